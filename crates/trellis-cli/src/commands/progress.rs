//! Live progress for `trellis run` and `trellis resume`: every event goes to the run record, and stage
//! events also become one line each on standard error (status and duration), with a spinner for the
//! running stage when standard error is a terminal.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trellis_handlers::model_call::events;

use serde_json::Value;
use trellis_engine::Event;
use trellis_engine::event::names;
use trellis_engine::services::EventSink;
use trellis_store::RunDir;

/// The stage currently running, for the spinner.
#[derive(Default)]
struct Running {
    node: Option<String>,
    since: Option<Instant>,
}

pub struct Progress {
    record: Arc<RunDir>,
    interactive: bool,
    running: Arc<Mutex<Running>>,
}

fn seconds(payload: &serde_json::Map<String, Value>) -> String {
    let ms = payload
        .get("duration_ms")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    format!("{:.1}s", Duration::from_millis(ms).as_secs_f64())
}

impl Progress {
    pub fn new(record: Arc<RunDir>) -> Arc<Self> {
        let progress = Arc::new(Self {
            record,
            interactive: std::io::stderr().is_terminal(),
            running: Arc::default(),
        });
        if progress.interactive {
            let running = progress.running.clone();
            tokio::spawn(async move {
                const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
                let mut frame = 0;
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let guard = running
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
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
        let mut running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.interactive {
            eprint!("\r\x1b[K");
        }
        running.node = None;
        eprintln!("{text}");
    }
}

impl EventSink for Progress {
    fn emit(&self, event: &Event) {
        self.record.emit(event);
        // Stages of a sub-workflow (run id `<run>/<node>`) show under their parent node: `first › greet`.
        let node_id = event.node_id.as_deref().unwrap_or("");
        let node = match event.run_id.split_once('/') {
            Some((_, path)) => format!("{} › {node_id}", path.replace('/', " › ")),
            None => node_id.to_owned(),
        };
        let node = node.as_str();
        let p = &event.payload;
        match event.event.as_str() {
            names::STAGE_STARTED if self.interactive => {
                let mut running = self
                    .running
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                running.node = Some(node.to_owned());
                running.since = Some(Instant::now());
            }
            names::STAGE_COMPLETED => {
                let status = p.get("status").and_then(Value::as_str).unwrap_or("");
                let mark = if status == "succeeded" { "✓" } else { "•" };
                let mut suffix = if status == "succeeded" {
                    String::new()
                } else {
                    format!(" [{status}]")
                };
                if let Some(model) = p.get("model").and_then(Value::as_str) {
                    let tokens = |k: &str| {
                        p.get("usage")
                            .and_then(|u| u.get(k))
                            .and_then(Value::as_u64)
                            .unwrap_or(0)
                    };
                    let _ = write!(
                        suffix,
                        " · {model}, {} tokens in / {} out",
                        tokens("input_tokens"),
                        tokens("output_tokens")
                    );
                }
                self.line(&format!("  {mark} {node} ({}){suffix}", seconds(p)));
            }
            names::STAGE_FAILED => {
                let reason = p
                    .get("failure_reason")
                    .and_then(Value::as_str)
                    .unwrap_or("failed");
                let first = reason.lines().next().unwrap_or_default();
                self.line(&format!("  ✗ {node} ({}): {first}", seconds(p)));
            }
            names::STAGE_RETRYING => {
                let reason = p.get("reason").and_then(Value::as_str).unwrap_or("");
                let delay = p.get("delay_ms").and_then(Value::as_u64).unwrap_or(0);
                self.line(&format!(
                    "  ↻ {node}: {} — retrying in {:.1}s",
                    reason.lines().next().unwrap_or_default(),
                    Duration::from_millis(delay).as_secs_f64()
                ));
            }
            names::HUMAN_GATE_ASKED => {
                // The question owns the terminal until the answer: no spinner over it.
                self.running
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .node = None;
                if self.interactive {
                    eprint!("\r\x1b[K");
                }
            }
            events::WARNING => {
                let message = p.get("message").and_then(Value::as_str).unwrap_or("");
                self.line(&format!("  ! {node}: {message}"));
            }
            events::CALL_RETRYING => {
                let error = p.get("error").and_then(Value::as_str).unwrap_or("");
                let delay = p.get("delay_ms").and_then(Value::as_u64).unwrap_or(0);
                self.line(&format!(
                    "  ↻ {node}: {error} — retrying the model call in {:.1}s",
                    Duration::from_millis(delay).as_secs_f64()
                ));
            }
            names::GOAL_GATE_UNMET => {
                self.line(&format!(
                    "  ! goal gate {node} is not met; retrying from its retry target"
                ));
            }
            _ => {}
        }
    }
}
