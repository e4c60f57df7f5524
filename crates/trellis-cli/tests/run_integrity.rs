//! Run-record integrity, secrets and stray processes, through the real `trellis` binary: one owner per
//! run, provider keys kept from commands (and redacted where they leak anyway), processes that escape
//! their group, damaged records, unbounded inputs and the record's permissions.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the code they run"
)]

mod run_support;

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use run_support::{Project, stage_dir, wait_for};
use serde_json::{Value, json};
use trellis_test::Llmock;

fn workflow(body: &str) -> String {
    format!(
        "digraph W {{\n graph [goal=\"Keep the run whole\"]\n start [shape=Mdiamond]\n exit [shape=Msquare]\n {body}\n}}\n"
    )
}

/// Whether a process is gone (a zombie counts as gone).
fn gone(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
        .map_or(true, |stat| stat.split_whitespace().nth(2) == Some("Z"))
}

/// Processes whose environment holds `marker`.
fn marked(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !gone(&pid.to_string()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|entry| entry == marker.as_bytes())
            })
        })
        .collect()
}

/// Every file under `dir`, with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            found.push((path, bytes));
        }
    }
    found
}

fn run_id(record: &Path) -> String {
    record.file_name().unwrap().to_string_lossy().into_owned()
}

/// Starts `w.fabro`, SIGKILLs `trellis` once the `slow` stage has started, and returns the run's
/// record.
fn killed_at_slow(p: &Project) -> PathBuf {
    let mut child = p.spawn_run("w.fabro");
    p.wait_for_event("StageStarted", "slow");
    // Killed once the command has done its first step (each `slow` here starts by making a file):
    // on a busy machine the stage's start is well before its command's (then a resumed `slow`
    // would take the sleeping branch).
    run_support::wait_for("the slow command to start", Duration::from_secs(20), || {
        p.path().join("again").exists() || p.path().join("slow.log").exists()
    });
    child.kill().unwrap();
    child.wait().unwrap();
    p.only_run()
}

/// A command of a sub-workflow that a killed run left running is stopped by the resume too: it
/// carries the sub-run's id, `<run id>/<node>`.
#[test]
fn a_resume_stops_what_a_killed_sub_workflow_left_running() {
    // Unconfined: the test reads process ids the commands print, which the sandbox would number in a
    // PID namespace of its own (the sandboxed path is tested in security.rs).
    let p = Project::new().with_env("TRELLIS_SANDBOX", "none");
    p.write(
        "child.fabro",
        "digraph Child { start [shape=Mdiamond]\n exit [shape=Msquare]\n slow [shape=parallelogram, script=\"test -f again || { touch again; sleep 30; }\"]\n start -> slow -> exit }",
    );
    p.write(
        "w.fabro",
        &workflow("sub [shape=house, workflow=\"child.fabro\"]\n start -> sub -> exit"),
    );
    let mut child = p.spawn_run("w.fabro");
    p.wait_for_event("StageStarted", "slow");
    let record = p.only_run();
    let slow = record.join("stages/002-sub@1/child/stages/002-slow@1");
    // The stage starts its command just after it says it started.
    run_support::wait_for("the command", Duration::from_secs(10), || {
        run_support::processes_of(&slow) > 0
    });
    // Trellis stopped, the spawner that runs its command killed with any reapers it forked, then
    // Trellis killed: the command outlives them (as it would a spawner that failed), and only the
    // resume is left to stop it.
    let trellis = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(trellis, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let pid = |pid: u32| nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    for spawner in trellis_process::reaper::children_of(child.id()) {
        for reaper in trellis_process::reaper::children_of(spawner) {
            if std::fs::read_to_string(format!("/proc/{reaper}/comm"))
                .is_ok_and(|comm| comm.trim() == trellis_process::reaper::REAPER_PROGRAM)
            {
                let _ = nix::sys::signal::kill(pid(reaper), nix::sys::signal::Signal::SIGKILL);
            }
        }
        let _ = nix::sys::signal::kill(pid(spawner), nix::sys::signal::Signal::SIGKILL);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        run_support::processes_of(&slow) > 0,
        "the killed run left its command running"
    );
    let resumed = p.resume(&run_id(&record), &[]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    run_support::assert_process_group_gone(&slow);
}

#[test]
fn one_owner_per_run_a_second_resume_is_refused() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "slow [shape=parallelogram, script=\"echo start >> slow.log; sleep 3; echo end >> slow.log\"]\n \
             after [shape=parallelogram, script=\"echo after >> after.log\"]\n \
             start -> slow -> after -> exit",
        ),
    );
    // A resume while the original run is alive is refused, naming the owner, and kills nothing.
    let mut original = p.spawn_run("w.fabro");
    p.wait_for_event("StageStarted", "slow");
    let id = run_id(&p.only_run());
    let refused = p.resume(&id, &[]);
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused
            .stderr()
            .contains(&format!("is in use by process {}", original.id())),
        "{}",
        refused.stderr()
    );
    assert!(original.wait().unwrap().success());
    assert_eq!(p.read("slow.log"), "start\nend\n");
    assert_eq!(p.read("after.log"), "after\n");

    // After a SIGKILL, two resumes at once: one continues the run, the other is refused.
    let q = Project::new();
    q.write("w.fabro", &p.read("w.fabro"));
    let id = run_id(&killed_at_slow(&q));
    let mut first = q.command(&["resume", &id]).spawn().unwrap();
    let mut second = q.command(&["resume", &id]).spawn().unwrap();
    let codes = [first.wait().unwrap().code(), second.wait().unwrap().code()];
    assert!(
        codes.contains(&Some(0)) && codes.contains(&Some(2)),
        "{codes:?}"
    );
    assert_eq!(q.read("after.log"), "after\n", "the rest ran once");
    let events = std::fs::read_to_string(q.only_run().join("events.jsonl")).unwrap();
    let events: Vec<Value> = events
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] > w[0]), "{seqs:?}");
    assert_eq!(
        events
            .iter()
            .filter(|e| e["event"] == "WorkflowRunCompleted")
            .count(),
        1
    );
}

#[test]
fn a_run_whose_owner_died_shows_as_interrupted() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "slow [shape=parallelogram, script=\"test -f again || { touch again; sleep 30; }\"]\n start -> slow -> exit",
        ),
    );
    let id = run_id(&killed_at_slow(&p));
    let runs = p.command(&["runs", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(runs[0]["status"], "interrupted");
    let show = p.command(&["show", &id]).output().unwrap();
    assert!(String::from_utf8_lossy(&show.stdout).contains("status:  interrupted"));
    // `events --follow` ends instead of waiting forever.
    let started = Instant::now();
    let follow = p.command(&["events", &id, "--follow"]).output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        String::from_utf8_lossy(&follow.stderr).contains("the run was interrupted"),
        "{}",
        String::from_utf8_lossy(&follow.stderr)
    );
    // The reaper of the resume stops the orphaned command, and the run finishes.
    let resumed = p.resume(&id, &[]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    let runs = p.command(&["runs", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(runs[0]["status"], "succeeded");
}

#[test]
fn provider_keys_never_reach_commands_or_the_record() {
    let Some(mock) = Llmock::start() else { return };
    let canary = "sk-ant-canary-2f9d8c7b6a5e4d3c";
    let deploy = "deploy-token-passed-on-8e7d6c5b";
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", canary)
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
        .with_env("DEPLOY_TOKEN", deploy);
    // A file holding the key: a command can still print it, and it is redacted.
    p.write("leak.txt", &format!("the key is {canary}\n"));
    p.write(
        "w.fabro",
        &workflow(
            "probe [shape=parallelogram, script=\"env; echo key=$ANTHROPIC_API_KEY; cat leak.txt\"]\n \
             deploy [shape=parallelogram, env=\"DEPLOY_TOKEN\", script=\"echo ${#DEPLOY_TOKEN} > passed; echo $DEPLOY_TOKEN\"]\n \
             summarise [shape=tab, prompt=\"Summarise what the commands printed\"]\n \
             start -> probe -> deploy -> summarise -> exit",
        ),
    );
    mock.scenario(&json!([{ "type": "reply", "text": "Nothing secret here.", "times": 1 }]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(
        p.read("passed").trim(),
        deploy.len().to_string(),
        "`env` passes a variable on"
    );
    let output =
        std::fs::read_to_string(stage_dir(&run.record(), "probe").join("stdout.log")).unwrap();
    assert!(output.contains("key=\n"), "{output}");
    assert!(output.contains("[redacted ANTHROPIC_API_KEY]"), "{output}");
    for (path, bytes) in files(&run.record()) {
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(canary), "{} holds the key", path.display());
        assert!(!text.contains(deploy), "{} holds the token", path.display());
    }
    // What the model was shown holds neither.
    for request in mock.requests() {
        let body = request["body"].to_string();
        assert!(!body.contains(canary), "the model was shown the key");
        assert!(!body.contains(deploy), "the model was shown the token");
    }
}

#[test]
fn sigterm_leaves_no_process_of_the_run_behind() {
    stopped_by_signal(nix::sys::signal::Signal::SIGTERM, 143, "interrupted");
}

#[test]
fn sigint_leaves_no_process_of_the_run_behind() {
    stopped_by_signal(nix::sys::signal::Signal::SIGINT, 130, "cancelled");
}

/// Stops a run whose command started a process outside its group with `signal`: the exit code, no
/// process with the run's marker left, and the status recorded.
fn stopped_by_signal(signal: nix::sys::signal::Signal, code: i32, recorded: &str) {
    // Unconfined: the test reads process ids the commands print, which the sandbox would number in a
    // PID namespace of its own (the sandboxed path is tested in security.rs).
    let p = Project::new().with_env("TRELLIS_SANDBOX", "none");
    p.write(
        "w.fabro",
        &workflow(
            "slow [shape=parallelogram, script=\"setsid sleep 300 & echo $! > escaped.pid; sleep 300\"]\n start -> slow -> exit",
        ),
    );
    let mut child = p.spawn_run("w.fabro");
    p.wait_for_event("StageStarted", "slow");
    wait_for("the escaped process", Duration::from_secs(10), || {
        !p.read("escaped.pid").trim().is_empty()
    });
    let id = run_id(&p.only_run());
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, signal).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(code));
    let marker = format!("TRELLIS_RUN_ID={id}");
    wait_for(
        "the run's processes to be gone",
        Duration::from_secs(5),
        || marked(&marker).is_empty(),
    );
    assert!(gone(&p.read("escaped.pid")));
    let runs = p.command(&["runs", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(runs[0]["status"], recorded);
}

#[test]
fn a_setsid_grandchild_cannot_hold_the_run_open() {
    // Unconfined: the test reads process ids the commands print, which the sandbox would number in a
    // PID namespace of its own (the sandboxed path is tested in security.rs).
    let p = Project::new().with_env("TRELLIS_SANDBOX", "none");
    p.write(
        "w.fabro",
        &workflow(
            "spawn [shape=parallelogram, script=\"setsid sh -c 'echo $$ > escaped.pid; sleep 300' & sleep 0.2; echo done\"]\n start -> spawn -> exit",
        ),
    );
    let started = Instant::now();
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the run waited for the escaped process"
    );
    wait_for(
        "the escaped process to be killed",
        Duration::from_secs(5),
        || gone(&p.read("escaped.pid")),
    );
    assert_eq!(
        std::fs::read_to_string(stage_dir(&run.record(), "spawn").join("stdout.log")).unwrap(),
        "done\n"
    );
    // The same when the command times out while the escaped process holds its output.
    std::fs::remove_file(p.path().join("escaped.pid")).unwrap();
    p.write(
        "w.fabro",
        &workflow(
            "spawn [shape=parallelogram, script=\"setsid sh -c 'echo $$ > escaped.pid; sleep 300' & sleep 300\", timeout=\"1s\", max_retries=0]\n start -> spawn\n spawn -> exit [condition=\"outcome=fail\"]",
        ),
    );
    let started = Instant::now();
    let run = p.run("w.fabro", &[]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{}",
        run.stderr()
    );
    wait_for(
        "the escaped process to be killed",
        Duration::from_secs(5),
        || gone(&p.read("escaped.pid")),
    );
}

#[test]
fn nothing_is_cut_silently_the_whole_output_is_kept() {
    let p = Project::new();
    // More than the 64 MiB that used to be kept, ending in a marker a condition looks for.
    p.write(
        "w.fabro",
        &workflow(
            "big [shape=parallelogram, script=\"head -c 68000000 /dev/zero | tr '\\\\\\\\0' a; echo; echo THE-END\"]\n \
             found [shape=parallelogram, script=\"echo found > found.txt\"]\n \
             start -> big\n big -> found [condition=\"context.command.output contains THE-END\"]\n big -> exit\n found -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(p.read("found.txt"), "found\n", "the condition saw the end");
}

#[test]
fn a_torn_event_line_is_repaired_before_the_resume_appends() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "slow [shape=parallelogram, script=\"test -f again || { touch again; sleep 30; }\"]\n start -> slow -> exit",
        ),
    );
    let record = killed_at_slow(&p);
    let log = record.join("events.jsonl");
    // Cut short inside a character, as a process that dies mid-write may leave it.
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(b"{\"seq\": 99, \"event\": \"StageCompleted\", \"note\": \"caf\xc3");
    std::fs::write(&log, &bytes).unwrap();
    let events = p.command(&["events", &run_id(&record)]).output().unwrap();
    assert_eq!(events.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&events.stderr);
    assert!(stderr.contains("lines that are not events"), "{stderr}");
    let resumed = p.resume(&run_id(&record), &[]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    for (number, line) in std::fs::read_to_string(&log).unwrap().lines().enumerate() {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "line {} is not an event: {line}",
            number + 1
        );
    }
    // A line damaged in the middle is reported by `trellis events`, by number.
    let mut lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    lines[2] = "garbage".to_owned();
    let mut bytes = (lines.join("\n") + "\n").into_bytes();
    bytes.extend_from_slice(b"\xff\xfe not text either\n");
    std::fs::write(&log, &bytes).unwrap();
    let events = p.command(&["events", &run_id(&record)]).output().unwrap();
    let stderr = String::from_utf8_lossy(&events.stderr);
    assert!(
        stderr.contains(&format!("line 3, {})", lines.len() + 1)),
        "{stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&events.stdout).lines().count(),
        lines.len() - 1
    );
}

/// A record whose `run.json` cannot be read is named when the runs are listed, not silently
/// passed over, and the others are still listed.
#[test]
fn runs_names_a_record_it_cannot_read_and_lists_the_rest() {
    let p = Project::new();
    p.write("w.fabro", &workflow("start -> exit"));
    let first = p.run("w.fabro", &[]);
    let second = p.run("w.fabro", &[]);
    assert_eq!((first.code(), second.code()), (Some(0), Some(0)));
    std::fs::write(first.record().join("run.json"), b"{\"run_id\": \"\xff").unwrap();
    let runs = p.command(&["runs"]).output().unwrap();
    assert_eq!(runs.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&runs.stderr);
    assert_eq!(
        stderr,
        format!(
            "warning: cannot read {}: stream did not contain valid UTF-8; that run is left out\n",
            first.record().join("run.json").display()
        )
    );
    let stdout = String::from_utf8_lossy(&runs.stdout);
    assert!(stdout.contains(&run_id(&second.record())), "{stdout}");
    assert!(!stdout.contains(&run_id(&first.record())), "{stdout}");
}

/// Command output is stored without waiting for the disk and synced with the journal: after a crash
/// of the machine, an entry may name a blob whose content never reached the disk. A resume runs that
/// stage again rather than carry the damaged output on.
#[test]
fn a_stage_whose_output_a_crash_lost_runs_again_on_resume() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "first [shape=parallelogram, script=\"echo first >> first.log; echo first output\"]\n \
             slow [shape=parallelogram, script=\"test -f again || { touch again; sleep 30; }; echo slow >> slow.log\"]\n \
             start -> first -> slow -> exit",
        ),
    );
    let record = killed_at_slow(&p);
    // As a crash leaves it: the blob's name on disk, its content not.
    let blob = files(&record.join("blobs"))
        .into_iter()
        .find(|(_, bytes)| bytes == b"first output\n")
        .expect("the first stage's output is a blob")
        .0;
    std::fs::write(&blob, b"").unwrap();
    std::fs::write(blob.with_extension("tmp-1-1"), b"a blob being written").unwrap();
    let resumed = p.resume(&run_id(&record), &[]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    assert_eq!(p.read("first.log"), "first\nfirst\n", "`first` ran again");
    assert_eq!(p.read("slow.log"), "slow\n");
    assert_eq!(std::fs::read(&blob).unwrap(), b"first output\n");
    assert!(!blob.with_extension("tmp-1-1").exists());
}

#[test]
fn a_truncated_checkpoint_falls_back_to_the_previous_one() {
    let p = Project::new();
    p.write(
        "w.fabro",
        &workflow(
            "first [shape=parallelogram, script=\"echo first >> first.log\"]\n \
             slow [shape=parallelogram, script=\"test -f again || { touch again; sleep 30; }; echo slow >> slow.log\"]\n \
             start -> first -> slow -> exit",
        ),
    );
    let record = killed_at_slow(&p);
    let checkpoint = record.join("checkpoint.json");
    let text = std::fs::read(&checkpoint).unwrap();
    std::fs::write(&checkpoint, &text[..text.len() / 2]).unwrap();
    std::fs::write(record.join("run.json.tmp-1-1"), b"left by a full disk").unwrap();
    let resumed = p.resume(&run_id(&record), &[]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    assert_eq!(p.read("slow.log"), "slow\n");
    assert!(
        !record.join("run.json.tmp-1-1").exists(),
        "temporary files are cleaned up"
    );
}

#[test]
fn inputs_are_bounded() {
    let p = Project::new();
    let out = p.command(&["validate", "/dev/zero"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/dev/zero is not a regular file (a device)")
    );
    p.write(
        "w.fabro",
        &workflow("plan [shape=tab, prompt=\"@/dev/zero\"]\n start -> plan -> exit"),
    );
    let out = p.command(&["validate", "w.fabro"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("which is in /dev, a view of the running system"),
        "{stdout}"
    );
    // A megabyte of garbage: a bounded report, quickly.
    let garbage: String = (0..1_000_000)
        .map(|i| if i % 7 == 0 { '#' } else { 'x' })
        .collect();
    p.write("garbage.fabro", &garbage);
    let started = Instant::now();
    let out = p.command(&["validate", "garbage.fabro"]).output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.matches("error[syntax]").count() <= 200, "unbounded");
    assert!(
        stdout.contains("more syntax errors are not shown"),
        "{stdout:.2000}"
    );
}

#[test]
fn the_record_is_private_to_its_user() {
    let p = Project::new();
    p.write("w.fabro", &workflow("start -> exit"));
    let run = p.run("w.fabro", &[]);
    let record = run.record();
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&record), 0o700);
    for name in [
        "run.json",
        "checkpoint.json",
        "events.jsonl",
        "workflow.fabro",
    ] {
        assert_eq!(mode(&record.join(name)), 0o600, "{name}");
    }
}

/// The nodes whose stages the run's checkpoint records as finished.
fn checkpointed(record: &Path) -> Vec<String> {
    if !record.join("checkpoint.json").exists() {
        return Vec::new();
    }
    let checkpoint = run_support::checkpoint_of(record);
    checkpoint["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["node_id"].as_str().map(str::to_owned))
        .collect()
}

/// The SIGKILL campaign, small by default (`TRELLIS_KILL_TRIALS` raises it): a chain of commands is
/// killed at random moments and resumed each time; no stage the checkpoint held when the process died
/// ever runs again, and the run still finishes with every stage.
#[test]
fn random_kills_never_rerun_a_checkpointed_stage() {
    let trials: u32 = std::env::var("TRELLIS_KILL_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    kill_campaign(25, "sleep 0.03", trials, 30..280);
}

/// The same on a run of 2,000 stages, killed at several random points: the journal, replayed on each
/// resume, holds every finished stage however long the run is.
#[test]
fn a_long_run_killed_at_random_points_loses_and_reruns_nothing() {
    kill_campaign(2_000, "true", 4, 300..2_500);
}

/// Runs a chain of `stages` commands (each logs its name, then runs `extra`), kills it `trials` times
/// after a random delay in `delay_ms` and resumes it each time, then checks the stages.
fn kill_campaign(stages: usize, extra: &str, trials: u32, delay_ms: std::ops::Range<u64>) {
    let p = Project::new();
    let nodes: Vec<String> = (1..=stages).map(|i| format!("s{i:04}")).collect();
    let mut body = String::new();
    for n in &nodes {
        let _ = write!(
            body,
            "{n} [shape=parallelogram, script=\"echo {n} >> ran.log; {extra}\"]\n "
        );
    }
    p.write(
        "w.fabro",
        &workflow(&format!("{body}start -> {} -> exit", nodes.join(" -> "))),
    );
    // A small generator seeded from the clock: where the kills land differs run to run.
    let mut seed = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos(),
    );
    let mut next = move || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        seed >> 33
    };
    // For each stage seen in a checkpoint after a kill: how often it had run by then. A stage may run
    // twice before it is checkpointed (killed mid-stage), never after.
    let mut held: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let runs_of = |log: &str| {
        let mut counts = std::collections::HashMap::<String, usize>::new();
        for line in log.lines() {
            *counts.entry(line.to_owned()).or_default() += 1;
        }
        counts
    };
    let mut child = p.spawn_run("w.fabro");
    for _ in 0..trials {
        let span = delay_ms.end - delay_ms.start;
        std::thread::sleep(Duration::from_millis(delay_ms.start + next() % span));
        let _ = child.kill();
        child.wait().unwrap();
        if !p.run_exists() {
            child = p.spawn_run("w.fabro");
            continue;
        }
        let record = p.only_run();
        let counts = runs_of(&p.read("ran.log"));
        for node in checkpointed(&record) {
            let times = counts.get(&node).copied().unwrap_or(0);
            held.entry(node).or_insert(times);
        }
        child = p.command(&["resume", &run_id(&record)]).spawn().unwrap();
    }
    assert!(child.wait().unwrap().code().is_some());
    let record = p.only_run();
    let finished = p.resume(&run_id(&record), &[]);
    assert!(
        finished.code() == Some(0) || finished.stderr().contains("already"),
        "{}",
        finished.stderr()
    );
    let counts = runs_of(&p.read("ran.log"));
    for node in &nodes {
        let times = counts.get(node).copied().unwrap_or(0);
        assert!(times >= 1, "{node} never ran");
        if let Some(before) = held.get(node) {
            assert_eq!(times, *before, "{node} ran again after it was checkpointed");
        }
    }
    assert_eq!(
        checkpointed(&record)
            .iter()
            .filter(|n| nodes.contains(n))
            .count(),
        nodes.len()
    );
}

/// What a run changed is its diff from start to end, in paths as its stages name them, without
/// the run's own record. Trellis reads the repository through a store of its own: a `.git/config`
/// a stage wrote (a file-system monitor, a filter) runs nothing outside the stage's sandbox, and
/// the user's index is left as it was.
#[test]
fn a_run_shows_what_it_changed_and_a_planted_git_config_runs_nothing() {
    let p = Project::new();
    let root = p.path();
    p.write("a.txt", "one\ntwo\n");
    p.write("old.txt", "gone\n");
    trellis_test::git(root, &["init", "-q"]);
    trellis_test::git(root, &["add", "a.txt", "old.txt"]);
    trellis_test::git(root, &["commit", "-qm", "start"]);
    let planted = root.join("planted");
    let edit = format!(
        "printf 'one\\\\nTWO\\\\nthree\\\\n' > a.txt && rm old.txt && echo new > new.txt && head -c 11000000 /dev/zero > big.bin && printf '[core]\\\\n\\\\tfsmonitor = touch {0}-monitor\\\\n[filter \\\"x\\\"]\\\\n\\\\tclean = touch {0}-filter; cat\\\\n' >> .git/config && echo '*.txt filter=x' > .gitattributes",
        planted.display()
    );
    p.write(
        "w.fabro",
        &workflow(&format!(
            "edit [shape=parallelogram, script=\"{edit}\"]\n start -> edit -> exit"
        )),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let id = run.summary["run_id"].as_str().unwrap().to_owned();
    let out = p.command(&["show", &id, "--changes"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let diff = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "diff --git a/a.txt b/a.txt",
        "-two\n+TWO\n+three\n",
        "diff --git a/new.txt b/new.txt\nnew file mode 100644",
        "diff --git a/old.txt b/old.txt\ndeleted file mode 100644",
        "+*.txt filter=x",
    ] {
        assert!(diff.contains(expected), "{expected:?} in\n{diff}");
    }
    assert!(
        !diff.contains("runs/"),
        "the run's record is not a change:\n{diff}"
    );
    assert!(
        !diff.contains("big.bin"),
        "an untracked file over 10 MB is left out:\n{diff}"
    );
    for hook in ["monitor", "filter"] {
        assert!(
            !root.join(format!("planted-{hook}")).exists(),
            "the planted {hook} ran"
        );
    }
    // `show` lists the files with their lines added and removed.
    let out = p.command(&["show", &id]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(&format!(
            "\nFiles changed: 4 (+4 −2); `trellis show {id} --changes` prints the diff\n  .gitattributes  +1 −0\n  a.txt           +2 −1\n  new.txt         +1 −0\n  old.txt         +0 −1\n"
        )),
        "{shown}"
    );
    let staged = std::process::Command::new("git")
        .args([
            "-c",
            "core.fsmonitor=false",
            "diff",
            "--cached",
            "--name-only",
        ])
        .current_dir(root)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&staged.stdout),
        "",
        "the user's index is as it was"
    );

    // A run waiting at a gate has not ended: its changes are to the tree as it is now, a file whose
    // name has a space included.
    p.write(
        "gate.fabro",
        &workflow(
            "write [shape=parallelogram, script=\"echo x > 'a b.txt'\"]\n ask [shape=hexagon, label=\"Go on?\"]\n start -> write -> ask\n ask -> exit [label=\"[Y] Yes\"]",
        ),
    );
    let waiting = p.run("gate.fabro", &[]);
    assert_eq!(waiting.code(), Some(3), "{}", waiting.stderr());
    assert!(!waiting.record().join("changes/end").exists());
    let id = waiting.summary["run_id"].as_str().unwrap().to_owned();
    p.write("later.txt", "after the stage\n");
    let out = p.command(&["show", &id, "--changes"]).output().unwrap();
    let diff = String::from_utf8_lossy(&out.stdout);
    assert!(
        diff.contains("diff --git a/a b.txt b/a b.txt\nnew file mode")
            && diff.contains("+after the stage"),
        "{diff}"
    );
    let out = p.command(&["show", &id]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("\nFiles changed so far: 2 (+2 −0);"),
        "{shown}"
    );
}

/// Outside git there is nothing to show, and the command says why.
#[test]
fn outside_git_a_run_has_no_changes_to_show() {
    let elsewhere = Project::new();
    elsewhere.write("w.fabro", &workflow("start -> exit"));
    let run = elsewhere.run("w.fabro", &[]);
    let id = run.summary["run_id"].as_str().unwrap().to_owned();
    let out = elsewhere
        .command(&["show", &id, "--changes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not in a git repository"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
