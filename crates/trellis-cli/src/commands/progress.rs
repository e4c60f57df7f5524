//! Live progress for `trellis run` and `trellis resume`, one subscriber of the run's events (the event
//! log is another): stage events become one line each on standard error (status and duration), with a
//! spinner for the running stage when standard error is a terminal. An agent's tool calls show one line
//! each under their stage as they finish (`shell cargo test … exit 101`); with `--verbose` the models'
//! answers stream as they are written.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use trellis_engine::event::{Event, EventKind};
use trellis_engine::services::EventSink;
use trellis_workflow::StageStatus;

/// The stage currently running, for the spinner.
#[derive(Default)]
struct Running {
    node: Option<String>,
    since: Option<Instant>,
    /// Streamed model text is on the current line.
    mid_text: bool,
    /// The node whose stage just failed, until its edge is chosen.
    failed: Option<String>,
}

pub struct Progress {
    interactive: bool,
    /// Stream the models' text (`--verbose`).
    verbose: bool,
    running: Arc<Mutex<Running>>,
}

/// How much of a tool call's path or command its line shows.
const TARGET_CHARS: usize = 80;

impl Progress {
    pub fn new(verbose: bool) -> Arc<Self> {
        let progress = Arc::new(Self {
            interactive: std::io::stderr().is_terminal(),
            verbose,
            running: Arc::default(),
        });
        if progress.interactive {
            let running = progress.running.clone();
            tokio::spawn(async move {
                const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
                let mut frame = 0;
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let guard = running.lock();
                    if let (Some(node), Some(since)) = (&guard.node, guard.since) {
                        eprint!(
                            "\r\x1b[K  {} {node} ({:.1}s)",
                            FRAMES[frame % FRAMES.len()],
                            since.elapsed().as_secs_f64()
                        );
                        let _ = std::io::stderr().flush();
                        frame += 1;
                    }
                }
            });
        }
        progress
    }

    fn line(&self, text: &str) {
        let mut running = self.running.lock();
        if running.mid_text {
            eprintln!();
            running.mid_text = false;
        } else if self.interactive {
            eprint!("\r\x1b[K");
        }
        running.node = None;
        eprintln!("{text}");
    }

    fn stream(&self, text: &str) {
        let mut running = self.running.lock();
        if !running.mid_text && self.interactive {
            eprint!("\r\x1b[K");
        }
        running.node = None;
        running.mid_text = true;
        eprint!("{text}");
        let _ = std::io::stderr().flush();
    }
}

/// A duration in milliseconds as seconds with one decimal.
fn seconds(ms: u64) -> String {
    format!("{:.1}s", Duration::from_millis(ms).as_secs_f64())
}

/// The first line of a message.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

impl EventSink for Progress {
    #[allow(
        clippy::too_many_lines,
        reason = "one arm per event shown: splitting it would scatter the display's one table"
    )]
    fn emit(&self, event: &Event) {
        // Stages of a sub-workflow (run id `<run>/<node>`) show under their parent node: `first › greet`.
        let node_id = event.node_id.as_deref().unwrap_or("");
        let node = match event.run_id.split_once('/') {
            Some((_, path)) => format!("{} › {node_id}", path.replace('/', " › ")),
            None => node_id.to_owned(),
        };
        match &event.kind {
            EventKind::StageStarted { .. } if self.interactive => {
                let mut running = self.running.lock();
                running.node = Some(node);
                running.since = Some(Instant::now());
            }
            EventKind::StageCompleted(end) => {
                let succeeded = end.status == StageStatus::Succeeded;
                let mark = if succeeded { "✓" } else { "•" };
                let mut suffix = if succeeded {
                    String::new()
                } else {
                    format!(" [{}]", end.status)
                };
                if let Some(model) = &end.model {
                    let usage = end.usage.unwrap_or_default();
                    let _ = write!(
                        suffix,
                        " · {model}, {} tokens in / {} out",
                        usage.input_tokens, usage.output_tokens
                    );
                    if let Some(cost) = end.cost_usd {
                        let _ = write!(suffix, ", ${cost:.4}");
                    }
                }
                self.line(&format!(
                    "  {mark} {node} ({}){suffix}",
                    seconds(end.duration_ms)
                ));
            }
            EventKind::StageFailed(end) => {
                self.running.lock().failed = Some(node.clone());
                let reason = end.failure_reason.as_deref().unwrap_or("failed");
                self.line(&format!(
                    "  ✗ {node} ({}): {}",
                    seconds(end.duration_ms),
                    first_line(reason)
                ));
            }
            EventKind::EdgeSelected(choice) => {
                let failed = self.running.lock().failed.take();
                if failed.as_deref() == Some(node.as_str())
                    && choice.condition.is_none()
                    && choice.when.is_none()
                    && choice.reason.is_none()
                {
                    self.line(&format!(
                        "  ! {node} failed, and its unconditional edge leads on to {}; give the edge a condition (outcome=success) to stop here",
                        choice.to
                    ));
                }
            }
            EventKind::StageRetrying {
                reason, delay_ms, ..
            } => {
                self.line(&format!(
                    "  ↻ {node}: {} — retrying in {}",
                    first_line(reason.as_deref().unwrap_or_default()),
                    seconds(*delay_ms)
                ));
            }
            EventKind::HumanGateAsked { .. } => {
                // The question owns the terminal until the answer: no spinner over it.
                self.running.lock().node = None;
                if self.interactive {
                    eprint!("\r\x1b[K");
                }
            }
            EventKind::ModelWarning { message } | EventKind::AgentError { message } => {
                self.line(&format!("  ! {node}: {message}"));
            }
            EventKind::ModelCallRetrying {
                error, delay_ms, ..
            } => {
                self.line(&format!(
                    "  ↻ {node}: {error} — retrying the model call in {}",
                    seconds(*delay_ms)
                ));
            }
            EventKind::AgentToolCallCompleted(end) => {
                let target = first_line(&end.target);
                let mut shown: String = target.chars().take(TARGET_CHARS).collect();
                if shown.len() < target.len() {
                    shown.push('…');
                }
                let result = match (&end.note, end.is_error) {
                    (Some(word), _) => format!(" … {word}"),
                    (None, true) => " … error".to_owned(),
                    (None, false) => String::new(),
                };
                self.line(&format!("    {node}: {} {shown}{result}", end.tool));
            }
            EventKind::AgentLoopDetected { period, .. } => {
                self.line(&format!(
                    "  ! {node}: the agent repeats itself (a loop of {period} call(s)); it was told so"
                ));
            }
            EventKind::AgentCompactionCompleted {
                original_turn_count,
                ..
            } => {
                self.line(&format!(
                    "  ! {node}: the conversation neared the context window; {original_turn_count} turns were summarised"
                ));
            }
            EventKind::ModelTextDelta { text } if self.verbose => self.stream(text),
            EventKind::GoalGateUnmet {
                retry_target: Some(target),
                ..
            } => {
                self.line(&format!(
                    "  ! goal gate {node} is not met; retrying from {target}"
                ));
            }
            EventKind::GoalGateUnmet {
                retry_target: None, ..
            } => {
                self.line(&format!(
                    "  ! goal gate {node} is not met and has no retry target left; the run fails"
                ));
            }
            _ => {}
        }
    }
}
