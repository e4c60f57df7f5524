//! Agent nodes with `backend="acp"` end to end: the real `trellis` binary as the client of a scripted
//! Agent Client Protocol agent (`fixtures/acp/scripted_agent.py`, no model). The tests read what the
//! agent was sent and answered from its log: the prompt, the working directory and MCP servers of its
//! session, files read and written through Trellis (confined), a terminal run in the sandbox,
//! permission answers by the node's level, and `session/cancel` when the stage times out.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;

use std::path::Path;
use std::time::Duration;

use run_support::{Project, stage_dir, wait_for};
use serde_json::{Value, json};

/// The scripted agent's command line; its script and log live outside the working directory (in
/// `aside`), so they are not files the stage touched.
fn agent_command(aside: &Path, script: &Value) -> String {
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/acp/scripted_agent.py");
    std::fs::write(aside.join("script.json"), script.to_string()).unwrap();
    format!(
        "python3 {} {} {}",
        agent.display(),
        aside.join("script.json").display(),
        aside.join("agent-log.jsonl").display()
    )
}

fn log_of(aside: &Path) -> String {
    std::fs::read_to_string(aside.join("agent-log.jsonl")).unwrap_or_default()
}

/// What the agent logged: every message it received.
fn received(aside: &Path) -> Vec<Value> {
    log_of(aside)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "received")
        .map(|e| e["value"].clone())
        .collect()
}

fn workflow(attrs: &str) -> String {
    format!(
        "digraph W {{\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         fix [prompt=\"Fix add in src/lib.rs\", backend=\"acp\"{attrs}]\n start -> fix -> exit\n}}\n"
    )
}

/// What the agent was sent before its turn: the capabilities, its session, the prompt.
fn assert_session_setup(messages: &[Value], work: &Path) {
    // initialize: Trellis offers files and terminals.
    let init = messages
        .iter()
        .find(|m| m["method"] == "initialize")
        .unwrap();
    assert_eq!(init["params"]["protocolVersion"], 1);
    assert_eq!(
        init["params"]["clientCapabilities"]["fs"]["readTextFile"],
        true
    );
    assert_eq!(
        init["params"]["clientCapabilities"]["fs"]["writeTextFile"],
        true
    );
    assert_eq!(init["params"]["clientCapabilities"]["terminal"], true);
    // session/new: the working directory and the project's MCP server.
    let new = messages
        .iter()
        .find(|m| m["method"] == "session/new")
        .unwrap();
    assert_eq!(
        new["params"]["cwd"].as_str().unwrap(),
        work.canonicalize().unwrap().display().to_string()
    );
    let servers = new["params"]["mcpServers"].as_array().unwrap();
    assert_eq!(servers.len(), 1, "{servers:?}");
    assert_eq!(servers[0]["name"], "files");
    assert_eq!(servers[0]["command"], "mcp-files");
    // session/prompt: the assembled prompt.
    let prompt = messages
        .iter()
        .find(|m| m["method"] == "session/prompt")
        .unwrap();
    let text = prompt["params"]["prompt"][0]["text"].as_str().unwrap();
    assert!(text.ends_with("Fix add in src/lib.rs"), "{text}");
}

#[test]
fn an_acp_agent_is_prompted_and_served_files_terminals_and_permissions() {
    let p = Project::new().with_env("MY_SECRET_TOKEN", "tok-should-never-reach-the-agent-7f");
    p.write(
        "src/lib.rs",
        "pub fn add(a: i32, b: i32) -> i32 { a - b }\n",
    );
    p.write(
        ".mcp.json",
        r#"{"mcpServers": {"files": {"command": "mcp-files", "args": ["--root", "."]}}}"#,
    );
    let aside = tempfile::tempdir().unwrap();
    let command = agent_command(
        aside.path(),
        &json!({ "prompts": [[
            { "do": "read", "path": "src/lib.rs" },
            { "do": "read", "path": "/etc/passwd" },
            { "do": "permission", "kind": "edit", "title": "Edit src/lib.rs" },
            { "do": "write", "path": "src/lib.rs", "content": "pub fn add(a: i32, b: i32) -> i32 { a + b }\n" },
            { "do": "terminal", "command": "sh", "args": ["-c", "cat src/lib.rs; echo token=$MY_SECRET_TOKEN"] },
            { "do": "say", "text": "Fixed add. {last}" },
        ]] }),
    );
    p.write(
        "w.fabro",
        &workflow(&format!(", acp_command=\"{command}\"")),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        p.read("src/lib.rs"),
        "pub fn add(a: i32, b: i32) -> i32 { a + b }\n"
    );
    let messages = received(aside.path());
    assert_session_setup(&messages, p.path());
    // What Trellis answered the agent's requests, in order.
    let answers: Vec<&Value> = messages
        .iter()
        .filter(|m| m.get("method").is_none())
        .filter(|m| m["id"].as_u64().is_some_and(|id| id > 1000))
        .collect();
    assert_eq!(
        answers[0]["result"]["content"],
        "pub fn add(a: i32, b: i32) -> i32 { a - b }\n"
    );
    let outside = answers[1]["error"]["message"].as_str().unwrap();
    assert!(
        outside.contains("outside the working directory"),
        "{outside}"
    );
    assert_eq!(answers[2]["result"]["outcome"]["optionId"], "allow");
    // The terminal ran in the sandbox, without the caller's secrets.
    let output = messages
        .iter()
        .find_map(|m| m["result"]["output"].as_str())
        .expect("the terminal's output");
    assert!(
        output.contains("a + b") && output.contains("token=\n"),
        "{output}"
    );
    // The agent's answer is the stage's response; its tool calls are events and transcript entries.
    let response =
        std::fs::read_to_string(stage_dir(&run.record(), "fix").join("response.md")).unwrap();
    assert!(response.starts_with("Fixed add. "), "{response}");
    let started: Vec<String> = run
        .events_named("Agent.ToolCallStarted")
        .iter()
        .map(|e| e["tool"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(started, ["read", "read", "edit", "edit", "execute"]);
    let completed = run.events_named("Agent.ToolCallCompleted");
    assert_eq!(completed.len(), 5);
    assert_eq!(completed[1]["is_error"], true, "reading /etc/passwd failed");
    let status: Value = serde_json::from_str(
        &std::fs::read_to_string(stage_dir(&run.record(), "fix").join("status.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(status["files_touched"], json!(["src/lib.rs"]));
    let transcript =
        std::fs::read_to_string(stage_dir(&run.record(), "fix").join("transcript.jsonl")).unwrap();
    assert!(
        transcript.contains("\"type\":\"permission\""),
        "{transcript}"
    );
}

#[test]
fn a_read_only_acp_agent_cannot_write_or_run_commands() {
    let p = Project::new();
    p.write("notes.md", "keep me\n");
    let aside = tempfile::tempdir().unwrap();
    let command = agent_command(
        aside.path(),
        &json!({ "prompts": [[
            { "do": "permission", "kind": "execute", "title": "Run tests" },
            { "do": "write", "path": "notes.md", "content": "overwritten" },
            { "do": "terminal", "command": "touch", "args": ["ran"] },
            { "do": "say", "text": "I could not change anything." },
        ]] }),
    );
    p.write(
        "w.fabro",
        &workflow(&format!(
            ", permissions=\"read-only\", acp_command=\"{command}\""
        )),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(p.read("notes.md"), "keep me\n");
    assert!(!p.path().join("ran").exists());
    let messages = received(aside.path());
    let answers: Vec<&Value> = messages
        .iter()
        .filter(|m| m.get("method").is_none() && m["id"].as_u64().is_some_and(|id| id > 1000))
        .collect();
    assert_eq!(answers[0]["result"]["outcome"]["optionId"], "reject");
    assert!(
        answers[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("writing files needs permissions read-write")
    );
    assert!(
        answers[2]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("running commands needs permissions full")
    );
}

#[test]
fn a_stage_that_times_out_cancels_its_acp_session() {
    let p = Project::new();
    let aside = tempfile::tempdir().unwrap();
    let command = agent_command(aside.path(), &json!({ "prompts": [[{ "do": "hang" }]] }));
    p.write(
        "w.fabro",
        &workflow(&format!(
            ", timeout=\"1s\", max_retries=0, acp_command=\"{command}\""
        )),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.stage_status("fix"), "failed", "{}", run.stderr());
    assert!(
        run.stderr().contains("fix (1.0s): timed out after 1s"),
        "{}",
        run.stderr()
    );
    // The agent is told, and it ends.
    wait_for(
        "session/cancel to reach the agent",
        Duration::from_secs(10),
        || {
            received(aside.path())
                .iter()
                .any(|m| m["method"] == "session/cancel")
        },
    );
    let cancel = received(aside.path())
        .into_iter()
        .find(|m| m["method"] == "session/cancel")
        .unwrap();
    assert_eq!(cancel["params"]["sessionId"], "sess-1");
    wait_for("the agent to exit", Duration::from_secs(10), || {
        log_of(aside.path()).contains("\"kind\": \"eof\"")
            || !std::process::Command::new("pgrep")
                .args(["-f", "scripted_agent.py"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().count() > 0)
    });
}
