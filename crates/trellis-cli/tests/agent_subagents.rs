//! Sub-agents (`spawn_agent`, `send_input`, `wait`, `close_agent`) through the real `trellis`
//! binary, with llmock as the model: a child works on its own history with the stage's tools and its
//! answer reaches the parent through `wait` (llmock's request log); its activity is in the run's
//! events under its id and in the stage's transcript; a child still working when its stage ends is
//! closed and its command killed; the depth limit holds.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;

use std::time::{Duration, Instant};

use run_support::{Project, stage_dir};
use serde_json::{Value, json};
use trellis_test::Llmock;

fn project(mock: &Llmock) -> Project {
    Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-subagents-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
}

fn agent(attrs: &str) -> String {
    format!(
        "digraph W {{\n start [shape=Mdiamond]\n exit [shape=Msquare]\n lead [prompt=\"Find the answer\", model=\"sonnet\"{attrs}]\n start -> lead -> exit\n}}\n"
    )
}

fn calls(calls: &[(&str, Value)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(name, arguments)| json!({ "name": name, "arguments": arguments }))
        .collect();
    json!({ "type": "reply", "tool_calls": calls, "times": 1 })
}

fn answer(text: &str) -> Value {
    json!({ "type": "reply", "text": text, "times": 1 })
}

/// The text of every message of a request body, in order (Anthropic's format).
fn texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match &m["content"] {
            Value::String(text) => text.clone(),
            Value::Array(blocks) => blocks
                .iter()
                .map(|b| {
                    b["text"]
                        .as_str()
                        .map_or_else(|| b.to_string(), str::to_owned)
                })
                .collect::<Vec<_>>()
                .join("\n"),
            other => other.to_string(),
        })
        .collect()
}

#[test]
fn a_sub_agent_works_on_its_own_history_and_its_answer_reaches_the_parent() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("note.txt", "the answer is 42\n");
    p.write("w.fabro", &agent(""));
    // The parent starts a child and waits for it in one turn: the requests come in a fixed order
    // (parent, child, child, parent).
    mock.scenario(&json!([
        calls(&[
            (
                "spawn_agent",
                json!({ "task": "Read note.txt and say what the answer is." })
            ),
            ("wait", json!({ "agent_id": "agent-1" })),
        ]),
        calls(&[("read_file", json!({ "path": "note.txt" }))]),
        answer("The note says 42."),
        answer("The answer is 42, as my helper found."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 4);
    let tools = Llmock::tool_names(&bodies[0]);
    for name in ["spawn_agent", "send_input", "wait", "close_agent"] {
        assert!(tools.contains(&name.to_owned()), "{tools:?}");
    }
    // The child starts from its task alone, with the same tools and system prompt.
    assert_eq!(
        texts(&bodies[1]),
        ["Read note.txt and say what the answer is."]
    );
    assert_eq!(Llmock::tool_names(&bodies[1]), tools);
    assert_eq!(bodies[1]["system"], bodies[0]["system"]);
    let read = &Llmock::tool_results(&bodies[2])[0];
    assert!(
        read["content"]
            .as_str()
            .unwrap()
            .contains("the answer is 42")
    );
    // The parent was shown the child's id, then its answer.
    let results = Llmock::tool_results(&bodies[3]);
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("Started sub-agent agent-1"),
        "{results:?}"
    );
    assert_eq!(
        results[1]["content"],
        "Sub-agent agent-1 answered:\nThe note says 42."
    );
    assert_eq!(results[1]["is_error"], false);

    // The child's activity is in the events under its id, its lifecycle under the stage's agent.
    let spawned = run.events_named("Agent.SubagentSpawned");
    assert_eq!(spawned.len(), 1);
    assert_eq!(spawned[0]["subagent"], "agent-1");
    assert_eq!(spawned[0]["depth"], 1);
    assert_eq!(spawned[0].get("agent_id"), None);
    let child_calls: Vec<Value> = run
        .events_named("Agent.ToolCallStarted")
        .into_iter()
        .filter(|e| e["agent_id"] == "agent-1")
        .collect();
    assert_eq!(child_calls.len(), 1);
    assert_eq!(child_calls[0]["tool"], "read_file");
    assert_eq!(child_calls[0]["node_id"], "lead");
    let completed = run.events_named("Agent.SubagentCompleted");
    assert_eq!(completed[0]["text"], "The note says 42.");
    assert_eq!(completed[0]["turns"], 2);
    // Answered children are closed with the stage.
    assert_eq!(run.events_named("Agent.SubagentClosed").len(), 1);
    let child_models: Vec<Value> = run
        .events_named("ModelCallCompleted")
        .into_iter()
        .filter(|e| e["agent_id"] == "agent-1")
        .collect();
    assert_eq!(child_models.len(), 2);
    // The stage's usage counts the child's calls.
    let status: Value = serde_json::from_str(
        &std::fs::read_to_string(stage_dir(&p.only_run(), "lead").join("status.json")).unwrap(),
    )
    .unwrap();
    let models = run.events_named("ModelCallCompleted");
    let input: u64 = models
        .iter()
        .map(|e| e["usage"]["input_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(status["usage"]["input_tokens"], input, "{status}");

    let transcript =
        std::fs::read_to_string(stage_dir(&p.only_run(), "lead").join("transcript.jsonl")).unwrap();
    assert!(
        transcript.contains(r#""agent":"agent-1","task":"Read note.txt"#),
        "{transcript}"
    );
    assert!(
        transcript
            .lines()
            .any(|l| l.contains(r#""tool":"read_file""#) && l.contains(r#""agent":"agent-1""#)),
        "{transcript}"
    );
    let logs = p.command(&["logs", &run_id(&p), "lead"]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("⇢ sub-agent agent-1 started"), "{logs}");
    assert!(logs.contains("[agent-1] → read_file"), "{logs}");
}

fn run_id(p: &Project) -> String {
    p.only_run()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_child_still_working_when_its_stage_ends_is_closed_and_its_command_killed() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &agent(""));
    // The parent starts a child and runs a command of its own meanwhile: the child's first request
    // comes while that command runs, and it runs a long command; the parent then finishes.
    mock.scenario(&json!([
        calls(&[
            ("spawn_agent", json!({ "task": "Wait a long time." })),
            ("shell", json!({ "command": "sleep 2" })),
        ]),
        calls(&[(
            "shell",
            json!({ "command": "echo started > child.txt; sleep 60; echo finished >> child.txt" }),
        )]),
        answer("I did not need the helper after all."),
    ]));
    let started = Instant::now();
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(started.elapsed() < Duration::from_secs(45));
    assert_eq!(p.read("child.txt"), "started\n");
    let closed = run.events_named("Agent.SubagentClosed");
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0]["subagent"], "agent-1");
    assert_eq!(
        run.events_named("Agent.SubagentCompleted"),
        [] as [serde_json::Value; 0]
    );
    run_support::assert_process_group_gone(&stage_dir(&p.only_run(), "lead"));
}

#[test]
fn the_depth_limit_holds_and_zero_offers_no_sub_agent_tools() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &agent(""));
    // The child tries to start a grandchild: refused (the default depth is one level).
    mock.scenario(&json!([
        calls(&[
            ("spawn_agent", json!({ "task": "Delegate this." })),
            ("wait", json!({ "agent_id": "agent-1" })),
        ]),
        calls(&[("spawn_agent", json!({ "task": "Deeper." }))]),
        answer("I could not delegate."),
        answer("Done."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let refused = &Llmock::tool_results(&mock.bodies()[2])[0];
    assert_eq!(refused["is_error"], true);
    assert!(
        refused["content"]
            .as_str()
            .unwrap()
            .contains("max_subagent_depth"),
        "{refused}"
    );
    assert_eq!(run.events_named("Agent.SubagentSpawned").len(), 1);

    let mock2 = Llmock::start().unwrap();
    let q = project(&mock2);
    q.write("w.fabro", &agent(", max_subagent_depth=0"));
    mock2.scenario(&json!([answer("Alone.")]));
    let run = q.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let tools = Llmock::tool_names(&mock2.bodies()[0]);
    assert!(!tools.contains(&"spawn_agent".to_owned()), "{tools:?}");
}
