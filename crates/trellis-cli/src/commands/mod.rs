//! One module per subcommand. Shared here: exit codes, colour choice and text fit for a terminal.

pub mod exec;
pub mod graph;
mod huge_pages;
pub mod logs;
pub mod models;
mod progress;
pub mod rules;
pub mod run;
pub mod runs;
pub mod serve;
pub mod steer;
pub mod temporal;
pub mod validate;

use std::borrow::Cow;
use std::io::IsTerminal;

use clap::ValueEnum;

/// `text` a run recorded (a command's output, a failure reason, a context value: anything a stage
/// or a model wrote) fit to print in a summary line: control characters other than a tab, and the
/// marks that turn text right to left, are written as escapes (`\n`, `\u{1b}`), so a hostile
/// output cannot move the cursor, retitle the terminal or hide what follows. A stage's output
/// printed whole (`trellis logs`, `--verbose`) is passed on as it is, as `cat` would.
pub fn printable(text: &str) -> Cow<'_, str> {
    let hidden = |c: char| c == '\n' || trellis_syntax::acts_on_terminal(c);
    if !text.contains(hidden) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

/// The sandbox the user chose, with this executable as the reaper of unconfined children (see
/// `trellis_process::reaper`); this process stops being readable by its children.
pub fn sandbox(
    choice: Option<trellis_run::SandboxChoice>,
) -> anyhow::Result<std::sync::Arc<trellis_run::Sandbox>> {
    trellis_process::secrets::keep_this_process_private();
    let mut sandbox = trellis_run::sandbox(choice)?;
    if let Ok(trellis) = std::env::current_exe() {
        sandbox = sandbox.with_reaper(trellis_process::reaper::Launcher::beside(&trellis));
    }
    Ok(std::sync::Arc::new(sandbox))
}

/// Runs a run's async work on a runtime of one thread, the calling one. The engine walks a run —
/// every branch of a fan-out too — in one task, and its file work goes to the blocking pool, so
/// worker threads would only add a thread switch to every wake-up. The pool's work is short (what
/// lasts a stage has a thread of its own, see `trellis_process::task::own_thread`), so a few
/// threads serve a wide fan-out as well as one each, without starting sixty of them. Leaves without
/// waiting for work still in flight (a console gate still reading a line after the run was
/// cancelled): whatever the work wrote is done when it returns.
pub fn on_runtime<T>(work: impl Future<Output = T>) -> std::io::Result<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(blocking_threads())
        .build()?;
    Ok(finish(runtime, work))
}

/// The most threads a run's blocking pool starts: two per core, 4 to 16. Its work (starting a
/// process, writing a stage's files) is short and keeps a core busy; more threads than that only
/// add thread starts during a burst and wake-ups at exit (a 64-branch fan-out of `sleep 0.2` on 2
/// cores took 1 – 6 ms less with 4 threads than with 16, in six alternating batches).
fn blocking_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    (cores * 2).clamp(4, 16)
}

/// Like [`on_runtime`] with a worker thread per core, for the server's many connections and runs.
pub fn on_server_runtime<T>(work: impl Future<Output = T>) -> std::io::Result<T> {
    Ok(finish(tokio::runtime::Runtime::new()?, work))
}

/// Runs `work` to its end, then leaves the runtime without joining its idle threads.
fn finish<T>(runtime: tokio::runtime::Runtime, work: impl Future<Output = T>) -> T {
    let result = runtime.block_on(work);
    runtime.shutdown_background();
    result
}

/// Exit code for a workflow with errors.
pub const EXIT_INVALID: u8 = 1;
/// Exit code for usage and file-system problems.
pub const EXIT_USAGE: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether to colour output written to a stream with the given terminal-ness.
    pub fn enabled(self, is_terminal: bool) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => is_terminal && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    pub fn for_stdout(self) -> bool {
        self.enabled(std::io::stdout().is_terminal())
    }

    pub fn for_stderr(self) -> bool {
        self.enabled(std::io::stderr().is_terminal())
    }
}

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[cfg(test)]
mod tests {
    #[test]
    fn printable_text_escapes_what_would_steer_the_terminal() {
        assert_eq!(super::printable("plain\ttext é"), "plain\ttext é");
        assert_eq!(
            super::printable("a\x1b]0;pwned\x07b\x1b[2J\r\nc\u{202e}d"),
            "a\\u{1b}]0;pwned\\u{7}b\\u{1b}[2J\\r\\nc\\u{202e}d"
        );
    }
}
