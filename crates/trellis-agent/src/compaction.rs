//! Context compaction, as the context document describes it: before every request the session
//! measures its size (the provider's count of input tokens in the last request, plus characters / 4
//! of what was added since; before the first answer, characters / 4 of the system prompt, the tools
//! and the history); above 80% of the model's context window, everything but the last 6 turns is
//! summarised by the same model in fixed sections and replaced by one `[Context Summary]` message.
//! The tracked files are copied into the summary verbatim.
//!
//! The summary is asked of the agent at the end of its own conversation ([`SUMMARY_REQUEST`] after
//! the history, the system prompt and tools unchanged), so a prompt cache serves the whole request
//! but that message, when the window leaves [`SUMMARY_ROOM`] tokens for the answer. Otherwise (and
//! after the provider said a request did not fit, or when that answer is a tool call or empty), the
//! older turns are rendered as text (tool arguments and results cut to 500 characters) for a
//! request of their own under [`SUMMARY_SYSTEM`].
//!
//! A turn is an assistant message with the messages that answer it (tool results, a repair request);
//! the messages before the first assistant message (the opening prompt) are a turn of their own. The
//! summary opens the new history as a user-role message, because every provider wants the conversation
//! to open with the user's turn; the preserved turns follow unchanged.

use std::fmt::Write as _;

use trellis_llm::{Message, Part, Role};

/// Turns kept verbatim.
pub const PRESERVED_TURNS: usize = 6;
/// Compaction starts above this share of the context window.
pub const THRESHOLD_PERCENT: u64 = 80;
/// Tool arguments and results are cut to this many characters in the rendered history.
pub const RENDER_CHARS: usize = 500;
/// The heading of the summary message.
pub const SUMMARY_HEADING: &str = "[Context Summary]";

/// Estimated tokens of a conversation: one per four characters.
pub fn estimate_tokens(system: Option<&str>, history: &[Message]) -> u64 {
    let mut chars = system.map_or(0, |s| s.chars().count());
    for message in history {
        for part in &message.parts {
            chars += match part {
                Part::Text { text } => text.chars().count(),
                Part::ToolCall(call) => {
                    call.name.len() + call.arguments.to_string().chars().count()
                }
                Part::ToolResult(result) => result.content.chars().count(),
            };
        }
    }
    (chars as u64).div_ceil(4)
}

/// Estimated tokens of the tool definitions a request carries (their names, descriptions and
/// schemas), one per four characters.
pub fn estimate_tool_tokens(tools: &[trellis_llm::ToolDef]) -> u64 {
    let chars: usize = tools
        .iter()
        .map(|tool| {
            tool.name.len() + tool.description.chars().count() + tool.parameters.to_string().len()
        })
        .sum();
    (chars as u64).div_ceil(4)
}

/// The index where each turn starts.
fn turn_starts(history: &[Message]) -> Vec<usize> {
    let mut starts = Vec::new();
    for (i, message) in history.iter().enumerate() {
        if i == 0 || message.role == Role::Assistant {
            starts.push(i);
        }
    }
    starts
}

/// Where the last `preserved` turns begin and how many turns there are, when there is anything older
/// to summarise.
pub fn split(history: &[Message], preserved: usize) -> Option<(usize, usize)> {
    let starts = turn_starts(history);
    let preserved = preserved.max(1);
    if starts.len() <= preserved {
        return None;
    }
    Some((starts[starts.len() - preserved], starts.len()))
}

/// The older turns as readable text for the summariser.
pub fn render(messages: &[Message]) -> String {
    let mut out = String::new();
    for message in messages {
        let who = match message.role {
            Role::User => "User",
            Role::Assistant => "Assistant",
        };
        for part in &message.parts {
            match part {
                Part::Text { text } => {
                    let _ = writeln!(out, "{who}: {text}\n");
                }
                Part::ToolCall(call) => {
                    let _ = writeln!(
                        out,
                        "{who} called {}({})\n",
                        call.name,
                        cut(&call.arguments.to_string())
                    );
                }
                Part::ToolResult(result) => {
                    let _ = writeln!(
                        out,
                        "Result of {}{}: {}\n",
                        result.name,
                        if result.is_error { " (error)" } else { "" },
                        cut(&result.content)
                    );
                }
            }
        }
    }
    out
}

fn cut(text: &str) -> String {
    let count = text.chars().count();
    if count <= RENDER_CHARS {
        return text.to_owned();
    }
    let kept: String = text.chars().take(RENDER_CHARS).collect();
    format!("{kept}… [{} more characters]", count - RENDER_CHARS)
}

/// The sections a summary has, whoever is asked for it.
macro_rules! sections {
    () => {
        "Write Markdown with exactly these sections, in this order:\n\
## Goal\nWhat the user asked for.\n\
## Progress\nWhat was accomplished, with file paths and key decisions.\n\
## Key Decisions\nImportant choices and their rationale.\n\
## Failed Approaches\nWhat was tried and did not work.\n\
## Open Issues\nRemaining bugs, edge cases or TODOs.\n\
## Next Steps\nWhat should happen next.\n\
Be specific and brief. Do not call tools."
    };
}

/// The summariser's instructions, for a summary of the older turns rendered as text.
pub const SUMMARY_SYSTEM: &str = concat!(
    "You summarise the earlier part of a coding agent's session so the agent can go on without it. ",
    sections!()
);

/// The message that asks the agent itself for the summary at the end of its own conversation, so
/// that the request is the conversation's next one plus this message and a prompt cache serves all
/// of the rest.
pub const SUMMARY_REQUEST: &str = concat!(
    "Stop the task for a moment: the conversation so far is about to be replaced by a summary you \
write now, and you will go on from that summary and the last few turns. Answer with the summary \
itself, not a tool call. ",
    sections!()
);

/// Tokens the in-conversation summary request must leave for the answer, at least.
pub const SUMMARY_ROOM: u64 = 768;

/// The longest summary asked for, in tokens: it replaces the history, and a small model asked for
/// one with the turn's limit (4,096) was still writing at 818 tokens after ten minutes on a loaded
/// 2-core CPU (2026-11-29).
pub const SUMMARY_MAX_TOKENS: u32 = 1_024;

/// The summary request's one user message.
pub fn summary_prompt(rendered: &str) -> String {
    format!("Summarise this conversation history:\n\n{rendered}")
}

/// The `File Operations` section: the tracked files, verbatim.
pub fn file_operations(files: &[String]) -> String {
    let mut out = String::from("## File Operations\n");
    for file in files {
        let _ = writeln!(out, "- {file}");
    }
    out
}

/// Whether `message` is a summary that replaced older turns.
pub fn is_summary(message: &Message) -> bool {
    matches!(message.parts.first(), Some(Part::Text { text }) if text.starts_with(SUMMARY_HEADING))
}

/// The message that replaces the older turns.
pub fn summary_message(summary: &str, files: &[String]) -> Message {
    let mut text = format!("{SUMMARY_HEADING}\n\n{}", summary.trim());
    if !files.is_empty() {
        let _ = write!(text, "\n\n{}", file_operations(files));
    }
    Message::user(text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use trellis_llm::{ToolCall, ToolResult};

    use super::*;

    fn turn(i: usize) -> Vec<Message> {
        vec![
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall(ToolCall {
                    id: format!("c{i}"),
                    name: "read_file".into(),
                    arguments: json!({ "path": "x".repeat(600) }),
                })],
            },
            Message {
                role: Role::User,
                parts: vec![Part::ToolResult(ToolResult {
                    call_id: format!("c{i}"),
                    name: "read_file".into(),
                    content: format!("line {i}"),
                    is_error: false,
                })],
            },
        ]
    }

    #[test]
    fn the_last_six_turns_are_kept_and_the_prompt_is_a_turn() {
        let mut history = vec![Message::user("Do the task")];
        assert_eq!(split(&history, PRESERVED_TURNS), None);
        for i in 0..5 {
            history.extend(turn(i));
        }
        assert_eq!(
            split(&history, PRESERVED_TURNS),
            None,
            "six turns: nothing older to summarise"
        );
        history.extend(turn(5));
        assert_eq!(
            split(&history, PRESERVED_TURNS),
            Some((1, 7)),
            "the prompt is summarised"
        );
    }

    #[test]
    fn rendering_cuts_arguments_and_the_estimate_counts_characters() {
        let rendered = render(&turn(0));
        assert!(rendered.contains("… ["), "{rendered}");
        assert!(rendered.contains("Result of read_file: line 0"));
        assert_eq!(estimate_tokens(Some("abcd"), &[Message::user("efgh")]), 2);
    }

    #[test]
    fn the_summary_carries_the_tracked_files_verbatim() {
        let message = summary_message("## Goal\nx", &["src/a.rs".into()]);
        assert_eq!(
            message.text(),
            "[Context Summary]\n\n## Goal\nx\n\n## File Operations\n- src/a.rs\n"
        );
    }
}
