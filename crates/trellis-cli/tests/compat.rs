//! Workflows written for Fabro and Attractor, run through the real `trellis` binary: each lenient
//! reading does at run time what the file meant (a label asked as the prompt, `tool_command` run as the
//! script, a bare timeout in seconds, a node reached only through a retry target, `auto_status`), and
//! `--simulate`, dry runs of the shipped examples and the messages a migrating user meets.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the code they run"
)]

mod run_support;

use std::time::{Duration, Instant};

use run_support::{Project, stage_dir};
use serde_json::{Value, json};
use trellis_test::Llmock;

fn workflow(body: &str) -> String {
    format!(
        "digraph W {{\n graph [goal=\"Ship the release notes\"]\n start [shape=Mdiamond]\n exit [shape=Msquare]\n {body}\n}}\n"
    )
}

fn with_mock(mock: &Llmock) -> Project {
    Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-compat")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
}

fn status(run: &run_support::Run, node: &str) -> Value {
    run_support::read_json(&stage_dir(&run.record(), node).join("status.json"))
}

#[test]
fn label_stands_in_for_a_missing_prompt() {
    let Some(mock) = Llmock::start() else { return };
    let p = with_mock(&mock);
    p.write(
        "w.fabro",
        &workflow(
            "notes [shape=tab, label=\"Draft release notes for $goal\"]\n start -> notes -> exit",
        ),
    );
    mock.scenario(&json!([{ "type": "reply", "text": "Notes drafted.", "times": 1 }]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(
        run.stderr().contains("warning[llm-prompt]"),
        "{}",
        run.stderr()
    );
    // What the model was shown: the label, with `$goal` expanded, as the prompt.
    let requests = mock.requests();
    let body = &requests[0]["body"];
    let shown = body["messages"].to_string();
    assert!(
        shown.contains("Draft release notes for Ship the release notes"),
        "{shown}"
    );
}

#[test]
fn tool_command_runs_as_the_script() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("build [shape=parallelogram, tool_command=\"echo built > out.txt\"]\n start -> build -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(p.read("out.txt"), "built\n");
    assert!(
        run.stderr()
            .contains("note[attribute-alias]: `tool_command` is read as `script`"),
        "{}",
        run.stderr()
    );
    let graph = p.command(&["graph", "w.fabro"]).output().unwrap();
    let dot = String::from_utf8_lossy(&graph.stdout);
    assert!(dot.contains("script=\"echo built > out.txt\""), "{dot}");
    assert!(!dot.contains("tool_command"), "{dot}");
}

#[test]
fn bare_number_timeouts_are_seconds() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "slow [shape=parallelogram, script=\"sleep 30\", timeout=1, max_retries=0]\n start -> slow -> exit [condition=\"outcome=success\"]",
        ),
    );
    let started = Instant::now();
    let run = p.run("w.fabro", &[]);
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        run.stderr()
            .contains("`timeout=1` has no unit: it is read as 1 seconds"),
        "{}",
        run.stderr()
    );
    assert_eq!(status(&run, "slow")["failure"]["class"], "timeout");
}

#[test]
fn a_node_reached_only_through_a_retry_target_runs() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "test [shape=parallelogram, script=\"test -f fixed\", goal_gate=true, retry_target=\"fixer\"]\n \
             fixer [shape=parallelogram, script=\"touch fixed\"]\n \
             start -> test -> exit\n fixer -> test",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "test", "fixer", "test", "exit"]);
    assert!(!run.stderr().contains("not reachable"), "{}", run.stderr());
}

#[test]
fn auto_status_counts_an_answer_without_a_status_as_succeeded() {
    let Some(mock) = Llmock::start() else { return };
    for (auto, expected) in [("true", "succeeded"), ("false", "failed")] {
        let p = with_mock(&mock);
        p.write(
            "w.fabro",
            &workflow(&format!(
                "check [shape=tab, prompt=\"Check the notes\", output_schema=\"routing\", output_retries=1, auto_status={auto}]\n \
                 start -> check -> exit"
            )),
        );
        mock.scenario(&json!([{ "type": "reply", "text": "Looks fine to me.", "times": 2 }]));
        let run = p.run("w.fabro", &[]);
        let status = status(&run, "check");
        assert_eq!(status["status"], expected, "{status}");
        if auto == "true" {
            assert!(
                status["auto_status"]
                    .as_str()
                    .unwrap()
                    .contains("no JSON object"),
                "{status}"
            );
            assert_eq!(status["repairs"], 1);
            assert_eq!(run.context("response.check"), "Looks fine to me.");
        } else {
            assert!(status.get("auto_status").is_none());
        }
    }
}

#[test]
fn auto_status_leaves_a_reported_failure_alone() {
    let Some(mock) = Llmock::start() else { return };
    let p = with_mock(&mock);
    p.write(
        "w.fabro",
        &workflow(
            "check [shape=tab, prompt=\"Check the notes\", output_schema=\"routing\", auto_status=true]\n \
             start -> check\n check -> exit [condition=\"outcome=success\"]\n check -> exit [condition=\"outcome=fail\"]",
        ),
    );
    mock.scenario(&json!([{ "type": "reply", "text": "{\"outcome\": \"fail\", \"failure_reason\": \"typos\"}", "times": 1 }]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(status(&run, "check")["status"], "failed");
}

#[test]
fn simulate_runs_commands_waits_and_gates_but_not_models() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "build [shape=parallelogram, script=\"echo built > built.txt\"]\n \
             pause [shape=insulator, duration=\"1s\"]\n \
             draft [prompt=\"Draft the notes\"]\n \
             approve [shape=hexagon, label=\"Publish?\"]\n \
             start -> build -> pause -> draft -> approve\n approve -> exit [label=\"[Y] Yes\"]\n approve -> draft [label=\"[N] No\"]",
        ),
    );
    let started = Instant::now();
    let run = p.run("w.fabro", &["--simulate", "--auto-approve"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "the wait was skipped"
    );
    assert_eq!(p.read("built.txt"), "built\n");
    assert_eq!(
        run.context("response.draft"),
        "[Simulated] Response for stage: draft"
    );
    assert_eq!(run.events_named("HumanGateAnswered").len(), 1);

    // A dry run keeps its meaning: no command runs.
    std::fs::remove_file(p.path().join("built.txt")).unwrap();
    let run = p.run("w.fabro", &["--dry-run", "--auto-approve"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(!p.path().join("built.txt").exists());
    // The two cannot be combined.
    let both = p
        .command(&["run", "w.fabro", "--dry-run", "--simulate"])
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2));
}

#[test]
fn every_shipped_example_reaches_its_exit_in_a_dry_run() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut files: Vec<_> = std::fs::read_dir(&examples)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "fabro" || e == "dot" || e == "yaml" || e == "yml")
        })
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for file in files {
        let p = Project::new();
        let run = p.run(file.to_str().unwrap(), &["--dry-run", "--auto-approve"]);
        assert_eq!(run.code(), Some(0), "{}: {}", file.display(), run.stderr());
        assert_eq!(run.summary["status"], "succeeded", "{}", file.display());
        // DOT runs end at their exit node; YAML runs at any terminal node.
        let stages = run.stages();
        let dot = file.extension().is_some_and(|e| e == "fabro" || e == "dot");
        assert!(
            !dot || stages.last().map(String::as_str) == Some("exit"),
            "{}: {stages:?}",
            file.display()
        );
    }
}

#[test]
fn a_goal_gate_without_a_retry_target_says_the_run_fails() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "test [shape=parallelogram, script=\"exit 1\", goal_gate=true]\n start -> test -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_ne!(run.code(), Some(0));
    let stderr = run.stderr();
    assert!(
        stderr.contains("goal gate test is not met and has no retry target left; the run fails"),
        "{stderr}"
    );
    assert!(!stderr.contains("retrying from"), "{stderr}");
}

#[test]
fn a_failed_stage_routed_on_by_an_unconditional_edge_is_shown() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("lint [shape=parallelogram, script=\"exit 2\"]\n start -> lint -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    assert!(
        run.stderr()
            .contains("! lint failed, and its unconditional edge leads on to exit"),
        "{}",
        run.stderr()
    );
}

#[test]
fn an_ambiguous_run_id_prefix_lists_the_candidates() {
    let p = Project::new();
    p.write("w.fabro", &workflow("start -> exit"));
    let first = p.run("w.fabro", &[]);
    let second = p.run("w.fabro", &[]);
    let (a, b) = (
        first.summary["run_id"].as_str().unwrap().to_owned(),
        second.summary["run_id"].as_str().unwrap().to_owned(),
    );
    let common = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let prefix = &a[..common.max(1).min(a.len() - 1)];
    if !b.starts_with(prefix) {
        return;
    }
    let out = p.command(&["show", prefix]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr.contains("is the start of 2 runs"), "{stderr}");
    assert!(stderr.contains(&a) && stderr.contains(&b), "{stderr}");
}

#[test]
fn run_takes_color_and_every_option_has_help() {
    let p = Project::new();
    p.write("w.fabro", &workflow("start -> exit"));
    let run = p
        .command(&["run", "w.fabro", "--color", "never"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0));
    for command in ["show", "events", "runs", "run", "resume"] {
        let help = p.command(&[command, "--help"]).output().unwrap();
        let text = String::from_utf8_lossy(&help.stdout);
        for line in text.lines().filter(|l| l.trim_start().starts_with("--")) {
            // The flag (with its value name) and then words of help.
            let words = line
                .split_whitespace()
                .filter(|w| !w.starts_with('<'))
                .count();
            assert!(
                words > 2,
                "`trellis {command} --help` has an option without help: {line}"
            );
        }
    }
}

#[test]
fn run_says_where_a_file_is_not_utf8() {
    let p = Project::new();
    std::fs::write(
        p.path().join("w.fabro"),
        b"digraph W { start [shape=Mdiamond, label=\"caf\xe9\"] }\n",
    )
    .unwrap();
    for command in ["run", "validate"] {
        let out = p.command(&[command, "w.fabro"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains("is not valid UTF-8 text (invalid byte at offset 45)"),
            "{command}: {stderr}"
        );
    }
}

#[test]
fn a_simulated_review_takes_the_labelled_edge_towards_the_exit() {
    let p = Project::new();
    // The first labelled edge loops back; a simulated answer takes the one nearer the exit.
    p.write(
        "w.fabro",
        &workflow(
            "implement [prompt=\"Implement\"]\n review [shape=tab, prompt=\"Review\"]\n \
             start -> implement -> review\n review -> implement [label=\"Fix\"]\n review -> exit [label=\"Approve\"]",
        ),
    );
    let run = p.run("w.fabro", &["--dry-run"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "implement", "review", "exit"]);
}
