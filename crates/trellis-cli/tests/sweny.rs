//! SWEny workflow files through the `trellis` binary: the specification's examples validate and dry-run
//! as the edges-and-routing page says; SWEny's fields reach the agent's prompt (instruction, rules and
//! context under their headings, the workflow input and prior results by node id, kebab-case ids); inputs
//! are checked with every problem reported at once.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;

use std::path::Path;

use run_support::Project;
use serde_json::{Value, json};
use trellis_test::Llmock;

fn spec_example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../trellis-workflow/tests/fixtures/spec")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_specification_examples_validate_and_dry_run_as_the_page_says() {
    let p = Project::new();
    for (file, expected) in [
        (
            "003-linear-flow.yaml",
            vec!["gather", "investigate", "notify"],
        ),
        // A dry run's router takes the first condition.
        (
            "003-conditional-branching.yaml",
            vec!["investigate", "create_issue", "notify"],
        ),
        // test -> implement at most 3 times; then only `all tests passed` is left.
        (
            "003-bounded-retry-loop.yaml",
            vec![
                "implement",
                "test",
                "implement",
                "test",
                "implement",
                "test",
                "implement",
                "test",
                "done",
            ],
        ),
        (
            "003-self-loop.yaml",
            vec!["retry", "retry", "retry", "retry", "done"],
        ),
    ] {
        p.write(file, &spec_example(file));
        let validated = p.command(&["validate", file]).output().unwrap();
        assert!(
            validated.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&validated.stdout)
        );
        let run = p.run(file, &["--dry-run"]);
        assert_eq!(
            run.code(),
            Some(0),
            "{file}: {}\n{}",
            run.summary,
            run.stderr()
        );
        assert_eq!(run.stages(), expected, "{file}");
    }
    for (file, code) in [
        ("003-invalid-unbounded-cycle.yaml", "UNBOUNDED_CYCLE"),
        ("003-invalid-unbounded-self-loop.yaml", "SELF_LOOP"),
    ] {
        p.write(file, &spec_example(file));
        let out = p
            .command(&["validate", "--format", "json", file])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{file}");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let codes: Vec<&str> = report["files"][0]["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["rule"].as_str().unwrap())
            .collect();
        assert_eq!(codes, [code], "{file}");
    }
}

const TRIAGE: &str = r"id: bug-triage
name: Bug triage
description: Read a bug report and decide what to do with it
workflow_type: triage
author: someone
tags: [triage]
entry: read-bug-report
rules:
  - Never close an issue.
context:
  - ./context/team.md
inputs:
  repo: { type: string, required: true, description: The repository }
  max_issues: { type: number, default: 3 }
  labels: { type: 'string[]', default: [bug] }
nodes:
  read-bug-report:
    name: Read the bug report
    instruction: ./prompts/read.md
    skills: [github]
    output:
      type: object
      properties:
        severity: { type: string, enum: [low, high] }
      required: [severity]
  file-issue:
    name: File an issue
    instruction: { inline: File one issue for the report. }
    rules:
      only: true
      sources:
        - { file: ./rules/filing.md }
    max_turns: 4
    disallowed_tools: [shell]
edges:
  - from: read-bug-report
    to: file-issue
";

fn triage_project(mock: &Llmock) -> Project {
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    p.write("triage.yml", TRIAGE);
    p.write(
        "prompts/read.md",
        "Read the bug report and rate its severity.\n",
    );
    p.write("context/team.md", "The team ships on Fridays.\n");
    p.write(
        "rules/filing.md",
        "Title issues with the component first.\n",
    );
    p
}

#[test]
fn a_sweny_workflow_validates_with_one_warning_per_ignored_field() {
    let p = Project::new();
    p.write("triage.yml", TRIAGE);
    p.write("prompts/read.md", "Read.\n");
    p.write("context/team.md", "Team.\n");
    p.write("rules/filing.md", "Rules.\n");
    let out = p
        .command(&["validate", "--format", "json", "triage.yml"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{report}");
    let file = &report["files"][0];
    assert_eq!(file["workflow"]["name"], "bug-triage");
    let warnings: Vec<&str> = file["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        warnings,
        [
            "`skills` is accepted but ignored (node `read-bug-report`): SWEny skills (tool bundles and MCP servers) are not provided"
        ]
    );
}

#[test]
fn a_sweny_nodes_prompt_has_its_rules_context_input_and_prior_results() {
    let Some(mock) = Llmock::start() else { return };
    let p = triage_project(&mock);
    mock.scenario(&json!([
        { "type": "reply", "text": "Severity: {\"severity\": \"high\", \"why\": \"crash on login\"}", "times": 1 },
        { "type": "reply", "text": "Filed as #12.", "times": 1 },
    ]));
    let run = p.run(
        "triage.yml",
        &["--input", "repo=acme/api", "--input", "labels=bug,login"],
    );
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.stages(), ["read-bug-report", "file-issue"]);
    let prompts: Vec<String> = mock
        .requests()
        .iter()
        .map(|r| {
            let body = &r["body"];
            let messages = body["messages"].as_array().unwrap();
            messages[0]["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    let first = &prompts[0];
    assert!(
        first.contains("## Rules\n\nNever close an issue."),
        "{first}"
    );
    assert!(
        first.contains("## Context\n\nThe team ships on Fridays."),
        "{first}"
    );
    assert!(
        first.contains("## Task\n\nRead the bug report and rate its severity."),
        "{first}"
    );
    assert!(
        first.contains("\"repo\": \"acme/api\"") && first.contains("\"max_issues\": 3"),
        "the input, defaults filled in: {first}"
    );
    let second = &prompts[1];
    assert!(
        second.contains("## Rules\n\nTitle issues with the component first."),
        "{second}"
    );
    assert!(
        !second.contains("Never close an issue."),
        "only: true drops the workflow's rules"
    );
    assert!(
        second.contains("## Context\n\nThe team ships on Fridays."),
        "{second}"
    );
    assert!(
        second.contains("\"read-bug-report\": {") && second.contains("\"why\": \"crash on login\""),
        "the prior node's whole result, by its id: {second}"
    );
    assert!(
        second.contains("\"labels\": [\n      \"bug\",\n      \"login\"\n    ]"),
        "{second}"
    );
    assert_eq!(run.context("output.read-bug-report")["severity"], "high");
}

#[test]
fn inputs_are_checked_with_every_problem_reported_at_once() {
    let Some(mock) = Llmock::start() else { return };
    let p = triage_project(&mock);
    p.write(
        "inputs.json",
        "{\"max_issues\": \"many\", \"labels\": \"bug\"}",
    );
    let out = p
        .command(&["run", "triage.yml", "--inputs", "inputs.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("input `repo` (The repository) is required"),
        "{stderr}"
    );
    assert!(
        stderr.contains("input `max_issues` must be a number, found a string"),
        "{stderr}"
    );
    assert!(
        stderr.contains("input `labels` must be a string[], found a string"),
        "{stderr}"
    );
    assert!(!p.path().join("runs").exists(), "no run was created");
    assert!(mock.requests().is_empty());
}
