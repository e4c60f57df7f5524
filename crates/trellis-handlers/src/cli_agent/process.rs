//! Running one CLI invocation: the program in the working directory, in a process group of its own
//! (recorded in the stage's `process` file for `trellis resume`'s reaper, and killed with everything
//! it started when the invocation ends or the stage is dropped on timeout or cancellation), the prompt
//! on standard input, its output read line by line as it streams — teed into `stdout.log` and
//! `stderr.log` — and handed to the CLI's reader.

use std::path::Path;
use std::process::{ExitStatus, Stdio};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use trellis_agent::AgentEvent;
use trellis_process::group::{self as process_group, ProcessGroup, drain};

use super::CommandLine;
use super::stream::Stream;

/// Lines of output that are not JSON quoted in a failure.
const QUOTED_LINES: usize = 5;
/// Standard error kept in memory for messages (the log gets all of it).
const STDERR_KEPT: usize = 64 * 1024;

/// One finished invocation.
pub(super) struct Ran {
    pub stream: Stream,
    pub status: ExitStatus,
    /// The end of standard error.
    pub stderr: String,
    /// The first lines of output that were not JSON.
    pub garbage: Vec<String>,
    /// JSON lines read.
    pub lines: usize,
}

/// Where and how to run.
pub(super) struct Spawn<'a> {
    pub program: &'a str,
    pub work_dir: &'a Path,
    pub stage_dir: &'a Path,
    pub env: Vec<(String, String)>,
}

/// Runs the command, handing each JSON line to `read` and the events it yields to `observe`.
pub(super) async fn run(
    spawn: &Spawn<'_>,
    line: CommandLine,
    read: fn(&mut Stream, &Value),
    observe: &mut (dyn FnMut(AgentEvent) + Send),
) -> std::io::Result<Ran> {
    let mut command = tokio::process::Command::new(spawn.program);
    command
        .args(&line.args)
        .current_dir(spawn.work_dir)
        .envs(spawn.env.iter().map(|(k, v)| (k, v)))
        .stdin(if line.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    // The prompt goes to standard input (taken before the group holds the child: it is not a
    // reaper's).
    if let (Some(mut stdin), Some(text)) = (child.stdin.take(), line.stdin) {
        // Written beside the reading, so a large prompt cannot block on a full pipe; a CLI that stops
        // reading early only makes the write fail.
        tokio::spawn(async move {
            let _ = stdin.write_all(text.as_bytes()).await;
        });
    }
    let group = ProcessGroup::of(&mut child, process_group::marker_in(&spawn.env));
    let stderr = child.stderr.take().map(|pipe| {
        let log = spawn.stage_dir.join("stderr.log");
        tokio::spawn(keep_stderr(pipe, log))
    });
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no standard output"))?;
    let mut log = trellis_process::files::create_no_link_async(&spawn.stage_dir.join("stdout.log"))
        .await
        .ok();
    let mut ran = Ran {
        stream: Stream::default(),
        status: ExitStatus::default(),
        stderr: String::new(),
        garbage: Vec::new(),
        lines: 0,
    };
    let status = {
        let reading = async {
            let mut reader = BufReader::new(stdout);
            let mut buffer = Vec::new();
            loop {
                buffer.clear();
                match reader.read_until(b'\n', &mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if let Some(file) = log.as_mut() {
                    let _ = file.write_all(&buffer).await;
                }
                read_line(&mut ran, &buffer, read, observe);
            }
        };
        tokio::pin!(reading);
        tokio::select! {
            status = child.wait() => {
                // The CLI is gone: stop whatever it left running, which also closes the pipe, then
                // read what is still buffered (not waiting on a process that escaped the group).
                let marker = group.close();
                let _ = drain(&mut reading, marker).await;
                status
            }
            () = &mut reading => {
                let status = child.wait().await;
                group.close();
                status
            }
        }
    };
    ran.status = status?;
    // The raw streams hold what the CLI's tools printed: no secret value stays in the record.
    let logs = [
        spawn.stage_dir.join("stdout.log"),
        spawn.stage_dir.join("stderr.log"),
    ];
    trellis_process::task::blocking(move || {
        for log in &logs {
            let _ = trellis_process::secrets::redact_file(log);
        }
    })
    .await;
    if let Some(stderr) = stderr {
        let text = stderr.await.unwrap_or_default();
        ran.stderr = trellis_process::secrets::redact(&text).into_owned();
    }
    Ok(ran)
}

/// Hands one line of output to the CLI's reader, or keeps it as a line that is not JSON.
fn read_line(
    ran: &mut Ran,
    bytes: &[u8],
    read: fn(&mut Stream, &Value),
    observe: &mut (dyn FnMut(AgentEvent) + Send),
) {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value) if value.is_object() => {
            ran.lines += 1;
            read(&mut ran.stream, &value);
            for event in ran.stream.events.drain(..) {
                observe(event);
            }
        }
        _ => {
            if ran.garbage.len() < QUOTED_LINES {
                ran.garbage.push(text.chars().take(300).collect());
            }
        }
    }
}

/// Copies standard error into its log, keeping its end for messages.
async fn keep_stderr(mut pipe: tokio::process::ChildStderr, log: std::path::PathBuf) -> String {
    let mut file = trellis_process::files::create_no_link_async(&log)
        .await
        .ok();
    let mut kept: Vec<u8> = Vec::new();
    let mut buffer = vec![0u8; 16 * 1024];
    while let Ok(n) = pipe.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        if let Some(file) = file.as_mut() {
            let _ = file.write_all(&buffer[..n]).await;
        }
        kept.extend_from_slice(&buffer[..n]);
        if kept.len() > 2 * STDERR_KEPT {
            kept.drain(..kept.len() - STDERR_KEPT);
        }
    }
    String::from_utf8_lossy(&kept).trim().to_owned()
}
