//! End-to-end: `trellis run` routing, retries, goal gates, limits and errors, asserted on exit codes,
//! the run record and the events.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use run_support::Project;

const HEAD: &str = "start [shape=Mdiamond]\n exit [shape=Msquare]\n";

fn workflow(body: &str) -> String {
    format!("digraph T {{\n {HEAD} {body}\n}}\n")
}

#[test]
fn conditions_route_on_the_previous_outcome_through_a_diamond() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "t [shape=parallelogram, script=\"exit 1\"]\n gate [shape=diamond]\n ok [shape=parallelogram, script=\"true\"]\n bad [shape=parallelogram, script=\"true\"]\n start -> t -> gate\n gate -> ok [condition=\"outcome=success\"]\n gate -> bad [condition=\"outcome=fail\"]\n ok -> exit\n bad -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "t", "gate", "bad", "exit"]);
    assert_eq!(run.summary["status"], "succeeded");
}

#[test]
fn weight_then_lexical_target_break_ties() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "n [shape=parallelogram, script=\"true\"]\n m [shape=parallelogram, script=\"true\"]\n b [shape=parallelogram, script=\"true\"]\n a [shape=parallelogram, script=\"true\"]\n z [shape=parallelogram, script=\"true\"]\n start -> n\n n -> z [weight=10]\n n -> a [weight=1]\n z -> m\n m -> b\n m -> a\n a -> exit\n b -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.stages(), ["start", "n", "z", "m", "a", "exit"]);
}

#[test]
fn context_values_from_set_drive_conditions() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("gate [shape=diamond]\n hi [shape=parallelogram, script=\"true\"]\n lo [shape=parallelogram, script=\"true\"]\n start -> gate\n gate -> hi [condition=\"context.score > 80 && mode=fast\"]\n gate -> lo\n hi -> exit\n lo -> exit"),
    );
    assert_eq!(
        p.run("w.fabro", &["--set", "score=85", "--set", "mode=fast"])
            .stages(),
        ["start", "gate", "hi", "exit"]
    );
    assert_eq!(
        p.run("w.fabro", &["--set", "score=85", "--set", "mode=slow"])
            .stages(),
        ["start", "gate", "lo", "exit"]
    );
}

#[test]
fn command_output_is_a_blob_that_conditions_read() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("say [shape=parallelogram, script=\"echo hello world; echo oops >&2\"]\n yes [shape=parallelogram, script=\"true\"]\n no [shape=parallelogram, script=\"true\"]\n start -> say\n say -> yes [condition=\"command.output contains hello\"]\n say -> no\n yes -> exit\n no -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.stages(), ["start", "say", "yes", "exit"]);
    let record = run.record();
    let say_dir = record.join("stages/002-say@1");
    assert_eq!(
        std::fs::read_to_string(say_dir.join("stdout.log")).unwrap(),
        "hello world\n"
    );
    assert_eq!(
        std::fs::read_to_string(say_dir.join("stderr.log")).unwrap(),
        "oops\n"
    );
    let status = run_support::read_json(&say_dir.join("status.json"));
    assert_eq!(status["status"], "succeeded");
    let output_ref = status["context_updates"]["command.output"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(output_ref.starts_with("blob://sha256/"), "{output_ref}");
    let hex = output_ref.trim_start_matches("blob://sha256/");
    assert_eq!(
        std::fs::read_to_string(record.join("blobs").join(hex)).unwrap(),
        "hello world\n"
    );
    assert_eq!(status["context_updates"]["command.exit_code"], 0);
}

/// A script that is one simple command starts its program without a shell; what the program sees and
/// what the stage records are what `sh -c` gives. A script the kernel cannot start (no `#!`) and a
/// program not found are still the shell's.
#[test]
fn a_simple_command_runs_as_the_shell_would_run_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let p = Project::new();
    let plain = p.write("plain.sh", "echo \"ran $1 in $(basename \"$PWD\")\"\n");
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.write(
        "w.fabro",
        &workflow("direct [shape=parallelogram, script=\"printenv PWD TRELLIS_NODE_ID\"]\n shell [shape=parallelogram, script=\"printenv PWD TRELLIS_NODE_ID; true\"]\n noshebang [shape=parallelogram, script=\"./plain.sh arg\"]\n missing [shape=parallelogram, script=\"no-such-program-here x\"]\n start -> direct -> shell -> noshebang -> missing -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let stdout = |dir: &str| {
        std::fs::read_to_string(run.record().join("stages").join(dir).join("stdout.log"))
            .unwrap_or_default()
    };
    let work_dir = std::fs::canonicalize(p.path()).unwrap();
    assert_eq!(
        stdout("002-direct@1"),
        format!("{}\ndirect\n", work_dir.display())
    );
    assert_eq!(
        stdout("003-shell@1"),
        format!("{}\nshell\n", work_dir.display())
    );
    let name = work_dir.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(stdout("004-noshebang@1"), format!("ran arg in {name}\n"));
    let failed = run.events_named("StageFailed");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["node_id"], "missing");
    let reason = failed[0]["failure_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the command exited with code 127: ") && reason.contains("not found"),
        "{reason}"
    );
}

#[test]
fn a_failing_command_reports_the_tail_of_stderr_and_is_not_retried() {
    let p = Project::new();
    p.write("w.fabro", &workflow("t [shape=parallelogram, script=\"echo broken >&2; exit 7\", max_retries=3]\n start -> t -> exit"));
    let run = p.run("w.fabro", &[]);
    assert_eq!(
        run.code(),
        Some(0),
        "an unconditional edge takes the failure onwards"
    );
    let failed = run.events_named("StageFailed");
    assert_eq!(failed.len(), 1);
    assert_eq!(
        failed[0]["failure_reason"],
        "the command exited with code 7: broken"
    );
    assert_eq!(
        run.events_named("StageRetrying"),
        [] as [serde_json::Value; 0]
    );
    assert_eq!(run.context("failure_class"), "stage_failed");
    assert_eq!(
        run.context("outcome"),
        "succeeded",
        "the exit stage ran last"
    );
}

/// A Fabro workflow routes on Fabro's failure classes as Fabro's engine would: a command's non-zero
/// exit is `deterministic`, a timeout `transient_infra`; and `allow_partial` ends a stage whose
/// retries ran out `partially_succeeded`.
#[test]
fn fabros_failure_classes_and_allow_partial_route_as_fabro_does() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "broken [shape=parallelogram, script=\"exit 1\"]\n \
             slow [shape=parallelogram, script=\"sleep 5\", timeout=\"200ms\", max_retries=0]\n \
             patient [shape=parallelogram, script=\"sleep 5\", timeout=\"200ms\", max_retries=1, allow_partial=true]\n \
             wrong [shape=parallelogram, script=\"true\"]\n \
             start -> broken\n \
             broken -> slow [condition=\"failure_class=deterministic\"]\n \
             broken -> wrong [condition=\"failure_class!=deterministic\"]\n \
             slow -> patient [condition=\"context.failure_class=transient_infra\"]\n \
             slow -> wrong [condition=\"failure_class=deterministic\"]\n \
             patient -> exit [condition=\"outcome=partial_success\"]\n \
             patient -> wrong [condition=\"outcome=fail\"]\n \
             wrong -> exit",
        ),
    );
    let checked = p.command(&["validate", "w.fabro"]).output().unwrap();
    let report = String::from_utf8_lossy(&checked.stdout);
    assert!(
        report.contains("valid") && !report.contains("warning"),
        "{report}"
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        run.stages(),
        ["start", "broken", "slow", "patient", "patient", "exit"]
    );
    let statuses: Vec<serde_json::Value> = run.checkpoint()["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["node_id"] == "patient")
        .map(|s| s["status"].clone())
        .collect();
    assert_eq!(statuses, ["failed", "partially_succeeded"]);
    // The failure it ended with stays said.
    assert_eq!(run.context("failure_class"), "timeout");
    let ended = run.events_named("StageCompleted");
    let patient = ended.iter().find(|e| e["node_id"] == "patient").unwrap();
    assert!(
        patient["failure_reason"]
            .as_str()
            .is_some_and(|r| r.contains("timeout") || r.contains("timed out")),
        "{patient}"
    );
}

#[test]
fn timeouts_are_retried_with_a_stage_directory_per_attempt() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("slow [shape=parallelogram, script=\"sleep 5\", timeout=\"200ms\", max_retries=1]\n start -> slow -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    // The timed-out process must be killed.
    run_support::assert_process_group_gone(&run.record().join("stages/002-slow@1"));
    assert_eq!(run.stages(), ["start", "slow", "slow", "exit"]);
    let retrying = run.events_named("StageRetrying");
    assert_eq!(retrying.len(), 1);
    assert_eq!(retrying[0]["reason"], "timed out after 200ms");
    assert!(run.record().join("stages/002-slow@1").is_dir());
    assert!(run.record().join("stages/003-slow@1").is_dir());
    assert_eq!(run.context("internal.retry_count.slow"), 1);
}

/// The graph's `stall_timeout` ends a stage that shows no progress for that long, not one that
/// takes longer: a command printing as it goes and a wait outlive it; a silent command fails as
/// stalled (its process killed), is retried and routes as a timeout does.
#[test]
fn the_stall_timeout_ends_a_stage_that_shows_no_progress_not_a_long_one() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &format!(
            "digraph T {{\n graph [stall_timeout=\"1s\"]\n {HEAD} \
             chatty [shape=parallelogram, script=\"for i in 1 2 3 4 5 6; do echo $i; sleep 0.4; done\"]\n \
             pause [shape=insulator, duration=\"1500ms\"]\n \
             quiet [shape=parallelogram, script=\"sleep 30\", max_retries=1]\n \
             after [shape=parallelogram, script=\"true\"]\n \
             start -> chatty -> pause -> quiet\n quiet -> after [condition=\"outcome=fail\"]\n \
             quiet -> exit\n after -> exit\n}}\n"
        ),
    );
    let started = std::time::Instant::now();
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    // Retried as a timeout is.
    assert_eq!(
        run.stages(),
        [
            "start", "chatty", "pause", "quiet", "quiet", "after", "exit"
        ]
    );
    assert_eq!(run.stage_status("chatty"), "succeeded");
    assert_eq!(run.stage_status("pause"), "succeeded");
    assert_eq!(run.stage_status("quiet"), "failed");
    run_support::assert_process_group_gone(&run_support::stage_dir(&run.record(), "quiet"));
    let ended = run.events_named("StageFailed");
    let quiet = ended.iter().find(|e| e["node_id"] == "quiet").unwrap();
    assert_eq!(
        quiet["failure_reason"],
        "stalled: no event and no output for 1s (the graph's `stall_timeout`; a node's `timeout` replaces it)"
    );
    assert_eq!(run.context("failure_class"), "timeout");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

/// The retries a node used are counted once it used one; a condition reads the count of a node
/// that never retried as 0 (the run keeps no key per node for them).
#[test]
fn conditions_read_the_retries_a_node_used() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("once [shape=parallelogram, script=\"true\"]\n flaky [shape=parallelogram, script=\"test -f tried || { touch tried; sleep 5; }\", timeout=\"300ms\", max_retries=2]\n gate [shape=diamond]\n both [shape=parallelogram, script=\"true\"]\n other [shape=parallelogram, script=\"true\"]\n start -> once -> flaky -> gate\n gate -> both [condition=\"internal.retry_count.once = 0 && internal.retry_count.flaky = 1\"]\n gate -> other\n both -> exit\n other -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(
        run.stages(),
        ["start", "once", "flaky", "flaky", "gate", "both", "exit"]
    );
    assert_eq!(run.context("internal.retry_count.flaky"), 1);
    assert_eq!(
        run.context("internal.retry_count.once"),
        serde_json::Value::Null
    );
}

#[test]
fn a_failed_node_with_no_matching_edge_follows_its_retry_target() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "t [shape=parallelogram, script=\"test -f ready || { touch ready; exit 1; }\", retry_target=\"prep\"]\n prep [shape=parallelogram, script=\"echo prep >> prep.log\"]\n start -> prep -> t\n t -> exit [condition=\"outcome=success\"]",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "prep", "t", "prep", "t", "exit"]);
    assert_eq!(p.read("prep.log"), "prep\nprep\n");
}

#[test]
fn no_matching_edge_is_a_clear_error() {
    let p = Project::new();
    p.write("w.fabro", &workflow("t [shape=parallelogram, script=\"true\"]\n start -> t\n t -> exit [condition=\"outcome=fail\"]"));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(1));
    assert_eq!(run.summary["status"], "failed");
    assert_eq!(
        run.summary["error"],
        "no edge from `t` matches its outcome `succeeded`; conditions tried: t -> exit: outcome=fail"
    );
    assert_eq!(run.events_named("WorkflowRunFailed").len(), 1);
}

#[test]
fn goal_gates_send_the_run_back_until_they_succeed() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "fix [shape=parallelogram, script=\"echo x >> fixes.log\"]\n check [shape=parallelogram, script=\"test $(wc -l < fixes.log) -ge 2\", goal_gate=true, retry_target=\"fix\"]\n start -> fix -> check -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(
        run.stages(),
        ["start", "fix", "check", "fix", "check", "exit"]
    );
    assert_eq!(run.events_named("GoalGateUnmet").len(), 1);
}

#[test]
fn an_unmet_goal_gate_without_retry_target_fails_the_run() {
    let p = Project::new();
    p.write("w.fabro", &workflow("check [shape=parallelogram, script=\"false\", goal_gate=true]\n start -> check -> exit"));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(1));
    assert_eq!(
        run.summary["error"],
        "goal gate `check` ended failed and no retry target is set"
    );
}

#[test]
fn visit_limits_stop_loops() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("again [shape=parallelogram, script=\"true\", max_visits=3]\n start -> again\n again -> again [weight=1]\n again -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(1));
    assert_eq!(
        run.summary["error"],
        "node `again` reached its visit limit of 3"
    );
    assert_eq!(run.stages(), ["start", "again", "again", "again"]);
}

/// A dry run's stages succeed with canned answers, so a loop that waits on a real one would go
/// round until the step budget: a node that sets no limit runs at most 10 times (Fabro's default).
#[test]
fn a_dry_run_stops_a_loop_that_waits_on_a_real_answer_at_ten_visits() {
    let p = Project::new();
    let looping = "test [shape=parallelogram, script=\"./run-tests.sh\"]\n fix [shape=tab, prompt=\"Fix it\"]\n start -> test\n test -> exit [condition=\"context.tests_passed=true\"]\n test -> fix\n fix -> test";
    p.write("w.fabro", &workflow(looping));
    let run = p.run("w.fabro", &["--dry-run"]);
    assert_eq!(run.code(), Some(1));
    let error = run.summary["error"].as_str().unwrap();
    assert!(
        error.starts_with(
            "node `test` reached its visit limit of 10 (a dry run's limit for a node that sets none"
        ),
        "{error}"
    );
    assert_eq!(
        run.stages().len(),
        21,
        "start, then test and fix ten times each"
    );
    // A limit the workflow sets is the limit, in a dry run too.
    p.write(
        "bounded.fabro",
        &workflow(&looping.replace("start -> test", "start -> test\n graph [max_node_visits=3]")),
    );
    let run = p.run("bounded.fabro", &["--dry-run"]);
    assert_eq!(
        run.summary["error"],
        "node `test` reached its visit limit of 3"
    );
    // So is an edge's: a loop that `max_iterations` bounds goes round as often as it says.
    p.write(
        "counted.fabro",
        &workflow(&looping.replace("fix -> test", "fix -> test [max_iterations=15]")),
    );
    let run = p.run("counted.fabro", &["--dry-run"]);
    let tests = run.stages().iter().filter(|s| *s == "test").count();
    assert_eq!(tests, 16, "{}", run.summary);
}

#[test]
fn max_iterations_bounds_an_edge_and_counts_survive_in_the_checkpoint() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("again [shape=parallelogram, script=\"true\"]\n start -> again\n again -> again [weight=1, max_iterations=2]\n again -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "again", "again", "again", "exit"]);
    assert_eq!(run.checkpoint()["edge_counts"]["again->again#1"], 2);
}

#[test]
fn the_step_budget_stops_runaways() {
    let p = Project::new();
    p.write("w.fabro", &workflow("a [shape=parallelogram, script=\"true\"]\n b [shape=parallelogram, script=\"true\"]\n start -> a -> b -> a\n b -> exit [condition=\"outcome=fail\"]"));
    let run = p.run("w.fabro", &["--max-steps", "7"]);
    assert_eq!(run.code(), Some(1));
    assert_eq!(
        run.summary["error"],
        "the run executed 7 stages without finishing, its step budget: a loop probably never ends"
    );
}

#[test]
fn wait_nodes_pause() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("pause [shape=insulator, duration=\"300ms\"]\n start -> pause -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0));
    let completed = run.events_named("StageCompleted");
    let pause = completed.iter().find(|e| e["node_id"] == "pause").unwrap();
    assert!(pause["duration_ms"].as_u64().unwrap() >= 300, "{pause}");
}

#[test]
fn yaml_workflows_end_at_a_terminal_node() {
    let p = Project::new();
    p.write(
        "w.yaml",
        "entry: a\nnodes:\n  a: { type: command, script: echo a }\n  b: { type: command, script: echo b }\nedges:\n  - { from: a, to: b }\n",
    );
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["a", "b"]);
}

#[test]
fn natural_language_edges_need_a_model_and_say_so() {
    let p = Project::new();
    p.write(
        "w.yaml",
        "entry: a\nnodes:\n  a: { type: command, script: echo a }\n  b: { type: command, script: echo b }\n  c: { type: command, script: echo c }\nedges:\n  - { from: a, to: b, when: things look good }\n  - { from: a, to: c, when: things look bad }\n",
    );
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(1));
    let error = run.summary["error"].as_str().unwrap();
    assert!(
        error.starts_with("choosing the edge out of `a` needs a model to judge its `when` conditions: configuration error from local: no model provider is configured")
            && error.contains("scripts/local-model.sh"),
        "{error}"
    );
    let dry = p.run("w.yaml", &["--dry-run"]);
    assert_eq!(dry.code(), Some(0));
    assert_eq!(dry.stages(), ["a", "b"]);
}

#[test]
fn model_nodes_fail_clearly_without_a_model_and_are_simulated_in_dry_runs() {
    let p = Project::new();
    p.write("w.fabro", &workflow("plan [shape=tab, prompt=\"Plan it\"]\n touch [shape=parallelogram, script=\"touch touched\"]\n start -> plan -> touch -> exit"));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(1), "a missing model stops the run");
    assert!(
        run.summary["error"].as_str().unwrap().starts_with("stage `plan` cannot run: configuration error from local: no model provider is configured and the local model server is missing")
            && run.summary["error"].as_str().unwrap().contains("set ANTHROPIC_API_KEY, OPENAI_API_KEY or GEMINI_API_KEY"),
        "{}",
        run.summary
    );
    assert_eq!(run.events_named("StageFailed").len(), 1);
    assert!(
        !p.path().join("touched").exists(),
        "nothing after the unconfigured stage ran"
    );
    let dry = p.run("w.fabro", &["--dry-run"]);
    assert_eq!(dry.code(), Some(0));
    assert_eq!(
        dry.context("response.plan"),
        "[Simulated] Response for stage: plan"
    );
    assert_eq!(dry.context("last_stage"), "plan");
    let plan_dir = dry.record().join("stages/002-plan@1");
    assert_eq!(
        std::fs::read_to_string(plan_dir.join("prompt.md")).unwrap(),
        "Plan it"
    );
    assert_eq!(
        std::fs::read_to_string(plan_dir.join("response.md")).unwrap(),
        "[Simulated] Response for stage: plan"
    );
    assert!(
        !p.path().join("touched").exists(),
        "a dry run runs no commands"
    );
}

#[test]
fn invalid_workflows_and_missing_files_do_not_start_a_run() {
    let p = Project::new();
    p.write("bad.fabro", "digraph B { start -> exit -> start }");
    let out = p.command(&["run", "bad.fabro"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("error[exit-outgoing]"));
    assert!(!p.path().join("runs").exists());
    let out = p.command(&["run", "missing.fabro"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read missing.fabro"));
    let out = p.command(&["resume", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no run `nope`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn events_are_numbered_and_named() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow("t [shape=parallelogram, script=\"true\"]\n start -> t -> exit"),
    );
    let run = p.run("w.fabro", &[]);
    let events = run.events();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["seq"], i as u64 + 1, "{event}");
        assert_eq!(event["run_id"], run.summary["run_id"]);
        assert!(event["ts"].as_str().unwrap().ends_with('Z'));
    }
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(names.first(), Some(&"WorkflowRunStarted"));
    assert_eq!(names.last(), Some(&"WorkflowRunCompleted"));
    for name in [
        "StageStarted",
        "StageCompleted",
        "EdgeSelected",
        "CheckpointSaved",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let id = run.summary["run_id"].as_str().unwrap();
    let out = p.command(&["events", id, "--json"]).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        events.len()
    );
    let out = p.command(&["show", id]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("status:  succeeded") && shown.contains("t@1 #1"),
        "{shown}"
    );
    let out = p.command(&["runs"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(id));
}

#[test]
fn a_loop_restart_edge_starts_visit_counts_afresh() {
    let p = Project::new();
    let body = "a [shape=parallelogram, script=\"true\", max_visits=1]\n b [shape=parallelogram, script=\"echo x >> n.log; test $(wc -l < n.log) -ge 3\"]\n start -> a -> b\n b -> exit [condition=\"outcome=success\"]\n b -> a [loop_restart=true]";
    p.write("w.fabro", &workflow(body));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(
        run.stages(),
        ["start", "a", "b", "a", "b", "a", "b", "exit"]
    );
    assert_eq!(run.events_named("LoopRestarted").len(), 2);
    std::fs::remove_file(p.path().join("n.log")).unwrap();
    p.write(
        "w.fabro",
        &workflow(&body.replace("loop_restart=true", "weight=0")),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(
        run.summary["error"],
        "node `a` reached its visit limit of 1"
    );
}

/// Fabro's circuit breaker: with `loop_restart_signature_limit=3`, a stage failing the same way a
/// third time stops the run, its numbers masked in the signature, across loop restarts and a kill
/// and resume; failures that differ in words are not the same, and without the attribute the loop
/// runs on as its bounds say.
#[test]
fn a_failure_repeated_to_the_graphs_limit_stops_the_run() {
    let p = Project::new();
    // `verify` fails with the round's number in its message; after two failures `implement`
    // waits once, to be killed there.
    let body = "implement [shape=parallelogram, script=\"if [ \\\"$(wc -l < v.log 2>/dev/null)\\\" = 2 ] && [ ! -f waited ]; then touch waited; sleep 30; fi\"]\n \
        verify [shape=parallelogram, script=\"echo x >> v.log; echo \\\"FAILED test_add: round $(wc -l < v.log), took 0.0$(wc -l < v.log)s\\\" >&2; exit 1\"]\n \
        check [shape=diamond]\n \
        start -> implement -> verify -> check\n \
        check -> exit [condition=\"outcome=success\"]\n \
        check -> implement [condition=\"outcome=fail\", loop_restart=true]";
    let limited =
        format!("digraph T {{\n graph [loop_restart_signature_limit=3]\n {HEAD} {body}\n}}\n");
    p.write("w.fabro", &limited);
    let mut child = p.spawn_run("w.fabro");
    run_support::wait_for(
        "implement waiting after two failures",
        std::time::Duration::from_secs(20),
        || p.path().join("waited").exists(),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let record = p.only_run();
    let id = record.file_name().unwrap().to_string_lossy().into_owned();
    let run = p.resume(&id, &[]);
    assert_eq!(run.code(), Some(1), "{}", run.stderr());
    let signature = "verify|stage_failed|the command exited with code <n>: failed test_add: round <n>, took <n>.<n>s";
    assert_eq!(
        run.summary["error"],
        format!(
            "node `verify` failed the same way 3 times, the graph's `loop_restart_signature_limit`: {signature}"
        )
    );
    assert_eq!(
        p.read("v.log").lines().count(),
        3,
        "verify ran three times in all"
    );
    let checkpoint = run_support::checkpoint_of(&record);
    assert_eq!(
        checkpoint["failure_signatures"][signature], 3,
        "{checkpoint}"
    );
    assert_eq!(checkpoint["context"]["failure_signature"], signature);

    // Another failure each time is no cycle: the loop ends at its bounds (here, its success).
    std::fs::remove_file(p.path().join("v.log")).unwrap();
    let varied = limited
        .replace(
            "FAILED test_add",
            "FAILED test_$(head -c 3 v.log | tr x a)$(wc -l < v.log | tr 0-9 a-j)",
        )
        .replace("exit 1", "test $(wc -l < v.log) -ge 5");
    p.write("w.fabro", &varied);
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(p.read("v.log").lines().count(), 5);

    // Without the attribute the same failure repeats as often as the loop goes round.
    std::fs::remove_file(p.path().join("v.log")).unwrap();
    p.write(
        "w.fabro",
        &workflow(&body.replace("exit 1", "test $(wc -l < v.log) -ge 5")),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(p.read("v.log").lines().count(), 5);
}

#[test]
fn the_recorded_source_has_file_references_inlined() {
    let p = Project::new();
    p.write(
        "prompts/plan.md",
        "Plan \"carefully\" for $goal\nwith \\d escapes",
    );
    p.write("schemas/out.json", r#"{"type": "object"}"#);
    p.write(
        "w.fabro",
        &format!("digraph T {{\n graph [goal=\"ship\"]\n {HEAD} plan [shape=tab, prompt=\"@prompts/plan.md\", output_schema=\"@schemas/out.json\"]\n start -> plan -> exit\n}}\n"),
    );
    let run = p.run("w.fabro", &["--dry-run"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let recorded = std::fs::read_to_string(run.record().join("workflow.fabro")).unwrap();
    assert!(
        recorded.contains(r#"prompt="Plan \"carefully\" for $goal\nwith \\d escapes""#),
        "{recorded}"
    );
    assert!(
        recorded.contains(r#"output_schema="{\"type\":\"object\"}""#),
        "{recorded}"
    );
    // The recorded source stands alone: it validates without the prompt files.
    std::fs::remove_dir_all(p.path().join("prompts")).unwrap();
    std::fs::remove_dir_all(p.path().join("schemas")).unwrap();
    let out = p
        .command(&[
            "validate",
            run.record().join("workflow.fabro").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
