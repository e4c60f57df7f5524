//! Benchmark: what Trellis adds to each model call (`cargo bench -p trellis-cli --bench model_latency`).
//! One llama-server with the tiny local model (SmolLM2-135M) serves both sides:
//! - direct: the same streamed chat request sent straight to the server, over plain HTTP;
//! - trellis: `trellis run` on a chain of prompt nodes pointed at that server as an OpenAI-compatible
//!   provider (`fidelity="truncate"`, so every prompt has the same size as the direct one).
//!
//! It prints the median direct call, the median model call inside Trellis, the median prompt stage, and
//! the whole run's wall time per stage; the differences are the client's and the engine's added latency.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PROMPT: &str = "Count from one to one hundred in words, separated by commas.";
const MAX_TOKENS: u32 = 8;
const CALLS: usize = 30;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// One streamed chat completion, straight to the server; returns the response bytes.
fn direct_call(port: u16, prompt: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "model": "bench", "stream": true, "max_tokens": MAX_TOKENS,
        "stream_options": { "include_usage": true },
        "messages": [{ "role": "user", "content": prompt }],
    })
    .to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("the server listens");
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    assert!(
        response.windows(6).any(|w| w == b"[DONE]"),
        "{}",
        String::from_utf8_lossy(&response)
    );
    response
}

fn wait_until_ready(port: u16) {
    let started = Instant::now();
    loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = write!(
                s,
                "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            );
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            if text.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        assert!(
            started.elapsed() < Duration::from_mins(2),
            "llama-server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts llama-server with the tiny model on a free port.
fn start_server(files: &trellis_test::LocalModelFiles) -> (std::process::Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Command::new(&files.server)
        .arg("--model")
        .arg(&files.tiny_model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--ctx-size", "2048", "--parallel", "1", "--no-webui"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("llama-server starts");
    wait_until_ready(port);
    (server, port)
}

/// Milliseconds of each direct call, after a warm-up.
fn measure_direct(port: u16) -> Vec<f64> {
    // The prompt Trellis sends with fidelity=truncate: the run line, then the node's prompt.
    let prompt = format!("Run: {}\n\n{PROMPT}", "0".repeat(26));
    for _ in 0..3 {
        direct_call(port, &prompt);
    }
    (0..CALLS)
        .map(|_| {
            let started = Instant::now();
            direct_call(port, &prompt);
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect()
}

/// Runs the chain of prompt nodes; returns the model-call and stage milliseconds and the wall time.
fn measure_trellis(port: u16) -> (Vec<f64>, Vec<f64>, f64) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temp dir");
    let mut workflow =
        String::from("digraph Latency {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n");
    for i in 0..CALLS {
        let _ = writeln!(
            workflow,
            " p{i:02} [shape=tab, prompt=\"{PROMPT}\", max_tokens={MAX_TOKENS}, fidelity=\"truncate\", provider=\"openai-compatible\", model=\"bench\", project_memory=false]"
        );
    }
    let chain: Vec<String> = (0..CALLS).map(|i| format!("p{i:02}")).collect();
    let _ = writeln!(workflow, " start -> {} -> exit\n}}", chain.join(" -> "));
    std::fs::write(dir.path().join("latency.fabro"), workflow).unwrap();
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["run", "latency.fabro", "--json", "--runs-dir"])
        .arg(dir.path().join("runs"))
        .current_dir(dir.path())
        .env(
            "OPENAI_COMPATIBLE_BASE_URL",
            format!("http://127.0.0.1:{port}/v1"),
        )
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("GEMINI_API_KEY")
        .output()
        .expect("trellis runs");
    let wall = started.elapsed().as_secs_f64() * 1000.0;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let run_dir = std::path::Path::new(summary["run_dir"].as_str().unwrap());
    let events = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    let (mut calls, mut stages) = (Vec::new(), Vec::new());
    for line in events.lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        let ms = event["duration_ms"].as_f64().unwrap_or(0.0);
        match event["event"].as_str() {
            Some("ModelCallCompleted") => calls.push(ms),
            Some("StageCompleted")
                if event["node_id"]
                    .as_str()
                    .is_some_and(|n| n.starts_with('p')) =>
            {
                stages.push(ms);
            }
            _ => {}
        }
    }
    assert_eq!(calls.len(), CALLS);
    (calls, stages, wall)
}

fn main() {
    let Some(files) = trellis_test::local_model_files() else {
        println!(
            "model_latency: skipped (the local model is not installed; run scripts/test-peers.sh)"
        );
        return;
    };
    let (mut server, port) = start_server(&files);
    let direct = measure_direct(port);
    let (calls, stages, wall) = measure_trellis(port);
    let _ = server.kill();
    let _ = server.wait();
    let (direct, call, stage) = (median(direct), median(calls), median(stages));
    println!("model_latency: {CALLS} calls of {MAX_TOKENS} tokens to llama-server (SmolLM2-135M)");
    println!("  direct HTTP call           {direct:8.1} ms (median)");
    println!(
        "  model call inside trellis  {call:8.1} ms (median)   +{:.1} ms client",
        call - direct
    );
    println!(
        "  prompt stage               {stage:8.1} ms (median)   +{:.1} ms engine and client",
        stage - direct
    );
    println!(
        "  whole run, per stage       {:8.1} ms (wall {wall:.0} ms / {CALLS}, includes process start)",
        wall / f64::from(u32::try_from(CALLS).unwrap())
    );
}
