//! A child started with its output piped ([`crate::sandbox::Sandbox::start`]): by Tokio, or by the
//! spawner ([`crate::spawner`]) under a reaper of its own. Command stages and the agent's `shell`
//! tool hold it the same way either way.

use std::pin::Pin;
use std::process::ExitStatus;

use crate::group::ProcessGroup;

/// One of the child's output pipes.
pub type Output = Pin<Box<dyn tokio::io::AsyncRead + Send>>;

/// A started child.
#[derive(Debug)]
pub enum Started {
    Child(tokio::process::Child),
    Spawned(crate::spawner::Spawned),
}

impl Started {
    /// Its process group, holding the reaper's stop handle if it runs under one; `marker`
    /// (`NAME=value`) is an environment entry only its processes carry.
    pub fn group(&mut self, marker: Option<String>) -> ProcessGroup {
        match self {
            Self::Child(child) => ProcessGroup::of(child, marker),
            Self::Spawned(spawned) => {
                ProcessGroup::new(Some(spawned.pid), marker, spawned.stop.take())
            }
        }
    }

    /// Its standard output and error (once).
    pub fn outputs(&mut self) -> Option<(Output, Output)> {
        match self {
            Self::Child(child) => {
                let (stdout, stderr) = (child.stdout.take()?, child.stderr.take()?);
                Some((Box::pin(stdout), Box::pin(stderr)))
            }
            Self::Spawned(spawned) => {
                let (stdout, stderr) = (spawned.stdout.take()?, spawned.stderr.take()?);
                Some((Box::pin(stdout), Box::pin(stderr)))
            }
        }
    }

    /// Waits for it to end.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Self::Child(child) => child.wait().await,
            Self::Spawned(spawned) => spawned.wait().await,
        }
    }
}

impl Drop for Started {
    /// A child still running when dropped — its stage was cancelled while it was being started,
    /// before anyone held its group — is killed with its whole group. Killing only the process
    /// Tokio started is not enough: a `bwrap` killed before it let its sandbox's first process go
    /// on leaves that process waiting for it for ever. (A spawned child's reaper ends everything
    /// when its stop pipe closes.)
    fn drop(&mut self) {
        if let Self::Child(child) = self
            && let Some(pid) = child.id()
        {
            crate::group::kill_group(pid);
        }
    }
}
