//! `trellis-store` keeps the run record on disk (DESIGN.md §4):
//!
//! ```text
//! <runs dir>/<run id>/
//!   run.json          workflow name, goal, source path, status, times, settings
//!   owner             the live owner's pid, under its `flock` (one owner per run)
//!   workflow.fabro    the exact source that ran
//!   checkpoint.json   a snapshot, written atomically when a run starts and stops (temp, fsync, rename)
//!   journal.jsonl     one synced line per stage with what it changed (replayed after the snapshot)
//!   events.jsonl      append-only event log
//!   stages/001-plan@1/ status.json, stdout.log and stderr.log (when written to), ...
//!                     (read live by [`StageOutput`])
//!   blobs/<hex>       content-addressed values
//! ```
//!
//! It implements the engine's `RunStore`, `BlobStore` and `EventSink` traits (the event log is
//! written by [`EventLog`]: lines are queued, and appended by a writer thread or before a checkpoint).

#![allow(
    clippy::disallowed_methods,
    reason = "the run record is written synchronously; the engine calls the store on the blocking pool"
)]

mod blobs;
mod event_log;
mod owner;
mod run_dir;
mod stage_output;

pub use blobs::FileBlobs;
pub use event_log::{EventLog, Written};
pub use owner::Owner;
pub use run_dir::{
    EventTail, GitWorkspace, RunDir, RunMeta, StoreError, TemporalTarget, default_runs_dir,
    list_runs, new_run_id, plain_name, read_whole_lines, resolve_runs_dir, write_atomically,
};
pub use stage_output::{Chunk, Position, StageOutput, StageState, Stream, last_line};
