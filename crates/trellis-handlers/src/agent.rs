//! Agent nodes (`shape=box`, the default): a multi-turn, tool-using session from `trellis-agent` on the
//! node's model (with `backend="cli"`, a coding-agent CLI instead: see [`crate::cli_agent`], which
//! shares this module's routing and repair loop, `converse`). The prompt is assembled as for prompt
//! nodes (preamble by fidelity, the node's prompt, schema instructions; project memory as the system
//! prompt) and `full`-fidelity nodes with the same thread continue one live conversation. The
//! session's events become run events (`Agent.ToolCallStarted`, ...), and the stage writes
//! `prompt.md`, `response.md`, `transcript.jsonl` and (through the engine) `status.json` with the
//! files it touched.
//!
//! Routing follows the outputs document: the directive comes from the final response, else
//! `status.json` in the working directory (written during the stage), else the last file the agent
//! touched. With `output_schema="routing"` a source is passed over only when it holds no routing
//! object at all; a malformed one gets a repair turn in the same live session. A custom schema reads
//! the response only.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use serde_json::{Value, json};
use trellis_agent::subagents::{self, Ending, Spawned, SubAgents};
use trellis_agent::{AgentEvent, ExternalTools, Observer, Session, Stop, Toolbox, WorkDir};
use trellis_engine::event::{EventKind, ToolCallEnd};
use trellis_engine::{Attempt, Emitter, FailureClass, Handler, Outcome, Stage};
use trellis_llm::{Client, Request, ToolChoice};
use trellis_process::group::STAGE_DIR_VAR;
use trellis_process::sandbox::Sandbox;
use trellis_process::secrets;
use trellis_workflow::node_kind::{Backend, LlmConfig, OutputSchema};
use trellis_workflow::requires::ToolCall;

use crate::checks;
use crate::cli_agent;
use crate::model_call::ModelCall;
use crate::output_schema::{self, SchemaError, Structured};
use crate::permissions;
use crate::prompt::{
    Opening, Thread, Threads, auto_status, effort, no_model, project_memory, response_updates,
    simulated_outcome, write_stage_file,
};
use crate::routing_directive;
use crate::skills;
use crate::steering;

/// What every agent is told before the project memory, ending with how to finish.
const AGENT_SYSTEM: &str = "You are a coding agent working in a project's directory. Do the task yourself \
with the tools; do not tell the user what to do. Paths are relative to the working directory, and nothing \
outside it can be changed (files the prompt points to in the run's record can be read). Read a file before \
you change it, and change only what the task needs. After a change, run the check that shows it works (the \
tests, or the program itself).";

/// How an agent that may answer without a tool finishes.
const ANSWER_TO_FINISH: &str =
    "When the task is done, answer with a short summary of what you did, without calling a tool.";

/// How the local model calls tools and finishes: its every answer is held to one call (a grammar on
/// the answer), written as one JSON object — shown with an example, a first look at what the task
/// names ([`first_look`]), since a small model copies an example's path as it is.
fn local_calls_hint(overview: &str, task: &str) -> String {
    // Laid out as the model lays out JSON itself: shown a call on one line just before the task,
    // it answered on one line too, and solved fewer tasks (5 of 9, against 9 – 11 of 12).
    let example = serde_json::to_string_pretty(&first_look(overview, task)).unwrap_or_default();
    format!(
        "Answer every time with one JSON object and nothing else: a short thought (what you do \
         next, and why), then the name and arguments of one tool to call. For example:\n{example}\n\
         The tool's result comes back in the next message. To change a file, write_file its whole \
         new content or edit_file one exact part of it; put what you write at the paths the task \
         names. When the task is done and checked, call {finish} with a one-sentence summary.",
        finish = trellis_agent::FINISH,
    )
}

/// The example call [`local_calls_hint`] shows: reading the first file of the working directory's
/// `overview` that the task names, or listing the first folder of it that it names; else reading
/// the overview's first file (an example listing the directory solved fewer tasks), else listing
/// the directory.
fn first_look(overview: &str, task: &str) -> serde_json::Value {
    let named = task.split_whitespace().find_map(|word| {
        let word = trellis_agent::bare_path(word).trim_end_matches('/');
        overview
            .lines()
            .find_map(|line| match line.strip_suffix('/') {
                Some(folder) if folder == word => Some((folder, false)),
                None if line == word => Some((line, true)),
                _ => None,
            })
    });
    let named = named.or_else(|| {
        overview
            .lines()
            .find(|line| !line.ends_with('/') && !line.starts_with("[…"))
            .map(|file| (file, true))
    });
    match named {
        Some((file, true)) => trellis_llm::text_tool_calls::written_call(
            "First I read the file, to see what to change.",
            "read_file",
            serde_json::json!({ "path": file }),
        ),
        Some((folder, false)) => trellis_llm::text_tool_calls::written_call(
            "First I look at what the folder holds.",
            "list_dir",
            serde_json::json!({ "path": folder }),
        ),
        None => trellis_llm::text_tool_calls::written_call(
            "First I look at what the directory holds.",
            "list_dir",
            serde_json::json!({ "path": "." }),
        ),
    }
}

/// How the local model's first answer in a new session writes files ([`trellis_agent::Settings::draft`]),
/// shown with the path it most likely writes ([`example_path`]): as aider asks (docs/agent-tasks.md),
/// the change said in a few words first — without it the model planned less.
fn local_draft_hint(overview: &str, task: &str) -> String {
    format!(
        "First answer without calling a tool. Say in a few words what has to change, then write \
         every file you create or change whole: its path alone on a line, then its complete new \
         content in a fenced code block, like this:\n\n{path}\n```\n{whole}\n```\n\nThe files are then written for you, and you go on with the tools: run \
         the check that shows the task is done, fix what it shows, and call {finish}.",
        path = example_path(overview, task),
        whole = trellis_agent::WHOLE_CONTENT,
        finish = trellis_agent::FINISH,
    )
}

/// What the local model is told after its first answer ([`local_draft_hint`]) wrote its files:
/// how to call a tool from then on, shown with a check to run ([`first_check`]).
fn local_calls_after_draft(overview: &str, task: &str) -> String {
    let example = serde_json::to_string_pretty(&first_check(overview, task)).unwrap_or_default();
    format!(
        "From now on, answer every time with one JSON object and nothing else: a short thought \
         (what you do next, and why), then the name and arguments of one tool to call. For \
         example:\n{example}\nThe tool's result comes back in the next message. Run the check \
         that shows the task is done and fix what it shows: to change a file, write_file its \
         whole new content or edit_file one exact part of it. When the task is done and checked, \
         call {finish} with a one-sentence summary.",
        finish = trellis_agent::FINISH,
    )
}

/// The file the first answer is shown writing ([`local_draft_hint`]): of the files the task
/// names, leaving tests out (a task rarely asks for them to change, and the model copies the
/// example's path), the first that does not exist yet (what the task asks to be made), else the
/// first; else the overview's first such file; else `main.py`.
fn example_path(overview: &str, task: &str) -> String {
    let listed: Vec<&str> = overview.lines().collect();
    let named: Vec<&str> = trellis_agent::named_paths(task)
        .into_iter()
        .filter(|path| !path.contains("test"))
        .collect();
    named
        .iter()
        .find(|path| !listed.contains(path))
        .or(named.first())
        .copied()
        .or_else(|| {
            listed.into_iter().find(|line| {
                !line.ends_with('/') && !line.starts_with("[…") && !line.contains("test")
            })
        })
        .unwrap_or("main.py")
        .to_owned()
}

/// The call shown after the first answer ([`local_calls_after_draft`]): the command the task
/// names in backticks (one whose program there is: [`runnable`]); else, when it names a Python
/// test file, running the tests (`unittest` finds `test*.py`); else running the example file when
/// it is a Python or shell script; else reading it back. The model runs the command it is shown
/// as it is.
fn first_check(overview: &str, task: &str) -> serde_json::Value {
    let named = task
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::trim)
        .find(|quoted| {
            quoted.contains(' ')
                && quoted
                    .split_whitespace()
                    .next()
                    .is_some_and(|program| runnable(overview, program))
        });
    let path = example_path(overview, task);
    let tests = trellis_agent::named_paths(task)
        .into_iter()
        .any(|path| path.contains("test") && path.rsplit_once('.').is_some_and(|(_, e)| e == "py"))
        .then(|| "python3 -m unittest".to_owned());
    let command = named.map(str::to_owned).or(tests).or_else(|| {
        let program = match path.rsplit_once('.')?.1 {
            "py" => "python3",
            "sh" => "bash",
            _ => return None,
        };
        Some(format!("{program} {path}"))
    });
    match command {
        Some(command) => trellis_llm::text_tool_calls::written_call(
            "Now I run it, to check the change.",
            "shell",
            serde_json::json!({ "command": command }),
        ),
        None => trellis_llm::text_tool_calls::written_call(
            "Now I read the file back, to check the change.",
            "read_file",
            serde_json::json!({ "path": path }),
        ),
    }
}

/// Whether `program` starts a command: a file of the working directory's `overview`, or a program
/// on `PATH` (`` Print `hello world` `` names no command).
fn runnable(overview: &str, program: &str) -> bool {
    let program = program.strip_prefix("./").unwrap_or(program);
    overview.lines().any(|file| file == program)
        || (!program.contains('/') && crate::command::on_path(program).is_some())
}

/// Files of the working directory listed in the system prompt.
const OVERVIEW_ENTRIES: usize = 100;

/// The longest one turn's answer may be unless the node sets `max_tokens`: a turn is a step, and a
/// model that runs on (a small local one repeating itself) must not fill its whole context window.
const DEFAULT_TURN_TOKENS: u32 = 4096;

pub struct AgentHandler {
    client: Option<Arc<Client>>,
    threads: Arc<Threads>,
    /// What the agent's `shell` calls run in.
    sandbox: Arc<Sandbox>,
    /// The run's MCP servers, shared by its agent stages (handlers are made per run).
    mcp: Arc<crate::mcp::Hub>,
}

impl AgentHandler {
    pub fn new(client: Option<Arc<Client>>, threads: Arc<Threads>, sandbox: Arc<Sandbox>) -> Self {
        Self {
            client,
            threads,
            mcp: Arc::new(crate::mcp::Hub::new(sandbox.clone())),
            sandbox,
        }
    }
}

#[async_trait]
impl Handler for AgentHandler {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        let Some(llm) = stage.node.kind.llm() else {
            return Outcome::success().into();
        };
        if let Some(unmet) = unmet_requirement(stage, llm).await {
            return unmet.into();
        }
        if stage.settings.models_simulated() {
            simulated_skills(stage, llm).await;
            return simulated_outcome(stage, llm).await.into();
        }
        match llm.backend {
            Backend::Api => {}
            Backend::Cli => {
                return cli_agent::run(stage, llm, self.client.as_deref())
                    .await
                    .into();
            }
            Backend::Acp => {
                return crate::acp::run(stage, llm, &self.sandbox, self.client.as_deref())
                    .await
                    .into();
            }
        }
        let Some(client) = &self.client else {
            return no_model(stage).into();
        };
        self.run(client, stage, llm).await.into()
    }
}

/// The outcome of a node whose `requires` (SWEny's pre-condition) the input and the results so far
/// do not meet: failed, or skipped with a warning saying why (`on_fail: skip`). Not checked in a
/// simulated run, whose results are samples.
async fn unmet_requirement(stage: &Stage<'_>, llm: &LlmConfig) -> Option<Outcome> {
    let requires = llm.checks.requires.as_ref()?;
    if stage.settings.models_simulated() {
        return None;
    }
    let (workflow, context, blobs) = (
        stage.workflow.clone(),
        stage.context.snapshot(),
        stage.services.blobs.clone(),
    );
    let root = trellis_process::task::blocking(move || {
        crate::preamble::results_by_node(&workflow, &context, &*blobs)
    })
    .await;
    let reasons = requires.check(&root).err()?;
    let reason = format!("requires failed:\n{reasons}");
    Some(match requires.on_fail {
        trellis_workflow::requires::OnFail::Fail => {
            Outcome::failed(FailureClass::StageFailed, reason)
        }
        trellis_workflow::requires::OnFail::Skip => {
            stage.emitter.emit(
                Some(&stage.node.id),
                EventKind::ModelWarning {
                    message: format!("skipped: {reason}"),
                },
            );
            Outcome::new(trellis_workflow::StageStatus::Skipped)
        }
    })
}

/// A simulated agent node still says what its skills lack (SWEny's pre-flight, which a real run
/// makes before it starts), as warnings: nothing is called.
async fn simulated_skills(stage: &Stage<'_>, llm: &LlmConfig) {
    let Some(names) = llm.skills.clone().filter(|names| !names.is_empty()) else {
        return;
    };
    let dir = stage.settings.work_dir.clone();
    let graph = stage.workflow.graph.clone();
    let (_, node) =
        trellis_process::task::blocking(move || skills::for_node_in(&dir, &graph, &names)).await;
    for problem in node.errors.iter().chain(&node.warnings) {
        stage.emitter.emit(
            Some(&stage.node.id),
            EventKind::ModelWarning {
                message: format!("skills: {problem}"),
            },
        );
    }
}

/// Turns the session's events into run events and writes the transcript as it goes.
pub(crate) struct StageObserver<'a> {
    emitter: &'a dyn Emitter,
    node_id: &'a str,
    transcript: std::sync::mpsc::Sender<Value>,
    /// The tool calls answered, in order (what a node's `verify` judges).
    calls: parking_lot::Mutex<Vec<ToolCall>>,
    /// The sub-agent observed (its transcript entries say so), if not the stage's own agent.
    agent: Option<String>,
}

impl<'a> StageObserver<'a> {
    /// An observer of `stage` and the writer of its `transcript.jsonl`, which finishes when the
    /// observer is dropped.
    pub(crate) fn new(
        stage: &'a Stage<'a>,
    ) -> (
        Self,
        impl std::future::Future<Output = Option<()>> + Send + 'static,
    ) {
        let (transcript, writer) = transcript_writer(stage.dir.join("transcript.jsonl"));
        let observer = StageObserver {
            emitter: stage.emitter,
            node_id: &stage.node.id,
            transcript,
            calls: parking_lot::Mutex::default(),
            agent: None,
        };
        (observer, writer)
    }

    /// An observer of the stage's sub-agent `agent`, emitting through `emitter`, writing into the
    /// same transcript.
    fn for_agent<'b>(&self, emitter: &'b dyn Emitter, agent: &str) -> StageObserver<'b>
    where
        'a: 'b,
    {
        StageObserver {
            emitter,
            node_id: self.node_id,
            transcript: self.transcript.clone(),
            calls: parking_lot::Mutex::default(),
            agent: Some(agent.to_owned()),
        }
    }

    /// Adds an entry to the transcript.
    pub(crate) fn note(&self, mut entry: Value) {
        if let (Some(agent), Some(fields)) = (&self.agent, entry.as_object_mut()) {
            fields.insert("agent".into(), json!(agent));
        }
        let _ = self.transcript.send(entry);
    }

    /// How many tool calls were answered.
    pub(crate) fn tool_calls(&self) -> u32 {
        u32::try_from(self.calls.lock().len()).unwrap_or(u32::MAX)
    }

    /// The tool calls answered so far.
    pub(crate) fn calls(&self) -> Vec<ToolCall> {
        self.calls.lock().clone()
    }
}

/// Appends transcript entries to `transcript.jsonl`, on a thread of its own (it lasts the whole
/// stage), until the sender is dropped — when the stage ends, or when it is cancelled, so a stopped
/// stage keeps what it did. The future ends once every entry is written.
#[allow(
    clippy::disallowed_methods,
    reason = "the file work runs on the thread it starts"
)]
fn transcript_writer(
    path: std::path::PathBuf,
) -> (
    std::sync::mpsc::Sender<Value>,
    impl std::future::Future<Output = Option<()>> + Send + 'static,
) {
    let (sender, entries) = std::sync::mpsc::channel::<Value>();
    let writer = trellis_process::task::own_thread("trellis-transcript", move || {
        use std::io::Write as _;
        let Ok(file) = trellis_process::files::create_no_link(&path) else {
            return;
        };
        let mut file = std::io::BufWriter::new(file);
        for entry in entries {
            let _ = writeln!(file, "{entry}");
            let _ = file.flush();
        }
    });
    (sender, writer)
}

impl Observer for StageObserver<'_> {
    #[allow(
        clippy::too_many_lines,
        reason = "one arm per agent event: what it adds to the transcript and the event it becomes"
    )]
    fn on_event(&self, event: AgentEvent) {
        let node = Some(self.node_id);
        let kind = match event {
            AgentEvent::TurnStarted { turn } => {
                self.note(json!({ "type": "turn", "turn": turn }));
                EventKind::AgentTurnStarted { turn }
            }
            AgentEvent::TurnAnswered { turn, usage } => {
                self.note(json!({ "type": "usage", "turn": turn, "usage": usage }));
                EventKind::AgentTurnCompleted {
                    turn,
                    usage: crate::model_call::token_usage(usage),
                }
            }
            AgentEvent::Text { turn, text } => {
                let text = secrets::redact(&text);
                self.note(json!({ "type": "assistant", "turn": turn, "text": text }));
                return;
            }
            AgentEvent::ToolCallStarted {
                call_id,
                tool,
                target,
                arguments,
            } => {
                self.note(json!({
                    "type": "tool_call", "call_id": call_id, "tool": tool, "arguments": arguments,
                }));
                EventKind::AgentToolCallStarted {
                    call_id,
                    tool,
                    target,
                    arguments,
                }
            }
            AgentEvent::ToolCallCompleted {
                call_id,
                tool,
                target,
                is_error,
                duration_ms,
                output,
                shown_chars,
                note,
            } => {
                self.calls.lock().push(ToolCall {
                    tool: tool.clone(),
                    succeeded: !is_error,
                });
                // The built-in shell redacts its output already; a CLI's tools do not.
                let output = secrets::redact(&output).into_owned();
                self.note(json!({
                    "type": "tool_result", "call_id": call_id, "tool": tool, "is_error": is_error,
                    "duration_ms": duration_ms, "shown_chars": shown_chars, "output": output,
                }));
                EventKind::AgentToolCallCompleted(ToolCallEnd {
                    call_id,
                    tool,
                    target,
                    is_error,
                    duration_ms,
                    output_chars: output.chars().count(),
                    shown_chars,
                    note,
                    output,
                })
            }
            AgentEvent::ApprovalAsked { prompt, options } => {
                self.note(json!({ "type": "approval", "prompt": prompt }));
                EventKind::HumanGateAsked {
                    prompt,
                    options,
                    freeform: false,
                }
            }
            AgentEvent::ApprovalAnswered { label, asked } => {
                self.note(json!({ "type": "approval_answer", "label": label, "asked": asked }));
                EventKind::HumanGateAnswered {
                    label,
                    text: None,
                    default_after_timeout: false,
                }
            }
            AgentEvent::Reminded { turn, text } => {
                self.note(json!({ "type": "reminder", "turn": turn, "text": text }));
                return;
            }
            AgentEvent::Steered { turn, text } => {
                self.note(json!({ "type": "steer", "turn": turn, "text": text }));
                EventKind::AgentSteeringReceived { turn, text }
            }
            AgentEvent::LoopDetected { period, tools } => {
                self.note(json!({ "type": "loop_detected", "period": period, "tools": tools }));
                EventKind::AgentLoopDetected { period, tools }
            }
            AgentEvent::ContextWindowWarning {
                estimated_tokens,
                context_window_size,
                usage_percent,
            } => EventKind::AgentContextWindowWarning {
                estimated_tokens,
                context_window_size,
                usage_percent,
            },
            AgentEvent::CompactionStarted {
                estimated_tokens,
                context_window_size,
            } => EventKind::AgentCompactionStarted {
                estimated_tokens,
                context_window_size,
            },
            AgentEvent::CompactionCompleted {
                original_turn_count,
                preserved_turn_count,
                summary_token_estimate,
                tracked_file_count,
                summary,
            } => {
                // The summary in the transcript only: what the session went on from, redacted as
                // the model's other text is.
                self.note(json!({
                    "type": "compaction",
                    "original_turn_count": original_turn_count,
                    "summary": secrets::redact(&summary),
                }));
                EventKind::AgentCompactionCompleted {
                    original_turn_count,
                    preserved_turn_count,
                    summary_token_estimate,
                    tracked_file_count,
                }
            }
            AgentEvent::Error { message } => {
                self.note(json!({ "type": "error", "message": message }));
                EventKind::AgentError { message }
            }
        };
        self.emitter.emit(node, kind);
    }
}

/// What the routing sources yielded under the node's schema.
enum Reading {
    Valid(Structured),
    /// Worth a repair turn: the problem, and whether the answer gave no routing object at all.
    Invalid {
        problem: String,
        missing: bool,
    },
    Fatal(String),
}

/// An agent's live conversation, as the routing and repair loop ([`converse`]) sees it: the built-in
/// session on the node's model, or a coding-agent CLI (`crate::cli_agent`).
#[async_trait]
pub(crate) trait Conversation: Send + Sync {
    /// Sends a message and runs the agent until it answers; a stage that cannot go on gets its
    /// failed outcome instead.
    async fn send(&mut self, message: String) -> Result<Answer, Box<Outcome>>;
    /// The working directory, where `status.json` is looked for.
    fn root(&self) -> &Path;
    /// The file the agent wrote last, relative to the working directory.
    fn last_touched(&self) -> Option<String>;
    /// The tool calls the agent made so far (answered).
    fn calls(&self) -> Vec<ToolCall>;
}

/// An agent's final answer to a message.
pub(crate) struct Answer {
    pub text: String,
    pub stop_reason: Option<Value>,
}

impl AgentHandler {
    async fn run(&self, client: &Client, stage: &Stage<'_>, llm: &LlmConfig) -> Outcome {
        let mut call = match ModelCall::for_stage(client, stage) {
            Ok(call) => call,
            Err(outcome) => return *outcome,
        };
        let work_dir = match agent_work_dir(stage).await {
            Ok(dir) => dir,
            Err(outcome) => return *outcome,
        };
        let mut opening = Opening::new(stage, llm, &self.threads).await;
        let (external, listing) = match self.extras(stage, llm, &mut opening.prompt).await {
            Ok(extras) => extras,
            Err(outcome) => return *outcome,
        };
        let base = SessionBase::new(
            stage,
            llm,
            (client, &call),
            (work_dir, &self.sandbox),
            (&opening.prompt, listing),
        )
        .await;
        let continuing = !opening.thread.messages.is_empty();
        opening.prompt = base.first_message(&opening.prompt, continuing).await;
        write_stage_file(stage, "prompt.md", &opening.prompt).await;
        let depth = subagent_depth(llm, &call);
        let (subagents, arrivals) = SubAgents::new(depth);
        let mut tools = external.clone();
        if depth > 0 {
            tools.push(Arc::new(subagents.clone()));
        }
        let mut session = base.session(tools, opening.thread, llm.max_turns);
        session.set_task(&opening.task).await;
        let (observer, writer) = StageObserver::new(stage);
        let inbox = StageInbox::open(stage).await;
        if let Some(inbox) = &inbox {
            session.set_inbox(Box::new(inbox.clone()));
        }
        if let Some(gate) = gate(stage, llm) {
            session.set_approver(Box::new(gate));
        }
        let mut conversation = ApiConversation {
            stage,
            session,
            call: &mut call,
            observer: &observer,
        };
        let children = Children {
            stage,
            llm,
            client,
            base: &base,
            external: &external,
            observer: &observer,
            usage: parking_lot::Mutex::default(),
        };
        let judges = checks::Judges::new(Some(client));
        let mut outcome = {
            let talk = std::pin::pin!(converse(
                stage,
                llm,
                &judges,
                &mut conversation,
                opening.prompt,
            ));
            let others =
                std::pin::pin!(subagents::drive(arrivals, |spawned| children.run(spawned)));
            match futures::future::select(talk, others).await {
                futures::future::Either::Left((outcome, _)) => outcome,
                futures::future::Either::Right((never, _)) => match never {},
            }
        };
        children.closed(&subagents.close_all());
        let children_usage = children.usage.into_inner();
        let session = conversation.session;
        if let Some(inbox) = inbox {
            inbox.close(stage, &observer).await;
        }
        outcome.details.fidelity = Some(opening.fidelity.as_str().to_owned());
        outcome.details.tool_calls = Some(observer.tool_calls());
        drop(observer);
        let _ = writer.await;
        outcome.files_touched = session.files_touched().to_vec();
        call.usage.add(children_usage);
        call.usage.add(judges.usage());
        call.describe(&mut outcome);
        if let Some(key) = opening.thread_key {
            self.threads.save(key, thread_of(session));
        }
        outcome
    }
}

/// What a session leaves of its thread: its conversation, and what its system prompt said of it
/// alone ([`Thread`]).
fn thread_of(session: Session) -> Thread {
    let opened_with = session.system_session().map(str::to_owned);
    Thread {
        messages: session.into_history(),
        session: opened_with,
    }
}

/// The agent's working directory (the run's record readable too: preambles point at large outputs
/// stored there; the runs directory left out of its walks, as its records quote the project's
/// files), stopped with the stage.
async fn agent_work_dir(stage: &Stage<'_>) -> Result<WorkDir, Box<Outcome>> {
    let record = stage
        .dir
        .parent()
        .and_then(Path::parent)
        .map(Path::to_owned);
    let (dir, stop) = (stage.settings.work_dir.clone(), stage.cancel.clone());
    // Resolving the directories touches the file system: on the blocking pool.
    let work_dir = trellis_process::task::blocking(move || {
        let work_dir = WorkDir::new(&dir)?.with_stop(stop);
        Ok::<_, std::io::Error>(match record {
            Some(record) => {
                let work_dir = work_dir.with_readable(&record);
                match record.parent() {
                    Some(runs) => work_dir.with_unwalked(runs),
                    None => work_dir,
                }
            }
            None => work_dir,
        })
    })
    .await;
    work_dir.map_err(|e| {
        Box::new(Outcome::failed(
            FailureClass::Configuration,
            format!(
                "the working directory {} cannot be used: {e}",
                stage.settings.work_dir.display()
            ),
        ))
    })
}

/// What stands before a stage agent's calls (its sub-agents' too): who asks about calls beyond its
/// permissions, and the run's tool hooks.
fn gate(stage: &Stage<'_>, llm: &LlmConfig) -> Option<crate::hooks::ToolGuard> {
    let interviewer = stage.services.interviewer.clone();
    let levels = (llm.permissions, stage.settings.permissions);
    crate::hooks::ToolGuard::of(
        stage,
        permissions::Gate::of(&stage.node.id, levels, interviewer),
    )
}

/// How deep the stage's sub-agents may nest (0: no sub-agent tools). The node's
/// `max_subagent_depth`, else one level (Fabro's default) — except on the local model, whose small
/// context window and text-written calls four more tools would crowd. `allowed_tools` and
/// `disallowed_tools` take or leave the four tools together, by `spawn_agent`'s name.
fn subagent_depth(llm: &LlmConfig, call: &ModelCall<'_>) -> u32 {
    let name = subagents::TOOL_NAMES[0];
    let offered = llm
        .allowed_tools
        .as_ref()
        .is_none_or(|allowed| allowed.iter().any(|n| n == name))
        && !llm.disallowed_tools.iter().any(|n| n == name);
    if !offered {
        return 0;
    }
    llm.max_subagent_depth
        .unwrap_or(u32::from(call.resolved.provider != "local"))
}

/// A stage's sub-agents: each a session of its own on the stage's model, tools, MCP servers, skills
/// and permissions, its events forwarded under its id and its transcript entries marked with it.
struct Children<'a> {
    stage: &'a Stage<'a>,
    llm: &'a LlmConfig,
    client: &'a Client,
    base: &'a SessionBase,
    external: &'a [Arc<dyn ExternalTools>],
    observer: &'a StageObserver<'a>,
    /// The tokens the children's model calls took, for the stage's total.
    usage: parking_lot::Mutex<trellis_llm::Usage>,
}

impl Children<'_> {
    fn emit(&self, agent: Option<&str>, kind: EventKind) {
        self.stage
            .emitter
            .emit_from(Some(&self.stage.node.id), agent, kind);
    }

    /// Runs one child: its task, then each input sent to it after an answer, until it is closed
    /// or the stage ends.
    async fn run(&self, spawned: Spawned) {
        let id = spawned.id.clone();
        let parent = subagents::parent_of(&id);
        self.emit(
            parent,
            EventKind::AgentSubagentSpawned {
                subagent: id.clone(),
                task: spawned.task.clone(),
                depth: spawned.depth,
            },
        );
        self.observer
            .note(json!({ "type": "subagent", "agent": id, "task": spawned.task }));
        let emitter = AgentEmitter {
            inner: self.stage.emitter,
            agent: id.clone(),
        };
        let observer = self.observer.for_agent(&emitter, &id);
        let model = ModelCall::new(
            self.client,
            &emitter,
            &self.stage.node.id,
            self.llm.model.as_deref(),
            self.llm.provider.as_deref(),
        );
        let mut model = match model {
            Ok(call) => Counted {
                call,
                total: &self.usage,
            },
            Err(outcome) => {
                let reason = failure_reason(&outcome);
                spawned.finish(Ending::Failed(reason.clone()));
                self.emit(
                    parent,
                    EventKind::AgentSubagentFailed {
                        subagent: id.clone(),
                        error: reason,
                    },
                );
                return;
            }
        };
        let mut tools = self.external.to_vec();
        tools.push(Arc::new(spawned.tools.clone()));
        let mut session = self
            .base
            .session(tools, Thread::default(), spawned.max_turns);
        session.set_inbox(spawned.inbox());
        if let Some(gate) = gate(self.stage, self.llm) {
            session.set_approver(Box::new(gate));
        }
        let rounds = async {
            let mut text = spawned.task.clone();
            loop {
                observer.note(json!({ "type": "user", "text": text }));
                let before = model.call.turns;
                let ending = match session.send(&mut model, &observer, text).await {
                    Ok(response) => Ending::Answered(response.text),
                    Err(Stop::MaxTurns { turns, last_text }) => Ending::Answered(format!(
                        "{last_text}\n\n(It stopped after {turns} turn(s), its max_turns.)"
                    )),
                    Err(Stop::Looping { last_text, .. }) => Ending::Answered(format!(
                        "{last_text}\n\n(It was stopped for repeating the same tool calls.)"
                    )),
                    Err(Stop::Model(outcome)) => Ending::Failed(failure_reason(&outcome)),
                };
                let kind = match &ending {
                    Ending::Answered(text) => EventKind::AgentSubagentCompleted {
                        subagent: id.clone(),
                        turns: model.call.turns - before,
                        text: secrets::redact(text).into_owned(),
                    },
                    Ending::Failed(error) => EventKind::AgentSubagentFailed {
                        subagent: id.clone(),
                        error: error.clone(),
                    },
                };
                self.emit(parent, kind);
                text = match spawned.finish(ending) {
                    Some(more) => more,
                    None => match spawned.next_input().await {
                        Some(more) => more,
                        None => break,
                    },
                };
            }
        };
        tokio::select! {
            () = rounds => {}
            () = spawned.closed() => self.closed(std::slice::from_ref(&id)),
        }
    }

    /// Reports children closed (by `close_agent`, or because the stage ended).
    fn closed(&self, ids: &[String]) {
        for id in ids {
            let parent = subagents::parent_of(id);
            self.observer
                .note(json!({ "type": "subagent_closed", "agent": id }));
            self.emit(
                parent,
                EventKind::AgentSubagentClosed {
                    subagent: id.clone(),
                },
            );
        }
    }
}

/// A sub-agent's model: each call's tokens go to the stage's total as the call ends (a child may be
/// stopped at any point).
struct Counted<'a> {
    call: ModelCall<'a>,
    total: &'a parking_lot::Mutex<trellis_llm::Usage>,
}

#[async_trait]
impl trellis_agent::Model for Counted<'_> {
    type Error = Box<Outcome>;

    async fn ask(&mut self, request: &Request) -> Result<trellis_llm::Response, Box<Outcome>> {
        let response = self.call.ask(request).await?;
        self.total.lock().add(response.usage);
        Ok(response)
    }

    fn overflowed(&self, error: &Box<Outcome>) -> bool {
        trellis_agent::Model::overflowed(&self.call, error)
    }
}

fn failure_reason(outcome: &Outcome) -> String {
    outcome
        .failure
        .as_ref()
        .map_or_else(|| "its model call failed".to_owned(), |f| f.reason.clone())
}

/// A sub-agent's events: the stage's, marked with its id; streamed text is left out (the children
/// would interleave theirs with the stage agent's).
struct AgentEmitter<'a> {
    inner: &'a dyn Emitter,
    agent: String,
}

impl Emitter for AgentEmitter<'_> {
    fn emit_from(&self, node: Option<&str>, _agent: Option<&str>, event: EventKind) {
        if !matches!(event, EventKind::ModelTextDelta { .. }) {
            self.inner.emit_from(node, Some(&self.agent), event);
        }
    }
}

/// A built-in agent stage's steering messages (see [`crate::steering`]).
#[derive(Clone)]
struct StageInbox(Arc<parking_lot::Mutex<Option<steering::Inbox>>>);

impl StageInbox {
    /// Opens the stage's inbox; `None` (and a warning) when it cannot be made.
    async fn open(stage: &Stage<'_>) -> Option<Self> {
        let dir = stage.dir.to_path_buf();
        match trellis_process::task::blocking(move || steering::Inbox::open(&dir)).await {
            Ok(inbox) => Some(Self(Arc::new(parking_lot::Mutex::new(Some(inbox))))),
            Err(e) => {
                stage.emitter.emit(
                    Some(&stage.node.id),
                    EventKind::ModelWarning {
                        message: format!("this stage cannot take steering messages: {e}"),
                    },
                );
                None
            }
        }
    }

    /// Stops taking messages; those that came after the last model call are reported undelivered.
    async fn close(self, stage: &Stage<'_>, observer: &StageObserver<'_>) {
        let inbox = self.0.lock().take();
        let Some(inbox) = inbox else {
            return;
        };
        let late = trellis_process::task::blocking(move || inbox.close()).await;
        for message in late {
            observer.note(json!({ "type": "steer_undelivered", "text": message.text }));
            stage.emitter.emit(
                Some(&stage.node.id),
                EventKind::AgentSteeringUndelivered { text: message.text },
            );
        }
    }
}

#[async_trait]
impl trellis_agent::Inbox for StageInbox {
    async fn take(&self) -> Vec<String> {
        let this = self.clone();
        trellis_process::task::blocking(move || {
            this.0
                .lock()
                .as_ref()
                .map(steering::Inbox::take)
                .unwrap_or_default()
        })
        .await
        .into_iter()
        .map(|m| m.text)
        .collect()
    }
}

impl AgentHandler {
    /// What an agent gets beyond its own tools: the skills (into `prompt`, and the system prompt's
    /// list of them with `use_skill`) and the run's MCP servers' tools (sub-agents get the same); the
    /// failed outcome of a node that cannot start for a missing skill or variable.
    async fn extras(
        &self,
        stage: &Stage<'_>,
        llm: &LlmConfig,
        prompt: &mut String,
    ) -> Result<(Vec<Arc<dyn ExternalTools>>, Option<String>), Box<Outcome>> {
        let dir = stage.settings.work_dir.clone();
        let graph = stage.workflow.graph.clone();
        let names = llm.skills.clone().unwrap_or_default();
        let (skills, node) =
            trellis_process::task::blocking(move || skills::for_node_in(&dir, &graph, &names))
                .await;
        if !node.errors.is_empty() {
            return Err(Box::new(Outcome::failed(
                FailureClass::Configuration,
                format!(
                    "agent node `{}` cannot start: {}",
                    stage.node.id,
                    node.errors.join("; ")
                ),
            )));
        }
        let warn = |message: String| {
            stage
                .emitter
                .emit(Some(&stage.node.id), EventKind::ModelWarning { message });
        };
        for warning in &node.warnings {
            warn(format!("skills: {warning}"));
        }
        *prompt = with_skills(&skills, llm, prompt, &node.instructions);
        // A node limited to some servers (`mcp=`) still gets those its skills stand for.
        let selection = llm.mcp.as_ref().map(|names| {
            let mut names = names.clone();
            names.extend(node.configured.iter().cloned());
            names
        });
        let servers = self
            .mcp
            .tools(
                (
                    &stage.settings.work_dir,
                    stage.run_id,
                    &stage.workflow.graph.mcp_servers,
                ),
                selection.as_deref(),
                &node.servers,
                &warn,
            )
            .await;
        // SWEny's `tools: {allow, deny}` narrows what skills and servers give.
        let mut sets: Vec<Arc<dyn ExternalTools>> = match (servers, llm.tool_filter.clone()) {
            (Some(servers), Some(filter)) => {
                vec![trellis_agent::filtered(servers, move |name| {
                    filter.keeps(name)
                })]
            }
            (servers, _) => servers.into_iter().collect(),
        };
        let listing = (!skills.is_empty()).then(|| skills.listing());
        if !skills.is_empty() {
            sets.push(Arc::new(skills::UseSkill(skills)));
        }
        Ok((sets, listing))
    }
}

/// The opening prompt with the node's skills: a `/skill-name` in the node's own prompt expanded, and
/// the `instructions` of the skills `skills=` names before it.
fn with_skills(
    skills: &skills::Skills,
    llm: &LlmConfig,
    prompt: &str,
    instructions: &str,
) -> String {
    let mut prompt = prompt.to_owned();
    let own = llm.prompt.trim();
    if !own.is_empty() {
        let expanded = skills.expand(own);
        if expanded != own {
            prompt = prompt.replacen(own, &expanded, 1);
        }
    }
    if instructions.is_empty() {
        prompt
    } else {
        format!("{instructions}\n\n{prompt}")
    }
}

/// The built-in agent loop on the node's model.
struct ApiConversation<'s, 'c> {
    stage: &'s Stage<'s>,
    session: Session,
    call: &'c mut ModelCall<'s>,
    observer: &'c StageObserver<'s>,
}

#[async_trait]
impl Conversation for ApiConversation<'_, '_> {
    fn calls(&self) -> Vec<ToolCall> {
        self.observer.calls()
    }

    async fn send(&mut self, message: String) -> Result<Answer, Box<Outcome>> {
        self.observer
            .note(json!({ "type": "user", "text": message }));
        match self.session.send(self.call, self.observer, message).await {
            Ok(response) => Ok(Answer {
                text: response.text,
                stop_reason: serde_json::to_value(&response.stop_reason).ok(),
            }),
            Err(Stop::Model(outcome)) => Err(outcome),
            Err(Stop::MaxTurns { turns, last_text }) => {
                let reason =
                    format!("the agent used its {turns} turn(s) (max_turns) without finishing");
                let class = FailureClass::BudgetExhausted;
                Err(Box::new(
                    stopped(self.stage, class, reason, &last_text).await,
                ))
            }
            Err(Stop::Looping {
                warnings,
                last_text,
            }) => {
                let reason = format!(
                    "the agent kept repeating the same tool calls after {warnings} warnings"
                );
                let class = FailureClass::StageFailed;
                Err(Box::new(
                    stopped(self.stage, class, reason, &last_text).await,
                ))
            }
        }
    }

    fn root(&self) -> &Path {
        self.session.toolbox().work_dir().root()
    }

    fn last_touched(&self) -> Option<String> {
        self.session.last_touched().map(str::to_owned)
    }
}

/// What every session of a stage shares, its agent's and its sub-agents': the node's tools (confined
/// to the working directory, shell calls recorded for the reaper), the agent's system prompt with
/// the project memory and the skills' list, and the request settings.
struct SessionBase {
    toolbox: Toolbox,
    /// The system prompt every session of the agent shares.
    system: String,
    /// What the system prompt says of this stage alone: the working directory's files, and for
    /// the local model how to call a tool.
    session: String,
    /// For the local model, a new session's instead, and what it is told after its first answer
    /// ([`local_draft_hint`]).
    draft: Option<(String, String)>,
    settings: trellis_agent::Settings,
}

impl SessionBase {
    async fn new(
        stage: &Stage<'_>,
        llm: &LlmConfig,
        (client, call): (&Client, &ModelCall<'_>),
        (work_dir, sandbox): (WorkDir, &Arc<Sandbox>),
        (task, skills): (&str, Option<String>),
    ) -> Self {
        // The local model is small, must call a tool every turn (a grammar holds its answer to one
        // call), decodes greedily unless told a temperature, and is coached.
        let local = call.resolved.provider == "local";
        let mut toolbox = Toolbox::new(
            work_dir,
            llm.allowed_tools.as_deref(),
            &llm.disallowed_tools,
        );
        toolbox.sandbox = (
            sandbox.clone(),
            crate::command::sandbox_policy(&llm.sandbox),
        );
        toolbox.shell_env = vec![
            (
                trellis_process::group::RUN_ID_VAR.into(),
                stage.run_id.to_owned(),
            ),
            ("TRELLIS_NODE_ID".into(), stage.node.id.clone()),
            (STAGE_DIR_VAR.into(), stage.dir.display().to_string()),
        ];
        toolbox.pass_env = llm.pass_env.to_vec();
        let memory = if llm.project_memory {
            project_memory(stage).await
        } else {
            None
        };
        let overview = toolbox.overview(OVERVIEW_ENTRIES).await;
        // What every session of this agent shares first, then what is this one's alone: a prompt
        // cache keeps the shared part (and the tools) from one session to the next.
        let mut system = if local {
            AGENT_SYSTEM.to_owned()
        } else {
            format!("{AGENT_SYSTEM} {ANSWER_TO_FINISH}")
        };
        for shared in [memory, skills].into_iter().flatten() {
            system = format!("{system}\n\n{shared}");
        }
        let mut session = if overview.is_empty() {
            "The working directory is empty.".to_owned()
        } else {
            format!("The working directory holds:\n{overview}")
        };
        let draft = local.then(|| {
            (
                format!("{session}\n\n{}", local_draft_hint(&overview, task)),
                local_calls_after_draft(&overview, task),
            )
        });
        if local {
            session = format!("{session}\n\n{}", local_calls_hint(&overview, task));
        }
        let settings = trellis_agent::Settings {
            template: Request {
                max_tokens: llm.max_tokens.or(Some(DEFAULT_TURN_TOKENS)),
                reasoning_effort: Some(effort(llm.effort())),
                tool_choice: if local {
                    ToolChoice::Required
                } else {
                    ToolChoice::Auto
                },
                ..Request::default()
            },
            context_window: client.context_window(&call.resolved).map(u64::from),
            greedy: local,
            coach: local,
            draft: None,
        };
        Self {
            toolbox,
            system,
            session,
            draft,
            settings,
        }
    }

    /// A session with `external` beside the node's tools, at most `max_turns` turns long: a new one
    /// (`thread` empty), or one continuing `thread`, whose system prompt then says what the
    /// thread's first session's did ([`Thread`]; its own opens its message: [`Self::first_message`]).
    fn session(
        &self,
        external: Vec<Arc<dyn ExternalTools>>,
        thread: Thread,
        max_turns: Option<u32>,
    ) -> Session {
        let mut toolbox = self.toolbox.clone();
        toolbox.external = trellis_agent::combined(external);
        let mut settings = self.settings.clone();
        let Thread {
            messages: history,
            session: opened_with,
        } = thread;
        let system_session = if !history.is_empty() {
            opened_with
        } else if let Some((first, then)) = &self.draft {
            settings.draft = Some(then.clone());
            Some(first.clone())
        } else {
            Some(self.session.clone())
        };
        let mut session = Session::new(toolbox, Some(self.system.clone()), history, settings);
        session.set_system_session(system_session);
        session.limit_turns(max_turns);
        session
    }

    /// The session's first message: `prompt`, then for the local model all of a small project (its
    /// first answer writes files whole). A session that continues a thread is told first what a
    /// new session's system prompt says of it alone (the working directory's files as they are
    /// now, for the local model how to call a tool): see [`Self::session`].
    async fn first_message(&self, prompt: &str, continuing: bool) -> String {
        let mut message = prompt.to_owned();
        if let Some(files) = self.toolbox.named_files(prompt, self.settings.coach).await {
            message = format!("{message}\n\n{files}");
        }
        if continuing {
            message = format!("{}\n\n{message}", self.session);
        }
        message
    }
}

/// Sends `prompt` and reads the answer's routing under the node's schema, with repair turns in the
/// same conversation, and writes `response.md` (and `repairs.md`). The outcome carries the response
/// keys and the routing directive or structured output.
pub(crate) async fn converse(
    stage: &Stage<'_>,
    llm: &LlmConfig,
    judges: &checks::Judges<'_>,
    conversation: &mut dyn Conversation,
    prompt: String,
) -> Outcome {
    let started = stage_start(stage).await;
    let repairs_allowed = llm.output_schema.as_ref().map_or(0, |_| llm.output_retries);
    let mut repairs = 0;
    let mut retries = 0;
    let mut log = String::new();
    let mut message = prompt;
    loop {
        let response = match conversation.send(message).await {
            Ok(response) => response,
            Err(outcome) => return *outcome,
        };
        let (problem, missing) = match read_routing(
            llm.output_schema.as_ref(),
            &response.text,
            &*conversation,
            started,
        )
        .await
        {
            Reading::Valid(structured) => {
                write_stage_file(stage, "response.md", &response.text).await;
                if !log.is_empty() {
                    write_stage_file(stage, "repairs.md", &log).await;
                }
                let mut outcome = Outcome::success();
                response_updates(&mut outcome, &stage.node.id, &response.text);
                structured.apply(&mut outcome, &stage.node.id);
                outcome.details.repairs = Some(repairs);
                outcome.details.stop_reason = response.stop_reason;
                let calls = conversation.calls();
                let Some(failures) =
                    checks::failures(stage, llm, judges, &mut outcome, &response.text, &calls)
                        .await
                else {
                    return outcome;
                };
                let _ = write!(
                    log,
                    "## Response {}\n\n{}\n\n## Checks that failed\n\n{failures}\n\n",
                    repairs + retries + 1,
                    response.text
                );
                let Some(retry) = llm.checks.retry.as_ref().filter(|r| retries < r.max) else {
                    if retries > 0 {
                        write_stage_file(stage, "repairs.md", &log).await;
                    }
                    return Outcome {
                        context_updates: outcome.context_updates,
                        details: outcome.details,
                        ..Outcome::failed(FailureClass::StageFailed, failures)
                    };
                };
                retries += 1;
                stage.emitter.emit(
                    Some(&stage.node.id),
                    EventKind::ModelWarning {
                        message: format!(
                            "checks failed; sent back ({retries} of {}): {}",
                            retry.max,
                            failures.replace('\n', " ")
                        ),
                    },
                );
                message = checks::retry_message(&retry.guidance, &failures, retries, retry.max);
                continue;
            }
            Reading::Fatal(reason) => return Outcome::failed(FailureClass::Configuration, reason),
            Reading::Invalid { problem, missing } => (problem, missing),
        };
        let _ = write!(
            log,
            "## Response {}\n\n{}\n\n## Problems\n\n{problem}\n\n",
            repairs + 1,
            response.text
        );
        let Some(schema) = llm
            .output_schema
            .as_ref()
            .filter(|_| repairs < repairs_allowed)
        else {
            write_stage_file(stage, "response.md", &response.text).await;
            write_stage_file(stage, "repairs.md", &log).await;
            let reason = format!(
                "output schema validation failed after {repairs} repair attempt(s): {problem}"
            );
            if let Some(mut outcome) = auto_status(stage, llm, &response.text, &reason, missing) {
                outcome.details.repairs = Some(repairs);
                return outcome;
            }
            let mut outcome = Outcome::failed(FailureClass::StageFailed, reason);
            response_updates(&mut outcome, &stage.node.id, &response.text);
            outcome.details.repairs = Some(repairs);
            return outcome;
        };
        repairs += 1;
        message = output_schema::repair_message(schema, &problem);
    }
}

/// The failed outcome of an agent stopped before its answer, keeping its last words.
pub(crate) async fn stopped(
    stage: &Stage<'_>,
    class: FailureClass,
    reason: String,
    last_text: &str,
) -> Outcome {
    let mut outcome = Outcome::failed(
        class,
        format!("{reason}; its work so far is kept (files_touched, transcript.jsonl)"),
    );
    if !last_text.is_empty() {
        write_stage_file(stage, "response.md", last_text).await;
        response_updates(&mut outcome, &stage.node.id, last_text);
    }
    outcome
}

/// When the stage started, on the file system's clock (`prompt.md`'s time), so a `status.json` the
/// agent writes is told from one left by an earlier stage.
async fn stage_start(stage: &Stage<'_>) -> SystemTime {
    tokio::fs::metadata(stage.dir.join("prompt.md"))
        .await
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| SystemTime::now())
}

/// The routing sources after the response: `status.json` in the working directory if the stage wrote
/// it, then the last file touched. Each is read only if it is a regular file, and bounded: the agent
/// may have left a pipe there, which a plain read would wait on forever.
async fn fallback_sources(
    conversation: &dyn Conversation,
    started: SystemTime,
) -> Vec<(String, String)> {
    let root = conversation.root().to_path_buf();
    let last = conversation
        .last_touched()
        .filter(|last| last != "status.json");
    trellis_process::task::blocking(move || read_fallback_sources(&root, last, started)).await
}

#[allow(
    clippy::disallowed_methods,
    reason = "runs on the blocking pool (fallback_sources)"
)]
fn read_fallback_sources(
    root: &Path,
    last: Option<String>,
    started: SystemTime,
) -> Vec<(String, String)> {
    let mut sources = Vec::new();
    let status = root.join("status.json");
    if std::fs::metadata(&status)
        .and_then(|meta| meta.modified())
        .is_ok_and(|modified| modified >= started)
        && let Ok(text) = trellis_syntax::read_found_text(&status, root)
    {
        sources.push(("status.json".to_owned(), text));
    }
    if let Some(last) = last
        && let Ok(text) = trellis_syntax::read_found_text(&root.join(&last), root)
    {
        sources.push((format!("the last file touched ({last})"), text));
    }
    sources
}

async fn read_routing(
    schema: Option<&OutputSchema>,
    response: &str,
    conversation: &dyn Conversation,
    started: SystemTime,
) -> Reading {
    match schema {
        Some(OutputSchema::JsonSchema { .. }) => match output_schema::check(schema, response) {
            Ok(structured) => Reading::Valid(structured),
            Err(SchemaError::Invalid(problem)) => Reading::Invalid {
                problem,
                missing: false,
            },
            Err(SchemaError::BadSchema(reason)) => Reading::Fatal(reason),
        },
        None => {
            if let Some(directive) = routing_directive::extract(response) {
                return Reading::Valid(Structured::Free(Some(directive)));
            }
            let found = fallback_sources(conversation, started)
                .await
                .into_iter()
                .find_map(|(_, text)| routing_directive::extract(&text));
            Reading::Valid(Structured::Free(found))
        }
        Some(OutputSchema::Routing) => {
            let mut sources = vec![("the response".to_owned(), response.to_owned())];
            if !routing_directive::has_directive(response) {
                sources.extend(fallback_sources(conversation, started).await);
            }
            let Some((name, text)) = sources
                .into_iter()
                .find(|(_, text)| routing_directive::has_directive(text))
            else {
                return Reading::Invalid {
                    problem: format!(
                        "no JSON object with a routing field ({}) was found in the response, status.json or the last file touched",
                        routing_directive::ROUTING_FIELDS.join(", ")
                    ),
                    missing: true,
                };
            };
            match routing_directive::validate_routing(&text) {
                Ok(directive) => Reading::Valid(Structured::Routing(directive)),
                Err(problem) => Reading::Invalid {
                    problem: format!("in {name}: {problem}"),
                    missing: false,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{example_path, first_check, first_look, local_draft_hint};

    /// The `agent-tools` rule checks names against the workflow language's list: it is the
    /// agent's tools exactly.
    #[test]
    fn the_workflow_language_names_exactly_the_agents_tools() {
        let mut offered: Vec<&str> = trellis_agent::Tool::ALL
            .iter()
            .map(|t| t.name())
            .chain(super::subagents::TOOL_NAMES)
            .collect();
        let mut named = trellis_workflow::node_kind::AGENT_TOOLS.to_vec();
        offered.sort_unstable();
        named.sort_unstable();
        assert_eq!(offered, named);
    }

    #[test]
    #[allow(
        clippy::disallowed_methods,
        reason = "a test sets up a working directory"
    )]
    fn routing_is_looked_for_in_files_the_agent_left_but_not_in_a_pipe() {
        let dir = tempfile::tempdir().unwrap();
        // Made by the agent's shell: a plain read would wait for a writer forever.
        nix::unistd::mkfifo(
            &dir.path().join("status.json"),
            nix::sys::stat::Mode::S_IRWXU,
        )
        .unwrap();
        std::fs::write(dir.path().join("out.json"), r#"{"preferred_label": "yes"}"#).unwrap();
        let sources = super::read_fallback_sources(
            dir.path(),
            Some("out.json".to_owned()),
            std::time::SystemTime::UNIX_EPOCH,
        );
        assert_eq!(
            sources,
            [(
                "the last file touched (out.json)".to_owned(),
                r#"{"preferred_label": "yes"}"#.to_owned()
            )]
        );
    }

    #[test]
    fn a_first_answer_is_shown_writing_the_file_the_task_asks_for_and_then_checking_it() {
        let overview = "README.md\ncalc.py\ntest_calc.py\nnotes/\nnotes/a.txt";
        let shown = |task: &str| {
            let call = first_check(overview, task);
            let argument = &call["arguments"]
                .as_object()
                .unwrap()
                .values()
                .next()
                .unwrap();
            (
                example_path(overview, task),
                format!("{} {argument}", call["name"]),
            )
        };
        // A file still to be made, before one there is; tests left out.
        assert_eq!(
            shown("Summarise README.md into SUMMARY.md."),
            ("SUMMARY.md".into(), r#""read_file" "SUMMARY.md""#.into())
        );
        // The command the task names is the check.
        assert_eq!(
            shown(
                "The test in test_calc.py fails. Fix calc.py so that `python3 -m unittest test_calc` passes."
            ),
            (
                "calc.py".into(),
                r#""shell" "python3 -m unittest test_calc""#.into()
            )
        );
        // Backticks around words that are not a command.
        assert_eq!(
            shown("Make calc.py print `hello world`."),
            ("calc.py".into(), r#""shell" "python3 calc.py""#.into())
        );
        assert_eq!(
            shown("Write backup.sh, version 1.2, and run it."),
            ("backup.sh".into(), r#""shell" "bash backup.sh""#.into())
        );
        assert_eq!(
            shown("Add reverse_words to words.py, with a test in test_words.py."),
            ("words.py".into(), r#""shell" "python3 -m unittest""#.into())
        );
        // Naming none: the overview's first file, else main.py.
        assert_eq!(shown("Make it faster.").0, "README.md");
        assert_eq!(example_path("", "Make it --faster."), "main.py");
        assert!(local_draft_hint(overview, "Fix calc.py.").contains("\ncalc.py\n```\n"));
    }

    #[test]
    fn the_example_call_looks_first_at_what_the_task_names() {
        let overview = "README.md\nnotes/\nnotes/a.txt\nsrc/\nsrc/lib.rs";
        let look = |task: &str| {
            let call = first_look(overview, task);
            format!("{} {}", call["name"], call["arguments"]["path"])
        };
        assert_eq!(
            look("Fix `src/lib.rs:3` so the tests pass."),
            r#""read_file" "src/lib.rs""#
        );
        assert_eq!(
            look("Copy every file of the notes folder into backup/."),
            r#""list_dir" "notes""#
        );
        assert_eq!(look("Write hello.py."), r#""read_file" "README.md""#);
        assert_eq!(first_look("", "Write hello.py.")["arguments"]["path"], ".");
    }
}
