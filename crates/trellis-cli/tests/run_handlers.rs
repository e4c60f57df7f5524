//! End-to-end: human gates, parallel fan-out/fan-in policies, sub-workflows and artifact capture, run
//! through the real binary.

#![allow(
    clippy::disallowed_macros,
    reason = "a test's message, which the test harness captures as it captures eprintln! alone"
)]
#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use std::time::Duration;

use run_support::Project;

const GATE: &str = "digraph G {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    approve [shape=hexagon, label=\"Ship it?\"]
    ship [shape=parallelogram, script=\"echo ship\"]
    hold [shape=parallelogram, script=\"echo hold\"]
    note [shape=parallelogram, script=\"echo note\"]
    start -> approve
    approve -> ship [label=\"[S] Ship\"]
    approve -> hold [label=\"[H] Hold\"]
    approve -> note [label=\"Other\", freeform=true]
    ship -> exit
    hold -> exit
    note -> exit
}
";

#[test]
fn auto_approve_takes_the_first_option() {
    let p = Project::new();
    p.write("g.fabro", GATE);
    let run = p.run("g.fabro", &["--auto-approve"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "approve", "ship", "exit"]);
    assert_eq!(run.context("human.gate.selected"), "S");
    assert_eq!(run.context("human.gate.label"), "[S] Ship");
    assert_eq!(run.events_named("HumanGateAsked").len(), 1);
}

#[test]
fn an_answers_file_gives_keys_labels_or_free_text() {
    let p = Project::new();
    p.write("g.fabro", GATE);
    for (answer, target) in [
        ("h", "hold"),
        ("Ship", "ship"),
        ("[H] Hold", "hold"),
        ("ask again tomorrow", "note"),
    ] {
        p.write(
            "answers.json",
            &serde_json::json!({ "approve": answer }).to_string(),
        );
        let run = p.run("g.fabro", &["--answers", "answers.json"]);
        assert_eq!(run.code(), Some(0), "{answer}: {}", run.stderr());
        assert_eq!(run.stages()[2], target, "{answer}");
    }
    assert_eq!(
        p.run("g.fabro", &["--answers", "answers.json"])
            .context("human.gate.text"),
        "ask again tomorrow"
    );
}

#[test]
fn a_non_interactive_run_waits_for_input_and_resumes_with_an_answer() {
    let p = Project::new();
    p.write("g.fabro", GATE);
    let run = p.run("g.fabro", &[]);
    assert_eq!(run.code(), Some(3), "{}", run.stderr());
    assert_eq!(run.summary["status"], "waiting_for_input");
    assert_eq!(run.summary["waiting_at"], "approve");
    assert_eq!(run.checkpoint()["next_node"], "approve");
    assert_eq!(run.events_named("WorkflowRunWaitingForInput").len(), 1);
    let id = run.summary["run_id"].as_str().unwrap().to_owned();
    // Still no answer: still waiting.
    assert_eq!(p.resume(&id, &[]).code(), Some(3));
    p.write("answers.json", r#"{"approve": "H"}"#);
    let resumed = p.resume(&id, &["--answers", "answers.json"]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    assert_eq!(resumed.stages(), ["start", "approve", "hold", "exit"]);
    assert_eq!(resumed.events_named("WorkflowRunResumed").len(), 2);
    // A finished run has nothing to resume.
    let again = p.command(&["resume", &id]).output().unwrap();
    assert_eq!(again.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already succeeded"));
}

#[test]
fn a_gate_timeout_takes_the_default_choice() {
    let p = Project::new();
    p.write(
        "g.fabro",
        &GATE.replace(
            "label=\"Ship it?\"",
            "label=\"Ship it?\", timeout=\"300ms\", human.default_choice=\"H\"",
        ),
    );
    let run = p.run("g.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "approve", "hold", "exit"]);
}

/// With nobody to answer (no terminal, no answers file), a timed gate's time runs out at once: the
/// same outcome as waiting it out — its default, or its failure without one — without the wait.
#[test]
fn a_timed_gate_nobody_can_answer_does_not_wait_out_its_timeout() {
    let p = Project::new();
    let timed = |extra: &str| {
        GATE.replace(
            "label=\"Ship it?\"",
            &format!("label=\"Ship it?\", timeout=\"1h\"{extra}"),
        )
    };
    p.write("default.fabro", &timed(", human.default_choice=\"H\""));
    p.write("none.fabro", &timed(""));
    let started = std::time::Instant::now();
    let run = p.run("default.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "approve", "hold", "exit"]);
    let answered = run.events_named("HumanGateAnswered");
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0]["default_after_timeout"], true);
    assert!(
        run.stderr()
            .contains("  · approve: nobody answered in time; took its default, [H] Hold"),
        "{}",
        run.stderr()
    );
    let failed = p.run("none.fabro", &[]);
    assert_eq!(failed.events_named("StageFailed").len(), 1);
    assert!(
        failed.stderr().contains(
            "no answer to `approve` before its timeout, and no usable human.default_choice"
        ),
        "{}",
        failed.stderr()
    );
    // An hour each had they waited.
    assert!(started.elapsed() < Duration::from_mins(2));
}

fn fan(policy: &str, branches: &str) -> String {
    format!(
        "digraph P {{
    start [shape=Mdiamond]
    exit [shape=Msquare]
    fan [shape=component, {policy}]
    merge [shape=tripleoctagon]
    after [shape=parallelogram, script=\"true\"]
    {branches}
    start -> fan
    merge -> after -> exit
}}
"
    )
}

const MIXED: &str = "fast [shape=parallelogram, script=\"echo fast\"]
    broken [shape=parallelogram, script=\"sleep 0.2; exit 1\"]
    slow [shape=parallelogram, script=\"sleep 5; echo slow\"]
    fan -> fast -> merge
    fan -> broken -> merge
    fan -> slow -> merge";

#[test]
fn wait_all_runs_every_branch_and_reports_each() {
    let p = Project::new();
    p.write(
        "p.fabro",
        &fan(
            "join_policy=\"wait_all\"",
            "a [shape=parallelogram, script=\"sleep 0.3; echo a\"]\n b [shape=parallelogram, script=\"sleep 0.3; exit 2\"]\n c1 [shape=parallelogram, script=\"echo c1\"]\n c2 [shape=parallelogram, script=\"echo c2\"]\n fan -> a -> merge\n fan -> b -> merge\n fan -> c1 -> c2 -> merge",
        ),
    );
    let run = p.run("p.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    // Branches run concurrently: both sleeping branches started before either ended.
    let first_end = run.stage_end("a").min(run.stage_end("b")).unwrap();
    assert!(
        run.stage_start("a") < first_end && run.stage_start("b") < first_end,
        "branches run concurrently"
    );
    let results = run.context("parallel.results");
    let statuses: Vec<(&str, &str)> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        [("a", "succeeded"), ("b", "failed"), ("c1", "succeeded")]
    );
    assert_eq!(run.context("parallel.fan_in.best_id"), "a");
    assert_eq!(run.context("parallel.fan_in.best_outcome"), "succeeded");
    assert_eq!(run.stage_status("fan"), "partially_succeeded");
    assert_eq!(run.events_named("ParallelBranchCompleted").len(), 3);
    // Branch updates reach the main context only through parallel.results.
    assert!(
        results[2]["updated_keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "command.output")
    );
}

#[test]
fn first_success_cancels_the_rest_and_kills_their_processes() {
    let p = Project::new();
    p.write("p.fabro", &fan("join_policy=\"first_success\"", MIXED));
    let run = p.run("p.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    // The slow branch is cancelled: it never ends, and its process is killed.
    assert_eq!(
        run.stage_end("slow"),
        None,
        "the slow branch must be cancelled"
    );
    run_support::assert_process_group_gone(&run_support::stage_dir(&run.record(), "slow"));
    let results = run.context("parallel.results");
    let slow = results
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "slow")
        .unwrap();
    assert_eq!(slow["status"], "skipped");
    assert!(
        slow["failure_reason"]
            .as_str()
            .unwrap()
            .starts_with("cancelled")
    );
}

#[test]
fn fail_fast_stops_at_the_first_failure() {
    let p = Project::new();
    p.write(
        "p.fabro",
        &fan(
            "join_policy=\"wait_all\", error_policy=\"fail_fast\"",
            MIXED,
        ),
    );
    let run = p.run("p.fabro", &[]);
    assert_eq!(
        run.stage_end("slow"),
        None,
        "the slow branch must be stopped"
    );
    run_support::assert_process_group_gone(&run_support::stage_dir(&run.record(), "slow"));
    assert_eq!(run.stage_status("fan"), "failed");
}

#[test]
fn k_of_n_and_quorum_count_successes() {
    let p = Project::new();
    let branches = "a [shape=parallelogram, script=\"true\"]\n b [shape=parallelogram, script=\"sleep 0.2\"]\n c [shape=parallelogram, script=\"false\"]\n fan -> a -> merge\n fan -> b -> merge\n fan -> c -> merge";
    // `c` fails at once, long before `b` (0.2 s) succeeds: two successes meet k_of_n(2) and
    // quorum(0.6), with a failure among the branches, so the fan-out partially succeeded.
    for (policy, expected) in [
        ("k_of_n(2)", "partially_succeeded"),
        ("k_of_n(3)", "failed"),
        ("quorum(0.6)", "partially_succeeded"),
        ("quorum(1)", "failed"),
    ] {
        p.write(
            "p.fabro",
            &fan(&format!("join_policy=\"{policy}\""), branches),
        );
        let run = p.run("p.fabro", &[]);
        let status = run.stage_status("fan");
        assert_eq!(status, expected, "{policy}");
    }
}

#[test]
fn error_policy_ignore_leaves_failures_out() {
    let p = Project::new();
    p.write("p.fabro", &fan("error_policy=\"ignore\"", "a [shape=parallelogram, script=\"true\"]\n c [shape=parallelogram, script=\"false\"]\n fan -> a -> merge\n fan -> c -> merge"));
    let run = p.run("p.fabro", &[]);
    assert_eq!(run.branch_ids(), ["a"]);
}

#[test]
fn max_parallel_limits_concurrency() {
    let p = Project::new();
    p.write(
        "p.fabro",
        &fan("max_parallel=1", "a [shape=parallelogram, script=\"sleep 0.3\"]\n b [shape=parallelogram, script=\"sleep 0.3\"]\n fan -> a -> merge\n fan -> b -> merge"),
    );
    let run = p.run("p.fabro", &[]);
    assert_eq!(run.code(), Some(0));
    // One branch at a time: each started only after the other ended.
    let (a, b) = (run.stage_start("a"), run.stage_start("b"));
    let (first, second) = if a < b { ("a", b) } else { ("b", a) };
    assert!(
        run.stage_end(first).unwrap() < second,
        "one branch at a time"
    );
}

#[test]
fn sub_workflows_take_context_in_and_give_changes_out() {
    let p = Project::new();
    p.write(
        "child.fabro",
        "digraph Child { start [shape=Mdiamond]\n exit [shape=Msquare]\n greet [shape=parallelogram, script=\"echo child saw $TRELLIS_GOAL\"]\n gate [shape=diamond]\n ok [shape=parallelogram, script=\"true\"]\n start -> greet -> gate\n gate -> ok [condition=\"context.mode=child\"]\n gate -> exit\n ok -> exit }",
    );
    p.write(
        "parent.fabro",
        "digraph Parent { graph [goal=\"ship\"]\n start [shape=Mdiamond]\n exit [shape=Msquare]\n sub [shape=house, workflow=\"child.fabro\"]\n check [shape=parallelogram, script=\"true\"]\n start -> sub -> check -> exit }",
    );
    let run = p.run("parent.fabro", &["--set", "mode=child"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "sub", "check", "exit"]);
    let sub_dir = run.record().join("stages/002-sub@1");
    // The child's stage records are in its journal.
    let journal = std::fs::read_to_string(sub_dir.join("child/journal.jsonl")).unwrap();
    let child_nodes: Vec<String> = journal
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .flat_map(|entry| entry["changes"].as_array().cloned().unwrap_or_default())
        .filter_map(|change| Some(change["stage"]["node_id"].as_str()?.to_owned()))
        .collect();
    assert_eq!(
        child_nodes,
        ["start", "greet", "gate", "ok", "exit"],
        "the child saw the parent's context"
    );
    let status = run_support::read_json(&sub_dir.join("status.json"));
    assert!(
        status["context_updates"]["command.output"]
            .as_str()
            .unwrap()
            .starts_with("blob://"),
        "{status}"
    );
    let child_events: Vec<_> = run
        .events()
        .into_iter()
        .filter(|e| e["run_id"].as_str().unwrap().ends_with("/sub"))
        .collect();
    assert_ne!(child_events, [] as [serde_json::Value; 0]);
}

#[test]
fn a_broken_child_workflow_fails_the_stage_with_its_error() {
    let p = Project::new();
    p.write("child.fabro", "digraph Child { start -> exit -> start }");
    p.write("parent.fabro", "digraph Parent { start [shape=Mdiamond]\n exit [shape=Msquare]\n sub [shape=house, workflow=\"child.fabro\"]\n start -> sub -> exit }");
    let run = p.run("parent.fabro", &[]);
    let failed = run.events_named("StageFailed");
    assert!(
        failed[0]["failure_reason"]
            .as_str()
            .unwrap()
            .contains("the child workflow is not valid"),
        "{failed:?}"
    );
}

#[test]
fn new_test_artifacts_are_captured() {
    let p = Project::new();
    p.write("test-results/old.png", "old");
    p.write(
        "w.fabro",
        "digraph A { start [shape=Mdiamond]\n exit [shape=Msquare]\n e2e [shape=parallelogram, script=\"mkdir -p test-results/login reports && echo png > test-results/login/shot.png && echo '<testsuite/>' > reports/junit-e2e.xml && echo src > main.txt\"]\n start -> e2e -> exit }",
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0));
    let captured = run.record().join("artifacts/e2e/attempt-1");
    assert_eq!(
        std::fs::read_to_string(captured.join("test-results/login/shot.png")).unwrap(),
        "png\n"
    );
    assert!(captured.join("reports/junit-e2e.xml").is_file());
    assert!(
        !captured.join("test-results/old.png").exists(),
        "unchanged files are not captured"
    );
    assert!(
        !captured.join("main.txt").exists(),
        "only artifacts are captured"
    );
    let completed = run.events_named("StageCompleted");
    let e2e = completed.iter().find(|e| e["node_id"] == "e2e").unwrap();
    assert_eq!(
        e2e["files_touched"],
        serde_json::json!(["reports/junit-e2e.xml", "test-results/login/shot.png"])
    );
}

#[test]
fn a_terminal_user_answers_with_an_accelerator_key() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "skipped: `script` (util-linux) is not installed, so no pseudo-terminal can be made"
        );
        return;
    }
    let p = Project::new();
    p.write("g.fabro", GATE);
    let trellis = env!("CARGO_BIN_EXE_trellis");
    let mut child = std::process::Command::new("script")
        .args([
            "-qec",
            &format!("{trellis} run g.fabro --runs-dir runs"),
            "/dev/null",
        ])
        .current_dir(p.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"h\n").unwrap();
    let output = child.wait_with_output().unwrap();
    let screen = String::from_utf8_lossy(&output.stdout).replace('\r', "");
    assert!(
        screen.contains("? Ship it?\n  [S] Ship\n  [H] Hold\n  (or type your own answer)\n"),
        "{screen}"
    );
    assert!(screen.contains("succeeded: 4 stages"), "{screen}");
    let runs: Vec<_> = std::fs::read_dir(p.path().join("runs")).unwrap().collect();
    let record = runs[0].as_ref().unwrap().path();
    let checkpoint = run_support::checkpoint_of(&record);
    assert_eq!(checkpoint["context"]["human.gate.label"], "[H] Hold");
}
