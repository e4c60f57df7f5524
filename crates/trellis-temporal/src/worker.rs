//! A Trellis worker: it polls the shared task queue for runs' workflows and segments, and a queue of
//! its own for the later segments of the runs it holds (their working state is where it left it).
//! A segment opens the run record as `trellis resume` does, executes it with the engine until the run
//! ends or stops for an answer, and heartbeats while it runs: Temporal cancelling the segment
//! cancels the run (its commands' process trees with it), and the worker stopping interrupts it for
//! another worker to take over.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use temporalio_sdk::runtime::worker_tuner::{FixedSizeSlotSupplier, TunerHolder};
use temporalio_sdk::{ApplicationFailure, Runtime, Worker, WorkerOptions};
use trellis_engine::services::{Answer, Interviewer, Question};
use trellis_handlers::interviewer::{Answers, AutoApprove};
use trellis_run::{Resumable, RunError, Sandbox, Stop, Wiring};
use trellis_store::RunDir;

use crate::workflow::{Segment, SegmentEnd, Settle, TrellisRun, WaitingGate};
use crate::{Target, connect};

/// What a worker needs.
pub struct WorkerConfig {
    pub target: Target,
    /// How many segments (runs) it executes at once.
    pub slots: usize,
    /// What its runs' commands and agent tools run in.
    pub sandbox: Arc<Sandbox>,
    /// The runs directory it serves: a segment of a run anywhere else is refused.
    pub runs_dir: PathBuf,
}

/// The worker's activities: one, a run's segment.
#[derive(Clone)]
pub struct Stages {
    /// The queue only this worker polls.
    queue: String,
    identity: String,
    sandbox: Arc<Sandbox>,
    /// The worker's: interrupting it interrupts every segment it is running.
    stop: Stop,
    runs_dir: PathBuf,
}

#[activities]
impl Stages {
    /// Runs a run from its checkpoint until it ends, waits for input, or is stopped.
    #[activity]
    pub async fn advance(
        self: Arc<Self>,
        ctx: ActivityContext,
        segment: Segment,
    ) -> Result<SegmentEnd, ActivityError> {
        match Box::pin(self.execute(&ctx, segment)).await {
            Ok(end) => Ok(end),
            Err(error) => Err(ApplicationFailure::non_retryable(error.to_string()).into()),
        }
    }

    /// Records the status of a run no segment is running.
    #[activity]
    pub async fn settle(
        self: Arc<Self>,
        _ctx: ActivityContext,
        settle: Settle,
    ) -> Result<(), ActivityError> {
        let runs_dir = self
            .confined(&settle.run_id, &settle.runs_dir)
            .await
            .map_err(ApplicationFailure::non_retryable)?;
        trellis_process::task::blocking(move || {
            let record = RunDir::open(&settle.run_id, &runs_dir)?;
            trellis_run::settle(&record, settle.status)
        })
        .await
        .map_err(|error| ApplicationFailure::non_retryable(error.to_string()).into())
    }
}

impl Stages {
    async fn execute(
        &self,
        ctx: &ActivityContext,
        segment: Segment,
    ) -> Result<SegmentEnd, RunError> {
        let runs_dir = self
            .confined(&segment.run_id, &segment.runs_dir)
            .await
            .map_err(|reason| RunError::Sandbox { reason })?;
        let resumable = Resumable::open(&segment.run_id, &runs_dir).await?;
        if let Some(status) = resumable.finished() {
            return Ok(self.end(status, None));
        }
        // The commands a lost worker on this machine left running are stopped first.
        resumable.reap().await;
        let loaded = resumable.load().await?;
        let asked = Arc::new(Mutex::new(None));
        let unanswered: Box<dyn Interviewer> = Box::new(OnTemporal {
            timed_out: segment.timed_out.into_iter().collect(),
            auto_approve: segment.auto_approve,
            asked: asked.clone(),
        });
        let interviewer: Arc<dyn Interviewer> = match segment.answers {
            Some(answers) => Arc::new(Answers::new(
                answers.into_iter().collect::<HashMap<_, _>>(),
                unanswered,
            )),
            None => Arc::from(unanswered),
        };
        let wiring = Wiring {
            interviewer,
            subscribers: Vec::new(),
            logged: None,
            sandbox: self.sandbox.clone(),
        };
        let run = resumable.into_run(loaded, wiring).await?;
        eprintln!(
            "run {}: {} from its checkpoint",
            run.id(),
            run.workflow_name()
        );
        let stop = Stop::new();
        let execute = run.execute(&stop);
        tokio::pin!(execute);
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        let finished = loop {
            tokio::select! {
                finished = &mut execute => break finished?,
                _ = beat.tick() => {
                    // A heartbeat that cannot be sent is retried at the next tick; Temporal
                    // decides when too many were missed.
                    let _ = ctx.record_heartbeat(()).await;
                }
                () = ctx.cancelled(), if !stop.token().is_cancelled() => stop.cancel(),
                () = self.stop.token().cancelled(), if !stop.token().is_cancelled() => stop.interrupt(),
            }
        };
        eprintln!(
            "run {}: {} after {} stages",
            finished.run_id,
            finished.status.as_str(),
            finished.checkpoint.stage_count
        );
        let mut end = self.end(
            finished.status,
            finished.error.as_ref().map(ToString::to_string),
        );
        if finished.status == trellis_engine::RunStatus::WaitingForInput {
            end.gate = asked.lock().take();
        }
        Ok(end)
    }

    /// The runs directory of a run a segment names, when it is this worker's and the run is named
    /// by its id: whoever can reach the Temporal service names the run, and only runs in the
    /// directory this worker was given are its to execute.
    async fn confined(&self, run_id: &str, runs_dir: &str) -> Result<PathBuf, String> {
        if run_id.is_empty() || !run_id.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("`{run_id}` is not a run id"));
        }
        let runs_dir = PathBuf::from(runs_dir);
        if !same_dir(&runs_dir, &self.runs_dir).await {
            return Err(format!(
                "run {run_id} is in {}, and this worker executes only runs in {} (its --runs-dir)",
                runs_dir.display(),
                self.runs_dir.display()
            ));
        }
        Ok(runs_dir)
    }

    fn end(&self, status: trellis_engine::RunStatus, error: Option<String>) -> SegmentEnd {
        SegmentEnd {
            status,
            error,
            queue: self.queue.clone(),
            worker: self.identity.clone(),
            gate: None,
        }
    }
}

/// Who answers a gate on a worker when the segment's answers do not: nobody, now — the segment
/// stops and the run waits for a signal, with the gate's timeout as a Temporal timer (the gate it
/// asked is kept for the segment's end) — unless that timer already ran out (the gate takes its
/// default) or the run was started with `--auto-approve` (the first option).
struct OnTemporal {
    timed_out: std::collections::BTreeSet<String>,
    auto_approve: bool,
    asked: Arc<Mutex<Option<WaitingGate>>>,
}

#[async_trait::async_trait]
impl Interviewer for OnTemporal {
    async fn ask(&self, question: &Question) -> Answer {
        if self.timed_out.contains(&question.node_id) {
            return Answer::TimedOut;
        }
        if self.auto_approve {
            return AutoApprove.ask(question).await;
        }
        *self.asked.lock() = Some(WaitingGate {
            node: question.node_id.clone(),
            timeout_ms: question
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        });
        Answer::Unavailable
    }
}

/// Runs a worker until `shutdown` completes; then the runs it is executing are interrupted (their
/// checkpoints kept) and handed to other workers.
pub async fn run_worker(
    config: WorkerConfig,
    shutdown: impl Future<Output = ()>,
    started: impl FnOnce(&str),
) -> anyhow::Result<()> {
    let runtime = Runtime::from_current_tokio(temporalio_sdk::runtime::RuntimeOptions::default())?;
    let identity = format!(
        "{}@{}-{}",
        std::process::id(),
        hostname(),
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    let client = connect(&config.target, &identity).await?;
    let stages = Stages {
        queue: format!("{}/{identity}", config.target.task_queue),
        identity: identity.clone(),
        sandbox: config.sandbox,
        stop: Stop::new(),
        runs_dir: config.runs_dir,
    };
    let tuner = || {
        TunerHolder::builder()
            .workflow_task_slot_supplier(FixedSizeSlotSupplier::new(100))
            .activity_task_slot_supplier(FixedSizeSlotSupplier::new(config.slots.max(1)))
            .local_activity_task_slot_supplier(FixedSizeSlotSupplier::new(1))
            .nexus_task_slot_supplier(FixedSizeSlotSupplier::new(1))
            .build()
    };
    let shared = WorkerOptions::new(config.target.task_queue.clone())
        .register_workflow::<TrellisRun>()?
        .register_activities(stages.clone())
        .tuner(tuner())
        .client_identity_override(identity.clone())
        .graceful_shutdown_period(Duration::from_secs(5))
        .build();
    let own = WorkerOptions::new(stages.queue.clone())
        .register_activities(stages.clone())
        .tuner(tuner())
        .client_identity_override(identity.clone())
        .graceful_shutdown_period(Duration::from_secs(5))
        .build();
    let mut shared = Worker::new(&runtime, client.clone(), shared)?;
    let mut own = Worker::new(&runtime, client, own)?;
    let (stop_shared, stop_own) = (shared.shutdown_handle(), own.shutdown_handle());
    started(&identity);
    let workers = async { tokio::try_join!(shared.run(), own.run()) };
    tokio::pin!(workers);
    tokio::select! {
        ran = &mut workers => { ran?; }
        () = shutdown => {
            stages.stop.interrupt();
            stop_shared();
            stop_own();
            workers.await?;
        }
    }
    Ok(())
}

/// Whether two paths name the same directory (one that does not exist is no one's).
async fn same_dir(a: &Path, b: &Path) -> bool {
    let (a, b) = (
        tokio::fs::canonicalize(a).await,
        tokio::fs::canonicalize(b).await,
    );
    matches!((a, b), (Ok(a), Ok(b)) if a == b)
}

#[allow(
    clippy::disallowed_methods,
    reason = "read once as the worker starts, before it polls"
)]
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
