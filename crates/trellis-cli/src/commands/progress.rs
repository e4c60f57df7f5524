//! Live progress for `trellis run` and `trellis resume`, one subscriber of the run's events (the event
//! log is another): stage events become one line each on standard error (status and duration). On a
//! terminal (or with `TRELLIS_PROGRESS=live`) a live block under them shows each running stage with a
//! spinner and the latest line it wrote (read from its output files, never from events), erased
//! when the stage ends, as cargo does. An agent's tool calls show one line each under their stage as
//! they finish (`shell cargo test … exit 101`); with `--verbose` the models' answers and every line
//! of the commands' output stream as they are written.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use trellis_engine::event::{Event, EventKind};
use trellis_engine::services::EventSink;
use trellis_store::{Chunk, Position, StageOutput, Stream, last_line};
use trellis_workflow::StageStatus;

/// A stage running now, as the display shows it.
struct Live {
    /// Its node as lines name it (`first › greet` in a sub-workflow).
    node: String,
    since: Instant,
    /// Its output files (the run's own stages; a sub-workflow's stages show without).
    output: Option<StageOutput>,
    /// The latest line it wrote.
    latest: Option<String>,
}

/// What the display is drawing.
#[derive(Default)]
struct Running {
    stages: Vec<Live>,
    /// Lines of the live block on the terminal now (erased before anything else is written).
    drawn: usize,
    /// A gate's question owns the terminal: no live block over it.
    asking: bool,
    /// Streamed model text is on the current line.
    mid_text: bool,
    /// The node whose stage just failed, until its edge is chosen.
    failed: Option<String>,
}

pub struct Progress {
    interactive: bool,
    /// Stream the models' text and the commands' output (`--verbose`).
    verbose: bool,
    /// Where the run's records are: `<runs dir>/<run id>/stages/<dir>`.
    runs_dir: PathBuf,
    running: Arc<Mutex<Running>>,
}

/// How much of a tool call's path or command its line shows.
const TARGET_CHARS: usize = 80;
/// How much of a stage's latest line the live block shows.
const LATEST_CHARS: usize = 100;
/// How often the live block is drawn and the output files read.
const TICK: Duration = Duration::from_millis(100);
/// How far back the latest line is looked for in a file that grew.
const TAIL_BYTES: u64 = 4096;
/// At most this much of a file is streamed per tick with `--verbose`.
const VERBOSE_CHUNK: u64 = 256 << 10;

impl Progress {
    /// The display; on a terminal (or with `verbose`) a thread of its own draws the running stages
    /// with their latest output line and streams output, so the terminal never slows the run.
    pub fn new(verbose: bool, runs_dir: PathBuf) -> Arc<Self> {
        let progress = Arc::new(Self {
            interactive: std::io::stderr().is_terminal()
                || std::env::var_os("TRELLIS_PROGRESS").is_some_and(|v| v == "live"),
            verbose,
            runs_dir,
            running: Arc::default(),
        });
        if progress.interactive || progress.verbose {
            let display = Arc::downgrade(&progress);
            let _ = std::thread::Builder::new()
                .name("trellis-progress".into())
                .spawn(move || {
                    let mut frame = 0;
                    while let Some(progress) = display.upgrade() {
                        progress.tick(frame);
                        drop(progress);
                        frame += 1;
                        std::thread::sleep(TICK);
                    }
                });
        }
        progress
    }

    /// Reads what the running stages wrote, streams it (`--verbose`) and draws the live block.
    fn tick(&self, frame: usize) {
        const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
        let mut running = self.running.lock();
        let mut streamed = Vec::new();
        for stage in &mut running.stages {
            let Some(output) = stage.output.as_mut() else {
                continue;
            };
            if !self.verbose {
                output.skip_to_last(TAIL_BYTES);
            }
            let limit = if self.verbose {
                VERBOSE_CHUNK
            } else {
                TAIL_BYTES
            };
            let chunks = output.read(limit, false).unwrap_or_default();
            if let Some(latest) = latest_of(&chunks) {
                stage.latest = Some(latest);
            }
            if self.verbose {
                streamed.push((stage.node.clone(), chunks));
            }
        }
        self.erase(&mut running);
        for (node, chunks) in streamed {
            print_streamed(&node, &chunks);
        }
        if !self.interactive || running.asking || running.mid_text {
            return;
        }
        let mut block = String::new();
        for stage in &running.stages {
            let _ = writeln!(
                block,
                "  {} {} ({:.1}s)",
                FRAMES[frame % FRAMES.len()],
                stage.node,
                stage.since.elapsed().as_secs_f64()
            );
            if let Some(latest) = &stage.latest
                && !self.verbose
            {
                let latest = super::printable(latest);
                let _ = writeln!(block, "    │ {}", shorten(&latest, LATEST_CHARS));
            }
        }
        running.drawn = block.lines().count();
        trellis_process::shown_on_stderr(&block);
    }

    /// Erases the live block, leaving the cursor where it began.
    fn erase(&self, running: &mut Running) {
        if self.interactive && running.drawn > 0 {
            trellis_process::shown_on_stderr(&"\x1b[1A\x1b[2K".repeat(running.drawn));
            running.drawn = 0;
        }
    }

    fn line(&self, text: &str) {
        let mut running = self.running.lock();
        if running.mid_text {
            trellis_process::note!();
            running.mid_text = false;
        }
        self.erase(&mut running);
        // Reasons, messages and tool targets are what stages and models wrote.
        trellis_process::note!("{}", super::printable(text));
    }

    fn stream(&self, text: &str) {
        let mut running = self.running.lock();
        self.erase(&mut running);
        running.mid_text = true;
        trellis_process::shown_on_stderr(text);
    }

    /// A stage began: it shows in the live block, with its output once it writes some.
    fn started(&self, event: &Event, node: String, dir: &str) {
        // A sub-workflow's stages (run id `<run>/<node>`) keep their files in the parent stage's
        // record: shown without their output.
        let output = (!event.run_id.contains('/')).then(|| {
            let dir = self.runs_dir.join(&event.run_id).join("stages").join(dir);
            StageOutput::new(dir, Position::default())
        });
        let mut running = self.running.lock();
        running.asking = false;
        running.stages.push(Live {
            node,
            since: Instant::now(),
            output,
            latest: None,
        });
    }

    /// A stage ended: with `--verbose`, the rest of its output is streamed first.
    fn ended(&self, node: &str) {
        let mut running = self.running.lock();
        let Some(at) = running.stages.iter().position(|s| s.node == node) else {
            return;
        };
        let stage = running.stages.remove(at);
        if self.verbose
            && let Some(mut output) = stage.output
        {
            self.erase(&mut running);
            while let Ok(chunks) = output.read(VERBOSE_CHUNK, true) {
                if chunks.is_empty() {
                    break;
                }
                print_streamed(node, &chunks);
            }
        }
    }
}

/// The latest line in what a stage wrote: its output's, or its transcript's last entry.
fn latest_of(chunks: &[Chunk]) -> Option<String> {
    chunks.iter().rev().find_map(|chunk| match chunk.stream {
        Stream::Stdout | Stream::Stderr => last_line(&chunk.text).map(str::to_owned),
        Stream::Transcript => chunk.text.lines().rev().find_map(|line| {
            let entry = serde_json::from_str(line).ok()?;
            super::logs::transcript_line(&entry)
        }),
    })
}

/// A stage's output, streamed with `--verbose`: each line under its node.
fn print_streamed(node: &str, chunks: &[Chunk]) {
    let mut err = std::io::stderr().lock();
    for chunk in chunks {
        if chunk.stream == Stream::Transcript {
            // An agent's turns show through its events (tool calls, streamed text).
            continue;
        }
        for line in chunk.text.lines() {
            let _ = writeln!(err, "    {node} │ {line}");
        }
    }
    let _ = err.flush();
}

/// `text` cut to `chars` characters, with an ellipsis when cut.
fn shorten(text: &str, chars: usize) -> String {
    let mut shown: String = text.chars().take(chars).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
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
            EventKind::StageStarted { dir, .. } => self.started(event, node, dir),
            EventKind::StageCompleted(end) => {
                self.ended(&node);
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
                self.ended(&node);
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
                // The question owns the terminal until the answer: no live block over it.
                let mut running = self.running.lock();
                running.asking = true;
                self.erase(&mut running);
            }
            EventKind::HumanGateAnswered {
                label,
                default_after_timeout,
                ..
            } => {
                self.running.lock().asking = false;
                if *default_after_timeout {
                    self.line(&format!(
                        "  · {node}: nobody answered in time; took its default, {label}"
                    ));
                }
            }
            EventKind::HookCompleted {
                hook,
                hook_event,
                decision,
                reason,
                error,
                ..
            } => {
                // A hook that let the run go on as if it were not there is not shown; one that
                // decided something, or could not decide, is.
                let at = if node.is_empty() {
                    hook_event.clone()
                } else {
                    format!("{hook_event} {node}")
                };
                let reason = reason.as_deref().map(|r| format!(": {}", first_line(r)));
                if decision != trellis_engine::hooks::HookDecision::Proceed.as_str() {
                    self.line(&format!(
                        "  · hook {hook} at {at}: {decision}{}",
                        reason.unwrap_or_default()
                    ));
                } else if let Some(error) = error {
                    self.line(&format!(
                        "  ! hook {hook} at {at} could not decide, so the run goes on: {}",
                        first_line(error)
                    ));
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
                let shown = shorten(first_line(&end.target), TARGET_CHARS);
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
