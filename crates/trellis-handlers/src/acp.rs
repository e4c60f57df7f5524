//! Agent nodes with `backend="acp"`: the node is handed to an agent that speaks the Agent Client
//! Protocol over its standard input and output (the `agent-client-protocol` crate), Trellis being the
//! client. `acp_command` (node or stylesheet) starts it; without one, the node's CLI's ACP command
//! ([`AgentCli::acp_command`]). The flow: `initialize` (Trellis offers file reading and writing and
//! terminals), `session/new` in the working directory with the run's MCP servers (those `mcp="..."`
//! names, when it does), then `session/prompt` with the prompt assembled as for the built-in agent.
//!
//! The agent's `session/update` notifications become the built-in agent's events, transcript and live
//! output: its message chunks are the answer (routed and checked against `output_schema` like the
//! built-in agent's; a repair turn is another prompt in the same session), its tool calls
//! `Agent.ToolCallStarted`/`Completed`. Its requests are served inside the working directory with the
//! confinement of the built-in tools: `fs/read_text_file` and `fs/write_text_file` resolve paths
//! there (writing needs `read-write`), `terminal/*` run commands in the run's sandbox with the node's
//! sandbox policy and the secret rules of the `shell` tool (they need `full`), and
//! `session/request_permission` is answered by the node's permission level (allow once, else
//! reject). When the stage is cancelled or times out, `session/cancel` is sent and the agent has two
//! seconds to wind down before its process group is killed. `files_touched` comes from git, as for
//! CLI agents.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, CreateTerminalRequest,
    CreateTerminalResponse, EnvVariable, FileSystemCapabilities, HttpHeader, InitializeRequest,
    KillTerminalRequest, KillTerminalResponse, McpServer, McpServerHttp, McpServerStdio,
    NewSessionRequest, PermissionOptionKind, PromptRequest, ReadTextFileRequest,
    ReadTextFileResponse, ReleaseTerminalRequest, ReleaseTerminalResponse,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionId, SessionNotification, SessionUpdate, StopReason,
    TerminalExitStatus, TerminalOutputRequest, TerminalOutputResponse, TextContent,
    ToolCallContent, ToolCallStatus, ToolKind, WaitForTerminalExitRequest,
    WaitForTerminalExitResponse, WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::{Agent, ByteStreams, Client};
use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::compat::{TokioAsyncReadCompatExt as _, TokioAsyncWriteCompatExt as _};
use trellis_agent::{AgentEvent, Category, Observer, ToolOutput, WorkDir};
use trellis_engine::event::{EventKind, ModelCallEnd};
use trellis_engine::{FailureClass, ModelDetails, Outcome, Stage};
use trellis_process::sandbox::{Policy, Sandbox};
use trellis_process::task::blocking;
use trellis_workflow::node_kind::{AgentCli, LlmConfig, Permissions};

use crate::agent::{Answer, Conversation, StageObserver, converse};
use crate::cli_agent::snapshot;
use crate::mcp::{Endpoint, ServerConfig};
use trellis_workflow::requires::ToolCall;

/// How long an agent told to cancel has before its process group is killed.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// The longest output a terminal keeps.
const TERMINAL_OUTPUT: usize = 256 * 1024;
/// How long a command an agent runs in a terminal may take.
const TERMINAL_TIMEOUT: Duration = Duration::from_mins(30);

/// Runs a `backend="acp"` agent stage.
pub(crate) async fn run(
    stage: &Stage<'_>,
    llm: &LlmConfig,
    sandbox: &Arc<Sandbox>,
    judge: Option<&trellis_llm::Client>,
) -> Outcome {
    let command = match &llm.acp_command {
        Some(command) => command.clone(),
        None => match AgentCli::for_node(llm) {
            Ok(cli) => cli.acp_command().to_owned(),
            Err(problem) => {
                return Outcome::failed(
                    FailureClass::Configuration,
                    format!("agent node `{}`: {problem}", stage.node.id),
                );
            }
        },
    };
    let (opening, prompt) = crate::cli_agent::session_prompt(stage, llm).await;
    let root = stage.settings.work_dir.clone();
    let exclude = crate::artifacts::runs_dir(stage.dir);
    let before = snapshot(&root, &exclude, stage.cancel).await;
    let work_dir = match WorkDir::new(&root) {
        Ok(dir) => dir,
        Err(e) => {
            return Outcome::failed(
                FailureClass::Configuration,
                format!("the working directory {}: {e}", root.display()),
            );
        }
    };
    let mut process = match AgentProcess::start(&command, &root, stage) {
        Ok(process) => process,
        Err(e) => {
            return Outcome::failed(
                FailureClass::CouldNotStart,
                format!("cannot start the ACP agent `{command}`: {e}"),
            );
        }
    };
    let (observer, writer) = StageObserver::new(stage);
    observer.note(json!({ "type": "command", "program": "acp", "args": [command.clone()] }));
    let server = Served {
        work_dir,
        sandbox: sandbox.clone(),
        policy: crate::command::sandbox_policy(&llm.sandbox),
        level: level(llm, stage),
        terminals: Mutex::new(HashMap::new()),
        next_terminal: Mutex::new(0),
        run_id: stage.run_id.to_owned(),
    };
    let shared = Shared {
        stage,
        observer: &observer,
        text: Mutex::new(String::new()),
        started: Mutex::new(HashMap::new()),
    };
    let servers = mcp_servers(stage, llm).await;
    let (outcome, stderr) = talk(
        &mut process,
        &shared,
        &server,
        servers,
        (llm, judge, prompt),
    )
    .await;
    let mut outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => Outcome::failed(
            FailureClass::StageFailed,
            format!(
                "the ACP agent `{command}` failed: {error}{}",
                stderr
                    .map(|s| format!("; it said: {}", trellis_engine::text::tail(&s, 2000)))
                    .unwrap_or_default()
            ),
        ),
    };
    process.finish();
    outcome.details.tool_calls = Some(observer.tool_calls());
    drop(observer);
    let _ = writer.await;
    let after = snapshot(&root, &exclude, stage.cancel).await;
    outcome.files_touched = blocking(move || before.touched(&after, &root, &exclude)).await;
    outcome.details.model = Some(ModelDetails {
        model: llm.model.clone().unwrap_or_else(|| "acp agent".to_owned()),
        provider: "acp".to_owned(),
        usage: trellis_engine::TokenUsage::default(),
        turns: 1,
        cost_usd: None,
    });
    outcome.details.cli = Some(format!("acp: {command}"));
    outcome.details.fidelity = Some(opening.fidelity.as_str().to_owned());
    outcome
}

/// The most the node's agent may do without asking: its level, lowered to the run's ceiling.
fn level(llm: &LlmConfig, stage: &Stage<'_>) -> Permissions {
    let rank = |p: Permissions| match p {
        Permissions::ReadOnly => 0,
        Permissions::ReadWrite => 1,
        Permissions::Full => 2,
    };
    match stage.settings.permissions {
        Some(ceiling) if rank(ceiling) < rank(llm.permissions) => ceiling,
        _ => llm.permissions,
    }
}

/// Whether `level` lets a call of `category` run.
fn allows(level: Permissions, category: Category) -> bool {
    match category {
        Category::Read => true,
        Category::Write => level != Permissions::ReadOnly,
        Category::Shell => level == Permissions::Full,
    }
}

/// The run's MCP servers, as ACP names them: those the node's `mcp` lists, or all of them.
async fn mcp_servers(stage: &Stage<'_>, llm: &LlmConfig) -> Vec<McpServer> {
    let (root, files) = (
        stage.settings.work_dir.clone(),
        stage.workflow.graph.mcp_servers.clone(),
    );
    let (configs, _) = blocking(move || crate::mcp::configured_for(&root, &files)).await;
    configs
        .into_iter()
        .filter(|(name, _)| {
            llm.mcp
                .as_ref()
                .is_none_or(|wanted| wanted.iter().any(|w| w == name))
        })
        .filter_map(|(name, config)| acp_server(&name, &config))
        .collect()
}

fn acp_server(name: &str, config: &ServerConfig) -> Option<McpServer> {
    Some(match &config.endpoint {
        Endpoint::Stdio { command, env } => {
            let (program, args) = command.split_first()?;
            McpServer::Stdio(
                McpServerStdio::new(name, program)
                    .args(args.to_vec())
                    .env(env.iter().map(|(k, v)| EnvVariable::new(k, v)).collect()),
            )
        }
        Endpoint::Http { url, headers } => McpServer::Http(
            McpServerHttp::new(name, url)
                .headers(headers.iter().map(|(k, v)| HttpHeader::new(k, v)).collect()),
        ),
        // Trellis starts these in its sandbox for its own agent; the ACP agent starts its servers.
        Endpoint::Sandboxed { .. } => return None,
    })
}

/// The agent's process: its group, and a handle on its input to say `session/cancel` when the stage
/// is dropped before the conversation ends.
struct AgentProcess {
    child: tokio::process::Child,
    /// A copy of its standard input, to say `session/cancel` on.
    cancel: Option<OwnedFd>,
    /// The session to cancel, once `session/new` made one.
    session: Arc<Mutex<Option<String>>>,
    stderr: PathBuf,
    done: bool,
}

impl AgentProcess {
    fn start(command: &str, root: &Path, stage: &Stage<'_>) -> std::io::Result<Self> {
        let stderr = stage.dir.join("acp-stderr.log");
        let log = trellis_process::files::create_no_link(&stderr)?;
        // Like the coding-agent CLIs, the agent is the user's own program with the user's own
        // credentials; what it asks Trellis to do is confined (see `Served`).
        let child = tokio::process::Command::new("sh")
            .args(["-c", &format!("exec {command}")])
            .current_dir(root)
            .env(trellis_process::group::RUN_ID_VAR, stage.run_id)
            .env(trellis_process::group::STAGE_DIR_VAR, stage.dir.as_os_str())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .process_group(0)
            // Ended by `finish`, or by `Drop` after the agent was told to cancel.
            .kill_on_drop(false)
            .spawn()?;
        let cancel = child
            .stdin
            .as_ref()
            .and_then(|stdin| std::os::fd::AsFd::as_fd(stdin).try_clone_to_owned().ok());
        Ok(Self {
            child,
            cancel,
            session: Arc::default(),
            stderr,
            done: false,
        })
    }

    /// The conversation is over: the agent and everything it started are stopped.
    fn finish(&mut self) {
        self.done = true;
        self.cancel = None;
        if let Some(pid) = self.child.id() {
            trellis_process::group::kill_group(pid);
        }
    }

    /// What the agent wrote to standard error, its tail.
    #[allow(
        clippy::disallowed_methods,
        reason = "a short log read once the agent failed"
    )]
    fn stderr(&self) -> Option<String> {
        std::fs::read_to_string(&self.stderr)
            .ok()
            .map(|s| trellis_process::secrets::redact(s.trim()).into_owned())
            .filter(|s| !s.is_empty())
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // The stage was dropped mid-conversation (a timeout, the run stopped): say `session/cancel`
        // on the agent's input, give it a moment, then end its group.
        if let (Some(fd), Some(session)) = (self.cancel.take(), self.session.lock().take()) {
            let line = json!({
                "jsonrpc": "2.0", "method": "session/cancel", "params": { "sessionId": session },
            });
            let _ = writeln!(std::fs::File::from(fd), "{line}");
        }
        let pid = self.child.id();
        std::thread::spawn(move || {
            std::thread::sleep(CANCEL_GRACE);
            if let Some(pid) = pid {
                trellis_process::group::kill_group(pid);
            }
        });
    }
}

/// The stage side of the conversation: events, transcript, the answer being written.
struct Shared<'s> {
    stage: &'s Stage<'s>,
    observer: &'s StageObserver<'s>,
    /// The agent's message for the prompt under way.
    text: Mutex<String>,
    /// When each tool call started, and its title and target.
    started: Mutex<HashMap<String, (Instant, String, String)>>,
}

impl Shared<'_> {
    fn on_update(&self, update: SessionUpdate) {
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let ContentBlock::Text(text) = chunk.content {
                    let shown = trellis_process::secrets::redact(&text.text).into_owned();
                    self.stage.emitter.emit(
                        Some(&self.stage.node.id),
                        EventKind::ModelTextDelta {
                            text: shown.clone(),
                        },
                    );
                    self.text.lock().push_str(&text.text);
                }
            }
            SessionUpdate::ToolCall(call) => {
                let id = call.tool_call_id.0.to_string();
                let target = call
                    .locations
                    .first()
                    .map(|l| l.path.display().to_string())
                    .unwrap_or_default();
                let tool = tool_name(call.kind, &call.title);
                self.started
                    .lock()
                    .insert(id.clone(), (Instant::now(), tool.clone(), target.clone()));
                self.observer.on_event(AgentEvent::ToolCallStarted {
                    call_id: id,
                    tool,
                    target,
                    arguments: json!({ "title": call.title, "input": call.raw_input }),
                });
                if matches!(
                    call.status,
                    ToolCallStatus::Completed | ToolCallStatus::Failed
                ) {
                    self.tool_ended(
                        &call.tool_call_id.0,
                        call.status,
                        &content_text(&call.content),
                    );
                }
            }
            SessionUpdate::ToolCallUpdate(update) => {
                if let Some(status @ (ToolCallStatus::Completed | ToolCallStatus::Failed)) =
                    update.fields.status
                {
                    let text = update
                        .fields
                        .content
                        .as_deref()
                        .map(content_text)
                        .unwrap_or_default();
                    self.tool_ended(&update.tool_call_id.0, status, &text);
                }
            }
            SessionUpdate::Plan(plan) => {
                self.observer.note(json!({ "type": "plan", "plan": plan }));
            }
            SessionUpdate::AgentThoughtChunk(chunk) => {
                if let ContentBlock::Text(text) = chunk.content {
                    self.observer
                        .note(json!({ "type": "thought", "text": text.text }));
                }
            }
            _ => {}
        }
    }

    fn tool_ended(&self, id: &str, status: ToolCallStatus, output: &str) {
        let Some((started, tool, target)) = self.started.lock().remove(id) else {
            return;
        };
        self.observer.on_event(AgentEvent::ToolCallCompleted {
            call_id: id.to_owned(),
            tool,
            target,
            is_error: status == ToolCallStatus::Failed,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            shown_chars: output.chars().count(),
            output: output.to_owned(),
            note: None,
        });
    }
}

/// A tool call's name for events: its kind (`read`, `edit`, `execute`, ...), else its title.
fn tool_name(kind: ToolKind, title: &str) -> String {
    match serde_json::to_value(kind) {
        Ok(Value::String(kind)) if kind != "other" => kind,
        _ => title.to_owned(),
    }
}

fn content_text(content: &[ToolCallContent]) -> String {
    content
        .iter()
        .filter_map(|c| match c {
            ToolCallContent::Content(content) => match &content.content {
                ContentBlock::Text(text) => Some(text.text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What Trellis serves the agent: its working directory, its terminals, its permission level.
struct Served {
    work_dir: WorkDir,
    sandbox: Arc<Sandbox>,
    policy: Policy,
    level: Permissions,
    terminals: Mutex<HashMap<String, Arc<Terminal>>>,
    next_terminal: Mutex<u32>,
    run_id: String,
}

/// Writes `content` to the resolved `path` (shown as `shown`), creating its folder. Runs on the
/// blocking pool (`Served::write`).
fn write_file(path: &Path, shown: &str, content: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        trellis_agent::create_folders(parent, shown)?;
    }
    let mut file = trellis_agent::open_file(path, shown, true)?;
    file.set_len(0)
        .and_then(|()| file.write_all(content.as_bytes()))
        .map_err(|e| format!("cannot write `{shown}`: {e}"))
}

/// A command the agent runs: its task, and its output once it ended.
struct Terminal {
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    output: tokio::sync::watch::Receiver<Option<ToolOutput>>,
}

fn refused(message: impl Into<String>) -> agent_client_protocol::Error {
    agent_client_protocol::Error::new(agent_client_protocol::ErrorCode::INVALID_PARAMS, message)
}

impl Served {
    async fn read(&self, request: ReadTextFileRequest) -> Result<String, String> {
        let path = self.work_dir.resolve(&request.path.display().to_string())?;
        let shown = self.work_dir.relative(&path);
        let text = blocking(move || {
            let mut file = trellis_agent::open_file(&path, &shown, false)?;
            let mut text = String::new();
            std::io::Read::read_to_string(&mut file, &mut text)
                .map_err(|e| format!("cannot read `{shown}`: {e}"))?;
            Ok::<_, String>(text)
        })
        .await?;
        let start = request.line.map_or(0, |l| l.saturating_sub(1) as usize);
        if start == 0 && request.limit.is_none() {
            return Ok(text);
        }
        let limit = request.limit.map_or(usize::MAX, |l| l as usize);
        Ok(text
            .lines()
            .skip(start)
            .take(limit)
            .fold(String::new(), |mut lines, line| {
                lines.push_str(line);
                lines.push('\n');
                lines
            }))
    }

    async fn write(&self, request: WriteTextFileRequest) -> Result<(), String> {
        if !allows(self.level, Category::Write) {
            return Err(format!(
                "writing files needs permissions read-write; this agent's are {}",
                self.level
            ));
        }
        let path = self.work_dir.resolve(&request.path.display().to_string())?;
        let shown = self.work_dir.relative(&path);
        blocking(move || write_file(&path, &shown, &request.content)).await
    }

    fn create_terminal(&self, request: &CreateTerminalRequest) -> Result<String, String> {
        if !allows(self.level, Category::Shell) {
            return Err(format!(
                "running commands needs permissions full; this agent's are {}",
                self.level
            ));
        }
        let dir = match &request.cwd {
            Some(cwd) => self.work_dir.resolve(&cwd.display().to_string())?,
            None => self.work_dir.root().to_path_buf(),
        };
        let script = std::iter::once(&request.command)
            .chain(&request.args)
            .map(|word| crate::hooks::shell_quote(word))
            .collect::<Vec<_>>()
            .join(" ");
        let env: Vec<(String, String)> = request
            .env
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .chain([(
                trellis_process::group::RUN_ID_VAR.to_owned(),
                self.run_id.clone(),
            )])
            .collect();
        let (sandbox, policy) = (self.sandbox.clone(), self.policy.clone());
        let (sender, output) = tokio::sync::watch::channel(None);
        let task = tokio::spawn(async move {
            let ran = trellis_agent::shell::run(&trellis_agent::shell::ShellCommand {
                dir: &dir,
                command: &script,
                timeout: TERMINAL_TIMEOUT,
                env: &env,
                pass_env: &[],
                sandbox: &sandbox,
                policy: &policy,
            })
            .await;
            let _ = sender.send(Some(ran));
        });
        let id = {
            let mut next = self.next_terminal.lock();
            *next += 1;
            format!("term-{next}")
        };
        self.terminals.lock().insert(
            id.clone(),
            Arc::new(Terminal {
                task: Mutex::new(Some(task)),
                output,
            }),
        );
        Ok(id)
    }

    fn terminal(&self, id: &str) -> Result<Arc<Terminal>, agent_client_protocol::Error> {
        self.terminals
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| refused(format!("no terminal `{id}`")))
    }
}

impl Terminal {
    /// Its output so far (all of it once it ended) and how it ended.
    fn state(&self) -> (String, bool, Option<TerminalExitStatus>) {
        let output = self.output.borrow();
        let Some(ran) = output.as_ref() else {
            return (String::new(), false, None);
        };
        let mut text = ran.content.clone();
        let truncated = text.len() > TERMINAL_OUTPUT;
        if truncated {
            let mut cut = text.len() - TERMINAL_OUTPUT;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            text = text[cut..].to_owned();
        }
        let code = ran
            .note
            .as_deref()
            .and_then(|n| n.strip_prefix("exit "))
            .and_then(|c| c.parse::<u32>().ok());
        let mut status = TerminalExitStatus::new();
        if let Some(code) = code {
            status = status.exit_code(code);
        }
        (text, truncated, Some(status))
    }

    async fn wait(&self) -> Option<TerminalExitStatus> {
        let mut output = self.output.clone();
        let _ = output.wait_for(Option::is_some).await;
        self.state().2
    }

    fn kill(&self) {
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
    }
}

/// The conversation itself: the connection with its handlers, and the stage's turns through it.
#[allow(
    clippy::too_many_lines,
    reason = "one handler per request of the agent's that the client serves"
)]
async fn talk(
    process: &mut AgentProcess,
    shared: &Shared<'_>,
    served: &Served,
    servers: Vec<McpServer>,
    (llm, judge, prompt): (&LlmConfig, Option<&trellis_llm::Client>, String),
) -> (
    Result<Outcome, agent_client_protocol::Error>,
    Option<String>,
) {
    let (Some(stdin), Some(stdout)) = (process.child.stdin.take(), process.child.stdout.take())
    else {
        return (
            Err(agent_client_protocol::Error::internal_error()),
            process.stderr(),
        );
    };
    let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
    let session_slot = process.session.clone();
    let result = Client
        .v1()
        .name("trellis")
        .on_receive_notification(
            async |notification: SessionNotification, _cx| {
                shared.on_update(notification.update);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async |request: ReadTextFileRequest, responder, _cx| match served.read(request).await {
                Ok(content) => responder.respond(ReadTextFileResponse::new(content)),
                Err(problem) => responder.respond_with_error(refused(problem)),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async |request: WriteTextFileRequest, responder, _cx| match served.write(request).await
            {
                Ok(()) => responder.respond(WriteTextFileResponse::new()),
                Err(problem) => responder.respond_with_error(refused(problem)),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async |request: CreateTerminalRequest, responder, _cx| match served
                .create_terminal(&request)
            {
                Ok(id) => responder.respond(CreateTerminalResponse::new(id)),
                Err(problem) => responder.respond_with_error(refused(problem)),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async |request: TerminalOutputRequest, responder, _cx| {
                let terminal = match served.terminal(&request.terminal_id.0) {
                    Ok(terminal) => terminal,
                    Err(error) => return responder.respond_with_error(error),
                };
                let (output, truncated, status) = terminal.state();
                responder
                    .respond(TerminalOutputResponse::new(output, truncated).exit_status(status))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async |request: WaitForTerminalExitRequest, responder, cx| {
                let terminal = match served.terminal(&request.terminal_id.0) {
                    Ok(terminal) => terminal,
                    Err(error) => return responder.respond_with_error(error),
                };
                // Waited for off the dispatch loop: the agent's other messages go on meanwhile.
                cx.spawn(async move {
                    let status = terminal
                        .wait()
                        .await
                        .unwrap_or_else(TerminalExitStatus::new);
                    responder.respond(WaitForTerminalExitResponse::new(status))
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async |request: KillTerminalRequest, responder, _cx| match served
                .terminal(&request.terminal_id.0)
            {
                Ok(terminal) => {
                    terminal.kill();
                    responder.respond(KillTerminalResponse::new())
                }
                Err(error) => responder.respond_with_error(error),
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async |request: ReleaseTerminalRequest, responder, _cx| {
                if let Some(terminal) = served.terminals.lock().remove(&*request.terminal_id.0) {
                    terminal.kill();
                }
                responder.respond(ReleaseTerminalResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async |request: RequestPermissionRequest, responder, _cx| {
                responder.respond(permission(&request, served.level, shared.observer))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async |cx: ConnectionTo<Agent>| {
            let capabilities = ClientCapabilities::new()
                .fs(FileSystemCapabilities::new()
                    .read_text_file(true)
                    .write_text_file(true))
                .terminal(true);
            cx.send_request(
                InitializeRequest::new(ProtocolVersion::V1).client_capabilities(capabilities),
            )
            .block_task()
            .await?;
            let root = served.work_dir.root().to_path_buf();
            let session = cx
                .send_request(NewSessionRequest::new(root).mcp_servers(servers))
                .block_task()
                .await?
                .session_id;
            *session_slot.lock() = Some(session.0.to_string());
            let mut conversation = AcpConversation {
                cx: &cx,
                session,
                shared,
                root: served.work_dir.root().to_path_buf(),
                turns: 0,
            };
            // An ACP agent reports no usage, so the stage has none to add the judges' to.
            let judges = crate::checks::Judges::new(judge);
            Ok(converse(shared.stage, llm, &judges, &mut conversation, prompt).await)
        })
        .await;
    let stderr = if result.is_err() {
        process.stderr()
    } else {
        None
    };
    (result, stderr)
}

/// The answer to a permission request: the first `allow` option when the node's level allows the
/// call's kind of tool, else the first `reject` option (or cancelled, when it offers neither).
fn permission(
    request: &RequestPermissionRequest,
    level: Permissions,
    observer: &StageObserver<'_>,
) -> RequestPermissionResponse {
    let kind = request.tool_call.fields.kind.unwrap_or_default();
    let category = match kind {
        ToolKind::Read | ToolKind::Search | ToolKind::Think | ToolKind::Fetch => Category::Read,
        ToolKind::Edit | ToolKind::Delete | ToolKind::Move => Category::Write,
        _ => Category::Shell,
    };
    let allowed = allows(level, category);
    let wanted: &[PermissionOptionKind] = if allowed {
        &[
            PermissionOptionKind::AllowOnce,
            PermissionOptionKind::AllowAlways,
        ]
    } else {
        &[
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ]
    };
    let chosen = wanted.iter().find_map(|want| {
        request
            .options
            .iter()
            .find(|option| option.kind == *want)
            .map(|option| option.option_id.clone())
    });
    observer.note(json!({
        "type": "permission",
        "title": request.tool_call.fields.title,
        "kind": tool_name(kind, ""),
        "allowed": allowed,
        "level": level.to_string(),
    }));
    RequestPermissionResponse::new(match chosen {
        Some(id) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id)),
        None => RequestPermissionOutcome::Cancelled,
    })
}

/// The stage's turns: each message is a `session/prompt`; cancelling the stage says
/// `session/cancel` and waits (briefly) for the agent to end the turn.
struct AcpConversation<'c, 's> {
    cx: &'c ConnectionTo<Agent>,
    session: SessionId,
    shared: &'c Shared<'s>,
    root: PathBuf,
    turns: u32,
}

#[async_trait]
impl Conversation for AcpConversation<'_, '_> {
    fn calls(&self) -> Vec<ToolCall> {
        self.shared.observer.calls()
    }

    async fn send(&mut self, message: String) -> Result<Answer, Box<Outcome>> {
        self.turns += 1;
        let stage = self.shared.stage;
        let node = Some(stage.node.id.as_str());
        self.shared
            .observer
            .note(json!({ "type": "user", "text": message }));
        self.shared.text.lock().clear();
        stage.emitter.emit(
            node,
            EventKind::ModelCallStarted {
                model: "acp".into(),
                provider: "acp".into(),
                turn: self.turns,
            },
        );
        let started = Instant::now();
        let request = PromptRequest::new(
            self.session.clone(),
            vec![ContentBlock::Text(TextContent::new(message))],
        );
        let prompt = self.cx.send_request(request).block_task();
        tokio::pin!(prompt);
        let answered = tokio::select! {
            answered = &mut prompt => answered,
            () = stage.cancel.cancelled() => {
                let _ = self.cx.send_notification(CancelNotification::new(self.session.clone()));
                let _ = tokio::time::timeout(CANCEL_GRACE, &mut prompt).await;
                self.ended(started, Some("cancelled"));
                return Err(Box::new(Outcome::failed(
                    FailureClass::StageFailed,
                    "the stage was cancelled; the ACP agent was told (session/cancel)",
                )));
            }
        };
        let text = std::mem::take(&mut *self.shared.text.lock());
        self.shared
            .observer
            .note(json!({ "type": "assistant", "turn": self.turns, "text": text }));
        match answered {
            Ok(response) if response.stop_reason == StopReason::EndTurn => {
                self.ended(started, None);
                Ok(Answer {
                    text,
                    stop_reason: serde_json::to_value(response.stop_reason).ok(),
                })
            }
            Ok(response) => {
                let reason = serde_json::to_value(response.stop_reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "unknown".into());
                self.ended(started, Some(&reason));
                Err(Box::new(Outcome::failed(
                    FailureClass::StageFailed,
                    format!("the ACP agent stopped without finishing its turn: {reason}"),
                )))
            }
            Err(error) => {
                self.ended(started, Some(&error.to_string()));
                Err(Box::new(Outcome::failed(
                    FailureClass::StageFailed,
                    format!("the ACP agent's prompt failed: {error}"),
                )))
            }
        }
    }

    fn root(&self) -> &Path {
        &self.root
    }

    fn last_touched(&self) -> Option<String> {
        None
    }
}

impl AcpConversation<'_, '_> {
    fn ended(&self, started: Instant, error: Option<&str>) {
        self.shared.stage.emitter.emit(
            Some(&self.shared.stage.node.id),
            EventKind::ModelCallCompleted(ModelCallEnd {
                model: "acp".into(),
                provider: "acp".into(),
                turn: self.turns,
                duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                usage: None,
                stop_reason: None,
                error: error.map(str::to_owned),
                kind: error.map(|_| "acp".to_owned()),
            }),
        );
    }
}
