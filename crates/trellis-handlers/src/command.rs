//! Command nodes: run `script` with `sh -c` (or `python3 -c` for `language="python"`) in the run's work
//! directory, in a process group of its own, with the secrets of the environment withheld unless the
//! node's `env` names them (see `trellis_agent::secrets`). Standard output and error stream into the
//! stage's `stdout.log` and `stderr.log` while it runs, are stored whole as blobs afterwards (with known
//! secret values redacted), and appear in the context as `command.output`, `command.stderr` and
//! `command.exit_code`. A non-zero exit is a failed outcome with the tail of standard error as its
//! reason. When the stage ends — normally, or because it timed out and the engine dropped it — the
//! whole process group is killed, and so is any process that left the group but carries the stage's
//! `TRELLIS_STAGE_DIR`, so nothing keeps running or holds the run open. New test artifacts are
//! captured into `artifacts/<node>/attempt-<n>/`.

use std::path::Path;
use std::process::Stdio;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::io::{Read, Write};

use tokio::process::{ChildStderr, ChildStdout};
use trellis_agent::process_group::{self, ProcessGroup, drain};
use trellis_agent::secrets;
use trellis_engine::event::EventKind;
use trellis_engine::text;
use trellis_engine::{Artifact, Attempt, FailureClass, Handler, Outcome, Stage, keys};
use trellis_workflow::NodeKind;
use trellis_workflow::node_kind::{CommandConfig, ScriptLanguage};

use crate::artifacts;

pub struct CommandHandler;

/// How much of standard error a failure reason quotes.
const STDERR_TAIL_CHARS: usize = 2000;

/// The file in a stage directory created just before a command starts (its time is the start, on the
/// file system's clock) and then holding the command's process group id.
const PROCESS_FILE: &str = "process";

/// Stops the commands an interrupted run left running: every stage directory under `run_dir` with a
/// `process` file but no `status.json` (the stage never finished) names a process group, which is killed
/// if it still belongs to this run (its leader's environment has `TRELLIS_RUN_ID=<run_id>`, so a reused
/// pid is never touched). Returns how many groups were stopped.
#[allow(
    clippy::disallowed_methods,
    reason = "called before a resumed run starts, on the blocking pool"
)]
pub fn reap(run_dir: &Path, run_id: &str) -> usize {
    let marker = format!("TRELLIS_RUN_ID={run_id}");
    walkdir::WalkDir::new(run_dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_name() == PROCESS_FILE)
        .filter(|e| {
            e.path()
                .parent()
                .is_some_and(|dir| !dir.join("status.json").exists())
        })
        .filter_map(|e| {
            std::fs::read_to_string(e.path())
                .ok()?
                .trim()
                .parse::<i32>()
                .ok()
        })
        .filter(|pgid| u32::try_from(*pgid).is_ok_and(|pid| process_group::carries(pid, &marker)))
        .filter(|pgid| killpg(Pid::from_raw(*pgid), Signal::SIGKILL).is_ok())
        .count()
}

/// Copies a pipe into a log file as the command writes it. Runs on the blocking pool, one thread per
/// pipe, so the logs fill while the command runs.
#[allow(
    clippy::disallowed_methods,
    reason = "runs on the blocking pool, one thread per pipe"
)]
fn tee(mut pipe: std::fs::File, log: &Path) {
    let mut file = std::fs::File::create(log).ok();
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(n) = pipe.read(&mut buffer) {
        if n == 0 {
            break;
        }
        if let Some(file) = file.as_mut() {
            let _ = file.write_all(&buffer[..n]);
        }
    }
}

/// "Now" on the file system's clock. File times come from the kernel's coarse clock; a marker file
/// written before the command starts gives the instant on that clock, so artifacts written right after
/// the start are never mistaken for older files.
#[allow(clippy::disallowed_methods, reason = "called on the blocking pool")]
fn start_marker(stage_dir: &Path) -> std::time::SystemTime {
    let marker = stage_dir.join(PROCESS_FILE);
    std::fs::write(&marker, b"")
        .and_then(|()| std::fs::metadata(&marker)?.modified())
        .unwrap_or_else(|_| std::time::SystemTime::now())
}

type Reader = tokio::task::JoinHandle<()>;

/// Starts one blocking reader per pipe, teeing into `stdout.log` and `stderr.log`. The first also
/// records the process group in the `process` file, so `trellis resume` can stop it after a kill.
#[allow(
    clippy::disallowed_methods,
    reason = "its file work runs in the blocking-pool closures it starts"
)]
fn spawn_readers(
    child: &mut tokio::process::Child,
    dir: &Path,
    pgid: Option<i32>,
) -> Option<(Reader, Reader)> {
    let stdout = child.stdout.take().map(ChildStdout::into_owned_fd)?.ok()?;
    let stderr = child.stderr.take().map(ChildStderr::into_owned_fd)?.ok()?;
    let process_file = pgid.map(|pgid| (dir.join(PROCESS_FILE), pgid.to_string()));
    let (stdout_log, stderr_log) = (dir.join("stdout.log"), dir.join("stderr.log"));
    let out_reader = tokio::task::spawn_blocking(move || {
        if let Some((path, pgid)) = process_file {
            let _ = std::fs::write(path, pgid);
        }
        tee(std::fs::File::from(stdout), &stdout_log);
    });
    let err_reader =
        tokio::task::spawn_blocking(move || tee(std::fs::File::from(stderr), &stderr_log));
    Some((out_reader, err_reader))
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

/// `sh -c SCRIPT` (or `python3 -c`) in the work directory, in a process group of its own, with pipes
/// for the output and the run's identity in the environment.
fn command_for(
    stage: &Stage<'_>,
    config: &CommandConfig,
) -> (&'static str, tokio::process::Command) {
    let (script, language) = (&config.script, config.language);
    let program = match language {
        ScriptLanguage::Shell => "sh",
        ScriptLanguage::Python => "python3",
    };
    let mut command = tokio::process::Command::new(program);
    command
        .arg("-c")
        .arg(script)
        .current_dir(&stage.settings.work_dir)
        .env_clear()
        .envs(secrets::child_env(&config.pass_env))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .env("TRELLIS_RUN_ID", stage.run_id)
        .env("TRELLIS_NODE_ID", &stage.node.id)
        .env(process_group::STAGE_DIR_VAR, stage.dir);
    if let Some(goal) = &stage.workflow.graph.goal {
        command.env("TRELLIS_GOAL", goal);
    }
    (program, command)
}

/// Records the captured artifacts: copied ones as the stage's files and `artifacts` detail, those left
/// out (too large) as `artifacts_skipped` with the reason.
fn with_artifacts(mut outcome: Outcome, artifacts: Vec<Artifact>) -> Outcome {
    let (copied, skipped): (Vec<_>, Vec<_>) =
        artifacts.into_iter().partition(|a| a.skipped.is_none());
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
        if stage.settings.dry_run {
            return Outcome::success()
                .with_update(keys::COMMAND_OUTPUT, "")
                .with_update(keys::COMMAND_STDERR, "")
                .with_update(keys::COMMAND_EXIT_CODE, 0);
        }
        let (program, mut command) = command_for(stage, config);
        let work_dir = stage.settings.work_dir.clone();
        let runs_dir = artifacts::runs_dir(stage.dir);
        let marker_dir = stage.dir.to_path_buf();
        let started = tokio::task::spawn_blocking(move || start_marker(&marker_dir))
            .await
            .unwrap_or_else(|_| std::time::SystemTime::now());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                return Outcome::failed(
                    FailureClass::CouldNotStart,
                    format!("cannot start `{program}`: {error}"),
                );
            }
        };
        let group = ProcessGroup::of(&child, Some(process_group::stage_marker(stage.dir)));
        let Some((out_reader, err_reader)) = spawn_readers(&mut child, stage.dir, group.id())
        else {
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
        let artifacts_dir = stage.dir.parent().and_then(Path::parent).map(|run| {
            run.join("artifacts")
                .join(&stage.node.id)
                .join(format!("attempt-{}", stage.attempt))
        });
        let blobs = stage.services.blobs.clone();
        // Artifacts and blobs in one trip to the blocking pool; standard error comes back for the reason.
        let finished = tokio::task::spawn_blocking(move || {
            let files = artifacts_dir.map(|dest| {
                artifacts::capture(&work_dir, started, &dest, &runs_dir).unwrap_or_default()
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
        let Ok(((Ok(output_ref), Ok(stderr_ref)), err, artifacts)) = finished else {
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
        let mut outcome = with_artifacts(exit_outcome(status, &err), artifacts);
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
