//! A Trellis worker: it polls the shared task queue for runs' workflows and their first stages, a
//! queue of its own for the later stages of the runs it holds, and one for their fan-outs' branches.
//!
//! Each stage of a run's main track is one activity, and so is each branch of a fan-out there. The
//! run's engine lives on the worker that holds the run, in a task of its own, from the run's first
//! stage on: before each stage it waits (its [`Pacer`]) for that stage's activity, runs the stage
//! while the activity heartbeats, and waits again; a fan-out's branch waits (`Branches`) for the
//! activity of its own, which takes a slot for it and heartbeats until it ends. An activity for a
//! run the worker does not hold (the first, or one taken over from a lost worker) opens the run
//! record as `trellis resume` does. Temporal cancelling a stage's activity cancels the run (its
//! commands' process trees with it); the worker stopping interrupts it for another worker to take
//! over; an engine whose next stage's activity does not come parks the run between the two stages,
//! for whichever worker that activity reaches.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};
use temporalio_sdk::runtime::worker_tuner::{FixedSizeSlotSupplier, TunerHolder};
use temporalio_sdk::{ApplicationFailure, Runtime, Worker, WorkerOptions};
use tokio::sync::{Semaphore, mpsc, oneshot};
use trellis_engine::RunStatus;
use trellis_engine::services::{Answer, Interviewer, Lease, Pace, Pacer, Question};
use trellis_handlers::interviewer::{Answers, AutoApprove};
use trellis_run::{Finished, Resumable, RunError, Sandbox, Stop, Wiring};
use trellis_store::RunDir;
use trellis_workflow::StageStatus;

use crate::workflow::{
    BranchEnd, BranchWork, FanOut, HANDOVER_TIMEOUT, HEARTBEAT_TIMEOUT, NextStage, Settle,
    StageEnd, SubStage, SubStageEnd, TrellisRun, TrellisSubRun, WaitingGate, branch_queue,
};
use crate::workspace::Checkout;
use crate::{Target, connect};

/// How long a held run's engine waits for its next stage's activity before it parks the run.
/// Shorter than [`HANDOVER_TIMEOUT`], after which the activity goes to any worker: by then the
/// engine here has let the run go.
const IDLE: Duration = Duration::from_secs(HANDOVER_TIMEOUT.as_secs() / 2);

/// How many branch activities a worker takes at once: they mostly wait for their turn.
const BRANCHES_AT_ONCE: usize = 1024;

/// Numbers the engines a worker starts.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

/// What a worker needs.
pub struct WorkerConfig {
    pub target: Target,
    /// How many stages it executes at once.
    pub slots: usize,
    /// What its runs' commands and agent tools run in.
    pub sandbox: Arc<Sandbox>,
    /// The runs directory it serves: a stage of a run anywhere else is refused.
    pub runs_dir: PathBuf,
    /// Where it checks out the working trees of runs kept on a git remote
    /// ([`crate::workspace`]).
    pub workspaces: PathBuf,
}

/// The worker's activities: a run's next stage, and recording the status of a run nothing runs.
#[derive(Clone)]
pub struct Stages {
    /// The queue only this worker polls.
    queue: String,
    identity: String,
    sandbox: Arc<Sandbox>,
    /// The worker's: interrupting it interrupts every stage it is running and parks the runs it
    /// holds.
    stop: Stop,
    runs_dir: PathBuf,
    workspaces: PathBuf,
    /// The runs whose engines wait here for their next stage.
    held: Arc<Mutex<HashMap<String, Live>>>,
    /// One permit per stage running (the worker's `--slots`).
    slots: Arc<Semaphore>,
    /// The tasks of the live engines, waited for when the worker stops.
    engines: Arc<Mutex<tokio::task::JoinSet<()>>>,
}

/// A run whose engine lives on this worker.
struct Live {
    /// Tells which engine this is (a run parked and opened again gets a new one).
    generation: u64,
    stop: Stop,
    /// Its main track.
    lane: Lane,
    /// The gate the run stopped at, when it did.
    asked: Arc<Mutex<Option<WaitingGate>>>,
    /// The wait the run parked at for the workflow's timer, when it did: its node and end.
    kept: Kept,
    /// The main tracks of the child runs of its sub-workflows, by the sub-workflow's node, while
    /// they run (and no activity of theirs holds them).
    children: Children,
}

type Children = Arc<Mutex<HashMap<String, Lane>>>;

/// The wait a run parked at for its workflow's timer, when it did: its node and end.
type Kept = Arc<Mutex<Option<(String, SystemTime)>>>;

/// A main track paced by activities: the run's, or a sub-workflow's child run's.
struct Lane {
    reports: mpsc::UnboundedReceiver<Report>,
    /// The engine waits before this stage for its activity.
    waiting: Option<Ready>,
    /// Where the branches of its fan-outs meet their activities.
    branches: Arc<Branches>,
}

/// The engine waits before `node`; `go` lets it run the stage.
struct Ready {
    node: String,
    go: oneshot::Sender<()>,
}

/// What a live engine tells the activities of its run.
enum Report {
    Ready(Ready),
    /// A fan-out's stage started these branches: each is to come as an activity of its own.
    FanOut(FanOut),
    /// A sub-workflow's stage (its node) started its child run, whose stages are to come as
    /// activities of a child workflow.
    SubWorkflow(String),
    /// The engine stopped: the run ended, waits for an answer, was stopped or parked.
    Ended(Box<Result<Finished, StageError>>),
    /// The lane's track is over: a child run ended, or the engine that paced it is gone.
    Over,
}

/// Why a stage's activity failed.
#[derive(Debug, thiserror::Error)]
enum StageError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("the run's engine on this worker stopped without a word")]
    Lost,
    #[error("the stage was cancelled before it started")]
    Cancelled,
}

#[activities]
impl Stages {
    /// Runs a run's next stage (opening the run from its checkpoint when this worker does not hold
    /// it), and says how the run stands after it.
    #[activity]
    pub async fn advance(
        self: Arc<Self>,
        ctx: ActivityContext,
        work: NextStage,
    ) -> Result<StageEnd, ActivityError> {
        match Box::pin(self.execute(&ctx, work)).await {
            Ok(end) => Ok(end),
            Err(error) => Err(ApplicationFailure::non_retryable(error.to_string()).into()),
        }
    }

    /// Runs the next stage of a sub-workflow's child run this worker holds, and says what follows.
    #[activity]
    pub async fn child_stage(
        self: Arc<Self>,
        ctx: ActivityContext,
        work: SubStage,
    ) -> Result<SubStageEnd, ActivityError> {
        match self.sub_stage(&ctx, work).await {
            Ok(end) => Ok(end),
            Err(error) => Err(ApplicationFailure::non_retryable(error.to_string()).into()),
        }
    }

    /// Runs a branch of a fan-out of a run this worker holds, when the run's engine comes to it, and
    /// says how it ended.
    #[activity]
    pub async fn branch(
        self: Arc<Self>,
        ctx: ActivityContext,
        work: BranchWork,
    ) -> Result<BranchEnd, ActivityError> {
        self.confined(&work.run_id, &work.runs_dir)
            .await
            .map_err(ApplicationFailure::non_retryable)?;
        let held = self.held.lock().get(&work.run_id).and_then(|live| {
            let branches = match &work.sub_workflow {
                None => Some(live.lane.branches.clone()),
                Some(node) => live.children.lock().get(node).map(|l| l.branches.clone()),
            };
            Some((live.stop.clone(), branches?))
        });
        // The run's engine is not here (it ended or was stopped): the branch has nothing to run.
        let Some((run, branches)) = held else {
            return Ok(BranchEnd { status: None });
        };
        let status = self.run_branch(&ctx, &run, &branches, &work).await;
        Ok(BranchEnd { status })
    }

    /// Records the status of a run no stage is running: a run this worker holds is cancelled
    /// through its engine; any other has its record settled.
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
        let held = self.held.lock().remove(&settle.run_id);
        if let Some(mut live) = held {
            live.stop.cancel();
            while let Some(report) = live.lane.reports.recv().await {
                if let Report::Ended(_) = report {
                    break;
                }
            }
        }
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
        work: NextStage,
    ) -> Result<StageEnd, StageError> {
        let runs_dir = self
            .confined(&work.run_id, &work.runs_dir)
            .await
            .map_err(|reason| RunError::Sandbox { reason })?;
        // Cancelled while it waited for a slot: the run, if this worker holds it, is the settle
        // activity's to cancel.
        let Some(_slot) = self.slot(ctx).await else {
            return Err(StageError::Cancelled);
        };
        let held = self.held.lock().remove(&work.run_id);
        let (mut live, mut opened) = match held {
            Some(live) => (live, false),
            None => match self.take_over(ctx, &work, &runs_dir).await? {
                Ok(live) => (live, true),
                Err(status) => return Ok(self.end(status, None)),
            },
        };
        // After a fan-out's branches or a sub-workflow's child run, the engine here finishes its
        // stage and comes to the next one, which is another activity's.
        let mut started = work.finishing.is_some() && !opened;
        loop {
            let ended = match self
                .drive(ctx, &live.stop, &mut live.lane, &mut started)
                .await
            {
                Report::Ended(ended) => ended,
                Report::Over => Box::new(Err(StageError::Lost)),
                report => {
                    let mut end = self.end(RunStatus::Running, None);
                    match report {
                        Report::Ready(next) => {
                            end.next = Some(next.node.clone());
                            live.lane.waiting = Some(next);
                        }
                        // The branches or the child run's stages are the workflow's to start, as
                        // activities of their own.
                        Report::FanOut(fan_out) => end.fan_out = Some(fan_out),
                        Report::SubWorkflow(node) => end.sub_workflow = Some(node),
                        Report::Ended(_) | Report::Over => unreachable!("matched above"),
                    }
                    self.held.lock().insert(work.run_id.clone(), live);
                    return Ok(end);
                }
            };
            // The engine parked for want of this activity (before it came, or as it came): the
            // stage is still to run. The run is opened again, once.
            if opened || !parked_idle(&ended, &live) {
                return self.ended(*ended, &live);
            }
            opened = true;
            live = match self.take_over(ctx, &work, &runs_dir).await? {
                Ok(live) => live,
                Err(status) => return Ok(self.end(status, None)),
            };
        }
    }

    /// Meets the branch `work` names when the run's engine comes to it, takes a slot for it, lets
    /// it run and waits for its end, heartbeating throughout: Temporal cancelling the activity
    /// cancels the run, and the worker stopping interrupts it. `None` when the branch did not run
    /// to its end in the fan-out.
    async fn run_branch(
        &self,
        ctx: &ActivityContext,
        run: &Stop,
        branches: &Branches,
        work: &BranchWork,
    ) -> Option<StageStatus> {
        let asked = branches.arrive(&work.node, &work.branch)?;
        let go = self.beating(ctx, run, asked).await.ok()?;
        let _slot = self.slot(ctx).await?;
        let (done, ended) = oneshot::channel();
        go.send(done).ok()?;
        self.beating(ctx, run, ended).await.ok().flatten()
    }

    /// Waits for `until`, heartbeating every second: the workflow cancelling the activity cancels
    /// the run, Temporal letting go of it (it counted the worker lost) or the worker stopping
    /// interrupts it; either way the wait goes on for what that ends.
    async fn beating<T>(&self, ctx: &ActivityContext, run: &Stop, until: T) -> T::Output
    where
        T: Future,
    {
        tokio::pin!(until);
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                out = &mut until => return out,
                _ = beat.tick() => {
                    // A heartbeat that cannot be sent is retried at the next tick; Temporal
                    // decides when too many were missed.
                    let _ = ctx.record_heartbeat(()).await;
                }
                () = ctx.cancelled(), if !run.token().is_cancelled() => {
                    if cancelled_by_workflow(ctx).await {
                        run.cancel();
                    } else {
                        run.interrupt();
                    }
                }
                () = self.stop.token().cancelled(), if !run.token().is_cancelled() => run.interrupt(),
            }
        }
    }

    /// A permit to run a stage, heartbeating while the worker's slots are all taken; none when
    /// Temporal cancels the activity meanwhile.
    async fn slot(&self, ctx: &ActivityContext) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let acquire = self.slots.clone().acquire_owned();
        tokio::pin!(acquire);
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                permit = &mut acquire => return permit.ok(),
                _ = beat.tick() => {
                    let _ = ctx.record_heartbeat(()).await;
                }
                () = ctx.cancelled() => return None,
            }
        }
    }

    /// The live engine's next report, heartbeating meanwhile: Temporal cancelling the activity
    /// cancels the run, and the worker stopping interrupts it.
    async fn report(&self, ctx: &ActivityContext, run: &Stop, lane: &mut Lane) -> Report {
        self.beating(ctx, run, lane.reports.recv())
            .await
            .unwrap_or(Report::Over)
    }

    /// Lets the lane's engine run the stage it waits before — unless `started`: the activity's unit
    /// runs already — and returns what it reports next.
    async fn drive(
        &self,
        ctx: &ActivityContext,
        run: &Stop,
        lane: &mut Lane,
        started: &mut bool,
    ) -> Report {
        loop {
            let report = match lane.waiting.take() {
                Some(ready) => Report::Ready(ready),
                None => self.report(ctx, run, lane).await,
            };
            match report {
                Report::Ready(ready) if !*started => {
                    // An engine that parked meanwhile reports its end next.
                    if ready.go.send(()).is_err() {
                        continue;
                    }
                    *started = true;
                    return self.report(ctx, run, lane).await;
                }
                report => return report,
            }
        }
    }

    /// Runs the next stage of a sub-workflow's child run on the worker that holds the run, and
    /// says what follows it.
    async fn sub_stage(
        &self,
        ctx: &ActivityContext,
        work: SubStage,
    ) -> Result<SubStageEnd, StageError> {
        self.confined(&work.run_id, &work.runs_dir)
            .await
            .map_err(|reason| RunError::Sandbox { reason })?;
        let Some(_slot) = self.slot(ctx).await else {
            return Err(StageError::Cancelled);
        };
        let held = self.held.lock().get(&work.run_id).and_then(|live| {
            let lane = live.children.lock().remove(&work.node)?;
            Some((live.stop.clone(), live.children.clone(), lane))
        });
        // The child run is not running here (its engine stopped): nothing of it is left to run.
        let Some((run, children, mut lane)) = held else {
            return Ok(SubStageEnd::default());
        };
        let mut started = work.finishing.is_some();
        let mut end = SubStageEnd::default();
        match self.drive(ctx, &run, &mut lane, &mut started).await {
            Report::Ready(next) => {
                end.next = Some(next.node.clone());
                lane.waiting = Some(next);
            }
            Report::FanOut(fan_out) => end.fan_out = Some(fan_out),
            // A child run's own sub-workflows run unpaced; its end is the only other report.
            Report::SubWorkflow(_) | Report::Ended(_) | Report::Over => return Ok(end),
        }
        children.lock().insert(work.node, lane);
        Ok(end)
    }

    /// Opens the run as [`Stages::open`] does. While another engine on this machine still owns the
    /// run's record — one whose worker Temporal counted lost and that has not yet seen so (it
    /// stalled) — waits for it to let go, heartbeating, for a while.
    async fn take_over(
        &self,
        ctx: &ActivityContext,
        work: &NextStage,
        runs_dir: &Path,
    ) -> Result<Result<Live, RunStatus>, RunError> {
        let pause = Duration::from_millis(250);
        let mut waited = Duration::ZERO;
        loop {
            match self.open(work, runs_dir).await {
                Err(RunError::Store(trellis_store::StoreError::Busy { .. }))
                    if waited < OWNER_WAIT && !ctx.is_cancelled() =>
                {
                    let _ = ctx.record_heartbeat(()).await;
                    tokio::time::sleep(pause).await;
                    waited += pause;
                }
                opened => return opened,
            }
        }
    }

    /// Opens the run from its checkpoint and starts its engine; a run that has ended already is
    /// its status.
    async fn open(
        &self,
        work: &NextStage,
        runs_dir: &Path,
    ) -> Result<Result<Live, RunStatus>, RunError> {
        let mut resumable = Resumable::open(&work.run_id, runs_dir).await?;
        if let Some(status) = resumable.finished() {
            return Ok(Err(status));
        }
        // The commands a lost worker on this machine left running are stopped first.
        resumable.reap().await;
        let tree = self.check_out(&mut resumable, &work.run_id).await?;
        let loaded = resumable.load().await?;
        let asked = Arc::new(Mutex::new(None));
        let unanswered: Box<dyn Interviewer> = Box::new(OnTemporal {
            timed_out: work.timed_out.iter().cloned().collect(),
            auto_approve: work.auto_approve,
            asked: asked.clone(),
        });
        let interviewer: Arc<dyn Interviewer> = match &work.answers {
            Some(answers) => Arc::new(Answers::new(
                answers.clone().into_iter().collect::<HashMap<_, _>>(),
                unanswered,
            )),
            None => Arc::from(unanswered),
        };
        let (reports, receiver) = mpsc::unbounded_channel();
        let kept = Arc::new(Mutex::new(None));
        let branches = Arc::new(Branches::default());
        let children = Children::default();
        let stop = Stop::new();
        let wiring = Wiring {
            interviewer,
            subscribers: Vec::new(),
            logged: None,
            sandbox: self.sandbox.clone(),
            pacer: Some(Arc::new(Paced {
                reports: reports.clone(),
                worker: self.stop.token().clone(),
                run: stop.clone(),
                kept: Some(kept.clone()),
                branches: branches.clone(),
                children: Some(children.clone()),
                tree: tree.clone(),
            })),
        };
        let run = resumable.into_run(loaded, wiring).await?;
        trellis_process::note!(
            "run {}: {} from its checkpoint",
            run.id(),
            run.workflow_name()
        );
        let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
        let (engine_stop, held, run_id) = (stop.clone(), self.held.clone(), work.run_id.clone());
        let mut engines = self.engines.lock();
        // The engines that ended are let go of here, not only when the worker stops.
        while engines.try_join_next().is_some() {}
        engines.spawn(async move {
            let ended = Box::pin(run.execute(&engine_stop))
                .await
                .map_err(StageError::from);
            if let Ok(finished) = &ended {
                trellis_process::note!(
                    "run {}: {} after {} stages",
                    finished.run_id,
                    finished.status.as_str(),
                    finished.checkpoint.stage_count
                );
                // The run's tree is on its remote now; the checkout here is not needed again.
                if finished.status.is_finished()
                    && let Some(tree) = tree
                {
                    trellis_process::task::blocking(move || tree.remove()).await;
                }
            }
            // A run that parked while it waited here is no longer held. One that ended is until
            // an activity hears it: the end may come while its branches' activities run, and the
            // fan-out's join hears it after them.
            let parked = matches!(&ended, Ok(finished) if finished.status == RunStatus::Running);
            let mut held = held.lock();
            if parked
                && held
                    .get(&run_id)
                    .is_some_and(|l| l.generation == generation)
            {
                held.remove(&run_id);
            }
            let _ = reports.send(Report::Ended(Box::new(ended)));
        });
        drop(engines);
        Ok(Ok(Live {
            generation,
            stop,
            lane: Lane {
                reports: receiver,
                waiting: None,
                branches,
            },
            asked,
            kept,
            children,
        }))
    }

    /// Checks out the tree of a run kept on git here, as its last saved step left it, for the run
    /// to work in; `None` for a run whose tree every worker shares.
    async fn check_out(
        &self,
        resumable: &mut Resumable,
        run_id: &str,
    ) -> Result<Option<Arc<Checkout>>, RunError> {
        let Some(workspace) = resumable.workspace().cloned() else {
            return Ok(None);
        };
        let (workspaces, run_id) = (self.workspaces.clone(), run_id.to_owned());
        let checkout = trellis_process::task::blocking(move || {
            Checkout::open(&workspaces, &run_id, &workspace)
        })
        .await
        .map_err(|reason| RunError::WorkingTree { reason })?;
        resumable.set_work_dir(checkout.tree().to_path_buf());
        Ok(Some(Arc::new(checkout)))
    }

    /// The end of an activity whose run's engine stopped.
    fn ended(
        &self,
        ended: Result<Finished, StageError>,
        live: &Live,
    ) -> Result<StageEnd, StageError> {
        let finished = ended?;
        let mut end = self.end(
            finished.status,
            finished.error.as_ref().map(ToString::to_string),
        );
        if finished.status == RunStatus::WaitingForInput {
            end.gate = live.asked.lock().take();
        }
        if finished.status == RunStatus::Running
            && let Some((node, until)) = live.kept.lock().take()
        {
            // Parked at a wait: the run goes on with it, here, when its time is up.
            let left = until.duration_since(SystemTime::now()).unwrap_or_default();
            end.next = Some(node);
            end.sleep_ms = Some(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
        }
        Ok(end)
    }

    /// The runs directory of a run an activity names, when it is this worker's and the run is
    /// named by its id: whoever can reach the Temporal service names the run, and only runs in the
    /// directory this worker was given are its to execute.
    async fn confined(&self, run_id: &str, runs_dir: &str) -> Result<PathBuf, String> {
        if !crate::is_run_id(run_id) {
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

    fn end(&self, status: RunStatus, error: Option<String>) -> StageEnd {
        StageEnd {
            status,
            error,
            queue: self.queue.clone(),
            worker: self.identity.clone(),
            gate: None,
            next: None,
            sleep_ms: None,
            fan_out: None,
            sub_workflow: None,
        }
    }
}

/// How long a worker taking a run over waits for a stalled engine on its machine to let go of it.
const OWNER_WAIT: Duration = Duration::from_secs(15);

/// How long an activity asks Temporal why it was cancelled before it takes it for a loss.
const ASK_WHY: Duration = Duration::from_secs(3);

/// Whether the activity was cancelled by its workflow — the run is to stop — rather than let go of
/// by Temporal, which no longer knows it: its heartbeats came too late (the worker stalled or was
/// cut off), the workflow counted the worker lost, and the run goes on elsewhere from its
/// checkpoint. Asks the service how the workflow's pending activity stands; when it cannot tell,
/// the run is interrupted, which loses nothing.
async fn cancelled_by_workflow(ctx: &ActivityContext) -> bool {
    use temporalio_common::protos::temporal::api::enums::v1::PendingActivityState;
    let Some(workflow) = ctx.workflow_handle::<TrellisRun>() else {
        return false;
    };
    let described = tokio::time::timeout(
        ASK_WHY,
        workflow.describe(temporalio_client::WorkflowDescribeOptions::default()),
    )
    .await;
    let Ok(Ok(described)) = described else {
        return false;
    };
    let id = &ctx.info().activity_id;
    described
        .raw_description
        .pending_activities
        .iter()
        .any(|a| &a.activity_id == id && a.state() == PendingActivityState::CancelRequested)
}

/// Whether an engine ended by parking between two stages for want of its next stage's activity
/// (not at a wait whose time the workflow keeps).
fn parked_idle(ended: &Result<Finished, StageError>, live: &Live) -> bool {
    matches!(ended, Ok(f) if f.status == RunStatus::Running) && live.kept.lock().is_none()
}

/// A held run's engine between two stages: it says it is ready for the next one and waits for
/// that stage's activity — not longer than [`IDLE`], nor once the worker stops. A wait's time is
/// kept by the run's workflow (a Temporal timer), not here.
struct Paced {
    reports: mpsc::UnboundedSender<Report>,
    worker: trellis_engine::CancellationToken,
    /// The run's: a child's stage or a branch waiting for its activity when the worker stops
    /// interrupts it.
    run: Stop,
    /// The wait whose time the workflow is to keep: its node and end. `None` paces a child run:
    /// it never parks (it would start over), and its waits count down in its engine.
    kept: Option<Kept>,
    branches: Arc<Branches>,
    /// Where the run's sub-workflows' child runs are paced; `None` in a child run, whose own
    /// sub-workflows run unpaced within their stage.
    children: Option<Children>,
    /// The run's working tree, when it is kept on a git remote: saved there before each step.
    tree: Option<Arc<Checkout>>,
}

impl Paced {
    /// Waits for `until`; the worker stopping meanwhile interrupts the run, whose stopping drops
    /// this wait with the rest of the engine's walk.
    async fn unless_stopped<T>(&self, until: impl Future<Output = T>) -> T {
        tokio::select! {
            out = until => out,
            () = self.worker.cancelled() => {
                self.run.interrupt();
                std::future::pending().await
            }
        }
    }
}

#[async_trait::async_trait]
impl Pacer for Paced {
    async fn next_stage(&self, node: &str) -> Pace {
        let (go, permit) = oneshot::channel();
        let ready = Ready {
            node: node.to_owned(),
            go,
        };
        if self.reports.send(Report::Ready(ready)).is_err() {
            return Pace::Park;
        }
        if self.kept.is_none() {
            // A child run's stage waits for its activity however long it takes.
            return match self.unless_stopped(permit).await {
                Ok(()) => Pace::Go,
                Err(_) => Pace::Park,
            };
        }
        tokio::select! {
            permitted = tokio::time::timeout(IDLE, permit) => match permitted {
                Ok(Ok(())) => Pace::Go,
                _ => Pace::Park,
            },
            () = self.worker.cancelled() => Pace::Park,
        }
    }

    fn keeps_time(&self, node: &str, until: SystemTime) -> bool {
        let Some(kept) = &self.kept else {
            return false;
        };
        *kept.lock() = Some((node.to_owned(), until));
        true
    }

    fn sub_workflow(&self, node: &str) -> Option<(Arc<dyn Pacer>, Lease)> {
        let children = self.children.as_ref()?;
        let (reports, receiver) = mpsc::unbounded_channel();
        let branches = Arc::new(Branches::default());
        children.lock().insert(
            node.to_owned(),
            Lane {
                reports: receiver,
                waiting: None,
                branches: branches.clone(),
            },
        );
        let _ = self.reports.send(Report::SubWorkflow(node.to_owned()));
        let over = reports.clone();
        let child = Paced {
            reports,
            worker: self.worker.clone(),
            run: self.run.clone(),
            kept: None,
            branches,
            children: None,
            tree: self.tree.clone(),
        };
        let lease = Lease::new(move |_| {
            let _ = over.send(Report::Over);
        });
        Some((Arc::new(child), lease))
    }

    fn fan_out(&self, node: &str, branches: &[String]) -> Lease {
        if branches.is_empty() {
            return Lease::none();
        }
        self.branches.open(node);
        let _ = self.reports.send(Report::FanOut(FanOut {
            node: node.to_owned(),
            branches: branches.to_vec(),
        }));
        let (meeting, node) = (self.branches.clone(), node.to_owned());
        Lease::new(move |_| meeting.close(&node))
    }

    async fn saving(&self) -> Result<(), String> {
        let Some(tree) = self.tree.clone() else {
            return Ok(());
        };
        trellis_process::task::blocking(move || tree.save()).await
    }

    async fn next_branch(&self, node: &str, branch: &str) -> Lease {
        match self.unless_stopped(self.branches.ask(node, branch)).await {
            Ok(done) => Lease::new(move |status| {
                let _ = done.send(status);
            }),
            // The branch's activity let go of it without a word (it was cancelled while it waited
            // for a slot): the branch runs unpaced, and the run's cancellation follows.
            Err(_) => Lease::none(),
        }
    }
}

/// Where the branches of a held run's fan-outs meet their activities: the engine asks for a
/// branch when its turn comes, the branch's activity arrives when Temporal starts it, whichever is
/// first waits for the other; then the activity lets the branch run, and hears how it ended.
#[derive(Default)]
struct Branches {
    meetings: Mutex<BranchMeetings>,
}

#[derive(Default)]
struct BranchMeetings {
    /// The fan-outs whose branches may still be asked for.
    open: std::collections::HashSet<String>,
    /// By fan-out and branch: who came first.
    waiting: HashMap<(String, String), Meeting>,
}

/// Sends the activity's end of a branch to the engine when the branch may run.
type Go = oneshot::Sender<oneshot::Sender<Option<StageStatus>>>;

enum Meeting {
    /// The engine asked for the branch: the activity lets it run with this.
    Asked(Go),
    /// The activity arrived: it hears through this when the engine asks for the branch.
    Arrived(oneshot::Sender<Go>),
}

impl Branches {
    fn open(&self, node: &str) {
        self.meetings.lock().open.insert(node.to_owned());
    }

    /// The fan-out is over: the activities of branches it did not ask for hear so.
    fn close(&self, node: &str) {
        let mut meetings = self.meetings.lock();
        meetings.open.remove(node);
        meetings.waiting.retain(|(fan_out, _), _| fan_out != node);
    }

    /// The engine asks for a branch: it may run once the answer comes.
    fn ask(
        &self,
        node: &str,
        branch: &str,
    ) -> oneshot::Receiver<oneshot::Sender<Option<StageStatus>>> {
        let (go, permit) = oneshot::channel();
        let key = (node.to_owned(), branch.to_owned());
        let mut meetings = self.meetings.lock();
        match meetings.waiting.remove(&key) {
            Some(Meeting::Arrived(arrived)) => {
                let _ = arrived.send(go);
            }
            _ => {
                meetings.waiting.insert(key, Meeting::Asked(go));
            }
        }
        permit
    }

    /// A branch's activity arrives: it hears when the engine asks for the branch — at once when it
    /// did already — and nothing when the fan-out is not (or no longer) running it.
    fn arrive(&self, node: &str, branch: &str) -> Option<oneshot::Receiver<Go>> {
        let (arrived, asked) = oneshot::channel();
        let key = (node.to_owned(), branch.to_owned());
        let mut meetings = self.meetings.lock();
        if !meetings.open.contains(node) {
            return None;
        }
        match meetings.waiting.remove(&key) {
            Some(Meeting::Asked(go)) => {
                let _ = arrived.send(go);
            }
            _ => {
                meetings.waiting.insert(key, Meeting::Arrived(arrived));
            }
        }
        Some(asked)
    }
}

/// Who answers a gate on a worker when the answers given do not: nobody, now — the run stops and
/// waits for a signal, with the gate's timeout as a Temporal timer (the gate it asked is kept for
/// the stage's end) — unless that timer already ran out (the gate takes its default) or the run
/// was started with `--auto-approve` (the first option).
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
    // Checkouts of runs that ended while this worker was away are not needed again.
    let (workspaces, runs_dir) = (config.workspaces.clone(), config.runs_dir.clone());
    trellis_process::task::blocking(move || {
        crate::workspace::tidy(&workspaces, |run_id| {
            RunDir::open(run_id, &runs_dir)
                .and_then(|record| record.meta())
                .map_or(true, |meta| meta.status.is_finished())
        });
    })
    .await;
    let stages = Stages {
        queue: format!("{}/{identity}", config.target.task_queue),
        identity: identity.clone(),
        sandbox: config.sandbox,
        stop: Stop::new(),
        runs_dir: config.runs_dir,
        workspaces: config.workspaces,
        held: Arc::default(),
        slots: Arc::new(Semaphore::new(config.slots.max(1))),
        engines: Arc::default(),
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
        .register_workflow::<TrellisSubRun>()?
        .register_activities(stages.clone())
        .tuner(tuner())
        // A run's next decision waits on this worker's sticky queue for no longer than its stage
        // waits for a heartbeat: when the worker died, another takes the decision over as soon as
        // the stage counts as lost (the SDK's default, 10 s, doubled the time a handover took).
        .sticky_queue_schedule_to_start_timeout(HEARTBEAT_TIMEOUT)
        .client_identity_override(identity.clone())
        .graceful_shutdown_period(Duration::from_secs(5))
        .build();
    let own = WorkerOptions::new(stages.queue.clone())
        .register_activities(stages.clone())
        .tuner(tuner())
        .client_identity_override(identity.clone())
        .graceful_shutdown_period(Duration::from_secs(5))
        .build();
    // A branch's activity waits on the worker for its turn (the fan-out's `max_parallel`, then a
    // slot), so any number of them may be taken at once.
    let branches = WorkerOptions::new(branch_queue(&stages.queue))
        .register_activities(stages.clone())
        .tuner(
            TunerHolder::builder()
                .workflow_task_slot_supplier(FixedSizeSlotSupplier::new(1))
                .activity_task_slot_supplier(FixedSizeSlotSupplier::new(BRANCHES_AT_ONCE))
                .local_activity_task_slot_supplier(FixedSizeSlotSupplier::new(1))
                .nexus_task_slot_supplier(FixedSizeSlotSupplier::new(1))
                .build(),
        )
        .client_identity_override(identity.clone())
        .graceful_shutdown_period(Duration::from_secs(5))
        .build();
    let mut shared = Worker::new(&runtime, client.clone(), shared)?;
    let mut own = Worker::new(&runtime, client.clone(), own)?;
    let mut branches = Worker::new(&runtime, client, branches)?;
    let stops = [
        shared.shutdown_handle(),
        own.shutdown_handle(),
        branches.shutdown_handle(),
    ];
    started(&identity);
    let workers = async { tokio::try_join!(shared.run(), own.run(), branches.run()) };
    tokio::pin!(workers);
    tokio::select! {
        ran = &mut workers => { ran?; }
        () = shutdown => {
            stages.stop.interrupt();
            for stop in stops {
                stop();
            }
            workers.await?;
        }
    }
    // The engines this worker held have parked their runs (or were interrupted): their records
    // are written before the worker goes.
    let mut engines = std::mem::take(&mut *stages.engines.lock());
    while engines.join_next().await.is_some() {}
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
