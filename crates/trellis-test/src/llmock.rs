//! A running `llmock serve` on a free loopback port, stopped when dropped. It speaks the providers'
//! real HTTP APIs and takes scripted faults through its admin API (`/_llmock/scenario`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::peers::{cache_dir, missing_peer};

pub struct Llmock {
    child: Child,
    pub port: u16,
}

impl Llmock {
    /// Starts llmock, or returns `None` (after reporting the missing peer).
    pub fn start() -> Option<Self> {
        let Some(binary) = Self::binary() else {
            missing_peer("llmock");
            return None;
        };
        let (child, port) = crate::http::start_on_free_port(
            "llmock",
            Duration::from_secs(30),
            |port| {
                Command::new(&binary)
                    .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
                    .args(["--log-level", "warning", "--tool-mode", "off"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("llmock starts")
            },
            |port| health(port).is_some(),
        );
        Some(Self { child, port })
    }

    fn binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os("TRELLIS_LLMOCK") {
            return Some(path.into());
        }
        let cached = cache_dir().join("peers/bin/llmock");
        cached.is_file().then_some(cached)
    }

    /// `http://127.0.0.1:<port>` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Queues behaviours (`{"type": "fail", "status": 429, ...}`) for the next requests.
    pub fn scenario(&self, behaviors: &Value) {
        let body = serde_json::json!({ "behaviors": behaviors }).to_string();
        self.request("POST", "/_llmock/scenario", &body)
            .expect("llmock takes the scenario");
    }

    /// Forgets recorded requests and queued behaviours.
    pub fn reset(&self) {
        self.request("POST", "/_llmock/reset", "{}")
            .expect("llmock resets");
    }

    /// Every request llmock has seen since the last reset.
    pub fn requests(&self) -> Vec<Value> {
        let text = self
            .get("/_llmock/requests")
            .expect("llmock lists requests");
        let value: Value = serde_json::from_str(&text).expect("requests are JSON");
        match value {
            Value::Array(items) => items,
            Value::Object(mut map) => match map.remove("requests") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// The request bodies llmock received since the last reset, in order.
    pub fn bodies(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .map(|r| r["body"].clone())
            .collect()
    }

    /// Every `tool_result` block of an Anthropic request body, in order: what the model was shown of
    /// its tool calls.
    pub fn tool_results(body: &Value) -> Vec<Value> {
        body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| b["type"] == "tool_result")
            .collect()
    }

    /// The names of the tools an Anthropic request body offered, in order.
    pub fn tool_names(body: &Value) -> Vec<String> {
        body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// llmock's verdict on how the client handled the faults.
    pub fn verdict(&self) -> Value {
        let text = self
            .get("/_llmock/verdict")
            .expect("llmock gives a verdict");
        serde_json::from_str(&text).expect("the verdict is JSON")
    }

    fn get(&self, path: &str) -> Option<String> {
        self.request("GET", path, "")
    }

    /// A stand-in for llama-server, for Trellis to start as its local model server
    /// (`TRELLIS_LLAMA_SERVER`): a script in `dir` that takes llama-server's arguments and forwards
    /// the port Trellis gives it to this llmock, so the local model's requests are answered by the
    /// scenario and logged here, sent exactly as llama-server would get them.
    pub fn as_llama_server(&self, dir: &Path) -> PathBuf {
        let script = dir.join("llama-server");
        let text = format!(
            "#!/bin/sh\n# llama-server's arguments; only --port matters.\nport=\n\
             while [ $# -gt 0 ]; do [ \"$1\" = --port ] && port=$2; shift; done\n\
             exec python3 -c '{FORWARDER}' \"$port\" {}\n",
            self.port
        );
        std::fs::write(&script, text).expect("the stand-in is written");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .expect("the stand-in is executable");
        script
    }

    fn request(&self, method: &str, path: &str, body: &str) -> Option<String> {
        request(self.port, method, path, body)
    }
}

/// llmock's `/health` on `port`, if it answers.
fn health(port: u16) -> Option<String> {
    request(port, "GET", "/health", "")
}

/// The body of a 2xx answer to a request to llmock's admin API on `port`, or `None` when there is
/// none (not up yet, or refused).
fn request(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let answer = crate::http::Request::new(port, method, path)
        .header("Content-Type", "application/json")
        .body(body.as_bytes().to_vec())
        .timeout(Duration::from_secs(10))
        .try_send()
        .ok()?;
    (200..300).contains(&answer.status).then(|| answer.text())
}

/// Python forwarding every connection to port `argv[1]` on to port `argv[2]` (no single quotes: it
/// goes inside them in a shell script), but for `GET /slots`, which it answers as a llama-server
/// without slots would: llmock stands in for the model, and keeps no cache to save.
const FORWARDER: &str = r#"
import socket, sys, threading
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(16)
def pipe(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            if data.startswith(b"GET /slots"):
                source.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                continue
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
while True:
    client, _ = server.accept()
    upstream = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    for source, sink in ((client, upstream), (upstream, client)):
        threading.Thread(target=pipe, args=(source, sink), daemon=True).start()
"#;

impl Drop for Llmock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
