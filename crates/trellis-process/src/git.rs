//! `git` as Trellis itself runs it, outside any sandbox, in trees a run's stages may have written:
//! never a prompt for credentials, no hooks, no file-system monitor, nothing on standard input.
//! A repository's own configuration can still name filter drivers, so a caller that must not run
//! them either gives git a git directory and configuration of its own (as a run's changes do), or
//! asks git nothing that reads a working-tree file (as a CLI agent's touched files do).

use std::process::{Command, Stdio};

/// `git` with those settings; the caller adds its own options and the subcommand.
pub fn command() -> Command {
    let mut command = Command::new("git");
    command
        .env("GIT_TERMINAL_PROMPT", "0")
        .args(["-c", "core.hooksPath=/dev/null"])
        .args(["-c", "core.fsmonitor=false"])
        .stdin(Stdio::null());
    command
}
