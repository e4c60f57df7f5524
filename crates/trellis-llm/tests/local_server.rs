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

/// One server at a time: llama-server's threads wait for each other spinning, so three servers of
/// two threads each on two cores took 12 - 53 s for what takes 7 s in turn (2026-12-05).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn the_local_server_starts_answers_and_stops() {
    let Some(files) = trellis_test::local_model_files() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("llama-server.log");
    let provider = std::sync::Arc::new(LocalProvider::new(
        LocalSettings {
            server: Some(files.server),
            model: Some(files.tiny_model),
            model_id: Some("smollm2-135m-instruct".into()),
            context_size: Some(2048),
            prompt_cache: None,
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
    assert_ne!(response.text.trim(), "");
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
    assert_ne!(again.text, "");
    provider.shutdown().await;
}

#[tokio::test]
async fn the_local_default_model_calls_an_offered_tool() {
    let Some(files) = trellis_test::local_model_files() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let provider = std::sync::Arc::new(LocalProvider::new(
        LocalSettings {
            server: Some(files.server),
            model: Some(files.default_model),
            model_id: None,
            context_size: Some(4096),
            prompt_cache: None,
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

/// The opening every session of an agent shares — its system prompt (and tools) — is computed once,
/// saved in the prompt cache and read back by the next server: a later run's first turn finds it
/// cached, whatever its task. The directory is its owner's alone, and the server answers no one
/// without its key.
#[tokio::test]
async fn a_later_server_reads_the_shared_opening_from_the_prompt_cache() {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(files) = trellis_test::local_model_files() else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("prompt-cache");
    let log = dir.path().join("llama-server.log");
    let settings = LocalSettings {
        server: Some(files.server),
        model: Some(files.tiny_model),
        model_id: Some("smollm2-135m-instruct".into()),
        context_size: Some(2048),
        prompt_cache: Some(cache.clone()),
    };
    let system = "You are a careful assistant in a project's directory. Read before you write, \
                  keep every change small, run the project's check after each change and answer \
                  in one short sentence when the work is done and checked."
        .repeat(3);
    let request = |task: &str| Request {
        system: Some(system.clone()),
        system_session: Some(format!("Task number {}.", task.len())),
        messages: vec![Message::user(task)],
        max_tokens: Some(4),
        temperature: Some(0.0),
        cache_prompt: true,
        ..Request::default()
    };
    let saved = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };

    let first = LocalProvider::new(settings.clone(), Some(log.clone()));
    let answer = first.stream(&request("Say hello."), &|_| {}).await.unwrap();
    // The opening was computed on its own and saved; the request read it from the slot.
    let opening = answer.usage.cached_tokens;
    assert!(
        opening > 60 && opening < answer.usage.input_tokens,
        "{:?}",
        answer.usage
    );
    let files_saved = saved();
    assert_eq!(files_saved.len(), 1, "{files_saved:?}");
    assert!(
        std::path::Path::new(&files_saved[0]).extension() == Some("bin".as_ref()),
        "{files_saved:?}"
    );
    assert_eq!(
        std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777,
        0o700
    );
    // The server refuses whoever does not have its key.
    let text = std::fs::read_to_string(&log).unwrap();
    let port = text
        .split("listening on http://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .expect(&text)
        .to_owned();
    let refused = reqwest_free_post(&port, "/v1/chat/completions");
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let refused = reqwest_free_post(&port, "/slots/0?action=save");
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    first.shutdown().await;

    // A new server (the next run) restores it: its first answer reads the opening from the cache.
    let second = LocalProvider::new(settings.clone(), None);
    let answer = second
        .stream(&request("Say goodbye, please."), &|_| {})
        .await
        .unwrap();
    assert_eq!(answer.usage.cached_tokens, opening, "{:?}", answer.usage);
    assert_eq!(saved(), files_saved);
    // Another opening is another file.
    let other = Request {
        system: Some(format!("{system} Be terse.")),
        ..request("Say hello.")
    };
    second.stream(&other, &|_| {}).await.unwrap();
    assert_eq!(saved().len(), 2, "{:?}", saved());
    second.shutdown().await;
}

/// An unauthenticated POST to the local server on `port`: the status line and what follows.
fn reqwest_free_post(port: &str, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    let body = r#"{"filename":"x.bin","messages":[{"role":"user","content":"hi"}]}"#;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}
