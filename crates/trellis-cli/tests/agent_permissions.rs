//! Agent permissions (`permissions=read-only|read-write|full`) through the real `trellis` binary, with
//! llmock scripting the model's calls: a call beyond the level is denied when nobody can answer,
//! allowed once or always from an answers file, and asked on a terminal (a pty); the model is shown
//! the denial (llmock's request log), and the run's events record the question as a gate.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;

use std::process::Command;

use run_support::{Project, stage_dir};
use serde_json::{Value, json};
use trellis_test::Llmock;

fn project(mock: &Llmock) -> Project {
    Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-permissions-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
}

fn agent(attrs: &str) -> String {
    format!(
        "digraph W {{\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"Tidy up\", model=\"sonnet\"{attrs}]\n start -> fix -> exit\n}}\n"
    )
}

fn call(name: &str, arguments: &Value) -> Value {
    json!({ "type": "reply", "tool_calls": [{ "name": name, "arguments": arguments }], "times": 1 })
}

fn answer(text: &str) -> Value {
    json!({ "type": "reply", "text": text, "times": 1 })
}

/// The tool results the model was sent in request `n`.
fn results(mock: &Llmock, n: usize) -> Vec<Value> {
    Llmock::tool_results(&mock.bodies()[n])
}

fn gate_events(p: &Project) -> Vec<Value> {
    let events = std::fs::read_to_string(p.only_run().join("events.jsonl")).unwrap();
    events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| {
            e["event"]
                .as_str()
                .is_some_and(|name| name.starts_with("HumanGate"))
        })
        .collect()
}

#[test]
fn a_read_only_agent_may_read_but_its_write_is_denied_when_nobody_can_answer() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("notes.txt", "keep\n");
    p.write("w.fabro", &agent(", permissions=\"read-only\""));
    mock.scenario(&json!([
        call("write_file", &json!({ "path": "new.txt", "content": "x" })),
        call("read_file", &json!({ "path": "notes.txt" })),
        answer("I could only read."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(!p.path().join("new.txt").exists(), "the write did not run");
    let denied = &results(&mock, 1)[0];
    assert_eq!(denied["is_error"], true);
    let text = denied["content"].as_str().unwrap();
    assert!(
        text.starts_with("Not run: `write_file` is a write tool, and this agent's permissions are read-only (read-write needed); nobody was there to allow it"),
        "{text}"
    );
    let read = &results(&mock, 2)[1];
    assert_eq!(read["is_error"], false, "{read}");
    // The question and its answer are in the record, as a gate's are.
    let gates = gate_events(&p);
    assert_eq!(gates.len(), 2, "{gates:?}");
    assert_eq!(gates[0]["event"], "HumanGateAsked");
    assert_eq!(gates[0]["node_id"], "fix");
    assert!(gates[0]["prompt"].as_str().unwrap().contains("write_file"));
    assert_eq!(gates[1]["label"], "[N] No");
    let transcript =
        std::fs::read_to_string(stage_dir(&p.only_run(), "fix").join("transcript.jsonl")).unwrap();
    assert!(transcript.contains("\"type\":\"approval\""), "{transcript}");
}

#[test]
fn always_raises_the_level_for_the_rest_of_the_stage_and_yes_allows_one_call() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &agent(", permissions=\"read-write\""));
    mock.scenario(&json!([
        call("shell", &json!({ "command": "echo one > one.txt" })),
        call("shell", &json!({ "command": "echo two > two.txt" })),
        answer("Both ran."),
    ]));
    p.write("answers.json", r#"{"fix": "A"}"#);
    let run = p.run("w.fabro", &["--answers", "answers.json"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(p.read("one.txt"), "one\n");
    assert_eq!(p.read("two.txt"), "two\n");
    // Asked once: "always" covered the second shell call.
    let gates = gate_events(&p);
    assert_eq!(gates.len(), 2, "{gates:?}");
    assert_eq!(gates[1]["label"], "[A] Always");

    // A graph-wide level applies to nodes that set none; "Y" allows the one call asked about.
    let mock2 = Llmock::start().unwrap();
    let q = project(&mock2);
    q.write(
        "w.fabro",
        "digraph W {\n graph [permissions=\"read-only\"]\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"Tidy up\", model=\"sonnet\"]\n start -> fix -> exit\n}\n",
    );
    mock2.scenario(&json!([
        call("write_file", &json!({ "path": "a.txt", "content": "a" })),
        call("write_file", &json!({ "path": "b.txt", "content": "b" })),
        answer("One of two."),
    ]));
    q.write("answers.json", r#"{"fix": "Y"}"#);
    let run = q.run("w.fabro", &["--answers", "answers.json"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(q.read("a.txt"), "a");
    assert!(
        !q.path().join("b.txt").exists(),
        "the second write was asked again, and denied"
    );
    assert_eq!(results(&mock2, 2)[1]["is_error"], true);
}

#[test]
fn on_a_terminal_the_person_is_asked() {
    let Some(mock) = Llmock::start() else { return };
    if Command::new("script").arg("--version").output().is_err() {
        trellis_test::missing_peer("script (util-linux), for a pty");
        return;
    }
    let p = project(&mock);
    p.write("w.fabro", &agent(", permissions=\"read-only\""));
    mock.scenario(&json!([
        call(
            "write_file",
            &json!({ "path": "asked.txt", "content": "yes" })
        ),
        answer("Written with permission."),
    ]));
    // `script` gives the run a terminal, with the environment the other tests run `trellis` in.
    let trellis = env!("CARGO_BIN_EXE_trellis");
    let base = p.command(&[]);
    let mut script = Command::new("script");
    script
        .args(["-qfec", &format!("{trellis} run w.fabro"), "/dev/null"])
        .current_dir(p.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (key, value) in base.get_envs() {
        match value {
            Some(value) => script.env(key, value),
            None => script.env_remove(key),
        };
    }
    let mut child = script.spawn().unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        // What the person types once the question is on the screen.
        run_support::wait_for("the question", std::time::Duration::from_secs(20), || {
            p.run_exists()
                && std::fs::read_to_string(p.only_run().join("events.jsonl"))
                    .unwrap_or_default()
                    .contains("HumanGateAsked")
        });
        stdin.write_all(b"Y\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    assert!(screen.contains("wants to run: write_file"), "{screen}");
    assert!(
        screen.contains("[A] Always") || screen.contains("Always"),
        "{screen}"
    );
    assert_eq!(p.read("asked.txt"), "yes");
}

#[test]
fn a_bad_level_is_an_error_and_a_cli_backend_is_warned() {
    let p = Project::new();
    p.write("bad.fabro", &agent(", permissions=\"read_only\""));
    let out = p.command(&["validate", "bad.fabro"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains(
            "`permissions` must be one of full, read-write, read-only; found `read_only`"
        ),
        "{text}"
    );
    assert!(text.contains("did you mean `read-only`?"), "{text}");
    p.write(
        "cli.fabro",
        &agent(", permissions=\"read-only\", backend=\"cli\", provider=\"anthropic\""),
    );
    let out = p.command(&["validate", "cli.fabro"]).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("`permissions` on `fix` is ignored"), "{text}");
}

#[test]
fn the_run_flag_is_a_ceiling_over_what_the_workflow_allows() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    // The node says full; the run says read-only.
    p.write("w.fabro", &agent(", permissions=\"full\""));
    mock.scenario(&json!([
        call("shell", &json!({ "command": "touch ran.txt" })),
        answer("Not allowed."),
    ]));
    let run = p.run("w.fabro", &["--permissions", "read-only"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(!p.path().join("ran.txt").exists());
    let denied = &results(&mock, 1)[0];
    assert!(
        denied["content"]
            .as_str()
            .unwrap()
            .contains("`shell` is a shell tool, and this agent's permissions are read-only"),
        "{denied}"
    );
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(p.only_run().join("run.json")).unwrap())
            .unwrap();
    assert_eq!(meta["settings"]["permissions"], "read-only");
    let bad = p
        .command(&["run", "w.fabro", "--permissions", "admin"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("use full, read-write, read-only"));
}
