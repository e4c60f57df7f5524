//! `trellis logs RUN [STAGE] [--follow]`: a stage's output — a command's standard output and error,
//! an agent's transcript as readable lines — from its files, live with `--follow` (from another
//! terminal, or for a run the server runs). Standard output goes to standard output and standard
//! error to standard error, as the command wrote them; headers naming the stage go to standard error.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use serde_json::Value;
use trellis_engine::event::EventKind;
use trellis_store::{Chunk, Position, RunDir, StageOutput, StageState, Stream, resolve_runs_dir};

#[derive(clap::Args)]
pub struct LogsArgs {
    /// The run id (or a unique prefix), or the run's directory.
    run: String,
    /// A node id (its latest attempt) or a stage directory (`002-build@1`); every stage when left out.
    stage: Option<String>,
    /// Keep printing output as it is written, until the stage (or, without STAGE, the run) ends.
    #[arg(long, short)]
    follow: bool,
    /// Where run records live [default: `$TRELLIS_RUNS_DIR` or `~/.trellis/runs`].
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<PathBuf>,
}

/// How often `--follow` looks at the files.
const POLL: Duration = Duration::from_millis(100);
/// At most this much of a file is read at a time.
const CHUNK: u64 = 1 << 20;

/// One stage being printed.
struct Followed {
    node: String,
    output: StageOutput,
    /// Its output is all printed (it ended, and a last read found nothing).
    done: bool,
}

pub fn logs(args: &LogsArgs) -> anyhow::Result<ExitCode> {
    let runs_dir = resolve_runs_dir(args.runs_dir.clone());
    let record = RunDir::open(&args.run, &runs_dir)?;
    let run_id = record.meta()?.run_id;
    let mut started = Started::new(&record, run_id);
    let mut stages: Vec<Followed> = Vec::new();
    let mut seen = HashSet::new();
    let mut headed: Option<usize> = None;
    loop {
        // Asked before reading: a run that ends in between wrote everything before it let go.
        let running = record.has_live_owner();
        for (node, dir) in started.read()? {
            let wanted = args.stage.as_deref().is_none_or(|s| s == node || s == dir);
            if wanted && seen.insert(dir.clone()) {
                let Some(output) = record.stage_output(&dir, Position::default()) else {
                    continue;
                };
                // A node named again by a later visit: its latest attempt is the one shown.
                if args.stage.as_deref() == Some(node.as_str()) {
                    stages.clear();
                    headed = None;
                }
                stages.push(Followed {
                    node,
                    output,
                    done: false,
                });
            }
        }
        if let Some(stage) = &args.stage
            && !args.follow
            && stages.is_empty()
        {
            bail!(
                "run {} has no stage `{stage}` (yet): give a node id or a stage directory as `trellis show` lists them",
                record.root().display()
            );
        }
        let several = args.stage.is_none();
        for (i, stage) in stages.iter_mut().enumerate().filter(|(_, s)| !s.done) {
            let over = !running || !args.follow || stage.output.state() == StageState::Ended;
            let chunks = stage.output.read(CHUNK, over)?;
            if chunks.is_empty() {
                stage.done = over;
                continue;
            }
            if several && headed != Some(i) {
                let dir = stage.output.dir().file_name().unwrap_or_default();
                trellis_process::note!("── {} ({}) ──", stage.node, dir.to_string_lossy());
                headed = Some(i);
            }
            print_chunks(&chunks)?;
        }
        let all_done = stages.iter().all(|s| s.done);
        let finished = match &args.stage {
            Some(_) => !stages.is_empty() && all_done,
            None => !running && all_done,
        };
        if !args.follow || finished {
            return Ok(ExitCode::SUCCESS);
        }
        if !running && stages.is_empty() {
            bail!(
                "the run is not running and has no stage `{}`",
                args.stage.as_deref().unwrap_or_default()
            );
        }
        std::thread::sleep(POLL);
    }
}

fn print_chunks(chunks: &[Chunk]) -> anyhow::Result<()> {
    for chunk in chunks {
        match chunk.stream {
            Stream::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(chunk.text.as_bytes())?;
                out.flush()?;
            }
            Stream::Stderr => {
                let mut err = std::io::stderr().lock();
                err.write_all(chunk.text.as_bytes())?;
                err.flush()?;
            }
            Stream::Transcript => {
                let mut out = std::io::stdout().lock();
                for line in chunk.text.lines() {
                    if let Some(shown) = serde_json::from_str::<Value>(line)
                        .ok()
                        .and_then(|entry| transcript_line(&entry))
                    {
                        writeln!(out, "{shown}")?;
                    }
                }
                out.flush()?;
            }
        }
    }
    Ok(())
}

/// How many characters of a tool's result a line shows.
const RESULT_CHARS: usize = 300;

/// A transcript entry as the terminal shows it; `None` for entries not worth a line.
pub(super) fn transcript_line(entry: &Value) -> Option<String> {
    let line = entry_line(entry)?;
    // A sub-agent's entries are marked with its id (a spawn names it already).
    Some(match entry["agent"].as_str() {
        Some(agent) if entry["type"] != "subagent" && entry["type"] != "subagent_closed" => {
            format!("[{agent}] {line}")
        }
        _ => line,
    })
}

fn entry_line(entry: &Value) -> Option<String> {
    let text = |key: &str| entry[key].as_str().unwrap_or_default().to_owned();
    Some(match entry["type"].as_str()? {
        "subagent" => format!("⇢ sub-agent {} started: {}", text("agent"), text("task")),
        "subagent_closed" => format!("⇢ sub-agent {} closed", text("agent")),
        "user" => format!("user: {}", text("text")),
        "steer" => format!("steering: {}", text("text")),
        "steer_undelivered" => format!(
            "! steering message not delivered (the agent had finished): {}",
            text("text")
        ),
        "assistant" => format!("assistant: {}", text("text")),
        "turn" => format!("── turn {}", entry["turn"]),
        "approval" => format!("? {}", text("prompt").replace('\n', " ")),
        "approval_answer" => format!(
            "  {} {}",
            if entry["asked"].as_bool() == Some(true) {
                "answered"
            } else {
                "nobody to ask:"
            },
            text("label")
        ),
        "tool_call" => format!("→ {} {}", text("tool"), entry["arguments"]),
        "tool_result" => {
            let output = text("output");
            let mut shown: String = output.chars().take(RESULT_CHARS).collect();
            if shown.len() < output.len() {
                shown.push('…');
            }
            let verdict = if entry["is_error"].as_bool() == Some(true) {
                "error"
            } else {
                "ok"
            };
            format!(
                "← {} {verdict} ({} ms): {}",
                text("tool"),
                entry["duration_ms"],
                shown.trim_end()
            )
        }
        "usage" => {
            let usage = &entry["usage"];
            format!(
                "   tokens: {} in ({} cached), {} out",
                usage["input_tokens"], usage["cached_tokens"], usage["output_tokens"]
            )
        }
        "loop_detected" => format!("! loop detected: {}", entry["tools"]),
        "compaction" => format!(
            "! the conversation was compacted ({} turns summarised)",
            entry["original_turn_count"]
        ),
        "error" => format!("! error: {}", text("message")),
        "command" => format!("$ {} {}", text("program"), entry["args"]),
        _ => return None,
    })
}

/// The run's stages as they start, read from its event log as it grows: `(node, stage dir)`.
struct Started {
    tail: trellis_store::EventTail,
    run_id: String,
}

impl Started {
    fn new(record: &RunDir, run_id: String) -> Self {
        Self {
            tail: record.event_tail(),
            run_id,
        }
    }

    /// The stages started since the last read (the run's own, not a sub-workflow's).
    fn read(&mut self) -> anyhow::Result<Vec<(String, String)>> {
        let (events, _) = self.tail.read()?;
        Ok(events
            .into_iter()
            .filter(|event| event.run_id == self.run_id)
            .filter_map(|event| match (event.kind, event.node_id) {
                (EventKind::StageStarted { dir, .. }, Some(node)) => Some((node, dir)),
                _ => None,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn transcript_entries_read_as_lines() {
        let call = json!({"type": "tool_call", "tool": "read_file", "arguments": {"path": "a.py"}});
        assert_eq!(
            transcript_line(&call).unwrap(),
            r#"→ read_file {"path":"a.py"}"#
        );
        let result = json!({"type": "tool_result", "tool": "shell", "is_error": true, "duration_ms": 12, "output": "boom\n"});
        assert_eq!(
            transcript_line(&result).unwrap(),
            "← shell error (12 ms): boom"
        );
        let usage = json!({"type": "usage", "usage": {"input_tokens": 10, "cached_tokens": 8, "output_tokens": 2}});
        assert_eq!(
            transcript_line(&usage).unwrap(),
            "   tokens: 10 in (8 cached), 2 out"
        );
        assert!(transcript_line(&json!({"type": "mystery"})).is_none());
    }
}
