//! The engine of one run: the [`Engine`] (its workflow, handlers, services and settings, and the
//! run's record as it keeps it, `record`), the numbering and emitting of events, and the run loop:
//! from the checkpoint until the run ends, waits for input or is cancelled. How a track advances —
//! one step per node, whatever its kind — is in `step`; how a work stage's attempts run is in
//! `attempt`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use parking_lot::MutexGuard;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use trellis_workflow::{NodeIndex, StageStatus, Workflow};

use crate::checkpoint::{Change, Checkpoint, RunStatus, StageRecord, Track};
use crate::context::RunContext;
use crate::event::{Event, EventKind, RunStart};
use crate::handler::{Handlers, Services};
use crate::keys;
use crate::record::{Book, Recorder};
use crate::settings::Settings;

/// Why a walk along a track stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WalkEnd {
    /// The track is over: the exit node ran, or (in YAML) a terminal node did.
    Finished,
    /// A branch reached its fan-in node (which the fan-out's own track runs).
    Reached,
    /// A human gate has nobody to answer it: the run stops, resumable with an answer.
    Waiting,
    /// The pacer parked the run between two stages.
    Parked,
}

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no edge from `{node}` matches its outcome `{outcome}`{}", tried_list(.tried))]
    NoEdge {
        node: String,
        outcome: StageStatus,
        tried: Vec<String>,
    },
    #[error("node `{node}` reached its visit limit of {limit}{}", if *.dry_run_default {
        " (a dry run's limit for a node that sets none: its stages succeed with canned answers, so a loop waiting on a real one never ends; set `max_visits` or the graph's `max_node_visits`)"
    } else {
        ""
    })]
    VisitLimit {
        node: String,
        limit: u32,
        /// The limit is a dry run's default (10), not one the workflow set.
        dry_run_default: bool,
    },
    #[error(
        "node `{node}` failed the same way {limit} times, the graph's `loop_restart_signature_limit`: {signature}"
    )]
    FailureRepeated {
        node: String,
        /// The failure's signature ([`crate::Failure::signature`]).
        signature: String,
        limit: u32,
    },
    #[error(
        "the run executed {steps} stages without finishing, its step budget: a loop probably never ends"
    )]
    StepBudget { steps: u32 },
    #[error(
        "node `{node}` failed: {reason} (in a YAML workflow a failed node stops the run; give it `fail_soft: true` to route on)"
    )]
    NodeFailed { node: String, reason: String },
    #[error("no handler for {kind} nodes (node `{node}`)")]
    NoHandler { node: String, kind: &'static str },
    #[error("goal gate `{node}` ended {status} and no retry target is set")]
    GoalGateUnmet { node: String, status: StageStatus },
    #[error("stage `{node}` cannot run: {reason}")]
    Configuration { node: String, reason: String },
    #[error("the checkpoint names node `{node}`, which this workflow does not have")]
    UnknownNode { node: String },
    #[error(
        "choosing the edge out of `{node}` needs a model to judge its `when` conditions: {reason}"
    )]
    Routing { node: String, reason: String },
    #[error(
        "sub-workflows nest more than {limit} deep at `{node}` ({workflow}): a workflow that includes itself never ends"
    )]
    NestingTooDeep {
        node: String,
        workflow: String,
        limit: u32,
    },
    #[error("a hook blocked the run at {event}{}", .reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    HookBlocked {
        event: &'static str,
        reason: Option<String>,
    },
    #[error("prepare step {step} (`{command}`) failed: {reason}")]
    Prepare {
        step: usize,
        command: String,
        reason: String,
    },
    #[error("a hook at {event} sends the run to `{node}`, which this workflow does not have")]
    HookTarget { event: &'static str, node: String },
    #[error("cannot keep the run's working tree: {reason}")]
    WorkingTree { reason: String },
    #[error("cannot write the run record: {source}")]
    Store {
        #[from]
        source: std::io::Error,
    },
}

fn tried_list(tried: &[String]) -> String {
    if tried.is_empty() {
        String::new()
    } else {
        format!("; conditions tried: {}", tried.join("; "))
    }
}

/// How a run ended.
#[derive(Debug)]
pub struct RunResult {
    pub status: RunStatus,
    pub checkpoint: Checkpoint,
    pub error: Option<EngineError>,
}

/// Runs one workflow.
pub struct Engine {
    pub workflow: Arc<Workflow>,
    pub handlers: Arc<Handlers>,
    pub services: Services,
    pub settings: Settings,
    pub(crate) seq: Arc<AtomicU64>,
    /// Stages executed in this process by the run and every sub-workflow in it, shared down the tree:
    /// the step budget counts them all.
    pub(crate) spent: Arc<std::sync::atomic::AtomicU32>,
    pub(crate) run_id: String,
    /// Sub-workflow nesting depth (0 for the top-level run).
    pub(crate) depth: u32,
    /// The run's cancellation token while it runs (a child of the caller's): every stage attempt's
    /// token is a child of it.
    cancel: parking_lot::Mutex<CancellationToken>,
    /// The run's record as the engine keeps it: the checkpoint as it stands and what is still to
    /// be written.
    pub(crate) recorder: Recorder,
    /// Paths left out of the files stages are recorded as touching ([`Settings::exclude_globs`]).
    pub(crate) excluded: Option<globset::GlobSet>,
    /// In a dry run, the nodes on a loop no edge bounds ([`Workflow::on_unbounded_loop`]): those a
    /// dry run's default visit limit applies to. Empty otherwise.
    pub(crate) dry_run_looping: Vec<bool>,
}

/// Stage attempts finished in this process, by any run: what a stage may have changed for the ones
/// that start after it.
static STAGES_FINISHED: AtomicU64 = AtomicU64::new(0);

/// How many stage attempts this process has finished. Something found out about the machine (where a
/// program is on `PATH`) stays true until the number changes: a stage that installs a program ends
/// before one that uses it starts, and stages running at the same time have no order anyway.
pub fn stages_finished() -> u64 {
    STAGES_FINISHED.load(Ordering::SeqCst)
}

pub(crate) use trellis_process::task::blocking;

/// The current time as RFC 3339 with milliseconds.
pub fn timestamp() -> String {
    format_time(SystemTime::now())
}

/// A time as RFC 3339 with milliseconds, as events and `run.json` write it.
pub fn format_time(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

impl Engine {
    pub fn new(
        workflow: Arc<Workflow>,
        handlers: Arc<Handlers>,
        services: Services,
        settings: Settings,
        run_id: impl Into<String>,
    ) -> Self {
        let run_id = run_id.into();
        Self {
            recorder: Recorder::new(
                &run_id,
                services.store.clone(),
                services.blobs.clone(),
                services.events.clone(),
            ),
            excluded: crate::settings::glob_set(&settings.exclude_globs),
            dry_run_looping: if settings.dry_run() {
                workflow.on_unbounded_loop()
            } else {
                Vec::new()
            },
            workflow,
            handlers,
            services,
            settings,
            seq: Arc::new(AtomicU64::new(0)),
            spent: Arc::default(),
            run_id,
            depth: 0,
            cancel: parking_lot::Mutex::new(CancellationToken::new()),
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// A fresh checkpoint for a new run: the start node next, the engine keys and any `--set` values.
    pub fn first_checkpoint(&self, initial: BTreeMap<String, Value>) -> Option<Checkpoint> {
        let start = self.workflow.start?;
        Some(Checkpoint::new(
            self.run_id.clone(),
            &self.workflow.nodes[start].id,
            initial,
        ))
    }

    pub(crate) fn book(&self) -> MutexGuard<'_, Book> {
        self.recorder.book()
    }

    /// Records a finished stage attempt.
    pub(crate) fn record(&self, record: StageRecord) {
        STAGES_FINISHED.fetch_add(1, Ordering::SeqCst);
        self.book().change(Change::Stage(Box::new(record)));
    }

    /// The next stage-directory rank; with `step`, the stage also counts against the step budget.
    pub(crate) fn next_rank(&self, step: bool) -> u32 {
        let checkpoint = &mut self.book().checkpoint;
        checkpoint.rank += 1;
        if step {
            checkpoint.steps += 1;
            self.spent.fetch_add(1, Ordering::Relaxed);
        }
        checkpoint.rank
    }

    /// Stages counted against the step budget: this run's recorded ones (across resumes), or, when
    /// more, those executed in this process by the whole tree of runs it belongs to.
    pub(crate) fn steps(&self) -> u32 {
        self.book()
            .checkpoint
            .steps
            .max(self.spent.load(Ordering::Relaxed))
    }
}

#[async_trait::async_trait]
impl crate::handler::History for Engine {
    async fn finished(&self) -> Vec<StageRecord> {
        let store = self.services.store.clone();
        blocking(move || store.finished_stages())
            .await
            .unwrap_or_default()
    }
}

impl crate::handler::Emitter for Engine {
    fn emit_from(&self, node: Option<&str>, agent: Option<&str>, event: EventKind) {
        self.stamp(node, agent, event);
    }

    fn detached(&self) -> Option<Arc<dyn crate::handler::Emitter>> {
        Some(Arc::new(EventHandle {
            seq: self.seq.clone(),
            services: self.services.clone(),
            run_id: self.run_id.clone(),
        }))
    }
}

/// An engine's events, owned: what a hook running in the background reports through.
#[derive(Clone)]
struct EventHandle {
    seq: Arc<AtomicU64>,
    services: Services,
    run_id: String,
}

impl crate::handler::Emitter for EventHandle {
    fn emit_from(&self, node: Option<&str>, agent: Option<&str>, kind: EventKind) {
        stamp(&self.seq, &self.services, &self.run_id, node, agent, kind);
    }

    fn detached(&self) -> Option<Arc<dyn crate::handler::Emitter>> {
        Some(Arc::new(self.clone()))
    }
}

/// Numbers and stamps an event and hands it to every subscriber.
fn stamp(
    seq: &AtomicU64,
    services: &Services,
    run_id: &str,
    node: Option<&str>,
    agent: Option<&str>,
    kind: EventKind,
) {
    // Live-only events are not logged, so they take no number of their own.
    let seq = if kind.is_live_only() {
        seq.load(Ordering::SeqCst)
    } else {
        seq.fetch_add(1, Ordering::SeqCst) + 1
    };
    services.events.emit(&Event {
        seq,
        ts: format_time(services.clock.now()),
        run_id: run_id.to_owned(),
        node_id: node.map(str::to_owned),
        agent_id: agent.map(str::to_owned),
        kind,
    });
}

impl Engine {
    /// The run's hooks decide at `context`'s point (proceed when it has none listening). A `block`
    /// is the run's error, with the hook's reason.
    pub(crate) async fn hook(
        &self,
        context: crate::hooks::HookContext,
    ) -> Result<crate::hooks::HookDecision, EngineError> {
        use crate::hooks::HookDecision;
        let Some(hooks) = &self.services.hooks else {
            return Ok(HookDecision::Proceed);
        };
        let event = context.event;
        if !hooks.listens(event) {
            return Ok(HookDecision::Proceed);
        }
        // A hook sees the record as the steps before it left it.
        self.settle_save().await?;
        match hooks.fire(context, self).await {
            HookDecision::Block { reason } => Err(EngineError::HookBlocked {
                event: event.as_str(),
                reason,
            }),
            decision => Ok(decision),
        }
    }

    /// Whether a hook listens at `event`: the engine builds what hooks are told only then.
    pub(crate) fn listens(&self, event: crate::hooks::HookEvent) -> bool {
        self.services
            .hooks
            .as_ref()
            .is_some_and(|hooks| hooks.listens(event))
    }

    /// The node a hook's `override` names.
    pub(crate) fn hook_target(
        &self,
        event: crate::hooks::HookEvent,
        node: &str,
    ) -> Result<NodeIndex, EngineError> {
        self.workflow
            .node_index(node)
            .ok_or_else(|| EngineError::HookTarget {
                event: event.as_str(),
                node: node.to_owned(),
            })
    }

    /// Numbers and stamps an event and hands it to every subscriber.
    pub fn emit(&self, node: Option<&str>, kind: EventKind) {
        self.stamp(node, None, kind);
    }

    fn stamp(&self, node: Option<&str>, agent: Option<&str>, kind: EventKind) {
        stamp(&self.seq, &self.services, &self.run_id, node, agent, kind);
    }

    /// A new stage attempt's cancellation token: a child of the run's.
    pub(crate) fn stage_token(&self) -> CancellationToken {
        self.cancel.lock().child_token()
    }

    /// The number of the last event emitted.
    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Writes what the step changed on `track` (and in its live context) into the book at `path`
    /// and saves it.
    pub(crate) async fn persist(
        &self,
        path: &[String],
        track: &mut Track,
        context: &RunContext,
    ) -> Result<(), EngineError> {
        self.recorder.change_track(path, track, context);
        self.save().await
    }

    /// Saves what changed since the last save (one journal entry), the working tree first when the
    /// pacer keeps it ([`crate::services::Pacer::saving`]).
    pub(crate) async fn save(&self) -> Result<(), EngineError> {
        self.save_tree().await?;
        Ok(self.recorder.save(self.seq()).await?)
    }

    /// Waits for the save the main track's last step handed ahead, if one is on its way
    /// ([`crate::record::Recorder::save_ahead`]), and tells that its checkpoint is saved.
    pub(crate) async fn settle_save(&self) -> Result<(), EngineError> {
        if let Some((node, next_node)) = self.recorder.settle().await? {
            self.emit(Some(&node), EventKind::CheckpointSaved { next_node });
        }
        Ok(())
    }

    /// Creates a stage attempt's directory, once the save before it is written: made on the
    /// record lane after the save the last step handed ahead, whose result is then ready (waiting
    /// for the directory alone wakes the run once, not twice).
    pub(crate) async fn stage_dir(
        &self,
        rank: u32,
        node: &str,
        visit: u32,
    ) -> Result<std::path::PathBuf, EngineError> {
        let dir = self.recorder.stage_dir(rank, node, visit).await;
        self.settle_save().await?;
        Ok(dir?)
    }

    /// Has the pacer, if there is one, make the run's working tree durable.
    async fn save_tree(&self) -> Result<(), EngineError> {
        match self.services.pacer.as_deref() {
            Some(pacer) => pacer
                .saving()
                .await
                .map_err(|reason| EngineError::WorkingTree { reason }),
            None => Ok(()),
        }
    }

    /// Runs from `checkpoint` until the run ends, waits for input, or `cancel` fires. Cancelling stops
    /// the running stage at once (its process group is killed, its model call dropped) and records the
    /// run as cancelled at the stage it was in, so `resume` runs that stage again.
    pub async fn run(&self, mut cp: Checkpoint, cancel: &CancellationToken) -> RunResult {
        let cancel = cancel.child_token();
        *self.cancel.lock() = cancel.clone();
        // However the run ends, the work of its stages that outlives them is told to stop.
        let _stop_stages = cancel.clone().drop_guard();
        // A sub-workflow shares its parent's event sequence.
        if self.depth == 0 {
            self.seq.store(cp.seq, Ordering::SeqCst);
        }
        let resumed = cp.stage_count > 0 || cp.status != RunStatus::Running;
        cp.status = RunStatus::Running;
        cp.failure = None;
        // The records a reader collected stay on disk; those of a record written before the journal
        // existed go into it now, with the first snapshot.
        let stages = std::mem::take(&mut cp.stages);
        let pending = if cp.journal == 0 {
            stages
                .into_iter()
                .map(|record| Change::Stage(Box::new(record)))
                .collect()
        } else {
            Vec::new()
        };
        let mut track = cp.track.clone();
        *self.book() = Book {
            checkpoint: cp,
            pending,
        };
        let context = RunContext::from_map(std::mem::take(&mut track.context));
        self.set_engine_keys(&context);
        if let Err(error) = self.recorder.save_snapshot(self.seq()).await {
            return RunResult {
                status: RunStatus::Failed,
                checkpoint: self.book().checkpoint.clone(),
                error: Some(error.into()),
            };
        }
        let start = RunStart {
            workflow: self.workflow.name.clone(),
            goal: self.workflow.graph.goal.clone(),
            next_node: track.next_node.clone(),
        };
        self.emit(
            None,
            if resumed {
                EventKind::WorkflowRunResumed(start)
            } else {
                EventKind::WorkflowRunStarted(start)
            },
        );
        let walked = tokio::select! {
            walked = self.walk_main(&mut track, &context, resumed) => Some(walked),
            () = cancel.cancelled() => None,
        };
        let (status, error) = match walked {
            Some(Ok(WalkEnd::Finished | WalkEnd::Reached)) => (RunStatus::Succeeded, None),
            Some(Ok(WalkEnd::Waiting)) => (RunStatus::WaitingForInput, None),
            Some(Ok(WalkEnd::Parked)) => (RunStatus::Running, None),
            Some(Err(error)) => (RunStatus::Failed, Some(error)),
            None => (RunStatus::Cancelled, None),
        };
        // The tree goes with the run's last save; a run that cannot keep it has failed.
        let (status, error) = match (self.save_tree().await, error) {
            (Err(failed), None) if status != RunStatus::Cancelled => {
                (RunStatus::Failed, Some(failed))
            }
            (_, error) => (status, error),
        };
        // On success, failure or waiting the walk's track is the truth; a cancelled walk was dropped
        // mid-stage, and the book holds the track as of its last finished stage.
        if status != RunStatus::Cancelled {
            self.recorder.change_track(&[], &mut track, &context);
        }
        {
            let book = &mut self.book().checkpoint;
            book.status = status;
            book.failure = error.as_ref().map(ToString::to_string);
        }
        // A parked run has not ended: it goes on where it stopped.
        if status != RunStatus::Running {
            let end = self.end_event(status);
            self.emit(None, end);
        }
        let (saved, checkpoint) = self.recorder.save_last_snapshot(self.seq()).await;
        match saved {
            Ok(()) => RunResult {
                status,
                checkpoint,
                error,
            },
            Err(error) => RunResult {
                status: RunStatus::Failed,
                checkpoint,
                error: Some(error.into()),
            },
        }
    }

    /// Walks the main track, with the run's hooks around it (a sub-workflow has none of its own):
    /// `run_start` and `sandbox_ready` before the first stage, `sandbox_cleanup` and `run_complete`
    /// or `run_failed` after the last. A blocking `run_complete` hook that blocks fails the run.
    async fn walk_main(
        &self,
        track: &mut Track,
        context: &RunContext,
        resumed: bool,
    ) -> Result<WalkEnd, EngineError> {
        use crate::hooks::{HookContext, HookEvent};
        if self.depth > 0 {
            return self.walk(&[], track, context, None, resumed).await;
        }
        self.hook(HookContext::new(HookEvent::RunStart)).await?;
        self.hook(HookContext::new(HookEvent::SandboxReady)).await?;
        let walked = self.walk(&[], track, context, None, resumed).await;
        match &walked {
            Ok(WalkEnd::Finished | WalkEnd::Reached) => {
                self.hook(HookContext::new(HookEvent::SandboxCleanup))
                    .await?;
                self.hook(HookContext::new(HookEvent::RunComplete)).await?;
            }
            Ok(WalkEnd::Waiting | WalkEnd::Parked) => {}
            Err(error) => {
                // The run has failed already: what these hooks decide changes nothing.
                let _ = self.hook(HookContext::new(HookEvent::SandboxCleanup)).await;
                let mut failed = HookContext::new(HookEvent::RunFailed);
                failed.failure_reason = Some(error.to_string());
                let _ = self.hook(failed).await;
            }
        }
        walked
    }

    /// The event that ends a run with `status`.
    fn end_event(&self, status: RunStatus) -> EventKind {
        let book = &self.book().checkpoint;
        match status {
            RunStatus::Succeeded => EventKind::WorkflowRunCompleted {
                status,
                stages: book.stage_count,
                artifact_count: book.artifact_count,
            },
            RunStatus::WaitingForInput => EventKind::WorkflowRunWaitingForInput {
                node: book.track.next_node.clone(),
            },
            RunStatus::Cancelled => EventKind::WorkflowRunCancelled {
                status,
                node: book.track.next_node.clone(),
                stages: book.stage_count,
            },
            _ => EventKind::WorkflowRunFailed {
                status,
                error: book.failure.clone(),
            },
        }
    }

    fn set_engine_keys(&self, context: &RunContext) {
        context.set(keys::RUN_ID, self.run_id.clone());
        context.set(keys::WORK_DIR, self.settings.work_dir.display().to_string());
        for (key, value) in &self.workflow.graph.attributes {
            context.set(format!("{}{key}", keys::GRAPH_PREFIX), value.clone());
        }
        if let Some(goal) = &self.workflow.graph.goal {
            context.set("graph.goal", goal.clone());
        }
    }
}
