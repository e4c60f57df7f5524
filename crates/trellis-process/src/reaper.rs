//! The reaper: what keeps an unconfined command from outliving its stage.
//!
//! Without the sandbox's PID namespace, a command can leave its process group (`setsid`), drop the
//! markers in its environment (`env -i`) and lose its parent (a double fork), and nothing else would
//! find it again. So an unconfined command starts under a small process of Trellis's own
//! (`trellis __reap -- PROGRAM ARGS...`) that makes itself a *child subreaper*: every process the command
//! starts whose parent dies is re-parented to the reaper instead of to `init`, however it left. When the
//! command exits — or the stage ends early, which the reaper learns when Trellis closes its standard
//! input (also when Trellis itself dies) — the reaper kills every process left under it, waits for
//! them, and exits as the command did. Command stages and the agent's shell tool are started by the
//! spawner instead ([`crate::spawner`]), under a copy of the reaper it forks — or by the spawner
//! itself, which is a subreaper too — told by a stop pipe rather than standard input; either does
//! the same.
//!
//! Where bubblewrap is not available, the reaper is also where the Landlock sandbox is applied
//! (`--landlock --write PATH... [--network-off]`): it restricts itself before it starts the command,
//! which inherits the restriction (and, with `--network-off`, a seccomp filter that refuses internet
//! sockets).

#![allow(
    clippy::disallowed_methods,
    reason = "the reaper is a small synchronous program of its own"
)]

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsFd;
use std::process::Stdio;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill, killpg};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgid, getpgrp};

/// The argument that makes the `trellis` binary the reaper: `trellis __reap [OPTIONS] -- PROGRAM
/// ARGS...`.
pub const REAPER_ARG: &str = "__reap";
/// The reaper's own small executable, installed beside `trellis`: it starts in a fraction of the time
/// the whole of `trellis` takes, which a run pays once per command.
pub const REAPER_PROGRAM: &str = "trellis-reap";

/// How to start the reaper: its own executable, or `trellis __reap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    program: std::path::PathBuf,
    /// `__reap` goes first (the program is `trellis` itself).
    subcommand: bool,
}

impl Launcher {
    /// The reaper of the `trellis` executable at `trellis`: [`REAPER_PROGRAM`] beside it when it is
    /// there (built and installed with `trellis`), else `trellis __reap`.
    pub fn beside(trellis: &std::path::Path) -> Self {
        let own = trellis.with_file_name(REAPER_PROGRAM);
        if own.is_file() {
            Self {
                program: own,
                subcommand: false,
            }
        } else {
            Self {
                program: trellis.to_path_buf(),
                subcommand: true,
            }
        }
    }

    pub fn program(&self) -> &std::path::Path {
        &self.program
    }

    /// The arguments before the reaper's own options.
    pub fn leading_args(&self) -> &'static [&'static str] {
        if self.subcommand { &[REAPER_ARG] } else { &[] }
    }
}

/// Option: confine the command with Landlock before it starts.
pub const LANDLOCK_ARG: &str = "--landlock";
/// Option (with `--landlock`, repeatable): a path the command may write.
pub const WRITE_ARG: &str = "--write";
/// Option (with `--landlock`): no network — no TCP connections or listening sockets (Landlock), and no
/// internet sockets at all (a seccomp filter).
pub const NETWORK_OFF_ARG: &str = "--network-off";

/// Paths every confined command may write besides those it is given: the shared temporary directory
/// and the devices programs write to.
const ALWAYS_WRITABLE: &[&str] = &[
    "/tmp",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/pts",
    "/dev/shm",
];

/// The Landlock confinement the reaper applies to itself, and so to the command, before starting it.
#[derive(Debug, Default)]
pub(crate) struct Confinement {
    writable: Vec<OsString>,
    network_off: bool,
}

/// Whether this kernel offers Landlock.
pub fn landlock_supported() -> bool {
    use landlock::{
        Access as _, AccessFs, CompatLevel, Compatible as _, Ruleset, RulesetAttr as _,
    };
    Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(landlock::ABI::V1))
        .and_then(landlock::Ruleset::create)
        .is_ok()
}

impl Confinement {
    /// Restricts this process (the reaper's only thread yet) and what it starts: reading anywhere,
    /// writing only inside the writable paths, no TCP when the network is off.
    fn apply(&self) -> Result<(), String> {
        use landlock::{
            ABI, Access as _, AccessFs, AccessNet, Ruleset, RulesetAttr as _,
            RulesetCreatedAttr as _, RulesetStatus, path_beneath_rules,
        };
        let abi = ABI::V5;
        let mut ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(abi))
            .map_err(|e| e.to_string())?;
        if self.network_off {
            ruleset = ruleset
                .handle_access(AccessNet::from_all(abi))
                .map_err(|e| e.to_string())?;
        }
        let writable = self
            .writable
            .iter()
            .map(std::path::Path::new)
            .chain(ALWAYS_WRITABLE.iter().map(std::path::Path::new));
        let status = ruleset
            .create()
            .and_then(|r| r.add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi))))
            .and_then(|r| r.add_rules(path_beneath_rules(writable, AccessFs::from_all(abi))))
            .and_then(landlock::RulesetCreated::restrict_self)
            .map_err(|e| e.to_string())?;
        if status.ruleset == RulesetStatus::NotEnforced {
            return Err("this kernel does not enforce Landlock".to_owned());
        }
        if self.network_off {
            deny_network_sockets()?;
        }
        Ok(())
    }
}

/// A seccomp filter that makes `socket(2)` fail for the internet families (IPv4, IPv6) — UDP included,
/// which Landlock's network rules (TCP only) leave open — and allows every other call.
fn deny_network_sockets() -> Result<(), String> {
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let family = |family: i32| {
        SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            u64::from(family.unsigned_abs()),
        )
        .and_then(|condition| SeccompRule::new(vec![condition]))
        .map_err(|e| e.to_string())
    };
    let rules = vec![family(libc::AF_INET)?, family(libc::AF_INET6)?];
    let filter = SeccompFilter::new(
        std::iter::once((libc::SYS_socket, rules)).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES.unsigned_abs()),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let program = BpfProgram::try_from(filter).map_err(|e| e.to_string())?;
    seccompiler::apply_filter(&program).map_err(|e| e.to_string())
}

/// The confinement options before `--`, and the program and its arguments after it.
fn parse(args: &[OsString]) -> Result<(Option<Confinement>, &[OsString]), String> {
    let mut confinement: Option<Confinement> = None;
    let mut rest = args.iter().enumerate();
    while let Some((i, arg)) = rest.next() {
        match arg.to_str() {
            Some("--") => return Ok((confinement, &args[i + 1..])),
            Some(LANDLOCK_ARG) => confinement = Some(Confinement::default()),
            Some(WRITE_ARG) => {
                let path = rest.next().ok_or("--write needs a path")?.1.clone();
                confinement.get_or_insert_default().writable.push(path);
            }
            Some(NETWORK_OFF_ARG) => confinement.get_or_insert_default().network_off = true,
            _ => return Err(format!("unknown option {}", arg.to_string_lossy())),
        }
    }
    Err("no `--` before the program".to_owned())
}

/// How many rounds of killing the reaper makes before it gives up (each re-parents the next layer).
const ROUNDS: usize = 200;

/// Runs `args` (a program and its arguments) as the reaper — or, with [`crate::spawner::SPAWNER_ARG`]
/// alone, as the spawner; returns the exit code to leave with (the command's own, or 128 + the signal
/// that killed it).
pub fn main(args: &[OsString]) -> i32 {
    if let [only] = args
        && only == crate::spawner::SPAWNER_ARG
    {
        return crate::spawner::serve();
    }
    match command_of(args) {
        Ok((confinement, command)) => supervise(confinement, command, std::io::stdin()),
        Err(problem) => {
            crate::note!("trellis {REAPER_ARG}: {problem}");
            2
        }
    }
}

/// Parses the reaper's arguments (its options, `--`, the program and its arguments) into the
/// command to start and its confinement.
pub(crate) fn command_of(
    args: &[OsString],
) -> Result<(Option<Confinement>, std::process::Command), String> {
    let (confinement, command) = parse(args)?;
    let (program, rest) = command.split_first().ok_or("no program to run")?;
    let mut command = std::process::Command::new(program);
    command.args(rest);
    Ok((confinement, command))
}

/// Starts `command` as the reaper: a child subreaper, confined first when asked; ends everything
/// under it when the command exits or when `stop` ends (Trellis closed its end: the stage is over,
/// or Trellis is gone). Returns the exit code to leave with.
///
/// The reaper has one thread, which waits for both at once: the command's end comes as `SIGCHLD`,
/// blocked and read from a descriptor polled beside `stop` (the command starts with no signal
/// blocked: the standard library clears the mask it inherits).
pub(crate) fn supervise(
    confinement: Option<Confinement>,
    mut command: std::process::Command,
    stop: impl AsFd + Read,
) -> i32 {
    let program = command.get_program().to_string_lossy().into_owned();
    let _ = nix::sys::prctl::set_child_subreaper(true);
    if let Some(confinement) = confinement
        && let Err(problem) = confinement.apply()
    {
        // Never run a command unconfined that was meant to be confined.
        crate::note!("trellis {REAPER_ARG}: cannot apply the Landlock sandbox: {problem}");
        return 126;
    }
    let exits = match child_exits() {
        Ok(exits) => exits,
        Err(errno) => {
            crate::note!("trellis {REAPER_ARG}: cannot watch for the command's end: {errno}");
            return 126;
        }
    };
    let mut child = match command.stdin(Stdio::null()).spawn() {
        Ok(child) => child,
        Err(error) => {
            crate::note!("{program}: {error}");
            return if error.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let status = exit_or_stop(&child, &exits, stop);
    if status.is_none() {
        // The stage is over (or the command could not be waited for): end it first.
        let _ = child.kill();
    }
    reap_all();
    status.unwrap_or(128 + Signal::SIGKILL as i32)
}

/// Blocks `SIGCHLD` in this (the only) thread and returns a descriptor that reads it.
pub(crate) fn child_exits() -> nix::Result<SignalFd> {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block()?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
}

/// Waits until `child` exits — the code a shell would report — or `stop` ends or fails — `None`.
/// Data on `stop` is read and ignored.
fn exit_or_stop(
    child: &std::process::Child,
    exits: &SignalFd,
    mut stop: impl AsFd + Read,
) -> Option<i32> {
    let pid = Pid::from_raw(i32::try_from(child.id()).ok()?);
    loop {
        // A `SIGCHLD` may be for an orphan re-parented here: the command is asked each time.
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(status) => {
                if let Some(code) = shell_code(status) {
                    return Some(code);
                }
            }
            Err(_) => return None,
        }
        let mut ready = [
            PollFd::new(exits.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut ready, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
        let stop_ready = ready[1].revents().is_some_and(|events| !events.is_empty());
        while let Ok(Some(_)) = exits.read_signal() {}
        if stop_ready && stop_ended(&mut stop) {
            return None;
        }
    }
}

/// Reads what a stop pipe that polled readable holds, and ignores it: whether it ended (Trellis
/// closed its end — the stage is over, or Trellis is gone — or it failed).
pub(crate) fn stop_ended(stop: &mut impl Read) -> bool {
    let mut sink = [0u8; 64];
    match stop.read(&mut sink) {
        Ok(read) => read == 0,
        Err(error) => !matches!(
            error.kind(),
            std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
        ),
    }
}

/// The code a shell would report for a child that ended (`None` for a status that is not an end):
/// its exit code, or 128 + the signal that killed it.
pub(crate) fn shell_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, signal, _) => Some(128 + signal as i32),
        _ => None,
    }
}

/// Kills every process left under the reaper (its children, and theirs as they are re-parented to
/// it), with their process groups, and waits for them.
fn reap_all() {
    end_all_but(&mut std::collections::HashSet::new());
}

/// Kills every child of this process but those in `spared` — and their process groups, and the
/// processes re-parented here as they die — and waits for them; a spared child found to have ended
/// is removed from `spared`. Returns when only spared children are left, or none.
pub(crate) fn end_all_but(spared: &mut std::collections::HashSet<Pid>) {
    let own_group = getpgrp();
    for _ in 0..ROUNDS {
        // Collect what has already ended; no children left at all means nothing escaped.
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(status) => {
                    if let Some(pid) = status.pid() {
                        spared.remove(&pid);
                    }
                }
                Err(Errno::ECHILD) => return,
                Err(_) => break,
            }
        }
        let left: Vec<Pid> = children()
            .into_iter()
            .filter(|pid| !spared.contains(pid))
            .collect();
        if left.is_empty() {
            return;
        }
        for pid in left {
            if let Ok(group) = getpgid(Some(pid))
                && group != own_group
            {
                let _ = killpg(group, Signal::SIGKILL);
            }
            let _ = kill(pid, Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The reaper's children.
fn children() -> Vec<Pid> {
    children_of(std::process::id())
        .into_iter()
        .filter_map(|pid| Some(Pid::from_raw(i32::try_from(pid).ok()?)))
        .collect()
}

/// The processes whose parent is `pid`, from `/proc`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| parent_of(child) == Some(pid))
        .collect()
}

/// The parent of process `pid`, from `/proc`: the fourth field of its `stat` (`pid (comm) state
/// ppid ...`, where the name may hold spaces and parentheses).
pub fn parent_of(pid: u32) -> Option<u32> {
    // One read of the line's start, which holds the parent (the name is at most 64 bytes): a
    // reaper or the spawner asks this of every process on the machine when a command ends.
    let mut start = [0u8; 256];
    let read = std::fs::File::open(format!("/proc/{pid}/stat"))
        .and_then(|mut stat| stat.read(&mut start))
        .ok()?;
    parent_in_stat(start.get(..read)?)
}

/// The parent in (the start of) a `stat` line. Bytes, not text: a process may name itself with any
/// bytes but NUL, `) ` included.
fn parent_in_stat(stat: &[u8]) -> Option<u32> {
    let end_of_name = stat.windows(2).rposition(|pair| pair == b") ")?;
    let rest = std::str::from_utf8(stat.get(end_of_name + 2..)?).ok()?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "the test sets up executables")]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_whatever_the_process_is_named() {
        assert_eq!(parent_in_stat(b"42 (sleep) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_in_stat(b"42 (a) S 1 (b) S 9 42 42 0"), Some(9));
        assert_eq!(parent_in_stat(b"42 (z\xff\xfe) S 11 42"), Some(11));
        assert_eq!(parent_in_stat(b"42 (sleep"), None);
        // This process, read from `/proc`.
        assert_eq!(
            parent_of(std::process::id()),
            Some(std::os::unix::process::parent_id())
        );
    }

    #[test]
    fn the_small_reaper_is_used_when_it_is_beside_trellis() {
        let dir = tempfile::tempdir().unwrap();
        let trellis = dir.path().join("trellis");
        std::fs::write(&trellis, "").unwrap();
        let alone = Launcher::beside(&trellis);
        assert_eq!(alone.program(), trellis);
        assert_eq!(alone.leading_args(), [REAPER_ARG]);

        let own = dir.path().join(REAPER_PROGRAM);
        std::fs::write(&own, "").unwrap();
        let beside = Launcher::beside(&trellis);
        assert_eq!(beside.program(), own);
        assert_eq!(beside.leading_args(), [] as [&str; 0]);
    }
}
