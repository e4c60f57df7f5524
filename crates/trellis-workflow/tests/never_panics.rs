//! Parsing and compiling never panic: more than 100,000 random and mutated inputs go through
//! parse + compile, and every diagnostic is rendered (terminal and JSON), which also checks that every
//! span lands on a character boundary inside the file. Inputs come from a seeded generator, so a failure
//! reproduces; the failing input is printed.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use trellis_syntax::SourceFile;
use trellis_syntax::render::{render_plain, to_json};
use trellis_workflow::{CompileOptions, compile};

/// xorshift64*: small, fast, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const FRAGMENTS: &[&str] = &[
    "digraph",
    "graph",
    "strict",
    "subgraph",
    "node",
    "edge",
    "G",
    "start",
    "exit",
    "a",
    "b",
    "->",
    "--",
    "[",
    "]",
    "{",
    "}",
    "=",
    ";",
    ",",
    "\"",
    "\\",
    "\\\"",
    "\\\n",
    "\n",
    " ",
    "/*",
    "*/",
    "//",
    "shape=",
    "Mdiamond",
    "Msquare",
    "diamond",
    "component",
    "tripleoctagon",
    "hexagon",
    "house",
    "insulator",
    "parallelogram",
    "tab",
    "prompt=",
    "script=",
    "condition=",
    "\"outcome=success\"",
    "&&",
    "||",
    "!",
    "(",
    ")",
    "matches",
    "contains",
    ">=",
    "$goal",
    "{{ goal }}",
    "$$",
    "@",
    "@missing.md",
    "~",
    "..",
    "1d",
    "250ms",
    "-0.5",
    ".5",
    "+7",
    "true",
    "false",
    "model_stylesheet=",
    "\"* { model: x; }\"",
    ".c",
    "#id",
    "label=",
    "\"Loop A\"",
    "class=",
    "max_iterations=",
    "when=",
    "fidelity=",
    "full",
    "thread_id=",
    "join_policy=",
    "k_of_n(",
    "quorum(",
    "é",
    "日本",
    "\u{0}",
    "\t",
    "\r\n",
    "nodes:",
    "edges:",
    "- from: a",
    "  to: b",
    ": ",
    "- ",
    "{ from: a, to: a }",
    "'",
    "|",
    ">",
    "&anchor",
    "*anchor",
    "!!str",
    "---",
    "...",
    "%YAML",
    "#",
];

fn corpus() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut stack = vec![root.join("tests/fixtures"), root.join("../../examples")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
        {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .extension()
                .is_some_and(|e| e == "fabro" || e == "yaml")
            {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                files.push((name, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    files.sort();
    assert!(files.len() > 50);
    files
}

fn char_boundary_at_or_before(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn mutate(rng: &mut Rng, text: &str) -> String {
    let mut text = text.to_owned();
    for _ in 0..=rng.below(4) {
        let at = char_boundary_at_or_before(&text, rng.below(text.len() + 1));
        match rng.below(5) {
            0 => text.insert_str(at, rng.pick(FRAGMENTS)),
            1 => {
                let end = char_boundary_at_or_before(&text, at + rng.below(40));
                text.replace_range(at..end.max(at), "");
            }
            2 => {
                let end = char_boundary_at_or_before(&text, at + rng.below(60));
                let copy = text[at..end.max(at)].to_owned();
                let to = char_boundary_at_or_before(&text, rng.below(text.len() + 1));
                text.insert_str(to, &copy);
            }
            3 => {
                let end = char_boundary_at_or_before(&text, at + 1 + rng.below(8));
                let fragment = rng.pick(FRAGMENTS);
                text.replace_range(at..end.max(at), fragment);
            }
            _ => {
                let cut = char_boundary_at_or_before(&text, at);
                text.truncate(cut);
            }
        }
    }
    text
}

fn soup(rng: &mut Rng) -> String {
    let mut text = String::new();
    for _ in 0..rng.below(60) {
        text.push_str(rng.pick(FRAGMENTS));
        if rng.below(3) == 0 {
            text.push(' ');
        }
    }
    text
}

fn check(name: &str, text: &str, base_dir: &Path) {
    let file = SourceFile::new(name, text);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let parsed = trellis_syntax::parse(&file);
        let options = CompileOptions {
            base_dir: Some(base_dir.to_path_buf()),
            attribute_texts: true,
            ..CompileOptions::default()
        };
        let compiled = compile(&file, parsed, &options);
        for diagnostic in &compiled.diagnostics {
            for span in std::iter::once(diagnostic.primary.span)
                .chain(diagnostic.secondary.iter().map(|l| l.span))
            {
                assert!(
                    span.start <= span.end && span.end as usize <= text.len(),
                    "span {span:?} outside the file"
                );
                assert!(
                    text.is_char_boundary(span.start as usize)
                        && text.is_char_boundary(span.end as usize)
                );
            }
            let _ = render_plain(&file, diagnostic);
            let _ = to_json(&file, diagnostic);
        }
        if let Some(workflow) = &compiled.workflow {
            let _ = trellis_workflow::graph_dot::to_dot(workflow);
        }
    }));
    if let Err(panic) = outcome {
        panic!("parse+compile panicked on {name} with input {text:?}: {panic:?}");
    }
}

#[test]
fn parse_and_compile_never_panic_on_100k_inputs() {
    let corpus = corpus();
    let base_dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut rng = Rng(0x5EED_CAFE_F00D_u64);
    let total = 100_000;
    for i in 0..total {
        let (name, text) = if i % 5 == 0 {
            let name = if rng.below(2) == 0 {
                "soup.fabro"
            } else {
                "soup.yaml"
            };
            (name.to_owned(), soup(&mut rng))
        } else {
            let (name, text) = &corpus[rng.below(corpus.len())];
            (name.clone(), mutate(&mut rng, text))
        };
        check(&name, &text, &base_dir);
    }
}

#[test]
fn conditions_and_stylesheets_never_panic() {
    let mut rng = Rng(42);
    for _ in 0..20_000 {
        let text = soup(&mut rng);
        let _ = trellis_workflow::Condition::compile(&text);
        let _ = trellis_syntax::stylesheet::parse_stylesheet(&text);
    }
}

/// Regression: 200,000 nested subgraphs or parentheses overflowed the parser's stack and aborted.
#[test]
fn regression_deep_nesting_is_an_error_not_a_stack_overflow() {
    let base_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cases = [
        (
            "deep.fabro",
            format!(
                "digraph G {{{}{}}}",
                "{".repeat(200_000),
                "}".repeat(200_000)
            ),
        ),
        (
            "deep-condition.fabro",
            format!(
                "digraph G {{ start -> exit [condition=\"{}x{}\"] }}",
                "(".repeat(100_000),
                ")".repeat(100_000)
            ),
        ),
        (
            "deep-not.fabro",
            format!(
                "digraph G {{ start -> exit [condition=\"{}x\"] }}",
                "!".repeat(100_000)
            ),
        ),
        (
            "deep.yaml",
            format!(
                "nodes:\n  a: {{ output_schema: {}{} }}\n",
                "[".repeat(100_000),
                "]".repeat(100_000)
            ),
        ),
    ];
    for (name, text) in cases {
        let file = SourceFile::new(name, text);
        let parsed = trellis_syntax::parse(&file);
        let options = CompileOptions {
            base_dir: Some(base_dir.to_path_buf()),
            ..CompileOptions::default()
        };
        let compiled = compile(&file, parsed, &options);
        assert!(
            compiled.has_errors(),
            "{name} should be rejected with an error"
        );
    }
}
