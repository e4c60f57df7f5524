//! The engine's semantics as unit tests on the in-memory run store: routing through the loop, retries,
//! goal gates, budgets, branches (nested too), cancellation and resume, large values as blobs. Command
//! nodes run a scripted handler whose script names what the stage does, so no process is started.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use std::time::{Duration, SystemTime};

use trellis_engine::event::EventKind;
use trellis_engine::services::memory::{
    FixedClock, MemoryBlobs, MemoryEvents, MemoryStore, NoAnswers,
};
use trellis_engine::services::{BLOB_PREFIX, BlobStore, EventSink, RunStore as _, Subscribers};
use trellis_engine::{
    Attempt, CancellationToken, Engine, FailureClass, Handler, Handlers, Outcome, RunStatus,
    Services, Settings, Stage,
};
use trellis_workflow::node_kind::HandlerKind;
use trellis_workflow::{CompileOptions, NodeKind, StageStatus, compile_text};

/// Runs command nodes by their script: `ok`, `fail`, `transient`, `hang`, `big` (a
/// 200,000-character value), `flaky` (transient on its first attempt), `need KEY` (fails until the
/// context has KEY), `set KEY=VALUE`, `talk` (emits an event every 30 ms for 300 ms), `watch`
/// (hangs, with a task that counts in `stopped` when the attempt's cancellation token fires).
#[derive(Default)]
struct Scripted {
    attempts: AtomicU32,
    stopped: Arc<AtomicU32>,
}

impl Scripted {
    async fn outcome(&self, stage: &Stage<'_>) -> Outcome {
        let NodeKind::Command(config) = &stage.node.kind else {
            return Outcome::success();
        };
        let script = config.script.as_str();
        match script {
            "flaky" if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 => {
                Outcome::failed(FailureClass::Transient, "overloaded")
            }
            "need fixed" if stage.context.get("fixed").is_none() => {
                Outcome::failed(FailureClass::StageFailed, "not fixed yet")
            }
            "ok" | "flaky" | "need fixed" => Outcome::success(),
            "fail" => Outcome::failed(FailureClass::StageFailed, "it failed"),
            "transient" => Outcome::failed(FailureClass::Transient, "overloaded"),
            "hang" => {
                std::future::pending::<()>().await;
                Outcome::success()
            }
            "watch" => {
                let (token, stopped) = (stage.cancel.clone(), self.stopped.clone());
                tokio::spawn(async move {
                    token.cancelled().await;
                    stopped.fetch_add(1, Ordering::SeqCst);
                });
                std::future::pending::<()>().await;
                Outcome::success()
            }
            "talk" => {
                for piece in 0..10 {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    stage.emitter.emit(
                        Some(&stage.node.id),
                        EventKind::ModelTextDelta {
                            text: format!("piece {piece}"),
                        },
                    );
                }
                Outcome::success()
            }
            "big" => Outcome::success()
                .with_update("big.value", "x".repeat(200_000))
                .with_update("small", "s"),
            other => match other.strip_prefix("set ").and_then(|kv| kv.split_once('=')) {
                Some((key, value)) => Outcome::success().with_update(key, value),
                None => Outcome::failed(FailureClass::Configuration, "unknown script"),
            },
        }
    }
}

#[async_trait]
impl Handler for Scripted {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        self.outcome(stage).await.into()
    }
}

struct Harness {
    engine: Engine,
    store: Arc<MemoryStore>,
    blobs: Arc<MemoryBlobs>,
    events: Arc<MemoryEvents>,
    _dir: tempfile::TempDir,
}

fn harness(text: &str, handler: Arc<dyn Handler>) -> Harness {
    harness_of("t.fabro", text, handler)
}

/// A harness for a workflow file named `name` (`.yaml` reads YAML).
fn harness_of(name: &str, text: &str, handler: Arc<dyn Handler>) -> Harness {
    let (_, compiled) = compile_text(name, text, &CompileOptions::default());
    let workflow = compiled
        .workflow
        .unwrap_or_else(|| panic!("{:?}", compiled.diagnostics));
    let mut handlers = Handlers::with_control_flow();
    handlers.register(HandlerKind::Command, handler);
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new(dir.path()));
    let blobs = Arc::new(MemoryBlobs::default());
    let events = Arc::new(MemoryEvents::default());
    let services = Services {
        store: store.clone(),
        blobs: blobs.clone(),
        events: Subscribers::new([events.clone() as Arc<dyn EventSink>]),
        interviewer: Arc::new(NoAnswers),
        router: None,
        clock: Arc::new(FixedClock(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000),
        )),
        hooks: None,
        pacer: None,
    };
    let settings = Settings {
        max_steps: 50,
        ..Settings::default()
    };
    let engine = Engine::new(
        Arc::new(workflow),
        Arc::new(handlers),
        services,
        settings,
        "test-run",
    );
    Harness {
        engine,
        store,
        blobs,
        events,
        _dir: dir,
    }
}

fn graph(body: &str) -> String {
    format!("digraph T {{ start [shape=Mdiamond]\n exit [shape=Msquare]\n {body} }}")
}

impl Harness {
    /// Runs the workflow; the result's checkpoint carries the finished stages as a reader of the
    /// record sees them (the engine itself keeps only their count).
    async fn run(&self) -> trellis_engine::RunResult {
        let first = self.engine.first_checkpoint(BTreeMap::new()).unwrap();
        let mut result = self.engine.run(first, &CancellationToken::new()).await;
        result.checkpoint.stages = self.store.last_checkpoint().unwrap().stages;
        result
    }

    /// Resumes a run from `checkpoint`, which the record now holds (as it holds what the first run
    /// wrote), as [`Harness::run`] runs one.
    async fn resume(&self, checkpoint: trellis_engine::Checkpoint) -> trellis_engine::RunResult {
        self.store.save_checkpoint(&checkpoint).unwrap();
        let mut result = self.engine.run(checkpoint, &CancellationToken::new()).await;
        result.checkpoint.stages = self.store.last_checkpoint().unwrap().stages;
        result
    }

    fn event_names(&self) -> Vec<String> {
        self.events.names()
    }
}

fn nodes(result: &trellis_engine::RunResult) -> Vec<&str> {
    result
        .checkpoint
        .stages
        .iter()
        .map(|s| s.node_id.as_str())
        .collect()
}

#[tokio::test]
async fn large_values_become_blobs_that_conditions_still_read() {
    let h = harness(
        &graph(
            "big [shape=parallelogram, script=\"big\"]\n other [shape=parallelogram, script=\"ok\"]\n start -> big\n big -> exit [condition=\"big.value contains xxxx\"]\n big -> other\n other -> exit",
        ),
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    assert_eq!(
        nodes(&result),
        ["start", "big", "exit"],
        "the condition saw the real value"
    );
    let reference = result.checkpoint.track.context["big.value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reference.starts_with(BLOB_PREFIX), "{reference}");
    assert_eq!(h.blobs.get(&reference).unwrap().len(), 200_000);
    assert_eq!(
        result.checkpoint.track.context["small"], "s",
        "small values stay inline"
    );
    assert_eq!(
        h.store.last_checkpoint().unwrap().track.context["big.value"],
        reference.as_str()
    );
}

#[tokio::test]
async fn conditions_route_through_the_loop_and_no_match_stops_the_run() {
    let h = harness(
        &graph(
            "t [shape=parallelogram, script=\"fail\"]\n fix [shape=parallelogram, script=\"ok\"]\n start -> t\n t -> exit [condition=\"outcome=success\"]\n t -> fix [condition=\"outcome=fail\"]\n fix -> exit",
        ),
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Succeeded);
    assert_eq!(nodes(&result), ["start", "t", "fix", "exit"]);

    let h = harness(
        &graph(
            "t [shape=parallelogram, script=\"ok\"]\n start -> t\n t -> exit [condition=\"outcome=fail\"]",
        ),
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Failed);
    assert!(
        result
            .error
            .unwrap()
            .to_string()
            .contains("no edge from `t` matches")
    );
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried_and_each_attempt_recorded() {
    let h = harness(
        &graph("t [shape=parallelogram, script=\"flaky\", max_retries=2]\n start -> t -> exit"),
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Succeeded);
    let attempts: Vec<u32> = result
        .checkpoint
        .stages
        .iter()
        .filter(|s| s.node_id == "t")
        .map(|s| s.attempt)
        .collect();
    assert_eq!(attempts, [1, 2]);
    let names = h.event_names();
    let retrying = names.iter().position(|n| n == "StageRetrying").unwrap();
    let completed = names.iter().rposition(|n| n == "StageCompleted").unwrap();
    assert!(retrying < completed, "{names:?}");
}

#[tokio::test]
async fn an_unmet_goal_gate_sends_the_run_to_its_retry_target() {
    let h = harness(
        &graph(
            "fix [shape=parallelogram, script=\"set fixed=yes\"]\n \
             check [shape=parallelogram, script=\"need fixed\", goal_gate=true, retry_target=\"fix\"]\n \
             start -> check -> exit\n check -> fix [condition=\"context.never\"]\n fix -> check",
        ),
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    assert_eq!(nodes(&result), ["start", "check", "fix", "check", "exit"]);
    let names = h.event_names();
    assert_eq!(names.iter().filter(|n| *n == "GoalGateUnmet").count(), 1);
}

#[tokio::test]
async fn the_step_budget_stops_a_runaway_loop() {
    let h = harness(
        &graph(
            "a [shape=parallelogram, script=\"ok\"]\n b [shape=parallelogram, script=\"ok\"]\n start -> a -> b -> a\n b -> exit [condition=\"context.never\"]",
        ),
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Failed);
    assert!(result.error.unwrap().to_string().contains("step budget"));
}

#[tokio::test]
async fn branches_walk_the_same_loop_and_nest() {
    let h = harness(
        &graph(
            "outer [shape=component]\n inner [shape=component]\n im [shape=tripleoctagon]\n om [shape=tripleoctagon]\n \
             x [shape=parallelogram, script=\"set x=1\"]\n y [shape=parallelogram, script=\"fail\"]\n z [shape=parallelogram, script=\"ok\"]\n \
             start -> outer\n outer -> inner\n inner -> x -> im\n inner -> y -> im\n im -> om\n outer -> z -> om\n om -> exit",
        ),
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    let status_of = |node: &str| {
        result
            .checkpoint
            .stages
            .iter()
            .find(|s| s.node_id == node)
            .map(|s| s.status.as_str())
    };
    assert_eq!(status_of("inner"), Some("partially_succeeded"));
    assert_eq!(
        status_of("im"),
        Some("partially_succeeded"),
        "the join's verdict"
    );
    assert_eq!(status_of("outer"), Some("succeeded"));
    assert!(result.checkpoint.track.parallel.is_none());
    // Branch updates reach the main context only through parallel.results.
    assert!(!result.checkpoint.track.context.contains_key("x"));
}

#[tokio::test]
async fn cancelling_stops_the_running_stage_and_resume_runs_it_again() {
    let h = harness(
        &graph(
            "a [shape=parallelogram, script=\"ok\"]\n wait [shape=parallelogram, script=\"hang\"]\n start -> a -> wait -> exit",
        ),
        Arc::new(Scripted::default()),
    );
    let cancel = CancellationToken::new();
    let first = h.engine.first_checkpoint(BTreeMap::new()).unwrap();
    let run = h.engine.run(first, &cancel);
    let stopper = async {
        // Cancel once the hanging stage has started.
        while !h.event_names().iter().any(|n| n == "StageStarted")
            || h.event_names()
                .iter()
                .filter(|n| *n == "StageStarted")
                .count()
                < 3
        {
            tokio::task::yield_now().await;
        }
        cancel.cancel();
    };
    let (mut result, ()) = tokio::join!(run, stopper);
    result.checkpoint.stages = h.store.last_checkpoint().unwrap().stages;
    assert_eq!(result.status, RunStatus::Cancelled);
    assert_eq!(result.checkpoint.next_node(), Some("wait"));
    assert_eq!(nodes(&result), ["start", "a"]);
    assert_eq!(
        h.event_names().last().map(String::as_str),
        Some("WorkflowRunCancelled")
    );
    assert_eq!(
        h.store.last_checkpoint().unwrap().status,
        RunStatus::Cancelled
    );

    // Resume with a handler that finishes: only the interrupted stage and what follows run.
    let resumed = harness(
        &graph(
            "a [shape=parallelogram, script=\"ok\"]\n wait [shape=parallelogram, script=\"ok\"]\n start -> a -> wait -> exit",
        ),
        Arc::new(Scripted::default()),
    );
    let result = resumed.resume(result.checkpoint).await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    assert_eq!(nodes(&result), ["start", "a", "wait", "exit"]);
    assert_eq!(
        resumed.event_names().first().map(String::as_str),
        Some("WorkflowRunResumed")
    );
}

/// Paces the main track: records every stage it is asked about and parks before `park_at`; and
/// every fan-out, branch and how each ended.
#[derive(Default)]
struct Pacing {
    asked: parking_lot::Mutex<Vec<String>>,
    park_at: Option<&'static str>,
    /// `fan b1,b2` when a fan-out starts, `b1` when a branch is asked for, `b1: succeeded` (or
    /// `b1: dropped`) when it ends, `fan: over` when the fan-out is.
    paced: Arc<parking_lot::Mutex<Vec<String>>>,
}

#[async_trait]
impl trellis_engine::services::Pacer for Pacing {
    async fn next_stage(&self, node: &str) -> trellis_engine::services::Pace {
        self.asked.lock().push(node.to_owned());
        if self.park_at == Some(node) {
            trellis_engine::services::Pace::Park
        } else {
            trellis_engine::services::Pace::Go
        }
    }

    fn fan_out(&self, node: &str, branches: &[String]) -> trellis_engine::services::Lease {
        self.paced
            .lock()
            .push(format!("{node} {}", branches.join(",")));
        let (paced, node) = (self.paced.clone(), node.to_owned());
        trellis_engine::services::Lease::new(move |_| paced.lock().push(format!("{node}: over")))
    }

    async fn next_branch(&self, _node: &str, branch: &str) -> trellis_engine::services::Lease {
        self.paced.lock().push(branch.to_owned());
        let (paced, branch) = (self.paced.clone(), branch.to_owned());
        trellis_engine::services::Lease::new(move |status| {
            let status = status.map_or("dropped", |s| s.as_str());
            paced.lock().push(format!("{branch}: {status}"));
        })
    }
}

/// Paces the main track and keeps a working tree: logs each stage it is asked about and each save
/// of the tree; the save numbered `fail_at` (from 1) fails.
#[derive(Default)]
struct Keeping {
    log: parking_lot::Mutex<Vec<String>>,
    fail_at: Option<usize>,
}

#[async_trait]
impl trellis_engine::services::Pacer for Keeping {
    async fn next_stage(&self, node: &str) -> trellis_engine::services::Pace {
        self.log.lock().push(node.to_owned());
        trellis_engine::services::Pace::Go
    }

    async fn saving(&self) -> Result<(), String> {
        let mut log = self.log.lock();
        log.push("save".to_owned());
        if self.fail_at == Some(log.iter().filter(|l| *l == "save").count()) {
            return Err("the remote refused the push".to_owned());
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_pacer_that_keeps_the_working_tree_saves_it_before_each_step_and_a_failed_save_fails_the_run()
 {
    let source = graph(
        "a [shape=parallelogram, script=\"ok\"]\n b [shape=parallelogram, script=\"ok\"]\n \
         start -> a -> b -> exit",
    );
    let mut h = harness(&source, Arc::new(Scripted::default()));
    let keeping = Arc::new(Keeping::default());
    h.engine.services.pacer = Some(keeping.clone());
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    // The tree is saved after each step (the exit's too), before the record, and with the run's
    // end.
    assert_eq!(
        *keeping.log.lock(),
        ["save", "a", "save", "b", "save", "save"]
    );

    // The save after `a` fails: the run fails with the reason and `b` never runs.
    let mut h = harness(&source, Arc::new(Scripted::default()));
    let failing = Arc::new(Keeping {
        fail_at: Some(2),
        ..Keeping::default()
    });
    h.engine.services.pacer = Some(failing.clone());
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Failed);
    assert_eq!(
        result.error.as_ref().map(ToString::to_string).as_deref(),
        Some("cannot keep the run's working tree: the remote refused the push")
    );
    assert_eq!(*failing.log.lock(), ["save", "a", "save", "save"]);
    assert_eq!(nodes(&result), ["start", "a"]);
}

#[tokio::test]
async fn a_pacer_is_asked_for_each_branch_of_a_main_track_fan_out_and_hears_how_it_ended() {
    // One branch at a time, and the first success ends the fan-out: `b2` is never asked for.
    let source = graph(
        "fan [shape=component, join_policy=\"first_success\", max_parallel=1]\n \
         b1 [shape=parallelogram, script=\"ok\"]\n b2 [shape=parallelogram, script=\"ok\"]\n \
         join [shape=tripleoctagon]\n start -> fan\n fan -> b1 -> join\n fan -> b2 -> join\n join -> exit",
    );
    let mut h = harness(&source, Arc::new(Scripted::default()));
    let pacing = Arc::new(Pacing::default());
    h.engine.services.pacer = Some(pacing.clone());
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    assert_eq!(
        *pacing.paced.lock(),
        ["fan b1,b2", "b1", "b1: succeeded", "fan: over"]
    );
}

#[tokio::test]
async fn a_pacer_is_asked_before_each_main_track_stage_and_a_parked_run_goes_on_where_it_stopped() {
    let source = graph(
        "a [shape=parallelogram, script=\"ok\"]\n fan [shape=component]\n \
         b1 [shape=parallelogram, script=\"ok\"]\n b2 [shape=parallelogram, script=\"ok\"]\n \
         join [shape=tripleoctagon]\n c [shape=parallelogram, script=\"set done=yes\"]\n \
         start -> a -> fan\n fan -> b1 -> join\n fan -> b2 -> join\n join -> c -> exit",
    );
    let mut h = harness(&source, Arc::new(Scripted::default()));
    let parking = Arc::new(Pacing {
        park_at: Some("c"),
        ..Pacing::default()
    });
    h.engine.services.pacer = Some(parking.clone());
    let result = h.run().await;
    // Parked before `c`: the run has not ended, nothing of `c` ran, and the record says where to
    // go on; no end event, no end status.
    assert_eq!(result.status, RunStatus::Running, "{:?}", result.error);
    assert_eq!(result.checkpoint.next_node(), Some("c"));
    // The branches run at once, and a loaded machine may end either first.
    let mut ran = nodes(&result);
    ran[2..4].sort_unstable();
    assert_eq!(ran, ["start", "a", "b1", "b2", "fan", "join"]);
    assert_eq!(
        h.store.last_checkpoint().unwrap().status,
        RunStatus::Running
    );
    let names = h.event_names();
    assert_eq!(names.last().map(String::as_str), Some("CheckpointSaved"));
    // The main track's stages are asked about, not the start, the exit or the branches'; each
    // branch is asked for on its own.
    assert_eq!(*parking.asked.lock(), ["a", "fan", "join", "c"]);
    let mut paced = parking.paced.lock().clone();
    paced[1..5].sort();
    assert_eq!(
        paced,
        [
            "fan b1,b2",
            "b1",
            "b1: succeeded",
            "b2",
            "b2: succeeded",
            "fan: over"
        ]
    );

    let mut resumed = harness(&source, Arc::new(Scripted::default()));
    let going = Arc::new(Pacing::default());
    resumed.engine.services.pacer = Some(going.clone());
    let result = resumed.resume(result.checkpoint).await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    assert_eq!(result.checkpoint.track.context["done"], "yes");
    assert_eq!(*going.asked.lock(), ["c"]);
    assert_eq!(
        resumed.event_names().last().map(String::as_str),
        Some("WorkflowRunCompleted")
    );
}

#[tokio::test]
async fn events_take_their_time_from_the_clock() {
    let h = harness(
        &graph("a [shape=parallelogram, script=\"ok\"]\n start -> a -> exit"),
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    assert_eq!(result.status, RunStatus::Succeeded);
    let fixed = trellis_engine::engine::format_time(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000),
    );
    let events = h.events.events.lock();
    assert!(events.len() > 5);
    assert!(events.iter().all(|e| e.ts == fixed), "{fixed}");
}

#[tokio::test]
async fn a_failed_yaml_node_ends_the_run_unless_it_is_fail_soft() {
    let yaml = |soft: &str| {
        format!(
            "name: Soft\nentry: check\nnodes:\n  check:\n    type: command\n    script: fail\n{soft}  after:\n    type: command\n    script: ok\nedges:\n  - from: check\n    to: after\n"
        )
    };
    let hard = harness_of("soft.yaml", &yaml(""), Arc::new(Scripted::default()));
    let result = hard.run().await;
    assert_eq!(result.status, RunStatus::Failed);
    let error = result.error.as_ref().unwrap().to_string();
    assert!(
        error.contains("node `check` failed") && error.contains("fail_soft"),
        "{error}"
    );
    assert_eq!(nodes(&result), ["check"]);

    let soft = harness_of(
        "soft.yaml",
        &yaml("    fail_soft: true\n"),
        Arc::new(Scripted::default()),
    );
    let result = soft.run().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    assert_eq!(nodes(&result), ["check", "after"]);
}

/// Waits (a little) until `count` reaches `want`.
async fn reaches(count: &AtomicU32, want: u32) -> u32 {
    for _ in 0..200 {
        if count.load(Ordering::SeqCst) >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    count.load(Ordering::SeqCst)
}

#[tokio::test]
async fn an_attempt_s_token_fires_when_it_times_out_and_when_the_run_stops() {
    let handler = Arc::new(Scripted::default());
    let h = harness(
        &graph(
            "slow [shape=parallelogram, script=\"watch\", timeout=\"50ms\", max_retries=1]\n start -> slow -> exit",
        ),
        handler.clone(),
    );
    let result = h.run().await;
    let slow: Vec<_> = result
        .checkpoint
        .stages
        .iter()
        .filter(|s| s.node_id == "slow")
        .map(|s| s.failure_reason.as_deref())
        .collect();
    assert_eq!(slow, [Some("timed out after 50ms"); 2]);
    // Two attempts timed out; each one's token fired with it.
    assert_eq!(reaches(&handler.stopped, 2).await, 2);

    let handler = Arc::new(Scripted::default());
    let h = harness(
        &graph("slow [shape=parallelogram, script=\"watch\"]\n start -> slow -> exit"),
        handler.clone(),
    );
    let cancel = CancellationToken::new();
    let first = h.engine.first_checkpoint(BTreeMap::new()).unwrap();
    let stopper = async {
        while h
            .event_names()
            .iter()
            .filter(|n| *n == "StageStarted")
            .count()
            < 2
        {
            tokio::task::yield_now().await;
        }
        cancel.cancel();
    };
    let (result, ()) = tokio::join!(h.engine.run(first, &cancel), stopper);
    assert_eq!(result.status, RunStatus::Cancelled);
    assert_eq!(reaches(&handler.stopped, 1).await, 1);
}

#[tokio::test]
async fn a_stage_fails_as_stalled_only_when_it_shows_no_progress_for_the_stall_timeout() {
    let h = harness(
        "digraph T { graph [stall_timeout=\"100ms\"]\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         talk [shape=parallelogram, script=\"talk\"]\n quiet [shape=parallelogram, script=\"hang\", max_retries=0]\n \
         capped [shape=parallelogram, script=\"talk\", timeout=\"50ms\", max_retries=0]\n \
         start -> talk -> quiet\n quiet -> capped [condition=\"outcome=fail\"]\n capped -> exit }",
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    let reasons: Vec<_> = result
        .checkpoint
        .stages
        .iter()
        .map(|s| (s.node_id.as_str(), s.status, s.failure_reason.as_deref()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("start", StageStatus::Succeeded, None),
            // 300 ms, three times the stall timeout, with an event every 30 ms.
            ("talk", StageStatus::Succeeded, None),
            (
                "quiet",
                StageStatus::Failed,
                Some(
                    "stalled: no event and no output for 100ms (the graph's `stall_timeout`; a node's `timeout` replaces it)"
                )
            ),
            // A node's own timeout is a limit on the whole attempt, progress or not.
            ("capped", StageStatus::Failed, Some("timed out after 50ms")),
            ("exit", StageStatus::Succeeded, None),
        ]
    );
}

#[tokio::test]
async fn a_fan_out_goes_through_the_attempt_path_with_its_timeout_and_retries() {
    let h = harness(
        &graph(
            "fan [shape=component, timeout=\"50ms\", max_retries=1]\n \
             a [shape=parallelogram, script=\"hang\"]\n b [shape=parallelogram, script=\"ok\"]\n \
             join [shape=tripleoctagon]\n \
             start -> fan\n fan -> a -> join\n fan -> b -> join\n join -> exit",
        ),
        Arc::new(Scripted::default()),
    );
    let result = h.run().await;
    let names = h.event_names();
    let fan_started = h
        .events
        .events
        .lock()
        .iter()
        .filter(|e| e.name() == "StageStarted" && e.node_id.as_deref() == Some("fan"))
        .count();
    assert_eq!(fan_started, 2, "two attempts at the fan-out: {names:?}");
    assert!(names.iter().any(|n| n == "StageRetrying"), "{names:?}");
    let fan_stages: Vec<_> = result
        .checkpoint
        .stages
        .iter()
        .filter(|s| s.node_id == "fan")
        .collect();
    assert_eq!(fan_stages.len(), 2);
    assert!(
        fan_stages
            .iter()
            .all(|s| s.failure_reason.as_deref() == Some("timed out after 50ms")),
        "{fan_stages:?}"
    );
    assert_ne!(
        fan_stages[0].dir, fan_stages[1].dir,
        "each attempt has its own directory"
    );
}
