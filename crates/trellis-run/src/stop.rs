//! How a run is asked to stop, and the one place a run is recorded as interrupted.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use trellis_engine::{CancellationToken, RunStatus};
use trellis_process::task::blocking;
use trellis_store::{RunDir, list_runs};

/// The handle a caller stops a run with: [`Stop::cancel`] when a person asks (Ctrl-C, the web app's
/// button), [`Stop::interrupt`] when the run is stopped from outside (SIGTERM, the server stopping).
/// Both cancel the same token; the run's record then says `cancelled` or `interrupted`.
#[derive(Clone, Default)]
pub struct Stop {
    token: CancellationToken,
    interrupted: Arc<AtomicBool>,
}

impl Stop {
    pub fn new() -> Self {
        Self::default()
    }

    /// A person stops the run.
    pub fn cancel(&self) {
        self.token.cancel();
    }

    /// The run is stopped from outside. Wins over an earlier or later [`Stop::cancel`].
    pub fn interrupt(&self) {
        self.interrupted.store(true, Ordering::SeqCst);
        self.token.cancel();
    }

    /// The token the engine watches.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// What a run the engine ended with `status` is recorded as.
    pub(crate) fn recorded(&self, status: RunStatus) -> RunStatus {
        if status == RunStatus::Cancelled && self.interrupted.load(Ordering::SeqCst) {
            RunStatus::Interrupted
        } else {
            status
        }
    }
}

/// Records every run under `runs_dir` that says `running` but has no live process as `interrupted`
/// (a server starting after a crash or a restart of the machine); returns how many. A run is claimed
/// while it is written, so a `trellis resume` starting meanwhile is not overwritten.
pub async fn mark_interrupted(runs_dir: &Path) -> usize {
    let runs_dir = runs_dir.to_path_buf();
    blocking(move || {
        list_runs(&runs_dir)
            .iter()
            .filter(|path| mark_one(path, &runs_dir))
            .count()
    })
    .await
}

/// Cancels a run that another process on this machine is running, as Ctrl-C there would: its owner
/// is interrupted (SIGINT) and records the run as cancelled. `Ok(None)` when no live process runs it.
pub fn interrupt_owner(record: &RunDir) -> std::io::Result<Option<u32>> {
    let Some(pid) = record.owner_pid().filter(|_| record.has_live_owner()) else {
        return Ok(None);
    };
    let target = i32::try_from(pid)
        .map(nix::unistd::Pid::from_raw)
        .map_err(|_| std::io::Error::other(format!("pid {pid} is out of range")))?;
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGINT)?;
    Ok(Some(pid))
}

/// Records `status` for a run nothing will finish (its Temporal workflow failed or was cancelled
/// while no stage ran): the run is claimed first, and a run that has already ended keeps its
/// status. Blocking.
pub fn settle(record: &RunDir, status: RunStatus) -> Result<(), trellis_store::StoreError> {
    let mut meta = record.meta()?;
    let _owner = record.claim(&meta.run_id)?;
    if matches!(meta.status, RunStatus::Running | RunStatus::WaitingForInput) {
        meta.status = status;
        meta.ended_at = Some(trellis_engine::engine::timestamp());
        record.write_meta(&meta)?;
    }
    Ok(())
}

fn mark_one(path: &Path, runs_dir: &Path) -> bool {
    let Ok(record) = RunDir::open(&path.display().to_string(), runs_dir) else {
        return false;
    };
    let Ok(mut meta) = record.meta() else {
        return false;
    };
    if meta.status != RunStatus::Running || meta.temporal.is_some() || record.has_live_owner() {
        return false;
    }
    let Ok(_owner) = record.claim(&meta.run_id) else {
        return false;
    };
    meta.status = RunStatus::Interrupted;
    record.write_meta(&meta).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_wins_over_cancel_and_only_changes_a_cancelled_run() {
        let stop = Stop::new();
        stop.cancel();
        assert!(stop.token().is_cancelled());
        assert_eq!(stop.recorded(RunStatus::Cancelled), RunStatus::Cancelled);
        stop.interrupt();
        assert_eq!(stop.recorded(RunStatus::Cancelled), RunStatus::Interrupted);
        // A run that finished before the stop reached it keeps its own status.
        assert_eq!(stop.recorded(RunStatus::Succeeded), RunStatus::Succeeded);
        assert_eq!(
            stop.recorded(RunStatus::WaitingForInput),
            RunStatus::WaitingForInput
        );
    }
}
