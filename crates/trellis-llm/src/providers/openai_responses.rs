//! OpenAI Responses API (`POST {base}/responses`), stateless: the whole conversation is sent as input
//! items every turn.

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::error::{ErrorKind, LlmError};
use crate::http::Transport;
use crate::message::{Part, Request, Response, Role, StopReason, StreamEvent, ToolCall, Usage};
use crate::provider::{OnEvent, Provider};
use crate::providers::openai_chat::u64_at;

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
        if let Some(system) = &request.system {
            body["instructions"] = json!(system);
        }
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| json!({ "type": "function", "name": t.name, "description": t.description, "parameters": t.parameters }))
                .collect();
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
            let data = stream.json(&event)?;
            let kind = data
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or(&event.event);
            match kind {
                "response.output_text.delta" => {
                    if let Some(delta) = data.get("delta").and_then(Value::as_str) {
                        text.push_str(delta);
                        stream.started = true;
                        on_event(StreamEvent::TextDelta(delta.to_owned()));
                    }
                }
                "response.output_item.added" => {
                    let item = &data["item"];
                    if item["type"] == "function_call" {
                        stream.started = true;
                        on_event(StreamEvent::ToolCallStarted {
                            id: item["call_id"].as_str().unwrap_or_default().to_owned(),
                            name: item["name"].as_str().unwrap_or_default().to_owned(),
                        });
                    }
                }
                "response.output_item.done" => {
                    let item = &data["item"];
                    if item["type"] == "function_call" {
                        let arguments = item["arguments"].as_str().unwrap_or("{}");
                        tool_calls.push(ToolCall {
                            id: item["call_id"].as_str().unwrap_or_default().to_owned(),
                            name: item["name"].as_str().unwrap_or_default().to_owned(),
                            arguments: serde_json::from_str(arguments)
                                .unwrap_or_else(|_| Value::String(arguments.to_owned())),
                        });
                    }
                }
                "response.completed" | "response.incomplete" => {
                    let response = &data["response"];
                    let usage = &response["usage"];
                    let incomplete = response
                        .pointer("/incomplete_details/reason")
                        .and_then(Value::as_str);
                    if incomplete == Some("content_filter") {
                        return Err(stream.fail(
                            ErrorKind::ContentFilter,
                            "the answer was withheld by the provider's content filter",
                        ));
                    }
                    let stop_reason = match incomplete {
                        _ if !tool_calls.is_empty() => StopReason::ToolUse,
                        None => StopReason::EndTurn,
                        Some("max_output_tokens") => StopReason::MaxTokens,
                        Some(other) => StopReason::Other(other.to_owned()),
                    };
                    return Ok(Response {
                        model: response["model"]
                            .as_str()
                            .unwrap_or(&request.model)
                            .to_owned(),
                        provider: self.transport.provider.clone(),
                        text,
                        tool_calls,
                        usage: Usage {
                            input_tokens: u64_at(usage, "/input_tokens"),
                            output_tokens: u64_at(usage, "/output_tokens"),
                            cached_tokens: u64_at(usage, "/input_tokens_details/cached_tokens"),
                            reasoning_tokens: u64_at(
                                usage,
                                "/output_tokens_details/reasoning_tokens",
                            ),
                        },
                        stop_reason,
                    });
                }
                "response.failed" | "error" => {
                    let message = data
                        .pointer("/response/error/message")
                        .or_else(|| data.get("message"))
                        .or_else(|| data.pointer("/error/message"))
                        .and_then(Value::as_str)
                        .unwrap_or("the provider reported a failure");
                    let code = data
                        .pointer("/response/error/code")
                        .or_else(|| data.get("code"))
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    let kind = match code {
                        "rate_limit_exceeded" => ErrorKind::RateLimit,
                        "context_length_exceeded" => ErrorKind::ContextLength,
                        _ => ErrorKind::Server,
                    };
                    return Err(stream.fail(kind, message));
                }
                _ => {}
            }
        }
        Err(stream.ended_early())
    }
}
