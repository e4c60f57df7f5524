//! End-to-end durability: a run killed with SIGKILL in the middle of a stage resumes from its last
//! checkpoint, re-runs only the interrupted stage, and loses nothing from the record; timed-out commands
//! leave no process behind.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use std::time::Duration;

use run_support::{Project, wait_for};

const WORKFLOW: &str = "digraph Durable {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    a [shape=parallelogram, script=\"echo a >> a.log\"]
    b [shape=parallelogram, script=\"echo start >> b.log; sleep 2; echo end >> b.log\"]
    c [shape=parallelogram, script=\"echo c >> c.log\"]
    start -> a -> b -> c -> exit
}
";

fn completed_nodes(record: &std::path::Path) -> Vec<String> {
    let checkpoint = run_support::checkpoint_of(record);
    checkpoint["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_run_killed_mid_stage_resumes_without_rerunning_finished_stages() {
    // The reference: the same workflow, never interrupted.
    let reference = Project::new();
    reference.write("w.fabro", WORKFLOW);
    let uninterrupted = reference.run("w.fabro", &[]);
    assert_eq!(uninterrupted.code(), Some(0));
    let expected = uninterrupted.stages();

    let p = Project::new();
    p.write("w.fabro", WORKFLOW);
    let mut child = p.spawn_run("w.fabro");
    p.wait_for_event("StageStarted", "b");
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());
    let record = p.only_run();
    assert_eq!(
        completed_nodes(&record),
        ["start", "a"],
        "the checkpoint holds the finished stages"
    );

    let id = record.file_name().unwrap().to_string_lossy().into_owned();
    let resumed = p.resume(&id, &[]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    assert_eq!(
        completed_nodes(&record),
        expected,
        "every stage ran as often as without the kill"
    );
    assert_eq!(
        p.read("a.log"),
        "a\n",
        "a finished before the kill and was not run again"
    );
    assert_eq!(p.read("c.log"), "c\n");
    assert_eq!(
        p.read("b.log").lines().filter(|l| *l == "end").count(),
        1,
        "b completed once"
    );
    // Nothing lost: the first process's events are still there, then the resumed run's.
    let events = resumed.events();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names.iter().filter(|n| **n == "WorkflowRunStarted").count(),
        1
    );
    assert_eq!(
        names.iter().filter(|n| **n == "WorkflowRunResumed").count(),
        1
    );
    assert_eq!(names.last(), Some(&"WorkflowRunCompleted"));
    let completed: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "StageCompleted")
        .map(|e| e["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(completed, expected);
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] > w[0]),
        "sequence numbers keep increasing across the resume: {seqs:?}"
    );
    // The interrupted attempt's directory is kept, out of the way.
    let stages: Vec<String> = std::fs::read_dir(record.join("stages"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        stages.iter().any(|s| s.starts_with("003-b@1.interrupted")),
        "{stages:?}"
    );
    assert!(stages.iter().any(|s| s == "003-b@1"), "{stages:?}");
}

#[test]
fn a_timed_out_command_leaves_no_process_behind() {
    // Unconfined: the test reads process ids the commands print, which the sandbox would number in a
    // PID namespace of its own (the sandboxed path is tested in security.rs).
    let p = Project::new().with_env("TRELLIS_SANDBOX", "none");
    p.write(
        "w.fabro",
        "digraph T { start [shape=Mdiamond]\n exit [shape=Msquare]\n slow [shape=parallelogram, script=\"sleep 30 & echo $! > bg.pid; sleep 30\", timeout=\"300ms\", max_retries=0]\n start -> slow -> exit }",
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0));
    let pid = p.read("bg.pid").trim().to_owned();
    assert_ne!(pid, "");
    wait_for(
        "the background process to be killed",
        Duration::from_secs(5),
        || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map_or(true, |stat| stat.split_whitespace().nth(2) == Some("Z"))
        },
    );
}

#[test]
fn events_follow_streams_until_the_run_ends() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph F { start [shape=Mdiamond]\n exit [shape=Msquare]\n pause [shape=insulator, duration=\"1s\"]\n start -> pause -> exit }",
    );
    let mut run = p.spawn_run("w.fabro");
    // The run's id is known once its record is (`run.json`, written once the run is owned).
    wait_for("the run's record", Duration::from_secs(20), || {
        std::fs::read_dir(p.path().join("runs")).is_ok_and(|runs| {
            runs.filter_map(Result::ok)
                .any(|run| run.path().join("run.json").is_file())
        })
    });
    let id = p
        .only_run()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let follow = p
        .command(&["events", &id, "--follow", "--json"])
        .output()
        .unwrap();
    assert!(run.wait().unwrap().success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&follow.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.last().unwrap()["event"],
        "WorkflowRunCompleted",
        "follow returns once the run has ended"
    );
    assert!(
        lines
            .iter()
            .any(|e| e["event"] == "StageCompleted" && e["node_id"] == "pause")
    );
}

#[test]
fn python_commands_run_with_python3() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph Py { start [shape=Mdiamond]\n exit [shape=Msquare]\n calc [shape=parallelogram, language=\"python\", script=\"print(6 * 7)\"]\n yes [shape=parallelogram, script=\"true\"]\n start -> calc\n calc -> yes [condition=\"command.output contains 42\"]\n yes -> exit }",
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "calc", "yes", "exit"]);
}

#[test]
fn a_run_killed_during_a_fan_out_resumes_each_branch_where_it_stopped() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph Fan { start [shape=Mdiamond]\n exit [shape=Msquare]\n fan [shape=component]\n merge [shape=tripleoctagon]\n quick [shape=parallelogram, script=\"echo quick >> quick.log\"]\n first [shape=parallelogram, script=\"echo first >> chain.log\"]\n second [shape=parallelogram, script=\"sleep 2; echo second >> chain.log\"]\n slow [shape=parallelogram, script=\"sleep 2; echo slow >> slow.log\"]\n start -> fan\n fan -> quick -> merge\n fan -> first -> second -> merge\n fan -> slow -> merge\n merge -> exit }",
    );
    let mut child = p.spawn_run("w.fabro");
    p.wait_for_event("StageStarted", "second");
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    let record = p.only_run();
    let checkpoint = run_support::checkpoint_of(&record);
    assert_eq!(
        checkpoint["parallel"]["branches"]["quick"]["result"]["status"], "succeeded",
        "{checkpoint}"
    );
    assert_eq!(
        checkpoint["parallel"]["branches"]["first"]["next"],
        "second"
    );

    let id = record.file_name().unwrap().to_string_lossy().into_owned();
    let resumed = p.resume(&id, &[]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    assert_eq!(
        p.read("quick.log"),
        "quick\n",
        "a finished branch is not run again"
    );
    assert_eq!(
        p.read("chain.log"),
        "first\nsecond\n",
        "a branch continues from the stage it was in"
    );
    assert_eq!(
        p.read("slow.log"),
        "slow\n",
        "the interrupted stage runs once more, and only once completes"
    );
    assert_eq!(resumed.branch_ids(), ["quick", "first", "slow"]);
    assert!(
        resumed.checkpoint().get("parallel").is_none(),
        "progress is dropped once the fan-out is done"
    );
}

/// A run of one wait of `duration`, started in `p` and waiting: its process, and the `wait.json`
/// its wait has written its end to.
fn waiting(p: &Project, duration: &str) -> (std::process::Child, std::path::PathBuf) {
    p.write(
        "w.fabro",
        &format!(
            "digraph W {{ start [shape=Mdiamond]\n exit [shape=Msquare]\n \
             pause [shape=insulator, duration=\"{duration}\"]\n start -> pause -> exit }}"
        ),
    );
    let child = p.spawn_run("w.fabro");
    p.wait_for_event("StageStarted", "pause");
    let until = p.only_run().join("stages/002-pause@1/wait.json");
    wait_for(
        "the wait's end to be written",
        Duration::from_secs(10),
        || until.exists(),
    );
    (child, until)
}

/// Regression: a wait meant to end after the year 9999 (`duration="9999999999h"`, a typo the
/// duration format allows) panicked writing its end; it waits, its end kept as the last moment a
/// record's time can say.
#[test]
fn a_wait_beyond_what_a_time_can_say_waits_until_the_last_one() {
    let p = Project::new();
    let (mut child, until) = waiting(&p, "9999999999h");
    assert_eq!(
        run_support::read_json(&until)["until"],
        "9999-12-31T23:59:59.000Z"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(child.try_wait().unwrap().is_none(), "the run still waits");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_wait_resumed_after_a_kill_ends_when_the_first_would_have() {
    let p = Project::new();
    let (mut child, first) = waiting(&p, "3s");
    let record = p.only_run();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let until = run_support::read_json(&first)["until"].clone();
    let id = record.file_name().unwrap().to_string_lossy().into_owned();
    let resumed = p.resume(&id, &[]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    // The resumed wait kept the first one's end; the first attempt is set aside beside it.
    assert_eq!(
        run_support::read_json(&record.join("stages/002-pause@1/wait.json"))["until"],
        until
    );
    assert_eq!(
        run_support::read_json(&record.join("stages/002-pause@1.interrupted-1/wait.json"))["until"],
        until
    );
}
