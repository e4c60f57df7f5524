//! Command nodes: run `script` with `sh -c` (or `python3 -c` for `language="python"`) in the run's work
//! directory, in a process group of its own, with the secrets of the environment withheld unless the
//! node's `env` names them (see `trellis_process::secrets`). Standard output and error stream into the
//! stage's `stdout.log` and `stderr.log` while it runs (each created when the command first writes to
//! it, so a quiet command leaves no empty files), are stored whole as blobs afterwards (with known
//! secret values redacted), and appear in the context as `command.output`, `command.stderr` and
//! `command.exit_code`. A non-zero exit is a failed outcome with the tail of standard error as its
//! reason. When the stage ends — normally, or because it timed out and the engine dropped it — the
//! whole process group is killed, and so is any process that left the group but carries the stage's
//! `TRELLIS_STAGE_DIR`, so nothing keeps running or holds the run open (and after a kill, a resumed run
//! stops whatever carries its `TRELLIS_RUN_ID`). New test artifacts are captured into
//! `artifacts/<node>/attempt-<n>/` unless `capture_artifacts=false`.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use trellis_engine::event::EventKind;
use trellis_engine::text;
use trellis_engine::{Attempt, FailureClass, Handler, Outcome, Stage, keys};
use trellis_process::child::Started;
use trellis_process::group::{self as process_group, drain};
use trellis_process::sandbox::{Policy, Sandbox};
use trellis_process::secrets;
use trellis_process::task::blocking;
use trellis_workflow::NodeKind;
use trellis_workflow::node_kind::{CommandConfig, SandboxPolicy, ScriptLanguage};

use crate::artifacts;
use crate::simple_command::{self, SimpleCommand};

pub struct CommandHandler {
    /// The working trees scanned for artifacts, so the next scan reads only what changed.
    trees: std::sync::Arc<artifacts::Trees>,
    /// What every command runs in.
    sandbox: Arc<Sandbox>,
}

impl CommandHandler {
    pub fn new(sandbox: Arc<Sandbox>) -> Self {
        Self {
            trees: std::sync::Arc::default(),
            sandbox,
        }
    }
}

/// The run's sandbox with a node's policy.
pub(crate) fn sandbox_policy(policy: &SandboxPolicy) -> Policy {
    Policy {
        network_off: policy.network_off,
        writable: policy.writable.to_vec(),
    }
}

/// What a pipe holds (Linux's default): the most one read can return.
const PIPE_CAPACITY: usize = 64 * 1024;

/// How much of standard error a failure reason quotes.
const STDERR_TAIL_CHARS: usize = 2000;

/// The most a log write gathers: what a chatty command has already put in its pipe joins the read
/// that woke the reader, so its output reaches the file in a few large writes (each a trip to the
/// blocking pool), not one per pipe read.
const WRITE_BATCH: usize = 1 << 20;

/// Copies a pipe into a log file as the command writes it, so the log fills while the command runs.
/// The pipe is read on the runtime (no thread of its own: a fan-out of many commands starts none);
/// the file is created on the first output and written through the blocking pool.
async fn tee(mut pipe: impl tokio::io::AsyncRead + Unpin, log: std::path::PathBuf) {
    use futures::FutureExt as _;
    // Not tried yet, or created (or not: the output is still read, so the command never blocks).
    let mut file: Option<std::io::Result<tokio::fs::File>> = None;
    // Read room: small at first (most commands say little, and a fan-out has two readers per
    // branch), larger while reads fill it, up to what a pipe holds.
    let mut room = 4 * 1024;
    let mut pending: Vec<u8> = Vec::new();
    let mut ended = false;
    while !ended {
        pending.reserve(room);
        match pipe.read_buf(&mut pending).await {
            Ok(0) | Err(_) => break,
            Ok(n) if n >= room && room < PIPE_CAPACITY => room *= 4,
            Ok(_) => {}
        }
        // Whatever else is in the pipe already (read futures are cancel-safe: one not ready
        // read nothing).
        while pending.len() < WRITE_BATCH {
            pending.reserve(room);
            match pipe.read_buf(&mut pending).now_or_never() {
                Some(Ok(0) | Err(_)) => {
                    ended = true;
                    break;
                }
                Some(Ok(_)) => {}
                None => break,
            }
        }
        if file.is_none() {
            file = Some(trellis_process::files::create_no_link_async(&log).await);
        }
        if let Some(Ok(file)) = file.as_mut() {
            let _ = file.write_all(&pending).await;
        }
        pending.clear();
        pending.shrink_to(room);
    }
    if let Some(Ok(mut file)) = file {
        // The last write is done before the stage reads the log back.
        let _ = file.flush().await;
    }
}

/// "Now" on the file system's clock. File times come from the kernel's coarse clock; the stage
/// directory, created just before the command starts and not written to since, gives the instant on
/// that clock, so artifacts written right after the start are never mistaken for older files.
#[allow(clippy::disallowed_methods, reason = "called on the blocking pool")]
fn start_time(stage_dir: &Path) -> std::time::SystemTime {
    std::fs::metadata(stage_dir)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| std::time::SystemTime::now())
}

/// Where an interpreter is on `PATH` (a child would search `PATH` on every start); the bare name
/// when it is not found, so starting it reports the problem.
fn program_path(program: &'static str) -> std::ffi::OsString {
    found_on_path(program).map_or_else(|| program.into(), std::path::PathBuf::into_os_string)
}

/// Where `program` is on `PATH`, looked up again only once a stage has finished since the last
/// lookup ([`trellis_engine::engine::stages_finished`]): a fan-out's branches, which start together,
/// share one search instead of statting every `PATH` directory each.
pub(crate) fn found_on_path(program: &str) -> Option<std::path::PathBuf> {
    type Found = std::collections::HashMap<String, (u64, Option<std::path::PathBuf>)>;
    static FOUND: std::sync::LazyLock<parking_lot::Mutex<Found>> =
        std::sync::LazyLock::new(parking_lot::Mutex::default);
    let now = trellis_engine::engine::stages_finished();
    let mut found = FOUND.lock();
    if let Some((when, path)) = found.get(program)
        && *when == now
    {
        return path.clone();
    }
    let path = on_path(program);
    found.insert(program.to_owned(), (now, path.clone()));
    path
}

/// The executable `program` on `PATH`, if there is one.
pub(crate) fn on_path(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| is_executable(path))
    })
}

/// Whether `path` is a file anyone may execute.
#[allow(
    clippy::disallowed_methods,
    reason = "one stat, when a program is looked for before it starts"
)]
pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

type Reader = tokio::task::JoinHandle<()>;

/// Starts one reader per pipe, teeing into `stdout.log` and `stderr.log`.
fn spawn_readers(child: &mut Started, dir: &Path) -> Option<(Reader, Reader)> {
    let (stdout, stderr) = child.outputs()?;
    Some((
        tokio::spawn(tee(stdout, dir.join("stdout.log"))),
        tokio::spawn(tee(stderr, dir.join("stderr.log"))),
    ))
}

/// The run's record and where the stage's artifacts go in it (`artifacts/<node>/attempt-<n>/`), unless
/// capture is off.
fn artifacts_dir(
    stage: &Stage<'_>,
    config: &CommandConfig,
) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let run = stage.dir.parent().and_then(Path::parent)?;
    config.capture_artifacts.then(|| {
        let dest = run
            .join("artifacts")
            .join(&stage.node.id)
            .join(format!("attempt-{}", stage.attempt));
        (run.to_path_buf(), dest)
    })
}

/// Says that artifact capture did not look at the whole working tree.
fn warn_truncated(stage: &Stage<'_>) {
    stage.emitter.emit(
        Some(&stage.node.id),
        EventKind::ModelWarning {
            message: format!(
                "artifact capture looked at the first {} directories of the working tree only; set capture_artifacts=false, or run in a smaller directory",
                artifacts::MAX_DIRS
            ),
        },
    );
}

/// A succeeded outcome for a zero exit; otherwise failed, quoting the tail of standard error.
fn exit_outcome(status: std::process::ExitStatus, stderr: &[u8]) -> Outcome {
    if status.success() {
        return Outcome::success();
    }
    let stderr_text = String::from_utf8_lossy(stderr);
    let detail = text::tail(stderr_text.trim_end(), STDERR_TAIL_CHARS);
    let how = status.code().map_or_else(
        || "was killed by a signal".to_owned(),
        |c| format!("exited with code {c}"),
    );
    let reason = if detail.is_empty() {
        format!("the command {how}")
    } else {
        format!("the command {how}: {detail}")
    };
    Outcome::failed(FailureClass::StageFailed, reason)
}

/// What starting a command needs, owned, so that it starts on the blocking pool: the parse of a
/// simple command stats its program, and the start itself waits for the child to exec, neither of
/// which belongs on the runtime (a fan-out's branches then start side by side, not one by one).
struct Launch {
    script: String,
    language: ScriptLanguage,
    work_dir: std::path::PathBuf,
    /// The stage's directory: its time is the start on the file system's clock ([`start_time`]).
    stage_dir: std::path::PathBuf,
    /// The secret variables the node passes on; the child gets this process's environment without
    /// the others ([`Sandbox::start`]) ...
    pass_env: Vec<String>,
    /// ... then the run's identity, set after it (so it replaces any inherited one).
    identity: Vec<(&'static str, std::ffi::OsString)>,
    sandbox: Arc<Sandbox>,
    policy: Policy,
}

impl Launch {
    fn of(stage: &Stage<'_>, config: &CommandConfig, sandbox: &Arc<Sandbox>) -> Self {
        let identity = [
            (process_group::RUN_ID_VAR, OsStr::new(stage.run_id)),
            ("TRELLIS_NODE_ID", OsStr::new(&stage.node.id)),
            (process_group::STAGE_DIR_VAR, stage.dir.as_os_str()),
        ];
        let goal = (stage.workflow.graph.goal.as_deref()).map(|g| ("TRELLIS_GOAL", OsStr::new(g)));
        let identity = identity
            .into_iter()
            .chain(goal)
            .map(|(name, value)| (name, value.to_owned()))
            .collect();
        Self {
            script: config.script.clone(),
            language: config.language,
            work_dir: stage.settings.work_dir.clone(),
            stage_dir: stage.dir.to_path_buf(),
            pass_env: config.pass_env.to_vec(),
            identity,
            sandbox: sandbox.clone(),
            policy: sandbox_policy(&config.sandbox),
        }
    }

    /// The interpreter's name (for messages).
    fn interpreter(&self) -> &'static str {
        match self.language {
            ScriptLanguage::Shell => "sh",
            ScriptLanguage::Python => "python3",
        }
    }

    /// Starts `sh -c SCRIPT` (or `python3 -c`) — or, for a simple command, its program (`direct`)
    /// with the shell's `PWD` — in the work directory, in the run's sandbox, in a process group of
    /// its own, with pipes for the output.
    fn spawn(&self, direct: Option<&SimpleCommand>) -> std::io::Result<Started> {
        let interpreter;
        let (program, args): (&OsStr, Vec<&OsStr>) = if let Some(simple) = direct {
            (
                simple.program.as_os_str(),
                simple.args.iter().map(AsRef::as_ref).collect(),
            )
        } else {
            interpreter = program_path(self.interpreter());
            (
                &interpreter,
                vec![OsStr::new("-c"), OsStr::new(&self.script)],
            )
        };
        let mut extra: Vec<(&OsStr, &OsStr)> = self
            .identity
            .iter()
            .map(|(k, v)| (OsStr::new(k), v.as_os_str()))
            .collect();
        if direct.is_some() {
            // What the shell would have exported: the directory it runs in.
            extra.push((OsStr::new("PWD"), self.work_dir.as_os_str()));
        }
        self.sandbox.start(
            program,
            &args,
            &self.work_dir,
            &self.policy,
            &self.pass_env,
            &extra,
        )
    }

    /// Starts the script (on the blocking pool): its program directly when it is a simple command
    /// the kernel will start, else through its interpreter. Returns the start on the file system's
    /// clock and the child.
    fn start(&self) -> (std::time::SystemTime, std::io::Result<Started>) {
        let started = start_time(&self.stage_dir);
        // In the sandbox (or under the reaper) the kernel's refusal to start a program would come too
        // late to fall back on the shell, so there a program starts directly only when the kernel
        // surely takes it (a binary or a `#!` script).
        let direct = (self.language == ScriptLanguage::Shell)
            .then(|| simple_command::parse(&self.script, &self.work_dir))
            .flatten()
            .filter(|simple| {
                self.sandbox.starts_directly() || simple_command::kernel_starts(&simple.program)
            });
        if let Some(simple) = direct
            && let Ok(child) = self.spawn(Some(&simple))
        {
            return (started, Ok(child));
        }
        // Not simple, or a program the kernel would not start (a script without `#!`, which the
        // shell runs itself).
        (started, self.spawn(None))
    }
}

/// Records the captured artifacts: copied ones as the stage's files and `artifacts` detail, those left
/// out (too large) as `artifacts_skipped` with the reason. A capture cut short says so.
fn with_artifacts(
    stage: &Stage<'_>,
    mut outcome: Outcome,
    captured: artifacts::Captured,
) -> Outcome {
    if captured.truncated {
        warn_truncated(stage);
    }
    let (copied, skipped): (Vec<_>, Vec<_>) = captured
        .artifacts
        .into_iter()
        .partition(|a| a.skipped.is_none());
    outcome.files_touched = copied.iter().map(|a| a.path.clone()).collect();
    outcome.details.artifacts = copied;
    outcome.details.artifacts_skipped = skipped;
    outcome
}

impl CommandHandler {
    /// Runs the script and records what it did.
    async fn outcome(&self, stage: &Stage<'_>) -> Outcome {
        let NodeKind::Command(config) = &stage.node.kind else {
            return Outcome::success();
        };
        if stage.settings.dry_run() {
            return Outcome::success()
                .with_update(keys::COMMAND_OUTPUT, "")
                .with_update(keys::COMMAND_STDERR, "")
                .with_update(keys::COMMAND_EXIT_CODE, 0);
        }
        let work_dir = stage.settings.work_dir.clone();
        let runs_dir = artifacts::runs_dir(stage.dir);
        let launch = Launch::of(stage, config, &self.sandbox);
        let program = launch.interpreter();
        let (started, spawned) = blocking(move || launch.start()).await;
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => {
                return Outcome::failed(
                    FailureClass::CouldNotStart,
                    format!("cannot start `{program}`: {error}"),
                );
            }
        };
        let group = child.group(Some(process_group::stage_marker(stage.dir)));
        let Some((out_reader, err_reader)) = spawn_readers(&mut child, stage.dir) else {
            return Outcome::failed(
                FailureClass::CouldNotStart,
                format!("cannot read the output of `{program}`"),
            );
        };
        let status = child.wait().await;
        // The script is done: stop whatever it left running, which also closes the pipes; a process
        // that left the group and holds them open is killed too.
        let marker = group.close();
        if drain(async { (out_reader.await, err_reader.await) }, marker)
            .await
            .is_none()
        {
            stage.emitter.emit(
                Some(&stage.node.id),
                EventKind::ModelWarning {
                    message: "a process the command started outside its process group kept its output open; its output after the command ended is not recorded".to_owned(),
                },
            );
        }
        let (stdout_log, stderr_log) = (stage.dir.join("stdout.log"), stage.dir.join("stderr.log"));
        let artifacts_dir = artifacts_dir(stage, config);
        let (blobs, trees) = (stage.services.blobs.clone(), self.trees.clone());
        let include = stage.settings.artifacts.clone();
        // Artifacts and blobs in one trip to the blocking pool; standard error comes back for the reason.
        let finished = blocking(move || {
            let files = artifacts_dir.map(|(record, dest)| {
                let include = trellis_engine::settings::glob_set(&include);
                trees
                    .capture(
                        &work_dir,
                        started,
                        (&record, &dest),
                        (&runs_dir, include.as_ref()),
                    )
                    .unwrap_or_default()
            });
            let (out, err) = (
                secrets::redact_file(&stdout_log).unwrap_or_default(),
                secrets::redact_file(&stderr_log).unwrap_or_default(),
            );
            (
                (blobs.put(&out), blobs.put(&err)),
                err,
                files.unwrap_or_default(),
            )
        })
        .await;
        let ((Ok(output_ref), Ok(stderr_ref)), err, artifacts) = finished else {
            return Outcome::failed(
                FailureClass::Configuration,
                "cannot store the command's output in the blob store",
            );
        };
        let status = match status {
            Ok(status) => status,
            Err(error) => {
                return Outcome::failed(
                    FailureClass::CouldNotStart,
                    format!("cannot wait for `{program}`: {error}"),
                );
            }
        };
        let code = status.code();
        let mut outcome = with_artifacts(stage, exit_outcome(status, &err), artifacts);
        outcome.details.script = Some(config.script.clone());
        outcome.details.stdout = Some(output_ref.clone());
        outcome.details.stderr = Some(stderr_ref.clone());
        outcome.details.exit_code = code;
        outcome
            .with_update(keys::COMMAND_OUTPUT, output_ref)
            .with_update(keys::COMMAND_STDERR, stderr_ref)
            .with_update(
                keys::COMMAND_EXIT_CODE,
                code.map_or(serde_json::Value::Null, Into::into),
            )
    }
}

#[async_trait]
impl Handler for CommandHandler {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        self.outcome(stage).await.into()
    }
}
