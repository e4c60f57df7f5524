//! Regression tests of the engine core, through the real `trellis` binary: parallel branches walk the
//! same loop as the main run (routing and setup errors, sub-workflows and nested fan-outs inside a
//! branch), the fan-in reports the join's verdict and sees each branch's output, fallback retry
//! targets, the events the documents name, the router's view of the context, and cancellation.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use std::time::Duration;

use run_support::{Project, wait_for};
use serde_json::{Value, json};
use trellis_test::Llmock;

fn workflow(body: &str) -> String {
    format!("digraph W {{\n start [shape=Mdiamond]\n exit [shape=Msquare]\n {body}\n}}\n")
}

#[test]
fn regression_a_routing_error_inside_a_branch_fails_the_run() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "fan [shape=component]\n merge [shape=tripleoctagon]\n a [shape=parallelogram, script=\"true\"]\n \
             b [shape=parallelogram, script=\"true\"]\n start -> fan\n fan -> a\n fan -> b -> merge\n \
             a -> merge [condition=\"outcome=fail\"]\n merge -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(1), "{}", run.stderr());
    let error = run.summary["error"].as_str().unwrap();
    assert!(error.contains("no edge from `a` matches"), "{error}");
}

#[test]
fn regression_a_sub_workflow_inside_a_branch_runs() {
    let p = Project::new();
    p.write(
        "child.fabro",
        &workflow("hello [shape=parallelogram, script=\"echo child >> child.log\"]\n start -> hello -> exit"),
    );
    p.write(
        "w.fabro",
        &workflow(
            "fan [shape=component]\n merge [shape=tripleoctagon]\n sub [shape=house, workflow=\"child.fabro\"]\n \
             b [shape=parallelogram, script=\"true\"]\n start -> fan\n fan -> sub -> merge\n fan -> b -> merge\n merge -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(p.read("child.log"), "child\n");
    let results = run.context("parallel.results");
    let statuses: Vec<&str> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["succeeded", "succeeded"]);
}

#[test]
fn regression_a_nested_fan_out_inside_a_branch_runs() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "outer [shape=component]\n inner [shape=component]\n inner_merge [shape=tripleoctagon]\n outer_merge [shape=tripleoctagon]\n \
             x [shape=parallelogram, script=\"echo x >> x.log\"]\n y [shape=parallelogram, script=\"echo y >> y.log\"]\n \
             z [shape=parallelogram, script=\"echo z >> z.log\"]\n \
             start -> outer\n outer -> inner\n inner -> x -> inner_merge\n inner -> y -> inner_merge\n \
             inner_merge -> outer_merge\n outer -> z -> outer_merge\n outer_merge -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    for log in ["x.log", "y.log", "z.log"] {
        assert_eq!(p.read(log).lines().count(), 1, "{log}");
    }
    assert_eq!(run.branch_ids(), ["inner", "z"]);
    let stages = run.stages();
    assert!(
        stages.contains(&"inner_merge".to_owned())
            && stages.last().map(String::as_str) == Some("exit"),
        "{stages:?}"
    );
}

#[test]
fn regression_a_setup_error_inside_a_branch_stops_the_run() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "fan [shape=component]\n merge [shape=tripleoctagon]\n ask [shape=tab, prompt=\"Hi\"]\n \
             b [shape=parallelogram, script=\"true\"]\n start -> fan\n fan -> ask -> merge\n fan -> b -> merge\n merge -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(1), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.summary["status"], "failed");
    let error = run.summary["error"].as_str().unwrap();
    assert!(error.contains("stage `ask` cannot run"), "{error}");
}

#[test]
fn regression_an_unmet_join_policy_fails_the_fan_in() {
    let p = Project::new();
    for policy in ["k_of_n(2)", "quorum(0.75)"] {
        p.write(
            "w.fabro",
            &workflow(&format!(
                "fan [shape=component, join_policy=\"{policy}\"]\n join [shape=tripleoctagon]\n \
                 a [shape=parallelogram, script=\"true\"]\n b [shape=parallelogram, script=\"false\"]\n \
                 ok [shape=parallelogram, script=\"true\"]\n start -> fan\n fan -> a -> join\n fan -> b -> join\n \
                 join -> ok [condition=\"outcome=success\"]\n ok -> exit"
            )),
        );
        let run = p.run("w.fabro", &[]);
        assert_eq!(run.code(), Some(1), "{policy}: {}", run.summary);
        assert_eq!(run.stage_status("join"), "failed", "{policy}");
        assert!(!run.stages().contains(&"ok".to_owned()), "{policy}");
        let error = run.summary["error"].as_str().unwrap();
        assert!(error.contains("no edge from `join` matches"), "{error}");
    }
}

#[test]
fn regression_a_partial_join_lets_partial_success_edges_match() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "fan [shape=component]\n join [shape=tripleoctagon]\n a [shape=parallelogram, script=\"true\"]\n \
             b [shape=parallelogram, script=\"false\"]\n partial [shape=parallelogram, script=\"true\"]\n \
             start -> fan\n fan -> a -> join\n fan -> b -> join\n \
             join -> partial [condition=\"outcome=partial_success\"]\n join -> exit [condition=\"outcome=success\"]\n partial -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.summary);
    assert_eq!(run.stage_status("join"), "partially_succeeded");
    assert!(run.stages().contains(&"partial".to_owned()));
}

#[test]
fn regression_fallback_retry_target_is_taken_when_the_retry_target_is_spent() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "check [shape=parallelogram, script=\"test -f fixed\", retry_target=\"quick\", fallback_retry_target=\"thorough\"]\n \
             quick [shape=parallelogram, script=\"echo quick >> quick.log\", max_visits=1]\n \
             thorough [shape=parallelogram, script=\"touch fixed\"]\n \
             start -> check\n check -> exit [condition=\"outcome=success\"]\n \
             check -> quick [condition=\"context.never\"]\n check -> thorough [condition=\"context.never\"]\n \
             quick -> check\n thorough -> check",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        run.stages(),
        [
            "start", "check", "quick", "check", "thorough", "check", "exit"
        ]
    );
}

#[test]
fn regression_human_gate_answered_is_emitted() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "approve [shape=hexagon, label=\"Ship it?\"]\n start -> approve\n approve -> exit [label=\"[Y] Yes\"]\n approve -> exit [label=\"[N] No\"]",
        ),
    );
    p.write("answers.json", "{\"approve\": \"N\"}");
    let run = p.run("w.fabro", &["--answers", "answers.json"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let answered = run.events_named("HumanGateAnswered");
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0]["node_id"], "approve");
    assert_eq!(answered[0]["label"], "[N] No");
}

#[test]
fn regression_artifacts_appear_in_status_events_show_and_the_run_total() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "test [shape=parallelogram, script=\"mkdir -p test-results && echo ok > test-results/report.txt && echo '<x/>' > junit.xml\"]\n start -> test -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let dir = run.record().join("stages").join("002-test@1");
    let status = run_support::read_json(&dir.join("status.json"));
    let paths: Vec<&str> = status["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["junit.xml", "test-results/report.txt"]);
    let completed = run
        .events_named("StageCompleted")
        .into_iter()
        .find(|e| e["node_id"] == "test")
        .unwrap();
    assert_eq!(completed["artifacts"].as_array().unwrap().len(), 2);
    assert_eq!(
        run.events_named("WorkflowRunCompleted")[0]["artifact_count"],
        2
    );
    let id = run.summary["run_id"].as_str().unwrap();
    let shown = p.command(&["show", id]).output().unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("artifact: test-results/report.txt, 3 bytes"),
        "{shown}"
    );
}

#[test]
fn regression_the_when_router_sees_command_output_and_reports_its_call() {
    let Some(mock) = Llmock::start() else { return };
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    p.write(
        "w.yaml",
        "entry: a\nnodes:\n  a: { type: command, script: echo tests failed }\n  b: { type: command, script: echo b }\n  c: { type: command, script: echo c }\n\
         edges:\n  - { from: a, to: b, when: the tests passed }\n  - { from: a, to: c, when: the tests failed }\n",
    );
    mock.scenario(&json!([{ "type": "reply", "text": "{\"choice\": 2}", "times": 1 }]));
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    let prompt = mock.requests()[0]["body"]["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        prompt.contains("\"command.output\": \"tests failed"),
        "{prompt}"
    );
    assert!(!prompt.contains("blob://"), "{prompt}");
    let calls = run.events_named("ModelCallCompleted");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["node_id"], "a");
    let edge = run
        .events_named("EdgeSelected")
        .into_iter()
        .find(|e| e["node_id"] == "a")
        .unwrap();
    assert_eq!(edge["router"]["usage"], calls[0]["usage"]);
}

#[test]
fn regression_a_fan_in_with_a_prompt_sees_each_branch_output() {
    let Some(mock) = Llmock::start() else { return };
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    p.write(
        "w.fabro",
        &workflow(
            "fan [shape=component]\n a [shape=parallelogram, script=\"echo all 12 tests pass\"]\n \
             b [shape=parallelogram, script=\"echo 3 tests fail; exit 1\"]\n \
             join [shape=tripleoctagon, prompt=\"Pick the best branch\"]\n \
             start -> fan\n fan -> a -> join\n fan -> b -> join\n join -> exit",
        ),
    );
    mock.scenario(&json!([{ "type": "reply", "text": "{\"best_id\": \"a\"}", "times": 1 }]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    let shown: Value = mock.requests()[0]["body"]["messages"][0]["content"][0]["text"].clone();
    let shown = shown.as_str().unwrap();
    assert!(
        shown.contains("### a (succeeded)\nOutput:\nall 12 tests pass"),
        "{shown}"
    );
    assert!(shown.contains("### b (failed)"), "{shown}");
    assert!(shown.contains("3 tests fail"), "{shown}");
    assert_eq!(run.stage_status("join"), "partially_succeeded");
}

#[test]
fn ctrl_c_cancels_the_run_kills_the_stage_and_resume_continues() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "first [shape=parallelogram, script=\"echo first >> first.log\"]\n \
             slow [shape=parallelogram, script=\"test -f again || { touch again; sleep 30; }; echo slow >> slow.log\"]\n \
             start -> first -> slow -> exit",
        ),
    );
    let mut child = p.spawn_run("w.fabro");
    p.wait_for_event("StageStarted", "slow");
    // The command itself is running once it has touched its marker.
    wait_for("the slow command to start", Duration::from_secs(10), || {
        p.path().join("again").exists()
    });
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let mut status = None;
    wait_for("trellis to stop", Duration::from_secs(5), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(status.unwrap().code(), Some(130));
    let record = p.only_run();
    let checkpoint = run_support::checkpoint_of(&record);
    assert_eq!(checkpoint["status"], "cancelled");
    assert_eq!(checkpoint["next_node"], "slow");
    let events = std::fs::read_to_string(record.join("events.jsonl")).unwrap();
    let last: Value = serde_json::from_str(events.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "WorkflowRunCancelled");
    assert_eq!(last["node"], "slow");
    run_support::assert_process_group_gone(&record.join("stages").join("003-slow@1"));
    let id = record.file_name().unwrap().to_string_lossy().into_owned();
    let resumed = p.resume(&id, &[]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    assert_eq!(
        p.read("first.log"),
        "first\n",
        "finished stages are not re-run"
    );
    assert_eq!(p.read("slow.log"), "slow\n");
}

#[test]
fn ctrl_c_stops_a_model_call_in_flight() {
    let Some(mock) = Llmock::start() else { return };
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    p.write(
        "w.fabro",
        &workflow("ask [shape=tab, prompt=\"Write a long essay\"]\n start -> ask -> exit"),
    );
    // The answer starts streaming, then stalls for 30 seconds.
    mock.scenario(&json!([
        { "type": "stream_fault", "kind": "stall", "after_chunks": 1, "stall_seconds": 30, "times": 1 }
    ]));
    let mut child = p.spawn_run("w.fabro");
    p.wait_for_event("ModelCallStarted", "ask");
    // llmock journals a request only when it ends; give the stream a moment to reach its stall.
    std::thread::sleep(Duration::from_millis(300));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let mut status = None;
    wait_for("trellis to stop", Duration::from_secs(5), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(status.unwrap().code(), Some(130));
    let checkpoint = run_support::checkpoint_of(&p.only_run());
    assert_eq!(checkpoint["status"], "cancelled");
    assert_eq!(checkpoint["next_node"], "ask");
    // llmock saw the client leave the stalled stream rather than sit it out.
    wait_for(
        "llmock to journal the request",
        Duration::from_secs(5),
        || {
            mock.requests()
                .first()
                .is_some_and(|r| r["completed"] == false)
        },
    );
}
