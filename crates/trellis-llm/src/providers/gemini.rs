//! Google Gemini (`POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse`). The base URL has
//! no version suffix, as in Google's SDKs.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ErrorKind, LlmError};
use crate::http::Transport;
use crate::message::{
    Part, Request, Response, Role, StopReason, StreamEvent, ToolCall, ToolChoice, Usage,
};
use crate::provider::{OnEvent, Provider};
use crate::providers::openai_chat::ChunkError;

pub struct Gemini {
    transport: Transport,
}

impl Gemini {
    pub fn new(transport: Transport) -> Self {
        Self { transport }
    }

    /// The request body. Reasoning settings go out only when the request has a `reasoning_effort`,
    /// which the client keeps for models that reason.
    fn body(request: &Request) -> Value {
        let contents: Vec<Value> = request
            .messages
            .iter()
            .map(|message| {
                let parts: Vec<Value> = message
                    .parts
                    .iter()
                    .map(|part| match part {
                        Part::Text { text } => json!({ "text": text }),
                        Part::ToolCall(call) => {
                            json!({ "functionCall": { "name": call.name, "args": call.arguments } })
                        }
                        Part::ToolResult(result) => json!({ "functionResponse": {
                            "name": result.name,
                            "response": { "content": result.content, "is_error": result.is_error },
                        } }),
                    })
                    .collect();
                let role = match message.role {
                    Role::User => "user",
                    Role::Assistant => "model",
                };
                json!({ "role": role, "parts": parts })
            })
            .collect();
        let mut body = json!({ "contents": contents });
        if let Some(system) = request.system_text() {
            body["systemInstruction"] = json!({ "parts": [{ "text": system }] });
        }
        if !request.tools.is_empty() {
            let declarations: Vec<Value> = request
                .tools
                .iter()
                .map(|t| json!({ "name": t.name, "description": t.description, "parameters": t.parameters }))
                .collect();
            body["tools"] = json!([{ "functionDeclarations": declarations }]);
            let mode = match request.tool_choice {
                ToolChoice::Auto => None,
                ToolChoice::Required => Some("ANY"),
                ToolChoice::None => Some("NONE"),
            };
            if let Some(mode) = mode {
                body["toolConfig"] = json!({ "functionCallingConfig": { "mode": mode } });
            }
        }
        let mut config = serde_json::Map::new();
        if let Some(max) = request.max_tokens {
            config.insert("maxOutputTokens".into(), json!(max));
        }
        if let Some(t) = request.temperature {
            config.insert("temperature".into(), json!(t));
        }
        if let Some(effort) = request.reasoning_effort {
            let budget = match effort {
                crate::ReasoningEffort::Low => 1024,
                crate::ReasoningEffort::Medium => 8192,
                crate::ReasoningEffort::High => 24576,
            };
            config.insert("thinkingConfig".into(), json!({ "thinkingBudget": budget }));
        }
        if let Some(format) = &request.response_schema {
            config.insert("responseMimeType".into(), json!("application/json"));
            config.insert(
                "responseSchema".into(),
                format.without_additional_properties(),
            );
        }
        if !config.is_empty() {
            body["generationConfig"] = Value::Object(config);
        }
        body
    }
}

/// One streamed chunk of `streamGenerateContent`, as far as Trellis reads it.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Chunk {
    model_version: Option<String>,
    usage_metadata: Option<WireUsage>,
    candidates: Option<Vec<WireCandidate>>,
    prompt_feedback: Option<WireFeedback>,
    error: Option<ChunkError>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
#[allow(clippy::struct_field_names, reason = "the protocol's own field names")]
struct WireUsage {
    prompt_token_count: Option<u64>,
    candidates_token_count: Option<u64>,
    thoughts_token_count: Option<u64>,
    cached_content_token_count: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireCandidate {
    content: Option<WireContent>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireContent {
    parts: Option<Vec<WirePart>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WirePart {
    text: Option<String>,
    thought: Option<bool>,
    function_call: Option<WireCall>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireCall {
    id: Option<String>,
    name: Option<String>,
    args: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireFeedback {
    block_reason: Option<String>,
}

#[async_trait]
#[allow(
    clippy::too_many_lines,
    reason = "one event loop per wire protocol reads best whole"
)]
impl Provider for Gemini {
    fn name(&self) -> &str {
        &self.transport.provider
    }

    async fn stream(&self, request: &Request, on_event: OnEvent<'_>) -> Result<Response, LlmError> {
        let mut headers = Vec::new();
        if let Some(key) = &self.transport.key {
            headers.push(("x-goog-api-key", key.expose().to_owned()));
        }
        let url = self.transport.url(&format!(
            "/v1beta/models/{}:streamGenerateContent?alt=sse",
            request.model
        ));
        let mut stream = self
            .transport
            .post_sse(&url, &headers, &Self::body(request))
            .await?;
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        let mut usage = Usage::default();
        let mut finish: Option<String> = None;
        let mut model = request.model.clone();
        while let Some(event) = stream.next().await {
            let event = event?;
            let chunk: Chunk = stream.parse(stream.json(&event)?)?;
            if let Some(error) = &chunk.error {
                return Err(stream.fail(ErrorKind::Server, error.message()));
            }
            if let Some(m) = chunk.model_version {
                model = m;
            }
            if let Some(u) = chunk.usage_metadata {
                let thoughts = u.thoughts_token_count.unwrap_or(0);
                usage = Usage {
                    input_tokens: u.prompt_token_count.unwrap_or(0),
                    output_tokens: u.candidates_token_count.unwrap_or(0) + thoughts,
                    cached_tokens: u.cached_content_token_count.unwrap_or(0),
                    reasoning_tokens: thoughts,
                };
            }
            let Some(candidate) = chunk.candidates.and_then(|c| c.into_iter().next()) else {
                if let Some(reason) = chunk.prompt_feedback.and_then(|f| f.block_reason) {
                    return Err(stream.fail(
                        ErrorKind::ContentFilter,
                        format!("the prompt was blocked ({reason})"),
                    ));
                }
                continue;
            };
            let parts = candidate.content.and_then(|c| c.parts).unwrap_or_default();
            for part in parts.into_iter().filter(|p| p.thought != Some(true)) {
                if let Some(piece) = part.text {
                    text.push_str(&piece);
                    stream.started = true;
                    on_event(StreamEvent::TextDelta(piece));
                }
                if let Some(call) = part.function_call {
                    let name = call.name.unwrap_or_default();
                    let id = call
                        .id
                        .unwrap_or_else(|| format!("call_{}", tool_calls.len()));
                    stream.started = true;
                    on_event(StreamEvent::ToolCallStarted {
                        id: id.clone(),
                        name: name.clone(),
                    });
                    tool_calls.push(ToolCall {
                        id,
                        name,
                        arguments: call.args.unwrap_or_else(|| json!({})),
                    });
                }
            }
            if let Some(reason) = candidate.finish_reason {
                finish = Some(reason);
            }
        }
        let Some(finish) = finish else {
            return Err(stream.ended_early());
        };
        let stop_reason = match finish.as_str() {
            _ if !tool_calls.is_empty() => StopReason::ToolUse,
            "STOP" => StopReason::EndTurn,
            "MAX_TOKENS" => StopReason::MaxTokens,
            "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" => {
                return Err(stream.fail(
                    ErrorKind::ContentFilter,
                    format!("the answer was blocked ({finish})"),
                ));
            }
            other => StopReason::Other(other.to_owned()),
        };
        Ok(Response {
            model,
            provider: self.transport.provider.clone(),
            text,
            tool_calls,
            usage,
            stop_reason,
        })
    }
}
