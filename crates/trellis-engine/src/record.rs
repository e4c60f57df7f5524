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
use trellis_process::task::{blocking, start_blocking};

use crate::blob::BlobStore;
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
    /// The sync of the journal entries last appended, which runs while the run goes on; the next
    /// write waits for it, so entries reach the disk in order, and takes its error.
    syncing: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The write [`Recorder::save_ahead`] handed to the record lane, until [`Recorder::settle`]
    /// takes its result.
    ahead: Mutex<Option<Ahead>>,
    store: Arc<dyn RunStore>,
    /// Synced before the journal: its entries name blobs, written without waiting for the disk.
    blobs: Arc<dyn BlobStore>,
    /// Flushed before each journal entry: an entry names the last event, which must be stored.
    events: Subscribers,
}

/// A journal entry on its way to the disk on the record lane, and the step it saves: the node
/// whose stage it records and the node the track goes to next.
struct Ahead {
    written: std::pin::Pin<Box<dyn Future<Output = Written> + Send>>,
    saved: Saved,
}

/// What a save handed ahead saved: the node whose stage it records, and the track's next node.
pub(crate) type Saved = (String, Option<String>);

/// What a write did: its result, the snapshot it was given back, and whether it appended entries.
type Written = (io::Result<()>, Option<Checkpoint>, bool);

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
    pub(crate) fn new(
        run_id: &str,
        store: Arc<dyn RunStore>,
        blobs: Arc<dyn BlobStore>,
        events: Subscribers,
    ) -> Self {
        Self {
            // Replaced by the checkpoint the run starts from.
            book: Mutex::new(Book {
                checkpoint: Checkpoint::new(run_id, "", BTreeMap::new()),
                pending: Vec::new(),
            }),
            queued: Arc::default(),
            writer: Arc::default(),
            syncing: Mutex::new(None),
            ahead: Mutex::new(None),
            store,
            blobs,
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

    /// Saves what changed since the last save: one journal entry, appended (on the blocking pool),
    /// with `seq` the last event's number, and synced to disk while the run goes on. What is written
    /// is what changed, not the whole checkpoint.
    pub(crate) async fn save(&self, seq: u64) -> io::Result<()> {
        self.queue_entry(&mut self.book(), seq);
        self.write(None).await.0
    }

    /// Saves what changed since the last save as [`Recorder::save`] does, but hands the write to
    /// the record lane and returns at once: the next stage's directory, made on the lane after it,
    /// waits for it there instead of the run waiting for each in turn. [`Recorder::settle`] gives
    /// the write's result, and must be awaited before the next stage's work begins; `saved` comes
    /// back with it.
    pub(crate) async fn save_ahead(&self, seq: u64, saved: Saved) {
        // The save before it first: each write takes what is queued, in order.
        let _ = self.settle().await;
        self.queue_entry(&mut self.book(), seq);
        self.synced().await;
        *self.ahead.lock() = Some(Ahead {
            written: Box::pin(in_order(self.write_job(None))),
            saved,
        });
    }

    /// Waits for the write [`Recorder::save_ahead`] handed on, if one is on its way, and starts
    /// its sync: what it saved, or its error (which every later write gives too, as for
    /// [`Recorder::save`]).
    pub(crate) async fn settle(&self) -> io::Result<Option<Saved>> {
        let ahead = self.ahead.lock().take();
        let Some(Ahead { written, saved }) = ahead else {
            return Ok(None);
        };
        let (written, _, appended) = written.await;
        if appended && written.is_ok() {
            self.start_sync();
        }
        written.map(|()| Some(saved))
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
    ///
    /// The entries appended are synced to disk after this returns, while the run goes on (the next
    /// stage starting): a kill loses nothing written, and a crash of the machine loses at most the
    /// entries of the last stage, which then runs again, as one cut short does (its work in the
    /// working directory was not synced either). The next write waits for the sync, so entries
    /// become durable in order; a snapshot syncs the journal before it is saved, as it counts on
    /// the entries before it.
    async fn write(&self, snapshot: Option<Checkpoint>) -> (io::Result<()>, Option<Checkpoint>) {
        // A write handed ahead goes first; its error, if any, is the writer's now.
        let _ = self.settle().await;
        self.synced().await;
        let is_snapshot = snapshot.is_some();
        let (written, snapshot, appended) = blocking(self.write_job(snapshot)).await;
        if appended && written.is_ok() && !is_snapshot {
            self.start_sync();
        }
        (written, snapshot)
    }

    /// Waits for the sync of the entries last appended.
    async fn synced(&self) {
        let syncing = self.syncing.lock().take();
        if let Some(syncing) = syncing {
            // Its error, if any, is the writer's now.
            let _ = syncing.await;
        }
    }

    /// The blocking work of a write: the queued stage statuses, the event log, the queued journal
    /// entries, then `snapshot` if given.
    fn write_job(&self, snapshot: Option<Checkpoint>) -> impl FnOnce() -> Written + Send + 'static {
        let (store, blobs, events) = (self.store.clone(), self.blobs.clone(), self.events.clone());
        let (queued, writer) = (self.queued.clone(), self.writer.clone());
        move || {
            let mut failed = writer.lock();
            if let (Some(error), None) = (&*failed, &snapshot) {
                return (Err(io::Error::other(error.clone())), snapshot, false);
            }
            let Queued { statuses, entries } = std::mem::take(&mut *queued.lock());
            let appended = !entries.is_empty() && failed.is_none();
            let written = (|| {
                for status in statuses {
                    status.write(&*store)?;
                }
                events.flush()?;
                if appended {
                    store.append_journal(&entries)?;
                }
                if let Some(snapshot) = &snapshot {
                    blobs.sync()?;
                    store.sync_journal()?;
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
            (written, snapshot, appended)
        }
    }

    /// Starts the sync of the entries just appended, which runs while the run goes on.
    fn start_sync(&self) {
        let (store, blobs, writer) = (self.store.clone(), self.blobs.clone(), self.writer.clone());
        *self.syncing.lock() = Some(start_blocking(move || {
            // The blobs the entries name first: an entry must not outlast them in a crash.
            if let Err(error) = blobs.sync().and_then(|()| store.sync_journal()) {
                writer.lock().get_or_insert(error.to_string());
            }
        }));
    }

    /// Creates a stage attempt's directory on the record lane ([`in_order`]): asked for at once,
    /// made after the writes handed to the lane before it.
    pub(crate) fn stage_dir(
        &self,
        rank: u32,
        node: &str,
        visit: u32,
    ) -> impl Future<Output = io::Result<PathBuf>> + Send + use<> {
        let (store, node) = (self.store.clone(), node.to_owned());
        in_order(move || store.stage_dir(rank, &node, visit))
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
///
/// The work is handed to the lane when this is called, not when the future is first polled, so
/// work asked for later runs after it, and a result nobody waits for yet wakes nobody. (Without a
/// thread for the lane, the work starts on the pool at once, in no order.)
fn in_order<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> impl Future<Output = T> + Send + 'static {
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
    // No thread for the lane: the pool does the work, started now all the same.
    let pool = refused.map(start_blocking);
    async move {
        if let Some(pool) = pool {
            let _ = pool.await;
        }
        // The lane runs every job it is given (a panic is caught in the job), so the answer comes.
        match receiver.await.expect("the record lane runs every job") {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that keeps only the order of its journal calls, and fails its syncs when asked.
    #[derive(Default)]
    struct Calls {
        log: Mutex<Vec<&'static str>>,
        failing_sync: std::sync::atomic::AtomicBool,
        failing_append: std::sync::atomic::AtomicBool,
    }

    impl RunStore for Calls {
        fn stage_dir(&self, _: u32, node: &str, _: u32) -> io::Result<PathBuf> {
            self.log.lock().push("dir");
            Ok(PathBuf::from(node))
        }
        fn write_status(&self, _: &Path, _: &StatusFile) -> io::Result<()> {
            Ok(())
        }
        fn read_status(&self, _: &Path) -> io::Result<Option<StatusFile>> {
            Ok(None)
        }
        fn save_checkpoint(&self, _: &Checkpoint) -> io::Result<()> {
            self.log.lock().push("snapshot");
            Ok(())
        }
        fn append_journal(&self, _: &[JournalEntry]) -> io::Result<()> {
            if self
                .failing_append
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                return Err(io::Error::other("the disk is full"));
            }
            self.log.lock().push("append");
            Ok(())
        }
        fn sync_journal(&self) -> io::Result<()> {
            self.log.lock().push("sync");
            if self.failing_sync.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(io::Error::other("the disk is gone"));
            }
            Ok(())
        }
        fn finished_stages(&self) -> io::Result<Vec<crate::checkpoint::StageRecord>> {
            Ok(Vec::new())
        }
        fn child(&self, _: &Path) -> io::Result<Arc<dyn RunStore>> {
            unreachable!("no sub-workflow here")
        }
    }

    /// Also the blob store: its syncs are logged with the journal's.
    impl BlobStore for Calls {
        fn put(&self, _: &[u8]) -> io::Result<String> {
            unreachable!("no stage runs here")
        }
        fn get(&self, _: &str) -> io::Result<Vec<u8>> {
            unreachable!("no stage runs here")
        }
        fn path_of(&self, _: &str) -> Option<PathBuf> {
            None
        }
        fn sync(&self) -> io::Result<()> {
            self.log.lock().push("blobs");
            Ok(())
        }
    }

    fn recorder(store: &Arc<Calls>) -> Recorder {
        Recorder::new("R", store.clone(), store.clone(), Subscribers::new([]))
    }

    fn change(recorder: &Recorder) {
        let change = TrackChange::take(&[], &mut Track::default(), BTreeMap::new());
        recorder.book().change(Change::Track(Box::new(change)));
    }

    #[tokio::test]
    async fn an_entry_is_synced_after_its_blobs_and_before_the_next_entry_and_any_snapshot() {
        let store = Arc::new(Calls::default());
        let recorder = recorder(&store);
        change(&recorder);
        recorder.save(1).await.unwrap();
        change(&recorder);
        recorder.save(2).await.unwrap();
        change(&recorder);
        recorder.save_snapshot(3).await.unwrap();
        assert_eq!(
            *store.log.lock(),
            [
                "append", "blobs", "sync", "append", "blobs", "sync", "append", "blobs", "sync",
                "snapshot"
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_sync_fails_the_next_save_until_a_snapshot_succeeds() {
        let store = Arc::new(Calls::default());
        let recorder = recorder(&store);
        store
            .failing_sync
            .store(true, std::sync::atomic::Ordering::Relaxed);
        change(&recorder);
        recorder.save(1).await.unwrap();
        change(&recorder);
        let error = recorder.save(2).await.unwrap_err();
        assert!(error.to_string().contains("the disk is gone"), "{error}");
        // No entry follows one that may be lost: the journal must have no gaps.
        assert_eq!(*store.log.lock(), ["append", "blobs", "sync"]);

        store
            .failing_sync
            .store(false, std::sync::atomic::Ordering::Relaxed);
        recorder.save_snapshot(3).await.unwrap();
        change(&recorder);
        recorder.save(4).await.unwrap();
        // (Its sync may be running still.)
        assert_eq!(
            store.log.lock()[..7],
            [
                "append", "blobs", "sync", "blobs", "sync", "snapshot", "append"
            ]
        );
    }

    #[tokio::test]
    async fn a_save_handed_ahead_is_written_before_the_next_stage_directory_and_then_synced() {
        let store = Arc::new(Calls::default());
        let recorder = recorder(&store);
        change(&recorder);
        let saved = ("a".to_owned(), Some("b".to_owned()));
        recorder.save_ahead(1, saved.clone()).await;
        let dir = recorder.stage_dir(2, "b", 1).await.unwrap();
        assert_eq!(dir, PathBuf::from("b"));
        assert_eq!(recorder.settle().await.unwrap(), Some(saved));
        // Nothing more to wait for; the next save waits for the sync the first one started.
        assert_eq!(recorder.settle().await.unwrap(), None);
        change(&recorder);
        recorder.save(2).await.unwrap();
        // (The second one's sync may be running still.)
        assert_eq!(
            store.log.lock()[..5],
            ["append", "dir", "blobs", "sync", "append"]
        );
    }

    #[tokio::test]
    async fn a_save_handed_ahead_that_fails_fails_its_settling_and_the_saves_after_it() {
        let store = Arc::new(Calls::default());
        let recorder = recorder(&store);
        store
            .failing_append
            .store(true, std::sync::atomic::Ordering::Relaxed);
        change(&recorder);
        recorder.save_ahead(1, ("a".to_owned(), None)).await;
        let error = recorder.settle().await.unwrap_err();
        assert!(error.to_string().contains("the disk is full"), "{error}");
        store
            .failing_append
            .store(false, std::sync::atomic::Ordering::Relaxed);
        change(&recorder);
        let error = recorder.save(2).await.unwrap_err();
        assert!(error.to_string().contains("the disk is full"), "{error}");
        assert_eq!(*store.log.lock(), [] as [&str; 0]);
    }
}
