//! The engine of one run: it holds the run's checkpoint as it stands (the "book": every track, the
//! finished stages, ranks and steps), journals what each stage changed in it and snapshots it when
//! the run starts and stops (see [`crate::checkpoint`]), numbers and emits events, and
//! runs the main track from the checkpoint until the run ends, waits for input or is cancelled. How a
//! track advances — one step per node, whatever its kind — is in `step`; how a work stage's
//! attempts run is in `attempt`.

use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use trellis_workflow::{StageStatus, Workflow};

use crate::checkpoint::{
    Change, Checkpoint, JournalEntry, RunStatus, StageRecord, Track, TrackChange,
};
use crate::context::RunContext;
use crate::event::{EdgeChoice, Event, EventKind, RunStart};
use crate::handler::{Handlers, Services};
use crate::keys;
use crate::settings::Settings;
use crate::status_file::StatusFile;
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
    /// The run's checkpoint as it stands, and the changes not yet in a journal entry.
    book: Mutex<Book>,
    /// What the next write takes: stage statuses and journal entries. Entries are queued under the
    /// book's lock and written under the writer's, so they reach the journal in order whichever save
    /// writes them.
    queued: Arc<Mutex<Queued>>,
    /// Held while writing the record; keeps the first write error, after which no entry is
    /// appended (the journal must have no gaps) until a snapshot succeeds.
    writer: Arc<Mutex<Option<String>>>,
}

/// Record files waiting for the next write, which writes the statuses first: a stage's
/// `status.json` is queued before its record, and both are taken at once, so the journal never
/// records a stage whose status is not on disk.
#[derive(Default)]
struct Queued {
    statuses: Vec<StatusWrite>,
    entries: Vec<JournalEntry>,
}

/// A finished stage's `status.json`, written with the journal entry that records the stage (one
/// trip to the disk for both); or a routing decision to add to one written already.
enum StatusWrite {
    Whole(std::path::PathBuf, Box<StatusFile>),
    Routing(std::path::PathBuf, Box<EdgeChoice>),
}

impl StatusWrite {
    fn write(self, store: &dyn crate::services::RunStore) -> std::io::Result<()> {
        match self {
            Self::Whole(dir, status) => store.write_status(&dir, &status),
            Self::Routing(dir, routing) => match store.read_status(&dir)? {
                Some(mut status) => {
                    status.routing = Some(*routing);
                    store.write_status(&dir, &status)
                }
                // Nothing to add it to (a store that keeps no statuses).
                None => Ok(()),
            },
        }
    }
}

/// The checkpoint as it stands and what changed in it since the last journal entry.
pub(crate) struct Book {
    pub(crate) checkpoint: Checkpoint,
    pending: Vec<Change>,
}

impl Book {
    /// Makes a change, and keeps it for the next journal entry. A stage record is only counted:
    /// the journal keeps it.
    pub(crate) fn change(&mut self, change: Change) {
        match &change {
            Change::Stage(record) => self.checkpoint.count(record),
            _ => self.checkpoint.apply(&change),
        }
        self.pending.push(change);
    }
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

/// Runs short blocking file work on the record lane: one thread that does such work in the order it
/// is given. Stage directories are made there. In one parent directory the file system makes them
/// one at a time anyway; on the blocking pool, a fan-out's burst of them would queue ahead of the
/// commands its branches start (each branch makes its directory, then starts its command), so no
/// branch could start before every directory was made. On the lane, a branch starts as soon as its
/// own directory is there, while the next one is made.
pub(crate) async fn in_order<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    type Job = Box<dyn FnOnce() + Send>;
    static LANE: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = sender.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)));
    });
    let lane = LANE.get_or_init(|| {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("trellis-record".to_owned())
            .spawn(move || queue.into_iter().for_each(|job| job()))
            .ok()
            .map(|_| jobs)
    });
    let refused = match lane {
        Some(jobs) => jobs.send(job).err().map(|refused| refused.0),
        None => Some(job),
    };
    if let Some(job) = refused {
        // No thread for the lane: the pool does the work.
        blocking(job).await;
    }
    // The lane runs every job it is given (a panic is caught in the job), so the answer comes.
    match receiver.await.expect("the record lane runs every job") {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Runs blocking work that lasts as long as a stage (a transcript written as the stage goes, a person
/// typing an answer) on a thread of its own, so it never holds one of the blocking pool's threads,
/// which short file work shares. The future gives its result (`None` if the thread could not start
/// or panicked); dropping it leaves the work running to its end.
pub fn own_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> impl Future<Output = Option<T>> + Send + 'static {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let started = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = sender.send(work());
        });
    async move {
        match started {
            Ok(_) => receiver.await.ok(),
            Err(_) => None,
        }
    }
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
            spent: Arc::default(),
            // Replaced by the checkpoint `run` starts from.
            book: Mutex::new(Book {
                checkpoint: Checkpoint::new(run_id.clone(), "", BTreeMap::new()),
                pending: Vec::new(),
            }),
            run_id,
            depth: 0,
            queued: Arc::default(),
            writer: Arc::default(),
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
        self.book.lock()
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

    /// Writes what the step changed on `track` (and in its live context) into the book at `path`
    /// and saves it.
    pub(crate) async fn persist(
        &self,
        path: &[String],
        track: &mut Track,
        context: &RunContext,
    ) -> Result<(), EngineError> {
        self.change_track(path, track, context);
        self.save().await
    }

    /// Makes what changed on `track` since its last change a change to the book.
    pub(crate) fn change_track(&self, path: &[String], track: &mut Track, context: &RunContext) {
        let mut change = TrackChange::take(path, track, context.take_changes());
        let mut book = self.book();
        change.parallel_ended = track.parallel.is_none()
            && book
                .checkpoint
                .track
                .at_mut(path)
                .is_some_and(|t| t.parallel.is_some());
        book.change(Change::Track(Box::new(change)));
    }

    /// Saves what changed since the last save: one journal entry, appended and synced (on the
    /// blocking pool). What is written is what changed, not the whole checkpoint.
    pub(crate) async fn save(&self) -> Result<(), EngineError> {
        self.queue_entry(&mut self.book());
        self.write(None).await.0
    }

    /// Saves the whole checkpoint as a snapshot (after the journal entries before it): at the start
    /// and the end of a run, so a record at rest needs no journal to read.
    async fn save_snapshot(&self) -> Result<(), EngineError> {
        let snapshot = {
            let mut book = self.book();
            self.queue_entry(&mut book);
            book.checkpoint.clone()
        };
        self.write(Some(snapshot)).await.0
    }

    /// The last snapshot of a run that has stopped: the checkpoint leaves the book (no copy of a
    /// long run's history is made) and comes back with the result.
    async fn save_last_snapshot(&self) -> (Result<(), EngineError>, Checkpoint) {
        let snapshot = {
            let mut book = self.book();
            self.queue_entry(&mut book);
            let placeholder = Checkpoint::new(self.run_id.clone(), "", BTreeMap::new());
            std::mem::replace(&mut book.checkpoint, placeholder)
        };
        let (saved, snapshot) = self.write(Some(snapshot)).await;
        (
            saved,
            snapshot.unwrap_or_else(|| self.book().checkpoint.clone()),
        )
    }

    /// Turns the book's pending changes into the next journal entry, queued for writing.
    fn queue_entry(&self, book: &mut Book) {
        book.checkpoint.seq = self.seq.load(Ordering::SeqCst);
        if book.pending.is_empty() {
            return;
        }
        let checkpoint = &mut book.checkpoint;
        checkpoint.journal += 1;
        let entry = JournalEntry {
            n: checkpoint.journal,
            rank: checkpoint.rank,
            steps: checkpoint.steps,
            seq: checkpoint.seq,
            changes: std::mem::take(&mut book.pending),
        };
        self.queued.lock().entries.push(entry);
    }

    /// Queues a finished stage's `status.json` for the write that records the stage.
    pub(crate) fn queue_status(&self, dir: &std::path::Path, status: StatusFile) {
        self.queued
            .lock()
            .statuses
            .push(StatusWrite::Whole(dir.to_path_buf(), Box::new(status)));
    }

    /// Adds a routing decision to the `status.json` of the stage in `dir`: to the queued one, or
    /// (written already) to the file, with the next write.
    pub(crate) fn queue_routing(&self, dir: &std::path::Path, routing: EdgeChoice) {
        let mut queued = self.queued.lock();
        let whole = queued
            .statuses
            .iter_mut()
            .rev()
            .find_map(|write| match write {
                StatusWrite::Whole(queued_dir, status) if queued_dir == dir => Some(status),
                _ => None,
            });
        match whole {
            Some(status) => status.routing = Some(routing),
            None => queued
                .statuses
                .push(StatusWrite::Routing(dir.to_path_buf(), Box::new(routing))),
        }
    }

    /// Writes the queued stage statuses, then the queued journal entries (the event log flushed
    /// first: an entry names the last event, which must be stored), then `snapshot` if given.
    async fn write(
        &self,
        snapshot: Option<Checkpoint>,
    ) -> (Result<(), EngineError>, Option<Checkpoint>) {
        let (store, events) = (self.services.store.clone(), self.services.events.clone());
        let (queued, writer) = (self.queued.clone(), self.writer.clone());
        let (written, snapshot) = blocking(move || {
            let mut failed = writer.lock();
            if let (Some(error), None) = (&*failed, &snapshot) {
                return (Err(std::io::Error::other(error.clone())), snapshot);
            }
            let Queued { statuses, entries } = std::mem::take(&mut *queued.lock());
            let written = (|| {
                for status in statuses {
                    status.write(&*store)?;
                }
                events.flush()?;
                if !entries.is_empty() && failed.is_none() {
                    store.append_journal(&entries)?;
                }
                if let Some(snapshot) = &snapshot {
                    store.save_checkpoint(snapshot)?;
                }
                Ok::<_, std::io::Error>(())
            })();
            match &written {
                Err(error) => *failed = Some(error.to_string()),
                // A snapshot holds everything: whatever was lost before it no longer matters.
                Ok(()) if snapshot.is_some() => *failed = None,
                Ok(()) => {}
            }
            (written, snapshot)
        })
        .await;
        (written.map_err(EngineError::from), snapshot)
    }

    /// Creates a stage attempt's directory (on the record lane, [`in_order`]).
    pub(crate) async fn stage_dir(
        &self,
        rank: u32,
        node: &str,
        visit: u32,
    ) -> Result<std::path::PathBuf, EngineError> {
        let (store, node) = (self.services.store.clone(), node.to_owned());
        Ok(in_order(move || store.stage_dir(rank, &node, visit)).await?)
    }

    /// Writes a stage attempt's `status.json` (on the blocking pool).
    pub(crate) async fn write_status(
        &self,
        dir: &std::path::Path,
        status: StatusFile,
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
        if let Err(error) = self.save_snapshot().await {
            return RunResult {
                status: RunStatus::Failed,
                checkpoint: self.book().checkpoint.clone(),
                error: Some(error),
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
            walked = self.walk(&[], &mut track, &context, None, resumed) => Some(walked),
            () = cancel.cancelled() => None,
        };
        let (status, error) = match walked {
            Some(Ok(WalkEnd::Finished | WalkEnd::Reached)) => (RunStatus::Succeeded, None),
            Some(Ok(WalkEnd::Waiting)) => (RunStatus::WaitingForInput, None),
            Some(Err(error)) => (RunStatus::Failed, Some(error)),
            None => (RunStatus::Cancelled, None),
        };
        // On success, failure or waiting the walk's track is the truth; a cancelled walk was dropped
        // mid-stage, and the book holds the track as of its last finished stage.
        if status != RunStatus::Cancelled {
            self.change_track(&[], &mut track, &context);
        }
        {
            let book = &mut self.book().checkpoint;
            book.status = status;
            book.failure = error.as_ref().map(ToString::to_string);
        }
        let end = {
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
        };
        self.emit(None, end);
        let (saved, checkpoint) = self.save_last_snapshot().await;
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
