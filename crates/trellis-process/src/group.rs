//! A child started in a process group of its own (`process_group(0)`), killed with everything it
//! started: [`ProcessGroup::close`] when the command ends, or on drop when its stage is cancelled or
//! times out. A process that left the group (`setsid`) is found by the marker in its environment
//! (`TRELLIS_STAGE_DIR=<stage>`), which it inherited — and, whatever it did to its environment, by
//! the sandbox's PID namespace or the reaper ([`crate::reaper`]) the child runs under. The shell tool,
//! command stages and coding-agent CLIs all run their children this way.

use std::future::Future;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The environment variable naming the stage a process belongs to: its entry is the marker that
/// finds the stage's processes wherever they went.
pub const STAGE_DIR_VAR: &str = "TRELLIS_STAGE_DIR";

/// The marker (`TRELLIS_STAGE_DIR=<dir>`) the processes of the stage in `stage_dir` carry.
pub fn stage_marker(stage_dir: &std::path::Path) -> String {
    format!("{STAGE_DIR_VAR}={}", stage_dir.display())
}

/// The stage marker among environment entries given to a child, if there is one.
pub fn marker_in(env: &[(String, String)]) -> Option<String> {
    env.iter()
        .find(|(name, _)| name == STAGE_DIR_VAR)
        .map(|(name, value)| format!("{name}={value}"))
}

/// Whether an entry of process `pid`'s environment passes `test`.
#[allow(
    clippy::disallowed_methods,
    reason = "reads /proc, off the run's hot path"
)]
fn has_entry(pid: u32, test: impl Fn(&[u8]) -> bool) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(test))
}

/// How long a finished command's output pipes may stay open before whatever holds them is killed.
const PIPE_GRACE: Duration = Duration::from_millis(200);
/// How long the rest of the output may take once they were.
const PIPE_DRAIN: Duration = Duration::from_secs(2);

/// Kills the process group when dropped (and, then, the processes carrying its marker).
pub struct ProcessGroup {
    pgid: Option<Pid>,
    marker: Option<String>,
    /// The reaper's standard input or stop pipe ([`crate::reaper`], [`crate::spawner`]), when the
    /// child runs under it: closing it tells the reaper to end everything.
    reaper: Option<std::os::fd::OwnedFd>,
}

/// How long a reaper told to stop has before its group is killed regardless.
const REAPER_GRACE: Duration = Duration::from_secs(2);

impl ProcessGroup {
    /// The group a child started by [`crate::sandbox::Sandbox::command`] leads (none if it already
    /// exited), holding the reaper's input if it has one; `marker` (`NAME=value`) is an environment
    /// entry only this command's processes carry.
    pub fn of(child: &mut tokio::process::Child, marker: Option<String>) -> Self {
        let reaper = child
            .stdin
            .take()
            .and_then(|input| input.into_owned_fd().ok());
        Self::new(child.id(), marker, reaper)
    }

    /// The group led by `pid` (none if it already exited), with the reaper's stop handle if the child
    /// runs under one.
    pub fn new(
        pid: Option<u32>,
        marker: Option<String>,
        reaper: Option<std::os::fd::OwnedFd>,
    ) -> Self {
        Self {
            pgid: pid.and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw),
            marker,
            reaper,
        }
    }

    /// The group's id, for the stage's `process` file.
    pub fn id(&self) -> Option<i32> {
        self.pgid.map(Pid::as_raw)
    }

    /// The command ended: stops what it left running in its group, and returns the marker for
    /// [`drain`].
    pub fn close(mut self) -> Option<String> {
        self.reaper.take();
        if let Some(pgid) = self.pgid.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        self.marker.take()
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(input) = self.reaper.take() {
            // The stage ended early: the reaper ends what the command started, then itself; its
            // group and marked processes (the reaper among them) are killed only if it has not
            // done so in time.
            drop(input);
            let (pgid, marker) = (self.pgid.take(), self.marker.take());
            std::thread::spawn(move || {
                std::thread::sleep(REAPER_GRACE);
                if let Some(pgid) = pgid {
                    let _ = killpg(pgid, Signal::SIGKILL);
                }
                if let Some(marker) = marker {
                    kill_marked(&marker);
                }
            });
            return;
        }
        if let Some(pgid) = self.pgid.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        if let Some(marker) = self.marker.take() {
            // Scanning `/proc` takes a while: not on the thread that dropped the stage (the runtime's).
            std::thread::spawn(move || kill_marked(&marker));
        }
    }
}

/// Every process but this one whose environment holds `marker` (`NAME=value`).
#[allow(
    clippy::disallowed_methods,
    reason = "reads /proc once, when a stage ends abnormally or a run resumes"
)]
fn marked(test: impl Fn(&[u8]) -> bool + Copy) -> Vec<Pid> {
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != own && has_entry(pid, test))
        .filter_map(|pid| Some(Pid::from_raw(i32::try_from(pid).ok()?)))
        .collect()
}

/// Kills the process group that the child `pid` leads (started with `process_group(0)`).
pub fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Kills every process whose environment holds `marker` (`NAME=value`); returns how many.
pub fn kill_marked(marker: &str) -> usize {
    marked(|entry| entry == marker.as_bytes())
        .into_iter()
        .filter(|&pid| kill(pid, Signal::SIGKILL).is_ok())
        .count()
}

/// The variable every process a run starts carries (commands, agent shells, coding-agent CLIs, and
/// what they start in turn), with the run's id.
pub const RUN_ID_VAR: &str = "TRELLIS_RUN_ID";

/// Stops what an interrupted run left running: every process carrying the run's id — or the id of
/// one of its sub-workflow runs, `<run id>/<node>…` — with its process group (never this process's
/// own). Returns how many processes were found. Called before a resumed run starts, when no live
/// process owns the run, so whatever carries its id is a leftover.
pub fn reap_run(run_id: &str) -> usize {
    let own_group = nix::unistd::getpgrp();
    let marker = format!("{RUN_ID_VAR}={run_id}");
    let found = marked(|entry| {
        entry
            .strip_prefix(marker.as_bytes())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
    });
    for &pid in &found {
        if let Ok(group) = nix::unistd::getpgid(Some(pid))
            && group != own_group
        {
            let _ = killpg(group, Signal::SIGKILL);
        }
        let _ = kill(pid, Signal::SIGKILL);
    }
    found.len()
}

/// Waits for the readers of a finished command's output. A process that escaped its group can keep a
/// pipe open after the command ended: after a short grace the processes carrying `marker` are killed,
/// and if the pipes still do not close, the readers are given up (`None`) rather than holding the
/// stage open.
pub async fn drain<T>(readers: impl Future<Output = T>, marker: Option<String>) -> Option<T> {
    tokio::pin!(readers);
    if let Ok(done) = tokio::time::timeout(PIPE_GRACE, &mut readers).await {
        return Some(done);
    }
    if let Some(marker) = marker {
        let _ = crate::task::blocking(move || kill_marked(&marker)).await;
    }
    tokio::time::timeout(PIPE_DRAIN, readers).await.ok()
}
