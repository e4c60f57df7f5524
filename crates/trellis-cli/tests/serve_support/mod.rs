//! A running `trellis serve` for end-to-end tests: the real binary on a free loopback port over a
//! project's runs and `workflows/` folder, driven over plain HTTP.

#![allow(dead_code)]

use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use trellis_test::http::{Request, Response};

use crate::run_support::{Project, wait_for};

pub use trellis_test::http::free_port;

/// A running `trellis serve` over a project's runs and workflows, killed when dropped.
pub struct Serve {
    pub child: Child,
    pub port: u16,
}

impl Serve {
    pub fn start(project: &Project) -> Self {
        Self::start_with(project, free_port(), &[])
    }

    /// Starts the server on `port`, or — when another test's server took that port first — on
    /// another free one: a server counts as started once it says where it listens.
    pub fn start_with(project: &Project, port: u16, extra: &[&str]) -> Self {
        Self::launch(project, port, extra, true)
    }

    /// Starts the server and then stops reading what it writes on standard error, as `trellis serve
    /// 2>&1 | head -1` does.
    pub fn start_unwatched(project: &Project) -> Self {
        Self::launch(project, free_port(), &[], false)
    }

    fn launch(project: &Project, port: u16, extra: &[&str], watched: bool) -> Self {
        let mut port = port;
        for _ in 0..5 {
            let listen = format!("127.0.0.1:{port}");
            let mut args = vec!["serve", "--listen", &listen, "--workflows", "workflows"];
            args.extend_from_slice(extra);
            let mut child = project
                .command(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let stderr = child.stderr.take().unwrap();
            let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
            let listening = lines
                .by_ref()
                .map_while(Result::ok)
                .any(|line| line.starts_with("trellis serve: http://"));
            // Keep reading, so the server never blocks on a full pipe.
            if watched {
                std::thread::spawn(move || lines.for_each(drop));
            }
            if listening {
                return Self { child, port };
            }
            let _ = child.wait();
            port = free_port();
        }
        panic!("trellis serve did not start");
    }

    pub fn get(&self, path: &str) -> Response {
        Request::new(self.port, "GET", path).send()
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        Request::new(self.port, "POST", path).json(body).send()
    }

    /// Starts a run of a workflow under `workflows/`; returns its id.
    pub fn start_run(&self, workflow: &str) -> String {
        let answer = self.post("/api/runs", &json!({ "workflow": workflow }));
        assert_eq!(answer.status, 201, "{}", answer.text());
        answer.json()["id"].as_str().unwrap().to_owned()
    }

    pub fn run(&self, id: &str) -> Value {
        let answer = self.get(&format!("/api/runs/{id}"));
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()
    }

    pub fn wait_for_status(&self, id: &str, status: &str) -> Value {
        let mut last = Value::Null;
        wait_for(
            &format!("run {id} to be {status}"),
            Duration::from_secs(30),
            || {
                last = self.run(id);
                last["status"] == status
            },
        );
        last
    }

    /// Every event of the stream (from `after`), to its `end` event.
    pub fn events_to_end(&self, id: &str, after: Option<u64>) -> Vec<Value> {
        let path = format!("/api/runs/{id}/events");
        let mut request =
            Request::new(self.port, "GET", &path).header("Accept", "text/event-stream");
        if let Some(after) = after {
            request = request.header("Last-Event-ID", after.to_string());
        }
        let stream = request.stream();
        assert_eq!(stream.status, 200);
        let mut events = Vec::new();
        for event in stream {
            if event.event == "end" {
                return events;
            }
            assert_eq!(
                event.id.as_deref(),
                Some(event.json()["seq"].to_string().as_str()),
                "the SSE id is the event's seq"
            );
            events.push(event.json());
        }
        panic!("the stream closed without an end event");
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn project_with(workflows: &[(&str, &str)]) -> Project {
    let project = Project::new();
    std::fs::create_dir_all(project.path().join("workflows")).unwrap();
    for (name, text) in workflows {
        project.write(&format!("workflows/{name}"), text);
    }
    project
}

/// A workflow that changes `notes.txt` (a line of two) and adds `added.txt`: what a run changed.
pub const EDITS: &str = r#"digraph edits {
    start [shape=Mdiamond]
    edit [shape=parallelogram, script="printf 'one\nTWO\n' > notes.txt && echo new > added.txt"]
    exit [shape=Msquare]
    start -> edit -> exit
}
"#;
