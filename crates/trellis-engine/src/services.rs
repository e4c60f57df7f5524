//! The seams the engine calls through, each a small trait owned here: where the run record goes
//! ([`RunStore`]), where large values go ([`BlobStore`]), who hears about progress ([`EventSink`]), who
//! answers human gates ([`Interviewer`]), who judges natural-language edges ([`Router`]). `trellis-store`
//! and `trellis-handlers` implement them; tests use the in-memory ones in [`memory`].

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use trellis_workflow::StageStatus;

use crate::checkpoint::Checkpoint;
use crate::event::Event;
use crate::status_file::StatusFile;

pub use crate::blob::{BLOB_PREFIX, BLOB_THRESHOLD, BlobStore, EMPTY_BLOB};

/// The name of one stage attempt's directory: `{rank:03}-{node}@{visit}`, with every character of the
/// node id that could leave the directory or confuse a reader — `/`, `%`, NUL and other control
/// characters — written as `%XX`. Validation refuses such ids; this holds whatever reaches the store.
pub fn stage_dir_name(rank: u32, node: &str, visit: u32) -> String {
    use std::fmt::Write as _;
    let mut name = format!("{rank:03}-");
    for c in node.chars() {
        if c == '/' || c == '%' || c.is_control() {
            let mut bytes = [0u8; 4];
            for byte in c.encode_utf8(&mut bytes).bytes() {
                let _ = write!(name, "%{byte:02X}");
            }
        } else {
            name.push(c);
        }
    }
    let _ = write!(name, "@{visit}");
    name
}

/// The durable record of a run.
pub trait RunStore: Send + Sync {
    /// Creates the directory of one stage attempt (`stages/` + [`stage_dir_name`]).
    fn stage_dir(&self, rank: u32, node: &str, visit: u32) -> io::Result<PathBuf>;
    /// Writes a stage attempt's `status.json`.
    fn write_status(&self, stage_dir: &std::path::Path, status: &StatusFile) -> io::Result<()>;
    /// Reads back the `status.json` written in `stage_dir`, if there is one.
    fn read_status(&self, stage_dir: &std::path::Path) -> io::Result<Option<StatusFile>>;
    /// Saves a snapshot of the checkpoint atomically: after a crash, either the old or the new one is
    /// there, whole.
    fn save_checkpoint(&self, checkpoint: &Checkpoint) -> io::Result<()>;
    /// Appends journal entries: when this returns they survive the process (a kill), and a crash
    /// mid-write leaves at most a torn last entry, which readers drop. [`sync_journal`] makes them
    /// survive the machine too.
    ///
    /// [`sync_journal`]: RunStore::sync_journal
    fn append_journal(&self, entries: &[crate::checkpoint::JournalEntry]) -> io::Result<()>;
    /// Makes every journal entry appended so far durable on disk (a store that keeps nothing on disk
    /// has nothing to do).
    fn sync_journal(&self) -> io::Result<()> {
        Ok(())
    }
    /// Every finished stage attempt in the record, in order.
    fn finished_stages(&self) -> io::Result<Vec<crate::checkpoint::StageRecord>>;
    /// The record of a sub-workflow run inside a stage directory.
    fn child(&self, stage_dir: &std::path::Path) -> io::Result<std::sync::Arc<dyn RunStore>>;
}

/// Where the engine reads time: the wall clock for timestamps and retry jitter, a monotonic instant for
/// durations (tokio's, so tests with paused time measure what they scheduled).
pub trait Clock: Send + Sync {
    fn now(&self) -> std::time::SystemTime;

    fn instant(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
}

/// The system's clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> std::time::SystemTime {
        std::time::SystemTime::now()
    }
}

/// Receives every event, in order.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: &Event);
    /// Returns once every event received so far is stored (a sink that stores nothing has nothing to
    /// wait for). The engine calls it before each checkpoint, so a checkpoint never names an event the
    /// log does not have; an error is a write error of the log, reported, never dropped.
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Everyone who hears a run's events, in order: the run record's log, the terminal display, a live
/// stream. Persisting events and showing them are separate subscribers.
#[derive(Clone, Default)]
pub struct Subscribers(Vec<std::sync::Arc<dyn EventSink>>);

impl Subscribers {
    pub fn new(sinks: impl IntoIterator<Item = std::sync::Arc<dyn EventSink>>) -> Self {
        Self(sinks.into_iter().collect())
    }

    pub fn emit(&self, event: &Event) {
        for sink in &self.0 {
            sink.emit(event);
        }
    }

    pub fn flush(&self) -> io::Result<()> {
        self.0.iter().try_for_each(|sink| sink.flush())
    }
}

/// One option of a human gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub label: String,
    pub key: Option<char>,
}

/// What a human gate asks.
#[derive(Debug, Clone)]
pub struct Question {
    pub node_id: String,
    pub prompt: String,
    pub choices: Vec<Choice>,
    /// Whether free text is accepted (the gate has a `freeform=true` edge).
    pub freeform: bool,
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Choice(usize),
    Freeform(String),
    /// The gate's timeout ran out.
    TimedOut,
    /// Nobody can answer now (a non-interactive run): the run waits for input.
    Unavailable,
}

#[async_trait]
pub trait Interviewer: Send + Sync {
    async fn ask(&self, question: &Question) -> Answer;
}

/// Whether the main track goes on to its next stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    Go,
    /// The run's execution ends here, between two stages: its record says `running`, every
    /// finished stage is saved, and resuming it goes on with the next stage (no end event, no
    /// end hooks).
    Park,
}

/// Something outside the engine that paces the main track (a distributed backend that runs each
/// stage as a unit of its own): asked before each stage other than the start and the exit, once
/// the previous stage's checkpoint is saved. The branches of a fan-out on the main track are paced
/// too, each as a unit of its own; what runs inside a branch or a sub-workflow is not.
#[async_trait]
pub trait Pacer: Send + Sync {
    async fn next_stage(&self, node: &str) -> Pace;

    /// A fan-out on the main track, `node`'s stage, is about to run `branches` (those a resumed
    /// fan-out has not finished), each asked for with [`Pacer::next_branch`] when its turn under
    /// `max_parallel` comes. The fan-out is over when the lease is dropped: a branch not asked for
    /// by then does not run in it.
    fn fan_out(&self, _node: &str, _branches: &[String]) -> Lease {
        Lease::none()
    }

    /// A sub-workflow on the main track, `node`'s stage, starts its child run: a pacer that runs
    /// the child's stages as units of their own returns the pacer of the child's main track —
    /// asked before each of its stages and branches, it must not park them: a child run starts
    /// over when its stage does — and a lease held while the child runs.
    fn sub_workflow(&self, _node: &str) -> Option<(Arc<dyn Pacer>, Lease)> {
        None
    }

    /// Asked before the branch `branch` of the fan-out at `node` runs: it runs when this returns,
    /// and the lease says how it ended (dropped without a word: it was cancelled or the run
    /// stopped).
    async fn next_branch(&self, _node: &str, _branch: &str) -> Lease {
        Lease::none()
    }

    /// A wait on the main track offers its time: `true` when the pacer keeps it (a durable timer
    /// of its own). The wait's stage then parks the run, and runs again — ending at once — when the
    /// pacer goes on at `until`.
    fn keeps_time(&self, _node: &str, _until: std::time::SystemTime) -> bool {
        false
    }

    /// The run's record is about to save a step (or the run's end): a pacer that carries the run's
    /// working tree to other machines makes the tree durable first, so that wherever the run is
    /// opened from that step, its tree is as the step left it (or later). An error stops the run
    /// with it.
    async fn saving(&self) -> Result<(), String> {
        Ok(())
    }
}

/// What a pacer hears when a unit it paced ends: the branch's status, or nothing when the unit
/// was dropped before it finished.
pub struct Lease(Option<Box<dyn FnOnce(Option<StageStatus>) + Send>>);

impl Lease {
    /// A lease nobody listens to.
    pub fn none() -> Self {
        Self(None)
    }

    /// A lease that calls `ended` once: with the status it is ended with, or `None` when dropped.
    pub fn new(ended: impl FnOnce(Option<StageStatus>) + Send + 'static) -> Self {
        Self(Some(Box::new(ended)))
    }

    /// The unit ended with `status`.
    pub fn end(mut self, status: StageStatus) {
        if let Some(ended) = self.0.take() {
            ended(Some(status));
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(ended) = self.0.take() {
            ended(None);
        }
    }
}

pub use crate::event::RouteOption;

/// The answer that stands for "none of the above" (the default edge).
pub const NONE_OF_THE_ABOVE: &str = "none_of_the_above";

/// What a router judges: the live `when` edges of a stage, and what the stage's run has produced.
pub struct RouteRequest<'a> {
    pub node_id: &'a str,
    pub options: &'a [RouteOption],
    /// The target of the unconditional edge offered as "none of the above", when there is one.
    pub default: Option<&'a str>,
    /// The route-eval view: the workflow input and every prior node's result, long values cut with a
    /// marker (see `route_view`).
    pub view: &'a Value,
    /// The stage's directory, where the router keeps its prompt and answer.
    pub record_dir: Option<&'a std::path::Path>,
}

#[async_trait]
pub trait Router: Send + Sync {
    /// Picks one of `request.options`, or none (then the engine takes the default edge, or stops the
    /// run naming the answer). Model calls it makes are reported through `events`.
    async fn choose(
        &self,
        request: &RouteRequest<'_>,
        events: &dyn crate::event::Emitter,
    ) -> Result<RouteChoice, String>;
}

/// A router's answer: the option it picked (`None` for "none of the above", or an answer that names
/// no live choice), the answer as given, the model's stated reason, and what judging cost (model,
/// provider, usage), recorded on the `EdgeSelected` event and in the stage's `status.json`.
#[derive(Debug, Clone, Default)]
pub struct RouteChoice {
    pub choice: Option<usize>,
    pub answer: String,
    pub reason: Option<String>,
    pub model: Option<crate::details::ModelDetails>,
}

/// In-memory implementations, for tests and dry runs.
pub mod memory {
    use parking_lot::Mutex;
    use std::collections::HashMap;

    use super::{Answer, BLOB_PREFIX, BlobStore, EventSink, Interviewer, Question};
    use crate::event::Event;

    #[derive(Default)]
    pub struct MemoryBlobs {
        blobs: Mutex<HashMap<String, Vec<u8>>>,
    }

    impl BlobStore for MemoryBlobs {
        fn put(&self, bytes: &[u8]) -> std::io::Result<String> {
            let reference = format!("{BLOB_PREFIX}{:016x}{:08x}", fxhash(bytes), bytes.len());
            self.blobs.lock().insert(reference.clone(), bytes.to_vec());
            Ok(reference)
        }

        fn get(&self, reference: &str) -> std::io::Result<Vec<u8>> {
            self.blobs.lock().get(reference).cloned().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, reference.to_owned())
            })
        }

        fn path_of(&self, _reference: &str) -> Option<std::path::PathBuf> {
            None
        }
    }

    fn fxhash(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// Collects events in memory.
    #[derive(Default)]
    pub struct MemoryEvents {
        pub events: Mutex<Vec<Event>>,
    }

    impl MemoryEvents {
        /// The names of the events received, in order.
        pub fn names(&self) -> Vec<String> {
            self.events
                .lock()
                .iter()
                .map(|e| e.name().to_owned())
                .collect()
        }
    }

    impl EventSink for MemoryEvents {
        fn emit(&self, event: &Event) {
            self.events.lock().push(event.clone());
        }
    }

    /// A run record kept in memory: the last snapshot with the journal entries after it replayed,
    /// readable by tests. Stage directories are still created, under `root`, since handlers write
    /// their files into them.
    pub struct MemoryStore {
        root: std::path::PathBuf,
        checkpoint: Mutex<Option<crate::checkpoint::Checkpoint>>,
    }

    impl MemoryStore {
        pub fn new(root: impl Into<std::path::PathBuf>) -> Self {
            Self {
                root: root.into(),
                checkpoint: Mutex::default(),
            }
        }

        /// The last checkpoint saved.
        pub fn last_checkpoint(&self) -> Option<crate::checkpoint::Checkpoint> {
            self.checkpoint.lock().clone()
        }
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "the engine calls the run store on the blocking pool"
    )]
    impl super::RunStore for MemoryStore {
        fn stage_dir(
            &self,
            rank: u32,
            node: &str,
            visit: u32,
        ) -> std::io::Result<std::path::PathBuf> {
            let dir = self.root.join(super::stage_dir_name(rank, node, visit));
            std::fs::create_dir_all(&dir)?;
            Ok(dir)
        }

        fn write_status(
            &self,
            _dir: &std::path::Path,
            _status: &crate::status_file::StatusFile,
        ) -> std::io::Result<()> {
            Ok(())
        }

        fn read_status(
            &self,
            _dir: &std::path::Path,
        ) -> std::io::Result<Option<crate::status_file::StatusFile>> {
            Ok(None)
        }

        fn save_checkpoint(
            &self,
            checkpoint: &crate::checkpoint::Checkpoint,
        ) -> std::io::Result<()> {
            let mut saved = self.checkpoint.lock();
            // As a reader of a real record would: the stages come from the journal.
            let stages = saved.take().map(|c| c.stages).unwrap_or_default();
            let mut checkpoint = checkpoint.clone();
            if checkpoint.stages.is_empty() {
                checkpoint.stages = stages;
            }
            *saved = Some(checkpoint);
            Ok(())
        }

        fn finished_stages(&self) -> std::io::Result<Vec<crate::checkpoint::StageRecord>> {
            Ok(self.last_checkpoint().map(|c| c.stages).unwrap_or_default())
        }

        fn append_journal(
            &self,
            entries: &[crate::checkpoint::JournalEntry],
        ) -> std::io::Result<()> {
            if let Some(checkpoint) = self.checkpoint.lock().as_mut() {
                for entry in entries {
                    if entry.n > checkpoint.journal {
                        checkpoint.replay(entry);
                    }
                }
            }
            Ok(())
        }

        fn child(
            &self,
            dir: &std::path::Path,
        ) -> std::io::Result<std::sync::Arc<dyn super::RunStore>> {
            Ok(std::sync::Arc::new(MemoryStore::new(dir.join("child"))))
        }
    }

    /// A wall clock that always says the same time, for reproducible timestamps.
    pub struct FixedClock(pub std::time::SystemTime);

    impl super::Clock for FixedClock {
        fn now(&self) -> std::time::SystemTime {
            self.0
        }
    }

    /// Answers nothing: every gate waits for input.
    pub struct NoAnswers;

    #[async_trait::async_trait]
    impl Interviewer for NoAnswers {
        async fn ask(&self, _question: &Question) -> Answer {
            Answer::Unavailable
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_node_id_names_a_stage_directory_outside_its_parent() {
        assert_eq!(super::stage_dir_name(7, "review", 2), "007-review@2");
        assert_eq!(
            super::stage_dir_name(1, "../../../tmp/x/pwn", 1),
            "001-..%2F..%2F..%2Ftmp%2Fx%2Fpwn@1"
        );
        assert_eq!(
            super::stage_dir_name(1, "a\0b\nc%", 1),
            "001-a%00b%0Ac%25@1"
        );
    }
}
