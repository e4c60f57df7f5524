//! Anthropic Messages (`POST {base}/v1/messages`, `anthropic-version: 2023-06-01`). The base URL has
//! no version suffix, as in Anthropic's SDKs.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ErrorKind, LlmError};
use crate::http::Transport;
use crate::message::{
    Part, Request, Response, Role, StopReason, StreamEvent, ToolCall, ToolChoice, Usage,
};
use crate::provider::{OnEvent, Provider};

/// Anthropic requires `max_tokens`; this is used when a node sets none.
const DEFAULT_MAX_TOKENS: u32 = 8192;

pub struct Anthropic {
    transport: Transport,
}

impl Anthropic {
    pub fn new(transport: Transport) -> Self {
        Self { transport }
    }

    /// The request body. Reasoning settings go out only when the request has a `reasoning_effort`,
    /// which the client keeps for models that reason.
    fn body(request: &Request) -> Value {
        let messages: Vec<Value> = request
            .messages
            .iter()
            .map(|message| {
                let content: Vec<Value> = message
                    .parts
                    .iter()
                    .map(|part| match part {
                        Part::Text { text } => json!({ "type": "text", "text": text }),
                        Part::ToolCall(call) => json!({
                            "type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments,
                        }),
                        Part::ToolResult(result) => json!({
                            "type": "tool_result", "tool_use_id": result.call_id,
                            "content": result.content, "is_error": result.is_error,
                        }),
                    })
                    .collect();
                let role = match message.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                };
                json!({ "role": role, "content": content })
            })
            .collect();
        let max_tokens = request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let mut body = json!({
            "model": request.model,
            "max_tokens": max_tokens,
            "messages": messages,
            "stream": true,
        });
        if let Some(system) = request.system_text() {
            body["system"] = json!(system);
        }
        if request.cache_prompt {
            // Two breakpoints: the system prompt's shared part (the tools come before it, and both
            // are the same for every session of an agent, across nodes and a fan-out's branches),
            // and automatic caching, which puts one after the last block of each request, so the
            // next turn reads the whole conversation so far from the cache.
            let ephemeral = json!({ "type": "ephemeral" });
            if let Some(system) = &request.system {
                let mut blocks =
                    vec![json!({ "type": "text", "text": system, "cache_control": ephemeral })];
                if let Some(session) = &request.system_session {
                    blocks.push(json!({ "type": "text", "text": session }));
                }
                body["system"] = Value::Array(blocks);
            }
            body["cache_control"] = ephemeral;
        }
        let mut tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| json!({ "name": t.name, "description": t.description, "input_schema": t.parameters }))
            .collect();
        // Structured output: a tool the model must call, whose input is the answer.
        if let Some(format) = &request.response_schema {
            tools.push(json!({
                "name": format.name,
                "description": "Give your answer by calling this tool.",
                "input_schema": format.schema,
            }));
            body["tool_choice"] = json!({ "type": "tool", "name": format.name });
        } else if !tools.is_empty() {
            match request.tool_choice {
                ToolChoice::Auto => {}
                ToolChoice::Required => body["tool_choice"] = json!({ "type": "any" }),
                ToolChoice::None => body["tool_choice"] = json!({ "type": "none" }),
            }
        }
        if !tools.is_empty() {
            body["tools"] = Value::Array(tools);
        }
        if let Some(t) = request.temperature {
            body["temperature"] = json!(t);
        }
        // Extended thinking needs a budget below max_tokens; effort picks its share.
        if let Some(effort) = request.reasoning_effort {
            let share = match effort {
                crate::ReasoningEffort::Low => 4,
                crate::ReasoningEffort::Medium => 3,
                crate::ReasoningEffort::High => 2,
            };
            let budget = max_tokens / share;
            if budget >= 1024 {
                body["thinking"] = json!({ "type": "enabled", "budget_tokens": budget });
                // Extended thinking takes no temperature other than the default.
                if let Some(map) = body.as_object_mut() {
                    map.remove("temperature");
                }
            }
        }
        body
    }
}

/// One streamed event of the Messages API, as far as Trellis reads it.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        #[serde(default)]
        message: WireMessage,
    },
    ContentBlockStart {
        #[serde(default)]
        index: u64,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        #[serde(default)]
        index: u64,
        delta: WireDelta,
    },
    MessageDelta {
        #[serde(default)]
        delta: WireStop,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Error {
        #[serde(default)]
        error: WireError,
    },
    /// `ping`, and whatever a newer API adds.
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct WireMessage {
    model: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Deserialize, Default)]
#[serde(default)]
#[allow(clippy::struct_field_names, reason = "the protocol's own field names")]
struct WireUsage {
    input_tokens: u64,
    cache_read_input_tokens: u64,
    cache_creation_input_tokens: u64,
    output_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireBlock {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        #[serde(default)]
        text: String,
    },
    InputJsonDelta {
        #[serde(default)]
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct WireStop {
    stop_reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireError {
    #[serde(rename = "type")]
    kind: String,
    message: Option<String>,
}

#[derive(Default)]
struct Block {
    kind: String,
    id: String,
    name: String,
    json: String,
}

#[async_trait]
#[allow(
    clippy::too_many_lines,
    reason = "one event loop per wire protocol reads best whole"
)]
impl Provider for Anthropic {
    fn name(&self) -> &str {
        &self.transport.provider
    }

    async fn stream(&self, request: &Request, on_event: OnEvent<'_>) -> Result<Response, LlmError> {
        let mut headers = vec![("anthropic-version", "2023-06-01".to_owned())];
        if let Some(key) = &self.transport.key {
            headers.push(("x-api-key", key.expose().to_owned()));
        }
        let url = self.transport.url("/v1/messages");
        let mut stream = self
            .transport
            .post_sse(&url, &headers, &Self::body(request))
            .await?;
        let mut text = String::new();
        let mut blocks: BTreeMap<u64, Block> = BTreeMap::new();
        let mut usage = Usage::default();
        let mut stop: Option<String> = None;
        let mut model = request.model.clone();
        while let Some(event) = stream.next().await {
            let event = event?;
            match stream.typed_event::<WireEvent>(&event)? {
                WireEvent::MessageStart { message } => {
                    if let Some(m) = message.model {
                        model = m;
                    }
                    let u = message.usage;
                    usage.input_tokens =
                        u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
                    usage.cached_tokens = u.cache_read_input_tokens;
                    usage.output_tokens = u.output_tokens.unwrap_or(0);
                }
                WireEvent::ContentBlockStart {
                    index,
                    content_block: block,
                } => {
                    let entry = Block {
                        kind: block.kind,
                        id: block.id,
                        name: block.name,
                        json: String::new(),
                    };
                    if entry.kind == "tool_use" {
                        stream.started = true;
                        on_event(StreamEvent::ToolCallStarted {
                            id: entry.id.clone(),
                            name: entry.name.clone(),
                        });
                    }
                    blocks.insert(index, entry);
                }
                WireEvent::ContentBlockDelta { index, delta } => match delta {
                    WireDelta::TextDelta { text: piece } => {
                        text.push_str(&piece);
                        stream.started = true;
                        on_event(StreamEvent::TextDelta(piece));
                    }
                    WireDelta::InputJsonDelta { partial_json } => {
                        if let Some(block) = blocks.get_mut(&index) {
                            block.json.push_str(&partial_json);
                        }
                    }
                    WireDelta::Other => {}
                },
                WireEvent::MessageDelta { delta, usage: out } => {
                    if let Some(reason) = delta.stop_reason {
                        stop = Some(reason);
                    }
                    if let Some(out) = out.and_then(|u| u.output_tokens) {
                        usage.output_tokens = out;
                    }
                }
                WireEvent::MessageStop => {
                    let tool_calls: Vec<ToolCall> = blocks
                        .into_values()
                        .filter(|b| b.kind == "tool_use")
                        .map(|b| ToolCall {
                            id: b.id,
                            name: b.name,
                            arguments: if b.json.trim().is_empty() {
                                json!({})
                            } else {
                                serde_json::from_str(&b.json).unwrap_or(Value::String(b.json))
                            },
                        })
                        .collect();
                    let stop_reason = match stop.as_deref() {
                        Some("end_turn") | None => StopReason::EndTurn,
                        Some("max_tokens") => StopReason::MaxTokens,
                        Some("tool_use") => StopReason::ToolUse,
                        Some("stop_sequence") => StopReason::StopSequence,
                        Some("refusal") => {
                            return Err(stream
                                .fail(ErrorKind::ContentFilter, "the model refused to answer"));
                        }
                        Some(other) => StopReason::Other(other.to_owned()),
                    };
                    return Ok(Response {
                        model,
                        provider: self.transport.provider.clone(),
                        text,
                        tool_calls,
                        usage,
                        stop_reason,
                    });
                }
                WireEvent::Error { error } => {
                    let message = error.message.as_deref().unwrap_or("error in stream");
                    let kind = match error.kind.as_str() {
                        "overloaded_error" => ErrorKind::Overloaded,
                        "rate_limit_error" => ErrorKind::RateLimit,
                        "invalid_request_error" => ErrorKind::BadRequest,
                        _ => ErrorKind::Server,
                    };
                    return Err(stream.fail(kind, message));
                }
                WireEvent::Other => {}
            }
        }
        Err(stream.ended_early())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    #[test]
    fn thinking_gets_a_budget_below_max_tokens_and_drops_the_temperature() {
        let request = Request {
            model: "claude-sonnet-4-5".into(),
            messages: vec![Message::user("hi")],
            max_tokens: Some(8192),
            reasoning_effort: Some(crate::ReasoningEffort::High),
            temperature: Some(0.0),
            ..Request::default()
        };
        let body = Anthropic::body(&request);
        assert_eq!(body["thinking"]["budget_tokens"], 4096);
        assert!(body.get("temperature").is_none());
        let plain = Anthropic::body(&Request {
            reasoning_effort: None,
            ..request.clone()
        });
        assert!(plain.get("thinking").is_none());
        assert_eq!(plain["temperature"], 0.0);
        // A small output budget leaves no room for thinking.
        let small = Anthropic::body(&Request {
            max_tokens: Some(300),
            ..request
        });
        assert!(small.get("thinking").is_none());
    }

    #[test]
    fn a_conversation_marks_its_system_prompt_and_turns_for_the_cache() {
        let request = Request {
            model: "claude-sonnet-4-5".into(),
            system: Some("be brief".into()),
            messages: vec![Message::user("hi")],
            cache_prompt: true,
            ..Request::default()
        };
        let ephemeral = serde_json::json!({ "type": "ephemeral" });
        let body = Anthropic::body(&request);
        assert_eq!(body["cache_control"], ephemeral);
        assert_eq!(
            body["system"],
            serde_json::json!([{ "type": "text", "text": "be brief", "cache_control": ephemeral }])
        );
        let once = Anthropic::body(&Request {
            cache_prompt: false,
            ..request.clone()
        });
        assert!(once.get("cache_control").is_none());
        assert_eq!(once["system"], "be brief");
        // What is the session's alone follows the marked part, unmarked.
        let session = Anthropic::body(&Request {
            system_session: Some("in /w".into()),
            ..request.clone()
        });
        assert_eq!(
            session["system"],
            serde_json::json!([
                { "type": "text", "text": "be brief", "cache_control": ephemeral },
                { "type": "text", "text": "in /w" }
            ])
        );
        let session_once = Anthropic::body(&Request {
            system_session: Some("in /w".into()),
            cache_prompt: false,
            ..request
        });
        assert_eq!(session_once["system"], "be brief\n\nin /w");
    }
}
