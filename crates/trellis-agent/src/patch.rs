//! The patch format of `apply_patch` (OpenAI's "v4a", which its models are trained to write, and
//! Fabro's OpenAI agents use): files added, deleted, or updated by chunks of context, removed and
//! added lines.
//!
//! ```text
//! *** Begin Patch
//! *** Add File: src/new.py
//! +print("hi")
//! *** Update File: src/app.py
//! *** Move to: src/main.py
//! @@ def greet():
//! -    return "hello"
//! +    return "hi"
//! *** Delete File: src/old.py
//! *** End Patch
//! ```
//!
//! A chunk starts at `@@` (the first may leave it out); text after `@@` names a line the chunk comes
//! after. Its lines start with a space (context), `-` (removed) or `+` (added); an empty line is an
//! empty context line. `*** End of File` after a chunk ties it to the file's end. A chunk's old lines
//! are looked for from where the last one ended: as written, then ignoring spaces at line ends,
//! then ignoring spaces at both ends.

/// One file's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileOp {
    Add {
        path: String,
        content: String,
    },
    Delete {
        path: String,
    },
    Update {
        path: String,
        move_to: Option<String>,
        chunks: Vec<Chunk>,
    },
}

impl FileOp {
    pub(crate) fn path(&self) -> &str {
        match self {
            FileOp::Add { path, .. } | FileOp::Delete { path } | FileOp::Update { path, .. } => {
                path
            }
        }
    }
}

/// A run of lines to replace in a file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Chunk {
    /// The line the chunk comes after (the text after `@@`), when given.
    pub anchor: Option<String>,
    pub lines: Vec<Line>,
    /// The chunk ends at the file's end.
    pub at_end: bool,
}

/// A line of a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Line {
    Context(String),
    Removed(String),
    Added(String),
}

impl Chunk {
    /// The context and removed lines, in order: what is there now.
    fn old(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter_map(|line| match line {
                Line::Context(text) | Line::Removed(text) => Some(text.as_str()),
                Line::Added(_) => None,
            })
            .collect()
    }

    /// Whether the chunk changes anything.
    fn changes(&self) -> bool {
        self.lines.iter().any(|l| !matches!(l, Line::Context(_)))
    }

    /// What `found` (the file's lines the old lines matched) becomes: the file's own context lines
    /// (which may differ from the chunk's in spaces), then the added lines where they go.
    fn replace(&self, found: &[String]) -> Vec<String> {
        let mut found = found.iter();
        let mut out = Vec::new();
        for line in &self.lines {
            match line {
                Line::Context(text) => out.push(found.next().unwrap_or(text).clone()),
                Line::Removed(_) => {
                    found.next();
                }
                Line::Added(text) => out.push(text.clone()),
            }
        }
        out
    }
}

const BEGIN: &str = "*** Begin Patch";
const END: &str = "*** End Patch";
const ADD: &str = "*** Add File: ";
const DELETE: &str = "*** Delete File: ";
const UPDATE: &str = "*** Update File: ";
const MOVE: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";

/// The file changes `text` holds, or what is wrong with it (with its line number).
pub(crate) fn parse(text: &str) -> Result<Vec<FileOp>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let begin = lines
        .iter()
        .position(|l| l.trim() == BEGIN)
        .ok_or_else(|| format!("a patch starts with a `{BEGIN}` line and ends with `{END}`"))?;
    let end = lines
        .iter()
        .rposition(|l| l.trim() == END)
        .filter(|&e| e > begin)
        .ok_or_else(|| format!("the patch has no `{END}` line after `{BEGIN}`"))?;
    let mut ops = Vec::new();
    let mut at = begin + 1;
    while at < end {
        let line = lines[at];
        let problem = |what: &str| format!("line {}: {what}", at + 1);
        if let Some(path) = line.strip_prefix(ADD) {
            let mut content = String::new();
            at += 1;
            while at < end && !lines[at].starts_with("*** ") {
                let added = lines[at].strip_prefix('+').ok_or_else(|| {
                    format!(
                        "line {}: the lines of an added file each start with +",
                        at + 1
                    )
                })?;
                content.push_str(added);
                content.push('\n');
                at += 1;
            }
            ops.push(FileOp::Add {
                path: file_path(path)?,
                content,
            });
        } else if let Some(path) = line.strip_prefix(DELETE) {
            ops.push(FileOp::Delete {
                path: file_path(path)?,
            });
            at += 1;
        } else if let Some(path) = line.strip_prefix(UPDATE) {
            at += 1;
            let move_to = match lines.get(at).and_then(|l| l.strip_prefix(MOVE)) {
                Some(to) if at < end => {
                    at += 1;
                    Some(file_path(to)?)
                }
                _ => None,
            };
            let (chunks, next) = chunks(&lines[..end], at)?;
            if chunks.is_empty() {
                return Err(format!("line {at}: `{UPDATE}{path}` changes nothing"));
            }
            at = next;
            ops.push(FileOp::Update {
                path: file_path(path)?,
                move_to,
                chunks,
            });
        } else if line.trim().is_empty() {
            at += 1;
        } else {
            return Err(problem(&format!(
                "expected `{ADD}`, `{DELETE}` or `{UPDATE}`, found `{}`",
                line.chars().take(80).collect::<String>()
            )));
        }
    }
    if ops.is_empty() {
        return Err("the patch changes no file".to_owned());
    }
    Ok(ops)
}

/// A path as a patch writes it, trimmed; an empty one is an error.
fn file_path(text: &str) -> Result<String, String> {
    let path = text.trim();
    if path.is_empty() {
        Err("a file line names no path".to_owned())
    } else {
        Ok(path.to_owned())
    }
}

/// The chunks of an update from line `at`, and the line after them.
fn chunks(lines: &[&str], mut at: usize) -> Result<(Vec<Chunk>, usize), String> {
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut open: Option<Chunk> = None;
    while at < lines.len() {
        let line = lines[at];
        if line.trim() == END_OF_FILE {
            let chunk = open
                .as_mut()
                .ok_or_else(|| format!("line {}: `{END_OF_FILE}` follows no chunk", at + 1))?;
            chunk.at_end = true;
            at += 1;
            continue;
        }
        if line.starts_with("*** ") {
            break;
        }
        if let Some(anchor) = line.strip_prefix("@@") {
            chunks.extend(open.take());
            let anchor = anchor.trim().trim_end_matches("@@").trim();
            open = Some(Chunk {
                anchor: (!anchor.is_empty()).then(|| anchor.to_owned()),
                ..Chunk::default()
            });
            at += 1;
            continue;
        }
        let chunk = open.get_or_insert_with(Chunk::default);
        let text = line.get(1..).unwrap_or_default().to_owned();
        match line.chars().next() {
            Some('+') => chunk.lines.push(Line::Added(text)),
            Some('-') => chunk.lines.push(Line::Removed(text)),
            Some(' ') | None => chunk.lines.push(Line::Context(text)),
            Some(_) => {
                return Err(format!(
                    "line {}: a chunk's lines start with a space, - or +, found `{}`",
                    at + 1,
                    line.chars().take(80).collect::<String>()
                ));
            }
        }
        at += 1;
    }
    chunks.extend(open);
    chunks.retain(Chunk::changes);
    Ok((chunks, at))
}

/// `text` with `chunks` applied in order, or the first chunk that cannot be placed.
pub(crate) fn apply(text: &str, chunks: &[Chunk]) -> Result<String, String> {
    let ends_with_newline = text.is_empty() || text.ends_with('\n');
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut from = 0;
    for (number, chunk) in chunks.iter().enumerate() {
        let which = || format!("chunk {} of {}", number + 1, chunks.len());
        let old = chunk.old();
        if let Some(anchor) = &chunk.anchor {
            let found = lines[from..]
                .iter()
                .position(|l| l.trim() == anchor.trim())
                .ok_or_else(|| format!("{}: no line reads `{anchor}`", which()))?;
            // The anchor may be the chunk's own first line too.
            let own = old
                .first()
                .is_some_and(|first| first.trim() == anchor.trim());
            from += if own { found } else { found + 1 };
        }
        let at = if old.is_empty() {
            if chunk.at_end || chunk.anchor.is_none() {
                lines.len()
            } else {
                from
            }
        } else {
            find(&lines, &old, from, chunk.at_end).ok_or_else(|| {
                let after = if from > 0 {
                    format!(" after line {from}")
                } else {
                    String::new()
                };
                format!(
                    "{}: its lines are not in the file{after}:\n{}",
                    which(),
                    old.join("\n")
                )
            })?
        };
        let new = chunk.replace(&lines[at..at + old.len()]);
        from = at + new.len();
        lines.splice(at..at + old.len(), new);
    }
    let mut out = lines.join("\n");
    if ends_with_newline && !lines.is_empty() {
        out.push('\n');
    }
    Ok(out)
}

/// Where `old` stands in `lines` at or after `from` (at the end when `at_end`): as written, then
/// ignoring spaces at line ends, then at both ends.
fn find(lines: &[String], old: &[&str], from: usize, at_end: bool) -> Option<usize> {
    let same: [fn(&str, &str) -> bool; 3] = [
        |a, b| a == b,
        |a, b| a.trim_end() == b.trim_end(),
        |a, b| a.trim() == b.trim(),
    ];
    let fits = |start: usize, eq: fn(&str, &str) -> bool| {
        lines[start..start + old.len()]
            .iter()
            .zip(old)
            .all(|(a, b)| eq(a, b))
    };
    let last = lines.len().checked_sub(old.len())?;
    for eq in same {
        if at_end {
            if last >= from && fits(last, eq) {
                return Some(last);
            }
            continue;
        }
        if let Some(start) = (from..=last).find(|&s| fits(s, eq)) {
            return Some(start);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks_of(patch: &str) -> Vec<Chunk> {
        match parse(patch).unwrap().remove(0) {
            FileOp::Update { chunks, .. } => chunks,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_patch_reads_as_added_deleted_and_updated_files() {
        let ops = parse(
            "*** Begin Patch\n*** Add File: a.py\n+x = 1\n+\n*** Delete File: b.py\n\
             *** Update File: c.py\n*** Move to: d.py\n@@ def f():\n-    return 1\n+    return 2\n\
             *** End Patch\n",
        )
        .unwrap();
        assert_eq!(
            ops,
            [
                FileOp::Add {
                    path: "a.py".into(),
                    content: "x = 1\n\n".into()
                },
                FileOp::Delete {
                    path: "b.py".into()
                },
                FileOp::Update {
                    path: "c.py".into(),
                    move_to: Some("d.py".into()),
                    chunks: vec![Chunk {
                        anchor: Some("def f():".into()),
                        lines: vec![
                            Line::Removed("    return 1".into()),
                            Line::Added("    return 2".into())
                        ],
                        at_end: false,
                    }]
                },
            ]
        );
        // What a model wraps a patch in (a heredoc) is left out.
        assert!(
            parse("apply_patch <<'EOF'\n*** Begin Patch\n*** Delete File: x\n*** End Patch\nEOF")
                .is_ok()
        );
        for (bad, said) in [
            (
                "*** Update File: a\n-x\n+y\n",
                "starts with a `*** Begin Patch`",
            ),
            (
                "*** Begin Patch\n*** Delete File: a\n",
                "no `*** End Patch`",
            ),
            ("*** Begin Patch\n*** End Patch", "changes no file"),
            (
                "*** Begin Patch\n*** Add File: a\nx\n*** End Patch",
                "line 3: the lines of an added file",
            ),
            (
                "*** Begin Patch\n*** Update File: a\n@@\n?x\n*** End Patch",
                "line 4: a chunk's lines",
            ),
            (
                "*** Begin Patch\n*** Rename File: a\n*** End Patch",
                "line 2: expected",
            ),
            (
                "*** Begin Patch\n*** Update File: a\n@@\n x\n*** End Patch",
                "changes nothing",
            ),
        ] {
            let problem = parse(bad).unwrap_err();
            assert!(problem.contains(said), "{bad}: {problem}");
        }
    }

    /// Any text, as a patch over any file: an answer or a problem, never a panic.
    #[test]
    fn garbage_patches_are_refused_not_panicked_on() {
        let pieces = [
            "*** Begin Patch",
            "*** End Patch",
            "*** Update File: a",
            "*** Add File: b",
            "*** Delete File: c",
            "*** Move to: d",
            "*** End of File",
            "@@",
            "@@ x",
            "@@ é",
            "+x",
            "-x",
            " x",
            "",
            "é",
            "+",
            "-",
            " ",
            "x",
            "-é",
            "\u{0}",
        ];
        let files = ["", "x", "x\n", "x\nx\n", "é\nx", "\n\n"];
        let mut state = 0x2545_f491_u32;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as usize % n
        };
        for _ in 0..20_000 {
            let lines: Vec<&str> = (0..next(12)).map(|_| pieces[next(pieces.len())]).collect();
            let mut text = lines.join("\n");
            if next(2) == 0 {
                text = format!("*** Begin Patch\n*** Update File: a\n{text}\n*** End Patch");
            }
            if let Ok(ops) = parse(&text) {
                for op in ops {
                    if let FileOp::Update { chunks, .. } = op {
                        let _ = apply(files[next(files.len())], &chunks);
                    }
                }
            }
        }
    }

    #[test]
    fn chunks_apply_in_order_after_their_anchors_and_tolerate_spaces() {
        let text = "def a():\n    return 1\n\ndef b():\n    return 1\n";
        // The anchor puts the change in `b`, not in `a`, whose line reads the same.
        let chunks = chunks_of(
            "*** Begin Patch\n*** Update File: m.py\n@@ def b():\n-    return 1\n+    return 2\n*** End Patch",
        );
        assert_eq!(
            apply(text, &chunks).unwrap(),
            "def a():\n    return 1\n\ndef b():\n    return 2\n"
        );
        // Two chunks, the first without @@; context lines; an empty line as empty context; a line
        // end's spaces told apart last.
        let chunks = chunks_of(
            "*** Begin Patch\n*** Update File: m.py\n def a():\n-    return 1\n+    return 10\n\n@@\n def b():   \n-    return 1\n+    return 20\n*** End Patch",
        );
        assert_eq!(
            apply(text, &chunks).unwrap(),
            "def a():\n    return 10\n\ndef b():\n    return 20\n"
        );
        // Added at the end of the file, and a file without a last newline keeps it so.
        let chunks = chunks_of(
            "*** Begin Patch\n*** Update File: m.py\n@@\n+def c():\n+    return 3\n*** End of File\n*** End Patch",
        );
        assert_eq!(
            apply("x = 1", &chunks).unwrap(),
            "x = 1\ndef c():\n    return 3"
        );
        // A chunk that is not there says which, and what it looked for.
        let chunks = chunks_of(
            "*** Begin Patch\n*** Update File: m.py\n@@\n-    return 9\n+    return 2\n*** End Patch",
        );
        let problem = apply(text, &chunks).unwrap_err();
        assert!(
            problem.starts_with("chunk 1 of 1: its lines are not in the file:\n    return 9"),
            "{problem}"
        );
        let chunks = chunks_of(
            "*** Begin Patch\n*** Update File: m.py\n@@ def z():\n-    return 1\n+    return 2\n*** End Patch",
        );
        assert!(
            apply(text, &chunks)
                .unwrap_err()
                .contains("no line reads `def z():`")
        );
    }
}
