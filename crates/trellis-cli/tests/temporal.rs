//! Runs on Temporal, end to end: a real Temporal dev server on a free loopback port with its own
//! database, `trellis worker` processes, and `trellis run --temporal` / `trellis resume` as a user
//! types them. The same workflows give the same stages, outcomes and context on both backends; a
//! killed worker loses only the stage it was running; a gate answered while its worker is down
//! completes on another; cancelling stops the stage's process tree.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up files and processes around the binary they run"
)]

mod run_support;
mod serve_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use run_support::{Project, Run, checkpoint_of, wait_for};
use serde_json::Value;
use trellis_test::TemporalServer;
use trellis_test::git;

/// One test at a time: each starts a dev server and workers, and a machine of two cores shared by
/// several would delay heartbeats past their timeout and hand runs over that were never lost.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn and a dev server of its own; `None` (the test skips) without the Temporal CLI.
fn server() -> Option<(std::sync::MutexGuard<'static, ()>, TemporalServer)> {
    let turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Some((turn, TemporalServer::start()?))
}

/// `trellis run FILE --json --temporal ADDR`, followed in the background.
fn follow(project: &Project, file: &str, server: &TemporalServer) -> Child {
    project
        .command(&["run", file, "--json", "--temporal", &server.address()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `trellis run FILE --temporal ADDR --detach`: the run's id.
fn submit(project: &Project, file: &str, server: &TemporalServer) -> String {
    let output = project
        .command(&["run", file, "--temporal", &server.address(), "--detach"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The JSON summary a followed run ends with, and its exit code (its standard error shown when the
/// status is not `expected`).
fn ended(child: Child, expected: &str) -> (Value, Option<i32>) {
    let output = child.wait_with_output().unwrap();
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    assert_eq!(
        summary["status"],
        expected,
        "{summary}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (summary, output.status.code())
}

/// A `trellis worker` process, killed when dropped.
struct Worker {
    child: Child,
    log: PathBuf,
}

impl Worker {
    /// Starts a worker with 4 slots; its commands see `TRELLIS_TEST_WORKER=name`.
    fn start(project: &Project, server: &TemporalServer, name: &str) -> Self {
        Self::with_slots(project, server, name, 4)
    }

    fn with_slots(project: &Project, server: &TemporalServer, name: &str, slots: u32) -> Self {
        Self::with_args(project, server, name, &["--slots", &slots.to_string()])
    }

    /// Starts a worker given `args` besides the service's address.
    fn with_args(project: &Project, server: &TemporalServer, name: &str, args: &[&str]) -> Self {
        let log = project.path().join(format!("{name}.log"));
        let address = server.address();
        let child = project
            .command(&[&["worker", "--temporal", &address], args].concat())
            .env("TRELLIS_TEST_WORKER", name)
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let worker = Self { child, log };
        wait_for("the worker to poll", Duration::from_secs(30), || {
            std::fs::read_to_string(&worker.log).is_ok_and(|l| l.contains("polling"))
        });
        worker
    }

    /// The identity it reports to Temporal (`PID@HOST-ID`).
    fn identity(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap();
        log.split_whitespace().nth(1).unwrap().to_owned()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether process `pid` has a descendant whose command line contains `needle`.
fn runs_descendant(pid: u32, needle: &str) -> bool {
    let mut parents = std::collections::HashMap::<u32, u32>::new();
    let mut commands = std::collections::HashMap::<u32, String>::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some(parent) = trellis_process::reaper::parent_of(child) {
            parents.insert(child, parent);
        }
        let command = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        commands.insert(child, String::from_utf8_lossy(&command).replace('\0', " "));
    }
    commands.iter().any(|(child, command)| {
        command.contains(needle) && {
            let mut at = *child;
            let mut found = false;
            while let Some(&parent) = parents.get(&at) {
                if parent == pid {
                    found = true;
                    break;
                }
                if parent <= 1 {
                    break;
                }
                at = parent;
            }
            found
        }
    })
}

/// What a run did, as both backends must agree on it: its status, each node's stage outcomes in
/// order, and the context it ended with (less what names the run itself).
fn outcome(run: &Run) -> Value {
    let checkpoint = run.checkpoint();
    let mut stages: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for stage in checkpoint["stages"].as_array().unwrap() {
        stages
            .entry(stage["node_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(stage["status"].clone());
    }
    let mut context = checkpoint["context"].clone();
    if let Some(map) = context.as_object_mut() {
        map.retain(|key, _| {
            !matches!(
                key.as_str(),
                "internal.run_id" | "run_id" | "internal.work_dir"
            )
        });
    }
    serde_json::json!({
        "status": run.summary["status"],
        "stages": stages,
        "context": context,
    })
}

fn temporal_run(project: &Project, server: &TemporalServer, file: &str, args: &[&str]) -> Run {
    let address = server.address();
    let mut all = vec!["--temporal", address.as_str()];
    all.extend_from_slice(args);
    project.run(file, &all)
}

/// The workflows both backends run: routing on outcomes, retries, a goal gate with its retry
/// target, a loop, a fan-out with its fan-in, a sub-workflow, human gates answered up front, by
/// `--auto-approve` and by their timeout (a Temporal timer), and a wait.
const WORKFLOWS: &[(&str, &str, &[&str])] = &[
    (
        "routing",
        "digraph R { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         check [shape=parallelogram, script=\"exit 1\"]\n \
         good [shape=parallelogram, script=\"echo good\"]\n bad [shape=parallelogram, script=\"echo bad\"]\n \
         start -> check\n check -> good [condition=\"outcome=success\"]\n check -> bad [condition=\"outcome=fail\"]\n \
         good -> exit\n bad -> exit }",
        &[],
    ),
    (
        "retries",
        "digraph T { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         flaky [shape=parallelogram, max_retries=3, script=\"n=$(cat n 2>/dev/null || echo 0); n=$((n+1)); echo $n > n; [ $n -ge 3 ]\"]\n \
         start -> flaky -> exit }",
        &[],
    ),
    (
        "goal-gate",
        "digraph G { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         fixer [shape=parallelogram, script=\"touch fixed\"]\n \
         test [shape=parallelogram, script=\"test -f fixed\", goal_gate=true, retry_target=\"fixer\"]\n \
         start -> test -> exit\n fixer -> test }",
        &[],
    ),
    (
        "loop",
        "digraph L { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         step [shape=parallelogram, script=\"n=$(cat n 2>/dev/null || echo 0); n=$((n+1)); echo $n > n; [ $n -ge 3 ]\"]\n \
         start -> step\n step -> step [condition=\"outcome=fail\"]\n step -> exit [condition=\"outcome=success\"] }",
        &[],
    ),
    (
        "fan-out",
        "digraph F { start [shape=Mdiamond]\n exit [shape=Msquare]\n fan [shape=component]\n merge [shape=tripleoctagon]\n \
         a [shape=parallelogram, script=\"echo a\"]\n b [shape=parallelogram, script=\"sleep 0.2; echo b\"]\n \
         c [shape=parallelogram, script=\"exit 1\"]\n \
         start -> fan\n fan -> a -> merge\n fan -> b -> merge\n fan -> c -> merge\n merge -> exit }",
        &[],
    ),
    (
        "fan-out-first",
        "digraph G { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         fan [shape=component, join_policy=\"first_success\", max_parallel=1]\n merge [shape=tripleoctagon]\n \
         a [shape=parallelogram, script=\"echo a\"]\n b [shape=parallelogram, script=\"echo b > b-ran\"]\n \
         c [shape=parallelogram, script=\"echo c > c-ran\"]\n \
         start -> fan\n fan -> a -> merge\n fan -> b -> merge\n fan -> c -> merge\n merge -> exit }",
        &[],
    ),
    (
        "sub-workflow",
        "digraph S { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         sub [shape=house, workflow=\"child.fabro\"]\n after [shape=parallelogram, script=\"test -f child-ran\"]\n \
         start -> sub -> after -> exit }",
        &[],
    ),
    (
        "gates",
        "digraph H { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         first [shape=hexagon, label=\"Ship?\"]\n second [shape=hexagon, label=\"Really?\"]\n \
         shipped [shape=parallelogram, script=\"echo shipped\"]\n \
         start -> first\n first -> second [label=\"[Y] Yes\"]\n first -> exit [label=\"[N] No\"]\n \
         second -> exit [label=\"[A] Abort\"]\n second -> shipped [label=\"[S] Ship\"]\n shipped -> exit }",
        &["--answers", "answers.json"],
    ),
    (
        "auto-approve",
        "digraph A { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         ok [shape=hexagon, label=\"Go?\"]\n went [shape=parallelogram, script=\"echo went\"]\n \
         start -> ok\n ok -> went [label=\"[G] Go\"]\n ok -> exit [label=\"[S] Stop\"]\n went -> exit }",
        &["--auto-approve"],
    ),
    (
        "gate-timeout",
        "digraph T { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         ok [shape=hexagon, label=\"Go?\", timeout=\"1s\", human.default_choice=\"Stop\"]\n \
         went [shape=parallelogram, script=\"echo went\"]\n stopped [shape=parallelogram, script=\"echo stopped\"]\n \
         start -> ok\n ok -> went [label=\"[G] Go\"]\n ok -> stopped [label=\"[S] Stop\"]\n went -> exit\n stopped -> exit }",
        &[],
    ),
    (
        "wait",
        "digraph W { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         pause [shape=insulator, duration=\"2s\"]\n after [shape=parallelogram, script=\"echo after\"]\n \
         start -> pause -> after -> exit }",
        &[],
    ),
];

fn project_for(name: &str, source: &str) -> Project {
    let project = Project::new();
    project.write(&format!("{name}.fabro"), source);
    project.write(
        "child.fabro",
        "digraph C { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         work [shape=parallelogram, script=\"touch child-ran\"]\n start -> work -> exit }",
    );
    project.write("answers.json", r#"{"first": "Yes", "second": "Ship"}"#);
    project
}

#[test]
fn the_same_workflows_give_the_same_stages_outcomes_and_context_on_both_backends() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let workers_home = Project::new();
    let _workers = [
        Worker::start(&workers_home, &server, "w1"),
        Worker::start(&workers_home, &server, "w2"),
    ];
    for (name, source, args) in WORKFLOWS {
        let file = format!("{name}.fabro");
        let local_project = project_for(name, source);
        let local = local_project.run(&file, args);
        // Submitted into the workers' runs directory, the only one they serve.
        let remote_project = project_for(name, source);
        let runs = workers_home.path().join("runs");
        let mut remote_args = vec!["--runs-dir", runs.to_str().unwrap()];
        remote_args.extend_from_slice(args);
        let remote = temporal_run(&remote_project, &server, &file, &remote_args);
        assert_eq!(
            local.code(),
            remote.code(),
            "{name}: exit codes differ\nlocal: {}\ntemporal: {}",
            local.stderr(),
            remote.stderr()
        );
        assert_eq!(
            outcome(&local),
            outcome(&remote),
            "{name}: the backends disagree\ntemporal stderr: {}",
            remote.stderr()
        );
        assert!(
            remote.summary["workers"]
                .as_array()
                .is_some_and(|w| !w.is_empty()),
            "{name}: {}",
            remote.summary
        );
        if *name == "gate-timeout" {
            // The gate's timeout ran on Temporal's timer: the worker took the run up twice.
            assert_eq!(
                remote.summary["workers"].as_array().unwrap().len(),
                2,
                "{}",
                remote.summary
            );
        }
        if name.starts_with("fan-out") {
            // Each branch was an activity of its own, all started together, then the join.
            let run_id = remote.summary["run_id"].as_str().unwrap();
            let branches: Vec<String> = ["a", "b", "c"]
                .iter()
                .map(|b| format!("branch {b} of fan"))
                .collect();
            let summaries = server.activity_summaries(run_id);
            assert_eq!(
                summaries.iter().filter(|s| branches.contains(s)).count(),
                3,
                "{summaries:?}"
            );
            let join = summaries.iter().position(|s| s == "end of fan");
            let last_branch = summaries.iter().rposition(|s| branches.contains(s));
            assert!(join > last_branch, "{summaries:?}");
            assert!(
                branches_scheduled_together(&server.history(run_id)),
                "{summaries:?}"
            );
        }
        if *name == "sub-workflow" {
            // The child run was a child workflow whose activities were its stages; then the
            // sub-workflow's stage ended in the run.
            let run_id = remote.summary["run_id"].as_str().unwrap();
            let child = server.activity_summaries(&format!("{run_id}/sub/1"));
            assert_eq!(child, ["the first stage of sub"], "{child:?}");
            let summaries = server.activity_summaries(run_id);
            assert!(summaries.iter().any(|s| s == "end of sub"), "{summaries:?}");
        }
        if *name == "wait" {
            // The wait's time was a Temporal timer.
            let run_id = remote.summary["run_id"].as_str().unwrap();
            assert_eq!(server.timers(run_id).len(), 1, "{}", remote.summary);
        }
        let meta = run_support::read_json(&remote.record().join("run.json"));
        assert_eq!(meta["temporal"]["task_queue"], "trellis", "{meta}");
    }
}

/// Whether every branch activity in `history` was scheduled before any activity ended: they ran
/// at once, not one after another.
fn branches_scheduled_together(history: &[Value]) -> bool {
    let scheduled_at = |e: &Value| {
        e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
            && e["activityTaskScheduledEventAttributes"]["activityType"]["name"] == "Stages::branch"
    };
    let first_branch = history.iter().position(scheduled_at);
    let last_branch = history.iter().rposition(scheduled_at);
    let (Some(first), Some(last)) = (first_branch, last_branch) else {
        return false;
    };
    !history[first..last]
        .iter()
        .any(|e| e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_COMPLETED")
}

/// The stage of `node` in the run's events: how many times it started and finished.
fn starts_and_ends(record: &Path, node: &str) -> (usize, usize) {
    let events = std::fs::read_to_string(record.join("events.jsonl")).unwrap();
    let (mut started, mut ended) = (0, 0);
    for line in events.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        if event["node_id"] != node {
            continue;
        }
        match event["event"].as_str() {
            Some("StageStarted") => started += 1,
            Some("StageCompleted" | "StageFailed") => ended += 1,
            _ => {}
        }
    }
    (started, ended)
}

/// Three stages that write their names to `done.log`; the second writes `two-started` first, then
/// takes `seconds`.
fn three_stages(seconds: u32) -> String {
    format!(
        "digraph K {{ start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         one [shape=parallelogram, script=\"echo one >> done.log\"]\n \
         two [shape=parallelogram, script=\"echo two-started >> done.log; sleep {seconds}; echo two >> done.log\"]\n \
         three [shape=parallelogram, script=\"echo three >> done.log\"]\n \
         start -> one -> two -> three -> exit }}"
    )
}

#[test]
fn a_killed_worker_loses_only_the_stage_it_was_running_and_another_worker_finishes_the_run() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    project.write("slow.fabro", &three_stages(4));
    let mut workers = [
        Worker::start(&project, &server, "w1"),
        Worker::start(&project, &server, "w2"),
    ];
    let follower = follow(&project, "slow.fabro", &server);
    let log = project.path().join("done.log");
    wait_for("stage two to start", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("two-started"))
    });
    let running = workers
        .iter()
        .position(|w| runs_descendant(w.pid(), "sleep 4"))
        .expect("a worker runs stage two");
    let lost = workers[running].identity();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(workers[running].pid()).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    workers[running].kill();
    let (summary, _) = ended(follower, "succeeded");
    let record = PathBuf::from(summary["run_dir"].as_str().unwrap());
    // Stage one finished before the kill and never ran again; stage two ran once more, whole.
    let done = std::fs::read_to_string(&log).unwrap();
    assert_eq!(done.matches("one").count(), 1, "{done}");
    assert_eq!(done.matches("two-started").count(), 2, "{done}");
    assert_eq!(done.lines().filter(|l| *l == "two").count(), 1, "{done}");
    assert_eq!(starts_and_ends(&record, "one"), (1, 1));
    assert_eq!(starts_and_ends(&record, "two"), (2, 1));
    // The lost worker held the run for stage one; the survivor took it over at stage two.
    let ran: Vec<&str> = summary["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let survivor = workers[1 - running].identity();
    assert_ne!(lost, survivor);
    assert_eq!(ran, [lost.as_str(), survivor.as_str()], "{summary}");
    assert_eq!(summary["handovers"], 1, "{summary}");
    // Each stage was an activity of its own, named in Temporal's history; the lost one ran twice.
    let run_id = summary["run_id"].as_str().unwrap();
    assert_eq!(
        server.activity_summaries(run_id),
        [
            "open the run at its checkpoint and run its next stage",
            "stage two",
            "stage two",
            "stage three"
        ]
    );
    assert_eq!(checkpoint_of(&record)["status"], "succeeded");
}

/// A run kept on git: each worker works in a checkout of its own, as on machines that share no
/// working directory; the tree goes to the run's ref on the remote before each step is saved, and
/// the worker that takes the run over finds there what the finished stages did.
#[test]
fn a_run_kept_on_git_is_taken_over_from_its_remote_with_the_work_of_its_finished_stages() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    let remote = tempfile::tempdir().unwrap();
    git(remote.path(), &["init", "-q", "--bare"]);
    project.write(
        ".gitignore",
        "runs/\nw?.log\nws-*/\n.config/\n.no-model-cache/\n",
    );
    project.write("input.txt", "from the repository\n");
    project.write(
        "flow.fabro",
        "digraph G { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         one [shape=parallelogram, script=\"cp input.txt copy.txt; echo one >> done.log\"]\n \
         two [shape=parallelogram, script=\"echo two-started >> done.log; sleep 4; echo two >> done.log\"]\n \
         three [shape=parallelogram, script=\"test -f copy.txt && echo three >> done.log\"]\n \
         start -> one -> two -> three -> exit }",
    );
    git(project.path(), &["init", "-q"]);
    git(project.path(), &["add", "-A"]);
    git(project.path(), &["commit", "-q", "-m", "start"]);
    let url = remote.path().display().to_string();
    git(project.path(), &["remote", "add", "origin", &url]);
    let spaces = [project.path().join("ws-w1"), project.path().join("ws-w2")];
    let mut workers = [0, 1].map(|i| {
        let dir = spaces[i].display().to_string();
        Worker::with_args(
            &project,
            &server,
            &format!("w{}", i + 1),
            &["--workspaces", &dir],
        )
    });
    let follower = project
        .command(&[
            "run",
            "flow.fabro",
            "--json",
            "--temporal",
            &server.address(),
            "--workspace",
            "git",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut running = None;
    wait_for("stage two to start", Duration::from_secs(30), || {
        running = workers
            .iter()
            .position(|w| runs_descendant(w.pid(), "sleep 4"));
        running.is_some()
    });
    let running = running.unwrap();
    workers[running].kill();
    let (summary, _) = ended(follower, "succeeded");
    let run_id = summary["run_id"].as_str().unwrap();
    // The run's result is at its ref: stage one's work was there for the worker that took the run
    // over, and the lost worker's half of stage two went with it.
    let at_ref = |file: &str| {
        git(
            remote.path(),
            &["show", &format!("refs/trellis/runs/{run_id}:{file}")],
        )
    };
    assert_eq!(at_ref("done.log"), "one\ntwo-started\ntwo\nthree\n");
    assert_eq!(at_ref("copy.txt"), "from the repository\n");
    assert_eq!(summary["handovers"], 1, "{summary}");
    // The submitter's tree was never worked in; the worker that finished the run let its checkout
    // go (the lost one's stays where it was killed).
    assert!(!project.path().join("done.log").exists());
    assert!(!spaces[1 - running].join(run_id).exists());
    assert!(spaces[running].join(run_id).join("copy.txt").exists());
    // Started again, it removes the checkout of the run that ended while it was away.
    let dir = spaces[running].display().to_string();
    let _again = Worker::with_args(&project, &server, "w3", &["--workspaces", &dir]);
    assert!(!spaces[running].join(run_id).exists());
    assert!(!spaces[running].join(format!("{run_id}.git")).exists());
}

#[test]
fn a_run_kept_on_git_needs_a_repository_with_a_remote_and_temporal() {
    let project = Project::new();
    project.write(
        "flow.fabro",
        "digraph G { start [shape=Mdiamond]\n exit [shape=Msquare]\n start -> exit }",
    );
    // Checked before anything is recorded or any service is reached.
    let refused = |args: &[&str], says: &str| {
        let output = project
            .command(&[&["run", "flow.fabro"], args].concat())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(says),
            "{stderr}"
        );
    };
    let temporal = ["--temporal", "127.0.0.1:9", "--workspace", "git"];
    refused(&temporal, "is not in a git repository");
    refused(
        &["--workspace", "git"],
        "--workspace git is for runs on Temporal",
    );
    git(project.path(), &["init", "-q"]);
    git(project.path(), &["add", "-A"]);
    git(project.path(), &["commit", "-q", "-m", "start"]);
    refused(&temporal, "has no remote `origin`");
    git(
        project.path(),
        &["config", "remote.origin.url", "--upload-pack=touch pwned"],
    );
    refused(&temporal, "is not a git remote a worker may use");
    assert!(!project.path().join("runs").exists());
    assert!(!project.path().join("pwned").exists());
    // A worker's checkouts may not lie where every sandboxed command may write.
    let home = std::env::var("HOME").unwrap();
    let output = project
        .command(&[
            "worker",
            "--temporal",
            "127.0.0.1:9",
            "--sandbox",
            "bubblewrap",
            "--workspaces",
            &format!("{home}/.cache/trellis-test-workspaces"),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success()
            && stderr.contains("lies where the sandbox lets every command write"),
        "{stderr}"
    );
}

#[test]
fn a_worker_killed_during_a_fan_out_loses_only_the_branch_it_was_running() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    project.write(
        "fan.fabro",
        "digraph F { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         fan [shape=component]\n merge [shape=tripleoctagon]\n \
         quick [shape=parallelogram, script=\"echo quick >> done.log\"]\n \
         slow [shape=parallelogram, script=\"echo slow-started >> done.log; sleep 4; echo slow >> done.log\"]\n \
         after [shape=parallelogram, script=\"echo after >> done.log\"]\n \
         start -> fan\n fan -> quick -> merge\n fan -> slow -> merge\n merge -> after -> exit }",
    );
    let mut first = Worker::start(&project, &server, "w1");
    let follower = follow(&project, "fan.fabro", &server);
    let log = project.path().join("done.log");
    wait_for("both branches to start", Duration::from_secs(30), || {
        std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("slow-started") && l.contains("quick"))
    });
    let _second = Worker::start(&project, &server, "w2");
    assert!(runs_descendant(first.pid(), "sleep 4"));
    first.kill();
    let (summary, _) = ended(follower, "succeeded");
    let record = PathBuf::from(summary["run_dir"].as_str().unwrap());
    // The branch that had finished kept its result; the one that was running ran again, whole.
    let done = std::fs::read_to_string(&log).unwrap();
    assert_eq!(done.matches("quick").count(), 1, "{done}");
    assert_eq!(done.matches("slow-started").count(), 2, "{done}");
    assert_eq!(done.lines().filter(|l| *l == "slow").count(), 1, "{done}");
    assert_eq!(done.lines().filter(|l| *l == "after").count(), 1, "{done}");
    assert_eq!(starts_and_ends(&record, "quick"), (1, 1));
    assert_eq!(starts_and_ends(&record, "slow"), (2, 1));
    assert_eq!(summary["handovers"], 1, "{summary}");
    // Each branch was an activity; the survivor's fan-out asked only for the unfinished one.
    let run_id = summary["run_id"].as_str().unwrap();
    let summaries = server.activity_summaries(run_id);
    let count = |name: &str| summaries.iter().filter(|s| *s == name).count();
    assert_eq!(count("branch quick of fan"), 1, "{summaries:?}");
    assert_eq!(count("branch slow of fan"), 2, "{summaries:?}");
    assert_eq!(count("end of fan"), 1, "{summaries:?}");
    assert_eq!(checkpoint_of(&record)["status"], "succeeded");
}

#[test]
fn a_sub_workflow_is_a_child_workflow_and_survives_its_worker_being_killed() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    project.write(
        "child.fabro",
        "digraph C { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         one [shape=parallelogram, script=\"echo one >> child.log\"]\n \
         fan [shape=component]\n merge [shape=tripleoctagon]\n \
         a [shape=parallelogram, script=\"echo a >> child.log\"]\n \
         b [shape=parallelogram, script=\"echo b-started >> child.log; sleep 4; echo b >> child.log\"]\n \
         two [shape=parallelogram, script=\"echo two >> child.log\"]\n \
         start -> one -> fan\n fan -> a -> merge\n fan -> b -> merge\n merge -> two -> exit }",
    );
    project.write(
        "parent.fabro",
        "digraph P { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         before [shape=parallelogram, script=\"echo before >> done.log\"]\n \
         sub [shape=house, workflow=\"child.fabro\"]\n \
         after [shape=parallelogram, script=\"echo after >> done.log\"]\n \
         start -> before -> sub -> after -> exit }",
    );
    let mut first = Worker::start(&project, &server, "w1");
    let follower = follow(&project, "parent.fabro", &server);
    let child_log = project.path().join("child.log");
    wait_for(
        "the child's branch b to start",
        Duration::from_secs(30),
        || std::fs::read_to_string(&child_log).is_ok_and(|l| l.contains("b-started")),
    );
    let _second = Worker::start(&project, &server, "w2");
    assert!(runs_descendant(first.pid(), "sleep 4"));
    first.kill();
    let (summary, _) = ended(follower, "succeeded");
    let record = PathBuf::from(summary["run_dir"].as_str().unwrap());
    // The parent's finished stage kept; the sub-workflow's stage ran again, its child run from
    // its start (as `trellis resume` runs it), and the run went on.
    let done = std::fs::read_to_string(project.path().join("done.log")).unwrap();
    assert_eq!(done, "before\nafter\n");
    let child = std::fs::read_to_string(&child_log).unwrap();
    assert_eq!(child.lines().filter(|l| *l == "b").count(), 1, "{child}");
    assert_eq!(child.lines().filter(|l| *l == "two").count(), 1, "{child}");
    assert_eq!(starts_and_ends(&record, "sub"), (2, 1));
    assert_eq!(summary["handovers"], 1, "{summary}");
    // The first child workflow was lost with its worker; the second ran the child's stages and
    // its fan-out's branches as its activities, on the survivor.
    let run_id = summary["run_id"].as_str().unwrap();
    let lost = server.activity_summaries(&format!("{run_id}/sub/1"));
    assert!(
        lost.iter().any(|s| s == "branch b of fan in sub"),
        "{lost:?}"
    );
    let second = server.activity_summaries(&format!("{run_id}/sub/2"));
    for unit in [
        "the first stage of sub",
        "branch a of fan in sub",
        "branch b of fan in sub",
        "end of fan in sub",
        "stage two of sub",
    ] {
        assert!(second.iter().any(|s| s == unit), "{unit}: {second:?}");
    }
    let parent = server.activity_summaries(run_id);
    assert_eq!(
        parent.iter().filter(|s| *s == "end of sub").count(),
        1,
        "{parent:?}"
    );
    assert_eq!(
        parent.iter().filter(|s| *s == "stage after").count(),
        1,
        "{parent:?}"
    );
}

#[test]
fn a_worker_that_stalls_past_its_heartbeats_lets_the_run_go_on_without_cancelling_it() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    project.write("stall.fabro", &three_stages(16));
    let first = Worker::start(&project, &server, "w1");
    let follower = follow(&project, "stall.fabro", &server);
    let log = project.path().join("done.log");
    wait_for("stage two to start", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("two-started"))
    });
    let _second = Worker::start(&project, &server, "w2");
    // The worker stalls longer than Temporal waits for a heartbeat: it counts the worker lost. When
    // the worker goes on, Temporal has let go of its stage: the run is interrupted there, not
    // cancelled, and goes on from its checkpoint.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(first.pid()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_secs(9));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let (summary, _) = ended(follower, "succeeded");
    let record = PathBuf::from(summary["run_dir"].as_str().unwrap());
    let done = std::fs::read_to_string(&log).unwrap();
    assert_eq!(done.lines().filter(|l| *l == "two").count(), 1, "{done}");
    assert_eq!(done.lines().filter(|l| *l == "three").count(), 1, "{done}");
    let (_, ended_two) = starts_and_ends(&record, "two");
    assert_eq!(ended_two, 1, "{done}");
    let events = std::fs::read_to_string(record.join("events.jsonl")).unwrap();
    assert!(!events.contains("\"StageFailed\""), "{events}");
    assert!(summary["handovers"].as_u64() >= Some(1), "{summary}");
    assert_eq!(checkpoint_of(&record)["status"], "succeeded");
    // The stalled worker's engine heard that Temporal had let go of its stage, not a cancellation.
    let stalled = std::fs::read_to_string(&first.log).unwrap();
    assert!(stalled.contains("interrupted after"), "{stalled}");
    assert!(!stalled.contains("cancelled after"), "{stalled}");
}

#[test]
fn a_gate_answered_while_its_worker_is_down_completes_on_another_worker() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    project.write(
        "gate.fabro",
        "digraph G { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         build [shape=parallelogram, script=\"echo built\"]\n approve [shape=hexagon, label=\"Ship it?\"]\n \
         ship [shape=parallelogram, script=\"touch shipped\"]\n \
         start -> build -> approve\n approve -> ship [label=\"[Y] Yes\"]\n approve -> exit [label=\"[N] No\"]\n ship -> exit }",
    );
    project.write("answers.json", r#"{"approve": "Yes"}"#);
    let mut workers = vec![Worker::start(&project, &server, "w1")];
    let waiting = temporal_run(&project, &server, "gate.fabro", &[]);
    assert_eq!(waiting.code(), Some(3), "{}", waiting.stderr());
    assert_eq!(waiting.summary["status"], "waiting_for_input");
    assert_eq!(waiting.summary["waiting_at"], "approve");
    let run_id = waiting.summary["run_id"].as_str().unwrap().to_owned();
    let shown = project.command(&["show", &run_id]).output().unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("status:  waiting_for_input"), "{shown}");
    assert!(
        shown.contains(&format!("on Temporal: {}", server.address())),
        "{shown}"
    );
    // An answer that is none of the gate's options is refused before it is sent.
    project.write("wrong.json", r#"{"approve": "Maybe"}"#);
    let wrong = project.resume(&run_id, &["--answers", "wrong.json"]);
    assert_eq!(wrong.code(), Some(2), "{}", wrong.stderr());
    assert!(
        wrong.stderr().contains("is not one of its options"),
        "{}",
        wrong.stderr()
    );
    // The worker that holds the run goes away; another comes up; the answer arrives.
    let first = workers[0].identity();
    workers[0].kill();
    workers.push(Worker::start(&project, &server, "w2"));
    let resumed = project.resume(&run_id, &["--answers", "answers.json"]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    assert!(project.path().join("shipped").exists());
    let ran: Vec<&str> = resumed.summary["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(ran.len(), 2, "{}", resumed.summary);
    assert_eq!(ran[0], first);
    assert_eq!(ran[1], workers[1].identity());
}

#[test]
fn cancelling_a_run_on_temporal_stops_the_commands_of_its_branches_and_child_runs() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    project.write(
        "child.fabro",
        "digraph C { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         inner [shape=parallelogram, script=\"touch inner-started; sleep 61\"]\n start -> inner -> exit }",
    );
    project.write(
        "both.fabro",
        "digraph B { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         fan [shape=component]\n merge [shape=tripleoctagon]\n \
         branch [shape=parallelogram, script=\"touch branch-started; sleep 62\"]\n \
         sub [shape=house, workflow=\"child.fabro\"]\n \
         start -> fan\n fan -> branch -> merge\n fan -> sub -> merge\n merge -> exit }",
    );
    // A sub-workflow on the main track: its child run is a child workflow.
    project.write(
        "main.fabro",
        "digraph M { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         sub [shape=house, workflow=\"child.fabro\"]\n start -> sub -> exit }",
    );
    let worker = Worker::start(&project, &server, "w1");
    for (file, markers) in [
        ("both.fabro", &["branch-started", "inner-started"][..]),
        ("main.fabro", &["inner-started"][..]),
    ] {
        for marker in markers {
            let _ = std::fs::remove_file(project.path().join(marker));
        }
        let id = submit(&project, file, &server);
        wait_for("the commands to start", Duration::from_secs(30), || {
            markers.iter().all(|m| project.path().join(m).exists())
        });
        let cancel = project.command(&["cancel", &id]).output().unwrap();
        assert!(
            cancel.status.success(),
            "{}",
            String::from_utf8_lossy(&cancel.stderr)
        );
        let record = project.path().join("runs").join(&id);
        wait_for("the run to be cancelled", Duration::from_secs(30), || {
            run_support::read_json(&record.join("run.json"))["status"] == "cancelled"
        });
        wait_for("the commands to stop", Duration::from_secs(10), || {
            !runs_descendant(worker.pid(), "sleep 6")
        });
    }
}

#[test]
fn cancelling_a_run_on_temporal_stops_its_running_command() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    project.write(
        "long.fabro",
        "digraph C { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         long [shape=parallelogram, script=\"echo started > started; sleep 60 & sleep 61; echo done > done\"]\n \
         start -> long -> exit }",
    );
    let _worker = Worker::start(&project, &server, "w1");
    let follower = follow(&project, "long.fabro", &server);
    wait_for("the command to start", Duration::from_secs(30), || {
        project.path().join("started").exists()
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(follower.id()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let (summary, code) = ended(follower, "cancelled");
    assert_eq!(code, Some(130));
    let record = PathBuf::from(summary["run_dir"].as_str().unwrap());
    run_support::assert_process_group_gone(&run_support::stage_dir(&record, "long"));
    assert!(!project.path().join("done").exists());
    let meta = run_support::read_json(&record.join("run.json"));
    assert_eq!(meta["status"], "cancelled");

    // `trellis cancel RUN` does the same for a detached run, and for a run running here.
    std::fs::remove_file(project.path().join("started")).unwrap();
    let id = submit(&project, "long.fabro", &server);
    wait_for("the command to start", Duration::from_secs(30), || {
        project.path().join("started").exists()
    });
    let cancel = project.command(&["cancel", &id]).output().unwrap();
    assert!(
        cancel.status.success(),
        "{}",
        String::from_utf8_lossy(&cancel.stderr)
    );
    let record = project.path().join("runs").join(&id);
    wait_for("the run to be cancelled", Duration::from_secs(30), || {
        run_support::read_json(&record.join("run.json"))["status"] == "cancelled"
    });
    run_support::assert_process_group_gone(&run_support::stage_dir(&record, "long"));
    let again = project.command(&["cancel", &id]).output().unwrap();
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("is not running (cancelled)"));

    std::fs::remove_file(project.path().join("started")).unwrap();
    let local = project
        .command(&["run", "long.fabro", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the command to start", Duration::from_secs(30), || {
        project.path().join("started").exists()
    });
    let newest = std::fs::read_dir(project.path().join("runs"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .unwrap();
    let cancel = project.command(&["cancel", &newest]).output().unwrap();
    assert!(
        cancel.status.success(),
        "{}",
        String::from_utf8_lossy(&cancel.stderr)
    );
    let output = local.wait_with_output().unwrap();
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    assert_eq!(summary["status"], "cancelled", "{summary}");
}

/// Each event of the run's log: (event name, node).
fn stage_events(record: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(record.join("events.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|e| {
            Some((
                e["event"].as_str()?.to_owned(),
                e["node_id"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

#[test]
fn thirty_runs_spread_over_three_workers_all_succeed_when_one_worker_is_killed() {
    const RUNS: usize = 30;
    const STAGES: usize = 20;
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    project.write(
        "chain.fabro",
        &trellis_test::workflows::command_chain(
            STAGES,
            "sleep 0.2; echo $TRELLIS_RUN_ID $TRELLIS_NODE_ID $TRELLIS_TEST_WORKER >> ran.log",
        ),
    );
    let chain: Vec<String> = (1..=STAGES).map(|s| format!("s{s}")).collect();
    let mut workers: Vec<Worker> = ["w1", "w2", "w3"]
        .iter()
        .map(|name| Worker::start(&project, &server, name))
        .collect();
    let address = server.address();
    let submitters: Vec<Child> = (0..RUNS)
        .map(|_| {
            project
                .command(&["run", "chain.fabro", "--temporal", &address, "--detach"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let run_ids: Vec<String> = submitters
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8_lossy(&output.stdout).trim().to_owned()
        })
        .collect();
    // A worker dies while every worker is busy.
    let log = project.path().join("ran.log");
    wait_for("stages to run", Duration::from_mins(1), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.lines().count() >= RUNS)
    });
    workers[0].kill();
    let runs = project.path().join("runs");
    let status =
        |id: &str| run_support::read_json(&runs.join(id).join("run.json"))["status"].clone();
    wait_for("every run to end", Duration::from_mins(4), || {
        run_ids.iter().all(|id| status(id) != "running")
    });
    let mut interrupted = 0;
    for id in &run_ids {
        assert_eq!(status(id), "succeeded", "run {id}");
        let events = stage_events(&runs.join(id));
        for node in &chain {
            let of_node: Vec<&str> = events
                .iter()
                .filter(|(_, n)| n == node)
                .map(|(e, _)| e.as_str())
                .collect();
            // A stage is finished once its checkpoint is saved, as for a local kill: a worker killed
            // between a stage's end and that save (the journal's sync) leaves it to run again, and
            // one killed just after it may take the `CheckpointSaved` event with it (the event
            // follows the save). So: a stage whose checkpoint was seen saved never started again,
            // and its last start completed.
            if let Some(saved) = of_node.iter().position(|e| *e == "CheckpointSaved") {
                assert!(
                    !of_node[saved..].contains(&"StageStarted"),
                    "run {id}, {node} ran after its checkpoint: {events:?}"
                );
            }
            let last = |name: &str| of_node.iter().rposition(|e| *e == name);
            assert!(
                last("StageCompleted") > last("StageStarted"),
                "run {id}, {node} did not complete: {events:?}"
            );
            match of_node.iter().filter(|e| **e == "StageStarted").count() {
                1 => {}
                2 => interrupted += 1,
                n => panic!("run {id}: {node} started {n} times"),
            }
        }
    }
    let ran = std::fs::read_to_string(&log).unwrap();
    for worker in ["w1", "w2", "w3"] {
        assert!(
            ran.lines().any(|l| l.ends_with(worker)),
            "{worker} ran no stage:\n{ran}"
        );
    }
    // Only the stages the killed worker was running (at most its 4 slots; its runs that waited
    // between two stages lost none) ran again.
    assert!(interrupted <= 4, "{interrupted} stages were interrupted");
}

#[test]
fn a_held_run_whose_next_stage_waits_for_a_slot_is_parked_and_goes_on() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    // Each stage outlasts the time a held run's engine waits for its next stage (5 s).
    project.write(
        "chain.fabro",
        &trellis_test::workflows::command_chain(3, "sleep 5.5; echo $TRELLIS_RUN_ID >> ran.log"),
    );
    // One slot: while one run's stage runs, the other's next stage waits (whichever of the two
    // goes first, one of them waits at least once for a whole stage).
    let _worker = Worker::with_slots(&project, &server, "w1", 1);
    let first = follow(&project, "chain.fabro", &server);
    std::thread::sleep(Duration::from_secs(1));
    let second = follow(&project, "chain.fabro", &server);
    let mut parked = 0;
    for follower in [first, second] {
        let (summary, _) = ended(follower, "succeeded");
        let record = PathBuf::from(summary["run_dir"].as_str().unwrap());
        for node in ["s1", "s2", "s3"] {
            assert_eq!(starts_and_ends(&record, node), (1, 1), "{summary}");
        }
        // A parked run was opened again from its checkpoint; nothing of it was lost or redone.
        let events = std::fs::read_to_string(record.join("events.jsonl")).unwrap();
        parked += events.matches("WorkflowRunResumed").count();
        assert_eq!(events.matches("WorkflowRunCompleted").count(), 1);
        assert_eq!(summary["handovers"], 0, "{summary}");
    }
    assert!(parked >= 1, "no run was parked");
    let ran = std::fs::read_to_string(project.path().join("ran.log")).unwrap();
    assert_eq!(ran.lines().count(), 6, "{ran}");
}

#[test]
fn a_run_whose_history_grows_long_continues_as_a_new_execution_and_loses_nothing() {
    let _turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Temporal suggests continuing as new once a history has 40 events (about six stages).
    let Some(server) = TemporalServer::start_with(&["limit.historyCount.suggestContinueAsNew=40"])
    else {
        return;
    };
    let project = Project::new();
    project.write(
        "chain.fabro",
        &trellis_test::workflows::command_chain(20, "echo $TRELLIS_NODE_ID >> ran.log"),
    );
    let _worker = Worker::start(&project, &server, "w1");
    let run = temporal_run(&project, &server, "chain.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.summary["status"], "succeeded", "{}", run.summary);
    let ran = std::fs::read_to_string(project.path().join("ran.log")).unwrap();
    let expected: Vec<String> = (1..=20).map(|s| format!("s{s}")).collect();
    assert_eq!(ran.lines().collect::<Vec<_>>(), expected);
    // The figures went on with the run: one worker held it throughout, none was lost.
    assert_eq!(run.summary["workers"].as_array().map(Vec::len), Some(1));
    assert_eq!(run.summary["handovers"], 0);
    // The last execution's history holds only the last stages.
    let run_id = run.summary["run_id"].as_str().unwrap();
    let stages = server.activity_summaries(run_id);
    assert!(!stages.is_empty() && stages.len() < 20, "{stages:?}");
    assert_eq!(stages.last().map(String::as_str), Some("stage s20"));
}

#[test]
fn a_wait_survives_restarting_every_worker() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = Project::new();
    project.write(
        "wait.fabro",
        "digraph W { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         before [shape=parallelogram, script=\"echo before >> done.log\"]\n \
         pause [shape=insulator, duration=\"5s\"]\n \
         after [shape=parallelogram, script=\"echo after >> done.log\"]\n \
         start -> before -> pause -> after -> exit }",
    );
    let mut workers = vec![
        Worker::start(&project, &server, "w1"),
        Worker::start(&project, &server, "w2"),
    ];
    let follower = follow(&project, "wait.fabro", &server);
    wait_for("the wait to start", Duration::from_secs(30), || {
        std::fs::read_to_string(project.path().join("done.log")).is_ok_and(|l| l.contains("before"))
    });
    std::thread::sleep(Duration::from_secs(1));
    for worker in &mut workers {
        worker.kill();
    }
    let _fresh = [
        Worker::start(&project, &server, "w3"),
        Worker::start(&project, &server, "w4"),
    ];
    let (summary, _) = ended(follower, "succeeded");
    let done = std::fs::read_to_string(project.path().join("done.log")).unwrap();
    assert_eq!(done, "before\nafter\n");
    assert_eq!(summary["handovers"], 1, "{summary}");
    // The wait did not start over on the new worker: both attempts end at the same time.
    let record = PathBuf::from(summary["run_dir"].as_str().unwrap());
    let ends: Vec<Value> = std::fs::read_dir(record.join("stages"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("-pause@1"))
        .map(|e| run_support::read_json(&e.path().join("wait.json"))["until"].clone())
        .collect();
    assert_eq!(ends.len(), 2, "{ends:?}");
    assert_eq!(ends[0], ends[1]);
    // The wait's time was a Temporal timer: no worker held the run meanwhile.
    let timers = server.timers(summary["run_id"].as_str().unwrap());
    assert!(
        matches!(timers.as_slice(), [t] if (1.0..=5.0).contains(t)),
        "{timers:?}"
    );
}

#[test]
fn the_web_api_answers_and_cancels_runs_on_temporal() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let project = serve_support::project_with(&[
        (
            "gate.fabro",
            "digraph G { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
             approve [shape=hexagon, label=\"Ship it?\"]\n ship [shape=parallelogram, script=\"touch shipped\"]\n \
             start -> approve\n approve -> ship [label=\"[Y] Yes\"]\n approve -> exit [label=\"[N] No\"]\n ship -> exit }",
        ),
        (
            "long.fabro",
            "digraph L { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
             long [shape=parallelogram, script=\"touch started; sleep 60\"]\n start -> long -> exit }",
        ),
    ]);
    let _worker = Worker::start(&project, &server, "w1");
    let serve = serve_support::Serve::start(&project);

    // The page's gate form answers a gate of a run on Temporal: a signal to its workflow.
    let id = submit(&project, "workflows/gate.fabro", &server);
    let mut run = Value::Null;
    wait_for("the gate to wait", Duration::from_secs(30), || {
        run = serve.run(&id);
        run["waiting"].as_array().is_some_and(|w| !w.is_empty())
    });
    assert_eq!(run["waiting"][0]["gate"], "approve");
    let path = format!("/api/runs/{id}/answers");
    let wrong = serve.post(
        &path,
        &serde_json::json!({ "gate": "approve", "answer": "maybe" }),
    );
    assert_eq!(wrong.status, 422, "{}", wrong.text());
    let answered = serve.post(
        &path,
        &serde_json::json!({ "gate": "approve", "answer": "Yes" }),
    );
    assert_eq!(answered.status, 202, "{}", answered.text());
    serve.wait_for_status(&id, "succeeded");
    assert!(project.path().join("shipped").exists());

    // Its cancel button cancels one.
    let id = submit(&project, "workflows/long.fabro", &server);
    wait_for("the command to start", Duration::from_secs(30), || {
        project.path().join("started").exists()
    });
    let cancelled = serve.post(&format!("/api/runs/{id}/cancel"), &Value::Null);
    assert_eq!(cancelled.status, 202, "{}", cancelled.text());
    serve.wait_for_status(&id, "cancelled");
    let again = serve.post(&format!("/api/runs/{id}/cancel"), &Value::Null);
    assert_eq!(again.status, 409, "{}", again.text());

    // A run waiting at a gate, with no stage running, is cancelled all the same.
    let id = submit(&project, "workflows/gate.fabro", &server);
    wait_for("the gate to wait", Duration::from_secs(30), || {
        serve.run(&id)["waiting"]
            .as_array()
            .is_some_and(|w| !w.is_empty())
    });
    let cancelled = serve.post(&format!("/api/runs/{id}/cancel"), &Value::Null);
    assert_eq!(cancelled.status, 202, "{}", cancelled.text());
    serve.wait_for_status(&id, "cancelled");
}

#[test]
fn a_worker_refuses_a_run_outside_its_runs_directory() {
    let Some((_turn, server)) = server() else {
        return;
    };
    let workers_home = Project::new();
    let _worker = Worker::start(&workers_home, &server, "w1");
    let elsewhere = Project::new();
    elsewhere.write(
        "w.fabro",
        "digraph E { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         touch [shape=parallelogram, script=\"touch ran\"]\n start -> touch -> exit }",
    );
    let refused = temporal_run(&elsewhere, &server, "w.fabro", &[]);
    assert_eq!(refused.code(), Some(1), "{}", refused.stderr());
    assert_eq!(refused.summary["status"], "failed");
    let error = refused.summary["error"].as_str().unwrap();
    assert!(
        error.contains("this worker executes only runs in"),
        "{error}"
    );
    assert!(!elsewhere.path().join("ran").exists());
    // The record says so, though no worker could write it.
    let meta = run_support::read_json(&refused.record().join("run.json"));
    assert_eq!(meta["status"], "failed");
}
