//! The provider-neutral conversation: what a caller sends ([`Request`]) and gets back ([`Response`]).
//! Every provider adapter translates these to and from its own wire format.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text { text: String },
    ToolCall(ToolCall),
    ToolResult(ToolResult),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call, echoed back with its result.
    pub id: String,
    pub name: String,
    /// The arguments as JSON (an object for well-formed calls).
    pub arguments: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: String,
    /// The tool's name (Gemini matches results by name, not id).
    pub name: String,
    pub content: String,
    pub is_error: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

impl Message {
    pub fn user(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            parts: vec![Part::Text { text: text.into() }],
        }
    }

    pub fn assistant(text: impl Into<String>) -> Self {
        Self {
            role: Role::Assistant,
            parts: vec![Part::Text { text: text.into() }],
        }
    }

    /// The concatenated text parts.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// A JSON Schema object for the arguments.
    pub parameters: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningEffort {
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The provider's model id (aliases are resolved before a request is built).
    pub model: String,
    /// The system prompt: for an agent, what every session of it shares.
    pub system: Option<String>,
    /// What the system prompt says about this session alone (the working directory's files, the
    /// example call), kept apart so that what comes before it — `system` and the tools — is the
    /// same for every session and a prompt cache serves it across them. llama-server reads it at
    /// the head of the first user message (a chat template puts the tools after the system
    /// prompt); the other providers after `system` ([`Request::system_text`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub system_session: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    pub max_tokens: Option<u32>,
    /// Sent only to models that reason.
    pub reasoning_effort: Option<ReasoningEffort>,
    pub temperature: Option<f32>,
    /// Structured output: the answer is one JSON value matching this schema, enforced by the
    /// provider (OpenAI's and compatible servers' `json_schema`, an Anthropic tool the model must
    /// call, Gemini's `responseSchema`). The answer's text is that JSON.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub response_schema: Option<ResponseSchema>,
    /// The request is one turn of a conversation that grows turn by turn (an agent session): the
    /// provider is asked to cache its prefix for the next turn where it must be asked (Anthropic's
    /// `cache_control`; llama-server's `cache_prompt`). OpenAI and Gemini cache a repeated prefix
    /// by themselves.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub cache_prompt: bool,
    /// Whether the answer may call a tool ([`ToolChoice`]); the tools are offered, and so shown
    /// to the model, either way.
    #[serde(skip_serializing_if = "ToolChoice::is_auto", default)]
    pub tool_choice: ToolChoice,
    /// For this turn, by tool name, a schema narrower than the tool's own that a required call's
    /// arguments must match where a grammar holds the call (llama-server): the arguments the
    /// session knows can work (an edit's `old_string` one of the lines of a file it has seen).
    /// `false` (the schema nothing matches) leaves the tool out of the grammar. The tools offered,
    /// and so the prompt the model reads, stay as they are.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub narrowed: BTreeMap<String, Value>,
}

impl Request {
    /// The whole system prompt: `system`, then `system_session` after a blank line.
    pub fn system_text(&self) -> Option<std::borrow::Cow<'_, str>> {
        match (self.system.as_deref(), self.system_session.as_deref()) {
            (Some(system), Some(session)) => Some(format!("{system}\n\n{session}").into()),
            (Some(text), None) | (None, Some(text)) => Some(text.into()),
            (None, None) => None,
        }
    }
}

/// Whether an answer may, must or must not call one of the request's tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The answer calls one of the tools (OpenAI's `tool_choice: "required"`, Anthropic's `any`,
    /// Gemini's `ANY`). On llama-server the answer is held by a grammar to one call written as
    /// JSON — a short `thought`, then the tool's `name` and `arguments` matching its schema — so a
    /// small model cannot write a malformed call or answer with prose.
    Required,
    /// The answer is text, and a call written in it is not taken for one (OpenAI's and Anthropic's
    /// `none`, Gemini's `NONE`): the tools stay in the prompt, so a prompt cache still serves it.
    None,
}

impl ToolChoice {
    pub fn is_auto(&self) -> bool {
        *self == ToolChoice::Auto
    }
}

/// A JSON Schema an answer must match, and its name (letters, digits, `_`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseSchema {
    pub name: String,
    pub schema: serde_json::Value,
}

impl ResponseSchema {
    /// The schema without `additionalProperties` (Gemini's schema dialect refuses it).
    pub fn without_additional_properties(&self) -> serde_json::Value {
        fn strip(value: &serde_json::Value) -> serde_json::Value {
            match value {
                serde_json::Value::Object(map) => map
                    .iter()
                    .filter(|(k, _)| k.as_str() != "additionalProperties")
                    .map(|(k, v)| (k.clone(), strip(v)))
                    .collect::<serde_json::Map<_, _>>()
                    .into(),
                serde_json::Value::Array(items) => items.iter().map(strip).collect(),
                other => other.clone(),
            }
        }
        strip(&self.schema)
    }
}

/// Token counts of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from the provider's prompt cache.
    pub cached_tokens: u64,
    /// Output tokens spent on hidden reasoning.
    pub reasoning_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_tokens += other.cached_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its answer.
    EndTurn,
    /// The answer hit the output token limit.
    MaxTokens,
    /// The model wants tool results before it goes on.
    ToolUse,
    /// A stop sequence ended the answer.
    StopSequence,
    /// Anything else the provider reported, verbatim.
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The model that answered, as the provider names it.
    pub model: String,
    pub provider: String,
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub stop_reason: StopReason,
}

impl Response {
    /// The assistant message to append to the conversation for the next turn.
    pub fn to_message(&self) -> Message {
        let mut parts = Vec::new();
        if !self.text.is_empty() {
            parts.push(Part::Text {
                text: self.text.clone(),
            });
        }
        parts.extend(self.tool_calls.iter().cloned().map(Part::ToolCall));
        Message {
            role: Role::Assistant,
            parts,
        }
    }
}

/// What a streaming call reports while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    TextDelta(String),
    ToolCallStarted { id: String, name: String },
}
