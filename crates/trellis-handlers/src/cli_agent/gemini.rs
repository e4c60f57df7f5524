//! Gemini CLI: `gemini --output-format stream-json --approval-mode yolo --prompt …`.
//!
//! One JSON event per line: `init {session_id, model}`, `message {role, content, delta}` (the
//! assistant's text, in pieces when `delta`), `tool_use {tool_name, tool_id, parameters}`,
//! `tool_result {tool_id, status, output, error}`, `error {severity, message}` (non-fatal), and last
//! `result {status, error, stats: {input_tokens, output_tokens, cached, tool_calls, ...}}`. The answer
//! is the assistant's text after its last tool call. (`--output-format json`, one object at the end,
//! reports no tool calls as they happen, so the stream is read instead.) Repairs resume the session
//! with `--resume <session_id>`.

use serde_json::Value;

use super::stream::{Stream, str_at, text_of, u64_at};
use super::{Ask, CommandLine};

/// The tools that write the file named by their `file_path`.
const WRITERS: &[&str] = &["write_file", "replace", "edit"];
/// Above this size the prompt goes on standard input (one argument may hold at most 128 KiB), with a
/// short `--prompt` that the CLI appends to it.
const ARGUMENT_LIMIT: usize = 100 * 1024;

pub(super) fn command(ask: &Ask<'_>) -> CommandLine {
    let mut args: Vec<String> = ["--output-format", "stream-json", "--approval-mode", "yolo"]
        .map(str::to_owned)
        .to_vec();
    if let Some(model) = ask.model {
        args.extend(["--model".to_owned(), model.to_owned()]);
    }
    if let Some(session) = ask.resume {
        args.extend(["--resume".to_owned(), session.to_owned()]);
    }
    let stdin = if ask.prompt.len() > ARGUMENT_LIMIT {
        args.extend([
            "--prompt".to_owned(),
            "Carry out the task above.".to_owned(),
        ]);
        Some(ask.prompt.to_owned())
    } else {
        args.extend(["--prompt".to_owned(), ask.prompt.to_owned()]);
        None
    };
    CommandLine { args, stdin }
}

pub(super) fn read(stream: &mut Stream, line: &Value) {
    match line["type"].as_str().unwrap_or_default() {
        "init" => {
            stream.session_id = str_at(line, "/session_id");
            stream.model = str_at(line, "/model");
        }
        "message" if line["role"] == "assistant" => {
            // A new turn begins with the first text after the start or after a tool call.
            if stream.text.is_empty() {
                stream.turn_started();
            }
            stream.said(line["content"].as_str().unwrap_or_default());
        }
        "tool_use" => {
            let tool = line["tool_name"].as_str().unwrap_or("tool");
            let parameters = line["parameters"].clone();
            let writes = WRITERS
                .contains(&tool)
                .then(|| str_at(&parameters, "/file_path"))
                .flatten();
            let id = line["tool_id"].as_str().unwrap_or_default();
            stream.call_started(id, tool, parameters, writes);
        }
        "tool_result" => {
            let is_error = line["status"] == "error";
            let output = str_at(line, "/error/message")
                .filter(|_| is_error)
                .unwrap_or_else(|| text_of(&line["output"]));
            stream.call_completed(
                line["tool_id"].as_str().unwrap_or_default(),
                is_error,
                output,
                None,
            );
        }
        "error" => stream.warned(line["message"].as_str().unwrap_or_default().to_owned()),
        "result" => {
            let stats = &line["stats"];
            stream.usage.input_tokens = u64_at(stats, "/input_tokens");
            stream.usage.cached_tokens = u64_at(stats, "/cached");
            stream.usage.output_tokens = u64_at(stats, "/output_tokens");
            if line["status"] == "success" {
                let answer = std::mem::take(&mut stream.text);
                stream.finished(answer);
            } else {
                let why =
                    str_at(line, "/error/message").unwrap_or_else(|| "the session failed".into());
                stream.failed(why);
            }
        }
        _ => {}
    }
}
