//! One owner per run: the live process that runs (or resumes) a run holds an exclusive `flock` on the
//! run's `owner` file, which also holds its pid for messages. The kernel releases the lock when the
//! process dies, however it dies, so a second `run`/`resume` of a run in progress is refused, and a
//! run recorded as running whose lock is free was interrupted.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use trellis_process::files::{Access, open_record};

/// The owner's hold on a run; dropping it (or the process dying) releases the run.
pub struct Owner {
    _lock: Flock<File>,
}

/// Why a run could not be claimed.
pub enum Claim {
    /// Another live process owns it (its pid, when it wrote one).
    Busy(Option<u32>),
    Io(std::io::Error),
}

fn open(path: &Path) -> std::io::Result<File> {
    open_record(path, Access::ReadWriteCreate)
}

fn pid_in(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// How many times a claim is tried while only a reader's probe (a shared lock held for a moment by
/// `trellis runs`, `show` or the server listing runs) may be in the way, and how far apart.
const CLAIM_TRIES: u32 = 10;
const CLAIM_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// Takes the run's lock for this process, writing its pid into the file.
pub(crate) fn claim(path: &Path) -> Result<Owner, Claim> {
    let mut tries = 0;
    loop {
        match claim_once(path) {
            Err(Claim::Busy(_)) if tries + 1 < CLAIM_TRIES => {
                tries += 1;
                std::thread::sleep(CLAIM_PAUSE);
            }
            // The pid in the file is the last owner's: when that process is gone, the lock is
            // held by someone else (a reader's probe that lasted, or a process it left).
            Err(Claim::Busy(Some(pid))) if !alive(pid) => return Err(Claim::Busy(None)),
            other => return other,
        }
    }
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|pid| {
        !matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(Errno::ESRCH)
        )
    })
}

fn claim_once(path: &Path) -> Result<Owner, Claim> {
    let file = open(path).map_err(Claim::Io)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            let pid = std::process::id().to_string();
            // Written over the old pid and then cut to length, never truncated to empty first: ext4
            // writes a file emptied and refilled out to disk when it is closed, which would hold up
            // the end of every run on the disk.
            let written = lock
                .rewind()
                .and_then(|()| lock.write_all(pid.as_bytes()))
                .and_then(|()| lock.set_len(pid.len() as u64));
            written.map_err(Claim::Io)?;
            Ok(Owner { _lock: lock })
        }
        Err((mut file, Errno::EWOULDBLOCK)) => Err(Claim::Busy(pid_in(&mut file))),
        Err((_, errno)) => Err(Claim::Io(errno.into())),
    }
}

/// The pid the run's last owner wrote.
pub(crate) fn pid(path: &Path) -> Option<u32> {
    let mut file = open_record(path, Access::Read).ok()?;
    pid_in(&mut file)
}

/// Whether a live process owns the run.
pub(crate) fn is_owned(path: &Path) -> bool {
    let Ok(file) = open_record(path, Access::Read) else {
        return false;
    };
    // Taking the lock (released as it drops) means nobody holds it.
    matches!(
        Flock::lock(file, FlockArg::LockSharedNonblock),
        Err((_, Errno::EWOULDBLOCK))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a reader's probe (a shared lock held for a moment) at the instant a resume
    /// claimed the run refused the resume, naming the previous owner, long gone.
    #[test]
    fn regression_a_readers_probe_does_not_refuse_a_claim() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner");
        std::fs::write(&path, "999999999").unwrap();
        let probe = Flock::lock(open(&path).unwrap(), FlockArg::LockSharedNonblock)
            .map_err(|(_, e)| e)
            .unwrap();
        let released = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            drop(probe);
        });
        assert!(claim(&path).is_ok(), "the claim waited out the probe");
        released.join().unwrap();
    }

    #[test]
    fn a_lock_held_under_a_dead_owners_pid_names_no_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner");
        std::fs::write(&path, "999999999").unwrap();
        let _held = Flock::lock(open(&path).unwrap(), FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| e)
            .unwrap();
        assert!(matches!(claim(&path), Err(Claim::Busy(None))));
    }
}
