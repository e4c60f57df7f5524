//! Codex CLI: `codex exec --json`, the prompt on standard input (`-`).
//!
//! One JSON event per line: `thread.started {thread_id}`, `turn.started`, `item.started` /
//! `item.updated` / `item.completed {item: {id, type, ...}}` where the item is an `agent_message
//! {text}`, `reasoning`, `command_execution {command, aggregated_output, exit_code, status}`,
//! `file_change {changes: [{path, kind}], status}`, `mcp_tool_call {server, tool, arguments, result,
//! error, status}`, `web_search {query}`, `todo_list` or `error {message}`; then
//! `turn.completed {usage: {input_tokens, cached_input_tokens, output_tokens}}` or
//! `turn.failed {error: {message}}`; `error {message}` reports a stream problem (fatal, or one it
//! recovers from, like reconnecting). The answer is the
//! last agent message. Repairs resume the thread with `codex exec resume <thread_id>`.

use serde_json::{Value, json};

use super::stream::{Stream, str_at, text_of, u64_at};
use super::{Ask, CommandLine};

pub(super) fn command(ask: &Ask<'_>) -> CommandLine {
    let mut args: Vec<String> = [
        "exec",
        "--json",
        "--color",
        "never",
        "--sandbox",
        "workspace-write",
        "--skip-git-repo-check",
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(model) = ask.model {
        args.extend(["--model".to_owned(), model.to_owned()]);
    }
    if let Some(effort) = ask.effort {
        args.extend([
            "-c".to_owned(),
            format!("model_reasoning_effort=\"{effort}\""),
        ]);
    }
    if let Some(thread) = ask.resume {
        args.extend(["resume".to_owned(), thread.to_owned()]);
    }
    args.push("-".to_owned());
    CommandLine {
        args,
        stdin: Some(ask.prompt.to_owned()),
    }
}

pub(super) fn read(stream: &mut Stream, line: &Value) {
    match line["type"].as_str().unwrap_or_default() {
        "thread.started" => stream.session_id = str_at(line, "/thread_id"),
        "turn.started" => stream.turn_started(),
        "item.started" => started(stream, &line["item"]),
        "item.completed" => completed(stream, &line["item"]),
        "turn.completed" => {
            let usage = &line["usage"];
            stream.usage.input_tokens += u64_at(usage, "/input_tokens");
            stream.usage.cached_tokens += u64_at(usage, "/cached_input_tokens");
            stream.usage.output_tokens += u64_at(usage, "/output_tokens");
            stream.usage.reasoning_tokens += u64_at(usage, "/reasoning_output_tokens");
            let answer = std::mem::take(&mut stream.text);
            stream.finished(answer);
        }
        "turn.failed" => {
            let why = str_at(line, "/error/message").unwrap_or_else(|| "the turn failed".into());
            stream.failed(why);
        }
        // Also sent for problems it recovers from (reconnecting): the turn's end says how it went.
        "error" => stream.warned(line["message"].as_str().unwrap_or_default().to_owned()),
        _ => {}
    }
}

/// The tool and arguments a tool-like item stands for.
fn call_of(item: &Value) -> Option<(String, Value)> {
    match item["type"].as_str()? {
        "command_execution" => Some(("shell".into(), json!({ "command": item["command"] }))),
        "mcp_tool_call" => Some((
            format!(
                "{}.{}",
                item["server"].as_str().unwrap_or("mcp"),
                item["tool"].as_str().unwrap_or("tool")
            ),
            item["arguments"].clone(),
        )),
        "web_search" => Some(("web_search".into(), json!({ "query": item["query"] }))),
        "file_change" => Some(("apply_patch".into(), json!({ "changes": item["changes"] }))),
        _ => None,
    }
}

fn started(stream: &mut Stream, item: &Value) {
    if let Some((tool, arguments)) = call_of(item) {
        let writes = last_change(item);
        stream.call_started(
            item["id"].as_str().unwrap_or_default(),
            &tool,
            arguments,
            writes,
        );
    }
}

/// The last path a `file_change` item adds or updates.
fn last_change(item: &Value) -> Option<String> {
    item["changes"]
        .as_array()?
        .iter()
        .rev()
        .find(|c| c["kind"] != "delete")
        .and_then(|c| str_at(c, "/path"))
}

fn completed(stream: &mut Stream, item: &Value) {
    let id = item["id"].as_str().unwrap_or_default();
    match item["type"].as_str().unwrap_or_default() {
        "agent_message" => {
            // The last message is the answer.
            stream.text.clear();
            stream.said(item["text"].as_str().unwrap_or_default());
        }
        "error" => stream.warned(item["message"].as_str().unwrap_or_default().to_owned()),
        _ => {
            let Some((tool, arguments)) = call_of(item) else {
                return;
            };
            let failed = matches!(item["status"].as_str(), Some("failed" | "declined"));
            let (output, note, is_error) = match item["type"].as_str() {
                Some("command_execution") => {
                    let code = item["exit_code"].as_i64();
                    (
                        text_of(&item["aggregated_output"]),
                        code.map(|c| format!("exit {c}")),
                        failed || code.is_some_and(|c| c != 0),
                    )
                }
                Some("file_change") => {
                    let changes: Vec<String> = item["changes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|c| {
                            format!(
                                "{} {}",
                                c["kind"].as_str().unwrap_or("update"),
                                c["path"].as_str().unwrap_or_default()
                            )
                        })
                        .collect();
                    (changes.join("\n"), None, failed)
                }
                Some("mcp_tool_call") => {
                    let output = str_at(item, "/error/message")
                        .unwrap_or_else(|| text_of(&item["result"]["content"]));
                    (output, None, failed || !item["error"].is_null())
                }
                _ => (String::new(), None, failed),
            };
            if !stream.has_call(id) {
                stream.call_started(id, &tool, arguments, last_change(item));
            }
            stream.call_completed(id, is_error, output, note);
        }
    }
}
