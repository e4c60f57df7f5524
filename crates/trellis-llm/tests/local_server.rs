//! The local provider against a real `llama-server` running SmolLM2-135M: Trellis starts the server on
//! a free port, waits for it, streams an answer through the OpenAI-compatible adapter, and stops it.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::sync::Mutex;

use trellis_llm::config::LocalSettings;
use trellis_llm::local::LocalProvider;
use trellis_llm::{Client, Message, Provider, Request, StopReason, StreamEvent};

#[tokio::test]
async fn the_local_server_starts_answers_and_stops() {
    let Some(files) = trellis_test::local_model_files() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("llama-server.log");
    let provider = std::sync::Arc::new(LocalProvider::new(
        LocalSettings {
            server: Some(files.server),
            model: Some(files.tiny_model),
            model_id: Some("smollm2-135m-instruct".into()),
            context_size: Some(2048),
        },
        Some(log.clone()),
    ));
    let client = Client::with_providers(vec![provider.clone()]);
    // No hosted provider: any model name resolves to the local one.
    let resolved = client.resolve(Some("claude-sonnet-4-5"), None).unwrap();
    assert_eq!(resolved.provider, "local");
    assert_eq!(resolved.model, "smollm2-135m-instruct");
    assert!(
        resolved
            .warning
            .as_deref()
            .unwrap()
            .contains("no provider key")
    );

    let request = Request {
        system: Some("You are a helpful assistant.".into()),
        messages: vec![Message::user(
            "What is the capital of France? Answer in one word.",
        )],
        max_tokens: Some(16),
        temperature: Some(0.0),
        ..Request::default()
    };
    let deltas = Mutex::new(String::new());
    let response = client
        .complete(
            &resolved,
            &request,
            &|event| {
                if let StreamEvent::TextDelta(t) = event {
                    deltas.lock().unwrap().push_str(&t);
                }
            },
            &|_, _, _| {},
        )
        .await
        .unwrap();
    assert!(!response.text.trim().is_empty());
    assert_eq!(*deltas.lock().unwrap(), response.text);
    assert!(
        response.usage.input_tokens > 0 && response.usage.output_tokens > 0,
        "{:?}",
        response.usage
    );
    assert!(matches!(
        response.stop_reason,
        StopReason::EndTurn | StopReason::MaxTokens
    ));
    assert!(
        std::fs::metadata(&log).unwrap().len() > 0,
        "the server's output is logged"
    );

    provider.shutdown().await;
    // A call after shutdown starts a fresh server.
    let again = provider.stream(&request, &|_| {}).await.unwrap();
    assert!(!again.text.is_empty());
    provider.shutdown().await;
}

#[tokio::test]
async fn the_local_default_model_calls_an_offered_tool() {
    let Some(files) = trellis_test::local_model_files() else {
        return;
    };
    let provider = std::sync::Arc::new(LocalProvider::new(
        LocalSettings {
            server: Some(files.server),
            model: Some(files.default_model),
            model_id: None,
            context_size: Some(4096),
        },
        None,
    ));
    let request = Request {
        messages: vec![Message::user("Show me what is in the file src/main.rs.")],
        tools: vec![trellis_llm::ToolDef {
            name: "read_file".into(),
            description: "Read a file of the project and return its text".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": { "path": { "type": "string", "description": "The file's path" } },
                "required": ["path"]
            }),
        }],
        max_tokens: Some(128),
        ..Request::default()
    };
    let response = provider.stream(&request, &|_| {}).await.unwrap();
    provider.shutdown().await;
    // Natively or as JSON text, the call comes back as a tool call.
    assert_eq!(response.tool_calls.len(), 1, "{response:?}");
    assert_eq!(response.tool_calls[0].name, "read_file");
    assert_eq!(response.tool_calls[0].arguments["path"], "src/main.rs");
    assert_eq!(response.stop_reason, StopReason::ToolUse);
}
