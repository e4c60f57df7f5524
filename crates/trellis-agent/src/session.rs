//! The agent loop. A [`Session`] holds one live conversation: the system prompt, the history, the
//! tools. [`Session::send`] adds a user message and runs turns — ask the model, run every tool call it
//! makes, send the results back — until the model answers without calling a tool (or, when every
//! answer must call one, calls `finish`), the turn limit is reached, or the model call fails. Tool calls of one turn that only read run concurrently. After each
//! assistant turn the session checks its size and compacts itself (see [`crate::compaction`]). What
//! happens is reported to an [`Observer`] as [`AgentEvent`]s; the model is reached through the [`Model`]
//! seam, so the caller decides how calls are made, reported and retried.

use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Value, json};
use trellis_llm::{
    Message, Part, Request, Response, Role, StopReason, ToolCall, ToolChoice, ToolDef, ToolResult,
};

use crate::compaction;
use crate::loop_detector::{LoopDetector, Repeat, SameFailure};
use crate::tools::{Tool, ToolOutput, Toolbox};

/// How the session reaches its model: one call, made and reported by the caller.
#[async_trait]
pub trait Model: Send {
    type Error: Send;
    async fn ask(&mut self, request: &Request) -> Result<Response, Self::Error>;

    /// Whether `error`, from this model's last call, says the request did not fit the model's
    /// context window.
    fn overflowed(&self, _error: &Self::Error) -> bool {
        false
    }
}

/// What the session reports while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    TurnStarted {
        turn: u32,
    },
    /// A turn's answer came: the tokens it took (the input's cached part included).
    TurnAnswered {
        turn: u32,
        usage: trellis_llm::Usage,
    },
    /// The text of an assistant turn.
    Text {
        turn: u32,
        text: String,
    },
    ToolCallStarted {
        call_id: String,
        tool: String,
        /// The path, command or pattern, for one-line displays.
        target: String,
        arguments: Value,
    },
    ToolCallCompleted {
        call_id: String,
        tool: String,
        target: String,
        is_error: bool,
        duration_ms: u64,
        /// The whole output; `shown_chars` of it (after cutting) reached the model.
        output: String,
        shown_chars: usize,
        note: Option<String>,
    },
    LoopDetected {
        period: usize,
        tools: Vec<String>,
    },
    /// A call beyond the agent's permissions was put to a person.
    ApprovalAsked {
        prompt: String,
        options: Vec<String>,
    },
    /// The answer (`asked` false when nobody could answer, which is a no).
    ApprovalAnswered {
        label: String,
        asked: bool,
    },
    /// The session answered the model itself before its next turn: an answer cut short at the
    /// output limit is met with a request to answer again, shorter; a coached model's answer that
    /// did nothing (`NOTHING_DONE`), with a reminder of how to save a file; its `finish` before it
    /// did anything (`NOT_FINISHED`) or checked its change (`UNCHECKED`), with what to do first.
    Reminded {
        turn: u32,
        text: String,
    },
    /// A steering message reached the model's next request.
    Steered {
        turn: u32,
        text: String,
    },
    ContextWindowWarning {
        estimated_tokens: u64,
        context_window_size: u64,
        usage_percent: u64,
    },
    CompactionStarted {
        estimated_tokens: u64,
        context_window_size: u64,
    },
    CompactionCompleted {
        original_turn_count: usize,
        preserved_turn_count: usize,
        summary_token_estimate: u64,
        tracked_file_count: usize,
        /// The summary that replaced the older turns, as the model wrote it.
        summary: String,
    },
    Error {
        message: String,
    },
}

pub trait Observer: Send + Sync {
    fn on_event(&self, event: AgentEvent);
}

/// Messages a person sends the agent while it works (steering), taken before each model call.
#[async_trait]
pub trait Inbox: Send + Sync {
    /// The messages sent since the last look, oldest first.
    async fn take(&self) -> Vec<String>;

    /// What each message is introduced with: who sent it.
    fn prefix(&self) -> &'static str {
        STEERING_PREFIX
    }
}

/// Decides whether a tool call outside the agent's permissions may run (asking a person, where one
/// can answer), or whether the run's hooks let it; called for every call before it runs, and told
/// when it ran.
#[async_trait]
pub trait Approver: Send + Sync {
    /// `Err` with the reason the model is told when the call may not run.
    async fn approve(
        &self,
        call: &ToolCall,
        category: crate::tools::Category,
        observer: &dyn Observer,
    ) -> Result<(), String>;

    /// Told about a call it approved once it has run, before the model is shown `output`.
    async fn ran(&self, _call: &ToolCall, _output: &ToolOutput) {}
}

/// How a steering message reads to the model.
pub const STEERING_PREFIX: &str =
    "Message from the person running this workflow (take it into account now): ";

/// Why a session stopped without a final answer.
#[derive(Debug)]
pub enum Stop<E> {
    /// The model call failed (after the caller's retries).
    Model(E),
    /// `max_turns` turns were used; the text of the last one.
    MaxTurns { turns: u32, last_text: String },
    /// The model kept looping after `LOOP_WARNINGS` warnings.
    Looping { warnings: u32, last_text: String },
}

/// Loop warnings a stage's model may ignore before the session gives up on it: a model that repeats
/// itself after being told three times will not stop by itself.
pub const LOOP_WARNINGS: u32 = 3;

/// The request settings every turn shares.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Copied into every request: model, max tokens, reasoning effort, temperature.
    pub template: Request,
    /// The model's context window in tokens, when known; compaction needs it.
    pub context_window: Option<u64>,
    /// The model decodes greedily unless a request names a temperature (the local model): the same
    /// conversation gets the same answer, so a turn after a loop warning or a cut answer is sampled
    /// instead (at 0.7).
    pub greedy: bool,
    /// The model is small (the local model), and is coached: a turn's calls after one that writes
    /// or runs something are not run (they were written blind to its result), a command that
    /// succeeds after a file was written says to finish if the task is done (`DONE_HINT`), and a
    /// final answer that called no tool, or holds code when no file was written, is met once with
    /// a request to act (`NOTHING_DONE`). When it must call a tool every turn, `finish` is refused
    /// once when nothing has run since the user's message (`NOT_FINISHED`) and once after each
    /// change no command has succeeded since (`UNCHECKED`).
    pub coach: bool,
    /// The model's first answer in a new session is text that writes every file it creates or
    /// changes whole — its path alone on a line, then its content in a fenced block, as the
    /// prompt shows — and calls no tool. Those files are written as `write_file` calls (their
    /// refusals kept: a test the task says not to change), their results sent back with this
    /// text: how to go on, with the tools. A small model writes a whole file far better as a
    /// block than as a JSON string, and at once, before a course of small edits goes astray
    /// (docs/agent-tasks.md).
    pub draft: Option<String>,
}

/// Answers cut short at the output limit in a row that are answered with a request to answer
/// again, shorter; the next is taken as it is.
const CUT_ANSWERS: u32 = 2;

/// What an answer cut short at the output limit is answered with: answer again, shorter — a long
/// file written in parts when `edit_file` can add the rest.
fn cut_request(limit: Option<u32>, in_parts: bool) -> String {
    let limit = limit.map(|l| format!(" ({l} tokens)")).unwrap_or_default();
    let parts = if in_parts {
        ": write a long file in parts (write_file the beginning, then edit_file to add the rest)"
    } else {
        ""
    };
    format!(
        "Your answer was cut off at the output limit{limit} before it ended. Answer again, \
         shorter{parts}."
    )
}

/// What a coached model's final answer is met with when no tool ran since the user's message, or
/// it holds code and no file was written: small models answer with a file's new content, or say
/// they wrote a file, instead of calling a tool.
pub const NOTHING_DONE: &str = "Nothing has been written to a file yet: code in an answer is not \
saved anywhere. To save a file, put the file's path alone on the line just before its code block \
(the whole file), or call write_file with its path and its whole new content; then run the check \
with shell. If the task needs no file and no command, repeat your answer.";

/// What a coached model's call is answered with when an earlier call of the same answer wrote or
/// ran something.
pub const ONE_CHANGE_AT_A_TIME: &str = "Not run: it came after a call that changes things, in \
the same answer, so it was written before that call's result was known. Look at that result \
first; call this again if it is still needed.";

/// Added to a coached model's result of a command that succeeded after a file was written; how
/// the model ends the task ([`Session::finishing`]) goes at the end.
pub const DONE_HINT: &str = "The command succeeded. If that shows the task is done, ";

/// What the example block of a first answer ([`Settings::draft`]) holds: a block that holds only
/// this (the example copied) is not written.
pub const WHOLE_CONTENT: &str = "the file's whole new content";

/// What a model's first answer is followed by when it held code blocks but wrote no file
/// ([`Settings::draft`]).
pub const NOTHING_DRAFTED: &str = "No file was written: a block is written only when the line \
                                   before it is the file's path alone. ";

/// Why a coached model's `finish` is refused, once, when its first answer held code blocks but
/// wrote no file and no file has been written since: the model went on to run the file as it was,
/// and finished on nothing done.
pub const NOT_CHANGED: &str = "Not finished: no file has been changed yet — the code in your first \
                                answer was not written. Write it into the file with write_file or \
                                edit_file, and check it. If the task needs no change, call finish \
                                again.";

/// What a coached model is told after it read back the file it last wrote, before how to finish:
/// a read-back is the check of a file the task asks for (a summary, a config), and without this
/// the model went on changing it.
pub const READ_BACK_HINT: &str = "That is the file as you wrote it. If it is what the task asks \
                                  for, ";

/// The tool a model that must call a tool every turn ([`ToolChoice::Required`]) ends the session
/// with: its summary is the session's answer.
pub const FINISH: &str = "finish";

/// The `finish` tool as the model sees it.
fn finish_definition() -> ToolDef {
    ToolDef {
        name: FINISH.to_owned(),
        description: "End the task once it is done and checked. Give a one-sentence summary of \
                      what you did."
            .to_owned(),
        parameters: json!({
            "type": "object",
            "properties": { "summary": { "type": "string" } },
            "required": ["summary"],
        }),
    }
}

/// What a coached model's `finish` is answered with when no tool ran since the user's message.
pub const NOT_FINISHED: &str = "Not finished: nothing has been done yet. Do the task with the \
tools first: write_file to save a file (its whole new content), shell to run a command or the \
check. If the task needs no file and no command, call finish again.";

/// What `finish` is answered with when the same answer calls other tools too.
const FINISH_ALONE: &str = "Not finished: call finish alone, once the results of your other \
calls show the task is done.";

/// What a coached model's `finish` is answered with, once, when a file was written since a command
/// last succeeded: a small model takes having written a file for having done the task.
pub const UNCHECKED: &str = "Not finished: nothing has checked your last change yet. Run the \
command that shows the task works with shell (the tests, or the program or script the task \
names); call finish once it succeeds.";

/// What a coached model's `finish` is answered with, once, when the last command run after its
/// last change failed: a small model takes having run the check for having passed it.
fn failed_check(command: &str) -> String {
    let command = short_command(command);
    format!(
        "Not finished: `{command}` failed after your last change. Read what it reported, fix \
         that, and run it again; call finish once it succeeds. If it was meant to fail, call \
         finish again."
    )
}

/// A command as the model is reminded of it: the start of its first line.
fn short_command(command: &str) -> String {
    const SHOWN: usize = 80;
    let command = command.trim();
    let first = command.lines().next().unwrap_or_default().trim_end();
    match first.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", &first[..end]),
        None if first.len() < command.len() => format!("{first}…"),
        None => first.to_owned(),
    }
}

/// What a coached model's `finish` is answered with, once, when a file its task names, which did
/// not exist when the task came, still does not: a small model takes having run a command for having
/// done the task.
fn missing_file(path: &str) -> String {
    format!(
        "Not finished: the task names `{path}`, and there is no such file yet. Create it with \
         write_file, then check it; if the task does not need it, call finish again."
    )
}

/// What a coached model that repeats itself is told beside the loop warning while a file its task
/// names is still missing: a small model that did the work another way (with commands instead of
/// the script it was asked for) goes round checking it.
fn still_missing_hint(path: &str) -> String {
    format!(
        "Still to do: the task names `{path}`, and there is no such file yet. Create it with \
         write_file."
    )
}

/// What a coached model's `finish` is answered with, once, when a number its task names (a port, a
/// limit) is in none of the files the task names, as when it came: a small model asked for two
/// changes makes one.
fn missing_value(value: &str) -> String {
    format!(
        "Not finished: the task names {value}, and no file it names holds {value} yet. Make that \
         part of the task too, then check it; if the task needs no {value} in a file, call finish \
         again."
    )
}

/// The temperature of a greedy model's turn after a loop warning or a cut answer: asked the same
/// way, it would answer the same way again.
pub const UNSTICK_TEMPERATURE: f32 = 0.7;

/// What a session did lately: what coaching a small model looks at.
#[derive(Debug, Default)]
struct Lately {
    /// A call ran since the user's last message.
    ran_since_user: bool,
    /// A file was written since the user's last message.
    wrote_since_user: bool,
    /// The first answer held code blocks but wrote no file, until `finish` was refused once for
    /// it ([`NOT_CHANGED`]).
    drafted_nothing: bool,
    /// Whether a file was written since a command last succeeded.
    check: Check,
    /// The command of the last `shell` call, when it failed after a change no command has checked
    /// yet, until `finish` was refused once for it ([`failed_check`]).
    failed: Option<String>,
    /// The files the user's last message names that did not exist when it came, until `finish`
    /// was refused once for one still missing ([`missing_file`]).
    wanted: Vec<String>,
    /// The numbers the user's last message names that none of the files it names held when it
    /// came, until `finish` was refused once for one still missing ([`missing_value`]).
    values: Vec<String>,
    /// The words of the user's last message, as [`Session::set_task`] took them.
    task: String,
}

/// Whether the session's changes were checked: a file written since a command last succeeded (or
/// the file was read back) is a check due, asked for once when the model would finish without it
/// ([`UNCHECKED`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Nothing was written since a command last succeeded.
    #[default]
    Done,
    Due,
    Asked,
}

pub struct Session {
    /// The next turn's request: the system prompt, the history so far, the tools and the settings.
    /// Turns add to its messages in place.
    request: Request,
    context_window: Option<u64>,
    toolbox: Toolbox,
    detector: LoopDetector,
    /// Files written or edited without error, in the order first touched.
    files: Vec<String>,
    last_touched: Option<String>,
    turns: u32,
    max_turns: Option<u32>,
    /// Loops detected since the last [`Session::limit_turns`].
    loops: u32,
    /// Whether the model is coached ([`Settings::coach`]).
    coach: bool,
    /// What follows the first answer, while it is still to come ([`Settings::draft`]).
    draft: Option<String>,
    /// What the session did lately, for coaching.
    lately: Lately,
    /// The template's temperature, and whether the model decodes greedily without one.
    temperature: (Option<f32>, bool),
    /// The input tokens the provider counted in the last request, and how many messages it held:
    /// what the next request measures from.
    measured: Option<(u64, usize)>,
    /// Where steering messages come from, when the stage takes them.
    inbox: Option<Box<dyn Inbox>>,
    /// Who allows calls outside the agent's permissions; every call runs when none is set.
    approver: Option<Box<dyn Approver>>,
}

impl Session {
    /// A session continuing `history` (empty for a new one).
    pub fn new(
        toolbox: Toolbox,
        system: Option<String>,
        history: Vec<Message>,
        settings: Settings,
    ) -> Self {
        toolbox.remember(&history);
        let history_was_empty = history.is_empty();
        let mut tools = toolbox.definitions();
        if settings.template.tool_choice == ToolChoice::Required {
            tools.push(finish_definition());
        }
        Self {
            request: Request {
                system,
                messages: history,
                tools,
                // Each turn's request is the last one and what came since: worth caching.
                cache_prompt: true,
                ..settings.template
            },
            context_window: settings.context_window,
            toolbox,
            detector: LoopDetector::default(),
            files: Vec::new(),
            last_touched: None,
            turns: 0,
            max_turns: None,
            loops: 0,
            coach: settings.coach,
            draft: settings.draft.filter(|_| history_was_empty),
            lately: Lately::default(),
            temperature: (settings.template.temperature, settings.greedy),
            measured: None,
            inbox: None,
            approver: None,
        }
    }

    /// Gives what the system prompt says about this session alone, sent after the shared part and
    /// the tools ([`Request::system_session`]).
    pub fn set_system_session(&mut self, text: Option<String>) {
        self.request.system_session = text;
    }

    /// What the system prompt says about this session alone ([`Self::set_system_session`]).
    pub fn system_session(&self) -> Option<&str> {
        self.request.system_session.as_deref()
    }

    /// Asks `approver` before every tool call from now on.
    pub fn set_approver(&mut self, approver: Box<dyn Approver>) {
        self.approver = Some(approver);
    }

    /// Takes steering messages from `inbox` before every model call from now on.
    pub fn set_inbox(&mut self, inbox: Box<dyn Inbox>) {
        self.inbox = Some(inbox);
    }

    /// Adds the steering messages sent since the last turn to the request about to go out: to the
    /// user message it ends with (the prompt, or the tool results), or as one of their own.
    async fn deliver_steering(&mut self, observer: &dyn Observer) {
        let Some(inbox) = &self.inbox else {
            return;
        };
        for text in inbox.take().await {
            let part = Part::Text {
                text: format!("{}{text}", inbox.prefix()),
            };
            match self.request.messages.last_mut() {
                Some(last) if last.role == Role::User => last.parts.push(part),
                _ => self.request.messages.push(Message {
                    role: Role::User,
                    parts: vec![part],
                }),
            }
            observer.on_event(AgentEvent::Steered {
                turn: self.turns,
                text,
            });
        }
    }

    /// At most `max` more turns (none: unlimited); the count starts again.
    pub fn limit_turns(&mut self, max: Option<u32>) {
        self.turns = 0;
        self.loops = 0;
        self.max_turns = max;
    }

    /// The conversation so far.
    pub fn history(&self) -> &[Message] {
        &self.request.messages
    }

    /// The conversation, for a thread to continue.
    pub fn into_history(self) -> Vec<Message> {
        self.request.messages
    }

    /// Files written or edited without error.
    pub fn files_touched(&self) -> &[String] {
        &self.files
    }

    /// The file most recently written or edited without error.
    pub fn last_touched(&self) -> Option<&str> {
        self.last_touched.as_deref()
    }

    pub fn toolbox(&self) -> &Toolbox {
        &self.toolbox
    }

    /// Takes `task` (what the user's next message asks, without the files it shows or the earlier
    /// output it quotes) for what the model is to do. For a coached model: its `finish` is refused
    /// once while a file the task names that does not exist now still does not (`Not finished: the
    /// task names …`), and the writing tools keep what the task does not ask to change: the tests
    /// when it says so, the names other files use ([`Toolbox::keep_for`]).
    pub async fn set_task(&mut self, task: &str) {
        if self.coach {
            self.toolbox.keep_for(task);
        }
        if self.coach && self.must_call() {
            self.lately.wanted = self.toolbox.missing_files(task).await;
            self.lately.values = self.toolbox.missing_values(task).await;
            task.clone_into(&mut self.lately.task);
        }
    }

    /// Sends `text` as the user and runs turns until the model answers without calling a tool.
    pub async fn send<M: Model>(
        &mut self,
        model: &mut M,
        observer: &dyn Observer,
        text: String,
    ) -> Result<Response, Stop<M::Error>> {
        self.request.messages.push(Message::user(text));
        let mut last_text = String::new();
        let mut cut = 0;
        let mut nudged = false;
        self.lately.ran_since_user = false;
        self.lately.wrote_since_user = false;
        if let Some(then) = self.draft.take() {
            self.draft(model, observer, then, &mut last_text).await?;
        }
        loop {
            if let Some(max) = self.max_turns
                && self.turns >= max
            {
                return Err(Stop::MaxTurns {
                    turns: self.turns,
                    last_text,
                });
            }
            let response = self.turn(model, observer, &mut last_text).await?;
            self.request.messages.push(assistant_message(&response));
            let refused = match self.finish(&response, &mut nudged).await {
                Some(Ok(finished)) => return Ok(finished),
                Some(Err(refused)) => Some(refused),
                None => None,
            };
            if let Some(Part::ToolResult(result)) = &refused
                && response.tool_calls.len() == 1
            {
                observer.on_event(AgentEvent::Reminded {
                    turn: self.turns,
                    text: result.content.clone(),
                });
                self.request.messages.push(Message {
                    role: Role::User,
                    parts: refused.into_iter().collect(),
                });
                self.unstick(true);
                continue;
            }
            if response.tool_calls.is_empty() {
                let reminder = if response.stop_reason == StopReason::MaxTokens && cut < CUT_ANSWERS
                {
                    cut += 1;
                    cut_request(self.request.max_tokens, self.toolbox.offers(Tool::EditFile))
                } else if self.coach
                    && !nudged
                    && !self.lately.wrote_since_user
                    && (!self.lately.ran_since_user || response.text.contains("```"))
                {
                    nudged = true;
                    NOTHING_DONE.to_owned()
                } else {
                    return Ok(response);
                };
                observer.on_event(AgentEvent::Reminded {
                    turn: self.turns,
                    text: reminder.clone(),
                });
                self.request.messages.push(Message::user(reminder));
                self.unstick(true);
                continue;
            }
            cut = 0;
            let warnings = self.loops;
            let calls: Vec<ToolCall> = response
                .tool_calls
                .iter()
                .filter(|c| refused.is_none() || c.name != FINISH)
                .cloned()
                .collect();
            let mut parts = self.run_tools(&calls, observer, self.coach).await;
            parts.extend(refused);
            self.request.messages.push(Message {
                role: Role::User,
                parts,
            });
            self.unstick(self.loops > warnings);
            if self.loops >= LOOP_WARNINGS {
                return Err(Stop::Looping {
                    warnings: self.loops,
                    last_text,
                });
            }
        }
    }

    /// One turn's answer: steering delivered and the history compacted before the request, the
    /// turn's events around it; its text kept in `last_text`.
    async fn turn<M: Model>(
        &mut self,
        model: &mut M,
        observer: &dyn Observer,
        last_text: &mut String,
    ) -> Result<Response, Stop<M::Error>> {
        self.turns += 1;
        observer.on_event(AgentEvent::TurnStarted { turn: self.turns });
        self.deliver_steering(observer).await;
        self.compact_if_needed(model, observer).await;
        let response = self.ask(model, observer).await?;
        observer.on_event(AgentEvent::TurnAnswered {
            turn: self.turns,
            usage: response.usage,
        });
        if !response.text.is_empty() {
            last_text.clone_from(&response.text);
            observer.on_event(AgentEvent::Text {
                turn: self.turns,
                text: response.text.clone(),
            });
        }
        Ok(response)
    }

    /// The first answer of a new session ([`Settings::draft`]): text, no call; the files it writes
    /// whole are written, and their results sent back with `then`.
    async fn draft<M: Model>(
        &mut self,
        model: &mut M,
        observer: &dyn Observer,
        then: String,
        last_text: &mut String,
    ) -> Result<(), Stop<M::Error>> {
        let choice = std::mem::replace(&mut self.request.tool_choice, ToolChoice::None);
        let response = self.turn(model, observer, last_text).await;
        self.request.tool_choice = choice;
        let response = response?;
        let calls = drafted_files(&response.text, &self.toolbox).await;
        let mut answer = assistant_message(&response);
        answer
            .parts
            .extend(calls.iter().cloned().map(Part::ToolCall));
        self.request.messages.push(answer);
        let mut parts = self.run_tools(&calls, observer, false).await;
        let then = if calls.is_empty() && response.text.contains("```") {
            self.lately.drafted_nothing = true;
            format!("{NOTHING_DRAFTED}{then}")
        } else {
            then
        };
        parts.push(Part::Text { text: then });
        self.request.messages.push(Message {
            role: Role::User,
            parts,
        });
        Ok(())
    }

    /// A `finish` call in `response`, answered. Alone, it ends the session with its summary as
    /// the answer (`Ok`) — unless the model is coached, ran nothing since the user's message and
    /// was not told so yet ([`NOT_FINISHED`]), a file the task names is still missing
    /// ([`missing_file`], once) or its last change is unchecked ([`UNCHECKED`], once); beside other
    /// calls it is refused ([`FINISH_ALONE`]). A refusal is the call's result part (`Err`), for the
    /// caller to send back.
    async fn finish(
        &mut self,
        response: &Response,
        nudged: &mut bool,
    ) -> Option<Result<Response, Part>> {
        if !self.must_call() {
            return None;
        }
        let call = response.tool_calls.iter().find(|c| c.name == FINISH)?;
        let refusal = if response.tool_calls.len() > 1 {
            Some(FINISH_ALONE.to_owned())
        } else if self.coach && !*nudged && !self.lately.ran_since_user {
            *nudged = true;
            Some(NOT_FINISHED.to_owned())
        } else if self.coach
            && std::mem::take(&mut self.lately.drafted_nothing)
            && self.files.is_empty()
        {
            Some(NOT_CHANGED.to_owned())
        } else if let Some(missing) = self.still_missing().await {
            Some(missing_file(&missing))
        } else if let Some(value) = self.value_still_missing().await {
            Some(missing_value(&value))
        } else if self.coach
            && let Some(command) = self.lately.failed.take()
        {
            self.lately.check = Check::Asked;
            Some(failed_check(&command))
        } else if self.coach && self.lately.check == Check::Due {
            self.lately.check = Check::Asked;
            Some(UNCHECKED.to_owned())
        } else {
            None
        };
        let result = |content: &str, is_error| {
            Part::ToolResult(ToolResult {
                call_id: call.id.clone(),
                name: FINISH.to_owned(),
                content: content.to_owned(),
                is_error,
            })
        };
        if let Some(refusal) = refusal {
            return Some(Err(result(&refusal, true)));
        }
        // The call is answered, so a thread that goes on continues a well-formed history.
        self.request.messages.push(Message {
            role: Role::User,
            parts: vec![result("Finished.", false)],
        });
        let summary = call.arguments["summary"].as_str().unwrap_or_default();
        Some(Ok(Response {
            text: summary.to_owned(),
            tool_calls: Vec::new(),
            stop_reason: StopReason::EndTurn,
            ..response.clone()
        }))
    }

    /// The first of the files the task names that is still missing, asked for once: the files
    /// wanted are forgotten once one is.
    async fn still_missing(&mut self) -> Option<String> {
        let wanted = std::mem::take(&mut self.lately.wanted);
        if wanted.is_empty() {
            return None;
        }
        let missing = self.toolbox.missing_files(&wanted.join(" ")).await;
        if missing.is_empty() {
            // Not asked yet: a file created and removed again is asked for later.
            self.lately.wanted = wanted;
        }
        missing.into_iter().next()
    }

    /// For a coached model going round in circles, the first of the files the task names that is
    /// still missing: often what it has left undone. Unlike [`Session::still_missing`], asking
    /// keeps the files wanted, so `finish` still asks for one once.
    async fn missing_while_looping(&self) -> Option<String> {
        if !self.coach || self.lately.wanted.is_empty() {
            return None;
        }
        let wanted = self.lately.wanted.join(" ");
        self.toolbox.missing_files(&wanted).await.into_iter().next()
    }

    /// The first of the numbers the task names that the files it names still do not hold, asked
    /// for once: the numbers wanted are forgotten then.
    async fn value_still_missing(&mut self) -> Option<String> {
        let wanted = std::mem::take(&mut self.lately.values);
        if wanted.is_empty() {
            return None;
        }
        let missing = self.toolbox.missing_values(&self.lately.task).await;
        wanted.into_iter().find(|value| missing.contains(value))
    }

    /// How the model ends the task, as the session's messages to it say it.
    /// Whether every answer must call a tool ([`ToolChoice::Required`]).
    fn must_call(&self) -> bool {
        self.request.tool_choice == ToolChoice::Required
    }

    fn finishing(&self) -> &'static str {
        if self.must_call() {
            "call finish now with a short summary"
        } else {
            "answer now with a short summary, without calling a tool"
        }
    }

    /// Sets the next turn's temperature: a greedy model that just got stuck (warned of a loop, or
    /// cut off at the output limit) is sampled for one turn, since asked the same way it would
    /// answer the same way; otherwise the template's holds.
    fn unstick(&mut self, stuck: bool) {
        self.request.temperature = match self.temperature {
            (None, true) if stuck => Some(UNSTICK_TEMPERATURE),
            (template, _) => template,
        };
    }

    /// Sends the request as it stands (a required call narrowed to what can work now:
    /// [`Toolbox::narrowed`]). An answer that it did not fit the model's context window
    /// compacts the history and sends it again, for as long as compaction can make it smaller.
    async fn ask<M: Model>(
        &mut self,
        model: &mut M,
        observer: &dyn Observer,
    ) -> Result<Response, Stop<M::Error>> {
        if self.must_call() {
            self.request.narrowed = self.toolbox.narrowed().await;
        }
        let mut preserved = compaction::PRESERVED_TURNS;
        loop {
            match model.ask(&self.request).await {
                Ok(response) => {
                    self.measured = (response.usage.input_tokens > 0)
                        .then_some((response.usage.input_tokens, self.request.messages.len()));
                    return Ok(response);
                }
                Err(error) if model.overflowed(&error) => {
                    observer.on_event(AgentEvent::Error {
                        message: "the request did not fit the model's context window; compacting \
                                  the history and sending it again"
                            .to_owned(),
                    });
                    // Fewer turns kept verbatim each time the last compaction was not enough.
                    while !self.compact(model, observer, preserved, false).await {
                        if preserved == 1 {
                            return Err(Stop::Model(error));
                        }
                        preserved = preserved.div_ceil(2);
                    }
                    preserved = preserved.div_ceil(2);
                }
                Err(error) => return Err(Stop::Model(error)),
            }
        }
    }

    /// The size of the next request in tokens: the provider's count of the last request, plus an
    /// estimate of what was added since (the answer, the tool results); all estimated before the
    /// first answer and after a compaction.
    fn next_request_tokens(&self) -> u64 {
        let messages = &self.request.messages;
        match self.measured {
            Some((counted, held)) if held <= messages.len() => {
                counted + compaction::estimate_tokens(None, &messages[held..])
            }
            _ => {
                compaction::estimate_tokens(self.request.system_text().as_deref(), messages)
                    + compaction::estimate_tool_tokens(&self.request.tools)
            }
        }
    }

    /// Runs a turn's calls in order, consecutive read-only calls together — or, `one_change` at a
    /// time, none after the first that changed something; returns the result parts (and a loop
    /// warning, when the calls complete one).
    async fn run_tools(
        &mut self,
        calls: &[ToolCall],
        observer: &dyn Observer,
        one_change: bool,
    ) -> Vec<Part> {
        let mut parts = Vec::new();
        let mut warning = None;
        let mut looped = false;
        let mut index = 0;
        // Calls after one that changed things are not run, one change at a time.
        let mut blind = false;
        while index < calls.len() {
            let end = self.group_end(calls, index);
            let group = &calls[index..end];
            let unseen = blind;
            let repeats = if unseen {
                vec![None; group.len()]
            } else {
                self.repeats(group).await
            };
            let targets: Vec<String> = group.iter().map(|c| target(&self.toolbox, c)).collect();
            let before = self.contents_before(group, &repeats, unseen).await;
            for (call, target) in group.iter().zip(&targets) {
                observer.on_event(AgentEvent::ToolCallStarted {
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    target: target.clone(),
                    arguments: call.arguments.clone(),
                });
            }
            let (toolbox, approver) = (&self.toolbox, self.approver.as_deref());
            let finishing = self.finishing();
            let outputs = futures::future::join_all(group.iter().zip(&repeats).map(
                |(call, repeat)| async move {
                    let started = Instant::now();
                    let verdict = match approver {
                        _ if unseen => Err(ONE_CHANGE_AT_A_TIME.to_owned()),
                        Some(approver) if repeat.is_none() => {
                            let category = crate::tools::Category::of(&call.name);
                            approver.approve(call, category, observer).await
                        }
                        _ => Ok(()),
                    };
                    let (output, ran) = match (repeat, verdict) {
                        (Some(repeat), _) => (ToolOutput::error(repeat.refusal(finishing)), false),
                        (None, Err(denied)) => (ToolOutput::error(denied), false),
                        (None, Ok(())) => {
                            let output = toolbox.run(call).await;
                            if let Some(approver) = approver {
                                approver.ran(call, &output).await;
                            }
                            (output, true)
                        }
                    };
                    (output, ran, started.elapsed())
                },
            ))
            .await;
            for ((((call, target), (output, ran, elapsed)), repeat), before) in group
                .iter()
                .zip(targets)
                .zip(outputs)
                .zip(repeats)
                .zip(before)
            {
                let (shown, same_failure) = self.settle(call, &output, ran).await;
                blind |= one_change && ran && self.toolbox.may_change(call);
                observer.on_event(AgentEvent::ToolCallCompleted {
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    target,
                    is_error: output.is_error,
                    duration_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
                    shown_chars: shown.chars().count(),
                    output: output.content,
                    note: output.note,
                });
                parts.push(Part::ToolResult(ToolResult {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: shown,
                    is_error: output.is_error,
                }));
                let wrote = (ran && !output.is_error, before);
                if let Some((period, tools, told)) = self
                    .loop_after(call, repeat, unseen, wrote, same_failure)
                    .await
                {
                    observer.on_event(AgentEvent::LoopDetected { period, tools });
                    self.loops += 1;
                    looped = true;
                    warning = told.or(warning);
                }
            }
            index = end;
        }
        if looped && let Some(missing) = self.missing_while_looping().await {
            let hint = still_missing_hint(&missing);
            warning = Some(warning.map_or(hint.clone(), |w| format!("{w}\n{hint}")));
        }
        if let Some(text) = warning {
            parts.push(Part::Text { text });
        }
        parts
    }

    /// After a call: what it leaves behind (files touched, a failed edit for the loop detector),
    /// what the model is shown of its output (cut to the tool's limit; for a coached model, a
    /// command that succeeded after a file was written with [`DONE_HINT`]), and the failure it
    /// repeats ([`Session::failed_again`]).
    async fn settle(
        &mut self,
        call: &ToolCall,
        output: &ToolOutput,
        ran: bool,
    ) -> (String, Option<SameFailure>) {
        // An edit that ran and failed (and so changed nothing) fails the same way on the same
        // content.
        if ran
            && output.is_error
            && let Some(content) = self.toolbox.edit_fingerprint(call).await
        {
            self.detector
                .edit_failed(&call.name, &call.arguments, content);
        }
        let tool = self.toolbox.find(call);
        // A command fails by its exit code, any other call by answering with an error.
        let failed = match tool {
            Some(Tool::Shell) => !crate::shell::succeeded(output),
            _ => output.is_error,
        };
        let again = ran
            .then(|| self.failed_again(call, tool, (failed, output)))
            .flatten();
        let mut shown = match tool {
            Some(tool) => tool.limit().apply(&output.content),
            None => crate::tools::EXTERNAL_LIMIT.apply(&output.content),
        };
        self.track(output);
        self.lately.ran_since_user |= ran;
        if ran && tool == Some(Tool::Shell) {
            if failed {
                if self.lately.check != Check::Done {
                    self.lately.failed = call.arguments["command"].as_str().map(str::to_owned);
                }
                if self.coach
                    && let Some(import) = self.toolbox.missing_import(&output.content).await
                {
                    shown = format!("{shown}\n{import}");
                }
            } else {
                if self.coach && self.lately.check != Check::Done {
                    shown = format!("{shown}\n{DONE_HINT}{}.", self.finishing());
                }
                self.lately.check = Check::Done;
                self.lately.failed = None;
            }
        }
        // Reading back the file last written (whole, or the lines of it `grep` finds) checks that
        // write (a task may be just that).
        let read = match tool {
            Some(Tool::ReadFile) => target(&self.toolbox, call),
            Some(Tool::Grep) => call.arguments["path"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            _ => String::new(),
        };
        if ran
            && !output.is_error
            && !read.is_empty()
            && let Ok(read) = self.toolbox.work_dir().resolve(&read)
            && self.last_touched.as_deref()
                == Some(self.toolbox.work_dir().relative(&read).as_str())
        {
            if self.coach && tool == Some(Tool::ReadFile) && self.lately.check != Check::Done {
                shown = format!("{shown}\n{READ_BACK_HINT}{}.", self.finishing());
            }
            self.lately.check = Check::Done;
            self.lately.failed = None;
        }
        (shown, again)
    }

    /// After a call of `tool` ran, whether it `failed` and with what output: the failure it
    /// repeats, when it failed the same way as the last times it ran (`loop_detector`).
    fn failed_again(
        &mut self,
        call: &ToolCall,
        tool: Option<Tool>,
        (failed, output): (bool, &ToolOutput),
    ) -> Option<SameFailure> {
        self.detector.ran(
            (&call.name, &call.arguments),
            failed,
            &output.content,
            || match (tool, call.arguments["command"].as_str()) {
                (Some(Tool::Shell), Some(command)) => format!("`{}`", short_command(command)),
                _ => format!("this `{}` call", call.name),
            },
        )
    }

    /// Where the group of calls starting at `index` ends: consecutive calls that only read run
    /// together, any other call alone.
    fn group_end(&self, calls: &[ToolCall], index: usize) -> usize {
        if self.toolbox.read_only(&calls[index]) {
            index
                + calls[index..]
                    .iter()
                    .take_while(|c| self.toolbox.read_only(c))
                    .count()
        } else {
            index + 1
        }
    }

    /// What the file each call of a group writes holds before it runs (for calls that will run),
    /// to tell an undone change ([`Self::loop_after`]).
    async fn contents_before(
        &self,
        group: &[ToolCall],
        repeats: &[Option<Repeat>],
        unseen: bool,
    ) -> Vec<Option<(String, u64)>> {
        let mut before = Vec::with_capacity(group.len());
        for (call, repeat) in group.iter().zip(repeats) {
            before.push(match repeat {
                None if !unseen => self.toolbox.written_fingerprint(call).await,
                _ => None,
            });
        }
        before
    }

    /// The loop a call completes, with its period, its tools and the warning to send, if any: a
    /// refused repeat (its refusal is the warning), a cycle of calls, a failure repeated
    /// (`same_failure`), or — for a call that ran without error (`wrote`), its file holding
    /// `before` then — a change undone (`loop_detector`).
    async fn loop_after(
        &mut self,
        call: &ToolCall,
        repeat: Option<Repeat>,
        unseen: bool,
        (wrote, before): (bool, Option<(String, u64)>),
        same_failure: Option<SameFailure>,
    ) -> Option<(usize, Vec<String>, Option<String>)> {
        if let Some(repeat) = repeat {
            return Some((repeat.period, vec![repeat.tool], None));
        }
        if unseen {
            return None;
        }
        if let Some(found) = self.detector.record(&call.name, &call.arguments) {
            let warning = found.warning(self.finishing());
            return Some((found.period, found.tools, Some(warning)));
        }
        if let Some(failure) = same_failure {
            let warning = failure.warning(self.finishing());
            return Some((failure.period, vec![call.name.clone()], Some(warning)));
        }
        if !wrote {
            return None;
        }
        let (path, after) = self.toolbox.written_fingerprint(call).await?;
        let before = before.map(|(_, content)| content);
        let undone = self.detector.wrote(&path, before, after)?;
        let warning = undone.warning(self.finishing());
        Some((undone.period, vec![call.name.clone()], Some(warning)))
    }

    /// For each of a group of calls, in order, the repeat it is: answered without running
    /// (`loop_detector`). An edit's file is looked at only when the same edit failed before.
    async fn repeats(&mut self, group: &[ToolCall]) -> Vec<Option<Repeat>> {
        let mut repeats = Vec::with_capacity(group.len());
        for call in group {
            let content = if self.detector.failed_before(&call.name, &call.arguments) {
                self.toolbox.edit_fingerprint(call).await
            } else {
                None
            };
            // Writing a file what it holds already changes nothing, so it does not start the count
            // of repeats afresh.
            let changes =
                self.toolbox.may_change(call) && !self.toolbox.writes_nothing_new(call).await;
            repeats.push(
                content
                    .and_then(|c| self.detector.check_edit(&call.name, &call.arguments, c))
                    .or_else(|| self.detector.check(&call.name, &call.arguments, changes)),
            );
        }
        repeats
    }

    fn track(&mut self, output: &ToolOutput) {
        if output.is_error {
            return;
        }
        for path in &output.touched {
            self.lately.wrote_since_user = true;
            self.lately.check = Check::Due;
            self.lately.failed = None;
            if !self.files.contains(path) {
                self.files.push(path.clone());
            }
            self.last_touched = Some(path.clone());
        }
    }

    /// Compacts the history when the next request would fill more than 80% of the context window.
    /// A failed summary is reported and the history kept; the next turn tries again.
    async fn compact_if_needed<M: Model>(&mut self, model: &mut M, observer: &dyn Observer) {
        let Some(window) = self.context_window.filter(|w| *w > 0) else {
            return;
        };
        let estimated = self.next_request_tokens();
        if estimated * 100 <= window * compaction::THRESHOLD_PERCENT {
            return;
        }
        observer.on_event(AgentEvent::ContextWindowWarning {
            estimated_tokens: estimated,
            context_window_size: window,
            usage_percent: estimated * 100 / window,
        });
        self.compact(model, observer, compaction::PRESERVED_TURNS, true)
            .await;
    }

    /// Replaces everything but the last `preserved` turns with a summary the model writes; whether
    /// that was done (there was more to replace than a summary alone, and the summary came). Ahead
    /// of a full window (`ahead`), the agent is asked at the end of its own conversation
    /// ([`Session::summary_in_place`]); after an overflow, or when that request leaves too little
    /// room or gets no summary, the older turns are rendered as text for a request of their own.
    async fn compact<M: Model>(
        &mut self,
        model: &mut M,
        observer: &dyn Observer,
        preserved: usize,
        ahead: bool,
    ) -> bool {
        let Some((split, turn_count)) = compaction::split(&self.request.messages, preserved)
            .filter(|(split, _)| *split >= 2 || !compaction::is_summary(&self.request.messages[0]))
        else {
            return false;
        };
        let estimated = self.next_request_tokens();
        observer.on_event(AgentEvent::CompactionStarted {
            estimated_tokens: estimated,
            context_window_size: self.context_window.unwrap_or(0),
        });
        let in_place = match ahead.then(|| self.summary_in_place(estimated)).flatten() {
            Some(request) => model
                .ask(&request)
                .await
                .ok()
                .filter(|r| r.tool_calls.is_empty() && !r.text.trim().is_empty()),
            None => None,
        };
        let answer = match in_place {
            Some(response) => Ok(response),
            None => model.ask(&self.summary_rendered(split)).await,
        };
        match answer {
            Ok(response) if !response.text.trim().is_empty() => {
                let summary = compaction::summary_message(&response.text, &self.files);
                let summary_tokens =
                    compaction::estimate_tokens(None, std::slice::from_ref(&summary));
                self.request.messages.splice(..split, [summary]);
                // The provider's last count no longer describes the history.
                self.measured = None;
                observer.on_event(AgentEvent::CompactionCompleted {
                    original_turn_count: turn_count,
                    preserved_turn_count: preserved,
                    summary_token_estimate: summary_tokens,
                    tracked_file_count: self.files.len(),
                    summary: response.text.trim().to_owned(),
                });
                true
            }
            Ok(_) => {
                observer.on_event(AgentEvent::Error {
                    message:
                        "context compaction failed: the summary was empty; the history is kept"
                            .to_owned(),
                });
                false
            }
            Err(_) => {
                observer.on_event(AgentEvent::Error {
                    message:
                        "context compaction failed: the summary call failed; the history is kept"
                            .to_owned(),
                });
                false
            }
        }
    }

    /// The summary asked of the agent at the end of its own conversation: the next request as it
    /// stands (system prompt, tools, history) plus [`compaction::SUMMARY_REQUEST`], so a prompt
    /// cache serves everything before that message. A local model then reads a hundred-odd new
    /// tokens instead of a fresh summary prompt of thousands (minutes on a 2-core CPU). `None`
    /// when the window, less the request of `estimated` tokens and the message, leaves less than
    /// [`compaction::SUMMARY_ROOM`] for the answer. No call is required, no schema holds the
    /// answer, and the answer is capped to the room left.
    fn summary_in_place(&self, estimated: u64) -> Option<Request> {
        let window = self.context_window.filter(|w| *w > 0)?;
        let asked = Message::user(compaction::SUMMARY_REQUEST);
        let room = window.checked_sub(
            estimated + compaction::estimate_tokens(None, std::slice::from_ref(&asked)),
        )?;
        if room < compaction::SUMMARY_ROOM {
            return None;
        }
        let mut request = self.request.clone();
        // After tool results, beside them (as a loop warning is): the roles keep alternating.
        match request.messages.last_mut() {
            Some(last) if last.role == Role::User => last.parts.extend(asked.parts),
            _ => request.messages.push(asked),
        }
        request.tool_choice = ToolChoice::Auto;
        request.narrowed.clear();
        request.response_schema = None;
        let room = u32::try_from(room).unwrap_or(u32::MAX);
        request.max_tokens = Some(self.summary_max_tokens().min(room));
        Some(request)
    }

    /// The summary asked of the same model and settings in a request of its own: the turns before
    /// `split` rendered as text, under the summariser's system prompt, without tools.
    fn summary_rendered(&self, split: usize) -> Request {
        Request {
            model: self.request.model.clone(),
            system: Some(compaction::SUMMARY_SYSTEM.to_owned()),
            messages: vec![Message::user(compaction::summary_prompt(
                &compaction::render(&self.request.messages[..split]),
            ))],
            tools: Vec::new(),
            max_tokens: Some(self.summary_max_tokens()),
            reasoning_effort: self.request.reasoning_effort,
            temperature: self.request.temperature,
            response_schema: None,
            ..Request::default()
        }
    }

    /// A summary's answer limit: the turn's, but no more than [`compaction::SUMMARY_MAX_TOKENS`].
    fn summary_max_tokens(&self) -> u32 {
        self.request
            .max_tokens
            .map_or(compaction::SUMMARY_MAX_TOKENS, |most| {
                most.min(compaction::SUMMARY_MAX_TOKENS)
            })
    }
}

/// The files `text` writes whole ([`Settings::draft`]), as `write_file` calls written as text,
/// each with its first block: a block naming no file goes to the one file that defines what it
/// defines ([`Toolbox::defining_files`]), which keeps what the block leaves out.
async fn drafted_files(text: &str, toolbox: &Toolbox) -> Vec<ToolCall> {
    if !toolbox.offers(Tool::WriteFile) {
        return Vec::new();
    }
    let drafted: Vec<(Option<String>, String)> = trellis_llm::text_tool_calls::drafted_files(text)
        .into_iter()
        .filter(|(_, content)| content.trim() != WHOLE_CONTENT)
        .collect();
    let unnamed: Vec<String> = drafted
        .iter()
        .filter(|(path, _)| path.is_none())
        .map(|(_, content)| content.clone())
        .collect();
    let mut defining = toolbox.defining_files(unnamed).await.into_iter();
    let mut files: Vec<(String, String)> = Vec::new();
    for (path, content) in drafted {
        let Some(path) = path.or_else(|| defining.next().flatten()) else {
            continue;
        };
        if !files.iter().any(|(p, _)| *p == path) {
            files.push((path, content));
        }
    }
    files
        .into_iter()
        .enumerate()
        .map(|(index, (path, content))| ToolCall {
            id: trellis_llm::text_tool_calls::text_call_id(index),
            name: Tool::WriteFile.name().to_owned(),
            arguments: json!({ "path": path, "content": content }),
        })
        .collect()
}

fn target(toolbox: &Toolbox, call: &ToolCall) -> String {
    match toolbox.find(call) {
        Some(tool) => tool.target(&call.arguments),
        // Another tool's (an MCP server's): its first text argument.
        None => call
            .arguments
            .as_object()
            .and_then(|args| args.values().find_map(Value::as_str))
            .unwrap_or_default()
            .to_owned(),
    }
}

/// The response as a history message. Arguments that are not a JSON object (a malformed call) are
/// wrapped in one: providers reject a tool call whose input is not an object; an empty answer is
/// marked as such.
fn assistant_message(response: &Response) -> Message {
    let mut message = response.to_message();
    // Providers reject an empty assistant turn in the history (a repair turn or a thread follows).
    if message.parts.is_empty() {
        message.parts.push(Part::Text {
            text: "(empty answer)".to_owned(),
        });
    }
    for part in &mut message.parts {
        if let Part::ToolCall(call) = part
            && !call.arguments.is_object()
        {
            call.arguments = json!({ "invalid_arguments": call.arguments });
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use trellis_llm::{StopReason, Usage};

    use super::*;
    use crate::WorkDir;

    /// A model that answers from a script and records what it was asked.
    struct Scripted {
        answers: Vec<Response>,
        asked: Vec<Request>,
    }

    #[async_trait]
    impl Model for Scripted {
        type Error = String;
        async fn ask(&mut self, request: &Request) -> Result<Response, String> {
            self.asked.push(request.clone());
            if self.answers.is_empty() {
                return Err("no more answers".into());
            }
            Ok(self.answers.remove(0))
        }
    }

    fn response(text: &str, calls: &[(&str, Value)]) -> Response {
        Response {
            model: "m".into(),
            provider: "p".into(),
            text: text.into(),
            tool_calls: calls
                .iter()
                .enumerate()
                .map(|(i, (name, arguments))| ToolCall {
                    id: format!("c{i}"),
                    name: (*name).into(),
                    arguments: arguments.clone(),
                })
                .collect(),
            usage: Usage::default(),
            stop_reason: StopReason::EndTurn,
        }
    }

    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Observer for Log {
        fn on_event(&self, event: AgentEvent) {
            let line = match event {
                AgentEvent::ToolCallStarted { tool, .. } => format!("start {tool}"),
                AgentEvent::ToolCallCompleted { tool, .. } => format!("end {tool}"),
                _ => return,
            };
            self.0.lock().push(line);
        }
    }

    #[tokio::test]
    async fn an_answer_cut_at_the_output_limit_is_asked_again_twice_then_taken() {
        let dir = tempfile::tempdir().unwrap();
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let settings = Settings {
            template: Request {
                max_tokens: Some(64),
                ..Request::default()
            },
            greedy: true,
            ..Settings::default()
        };
        let mut session = Session::new(toolbox, None, Vec::new(), settings);
        let cut = |text: &str| Response {
            stop_reason: StopReason::MaxTokens,
            ..response(text, &[])
        };
        let mut model = Scripted {
            answers: vec![
                cut("{\"name\": \"write"),
                cut("{\"na"),
                cut("taken as it is"),
            ],
            asked: Vec::new(),
        };
        let answer = session
            .send(&mut model, &Log::default(), "go".into())
            .await
            .unwrap();
        assert_eq!(answer.text, "taken as it is");
        assert_eq!(model.asked.len(), 3);
        let again = model.asked[1].messages.last().unwrap().text();
        assert!(
            again.starts_with("Your answer was cut off at the output limit (64 tokens)"),
            "{again}"
        );
        // A greedy model cut off is sampled for its next turn.
        let temperatures: Vec<Option<f32>> = model.asked.iter().map(|r| r.temperature).collect();
        assert_eq!(
            temperatures,
            [None, Some(UNSTICK_TEMPERATURE), Some(UNSTICK_TEMPERATURE)]
        );
        // The cut answer stays in the history, as the model wrote it.
        assert_eq!(model.asked[1].messages[1].text(), "{\"name\": \"write");
    }

    /// The tool results a request's last message holds, in order.
    fn last_results(request: &Request) -> Vec<(String, bool)> {
        request
            .messages
            .last()
            .unwrap()
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::ToolResult(result) => Some((result.content.clone(), result.is_error)),
                _ => None,
            })
            .collect()
    }

    fn coached(dir: &std::path::Path) -> Session {
        let toolbox = Toolbox::new(WorkDir::new(dir).unwrap(), None, &[]);
        let settings = Settings {
            coach: true,
            ..Settings::default()
        };
        Session::new(toolbox, None, Vec::new(), settings)
    }

    /// A coached session that must call a tool every turn, whose first answer writes files whole
    /// and is followed by `then`.
    fn drafting(dir: &std::path::Path, then: &str) -> Session {
        must_call(dir, Some(then.into()))
    }

    /// A coached session that must call a tool every turn, ending with `finish`.
    fn coached_to_finish(dir: &std::path::Path) -> Session {
        must_call(dir, None)
    }

    /// A coached session that must call a tool every turn, with `draft` ([`Settings::draft`]).
    fn must_call(dir: &std::path::Path, draft: Option<String>) -> Session {
        let toolbox = Toolbox::new(WorkDir::new(dir).unwrap(), None, &[]);
        let settings = Settings {
            template: Request {
                tool_choice: ToolChoice::Required,
                ..Request::default()
            },
            coach: true,
            draft,
            ..Settings::default()
        };
        Session::new(toolbox, None, Vec::new(), settings)
    }

    #[tokio::test]
    async fn a_coached_model_runs_one_change_per_answer_and_is_told_when_a_check_passes() {
        let dir = tempfile::tempdir().unwrap();
        let mut session = coached(dir.path());
        let write = |content: &str| ("write_file", json!({ "path": "a.py", "content": content }));
        let mut model = Scripted {
            answers: vec![
                // A write, then calls written before its result was known.
                response(
                    "",
                    &[
                        write("print(1)\n"),
                        write("print(2)\n"),
                        ("shell", json!({ "command": "echo hi" })),
                    ],
                ),
                response("", &[("shell", json!({ "command": "python3 a.py" }))]),
                response("", &[("shell", json!({ "command": "true" }))]),
                response("Done.", &[]),
            ],
            asked: Vec::new(),
        };
        let answer = session
            .send(&mut model, &Log::default(), "go".into())
            .await
            .unwrap();
        assert_eq!(answer.text, "Done.");
        assert_eq!(
            tokio::fs::read_to_string(dir.path().join("a.py"))
                .await
                .unwrap(),
            "print(1)\n"
        );
        let first = last_results(&model.asked[1]);
        assert!(first[0].0.starts_with("wrote "), "{first:?}");
        for (text, is_error) in &first[1..] {
            assert_eq!((text.as_str(), *is_error), (ONE_CHANGE_AT_A_TIME, true));
        }
        // The command after the write succeeds: the model is told it may answer; a second success
        // with nothing written since is not remarked on.
        let run = &last_results(&model.asked[2])[0].0;
        assert!(run.contains(&format!("[exit 0]\n{DONE_HINT}")), "{run}");
        let again = &last_results(&model.asked[3])[0].0;
        assert!(again.ends_with("[exit 0]"), "{again}");
    }

    #[tokio::test]
    async fn a_coached_model_that_answers_without_doing_anything_is_asked_once_to_act() {
        let dir = tempfile::tempdir().unwrap();
        let mut session = coached(dir.path());
        let mut model = Scripted {
            answers: vec![
                response("I wrote SUMMARY.md.", &[]),
                response("Here it is:\n```\nprint(1)\n```", &[]),
            ],
            asked: Vec::new(),
        };
        let answer = session
            .send(&mut model, &Log::default(), "go".into())
            .await
            .unwrap();
        // Once per message from the user: the second answer is taken.
        assert_eq!(model.asked.len(), 2);
        assert_eq!(answer.text, "Here it is:\n```\nprint(1)\n```");
        assert_eq!(model.asked[1].messages.last().unwrap().text(), NOTHING_DONE);

        // Code in an answer after only reading is met the same way; prose is taken.
        tokio::fs::write(dir.path().join("a.py"), "x = 1\n")
            .await
            .unwrap();
        let mut model = Scripted {
            answers: vec![
                response("", &[("read_file", json!({ "path": "a.py" }))]),
                response("```python\nx = 2\n```", &[]),
                response(
                    "",
                    &[(
                        "write_file",
                        json!({ "path": "a.py", "content": "x = 2\n" }),
                    )],
                ),
                response("Done: x is 2 now.", &[]),
                response("", &[("read_file", json!({ "path": "a.py" }))]),
                response("It says x = 2.", &[]),
            ],
            asked: Vec::new(),
        };
        session
            .send(&mut model, &Log::default(), "change x".into())
            .await
            .unwrap();
        assert_eq!(model.asked[2].messages.last().unwrap().text(), NOTHING_DONE);
        assert_eq!(model.asked.len(), 4);
        let answer = session
            .send(&mut model, &Log::default(), "what is x?".into())
            .await
            .unwrap();
        assert_eq!(answer.text, "It says x = 2.");
        assert_eq!(model.asked.len(), 6);

        // An uncoached model's answers are taken as they come.
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let mut plain = Session::new(toolbox, None, Vec::new(), Settings::default());
        let mut model = Scripted {
            answers: vec![response("I wrote SUMMARY.md.", &[])],
            asked: Vec::new(),
        };
        let answer = plain
            .send(&mut model, &Log::default(), "go".into())
            .await
            .unwrap();
        assert_eq!(answer.text, "I wrote SUMMARY.md.");
    }

    #[tokio::test]
    async fn a_model_that_must_call_a_tool_finishes_with_finish_once_it_has_done_something() {
        let dir = tempfile::tempdir().unwrap();
        let mut session = coached_to_finish(dir.path());
        let finish = |summary: &str| (FINISH, json!({ "summary": summary }));
        let mut model = Scripted {
            answers: vec![
                // Too soon: nothing ran yet.
                response("", &[finish("I wrote a.py.")]),
                response(
                    "",
                    &[(
                        "write_file",
                        json!({ "path": "a.py", "content": "x = 1\n" }),
                    )],
                ),
                // Not alone: the write runs, finish is refused.
                response(
                    "",
                    &[
                        (
                            "write_file",
                            json!({ "path": "b.py", "content": "y = 1\n" }),
                        ),
                        finish("done"),
                    ],
                ),
                // Unchecked: files were written since a command last succeeded.
                response("", &[finish("Wrote a.py and b.py.")]),
                response("", &[("shell", json!({ "command": "cat a.py b.py" }))]),
                response("", &[finish("Wrote a.py and b.py.")]),
            ],
            asked: Vec::new(),
        };
        let answer = session
            .send(&mut model, &Log::default(), "write a.py".into())
            .await
            .unwrap();
        assert_eq!(answer.text, "Wrote a.py and b.py.");
        assert_eq!(answer.tool_calls, [] as [trellis_llm::ToolCall; 0]);
        assert_eq!(model.asked.len(), 6);
        let asked = &model.asked[0];
        assert_eq!(asked.tool_choice, ToolChoice::Required);
        assert!(
            asked.tools.iter().any(|t| t.name == FINISH),
            "finish is offered"
        );
        assert_eq!(
            last_results(&model.asked[1]),
            [(NOT_FINISHED.to_owned(), true)]
        );
        let results = last_results(&model.asked[3]);
        assert_eq!(results.len(), 2, "{results:?}");
        assert!(!results[0].1, "the write ran: {results:?}");
        assert_eq!(results[1], (FINISH_ALONE.to_owned(), true));
        assert!(dir.path().join("b.py").exists());
        assert_eq!(
            last_results(&model.asked[4]),
            [(UNCHECKED.to_owned(), true)]
        );
        let checked = &last_results(&model.asked[5])[0].0;
        assert!(
            checked
                .ends_with("If that shows the task is done, call finish now with a short summary."),
            "{checked}"
        );
        // The finish call is answered in the history a thread continues.
        let last = session.history().last().unwrap();
        assert!(matches!(&last.parts[0], Part::ToolResult(r) if r.name == FINISH && !r.is_error));
    }

    #[tokio::test]
    async fn a_file_read_back_after_it_was_written_is_a_check_of_that_write() {
        let dir = tempfile::tempdir().unwrap();
        let mut session = coached_to_finish(dir.path());
        let write = |path: &str| ("write_file", json!({ "path": path, "content": "hi\n" }));
        let read = |path: &str| ("read_file", json!({ "path": path }));
        let finish = || response("", &[(FINISH, json!({ "summary": "Wrote it." }))]);
        // The file just written, read back (by another spelling of its path): finish is taken.
        let (answer, asked) = scripted(
            &mut session,
            "write a.txt",
            vec![
                response("", &[write("a.txt")]),
                response("", &[read("./a.txt")]),
                finish(),
            ],
        )
        .await;
        assert_eq!(answer.text, "Wrote it.");
        assert_eq!(asked.len(), 3);
        // Lines of it found with grep are a read-back too.
        let grep = ("grep", json!({ "pattern": "hi", "path": "c.txt" }));
        let (_, asked) = scripted(
            &mut session,
            "write c.txt",
            vec![
                response("", &[write("c.txt")]),
                response("", &[grep]),
                finish(),
            ],
        )
        .await;
        assert_eq!(asked.len(), 3);
        // Another file read back checks nothing: finish is refused once.
        let (_, asked) = scripted(
            &mut session,
            "write b.txt",
            vec![
                response("", &[write("b.txt")]),
                response("", &[read("a.txt")]),
                finish(),
                finish(),
            ],
        )
        .await;
        assert_eq!(asked.len(), 4);
        assert_eq!(last_results(&asked[3]), [(UNCHECKED.to_owned(), true)]);
    }

    #[tokio::test]
    async fn a_check_that_failed_after_the_last_change_is_named_when_the_model_would_finish() {
        let dir = tempfile::tempdir().unwrap();
        let mut session = coached_to_finish(dir.path());
        let write = |code: u8| {
            (
                "write_file",
                json!({ "path": "a.sh", "content": format!("exit {code}\n") }),
            )
        };
        let run = |command: &str| ("shell", json!({ "command": command }));
        let finish = || response("", &[(FINISH, json!({ "summary": "Wrote it." }))]);
        // Written, run, failed: finish is refused once, naming the command; the second is taken.
        let (answer, asked) = scripted(
            &mut session,
            "write a.sh",
            vec![
                response("", &[write(3)]),
                response("", &[run("sh a.sh")]),
                finish(),
                finish(),
            ],
        )
        .await;
        assert_eq!(answer.text, "Wrote it.");
        assert_eq!(asked.len(), 4);
        assert_eq!(last_results(&asked[3]), [(failed_check("sh a.sh"), true)]);
        // After the unchecked-change refusal, a failed run is named too.
        let (_, asked) = scripted(
            &mut session,
            "change a.sh",
            vec![
                response("", &[write(4)]),
                finish(),
                response("", &[run("sh a.sh")]),
                finish(),
                finish(),
            ],
        )
        .await;
        assert_eq!(asked.len(), 5);
        assert_eq!(last_results(&asked[2]), [(UNCHECKED.to_owned(), true)]);
        assert_eq!(last_results(&asked[4]), [(failed_check("sh a.sh"), true)]);
        // A failure with no change unchecked is not named, nor one a later success makes good.
        let (_, asked) = scripted(
            &mut session,
            "fix a.sh",
            vec![
                response("", &[run("true")]),
                response("", &[run("false")]),
                finish(),
            ],
        )
        .await;
        assert_eq!(asked.len(), 3);
        let (_, asked) = scripted(
            &mut session,
            "fix a.sh again",
            vec![
                response("", &[write(0)]),
                response("", &[run("false")]),
                response("", &[run("sh a.sh")]),
                finish(),
            ],
        )
        .await;
        assert_eq!(asked.len(), 4);
    }

    #[tokio::test]
    async fn a_model_going_round_in_circles_is_told_which_named_file_is_still_missing() {
        let dir = tempfile::tempdir().unwrap();
        let mut session = coached_to_finish(dir.path());
        let run = || response("", &[("shell", json!({ "command": "ls" }))]);
        let write = (
            "write_file",
            json!({ "path": "backup.sh", "content": "true\n" }),
        );
        let task = "Write backup.sh to copy the notes.";
        session.set_task(task).await;
        let finish = || response("", &[(FINISH, json!({ "summary": "Done." }))]);
        let (answer, asked) = scripted(
            &mut session,
            task,
            vec![
                run(),
                run(),
                // Refused as a repeat: the warning says what is still missing.
                run(),
                response("", &[write]),
                // Refused again: backup.sh is there, so nothing more is said.
                run(),
                run(),
                run(),
                finish(),
            ],
        )
        .await;
        assert_eq!(answer.text, "Done.");
        let hint = still_missing_hint("backup.sh");
        let told = |request: &Request| match &request.messages.last().unwrap().parts[..] {
            [Part::ToolResult(_), Part::Text { text }] => Some(text.clone()),
            _ => None,
        };
        assert!(
            told(&asked[3]).is_some_and(|t| t.ends_with(&hint)),
            "{:?}",
            told(&asked[3])
        );
        assert!(
            told(&asked[6]).is_none_or(|t| !t.contains(&hint)),
            "{:?}",
            told(&asked[6])
        );
        assert!(last_results(&asked[7])[0].0.starts_with("Not run"));
        assert_eq!(told(&asked[7]), None);
    }

    #[test]
    fn a_failed_command_is_named_by_the_start_of_its_first_line() {
        let named = |command: &str| {
            let text = failed_check(command);
            text[text.find('`').unwrap() + 1..text.rfind('`').unwrap()].to_owned()
        };
        assert_eq!(named("python3 main.py\n"), "python3 main.py");
        assert_eq!(named("cd a\npytest"), "cd a…");
        assert_eq!(named("\n  make test  \n"), "make test");
        let long = "é".repeat(100);
        assert_eq!(named(&long), format!("{}…", "é".repeat(80)));
    }

    /// Sends `task` to `session` with a model answering `answers` in turn: the session's answer,
    /// and the requests the model was sent.
    async fn scripted(
        session: &mut Session,
        task: &str,
        answers: Vec<Response>,
    ) -> (Response, Vec<Request>) {
        let mut model = Scripted {
            answers,
            asked: Vec::new(),
        };
        let answer = session
            .send(&mut model, &Log::default(), task.into())
            .await
            .unwrap();
        (answer, model.asked)
    }

    #[tokio::test]
    async fn a_drafting_model_writes_its_files_whole_in_its_first_answer_then_calls_tools() {
        let dir = tempfile::tempdir().unwrap();
        for (file, text) in [
            ("util.py", "def get_total(p):\n    return sum(p)\n"),
            (
                "main.py",
                "from util import get_total\nprint(get_total([1]))\n",
            ),
            (
                "test_util.py",
                "from util import get_total\nassert get_total([2]) == 2\n",
            ),
        ] {
            tokio::fs::write(dir.path().join(file), text).await.unwrap();
        }
        let mut session = drafting(dir.path(), "From now on, call one tool an answer.");
        let task =
            "Rename get_total to compute_total in util.py and main.py. Do not change the tests.";
        session.set_task(task).await;
        // Shown with the task, so read.
        let shown = session.toolbox().named_files(task, true).await.unwrap();
        assert!(shown.starts_with("The project's files, as they are now:\n\nmain.py\n```\n"));
        let draft = "Rename it in both files:\n\nutil.py\n```\ndef compute_total(p):\n    return \
                     sum(p)\n```\n\nHere is the updated `main.py`:\n```python\nfrom util import \
                     compute_total\nprint(compute_total([1]))\n```\n\ntest_util.py\n```\nassert \
                     True\n```\n\nmain.py\n```\nthe file's whole new content\n```\n\nnew.py\n```\nthe \
                     file's whole new content\n```\n";
        let answers = vec![
            response(draft, &[]),
            response("", &[("shell", json!({ "command": "python3 main.py" }))]),
            response("", &[(FINISH, json!({ "summary": "Renamed." }))]),
        ];
        let (answer, asked) = scripted(&mut session, task, answers).await;
        assert_eq!(answer.text, "Renamed.");
        // The first answer is asked for as text, the tools shown all the same; then calls again.
        assert_eq!(asked[0].tool_choice, ToolChoice::None);
        assert_eq!(asked[0].tools, asked[1].tools);
        assert_eq!(asked[1].tool_choice, ToolChoice::Required);
        // Each file written whole once, with its first block; the test kept, as the task says.
        let read = |file: &str| tokio::fs::read_to_string(dir.path().join(file));
        assert_eq!(
            read("util.py").await.unwrap(),
            "def compute_total(p):\n    return sum(p)\n"
        );
        assert_eq!(
            read("main.py").await.unwrap(),
            "from util import compute_total\nprint(compute_total([1]))\n"
        );
        // The example's block copied is not a file.
        assert!(read("new.py").await.is_err());
        let test = read("test_util.py").await.unwrap();
        assert!(test.contains("assert get_total([2]) == 2"));
        // The model is shown what each write did, then how to go on; its answer stays as it was.
        let results = last_results(&asked[1]);
        assert_eq!(results.len(), 3, "{results:?}");
        assert!(
            results[0].0.starts_with("wrote") && !results[0].1,
            "{results:?}"
        );
        assert!(
            results[2].0.starts_with("Refused") && results[2].1,
            "{results:?}"
        );
        let shown = asked[1].messages.last().unwrap();
        assert!(matches!(
            shown.parts.last(),
            Some(Part::Text { text }) if text == "From now on, call one tool an answer."
        ));
        assert_eq!(asked[1].messages[1].text(), draft);
        // Each request is the last one and what came since.
        for pair in asked.windows(2) {
            assert_eq!(
                pair[0].messages[..],
                pair[1].messages[..pair[0].messages.len()]
            );
        }
    }

    #[tokio::test]
    async fn a_first_answer_whose_code_was_not_written_is_said_so_and_finish_refused_once() {
        let dir = tempfile::tempdir().unwrap();
        tokio::fs::write(
            dir.path().join("primes.py"),
            "def is_prime(n):\n    raise NotImplementedError\n",
        )
        .await
        .unwrap();
        let mut session = drafting(dir.path(), "Go on.");
        let finish = response("", &[(FINISH, json!({ "summary": "Done." }))]);
        let answers = vec![
            response("Then it works:\n```python\nprint(is_prime(7))\n```\n", &[]),
            response("", &[("shell", json!({ "command": "python3 primes.py" }))]),
            finish.clone(),
            finish,
        ];
        let (answer, asked) =
            scripted(&mut session, "Implement is_prime in primes.py.", answers).await;
        assert_eq!(answer.text, "Done.");
        assert_eq!(asked.len(), 4);
        assert!(matches!(
            asked[1].messages.last().unwrap().parts.last(),
            Some(Part::Text { text }) if *text == format!("{NOTHING_DRAFTED}Go on.")
        ));
        assert_eq!(last_results(&asked[3]), [(NOT_CHANGED.to_owned(), true)]);
    }

    #[tokio::test]
    async fn a_first_answers_block_naming_no_file_goes_to_the_one_defining_what_it_defines() {
        let dir = tempfile::tempdir().unwrap();
        let primes = "def is_prime(n):\n    raise NotImplementedError\n\n\ndef primes_below(limit):\n    return [n for n in range(limit) if is_prime(n)]\n";
        tokio::fs::write(dir.path().join("primes.py"), primes)
            .await
            .unwrap();
        // Another file that defines it too but is prose, and one that only uses it.
        tokio::fs::write(dir.path().join("NOTES.md"), "def is_prime(n):\n")
            .await
            .unwrap();
        tokio::fs::write(dir.path().join("main.py"), "print(is_prime(7))\n")
            .await
            .unwrap();
        let mut session = drafting(dir.path(), "Go on.");
        let task = "Implement is_prime in primes.py.";
        session.set_task(task).await;
        session.toolbox().named_files(task, true).await.unwrap();
        let answers = vec![
            response(
                "Here is `is_prime`:\n```python\ndef is_prime(n):\n    return n > 1\n```\n",
                &[],
            ),
            response("", &[("shell", json!({ "command": "python3 primes.py" }))]),
            response("", &[(FINISH, json!({ "summary": "Done." }))]),
        ];
        let (_, asked) = scripted(&mut session, task, answers).await;
        assert_eq!(
            tokio::fs::read_to_string(dir.path().join("primes.py"))
                .await
                .unwrap(),
            primes.replace("raise NotImplementedError\n\n", "return n > 1\n")
        );
        assert_eq!(
            last_results(&asked[1]),
            [(
                "wrote 112 bytes to primes.py, keeping `primes_below` as it was: your content left \
                 it out, and the task does not ask for it to go"
                    .to_owned(),
                false
            )]
        );
    }

    #[tokio::test]
    async fn a_number_the_task_names_is_asked_for_once_while_no_named_file_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = "{\n  \"port\": 8080,\n  \"debug\": true\n}\n";
        tokio::fs::write(dir.path().join("config.json"), config)
            .await
            .unwrap();
        let mut session = coached_to_finish(dir.path());
        let finish = (FINISH, json!({ "summary": "Done." }));
        let edit = |old: &str, new: &str| {
            response(
                "",
                &[(
                    "edit_file",
                    json!({ "path": "config.json", "old_string": old, "new_string": new }),
                )],
            )
        };
        let check = response("", &[("shell", json!({ "command": "cat config.json" }))]);
        let mut model = Scripted {
            answers: vec![
                // One change of the two, checked.
                edit("\"debug\": true", "\"debug\": false"),
                check.clone(),
                // 9090 is in no file the task names.
                response("", std::slice::from_ref(&finish)),
                edit("\"port\": 8080,", "\"port\": 9090,"),
                check,
                response("", std::slice::from_ref(&finish)),
            ],
            asked: Vec::new(),
        };
        let task = "In config.json, set the port to 9090 and turn debug off.";
        session.set_task(task).await;
        let answer = session
            .send(&mut model, &Log::default(), task.into())
            .await
            .unwrap();
        assert_eq!(answer.text, "Done.");
        assert_eq!(model.asked.len(), 6);
        assert_eq!(
            last_results(&model.asked[3]),
            [(missing_value("9090"), true)]
        );
        assert!(
            tokio::fs::read_to_string(dir.path().join("config.json"))
                .await
                .unwrap()
                .contains("9090")
        );
    }

    #[tokio::test]
    async fn a_file_the_task_names_is_asked_for_once_and_an_edit_may_name_a_line_that_occurs_once()
    {
        let dir = tempfile::tempdir().unwrap();
        tokio::fs::write(dir.path().join("notes.txt"), "a\nb = 1\na\n")
            .await
            .unwrap();
        let mut session = coached_to_finish(dir.path());
        let finish = (FINISH, json!({ "summary": "Done." }));
        let mut model = Scripted {
            answers: vec![
                response("", &[("shell", json!({ "command": "true" }))]),
                // backup.sh, which the task names, is not there.
                response("", std::slice::from_ref(&finish)),
                response("", &[("read_file", json!({ "path": "notes.txt" }))]),
                // Asked once: the model may finish without it.
                response("", std::slice::from_ref(&finish)),
            ],
            asked: Vec::new(),
        };
        let task = "Write backup.sh to copy notes.txt, then run it.";
        session.set_task(task).await;
        // Only the task's own words count: the files shown after it may name files of their own.
        let shown = format!("{task}\n\n`notes.txt` holds: see setup.py.");
        let answer = session
            .send(&mut model, &Log::default(), shown)
            .await
            .unwrap();
        assert_eq!(answer.text, "Done.");
        assert_eq!(model.asked.len(), 4);
        assert_eq!(
            last_results(&model.asked[2]),
            [(missing_file("backup.sh"), true)]
        );
        // An edit of notes.txt may name only its line that occurs once.
        assert_eq!(
            model.asked[0].narrowed["edit_file"]["oneOf"][0]["properties"],
            json!({
                "path": { "const": "notes.txt" },
                "old_string": { "enum": ["b = 1"] },
                "new_string": { "type": "string" },
                "replace_all": { "type": "boolean" },
            })
        );
    }

    #[tokio::test]
    async fn reads_of_one_turn_run_together_and_writes_alone() {
        let dir = tempfile::tempdir().unwrap();
        tokio::fs::write(dir.path().join("a.txt"), "a")
            .await
            .unwrap();
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let mut session = Session::new(toolbox, None, Vec::new(), Settings::default());
        let mut model = Scripted {
            answers: vec![
                response(
                    "",
                    &[
                        ("read_file", json!({ "path": "a.txt" })),
                        ("list_dir", json!({})),
                        ("write_file", json!({ "path": "b.txt", "content": "b" })),
                        ("grep", json!({ "pattern": "a" })),
                    ],
                ),
                response("done", &[]),
            ],
            asked: Vec::new(),
        };
        let log = Log::default();
        let answer = session.send(&mut model, &log, "go".into()).await.unwrap();
        assert_eq!(answer.text, "done");
        assert_eq!(
            *log.0.lock(),
            [
                "start read_file",
                "start list_dir",
                "end read_file",
                "end list_dir",
                "start write_file",
                "end write_file",
                "start grep",
                "end grep"
            ]
        );
        // The results went back in the calls' order, one user message after the assistant's.
        let history = &model.asked[1].messages;
        assert_eq!(history.len(), 3);
        let ids: Vec<&str> = history[2]
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::ToolResult(r) => Some(r.call_id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(ids, ["c0", "c1", "c2", "c3"]);
        assert_eq!(session.files_touched(), ["b.txt"]);
    }

    #[tokio::test]
    async fn a_failed_model_call_stops_the_session_with_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let mut session = Session::new(toolbox, None, Vec::new(), Settings::default());
        let mut model = Scripted {
            answers: Vec::new(),
            asked: Vec::new(),
        };
        match session.send(&mut model, &Log::default(), "go".into()).await {
            Err(Stop::Model(error)) => assert_eq!(error, "no more answers"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_providers_count_of_the_last_request_decides_when_to_compact() {
        // The history's text is small, but the provider counts many more tokens (a tokenizer that
        // splits code finely, a chat template): its count decides.
        let model = compacted_with(
            1_000,
            100,
            vec![response("Summary: looked for files.", &[])],
        )
        .await;
        let summaries: Vec<usize> = model
            .asked
            .iter()
            .enumerate()
            .filter(|(_, r)| r.tools.is_empty())
            .map(|(i, _)| i)
            .collect();
        // The eighth answer counted 800 tokens, and more came since (over 80%): the ninth request
        // is the summary.
        assert_eq!(summaries, [8]);
        assert!(compaction::estimate_tokens(None, &model.asked[7].messages) < 800);
        assert!(compaction::is_summary(&model.asked[9].messages[0]));
        assert!(model.asked[9].cache_prompt && !model.asked[8].cache_prompt);
    }

    /// A session of eight `glob` turns in a window of `window` tokens whose provider counts
    /// `per_turn` input tokens more each turn: with `per_turn` a tenth of the window, the eighth
    /// answer's count is 80% of it, so compaction starts before the ninth request, which `then`
    /// answers; the session's answer after that is "done".
    async fn compacted_with(window: u64, per_turn: u64, then: Vec<Response>) -> Scripted {
        let dir = tempfile::tempdir().unwrap();
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let settings = Settings {
            context_window: Some(window),
            ..Settings::default()
        };
        let mut session = Session::new(toolbox, None, Vec::new(), settings);
        let mut answers: Vec<Response> = (0..8)
            .map(|turn| Response {
                usage: Usage {
                    input_tokens: per_turn * (turn + 1),
                    ..Usage::default()
                },
                ..response("", &[("glob", json!({ "pattern": format!("*.{turn}") }))])
            })
            .collect();
        answers.extend(then);
        answers.push(response("done", &[]));
        let mut model = Scripted {
            answers,
            asked: Vec::new(),
        };
        let answer = session
            .send(&mut model, &Log::default(), "find files".into())
            .await
            .unwrap();
        assert_eq!(answer.text, "done");
        model
    }

    #[tokio::test]
    async fn ahead_of_a_full_window_the_agent_writes_the_summary_at_the_end_of_its_own_conversation()
     {
        let model =
            compacted_with(10_000, 1_000, vec![response("## Goal\nFind files.", &[])]).await;
        assert_eq!(model.asked.len(), 10);
        let (last_turn, asked) = (&model.asked[7], &model.asked[8]);
        // The conversation's next request, unchanged up to the end: a prompt cache serves it all.
        assert_eq!(asked.system, last_turn.system);
        assert_eq!(asked.tools, last_turn.tools);
        assert_ne!(asked.tools, [] as [trellis_llm::ToolDef; 0]);
        assert_eq!(asked.cache_prompt, last_turn.cache_prompt);
        assert_eq!(
            asked.messages[..last_turn.messages.len()],
            last_turn.messages[..]
        );
        // Beside the last tool results, the request for the summary; the answer fits the window.
        let last = asked.messages.last().unwrap();
        assert_eq!(last.role, Role::User);
        assert!(matches!(last.parts.first(), Some(Part::ToolResult(_))));
        assert!(matches!(
            last.parts.last(),
            Some(Part::Text { text }) if text == compaction::SUMMARY_REQUEST
        ));
        assert_eq!(asked.tool_choice, ToolChoice::Auto);
        // About 1,800 tokens are left; a summary is held to 1,024.
        assert_eq!(asked.max_tokens, Some(compaction::SUMMARY_MAX_TOKENS));
        // The history from then on opens with that summary.
        assert!(compaction::is_summary(&model.asked[9].messages[0]));
        assert!(matches!(
            model.asked[9].messages[0].parts.first(),
            Some(Part::Text { text }) if text.contains("Find files.")
        ));
    }

    #[tokio::test]
    async fn an_agent_that_calls_a_tool_instead_of_summarising_gets_the_summary_asked_apart() {
        let model = compacted_with(
            10_000,
            1_000,
            vec![
                response("", &[("glob", json!({ "pattern": "*.rs" }))]),
                response("## Goal\nFind files.", &[]),
            ],
        )
        .await;
        assert_eq!(model.asked.len(), 11);
        assert_ne!(model.asked[8].tools, [] as [trellis_llm::ToolDef; 0]);
        let apart = &model.asked[9];
        assert_eq!(apart.tools, [] as [trellis_llm::ToolDef; 0]);
        assert_eq!(apart.system.as_deref(), Some(compaction::SUMMARY_SYSTEM));
        assert_eq!(apart.max_tokens, Some(compaction::SUMMARY_MAX_TOKENS));
        assert!(compaction::is_summary(&model.asked[10].messages[0]));
    }

    /// A model whose first answer says the request did not fit, then answers from a script.
    struct Overflowing(Scripted, bool);

    #[async_trait]
    impl Model for Overflowing {
        type Error = String;
        async fn ask(&mut self, request: &Request) -> Result<Response, String> {
            if request.tools.is_empty() || self.1 {
                return self.0.ask(request).await;
            }
            self.0.asked.push(request.clone());
            self.1 = true;
            Err("too long".into())
        }
        fn overflowed(&self, error: &String) -> bool {
            error == "too long"
        }
    }

    #[tokio::test]
    async fn an_overflow_with_nothing_left_to_compact_fails_the_session() {
        let dir = tempfile::tempdir().unwrap();
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let mut session = Session::new(toolbox, None, Vec::new(), Settings::default());
        let mut model = Overflowing(
            Scripted {
                answers: vec![response("done", &[])],
                asked: Vec::new(),
            },
            false,
        );
        // One message: no summary can make it smaller.
        let stopped = session
            .send(&mut model, &Log::default(), "hello".into())
            .await;
        assert!(matches!(stopped, Err(Stop::Model(error)) if error == "too long"));
        assert_eq!(model.0.asked.len(), 1);
    }

    /// Two edits undoing each other with a check between (`12` → `15`, check, `15` → `12`, ...):
    /// each undoing is named, and the third ends the session as looping.
    #[tokio::test]
    async fn edits_that_undo_each_other_are_named_and_end_the_session_at_the_third() {
        let dir = tempfile::tempdir().unwrap();
        tokio::fs::write(dir.path().join("lib.rs"), "assert_eq!(area(3, 4), 12);\n")
            .await
            .unwrap();
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let mut session = Session::new(toolbox, None, Vec::new(), Settings::default());
        let edit = |old: &str, new: &str| {
            response(
                "",
                &[(
                    "edit_file",
                    json!({ "path": "lib.rs", "old_string": old, "new_string": new }),
                )],
            )
        };
        let check = || response("", &[("shell", json!({ "command": "true" }))]);
        let mut model = Scripted {
            answers: vec![
                edit("12);", "15);"),
                check(),
                edit("15);", "12);"),
                check(),
                edit("12);", "15);"),
                check(),
                edit("15);", "12);"),
                check(),
            ],
            asked: Vec::new(),
        };
        let stop = session
            .send(&mut model, &Log::default(), "make the test pass".into())
            .await
            .unwrap_err();
        assert!(
            matches!(stop, Stop::Looping { warnings: 3, .. }),
            "{stop:?}"
        );
        // Stopped at the third undoing, the seventh call; the model was told at the first.
        assert_eq!(model.asked.len(), 7);
        let told = model.asked[3].messages.last().unwrap().text();
        assert!(
            told.contains("`lib.rs` now holds what it held 3 call(s) ago"),
            "{told}"
        );
    }

    #[tokio::test]
    async fn a_greedy_model_warned_of_a_loop_is_sampled_for_the_next_turn() {
        let dir = tempfile::tempdir().unwrap();
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let settings = Settings {
            greedy: true,
            ..Settings::default()
        };
        let mut session = Session::new(toolbox, None, Vec::new(), settings);
        let same = || response("", &[("list_dir", json!({}))]);
        let mut model = Scripted {
            answers: vec![
                same(),
                same(),
                same(),
                response("", &[("glob", json!({ "pattern": "*" }))]),
                response("done", &[]),
            ],
            asked: Vec::new(),
        };
        session
            .send(&mut model, &Log::default(), "look".into())
            .await
            .unwrap();
        let temperatures: Vec<Option<f32>> = model.asked.iter().map(|r| r.temperature).collect();
        // The third call was refused: the fourth turn is sampled, the fifth greedy again.
        assert_eq!(
            temperatures,
            [None, None, None, Some(UNSTICK_TEMPERATURE), None]
        );
    }
}
