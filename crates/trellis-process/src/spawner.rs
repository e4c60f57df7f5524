//! The spawner: one process that starts unconfined commands for Trellis — each under a reaper it
//! forks, or, when idle, itself — instead of Trellis starting the reaper's program per command.
//!
//! An unconfined command runs under a reaper ([`crate::reaper`]). Starting `trellis-reap` for each
//! costs a program start — 1.2 ms on the project's machine, more than the engine's own cost per
//! stage. So the first time a Trellis process needs a reaper it starts one in spawner mode
//! (`trellis-reap --spawner`), and asks it over a socket pair for each command. The spawner is a
//! child subreaper itself, and runs a command itself when it can tell what that command leaves
//! behind from everything else it holds: when the command is unconfined and the spawner runs no
//! other command (see `Serving`) — every command of a chain. Otherwise it forks — a small
//! single-threaded process, quick to copy — and the copy becomes that command's reaper, just as if
//! `trellis-reap` had been started: in a process group of its own, a child subreaper, confined by
//! Landlock when asked. Either way, everything the command left ends when it exits or when the
//! stage is over, and the command leads a process group of its own or its reaper's.
//!
//! With each request go four descriptors: the write ends of the command's standard output and error;
//! the read end of a *stop* pipe, whose write end Trellis holds (closing it — at the end of the
//! stage, or by dying — tells the spawner or the reaper to end everything, as closing
//! `trellis-reap`'s standard input does); and the write end of a *status* pipe, where the command's
//! exit code is written once what it left has ended. The spawner answers with the process id of the
//! command or its reaper, which is its process group. Its own environment is empty (a command's
//! comes with its request), it keeps no descriptor of a command but those two pipes while it runs
//! it, it cannot be read by other processes (not dumpable), and it exits — ending the command it
//! runs — when Trellis closes its end of the socket or dies. When it cannot be had — or dies —
//! commands start `trellis-reap` as before.

#![allow(
    clippy::disallowed_methods,
    reason = "the spawner is a small synchronous program of its own; Trellis asks it where it would otherwise start a process"
)]

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io::{IoSlice, IoSliceMut, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::signalfd::SignalFd;
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};
use parking_lot::Mutex;

/// The argument that makes the reaper the spawner: `trellis-reap --spawner`.
pub const SPAWNER_ARG: &str = "--spawner";

/// The largest request the spawner reads (a command's arguments and environment), within what a
/// socket pair takes in one message by default; larger ones start `trellis-reap` instead.
const MAX_REQUEST: usize = 128 * 1024;

/// The descriptors that go with a request, in order.
const FDS: usize = 4;

/// A running spawner and Trellis's end of its socket.
struct Spawner {
    socket: OwnedFd,
    process: std::process::Child,
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // Closing the socket (after this) ends it; the reapers it started go on until their stages end.
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The spawner of this process.
enum State {
    NotStarted,
    Running(Spawner),
    /// It could not be started: not tried again.
    Unavailable,
}

static SPAWNER: Mutex<State> = Mutex::new(State::NotStarted);

/// A command started by the spawner, under a reaper of its own.
#[derive(Debug)]
pub struct Spawned {
    /// The reaper's process id: the command's process group.
    pub pid: u32,
    /// The command's standard output and error, until taken.
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
    /// Closing it tells the reaper to end everything (see [`crate::group::ProcessGroup`]).
    pub stop: Option<OwnedFd>,
    status: tokio::net::unix::pipe::Receiver,
}

impl Spawned {
    /// Waits for the command to end: its exit code as its reaper reports it (128 + the signal that
    /// killed it), or killed by `SIGKILL` when the reaper ended without saying.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        use tokio::io::AsyncReadExt as _;
        let mut code = [0u8; 4];
        match self.status.read_exact(&mut code).await {
            Ok(_) => Ok(ExitStatus::from_raw((i32::from_le_bytes(code) & 0xff) << 8)),
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
                Ok(ExitStatus::from_raw(libc::SIGKILL))
            }
            Err(error) => Err(error),
        }
    }
}

/// Starts `program args` in `work_dir` with exactly the environment `env` (later entries win), under
/// a reaper the spawner of `launcher` forks, confined as the reaper's `options` say (`--landlock`
/// ...). Must be called inside the Tokio runtime (the pipes register with it). `None` when the
/// spawner cannot be had or the request cannot go to it: the caller starts the reaper's program
/// instead.
pub fn spawn(
    launcher: &crate::reaper::Launcher,
    options: &[OsString],
    program: &OsStr,
    args: &[&OsStr],
    work_dir: &Path,
    env: &[(&OsStr, &OsStr)],
) -> Option<std::io::Result<Spawned>> {
    let request = encode(options, program, args, work_dir, env)?;
    let mut state = SPAWNER.lock();
    if matches!(*state, State::NotStarted) {
        *state = start(launcher).map_or(State::Unavailable, State::Running);
    }
    let State::Running(spawner) = &*state else {
        return None;
    };
    match ask(spawner, &request) {
        Asked::NotSent { spawner_gone } => {
            if spawner_gone {
                // A new spawner for the next command.
                *state = State::NotStarted;
            }
            None
        }
        Asked::Lost(error) => {
            // The request went, but no answer came: the command may have started, so it is not
            // started again; a new spawner for the next one.
            *state = State::NotStarted;
            Some(Err(error))
        }
        Asked::Answered(answer) => Some(answer),
    }
}

/// How a request to the spawner went.
enum Asked {
    /// It never reached the spawner: the caller may start the command another way.
    NotSent { spawner_gone: bool },
    /// It reached the spawner, which did not answer.
    Lost(std::io::Error),
    /// The command started under its reaper, or the spawner could not fork it.
    Answered(std::io::Result<Spawned>),
}

/// Starts the spawner of `launcher` with an empty environment, its socket as its standard input.
fn start(launcher: &crate::reaper::Launcher) -> std::io::Result<Spawner> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let process = std::process::Command::new(launcher.program())
        .args(launcher.leading_args())
        .arg(SPAWNER_ARG)
        .env_clear()
        .stdin(std::process::Stdio::from(theirs))
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()?;
    Ok(Spawner {
        socket: ours,
        process,
    })
}

/// A request: NUL-separated fields — the working directory, the number of environment entries, the
/// entries (`NAME=value`), then the reaper's arguments (options, `--`, program, arguments). `None`
/// when a field holds a NUL (no program could be given it) or the request is too large.
fn encode(
    options: &[OsString],
    program: &OsStr,
    args: &[&OsStr],
    work_dir: &Path,
    env: &[(&OsStr, &OsStr)],
) -> Option<Vec<u8>> {
    let count = env.len().to_string();
    let mut fields: Vec<Vec<u8>> = vec![work_dir.as_os_str().as_bytes().to_vec(), count.into()];
    for (name, value) in env {
        let mut entry = name.as_bytes().to_vec();
        entry.push(b'=');
        entry.extend_from_slice(value.as_bytes());
        fields.push(entry);
    }
    fields.extend(options.iter().map(|o| o.as_bytes().to_vec()));
    fields.push(b"--".to_vec());
    fields.push(program.as_bytes().to_vec());
    fields.extend(args.iter().map(|a| a.as_bytes().to_vec()));
    if fields.iter().any(|f| f.contains(&0)) {
        return None;
    }
    let request = fields.join(&0u8);
    (request.len() <= MAX_REQUEST).then_some(request)
}

/// A pipe whose ends are closed on exec.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

/// Sends one request with its descriptors and reads the reaper's process id.
fn ask(spawner: &Spawner, request: &[u8]) -> Asked {
    let Ok(((stdout, stdout_w), (stderr, stderr_w), (stop_r, stop), (status, status_w))) =
        (|| Ok::<_, std::io::Error>((pipe()?, pipe()?, pipe()?, pipe()?)))()
    else {
        return Asked::NotSent {
            spawner_gone: false,
        };
    };
    let fds = [
        stdout_w.as_raw_fd(),
        stderr_w.as_raw_fd(),
        stop_r.as_raw_fd(),
        status_w.as_raw_fd(),
    ];
    let socket = spawner.socket.as_raw_fd();
    if let Err(errno) = sendmsg::<()>(
        socket,
        &[IoSlice::new(request)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    ) {
        return Asked::NotSent {
            // Too large for the socket says nothing about the spawner.
            spawner_gone: errno != nix::errno::Errno::EMSGSIZE,
        };
    }
    // Only the reaper keeps these now.
    drop((stdout_w, stderr_w, stop_r, status_w));
    let mut answer = [0u8; 4];
    match nix::sys::socket::recv(socket, &mut answer, MsgFlags::empty()) {
        Ok(read) if read == answer.len() => {}
        Ok(_) => return Asked::Lost(std::io::Error::other("the spawner ended")),
        Err(errno) => return Asked::Lost(errno.into()),
    }
    let pid = i32::from_le_bytes(answer);
    let Ok(pid) = u32::try_from(pid) else {
        // The spawner could not fork: its error, for this command only.
        return Asked::Answered(Err(std::io::Error::from_raw_os_error(-pid)));
    };
    let receiver = tokio::net::unix::pipe::Receiver::from_owned_fd;
    // Dropping the stop pipe on an error here ends the command at once.
    Asked::Answered((|| {
        Ok(Spawned {
            pid,
            stdout: Some(receiver(stdout)?),
            stderr: Some(receiver(stderr)?),
            stop: Some(stop),
            status: receiver(status)?,
        })
    })())
}

/// Runs as the spawner, its socket on standard input, until Trellis closes the socket: starts each
/// request's command, itself or under a reaper it forks (see [`Serving`]). Returns the exit code.
pub(crate) fn serve() -> i32 {
    // Nothing of what passes through here is for other processes to read.
    let _ = nix::sys::prctl::set_dumpable(false);
    // What a command it runs itself leaves behind is re-parented here, to be ended with it.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let Ok(exits) = crate::reaper::child_exits() else {
        return 1;
    };
    let mut serving = Serving {
        exits: Some(exits),
        reapers: HashSet::new(),
        direct: None,
    };
    let mut buffer = vec![0u8; MAX_REQUEST];
    loop {
        let (request, exited, stop) = {
            let stdin = std::io::stdin();
            let mut ready = vec![PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
            let exits_at = ready.len();
            if let Some(exits) = &serving.exits {
                ready.push(PollFd::new(exits.as_fd(), PollFlags::POLLIN));
            }
            let stop_at = ready.len();
            if let Some(direct) = &serving.direct {
                ready.push(PollFd::new(direct.stop.as_fd(), PollFlags::POLLIN));
            }
            match nix::poll::poll(&mut ready, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => {
                    serving.end_direct();
                    return 1;
                }
            }
            let is_ready = |i: usize| {
                ready
                    .get(i)
                    .and_then(PollFd::revents)
                    .is_some_and(|events| !events.is_empty())
            };
            (
                is_ready(0),
                serving.exits.is_some() && is_ready(exits_at),
                serving.direct.is_some() && is_ready(stop_at),
            )
        };
        // First the ends: a command that ended is finished before the next may start here.
        if exited {
            serving.collect();
        }
        if stop {
            serving.read_stop();
        }
        if request {
            match serving.answer(&mut buffer) {
                Ok(true) => {}
                // Trellis closed the socket (or is gone).
                Ok(false) => {
                    serving.end_direct();
                    return 0;
                }
                Err(_) => {
                    serving.end_direct();
                    return 1;
                }
            }
        }
    }
}

/// The spawner at work.
///
/// A reaper costs a fork, and the reaper's own start and end, per command. So the spawner runs a
/// command itself — as a child subreaper it can do what a reaper does — when the command is
/// unconfined (Landlock must confine a process before it starts the command: a reaper) and it runs
/// no other command, itself or under a reaper. What the command leaves behind is re-parented to the
/// spawner, and with one such command at a time, every child of the spawner that is not a reaper is
/// that command's (a reaper's command leaves what it started to its reaper). When it ends, finding
/// those children takes a scan of `/proc` if reapers have been forked since it started, and none
/// otherwise; it is made once per command run here, which is why the spawner runs one only when
/// idle. A chain's commands all start this way; the first of a fan-out's branches too, and the
/// others under reapers of their own.
struct Serving {
    /// `SIGCHLD`, blocked and read here (taken in a forked reaper, which does not need it).
    exits: Option<SignalFd>,
    /// The reapers forked and not yet waited for.
    reapers: HashSet<Pid>,
    /// The command the spawner runs itself.
    direct: Option<Direct>,
}

/// A command the spawner runs itself, with the two pipes its reaper would have held.
struct Direct {
    /// Its process id, and its process group's.
    pid: Pid,
    stop: std::fs::File,
    status: std::fs::File,
}

impl Serving {
    /// Waits for the children that have ended: the reapers are forgotten, and the command the
    /// spawner runs itself is finished.
    fn collect(&mut self) {
        if let Some(exits) = &self.exits {
            while let Ok(Some(_)) = exits.read_signal() {}
        }
        loop {
            let status = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(status) => status,
            };
            let Some(pid) = status.pid() else { continue };
            if self.reapers.remove(&pid) {
                continue;
            }
            if let Some(code) = crate::reaper::shell_code(status)
                && self.direct.as_ref().is_some_and(|direct| direct.pid == pid)
            {
                self.finish_direct(code);
            }
        }
    }

    /// The command run here has ended with `code`: ends what it left (every child but the
    /// reapers), then reports the code on its status pipe.
    fn finish_direct(&mut self, code: i32) {
        let Some(direct) = self.direct.take() else {
            return;
        };
        crate::reaper::end_all_but(&mut self.reapers);
        let mut status = direct.status;
        let _ = status.write_all(&code.to_le_bytes());
    }

    /// Reads the stop pipe of the command run here; at its end (the stage is over, or Trellis is
    /// gone) ends the command. Data on it is ignored.
    fn read_stop(&mut self) {
        if let Some(direct) = &mut self.direct
            && crate::reaper::stop_ended(&mut direct.stop)
        {
            self.end_direct();
        }
    }

    /// Kills the command run here, with its process group, and finishes it.
    fn end_direct(&mut self) {
        let Some(direct) = &self.direct else {
            return;
        };
        let pid = direct.pid;
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
        self.finish_direct(128 + Signal::SIGKILL as i32);
    }

    /// Reads one request and answers it; `false` when Trellis has closed the socket.
    fn answer(&mut self, buffer: &mut [u8]) -> nix::Result<bool> {
        let mut space = nix::cmsg_space!([RawFd; FDS]);
        let (length, fds) = {
            let mut io = [IoSliceMut::new(buffer)];
            let message = match recvmsg::<()>(
                SOCKET,
                &mut io,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(message) => message,
                Err(Errno::EINTR) => return Ok(true),
                Err(errno) => return Err(errno),
            };
            let mut fds: Vec<OwnedFd> = Vec::with_capacity(FDS);
            if let Ok(messages) = message.cmsgs() {
                for received in messages {
                    if let ControlMessageOwned::ScmRights(raw) = received {
                        fds.extend(raw.into_iter().map(own));
                    }
                }
            }
            (message.bytes, fds)
        };
        if length == 0 {
            return Ok(false);
        }
        let request = decode(&buffer[..length]);
        let answer = match <[OwnedFd; FDS]>::try_from(fds) {
            Ok(fds) => match self.run_here(&request, fds) {
                Ok(pid) => pid.as_raw(),
                Err(fds) => self.fork_reaper(request, fds),
            },
            Err(_) => -libc::EINVAL,
        };
        nix::sys::socket::send(SOCKET, &answer.to_le_bytes(), MsgFlags::MSG_NOSIGNAL)?;
        Ok(true)
    }

    /// Starts the request's command here, if it may run without a reaper (see [`Serving`]): its
    /// process id; else, or when it cannot start, the descriptors back for a reaper (which says
    /// why it cannot, as `trellis-reap` would).
    fn run_here(
        &mut self,
        request: &Result<Decoded, String>,
        fds: [OwnedFd; FDS],
    ) -> Result<Pid, [OwnedFd; FDS]> {
        if self.direct.is_some() || !self.reapers.is_empty() {
            return Err(fds);
        }
        let Ok((work_dir, env, reaper_args)) = request else {
            return Err(fds);
        };
        let Ok((None, mut command)) = crate::reaper::command_of(reaper_args) else {
            return Err(fds);
        };
        let (Ok(stdout), Ok(stderr)) = (fds[0].try_clone(), fds[1].try_clone()) else {
            return Err(fds);
        };
        command
            .env_clear()
            .envs(env.iter().map(|(name, value)| (name, value)))
            .current_dir(work_dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0);
        let started = command.spawn();
        // Its output's write ends are the command's alone now.
        drop(command);
        let Ok(pid) = started.map(|child| child.id()) else {
            return Err(fds);
        };
        let Ok(pid) = i32::try_from(pid).map(Pid::from_raw) else {
            return Err(fds);
        };
        let [_, _, stop, status] = fds;
        self.direct = Some(Direct {
            pid,
            stop: stop.into(),
            status: status.into(),
        });
        Ok(pid)
    }

    /// Forks the reaper of one request (read once, above: one that could not be read is reported
    /// by the reaper on the command's standard error); returns its process id, or minus the error
    /// number.
    #[allow(
        unsafe_code,
        reason = "forking without starting a program is what saves the reaper's start; no safe API forks"
    )]
    fn fork_reaper(&mut self, request: Result<Decoded, String>, fds: [OwnedFd; FDS]) -> i32 {
        // SAFETY: the spawner has one thread (it starts none), so no lock or allocator state can be
        // left held in the child; the child runs the reaper as `trellis-reap` would and exits.
        match unsafe { nix::unistd::fork() } {
            Ok(ForkResult::Child) => {
                // The spawner's descriptors are not the reaper's.
                drop((self.exits.take(), self.direct.take()));
                std::process::exit(reap(request, fds))
            }
            Ok(ForkResult::Parent { child }) => {
                // Also set by the child: the group exists before Trellis is told of it.
                let _ = nix::unistd::setpgid(child, child);
                self.reapers.insert(child);
                child.as_raw()
            }
            Err(errno) => -(errno as i32),
        }
    }
}

/// The spawner's socket: its standard input.
const SOCKET: RawFd = 0;

/// A descriptor the kernel has just given this process with a message.
#[allow(
    unsafe_code,
    reason = "nix gives received descriptors as raw numbers; std's safe receiving API is unstable"
)]
fn own(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `fd` in this process for this message, and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The forked reaper: takes its place (process group, standard streams, environment) and runs the
/// request's command under [`crate::reaper::supervise`]; writes the exit code to the status pipe.
fn reap(request: Result<Decoded, String>, fds: [OwnedFd; FDS]) -> i32 {
    let _ = nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0));
    let [stdout, stderr, stop, status] = fds;
    // The socket (standard input) is the spawner's, not the command's.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(null.as_fd());
    }
    let _ = nix::unistd::dup2_stdout(stdout.as_fd());
    let _ = nix::unistd::dup2_stderr(stderr.as_fd());
    drop((stdout, stderr));
    let mut status = std::fs::File::from(status);
    let code = match request {
        Ok((work_dir, env, reaper_args)) => match crate::reaper::command_of(&reaper_args) {
            Ok((confinement, mut command)) => {
                command.env_clear().envs(env).current_dir(work_dir);
                crate::reaper::supervise(confinement, command, std::fs::File::from(stop))
            }
            Err(problem) => {
                crate::note!("trellis {SPAWNER_ARG}: {problem}");
                2
            }
        },
        Err(problem) => {
            crate::note!("trellis {SPAWNER_ARG}: {problem}");
            2
        }
    };
    let _ = status.write_all(&code.to_le_bytes());
    code
}

/// A request read back: the working directory, the environment, the reaper's arguments.
type Decoded = (OsString, Vec<(OsString, OsString)>, Vec<OsString>);

/// The fields of [`encode`].
fn decode(request: &[u8]) -> Result<Decoded, String> {
    let mut fields = request
        .split(|b| *b == 0)
        .map(|f| OsString::from_vec(f.to_vec()));
    let work_dir = fields.next().ok_or("an empty request")?;
    let count: usize = fields
        .next()
        .and_then(|c| c.to_str()?.parse().ok())
        .ok_or("no environment count")?;
    let mut env = Vec::with_capacity(count);
    for _ in 0..count {
        let entry = fields.next().ok_or("fewer environment entries than said")?;
        let bytes = entry.into_vec();
        let split = bytes.iter().position(|b| *b == b'=').unwrap_or(bytes.len());
        let (name, value) = bytes.split_at(split);
        env.push((
            OsString::from_vec(name.to_vec()),
            OsString::from_vec(value.get(1..).unwrap_or_default().to_vec()),
        ));
    }
    Ok((work_dir, env, fields.collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_back_as_they_were_written() {
        let request = encode(
            &["--landlock".into(), "--write".into(), "/w".into()],
            OsStr::new("sh"),
            &[OsStr::new("-c"), OsStr::new("echo a=b")],
            Path::new("/w"),
            &[
                (OsStr::new("A"), OsStr::new("1=2")),
                (OsStr::new("EMPTY"), OsStr::new("")),
            ],
        )
        .unwrap();
        let (work_dir, env, args) = decode(&request).unwrap();
        assert_eq!(work_dir, "/w");
        assert_eq!(
            env,
            [
                ("A".into(), "1=2".into()),
                ("EMPTY".into(), OsString::new())
            ]
        );
        assert_eq!(
            args,
            ["--landlock", "--write", "/w", "--", "sh", "-c", "echo a=b"]
        );
        // A NUL cannot reach a program: such a request goes the other way.
        assert!(
            encode(
                &[],
                OsStr::new("sh"),
                &[OsStr::new("a\0b")],
                Path::new("/"),
                &[]
            )
            .is_none()
        );
    }
}
