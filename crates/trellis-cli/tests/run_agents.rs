//! Agent nodes end to end through the real `trellis` binary, with llmock standing in for Anthropic's API
//! and scripting the model's tool calls. Each test checks what happened on disk and in the run record,
//! and what the model was shown (llmock's request log).

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use std::fmt::Write as _;

use run_support::{Project, Run, stage_dir};
use serde_json::{Value, json};
use trellis_test::Llmock;

const KEY: &str = "sk-ant-test-agent-NEVER-SHOWN-4d2c";

fn project(mock: &Llmock) -> Project {
    Project::new()
        .with_env("ANTHROPIC_API_KEY", KEY)
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
}

/// A scripted turn that calls tools.
fn calls(calls: &[(&str, Value)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(name, arguments)| json!({ "name": name, "arguments": arguments }))
        .collect();
    json!({ "type": "reply", "tool_calls": calls, "times": 1 })
}

fn call(name: &str, arguments: Value) -> Value {
    calls(&[(name, arguments)])
}

fn answer(text: &str) -> Value {
    json!({ "type": "reply", "text": text, "times": 1 })
}

fn workflow(body: &str) -> String {
    format!(
        "digraph W {{\n graph [goal=\"Fix the add function\"]\n start [shape=Mdiamond]\n exit [shape=Msquare]\n {body}\n}}\n"
    )
}

/// One agent node between start and exit.
fn one_agent(attrs: &str) -> String {
    workflow(&format!(
        "fix [prompt=\"Fix add in src/lib.rs\", model=\"sonnet\"{attrs}]\n start -> fix -> exit"
    ))
}

fn stage_file(run: &Run, node: &str, name: &str) -> String {
    let path = stage_dir(&run.record(), node).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn status(run: &Run, node: &str) -> Value {
    serde_json::from_str(&stage_file(run, node, "status.json")).unwrap()
}

/// Whether a process has ended (a zombie waiting for its parent counts as ended).
fn gone(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.contains(") Z "))
}

fn lib_rs(p: &Project) {
    p.write(
        "src/lib.rs",
        "pub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n",
    );
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one agent stage checked whole: disk, request log, record, events, terminal"
)]
fn an_agent_reads_edits_runs_a_command_and_answers() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    p.write("w.fabro", &one_agent(""));
    mock.scenario(&json!([
        call("read_file", json!({ "path": "src/lib.rs" })),
        call(
            "edit_file",
            json!({ "path": "src/lib.rs", "old_string": "a - b", "new_string": "a + b" })
        ),
        // A write that fails (a refused path) is not a file touched.
        call(
            "write_file",
            json!({ "path": "../escaped.txt", "content": "x" })
        ),
        call(
            "shell",
            json!({ "command": "grep -c 'a + b' src/lib.rs; exit 101" })
        ),
        answer("Fixed: add now adds."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(
        p.read("src/lib.rs"),
        "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n"
    );
    assert!(!p.path().parent().unwrap().join("escaped.txt").exists());

    // What the model was shown: the prompt with tools, then each result in turn.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 5);
    let tools = Llmock::tool_names(&bodies[0]);
    assert_eq!(
        tools,
        [
            "read_file",
            "write_file",
            "edit_file",
            "shell",
            "grep",
            "glob",
            "list_dir",
            "spawn_agent",
            "send_input",
            "wait",
            "close_agent"
        ]
    );
    let system = &system_text(&bodies[0]);
    assert!(system.contains("coding agent"), "{system}");
    // It is shown the working directory, so it need not guess paths.
    assert!(
        system.contains("The working directory holds:\n") && system.contains("\nsrc/lib.rs\n"),
        "{system}"
    );
    let results = Llmock::tool_results(&bodies[4]);
    assert_eq!(results.len(), 4);
    assert_eq!(
        results[0]["content"],
        "     1\tpub fn add(a: i32, b: i32) -> i32 {\n     2\t    a - b\n     3\t}\n"
    );
    assert_eq!(
        results[1]["content"],
        "replaced 1 occurrence(s) in src/lib.rs; lines 1-3 now read:\n     1\tpub fn add(a: i32, b: i32) -> i32 {\n     2\t    a + b\n     3\t}\n"
    );
    assert_eq!(results[2]["is_error"], true);
    assert!(
        results[2]["content"]
            .as_str()
            .unwrap()
            .contains("outside the working directory")
    );
    assert_eq!(results[3]["content"], "1\n[exit 101]");

    // The stage's record.
    let status = status(&run, "fix");
    assert_eq!(status["files_touched"], json!(["src/lib.rs"]));
    assert_eq!(status["tool_calls"], 4);
    assert_eq!(status["turns"], 5);
    assert_eq!(status["model"], "claude-sonnet-4-5");
    assert!(status["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        stage_file(&run, "fix", "response.md"),
        "Fixed: add now adds."
    );
    assert!(
        stage_file(&run, "fix", "prompt.md")
            .ends_with("Fix add in src/lib.rs\n\nThe files the task names, as they are now:\n\nsrc/lib.rs\n```\npub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n```")
    );
    let transcript: Vec<Value> = stage_file(&run, "fix", "transcript.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = transcript
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "user",
            "turn",
            "usage",
            "tool_call",
            "tool_result",
            "turn",
            "usage",
            "tool_call",
            "tool_result",
            "turn",
            "usage",
            "tool_call",
            "tool_result",
            "turn",
            "usage",
            "tool_call",
            "tool_result",
            "turn",
            "usage",
            "assistant"
        ]
    );
    assert_eq!(run.context("response.fix"), "Fixed: add now adds.");

    // The events, in order, and files_touched on StageCompleted.
    let agent_events: Vec<String> = run
        .events()
        .iter()
        .filter(|e| e["event"].as_str().unwrap().starts_with("Agent."))
        .map(|e| {
            let name = e["event"].as_str().unwrap();
            match e["tool"].as_str() {
                Some(tool) => format!("{name} {tool}"),
                None => name.to_owned(),
            }
        })
        .collect();
    assert_eq!(
        agent_events,
        [
            "Agent.TurnStarted",
            "Agent.TurnCompleted",
            "Agent.ToolCallStarted read_file",
            "Agent.ToolCallCompleted read_file",
            "Agent.TurnStarted",
            "Agent.TurnCompleted",
            "Agent.ToolCallStarted edit_file",
            "Agent.ToolCallCompleted edit_file",
            "Agent.TurnStarted",
            "Agent.TurnCompleted",
            "Agent.ToolCallStarted write_file",
            "Agent.ToolCallCompleted write_file",
            "Agent.TurnStarted",
            "Agent.TurnCompleted",
            "Agent.ToolCallStarted shell",
            "Agent.ToolCallCompleted shell",
            "Agent.TurnStarted",
            "Agent.TurnCompleted",
        ]
    );
    let completed = run.events_named("StageCompleted");
    let fix = completed.iter().find(|e| e["node_id"] == "fix").unwrap();
    assert_eq!(fix["files_touched"], json!(["src/lib.rs"]));
    let shell = &run.events_named("Agent.ToolCallCompleted")[3];
    assert_eq!(shell["note"], "exit 101");
    assert_eq!(shell["is_error"], false);
    // The terminal shows each call under its stage.
    let stderr = run.stderr();
    assert!(
        stderr.contains("    fix: read_file src/lib.rs\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("    fix: shell grep -c 'a + b' src/lib.rs; exit 101 … exit 101\n"),
        "{stderr}"
    );
    // The key never reaches the record or the agent's commands.
    assert!(
        !std::fs::read_to_string(run.record().join("events.jsonl"))
            .unwrap()
            .contains(KEY)
    );
}

#[test]
fn output_is_cut_for_the_model_and_kept_whole_in_the_event() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &one_agent(""));
    mock.scenario(&json!([
        call(
            "shell",
            json!({ "command": "head -c 100000 /dev/zero | tr '\\0' x; echo; env" })
        ),
        answer("done"),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let shown = Llmock::tool_results(&mock.bodies()[1])[0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(shown.len() < 31_000, "{}", shown.len());
    assert!(shown.contains("characters cut"), "{}", &shown[..200]);
    assert!(shown.ends_with("[exit 0]"), "the tail is kept");
    let event = &run.events_named("Agent.ToolCallCompleted")[0];
    assert!(event["output_chars"].as_u64().unwrap() > 100_000);
    assert_eq!(
        event["output"].as_str().unwrap().len() as u64,
        event["output_chars"].as_u64().unwrap()
    );
    assert_eq!(
        event["shown_chars"].as_u64().unwrap() as usize,
        shown.chars().count()
    );
    // Secrets are not in the command's environment.
    assert!(
        !event["output"]
            .as_str()
            .unwrap()
            .contains("ANTHROPIC_API_KEY")
    );
    assert!(
        event["output"]
            .as_str()
            .unwrap()
            .contains("TRELLIS_RUN_ID=")
    );
}

#[test]
fn paths_outside_the_working_directory_are_refused_and_never_touched() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(outside.path(), p.path().join("link")).unwrap();
    let absolute = outside.path().join("abs.txt");
    p.write("w.fabro", &one_agent(""));
    mock.scenario(&json!([
        calls(&[
            ("write_file", json!({ "path": "../climb.txt", "content": "x" })),
            ("write_file", json!({ "path": absolute.to_str().unwrap(), "content": "x" })),
            ("write_file", json!({ "path": "link/through.txt", "content": "x" })),
            ("edit_file", json!({ "path": "link/secret.txt", "old_string": "outside", "new_string": "changed" })),
            ("read_file", json!({ "path": "link/secret.txt" })),
        ]),
        answer("done"),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    for result in Llmock::tool_results(&mock.bodies()[1]) {
        assert_eq!(result["is_error"], true, "{result}");
        assert!(
            result["content"]
                .as_str()
                .unwrap()
                .contains("outside the working directory"),
            "{result}"
        );
    }
    assert!(!p.path().parent().unwrap().join("climb.txt").exists());
    assert!(!absolute.exists());
    assert!(!outside.path().join("through.txt").exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
        "outside"
    );
    assert_eq!(
        status(&run, "fix").get("files_touched"),
        None,
        "nothing was touched"
    );
}

#[test]
fn a_shell_timeout_kills_the_command_and_everything_it_started() {
    // Unconfined, so that `$!` is a process id this test can look up (the sandbox has its own).
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &one_agent(""));
    mock.scenario(&json!([
        call(
            "shell",
            json!({ "command": "sleep 60 & echo $! > child.pid; sleep 60", "timeout_ms": 500 })
        ),
        answer("gave up"),
    ]));
    let run = p.run("w.fabro", &["--sandbox", "none"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let result = &Llmock::tool_results(&mock.bodies()[1])[0];
    assert_eq!(result["is_error"], true);
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("timed out after"),
        "{result}"
    );
    let pid = p.read("child.pid").trim().to_owned();
    assert_ne!(pid, "");
    assert!(gone(&pid), "the background child {pid} still runs");
    assert_eq!(
        run.events_named("Agent.ToolCallCompleted")[0]["note"],
        "timed out"
    );
}

#[test]
fn malformed_and_unknown_tool_calls_are_answered_with_errors() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &one_agent(""));
    mock.scenario(&json!([
        call("write_file", json!({ "path": "a.txt", "content": "some content here" })),
        { "type": "tool_fault", "kind": "malformed_arguments", "times": 1 },
        call("read_file", json!({ "path": "a.txt" })),
        { "type": "tool_fault", "kind": "unknown_tool", "times": 1 },
        call("list_dir", json!({})),
        { "type": "tool_fault", "kind": "unknown_tool", "times": 1 },
        answer("still standing"),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let results = Llmock::tool_results(&mock.bodies()[3]);
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["is_error"], true);
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("must be a JSON object"),
        "{}",
        results[0]
    );
    for result in &results[1..] {
        assert_eq!(result["is_error"], true);
        assert!(
            result["content"]
                .as_str()
                .unwrap()
                .contains("unknown tool `llmock_unknown_tool`"),
            "{result}"
        );
    }
    assert!(
        !p.path().join("a.txt").exists(),
        "the broken write wrote nothing"
    );
    assert_eq!(run.context("response.fix"), "still standing");
}

/// The system prompt of an agent's request: a text block every session of the agent shares, marked
/// for the prompt cache, then one of this stage's alone (the working directory's files), not marked.
fn system_text(body: &Value) -> String {
    let blocks = body["system"]
        .as_array()
        .expect("the system prompt as blocks");
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert_eq!(blocks[0]["cache_control"], json!({ "type": "ephemeral" }));
    assert!(blocks[1].get("cache_control").is_none(), "{blocks:?}");
    let session = blocks[1]["text"].as_str().unwrap();
    assert!(session.starts_with("The working directory "), "{session}");
    format!("{}\n\n{session}", blocks[0]["text"].as_str().unwrap())
}

#[test]
fn every_turn_sends_the_last_request_and_what_came_since_for_the_prompt_cache() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    p.write("w.fabro", &one_agent(""));
    mock.scenario(&json!([
        call("read_file", json!({ "path": "src/lib.rs" })),
        calls(&[
            ("list_dir", json!({ "path": "src" })),
            ("grep", json!({ "pattern": "add" })),
        ]),
        call(
            "edit_file",
            json!({ "path": "src/lib.rs", "old_string": "a - b", "new_string": "a + b" })
        ),
        call("shell", json!({ "command": "cat src/lib.rs" })),
        answer("Done."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 5);
    for (n, pair) in bodies.windows(2).enumerate() {
        let (before, after) = (&pair[0], &pair[1]);
        // Automatic caching: the breakpoint moves to the end of each request.
        assert_eq!(after["cache_control"], json!({ "type": "ephemeral" }));
        for unchanged in ["system", "tools", "model", "max_tokens"] {
            assert_eq!(
                before[unchanged], after[unchanged],
                "{unchanged} of request {n}"
            );
        }
        let (before, after) = (
            before["messages"].as_array().unwrap(),
            after["messages"].as_array().unwrap(),
        );
        assert!(after.len() > before.len());
        for (i, message) in before.iter().enumerate() {
            assert_eq!(
                message.to_string(),
                after[i].to_string(),
                "request {} changed message {i} of request {n}",
                n + 1
            );
        }
    }
    // Each turn's tokens, the cached part included, are in the transcript.
    let turns: Vec<Value> = stage_file(&run, "fix", "transcript.jsonl")
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|entry| entry["type"] == "usage")
        .collect();
    assert_eq!(turns.len(), 5);
    assert!(
        turns.iter().all(|t| t["usage"]["cached_tokens"].is_u64()
            && t["usage"]["input_tokens"].as_u64() > Some(0)),
        "{turns:?}"
    );
}

#[test]
fn every_agent_stage_opens_with_the_same_system_prompt_and_tools_for_the_prompt_cache() {
    // Two agent stages, the second after the first wrote a file: what they share (the tools, the
    // system prompt's marked block) is the same byte for byte; the working directory's files, the
    // stage's own, come after it.
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         one [prompt=\"Write notes.md.\", model=\"sonnet\"]\n two [prompt=\"Read it.\", model=\"sonnet\"]\n \
         start -> one -> two -> exit\n}\n",
    );
    mock.scenario(&json!([
        call("write_file", json!({ "path": "notes.md", "content": "n" })),
        answer("Written."),
        answer("Read."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 3);
    let (one, two) = (&bodies[0], &bodies[2]);
    assert_eq!(one["tools"], two["tools"]);
    assert_eq!(one["system"][0], two["system"][0]);
    let own = |body: &Value| body["system"][1]["text"].as_str().unwrap().to_owned();
    assert!(!own(one).contains("notes.md"), "{}", own(one));
    assert!(own(two).contains("\nnotes.md\n"), "{}", own(two));
    assert!(system_text(two).contains("coding agent"));
}

/// The text of every tool result in a request, in order.
fn result_texts(body: &Value) -> Vec<String> {
    Llmock::tool_results(body)
        .iter()
        .map(|r| r["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The last message of a request the model got, as JSON text.
fn last_message(body: &Value) -> String {
    body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .to_string()
}

/// A script of `first(i)` then `second`, `times` times.
fn alternating(times: usize, first: impl Fn(usize) -> Value, second: &Value) -> Vec<Value> {
    (0..times)
        .flat_map(|i| [first(i), second.clone()])
        .collect()
}

/// The stage stopped at the third loop warning, each named for `tool` with `period`.
fn assert_three_loops_of(run: &Run, tool: &str, period: usize) {
    assert_stopped_for_looping(run);
    let detected = run.events_named("Agent.LoopDetected");
    assert_eq!(detected.len(), 3);
    assert!(
        detected
            .iter()
            .all(|e| e["tools"] == json!([tool]) && e["period"] == period),
        "{detected:?}"
    );
}

#[test]
fn a_cycle_that_writes_is_named_to_the_model() {
    // Two commands alternately, ten times: each may change something (the first writes a file),
    // so none is refused as a repeat, but the cycle is named.
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &one_agent(""));
    let mut script = alternating(
        5,
        |_| call("shell", json!({ "command": "echo x > a.txt" })),
        &call("shell", json!({ "command": "cat a.txt" })),
    );
    script.push(answer("I was going round in circles."));
    mock.scenario(&Value::Array(script));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let detected = run.events_named("Agent.LoopDetected");
    assert_eq!(detected.len(), 1);
    assert_eq!(detected[0]["period"], 2);
    let bodies = mock.bodies();
    let last_user = bodies[10]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let texts: Vec<&str> = last_user["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts.len(), 1, "{last_user}");
    assert!(texts[0].starts_with("Loop detected"), "{}", texts[0]);
    // Before the tenth call nothing was said, and every call ran.
    assert!(!bodies[9].to_string().contains("Loop detected"));
    assert!(!bodies.iter().any(|b| b.to_string().contains("Not run")));
}

#[test]
fn a_write_that_undoes_a_change_is_named_to_the_model_and_the_third_stops_the_stage() {
    // A file written, changed by a command, written back, ...: every call runs (each changes
    // something), and from the second write on each puts the file back to what it held.
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &one_agent(""));
    let script = alternating(
        5,
        |_| call("write_file", json!({ "path": "a.txt", "content": "x" })),
        &call("shell", json!({ "command": "echo y > a.txt" })),
    );
    mock.scenario(&Value::Array(script));
    let run = p.run("w.fabro", &[]);
    assert_three_loops_of(&run, "write_file", 2);
    // Stopped right after the third undoing (the seventh call); the model was told at the first
    // (the third call), and nothing was refused.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 7);
    let told = last_message(&bodies[3]);
    assert!(
        told.contains("Loop detected: `a.txt` now holds what it held 2 call(s) ago"),
        "{told}"
    );
    assert!(!bodies[2].to_string().contains("Loop detected"));
    assert!(!bodies.iter().any(|b| b.to_string().contains("Not run")));
}

#[test]
fn a_check_that_keeps_failing_the_same_way_between_new_edits_is_named_and_the_third_time_stops_the_stage()
 {
    // A new edit each time (each writes, none undoes another), and after each the same wrong check,
    // failing the same way: as the local model went round for 3 minutes.
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &one_agent(""));
    let script = alternating(
        8,
        |i| {
            call(
                "write_file",
                json!({ "path": "count.txt", "content": format!("{}", 43 + i) }),
            )
        },
        &call("shell", json!({ "command": "cat shop.js" })),
    );
    mock.scenario(&Value::Array(script));
    let run = p.run("w.fabro", &[]);
    assert_three_loops_of(&run, "shell", 2);
    // The check's third identical failure (the sixth call) was named to the model, and each after
    // it; the session stopped at the fifth (the tenth call). Every call ran.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 10);
    assert!(!bodies[5].to_string().contains("Loop detected"));
    for (body, times) in [(&bodies[6], 3), (&bodies[8], 4)] {
        let told = last_message(body);
        assert!(
            told.contains(&format!(
                "Loop detected: `cat shop.js` failed {times} times in a row with the same output"
            )),
            "{told}"
        );
    }
    assert!(!bodies.iter().any(|b| b.to_string().contains("Not run")));
}

/// The `fix` stage failed because its model kept repeating itself after three warnings.
fn assert_stopped_for_looping(run: &Run) {
    let status = status(run, "fix");
    assert_eq!(status["status"], "failed");
    assert!(
        status["failure"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("the agent kept repeating the same tool calls after 3 warnings"),
        "{status}"
    );
}

#[test]
fn a_repeated_call_is_answered_without_running_and_a_model_that_keeps_on_is_stopped() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    p.write("w.fabro", &one_agent(""));
    // Interleaved: A, B, A, B, then A and B again and again.
    let script: Vec<Value> = (0..20)
        .map(|i| {
            if i % 2 == 0 {
                call("read_file", json!({ "path": "src/lib.rs" }))
            } else {
                call("list_dir", json!({ "path": "src" }))
            }
        })
        .collect();
    mock.scenario(&Value::Array(script));
    let run = p.run("w.fabro", &[]);
    assert_stopped_for_looping(&run);
    // Two of each ran; the third A, the third B and the fourth A were answered with the refusal,
    // and the session ended after the third.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 7, "stopped right after the third refusal");
    for (turn, body) in bodies.iter().enumerate().skip(1).take(4) {
        let results = result_texts(body);
        let last = results.last().unwrap();
        assert!(!last.starts_with("Not run"), "turn {turn}: {last}");
    }
    for body in &bodies[5..] {
        let last = result_texts(body).pop().unwrap();
        assert!(
            last.starts_with("Not run: this is call number 3 of `"),
            "{last}"
        );
    }
    let events = run.events_named("Agent.LoopDetected");
    let periods: Vec<&Value> = events.iter().map(|e| &e["period"]).collect();
    assert_eq!(periods, [2, 2, 2]);
    // The refused calls are in the record as calls that failed, with what the model was told.
    let completed = run.events_named("Agent.ToolCallCompleted");
    assert_eq!(completed.len(), 7);
    assert!(completed[4..].iter().all(|e| e["is_error"] == true));
}

#[test]
fn a_model_that_ignores_three_loop_warnings_is_stopped() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    p.write("w.fabro", &one_agent(""));
    let script: Vec<Value> = (0..40)
        .map(|_| call("list_dir", json!({ "path": "src" })))
        .collect();
    mock.scenario(&Value::Array(script));
    let run = p.run("w.fabro", &[]);
    assert_stopped_for_looping(&run);
    assert_eq!(run.events_named("Agent.LoopDetected").len(), 3);
    // Two ran, three were refused.
    assert_eq!(
        mock.bodies().len(),
        5,
        "stopped right after the third refusal"
    );
}

#[test]
fn an_answer_cut_off_at_the_output_limit_is_asked_for_again_not_taken() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    p.write("w.fabro", &one_agent(", max_tokens=64"));
    mock.scenario(&json!([
        { "type": "reply", "text": "Here is the whole of src/lib.rs, rewritten: pub fn add(a: i32, b: i32) -> i32 {", "finish_reason": "length", "times": 1 },
        answer("Fixed: add now adds."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(
        stage_file(&run, "fix", "response.md").trim(),
        "Fixed: add now adds."
    );
    // What the model was shown after its cut answer: that answer, then the request to answer again.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2);
    let messages = bodies[1]["messages"].as_array().unwrap();
    let cut = &messages[messages.len() - 2];
    assert_eq!(cut["role"], "assistant");
    assert!(cut.to_string().contains("rewritten: pub fn add"), "{cut}");
    let again = messages.last().unwrap().to_string();
    assert!(
        again.contains("Your answer was cut off at the output limit (64 tokens)"),
        "{again}"
    );
    let transcript = stage_file(&run, "fix", "transcript.jsonl");
    assert!(transcript.contains("\"type\":\"reminder\""), "{transcript}");
}

#[test]
fn an_edit_that_failed_is_not_tried_again_on_the_same_content() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    p.write("w.fabro", &one_agent(""));
    let guessed = json!({ "path": "src/lib.rs", "old_string": "a * b", "new_string": "a + b" });
    mock.scenario(&json!([
        call("edit_file", guessed.clone()),
        call("shell", json!({ "command": "cat src/lib.rs" })),
        call("edit_file", guessed.clone()),
        call(
            "edit_file",
            json!({ "path": "src/lib.rs", "old_string": "a - b", "new_string": "a + b" })
        ),
        // The content changed: the first edit may run again (and fails again, on the new content).
        call("edit_file", guessed),
        answer("Fixed."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(p.read("src/lib.rs").contains("a + b"));
    // What the model was shown for each edit.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 6);
    let result = |i: usize| Llmock::tool_results(&bodies[i]).last().unwrap()["content"].to_string();
    assert!(
        result(1).contains("old_string was not found"),
        "{}",
        result(1)
    );
    assert!(
        result(3).contains("Not run: this same `edit_file` call failed before"),
        "{}",
        result(3)
    );
    assert!(result(4).contains("replaced 1"), "{}", result(4));
    assert!(
        result(5).contains("old_string was not found"),
        "{}",
        result(5)
    );
    let detected = run.events_named("Agent.LoopDetected");
    assert_eq!(detected.len(), 1, "the refusal is a loop warning");
}

#[test]
fn a_blind_overwrite_is_refused_until_the_file_is_read() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    // The prompt does not name the file, so the model has not been shown it.
    p.write(
        "w.fabro",
        &workflow("fix [prompt=\"Fix add\", model=\"sonnet\"]\n start -> fix -> exit"),
    );
    let fixed = "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n";
    mock.scenario(&json!([
        call(
            "write_file",
            json!({ "path": "src/lib.rs", "content": fixed })
        ),
        call("read_file", json!({ "path": "src/lib.rs" })),
        call(
            "write_file",
            json!({ "path": "src/lib.rs", "content": fixed })
        ),
        answer("Fixed."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(p.read("src/lib.rs"), fixed);
    let bodies = mock.bodies();
    let refused = result_texts(&bodies[1]);
    assert!(
        refused[0]
            .starts_with("Cannot write to `src/lib.rs`: the file exists, and you have not read it"),
        "{refused:?}"
    );
    assert_eq!(Llmock::tool_results(&bodies[1])[0]["is_error"], true);
    let last = result_texts(&bodies[3]).pop().unwrap();
    assert!(last.starts_with("wrote "), "{last}");
}

#[test]
fn the_files_the_prompt_names_are_shown_with_it_and_count_as_read() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    p.write("notes.txt", "unrelated\n");
    p.write("w.fabro", &one_agent(""));
    let fixed = "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n";
    mock.scenario(&json!([
        call(
            "write_file",
            json!({ "path": "src/lib.rs", "content": fixed })
        ),
        answer("Fixed."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(p.read("src/lib.rs"), fixed);
    let bodies = mock.bodies();
    let shown = "Fix add in src/lib.rs\n\nThe files the task names, as they are now:\n\nsrc/lib.rs\n```\n\
                 pub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n```";
    let first = bodies[0].to_string();
    let opening = &bodies[0]["messages"][0]["content"];
    let user = opening.as_str().map_or_else(
        || {
            opening
                .as_array()
                .into_iter()
                .flatten()
                .map(|b| b["text"].as_str().unwrap_or_default())
                .collect()
        },
        str::to_owned,
    );
    assert!(user.ends_with(shown), "{user}");
    assert!(!first.contains("unrelated"), "{first}");
    // Written at once: the model was shown the file.
    assert!(
        result_texts(&bodies[1])[0].starts_with("wrote "),
        "{:?}",
        result_texts(&bodies[1])
    );
    assert!(stage_file(&run, "fix", "prompt.md").ends_with(shown));
}

/// A reviewer agent routed to `approve` or `fix` by the first source that has a directive.
fn review_workflow(schema: &str) -> String {
    workflow(&format!(
        "review [prompt=\"Review\", model=\"sonnet\"{schema}]\n \
         approve [shape=parallelogram, script=\"true\"]\n fix [shape=parallelogram, script=\"true\"]\n \
         start -> review\n review -> approve [label=\"Approve\"]\n review -> fix [label=\"Fix\"]\n \
         approve -> exit\n fix -> exit"
    ))
}

#[test]
fn routing_comes_from_the_response_then_status_json_then_the_last_file_touched() {
    let Some(mock) = Llmock::start() else { return };
    // 1. The response wins over status.json.
    let p = project(&mock);
    p.write("w.fabro", &review_workflow(""));
    mock.scenario(&json!([
        call(
            "write_file",
            json!({ "path": "status.json", "content": "{\"preferred_next_label\": \"fix\"}" })
        ),
        answer("Looks good. {\"preferred_next_label\": \"approve\"}"),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.stages(), ["start", "review", "approve", "exit"]);

    // 2. No directive in the response: status.json, written during the stage.
    let p = project(&mock);
    p.write("w.fabro", &review_workflow(""));
    mock.scenario(&json!([
        call("write_file", json!({ "path": "status.json", "content": "{\"preferred_next_label\": \"fix\", \"context_updates\": {\"from\": \"status\"}}" })),
        call("write_file", json!({ "path": "notes.md", "content": "{\"preferred_next_label\": \"approve\"}" })),
        answer("See status.json."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.stages(), ["start", "review", "fix", "exit"]);
    assert_eq!(run.context("from"), "status");

    // 3. Neither: the last file touched. A stale status.json from before the stage is ignored.
    let p = project(&mock);
    p.write("status.json", "{\"preferred_next_label\": \"fix\"}");
    let old = std::time::SystemTime::now() - std::time::Duration::from_hours(1);
    std::fs::File::options()
        .write(true)
        .open(p.path().join("status.json"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    p.write("w.fabro", &review_workflow(""));
    mock.scenario(&json!([
        call("write_file", json!({ "path": "review.md", "content": "Verdict:\n{\"preferred_next_label\": \"approve\"}\n" })),
        answer("Written to review.md."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.stages(), ["start", "review", "approve", "exit"]);
}

#[test]
fn a_routing_schema_is_repaired_in_the_same_live_session() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &review_workflow(", output_schema=\"routing\", output_retries=1"),
    );
    mock.scenario(&json!([
        call("list_dir", json!({})),
        // Malformed: a routing object with a wrong type. It is repaired, not passed over.
        answer("{\"preferred_next_label\": 7}"),
        call("read_file", json!({ "path": "w.fabro" })),
        answer("{\"preferred_next_label\": \"fix\"}"),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "review", "fix", "exit"]);
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 4);
    // The repair request continues the session: the tool call, the bad answer, then the correction.
    let messages = bodies[2]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5, "{messages:?}");
    assert_eq!(messages[1]["content"][0]["type"], "tool_use");
    assert_eq!(
        messages[3]["content"][0]["text"],
        "{\"preferred_next_label\": 7}"
    );
    let repair = messages[4]["content"][0]["text"].as_str().unwrap();
    assert!(
        repair.contains("`preferred_next_label` must be a string"),
        "{repair}"
    );
    let status = status(&run, "review");
    assert_eq!(status["repairs"], 1);
    assert_eq!(status["tool_calls"], 2);
    assert!(stage_file(&run, "review", "repairs.md").contains("must be a string"));
}

/// The second node of a thread sends the conversation exactly as it was sent before, under the
/// same system prompt — what it said of the first node's session included — so that the provider's
/// prompt cache still holds all of it (llama-server computed all of it again when the system prompt
/// changed); what is its session's own, the working directory as it is now, opens its prompt.
#[test]
fn a_second_node_on_the_thread_continues_the_live_session() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    lib_rs(&p);
    p.write(
        "w.fabro",
        &workflow(
            "subgraph cluster_impl { node [thread_id=\"impl\", fidelity=\"full\", model=\"sonnet\"]\n \
             implement [prompt=\"Implement it\"]\n test [prompt=\"Now write tests\"] }\n \
             made [shape=parallelogram, script=\"touch made.txt\"]\n \
             start -> implement -> made -> test -> exit",
        ),
    );
    mock.scenario(&json!([
        call("read_file", json!({ "path": "src/lib.rs" })),
        answer("Implemented."),
        call(
            "write_file",
            json!({ "path": "tests/add.rs", "content": "#[test] fn t() {}\n" })
        ),
        answer("Tests written."),
    ]));
    let run = p.run("w.fabro", &["--verbose"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    // --verbose streams the models' text as it comes.
    assert!(run.stderr().contains("Implemented.\n"), "{}", run.stderr());
    let bodies = mock.bodies();
    let messages = bodies[2]["messages"].as_array().unwrap();
    // The first node's prompt, its tool call and result, its answer, then the second prompt alone.
    assert_eq!(messages.len(), 5, "{messages:?}");
    assert!(
        messages[0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .ends_with("Implement it")
    );
    assert_eq!(messages[1]["content"][0]["name"], "read_file");
    assert_eq!(messages[2]["content"][0]["type"], "tool_result");
    assert_eq!(messages[3]["content"][0]["text"], "Implemented.");
    assert_eq!(messages[0], bodies[0]["messages"][0]);
    // The same system prompt and tools: the files it names are the first session's.
    assert_eq!(bodies[2]["system"], bodies[0]["system"]);
    assert_eq!(bodies[2]["tools"], bodies[0]["tools"]);
    let system = bodies[0]["system"].to_string();
    assert!(
        system.contains("src/lib.rs") && !system.contains("made.txt"),
        "{system}"
    );
    // The second prompt, after the working directory as it is now; the stage's record shows it.
    let second = messages[4]["content"][0]["text"].as_str().unwrap();
    assert!(
        second.starts_with("The working directory holds:\n")
            && second.contains("made.txt")
            && second.ends_with("\n\nNow write tests"),
        "{second}"
    );
    assert_eq!(stage_file(&run, "test", "prompt.md"), second);
    assert_eq!(
        status(&run, "test")["files_touched"],
        json!(["tests/add.rs"])
    );
    assert_eq!(status(&run, "implement").get("files_touched"), None);
}

#[test]
fn a_small_context_window_forces_compaction() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        ".config/trellis/config.toml",
        "[providers.anthropic]\ncontext_window = 2000\n",
    );
    p.write("big.txt", &"0123456789abcdef\n".repeat(30));
    p.write("w.fabro", &one_agent(""));
    // The agent's turns offer tools; the summary request does not: each reply waits for its kind.
    let agent = json!({ "tools": true });
    let mut script = vec![json!({
        "type": "reply", "match": agent,
        "tool_calls": [{ "name": "write_file", "arguments": { "path": "notes.md", "content": "progress" } }],
    })];
    for i in 0..8 {
        script.push(json!({
            "type": "reply", "match": agent,
            "tool_calls": [{ "name": "read_file", "arguments": { "path": "big.txt", "limit": 100 + i } }],
        }));
    }
    script.push(json!({ "type": "reply", "match": agent, "text": "All done." }));
    script.push(json!({
        "type": "reply", "match": { "tools": false },
        "text": "Summary of the work so far: read big.txt eight times.",
    }));
    mock.scenario(&Value::Array(script));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let warnings = run.events_named("Agent.ContextWindowWarning");
    assert_ne!(warnings, [] as [serde_json::Value; 0]);
    // Compacted before any request outgrew the window (as the provider counted it).
    for call in run.events_named("ModelCallCompleted") {
        let input = call["usage"]["input_tokens"].as_u64().unwrap();
        assert!(input < 2000, "{call}");
    }
    assert_eq!(warnings[0]["context_window_size"], 2000);
    assert!(warnings[0]["usage_percent"].as_u64().unwrap() >= 80);
    let started = run.events_named("Agent.CompactionStarted");
    let completed = run.events_named("Agent.CompactionCompleted");
    assert_eq!(started.len(), 1);
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0]["preserved_turn_count"], 6);
    assert_eq!(completed[0]["tracked_file_count"], 1);
    let original = completed[0]["original_turn_count"].as_u64().unwrap();
    assert!(original > 6, "{original}");

    // The summary request: no tools, the sections asked for, the old turns rendered with cut arguments.
    let bodies = mock.bodies();
    let (index, summary) = bodies
        .iter()
        .enumerate()
        .find(|(_, b)| {
            b["system"]
                .as_str()
                .is_some_and(|s| s.starts_with("You summarise"))
        })
        .expect("a summary request");
    assert!(summary.get("tools").is_none() || summary["tools"].as_array().unwrap().is_empty());
    let system = summary["system"].as_str().unwrap();
    for section in [
        "## Goal",
        "## Progress",
        "## Key Decisions",
        "## Failed Approaches",
        "## Open Issues",
        "## Next Steps",
    ] {
        assert!(system.contains(section), "{section}");
    }
    let rendered = summary["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(rendered.contains("Fix add in src/lib.rs"), "{rendered}");
    assert!(
        rendered.contains("Assistant called write_file"),
        "{rendered}"
    );
    assert!(
        rendered.contains("more characters]"),
        "results are cut to 500 characters"
    );

    // The next request: the summary message first (with the tracked files verbatim), then the six
    // preserved turns.
    let next = &bodies[index + 1];
    let messages = next["messages"].as_array().unwrap();
    let first = messages[0]["content"][0]["text"].as_str().unwrap();
    assert!(
        first.starts_with("[Context Summary]\n\nSummary of the work so far"),
        "{first}"
    );
    assert!(
        first.ends_with("## File Operations\n- notes.md\n"),
        "{first}"
    );
    let assistant_turns = messages.iter().filter(|m| m["role"] == "assistant").count();
    assert_eq!(assistant_turns, 6);
    assert_eq!(run.context("response.fix"), "All done.");
}

/// Reads of a large file fill a window of 8,000 tokens; at 80% the agent is asked for the summary at
/// the end of its own conversation, so the provider's prompt cache serves all of the request but
/// the one message asking for it.
#[test]
fn ahead_of_a_full_window_the_summary_is_asked_at_the_end_of_the_conversation() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        ".config/trellis/config.toml",
        "[providers.anthropic]\ncontext_window = 8000\n",
    );
    p.write("big.txt", &"0123456789abcdef\n".repeat(120));
    p.write("w.fabro", &one_agent(""));
    let mut script: Vec<Value> = (0..READS_BEFORE_COMPACTION)
        .map(|i| call("read_file", json!({ "path": "big.txt", "limit": 120 + i })))
        .collect();
    script.push(answer("## Goal\nFix add.\n## Progress\nRead big.txt."));
    script.push(answer("All done."));
    mock.scenario(&Value::Array(script));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.events_named("Agent.CompactionCompleted").len(), 1);
    assert_eq!(run.context("response.fix"), "All done.");
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), READS_BEFORE_COMPACTION + 2);
    let (before, asked) = (&bodies[bodies.len() - 3], &bodies[bodies.len() - 2]);
    // The conversation's next request: system prompt, tools and every message as they were.
    for unchanged in ["system", "tools", "model"] {
        assert_eq!(before[unchanged], asked[unchanged], "{unchanged}");
    }
    let (before, messages) = (
        before["messages"].as_array().unwrap(),
        asked["messages"].as_array().unwrap(),
    );
    for (i, message) in before.iter().enumerate() {
        assert_eq!(message.to_string(), messages[i].to_string(), "message {i}");
    }
    // Then the last tool result, and beside it the request for the summary.
    let last = messages.last().unwrap()["content"].as_array().unwrap();
    assert_eq!(last[0]["type"], "tool_result");
    let request = last.last().unwrap()["text"].as_str().unwrap();
    assert!(
        request.starts_with("Stop the task for a moment") && request.contains("## Next Steps"),
        "{request}"
    );
    // The answer fits what the window has left (about 1,200 tokens) and a summary's limit.
    assert_eq!(asked["max_tokens"], 1_024);
    // The next turn opens with that summary.
    let next = &bodies[bodies.len() - 1];
    let first = next["messages"][0]["content"][0]["text"].as_str().unwrap();
    assert!(
        first.starts_with("[Context Summary]\n\n## Goal\nFix add."),
        "{first}"
    );
    // The transcript keeps the summary the session went on from.
    let transcript = stage_file(&run, "fix", "transcript.jsonl");
    let compaction: Value = transcript
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|entry| entry["type"] == "compaction")
        .expect("a compaction entry");
    assert_eq!(
        compaction["summary"],
        "## Goal\nFix add.\n## Progress\nRead big.txt."
    );
}

/// How many 120-line reads the window of the test above holds before compaction (as llmock
/// counts tokens).
const READS_BEFORE_COMPACTION: usize = 9;

#[test]
fn a_context_overflow_answer_compacts_the_thread_and_sends_the_turn_again() {
    // The catalog's window is large, so nothing is compacted ahead; the provider says otherwise
    // when the thread's second node (on a model of its own) sends the history on.
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("big.txt", &"0123456789abcdef\n".repeat(30));
    p.write(
        "w.fabro",
        &workflow(
            "node [thread_id=\"t\", fidelity=\"full\"]\n \
             fix [prompt=\"Fix add in src/lib.rs\", model=\"sonnet\"]\n \
             check [prompt=\"Check the fix\", model=\"opus\"]\n \
             start -> fix -> check -> exit",
        ),
    );
    let first = json!({ "tools": true, "model": "claude-sonnet*" });
    let second = json!({ "tools": true, "model": "claude-opus*" });
    let mut script: Vec<Value> = (0..8)
        .map(|i| {
            json!({
                "type": "reply", "match": first,
                "tool_calls": [{ "name": "read_file", "arguments": { "path": "big.txt", "limit": 100 + i } }],
            })
        })
        .collect();
    script.push(json!({ "type": "reply", "match": first, "text": "Fixed." }));
    script.push(json!({
        "type": "fail", "match": second, "status": 400, "times": 1,
        "message": "prompt is too long: 210000 tokens > 200000 maximum",
    }));
    script.push(json!({
        "type": "reply", "match": { "tools": false },
        "text": "Summary of the work so far: read big.txt eight times.",
    }));
    script.push(json!({ "type": "reply", "match": second, "text": "All done." }));
    mock.scenario(&Value::Array(script));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.context("response.check"), "All done.");

    // What the model was sent: the turn that did not fit, the summary request, and the same turn
    // again with the older turns summarised.
    let bodies = mock.bodies();
    assert_eq!(
        bodies.len(),
        12,
        "9 turns, the refused one, the summary, the retry"
    );
    assert!(system_of(&bodies[10]).starts_with("You summarise"));
    let (refused, retried) = (&bodies[9]["messages"], &bodies[11]["messages"]);
    let first = retried[0]["content"][0]["text"].as_str().unwrap();
    assert!(
        first.starts_with("[Context Summary]\n\nSummary of the work so far"),
        "{first}"
    );
    let refused = refused.as_array().unwrap();
    let retried = retried.as_array().unwrap();
    assert!(retried.len() < refused.len());
    assert_eq!(
        retried[1..],
        refused[refused.len() - (retried.len() - 1)..],
        "the preserved turns are sent unchanged"
    );
    let failed: Vec<Value> = run
        .events_named("ModelCallCompleted")
        .into_iter()
        .filter(|e| !e["error"].is_null())
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["kind"], "context_length");
    assert_eq!(run.events_named("Agent.CompactionCompleted").len(), 1);
}

/// A request's system prompt, whether it was sent as text or as blocks.
fn system_of(body: &Value) -> String {
    match &body["system"] {
        Value::String(text) => text.clone(),
        Value::Array(_) => system_text(body),
        other => panic!("no system prompt: {other}"),
    }
}

#[test]
fn max_turns_fails_the_stage_and_keeps_the_work() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &one_agent(", max_turns=2"));
    mock.scenario(&json!([
        call("write_file", json!({ "path": "a.txt", "content": "one" })),
        call("write_file", json!({ "path": "b.txt", "content": "two" })),
        answer("never asked"),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(p.read("b.txt"), "two");
    let status = status(&run, "fix");
    assert_eq!(status["status"], "failed");
    assert!(
        status["failure"]["reason"]
            .as_str()
            .unwrap()
            .contains("used its 2 turn(s) (max_turns)"),
        "{status}"
    );
    assert_eq!(status["failure"]["class"], "budget_exhausted");
    assert_eq!(status["files_touched"], json!(["a.txt", "b.txt"]));
    assert_eq!(mock.bodies().len(), 2);
}

#[test]
fn allowed_and_disallowed_tools_narrow_what_is_offered() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &one_agent(", allowed_tools=\"read_file,grep,shell\", disallowed_tools=\"shell\""),
    );
    mock.scenario(&json!([
        call("shell", json!({ "command": "touch x" })),
        answer("ok")
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    let offered = Llmock::tool_names(&bodies[0]);
    assert_eq!(offered, ["read_file", "grep"]);
    assert_eq!(Llmock::tool_results(&bodies[1])[0]["is_error"], true);
    assert!(!p.path().join("x").exists());

    let p = project(&mock);
    p.write("w.fabro", &one_agent(", allowed_tools=\"read_fil\""));
    let asked = mock.bodies().len();
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(1));
    // Refused before anything runs, with the nearest tool's name.
    assert!(
        run.stderr()
            .contains("error[agent-tools]: agent node `fix`: `read_fil` in allowed_tools is no tool of the agent")
            && run.stderr().contains("did you mean `read_file`?")
            && mock.bodies().len() == asked,
        "{}",
        run.stderr()
    );
}

/// A web server on loopback whose every answer is `page`, as HTML.
fn web_page(page: &'static str) -> String {
    use std::io::{BufRead as _, BufReader, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/notes", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let _ = write!(
                reader.get_mut(),
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    url
}

/// `read_many_files` and `web_fetch` are offered only when `allowed_tools` names them: the page
/// comes back as Markdown without its scripts, the files each under its path; a node that cuts the
/// network is refused the fetch.
#[test]
fn web_fetch_and_read_many_files_are_offered_when_named() {
    let Some(mock) = Llmock::start() else { return };
    let url = web_page(
        "<html><head><script>var tracking = 'xyz';</script><style>p { color: red }</style></head>\
         <body><h1>Release notes</h1><p>Version <b>2.1</b> fixes the parser.</p></body></html>",
    );
    let p = project(&mock);
    p.write(
        "src/lib.rs",
        "pub fn add(a: i32, b: i32) -> i32 { a - b }\n",
    );
    p.write(
        "w.fabro",
        &one_agent(", allowed_tools=\"read_many_files,web_fetch\""),
    );
    mock.scenario(&json!([
        call("web_fetch", json!({ "url": url })),
        call(
            "read_many_files",
            json!({ "paths": ["src/lib.rs", "nope.rs"] })
        ),
        answer("Read them."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    let offered = Llmock::tool_names(&bodies[0]);
    assert_eq!(offered, ["read_many_files", "web_fetch"]);
    let fetched = &Llmock::tool_results(&bodies[1])[0];
    let page = fetched["content"].as_str().unwrap();
    assert!(
        fetched["is_error"] != true
            && page.contains("# Release notes")
            && page.contains("Version **2.1** fixes the parser.")
            && !page.contains("tracking")
            && !page.contains("color"),
        "{fetched}"
    );
    let read = Llmock::tool_results(&bodies[2]).last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        read.starts_with("=== src/lib.rs ===\n     1\tpub fn add")
            && read.contains("=== nope.rs ===\n["),
        "{read}"
    );

    // Where the node cuts the network, so does the tool.
    mock.reset();
    p.write(
        "w.fabro",
        &one_agent(", allowed_tools=\"web_fetch\", sandbox=\"network=off\""),
    );
    mock.scenario(&json!([
        call("web_fetch", json!({ "url": url })),
        answer("No.")
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let refused = Llmock::tool_results(&mock.bodies()[1])
        .last()
        .cloned()
        .unwrap();
    assert_eq!(refused["is_error"], true);
    assert!(
        refused["content"]
            .as_str()
            .unwrap()
            .contains("this stage has no network"),
        "{refused}"
    );
}

/// A Brave Search API on loopback answering every request with `body`, keeping each request's
/// head (its line and headers).
fn brave_search(body: &'static str) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead as _, BufReader, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/res/v1", listener.local_addr().unwrap());
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = heads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let (mut head, mut line) = (String::new(), String::new());
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                head.push_str(&line);
                line.clear();
            }
            kept.lock().unwrap().push(head);
            let _ = write!(
                reader.get_mut(),
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (base, heads)
}

/// `web_search` (offered when named, Fabro's tool) asks Brave Search with the key in Trellis's
/// environment and shows the model the results, numbered; the key reaches neither the model nor
/// the agent's commands. Without the key the run stops before its first stage.
#[test]
fn web_search_asks_brave_search_with_the_users_key() {
    let Some(mock) = Llmock::start() else { return };
    let (base, heads) = brave_search(
        r#"{"type":"search","web":{"type":"search","results":[{"title":"<strong>tokio</strong>::select","url":"https://docs.rs/tokio/latest/tokio/macro.select.html","description":"Waits on multiple concurrent branches &amp; returns the first."}]}}"#,
    );
    let key = "brave-key-5f1c9a52d3e6";
    let p = project(&mock)
        .with_env("BRAVE_SEARCH_API_KEY", key)
        .with_env("BRAVE_SEARCH_BASE_URL", &base);
    p.write(
        "w.fabro",
        &one_agent(", allowed_tools=\"web_search,shell\""),
    );
    mock.scenario(&json!([
        call(
            "web_search",
            json!({ "query": "tokio select", "max_results": 1 })
        ),
        call(
            "shell",
            json!({ "command": "env | grep -c BRAVE_SEARCH_API_KEY; true" })
        ),
        answer("Found it."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(Llmock::tool_names(&bodies[0]), ["shell", "web_search"]);
    let found = &Llmock::tool_results(&bodies[1])[0];
    assert_eq!(
        found["content"],
        "1. **tokio**::select\n   https://docs.rs/tokio/latest/tokio/macro.select.html\n   Waits on multiple concurrent branches & returns the first.",
        "{found}"
    );
    let head = heads.lock().unwrap()[0].to_ascii_lowercase();
    assert!(
        head.starts_with("get /res/v1/web/search?q=tokio+select&count=1 http/1.1\r\n")
            && head.contains(&format!("\r\nx-subscription-token: {key}\r\n")),
        "{head}"
    );
    let env = Llmock::tool_results(&bodies[2]).last().unwrap()["content"].clone();
    assert!(
        env.as_str().unwrap().starts_with('0'),
        "the agent's commands do not get the key: {env}"
    );
    for body in &bodies {
        assert!(
            !body.to_string().contains(key),
            "the model was shown the key"
        );
    }

    // Without the key, nothing runs.
    let keyless = project(&mock).with_env("BRAVE_SEARCH_BASE_URL", &base);
    keyless.write("w.fabro", &one_agent(", allowed_tools=\"web_search\""));
    let asked = mock.bodies().len();
    let out = keyless.command(&["run", "w.fabro"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the run cannot start")
            && stderr.contains(
                "node `fix`: `web_search` needs a Brave Search API key in BRAVE_SEARCH_API_KEY"
            ),
        "{stderr}"
    );
    assert_eq!(mock.bodies().len(), asked);
    assert_eq!(heads.lock().unwrap().len(), 1);
}

/// `trellis exec "PROMPT"`: one agent on the working directory, without a workflow file. The
/// prompt reaches the model as written (no template is read in it), the agent's tools work on the
/// directory, its answer is standard output and the run is recorded like any other.
#[test]
fn exec_runs_one_agent_on_a_prompt() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "src/lib.rs",
        "pub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n",
    );
    mock.scenario(&json!([
        call("read_file", json!({ "path": "src/lib.rs" })),
        call(
            "edit_file",
            json!({ "path": "src/lib.rs", "old_string": "a - b", "new_string": "a + b" })
        ),
        answer("Fixed: `add` adds now."),
    ]));
    let prompt = "Fix add in src/lib.rs; $PATH, {{ braces }} and $goal stay as written";
    let out = p
        .command(&["exec", prompt, "--model", "sonnet", "--max-turns", "5"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Fixed: `add` adds now.\n"
    );
    assert!(
        stderr.contains("✓ agent") && stderr.contains("succeeded: 3 stages"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(p.path().join("src/lib.rs")).unwrap(),
        "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n"
    );
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 3);
    assert!(
        Llmock::tool_names(&bodies[0]).contains(&"edit_file".to_owned()),
        "{:?}",
        Llmock::tool_names(&bodies[0])
    );
    assert!(bodies[0].to_string().contains(prompt), "{}", bodies[0]);
    // A run like any other: shown, its agent's transcript read back.
    let run = p.only_run();
    let id = run.file_name().unwrap().to_str().unwrap();
    let shown = p.command(&["show", id]).output().unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("agent") && shown.contains("succeeded"),
        "{shown}"
    );
}

/// `trellis exec -` reads the prompt from standard input; `--json` gives the summary with the
/// answer; `--permissions read-only` holds for its agent as for a workflow's. No prompt, or an
/// empty one, is a usage error.
#[test]
fn exec_reads_its_prompt_from_standard_input() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("notes.md", "old\n");
    mock.scenario(&json!([
        call("read_file", json!({ "path": "notes.md" })),
        call(
            "edit_file",
            json!({ "path": "notes.md", "old_string": "old", "new_string": "new" })
        ),
        answer("I may not edit it."),
    ]));
    let mut child = p
        .command(&[
            "exec",
            "-",
            "--model",
            "sonnet",
            "--permissions",
            "read-only",
            "--json",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"Update notes.md\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["status"], "succeeded");
    assert_eq!(summary["response"], "I may not edit it.");
    assert_eq!(
        std::fs::read_to_string(p.path().join("notes.md")).unwrap(),
        "old\n"
    );
    let bodies = mock.bodies();
    let refused = Llmock::tool_results(&bodies[bodies.len() - 1]);
    assert!(
        refused.last().unwrap()["content"]
            .to_string()
            .contains("read-only"),
        "{refused:?}"
    );
    assert!(
        bodies[0].to_string().contains("Update notes.md"),
        "{}",
        bodies[0]
    );

    // No prompt, an empty one: a usage error, nothing recorded.
    let p = project(&mock);
    for args in [&["exec", ""][..], &["exec", "-"][..]] {
        let out = p
            .command(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("error: the prompt is empty"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(!p.run_exists());
}

/// An `exec` run killed during its agent's tool call and resumed prints the agent's answer when it
/// ends, as `trellis exec` would have: the record says which node's response is the run's answer.
#[test]
fn exec_resumed_after_a_kill_prints_its_answer() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    mock.scenario(&json!([call(
        "shell",
        json!({ "command": "echo $$ > shell.pid; sleep 60" })
    )]));
    let mut child = p
        .command(&[
            "exec",
            "Count the files",
            "--model",
            "sonnet",
            "--sandbox",
            "none",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    run_support::wait_for(
        "the shell to start",
        std::time::Duration::from_secs(20),
        || !p.read("shell.pid").trim().is_empty(),
    );
    child.kill().unwrap(); // SIGKILL, in the middle of the shell call
    child.wait().unwrap();
    let record = p.only_run();
    let id = record.file_name().unwrap().to_string_lossy().into_owned();

    mock.reset();
    mock.scenario(&json!([answer("There are 2 files.")]));
    let out = p
        .command(&["resume", &id, "--sandbox", "none"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "There are 2 files.\n");
    assert!(stderr.contains("succeeded: 3 stages"), "{stderr}");
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 1);
    assert!(
        bodies[0].to_string().contains("Count the files"),
        "the resumed agent was asked the prompt again: {}",
        bodies[0]
    );
    // The record names the node whose response is the answer (a workflow's run names none).
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(record.join("run.json")).unwrap()).unwrap();
    assert_eq!(meta["answer_node"], "agent");

    // Resumed again once done: nothing runs, and the answer is printed as it was.
    mock.reset();
    let again = p
        .command(&["resume", &id, "--sandbox", "none"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "There are 2 files.\n"
    );
    assert!(stderr.contains("already succeeded"), "{stderr}");
    assert_eq!(mock.bodies().len(), 0);
}

/// `apply_patch` (offered when named) changes several files in one call, whole or not at all: a
/// deletion of a file the agent has not read is refused, and nothing of that patch applied.
#[test]
fn apply_patch_changes_files_when_named() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "src/lib.rs",
        "pub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n",
    );
    p.write("NOTES.md", "old notes\n");
    p.write(
        "w.fabro",
        &one_agent(", allowed_tools=\"read_file,apply_patch\""),
    );
    let fix = "*** Begin Patch\n*** Update File: src/lib.rs\n@@ pub fn add(a: i32, b: i32) -> i32 {\n-    a - b\n+    a + b\n*** Add File: CHANGES.md\n+Fixed add.\n*** End Patch";
    let unread =
        "*** Begin Patch\n*** Add File: more.md\n+x\n*** Delete File: NOTES.md\n*** End Patch";
    mock.scenario(&json!([
        call("apply_patch", json!({ "patch": unread })),
        call("apply_patch", json!({ "patch": fix })),
        answer("Fixed."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    let refused = Llmock::tool_results(&bodies[1]).last().cloned().unwrap();
    assert_eq!(refused["is_error"], true);
    assert!(
        refused["content"]
            .as_str()
            .unwrap()
            .starts_with("Cannot delete `NOTES.md`: you have not read it."),
        "{refused}"
    );
    assert!(!p.path().join("more.md").exists());
    assert_eq!(p.read("NOTES.md"), "old notes\n");
    let applied = Llmock::tool_results(&bodies[2]).last().cloned().unwrap();
    assert_eq!(
        applied["content"],
        "applied the patch: updated src/lib.rs (1 chunk(s)), added CHANGES.md"
    );
    assert_eq!(
        p.read("src/lib.rs"),
        "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n"
    );
    assert_eq!(p.read("CHANGES.md"), "Fixed add.\n");
    assert_eq!(
        status(&run, "fix")["files_touched"],
        json!(["src/lib.rs", "CHANGES.md"])
    );
}

#[test]
fn a_run_killed_during_a_tool_call_resumes_by_running_that_stage_again() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &workflow(
            "prep [shape=parallelogram, script=\"echo prep >> prep.log\"]\n              fix [prompt=\"Fix it\", model=\"sonnet\"]\n start -> prep -> fix -> exit",
        ),
    );
    mock.scenario(&json!([
        call(
            "write_file",
            json!({ "path": "first.txt", "content": "before the kill" })
        ),
        call(
            "shell",
            json!({ "command": "echo $$ > shell.pid; sleep 60" })
        ),
    ]));
    // Unconfined: the test is of the reaper a resume runs, which finds the shell by the run's marker.
    let mut child = p
        .command(&["run", "w.fabro", "--sandbox", "none"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    p.wait_for_event("Agent.ToolCallStarted", "fix");
    run_support::wait_for(
        "the shell to start",
        std::time::Duration::from_secs(10),
        || !p.read("shell.pid").trim().is_empty(),
    );
    child.kill().unwrap(); // SIGKILL, in the middle of the shell call
    child.wait().unwrap();
    let record = p.only_run();
    let id = record.file_name().unwrap().to_string_lossy().into_owned();
    let pid = p.read("shell.pid").trim().to_owned();
    // The killed stage's transcript holds what it did up to the kill.
    let transcript =
        std::fs::read_to_string(stage_dir(&record, "fix").join("transcript.jsonl")).unwrap();
    assert!(transcript.contains("\"tool\":\"shell\""), "{transcript}");

    mock.reset();
    mock.scenario(&json!([
        call("read_file", json!({ "path": "first.txt" })),
        answer("Done after the restart."),
    ]));
    let resumed = p.resume(&id, &["--sandbox", "none"]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    assert_eq!(resumed.stages(), ["start", "prep", "fix", "exit"]);
    assert_eq!(
        p.read("prep.log"),
        "prep\n",
        "the finished stage did not run again"
    );
    assert_eq!(resumed.context("response.fix"), "Done after the restart.");
    // A workflow's run has no answer to print (only `trellis exec`'s names one).
    assert!(
        !std::fs::read_to_string(record.join("run.json"))
            .unwrap()
            .contains("answer_node")
    );
    // The interrupted shell's process group was stopped when the run resumed.
    assert!(gone(&pid), "the killed run's shell {pid} still runs");
    // Nothing finished was lost: the first attempt's events are still in the log.
    let started = resumed.events_named("Agent.ToolCallStarted");
    let tools: Vec<&str> = started
        .iter()
        .map(|e| e["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["write_file", "shell", "read_file"]);
    let bodies = mock.bodies();
    assert!(
        bodies[0]["messages"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("- **prep**: succeeded"),
        "the re-run stage's preamble shows the finished stage"
    );
}

#[test]
fn project_memory_is_read_from_the_repository_root_down_to_the_working_directory() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    std::fs::create_dir(p.path().join(".git")).unwrap();
    p.write("AGENTS.md", "Root rule: keep it simple.");
    p.write("pkg/CLAUDE.md", "Package rule: no unsafe code.");
    p.write("pkg/w.fabro", &one_agent(""));
    // A cloned repository's memory files may be links: to another memory file, read; out of the
    // project or to a device, not (a secret would reach the model; /dev/zero would never end).
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "hunter2-outside").unwrap();
    std::os::unix::fs::symlink("AGENTS.md", p.path().join("GEMINI.md")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), p.path().join("CLAUDE.md")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", p.path().join("pkg/AGENTS.md")).unwrap();
    mock.scenario(&json!([answer("ok")]));
    let output = p
        .command(&["run", "w.fabro", "--json"])
        .current_dir(p.path().join("pkg"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let system = system_text(&mock.bodies()[0]);
    let root = system
        .find("# AGENTS.md\n\nRoot rule: keep it simple.")
        .expect(&system);
    let package = system
        .find("# pkg/CLAUDE.md\n\nPackage rule: no unsafe code.")
        .expect(&system);
    assert!(root < package, "outermost first: {system}");
    assert!(
        system.contains("# GEMINI.md\n\nRoot rule: keep it simple."),
        "{system}"
    );
    assert!(!system.contains("hunter2-outside"), "{system}");
    assert!(!system.contains("# CLAUDE.md") && !system.contains("# pkg/AGENTS.md"));
}

#[test]
fn a_fan_out_of_more_agents_than_the_blocking_pool_has_threads_finishes() {
    // Each agent writes its transcript for its whole stage; the twenty are all running at once
    // (their shell calls wait for one another), more than the run's pool of blocking threads, which
    // must still serve their files.
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    let branches = 20;
    let mut body = format!(
        "fan [shape=component, max_parallel={branches}]\n merge [shape=tripleoctagon]\n start -> fan\n merge -> exit\n"
    );
    for i in 0..branches {
        let _ = writeln!(
            body,
            " a{i} [prompt=\"Wait a moment\", model=\"sonnet\"]\n fan -> a{i} -> merge"
        );
    }
    p.write("w.fabro", &workflow(&body));
    // A barrier: each shell waits (up to 20 s) until all twenty are running.
    let barrier = format!(
        "mktemp started.XXXXXX >/dev/null; for i in $(seq 400); do [ $(ls started.* | wc -l) -ge {branches} ] && exit 0; sleep 0.05; done; exit 1"
    );
    let mut scenario: Vec<Value> = (0..branches)
        .map(|_| call("shell", json!({ "command": barrier })))
        .collect();
    scenario.extend((0..branches).map(|_| answer("Waited.")));
    mock.scenario(&Value::Array(scenario));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stage_status("fan"), "succeeded");
    assert_eq!(run.branch_ids().len(), branches);
    for i in 0..branches {
        let transcript = stage_file(&run, &format!("a{i}"), "transcript.jsonl");
        assert!(
            transcript.contains("\"tool\":\"shell\""),
            "a{i}: {transcript}"
        );
    }
    assert_eq!(
        p.path()
            .read_dir()
            .unwrap()
            .filter(|e| e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("started."))
            .count(),
        branches
    );
    // What the model was shown: every agent's prompt, then every agent's shell result.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2 * branches);
    for body in &bodies[branches..] {
        let results = Value::Array(Llmock::tool_results(body)).to_string();
        assert!(
            results.contains("[exit 0]"),
            "the barrier was passed: {results}"
        );
    }
}

/// A project whose local model is `mock` standing in for llama-server (the stand-in's folder, to
/// keep while the project runs).
fn on_the_local_model(mock: &Llmock) -> (tempfile::TempDir, Project) {
    let stand_in = tempfile::tempdir().unwrap();
    let server = mock.as_llama_server(stand_in.path());
    let model = stand_in.path().join("model.gguf");
    std::fs::write(&model, "not a model: llmock answers").unwrap();
    let p = Project::new()
        .with_env("TRELLIS_LLAMA_SERVER", &server.display().to_string())
        .with_env("TRELLIS_LOCAL_MODEL", &model.display().to_string());
    (stand_in, p)
}

/// A reply of the local model: a call written as the JSON object its grammar holds it to.
fn local_call(thought: &str, name: &str, arguments: &Value) -> Value {
    let text = json!({ "thought": thought, "name": name, "arguments": arguments }).to_string();
    json!({ "type": "reply", "text": text, "times": 1 })
}

/// The local model's first answer in a new session: text that writes files whole, each after its
/// path on a line of its own.
fn local_draft(text: &str) -> Value {
    json!({ "type": "reply", "text": text, "times": 1 })
}

/// The text of the last message of an OpenAI-style request (the local model's results come back as
/// text, since it wrote its calls as text).
fn last_text(body: &Value) -> String {
    body["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// An edit may name only a file there is and, as the text to replace, a line of it that occurs once
/// (its content as it is when the request goes out); the tool offered is unchanged.
fn edits_are_held_to_lines_of_calc_py(bodies: &[Value]) {
    let edit = |body: &Value| {
        body["response_format"]["json_schema"]["schema"]["oneOf"][2]["properties"]["arguments"]
            ["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .find(|file| file["properties"]["path"]["const"] == "calc.py")
            .map(|file| file["properties"]["old_string"]["enum"].clone())
    };
    assert_eq!(
        edit(&bodies[0]),
        Some(json!(["def add(a, b):", "return a - b"]))
    );
    assert_eq!(
        edit(&bodies[3]),
        Some(json!(["def add(a, b):", "return a + b"]))
    );
    assert_eq!(
        bodies[0]["tools"][2]["function"]["parameters"]["properties"]["old_string"]["type"],
        "string"
    );
}

/// The system prompt and the tools are what every session shares (llama-server's prompt cache keeps
/// them from run to run); what is this stage's alone — the directory's files, how to write them in
/// the first answer, with an example — opens the first user message, before the task and the
/// project's files. That answer is asked for as text (the tools shown all the same), and the next
/// request says how to call a tool from then on.
fn first_answer_is_text_that_writes_files(bodies: &[Value]) {
    let body = &bodies[0];
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(system.starts_with("You are a coding agent"), "{system}");
    assert!(!system.contains("calc.py"), "{system}");
    let opening = body["messages"][1]["content"].as_str().unwrap();
    assert!(
        opening.starts_with(
            "The working directory holds:\ncalc.py\nw.fabro\n\nFirst answer without calling a tool."
        ),
        "{opening}"
    );
    let example = opening.find("\ncalc.py\n```\n").expect(opening);
    let task = opening.find("Fix add in calc.py").unwrap();
    assert!(example < task, "{opening}");
    assert!(
        opening[task..].contains("\n\nThe project's files, as they are now:\n\ncalc.py\n```\ndef add(a, b):\n    return a - b\n```"),
        "{opening}"
    );
    assert_eq!(body["tool_choice"], "none");
    assert!(body.get("response_format").is_none(), "{body}");
    assert_eq!(body["tools"], bodies[1]["tools"]);
    let sent = |body: &Value| body["messages"].as_array().unwrap().clone();
    assert_eq!(sent(body)[..], sent(&bodies[1])[..sent(body).len()]);
    let then = last_text(&bodies[1]);
    assert!(
        then.starts_with("From now on, answer every time with one JSON object")
            && then.ends_with("call finish with a one-sentence summary."),
        "{then}"
    );
}

#[test]
fn the_local_model_is_held_to_one_call_a_turn_and_finishes_once_its_change_is_checked() {
    let Some(mock) = Llmock::start() else { return };
    let (_stand_in, p) = on_the_local_model(&mock);
    p.write("calc.py", "def add(a, b):\n    return a - b\n");
    p.write(
        "w.fabro",
        &workflow("fix [prompt=\"Fix add in calc.py\", provider=\"local\"]\n start -> fix -> exit"),
    );
    let fixed = "def add(a, b):\n    return a + b\n";
    let finish =
        |summary: &str| local_call("It is done.", "finish", &json!({ "summary": summary }));
    mock.scenario(&json!([
        local_draft("First I look at calc.py with the tools."),
        finish("Fixed already."),
        local_call(
            "First I read it.",
            "read_file",
            &json!({ "path": "calc.py" })
        ),
        local_call(
            "It subtracts; it must add.",
            "write_file",
            &json!({ "path": "calc.py", "content": fixed })
        ),
        finish("Fixed add."),
        local_call(
            "Check it.",
            "shell",
            &json!({ "command": "python3 -c 'import calc; assert calc.add(2, 3) == 5'" })
        ),
        finish("Fixed add in calc.py."),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(p.read("calc.py"), fixed);
    assert_eq!(
        stage_file(&run, "fix", "response.md").trim(),
        "Fixed add in calc.py."
    );

    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 7, "{bodies:#?}");
    first_answer_is_text_that_writes_files(&bodies);
    // Every later answer is held by a grammar to one call of the agent's tools or `finish`: a
    // thought first, then the tool's name and arguments under its own schema.
    let bodies = &bodies[1..];
    let tools: Vec<&str> = bodies[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools[..2], ["read_file", "write_file"]);
    assert_eq!(tools.last(), Some(&"finish"));
    let calls = bodies[0]["response_format"]["json_schema"]["schema"]["oneOf"]
        .as_array()
        .expect("the answer's schema: one call of the tools");
    assert_eq!(calls.len(), tools.len());
    for (call, tool) in calls.iter().zip(&tools) {
        let keys: Vec<&String> = call["properties"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["thought", "name", "arguments"]);
        assert_eq!(call["properties"]["name"]["const"], *tool);
    }
    assert_eq!(
        calls[1]["properties"]["arguments"]["required"],
        json!(["path", "content"])
    );
    edits_are_held_to_lines_of_calc_py(bodies);
    // `finish` before anything was done, and after a write nothing checked, is refused once each;
    // the check that passes says to call finish.
    assert!(last_text(&bodies[1]).contains("Not finished: nothing has been done yet"));
    assert!(
        last_text(&bodies[4]).contains("Not finished: nothing has checked your last change yet"),
        "{}",
        last_text(&bodies[4])
    );
    let checked = last_text(&bodies[5]);
    assert!(
        checked.contains("[exit 0]")
            && checked
                .ends_with("If that shows the task is done, call finish now with a short summary."),
        "{checked}"
    );
    // Each request is the last one and what came since, for llama-server's prompt cache.
    for pair in bodies.windows(2) {
        let (before, after) = (
            pair[0]["messages"].as_array().unwrap(),
            pair[1]["messages"].as_array().unwrap(),
        );
        assert_eq!(before[..], after[..before.len()]);
        assert_eq!(pair[1]["cache_prompt"], true);
    }
}

/// A task that says not to change the tests keeps them: the local model's rewrite of the test with
/// another expected value is refused, with the lines it took out, and the file stays as it was; a
/// command that does the same (`sed -i`) has the file put back; the fix of the code then goes
/// through.
#[test]
fn the_local_model_told_to_keep_the_tests_cannot_change_their_assertions() {
    let Some(mock) = Llmock::start() else { return };
    let (_stand_in, p) = on_the_local_model(&mock);
    p.write("calc.py", "def add(a, b):\n    return a - b\n");
    let test = "import unittest\nfrom calc import add\n\n\nclass TestAdd(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n";
    p.write("test_calc.py", test);
    p.write(
        "w.fabro",
        &workflow(
            "fix [prompt=\"The test in test_calc.py fails. Fix calc.py. Do not change test_calc.py.\", provider=\"local\"]\n start -> fix -> exit",
        ),
    );
    let weakened = test.replace("5)", "-1)");
    mock.scenario(&json!([
        local_draft(&format!("The test expects the wrong value.\n\ntest_calc.py\n```\n{weakened}```\n")),
        local_call(
            "Another way.",
            "shell",
            &json!({ "command": "sed -i 's/5)/-1)/' test_calc.py && python3 -m unittest test_calc" })
        ),
        local_call(
            "Then the code.",
            "edit_file",
            &json!({ "path": "calc.py", "old_string": "a - b", "new_string": "a + b" })
        ),
        local_call(
            "Check it.",
            "shell",
            &json!({ "command": "python3 -m unittest test_calc" })
        ),
        local_call("Done.", "finish", &json!({ "summary": "Fixed add." })),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(p.read("test_calc.py"), test);
    assert_eq!(p.read("calc.py"), "def add(a, b):\n    return a + b\n");
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 5, "{bodies:#?}");
    let refused = last_text(&bodies[1]);
    assert!(
        refused.contains(
            "Refused: the task says not to change the tests, and this change takes out 1 test \
             line(s) of `test_calc.py`:\nself.assertEqual(add(2, 3), 5)\n"
        ),
        "{refused}"
    );
    let put_back = last_text(&bodies[2]);
    assert!(
        put_back.contains(
            "Refused: the task says not to change the tests, and this command took out 1 test \
             line(s) of `test_calc.py`:\nself.assertEqual(add(2, 3), 5)\n`test_calc.py` was put \
             back as it was"
        ),
        "{put_back}"
    );
    assert!(
        last_text(&bodies[4]).contains("[exit 0]"),
        "{}",
        last_text(&bodies[4])
    );
}

/// A coached model that rewrites a file as one function, leaving out one its task does not name,
/// has that function kept (where it was) and is told so.
#[test]
fn the_local_model_rewriting_a_file_as_one_function_keeps_the_others() {
    let Some(mock) = Llmock::start() else { return };
    let (_stand_in, p) = on_the_local_model(&mock);
    let util = "def get_total(prices):\n    return sum(prices)\n\n\ndef average(prices):\n    return get_total(prices) / len(prices)\n";
    p.write("util.py", util);
    p.write(
        "main.py",
        "from util import get_total, average\n\nprint(get_total([3, 4, 5]), average([3, 4, 5]))\n",
    );
    p.write(
        "w.fabro",
        &workflow(
            "rename [prompt=\"Rename the function get_total to compute_total in util.py and main.py.\", provider=\"local\"]\n start -> rename -> exit",
        ),
    );
    mock.scenario(&json!([
        local_draft("Rewrite util.py.\n\nutil.py\n```\ndef compute_total(prices):\n    return sum(prices)\n```\n"),
        local_call(
            "Keep average.",
            "write_file",
            &json!({ "path": "util.py", "content": util.replace("get_total", "compute_total") })
        ),
        local_call(
            "Then the caller.",
            "edit_file",
            &json!({ "path": "main.py", "old_string": "get_total", "new_string": "compute_total", "replace_all": true })
        ),
        local_call("Check it.", "shell", &json!({ "command": "python3 main.py" })),
        local_call("Done.", "finish", &json!({ "summary": "Renamed." })),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        p.read("util.py"),
        util.replace("get_total", "compute_total")
    );
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 5, "{bodies:#?}");
    let kept = last_text(&bodies[1]);
    assert!(
        kept.contains(
            "Result of write_file:\nwrote 115 bytes to util.py, keeping `average` as it was: your \
             content left it out, and the task does not ask for it to go\n\n"
        ),
        "{kept}"
    );
    assert!(
        last_text(&bodies[4]).contains("12 4.0\n[exit 0]"),
        "{}",
        last_text(&bodies[4])
    );
}
