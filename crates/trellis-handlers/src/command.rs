//! Command nodes: run `script` with `sh -c` (or `python3 -c` for `language="python"`) in the run's work
//! directory, in a process group of its own. Standard output and error stream into the stage's
//! `stdout.log` and `stderr.log` while it runs, are stored as blobs afterwards, and appear in the context
//! as `command.output`, `command.stderr` and `command.exit_code`. A non-zero exit is a failed outcome
//! with the tail of standard error as its reason. When the stage ends — normally, or because it timed
//! out and the engine dropped it — the whole process group is killed, so no stray process keeps running.
//! New test artifacts are captured into `artifacts/<node>/attempt-<n>/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use trellis_engine::{FailureClass, Handler, Outcome, Stage, keys};
use trellis_workflow::NodeKind;
use trellis_workflow::node_kind::ScriptLanguage;

use crate::artifacts;

pub struct CommandHandler;

/// How much of standard error a failure reason quotes.
const STDERR_TAIL_CHARS: usize = 2000;
/// Output kept in memory for the blob store; the log files always get everything.
const MAX_CAPTURED: usize = 64 * 1024 * 1024;

/// The file in a stage directory that names the process group of a running command.
const PGID_FILE: &str = "pgid";

/// Stops the commands an interrupted run left running: every stage directory under `run_dir` with a
/// `pgid` file but no `status.json` (the stage never finished) names a process group, which is killed
/// if it still belongs to this run (its leader's environment has `TRELLIS_RUN_ID=<run_id>`, so a reused
/// pid is never touched). Returns how many groups were stopped.
pub fn reap(run_dir: &Path, run_id: &str) -> usize {
    let marker = format!("TRELLIS_RUN_ID={run_id}");
    walkdir::WalkDir::new(run_dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_name() == PGID_FILE)
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
        .filter(|pgid| {
            std::fs::read(format!("/proc/{pgid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == marker.as_bytes()))
        })
        .filter(|pgid| killpg(Pid::from_raw(*pgid), Signal::SIGKILL).is_ok())
        .count()
}

/// Kills the process group when dropped, unless disarmed.
struct ProcessGroup(Option<Pid>);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

/// Copies a stream into a log file while keeping (up to a limit) a copy in memory.
async fn tee(mut stream: impl AsyncRead + Unpin, log: &Path) -> Vec<u8> {
    let mut file = tokio::fs::File::create(log).await.ok();
    let mut captured = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(n) = stream.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        if let Some(file) = file.as_mut() {
            let _ = file.write_all(&buffer[..n]).await;
        }
        if captured.len() < MAX_CAPTURED {
            captured.extend_from_slice(&buffer[..n]);
        }
    }
    if let Some(file) = file.as_mut() {
        let _ = file.flush().await;
    }
    captured
}

fn tail(text: &str, chars: usize) -> &str {
    let count = text.chars().count();
    if count <= chars {
        return text;
    }
    let skip = text.char_indices().nth(count - chars).map_or(0, |(i, _)| i);
    &text[skip..]
}

/// "Now" on the file system's clock. File times come from the kernel's coarse clock; a marker file
/// written before the command starts gives the instant on that clock, so artifacts written right after
/// the start are never mistaken for older files.
async fn start_marker(stage_dir: &Path) -> std::time::SystemTime {
    let marker = stage_dir.join("started");
    let written = match tokio::fs::write(&marker, b"").await {
        Ok(()) => tokio::fs::metadata(&marker)
            .await
            .and_then(|m| m.modified())
            .ok(),
        Err(_) => None,
    };
    written.unwrap_or_else(std::time::SystemTime::now)
}

/// Copies the artifacts the command produced to `<run>/artifacts/<node>/attempt-<n>/`.
async fn capture_artifacts(
    stage: &Stage<'_>,
    work_dir: PathBuf,
    runs_dir: PathBuf,
    since: std::time::SystemTime,
) -> Vec<PathBuf> {
    let Some(run) = stage.dir.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let dest = run
        .join("artifacts")
        .join(&stage.node.id)
        .join(format!("attempt-{}", stage.attempt));
    tokio::task::spawn_blocking(move || {
        artifacts::capture(&work_dir, since, &dest, &runs_dir).unwrap_or_default()
    })
    .await
    .unwrap_or_default()
}

/// A succeeded outcome for a zero exit; otherwise failed, quoting the tail of standard error.
fn exit_outcome(status: std::process::ExitStatus, stderr: &[u8]) -> Outcome {
    if status.success() {
        return Outcome::success();
    }
    let stderr_text = String::from_utf8_lossy(stderr);
    let detail = tail(stderr_text.trim_end(), STDERR_TAIL_CHARS);
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
    script: &str,
    language: ScriptLanguage,
) -> (&'static str, tokio::process::Command) {
    let program = match language {
        ScriptLanguage::Shell => "sh",
        ScriptLanguage::Python => "python3",
    };
    let mut command = tokio::process::Command::new(program);
    command
        .arg("-c")
        .arg(script)
        .current_dir(&stage.settings.work_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .env("TRELLIS_RUN_ID", stage.run_id)
        .env("TRELLIS_NODE_ID", &stage.node.id)
        .env("TRELLIS_STAGE_DIR", stage.dir);
    if let Some(goal) = &stage.workflow.graph.goal {
        command.env("TRELLIS_GOAL", goal);
    }
    (program, command)
}

#[async_trait]
impl Handler for CommandHandler {
    async fn execute(&self, stage: &Stage<'_>) -> Outcome {
        let NodeKind::Command(config) = &stage.node.kind else {
            return Outcome::success();
        };
        if stage.settings.dry_run {
            return Outcome::success()
                .with_update(keys::COMMAND_OUTPUT, "")
                .with_update(keys::COMMAND_STDERR, "")
                .with_update(keys::COMMAND_EXIT_CODE, 0);
        }
        let (program, mut command) = command_for(stage, &config.script, config.language);
        let work_dir = stage.settings.work_dir.clone();
        // The run record is `<runs dir>/<run>/stages/<stage>`; the runs directory is never scanned.
        let runs_dir = stage
            .dir
            .ancestors()
            .nth(3)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let started = start_marker(stage.dir).await;
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                return Outcome::failed(
                    FailureClass::CouldNotStart,
                    format!("cannot start `{program}`: {error}"),
                );
            }
        };
        let group = ProcessGroup(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .map(Pid::from_raw),
        );
        // If this process is killed, `trellis resume` finds the group here and stops it (see `reap`).
        if let Some(pgid) = group.0 {
            let _ = tokio::fs::write(stage.dir.join(PGID_FILE), pgid.to_string()).await;
        }
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (stdout_log, stderr_log) = (stage.dir.join("stdout.log"), stage.dir.join("stderr.log"));
        let (status, out, err) = tokio::join!(
            async {
                let status = child.wait().await;
                // The script is done: stop whatever it left running, which also closes the pipes.
                if let Some(pgid) = group.0 {
                    let _ = killpg(pgid, Signal::SIGKILL);
                }
                status
            },
            tee(stdout, &stdout_log),
            tee(stderr, &stderr_log),
        );
        drop(group);
        let files_touched = capture_artifacts(stage, work_dir, runs_dir, started).await;
        let blobs = stage.services.blobs.clone();
        // Standard error comes back for the failure reason.
        let stored =
            tokio::task::spawn_blocking(move || ((blobs.put(&out), blobs.put(&err)), err)).await;
        let Ok(((Ok(output_ref), Ok(stderr_ref)), err)) = stored else {
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
        let mut outcome = exit_outcome(status, &err);
        outcome.files_touched = files_touched
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        outcome
            .with_update(keys::COMMAND_OUTPUT, output_ref)
            .with_update(keys::COMMAND_STDERR, stderr_ref)
            .with_update(
                keys::COMMAND_EXIT_CODE,
                code.map_or(serde_json::Value::Null, Into::into),
            )
    }
}
