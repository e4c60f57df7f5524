//! The Temporal workflow of one Trellis run, and the messages between it and the workers.
//!
//! The workflow holds no routing rules of its own: each of its activities is one stage of the run's
//! main track (or one branch of a fan-out there, run concurrently with its siblings), run by the
//! engine (its own step function and routing) on the worker that holds the run, which says how the
//! run stands after it: at which stage it goes on, or how it stopped. Everything the workflow
//! decides — which queue the next stage goes to, whether the worker was lost, waiting for an answer
//! — depends only on those recorded results, signals and timers, so the workflow replays. A
//! sub-workflow on the main track is a child workflow, [`TrellisSubRun`], driven the same way.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use temporalio_common::protos::temporal::api::common::v1::RetryPolicy;
use temporalio_common::protos::temporal::api::failure::v1::Failure;
use temporalio_common::protos::temporal::api::failure::v1::failure::FailureInfo;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{
    ActivityCancellationType, ActivityExecutionError, ActivityOptions, ApplicationFailure,
    ChildWorkflowOptions, ContinueAsNewOptions, SyncWorkflowContext, WorkflowCancellationToken,
    WorkflowContext, WorkflowContextView, WorkflowResult, WorkflowTermination,
};
use trellis_engine::RunStatus;
use trellis_workflow::StageStatus;

use crate::worker::Stages;

/// How long a worker may go without a heartbeat before its stage counts as lost. Workers send
/// one every second while a stage runs.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a stage may wait on the queue of the worker that holds the run before another worker
/// takes the run over.
pub const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a run may lose its worker before the workflow gives up on it.
pub const MAX_LOST_WORKERS: u32 = 5;

/// What a run's workflow is started with: the run record (created by the submitter, in a runs
/// directory every worker reaches at the same path).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInput {
    pub run_id: String,
    pub runs_dir: String,
    /// Answers given up front (`trellis run --answers`), by the gate's node id.
    #[serde(default)]
    pub answers: Option<BTreeMap<String, String>>,
    /// Every gate without an answer takes its first option (`--auto-approve`).
    #[serde(default)]
    pub auto_approve: bool,
    /// Where an earlier execution of the workflow left the run when its history grew long and it
    /// continued as a new one.
    #[serde(default)]
    pub carried: Option<Carried>,
}

/// What a workflow execution hands to the one it continues as: the worker that holds the run, the
/// stage it goes on with, and the figures so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Carried {
    pub held_by: Option<String>,
    pub next: Option<String>,
    pub workers: Vec<String>,
    pub handovers: u32,
}

/// How a run's workflow ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunEnd {
    pub status: RunStatus,
    /// Why the run failed, as the engine said.
    pub error: Option<String>,
    /// The workers that held it, in order: a worker is named again each time it takes the run up
    /// (at the start, after a gate, after another worker was lost).
    pub workers: Vec<String>,
    /// How many times its worker was lost and another took the run over.
    pub handovers: u32,
}

/// A run's next stage, sent to a worker: the one that holds the run runs it with the run's live
/// engine; any other opens the run from its checkpoint first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NextStage {
    pub run_id: String,
    pub runs_dir: String,
    /// The answers to human gates given up front and those that arrived while it waited (by the
    /// gate's node id).
    pub answers: Option<BTreeMap<String, String>>,
    /// Gates without an answer take their first option.
    #[serde(default)]
    pub auto_approve: bool,
    /// Gates whose timeout ran out on Temporal's timer: they take their default.
    #[serde(default)]
    pub timed_out: Vec<String>,
    /// The fan-out whose branches ran as activities of their own, or the sub-workflow whose child
    /// run's stages did: this activity finishes its stage on the worker that holds the run, and
    /// does not start the next one.
    #[serde(default)]
    pub finishing: Option<String>,
}

/// The next stage of a sub-workflow's child run, sent to the worker that holds the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubStage {
    pub run_id: String,
    pub runs_dir: String,
    /// The sub-workflow's node in the run.
    pub node: String,
    /// The child run's fan-out whose branches ran: this activity finishes its stage.
    #[serde(default)]
    pub finishing: Option<String>,
}

/// What follows a stage of a child run: its next stage, a fan-out's branches, or — neither — the
/// child run's end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SubStageEnd {
    pub next: Option<String>,
    pub fan_out: Option<FanOut>,
}

/// What a sub-workflow's child workflow is started with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubInput {
    pub run_id: String,
    pub runs_dir: String,
    /// The sub-workflow's node in the run.
    pub node: String,
    /// The queue of the worker that holds the run: the child run's engine is there.
    pub queue: String,
}

/// How a sub-workflow's child workflow ended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum SubEnd {
    /// The child run ended; its sub-workflow's stage goes on in the parent.
    Over,
    /// The worker that holds the run was lost.
    Lost,
    Cancelled,
}

/// A branch of a fan-out on a run's main track, sent to the worker that holds the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BranchWork {
    pub run_id: String,
    pub runs_dir: String,
    /// The fan-out node.
    pub node: String,
    /// The branch: the id of its first node.
    pub branch: String,
    /// The sub-workflow whose child run the fan-out is in, when it is in one.
    #[serde(default)]
    pub sub_workflow: Option<String>,
}

/// How a branch's activity ended: with the branch's status, or none when the branch did not run
/// to its end in the fan-out (the join policy was met without it, or the run stopped).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BranchEnd {
    pub status: Option<StageStatus>,
}

/// The branches a fan-out on the main track is about to run, each an activity of its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FanOut {
    pub node: String,
    pub branches: Vec<String>,
}

/// A status to record for a run no stage is running (cancelled while it waited).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settle {
    pub run_id: String,
    pub runs_dir: String,
    pub status: RunStatus,
}

/// How the run stands after a stage, and where its working state now is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageEnd {
    pub status: RunStatus,
    pub error: Option<String>,
    /// The task queue only the worker that ran the stage polls: the run's next stage goes there.
    pub queue: String,
    /// That worker's identity.
    pub worker: String,
    /// The gate the run waits at, when it waits.
    #[serde(default)]
    pub gate: Option<WaitingGate>,
    /// The stage the run goes on with, when the stage ran and the run goes on: its engine waits for
    /// it on the worker that holds the run.
    #[serde(default)]
    pub next: Option<String>,
    /// How long the run waits before it goes on with `next`: a wait node's time, kept by the
    /// workflow as a durable timer (the run is parked, no worker holds it meanwhile).
    #[serde(default)]
    pub sleep_ms: Option<u64>,
    /// The fan-out the stage started, when it is one: its branches are the workflow's to start,
    /// then its join.
    #[serde(default)]
    pub fan_out: Option<FanOut>,
    /// The sub-workflow the stage started its child run at, when it is one: the child run's stages
    /// are a child workflow's, then the stage ends.
    #[serde(default)]
    pub sub_workflow: Option<String>,
}

/// A gate a run stopped at, and how long it may wait for an answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WaitingGate {
    pub node: String,
    /// The gate's `timeout`: when no answer came by then, the gate takes its default.
    pub timeout_ms: Option<u64>,
}

/// A Trellis run on Temporal. Its id is the run's id.
#[workflow]
#[derive(Default)]
pub struct TrellisRun {
    /// Answers signalled while the run waits for a human gate.
    answers: Option<BTreeMap<String, String>>,
    /// The gate the run waits at, while it does.
    gate: Option<WaitingGate>,
}

#[workflow_methods]
impl TrellisRun {
    #[run]
    pub async fn run(ctx: &mut WorkflowContext<Self>, input: RunInput) -> WorkflowResult<RunEnd> {
        let mut run = Holding::new(input.carried.clone());
        let mut answers = input.answers.clone();
        let mut timed_out: Vec<String> = Vec::new();
        let mut finishing: Option<String> = None;
        // The child workflows this execution started, which number them.
        let mut children = 0u32;
        loop {
            let work = NextStage {
                run_id: input.run_id.clone(),
                runs_dir: input.runs_dir.clone(),
                answers: answers.clone(),
                auto_approve: input.auto_approve,
                timed_out: timed_out.clone(),
                finishing: finishing.take(),
            };
            let options = stage_options(
                run.held_by.as_deref(),
                work.finishing.as_deref(),
                run.next.as_deref(),
            );
            let done = match ctx.execute_activity(Stages::advance, work, options).await {
                Ok(done) => done,
                Err(ActivityExecutionError::Cancelled(_)) => {
                    // A stage that ran recorded the cancellation; a run that waited between
                    // two stages is cancelled by the worker that holds it.
                    let held_by = run.held_by.clone();
                    return cancelled(ctx, &input, held_by.as_deref(), run.end).await;
                }
                Err(lost) if worker_lost(&lost) => {
                    // The worker died, or nobody polls its queue any more: any worker resumes the
                    // run from its checkpoint, re-running the stage that was interrupted.
                    run.handed_over(&input.run_id)?;
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            // The answers and timeouts were the stage's to use (a lost stage's go to the next).
            answers.clone_from(&input.answers);
            timed_out.clear();
            run.ran(&done);
            if done.fan_out.is_some() || done.sub_workflow.is_some() {
                // The branches run concurrently, each an activity on the worker that holds the
                // run, or the child run's stages as a child workflow's activities there; then the
                // stage ends there (the fan-out's join).
                let held_by = run.held_by.clone().unwrap_or_default();
                let (node, ran) = run_units(ctx, &input, &held_by, &done, &mut children).await;
                match ran {
                    Branched::Ran => finishing = Some(node),
                    Branched::Lost => run.handed_over(&input.run_id)?,
                    Branched::Cancelled => {
                        return cancelled(ctx, &input, Some(&held_by), run.end).await;
                    }
                    Branched::Failed(error) => return Err(*error),
                }
                continue;
            }
            if let Some(ms) = done.sleep_ms {
                // Any worker may go on after the timer; the one that parked the run first.
                run.taken_up = true;
                if let temporalio_sdk::TimerResult::Cancelled =
                    ctx.timer(Duration::from_millis(ms)).await
                {
                    return cancelled(ctx, &input, None, run.end).await;
                }
                continue;
            }
            if run.next.is_some() {
                // Between two stages, a history Temporal finds long goes on in a new execution
                // (same workflow id: followers, signals and cancellation reach it).
                if ctx.continue_as_new_suggested() {
                    let input = RunInput {
                        carried: Some(run.carried()),
                        ..input
                    };
                    let Err(continued) =
                        ctx.continue_as_new(input, ContinueAsNewOptions::default());
                    return Err(continued);
                }
                continue;
            }
            match done.status {
                RunStatus::WaitingForInput => {
                    run.taken_up = true;
                    match wait_at_gate(ctx, done.gate).await {
                        Waited::Answered(given) => answers.get_or_insert_default().extend(given),
                        Waited::TimedOut(gate) => timed_out.push(gate),
                        // Cancelled while nothing runs: the record says so too.
                        Waited::Cancelled => return cancelled(ctx, &input, None, run.end).await,
                    }
                }
                // The worker was stopped mid-stage (its own shutdown) or let the run go between
                // two stages: another takes over.
                RunStatus::Interrupted | RunStatus::Running => {
                    run.held_by = None;
                    run.taken_up = true;
                    run.end.handovers += 1;
                }
                status => {
                    run.end.status = status;
                    run.end.error = done.error;
                    return Ok(run.end);
                }
            }
        }
    }

    /// Answers to the run's human gates (node id → answer), from `trellis resume --answers` or the
    /// web app.
    #[signal]
    pub fn answer(
        &mut self,
        _ctx: &mut SyncWorkflowContext<Self>,
        answers: BTreeMap<String, String>,
    ) {
        self.answers.get_or_insert_default().extend(answers);
    }

    /// The gate the run waits at, if it waits.
    #[query]
    pub fn gate(&self, _ctx: &WorkflowContextView) -> Option<WaitingGate> {
        self.gate.clone()
    }
}

/// Where a run is, as its workflow follows it from stage to stage.
struct Holding {
    /// The queue of the worker that holds the run, when one does.
    held_by: Option<String>,
    /// The stage the run goes on with, when known.
    next: Option<String>,
    /// The next worker to run a stage takes the run up (it is named in `workers` even when it held
    /// the run before).
    taken_up: bool,
    end: RunEnd,
}

impl Holding {
    fn new(carried: Option<Carried>) -> Self {
        let taken_up = carried.is_none();
        let carried = carried.unwrap_or(Carried {
            held_by: None,
            next: None,
            workers: Vec::new(),
            handovers: 0,
        });
        Self {
            held_by: carried.held_by,
            next: carried.next,
            taken_up,
            end: RunEnd {
                status: RunStatus::Running,
                error: None,
                workers: carried.workers,
                handovers: carried.handovers,
            },
        }
    }

    /// A stage ran: its worker holds the run.
    fn ran(&mut self, done: &StageEnd) {
        if self.taken_up || self.end.workers.last() != Some(&done.worker) {
            self.end.workers.push(done.worker.clone());
        }
        self.taken_up = false;
        self.held_by = Some(done.queue.clone());
        self.next.clone_from(&done.next);
    }

    /// The worker was lost: any worker takes the run over at the stage it was running — unless
    /// that happened too often.
    fn handed_over(&mut self, run_id: &str) -> WorkflowResult<()> {
        self.held_by = None;
        self.taken_up = true;
        self.end.handovers += 1;
        if self.end.handovers > MAX_LOST_WORKERS {
            return Err(ApplicationFailure::non_retryable(format!(
                "run {run_id} lost its worker {} times; giving up",
                self.end.handovers
            ))
            .into());
        }
        Ok(())
    }

    fn carried(self) -> Carried {
        Carried {
            held_by: self.held_by,
            next: self.next,
            workers: self.end.workers,
            handovers: self.end.handovers,
        }
    }
}

/// The end of a run cancelled while no stage ran to record it: the record says so too.
async fn cancelled(
    ctx: &mut WorkflowContext<TrellisRun>,
    input: &RunInput,
    held_by: Option<&str>,
    mut end: RunEnd,
) -> WorkflowResult<RunEnd> {
    settle(ctx, input, held_by).await?;
    end.status = RunStatus::Cancelled;
    Ok(end)
}

/// How a wait at a gate ended.
enum Waited {
    Answered(BTreeMap<String, String>),
    /// The gate (its node id) takes its default.
    TimedOut(String),
    Cancelled,
}

/// Waits for answers to the gate the run stopped at, or for its timeout — a durable timer: when it
/// fires first, the next stage gives the gate its default.
async fn wait_at_gate(ctx: &mut WorkflowContext<TrellisRun>, gate: Option<WaitingGate>) -> Waited {
    ctx.state_mut(|s| s.gate.clone_from(&gate));
    let limit = gate.as_ref().and_then(|g| g.timeout_ms);
    let waited = match limit {
        Some(ms) => {
            temporalio_sdk::workflows::select! {
                answered = ctx.wait_condition(|s: &TrellisRun| s.answers.is_some()) => answered.map(|()| true),
                _ = ctx.timer(Duration::from_millis(ms)) => Ok(false),
            }
        }
        None => ctx
            .wait_condition(|s| s.answers.is_some())
            .await
            .map(|()| true),
    };
    ctx.state_mut(|s| s.gate = None);
    match waited {
        Ok(true) => Waited::Answered(ctx.state_mut(|s| s.answers.take()).unwrap_or_default()),
        Ok(false) => gate.map_or(Waited::Cancelled, |g| Waited::TimedOut(g.node)),
        Err(_) => Waited::Cancelled,
    }
}

/// A stage's options: on the queue of the worker that holds the run when there is one (with a limit
/// on how long it may wait there), else on the shared queue. Temporal never retries a stage: a lost
/// worker is the workflow's to handle, and a failed stage is the engine's (its own retries). The
/// activity's summary names the stage when it is known (Temporal's UI shows it).
fn stage_options(
    held_by: Option<&str>,
    finishing: Option<&str>,
    next: Option<&str>,
) -> ActivityOptions {
    let summary = match (finishing, next) {
        (Some(node), _) => format!("end of {node}"),
        (None, Some(node)) => format!("stage {node}"),
        (None, None) => "open the run at its checkpoint and run its next stage".to_owned(),
    };
    unit_options(held_by.map(str::to_owned), summary)
}

/// The options of a unit of a run's work: a stage, a branch or a join. See [`stage_options`].
fn unit_options(queue: Option<String>, summary: String) -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_hours(30 * 24))
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .maybe_schedule_to_start_timeout(queue.as_ref().map(|_| HANDOVER_TIMEOUT))
        .maybe_task_queue(queue)
        .cancellation_type(ActivityCancellationType::WaitCancellationCompleted)
        .retry_policy(RetryPolicy {
            maximum_attempts: 1,
            ..RetryPolicy::default()
        })
        .summary(summary)
        .build()
}

/// The queue a worker takes the branches of the runs it holds from, given the queue of its own:
/// apart from its stages, since a branch's activity waits there for its turn under the fan-out's
/// `max_parallel` and the worker's slots, and must not keep a stage from starting meanwhile.
pub fn branch_queue(queue: &str) -> String {
    format!("{queue}/branches")
}

/// How a fan-out's branches or a sub-workflow's child run ended.
enum Branched {
    /// Each branch ran (or was left out by the fan-out), or the child run ended: the stage's end
    /// is next.
    Ran,
    /// The worker that holds the run was lost.
    Lost,
    Cancelled,
    Failed(Box<WorkflowTermination>),
}

/// Where a run's units run: the run, and the queue of the worker that holds it; inside a
/// sub-workflow's child run, that sub-workflow.
struct Place<'a> {
    run_id: &'a str,
    runs_dir: &'a str,
    held_by: &'a str,
    sub_workflow: Option<&'a str>,
}

impl<'a> Place<'a> {
    fn new(
        run_id: &'a str,
        runs_dir: &'a str,
        held_by: &'a str,
        sub_workflow: Option<&'a str>,
    ) -> Self {
        Self {
            run_id,
            runs_dir,
            held_by,
            sub_workflow,
        }
    }
}

/// Runs what the stage `done` started as units of their own on the worker that holds the run
/// (queue `held_by`): a fan-out's branches, or a sub-workflow's child run (the `children`th child
/// workflow this execution starts). Returns the stage's node and how they ended.
async fn run_units(
    ctx: &mut WorkflowContext<TrellisRun>,
    input: &RunInput,
    held_by: &str,
    done: &StageEnd,
    children: &mut u32,
) -> (String, Branched) {
    if let Some(fan_out) = &done.fan_out {
        let place = Place::new(&input.run_id, &input.runs_dir, held_by, None);
        return (
            fan_out.node.clone(),
            run_branches(ctx, &place, fan_out).await,
        );
    }
    let node = done.sub_workflow.clone().unwrap_or_default();
    *children += 1;
    let ran = run_sub_workflow(ctx, input, held_by, &node, *children).await;
    (node, ran)
}

/// Runs `fan_out`'s branches at once, each an activity on the worker that holds the run, and
/// waits for them all.
async fn run_branches<W>(
    ctx: &mut WorkflowContext<W>,
    place: &Place<'_>,
    fan_out: &FanOut,
) -> Branched {
    let branches = fan_out.branches.iter().map(|branch| {
        let work = BranchWork {
            run_id: place.run_id.to_owned(),
            runs_dir: place.runs_dir.to_owned(),
            node: fan_out.node.clone(),
            branch: branch.clone(),
            sub_workflow: place.sub_workflow.map(str::to_owned),
        };
        let within = place
            .sub_workflow
            .map_or_else(String::new, |node| format!(" in {node}"));
        let options = unit_options(
            Some(branch_queue(place.held_by)),
            format!("branch {branch} of {}{within}", fan_out.node),
        );
        ctx.execute_activity(Stages::branch, work, options)
    });
    let ended = temporalio_sdk::workflows::join_all(branches).await;
    let mut outcome = Branched::Ran;
    for end in ended {
        match end {
            Ok(_) => {}
            Err(ActivityExecutionError::Cancelled(_)) => return Branched::Cancelled,
            Err(lost) if worker_lost(&lost) => outcome = Branched::Lost,
            Err(error) => {
                if matches!(outcome, Branched::Ran) {
                    outcome = Branched::Failed(Box::new(error.into()));
                }
            }
        }
    }
    outcome
}

/// Runs the child run of the sub-workflow at `node` as a child workflow (the `number`th this
/// execution started), whose activities are its stages on the worker that holds the run.
async fn run_sub_workflow(
    ctx: &mut WorkflowContext<TrellisRun>,
    input: &RunInput,
    held_by: &str,
    node: &str,
    number: u32,
) -> Branched {
    let child = SubInput {
        run_id: input.run_id.clone(),
        runs_dir: input.runs_dir.clone(),
        node: node.to_owned(),
        queue: held_by.to_owned(),
    };
    let options = ChildWorkflowOptions::builder()
        .workflow_id(format!("{}/{node}/{number}", input.run_id))
        .static_summary(format!("sub-workflow {node}"))
        .build();
    let started = match ctx
        .start_child_workflow(TrellisSubRun::run, child, options)
        .await
    {
        Ok(started) => started,
        Err(error) => return Branched::Failed(Box::new(error.into())),
    };
    match started.result().await {
        Ok(SubEnd::Over) => Branched::Ran,
        Ok(SubEnd::Lost) => Branched::Lost,
        Ok(SubEnd::Cancelled) => Branched::Cancelled,
        Err(error) if error.failure().is_some_and(cancelled_failure) => Branched::Cancelled,
        Err(error) => Branched::Failed(Box::new(error.into())),
    }
}

/// Whether a failure says something was cancelled.
fn cancelled_failure(failure: &Failure) -> bool {
    std::iter::successors(Some(failure), |f| f.cause.as_deref())
        .any(|f| matches!(f.failure_info, Some(FailureInfo::CanceledFailureInfo(_))))
}

/// The child run of a sub-workflow on a Trellis run's main track, whose stages (and its fan-outs'
/// branches) are its activities, on the worker that holds the run. Its id is
/// `RUN/NODE/N`.
#[workflow]
#[derive(Default)]
pub struct TrellisSubRun;

#[workflow_methods]
impl TrellisSubRun {
    #[run]
    pub async fn run(ctx: &mut WorkflowContext<Self>, input: SubInput) -> WorkflowResult<SubEnd> {
        let place = Place::new(
            &input.run_id,
            &input.runs_dir,
            &input.queue,
            Some(&input.node),
        );
        let mut next: Option<String> = None;
        let mut finishing: Option<String> = None;
        loop {
            let summary = match (&finishing, &next) {
                (Some(fan_out), _) => format!("end of {fan_out} in {}", input.node),
                (None, Some(stage)) => format!("stage {stage} of {}", input.node),
                (None, None) => format!("the first stage of {}", input.node),
            };
            let work = SubStage {
                run_id: input.run_id.clone(),
                runs_dir: input.runs_dir.clone(),
                node: input.node.clone(),
                finishing: finishing.take(),
            };
            let options = unit_options(Some(input.queue.clone()), summary);
            let done = match ctx
                .execute_activity(Stages::child_stage, work, options)
                .await
            {
                Ok(done) => done,
                Err(ActivityExecutionError::Cancelled(_)) => return Ok(SubEnd::Cancelled),
                Err(lost) if worker_lost(&lost) => return Ok(SubEnd::Lost),
                Err(error) => return Err(error.into()),
            };
            if let Some(fan_out) = &done.fan_out {
                match run_branches(ctx, &place, fan_out).await {
                    Branched::Ran => finishing = Some(fan_out.node.clone()),
                    Branched::Lost => return Ok(SubEnd::Lost),
                    Branched::Cancelled => return Ok(SubEnd::Cancelled),
                    Branched::Failed(error) => return Err(*error),
                }
                continue;
            }
            match done.next {
                Some(stage) => next = Some(stage),
                None => return Ok(SubEnd::Over),
            }
        }
    }
}

/// Records `input`'s run as cancelled: through the worker that holds it when there is one (its
/// engine may wait there between two stages), else — or when that worker is gone — on any worker.
async fn settle(
    ctx: &mut WorkflowContext<TrellisRun>,
    input: &RunInput,
    held_by: Option<&str>,
) -> WorkflowResult<()> {
    let settle = Settle {
        run_id: input.run_id.clone(),
        runs_dir: input.runs_dir.clone(),
        status: RunStatus::Cancelled,
    };
    if held_by.is_some() {
        match ctx
            .execute_activity(Stages::settle, settle.clone(), settle_options(held_by))
            .await
        {
            Err(lost) if worker_lost(&lost) => {}
            settled => return Ok(settled?),
        }
    }
    ctx.execute_activity(Stages::settle, settle, settle_options(None))
        .await?;
    Ok(())
}

/// Recording a status is quick, and done even though the workflow was cancelled.
fn settle_options(held_by: Option<&str>) -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_mins(1))
        .cancellation_token(WorkflowCancellationToken::new())
        .maybe_task_queue(held_by.map(str::to_owned))
        .maybe_schedule_to_start_timeout(held_by.map(|_| HANDOVER_TIMEOUT))
        .retry_policy(RetryPolicy {
            maximum_attempts: 1,
            ..RetryPolicy::default()
        })
        .build()
}

/// Whether a stage failed because its worker went away: its heartbeats stopped, or it never
/// picked the stage up.
fn worker_lost(error: &ActivityExecutionError) -> bool {
    let Some(failure) = error.failure() else {
        return false;
    };
    std::iter::successors(Some(failure), |f| f.cause.as_deref())
        .any(|f| matches!(f.failure_info, Some(FailureInfo::TimeoutFailureInfo(_))))
}
