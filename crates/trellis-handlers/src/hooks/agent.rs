//! Agent hooks (Fabro's `type = "agent"`): a session with the built-in tools — reading, writing and
//! searching files, and `shell` in the run's sandbox — in the run's working directory, that looks
//! into what its instructions ask and answers `{"ok": true}` or `{"ok": false, "reason": ...}`.
//! Like a prompt hook it fails open: a model error, its timeout, `max_tool_rounds` used up, a loop
//! it would not leave, or an answer that is no decision proceeds. What it did is kept beside the hook's context file, as
//! `NNNN-<event>.agent.jsonl` (one line per turn, text and tool call, known secrets redacted).

use std::fmt::Write as _;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::{Value, json};
use trellis_agent::{AgentEvent, Observer, Session, Stop, Toolbox, WorkDir};
use trellis_llm::{Client, ErrorKind, LlmError, Request, ResolvedModel, Response, ToolChoice};
use trellis_process::sandbox::Policy;

use super::{HookRun, Ran};

/// Rounds of tool calls an agent hook may make before it gives up (Fabro's default).
pub(super) const DEFAULT_ROUNDS: u32 = 50;

/// What every agent hook is told first.
const SYSTEM: &str = "You check one point of a workflow run before it goes on. You have tools to \
look at the working directory and run commands in it: use them to find out what the instructions \
ask. Then answer with JSON only: {\"ok\": true} to let the run go on, or {\"ok\": false, \
\"reason\": \"...\"} to stop it, the reason saying what you found.";

/// Added for a model that must call a tool every turn (the local model): how it calls one, and
/// how it answers.
const ANSWER_BY_FINISH: &str = "Answer every time with one JSON object and nothing else: a short \
thought, then the name and arguments of one tool to call. The tool's result comes back in the next \
message. As soon as you know the answer, call finish with the decision as its summary, for \
example:\n{\"thought\": \"The file says a test failed.\", \"name\": \"finish\", \"arguments\": \
{\"summary\": \"{\\\"ok\\\": false, \\\"reason\\\": \\\"a test failed\\\"}\"}}";

/// Output tokens a turn may take.
const TURN_TOKENS: u32 = 4096;

/// The hook's model calls, made as they are: no retries beyond the client's own.
struct HookModel<'a> {
    client: &'a Client,
    resolved: ResolvedModel,
}

#[async_trait]
impl trellis_agent::Model for HookModel<'_> {
    type Error = LlmError;

    async fn ask(&mut self, request: &Request) -> Result<Response, LlmError> {
        self.client
            .complete(&self.resolved, request, &|_| {}, &|_, _, _| {})
            .await
    }

    fn overflowed(&self, error: &LlmError) -> bool {
        error.kind == ErrorKind::ContextLength
    }
}

/// The session's turns, text and tool calls, as transcript lines.
#[derive(Default)]
struct Transcript(Mutex<Vec<Value>>);

impl Observer for Transcript {
    fn on_event(&self, event: AgentEvent) {
        let entry = match event {
            AgentEvent::TurnStarted { turn } => json!({ "type": "turn", "turn": turn }),
            AgentEvent::Text { text, .. } => json!({ "type": "text", "text": text }),
            AgentEvent::ToolCallCompleted {
                tool,
                target,
                is_error,
                output,
                ..
            } => json!({
                "type": "tool", "tool": tool, "target": target, "is_error": is_error,
                "output": output,
            }),
            AgentEvent::Reminded { text, .. } => json!({ "type": "reminded", "text": text }),
            AgentEvent::Error { message } => json!({ "type": "error", "message": message }),
            _ => return,
        };
        self.0.lock().push(entry);
    }
}

impl HookRun {
    /// Runs the agent: at most `rounds` rounds of tool calls, then its answer, within the hook's
    /// timeout.
    pub(super) async fn agent(&self, prompt: &str, model: Option<&str>, rounds: u32) -> Ran {
        let (client, resolved) = match self.model(model) {
            Ok(asked) => asked,
            Err(open) => return open,
        };
        let work_dir = match self.work_dir().await {
            Ok(work_dir) => work_dir,
            Err(e) => return Ran::open(format!("the working directory cannot be used: {e}")),
        };
        // No rounds of calls: no tools, only the answer.
        let mut toolbox = Toolbox::new(work_dir, (rounds == 0).then_some(&[][..]), &[]);
        toolbox.sandbox = (self.setting.sandbox.clone(), Policy::default());
        toolbox.shell_env = vec![
            (
                trellis_process::group::RUN_ID_VAR.into(),
                self.setting.run_id.clone(),
            ),
            ("FABRO_EVENT".into(), self.hook.event.as_str().into()),
        ];
        // The local model's answers are held to one tool call each: it ends by calling `finish`.
        let local = resolved.provider == "local";
        let system = if local {
            format!("{SYSTEM}\n\n{ANSWER_BY_FINISH}")
        } else {
            SYSTEM.to_owned()
        };
        let settings = trellis_agent::Settings {
            template: Request {
                max_tokens: Some(TURN_TOKENS),
                tool_choice: if local {
                    ToolChoice::Required
                } else {
                    ToolChoice::Auto
                },
                ..Request::default()
            },
            context_window: client.context_window(&resolved).map(u64::from),
            greedy: local,
            ..trellis_agent::Settings::default()
        };
        let mut session = Session::new(toolbox, Some(system), Vec::new(), settings);
        // Each round of calls is a turn, and the answer one more.
        session.limit_turns(Some(rounds.saturating_add(1)));
        let transcript = Transcript::default();
        let mut model = HookModel { client, resolved };
        let sent = tokio::time::timeout(
            self.hook.timeout,
            session.send(&mut model, &transcript, self.instructions(prompt)),
        )
        .await;
        self.keep_transcript(transcript).await;
        match sent {
            Ok(Ok(response)) => super::verdict(&response.text),
            Ok(Err(Stop::Model(e))) => Ran::open(e.to_string()),
            Ok(Err(Stop::MaxTurns { .. })) => Ran::open(format!(
                "used up `max_tool_rounds` ({rounds}) without answering"
            )),
            Ok(Err(Stop::Looping { warnings, .. })) => Ran::open(format!(
                "stopped: it kept repeating its calls after {warnings} warnings"
            )),
            Err(_) => Ran::open("timed out".into()),
        }
    }

    /// The run's working directory for the agent's tools: the run's record readable too (what
    /// the stages wrote), the runs directory left out of its walks.
    async fn work_dir(&self) -> std::io::Result<WorkDir> {
        let (dir, hooks) = (self.setting.work_dir.clone(), self.setting.dir.clone());
        trellis_process::task::blocking(move || {
            let mut work_dir = WorkDir::new(&dir)?;
            if let Some(record) = hooks.parent() {
                work_dir = work_dir.with_readable(record);
                if let Some(runs) = record.parent() {
                    work_dir = work_dir.with_unwalked(runs);
                }
            }
            Ok(work_dir)
        })
        .await
    }

    /// Writes what the agent did beside the hook's context file.
    async fn keep_transcript(&self, transcript: Transcript) {
        let mut lines = String::new();
        for entry in transcript.0.into_inner() {
            let _ = writeln!(lines, "{entry}");
        }
        let text = trellis_process::secrets::redact(&lines).into_owned();
        let _ = self.keep(".agent.jsonl", text).await;
    }
}
