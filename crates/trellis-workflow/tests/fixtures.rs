//! Fixture tests: every `.fabro`/`.yaml` file under `tests/fixtures/` is compiled and its rendered
//! diagnostics (and, when valid, its normalized DOT) compared with an `insta` snapshot. Beside the
//! snapshots, structural checks: every rule has a passing and a failing fixture, the specification's
//! examples validate as the documents say, and the shipped examples validate clean.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use trellis_syntax::render::render_plain;
use trellis_syntax::{Diagnostic, SourceFile, Tally};
use trellis_workflow::{CompileOptions, Compiled, compile, rules};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Compiles a file, naming it by its path relative to `root` so snapshots do not depend on the checkout.
fn compile_file(path: &Path, root: &Path) -> (SourceFile, Compiled) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = path
        .strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/");
    let file = SourceFile::new(name, text);
    let options = CompileOptions {
        base_dir: path.parent().map(Path::to_path_buf),
        attribute_texts: true,
        ..CompileOptions::default()
    };
    let parsed = trellis_syntax::parse(&file);
    let compiled = compile(&file, parsed, &options);
    (file, compiled)
}

fn render(path: &Path) -> String {
    let (file, compiled) = compile_file(path, &fixtures_dir());
    let mut out: String = compiled
        .diagnostics
        .iter()
        .map(|d| render_plain(&file, d))
        .collect();
    let tally = Tally::of(&compiled.diagnostics);
    let _ = writeln!(
        out,
        "{} error(s), {} warning(s)",
        tally.errors, tally.warnings
    );
    if let Some(workflow) = &compiled.workflow {
        out.push('\n');
        out.push_str(&trellis_workflow::graph_dot::to_dot(workflow));
    }
    // "looked for <path>" labels are absolute: keep snapshots independent of the checkout.
    out.replace(&fixtures_dir().display().to_string(), "[fixtures]")
}

#[test]
fn fixture_snapshots() {
    insta::glob!("fixtures/**/*.{fabro,yaml}", |path| {
        insta::assert_snapshot!(render(path));
    });
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "fabro" || e == "yaml"));
    files.sort();
    files
}

fn codes(diagnostics: &[Diagnostic]) -> Vec<&'static str> {
    diagnostics.iter().map(|d| d.code).collect()
}

#[test]
fn every_rule_has_a_passing_and_a_failing_fixture() {
    for rule in rules::ALL.iter().filter(|r| r.code != "syntax") {
        let dir = fixtures_dir().join("rules").join(rule.code);
        let files = files_in(&dir);
        let name = |p: &PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
        let passes: Vec<_> = files
            .iter()
            .filter(|p| name(p).starts_with("pass"))
            .collect();
        let fails: Vec<_> = files
            .iter()
            .filter(|p| name(p).starts_with("fail"))
            .collect();
        assert!(
            !passes.is_empty() && !fails.is_empty(),
            "rule `{}` needs pass and fail fixtures in {}",
            rule.code,
            dir.display()
        );
        for pass in passes {
            let (_, compiled) = compile_file(pass, &dir);
            assert!(
                compiled.diagnostics.is_empty(),
                "{} should validate clean, got {:?}",
                pass.display(),
                codes(&compiled.diagnostics)
            );
        }
        for fail in fails {
            let (_, compiled) = compile_file(fail, &dir);
            let found = compiled
                .diagnostics
                .iter()
                .filter(|d| d.code == rule.code)
                .collect::<Vec<_>>();
            assert!(
                !found.is_empty(),
                "{} should report `{}`, got {:?}",
                fail.display(),
                rule.code,
                codes(&compiled.diagnostics)
            );
            assert!(found.iter().all(|d| d.severity == rule.severity
                || rule.code == "cycles"
                || rule.code == "AMBIGUOUS_EDGES"
                || rule.code == "condition-syntax"));
        }
    }
}

/// One error (or warning) of every rule in a few files: each file reports all of its own, none
/// hidden by another. `every.fabro` holds every rule that applies to DOT; `every.yaml` the YAML
/// ones; `no-entry.yaml` the one that leaves nothing to walk from.
#[test]
fn every_rule_reports_past_every_other_error() {
    let dir = fixtures_dir().join("every-rule");
    let yaml_only = [
        "MISSING_ENTRY",
        "UNKNOWN_EDGE_SOURCE",
        "UNKNOWN_EDGE_TARGET",
        "UNREACHABLE_NODE",
        "SELF_LOOP",
        "UNBOUNDED_CYCLE",
        "inputs",
        "workflow-type",
        "ignored-field",
    ];
    let all: BTreeSet<&str> = rules::ALL
        .iter()
        .map(|r| r.code)
        .filter(|&c| c != "syntax")
        .collect();
    let reported = |name: &str| -> BTreeSet<&'static str> {
        let (_, compiled) = compile_file(&dir.join(name), &dir);
        compiled.diagnostics.iter().map(|d| d.code).collect()
    };
    let dot = reported("every.fabro");
    let expected_dot: BTreeSet<&str> = all
        .iter()
        .copied()
        .filter(|c| !yaml_only.contains(c))
        .collect();
    assert_eq!(dot, expected_dot, "every.fabro");
    let yaml = reported("every.yaml");
    let expected_yaml: BTreeSet<&str> = yaml_only
        .iter()
        .copied()
        .filter(|&c| c != "MISSING_ENTRY")
        .chain(["AMBIGUOUS_EDGES"])
        .collect();
    assert_eq!(yaml, expected_yaml, "every.yaml");
    assert_eq!(
        reported("no-entry.yaml"),
        BTreeSet::from(["MISSING_ENTRY"]),
        "no-entry.yaml"
    );
}

#[test]
fn syntax_error_fixtures_report_syntax_errors_and_features_parse_clean() {
    for file in files_in(&fixtures_dir().join("syntax-errors")) {
        let (_, compiled) = compile_file(&file, &fixtures_dir());
        assert!(
            compiled.diagnostics.iter().any(|d| d.code == "syntax"),
            "{}: {:?}",
            file.display(),
            codes(&compiled.diagnostics)
        );
    }
    for file in files_in(&fixtures_dir().join("syntax")) {
        let (_, compiled) = compile_file(&file, &fixtures_dir());
        assert!(
            compiled.diagnostics.is_empty(),
            "{}: {:?}",
            file.display(),
            codes(&compiled.diagnostics)
        );
    }
}

#[test]
fn many_errors_are_reported_in_one_run() {
    let (_, compiled) = compile_file(
        &fixtures_dir().join("syntax-errors/many-errors.fabro"),
        &fixtures_dir(),
    );
    // Six syntax errors, each reported where it is: the parser recovers after every one.
    assert_eq!(
        codes(&compiled.diagnostics),
        ["syntax"; 6],
        "{:?}",
        compiled.diagnostics
    );
}

#[test]
fn specification_examples_validate_as_documented() {
    for file in files_in(&fixtures_dir().join("spec")) {
        let (_, compiled) = compile_file(&file, &fixtures_dir());
        let invalid = file
            .file_name()
            .unwrap()
            .to_string_lossy()
            .contains("invalid");
        if invalid {
            assert!(
                compiled.has_errors(),
                "{} should be invalid",
                file.display()
            );
        } else {
            // The transitions page's weight example shows an edge a heavier one always beats; saying
            // so is the point of the AMBIGUOUS_EDGES warning.
            let reported: Vec<_> = compiled
                .diagnostics
                .iter()
                .filter(|d| {
                    d.code != "AMBIGUOUS_EDGES" || d.severity != trellis_syntax::Severity::Warning
                })
                .collect();
            assert!(reported.is_empty(), "{}: {:?}", file.display(), reported);
        }
    }
}

#[test]
fn shipped_examples_validate_clean() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let files = files_in(&examples);
    assert!(
        files.len() >= 6,
        "examples/ should hold the reference example and five more"
    );
    for file in files {
        let (_, compiled) = compile_file(&file, &examples);
        assert!(
            compiled.diagnostics.is_empty(),
            "{}: {:?}",
            file.display(),
            compiled.diagnostics
        );
    }
}

#[test]
fn the_corpus_is_large_enough() {
    let mut count = 0;
    let mut stack = vec![fixtures_dir()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
            if entry.path().is_dir() {
                stack.push(entry.path());
            } else if entry
                .path()
                .extension()
                .is_some_and(|e| e == "fabro" || e == "yaml")
            {
                count += 1;
            }
        }
    }
    assert!(count >= 60, "only {count} fixtures");
}
