//! The `shell` tool: `sh -c` in the working directory, in the run's sandbox, in a process group of its
//! own, with secrets removed from its environment unless the node passes them on, and their values
//! redacted from its output (see `trellis_process::secrets`). When the call ends — the command exits,
//! its timeout runs out, or the session is dropped because the stage was cancelled — the whole group is
//! killed (and, in the sandbox, everything in it), so nothing it started in the background lingers.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::tools::ToolOutput;
use trellis_process::group::{self as process_group, drain};
use trellis_process::sandbox::{Policy, Sandbox};
use trellis_process::secrets;
use trellis_process::task::blocking;

/// Output kept in memory per stream; more is dropped (the model sees far less anyway).
const MAX_CAPTURED: usize = 4 * 1024 * 1024;

pub struct ShellCommand<'a> {
    pub dir: &'a Path,
    pub command: &'a str,
    pub timeout: Duration,
    pub env: &'a [(String, String)],
    /// Secret variables the node passes on (`env`).
    pub pass_env: &'a [String],
    /// The run's sandbox, and the node's policy in it.
    pub sandbox: &'a Sandbox,
    pub policy: &'a Policy,
}

pub async fn run(shell: &ShellCommand<'_>) -> ToolOutput {
    let started = Instant::now();
    // Starting waits for the process (or for the spawner's answer): off the runtime's threads.
    let (sandbox, policy) = (shell.sandbox.clone(), shell.policy.clone());
    let (dir, command) = (shell.dir.to_path_buf(), shell.command.to_owned());
    let (pass_env, env) = (shell.pass_env.to_vec(), shell.env.to_vec());
    let spawned = blocking(move || {
        let extra: Vec<(&OsStr, &OsStr)> = env
            .iter()
            .map(|(k, v)| (OsStr::new(k), OsStr::new(v)))
            .collect();
        sandbox.start(
            "sh".as_ref(),
            &["-c".as_ref(), command.as_ref()],
            &dir,
            &policy,
            &pass_env,
            &extra,
        )
    })
    .await;
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return ToolOutput::error(format!("cannot start `sh`: {e}")),
    };
    // The stage's marker finds what the command started outside its group.
    let group = child.group(process_group::marker_in(shell.env));
    let (stdout, stderr) = child.outputs().unzip();
    let stdout = tokio::spawn(capture(stdout));
    let stderr = tokio::spawn(capture(stderr));
    let status = tokio::time::timeout(shell.timeout, child.wait()).await;
    // The command is over (or out of time): stop whatever it left behind, which also closes the pipes.
    let marker = group.close();
    let (stdout, stderr) = drain(async { (stdout.await, stderr.await) }, marker)
        .await
        .unwrap_or((Ok(Vec::new()), Ok(Vec::new())));
    let (stdout, stderr) = (stdout.unwrap_or_default(), stderr.unwrap_or_default());
    let mut content = secrets::redact(&String::from_utf8_lossy(&stdout)).into_owned();
    if !stderr.is_empty() {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        let _ = write!(
            content,
            "[stderr]\n{}",
            secrets::redact(&String::from_utf8_lossy(&stderr))
        );
    }
    if !content.is_empty() && !content.ends_with('\n') {
        content.push('\n');
    }
    match status {
        Ok(Ok(status)) => {
            let note = status
                .code()
                .map_or_else(|| "killed by a signal".to_owned(), exit_note);
            let _ = write!(content, "[{note}]");
            ToolOutput {
                note: Some(note),
                ..ToolOutput::ok(content)
            }
        }
        Ok(Err(e)) => ToolOutput::error(format!("{content}[cannot wait for the command: {e}]")),
        Err(_) => {
            let _ = write!(
                content,
                "[timed out after {} ms; the command and everything it started were killed]",
                started.elapsed().as_millis()
            );
            ToolOutput {
                note: Some("timed out".to_owned()),
                ..ToolOutput::error(content)
            }
        }
    }
}

async fn capture(pipe: Option<impl AsyncRead + Unpin>) -> Vec<u8> {
    let Some(mut pipe) = pipe else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(n) = pipe.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        if kept.len() < MAX_CAPTURED {
            kept.extend_from_slice(&buffer[..n]);
        }
    }
    kept
}

/// The note of a command that exited with status `code`.
fn exit_note(code: i32) -> String {
    format!("exit {code}")
}

/// Whether a `shell` call's output is that of a command that exited with status 0.
pub fn succeeded(output: &ToolOutput) -> bool {
    output.note.as_deref() == Some(exit_note(0).as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    static NONE: std::sync::LazyLock<Sandbox> = std::sync::LazyLock::new(Sandbox::none);
    static POLICY: Policy = Policy {
        network_off: false,
        writable: Vec::new(),
    };

    fn command<'a>(dir: &'a Path, script: &'a str, timeout: Duration) -> ShellCommand<'a> {
        ShellCommand {
            dir,
            command: script,
            timeout,
            env: &[],
            pass_env: &[],
            sandbox: &NONE,
            policy: &POLICY,
        }
    }

    #[tokio::test]
    async fn output_error_stream_and_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(&command(
            dir.path(),
            "echo out; echo err >&2; exit 3",
            Duration::from_secs(10),
        ))
        .await;
        assert_eq!(out.content, "out\n[stderr]\nerr\n[exit 3]");
        assert!(!out.is_error);
        assert_eq!(out.note.as_deref(), Some("exit 3"));
    }
}
