//! OpenAI Chat Completions (`POST {base}/chat/completions`), which is also what every
//! OpenAI-compatible server speaks — llama-server included. Small local models often answer a tool
//! call as text; with `text_tool_calls` on, a ```` ```json {"name", "arguments"} ```` block or a
//! `<tool_call>` element in the answer counts as a call.

use std::borrow::Cow;
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
use crate::text_tool_calls;

pub struct OpenAiChat {
    transport: Transport,
    /// Parse tool calls written as text (small local models).
    text_tool_calls: bool,
    /// Send `max_completion_tokens` (OpenAI) rather than `max_tokens` (compatible servers).
    max_completion_tokens: bool,
    /// The server is llama-server, which takes `cache_prompt`.
    llama_server: bool,
}

impl OpenAiChat {
    /// OpenAI itself.
    pub fn openai(transport: Transport) -> Self {
        Self {
            transport,
            text_tool_calls: false,
            max_completion_tokens: true,
            llama_server: false,
        }
    }

    /// Any OpenAI-compatible server.
    pub fn compatible(transport: Transport) -> Self {
        Self {
            transport,
            text_tool_calls: true,
            max_completion_tokens: false,
            llama_server: false,
        }
    }

    /// The llama-server Trellis runs the local model on.
    pub fn llama_server(transport: Transport) -> Self {
        Self {
            llama_server: true,
            ..Self::compatible(transport)
        }
    }

    /// The request's tools, and when a call is required, how: a grammar on llama-server, else
    /// `tool_choice`.
    fn offer_tools(&self, request: &Request, body: &mut Value) {
        if request.tools.is_empty() {
            return;
        }
        body["tools"] = request
            .tools
            .iter()
            .map(|t| json!({ "type": "function", "function": { "name": t.name, "description": t.description, "parameters": t.parameters } }))
            .collect();
        match request.tool_choice {
            ToolChoice::Auto => return,
            ToolChoice::None => {
                body["tool_choice"] = json!("none");
                return;
            }
            ToolChoice::Required => {}
        }
        if self.llama_server && request.response_schema.is_none() {
            // Its own tool-call grammar depends on the chat template and does not hold every model
            // to a call; a schema on the answer does.
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": { "name": "tool_call", "schema": call_schema(&request.tools, &request.narrowed) },
            });
        } else {
            body["tool_choice"] = json!("required");
        }
    }

    fn body(&self, request: &Request) -> Value {
        let mut messages = Vec::new();
        // llama-server's chat template puts the tools after the system prompt: what is this
        // session's alone goes at the head of the first user message, so the system prompt and the
        // tools open every session's prompt alike (and its KV cache can be kept across sessions).
        let mut session = None;
        let system = if self.llama_server {
            session = request.system_session.as_deref();
            request.system.as_deref().map(Cow::Borrowed)
        } else {
            request.system_text()
        };
        if let Some(system) = system {
            messages.push(json!({ "role": "system", "content": system }));
        }
        for message in &request.messages {
            let text = message.text();
            match message.role {
                Role::User => {
                    // Results of calls the model wrote as text go back as text too: the model
                    // never saw them as API tool calls, and small models follow a plain exchange.
                    let mut plain: Vec<String> =
                        session.take().map(str::to_owned).into_iter().collect();
                    for part in &message.parts {
                        if let Part::ToolResult(result) = part {
                            if text_tool_calls::is_text_call(&result.call_id) {
                                plain.push(format!(
                                    "Result of {}{}:\n{}",
                                    result.name,
                                    if result.is_error { " (error)" } else { "" },
                                    result.content
                                ));
                                continue;
                            }
                            messages.push(json!({
                                "role": "tool",
                                "tool_call_id": result.call_id,
                                "content": result.content,
                            }));
                        }
                    }
                    if !text.is_empty() {
                        plain.push(text);
                    }
                    if !plain.is_empty() {
                        messages.push(json!({ "role": "user", "content": plain.join("\n\n") }));
                    }
                }
                Role::Assistant => {
                    let calls: Vec<Value> = message
                        .parts
                        .iter()
                        .filter_map(|p| match p {
                            // A call written as text is already in the text.
                            Part::ToolCall(call) if text_tool_calls::is_text_call(&call.id) => None,
                            Part::ToolCall(call) => Some(json!({
                                "id": call.id,
                                "type": "function",
                                "function": { "name": call.name, "arguments": call.arguments.to_string() },
                            })),
                            _ => None,
                        })
                        .collect();
                    let mut m = json!({ "role": "assistant", "content": text });
                    if !calls.is_empty() {
                        m["tool_calls"] = Value::Array(calls);
                    }
                    messages.push(m);
                }
            }
        }
        let mut body = json!({
            "model": request.model,
            "messages": messages,
            "stream": true,
            "stream_options": { "include_usage": true },
        });
        if self.llama_server {
            // The prompt's real size (and what the cache held) comes first, so it is known even
            // when a call written as text cuts the answer short, before the closing usage.
            body["return_progress"] = json!(true);
            if request.cache_prompt {
                // Reuse the KV cache of the slot's last request for the prefix this one shares.
                body["cache_prompt"] = json!(true);
            }
        }
        self.offer_tools(request, &mut body);
        if let Some(max) = request.max_tokens {
            let field = if self.max_completion_tokens {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            body[field] = json!(max);
        }
        if let Some(effort) = request.reasoning_effort {
            body["reasoning_effort"] = json!(effort.as_str());
        }
        if let Some(t) = request.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(format) = &request.response_schema {
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": { "name": format.name, "schema": format.schema, "strict": true },
            });
        }
        body
    }
}

/// One streamed chunk of Chat Completions, as far as Trellis reads it. Every field may be missing or
/// `null`: servers that speak the protocol differ in what they send.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Chunk {
    model: Option<String>,
    usage: Option<ChunkUsage>,
    /// llama-server's count of the prompt, sent before the answer (`return_progress`).
    prompt_progress: Option<PromptProgress>,
    choices: Option<Vec<ChunkChoice>>,
    error: Option<ChunkError>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ChunkUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<CachedTokens>,
    completion_tokens_details: Option<ReasoningTokens>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PromptProgress {
    /// The prompt's tokens.
    total: u64,
    /// Those its KV cache already held.
    cache: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct CachedTokens {
    pub(crate) cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct ReasoningTokens {
    pub(crate) reasoning_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ChunkChoice {
    delta: Option<ChunkDelta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ChunkDelta {
    content: Option<String>,
    tool_calls: Option<Vec<ChunkToolCall>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ChunkToolCall {
    index: Option<u64>,
    id: Option<String>,
    function: Option<ChunkFunction>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ChunkFunction {
    name: Option<String>,
    arguments: Option<String>,
}

/// Usage as OpenAI's APIs report it (Chat Completions and Responses name the fields differently,
/// and agree on the rest): what is missing counts as none.
pub(crate) fn openai_usage(
    input: Option<u64>,
    output: Option<u64>,
    cached: Option<CachedTokens>,
    reasoning: Option<ReasoningTokens>,
) -> Usage {
    Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cached_tokens: cached.and_then(|d| d.cached_tokens).unwrap_or(0),
        reasoning_tokens: reasoning.and_then(|d| d.reasoning_tokens).unwrap_or(0),
    }
}

/// An error in the stream: an object with a message, or just text.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum ChunkError {
    Object {
        #[serde(default)]
        message: Option<String>,
    },
    Text(String),
}

impl ChunkError {
    pub(crate) fn message(&self) -> &str {
        match self {
            ChunkError::Object { message } => message.as_deref().unwrap_or("error in stream"),
            ChunkError::Text(text) => text,
        }
    }
}

/// A tool call assembled from streamed fragments.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

#[async_trait]
#[allow(
    clippy::too_many_lines,
    reason = "one event loop per wire protocol reads best whole"
)]
impl Provider for OpenAiChat {
    fn name(&self) -> &str {
        &self.transport.provider
    }

    async fn stream(&self, request: &Request, on_event: OnEvent<'_>) -> Result<Response, LlmError> {
        let headers = self.transport.bearer();
        let url = self.transport.url("/chat/completions");
        let mut stream = self
            .transport
            .post_sse(&url, &headers, &self.body(request))
            .await?;
        let mut text = String::new();
        let mut calls: BTreeMap<u64, PartialCall> = BTreeMap::new();
        let mut usage = Usage::default();
        let mut counted: Option<PromptProgress> = None;
        let mut finish: Option<String> = None;
        let mut model = request.model.clone();
        let offered: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
        let watch_text_calls =
            self.text_tool_calls && !offered.is_empty() && request.tool_choice != ToolChoice::None;
        let mut checked = 0;
        while let Some(event) = stream.next().await {
            let event = event?;
            if event.data.trim() == "[DONE]" {
                break;
            }
            let chunk: Chunk = stream.parse(stream.json(&event)?)?;
            if let Some(error) = &chunk.error {
                return Err(stream.fail(ErrorKind::Server, error.message()));
            }
            if let Some(m) = chunk.model {
                model = m;
            }
            if let Some(progress) = chunk.prompt_progress {
                counted = Some(progress);
            }
            if let Some(u) = chunk.usage {
                usage = openai_usage(
                    u.prompt_tokens,
                    u.completion_tokens,
                    u.prompt_tokens_details,
                    u.completion_tokens_details,
                );
            }
            let Some(choice) = chunk.choices.and_then(|c| c.into_iter().next()) else {
                continue;
            };
            let delta = choice.delta.unwrap_or_default();
            if let Some(piece) = delta.content.filter(|p| !p.is_empty()) {
                text.push_str(&piece);
                stream.started = true;
                // A local model repeating itself would go on to the output limit, minutes away.
                if self.llama_server && text.len() >= checked + REPETITION_CHECK_BYTES {
                    checked = text.len();
                    if repeating(&text) {
                        on_event(StreamEvent::TextDelta(piece));
                        finish = Some("length".to_owned());
                        usage = cut_usage(request, &text, counted.as_ref());
                        break;
                    }
                }
                let complete_call = watch_text_calls
                    && piece.contains(['`', '>'])
                    && text_tool_calls::has_complete_call(&text, &offered);
                on_event(StreamEvent::TextDelta(piece));
                // A call written as text is complete: stop the answer there (dropping the stream
                // closes the connection, which stops the server generating).
                if complete_call {
                    finish = Some("tool_calls".to_owned());
                    if usage == Usage::default() {
                        usage = cut_usage(request, &text, counted.as_ref());
                    }
                    break;
                }
            }
            for call in delta.tool_calls.into_iter().flatten() {
                let entry = calls.entry(call.index.unwrap_or(0)).or_default();
                if let Some(id) = call.id {
                    entry.id = id;
                }
                let function = call.function.unwrap_or_default();
                if let Some(name) = function.name {
                    entry.name.push_str(&name);
                    stream.started = true;
                    on_event(StreamEvent::ToolCallStarted {
                        id: entry.id.clone(),
                        name: entry.name.clone(),
                    });
                }
                if let Some(args) = function.arguments {
                    entry.arguments.push_str(&args);
                }
            }
            if let Some(reason) = choice.finish_reason {
                finish = Some(reason);
            }
        }
        // Servers send `[DONE]` last; a finish reason with the connection closed is accepted too.
        let Some(finish) = finish else {
            return Err(stream.ended_early());
        };
        if finish == "content_filter" {
            return Err(stream.fail(
                ErrorKind::ContentFilter,
                "the answer was withheld by the provider's content filter",
            ));
        }
        let mut tool_calls: Vec<ToolCall> = calls
            .into_values()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: if c.id.is_empty() {
                    format!("call_{i}")
                } else {
                    c.id
                },
                name: c.name,
                arguments: serde_json::from_str(&c.arguments).unwrap_or(Value::String(c.arguments)),
            })
            .collect();
        if tool_calls.is_empty() && watch_text_calls {
            tool_calls = text_tool_calls::parse(&text, &offered);
        }
        let stop_reason = if tool_calls.is_empty() {
            match finish.as_str() {
                "stop" => StopReason::EndTurn,
                "length" => StopReason::MaxTokens,
                "tool_calls" | "function_call" => StopReason::ToolUse,
                other => StopReason::Other(other.to_owned()),
            }
        } else {
            StopReason::ToolUse
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

/// The longest `thought` a call written under [`call_schema`] may open with.
const THOUGHT_CHARS: u32 = 400;

/// One call of one of `tools`, written as a JSON object: a short thought first (a small model picks
/// a better call after saying what it is about to do), then the tool's name and its arguments under
/// the tool's own schema, or the narrower one given for this turn ([`Request::narrowed`]; a tool
/// narrowed to `false` is left out).
fn call_schema(
    tools: &[crate::message::ToolDef],
    narrowed: &std::collections::BTreeMap<String, Value>,
) -> Value {
    let calls: Vec<Value> = tools
        .iter()
        .filter_map(|tool| {
            let arguments = narrowed.get(&tool.name).unwrap_or(&tool.parameters);
            (*arguments != Value::Bool(false)).then_some((tool, arguments))
        })
        .map(|(tool, arguments)| {
            json!({
                "type": "object",
                "properties": {
                    "thought": { "type": "string", "maxLength": THOUGHT_CHARS },
                    "name": { "const": tool.name },
                    "arguments": arguments,
                },
                "required": ["thought", "name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    json!({ "oneOf": calls })
}

/// How much an answer grows between two looks for repetition.
const REPETITION_CHECK_BYTES: usize = 256;
/// The end of an answer that, found this many times before it, shows the model repeating itself.
const REPEATED_TAIL_CHARS: usize = 100;
const REPEATS: usize = 3;

/// Whether the answer's last 100 characters occur three more times before them: a model stuck
/// repeating itself (a greedy small model going round one sentence), which would not stop before
/// the output limit. The answer is cut there, as if it had reached the limit.
fn repeating(text: &str) -> bool {
    let Some((start, _)) = text.char_indices().rev().nth(REPEATED_TAIL_CHARS - 1) else {
        return false;
    };
    let (before, tail) = text.split_at(start);
    before.matches(tail).take(REPEATS).count() == REPEATS
}

/// Usage for an answer cut short before the server reported its figures: llama-server's count of
/// the prompt where it sent one, else estimated.
fn cut_usage(request: &Request, text: &str, counted: Option<&PromptProgress>) -> Usage {
    let mut usage = estimated_usage(request, text);
    if let Some(counted) = counted {
        usage.input_tokens = counted.total;
        usage.cached_tokens = counted.cache;
    }
    usage
}

/// Usage estimated at four characters a token, for an answer cut short before the server reported
/// its own figures.
fn estimated_usage(request: &Request, text: &str) -> Usage {
    let prompt: usize = request.system_text().map_or(0, |s| s.len())
        + request
            .messages
            .iter()
            .map(|m| serde_json::to_string(m).map_or(0, |s| s.len()))
            .sum::<usize>();
    Usage {
        input_tokens: (prompt as u64).div_ceil(4),
        output_tokens: (text.len() as u64).div_ceil(4),
        ..Usage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    #[test]
    fn calls_written_as_text_go_back_as_text() {
        use crate::message::ToolResult;
        let call = ToolCall {
            id: "text_call_0".into(),
            name: "read_file".into(),
            arguments: json!({ "path": "a" }),
        };
        let request = Request {
            model: "m".into(),
            messages: vec![
                Message::user("read a"),
                Message {
                    role: Role::Assistant,
                    parts: vec![
                        Part::Text {
                            text: "```json\n{...}\n```".into(),
                        },
                        Part::ToolCall(call),
                    ],
                },
                Message {
                    role: Role::User,
                    parts: vec![Part::ToolResult(ToolResult {
                        call_id: "text_call_0".into(),
                        name: "read_file".into(),
                        content: "1\tA".into(),
                        is_error: false,
                    })],
                },
            ],
            ..Request::default()
        };
        let transport = Transport::new("x", "http://127.0.0.1:9/v1", None);
        let body = OpenAiChat::compatible(transport).body(&request);
        assert_eq!(
            body["messages"][1],
            json!({ "role": "assistant", "content": "```json\n{...}\n```" })
        );
        assert_eq!(
            body["messages"][2],
            json!({ "role": "user", "content": "Result of read_file:\n1\tA" })
        );
    }

    #[test]
    fn llama_server_reads_what_is_the_sessions_alone_after_the_tools() {
        let request = Request {
            model: "m".into(),
            system: Some("You are an agent.".into()),
            system_session: Some("The working directory holds:\na.py".into()),
            messages: vec![
                Message::user("Fix a.py."),
                Message::assistant("Done."),
                Message::user("Check it."),
            ],
            ..Request::default()
        };
        let transport = || Transport::new("x", "http://127.0.0.1:9/v1", None);
        // The chat template puts the tools after the system prompt: the session's part goes to the
        // head of the first user message, so every session's prompt opens alike.
        let local = OpenAiChat::llama_server(transport()).body(&request);
        assert_eq!(
            local["messages"],
            json!([
                { "role": "system", "content": "You are an agent." },
                { "role": "user", "content": "The working directory holds:\na.py\n\nFix a.py." },
                { "role": "assistant", "content": "Done." },
                { "role": "user", "content": "Check it." },
            ])
        );
        // Elsewhere the system prompt is whole.
        let other = OpenAiChat::compatible(transport()).body(&request);
        assert_eq!(
            other["messages"][0],
            json!({ "role": "system", "content": "You are an agent.\n\nThe working directory holds:\na.py" })
        );
        assert_eq!(
            other["messages"][1],
            json!({ "role": "user", "content": "Fix a.py." })
        );
    }

    #[test]
    fn openai_and_compatible_servers_name_the_output_limit_differently() {
        let request = Request {
            model: "m".into(),
            system: Some("be brief".into()),
            messages: vec![Message::user("hi")],
            max_tokens: Some(50),
            ..Request::default()
        };
        let transport = || Transport::new("x", "http://127.0.0.1:9/v1", None);
        let openai = OpenAiChat::openai(transport()).body(&request);
        assert_eq!(openai["max_completion_tokens"], 50);
        assert_eq!(
            openai["messages"][0],
            json!({ "role": "system", "content": "be brief" })
        );
        let compatible = OpenAiChat::compatible(transport()).body(&request);
        assert_eq!(compatible["max_tokens"], 50);
        assert!(compatible.get("max_completion_tokens").is_none());
    }

    #[test]
    fn a_required_call_is_a_grammar_on_llama_server_and_tool_choice_elsewhere() {
        let request = Request {
            model: "m".into(),
            messages: vec![Message::user("hi")],
            tools: vec![crate::message::ToolDef {
                name: "read_file".into(),
                description: "Read a file.".into(),
                parameters: json!({ "type": "object", "properties": { "path": { "type": "string" } } }),
            }],
            tool_choice: ToolChoice::Required,
            ..Request::default()
        };
        let transport = || Transport::new("x", "http://127.0.0.1:9/v1", None);
        let local = OpenAiChat::llama_server(transport()).body(&request);
        assert!(local.get("tool_choice").is_none(), "{local}");
        let call = &local["response_format"]["json_schema"]["schema"]["oneOf"][0];
        let keys: Vec<&String> = call["properties"].as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["thought", "name", "arguments"],
            "the thought comes first"
        );
        assert_eq!(call["properties"]["name"]["const"], "read_file");
        assert_eq!(
            call["properties"]["arguments"]["properties"]["path"]["type"],
            "string"
        );
        // A tool narrowed for the turn is held to the narrower schema; one narrowed to `false` is
        // left out of the grammar, not of the tools offered.
        let edit = crate::message::ToolDef {
            name: "edit_file".into(),
            description: "Edit a file.".into(),
            parameters: json!({ "type": "object" }),
        };
        let narrow = json!({ "type": "object", "properties": { "path": { "const": "a.py" } } });
        for (schema, calls) in [(narrow.clone(), 2), (json!(false), 1)] {
            let narrowed = Request {
                tools: vec![request.tools[0].clone(), edit.clone()],
                narrowed: [("edit_file".to_owned(), schema.clone())].into(),
                ..request.clone()
            };
            let body = OpenAiChat::llama_server(transport()).body(&narrowed);
            let offered = body["response_format"]["json_schema"]["schema"]["oneOf"]
                .as_array()
                .unwrap();
            assert_eq!(offered.len(), calls, "{body}");
            assert_eq!(body["tools"].as_array().unwrap().len(), 2);
            if calls == 2 {
                assert_eq!(offered[1]["properties"]["arguments"], narrow);
            }
        }
        let other = OpenAiChat::compatible(transport()).body(&request);
        assert_eq!(other["tool_choice"], "required");
        assert!(other.get("response_format").is_none(), "{other}");
    }

    #[test]
    fn only_llama_server_is_asked_to_cache_the_prompt() {
        let request = Request {
            model: "m".into(),
            messages: vec![Message::user("hi")],
            cache_prompt: true,
            ..Request::default()
        };
        let transport = || Transport::new("x", "http://127.0.0.1:9/v1", None);
        let local = OpenAiChat::llama_server(transport()).body(&request);
        assert_eq!(local["cache_prompt"], true);
        // Its count of the prompt comes before the answer.
        assert_eq!(local["return_progress"], true);
        for other in [
            OpenAiChat::openai(transport()).body(&request),
            OpenAiChat::compatible(transport()).body(&request),
            OpenAiChat::llama_server(transport()).body(&Request {
                cache_prompt: false,
                ..request.clone()
            }),
        ] {
            assert!(other.get("cache_prompt").is_none(), "{other}");
        }
    }

    #[test]
    fn an_answer_that_repeats_its_end_three_times_is_repeating() {
        use std::fmt::Write as _;
        let sentence = "Python script fizzbuzz.py that prints the numbers 1 to 15, one per line, but Fizz for multiples of 3.";
        let start = "```json\n{\"name\":\"write_file\",\"arguments\":{\"content\":\"print(1)}}";
        assert!(!repeating(&format!("{start}{}", sentence.repeat(3))));
        assert!(repeating(&format!("{start}{}", sentence.repeat(4))));
        // Short periods too, and text shorter than the tail never.
        assert!(repeating(&"ab".repeat(200)));
        assert!(!repeating("ab"));
        let mut code = String::new();
        for i in 0..60 {
            let _ = writeln!(code, "    assert f({i}) == {}", i * 2);
        }
        assert!(!repeating(&code));
    }
}
