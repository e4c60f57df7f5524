//! Watching and steering a run live, through the real `trellis` binary: `trellis logs --follow` from
//! another terminal, `trellis run --verbose` and the live block under a running stage, and
//! `trellis steer` reaching an agent's model (llmock's request log shows what it was sent).

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use run_support::{Project, stage_dir, wait_for};
use serde_json::{Value, json};
use trellis_test::Llmock;

/// A command that prints thirty lines over three seconds, then one on standard error.
const CHATTY: &str = r#"digraph chatty {
    start [shape=Mdiamond]
    fetch [shape=parallelogram, script="for i in $(seq 30); do echo line $i; sleep 0.1; done; echo done fetching >&2"]
    exit [shape=Msquare]
    start -> fetch -> exit
}
"#;

fn chatty() -> Project {
    let p = Project::new();
    p.write("chatty.fabro", CHATTY);
    p
}

fn run_id(p: &Project) -> String {
    p.only_run()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn fetch_ended(p: &Project) -> bool {
    std::fs::read_to_string(p.only_run().join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("\"StageCompleted\"") && l.contains("\"node_id\":\"fetch\""))
}

#[test]
fn logs_follow_prints_a_running_command_s_lines_as_they_are_written() {
    let p = chatty();
    let mut run = p.spawn_run("chatty.fabro");
    p.wait_for_event("StageStarted", "fetch");
    let id = run_id(&p);
    let mut logs = p
        .command(&["logs", &id, "fetch", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(logs.stdout.take().unwrap());
    let mut lines = Vec::new();
    let mut early = 0;
    for line in stdout.lines() {
        let line = line.unwrap();
        // Lines arrive while the stage still runs, not all at its end.
        if !fetch_ended(&p) {
            early += 1;
        }
        lines.push(line);
    }
    let expected: Vec<String> = (1..=30).map(|i| format!("line {i}")).collect();
    assert_eq!(lines, expected);
    assert!(
        early >= 10,
        "only {early} lines came before the stage ended"
    );
    let output = logs.wait_with_output().unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stderr), "done fetching\n");
    assert!(run.wait().unwrap().success());

    // Afterwards, without --follow, the whole run's output with a header per stage.
    let all = p.command(&["logs", &id]).output().unwrap();
    assert!(all.status.success());
    assert!(String::from_utf8_lossy(&all.stdout).ends_with("line 29\nline 30\n"));
    assert!(String::from_utf8_lossy(&all.stderr).contains("── fetch (002-fetch@1) ──"));
    // A stage the run does not have is an error that says so.
    let missing = p.command(&["logs", &id, "deploy"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("has no stage `deploy`"));
    // `show` prints the values kept as blobs, not their references.
    let show = p.command(&["show", &id]).output().unwrap();
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(
        shown.contains("command.stderr = done fetching\\n"),
        "{shown}"
    );
    assert!(!shown.contains("blob://"), "{shown}");
    // Output is never copied into the event log.
    let events = std::fs::read_to_string(p.only_run().join("events.jsonl")).unwrap();
    assert!(!events.contains("line 17"), "{events}");
}

#[test]
fn run_verbose_streams_every_line_and_the_live_block_shows_the_latest_one() {
    let p = chatty();
    let verbose = p
        .command(&["run", "chatty.fabro", "--verbose"])
        .output()
        .unwrap();
    assert!(verbose.status.success());
    let stderr = String::from_utf8_lossy(&verbose.stderr);
    let streamed: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("    fetch │ "))
        .collect();
    let mut expected: Vec<String> = (1..=30).map(|i| format!("line {i}")).collect();
    expected.push("done fetching".into());
    assert_eq!(streamed, expected, "{stderr}");

    // The live block (forced on off a terminal): the running stage with its latest line, erased
    // and drawn again as lines come, gone once the stage ends.
    let live = p
        .command(&["run", "chatty.fabro"])
        .env("TRELLIS_PROGRESS", "live")
        .output()
        .unwrap();
    assert!(live.status.success());
    let stderr = String::from_utf8_lossy(&live.stderr);
    let shown: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split("    │ ").nth(1))
        .collect();
    assert!(shown.len() >= 10, "{stderr}");
    assert!(shown.windows(2).all(|w| {
        let n = |s: &str| s.strip_prefix("line ").and_then(|n| n.parse::<u32>().ok());
        n(w[0]) <= n(w[1]) || n(w[1]).is_none()
    }));
    assert!(stderr.contains("\x1b[1A\x1b[2K"), "the block is erased");
    assert!(stderr.contains("✓ fetch"));
}

/// Regression: `trellis run w.fabro 2>&1 | head -1` ended the run with a panic at the second line of
/// progress, the run left interrupted at its start. The progress is for whoever watches: once they
/// have gone it goes unseen, and the run carries on to its end.
#[test]
fn a_run_whose_watcher_has_gone_carries_on_to_its_end() {
    let p = chatty();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = p
        .command(&["run", "chatty.fabro", "--verbose"])
        .env("TRELLIS_PROGRESS", "live")
        .stderr(writer)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("succeeded: 3 stages"), "{stdout}");
    assert!(fetch_ended(&p));
}

const KEY: &str = "sk-ant-test-steer-0000";

#[test]
fn steer_reaches_the_running_agent_s_next_model_call() {
    let Some(mock) = Llmock::start() else { return };
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", KEY)
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"Tidy up\", model=\"sonnet\"]\n start -> fix -> exit\n}\n",
    );
    mock.scenario(&json!([
        { "type": "reply", "tool_calls": [{ "name": "shell", "arguments": { "command": "sleep 3" } }], "times": 1 },
        { "type": "reply", "text": "Done, with tabs.", "times": 1 },
    ]));
    // Nothing runs yet: there is no run to steer.
    let none = p.command(&["steer", "nope", "hello"]).output().unwrap();
    assert_eq!(none.status.code(), Some(2));

    let mut run = p.spawn_run("w.fabro");
    p.wait_for_event("Agent.ToolCallStarted", "fix");
    let id = run_id(&p);
    let empty = p.command(&["steer", &id, "  "]).output().unwrap();
    assert_eq!(empty.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("needs some text"));
    let wrong = p
        .command(&["steer", &id, "hi", "--node", "exit"])
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("`exit` is not running now (running: fix)"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    let sent = p
        .command(&["steer", &id, "Use tabs, not spaces."])
        .output()
        .unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(String::from_utf8_lossy(&sent.stderr).starts_with("sent to fix (002-fix@1)"));
    assert!(run.wait().unwrap().success());

    // The model was shown it with the shell's result, in the request after the one it came during.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2);
    let first = bodies[0].to_string();
    assert!(!first.contains("Use tabs"), "{first}");
    let last = bodies[1]["messages"].as_array().unwrap().last().unwrap();
    let texts: Vec<&str> = last["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|part| part["text"].as_str())
        .collect();
    assert_eq!(
        texts,
        [
            "Message from the person running this workflow (take it into account now): Use tabs, not spaces."
        ]
    );
    // The transcript and the event log record it.
    let record = p.only_run();
    let transcript =
        std::fs::read_to_string(stage_dir(&record, "fix").join("transcript.jsonl")).unwrap();
    let steer: Vec<Value> = transcript
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "steer")
        .collect();
    assert_eq!(steer.len(), 1);
    assert_eq!(steer[0]["text"], "Use tabs, not spaces.");
    assert_eq!(steer[0]["turn"], 2);
    let events = std::fs::read_to_string(record.join("events.jsonl")).unwrap();
    assert!(events.contains("\"Agent.SteeringReceived\""), "{events}");
    // Each turn's tokens are an event too, with the cached part of the input.
    let turns: Vec<Value> = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "Agent.TurnCompleted")
        .collect();
    assert_eq!(turns.len(), 2, "{events}");
    assert!(turns[1]["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(turns[1]["usage"]["cached_tokens"].is_u64());
    let logs = p.command(&["logs", &id, "fix"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("steering: Use tabs, not spaces."),
        "{}",
        String::from_utf8_lossy(&logs.stdout)
    );

    // Once the run has ended, a message is refused, not queued for nobody.
    let after = p.command(&["steer", &id, "again"]).output().unwrap();
    assert_eq!(after.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&after.stderr).contains("the run is not running"));
}

#[test]
fn a_command_stage_takes_no_steering_and_says_so() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n wait [shape=parallelogram, script=\"sleep 3\"]\n start -> wait -> exit\n}\n",
    );
    let mut run = p.spawn_run("w.fabro");
    p.wait_for_event("StageStarted", "wait");
    let id = run_id(&p);
    let none = p.command(&["steer", &id, "hurry"]).output().unwrap();
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no agent stage is running"));
    let named = p
        .command(&["steer", &id, "hurry", "--node", "wait"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&named.stderr).contains("`wait` takes no messages"));
    let started = Instant::now();
    wait_for("the run to end", Duration::from_secs(20), || {
        run.try_wait().unwrap().is_some()
    });
    assert!(started.elapsed() < Duration::from_secs(20));
}
