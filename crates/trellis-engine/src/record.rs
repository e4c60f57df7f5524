//! The run's record as the engine keeps it: the checkpoint as it stands (the "book": every track, the
//! finished stages, ranks and steps), the journal entry each step's changes become, the stage
//! statuses written with it, and the snapshots at a run's start and end. Everything goes through the
//! run store ([`RunStore`]); nothing here knows the record's file layout.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use crate::checkpoint::{Change, Checkpoint, JournalEntry, Track, TrackChange};
use crate::context::RunContext;
use crate::event::EdgeChoice;
use trellis_process::task::blocking;

use crate::services::{RunStore, Subscribers};
use crate::status_file::StatusFile;

/// The record of one run: its book, and what the next write takes.
pub(crate) struct Recorder {
    /// The run's checkpoint as it stands, and the changes not yet in a journal entry.
    book: Mutex<Book>,
    /// What the next write takes: stage statuses and journal entries. Entries are queued under the
    /// book's lock and written under the writer's, so they reach the journal in order whichever save
    /// writes them.
    queued: Arc<Mutex<Queued>>,
    /// Held while writing the record; keeps the first write error, after which no entry is
    /// appended (the journal must have no gaps) until a snapshot succeeds.
    writer: Arc<Mutex<Option<String>>>,
    store: Arc<dyn RunStore>,
    /// Flushed before each journal entry: an entry names the last event, which must be stored.
    events: Subscribers,
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
    Whole(PathBuf, Box<StatusFile>),
    Routing(PathBuf, Box<EdgeChoice>),
}

impl StatusWrite {
    fn write(self, store: &dyn RunStore) -> io::Result<()> {
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
    pub(crate) pending: Vec<Change>,
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

impl Recorder {
    pub(crate) fn new(run_id: &str, store: Arc<dyn RunStore>, events: Subscribers) -> Self {
        Self {
            // Replaced by the checkpoint the run starts from.
            book: Mutex::new(Book {
                checkpoint: Checkpoint::new(run_id, "", BTreeMap::new()),
                pending: Vec::new(),
            }),
            queued: Arc::default(),
            writer: Arc::default(),
            store,
            events,
        }
    }

    pub(crate) fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock()
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
    /// blocking pool), with `seq` the last event's number. What is written is what changed, not
    /// the whole checkpoint.
    pub(crate) async fn save(&self, seq: u64) -> io::Result<()> {
        self.queue_entry(&mut self.book(), seq);
        self.write(None).await.0
    }

    /// Saves the whole checkpoint as a snapshot (after the journal entries before it): at the start
    /// and the end of a run, so a record at rest needs no journal to read.
    pub(crate) async fn save_snapshot(&self, seq: u64) -> io::Result<()> {
        let snapshot = {
            let mut book = self.book();
            self.queue_entry(&mut book, seq);
            book.checkpoint.clone()
        };
        self.write(Some(snapshot)).await.0
    }

    /// The last snapshot of a run that has stopped: the checkpoint leaves the book (no copy of a
    /// long run's history is made) and comes back with the result.
    pub(crate) async fn save_last_snapshot(&self, seq: u64) -> (io::Result<()>, Checkpoint) {
        let snapshot = {
            let mut book = self.book();
            self.queue_entry(&mut book, seq);
            let placeholder = Checkpoint::new(book.checkpoint.run_id.clone(), "", BTreeMap::new());
            std::mem::replace(&mut book.checkpoint, placeholder)
        };
        let (saved, snapshot) = self.write(Some(snapshot)).await;
        (
            saved,
            snapshot.unwrap_or_else(|| self.book().checkpoint.clone()),
        )
    }

    /// Turns the book's pending changes into the next journal entry, queued for writing.
    fn queue_entry(&self, book: &mut Book, seq: u64) {
        book.checkpoint.seq = seq;
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
    pub(crate) fn queue_status(&self, dir: &Path, status: StatusFile) {
        self.queued
            .lock()
            .statuses
            .push(StatusWrite::Whole(dir.to_path_buf(), Box::new(status)));
    }

    /// Adds a routing decision to the `status.json` of the stage in `dir`: to the queued one, or
    /// (written already) to the file, with the next write.
    pub(crate) fn queue_routing(&self, dir: &Path, routing: EdgeChoice) {
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
    async fn write(&self, snapshot: Option<Checkpoint>) -> (io::Result<()>, Option<Checkpoint>) {
        let (store, events) = (self.store.clone(), self.events.clone());
        let (queued, writer) = (self.queued.clone(), self.writer.clone());
        blocking(move || {
            let mut failed = writer.lock();
            if let (Some(error), None) = (&*failed, &snapshot) {
                return (Err(io::Error::other(error.clone())), snapshot);
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
                Ok::<_, io::Error>(())
            })();
            match &written {
                Err(error) => *failed = Some(error.to_string()),
                // A snapshot holds everything: whatever was lost before it no longer matters.
                Ok(()) if snapshot.is_some() => *failed = None,
                Ok(()) => {}
            }
            (written, snapshot)
        })
        .await
    }

    /// Creates a stage attempt's directory (on the record lane, [`in_order`]).
    pub(crate) async fn stage_dir(&self, rank: u32, node: &str, visit: u32) -> io::Result<PathBuf> {
        let (store, node) = (self.store.clone(), node.to_owned());
        in_order(move || store.stage_dir(rank, &node, visit)).await
    }

    /// Writes a stage attempt's `status.json` now (on the blocking pool).
    pub(crate) async fn write_status(&self, dir: &Path, status: StatusFile) -> io::Result<()> {
        let (store, dir) = (self.store.clone(), dir.to_path_buf());
        blocking(move || store.write_status(&dir, &status)).await
    }
}

/// Runs short blocking file work on the record lane: one thread that does such work in the order it
/// is given. Stage directories are made there. In one parent directory the file system makes them
/// one at a time anyway; on the blocking pool, a fan-out's burst of them would queue ahead of the
/// commands its branches start (each branch makes its directory, then starts its command), so no
/// branch could start before every directory was made. On the lane, a branch starts as soon as its
/// own directory is there, while the next one is made.
async fn in_order<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
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
