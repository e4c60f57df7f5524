//! `trellis-process`: how Trellis starts and ends the processes a run asks for. Every crate that starts
//! a child — command stages and coding-agent CLIs in `trellis-handlers`, the agent's `shell` tool in
//! `trellis-agent`, the run library when it reaps what a killed run left — goes through it:
//!
//! - [`group`]: a child in a process group of its own, killed with everything it started when its
//!   stage ends, and the markers (`TRELLIS_STAGE_DIR`, `TRELLIS_RUN_ID`) that find its processes again.
//! - [`secrets`]: the environment a child gets (without the user's secrets) and the redaction of
//!   secret values from what children print; the random tokens that guard a server (`trellis serve`,
//!   the local model server).
//! - [`sandbox`]: the confinement a child runs in (bubblewrap, or none when the user says so).
//! - [`reaper`]: what ends everything an unconfined child started, however it left; [`spawner`]:
//!   one reaper process that forks the reaper of each command; [`child`]: a child started either way.
//! - [`port`]: a free loopback port for a server a run starts; [`git`]: `git` as Trellis runs it
//!   itself, in trees a run's stages may have written.
//! - [`files`]: opening a file, or making folders, by a resolved path so that no folder swapped for
//!   a link since leads them elsewhere (the agent's file tools, the files a run finds in its working directory).
//! - [`task`]: blocking work on the blocking pool, and [`backoff`]: how long to wait before a retry.
//! - [`note!`] and [`shown_on_stderr`]: this process's own messages on standard error, which never
//!   end it once nobody reads them.
//!
//! It sits at the bottom of the process side of the workspace: `trellis-llm`, `trellis-agent`,
//! `trellis-handlers` and `trellis-run` build on it (and `trellis-syntax`, for [`files`] alone), and
//! it depends on no other Trellis crate. The engine uses it for [`task`] and [`backoff`] alone.

pub mod backoff;
pub mod child;
pub mod files;
pub mod git;
pub mod group;
pub mod port;
pub mod reaper;
pub mod sandbox;
pub mod secrets;
pub mod spawner;
pub mod task;

/// Writes `text` on this process's standard error at once, or nowhere when nobody reads it any more:
/// where `eprint!` panics once its reader has gone (`trellis run w.fabro 2>&1 | head`), the process
/// carries on — a run to its end and its record, a server to let go of a finished run.
pub fn shown_on_stderr(text: &str) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// A line on standard error, as `eprintln!` writes it, through [`shown_on_stderr`].
#[macro_export]
macro_rules! note {
    () => {
        $crate::shown_on_stderr("\n")
    };
    ($($arg:tt)*) => {
        $crate::shown_on_stderr(&format!("{}\n", format_args!($($arg)*)))
    };
}
