//! `trellis serve` end to end: the real binary on a free loopback port, driven over HTTP as a program or
//! the web app would — list, start, watch a run's events to the end, reconnect with `Last-Event-ID`,
//! answer human gates (of its own runs and of a run a terminal left waiting), cancel a run with a running
//! command, resume, the server killed and restarted mid-run, path traversal, the token, cross-site
//! requests, body limits and the OpenAPI document.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;
mod serve_support;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use run_support::wait_for;
use serde_json::{Value, json};
use serve_support::{Serve, free_port, project_with};
use trellis_test::http::Request;

const GATE: &str = r#"digraph gate {
    goal = "ship"
    start [shape=Mdiamond]
    build [shape=parallelogram, script="echo building"]
    approve [shape=hexagon, label="Ship it?"]
    done [shape=Msquare]
    start -> build -> approve
    approve -> done [label="[A] Approve"]
    approve -> build [label="[R] Rebuild"]
}
"#;

const STEPS: &str = r#"digraph steps {
    start [shape=Mdiamond]
    one [shape=parallelogram, script="sleep 0.3; echo one"]
    two [shape=parallelogram, script="sleep 0.3; echo two"]
    three [shape=parallelogram, script="sleep 0.3; echo three"]
    done [shape=Msquare]
    start -> one -> two -> three -> done
}
"#;

/// A workflow whose one command runs for ten minutes; `marker` tells its processes apart.
fn slow(marker: &str) -> String {
    format!(
        r#"digraph slow {{
    start [shape=Mdiamond]
    wait [shape=parallelogram, script="sleep 600 # {marker}"]
    done [shape=Msquare]
    start -> wait -> done
}}
"#
    )
}

fn names(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["event"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn seqs(events: &[Value]) -> Vec<u64> {
    events.iter().map(|e| e["seq"].as_u64().unwrap()).collect()
}

/// Processes whose command line mentions `marker`.
/// Commands whose command line holds `marker`: the outermost such process of each, which is the
/// command itself, its reaper (unconfined) or its sandbox (bubblewrap).
fn processes_with(marker: &str) -> usize {
    let found: Vec<(String, String)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?.to_string();
            let line = std::fs::read(e.path().join("cmdline")).ok()?;
            if !String::from_utf8_lossy(&line).contains(marker) {
                return None;
            }
            let parent = trellis_process::reaper::parent_of(pid.parse().ok()?)?.to_string();
            Some((pid, parent))
        })
        .collect();
    found
        .iter()
        .filter(|(_, parent)| !found.iter().any(|(pid, _)| pid == parent))
        .count()
}

#[test]
fn a_run_is_started_listed_and_watched_to_its_end() {
    let project = project_with(&[("steps.fabro", STEPS), ("gate.fabro", GATE)]);
    let serve = Serve::start(&project);
    assert_eq!(serve.get("/healthz").json()["status"], "ok");

    let workflows = serve.get("/api/workflows").json();
    let listed: Vec<&str> = workflows
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["path"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["gate.fabro", "steps.fabro"]);
    assert_eq!(workflows[1]["valid"], true);
    assert_eq!(workflows[1]["nodes"], 5);

    let id = serve.start_run("steps.fabro");
    let events = serve.events_to_end(&id, None);
    let names = names(&events);
    assert_eq!(
        names.first().map(String::as_str),
        Some("WorkflowRunStarted")
    );
    assert_eq!(
        names.last().map(String::as_str),
        Some("WorkflowRunCompleted")
    );
    let seqs = seqs(&events);
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "every event once, in order"
    );

    // The stream and the log as it stands agree.
    let log = serve.get(&format!("/api/runs/{id}/events?format=jsonl"));
    assert_eq!(log.header("content-type"), Some("application/x-ndjson"));
    let logged: Vec<Value> = log
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(logged, events);

    let run = serve.run(&id);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["stage_count"], 5);
    let stages: Vec<&str> = run["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["start", "one", "two", "three", "done"]);
    assert_eq!(
        run["context"]["command.output"], "three\n",
        "blob values are shown resolved"
    );

    // A second run; the list is newest first, filtered by status and workflow, and paged.
    let second = serve.start_run("gate.fabro");
    serve.wait_for_status(&second, "running");
    let list = serve.get("/api/runs").json();
    assert_eq!(list["total"], 2);
    assert_eq!(list["runs"][0]["id"], second.as_str());
    assert_eq!(list["runs"][1]["id"], id.as_str());
    let succeeded = serve.get("/api/runs?status=succeeded").json();
    assert_eq!(succeeded["total"], 1);
    assert_eq!(succeeded["runs"][0]["id"], id.as_str());
    assert_eq!(
        serve.get("/api/runs?workflow=gate").json()["runs"][0]["id"],
        second.as_str()
    );
    // A status that is none is the API's own 400, naming the ones there are.
    let bogus = serve.get("/api/runs?status=bogus");
    assert_eq!(bogus.status, 400);
    let error = bogus.json()["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains("bogus") && error.contains("interrupted"),
        "{error}"
    );
    let page = serve.get("/api/runs?offset=1&limit=1").json();
    assert_eq!(page["runs"].as_array().unwrap().len(), 1);
    assert_eq!(page["runs"][0]["id"], id.as_str());

    // Stage files.
    let stdout = serve.get(&format!("/api/runs/{id}/stages/002-one@1/stdout.log"));
    assert_eq!(stdout.status, 200);
    assert_eq!(stdout.text(), "one\n");
    assert!(
        stdout
            .header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let status = serve.get(&format!("/api/runs/{id}/stages/002-one@1/status.json"));
    assert_eq!(status.json()["status"], "succeeded");

    // The picture of the run's workflow.
    let graph = serve.get(&format!("/api/runs/{id}/graph.svg"));
    assert_eq!(graph.status, 200);
    assert_eq!(graph.header("content-type"), Some("image/svg+xml"));
    assert!(graph.text().contains("<svg"), "{}", graph.text());
}

#[test]
fn a_client_that_reconnects_with_last_event_id_gets_exactly_the_missed_events() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let serve = Serve::start(&project);
    let id = serve.start_run("steps.fabro");
    let path = format!("/api/runs/{id}/events");
    // Read the first few events mid-run, then drop the connection.
    let mut first = Vec::new();
    {
        let mut stream = Request::new(serve.port, "GET", &path).stream();
        while first.len() < 6 {
            let event = stream.next().expect("events while the run goes on");
            assert_ne!(
                event.event, "end",
                "the run ended before the client reconnected"
            );
            first.push(event);
        }
    }
    let last_id: u64 = first
        .last()
        .unwrap()
        .id
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        serve.run(&id)["status"] == "running",
        "the reconnect happens mid-run"
    );
    let rest = serve.events_to_end(&id, Some(last_id));
    let mut all: Vec<u64> = first
        .iter()
        .map(|e| e.id.as_deref().unwrap().parse().unwrap())
        .collect();
    all.extend(seqs(&rest));
    let logged = serve
        .get(&format!("/api/runs/{id}/events?format=jsonl"))
        .text()
        .lines()
        .count() as u64;
    assert_eq!(
        all,
        (1..=logged).collect::<Vec<_>>(),
        "no event missed, none twice"
    );
    assert_eq!(rest.first().unwrap()["seq"], last_id + 1);
    assert_eq!(
        names(&rest).last().map(String::as_str),
        Some("WorkflowRunCompleted")
    );
}

#[test]
fn a_human_gate_is_answered_through_the_api() {
    let project = project_with(&[("gate.fabro", GATE)]);
    let serve = Serve::start(&project);
    let id = serve.start_run("gate.fabro");
    let mut run = Value::Null;
    wait_for("the gate to ask", Duration::from_secs(20), || {
        run = serve.run(&id);
        !run["waiting"].as_array().unwrap().is_empty()
    });
    let gate = &run["waiting"][0];
    assert_eq!(gate["gate"], "approve");
    assert_eq!(gate["prompt"], "Ship it?");
    assert_eq!(
        gate["options"],
        json!([{ "label": "[A] Approve", "key": "A" }, { "label": "[R] Rebuild", "key": "R" }])
    );
    assert_eq!(run["current"], "approve");

    let path = format!("/api/runs/{id}/answers");
    let wrong = serve.post(&path, &json!({ "gate": "approve", "answer": "maybe" }));
    assert_eq!(wrong.status, 422, "{}", wrong.text());
    assert!(
        wrong.json()["error"]
            .as_str()
            .unwrap()
            .contains("[A] Approve")
    );
    let unknown = serve.post(&path, &json!({ "gate": "nope", "answer": "A" }));
    assert_eq!(unknown.status, 409);

    let answered = serve.post(&path, &json!({ "gate": "approve", "answer": "a" }));
    assert_eq!(answered.status, 202, "{}", answered.text());
    serve.wait_for_status(&id, "succeeded");
    let events = serve.events_to_end(&id, None);
    let answer = events
        .iter()
        .find(|e| e["event"] == "HumanGateAnswered")
        .unwrap();
    assert_eq!(answer["label"], "[A] Approve");
}

#[test]
fn a_run_a_terminal_left_waiting_is_answered_and_resumed_by_the_server() {
    let project = project_with(&[("gate.fabro", GATE)]);
    // `trellis run` with no terminal stops at the gate, waiting for input.
    let waiting = project.run("workflows/gate.fabro", &[]);
    assert_eq!(waiting.code(), Some(3), "{}", waiting.stderr());
    let id = waiting.summary["run_id"].as_str().unwrap().to_owned();

    let serve = Serve::start(&project);
    let run = serve.run(&id);
    assert_eq!(run["status"], "waiting_for_input");
    assert_eq!(run["waiting"][0]["gate"], "approve");
    assert_eq!(run["waiting"][0]["options"][1]["key"], "R");

    let path = format!("/api/runs/{id}/answers");
    let wrong = serve.post(&path, &json!({ "gate": "approve", "answer": "later" }));
    assert_eq!(wrong.status, 422);
    let answered = serve.post(&path, &json!({ "gate": "approve", "answer": "Approve" }));
    assert_eq!(answered.status, 202, "{}", answered.text());
    serve.wait_for_status(&id, "succeeded");
    let stages: Vec<String> = serve.run(&id)["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        stages,
        ["start", "build", "approve", "done"],
        "nothing ran twice"
    );
}

#[test]
fn cancelling_a_run_stops_its_command_within_a_second_and_it_can_be_resumed() {
    let marker = "trellis-serve-cancel-7d1";
    let project = project_with(&[("slow.fabro", &slow(marker))]);
    let serve = Serve::start(&project);
    let id = serve.start_run("slow.fabro");
    wait_for("the command to start", Duration::from_secs(20), || {
        processes_with(marker) > 0
    });
    let cancelled = serve.post(&format!("/api/runs/{id}/cancel"), &json!({}));
    assert_eq!(cancelled.status, 202, "{}", cancelled.text());
    let asked = Instant::now();
    wait_for("the command to be gone", Duration::from_secs(1), || {
        processes_with(marker) == 0
    });
    assert!(asked.elapsed() < Duration::from_secs(1));
    let run = serve.wait_for_status(&id, "cancelled");
    assert_eq!(run["current"], "wait");
    let events = serve.events_to_end(&id, None);
    assert_eq!(
        names(&events).last().map(String::as_str),
        Some("WorkflowRunCancelled")
    );
    // Not running: a second cancel is a conflict.
    assert_eq!(
        serve
            .post(&format!("/api/runs/{id}/cancel"), &json!({}))
            .status,
        409
    );

    let resumed = serve.post(&format!("/api/runs/{id}/resume"), &json!({}));
    assert_eq!(resumed.status, 202, "{}", resumed.text());
    serve.wait_for_status(&id, "running");
    wait_for("the command to run again", Duration::from_secs(20), || {
        processes_with(marker) > 0
    });
    // Running: resuming it again is a conflict.
    assert_eq!(
        serve
            .post(&format!("/api/runs/{id}/resume"), &json!({}))
            .status,
        409
    );
    serve.post(&format!("/api/runs/{id}/cancel"), &json!({}));
    serve.wait_for_status(&id, "cancelled");
    assert_eq!(processes_with(marker), 0);
}

#[test]
fn a_server_killed_mid_run_finds_the_run_interrupted_after_a_restart_and_resumes_it() {
    let marker = "trellis-serve-restart-3c9";
    let project = project_with(&[("slow.fabro", &slow(marker))]);
    // Unconfined: each command runs under its reaper, which counts as the command here.
    let unconfined = ["--sandbox", "none"];
    let mut serve = Serve::start_with(&project, free_port(), &unconfined);
    let id = serve.start_run("slow.fabro");
    wait_for("the command to start", Duration::from_secs(20), || {
        processes_with(marker) > 0
    });
    serve.kill();
    // Nothing outlives the killed server: the reaper ends the command when the server is gone.
    wait_for("the command to end", Duration::from_secs(5), || {
        processes_with(marker) == 0
    });

    let serve = Serve::start_with(&project, free_port(), &unconfined);
    let record = project.path().join("runs").join(&id);
    let run = serve.run(&id);
    assert_eq!(run["status"], "interrupted");
    assert_eq!(
        run_support::read_json(&record.join("run.json"))["status"],
        "interrupted",
        "the restarted server marks it in the record"
    );
    let resumed = serve.post(&format!("/api/runs/{id}/resume"), &json!({}));
    assert_eq!(resumed.status, 202, "{}", resumed.text());
    serve.wait_for_status(&id, "running");
    // The resume started the interrupted stage again.
    // The event log is written by its own thread, a moment after the event.
    wait_for("the resume's event", Duration::from_secs(5), || {
        serve
            .get(&format!("/api/runs/{id}/events?format=jsonl"))
            .text()
            .contains("WorkflowRunResumed")
    });
    wait_for("exactly one command", Duration::from_secs(20), || {
        processes_with(marker) == 1
    });
    serve.post(&format!("/api/runs/{id}/cancel"), &json!({}));
    serve.wait_for_status(&id, "cancelled");
    wait_for("no command", Duration::from_secs(5), || {
        processes_with(marker) == 0
    });
}

#[test]
fn nothing_outside_a_run_directory_is_served() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    project.write("secret.txt", "top secret");
    let serve = Serve::start(&project);
    let id = serve.start_run("steps.fabro");
    serve.wait_for_status(&id, "succeeded");
    let record = project.path().join("runs").join(&id);
    // A symbolic link inside a stage directory that points out of the run.
    std::os::unix::fs::symlink(
        project.path().join("secret.txt"),
        record.join("stages/002-one@1/link.txt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(project.path(), record.join("stages/003-two@1")).ok();
    assert_eq!(
        serve
            .get(&format!("/api/runs/{id}/stages/002-one@1/stdout.log"))
            .status,
        200
    );
    for path in [
        format!("/api/runs/{id}/stages/002-one@1/link.txt"),
        format!("/api/runs/{id}/stages/..%2F..%2F..%2Fsecret.txt/x"),
        format!("/api/runs/{id}/stages/002-one@1/..%2F..%2Frun.json"),
        format!("/api/runs/{id}/stages/002-one@1/%2e%2e"),
        format!("/api/runs/{id}/stages/../run.json"),
        format!("/api/runs/{id}/stages/..%5C..%5Csecret.txt/x"),
        format!("/api/runs/{id}/stages/002-one@1/..%252F..%252Frun.json"),
        format!("/api/runs/{id}/artifacts/..%2F..%2Fsecret.txt"),
        format!("/api/runs/{id}/artifacts/../../secret.txt"),
        "/api/runs/..%2F..%2Fsecret.txt".to_owned(),
        "/api/runs/%2Fetc%2Fpasswd/stages/x/y".to_owned(),
        "/api/runs/..%2Fworkflows/events?format=jsonl".to_owned(),
    ] {
        let answer = serve.get(&path);
        assert_eq!(answer.status, 404, "{path}: {}", answer.text());
        assert!(!answer.text().contains("top secret"), "{path}");
    }
    // A workflow path that leaves --workflows is not run.
    let outside = serve.post("/api/runs", &json!({ "workflow": "../secret.txt" }));
    assert_eq!(outside.status, 404, "{}", outside.text());
}

#[test]
fn a_server_on_another_address_needs_a_token_and_every_request_carries_it() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let child = project
        .command(&["serve", "--listen", &listen, "--workflows", "workflows"])
        .env("TRELLIS_SERVER_TOKEN", "s3cret-token-0123456")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let serve = Serve { child, port };
    trellis_test::http::wait_for_port(port, "trellis serve");
    assert_eq!(serve.get("/api/runs").status, 401);
    assert_eq!(serve.get("/healthz").status, 401);
    assert_eq!(serve.get("/").status, 401);
    let wrong = Request::new(port, "GET", "/api/runs")
        .header("Authorization", "Bearer s3cret-token-0123457")
        .send();
    assert_eq!(wrong.status, 401);
    let right = Request::new(port, "GET", "/api/runs")
        .header("Authorization", "Bearer s3cret-token-0123456")
        .send();
    assert_eq!(right.status, 200, "{}", right.text());
    // A browser's first visit with ?token= gets a cookie that carries it from then on.
    let page = serve.get("/?token=s3cret-token-0123456");
    assert_eq!(page.status, 200);
    let cookie = page.header("set-cookie").unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    let with_cookie = Request::new(port, "GET", "/api/runs")
        .header("Cookie", pair)
        .send();
    assert_eq!(with_cookie.status, 200);
    // The token never appears in what the server answers.
    assert!(!right.text().contains("s3cret-token-0123456"));
}

#[test]
fn cross_site_requests_large_bodies_and_bad_input_are_refused_with_the_right_status() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let serve = Serve::start(&project);
    let start = json!({ "workflow": "steps.fabro" });
    let cross = Request::new(serve.port, "POST", "/api/runs")
        .header("Origin", "http://evil.example")
        .json(&start)
        .send();
    assert_eq!(cross.status, 403);
    let fetch = Request::new(serve.port, "POST", "/api/runs")
        .header("Sec-Fetch-Site", "cross-site")
        .json(&start)
        .send();
    assert_eq!(fetch.status, 403);
    let form = Request::new(serve.port, "POST", "/api/runs")
        .header("Content-Type", "text/plain")
        .body(start.to_string().into_bytes())
        .send();
    assert_eq!(form.status, 415, "a body that is not JSON is refused");
    assert_eq!(
        form.json()["error"],
        "Expected request with `Content-Type: application/json`"
    );
    let same_origin = Request::new(serve.port, "POST", "/api/validate")
        .header("Origin", format!("http://127.0.0.1:{}", serve.port))
        .json(&json!({ "source": STEPS }))
        .send();
    assert_eq!(same_origin.status, 200, "{}", same_origin.text());

    let huge = json!({ "source": "x".repeat(5 << 20) });
    let big = serve.post("/api/validate", &huge);
    assert_eq!(big.status, 413);
    let broken = Request::new(serve.port, "POST", "/api/runs")
        .header("Content-Type", "application/json")
        .body(b"{\"workflow\": ".to_vec())
        .send();
    assert_eq!(broken.status, 400);
    // Every refusal has the API's error body, whoever answered it: the body's reader, the router.
    assert!(
        broken.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("Failed to parse the request body as JSON"),
        "{}",
        broken.text()
    );
    let shape = serve.post("/api/runs", &json!([]));
    assert_eq!(shape.status, 422);
    assert!(shape.json()["error"].as_str().is_some(), "{}", shape.text());
    assert_eq!(
        big.json()["error"],
        "the request body is larger than 4 MiB, or was cut off"
    );
    let nowhere = serve.get("/api/nothing");
    assert_eq!(nowhere.status, 404);
    assert_eq!(nowhere.json()["error"], "no API route is `/api/nothing`");
    let put = Request::new(serve.port, "PUT", "/api/runs").send();
    assert_eq!(put.status, 405);
    assert_eq!(put.json()["error"], "`/api/runs` does not take PUT");
    let neither = serve.post("/api/runs", &json!({ "goal": "x" }));
    assert_eq!(neither.status, 400);
    assert!(
        neither.json()["error"]
            .as_str()
            .unwrap()
            .contains("`workflow`")
    );
    let missing = serve.post("/api/runs", &json!({ "workflow": "nope.fabro" }));
    assert_eq!(missing.status, 404);
    assert_eq!(serve.get("/api/runs/01NOPE").status, 404);
    assert_eq!(
        serve.get("/api/runs/01NOPE").json()["error"],
        "no run `01NOPE`"
    );
    let bad_name = serve.post(
        "/api/validate",
        &json!({ "source": STEPS, "name": "../x.fabro" }),
    );
    assert_eq!(bad_name.status, 400);
}

/// Diagnostics without their file names (the CLI names the path it was given, the server the file).
fn without_file(diagnostics: &Value) -> Value {
    let mut diagnostics = diagnostics.clone();
    for diagnostic in diagnostics.as_array_mut().unwrap() {
        diagnostic.as_object_mut().unwrap().remove("file");
    }
    diagnostics
}

#[test]
fn an_invalid_workflow_gets_422_with_the_diagnostics_trellis_validate_prints() {
    let broken = "digraph broken {\n    start [shape=Mdiamond]\n    a [shape=parallelogram]\n    start -> a -> nowhere\n}\n";
    let project = project_with(&[("broken.fabro", broken)]);
    let serve = Serve::start(&project);
    let cli = project
        .command(&["validate", "--format", "json", "workflows/broken.fabro"])
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(cli["valid"], false);

    for answer in [
        serve.post("/api/runs", &json!({ "workflow": "broken.fabro" })),
        serve.post(
            "/api/runs",
            &json!({ "source": broken, "name": "broken.fabro" }),
        ),
    ] {
        assert_eq!(answer.status, 422, "{}", answer.text());
        let report = answer.json();
        assert_eq!(report["valid"], false);
        assert_eq!(
            report["files"][0]["file"], "broken.fabro",
            "no server path is shown"
        );
        assert_eq!(
            without_file(&report["files"][0]["diagnostics"]),
            without_file(&cli["files"][0]["diagnostics"])
        );
        assert_eq!(report["files"][0]["errors"], cli["files"][0]["errors"]);
    }
    let validated = serve.post(
        "/api/validate",
        &json!({ "source": broken, "name": "broken.fabro" }),
    );
    assert_eq!(validated.status, 200);
    assert_eq!(
        without_file(&validated.json()["files"][0]["diagnostics"]),
        without_file(&cli["files"][0]["diagnostics"])
    );
    assert!(!project.path().join("runs").exists(), "no run was created");

    // A valid source text runs, dry, with values set.
    let started = serve.post(
        "/api/runs",
        &json!({ "source": STEPS, "name": "pasted.fabro", "dry_run": true, "goal": "check", "set": { "ticket": 42 } }),
    );
    assert_eq!(started.status, 201, "{}", started.text());
    let id = started.json()["id"].as_str().unwrap().to_owned();
    let run = serve.wait_for_status(&id, "succeeded");
    assert_eq!(run["goal"], "check");
    assert_eq!(run["context"]["ticket"], 42);
    assert_eq!(run["settings"]["mode"], "dry_run");
}

#[test]
fn the_openapi_document_describes_every_route_the_server_answers() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let serve = Serve::start(&project);
    let document = serve.get("/api/openapi.json").json();
    let paths: BTreeSet<String> = document["paths"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    for expected in [
        "/api/runs",
        "/api/runs/{id}",
        "/api/runs/{id}/events",
        "/api/runs/{id}/stages/{dir}/{file}",
        "/api/runs/{id}/artifacts/{path}",
        "/api/runs/{id}/graph.svg",
        "/api/runs/{id}/answers",
        "/api/runs/{id}/cancel",
        "/api/runs/{id}/resume",
        "/api/runs/{id}/steer",
        "/api/runs/{id}/changes",
        "/api/validate",
        "/api/workflows",
        "/healthz",
    ] {
        assert!(
            paths.contains(expected),
            "{expected} is not documented: {paths:?}"
        );
    }
    // A run's detail is typed down to its stages, settings and status.
    let schemas = &document["components"]["schemas"];
    let statuses = schemas["RunStatus"]["enum"].as_array().unwrap();
    assert!(statuses.contains(&json!("interrupted")), "{statuses:?}");
    for (schema, property) in [
        ("StageRecord", "node_id"),
        ("StageRecord", "duration_ms"),
        ("Settings", "mode"),
        ("TokenUsage", "input_tokens"),
        ("Changes", "diff"),
        ("ChangedFile", "added"),
    ] {
        // Flattened fields make the schema an `allOf` of parts.
        let parts = schemas[schema]["allOf"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![schemas[schema].clone()]);
        assert!(
            parts.iter().any(|p| p["properties"][property].is_object()),
            "{schema}.{property} is not described: {}",
            schemas[schema]
        );
    }
    // Every documented route is served: an unknown run gets the API's own 404, never the router's.
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let concrete = path
                .replace("{id}", "01UNKNOWN")
                .replace("{dir}", "001-start@1")
                .replace("{file}", "status.json")
                .replace("{path}", "a/b");
            let verb = method.to_ascii_uppercase();
            let mut request = Request::new(serve.port, &verb, &concrete);
            if method == "post" {
                request = request.json(&json!({ "gate": "g", "answer": "a", "source": STEPS }));
            }
            let answer = request.send();
            assert_ne!(answer.status, 405, "{method} {path}");
            if answer.status == 404 {
                assert!(
                    answer.json()["error"].is_string(),
                    "{method} {path}: {}",
                    answer.text()
                );
            }
        }
    }
    // Components carry the types the handlers return.
    let schemas = document["components"]["schemas"].as_object().unwrap();
    for name in ["RunSummary", "RunDetail", "RunList", "StartRequest", "Gate"] {
        assert!(schemas.contains_key(name), "{name}");
    }
}

#[test]
fn a_hundred_clients_on_one_run_each_receive_every_event() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let serve = Serve::start(&project);
    let id = serve.start_run("steps.fabro");
    let path = format!("/api/runs/{id}/events");
    // Every stream is open before the clients read: most connect while the run goes on.
    let streams: Vec<_> = (0..100)
        .map(|_| Request::new(serve.port, "GET", &path).stream())
        .collect();
    let readers: Vec<_> = streams
        .into_iter()
        .map(|stream| {
            std::thread::spawn(move || {
                stream
                    .take_while(|e| e.event != "end")
                    .map(|e| e.json()["seq"].as_u64().unwrap())
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let received: Vec<Vec<u64>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let logged = serve
        .get(&format!("/api/runs/{id}/events?format=jsonl"))
        .text()
        .lines()
        .count() as u64;
    assert!(logged > 15);
    for seqs in received {
        assert_eq!(seqs, (1..=logged).collect::<Vec<_>>());
    }
}

#[test]
fn a_server_stopped_with_sigterm_interrupts_its_runs_and_ends_its_streams() {
    let marker = "trellis-serve-sigterm-5e2";
    let project = project_with(&[("slow.fabro", &slow(marker))]);
    let mut serve = Serve::start(&project);
    let id = serve.start_run("slow.fabro");
    wait_for("the command to start", Duration::from_secs(20), || {
        processes_with(marker) > 0
    });
    let path = format!("/api/runs/{id}/events");
    let stream = Request::new(serve.port, "GET", &path).stream();
    let reader = std::thread::spawn(move || stream.map(|e| e.event).collect::<Vec<String>>());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(serve.child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = serve.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "the server did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let events = reader.join().unwrap();
    assert_eq!(
        events.last().map(String::as_str),
        Some("end"),
        "the stream ended"
    );
    // The run's command is ended with the server: by its sandbox or reaper, which the server's exit
    // tells, moments later.
    wait_for("the run's command to stop", Duration::from_secs(5), || {
        processes_with(marker) == 0
    });
    let record = project.path().join("runs").join(&id);
    assert_eq!(
        run_support::read_json(&record.join("run.json"))["status"],
        "interrupted"
    );
    // A new server resumes it.
    let serve = Serve::start(&project);
    assert_eq!(serve.run(&id)["status"], "interrupted");
    assert_eq!(
        serve
            .post(&format!("/api/runs/{id}/resume"), &json!({}))
            .status,
        202
    );
    serve.wait_for_status(&id, "running");
    serve.post(&format!("/api/runs/{id}/cancel"), &json!({}));
    serve.wait_for_status(&id, "cancelled");
    // Cancelled (here, often while its command was being started), the run leaves nothing running.
    wait_for(
        "the resumed command to stop",
        Duration::from_secs(5),
        || processes_with(marker) == 0,
    );
}

#[test]
fn a_yaml_workflows_input_is_checked_and_reaches_the_run() {
    let flow = "entry: a\ninputs:\n  repo: { type: string, required: true }\n  limit: { type: number, default: 3 }\nnodes:\n  a: { type: command, script: echo ok }\n";
    let project = project_with(&[("flow.yml", flow)]);
    let serve = Serve::start(&project);
    let refused = serve.post(
        "/api/runs",
        &json!({ "workflow": "flow.yml", "input": { "limit": "x" } }),
    );
    assert_eq!(refused.status, 422);
    let error = refused.json()["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains("`repo`") && error.contains("`limit` must be a number"),
        "{error}"
    );
    let started = serve.post(
        "/api/runs",
        &json!({ "workflow": "flow.yml", "input": { "repo": "acme/api" } }),
    );
    assert_eq!(started.status, 201, "{}", started.text());
    let id = started.json()["id"].as_str().unwrap().to_owned();
    let run = serve.wait_for_status(&id, "succeeded");
    assert_eq!(
        run["context"]["input"],
        json!({ "repo": "acme/api", "limit": 3 })
    );
}

#[test]
fn a_run_file_under_workflows_starts_a_run_with_its_inputs_and_hooks() {
    let p = project_with(&[
        (
            "ci.fabro",
            "digraph CI {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n t [shape=parallelogram, script=\"echo testing {{ inputs.language }} > tested.txt\"]\n start -> t -> exit\n}\n",
        ),
        (
            "ci.toml",
            "graph = \"ci.fabro\"\n[vars]\nlanguage = \"rust\"\n[[hooks]]\nevent = \"run_complete\"\nscript = \"echo done > hooked.txt\"\n",
        ),
        // A run file whose graph lies outside --workflows is refused.
        ("escape.toml", "graph = \"../outside.fabro\"\n"),
    ]);
    p.write(
        "outside.fabro",
        "digraph O {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n start -> exit\n}\n",
    );
    let serve = Serve::start(&p);
    // The web app's list shows the run file, valid with its inputs; the workflow alone is not.
    let listed = serve.get("/api/workflows").json();
    let entry = |path: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["path"] == path)
            .cloned()
            .unwrap_or_else(|| panic!("{path} in {listed}"))
    };
    assert_eq!(entry("ci.toml")["valid"], true);
    assert_eq!(entry("ci.fabro")["valid"], false);
    assert_eq!(entry("ci.fabro")["needs_inputs"], true, "{listed}");
    assert_eq!(entry("escape.toml")["needs_inputs"], false, "{listed}");
    let id = serve.start_run("ci.toml");
    let run = serve.wait_for_status(&id, "succeeded");
    assert_eq!(run["settings"]["inputs"]["language"], "rust", "{run}");
    assert_eq!(p.read("tested.txt").trim(), "testing rust");
    assert_eq!(p.read("hooked.txt").trim(), "done");
    let refused = serve.post("/api/runs", &json!({ "workflow": "escape.toml" }));
    assert_eq!(refused.status, 422, "{}", refused.text());
    assert!(
        refused
            .text()
            .contains("not a workflow file under --workflows"),
        "{}",
        refused.text()
    );
}

/// `POST /api/runs` takes `model` and `provider` as `trellis run --model/--provider` do: for the
/// nodes that name no model, recorded in the run's settings; a provider that is none is a 400.
#[test]
fn a_run_started_through_the_api_asks_the_model_and_provider_it_names() {
    let Some(mock) = trellis_test::Llmock::start() else {
        return;
    };
    let p = project_with(&[(
        "ask.fabro",
        "digraph Ask {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n ask [shape=tab, prompt=\"Say hi\"]\n own [shape=tab, prompt=\"Say bye\", model=\"claude-haiku-4-5\"]\n start -> ask -> own -> exit\n}\n",
    )])
    .with_env("ANTHROPIC_API_KEY", "sk-ant-test-serve-0000")
    .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
    .with_env("OPENAI_API_KEY", "sk-openai-test-serve")
    .with_env("OPENAI_BASE_URL", &mock.url("/v1"));
    mock.scenario(&json!([{ "type": "reply", "text": "hi", "times": 2 }]));
    let serve = Serve::start(&p);
    let started = serve.post(
        "/api/runs",
        &json!({ "workflow": "ask.fabro", "model": "my-finetune", "provider": "openai" }),
    );
    assert_eq!(started.status, 201, "{}", started.text());
    let id = started.json()["id"].as_str().unwrap().to_owned();
    let run = serve.wait_for_status(&id, "succeeded");
    assert_eq!(run["settings"]["model"], "my-finetune", "{run}");
    assert_eq!(run["settings"]["provider"], "openai", "{run}");
    let models: Vec<Value> = mock.bodies().iter().map(|b| b["model"].clone()).collect();
    assert_eq!(models, [json!("my-finetune"), json!("claude-haiku-4-5")]);
    let typo = serve.post(
        "/api/runs",
        &json!({ "workflow": "ask.fabro", "provider": "opneai" }),
    );
    assert_eq!(typo.status, 400, "{}", typo.text());
    assert!(
        typo.text()
            .contains("`provider`: unknown provider `opneai`"),
        "{}",
        typo.text()
    );
}

/// Regression: with nobody reading the server's standard error any more (`trellis serve 2>&1 | head
/// -1`), the line it writes when a run ends panicked, and the run stayed live for its watchers. The
/// run ends, is let go of, and its event stream ends.
#[test]
fn a_server_whose_watcher_has_gone_lets_its_finished_runs_go() {
    let p = project_with(&[("steps.fabro", STEPS)]);
    let server = Serve::start_unwatched(&p);
    let id = server.start_run("steps.fabro");
    server.wait_for_status(&id, "succeeded");
    wait_for("the run to be let go of", Duration::from_secs(10), || {
        server.run(&id)["live"] == json!(false)
    });
    let events = server.events_to_end(&id, None);
    assert_eq!(
        names(&events).last().map(String::as_str),
        Some("WorkflowRunCompleted")
    );
    // And it still serves.
    assert_eq!(server.get("/api/runs").status, 200);
}

#[test]
fn a_runs_changes_are_its_files_and_diff_and_outside_git_a_conflict_that_says_why() {
    let project = project_with(&[("edits.fabro", serve_support::EDITS)]);
    let serve = Serve::start(&project);
    // Not a repository yet: the run records why there is nothing to show.
    let id = serve.start_run("edits.fabro");
    serve.wait_for_status(&id, "succeeded");
    let none = serve.get(&format!("/api/runs/{id}/changes"));
    assert_eq!(none.status, 409, "{}", none.text());
    assert!(
        none.json()["error"]
            .as_str()
            .unwrap()
            .contains("not in a git repository"),
        "{}",
        none.text()
    );
    // The first run's file is gone before the second starts: the second adds it again.
    std::fs::remove_file(project.path().join("added.txt")).unwrap();
    project.write("notes.txt", "one\ntwo\n");
    trellis_test::git(project.path(), &["init", "-q"]);
    trellis_test::git(project.path(), &["add", "notes.txt"]);
    trellis_test::git(project.path(), &["commit", "-qm", "notes"]);
    let id = serve.start_run("edits.fabro");
    serve.wait_for_status(&id, "succeeded");
    let changes = serve.get(&format!("/api/runs/{id}/changes"));
    assert_eq!(changes.status, 200, "{}", changes.text());
    let changes = changes.json();
    assert_eq!(
        changes["files"],
        json!([
            { "path": "added.txt", "added": 1, "removed": 0 },
            { "path": "notes.txt", "added": 1, "removed": 1 },
        ]),
        "{changes}"
    );
    assert_eq!(changes["live"], false);
    assert!(
        changes["diff"].as_str().unwrap().contains("-two\n+TWO\n"),
        "{changes}"
    );
    assert_eq!(serve.get("/api/runs/NOSUCHRUN/changes").status, 404);
}
