//! Benchmark: how an agent session's turns slow down as it grows (`cargo bench -p trellis-llm --bench
//! turn_latency`). Trellis starts the local model (Qwen2.5-Coder-1.5B, as `trellis run` does) and
//! sends a 20-turn conversation through the client the agent loop uses: each request is the last one
//! plus the answer and a new message of the same size (a tool result of about 300 tokens), with
//! `cache_prompt` set, and each answer is 16 tokens long. With the server's KV cache reused, every
//! turn processes only its new tokens, so the last turn takes about as long as the second.
//!
//! Prints each turn's input, cached input and wall time, and the last turn's time over the second's
//! beside its target (≤ 1.5×).

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::fmt::Write as _;
use std::time::Instant;

use trellis_llm::config::LocalSettings;
use trellis_llm::local::LocalProvider;
use trellis_llm::{Client, Message, Request};

const TURNS: usize = 20;
const ANSWER_TOKENS: u32 = 16;
/// The target: the last turn's time over the second's.
const TARGET_RATIO: f64 = 1.5;

/// A tool result of the same size every turn, different each turn (as a listing of a new file).
fn tool_result(turn: usize) -> String {
    let mut text = format!("Output of `cat part{turn}.txt`:\n");
    for line in 1..=30 {
        let _ = writeln!(
            text,
            "{line:>4}  entry {turn}-{line}: value {}",
            turn * 31 + line
        );
    }
    text.push_str("Go on: count on from where you stopped, in words.");
    text
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(files) = trellis_test::local_model_files() else {
        println!(
            "turn_latency: skipped (the local model is not installed: scripts/local-model.sh)"
        );
        return;
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    let provider = std::sync::Arc::new(LocalProvider::new(
        LocalSettings {
            server: Some(files.server),
            model: Some(files.default_model),
            model_id: Some("qwen2.5-coder-1.5b-instruct".into()),
            context_size: None,
            prompt_cache: None,
        },
        Some(dir.path().join("llama-server.log")),
    ));
    let client = Client::with_providers(vec![provider]);
    let resolved = client.resolve(None, None).expect("the local model");
    let mut request = Request {
        system: Some(
            "You are a coding agent working in a project's directory. Count in words, one number \
             after another, and never stop."
                .into(),
        ),
        messages: vec![Message::user("Count from one, in words.")],
        max_tokens: Some(ANSWER_TOKENS),
        temperature: Some(0.0),
        cache_prompt: true,
        ..Request::default()
    };
    println!(
        "turn latency on {} (local), {TURNS} turns of one ~300-token message and a {ANSWER_TOKENS}-token answer each",
        resolved.model
    );
    println!("  turn      input   cached   wall ms");
    let mut times = Vec::with_capacity(TURNS);
    for turn in 1..=TURNS {
        let started = Instant::now();
        let response = client
            .complete(&resolved, &request, &|_| {}, &|_, _, _| {})
            .await
            .expect("the local model answers");
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        times.push(elapsed);
        println!(
            "  {turn:>4} {:>10} {:>8} {elapsed:>9.0}",
            response.usage.input_tokens, response.usage.cached_tokens
        );
        request.messages.push(Message::assistant(response.text));
        request.messages.push(Message::user(tool_result(turn)));
    }
    let ratio = times[TURNS - 1] / times[1];
    let verdict = if ratio <= TARGET_RATIO {
        "met"
    } else {
        "MISSED"
    };
    println!(
        "turn {TURNS} / turn 2: {ratio:.2}× [≤ {TARGET_RATIO}×] {verdict} ({:.0} ms / {:.0} ms)",
        times[TURNS - 1],
        times[1]
    );
}
