//! Tool calls written as text. Small local models often answer a tool request with a fenced
//! ```` ```json {"name": ..., "arguments": {...}} ```` block or a `<tool_call>{...}</tool_call>` element
//! instead of the API's structured field. What counts as a call: an object naming an offered tool, or
//! one shaped like a call (a `name` and an `arguments` object) naming a tool that is not offered — the
//! session answers that with the list of tools it has, rather than taking the block for an answer.
//! A file's path alone on a line, then a fenced block, is that file's whole new content: a
//! `write_file` call (the "whole file" format small coding models know), when that tool is offered;
//! so is a block whose first line is a comment holding the path alone (`# fizzbuzz.py`), without
//! that line.
//! An answer that is a call object alone, unfenced, is a call too (what llama-server's grammar
//! holds an answer to when a call is required).

use serde_json::Value;

use crate::message::ToolCall;

/// The tool calls in `text`, in order (files written whole after the calls written as JSON).
pub fn parse(text: &str, offered: &[&str]) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    for body in tagged(text, "<tool_call>", "</tool_call>")
        .into_iter()
        .chain(fenced(text))
        .chain(bare(text))
    {
        for value in values(body) {
            if let Some(call) = to_call(&value, offered, calls.len()) {
                calls.push(call);
            }
        }
    }
    for (path, content) in whole_files(text, offered) {
        calls.push(ToolCall {
            id: text_call_id(calls.len()),
            name: WRITE_FILE.to_owned(),
            arguments: serde_json::json!({ "path": path, "content": content }),
        });
    }
    calls
}

/// The whole answer, when it is one JSON object and nothing else: a call written under a grammar
/// that holds the answer to one (llama-server, when a call is required).
fn bare(text: &str) -> Option<&str> {
    let text = text.trim();
    (text.starts_with('{') && text.ends_with('}')).then_some(text)
}

/// The tool a file written whole is a call of.
const WRITE_FILE: &str = "write_file";

/// The files written whole in `text`: a line that is only a path (in backticks or bold, with a colon
/// after it, or bare), then a fenced block that is not a call; or a block whose first line is a
/// comment (`#` or `//`) that is only a path, without that line. None unless `write_file` is offered.
fn whole_files<'a>(text: &'a str, offered: &[&str]) -> Vec<(&'a str, &'a str)> {
    if !offered.contains(&WRITE_FILE) {
        return Vec::new();
    }
    blocks(text)
        .into_iter()
        .filter_map(|block| {
            let (path, body) = block.file(false)?;
            let is_call = values(body)
                .iter()
                .any(|v| to_call(v, offered, 0).is_some());
            (!is_call).then_some((path, body))
        })
        .collect()
}

/// The files an answer that was asked to write files whole writes, in the order written (a small
/// model restates a file, or copies the example it was shown after it, or shows what a command
/// would print: the caller keeps each file's first): as [`parse`] finds them, a block below a line ending with a colon that
/// names one path in backticks (`` Here is the updated `words.py` file: ``), and a `write_file`
/// call written out in a block (a path and a content), in the order written; and, without a path,
/// each block that names no file and holds no call (`` Here's the implementation of the `is_prime`
/// function: ``), for the caller to find its file by what it defines.
pub fn drafted_files(text: &str) -> Vec<(Option<String>, String)> {
    let mut files = Vec::new();
    for block in blocks(text) {
        let values = values(block.body);
        let calls: Vec<ToolCall> = values
            .iter()
            .filter_map(|v| to_call(v, &[WRITE_FILE], 0))
            .collect();
        let written: Vec<(Option<String>, String)> = if !calls.is_empty() {
            calls
                .iter()
                .filter(|call| call.name == WRITE_FILE)
                .filter_map(|call| {
                    let path = as_path(call.arguments["path"].as_str()?)?;
                    let content = call.arguments["content"].as_str()?;
                    Some((Some(path.to_owned()), content.to_owned()))
                })
                .collect()
        } else if let Some((path, body)) = block.file(true) {
            vec![(Some(path.to_owned()), body.to_owned())]
        } else if values.is_empty() {
            vec![(None, block.body.to_owned())]
        } else {
            Vec::new()
        };
        files.extend(written);
    }
    files
}

/// The path a line ending with a colon introduces: the one path it names in backticks.
fn introduced(line: &str) -> Option<&str> {
    let line = line.trim().trim_end_matches('*');
    if !line.ends_with(':') {
        return None;
    }
    let mut paths = line.split('`').skip(1).step_by(2).filter_map(as_path);
    let path = paths.next()?;
    paths.next().is_none().then_some(path)
}

/// A block's body whose first line is a comment that is a path and nothing else: the path, and
/// the body after that line.
fn commented_path(body: &str) -> Option<(&str, &str)> {
    let (first, rest) = body.split_once('\n')?;
    let comment = first
        .trim()
        .strip_prefix("//")
        .or_else(|| first.trim().strip_prefix('#'))?;
    Some((as_path(comment)?, rest))
}

/// A line that is a file's path and nothing else, without its decoration.
fn as_path(line: &str) -> Option<&str> {
    let path = line
        .trim()
        .trim_end_matches(':')
        .trim_matches(|c| c == '`' || c == '*')
        .trim_end_matches(':');
    let looks_like_one = !path.is_empty()
        && (path.contains('.') || path.contains('/'))
        && !path.contains(char::is_whitespace)
        && !path.contains("://")
        && !path.starts_with(['-', '#', '.', '/'])
        && !path.ends_with(['.', '/']);
    looks_like_one.then_some(path)
}

/// The JSON values a block holds: one, or several in a row (a model that writes two calls in one
/// block).
fn values(body: &str) -> Vec<Value> {
    serde_json::Deserializer::from_str(body.trim())
        .into_iter::<Value>()
        .map_while(Result::ok)
        .collect()
}

/// A call as a model held to one call an answer writes it (the grammar of
/// `providers::openai_chat`): a thought, then the tool's name and arguments — what an example
/// shown to such a model looks like.
pub fn written_call(thought: &str, name: &str, arguments: Value) -> Value {
    let mut call = serde_json::Map::new();
    call.insert("thought".to_owned(), thought.into());
    call.insert("name".to_owned(), name.into());
    call.insert("arguments".to_owned(), arguments);
    Value::Object(call)
}

/// The id prefix of calls found in text.
const TEXT_CALL_PREFIX: &str = "text_call_";

/// The id of the `index`th call found in an answer's text.
pub fn text_call_id(index: usize) -> String {
    format!("{TEXT_CALL_PREFIX}{index}")
}

/// Whether a call (by its id) was written as text rather than through the API.
pub fn is_text_call(id: &str) -> bool {
    id.starts_with(TEXT_CALL_PREFIX)
}

/// Whether `text` already holds a finished call (a closed element or fence). A streaming caller stops
/// the answer there: a small model that goes on tends to repeat the call or invent its result.
pub fn has_complete_call(text: &str, offered: &[&str]) -> bool {
    let closed_tags = closed_tagged(text, "<tool_call>", "</tool_call>");
    closed_tags.into_iter().chain(fenced(text)).any(|body| {
        values(body)
            .iter()
            .any(|v| to_call(v, offered, 0).is_some())
    }) || !whole_files(text, offered).is_empty()
}

fn closed_tagged<'a>(text: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(close) else {
            break;
        };
        out.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    out
}

fn to_call(value: &Value, offered: &[&str], index: usize) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?;
    let given = value.get("arguments").or_else(|| value.get("parameters"));
    if !offered.contains(&name) && !given.is_some_and(Value::is_object) {
        return None;
    }
    let arguments = match given {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(v) => v.clone(),
        None => Value::Object(serde_json::Map::new()),
    };
    Some(ToolCall {
        id: text_call_id(index),
        name: name.to_owned(),
        arguments,
    })
}

fn tagged<'a>(text: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(close) else {
            // An unclosed last element (the model stopped at the tag) still counts.
            out.push(after);
            break;
        };
        out.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    out
}

/// The bodies of the closed fenced blocks that may hold calls (no language, or JSON).
fn fenced(text: &str) -> Vec<&str> {
    blocks(text)
        .into_iter()
        .filter(|b| b.lang.is_empty() || b.lang.eq_ignore_ascii_case("json"))
        .map(|b| b.body)
        .collect()
}

/// A closed fenced block.
struct Block<'a> {
    /// The line before its opening fence (one blank line between skipped), when the fence starts
    /// a line and one comes before.
    before: Option<&'a str>,
    lang: &'a str,
    body: &'a str,
}

impl<'a> Block<'a> {
    /// The file the block writes whole, and its content: named by the line before it that is a
    /// path alone — or, `introduced_too`, a line ending with a colon that names one
    /// ([`introduced`]) — else by a first line that is a comment holding a path alone, without
    /// that line.
    fn file(&self, introduced_too: bool) -> Option<(&'a str, &'a str)> {
        let named = self.before.and_then(|line| {
            as_path(line).or_else(|| introduced_too.then(|| introduced(line)).flatten())
        });
        match named {
            Some(path) => Some((path, self.body)),
            None => commented_path(self.body),
        }
    }
}

fn blocks(text: &str) -> Vec<Block<'_>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(start) = text[from..].find("```").map(|i| from + i) {
        let after = &text[start + 3..];
        let Some(line_end) = after.find('\n') else {
            break;
        };
        let lang = after[..line_end].trim();
        let body_at = start + 3 + line_end + 1;
        let Some(end) = text[body_at..].find("```") else {
            break;
        };
        let before = text[..start]
            .strip_suffix('\n')
            .and_then(|above| above.lines().next_back());
        out.push(Block {
            before,
            lang,
            body: &text[body_at..body_at + end],
        });
        from = body_at + end + 3;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_json_block_is_a_call() {
        let text = "I'll look.\n```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\"}}\n```\n";
        let calls = parse(text, &["read_file"]);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "read_file");
        assert_eq!(calls[0].arguments["path"], "a.txt");
    }

    #[test]
    fn several_calls_in_one_block_are_each_a_call() {
        let text = "```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a\"}}\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n```";
        let calls = parse(text, &["read_file", "write_file"]);
        let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["write_file", "read_file"]);
        assert_eq!(calls[1].id, "text_call_1");
    }

    #[test]
    fn tool_call_element_is_a_call_and_string_arguments_are_decoded() {
        let text = "<tool_call>\n{\"name\": \"shell\", \"arguments\": \"{\\\"cmd\\\": \\\"ls\\\"}\"}\n</tool_call>";
        let calls = parse(text, &["shell"]);
        assert_eq!(calls[0].arguments["cmd"], "ls");
    }

    #[test]
    fn a_call_is_complete_once_its_block_closes() {
        let offered = ["read_file"];
        let open = "```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n";
        assert!(!has_complete_call(open, &offered));
        assert!(has_complete_call(&format!("{open}```"), &offered));
        assert!(!has_complete_call(
            "<tool_call>{\"name\": \"read_file\"}",
            &offered
        ));
        assert!(has_complete_call(
            "<tool_call>{\"name\": \"read_file\"}</tool_call>",
            &offered
        ));
    }

    #[test]
    fn an_answer_that_is_a_call_object_alone_is_a_call() {
        let calls = parse(
            "{\n  \"thought\": \"Read it first.\",\n  \"name\": \"read_file\",\n  \"arguments\": {\"path\": \"a.py\"}\n}",
            &["read_file"],
        );
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "read_file");
        assert_eq!(calls[0].arguments, serde_json::json!({ "path": "a.py" }));
        assert!(is_text_call(&calls[0].id));
        assert_eq!(
            parse("{\"name\": \"orders-api\", \"port\": 80}", &["read_file"]),
            []
        );
    }

    #[test]
    fn plain_json_is_no_call_but_a_call_of_an_unknown_tool_is_one() {
        // Shaped like a call: the session answers that the tool does not exist.
        let unknown = parse(
            "```json\n{\"name\": \"add_function\", \"arguments\": {\"name\": \"f\"}}\n```",
            &["shell"],
        );
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].name, "add_function");
        assert_eq!(
            parse(
                "```json\n{\"name\": \"orders-api\", \"port\": 80}\n```",
                &["shell"]
            ),
            []
        );
        assert_eq!(
            parse("```json\n{\"outcome\": \"succeeded\"}\n```", &["shell"]),
            []
        );
        assert_eq!(parse("no calls here", &["shell"]), []);
    }

    #[test]
    fn a_path_line_then_a_block_writes_that_file_whole() {
        let offered = ["read_file", "write_file"];
        let text = "Here is the fix.\n\n`src/lib.rs`:\n```rust\npub fn f() {}\n```\nDone.";
        let calls = parse(text, &offered);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "write_file");
        assert_eq!(
            calls[0].arguments,
            serde_json::json!({ "path": "src/lib.rs", "content": "pub fn f() {}\n" })
        );
        assert!(has_complete_call(text, &offered));
        assert!(!has_complete_call(
            "`src/lib.rs`:\n```rust\npub fn f() {}\n",
            &offered
        ));
        for path in ["config.json", "**notes/a.txt**", "a.py:"] {
            let calls = parse(&format!("{path}\n```\nx = 1\n```"), &offered);
            assert_eq!(calls.len(), 1, "{path}");
        }
        // Not a path alone on its line, no line at all, a call, or no write_file offered.
        for text in [
            "Here's the corrected code:\n```rust\nfn f() {}\n```",
            "```python\nx = 1\n```",
            "Run it:\n```sh\npython3 a.py\n```",
            "see https://example.com/a.py\n```\nx\n```",
            "a.py ```\nx = 1\n```",
        ] {
            assert!(parse(text, &offered).is_empty(), "{text}");
        }
        let call =
            "a.json\n```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n```";
        let calls = parse(call, &offered);
        assert_eq!((calls.len(), calls[0].name.as_str()), (1, "read_file"));
        assert_eq!(parse("a.py\n```\nx = 1\n```", &["read_file"]), []);
    }

    #[test]
    fn a_draft_writes_its_files_blocks_in_order_and_calls_none() {
        let text = "Here is `calc.py`, fixed:\n```python\ndef add(a, b):\n    return a + \
                    b\n```\nHere is the updated `words.py` file (run `python3 -m unittest`):\n```\n\
                    w = 1\n```\n\nnotes.md\n\n```\nhello\n```\nnotes.md\n```\nthe file's whole new \
                    content\n```\n```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \
                    \"x.txt\", \"content\": \"1\"}}\n```\nRun `a.py` and `b.py`:\n```sh\npython3 \
                    a.py\n```\n";
        let owned = |files: &[(&str, &str)]| -> Vec<(Option<String>, String)> {
            files
                .iter()
                .map(|(p, c)| ((!p.is_empty()).then(|| (*p).to_owned()), (*c).to_owned()))
                .collect()
        };
        // A block naming no file comes without a path.
        assert_eq!(
            drafted_files(text),
            owned(&[
                ("calc.py", "def add(a, b):\n    return a + b\n"),
                ("words.py", "w = 1\n"),
                ("notes.md", "hello\n"),
                ("notes.md", "the file's whole new content\n"),
                ("x.txt", "1"),
                ("", "python3 a.py\n"),
            ])
        );
        // A write_file call written out comes first, before a block showing what the file holds.
        let shown = "Write `hello.txt` with:\n```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \
                     \"hello.txt\", \"content\": \"Hello\"}}\n```\nThen `hello.txt` holds:\n```\n\
                     hello.txt\n```\n";
        assert_eq!(
            drafted_files(shown),
            owned(&[("hello.txt", "Hello"), ("hello.txt", "hello.txt\n")])
        );
    }

    #[test]
    fn a_block_opening_with_a_comment_that_is_a_path_writes_that_file_without_it() {
        let offered = ["write_file"];
        for (text, path, content) in [
            (
                "Here it is:\n```python\n# fizzbuzz.py\nprint(1)\n```",
                "fizzbuzz.py",
                "print(1)\n",
            ),
            ("```js\n// src/a.js\nf();\n```", "src/a.js", "f();\n"),
            // A path line before the block wins over the comment, which stays.
            ("b.py\n```\n# a.py\nx\n```", "b.py", "# a.py\nx\n"),
        ] {
            let calls = parse(text, &offered);
            assert_eq!(calls.len(), 1, "{text}");
            assert_eq!(
                calls[0].arguments,
                serde_json::json!({ "path": path, "content": content }),
                "{text}"
            );
        }
        // A comment that is not a path alone.
        for text in [
            "```bash\n# Output of the check\npath/to/greet.py\n```",
            "```python\n# see a.py\nx\n```",
            "```python\n#!/usr/bin/env python3\nx\n```",
        ] {
            assert!(parse(text, &offered).is_empty(), "{text}");
        }
    }
}
