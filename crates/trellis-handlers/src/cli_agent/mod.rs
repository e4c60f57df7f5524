//! Agent nodes with `backend="cli"`: the node is handed to a coding-agent CLI — Claude Code (`claude`),
//! Codex CLI (`codex`) or Gemini CLI (`gemini`), chosen by the node's provider
//! ([`AgentCli::for_node`]) — in its non-interactive, machine-readable mode, in the run's working
//! directory. The prompt is assembled as for the built-in agent (preamble by fidelity, the node's
//! prompt, schema instructions) with the project memory before it. The CLI's output is read as it
//! streams: its tool calls become `Agent.ToolCallStarted`/`Completed` events (and the transcript), its
//! final answer the response, which is routed and checked against `output_schema` exactly as for the
//! built-in agent (`crate::agent::converse`); a repair turn resumes the same CLI session. Usage and
//! cost, where reported, go to `status.json`, and `files_touched` comes from git (see `touched.rs`).
//!
//! Each CLI's command line and output format is in its own module; `process.rs` runs one invocation.

mod claude;
mod codex;
mod gemini;
mod process;
mod stream;
pub(crate) mod touched;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use trellis_agent::{AgentEvent, Observer};
use trellis_engine::CancellationToken;
use trellis_engine::event::{EventKind, ModelCallEnd};
use trellis_engine::{FailureClass, ModelDetails, Outcome, Stage, text};
use trellis_llm::Usage;
use trellis_process::group::STAGE_DIR_VAR;
use trellis_process::task::blocking;
use trellis_workflow::node_kind::{AgentCli, LlmConfig, ReasoningEffort};

use crate::agent::{Answer, Conversation, StageObserver, converse};
use crate::artifacts;
use crate::model_call::token_usage;
use crate::prompt::{Opening, Threads, project_memory, write_stage_file};
use process::{Ran, Spawn};
use stream::Stream;
use touched::Snapshot;
use trellis_workflow::requires::ToolCall;

/// How much of standard error a failure quotes.
const STDERR_TAIL_CHARS: usize = 2000;

/// What one invocation is asked.
pub(super) struct Ask<'a> {
    pub prompt: &'a str,
    pub model: Option<&'a str>,
    /// The node's reasoning effort, when the workflow sets one (the CLI's own default otherwise).
    pub effort: Option<ReasoningEffort>,
    pub max_turns: Option<u32>,
    /// The session to continue (a repair turn).
    pub resume: Option<&'a str>,
}

/// The arguments and standard input of one invocation.
pub(super) struct CommandLine {
    pub args: Vec<String>,
    pub stdin: Option<String>,
}

/// One CLI's command line, output reader and setup help.
struct Format {
    command: fn(&Ask<'_>) -> CommandLine,
    read: fn(&mut Stream, &Value),
    /// The name of its output format, for messages.
    output: &'static str,
    install: &'static str,
    login: &'static str,
}

fn format(cli: AgentCli) -> Format {
    match cli {
        AgentCli::Claude => Format {
            command: claude::command,
            read: claude::read,
            output: "stream-json",
            install: "npm install -g @anthropic-ai/claude-code",
            login: "run `claude` once and log in (/login), or set ANTHROPIC_API_KEY",
        },
        AgentCli::Codex => Format {
            command: codex::command,
            read: codex::read,
            output: "exec --json",
            install: "npm install -g @openai/codex",
            login: "run `codex login`, or set OPENAI_API_KEY",
        },
        AgentCli::Gemini => Format {
            command: gemini::command,
            read: gemini::read,
            output: "stream-json",
            install: "npm install -g @google/gemini-cli",
            login: "run `gemini` once and choose how to sign in, or set GEMINI_API_KEY",
        },
    }
}

/// Runs a `backend="cli"` agent stage.
pub(crate) async fn run(
    stage: &Stage<'_>,
    llm: &LlmConfig,
    judge: Option<&trellis_llm::Client>,
) -> Outcome {
    let cli = match AgentCli::for_node(llm) {
        Ok(cli) => cli,
        Err(problem) => {
            return Outcome::failed(
                FailureClass::Configuration,
                format!("agent node `{}`: {problem}", stage.node.id),
            );
        }
    };
    let (opening, prompt) = session_prompt(stage, llm).await;
    let root = stage.settings.work_dir.clone();
    let exclude = artifacts::runs_dir(stage.dir);
    let before = snapshot(&root, &exclude, stage.cancel).await;
    let (observer, writer) = StageObserver::new(stage);
    let mut conversation = CliConversation {
        stage,
        llm,
        cli,
        observer: &observer,
        root: root.clone(),
        session_id: None,
        sent: 0,
        model: None,
        usage: Usage::default(),
        cost_usd: None,
        turns: 0,
        last_written: None,
    };
    let judges = crate::checks::Judges::new(judge);
    let mut outcome = converse(stage, llm, &judges, &mut conversation, prompt).await;
    let CliConversation {
        session_id,
        model,
        mut usage,
        cost_usd,
        turns,
        ..
    } = conversation;
    outcome.details.tool_calls = Some(observer.tool_calls());
    drop(observer);
    let _ = writer.await;
    let after = snapshot(&root, &exclude, stage.cancel).await;
    if before.truncated || after.truncated {
        stage.emitter.emit(
            Some(&stage.node.id),
            EventKind::ModelWarning {
                message: format!(
                    "the working directory has more than {} files outside git: files_touched covers the first of them",
                    touched::MAX_FILES
                ),
            },
        );
    }
    outcome.files_touched = blocking(move || before.touched(&after, &root, &exclude)).await;
    // The node's judges (`eval`) count as the stage's.
    usage.add(judges.usage());
    outcome.details.model = Some(ModelDetails {
        model: model_name(model, llm, cli),
        provider: cli.provider().to_owned(),
        usage: token_usage(usage),
        turns,
        cost_usd,
    });
    outcome.details.cli = Some(cli.as_str().to_owned());
    outcome.details.session_id = session_id;
    outcome.details.fidelity = Some(opening.fidelity.as_str().to_owned());
    outcome
}

/// The prompt of an agent that runs a session of its own (a CLI's, an ACP agent's), written to
/// `prompt.md`: the project memory, then the prompt as the built-in agent's opens. Each stage is a new
/// session, so a `full`-fidelity node gets the preamble instead of a thread.
pub(crate) async fn session_prompt(stage: &Stage<'_>, llm: &LlmConfig) -> (Opening, String) {
    let mut opening = Opening::new(stage, llm, &Threads::default()).await;
    let mut prompt = std::mem::take(&mut opening.prompt);
    if llm.project_memory
        && let Some(memory) = project_memory(stage).await
    {
        prompt = format!("{memory}\n\n{prompt}");
    }
    write_stage_file(stage, "prompt.md", &prompt).await;
    (opening, prompt)
}

/// The model as the CLI reported it, else as the node named it, else the CLI's default.
fn model_name(reported: Option<String>, llm: &LlmConfig, cli: AgentCli) -> String {
    reported
        .or_else(|| llm.model.clone())
        .unwrap_or_else(|| format!("{cli} default"))
}

pub(crate) async fn snapshot(root: &Path, exclude: &Path, stop: &CancellationToken) -> Snapshot {
    let (root, exclude, stop) = (root.to_owned(), exclude.to_owned(), stop.clone());
    blocking(move || Snapshot::take(&root, &exclude, &stop)).await
}

/// A stage's conversation with its CLI: one invocation per message, the later ones resuming the
/// session the first started.
struct CliConversation<'s, 'o> {
    stage: &'s Stage<'s>,
    llm: &'s LlmConfig,
    cli: AgentCli,
    observer: &'o StageObserver<'s>,
    root: PathBuf,
    session_id: Option<String>,
    sent: u32,
    model: Option<String>,
    usage: Usage,
    cost_usd: Option<f64>,
    turns: u32,
    last_written: Option<String>,
}

#[async_trait]
impl Conversation for CliConversation<'_, '_> {
    fn calls(&self) -> Vec<ToolCall> {
        self.observer.calls()
    }

    async fn send(&mut self, message: String) -> Result<Answer, Box<Outcome>> {
        let cli = self.cli;
        if self.sent > 0 && self.session_id.is_none() {
            return Err(Box::new(Outcome::failed(
                FailureClass::StageFailed,
                format!(
                    "{cli} reported no session id, so its answer cannot be repaired in the same session"
                ),
            )));
        }
        self.sent += 1;
        self.observer
            .note(json!({ "type": "user", "text": message }));
        let format = format(cli);
        let line = (format.command)(&Ask {
            prompt: &message,
            model: self.llm.model.as_deref(),
            effort: self.llm.reasoning_effort,
            max_turns: self.llm.max_turns,
            resume: self.session_id.as_deref(),
        });
        self.observer.note(
            json!({ "type": "command", "program": cli.as_str(), "args": command_shown(&line) }),
        );
        let stage = self.stage;
        let node = Some(stage.node.id.as_str());
        let model = model_name(self.model.clone(), self.llm, cli);
        stage.emitter.emit(
            node,
            EventKind::ModelCallStarted {
                model: model.clone(),
                provider: cli.provider().to_owned(),
                turn: self.sent,
            },
        );
        let started = Instant::now();
        let spawn = Spawn {
            program: cli.as_str(),
            work_dir: &self.root,
            stage_dir: stage.dir,
            env: vec![
                (
                    trellis_process::group::RUN_ID_VAR.into(),
                    stage.run_id.to_owned(),
                ),
                ("TRELLIS_NODE_ID".into(), stage.node.id.clone()),
                (STAGE_DIR_VAR.into(), stage.dir.display().to_string()),
            ],
        };
        let observer = self.observer;
        let mut observe = |event: AgentEvent| {
            if let AgentEvent::Text { text, .. } = &event {
                let text = trellis_process::secrets::redact(text).into_owned();
                stage.emitter.emit(node, EventKind::ModelTextDelta { text });
            }
            observer.on_event(event);
        };
        let ran = process::run(&spawn, line, format.read, &mut observe).await;
        let ran = match ran {
            Ok(ran) => ran,
            Err(error) => {
                let outcome = not_started(cli, &format, &error);
                self.call_ended(model, started, None, outcome.failure_reason());
                return Err(Box::new(outcome));
            }
        };
        self.gather(&ran.stream);
        let verdict = judge(cli, &format, ran);
        let usage = token_usage(self.usage);
        match verdict {
            Ok(answer) => {
                self.call_ended(model, started, Some(usage), None);
                Ok(Answer {
                    text: answer,
                    stop_reason: None,
                })
            }
            Err(outcome) => {
                self.call_ended(model, started, Some(usage), outcome.failure_reason());
                Err(outcome)
            }
        }
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn last_touched(&self) -> Option<String> {
        let written = self.last_written.as_deref()?;
        let path = Path::new(written);
        let relative = if path.is_absolute() {
            path.strip_prefix(&self.root).ok()?
        } else {
            path
        };
        Some(relative.to_string_lossy().into_owned())
    }
}

impl CliConversation<'_, '_> {
    /// Adds an invocation's session, model, usage, cost and turns to the stage's.
    fn gather(&mut self, stream: &Stream) {
        if stream.session_id.is_some() {
            self.session_id.clone_from(&stream.session_id);
        }
        if stream.model.is_some() {
            self.model.clone_from(&stream.model);
        }
        if stream.last_written.is_some() {
            self.last_written.clone_from(&stream.last_written);
        }
        self.usage.add(stream.usage);
        if let Some(cost) = stream.cost_usd {
            self.cost_usd = Some(self.cost_usd.unwrap_or(0.0) + cost);
        }
        self.turns += stream.turns.max(1);
    }

    fn call_ended(
        &self,
        model: String,
        started: Instant,
        usage: Option<trellis_engine::TokenUsage>,
        error: Option<&str>,
    ) {
        self.stage.emitter.emit(
            Some(&self.stage.node.id),
            EventKind::ModelCallCompleted(ModelCallEnd {
                model,
                provider: self.cli.provider().to_owned(),
                turn: self.sent,
                duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                usage,
                stop_reason: None,
                error: error.map(str::to_owned),
                kind: error.map(|_| "cli".to_owned()),
            }),
        );
    }
}

/// The command line as the transcript shows it: the prompt itself is in `prompt.md`.
fn command_shown(line: &CommandLine) -> Vec<String> {
    line.args
        .iter()
        .map(|a| {
            if a.len() > 200 {
                format!("{}…", a.chars().take(60).collect::<String>())
            } else {
                a.clone()
            }
        })
        .collect()
}

/// The failure of a CLI that could not be started.
fn not_started(cli: AgentCli, format: &Format, error: &std::io::Error) -> Outcome {
    if error.kind() == std::io::ErrorKind::NotFound {
        return Outcome::failed(
            FailureClass::Configuration,
            format!(
                "`{cli}` ({}) is not installed or not on PATH: install it (`{}`) and log in, or remove backend=\"cli\" to use the built-in agent",
                cli.product(),
                format.install
            ),
        );
    }
    Outcome::failed(
        FailureClass::CouldNotStart,
        format!("cannot start `{cli}` ({}): {error}", cli.product()),
    )
}

/// Whether a CLI's message says it has no usable login.
fn is_login_problem(text: &str) -> bool {
    const SIGNS: &[&str] = &[
        "/login",
        "log in",
        "logged in",
        "login",
        "invalid api key",
        "api key",
        "unauthorized",
        "401",
        "authenticat",
        "auth method",
    ];
    let lower = text.to_ascii_lowercase();
    SIGNS.iter().any(|sign| lower.contains(sign))
}

/// How the process ended, for messages.
fn exit_words(status: std::process::ExitStatus) -> String {
    status.code().map_or_else(
        || "was killed by a signal".to_owned(),
        |code| format!("exited with code {code}"),
    )
}

/// The answer of a finished invocation, or the stage's failure: not logged in, a failed session, a
/// non-zero exit, output in the wrong format, or a stream cut off before the CLI's result.
fn judge(cli: AgentCli, format: &Format, ran: Ran) -> Result<String, Box<Outcome>> {
    let Ran {
        stream,
        status,
        stderr,
        garbage,
        lines,
    } = ran;
    if status.success()
        && let Some(answer) = stream.answer
    {
        return Ok(answer);
    }
    let quoted = if garbage.is_empty() {
        String::new()
    } else {
        format!(
            "; its output began:\n{}",
            garbage
                .iter()
                .map(|l| format!("  > {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    };
    let said = stream
        .failure
        .clone()
        .or_else(|| (!stderr.is_empty()).then(|| text::tail(&stderr, STDERR_TAIL_CHARS).to_owned()))
        .or_else(|| stream.last_warning.clone());
    if let Some(said) = &said
        && is_login_problem(said)
    {
        return Err(Box::new(Outcome::failed(
            FailureClass::Configuration,
            format!(
                "`{cli}` ({}) is not logged in: {said}; {}",
                cli.product(),
                format.login
            ),
        )));
    }
    let reason = if let Some(why) = &stream.failure {
        format!("`{cli}` failed: {why}")
    } else if !status.success() {
        match &said {
            Some(said) => format!("`{cli}` {}: {said}", exit_words(status)),
            None => format!("`{cli}` {} without a message", exit_words(status)),
        }
    } else if lines == 0 && !garbage.is_empty() {
        format!(
            "`{cli}` printed output that is not its {} format",
            format.output
        )
    } else {
        format!(
            "the output of `{cli}` ended before its result ({lines} JSON line(s) read): the stream was cut off"
        )
    };
    Err(Box::new(Outcome::failed(
        FailureClass::StageFailed,
        format!("{reason}{quoted}"),
    )))
}

/// A coding-agent CLI found on `PATH`, for `trellis models`.
pub struct FoundCli {
    pub cli: AgentCli,
    pub path: Option<PathBuf>,
    /// The first line `--version` printed.
    pub version: Option<String>,
}

/// Which of the CLIs are installed, with their versions (each asked for at most a few seconds).
pub fn find_clis() -> Vec<FoundCli> {
    [AgentCli::Claude, AgentCli::Codex, AgentCli::Gemini]
        .into_iter()
        .map(|cli| {
            let path = crate::command::on_path(cli.as_str());
            let version = path.as_deref().and_then(version_of);
            FoundCli { cli, path, version }
        })
        .collect()
}

fn version_of(program: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut child = std::process::Command::new(program)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    out.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
}
