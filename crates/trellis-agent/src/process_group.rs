//! A child started in a process group of its own (`process_group(0)`), killed with everything it
//! started when the guard is dropped — when the command ends, times out, or its stage is cancelled.
//! The shell tool, command stages and coding-agent CLIs all run their children this way.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Kills the process group when dropped.
pub struct ProcessGroup(Option<Pid>);

impl ProcessGroup {
    /// The group a child spawned with `process_group(0)` leads (none if it already exited).
    pub fn of(child: &tokio::process::Child) -> Self {
        Self(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .map(Pid::from_raw),
        )
    }

    /// The group's id, for the stage's `process` file.
    pub fn id(&self) -> Option<i32> {
        self.0.map(Pid::as_raw)
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}
