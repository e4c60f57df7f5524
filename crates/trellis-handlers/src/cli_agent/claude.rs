//! Claude Code: `claude -p --output-format stream-json --verbose`, the prompt on standard input; the
//! node's model, reasoning effort (`--effort`) and `max_turns` when the workflow sets them.
//!
//! One JSON object per line: `{"type":"system","subtype":"init","session_id",...,"model"}` first;
//! `{"type":"assistant","message":{"id","content":[text | tool_use {id,name,input}]}}` for each piece
//! of an assistant message; `{"type":"user","message":{"content":[tool_result {tool_use_id,content,
//! is_error}]}}` for tool results; and last `{"type":"result","subtype":"success"|"error_…",
//! "is_error","result","session_id","num_turns","total_cost_usd","usage"}`. Repairs resume the
//! session with `--resume <session_id>`.

use serde_json::Value;

use super::stream::{self, Stream, str_at, text_of, u64_at};
use super::{Ask, CommandLine};

/// The tools Claude Code may use without asking (print mode cannot ask): edits are accepted by the
/// permission mode, and these are allowed outright.
const ALLOWED_TOOLS: &str =
    "Bash,Read,Write,Edit,MultiEdit,NotebookEdit,Glob,Grep,LS,WebFetch,WebSearch,TodoWrite,Task";
/// The tools that write the file named by their `file_path` (or `notebook_path`).
const WRITERS: &[&str] = &["Write", "Edit", "MultiEdit", "NotebookEdit"];

pub(super) fn command(ask: &Ask<'_>) -> CommandLine {
    let mut args: Vec<String> = [
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        "acceptEdits",
        "--allowedTools",
        ALLOWED_TOOLS,
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(model) = ask.model {
        args.extend(["--model".to_owned(), model.to_owned()]);
    }
    if let Some(effort) = ask.effort {
        args.extend(["--effort".to_owned(), effort.as_str().to_owned()]);
    }
    if let Some(turns) = ask.max_turns {
        args.extend(["--max-turns".to_owned(), turns.to_string()]);
    }
    if let Some(session) = ask.resume {
        args.extend(["--resume".to_owned(), session.to_owned()]);
    }
    CommandLine {
        args,
        stdin: Some(ask.prompt.to_owned()),
    }
}

pub(super) fn read(stream: &mut Stream, line: &Value) {
    match line["type"].as_str().unwrap_or_default() {
        "system" if line["subtype"] == "init" => {
            stream.session_id = str_at(line, "/session_id").or(stream.session_id.take());
            stream.model = str_at(line, "/model").or(stream.model.take());
        }
        "assistant" => {
            let message = &line["message"];
            let id = str_at(message, "/id");
            if id.is_none() || id != stream.message_id {
                stream.message_id = id;
                stream.turn_started();
            }
            for block in message["content"].as_array().into_iter().flatten() {
                match block["type"].as_str().unwrap_or_default() {
                    "text" => stream.said(block["text"].as_str().unwrap_or_default()),
                    "tool_use" => {
                        let tool = block["name"].as_str().unwrap_or("tool");
                        let input = block["input"].clone();
                        let writes = WRITERS
                            .contains(&tool)
                            .then(|| {
                                str_at(&input, "/file_path").or(str_at(&input, "/notebook_path"))
                            })
                            .flatten();
                        let id = block["id"].as_str().unwrap_or_default();
                        stream.call_started(id, tool, input, writes);
                    }
                    _ => {}
                }
            }
        }
        "user" => {
            for block in line["message"]["content"].as_array().into_iter().flatten() {
                if block["type"] == "tool_result" {
                    stream.call_completed(
                        block["tool_use_id"].as_str().unwrap_or_default(),
                        block["is_error"].as_bool().unwrap_or(false),
                        text_of(&block["content"]),
                        None,
                    );
                }
            }
        }
        "result" => read_result(stream, line),
        _ => {}
    }
}

fn read_result(stream: &mut Stream, line: &Value) {
    stream.session_id = str_at(line, "/session_id").or(stream.session_id.take());
    let usage = &line["usage"];
    stream.usage.input_tokens = u64_at(usage, "/input_tokens")
        + u64_at(usage, "/cache_read_input_tokens")
        + u64_at(usage, "/cache_creation_input_tokens");
    stream.usage.cached_tokens = u64_at(usage, "/cache_read_input_tokens");
    stream.usage.output_tokens = u64_at(usage, "/output_tokens");
    stream.cost_usd = line["total_cost_usd"].as_f64();
    if let Some(turns) = line["num_turns"].as_u64() {
        stream.turns = u32::try_from(turns).unwrap_or(u32::MAX);
    }
    if stream.model.is_none() {
        stream.model = line["modelUsage"]
            .as_object()
            .and_then(|models| models.keys().next().cloned());
    }
    let mut text = line["result"].as_str().unwrap_or_default().to_owned();
    if let Some(errors) = line["errors"].as_array().filter(|e| !e.is_empty()) {
        text = errors
            .iter()
            .map(stream::text_of)
            .collect::<Vec<_>>()
            .join("; ");
    }
    let subtype = line["subtype"].as_str().unwrap_or("success");
    if line["is_error"].as_bool().unwrap_or(false) || subtype != "success" {
        let why = match subtype {
            "error_max_turns" => "it used its turns (--max-turns) without finishing".to_owned(),
            "error_during_execution" if text.is_empty() => "it failed during execution".to_owned(),
            _ if text.is_empty() => format!("it ended with `{subtype}`"),
            _ => text,
        };
        stream.failed(why);
    } else {
        stream.finished(text);
    }
}
