//! The tools that work on files: `read_file`, `write_file`, `edit_file`, `grep`, `glob`, `list_dir`.
//! Synchronous: [`crate::tools::Toolbox::run`] calls them on the blocking pool. Every path goes through
//! [`WorkDir::resolve`] first, so nothing outside the working directory is read or written.

#![allow(
    clippy::disallowed_methods,
    reason = "these tools run on the blocking pool (Toolbox::run)"
)]

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use grep::regex::RegexMatcherBuilder;
use grep::searcher::{BinaryDetection, SearcherBuilder, sinks::UTF8};
use serde::Deserialize;
use serde_json::Value;

use crate::definitions::{self, defined_names};
use crate::patch::FileOp;
use crate::tools::{Tool, ToolOutput, parse_args};
use crate::work_dir::{self, WorkDir};

/// Lines `read_file` returns unless told otherwise.
const READ_DEFAULT_LINES: usize = 2_000;
/// A longer line is cut when read.
const READ_LINE_CHARS: usize = 2_000;
/// `grep` stops collecting past this much output (what the model sees is cut shorter still).
const GREP_COLLECT_CHARS: usize = 200_000;
/// Lines shown before and after an edit's first replacement.
const EDIT_CONTEXT_LINES: usize = 3;
/// `glob` lists at most this many paths.
const GLOB_MAX: usize = 5_000;

/// What the writing tools must leave as it is, besides what they always keep (the working directory).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// The task says not to change the tests: a write or an edit that takes out a test line (an
    /// assertion, a test's declaration) or turns a test off is refused ([`test_lines_taken_out`],
    /// [`skips_added`]).
    pub tests: bool,
    /// The task of a coached model: a `write_file` over a file that leaves out a top-level
    /// definition of it, which this does not name, keeps it ([`definitions::merge`]); one that
    /// takes out another name the file defines, which this does not name and another file still
    /// uses, is refused ([`keep_used_names`]).
    pub used_names_but: Option<std::sync::Arc<str>>,
}

/// Runs a file tool; `Err` is the error result's text.
pub fn run(
    tool: Tool,
    work_dir: &WorkDir,
    arguments: &Value,
    kept: &Kept,
) -> Result<ToolOutput, String> {
    match tool {
        Tool::ReadFile => read_file(work_dir, &parse_args(tool, arguments)?),
        Tool::WriteFile => write_file(work_dir, &parse_args(tool, arguments)?, kept),
        Tool::EditFile => edit_file(work_dir, &parse_args(tool, arguments)?, kept),
        Tool::Grep => grep(work_dir, &parse_args(tool, arguments)?),
        Tool::Glob => glob(work_dir, &parse_args(tool, arguments)?),
        Tool::ListDir => list_dir(work_dir, &parse_args(tool, arguments)?),
        Tool::ReadManyFiles => read_many_files(work_dir, &parse_args(tool, arguments)?),
        Tool::ApplyPatch => apply_patch(work_dir, &parse_args(tool, arguments)?, kept),
        Tool::Shell | Tool::WebFetch | Tool::WebSearch => {
            Err(format!("`{}` is not a file tool", tool.name()))
        }
    }
}

#[derive(Deserialize)]
struct PatchArgs {
    patch: String,
}

/// A file as a patch leaves it: its new content, or none (deleted).
struct Change {
    path: PathBuf,
    shown: String,
    content: Option<String>,
}

/// Applies a patch whole or not at all: every change is worked out (and checked against the files
/// and what the task keeps) before any is written.
fn apply_patch(work_dir: &WorkDir, args: &PatchArgs, kept: &Kept) -> Result<ToolOutput, String> {
    let ops = crate::patch::parse(&args.patch)?;
    let mut changes: Vec<Change> = Vec::new();
    let mut said = Vec::new();
    let change = |path: PathBuf, shown: &str, content: Option<String>| Change {
        path,
        shown: shown.to_owned(),
        content,
    };
    for op in &ops {
        match op {
            FileOp::Add { path, content } => {
                let full = work_dir.resolve_writable(path)?;
                if full.symlink_metadata().is_ok() {
                    return Err(format!(
                        "`{path}` exists: change it with `*** Update File: {path}`, not add it"
                    ));
                }
                changes.push(change(full, path, Some(content.clone())));
                said.push(format!("added {path}"));
            }
            FileOp::Delete { path } => {
                let full = work_dir.resolve_writable(path)?;
                let before = String::from_utf8_lossy(&read_whole(&full, path)?).into_owned();
                if kept.tests {
                    keep_tests(path, &before, "")?;
                }
                changes.push(change(full, path, None));
                said.push(format!("deleted {path}"));
            }
            FileOp::Update {
                path,
                move_to,
                chunks,
            } => {
                let full = work_dir.resolve_writable(path)?;
                let before = String::from_utf8(read_whole(&full, path)?)
                    .map_err(|_| format!("`{path}` is not UTF-8 text"))?;
                let after = crate::patch::apply(&before, chunks)
                    .map_err(|problem| format!("`{path}`, {problem}"))?;
                if kept.tests {
                    keep_tests(path, &before, &after)?;
                }
                let count = format!("{} chunk(s)", chunks.len());
                if let Some(to) = move_to {
                    let dest = work_dir.resolve_writable(to)?;
                    if dest.symlink_metadata().is_ok() {
                        return Err(format!("cannot move `{path}` to `{to}`: `{to}` exists"));
                    }
                    changes.push(change(dest, to, Some(after)));
                    changes.push(change(full, path, None));
                    said.push(format!("moved {path} to {to} ({count})"));
                } else {
                    changes.push(change(full, path, Some(after)));
                    said.push(format!("updated {path} ({count})"));
                }
            }
        }
    }
    let mut paths: Vec<&Path> = changes.iter().map(|c| c.path.as_path()).collect();
    paths.sort_unstable();
    if let Some(twice) = paths.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(format!(
            "the patch changes `{}` twice: give each file one section",
            work_dir.relative(twice[0])
        ));
    }
    let mut touched = Vec::new();
    for Change {
        path,
        shown,
        content,
    } in changes
    {
        match content {
            Some(text) => {
                if let Some(parent) = path.parent() {
                    work_dir::create_folders(parent, &shown)?;
                }
                write_whole(&path, &shown, text.as_bytes())?;
            }
            None => {
                std::fs::remove_file(&path).map_err(|e| format!("cannot delete `{shown}`: {e}"))?;
            }
        }
        touched.push(work_dir.relative(&path));
    }
    Ok(ToolOutput {
        touched,
        ..ToolOutput::ok(format!("applied the patch: {}", said.join(", ")))
    })
}

#[derive(Deserialize)]
struct ReadManyArgs {
    paths: Vec<String>,
}

/// The files most `read_many_files` reads in one call.
const READ_MANY_FILES: usize = 20;

/// Each file as `read_file` shows it, under `=== path ===`; a file that cannot be read says why in
/// its place. An error when none could be read.
fn read_many_files(work_dir: &WorkDir, args: &ReadManyArgs) -> Result<ToolOutput, String> {
    if args.paths.is_empty() {
        return Err("`paths` lists no file".to_owned());
    }
    if args.paths.len() > READ_MANY_FILES {
        return Err(format!(
            "`paths` lists {} files; read at most {READ_MANY_FILES} in one call",
            args.paths.len()
        ));
    }
    let mut out = ToolOutput::ok(String::new());
    let mut read = 0;
    for path in &args.paths {
        let one = ReadArgs {
            path: path.clone(),
            offset: None,
            limit: None,
        };
        let _ = writeln!(out.content, "=== {path} ===");
        match read_file(work_dir, &one) {
            Ok(file) => {
                read += 1;
                out.content.push_str(&file.content);
                out.seen.extend(file.seen);
            }
            Err(problem) => {
                let _ = writeln!(out.content, "[{problem}]");
            }
        }
    }
    if read == 0 {
        out.is_error = true;
    }
    Ok(out)
}

#[derive(Deserialize)]
struct ReadArgs {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

fn read_file(work_dir: &WorkDir, args: &ReadArgs) -> Result<ToolOutput, String> {
    let path = work_dir.resolve_readable(&args.path)?;
    let bytes = read_whole(&path, &args.path)?;
    if bytes.contains(&0) {
        return Err(format!(
            "`{}` is a binary file ({} bytes); read_file shows text only",
            args.path,
            bytes.len()
        ));
    }
    let seen = |content: String| ToolOutput {
        seen: vec![work_dir.relative(&path)],
        ..ToolOutput::ok(content)
    };
    let text = String::from_utf8_lossy(&bytes);
    if text.is_empty() {
        return Ok(seen(format!("(`{}` is empty)", args.path)));
    }
    let first = args.offset.unwrap_or(1).max(1);
    let limit = args.limit.unwrap_or(READ_DEFAULT_LINES).max(1);
    let total = text.lines().count();
    if first > total {
        return Err(format!(
            "`{}` has {total} lines; offset {first} is past its end",
            args.path
        ));
    }
    let mut out = String::new();
    for (index, line) in text.lines().enumerate().skip(first - 1).take(limit) {
        let shown: String = line.chars().take(READ_LINE_CHARS).collect();
        let _ = writeln!(out, "{:>6}\t{shown}", index + 1);
    }
    let last = (first - 1 + limit).min(total);
    if last < total {
        let _ = writeln!(
            out,
            "[… `{}` has {total} lines; read on with offset={}]",
            args.path,
            last + 1
        );
    }
    Ok(seen(out))
}

#[derive(Deserialize)]
struct WriteArgs {
    path: String,
    content: String,
}

fn write_file(work_dir: &WorkDir, args: &WriteArgs, kept: &Kept) -> Result<ToolOutput, String> {
    let path = work_dir.resolve_writable(&args.path)?;
    if path.is_dir() {
        return Err(format!("`{}` is a folder", args.path));
    }
    if let Some(parent) = path.parent() {
        work_dir::create_folders(parent, &args.path)?;
    }
    let (before, content, put_back) = to_write(&path, &args.path, &args.content, kept);
    let unchanged = match &before {
        Some(before) => *before == content,
        None => holds(&path, &args.path, &content),
    };
    if unchanged {
        return Ok(ToolOutput::ok(format!(
            "{} already holds exactly this content: nothing changed",
            args.path
        )));
    }
    if let Some(before) = &before {
        if let Some(task) = &kept.used_names_but {
            keep_used_names(work_dir, (&path, &args.path), before, &content, task)?;
        }
        if kept.tests {
            keep_tests(&args.path, before, &content)?;
        }
    }
    write_whole(&path, &args.path, content.as_bytes())?;
    let mut out = format!("wrote {} bytes to {}", content.len(), args.path);
    if !put_back.is_empty() {
        let (them, were) = if put_back.len() == 1 {
            ("it", "it was")
        } else {
            ("them", "they were")
        };
        let _ = write!(
            out,
            ", keeping {} as {were}: your content left {them} out, and the task does not ask for \
             {them} to go",
            quoted(&put_back)
        );
    }
    if let Some(before) = before {
        out.push_str(&still_named(work_dir, &removed_names(&before, &content)));
    }
    Ok(touched(out, work_dir, &path))
}

/// What a `write_file` of `content` over `path` (`shown` as given) would leave in it: the file's
/// text before (when it is a small text file: a rename done by rewriting a file is told where the
/// old name is still used, as one done by editing it is), the content written, and the names of
/// the definitions `content` left out that are kept ([`Kept::used_names_but`]).
fn to_write<'a>(
    path: &Path,
    shown: &str,
    content: &'a str,
    kept: &Kept,
) -> (Option<String>, std::borrow::Cow<'a, str>, Vec<String>) {
    let before = path
        .symlink_metadata()
        .is_ok_and(|m| m.is_file() && m.len() <= RENAMED_FILE_BYTES)
        .then(|| read_whole(path, shown).ok())
        .flatten()
        .and_then(|bytes| String::from_utf8(bytes).ok());
    let merged = before
        .as_deref()
        .zip(kept.used_names_but.as_deref())
        .and_then(|(before, task)| definitions::merge(before, content, task));
    match merged {
        Some(merged) => (before, merged.text.into(), merged.kept),
        None => (before, content.into(), Vec::new()),
    }
}

#[derive(Deserialize)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

fn edit_file(work_dir: &WorkDir, args: &EditArgs, kept: &Kept) -> Result<ToolOutput, String> {
    let path = work_dir.resolve_writable(&args.path)?;
    if args.old_string.is_empty() {
        return Err("old_string is empty; give the exact text to replace".to_owned());
    }
    if args.old_string == args.new_string {
        return Err(
            "old_string and new_string are the same, so there is nothing to change: new_string \
             is the text as it should read after the change"
                .to_owned(),
        );
    }
    let text = String::from_utf8(read_whole(&path, &args.path)?)
        .map_err(|_| format!("`{}` is not UTF-8 text", args.path))?;
    let count = text.matches(&args.old_string).count();
    match count {
        0 => {
            // What is there, so the next try can copy from it (a small model guesses otherwise),
            // and the line it most likely meant.
            let nearest = nearest_line(&text, &args.old_string)
                .map(|(n, line)| {
                    format!(
                        "\nThe line most like old_string's first line is line {n}, which reads \
                         exactly:\n{line}"
                    )
                })
                .unwrap_or_default();
            // An earlier stage or turn may have made this very change (said only of a new_string
            // long enough not to be found by chance).
            let made = text
                .find(&args.new_string)
                .filter(|_| args.new_string.trim().chars().count() >= MADE_CHARS)
                .map(|at| {
                    format!(
                        " new_string is in it already (line {}): the change looks made.",
                        text[..at].matches('\n').count() + 1
                    )
                })
                .unwrap_or_default();
            return Err(format!(
                "old_string was not found in `{}`; it must match the file exactly, whitespace \
                 included.{made} The file holds now:\n{text}{nearest}",
                args.path
            ));
        }
        n if n > 1 && !args.replace_all => {
            return Err(format!(
                "old_string occurs {n} times in `{}`; add surrounding lines to make it unique, or set replace_all",
                args.path
            ));
        }
        _ => {}
    }
    let edited = if args.replace_all {
        text.replace(&args.old_string, &args.new_string)
    } else {
        text.replacen(&args.old_string, &args.new_string, 1)
    };
    if kept.tests {
        keep_tests(&args.path, &text, &edited)?;
    }
    write_whole(&path, &args.path, edited.as_bytes())?;
    // Where the first replacement now stands, with the lines around it: what the file holds there
    // now, so the next edit starts from it (a model otherwise edits what it remembers).
    let first = text.find(&args.old_string).unwrap_or(0);
    let start = text[..first].matches('\n').count();
    let replaced = args
        .new_string
        .strip_suffix('\n')
        .unwrap_or(&args.new_string);
    let end = start + replaced.matches('\n').count();
    let lines: Vec<&str> = edited.lines().collect();
    let mut out = format!("replaced {count} occurrence(s) in {}", args.path);
    let from = start.saturating_sub(EDIT_CONTEXT_LINES);
    let to = (end + EDIT_CONTEXT_LINES).min(lines.len().saturating_sub(1));
    if from <= to && from < lines.len() {
        let _ = writeln!(out, "; lines {}-{} now read:", from + 1, to + 1);
        for (index, line) in lines.iter().enumerate().take(to + 1).skip(from) {
            let shown: String = line.chars().take(READ_LINE_CHARS).collect();
            let _ = writeln!(out, "{:>6}\t{shown}", index + 1);
        }
    }
    out.push_str(&still_named(
        work_dir,
        &removed_names(&args.old_string, &args.new_string),
    ));
    Ok(touched(out, work_dir, &path))
}

/// The refusal of a rewrite of `path` (`shown` as given) from `before` to `after` that takes out
/// names `before` defines, which `task` does not name and other files still name: told to rename
/// one function, a small model rewrote the file as that function alone, and the program's other
/// imports broke. (A top-level definition left out is put back before this: [`definitions::merge`].)
fn keep_used_names(
    work_dir: &WorkDir,
    (path, shown): (&Path, &str),
    before: &str,
    after: &str,
    task: &str,
) -> Result<(), String> {
    /// The most names looked for: each is looked for on every line of up to [`RENAMED_FILES`]
    /// files.
    const MOST: usize = 20;
    let defined = defined_names(before);
    let names: Vec<String> = removed_words(before, after)
        .into_iter()
        .filter(|name| defined.contains(name) && !names_word(task, name))
        .take(MOST)
        .map(str::to_owned)
        .collect();
    let (places, more) = places_naming(work_dir, &names, Some(path));
    if places.is_empty() {
        return Ok(());
    }
    let quoted = quoted(&names);
    let mut message = format!(
        "Refused: this rewrite of `{shown}` takes out {quoted}, which the task does not ask for \
         and other files still use:\n{}\n",
        places.join("\n")
    );
    if more > 0 {
        let _ = writeln!(message, "(and {more} more lines)");
    }
    let _ = write!(
        message,
        "Write `{shown}` again with {quoted} kept in it, or change only the lines the task is \
         about with edit_file. `{shown}` is unchanged."
    );
    Err(message)
}

/// The refusal of a change of `path` from `before` to `after` that takes out test lines, when the
/// task says not to change the tests: a small model told to fix the code "without changing the
/// tests" deletes the failing assertion, changes its expected value, or rewrites the file without
/// its test module, and the tests pass.
fn keep_tests(path: &str, before: &str, after: &str) -> Result<(), String> {
    match tests_weakened(path, before, after, false) {
        None => Ok(()),
        Some(told) => Err(format!(
            "{told}\nKeep the tests exactly as they are and change the code they test instead. \
             `{path}` is unchanged."
        )),
    }
}

/// What the model is told first when a change of `path` (a command's, `by_command`) from `before`
/// to `after` takes test lines out or turns tests off ([`test_lines_taken_out`],
/// [`skips_added`]), the first few of those lines quoted; none when it does neither.
fn tests_weakened(path: &str, before: &str, after: &str, by_command: bool) -> Option<String> {
    /// The most lines quoted.
    const SHOWN: usize = 3;
    let taken = test_lines_taken_out(before, after);
    let (lines, [now, then]) = if taken.is_empty() {
        (
            skips_added(before, after),
            ["turns off tests with", "turned off tests with"],
        )
    } else {
        (taken, ["takes out", "took out"])
    };
    if lines.is_empty() {
        return None;
    }
    let what = if by_command {
        format!("this command {then}")
    } else {
        format!("this change {now}")
    };
    let mut message = format!(
        "Refused: the task says not to change the tests, and {what} {} test line(s) of `{path}`:",
        lines.len()
    );
    for line in lines.iter().take(SHOWN) {
        let _ = write!(message, "\n{line}");
    }
    if lines.len() > SHOWN {
        let _ = write!(message, "\n(and {} more)", lines.len() - SHOWN);
    }
    Some(message)
}

/// The lines of `after` that turn a test off and `before` did not hold (as many times): `#[ignore]`,
/// `@unittest.skip…`, `@pytest.mark.skip…`/`xfail`, `self.skipTest(`, `pytest.skip(`, `it.skip(`,
/// `test.skip(`, `describe.skip(`, `xit(`, compared with the whitespace around them taken off.
fn skips_added<'a>(before: &str, after: &'a str) -> Vec<&'a str> {
    const SKIPS: [&str; 11] = [
        "#[ignore",
        "@unittest.skip",
        "@pytest.mark.skip",
        "@pytest.mark.xfail",
        "self.skipTest(",
        "pytest.skip(",
        "it.skip(",
        "test.skip(",
        "describe.skip(",
        "xit(",
        "@skip",
    ];
    let is_skip = |line: &&str| SKIPS.iter().any(|skip| line.starts_with(skip));
    let mut had: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for line in before.lines().map(str::trim).filter(is_skip) {
        *had.entry(line).or_default() += 1;
    }
    after
        .lines()
        .map(str::trim)
        .filter(is_skip)
        .filter(|line| match had.get_mut(line) {
            Some(count) if *count > 0 => {
                *count -= 1;
                false
            }
            _ => true,
        })
        .collect()
}

/// The test lines of `before` that `after` no longer holds, each once, in order: lines that assert
/// (`assert`, `assert_eq!`, `self.assertEqual`, a line opening with `expect(`) or declare a test (`#[test]`,
/// `def test…`), compared with the whitespace around them taken off. A line moved within the file
/// is not taken out; one changed (another expected value) is.
pub fn test_lines_taken_out<'a>(before: &'a str, after: &str) -> Vec<&'a str> {
    fn is_test_line(line: &str) -> bool {
        let lower = line.to_ascii_lowercase();
        lower.contains("assert")
            || line.starts_with("expect(")
            || line.starts_with("#[test")
            || line.starts_with("def test")
    }
    let mut left: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for line in after.lines().map(str::trim).filter(|l| is_test_line(l)) {
        *left.entry(line).or_default() += 1;
    }
    let mut taken: Vec<&str> = Vec::new();
    for line in before.lines().map(str::trim).filter(|l| is_test_line(l)) {
        match left.get_mut(line) {
            Some(count) if *count > 0 => *count -= 1,
            _ if !taken.contains(&line) => taken.push(line),
            _ => {}
        }
    }
    taken
}

/// The most names an edit's result looks for after it took them out (more: a rewrite, not a
/// rename), the files it looks in, their largest size, and the places it lists.
const RENAMED_NAMES: usize = 3;
const RENAMED_FILES: usize = 200;
const RENAMED_FILE_BYTES: u64 = 256 * 1024;
const RENAMED_PLACES: usize = 6;

/// The names `old` holds and `new` does not, each once, in order: what an edit took out — a
/// renamed function, an option replaced by another. A name is a run of letters, digits and `_` of
/// three characters or more, not starting with a digit nor a common keyword or literal.
fn removed_words<'a>(old: &'a str, new: &str) -> Vec<&'a str> {
    const COMMON: &[&str] = &[
        "true", "false", "null", "nil", "none", "self", "this", "return", "import", "from", "def",
        "class", "function", "const", "let", "var", "pass", "else", "elif", "then", "and", "not",
        "for", "while", "print", "echo", "the",
    ];
    fn names(text: &str) -> impl Iterator<Item = &str> {
        text.split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|w| w.chars().count() >= 3 && !w.starts_with(|c: char| c.is_ascii_digit()))
            .filter(|w| !COMMON.contains(&w.to_ascii_lowercase().as_str()))
    }
    let kept: std::collections::HashSet<&str> = names(new).collect();
    let mut removed: Vec<&str> = Vec::new();
    for name in names(old) {
        if !kept.contains(name) && !removed.contains(&name) {
            removed.push(name);
        }
    }
    removed
}

/// The names an edit took out ([`removed_words`]) that read as code rather than prose: holding `_`
/// or an inner capital, or in `old` followed by `(` or coming after `.` or `--`.
fn removed_names(old: &str, new: &str) -> Vec<String> {
    let code_like = |name: &str| {
        name.contains('_')
            || name.chars().skip(1).any(char::is_uppercase)
            || old.match_indices(name).any(|(at, _)| {
                old[at + name.len()..].starts_with('(')
                    || old[..at].ends_with('.')
                    || old[..at].ends_with("--")
            })
    };
    removed_words(old, new)
        .into_iter()
        .filter(|name| code_like(name))
        .map(str::to_owned)
        .collect()
}

/// Where the working directory's text files still name any of `names` as a whole word, as a note
/// for an edit's result (empty when nowhere, or when there are more than [`RENAMED_NAMES`]: a
/// rewrite, not a rename): a rename that missed an import or a caller shows at once.
fn still_named(work_dir: &WorkDir, names: &[String]) -> String {
    if names.len() > RENAMED_NAMES {
        return String::new();
    }
    let (places, more) = places_naming(work_dir, names, None);
    if places.is_empty() {
        return String::new();
    }
    let mut note = format!(
        "\nThis change took out {}, which these lines still name (change them too if they should \
         follow):\n{}\n",
        quoted(names),
        places.join("\n")
    );
    if more > 0 {
        let _ = writeln!(note, "(and {more} more lines)");
    }
    note
}

/// `names` quoted and joined with `and`.
fn quoted(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    quoted.join(" and ")
}

/// For Python tracebacks in `output` ending in `NameError: name 'X' is not defined`, raised in a
/// file of the working directory that does not define `X` while another of its Python files does:
/// the import to add, every such name of the last raising file in one line. A small model that
/// wrote a test without importing what it tests read the `NameError` as the function missing, and
/// wrote the function again.
pub fn missing_import(work_dir: &WorkDir, output: &str) -> Option<String> {
    // Each error's name and the file whose frame comes last before it.
    let mut errors: Vec<(&str, &str)> = Vec::new();
    let mut frame = None;
    for line in output.lines() {
        let line = line.trim();
        if let Some(file) = line.strip_prefix("File \"").and_then(|l| l.split_once('"')) {
            frame = Some(file.0);
        } else if let Some(rest) = line.strip_prefix("NameError: name '")
            && let Some((name, _)) = rest.split_once("' is not defined")
            && !name.is_empty()
            && name.chars().all(|c| c == '_' || c.is_alphanumeric())
            && let Some(file) = frame
        {
            errors.push((name, file));
        }
    }
    let (_, raised) = *errors.last()?;
    let mut names: Vec<&str> = errors
        .iter()
        .filter(|(_, file)| *file == raised)
        .map(|(name, _)| *name)
        .collect();
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(*name));
    let raised = work_dir.resolve(raised).ok()?;
    let mut defining = None;
    let mut raising = String::new();
    for (path, shown, text) in small_text_files(work_dir) {
        if path.extension().is_none_or(|e| e != "py") {
            continue;
        }
        let defined = defined_names(&text);
        if path == raised {
            names.retain(|name| !defined.contains(name));
            raising = text;
        } else if defining.is_none() && names.iter().all(|name| defined.contains(name)) {
            defining = Some(shown);
        }
    }
    let defining = defining.filter(|_| !names.is_empty())?;
    let module = defining.strip_suffix(".py")?.replace('/', ".");
    let file = work_dir.relative(&raised);
    let them = if names.len() == 1 { "it" } else { "them" };
    let shown: Vec<String> = names.iter().map(|&n| n.to_owned()).collect();
    let import = format!("from {module} import {}", names.join(", "));
    let mut told = format!(
        "`{file}` uses {} without importing {them}, and `{defining}` defines {them}: add \
         `{import}` at the top of `{file}`.",
        quoted(&shown),
    );
    if let Some((old, new)) = import_edit(&raising, &import) {
        let call = trellis_llm::text_tool_calls::written_call(
            &format!("I add the missing import to {file}."),
            Tool::EditFile.name(),
            serde_json::json!({ "path": file, "old_string": old, "new_string": new }),
        );
        let _ = write!(told, " With edit_file:\n{call}");
    }
    Some(told)
}

/// The `edit_file` strings that put `import` into a Python file holding `text`: after its first
/// `import` line, or before its first line, when that line is in it once. A small model copies a
/// call it is shown; told only what to add, it ran the failing check again.
fn import_edit(text: &str, import: &str) -> Option<(String, String)> {
    let imports = text
        .lines()
        .find(|line| line.starts_with("import ") || line.starts_with("from "));
    let (line, new) = if let Some(line) = imports {
        (line, format!("{line}\n{import}"))
    } else {
        let line = text.lines().find(|line| !line.trim().is_empty())?;
        (line, format!("{import}\n{line}"))
    };
    (text.matches(line).count() == 1).then(|| (line.to_owned(), new))
}

/// For each of `codes`, the one source file of the working directory (not prose: `.md`, `.txt`,
/// `.rst`) that defines at its top level every name that code defines there, when it defines any:
/// where a block of code a model wrote without naming its file goes (`def is_prime(n): …` after
/// "Here's the implementation of the `is_prime` function:"). None when no file does, or more than
/// one. The files are read once for all the codes (an answer may hold hundreds of blocks).
pub fn defining_files(work_dir: &WorkDir, codes: &[String]) -> Vec<Option<String>> {
    const PROSE: [&str; 3] = ["md", "txt", "rst"];
    let wanted: Vec<Vec<&str>> = codes
        .iter()
        .map(|code| definitions::top_level_names(code))
        .collect();
    // Per code: the files found so far defining all its names (two is enough to say none).
    let mut found: Vec<Vec<String>> = vec![Vec::new(); codes.len()];
    if wanted.iter().all(Vec::is_empty) {
        return vec![None; codes.len()];
    }
    for (path, shown, text) in small_text_files(work_dir) {
        if path
            .extension()
            .is_some_and(|e| PROSE.iter().any(|prose| e == *prose))
        {
            continue;
        }
        let defined = definitions::top_level_names(&text);
        for (names, found) in wanted.iter().zip(&mut found) {
            if !names.is_empty() && found.len() < 2 && names.iter().all(|n| defined.contains(n)) {
                found.push(shown.clone());
            }
        }
    }
    found
        .into_iter()
        .map(|mut found| (found.len() == 1).then(|| found.remove(0)))
        .collect()
}

/// The lines of the working directory's text files (but `except`) that name any of `names` as a
/// whole word, as `file:line: text`, and how many more there are. At most [`RENAMED_FILES`] files
/// of at most [`RENAMED_FILE_BYTES`] are read (the walk honours `.gitignore`), and
/// [`RENAMED_PLACES`] places listed.
fn places_naming(
    work_dir: &WorkDir,
    names: &[String],
    except: Option<&Path>,
) -> (Vec<String>, usize) {
    let mut places: Vec<String> = Vec::new();
    let mut more = 0;
    if names.is_empty() {
        return (places, more);
    }
    for (path, shown, text) in small_text_files(work_dir) {
        if except.is_some_and(|except| path == except) {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            if names.iter().any(|name| names_word(line, name)) {
                if places.len() == RENAMED_PLACES {
                    more += 1;
                } else {
                    let line: String = line.trim().chars().take(120).collect();
                    places.push(format!("{shown}:{}: {line}", n + 1));
                }
            }
        }
    }
    if work_dir.stopped() {
        return (Vec::new(), 0);
    }
    (places, more)
}

/// The working directory's UTF-8 text files, as (path, path shown, text): at most
/// [`RENAMED_FILES`] files of at most [`RENAMED_FILE_BYTES`] (the walk honours `.gitignore`), and
/// none more once the stage stops.
fn small_text_files(work_dir: &WorkDir) -> impl Iterator<Item = (PathBuf, String, String)> + '_ {
    work_dir
        .walk(work_dir.root())
        .build()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
        .filter(|e| e.metadata().is_ok_and(|m| m.len() <= RENAMED_FILE_BYTES))
        .take(RENAMED_FILES)
        .take_while(|_| !work_dir.stopped())
        .filter_map(|entry| {
            let shown = work_dir.relative(entry.path());
            let text = String::from_utf8(read_whole(entry.path(), &shown).ok()?).ok()?;
            Some((entry.into_path(), shown, text))
        })
}

/// The files of the working directory that hold test lines ([`test_lines_taken_out`]), with what
/// they hold: kept before a command runs when the task says not to change the tests
/// ([`put_back_tests`]). The files [`small_text_files`] reads.
pub fn test_files(work_dir: &WorkDir) -> Vec<(String, String)> {
    small_text_files(work_dir)
        .filter(|(_, _, text)| !test_lines_taken_out(text, "").is_empty())
        .map(|(_, shown, text)| (shown, text))
        .collect()
}

/// After a command, when the task says not to change the tests: each of the `kept` files
/// ([`test_files`]) that the command took test lines out of (deleted, given another expected
/// value, or the file removed) or turned a test off in (`#[ignore]`) is put back as it was. What
/// the model is told, when any was.
pub fn put_back_tests(work_dir: &WorkDir, kept: Vec<(String, String)>) -> Option<String> {
    let mut told = String::new();
    for (shown, before) in kept {
        let Ok(path) = work_dir.resolve_writable(&shown) else {
            continue;
        };
        let now = read_whole(&path, &shown)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .unwrap_or_default();
        let Some(weakened) = tests_weakened(&shown, &before, &now, true) else {
            continue;
        };
        let put_back = path
            .parent()
            .is_none_or(|parent| work_dir::create_folders(parent, &shown).is_ok())
            && write_whole(&path, &shown, before.as_bytes()).is_ok();
        let _ = write!(
            told,
            "\n{}\n`{shown}` {}: keep the tests as they are and change the code they test instead.",
            weakened,
            if put_back {
                "was put back as it was"
            } else {
                "could not be put back"
            }
        );
    }
    (!told.is_empty()).then_some(told)
}

/// Whether `line` holds `name` as a whole word.
pub(crate) fn names_word(line: &str, name: &str) -> bool {
    let word_char = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(name).any(|(at, _)| {
        !line[..at].chars().next_back().is_some_and(word_char)
            && !line[at + name.len()..]
                .chars()
                .next()
                .is_some_and(word_char)
    })
}

/// The shortest `new_string` a failed edit says is in the file already.
const MADE_CHARS: usize = 5;

/// The line of `text` (its number from 1, and the line) that shares the most words — runs of
/// letters, digits and `_` — with the first non-blank line of `wanted`, when it shares at least
/// half of them: what an edit whose `old_string` is not in the file most likely meant (a small
/// model drops quotes or changes spacing).
fn nearest_line<'a>(text: &'a str, wanted: &str) -> Option<(usize, &'a str)> {
    fn words(line: &str) -> Vec<&str> {
        line.split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|w| !w.is_empty())
            .collect()
    }
    let wanted = words(wanted.lines().find(|l| !l.trim().is_empty())?);
    if wanted.is_empty() {
        return None;
    }
    let (shared, n, line) = text
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let have = words(line);
            let shared = wanted.iter().filter(|w| have.contains(w)).count();
            (shared, i + 1, line)
        })
        // The most shared words; of equals, the first line.
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))?;
    (shared * 2 >= wanted.len() && shared > 0).then_some((n, line))
}

/// Whether a `write_file` of `content` to `path` would change nothing: the file holds it already,
/// with what `kept` keeps ([`to_write`]).
pub fn writes_nothing_new(work_dir: &WorkDir, path: &str, content: &str, kept: &Kept) -> bool {
    work_dir.resolve(path).is_ok_and(|resolved| {
        let (_, content, _) = to_write(&resolved, path, content, kept);
        holds(&resolved, path, &content)
    })
}

fn holds(path: &Path, shown: &str, content: &str) -> bool {
    path.symlink_metadata()
        .is_ok_and(|m| m.is_file() && m.len() == content.len() as u64)
        && read_whole(path, shown).is_ok_and(|bytes| bytes == content.as_bytes())
}

/// A fingerprint of a file's content, read as the file tools read it (none when they would not):
/// what the loop detector compares failed edits by.
pub fn fingerprint(work_dir: &WorkDir, path: &str) -> Option<u64> {
    let resolved = work_dir.resolve(path).ok()?;
    let content = read_whole(&resolved, path).ok()?;
    Some(crate::loop_detector::fingerprint(&content))
}

/// What an `edit_file` call may name as the `old_string` of one file ([`edit_targets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Anchors {
    /// Each line of the file, with the whitespace around it taken off, whose text occurs exactly
    /// once in the file: an edit naming one applies.
    Lines(Vec<String>),
    /// Any text: the file is too large to list its lines.
    Any,
}

/// The files of the working directory an `edit_file` call may name, and for each what it may name
/// as its `old_string` ([`Anchors`]): every UTF-8 text file (the walk honours `.gitignore`), in
/// path order; a file larger than `max_bytes` takes any text, and so do the files after
/// `max_lines` lines were looked for in their files (each a search of its file, so a hostile
/// directory costs at most that many). None when there are more than `max_files` files: the list
/// would be too long to hold calls to.
pub fn edit_targets(
    work_dir: &WorkDir,
    (max_files, max_bytes, max_lines): (usize, u64, usize),
) -> Option<Vec<(String, Anchors)>> {
    let mut paths = Vec::new();
    for entry in work_dir.walk(work_dir.root()).build() {
        if work_dir.stopped() {
            return None;
        }
        let Ok(entry) = entry else { continue };
        if entry.file_type().is_some_and(|t| t.is_file()) {
            if paths.len() == max_files {
                return None;
            }
            paths.push(work_dir.relative(entry.path()));
        }
    }
    paths.sort();
    let mut searches = max_lines;
    let targets = paths
        .into_iter()
        .filter_map(|path| {
            let anchors = edit_anchors(work_dir, &path, max_bytes, &mut searches)?;
            match &anchors {
                Anchors::Lines(lines) if lines.is_empty() => None,
                _ => Some((path, anchors)),
            }
        })
        .collect();
    Some(targets)
}

/// What an edit of the file at `path` may name ([`Anchors`]): its lines, when it is at most
/// `max_bytes` long and the `searches` left (one per line not repeated as a whole line, for the
/// line's text anywhere else in the file) cover them; none for a file the file tools would not read
/// or that is not UTF-8 text.
fn edit_anchors(
    work_dir: &WorkDir,
    path: &str,
    max_bytes: u64,
    searches: &mut usize,
) -> Option<Anchors> {
    let resolved = work_dir.resolve(path).ok()?;
    let file = work_dir::open_file(&resolved, path, false).ok()?;
    let mut bytes = Vec::new();
    file.take(max_bytes + 1).read_to_end(&mut bytes).ok()?;
    let too_large = bytes.len() as u64 > max_bytes;
    if too_large {
        bytes.truncate(usize::try_from(max_bytes).unwrap_or(usize::MAX));
    }
    if bytes.contains(&0) {
        return None;
    }
    // A file cut short may end inside a character.
    let content = match String::from_utf8(bytes) {
        Ok(content) => content,
        Err(e) if too_large && e.utf8_error().error_len().is_none() => return Some(Anchors::Any),
        Err(_) => return None,
    };
    if too_large {
        return Some(Anchors::Any);
    }
    let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for line in content.lines().map(str::trim) {
        *counts.entry(line).or_default() += 1;
    }
    let mut lines: Vec<String> = Vec::new();
    for line in content.lines().map(str::trim) {
        if line.is_empty() || counts[line] > 1 {
            continue;
        }
        if *searches == 0 {
            return Some(Anchors::Any);
        }
        *searches -= 1;
        // Unique as a line, it may still be part of another.
        if content.match_indices(line).nth(1).is_none() {
            lines.push(line.to_owned());
        }
    }
    Some(Anchors::Lines(lines))
}

/// The files of the working directory a task names, with their text: each word of `text` that looks
/// like a path (it has a `.` or a `/`, once quotes, backticks and punctuation around it and a `:line`
/// or `:line:column` after it are taken off) and names a UTF-8 text file of at most `each` bytes —
/// then the files those files name (a test's output the task points to names the failing source
/// file, `src/lib.rs:12:9`); at most `count` files and `total` bytes in all, in the order named.
pub fn named_files(
    work_dir: &WorkDir,
    text: &str,
    (count, each, total): (usize, u64, usize),
) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = Vec::new();
    let mut used = 0;
    let mut scanned = 0;
    let mut next = text.to_owned();
    loop {
        for word in next.split_whitespace() {
            if files.len() == count || work_dir.stopped() {
                return files;
            }
            let Some((relative, content)) = named_file(work_dir, word, each) else {
                continue;
            };
            if files.iter().any(|(p, _)| *p == relative) || used + content.len() > total {
                continue;
            }
            used += content.len();
            files.push((relative, content));
        }
        let Some((_, content)) = files.get(scanned) else {
            return files;
        };
        next.clone_from(content);
        scanned += 1;
    }
}

/// Every file of the working directory, with its text, when it holds at most `count` files (its
/// ignored files and `.fabro` workflows left out: a workflow's prompts are not the project's
/// work, and the model would read its task again there) and each is a UTF-8 text file of at most
/// `each` bytes, `total` in all; else none.
pub fn project_files(
    work_dir: &WorkDir,
    (count, each, total): (usize, u64, usize),
) -> Vec<(String, String)> {
    let mut paths = Vec::new();
    for entry in work_dir.walk(work_dir.root()).build() {
        if work_dir.stopped() {
            return Vec::new();
        }
        let Ok(entry) = entry else {
            return Vec::new();
        };
        if entry.file_type().is_some_and(|t| t.is_file())
            && entry.path().extension().is_none_or(|e| e != "fabro")
        {
            if paths.len() == count {
                return Vec::new();
            }
            paths.push(work_dir.relative(entry.path()));
        }
    }
    paths.sort();
    let mut files = Vec::new();
    let mut used = 0;
    for path in paths {
        let Some((relative, content)) = named_file(work_dir, &path, each) else {
            return Vec::new();
        };
        used += content.len();
        if used > total {
            return Vec::new();
        }
        files.push((relative, content));
    }
    files
}

/// The file `word` names (its path relative to the working directory, and its text), when it is a
/// UTF-8 text file of at most `each` bytes ([`named_files`]).
fn named_file(work_dir: &WorkDir, word: &str, each: u64) -> Option<(String, String)> {
    let word = path_word(word)?;
    let path = work_dir.resolve(word).ok()?;
    let file = work_dir::open_file(&path, word, false).ok()?;
    if file.metadata().map_or(true, |m| m.len() > each) {
        return None;
    }
    let mut bytes = Vec::new();
    if file.take(each).read_to_end(&mut bytes).is_err() || bytes.contains(&0) {
        return None;
    }
    Some((work_dir.relative(&path), String::from_utf8(bytes).ok()?))
}

/// A word of a text as the path it may name: quotes, backticks and punctuation around it, a
/// leading `./` and a `:line` or `:line:column` after it taken off (`` `./src/lib.rs:12:9`, `` is
/// `src/lib.rs`).
pub fn bare_path(word: &str) -> &str {
    let word = word
        .trim_start_matches(|c: char| "`'\"([{<*".contains(c))
        .trim_end_matches(|c: char| "`'\"()[]{}<>*,;:!?.".contains(c));
    let word = word.strip_prefix("./").unwrap_or(word);
    // A place in a file, as compilers and test runners print it: `src/lib.rs:12:9`.
    (0..2).fold(word, |word, _| match word.rsplit_once(':') {
        Some((path, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => path,
        _ => word,
    })
}

/// The path a word of a text names, when it looks like one: it has a `.` or a `/` once bare
/// ([`bare_path`]).
fn path_word(word: &str) -> Option<&str> {
    let word = bare_path(word);
    (word.contains('.') || word.contains('/')).then_some(word)
}

/// The extensions of the files a task may ask for by name ([`named_paths`]): a word such as
/// `e.g.` or `v1.2` is not taken for a file (nor a capitalised `.js`: `Node.js` is a name).
const FILE_EXTENSIONS: &[&str] = &[
    "c", "cfg", "conf", "cpp", "cs", "css", "csv", "dot", "fabro", "go", "h", "hpp", "html", "ini",
    "java", "js", "json", "jsx", "kt", "lua", "md", "php", "pl", "py", "rb", "rs", "rst", "sh",
    "sql", "swift", "toml", "ts", "tsx", "txt", "xml", "yaml", "yml",
];

/// The files `text` names: each word that looks like a relative path (a `.` or a `/` in it once
/// quotes and punctuation are off; not a glob, an option or an address) to a file with a usual
/// extension (`py`, `rs`, `json`, `txt`, …; not `Node.js`), in the order named, each once.
pub fn named_paths(text: &str) -> Vec<&str> {
    let mut named: Vec<&str> = Vec::new();
    for word in text.split_whitespace().filter_map(path_word) {
        let Some((stem, extension)) = word.rsplit_once('.') else {
            continue;
        };
        let name = stem.rsplit('/').next().unwrap_or(stem);
        if name.is_empty()
            || word.starts_with(['/', '-'])
            || word.contains(['*', '?'])
            || word.contains("://")
            || !FILE_EXTENSIONS.contains(&extension)
            || (extension == "js" && name.starts_with(char::is_uppercase))
            || named.contains(&word)
        {
            continue;
        }
        named.push(word);
    }
    named
}

/// The files `text` names ([`named_paths`]) that are not in the working directory, in the order
/// named.
pub fn missing_files(work_dir: &WorkDir, text: &str) -> Vec<String> {
    named_paths(text)
        .into_iter()
        .filter(|word| {
            work_dir
                .resolve(word)
                .is_ok_and(|path| path.symlink_metadata().is_err())
        })
        .map(str::to_owned)
        .collect()
}

/// The whole of a regular file ([`work_dir::open_file`]).
fn read_whole(path: &Path, shown: &str) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    work_dir::open_file(path, shown, false)?
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    Ok(bytes)
}

/// Replaces a regular file's content, or creates it ([`work_dir::open_file`]).
fn write_whole(path: &Path, shown: &str, content: &[u8]) -> Result<(), String> {
    let mut file = work_dir::open_file(path, shown, true)?;
    file.set_len(0)
        .and_then(|()| file.write_all(content))
        .map_err(|e| format!("cannot write `{shown}`: {e}"))
}

fn touched(message: String, work_dir: &WorkDir, path: &Path) -> ToolOutput {
    ToolOutput {
        touched: vec![work_dir.relative(path)],
        ..ToolOutput::ok(message)
    }
}

#[derive(Deserialize)]
struct GrepArgs {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
}

fn grep(work_dir: &WorkDir, args: &GrepArgs) -> Result<ToolOutput, String> {
    let root = work_dir.resolve(args.path.as_deref().unwrap_or(""))?;
    // A pattern that is no regular expression is text to find as it is (a line of code, with its
    // brackets): searched so, and the answer says so.
    let mut builder = RegexMatcherBuilder::new();
    builder.case_insensitive(args.case_insensitive);
    let (matcher, as_text) = match builder.build(&args.pattern) {
        Ok(matcher) => (matcher, ""),
        Err(_) => (
            builder
                .fixed_strings(true)
                .build(&args.pattern)
                .map_err(|e| format!("cannot search for `{}`: {e}", args.pattern))?,
            " (not a regular expression, so searched for as plain text)",
        ),
    };
    let mut walk = work_dir.walk(&root);
    if let Some(glob) = &args.glob {
        let mut overrides = ignore::overrides::OverrideBuilder::new(&root);
        overrides
            .add(glob)
            .map_err(|e| format!("invalid glob `{glob}`: {e}"))?;
        walk.overrides(
            overrides
                .build()
                .map_err(|e| format!("invalid glob `{glob}`: {e}"))?,
        );
    }
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(0))
        .line_number(true)
        .build();
    let mut out = String::new();
    let mut hits = 0usize;
    let mut found = Vec::new();
    for entry in walk.build().filter_map(Result::ok) {
        if work_dir.stopped() {
            break;
        }
        // Regular files with one name only (a second hard link may be a file from elsewhere).
        if !entry.file_type().is_some_and(|t| t.is_file())
            || entry
                .metadata()
                .is_ok_and(|m| std::os::unix::fs::MetadataExt::nlink(&m) > 1)
        {
            continue;
        }
        let shown = work_dir.relative(entry.path());
        let before = hits;
        let _ = searcher.search_path(
            &matcher,
            entry.path(),
            UTF8(|line, text| {
                hits += 1;
                let _ = writeln!(out, "{shown}:{line}:{}", text.trim_end_matches('\n'));
                Ok(out.len() < GREP_COLLECT_CHARS)
            }),
        );
        if hits > before {
            found.push(shown);
        }
        if out.len() >= GREP_COLLECT_CHARS {
            break;
        }
    }
    if hits == 0 {
        let mut answer = format!("no matches for `{}`{as_text}", args.pattern);
        let files = files_named_by(work_dir, &args.pattern);
        if !files.is_empty() {
            // A small model greps for `notes/*.txt` to see whether there are such files, and
            // takes "no matches" for "none".
            let _ = write!(
                answer,
                " in the files' text. `{}` names files, which grep does not look for; these \
                 exist: {}",
                args.pattern,
                files.join(", ")
            );
        }
        return Ok(ToolOutput::ok(answer));
    }
    if !as_text.is_empty() {
        out = format!("`{}`{as_text}:\n{out}", args.pattern);
    }
    Ok(ToolOutput {
        seen: found,
        ..ToolOutput::ok(out)
    })
}

/// The files of the working directory (at most ten) that `pattern` names when read as a path or a
/// glob (`notes/*.txt`, `src/main.rs`), not as a regular expression; none for a pattern without a
/// `/`, `*` or `.`, which is text.
fn files_named_by(work_dir: &WorkDir, pattern: &str) -> Vec<String> {
    const SHOWN: usize = 10;
    if !pattern.contains(['/', '*', '.']) {
        return Vec::new();
    }
    let Ok(matcher) = globset::GlobBuilder::new(pattern.trim_start_matches("./"))
        .literal_separator(true)
        .build()
        .map(|glob| glob.compile_matcher())
    else {
        return Vec::new();
    };
    files_matching(work_dir, work_dir.root(), &matcher)
        .take(SHOWN)
        .map(|e| work_dir.relative(e.path()))
        .collect()
}

/// The files under `root` (`.gitignore` honoured) whose path from `root` `matcher` matches, until
/// the stage stops.
fn files_matching<'a>(
    work_dir: &'a WorkDir,
    root: &'a Path,
    matcher: &'a globset::GlobMatcher,
) -> impl Iterator<Item = ignore::DirEntry> + 'a {
    work_dir
        .walk(root)
        .build()
        .take_while(|_| !work_dir.stopped())
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
        .filter(move |e| {
            e.path()
                .strip_prefix(root)
                .is_ok_and(|rel| matcher.is_match(rel))
        })
}

#[derive(Deserialize)]
struct GlobArgs {
    pattern: String,
    path: Option<String>,
}

fn glob(work_dir: &WorkDir, args: &GlobArgs) -> Result<ToolOutput, String> {
    let root = work_dir.resolve(args.path.as_deref().unwrap_or(""))?;
    let matcher = globset::Glob::new(&args.pattern)
        .map_err(|e| format!("invalid glob `{}`: {e}", args.pattern))?
        .compile_matcher();
    let mut found: Vec<(SystemTime, String)> = files_matching(work_dir, &root, &matcher)
        .take(GLOB_MAX)
        .map(|e| {
            let modified = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            (modified, work_dir.relative(e.path()))
        })
        .collect();
    if found.is_empty() {
        return Ok(ToolOutput::ok(format!("no files match `{}`", args.pattern)));
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut out = String::new();
    for (_, path) in found {
        let _ = writeln!(out, "{path}");
    }
    Ok(ToolOutput::ok(out))
}

#[derive(Deserialize)]
struct ListArgs {
    path: Option<String>,
}

fn list_dir(work_dir: &WorkDir, args: &ListArgs) -> Result<ToolOutput, String> {
    let shown = args.path.as_deref().unwrap_or(".");
    let dir = work_dir.resolve(args.path.as_deref().unwrap_or(""))?;
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("cannot list `{shown}`: {e}"))?;
    let mut lines: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            match entry.path().symlink_metadata() {
                Ok(m) if m.file_type().is_symlink() => format!("link  {name}"),
                Ok(m) if m.is_dir() => format!("dir   {name}/"),
                Ok(m) => format!("file  {name}  ({} bytes)", m.len()),
                Err(_) => format!("?     {name}"),
            }
        })
        .collect();
    if lines.is_empty() {
        return Ok(ToolOutput::ok(format!("`{shown}` is empty")));
    }
    lines.sort_by(|a, b| a[6..].cmp(&b[6..]));
    Ok(ToolOutput::ok(lines.join("\n") + "\n"))
}

/// The working directory's files two levels deep (honouring `.gitignore`, hidden files left out), at
/// most `limit` entries: what an agent is shown before it starts, so it need not guess paths.
pub fn overview(work_dir: &WorkDir, limit: usize) -> String {
    let root = work_dir.root();
    let mut entries: Vec<String> = work_dir
        .walk(root)
        .max_depth(Some(2))
        .build()
        .take_while(|_| !work_dir.stopped())
        .filter_map(Result::ok)
        .filter(|e| e.depth() > 0)
        .map(|e| {
            let path = work_dir.relative(e.path());
            if e.file_type().is_some_and(|t| t.is_dir()) {
                format!("{path}/")
            } else {
                path
            }
        })
        .collect();
    entries.sort();
    let total = entries.len();
    entries.truncate(limit);
    let mut out = entries.join("\n");
    if total > limit {
        let _ = write!(out, "\n[… and {} more]", total - limit);
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_missing_old_string_is_met_with_the_line_most_like_it() {
        let config = "{\n  \"port\": 8080,\n  \"debug\": true\n}\n";
        assert_eq!(
            nearest_line(config, "debug: true"),
            Some((3, "  \"debug\": true"))
        );
        assert_eq!(
            nearest_line(config, "\n  port = 8080\nmore"),
            Some((2, "  \"port\": 8080,"))
        );
        assert_eq!(nearest_line(config, "verbose: yes"), None);
        assert_eq!(nearest_line(config, "{}"), None);
    }

    fn setup() -> (tempfile::TempDir, WorkDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::fs::write(
            dir.path().join("src/lib.rs"),
            "pub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join(".gitignore"), "target/\n").unwrap();
        std::fs::create_dir(dir.path().join("target")).unwrap();
        std::fs::write(dir.path().join("target/junk.rs"), "pub fn add() {}\n").unwrap();
        let work = WorkDir::new(dir.path()).unwrap();
        (dir, work)
    }

    fn call(work: &WorkDir, tool: Tool, args: &Value) -> Result<ToolOutput, String> {
        run(tool, work, args, &Kept::default())
    }

    #[test]
    fn the_test_lines_a_change_takes_out_are_named_and_moves_are_not() {
        let before = "fn area() {}\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn a() {\n        assert_eq!(area(3, 4), 12);\n        assert!(ok());\n    }\n}\n";
        // Another expected value, a deleted assertion, the test module dropped.
        assert_eq!(
            test_lines_taken_out(before, &before.replace("12)", "7)")),
            ["assert_eq!(area(3, 4), 12);"]
        );
        assert_eq!(
            test_lines_taken_out(before, &before.replace("        assert!(ok());\n", "")),
            ["assert!(ok());"]
        );
        assert_eq!(
            test_lines_taken_out(before, "fn area() {}\n"),
            ["#[test]", "assert_eq!(area(3, 4), 12);", "assert!(ok());"]
        );
        // The code changed, a test added, the lines indented anew: nothing taken out.
        let after = before
            .replace("fn area() {}", "fn area() -> u32 { 12 }")
            .replace("        assert!", "\tassert!")
            .replace(
                "mod tests {\n",
                "mod tests {\n    #[test]\n    fn b() { assert!(true); }\n",
            );
        assert_eq!(test_lines_taken_out(before, &after), [] as [&str; 0]);
    }

    #[test]
    fn kept_tests_refuse_a_rewrite_without_them_and_let_the_code_change() {
        let (dir, work) = setup();
        let lib = "pub fn area(w: u32, h: u32) -> u32 {\n    w + h\n}\n\n#[test]\nfn area_of_a_rectangle() {\n    assert_eq!(area(3, 4), 12);\n}\n";
        std::fs::write(dir.path().join("src/area.rs"), lib).unwrap();
        let kept = Kept {
            tests: true,
            ..Kept::default()
        };
        let rewrite = json!({"path": "src/area.rs", "content": "pub fn area(w: u32, h: u32) -> u32 {\n    w * h\n}\n"});
        let err = run(Tool::WriteFile, &work, &rewrite, &kept).unwrap_err();
        assert!(
            err.contains(
                "takes out 2 test line(s) of `src/area.rs`:\n#[test]\nassert_eq!(area(3, 4), 12);\n"
            ),
            "{err}"
        );
        // Nor may a test be turned off.
        let ignore = json!({"path": "src/area.rs", "old_string": "#[test]", "new_string": "#[test]\n#[ignore]"});
        let err = run(Tool::EditFile, &work, &ignore, &kept).unwrap_err();
        assert!(
            err.starts_with(
                "Refused: the task says not to change the tests, and this change turns off tests \
                 with 1 test line(s) of `src/area.rs`:\n#[ignore]\nKeep the tests exactly"
            ),
            "{err}"
        );
        let edit = json!({"path": "src/area.rs", "old_string": "w + h", "new_string": "w * h"});
        run(Tool::EditFile, &work, &edit, &kept).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("src/area.rs")).unwrap(),
            lib.replace("w + h", "w * h")
        );
        // Without the rule, the rewrite is the model's to make.
        run(Tool::WriteFile, &work, &rewrite, &Kept::default()).unwrap();
    }

    #[test]
    fn test_lines_a_command_took_out_are_put_back_and_other_changes_stay() {
        let (dir, work) = setup();
        let file = |name: &str| dir.path().join(name);
        let test = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n";
        std::fs::write(file("test_calc.py"), test).unwrap();
        std::fs::create_dir(file("tests")).unwrap();
        std::fs::write(file("tests/test_more.py"), test).unwrap();
        std::fs::write(file("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
        let kept = test_files(&work);
        let mut names: Vec<&str> = kept.iter().map(|(name, _)| name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["test_calc.py", "tests/test_more.py"]);
        // A command (`sed -i`, `rm -r`) weakens one test file, removes the other's folder, and
        // changes the code; another adds a test.
        std::fs::write(file("test_calc.py"), test.replace("== 5", "== -1")).unwrap();
        std::fs::remove_dir_all(file("tests")).unwrap();
        std::fs::write(file("calc.py"), "def add(a, b):\n    return a + b\n").unwrap();
        let told = put_back_tests(&work, kept).unwrap();
        assert!(
            told.contains(
                "this command took out 1 test line(s) of `test_calc.py`:\nassert add(2, 3) == 5\n\
                 `test_calc.py` was put back as it was"
            ),
            "{told}"
        );
        assert!(
            told.contains("of `tests/test_more.py`:\ndef test_add():\n"),
            "{told}"
        );
        assert_eq!(std::fs::read_to_string(file("test_calc.py")).unwrap(), test);
        assert_eq!(
            std::fs::read_to_string(file("tests/test_more.py")).unwrap(),
            test
        );
        assert_eq!(
            std::fs::read_to_string(file("calc.py")).unwrap(),
            "def add(a, b):\n    return a + b\n"
        );
        // A test added is no weakening; a test turned off is.
        let kept = test_files(&work);
        let more = format!("{test}    assert add(0, 0) == 0\n");
        std::fs::write(file("test_calc.py"), &more).unwrap();
        assert_eq!(put_back_tests(&work, kept), None);
        let kept = test_files(&work);
        let skipped = more.replace("def test_add", "@pytest.mark.skip\ndef test_add");
        std::fs::write(file("test_calc.py"), skipped).unwrap();
        let told = put_back_tests(&work, kept).unwrap();
        assert!(
            told.contains("this command turned off tests with 1 test line(s) of `test_calc.py`"),
            "{told}"
        );
        assert_eq!(std::fs::read_to_string(file("test_calc.py")).unwrap(), more);
    }

    #[test]
    fn a_patch_adds_updates_moves_and_deletes_whole_or_not_at_all() {
        let (dir, work) = setup();
        std::fs::write(dir.path().join("old.txt"), "bye\n").unwrap();
        let patch = |text: &str| call(&work, Tool::ApplyPatch, &json!({ "patch": text }));
        let out = patch(
            "*** Begin Patch\n*** Update File: src/lib.rs\n*** Move to: src/add.rs\n@@ pub fn add(a: i32, b: i32) -> i32 {\n-    a - b\n+    a + b\n*** Add File: docs/notes.md\n+# Notes\n*** Delete File: old.txt\n*** End Patch",
        )
        .unwrap();
        assert_eq!(
            out.content,
            "applied the patch: moved src/lib.rs to src/add.rs (1 chunk(s)), added docs/notes.md, deleted old.txt"
        );
        assert_eq!(
            out.touched,
            ["src/add.rs", "src/lib.rs", "docs/notes.md", "old.txt"]
        );
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).ok();
        assert_eq!(
            read("src/add.rs").unwrap(),
            "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n"
        );
        assert_eq!(read("docs/notes.md").unwrap(), "# Notes\n");
        assert!(read("src/lib.rs").is_none() && read("old.txt").is_none());
        // A chunk that is not there: nothing is written, the add before it included.
        let problem = patch(
            "*** Begin Patch\n*** Add File: new.md\n+x\n*** Update File: src/add.rs\n@@\n-    a * b\n+    a / b\n*** End Patch",
        )
        .unwrap_err();
        assert!(
            problem.starts_with("`src/add.rs`, chunk 1 of 1: its lines are not in the file"),
            "{problem}"
        );
        assert!(read("new.md").is_none());
        // Outside the working directory, over a file that exists, the same file twice: refused.
        for (text, said) in [
            (
                "*** Begin Patch\n*** Add File: ../escape.md\n+x\n*** End Patch",
                "..",
            ),
            (
                "*** Begin Patch\n*** Add File: docs/notes.md\n+x\n*** End Patch",
                "exists",
            ),
            (
                "*** Begin Patch\n*** Delete File: docs/notes.md\n*** Update File: docs/notes.md\n@@\n-# Notes\n+# N\n*** End Patch",
                "twice",
            ),
        ] {
            let problem = patch(text).unwrap_err();
            assert!(problem.contains(said), "{text}: {problem}");
        }
        assert!(!dir.path().parent().unwrap().join("escape.md").exists());
        // A link out of the working directory leads nowhere: no add, update or delete through it.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "s3cret\n").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        for text in [
            "*** Begin Patch\n*** Add File: out/new.txt\n+x\n*** End Patch",
            "*** Begin Patch\n*** Update File: out/secret.txt\n@@\n-s3cret\n+gone\n*** End Patch",
            "*** Begin Patch\n*** Delete File: out/secret.txt\n*** End Patch",
            "*** Begin Patch\n*** Update File: docs/notes.md\n*** Move to: out/moved.md\n@@\n-# Notes\n+# N\n*** End Patch",
        ] {
            assert!(patch(text).is_err(), "{text}");
        }
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
            "s3cret\n"
        );
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
        assert_eq!(read("docs/notes.md").unwrap(), "# Notes\n");
    }

    #[test]
    fn read_many_files_shows_each_file_under_its_path_and_what_it_could_not_read() {
        let (_d, work) = setup();
        let out = call(
            &work,
            Tool::ReadManyFiles,
            &json!({"paths": ["src/lib.rs", "missing.rs", ".gitignore"]}),
        )
        .unwrap();
        assert!(!out.is_error);
        assert!(
            out.content
                .starts_with("=== src/lib.rs ===\n     1\tpub fn add(a: i32, b: i32) -> i32 {\n")
                && out.content.contains("=== missing.rs ===\n[")
                && out
                    .content
                    .ends_with("=== .gitignore ===\n     1\ttarget/\n"),
            "{}",
            out.content
        );
        assert_eq!(out.seen, ["src/lib.rs", ".gitignore"]);
        let none = call(&work, Tool::ReadManyFiles, &json!({"paths": ["nope"]})).unwrap();
        assert!(none.is_error);
        assert!(call(&work, Tool::ReadManyFiles, &json!({"paths": []})).is_err());
        let outside = call(
            &work,
            Tool::ReadManyFiles,
            &json!({"paths": ["../../etc/passwd"]}),
        )
        .unwrap();
        assert!(
            outside.is_error && !outside.content.contains("root:"),
            "{}",
            outside.content
        );
    }

    #[test]
    fn read_numbers_lines_and_says_where_to_read_on() {
        let (_d, work) = setup();
        let out = call(
            &work,
            Tool::ReadFile,
            &json!({"path": "src/lib.rs", "limit": 2}),
        )
        .unwrap();
        assert_eq!(
            out.content,
            "     1\tpub fn add(a: i32, b: i32) -> i32 {\n     2\t    a - b\n[… `src/lib.rs` has 3 lines; read on with offset=3]\n"
        );
        let out = call(
            &work,
            Tool::ReadFile,
            &json!({"path": "src/lib.rs", "offset": 3}),
        )
        .unwrap();
        assert_eq!(out.content, "     3\t}\n");
    }

    /// A working directory holding `files` (name, content).
    fn with_files(files: &[(&str, &str)]) -> (tempfile::TempDir, WorkDir) {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).unwrap();
        }
        let work = WorkDir::new(dir.path()).unwrap();
        (dir, work)
    }

    #[test]
    fn an_edit_that_takes_a_name_out_says_where_it_is_still_named() {
        let (_dir, work_dir) = with_files(&[
            (
                "util.py",
                "def get_total(prices):\n    return sum(prices)\n\n\ndef average(prices):\n    return get_total(prices) / len(prices)\n",
            ),
            (
                "main.py",
                "from util import get_total, average\nprint(get_total([3]), average([3]))\nget_totals = 1\n",
            ),
        ]);
        let edit = |old: &str, new: &str| {
            let args = EditArgs {
                path: "util.py".into(),
                old_string: old.into(),
                new_string: new.into(),
                replace_all: false,
            };
            edit_file(&work_dir, &args, &Kept::default())
                .unwrap()
                .content
        };
        let out = edit("def get_total(prices):", "def compute_total(prices):");
        assert!(
            out.ends_with(
                "This change took out `get_total`, which these lines still name (change them too if they should follow):\n\
                 main.py:1: from util import get_total, average\n\
                 main.py:2: print(get_total([3]), average([3]))\n\
                 util.py:6: return get_total(prices) / len(prices)\n"
            ),
            "{out}"
        );
        // A literal changed, prose, or a name gone everywhere: nothing to say.
        let out = edit("return sum(prices)", "return sum(prices) or False");
        assert!(!out.contains("took out"), "{out}");
        let out = edit("or False", "or None  # a total of prices");
        assert!(!out.contains("took out"), "{out}");
        let out = edit("# a total of prices", "# the sum");
        assert!(!out.contains("took out"), "{out}");
        let out = edit("def compute_total(prices):", "def compute_sum(prices):");
        assert!(!out.contains("took out"), "{out}");
        // A call taken out is named where it is still used, and not once it is gone everywhere.
        let out = edit("return get_total(prices)", "return compute_sum(prices)");
        assert!(out.contains("took out `get_total`"), "{out}");
        let out = edit("/ len(prices)", "/ prices.count()");
        assert!(!out.contains("took out"), "{out}");
    }

    #[test]
    fn a_rewrite_that_takes_a_name_out_says_where_it_is_still_named() {
        let (_dir, work_dir) = with_files(&[
            (
                "util.py",
                "def get_total(prices):\n    return sum(prices)\n",
            ),
            (
                "main.py",
                "from util import get_total\nprint(get_total([3]))\n",
            ),
        ]);
        let write = |path: &str, content: &str| {
            let args = WriteArgs {
                path: path.into(),
                content: content.into(),
            };
            write_file(&work_dir, &args, &Kept::default())
                .unwrap()
                .content
        };
        let out = write(
            "main.py",
            "from util import compute_total\nprint(compute_total([3]))\n",
        );
        assert_eq!(
            out,
            "wrote 57 bytes to main.py\n\
             This change took out `get_total`, which these lines still name (change them too if they should follow):\n\
             util.py:1: def get_total(prices):\n"
        );
        // Gone everywhere, or a new file: nothing to say.
        let out = write(
            "util.py",
            "def compute_total(prices):\n    return sum(prices)\n",
        );
        assert_eq!(out, "wrote 50 bytes to util.py");
        let out = write("new.py", "print(1)\n");
        assert_eq!(out, "wrote 9 bytes to new.py");
    }

    #[test]
    fn a_rewrite_leaving_definitions_out_keeps_them_and_one_taking_out_a_used_name_is_refused() {
        let util = "def get_total(prices):\n    return sum(prices)\n\n\ndef average(prices):\n    return get_total(prices) / len(prices)\n";
        let (dir, work_dir) = with_files(&[
            ("util.py", util),
            (
                "main.py",
                "from util import get_total, average\nprint(get_total([3]), average([3]))\n",
            ),
        ]);
        let kept = Kept {
            used_names_but: Some(
                "Rename the function get_total to compute_total everywhere.".into(),
            ),
            ..Kept::default()
        };
        let write = |path: &str, content: &str| {
            let args = WriteArgs {
                path: path.into(),
                content: content.into(),
            };
            write_file(&work_dir, &args, &kept)
        };
        let read = |path: &str| std::fs::read_to_string(dir.path().join(path)).unwrap();
        // The rename of get_total is the task; leaving out average is not, so it is kept.
        let out = write(
            "util.py",
            "def compute_total(prices):\n    return sum(prices)\n",
        )
        .unwrap();
        assert_eq!(
            out.content,
            "wrote 115 bytes to util.py, keeping `average` as it was: your content left it out, \
             and the task does not ask for it to go"
        );
        assert_eq!(
            read("util.py"),
            "def average(prices):\n    return get_total(prices) / len(prices)\n\ndef \
             compute_total(prices):\n    return sum(prices)\n"
        );
        // The same again changes nothing, and counts as no change.
        let partial = "def compute_total(prices):\n    return sum(prices)\n";
        assert!(writes_nothing_new(&work_dir, "util.py", partial, &kept));
        assert!(!writes_nothing_new(
            &work_dir,
            "util.py",
            partial,
            &Kept::default()
        ));
        let out = write("util.py", partial).unwrap();
        assert_eq!(
            out.content,
            "util.py already holds exactly this content: nothing changed"
        );
        // Written whole, as it is.
        let out = write("util.py", &util.replace("get_total", "compute_total")).unwrap();
        assert!(
            out.content.starts_with("wrote 120 bytes to util.py\n"),
            "{}",
            out.content
        );
        // Not coached: as written.
        let args = WriteArgs {
            path: "util.py".into(),
            content: "x = 1\n".into(),
        };
        write_file(&work_dir, &args, &Kept::default()).unwrap();
        assert_eq!(read("util.py"), "x = 1\n");
        // A method another file calls, taken out of its class, is refused.
        let cart = "class Cart:\n    def total(self):\n        return 0\n";
        std::fs::write(dir.path().join("cart.py"), cart).unwrap();
        std::fs::write(dir.path().join("shop.py"), "print(Cart().total())\n").unwrap();
        let err = write("cart.py", "class Cart:\n    pass\n").unwrap_err();
        assert_eq!(
            err,
            "Refused: this rewrite of `cart.py` takes out `total`, which the task does not ask \
             for and other files still use:\n\
             shop.py:1: print(Cart().total())\n\
             Write `cart.py` again with `total` kept in it, or change only the lines the task \
             is about with edit_file. `cart.py` is unchanged."
        );
        assert_eq!(read("cart.py"), cart);
    }

    #[test]
    fn edit_needs_exactly_one_match_unless_replace_all() {
        let (d, work) = setup();
        let missing = call(
            &work,
            Tool::EditFile,
            &json!({"path": "src/lib.rs", "old_string": "a * b", "new_string": "x"}),
        )
        .unwrap_err();
        assert!(missing.contains("not found"), "{missing}");
        assert!(!missing.contains("looks made"), "{missing}");
        let made = call(
            &work,
            Tool::EditFile,
            &json!({"path": "src/lib.rs", "old_string": "a + b", "new_string": "a - b"}),
        )
        .unwrap_err();
        assert!(
            made.contains("new_string is in it already (line 2): the change looks made."),
            "{made}"
        );
        let short = call(
            &work,
            Tool::EditFile,
            &json!({"path": "src/lib.rs", "old_string": "c", "new_string": "b"}),
        )
        .unwrap_err();
        assert!(!short.contains("looks made"), "{short}");
        let same = call(
            &work,
            Tool::EditFile,
            &json!({"path": "src/lib.rs", "old_string": "a - b", "new_string": "a - b"}),
        )
        .unwrap_err();
        assert!(same.contains("nothing to change"), "{same}");
        let twice = call(
            &work,
            Tool::EditFile,
            &json!({"path": "src/lib.rs", "old_string": "i32", "new_string": "i64"}),
        )
        .unwrap_err();
        assert!(twice.contains("occurs 3 times"), "{twice}");
        let out = call(&work, Tool::EditFile, &json!({"path": "src/lib.rs", "old_string": "i32", "new_string": "i64", "replace_all": true}),
        )
        .unwrap();
        assert_eq!(out.touched, ["src/lib.rs"]);
        assert!(
            std::fs::read_to_string(d.path().join("src/lib.rs"))
                .unwrap()
                .starts_with("pub fn add(a: i64, b: i64) -> i64")
        );
    }

    #[test]
    fn an_edit_shows_the_lines_around_it_as_they_now_are() {
        let (d, work) = setup();
        let text = (1..=20).fold(String::new(), |mut text, i| {
            let _ = writeln!(text, "line {i}");
            text
        });
        std::fs::write(d.path().join("f.txt"), text).unwrap();
        let out = call(
            &work,
            Tool::EditFile,
            &json!({"path": "f.txt", "old_string": "line 10\n", "new_string": "ten\nand a half\n"}),
        )
        .unwrap();
        assert_eq!(
            out.content,
            "replaced 1 occurrence(s) in f.txt; lines 7-14 now read:\n     7\tline 7\n     8\tline 8\n     9\tline 9\n    10\tten\n    11\tand a half\n    12\tline 11\n    13\tline 12\n    14\tline 13\n"
        );
        // At the ends of the file; and a file edited down to nothing.
        let out = call(
            &work,
            Tool::EditFile,
            &json!({"path": "f.txt", "old_string": "line 1\n", "new_string": ""}),
        )
        .unwrap();
        assert!(out.content.ends_with("lines 1-4 now read:\n     1\tline 2\n     2\tline 3\n     3\tline 4\n     4\tline 5\n"), "{}", out.content);
        std::fs::write(d.path().join("g.txt"), "only").unwrap();
        let out = call(
            &work,
            Tool::EditFile,
            &json!({"path": "g.txt", "old_string": "only", "new_string": ""}),
        )
        .unwrap();
        assert_eq!(out.content, "replaced 1 occurrence(s) in g.txt");
    }

    #[test]
    fn write_creates_folders_and_reports_the_path() {
        let (d, work) = setup();
        let out = call(
            &work,
            Tool::WriteFile,
            &json!({"path": "docs/api/intro.md", "content": "# Intro\n"}),
        )
        .unwrap();
        assert_eq!(out.touched, ["docs/api/intro.md"]);
        assert_eq!(
            std::fs::read_to_string(d.path().join("docs/api/intro.md")).unwrap(),
            "# Intro\n"
        );
    }

    #[test]
    fn walks_stop_once_the_stage_has_ended() {
        let (dir, _) = setup();
        let stop = tokio_util::sync::CancellationToken::new();
        let work = WorkDir::new(dir.path()).unwrap().with_stop(stop.clone());
        let found = call(&work, Tool::Grep, &json!({"pattern": "pub fn add"})).unwrap();
        assert!(found.content.contains("src/lib.rs:1"), "{}", found.content);
        stop.cancel();
        let stopped = call(&work, Tool::Grep, &json!({"pattern": "pub fn add"})).unwrap();
        assert!(
            stopped.content.starts_with("no matches"),
            "{}",
            stopped.content
        );
        let listed = call(&work, Tool::Glob, &json!({"pattern": "**/*.rs"})).unwrap();
        assert!(!listed.content.contains("lib.rs"), "{}", listed.content);
    }

    #[test]
    fn grep_honours_gitignore_and_globs() {
        let (_d, work) = setup();
        let out = call(&work, Tool::Grep, &json!({"pattern": "pub fn add"})).unwrap();
        assert_eq!(
            out.content,
            "src/lib.rs:1:pub fn add(a: i32, b: i32) -> i32 {\n"
        );
        let none = call(
            &work,
            Tool::Grep,
            &json!({"pattern": "A - B", "case_insensitive": true, "glob": "*.md"}),
        )
        .unwrap();
        assert!(none.content.starts_with("no matches"), "{}", none.content);
        // Not a regular expression: searched for as it is written.
        let text = call(&work, Tool::Grep, &json!({"pattern": "add(a: i32"})).unwrap();
        assert_eq!(
            text.content,
            "`add(a: i32` (not a regular expression, so searched for as plain text):\n\
             src/lib.rs:1:pub fn add(a: i32, b: i32) -> i32 {\n"
        );
        let none = call(&work, Tool::Grep, &json!({"pattern": "sub("})).unwrap();
        assert!(
            none.content
                .starts_with("no matches for `sub(` (not a regular expression"),
            "{}",
            none.content
        );
    }

    #[test]
    fn a_grep_for_file_names_finding_no_text_says_which_files_they_name() {
        let (_d, work) = setup();
        // As a small model looks for files: the pattern is a glob, and the text holds no such line.
        let out = call(
            &work,
            Tool::Grep,
            &json!({"pattern": "src/*.rs", "path": "src", "glob": "*.rs"}),
        )
        .unwrap();
        assert_eq!(
            out.content,
            "no matches for `src/*.rs` in the files' text. `src/*.rs` names files, which grep \
             does not look for; these exist: src/lib.rs"
        );
        // Ignored files are not named; text is not taken for a file name.
        let ignored = call(&work, Tool::Grep, &json!({"pattern": "target/*"})).unwrap();
        assert_eq!(ignored.content, "no matches for `target/*`");
        let text = call(&work, Tool::Grep, &json!({"pattern": "fn sub"})).unwrap();
        assert_eq!(text.content, "no matches for `fn sub`");
    }

    #[test]
    fn the_overview_lists_two_levels_without_ignored_files() {
        let (_d, work) = setup();
        assert_eq!(overview(&work, 10), "src/\nsrc/lib.rs");
        assert_eq!(overview(&work, 1), "src/\n[… and 1 more]");
    }

    #[test]
    fn glob_and_list_dir() {
        let (_d, work) = setup();
        let out = call(&work, Tool::Glob, &json!({"pattern": "**/*.rs"})).unwrap();
        assert_eq!(out.content, "src/lib.rs\n");
        let out = call(&work, Tool::ListDir, &json!({})).unwrap();
        assert_eq!(
            out.content,
            "file  .gitignore  (8 bytes)\ndir   src/\ndir   target/\n"
        );
    }

    #[test]
    fn wrong_arguments_say_what_is_wrong() {
        let (_d, work) = setup();
        let error = call(&work, Tool::WriteFile, &json!({"path": "x"})).unwrap_err();
        assert!(error.contains("missing field `content`"), "{error}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let (d, work) = setup();
        nix::unistd::mkfifo(&d.path().join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        for tool in [Tool::ReadFile, Tool::WriteFile, Tool::EditFile] {
            let args =
                json!({"path": "pipe", "content": "x", "old_string": "a", "new_string": "b"});
            let error = call(&work, tool, &args).unwrap_err();
            assert!(error.contains("not a regular file"), "{tool:?}: {error}");
        }
        let out = call(&work, Tool::Grep, &json!({"pattern": "x", "path": "pipe"})).unwrap();
        assert!(out.content.starts_with("no matches"), "{}", out.content);
        // Nor is it read for the loop detector's fingerprint.
        assert_eq!(fingerprint(&work, "pipe"), None);
    }

    #[test]
    fn a_fingerprint_follows_the_content_and_stays_inside() {
        let (d, work) = setup();
        std::fs::write(d.path().join("a.py"), "x = 1\n").unwrap();
        let first = fingerprint(&work, "a.py").unwrap();
        assert_eq!(fingerprint(&work, "a.py"), Some(first));
        std::fs::write(d.path().join("a.py"), "x = 2\n").unwrap();
        assert_ne!(fingerprint(&work, "a.py"), Some(first));
        assert_eq!(fingerprint(&work, "../outside.py"), None);
        assert_eq!(fingerprint(&work, "/etc/passwd"), None);
        assert_eq!(fingerprint(&work, "missing.py"), None);
    }

    #[test]
    fn a_file_with_a_second_hard_link_is_not_read_or_written() {
        let (d, work) = setup();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "the secret\n").unwrap();
        std::fs::hard_link(outside.path().join("secret.txt"), d.path().join("link.txt")).unwrap();
        for tool in [Tool::ReadFile, Tool::WriteFile, Tool::EditFile] {
            let args =
                json!({"path": "link.txt", "content": "x", "old_string": "the", "new_string": "a"});
            let error = call(&work, tool, &args).unwrap_err();
            assert!(error.contains("hard links"), "{tool:?}: {error}");
        }
        let out = call(&work, Tool::Grep, &json!({"pattern": "secret"})).unwrap();
        assert!(!out.content.contains("the secret"), "{}", out.content);
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
            "the secret\n"
        );
    }

    #[test]
    fn a_name_error_in_a_file_that_does_not_import_the_name_another_defines_names_the_import() {
        let (d, work) = setup();
        std::fs::create_dir(d.path().join("text")).unwrap();
        std::fs::write(
            d.path().join("text/words.py"),
            "def count_words(t):\n    return 0\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("test_words.py"),
            "import unittest\nx = count_words('a')\n",
        )
        .unwrap();
        let traceback = |file: &str, name: &str| {
            format!(
                "Traceback (most recent call last):\n  File \"/usr/lib/python3/unittest/case.py\", line 58, in run\n  File \"{file}\", line 2, in <module>\n    x = count_words('a')\nNameError: name '{name}' is not defined\n"
            )
        };
        let test = d.path().join("test_words.py").display().to_string();
        assert_eq!(
            missing_import(&work, &traceback(&test, "count_words")).as_deref(),
            Some(
                "`test_words.py` uses `count_words` without importing it, and `text/words.py` \
                 defines it: add `from text.words import count_words` at the top of \
                 `test_words.py`. With edit_file:\n{\"thought\":\"I add the missing import to \
                 test_words.py.\",\"name\":\"edit_file\",\"arguments\":{\"path\":\"test_words.py\",\
                 \"old_string\":\"import unittest\",\"new_string\":\"import unittest\\nfrom \
                 text.words import count_words\"}}"
            )
        );
        // Every name the same file lacks, in one import.
        std::fs::write(
            d.path().join("text/words.py"),
            "def count_words(t):\n    return 0\n\n\ndef reverse_words(t):\n    return t\n",
        )
        .unwrap();
        let both = traceback(&test, "count_words") + &traceback(&test, "reverse_words");
        assert_eq!(
            missing_import(&work, &both).as_deref(),
            Some(
                "`test_words.py` uses `count_words` and `reverse_words` without importing them, \
                 and `text/words.py` defines them: add `from text.words import count_words, \
                 reverse_words` at the top of `test_words.py`. With edit_file:\n{\"thought\":\"I \
                 add the missing import to test_words.py.\",\"name\":\"edit_file\",\"arguments\":\
                 {\"path\":\"test_words.py\",\"old_string\":\"import unittest\",\"new_string\":\
                 \"import unittest\\nfrom text.words import count_words, reverse_words\"}}"
            )
        );
        // Without an import line, the import goes first; no call when that line is there twice.
        assert_eq!(
            import_edit("x = 1\n", "import a"),
            Some(("x = 1".to_owned(), "import a\nx = 1".to_owned()))
        );
        assert_eq!(import_edit("x = 1\nx = 1\n", "import a"), None);
        assert_eq!(import_edit("", "import a"), None);
        // A name no file defines, one the raising file defines itself, or a file outside.
        assert_eq!(
            missing_import(&work, &traceback(&test, "split_words")),
            None
        );
        let words = d.path().join("text/words.py").display().to_string();
        assert_eq!(
            missing_import(&work, &traceback(&words, "count_words")),
            None
        );
        assert_eq!(
            missing_import(&work, &traceback("/etc/x.py", "count_words")),
            None
        );
        assert_eq!(
            missing_import(&work, "NameError: name 'count_words' is not defined"),
            None
        );
    }

    #[test]
    fn a_small_projects_files_are_all_of_it_or_none() {
        let (d, work) = setup();
        let paths = |limits| -> Vec<String> {
            project_files(&work, limits)
                .into_iter()
                .map(|(p, _)| p)
                .collect()
        };
        // Ignored and hidden files are not the project's.
        assert_eq!(paths((4, 8192, 16384)), ["src/lib.rs"]);
        std::fs::write(d.path().join("a.py"), "x = 1\n").unwrap();
        std::fs::write(d.path().join("w.fabro"), "digraph W {}\n").unwrap();
        assert_eq!(paths((4, 8192, 16384)), ["a.py", "src/lib.rs"]);
        // More files than the count, one too large, or too many bytes in all: none.
        assert_eq!(paths((1, 8192, 16384)), [] as [String; 0]);
        assert_eq!(paths((4, 8192, 50)), [] as [String; 0]);
        std::fs::write(d.path().join("b.txt"), "x".repeat(9000)).unwrap();
        assert_eq!(paths((4, 8192, 16384)), [] as [String; 0]);
    }

    #[test]
    fn the_files_a_task_names_are_found_small_text_inside_only() {
        let (d, work) = setup();
        std::fs::write(
            d.path().join("calc.py"),
            "def add(a, b):\n    return a - b\n",
        )
        .unwrap();
        std::fs::write(d.path().join("big.txt"), "x".repeat(9000)).unwrap();
        std::fs::write(d.path().join("blob.bin"), b"a\0b").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("pw.txt")).unwrap();
        let task = "Fix `calc.py` (see ./src/lib.rs:2:5, \"calc.py\", big.txt, blob.bin, pw.txt, \
                    ../outside.py, /etc/hostname, target/junk.rs and missing.py). Run tests.";
        let task = format!("{task} Also {}/calc.py.", d.path().display());
        let task = task.as_str();
        let found = named_files(&work, task, (4, 8192, 16384));
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        // The ignored `target/junk.rs` is still a file the task names, inside the directory.
        assert_eq!(paths, ["calc.py", "src/lib.rs", "target/junk.rs"]);
        assert_eq!(found[0].1, "def add(a, b):\n    return a - b\n");
        // The count and the total are limits too.
        assert_eq!(named_files(&work, task, (1, 8192, 16384)).len(), 1);
        let paths: Vec<String> = named_files(&work, task, (4, 8192, 60))
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(paths, ["calc.py", "target/junk.rs"]);
    }

    #[test]
    fn the_files_named_in_a_named_file_come_after_it() {
        let (d, work) = setup();
        std::fs::write(
            d.path().join("test-output.txt"),
            "thread 'tests::adds' panicked at src/lib.rs:2:5:\nassertion failed\n",
        )
        .unwrap();
        let found = named_files(&work, "The output is in test-output.txt.", (4, 8192, 16384));
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["test-output.txt", "src/lib.rs"]);
    }

    #[test]
    fn an_edit_may_name_the_lines_of_a_file_that_occur_once_trimmed() {
        let (d, work) = setup();
        std::fs::write(
            d.path().join("config.json"),
            "{\n  \"port\": 8080,\n  \"debug\": true,\n  \"db\": {\n    \"debug\": true\n  }\n}\n",
        )
        .unwrap();
        std::fs::write(d.path().join("logo.png"), b"\x89PNG\0\0").unwrap();
        std::fs::write(d.path().join("big.txt"), "x\n".repeat(600)).unwrap();
        // `"debug": true` is in config.json twice, and so are its braces: an edit naming them would
        // not apply. Ignored and binary files are not listed; a large one takes any text.
        let lines = |l: &[&str]| Anchors::Lines(l.iter().map(|&l| l.to_owned()).collect());
        assert_eq!(
            edit_targets(&work, (10, 1024, 100)).unwrap(),
            [
                ("big.txt".to_owned(), Anchors::Any),
                (
                    "config.json".to_owned(),
                    lines(&["\"port\": 8080,", "\"debug\": true,", "\"db\": {"])
                ),
                (
                    "src/lib.rs".to_owned(),
                    lines(&["pub fn add(a: i32, b: i32) -> i32 {", "a - b", "}"])
                ),
            ]
        );
        // Past the searches allowed (config.json takes five: its lines not repeated whole), a file
        // takes any text; past the files allowed, nothing is listed.
        let few = edit_targets(&work, (10, 1024, 6)).unwrap();
        assert!(matches!(&few[1].1, Anchors::Lines(l) if l.len() == 3));
        assert_eq!(few[2], ("src/lib.rs".to_owned(), Anchors::Any));
        assert_eq!(edit_targets(&work, (3, 1024, 100)), None);
    }

    #[test]
    fn the_files_a_task_names_are_those_with_a_usual_extension() {
        let (_d, work) = setup();
        let task = "Write backup.sh (e.g. with cp) that copies notes/*.txt into `out/list.txt`, \
                    as src/lib.rs does; see Node.js, version 1.2 and /etc/passwd.txt, and .txt \
                    files; then run ./backup.sh.";
        assert_eq!(missing_files(&work, task), ["backup.sh", "out/list.txt"]);
        assert_eq!(
            named_paths(&format!(
                "{task} See https://x.org/a.py, --out=a.txt and w.fabro."
            )),
            ["backup.sh", "out/list.txt", "src/lib.rs", "w.fabro"]
        );
    }
}
