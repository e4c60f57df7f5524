//! End-to-end tests of `trellis validate`, `trellis graph` and `trellis rules`: the real binary, run as a
//! user would, with exact output and exit codes.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn trellis(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .output()
        .expect("the trellis binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn a_valid_workflow_prints_its_outline_and_exits_zero() {
    let out = trellis(
        &["validate", "examples/implement-feature.fabro"],
        &repo_root(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "Workflow: ImplementFeature (9 nodes, 10 edges)\nexamples/implement-feature.fabro: valid\n"
    );
}

#[test]
fn every_shipped_example_validates() {
    let root = repo_root();
    let mut files: Vec<String> = std::fs::read_dir(root.join("examples"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "fabro" || e == "yaml"))
        .map(|p| format!("examples/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    files.sort();
    let args: Vec<&str> = std::iter::once("validate")
        .chain(files.iter().map(String::as_str))
        .collect();
    let out = trellis(&args, &root);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(text(&out.stdout).matches(": valid\n").count(), files.len());
}

#[test]
fn errors_are_rendered_with_code_location_and_snippet_and_exit_one() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "bad.fabro",
        "digraph Bad {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  t [shape=parallelogram, script=\"true\", timeout=soon]\n  start -> t -> exit [condition=\"outcome=succes\"]\n}\n",
    );
    let out = trellis(&["validate", "bad.fabro"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("Workflow: Bad (3 nodes, 2 edges)\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("error[attribute-value]: `timeout` expects a duration, found `soon`"),
        "{stdout}"
    );
    assert!(stdout.contains("┌─ bad.fabro:4:50"), "{stdout}");
    assert!(
        stdout.contains("4 │   t [shape=parallelogram, script=\"true\", timeout=soon]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("error[condition-syntax]: invalid condition: unknown outcome `succes`"),
        "{stdout}"
    );
    assert!(stdout.contains("┌─ bad.fabro:5:42"), "{stdout}");
    assert!(
        stdout.ends_with("bad.fabro: invalid: 2 errors, 0 warnings\n"),
        "{stdout}"
    );
}

#[test]
fn warnings_alone_keep_the_exit_code_zero() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "warn.fabro",
        "digraph W {\n  start -> t -> exit\n  t [shape=parallelogram, script=\"true\", colour=red]\n}\n",
    );
    let out = trellis(&["validate", "warn.fabro"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("warning[unknown-attribute]: unknown node attribute `colour` is ignored"),
        "{stdout}"
    );
    assert!(stdout.contains("help: did you mean `color`?"), "{stdout}");
    assert!(
        stdout.ends_with("warn.fabro: valid with 1 warning\n"),
        "{stdout}"
    );
}

#[test]
fn json_output_is_one_document_with_every_diagnostic() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "bad.fabro",
        "digraph Bad {\n  start -> plan -> exit\n  plan [shape=tab]\n}\n",
    );
    write(dir.path(), "good.fabro", "digraph Good { start -> exit }\n");
    let out = trellis(
        &["validate", "--format", "json", "bad.fabro", "good.fabro"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(document["valid"], false);
    let files = document["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(
        files[0]["workflow"],
        serde_json::json!({ "name": "Bad", "nodes": 3, "edges": 2 })
    );
    assert_eq!(files[0]["errors"], 1);
    assert_eq!(files[0]["needs_inputs"], false);
    let diagnostic = &files[0]["diagnostics"][0];
    assert_eq!(diagnostic["rule"], "llm-prompt");
    assert_eq!(diagnostic["severity"], "error");
    assert_eq!(diagnostic["message"], "prompt node `plan` has no prompt");
    assert_eq!(diagnostic["file"], "bad.fabro");
    assert_eq!(
        (diagnostic["line"].as_u64(), diagnostic["column"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(
        diagnostic["span"],
        serde_json::json!({ "start": 40, "end": 44 })
    );
    assert_eq!(files[1]["valid"], true);
    assert_eq!(files[1]["diagnostics"], serde_json::json!([]));
}

#[test]
fn a_missing_file_is_a_clear_error_with_exit_two() {
    let dir = tempfile::tempdir().unwrap();
    let out = trellis(&["validate", "nope.fabro"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "error: cannot read nope.fabro: No such file or directory (os error 2)\n"
    );
    let out = trellis(&["validate", "--format", "json", "nope.fabro"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        document["files"][0]["error"]
            .as_str()
            .unwrap()
            .contains("cannot read nope.fabro")
    );
}

#[test]
fn unreadable_inputs_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("binary.fabro"), [0xff, 0xfe, 0x00, 0x41]).unwrap();
    std::fs::create_dir(dir.path().join("folder.fabro")).unwrap();
    let out = trellis(&["validate", "binary.fabro"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("binary.fabro is not valid UTF-8 text"),
        "{}",
        text(&out.stderr)
    );
    let out = trellis(&["validate", "folder.fabro"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with("error: folder.fabro is not a regular file (a directory)"),
        "{}",
        text(&out.stderr)
    );
}

/// Windows editors save UTF-8 with a byte order mark: a workflow so saved is read as the same
/// workflow without it, and a diagnostic's position counts from after it.
#[test]
fn a_workflow_saved_with_a_byte_order_mark_reads_as_without_it() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "marked.fabro",
        "\u{feff}digraph Marked {\r\n  start [shape=Mdiamond]\r\n  exit [shape=Msquare]\r\n  start -> exit\r\n}\r\n",
    );
    write(
        dir.path(),
        "marked.yaml",
        "\u{feff}entry: only\nnodes:\n  only: { type: command, script: \"true\" }\nedges: []\n",
    );
    let out = trellis(&["validate", "marked.fabro", "marked.yaml"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(
        text(&out.stdout),
        "Workflow: Marked (2 nodes, 1 edges)\nmarked.fabro: valid\n\n\
         Workflow: marked (1 nodes, 0 edges)\nmarked.yaml: valid\n"
    );
    write(dir.path(), "bad.fabro", "\u{feff}digraph X { start -> }\n");
    let out = trellis(&["validate", "bad.fabro"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("expected a node id, found `}`\n  ┌─ bad.fabro:1:22"),
        "{}",
        text(&out.stdout)
    );
}

/// A file large enough for `validate` to start itself again with huge pages for its heap (see
/// `commands/huge_pages.rs`) is reported as it is without them (the user's own `hugetlb` setting
/// keeps it from starting again): same output, same exit code, valid or not.
#[test]
fn a_large_workflow_is_reported_the_same_with_huge_pages_as_without() {
    let dir = tempfile::tempdir().unwrap();
    let valid = trellis_test::workflows::generated(4_000);
    assert!(valid.len() > 300_000, "{} bytes", valid.len());
    write(dir.path(), "large.fabro", &valid);
    // A timeout that is no duration: an error.
    let invalid = valid.replacen(
        "exit [shape=Msquare]",
        "exit [shape=Msquare, timeout=banana]",
        1,
    );
    write(dir.path(), "broken.fabro", &invalid);
    for (file, code) in [("large.fabro", 0), ("broken.fabro", 1)] {
        for format in ["text", "json"] {
            let args = ["validate", "--format", format, file];
            let started_again = trellis(&args, dir.path());
            let own = Command::new(env!("CARGO_BIN_EXE_trellis"))
                .args(args)
                .current_dir(dir.path())
                .env("NO_COLOR", "1")
                .env("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
                .output()
                .unwrap();
            assert_eq!(started_again.status.code(), Some(code), "{file} {format}");
            assert_eq!(own.status.code(), Some(code), "{file} {format}");
            assert_eq!(
                text(&started_again.stdout),
                text(&own.stdout),
                "{file} {format}"
            );
            assert_eq!(
                text(&started_again.stderr),
                text(&own.stderr),
                "{file} {format}"
            );
        }
    }
    let out = trellis(&["validate", "broken.fabro"], dir.path());
    assert!(
        text(&out.stdout).contains("banana"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn usage_errors_exit_two() {
    let out = trellis(&["validate"], &repo_root());
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Usage"), "{}", text(&out.stderr));
    let out = trellis(&["validate", "--format", "xml", "x.fabro"], &repo_root());
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn graph_prints_normalized_dot_that_validates_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = repo_root();
    for example in [
        "implement-feature.fabro",
        "parallel-checks.fabro",
        "release-approval.fabro",
    ] {
        let out = trellis(&["graph", &format!("examples/{example}")], &root);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let dot = text(&out.stdout);
        let copy = write(dir.path(), example, &dot);
        let again = trellis(&["validate", copy.to_str().unwrap()], dir.path());
        assert_eq!(
            again.status.code(),
            Some(0),
            "{dot}\n{}",
            text(&again.stdout)
        );
        // The normalized form is a fixed point.
        let twice = trellis(&["graph", copy.to_str().unwrap()], dir.path());
        assert_eq!(text(&twice.stdout), dot);
    }
}

#[test]
fn graph_shows_resolved_types_classes_and_models() {
    let out = trellis(
        &[
            "graph",
            "examples/implement-feature.fabro",
            "--goal",
            "Add dark mode",
        ],
        &repo_root(),
    );
    assert_eq!(out.status.code(), Some(0));
    let dot = text(&out.stdout);
    assert!(dot.contains(
        "    implement [type=\"agent\", shape=\"box\", label=\"Implement\", class=\"implementation,coding\", fidelity=\"full\", model=\"claude-sonnet-4-5\", prompt=\"Implement the approved plan.\", reasoning_effort=\"high\", thread_id=\"impl\"]\n"
    ), "{dot}");
    assert!(
        dot.contains("prompt=\"Create a detailed implementation plan for: Add dark mode\""),
        "{dot}"
    );
}

#[test]
fn graph_of_an_invalid_workflow_reports_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "bad.fabro",
        "digraph Bad { start -> exit -> start }\n",
    );
    let out = trellis(&["graph", "bad.fabro"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(out.stdout, [] as [u8; 0]);
    assert!(
        text(&out.stderr).contains("error[exit-outgoing]"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn rules_lists_every_rule() {
    let out = trellis(&["rules"], &repo_root());
    assert_eq!(out.status.code(), Some(0));
    let listing = text(&out.stdout);
    assert_eq!(listing.lines().count(), trellis_workflow::rules::ALL.len());
    for rule in trellis_workflow::rules::ALL {
        assert!(
            listing.lines().any(|l| l.starts_with(rule.code)),
            "{}:\n{listing}",
            rule.code
        );
    }
}

#[test]
fn prompt_files_resolve_home_and_parent_directories() {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("shared-prompts")).unwrap();
    std::fs::write(
        home.path().join("shared-prompts/review.md"),
        "Review for $goal",
    )
    .unwrap();
    std::fs::create_dir_all(project.path().join("common")).unwrap();
    std::fs::write(project.path().join("common/plan.md"), "Plan it").unwrap();
    std::fs::create_dir_all(project.path().join("flows")).unwrap();
    write(
        &project.path().join("flows"),
        "refs.fabro",
        "digraph Refs {\n  graph [goal=\"ship\"]\n  start -> shared -> parent -> exit\n  shared [shape=tab, prompt=\"@~/shared-prompts/review.md\"]\n  parent [shape=tab, prompt=\"@../common/plan.md\"]\n}\n",
    );
    let run = |home_dir: &Path, allow: &[&Path]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
        command.args(["graph", "flows/refs.fabro"]);
        for dir in allow {
            command.arg("--allow-dir").arg(dir);
        }
        command
            .current_dir(project.path())
            .env("HOME", home_dir)
            .output()
            .unwrap()
    };
    // Outside the workflow's directory (and no git repository around it): read only when allowed.
    let out = run(home.path(), &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("`prompt` refers to `~/shared-prompts/review.md`, which is outside the workflow's directory"),
        "{stderr}"
    );
    assert!(
        stderr.contains("`prompt` refers to `../common/plan.md`, which is outside"),
        "{stderr}"
    );
    let shared = home.path().join("shared-prompts");
    let common = project.path().join("common");
    let out = run(home.path(), &[&shared, &common]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("prompt=\"Review for ship\""),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stdout).contains("prompt=\"Plan it\""));
    let elsewhere = tempfile::tempdir().unwrap();
    let out = run(elsewhere.path(), &[&common]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("error[file-reference]: `prompt` refers to `~/shared-prompts/review.md`, which does not exist"), "{}", text(&out.stderr));
}

/// A reader that stops early (`trellis graph big.fabro | head`) ends the command quietly, with the
/// status a SIGPIPE gives, whether the command printed with `println!` or wrote with `?`.
#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    // Far more than a pipe holds (64 KiB), so the command is still writing when the reader leaves:
    // the normalized graph (printed, 0.3 MB), and the 200 warnings each of four files has shown
    // (written, 0.4 MB).
    let big = trellis_test::workflows::generated(2_000);
    write(dir.path(), "big.fabro", &big);
    let warned = big.replace("max_visits=", "max_visitz=");
    for name in ["w1.fabro", "w2.fabro", "w3.fabro", "w4.fabro"] {
        write(dir.path(), name, &warned);
    }
    let validate = [
        "validate", "--format", "json", "w1.fabro", "w2.fabro", "w3.fabro", "w4.fabro",
    ];
    for args in [&["graph", "big.fabro"][..], &validate[..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .args(args)
            .current_dir(dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert_ne!(first, "");
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(141), "{args:?}");
        assert_eq!(text(&out.stderr), "", "{args:?}");
    }
}
