//! What a source file defines, read from its lines in any of the languages agents write (Python,
//! Rust, JavaScript, shell): the names it defines ([`defined_names`]), its top-level pieces, and the
//! rewrite of a file that keeps the pieces a partial rewrite left out ([`merge`]).

use std::collections::{HashMap, HashSet};

/// The names `text` defines, each on a line of its own: `def name`, `class name`, `fn name`,
/// `function name`, `struct`, `enum`, `trait`, `type`, `const`, `let`, `var` or `static` (after
/// `pub`, `pub(crate)`, `export`, `async` or `unsafe`), or `name =` at the start of a line.
pub fn defined_names(text: &str) -> HashSet<&str> {
    text.lines()
        .filter_map(|line| defined_name(line, true))
        .collect()
}

/// The name `line` defines ([`defined_names`]); `name =` only with `assigned`.
fn defined_name(line: &str, assigned: bool) -> Option<&str> {
    const KEYWORDS: [&str; 12] = [
        "def", "class", "fn", "function", "struct", "enum", "trait", "type", "const", "let", "var",
        "static",
    ];
    const PREFIXES: [&str; 5] = ["pub(crate)", "pub", "export", "async", "unsafe"];
    /// The word `rest` starts with.
    fn word(rest: &str) -> &str {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        &rest[..end]
    }
    /// What follows the word `w` that `rest` starts with, and the spaces after it.
    fn after_word<'a>(rest: &'a str, w: &str) -> Option<&'a str> {
        rest.strip_prefix(w)
            .filter(|after| after.starts_with(' '))
            .map(str::trim_start)
    }
    let mut rest = line.trim_start();
    while let Some(after) = PREFIXES.iter().find_map(|p| after_word(rest, p)) {
        rest = after;
    }
    let name = if let Some(after) = KEYWORDS.iter().find_map(|k| after_word(rest, k)) {
        word(after.strip_prefix("mut ").unwrap_or(after))
    } else {
        let name = word(rest);
        let then = rest[name.len()..].trim_start();
        if !assigned || !then.starts_with('=') || then.starts_with("==") {
            return None;
        }
        name
    };
    (!name.is_empty()).then_some(name)
}

/// One top-level piece of a source text: from a line that is not indented (nor blank, nor closing
/// a bracket) — with the comment, decorator and attribute lines right above it — up to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece<'a> {
    text: &'a str,
    key: Key<'a>,
}

/// What a piece is matched by in another version of its file: the name its first line defines
/// with a keyword (`def`, `class`, `fn`, …), or else that line itself (an import, `LIMIT = 3`,
/// `if __name__ == "__main__":`, `impl Cart {`). A script's assignment is a step of it, which a
/// rewrite may do another way; put back alone, it may need an import the rewrite dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key<'a> {
    Name(&'a str),
    Line(&'a str),
}

/// The top-level pieces of `text`, in order; together they are `text`.
fn pieces(text: &str) -> Vec<Piece<'_>> {
    /// A line that belongs to the piece below it.
    fn leads(line: &str) -> bool {
        line.starts_with('@') || line.starts_with('#') || line.starts_with("//")
    }
    fn top_level(line: &str) -> bool {
        !line.trim().is_empty()
            && !line.starts_with(char::is_whitespace)
            && !line.starts_with(['}', ')', ']'])
    }
    let mut starts: Vec<usize> = Vec::new();
    let mut at = 0;
    let mut above_leads = false;
    for line in text.split_inclusive('\n') {
        if top_level(line) && !above_leads {
            starts.push(at);
        }
        above_leads = top_level(line) && leads(line);
        at += line.len();
    }
    if starts.first() != Some(&0) {
        starts.insert(0, 0);
    }
    starts
        .iter()
        .zip(starts.iter().skip(1).chain([&text.len()]))
        .filter(|(from, to)| from < to)
        .map(|(&from, &to)| {
            let text = &text[from..to];
            let head = text
                .lines()
                .find(|line| top_level(line) && !leads(line))
                .or_else(|| text.lines().find(|line| !line.trim().is_empty()))
                .unwrap_or_default();
            let key = defined_name(head, false).map_or(Key::Line(head.trim()), Key::Name);
            Piece { text, key }
        })
        .collect()
}

/// The names `text` defines at its top level, in order: what a block of code written without its
/// file's name is matched to a file by.
pub fn top_level_names(text: &str) -> Vec<&str> {
    pieces(text)
        .into_iter()
        .filter_map(|piece| match piece.key {
            Key::Name(name) => Some(name),
            Key::Line(_) => None,
        })
        .collect()
}

/// A rewrite with the pieces it left out put back ([`merge`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Merged {
    /// The file as it is written.
    pub text: String,
    /// The names of the pieces put back.
    pub kept: Vec<String>,
}

/// When `after`, written over a file that holds `before`, leaves out a top-level definition of it
/// whose name `task` does not name: `after` with every top-level piece of `before` that it left out
/// put back — the definitions `task` does not name, and, when `after` is definitions alone, the
/// rest too (imports, a main block) — each after the piece of `after` that matches the nearest one
/// above it in `before` (or first). A small model writes the one function it changed as the whole
/// file (`is_prime` written over `primes.py`, its `primes_below` gone); a definition the task names
/// may go (a rename). `None` when `after` leaves no such definition out.
pub fn merge(before: &str, after: &str, task: &str) -> Option<Merged> {
    let old = pieces(before);
    let new = pieces(after);
    let in_new: HashSet<Key> = new.iter().map(|piece| piece.key).collect();
    // Content of definitions alone is a part of the file; with other lines of its own, it says
    // what the rest of the file is (a fixed statement must not come back as it was).
    let definitions_alone = new
        .iter()
        .all(|piece| matches!(piece.key, Key::Name(_)) || piece.text.trim().is_empty());
    let put_back = |key: &Key| match key {
        Key::Name(name) => !crate::file_tools::names_word(task, name),
        Key::Line(_) => definitions_alone,
    };
    let left_out = |piece: &Piece| !in_new.contains(&piece.key) && put_back(&piece.key);
    let kept: Vec<String> = old
        .iter()
        .filter(|piece| left_out(piece))
        .filter_map(|piece| match piece.key {
            Key::Name(name) => Some(name.to_owned()),
            Key::Line(_) => None,
        })
        .collect();
    if kept.is_empty() {
        return None;
    }
    // Each piece put back goes after the piece of `after` matching the nearest piece above it in
    // `before` that `after` has; `None`, before everything. (One pass each way: a file may have
    // many thousands of pieces.)
    let mut put_after: HashMap<Option<Key>, Vec<&str>> = HashMap::new();
    let mut anchor = None;
    for piece in &old {
        if in_new.contains(&piece.key) {
            anchor = Some(piece.key);
        } else if left_out(piece) {
            put_after.entry(anchor).or_default().push(piece.text);
        }
    }
    let mut parts: Vec<&str> = put_after.remove(&None).unwrap_or_default();
    for piece in &new {
        parts.push(piece.text);
        parts.extend(put_after.remove(&Some(piece.key)).unwrap_or_default());
    }
    Some(Merged {
        text: joined(&parts),
        kept,
    })
}

/// `parts` one after the other, each on lines of its own, a definition set apart from what is
/// above it by a blank line, ending in one line end.
fn joined(parts: &[&str]) -> String {
    let mut text = String::new();
    for part in parts {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        if !text.is_empty() && !text.ends_with("\n\n") && defined_name(part, false).is_some() {
            text.push('\n');
        }
        text.push_str(part);
    }
    text.truncate(text.trim_end().len());
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_a_text_defines_are_read_from_its_lines() {
        assert_eq!(
            defined_names("def f(x):\n  pub async fn run() {}\nLIMIT = 3\nlet mut total = 0;\n"),
            ["f", "run", "LIMIT", "total"].into()
        );
        assert!(defined_names("average == 3\nprint(average(p))\nreturn len(p)\n").is_empty());
        assert_eq!(
            top_level_names(
                "import os\n\n@cache\ndef f(x):\n    y = 1\n\nclass A:\n    z = 2\nLIMIT = 3\n"
            ),
            ["f", "A"]
        );
    }

    #[test]
    fn pieces_are_top_level_lines_with_what_is_above_and_below_them() {
        let rust = "use std::fs;\n\n/// Doc.\n#[inline]\npub fn a() {\n    1\n}\n\nimpl B {\n    fn c() {}\n}\n";
        let got: Vec<(&str, Key)> = pieces(rust).iter().map(|p| (p.text, p.key)).collect();
        assert_eq!(
            got,
            [
                ("use std::fs;\n\n", Key::Line("use std::fs;")),
                (
                    "/// Doc.\n#[inline]\npub fn a() {\n    1\n}\n\n",
                    Key::Name("a")
                ),
                ("impl B {\n    fn c() {}\n}\n", Key::Line("impl B {")),
            ]
        );
        assert_eq!(pieces("").len(), 0);
        assert_eq!(pieces("  indented\nx = 1\n").len(), 2);
    }

    #[test]
    fn a_rewrite_leaving_definitions_out_gets_them_back_where_they_were() {
        let primes = "import math\n\n\ndef is_prime(n):\n    # TODO\n    raise NotImplementedError\n\n\ndef primes_below(limit):\n    return [n for n in range(limit) if is_prime(n)]\n\n\nif __name__ == \"__main__\":\n    print(primes_below(10))\n";
        let task = "Implement is_prime(n) in primes.py.";
        let merged = merge(primes, "def is_prime(n):\n    return n > 1", task).unwrap();
        assert_eq!(merged.kept, ["primes_below"]);
        assert_eq!(
            merged.text,
            "import math\n\n\ndef is_prime(n):\n    return n > 1\n\ndef primes_below(limit):\n    return [n for n in range(limit) if is_prime(n)]\n\n\nif __name__ == \"__main__\":\n    print(primes_below(10))\n"
        );
        // Content with top-level lines of its own besides definitions: those of the file are not
        // put back (a statement it fixes must not come back as it was).
        let merged = merge(
            primes,
            "import sys\n\ndef is_prime(n):\n    return n > 1\n",
            task,
        )
        .unwrap();
        assert_eq!(
            merged.text,
            "import sys\n\ndef is_prime(n):\n    return n > 1\n\ndef primes_below(limit):\n    return [n for n in range(limit) if is_prime(n)]\n"
        );
        // The whole file written, or only a definition the task names left out: as written.
        assert_eq!(
            merge(primes, &primes.replace("raise", "return"), task),
            None
        );
        let util = "def get_total(p):\n    return sum(p)\n\n\ndef average(p):\n    return get_total(p) / len(p)\n";
        let rename = "Rename get_total to compute_total.";
        assert_eq!(
            merge(util, &util.replace("get_total", "compute_total"), rename),
            None
        );
        // A rename that leaves another definition out gets it back, first when nothing above it
        // is still there.
        let merged = merge(util, "def compute_total(p):\n    return sum(p)\n", rename).unwrap();
        assert_eq!(merged.kept, ["average"]);
        assert_eq!(
            merged.text,
            "def average(p):\n    return get_total(p) / len(p)\n\ndef compute_total(p):\n    return sum(p)\n"
        );
        // A file of many pieces (a 256 KB file may hold 100,000) is merged piece by piece.
        let many = "def f():\n    pass\n".to_owned() + &"x\n".repeat(100_000);
        let many_merged = merge(&many, "def g():\n    pass\n", "").unwrap();
        assert_eq!(many_merged.kept, ["f"]);
        assert_eq!(many_merged.text.lines().count(), 100_005);
    }
}
