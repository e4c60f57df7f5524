//! The engine of one run: it holds the run's checkpoint as it stands (the "book": every track, the
//! finished stages, ranks and steps), persists it after every stage, numbers and emits events, and
//! runs the main track from the checkpoint until the run ends, waits for input or is cancelled. How a
//! track advances — one step per node, whatever its kind — is in [`crate::step`]; how a work stage's
//! attempts run is in [`crate::attempt`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use trellis_workflow::{StageStatus, Workflow};

use crate::checkpoint::{Checkpoint, RunStatus, StageRecord, Track};
use crate::context::RunContext;
use crate::event::{Event, EventKind, RunStart};
use crate::handler::{Handlers, Services, Settings};
use crate::keys;
use crate::outcome::Outcome;
use crate::step::WalkEnd;

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no edge from `{node}` matches its outcome `{outcome}`{}", tried_list(.tried))]
    NoEdge {
        node: String,
        outcome: StageStatus,
        tried: Vec<String>,
    },
    #[error("node `{node}` reached its visit limit of {limit}")]
    VisitLimit { node: String, limit: u32 },
    #[error(
        "the run executed {steps} stages without finishing, its step budget: a loop probably never ends"
    )]
    StepBudget { steps: u32 },
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
    pub(crate) run_id: String,
    /// Sub-workflow nesting depth (0 for the top-level run).
    pub(crate) depth: u32,
    /// The run's checkpoint as it stands. Tracks write their state into it (the main track at the
    /// root, branches below their fan-out) and every save writes all of it.
    book: Mutex<Checkpoint>,
    /// Numbers saves, so a save that was overtaken (a cancelled run's last in-flight write) never
    /// replaces a later one on disk.
    saves: AtomicU64,
    written: Arc<Mutex<u64>>,
}

/// Runs blocking file work on the blocking pool, off the async workers (DESIGN.md §5).
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// A stage attempt's `status.json`: its outcome plus where and when it ran.
pub(crate) fn status_json(
    outcome: &Outcome,
    node_id: &str,
    visit: u32,
    attempt: u32,
    duration_ms: u64,
) -> Value {
    let mut status = serde_json::to_value(outcome).unwrap_or_default();
    if let Value::Object(map) = &mut status {
        map.insert("node_id".into(), json!(node_id));
        map.insert("visit".into(), json!(visit));
        map.insert("attempt".into(), json!(attempt));
        map.insert("duration_ms".into(), json!(duration_ms));
    }
    status
}

/// How many artifacts the run's stages captured (the outputs document's `artifact_count`).
fn artifact_count(stages: &[StageRecord]) -> usize {
    stages.iter().map(|s| s.details.artifacts.len()).sum()
}

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
            workflow,
            handlers,
            services,
            settings,
            seq: Arc::new(AtomicU64::new(0)),
            // Replaced by the checkpoint `run` starts from.
            book: Mutex::new(Checkpoint::new(run_id.clone(), "", BTreeMap::new())),
            run_id,
            depth: 0,
            saves: AtomicU64::new(0),
            written: Arc::new(Mutex::new(0)),
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

    pub(crate) fn book(&self) -> MutexGuard<'_, Checkpoint> {
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a finished stage attempt.
    pub(crate) fn record(&self, record: StageRecord) {
        self.book().stages.push(record);
    }

    /// The next stage-directory rank; with `step`, the stage also counts against the step budget.
    pub(crate) fn next_rank(&self, step: bool) -> u32 {
        let mut book = self.book();
        book.rank += 1;
        if step {
            book.steps += 1;
        }
        book.rank
    }

    pub(crate) fn steps(&self) -> u32 {
        self.book().steps
    }
}

impl crate::handler::History for Engine {
    fn finished(&self) -> Vec<StageRecord> {
        self.book().stages.clone()
    }
}

impl crate::handler::Emitter for Engine {
    fn emit(&self, node: Option<&str>, event: EventKind) {
        Engine::emit(self, node, event);
    }
}

impl Engine {
    /// Numbers and stamps an event and hands it to every subscriber.
    pub fn emit(&self, node: Option<&str>, kind: EventKind) {
        // Live-only events are not logged, so they take no number of their own.
        let seq = if kind.is_live_only() {
            self.seq.load(Ordering::SeqCst)
        } else {
            self.seq.fetch_add(1, Ordering::SeqCst) + 1
        };
        self.services.events.emit(&Event {
            seq,
            ts: format_time(self.services.clock.now()),
            run_id: self.run_id.clone(),
            node_id: node.map(str::to_owned),
            kind,
        });
    }

    /// Writes `track` (with its live context) into the book at `path` and saves the checkpoint.
    pub(crate) async fn persist(
        &self,
        path: &[String],
        track: &Track,
        context: &RunContext,
    ) -> Result<(), EngineError> {
        {
            let mut book = self.book();
            if let Some(slot) = book.track.at_mut(path) {
                *slot = track.clone();
                slot.context = context.snapshot();
            }
        }
        self.save().await
    }

    /// Saves the book as the checkpoint (on the blocking pool: it writes and syncs a file). A save that
    /// finishes after a later one has been written is dropped, so the newest state always wins.
    pub(crate) async fn save(&self) -> Result<(), EngineError> {
        let (generation, snapshot) = {
            let mut book = self.book();
            book.seq = self.seq.load(Ordering::SeqCst);
            (self.saves.fetch_add(1, Ordering::SeqCst) + 1, book.clone())
        };
        let (store, written) = (self.services.store.clone(), self.written.clone());
        let events = self.services.events.clone();
        blocking(move || {
            let mut last = written
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if generation > *last {
                // The log first: the checkpoint names the last event, which must be stored.
                events.flush()?;
                store.save_checkpoint(&snapshot)?;
                *last = generation;
            }
            Ok::<_, std::io::Error>(())
        })
        .await?;
        Ok(())
    }

    /// Creates a stage attempt's directory (on the blocking pool).
    pub(crate) async fn stage_dir(
        &self,
        rank: u32,
        node: &str,
        visit: u32,
    ) -> Result<std::path::PathBuf, EngineError> {
        let (store, node) = (self.services.store.clone(), node.to_owned());
        Ok(blocking(move || store.stage_dir(rank, &node, visit)).await?)
    }

    /// Writes a stage attempt's `status.json` (on the blocking pool).
    pub(crate) async fn write_status(
        &self,
        dir: &std::path::Path,
        status: Value,
    ) -> Result<(), EngineError> {
        let (store, dir) = (self.services.store.clone(), dir.to_path_buf());
        Ok(blocking(move || store.write_status(&dir, &status)).await?)
    }

    /// Runs from `checkpoint` until the run ends, waits for input, or `cancel` fires. Cancelling stops
    /// the running stage at once (its process group is killed, its model call dropped) and records the
    /// run as cancelled at the stage it was in, so `resume` runs that stage again.
    pub async fn run(&self, mut cp: Checkpoint, cancel: &CancellationToken) -> RunResult {
        // A sub-workflow shares its parent's event sequence.
        if self.depth == 0 {
            self.seq.store(cp.seq, Ordering::SeqCst);
        }
        let resumed = !cp.stages.is_empty() || cp.status != RunStatus::Running;
        cp.status = RunStatus::Running;
        cp.failure = None;
        let mut track = cp.track.clone();
        *self.book() = cp;
        let context = RunContext::from_map(std::mem::take(&mut track.context));
        self.set_engine_keys(&context);
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
            walked = self.walk(&[], &mut track, &context, None, resumed) => Some(walked),
            () = cancel.cancelled() => None,
        };
        let (status, error) = match walked {
            Some(Ok(WalkEnd::Finished | WalkEnd::Reached)) => (RunStatus::Succeeded, None),
            Some(Ok(WalkEnd::Waiting)) => (RunStatus::WaitingForInput, None),
            Some(Err(error)) => (RunStatus::Failed, Some(error)),
            None => (RunStatus::Cancelled, None),
        };
        {
            let mut book = self.book();
            // On success, failure or waiting the walk's track is the truth; a cancelled walk was
            // dropped mid-stage, and the book holds the track as of its last finished stage.
            if status != RunStatus::Cancelled {
                book.track = track;
                book.track.context = context.snapshot();
            }
            book.status = status;
            book.failure = error.as_ref().map(ToString::to_string);
        }
        let end = {
            let book = self.book();
            match status {
                RunStatus::Succeeded => EventKind::WorkflowRunCompleted {
                    status,
                    stages: book.stages.len(),
                    artifact_count: artifact_count(&book.stages),
                },
                RunStatus::WaitingForInput => EventKind::WorkflowRunWaitingForInput {
                    node: book.track.next_node.clone(),
                },
                RunStatus::Cancelled => EventKind::WorkflowRunCancelled {
                    status,
                    node: book.track.next_node.clone(),
                    stages: book.stages.len(),
                },
                _ => EventKind::WorkflowRunFailed {
                    status,
                    error: book.failure.clone(),
                },
            }
        };
        self.emit(None, end);
        let saved = self.save().await;
        let checkpoint = self.book().clone();
        match saved {
            Ok(()) => RunResult {
                status,
                checkpoint,
                error,
            },
            Err(error) => RunResult {
                status: RunStatus::Failed,
                checkpoint,
                error: Some(error),
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
