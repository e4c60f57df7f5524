//! What a coding-agent CLI's machine-readable output says, gathered one JSON line at a time by the
//! CLI's reader (`claude`, `codex`, `gemini` modules): its session, model, tool calls (as
//! [`AgentEvent`]s for the run's events and transcript), usage and cost, and its final answer or
//! failure.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::Value;
use trellis_agent::AgentEvent;
use trellis_llm::Usage;

/// One CLI invocation's output, as read so far.
#[derive(Default)]
pub(super) struct Stream {
    pub session_id: Option<String>,
    pub model: Option<String>,
    /// The final answer, once the CLI reported that it finished.
    pub answer: Option<String>,
    /// The CLI's end said it failed: why.
    pub failure: Option<String>,
    pub usage: Usage,
    pub cost_usd: Option<f64>,
    pub turns: u32,
    /// The last file a reported tool call wrote, as the CLI named it.
    pub last_written: Option<String>,
    /// Assistant text since the last tool call (the answer of CLIs that stream it in pieces).
    pub text: String,
    /// The id of the assistant message being read, for CLIs that split one over several lines.
    pub message_id: Option<String>,
    calls: HashMap<String, OpenCall>,
    /// The last problem the CLI reported and went on after (the cause, if the stream then breaks off).
    pub last_warning: Option<String>,
    /// Events not yet handed to the observer.
    pub events: Vec<AgentEvent>,
}

struct OpenCall {
    tool: String,
    target: String,
    /// The file the call writes, confirmed when it succeeds.
    writes: Option<String>,
    started: Instant,
}

/// The argument a one-line display shows for a tool call: its path, command, pattern or query.
fn target_of(arguments: &Value) -> String {
    const KEYS: &[&str] = &[
        "file_path",
        "absolute_path",
        "notebook_path",
        "path",
        "dir_path",
        "command",
        "pattern",
        "url",
        "query",
    ];
    KEYS.iter()
        .find_map(|key| arguments.get(*key).and_then(Value::as_str))
        .unwrap_or_default()
        .to_owned()
}

/// Text from a string, or from an array of `{"type": "text", "text": ...}` blocks.
pub(super) fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

pub(super) fn u64_at(value: &Value, pointer: &str) -> u64 {
    value.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

pub(super) fn str_at(value: &Value, pointer: &str) -> Option<String> {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_owned)
}

impl Stream {
    pub fn turn_started(&mut self) {
        self.turns += 1;
        self.events
            .push(AgentEvent::TurnStarted { turn: self.turns });
    }

    /// Assistant text: into the transcript, and the answer so far.
    pub fn said(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.text.push_str(text);
        self.events.push(AgentEvent::Text {
            turn: self.turns,
            text: text.to_owned(),
        });
    }

    /// A tool call began; `writes` names the file it changes, if it does.
    pub fn call_started(&mut self, id: &str, tool: &str, arguments: Value, writes: Option<String>) {
        let target = target_of(&arguments);
        self.text.clear();
        self.calls.insert(
            id.to_owned(),
            OpenCall {
                tool: tool.to_owned(),
                target: target.clone(),
                writes,
                started: Instant::now(),
            },
        );
        self.events.push(AgentEvent::ToolCallStarted {
            call_id: id.to_owned(),
            tool: tool.to_owned(),
            target,
            arguments,
        });
    }

    /// A tool call ended. A call whose start was never seen is reported as started now.
    pub fn call_completed(
        &mut self,
        id: &str,
        is_error: bool,
        output: String,
        note: Option<String>,
    ) {
        let Some(call) = self.calls.remove(id) else {
            self.call_started(id, "tool", Value::Null, None);
            return self.call_completed(id, is_error, output, note);
        };
        if !is_error && call.writes.is_some() {
            self.last_written = call.writes;
        }
        self.events.push(AgentEvent::ToolCallCompleted {
            call_id: id.to_owned(),
            tool: call.tool,
            target: call.target,
            is_error,
            duration_ms: u64::try_from(call.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            shown_chars: output.chars().count(),
            output,
            note,
        });
    }

    pub fn has_call(&self, id: &str) -> bool {
        self.calls.contains_key(id)
    }

    /// A problem the CLI reported and went on after.
    pub fn warned(&mut self, message: String) {
        self.last_warning = Some(message.clone());
        self.events.push(AgentEvent::Error { message });
    }

    pub fn finished(&mut self, answer: String) {
        self.answer = Some(answer);
    }

    pub fn failed(&mut self, why: String) {
        self.failure = Some(why);
    }
}
