//! The Temporal workflow of one Trellis run, and the messages between it and the workers.
//!
//! The workflow holds no routing rules of its own: it hands the run to a worker, which executes it
//! with the engine from its checkpoint (the engine's own step function and routing) until the run
//! ends or stops for a human answer, and says how it stopped. Everything the workflow decides —
//! which queue to send the next segment to, whether the worker was lost, waiting for an answer —
//! depends only on those recorded results and on signals, so the workflow replays.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use temporalio_common::protos::temporal::api::common::v1::RetryPolicy;
use temporalio_common::protos::temporal::api::failure::v1::failure::FailureInfo;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::{
    ActivityCancellationType, ActivityExecutionError, ActivityOptions, ApplicationFailure,
    SyncWorkflowContext, WorkflowCancellationToken, WorkflowContext, WorkflowContextView,
    WorkflowResult,
};
use trellis_engine::RunStatus;

use crate::worker::Stages;

/// How long a worker may go without a heartbeat before its segment counts as lost. Workers send
/// one every second while a segment runs.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a segment may wait on the queue of the worker that holds the run before another worker
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
}

/// How a run's workflow ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunEnd {
    pub status: RunStatus,
    /// Why the run failed, as the engine said.
    pub error: Option<String>,
    /// The workers that executed it, in order (one per segment).
    pub workers: Vec<String>,
    /// How many times its worker was lost and another took the run over.
    pub handovers: u32,
}

/// One segment of a run, sent to a worker: run it from its checkpoint until it ends or waits.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Segment {
    pub run_id: String,
    pub runs_dir: String,
    /// The answers to human gates that arrived while it waited (by the gate's node id).
    pub answers: Option<BTreeMap<String, String>>,
    /// Gates without an answer take their first option.
    #[serde(default)]
    pub auto_approve: bool,
    /// Gates whose timeout ran out on Temporal's timer: they take their default.
    #[serde(default)]
    pub timed_out: Vec<String>,
}

/// A status to record for a run no segment is running (cancelled while it waited).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settle {
    pub run_id: String,
    pub runs_dir: String,
    pub status: RunStatus,
}

/// How a segment ended, and where the run's working state now is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SegmentEnd {
    pub status: RunStatus,
    pub error: Option<String>,
    /// The task queue only the worker that ran the segment polls: the run's next segment goes there.
    pub queue: String,
    /// That worker's identity.
    pub worker: String,
    /// The gate the run waits at, when it waits.
    #[serde(default)]
    pub gate: Option<WaitingGate>,
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
        let mut held_by: Option<String> = None;
        let mut answers = input.answers.clone();
        let mut timed_out: Vec<String> = Vec::new();
        let mut end = RunEnd {
            status: RunStatus::Running,
            error: None,
            workers: Vec::new(),
            handovers: 0,
        };
        loop {
            let segment = Segment {
                run_id: input.run_id.clone(),
                runs_dir: input.runs_dir.clone(),
                answers: answers.clone(),
                auto_approve: input.auto_approve,
                timed_out: timed_out.clone(),
            };
            let done = ctx
                .execute_activity(
                    Stages::advance,
                    segment,
                    segment_options(held_by.as_deref()),
                )
                .await;
            match done {
                Ok(done) => {
                    // The answers were the segment's to use (a lost segment's go to the next).
                    answers = None;
                    timed_out.clear();
                    end.workers.push(done.worker.clone());
                    match done.status {
                        RunStatus::WaitingForInput => {
                            held_by = Some(done.queue);
                            let gate = done.gate.clone();
                            ctx.state_mut(|s| s.gate = gate);
                            // The gate's timeout is a durable timer: when it fires first, the
                            // next segment gives the gate its default.
                            let limit = done.gate.as_ref().and_then(|g| g.timeout_ms);
                            let waited = match limit {
                                Some(ms) => {
                                    temporalio_sdk::workflows::select! {
                                        answered = ctx.wait_condition(|s: &Self| s.answers.is_some()) => answered.map(|()| true),
                                        _ = ctx.timer(Duration::from_millis(ms)) => Ok(false),
                                    }
                                }
                                None => ctx
                                    .wait_condition(|s| s.answers.is_some())
                                    .await
                                    .map(|()| true),
                            };
                            ctx.state_mut(|s| s.gate = None);
                            if let Ok(false) = waited {
                                timed_out.extend(done.gate.map(|g| g.node));
                                continue;
                            }
                            if waited.is_err() {
                                // Cancelled while nothing runs: the record says so too.
                                let settle = Settle {
                                    run_id: input.run_id.clone(),
                                    runs_dir: input.runs_dir.clone(),
                                    status: RunStatus::Cancelled,
                                };
                                ctx.execute_activity(Stages::settle, settle, settle_options())
                                    .await?;
                                end.status = RunStatus::Cancelled;
                                return Ok(end);
                            }
                            answers = ctx.state_mut(|s| s.answers.take());
                        }
                        // The worker was stopped mid-run (its own shutdown): another takes over.
                        RunStatus::Interrupted | RunStatus::Running => {
                            held_by = None;
                            end.handovers += 1;
                        }
                        status => {
                            end.status = status;
                            end.error = done.error;
                            return Ok(end);
                        }
                    }
                }
                Err(ActivityExecutionError::Cancelled(_)) => {
                    end.status = RunStatus::Cancelled;
                    return Ok(end);
                }
                Err(lost) if worker_lost(&lost) => {
                    // The worker died, or nobody polls its queue any more: any worker resumes the
                    // run from its checkpoint, re-running the stage that was interrupted.
                    held_by = None;
                    end.handovers += 1;
                    if end.handovers > MAX_LOST_WORKERS {
                        return Err(ApplicationFailure::non_retryable(format!(
                            "run {} lost its worker {} times; giving up",
                            input.run_id, end.handovers
                        ))
                        .into());
                    }
                }
                Err(error) => return Err(error.into()),
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

/// A segment's options: on the queue of the worker that holds the run when there is one (with a
/// limit on how long it may wait there), else on the shared queue. Temporal never retries a segment:
/// a lost worker is the workflow's to handle, and a failed stage is the engine's (its own retries).
fn segment_options(held_by: Option<&str>) -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_hours(30 * 24))
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .maybe_task_queue(held_by.map(str::to_owned))
        .maybe_schedule_to_start_timeout(held_by.map(|_| HANDOVER_TIMEOUT))
        .cancellation_type(ActivityCancellationType::WaitCancellationCompleted)
        .retry_policy(RetryPolicy {
            maximum_attempts: 1,
            ..RetryPolicy::default()
        })
        .summary("run the stages of a Trellis run".to_owned())
        .build()
}

/// Recording a status is quick, on any worker, and done even though the workflow was cancelled.
fn settle_options() -> ActivityOptions {
    ActivityOptions::with_start_to_close_timeout(Duration::from_secs(30))
        .cancellation_token(WorkflowCancellationToken::new())
        .build()
}

/// Whether a segment failed because its worker went away: its heartbeats stopped, or it never
/// picked the segment up.
fn worker_lost(error: &ActivityExecutionError) -> bool {
    let Some(failure) = error.failure() else {
        return false;
    };
    std::iter::successors(Some(failure), |f| f.cause.as_deref())
        .any(|f| matches!(f.failure_info, Some(FailureInfo::TimeoutFailureInfo(_))))
}
