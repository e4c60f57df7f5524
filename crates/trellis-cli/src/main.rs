//! The `trellis` command: parses arguments and hands each subcommand to its module in [`commands`].
//! Exit codes: 0 success, 1 an invalid workflow (or a failed run), 2 usage or file-system problems,
//! 3 a run waiting for input, 141 (quietly) a reader of the output that stopped early.

#![allow(
    clippy::disallowed_methods,
    reason = "the commands are synchronous; a run's async path goes through trellis-run"
)]

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run AI-agent workflows defined as graphs.
#[derive(Parser)]
#[command(name = "trellis", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check workflow files and report every problem with its location.
    Validate(commands::validate::Args),
    /// Print the compiled workflow as normalized DOT: what the engine will run.
    Graph(commands::graph::Args),
    /// List the validation rules with their codes and severities.
    Rules(commands::rules::Args),
    /// Run a workflow, recording every stage; exits 0 on success, 1 on failure, 3 when waiting for input.
    Run(commands::run::RunArgs),
    /// Run one agent on a prompt, on the working directory, without a workflow file; its answer
    /// goes to standard output. Recorded as a run: `show`, `logs`, `steer` and `resume` work on it.
    Exec(commands::exec::ExecArgs),
    /// Continue a run from its last checkpoint (after a crash, a kill or a stop for input).
    Resume(commands::run::ResumeArgs),
    /// List recent runs.
    Runs(commands::runs::RunsArgs),
    /// Show a run's stages, outcomes and context.
    Show(commands::runs::ShowArgs),
    /// Cancel a running run, here or on Temporal; `trellis resume` continues it.
    Cancel(commands::runs::CancelArgs),
    /// Print a run's event log.
    Events(commands::runs::EventsArgs),
    /// Print a stage's output (a command's output, an agent's transcript); `--follow` prints it live.
    Logs(commands::logs::LogsArgs),
    /// Send a running agent a message (a course correction), read before its next model call.
    Steer(commands::steer::SteerArgs),
    /// Execute runs submitted to Temporal (`trellis run --temporal`): start any number, anywhere
    /// that reaches the service and the runs directory.
    Worker(commands::temporal::WorkerArgs),
    /// Serve the HTTP API and the web app: start, watch, answer and cancel runs from a browser.
    Serve(commands::serve::Args),
    /// Show the configured model providers, the local model's state and the model catalog.
    Models(commands::models::Args),
    /// Print a shell completion script: `trellis completions bash > ~/.local/share/bash-completion/completions/trellis`.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// The status a command ends with, quietly, when the reader of its standard output has gone: the
/// one a SIGPIPE would give, as other command-line tools end.
const CLOSED_STDOUT: u8 = 141;

/// A reader that stops early (`trellis rules | head`) closes the pipe; Rust's `println!` then panics.
/// End quietly instead ([`CLOSED_STDOUT`]); a command that writes with `?` ends so in `main`
/// ([`stdout_closed`]).
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") {
            std::process::exit(CLOSED_STDOUT.into());
        }
        default(info);
    }));
}

/// Whether `error` is a write to a standard output whose reader has gone (`trellis validate big.fabro
/// | head`): the commands that write with `?` end with it. Only a broken pipe on the standard output
/// itself ends quietly; one anywhere else is an error to report.
fn stdout_closed(error: &anyhow::Error) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let broken_pipe = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    });
    if !broken_pipe {
        return false;
    }
    // A pipe whose reader has closed polls as an error for its writer.
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(
        std::os::fd::AsFd::as_fd(&stdout),
        PollFlags::POLLOUT,
    )];
    poll(&mut fds, PollTimeout::ZERO).is_ok()
        && fds[0]
            .revents()
            .is_some_and(|events| events.contains(PollFlags::POLLERR))
}

/// An error and its causes in one line, as `{:#}` writes it, less the causes the message before
/// them already says: most of Trellis's errors quote their cause (`cannot read PATH: CAUSE`) and
/// name it as their source too, and the user should read it once.
fn described(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.is_empty() {
            text = cause;
        } else if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

/// `trellis completions SHELL`. The script is written whole into memory first: `clap_complete`
/// panics when it cannot write (`trellis completions fish | head`), and a write here ends as any
/// other command's does when its reader has gone.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    use clap::CommandFactory as _;
    use std::io::Write as _;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "trellis", &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script)?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    // `trellis __reap PROGRAM ARGS...`: the reaper an unconfined command runs under (never typed by
    // a user; see `trellis_process::reaper`).
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .get(1)
        .is_some_and(|a| a == trellis_process::reaper::REAPER_ARG)
    {
        let code = trellis_process::reaper::main(&args[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Validate(args) => commands::validate::run(&args),
        Command::Graph(args) => commands::graph::run(&args),
        Command::Rules(args) => Ok(commands::rules::run(&args)),
        Command::Run(args) => commands::run::run(&args),
        Command::Exec(args) => commands::exec::exec(&args),
        Command::Resume(args) => commands::run::resume(&args),
        Command::Runs(args) => commands::runs::runs(&args),
        Command::Show(args) => commands::runs::show(&args),
        Command::Events(args) => commands::runs::events(&args),
        Command::Cancel(args) => commands::runs::cancel(&args),
        Command::Logs(args) => commands::logs::logs(&args),
        Command::Steer(args) => commands::steer::steer(&args),
        Command::Models(args) => commands::models::run(&args),
        Command::Serve(args) => commands::serve::run(&args),
        Command::Worker(args) => commands::temporal::worker(&args),
        Command::Completions { shell } => completions(shell),
    };
    match result {
        Ok(code) => code,
        Err(error) if stdout_closed(&error) => ExitCode::from(CLOSED_STDOUT),
        Err(error) => {
            trellis_process::note!("error: {}", described(&error));
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_says_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8");
        // A cause the message quotes is not said again; one it does not is.
        let quoted = anyhow::Error::new(io).context("cannot read run.json: not UTF-8");
        assert_eq!(described(&quoted), "cannot read run.json: not UTF-8");
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8");
        let unquoted = anyhow::Error::new(io).context("cannot read run.json");
        assert_eq!(described(&unquoted), "cannot read run.json: not UTF-8");
    }
}
