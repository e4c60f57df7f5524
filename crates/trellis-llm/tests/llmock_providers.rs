//! The provider clients against llmock, a real HTTP peer that speaks each provider's API: streamed
//! text, usage, scripted tool calls, and the faults providers really produce — 429 with Retry-After,
//! overload, auth errors, context overflow, dropped and truncated streams.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use trellis_llm::config::ProviderSettings;
use trellis_llm::{
    Client, ErrorKind, LlmError, Message, Provider, Request, RetryPolicy, Secret, StopReason,
    StreamEvent, ToolDef, build_provider,
};
use trellis_test::Llmock;

const KEY: &str = "sk-test-DO-NOT-LEAK-4242";

/// (provider, API flavour, base path on llmock, a model it knows).
const PROVIDERS: &[(&str, Option<&str>, &str, &str)] = &[
    ("anthropic", None, "/anthropic", "claude-sonnet-4-5"),
    ("openai", Some("responses"), "/v1", "gpt-5"),
    ("openai", Some("chat"), "/v1", "gpt-5"),
    ("gemini", None, "/gemini", "gemini-2.5-pro"),
    ("openai-compatible", None, "/v1", "my-local-model"),
];

fn provider(mock: &Llmock, name: &str, api: Option<&str>, base: &str) -> Arc<dyn Provider> {
    let settings = ProviderSettings {
        api_key: Some(Secret::new(KEY)),
        base_url: Some(mock.url(base)),
        api: api.map(str::to_owned),
        context_window: None,
    };
    build_provider(name, &settings)
}

fn client(provider: Arc<dyn Provider>) -> Client {
    let mut client = Client::with_providers(vec![provider]);
    client.retry = RetryPolicy {
        max_attempts: 4,
        backoff: trellis_process::backoff::Backoff {
            initial: Duration::from_millis(50),
            factor: 2.0,
            max: Duration::from_secs(2),
        },
    };
    client
}

fn request(model: &str, text: &str) -> Request {
    Request {
        model: model.into(),
        system: Some("You are terse.".into()),
        messages: vec![Message::user(text)],
        max_tokens: Some(200),
        ..Request::default()
    }
}

async fn call(
    client: &Client,
    model: &str,
    request: &Request,
) -> (Result<trellis_llm::Response, LlmError>, usize, Vec<String>) {
    let provider = client.providers().next().unwrap().to_owned();
    let resolved = client.resolve(Some(model), Some(&provider)).unwrap();
    let retries = AtomicUsize::new(0);
    let deltas = std::sync::Mutex::new(Vec::new());
    let result = client
        .complete(
            &resolved,
            request,
            &|event| {
                if let StreamEvent::TextDelta(t) = event {
                    deltas.lock().unwrap().push(t);
                }
            },
            &|_, _, _| {
                retries.fetch_add(1, Ordering::SeqCst);
            },
        )
        .await;
    (
        result,
        retries.load(Ordering::SeqCst),
        deltas.into_inner().unwrap(),
    )
}

#[tokio::test]
async fn every_provider_streams_text_with_usage_and_a_stop_reason() {
    let Some(mock) = Llmock::start() else { return };
    for &(name, api, base, model) in PROVIDERS {
        let client = client(provider(&mock, name, api, base));
        let (result, retries, deltas) = call(&client, model, &request(model, "Say hello")).await;
        let response = result.unwrap_or_else(|e| panic!("{name}/{api:?}: {e}"));
        assert!(!response.text.is_empty(), "{name}: empty text");
        assert!(
            deltas.len() > 1,
            "{name}: the answer did not stream ({deltas:?})"
        );
        assert_eq!(
            deltas.concat(),
            response.text,
            "{name}: deltas add up to the text"
        );
        assert!(
            response.usage.output_tokens > 0,
            "{name}: no usage: {:?}",
            response.usage
        );
        assert_eq!(response.stop_reason, StopReason::EndTurn, "{name}");
        assert_eq!(retries, 0);
    }
}

#[tokio::test]
async fn every_provider_returns_scripted_tool_calls_and_takes_tool_results() {
    let Some(mock) = Llmock::start() else { return };
    let tools = vec![ToolDef {
        name: "read_file".into(),
        description: "Read a file".into(),
        parameters: json!({ "type": "object", "properties": { "path": { "type": "string" } }, "required": ["path"] }),
    }];
    for &(name, api, base, model) in PROVIDERS {
        mock.scenario(&json!([{ "type": "reply", "tool_calls": [{ "name": "read_file", "arguments": { "path": "src/main.rs" } }], "times": 1 }]));
        let client = client(provider(&mock, name, api, base));
        let mut req = request(model, "Read src/main.rs");
        req.tools.clone_from(&tools);
        let (result, _, _) = call(&client, model, &req).await;
        let response = result.unwrap_or_else(|e| panic!("{name}/{api:?}: {e}"));
        assert_eq!(response.tool_calls.len(), 1, "{name}/{api:?}: {response:?}");
        assert_eq!(response.tool_calls[0].name, "read_file");
        assert_eq!(
            response.tool_calls[0].arguments["path"], "src/main.rs",
            "{name}"
        );
        assert_eq!(response.stop_reason, StopReason::ToolUse, "{name}");
        // The conversation goes on with the tool's result, in each provider's own shape.
        let tool_call = response.tool_calls[0].clone();
        req.messages.push(response.to_message());
        req.messages.push(Message {
            role: trellis_llm::Role::User,
            parts: vec![trellis_llm::Part::ToolResult(trellis_llm::ToolResult {
                call_id: tool_call.id,
                name: tool_call.name,
                content: "fn main() {}".into(),
                is_error: false,
            })],
        });
        let (result, _, _) = call(&client, model, &req).await;
        let response =
            result.unwrap_or_else(|e| panic!("{name}/{api:?} after the tool result: {e}"));
        assert!(
            response.tool_calls.is_empty() && !response.text.is_empty(),
            "{name}: {response:?}"
        );
    }
}

#[tokio::test]
async fn rate_limits_are_retried_after_the_retry_after_wait() {
    let Some(mock) = Llmock::start() else { return };
    for &(name, api, base, model) in PROVIDERS {
        mock.reset();
        mock.scenario(&json!([{ "type": "fail", "status": 429, "retry_after": 0.3, "times": 2 }]));
        let client = client(provider(&mock, name, api, base));
        let started = std::time::Instant::now();
        let (result, retries, _) =
            call(&client, model, &request(model, "Hello after a rate limit")).await;
        result.unwrap_or_else(|e| panic!("{name}/{api:?}: {e}"));
        assert_eq!(retries, 2, "{name}");
        assert!(
            started.elapsed() >= Duration::from_millis(600),
            "{name}: Retry-After was not honoured"
        );
        let verdict = mock.verdict();
        assert!(
            !verdict.to_string().contains("retry_after_ignored"),
            "{name}: llmock says: {verdict}"
        );
    }
}

#[tokio::test]
async fn overload_and_server_errors_are_retried_then_reported_typed() {
    let Some(mock) = Llmock::start() else { return };
    let (name, api, base, model) = PROVIDERS[0];
    let client = client(provider(&mock, name, api, base));
    mock.scenario(&json!([{ "type": "fail", "status": 529, "times": 1 }]));
    let (result, retries, _) = call(&client, model, &request(model, "overloaded once")).await;
    result.unwrap();
    assert_eq!(retries, 1);
    mock.scenario(&json!([{ "type": "fail", "status": 500, "times": null }]));
    let (result, retries, _) = call(&client, model, &request(model, "always failing")).await;
    let error = result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Server);
    assert!(error.retryable());
    assert_eq!(retries, 3, "four attempts in all");
    mock.reset();
}

#[tokio::test]
async fn auth_and_bad_requests_fail_at_once_without_leaking_the_key() {
    let Some(mock) = Llmock::start() else { return };
    for &(name, api, base, model) in PROVIDERS {
        mock.reset();
        mock.scenario(&json!([{ "type": "fail", "status": 401, "times": 1 }]));
        let client = client(provider(&mock, name, api, base));
        let (result, retries, _) = call(&client, model, &request(model, "who am I")).await;
        let error = result.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Auth, "{name}: {error}");
        assert!(!error.retryable());
        assert_eq!(retries, 0, "{name}: an auth error was retried");
        assert!(!error.to_string().contains(KEY), "{name}: {error}");
        assert!(!format!("{error:?}").contains(KEY));
        mock.scenario(&json!([{ "type": "fail", "status": 400, "times": 1 }]));
        let (result, retries, _) = call(&client, model, &request(model, "bad")).await;
        assert_eq!(result.unwrap_err().kind, ErrorKind::BadRequest, "{name}");
        assert_eq!(retries, 0);
    }
}

#[tokio::test]
async fn context_overflow_is_reported_as_such() {
    let Some(mock) = Llmock::start() else { return };
    for &(name, api, base, model) in PROVIDERS {
        mock.scenario(&json!([{
            "type": "fail", "status": 400, "code": "context_length_exceeded",
            "message": "This model's maximum context length was exceeded.", "times": 1,
        }]));
        let client = client(provider(&mock, name, api, base));
        let (result, retries, _) =
            call(&client, model, &request(model, "a very long prompt")).await;
        let error = result.unwrap_err();
        assert_eq!(
            error.kind,
            ErrorKind::ContextLength,
            "{name}/{api:?}: {error}"
        );
        assert_eq!(retries, 0);
    }
}

#[tokio::test]
async fn broken_streams_fail_and_are_never_retried_after_output() {
    let Some(mock) = Llmock::start() else { return };
    for kind in ["disconnect", "truncate", "malformed"] {
        let mut failed_after_output = 0;
        for &(name, api, base, model) in PROVIDERS {
            mock.reset();
            mock.scenario(
                &json!([{ "type": "stream_fault", "kind": kind, "after_chunks": 6, "times": 1 }]),
            );
            let client = client(provider(&mock, name, api, base));
            let prompt = "tell me a long story about a river";
            let (result, retries, deltas) = call(&client, model, &request(model, prompt)).await;
            let requests = mock.requests().len();
            assert_eq!(requests, 1 + retries, "{name} {kind}");
            match result {
                // The fault came before any text: a retry is safe, and it succeeded.
                Ok(_) => assert!(retries >= 1, "{name}/{api:?}: a {kind} stream was accepted"),
                Err(error) => {
                    assert!(
                        matches!(error.kind, ErrorKind::Network | ErrorKind::Protocol),
                        "{name}/{api:?} {kind}: {error}"
                    );
                    assert!(
                        !deltas.is_empty(),
                        "{name} {kind}: failed without output: {error}"
                    );
                    assert!(error.partial_output, "{name} {kind}: {error}");
                    assert_eq!(retries, 0, "{name} {kind}: retried after partial output");
                    failed_after_output += 1;
                }
            }
        }
        assert!(
            failed_after_output >= 3,
            "{kind}: only {failed_after_output} providers broke after output"
        );
    }
    let verdict: Value = mock.verdict();
    assert!(
        !verdict.to_string().contains("truncated_stream_accepted"),
        "{verdict}"
    );
}

#[tokio::test]
async fn every_provider_is_asked_for_structured_output_in_its_own_terms() {
    let Some(mock) = Llmock::start() else { return };
    let schema = json!({
        "type": "object",
        "properties": { "reason": { "type": "string" }, "choice": { "type": "string", "enum": ["fix", "ship"] } },
        "required": ["reason", "choice"],
        "additionalProperties": false,
    });
    for &(name, api, base, model) in PROVIDERS {
        mock.reset();
        let answer = json!({ "reason": "the tests fail", "choice": "fix" });
        let reply = if name == "anthropic" {
            // Anthropic answers structured output by calling the answer tool.
            json!([{ "type": "reply", "tool_calls": [{ "name": "route", "arguments": answer }], "times": 1 }])
        } else {
            json!([{ "type": "reply", "text": answer.to_string(), "times": 1 }])
        };
        mock.scenario(&reply);
        let client = client(provider(&mock, name, api, base));
        let mut ask = request(model, "Which way?");
        ask.response_schema = Some(trellis_llm::ResponseSchema {
            name: "route".into(),
            schema: schema.clone(),
        });
        let (result, _, _) = call(&client, model, &ask).await;
        let response = result.unwrap_or_else(|e| panic!("{name}/{api:?}: {e}"));
        let parsed: Value = serde_json::from_str(&response.text)
            .unwrap_or_else(|e| panic!("{name}/{api:?}: {e}: {}", response.text));
        assert_eq!(parsed, answer, "{name}/{api:?}");
        assert!(
            response.tool_calls.is_empty(),
            "{name}: the answer tool is not a tool call"
        );
        assert_eq!(response.stop_reason, StopReason::EndTurn, "{name}");
        let body = &mock.requests()[0]["body"];
        match (name, api) {
            ("anthropic", _) => {
                assert_eq!(
                    body["tool_choice"],
                    json!({ "type": "tool", "name": "route" })
                );
                let tool = body["tools"].as_array().unwrap().last().unwrap();
                assert_eq!(tool["name"], "route");
                assert_eq!(tool["input_schema"], schema);
            }
            ("openai", Some("responses")) => {
                assert_eq!(
                    body["text"]["format"],
                    json!({ "type": "json_schema", "name": "route", "schema": schema, "strict": true })
                );
            }
            ("gemini", _) => {
                let config = &body["generationConfig"];
                assert_eq!(config["responseMimeType"], "application/json");
                let mut expected = schema.clone();
                expected
                    .as_object_mut()
                    .unwrap()
                    .remove("additionalProperties");
                assert_eq!(
                    config["responseSchema"], expected,
                    "Gemini's dialect has no additionalProperties"
                );
            }
            _ => {
                assert_eq!(
                    body["response_format"],
                    json!({ "type": "json_schema", "json_schema": { "name": "route", "schema": schema, "strict": true } }),
                    "{name}/{api:?}"
                );
            }
        }
    }
}
