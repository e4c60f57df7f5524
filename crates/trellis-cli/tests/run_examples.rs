//! The example workflows with agent nodes run for real through the `trellis` binary, on a small Rust
//! crate, with llmock scripting the models' answers and tool calls: the agents' edits land on disk,
//! `cargo test`/`cargo doc` run on them, and the routing follows. `implement-feature.fabro` is the
//! complete example of the language reference.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use std::path::Path;

use run_support::Project;
use serde_json::{Value, json};
use trellis_test::Llmock;

fn project(mock: &Llmock) -> Project {
    Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-examples")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
}

/// Copies an example (and the files beside it that it references) into the project.
fn example(p: &Project, names: &[&str]) {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for name in names {
        p.write(name, &std::fs::read_to_string(examples.join(name)).unwrap());
    }
}

/// A one-file crate whose `add` subtracts, with a test that says so.
fn crate_with_a_bug(p: &Project) {
    p.write(
        "Cargo.toml",
        "[package]\nname = \"adder\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    );
    p.write(
        "src/lib.rs",
        "pub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn adds() {\n        assert_eq!(super::add(2, 3), 5);\n    }\n}\n",
    );
}

fn call(name: &str, arguments: &Value) -> Value {
    json!({ "type": "reply", "tool_calls": [{ "name": name, "arguments": arguments }], "times": 1 })
}

fn answer(text: &str) -> Value {
    json!({ "type": "reply", "text": text, "times": 1 })
}

fn tool_names(run: &run_support::Run, node: &str) -> Vec<String> {
    run.events_named("Agent.ToolCallCompleted")
        .iter()
        .filter(|e| e["node_id"] == node && e["is_error"] == false)
        .map(|e| e["tool"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn implement_feature_the_complete_example_runs_with_auto_approve() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    example(&p, &["implement-feature.fabro"]);
    crate_with_a_bug(&p);
    mock.scenario(&json!([
        answer("Plan: 1. make add add. 2. test it."),
        call("read_file", &json!({ "path": "src/lib.rs" })),
        call("edit_file", &json!({ "path": "src/lib.rs", "old_string": "a - b", "new_string": "a + b" })),
        answer("Implemented the plan."),
        call("edit_file", &json!({
            "path": "src/lib.rs",
            "old_string": "    fn adds() {",
            "new_string": "    fn adds_negatives() {\n        assert_eq!(super::add(-2, -3), -5);\n    }\n\n    #[test]\n    fn adds() {",
        })),
        answer("Tests written."),
        answer("The implementation is correct."),
    ]));
    let run = p.run("implement-feature.fabro", &["--auto-approve"]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        run.stages(),
        [
            "start",
            "plan",
            "approve",
            "implement",
            "test",
            "validate",
            "gate",
            "review",
            "exit"
        ]
    );
    assert!(p.read("src/lib.rs").contains("a + b"));
    assert_eq!(tool_names(&run, "implement"), ["read_file", "edit_file"]);
    assert_eq!(tool_names(&run, "test"), ["edit_file"]);
    let output = run.context("command.output");
    assert!(
        output.to_string().contains("blob://") || output.to_string().contains("test result"),
        "{output}"
    );
    // `test` continued `implement`'s thread: its request held implement's tool calls.
    let requests = mock.requests();
    let test_request = &requests[4]["body"];
    let messages = test_request["messages"].as_array().unwrap();
    assert!(
        messages
            .iter()
            .any(|m| m["content"][0]["text"] == "Implemented the plan."),
        "{messages:?}"
    );
    assert_eq!(test_request["model"], "claude-sonnet-4-5");
}

#[test]
fn fix_failing_tests_loops_until_the_suite_passes() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    example(&p, &["fix-failing-tests.fabro"]);
    crate_with_a_bug(&p);
    mock.scenario(&json!([
        call("read_file", &json!({ "path": "src/lib.rs" })),
        answer("Root cause: add subtracts."),
        call(
            "edit_file",
            &json!({ "path": "src/lib.rs", "old_string": "a - b", "new_string": "a + b" })
        ),
        call("shell", &json!({ "command": "cargo test 2>&1 | tail -3" })),
        answer("Fixed: add adds."),
        answer("Good fix. {\"preferred_next_label\": \"approve\"}"),
    ]));
    let run = p.run("fix-failing-tests.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        run.stages(),
        [
            "start", "test", "gate", "diagnose", "fix", "test", "gate", "review", "exit"
        ]
    );
    assert!(p.read("src/lib.rs").contains("a + b"));
    let shell = run
        .events_named("Agent.ToolCallCompleted")
        .into_iter()
        .find(|e| e["tool"] == "shell")
        .unwrap();
    assert!(
        shell["output"]
            .as_str()
            .unwrap()
            .contains("test result: ok"),
        "{shell}"
    );
    let fix_status =
        run_support::read_json(&run_support::stage_dir(&run.record(), "fix").join("status.json"));
    assert_eq!(fix_status["files_touched"], json!(["src/lib.rs"]));
}

#[test]
fn write_docs_drafts_audits_and_builds_the_docs() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    example(
        &p,
        &[
            "write-docs.fabro",
            "prompts/outline.md",
            "prompts/draft.md",
            "prompts/audit.md",
            "schemas/audit.schema.json",
        ],
    );
    crate_with_a_bug(&p);
    mock.scenario(&json!([
        answer("Outline: crate docs, then add()."),
        call(
            "edit_file",
            &json!({
                "path": "src/lib.rs",
                "old_string": "pub fn add",
                "new_string": "/// Adds two numbers.\npub fn add",
            })
        ),
        answer("Drafted the docs."),
        answer("{\"verdict\": \"pass\", \"problems\": []}"),
    ]));
    let run = p.run("write-docs.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        run.stages(),
        [
            "start", "outline", "draft", "audit", "gate", "build", "exit"
        ]
    );
    assert!(p.read("src/lib.rs").starts_with("/// Adds two numbers.\n"));
    assert_eq!(run.context("output.audit")["verdict"], "pass");
    assert!(p.path().join("target/doc/adder/index.html").is_file());
}
