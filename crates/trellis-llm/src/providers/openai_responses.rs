//! OpenAI Responses API (`POST {base}/responses`), stateless: the whole conversation is sent as input
//! items every turn.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ErrorKind, LlmError};
use crate::http::SseStream;
use crate::http::Transport;
use crate::message::{
    Part, Request, Response, Role, StopReason, StreamEvent, ToolCall, ToolChoice,
};
use crate::provider::{OnEvent, Provider};
use crate::providers::openai_chat::{CachedTokens, ReasoningTokens, openai_usage};

pub struct OpenAiResponses {
    transport: Transport,
}

impl OpenAiResponses {
    pub fn new(transport: Transport) -> Self {
        Self { transport }
    }

    fn body(request: &Request) -> Value {
        let mut input = Vec::new();
        for message in &request.messages {
            for part in &message.parts {
                match (message.role, part) {
                    (Role::User, Part::Text { text }) => input.push(json!({
                        "role": "user",
                        "content": [{ "type": "input_text", "text": text }],
                    })),
                    (Role::Assistant, Part::Text { text }) => input.push(json!({
                        "role": "assistant",
                        "content": [{ "type": "output_text", "text": text }],
                    })),
                    (_, Part::ToolCall(call)) => input.push(json!({
                        "type": "function_call",
                        "call_id": call.id,
                        "name": call.name,
                        "arguments": call.arguments.to_string(),
                    })),
                    (_, Part::ToolResult(result)) => input.push(json!({
                        "type": "function_call_output",
                        "call_id": result.call_id,
                        "output": result.content,
                    })),
                }
            }
        }
        let mut body = json!({
            "model": request.model,
            "input": input,
            "stream": true,
            "store": false,
        });
        if let Some(system) = request.system_text() {
            body["instructions"] = json!(system);
        }
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| json!({ "type": "function", "name": t.name, "description": t.description, "parameters": t.parameters }))
                .collect();
            match request.tool_choice {
                ToolChoice::Auto => {}
                ToolChoice::Required => body["tool_choice"] = json!("required"),
                ToolChoice::None => body["tool_choice"] = json!("none"),
            }
        }
        if let Some(max) = request.max_tokens {
            body["max_output_tokens"] = json!(max);
        }
        if let Some(effort) = request.reasoning_effort {
            body["reasoning"] = json!({ "effort": effort.as_str() });
        }
        if let Some(t) = request.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(format) = &request.response_schema {
            body["text"] = json!({ "format": {
                "type": "json_schema", "name": format.name, "schema": format.schema, "strict": true,
            } });
        }
        body
    }
}

#[async_trait]
#[allow(
    clippy::too_many_lines,
    reason = "one event loop per wire protocol reads best whole"
)]
impl Provider for OpenAiResponses {
    fn name(&self) -> &str {
        &self.transport.provider
    }

    async fn stream(&self, request: &Request, on_event: OnEvent<'_>) -> Result<Response, LlmError> {
        let headers = self.transport.bearer();
        let url = self.transport.url("/responses");
        let mut stream = self
            .transport
            .post_sse(&url, &headers, &Self::body(request))
            .await?;
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        while let Some(event) = stream.next().await {
            let event = event?;
            match stream.typed_event::<WireEvent>(&event)? {
                WireEvent::TextDelta { delta } => {
                    text.push_str(&delta);
                    stream.started = true;
                    on_event(StreamEvent::TextDelta(delta));
                }
                WireEvent::ItemAdded { item } if item.kind == "function_call" => {
                    stream.started = true;
                    on_event(StreamEvent::ToolCallStarted {
                        id: item.call_id,
                        name: item.name,
                    });
                }
                WireEvent::ItemDone { item } if item.kind == "function_call" => {
                    let arguments = item.arguments.unwrap_or_else(|| "{}".to_owned());
                    tool_calls.push(ToolCall {
                        id: item.call_id,
                        name: item.name,
                        arguments: serde_json::from_str(&arguments)
                            .unwrap_or(Value::String(arguments)),
                    });
                }
                WireEvent::Completed { response } | WireEvent::Incomplete { response } => {
                    let incomplete = response.incomplete_details.and_then(|d| d.reason);
                    if incomplete.as_deref() == Some("content_filter") {
                        return Err(stream.fail(
                            ErrorKind::ContentFilter,
                            "the answer was withheld by the provider's content filter",
                        ));
                    }
                    let stop_reason = match incomplete {
                        _ if !tool_calls.is_empty() => StopReason::ToolUse,
                        None => StopReason::EndTurn,
                        Some(reason) if reason == "max_output_tokens" => StopReason::MaxTokens,
                        Some(other) => StopReason::Other(other),
                    };
                    let usage = response.usage.unwrap_or_default();
                    return Ok(Response {
                        model: response.model.unwrap_or_else(|| request.model.clone()),
                        provider: self.transport.provider.clone(),
                        text,
                        tool_calls,
                        usage: openai_usage(
                            usage.input_tokens,
                            usage.output_tokens,
                            usage.input_tokens_details,
                            usage.output_tokens_details,
                        ),
                        stop_reason,
                    });
                }
                WireEvent::Failed { response } => {
                    let error = response.and_then(|r| r.error).unwrap_or_default();
                    return Err(failure(
                        &stream,
                        error.code.as_deref(),
                        error.message.as_deref(),
                    ));
                }
                WireEvent::Error {
                    code,
                    message,
                    error,
                } => {
                    let nested = error.unwrap_or_default();
                    return Err(failure(
                        &stream,
                        code.as_deref().or(nested.code.as_deref()),
                        message.as_deref().or(nested.message.as_deref()),
                    ));
                }
                _ => {}
            }
        }
        Err(stream.ended_early())
    }
}
/// One streamed event of the Responses API, as far as Trellis reads it.
#[derive(Deserialize)]
#[serde(tag = "type")]
enum WireEvent {
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        #[serde(default)]
        delta: String,
    },
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        #[serde(default)]
        item: WireItem,
    },
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        #[serde(default)]
        item: WireItem,
    },
    #[serde(rename = "response.completed")]
    Completed {
        #[serde(default)]
        response: WireResponse,
    },
    #[serde(rename = "response.incomplete")]
    Incomplete {
        #[serde(default)]
        response: WireResponse,
    },
    #[serde(rename = "response.failed")]
    Failed {
        #[serde(default)]
        response: Option<WireFailed>,
    },
    #[serde(rename = "error")]
    Error {
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        error: Option<WireError>,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireItem {
    #[serde(rename = "type")]
    kind: String,
    call_id: String,
    name: String,
    arguments: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireResponse {
    model: Option<String>,
    usage: Option<WireUsage>,
    incomplete_details: Option<WireIncomplete>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<CachedTokens>,
    output_tokens_details: Option<ReasoningTokens>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireIncomplete {
    reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireFailed {
    error: Option<WireError>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireError {
    code: Option<String>,
    message: Option<String>,
}

/// The error a failed response or an error event stands for.
fn failure(stream: &SseStream, code: Option<&str>, message: Option<&str>) -> LlmError {
    let kind = match code {
        Some("rate_limit_exceeded") => ErrorKind::RateLimit,
        Some("context_length_exceeded") => ErrorKind::ContextLength,
        _ => ErrorKind::Server,
    };
    stream.fail(kind, message.unwrap_or("the provider reported a failure"))
}
