//! SWEny workflow files through the `trellis` binary: the specification's examples validate and dry-run
//! as the edges-and-routing page says; SWEny's fields reach the agent's prompt (instruction, rules and
//! context under their headings, the workflow input and prior results by node id, kebab-case ids); inputs
//! are checked with every problem reported at once; nodes' `skills` resolve as SWEny's pre-flight
//! says (built-in ids by category, custom instruction and MCP skills reaching the model).

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
workflow_type: generic
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
    // The `github` skill needs a token; its server (`github-mcp-server`) is not installed here,
    // which is a warning.
    let p = Project::new()
        .with_env("GITHUB_TOKEN", "ghp-test-0000")
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
fn a_sweny_workflow_validates_with_its_skills_taken() {
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
    assert!(warnings.is_empty(), "{warnings:?}");
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
    assert_eq!(mock.requests(), [] as [serde_json::Value; 0]);
}

/// A triage workflow shaped as SWEny's own (its nodes name the same skills, check their tool calls
/// and output with `verify` (older files) and `eval` (newer ones) and output patterns, and its edges
/// are judged in plain words): every skill id is SWEny's built-in one.
const ALERT_TRIAGE: &str = r"id: alert-triage
name: Alert triage
entry: prepare
nodes:
  prepare:
    name: Load rules
    instruction: Fetch the rule documents the input lists.
    skills: [linear]
  gather:
    name: Gather context
    instruction: Pull the errors, logs and recent commits around the alert.
    skills: [github, sentry, datadog, betterstack, linear]
  investigate:
    name: Find the cause
    instruction: Decide whether each finding is new or a duplicate.
    skills: [github, linear]
    verify:
      # A finding is new only once the trackers were searched.
      any_tool_called:
        - linear_search_issues
        - github_search_issues
    output:
      type: object
      properties:
        novel_count: { type: number }
        highest_severity: { type: string, enum: [critical, high, medium, low] }
      required: [novel_count, highest_severity]
  create_issue:
    name: File issues
    instruction: File an issue for each new finding.
    skills: [linear, github]
    eval:
      - name: filed
        kind: function
        rule: { any_tool_called: [linear_create_issue, github_create_issue, linear_add_comment] }
      - name: actionable
        kind: judge
        rubric: Each issue filed says how to reproduce the failure.
    retry: { max: 1, instruction: { auto: true } }
    output:
      type: object
      properties:
        issueIdentifier: { type: string, pattern: '^[A-Z][A-Z0-9]*-\d+$' }
        issueUrl: { type: string, pattern: '^https?://' }
        issues: { type: array, minItems: 1 }
      required: [issueIdentifier, issues]
  skip:
    name: Skip
    instruction: Comment on the duplicates.
    skills: [linear, github]
  notify:
    name: Tell the team
    instruction: Post a summary.
    skills: [slack, notification]
edges:
  - { from: prepare, to: gather }
  - { from: gather, to: investigate }
  - { from: investigate, to: create_issue, when: novel_count is greater than 0 }
  - { from: investigate, to: skip, when: novel_count is 0 }
  - { from: create_issue, to: notify }
  - { from: skip, to: notify }
";

#[test]
fn a_sweny_triage_workflow_simulates_with_a_message_per_missing_configuration() {
    let p = Project::new();
    p.write("triage.yml", ALERT_TRIAGE);
    // Nothing configured: the run is simulated, and each node says what its skills lack.
    let run = p.run("triage.yml", &["--simulate"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let warnings = run.warnings();
    let gather: Vec<&String> = warnings
        .iter()
        .filter(|w| w.starts_with("gather: "))
        .collect();
    assert_eq!(gather.len(), 3, "{warnings:#?}");
    assert!(
        gather.contains(
            &&"gather: skills: no git skill is available: `github` needs GITHUB_TOKEN set"
                .to_owned()
        ),
        "{warnings:#?}"
    );
    assert!(
        gather.iter().any(|w| w.starts_with("gather: skills: no observability skill is available: `sentry` needs SENTRY_AUTH_TOKEN and SENTRY_ORG set; `datadog` needs DD_API_KEY and DD_APP_KEY set; `betterstack` needs")),
        "{warnings:#?}"
    );
    assert!(
        gather.contains(
            &&"gather: skills: no tasks skill is available: `linear` needs LINEAR_API_KEY set"
                .to_owned()
        ),
        "{warnings:#?}"
    );
    assert!(
        warnings.iter().any(|w| w.starts_with("notify: skills: no notification skill is available: `slack` needs SLACK_WEBHOOK_URL, or SLACK_BOT_TOKEN set; `notification` needs")),
        "{warnings:#?}"
    );

    // A real run stops before it starts, naming every node's problem; notifications only warn.
    let out = p
        .command(&["run", "triage.yml"])
        .env("ANTHROPIC_API_KEY", "sk-ant-test")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for node in ["prepare", "gather", "investigate", "create_issue", "skip"] {
        assert!(
            stderr.contains(&format!("node `{node}`: ")),
            "{node}: {stderr}"
        );
    }
    assert!(!stderr.contains("node `notify`"), "{stderr}");

    // Configured: a token for GitHub, Sentry's variables, and an MCP server named `linear`.
    let c = Project::new()
        .with_env("GITHUB_TOKEN", "ghp-x")
        .with_env("SENTRY_AUTH_TOKEN", "s")
        .with_env("SENTRY_ORG", "acme");
    c.write("triage.yml", ALERT_TRIAGE);
    c.write(
        ".mcp.json",
        &json!({ "mcpServers": { "linear": { "command": "linear-mcp" } } }).to_string(),
    );
    let run = c.run("triage.yml", &["--simulate"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let warnings = run.warnings();
    assert_eq!(
        warnings.len(),
        1,
        "only the notification one is left: {warnings:#?}"
    );
    assert!(warnings[0].starts_with("notify: "), "{warnings:#?}");
}

#[test]
fn custom_instruction_and_mcp_skills_reach_the_model() {
    let Some(server) = files_server() else { return };
    let Some(mock) = Llmock::start() else { return };
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-sweny-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
        .with_env("SWENY_ALLOW_SKILL_STDIO_COMMAND", "1");
    let root = p.path().canonicalize().unwrap();
    p.write(
        ".sweny/skills/code-standards/SKILL.md",
        "---\nname: code-standards\ndescription: Team conventions\n---\nEvery public function needs a test.\n",
    );
    p.write(
        ".sweny/skills/notes/SKILL.md",
        &format!(
            "---\nname: notes\ndescription: The team's notes\ncategory: data\nmcp:\n  command: {}\n  args: [\"{}\"]\n---\nRead the notes with the notes tools.\n",
            server.display(),
            root.display()
        ),
    );
    let notes = p.write("notes.txt", "ship on fridays\n");
    p.write(
        "review.yml",
        "id: review\nname: Review\nentry: review\nnodes:\n  review:\n    name: Review\n    instruction: Review the change.\n    skills: [code-standards, notes]\nedges: []\n",
    );
    mock.scenario(&json!([
        { "type": "reply", "tool_calls": [{ "name": "mcp__notes__read_text_file",
            "arguments": { "path": notes.canonicalize().unwrap() } }], "times": 1 },
        { "type": "reply", "text": "Reviewed.", "times": 1 },
    ]));
    let run = p.run("review.yml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    let prompt = bodies[0]["messages"][0].to_string();
    assert!(prompt.contains("## Skill: code-standards"), "{prompt}");
    assert!(
        prompt.contains("Every public function needs a test."),
        "{prompt}"
    );
    assert!(
        prompt.contains("Read the notes with the notes tools."),
        "{prompt}"
    );
    let tools = Llmock::tool_names(&bodies[0]);
    assert!(
        tools.iter().any(|t| t == "mcp__notes__read_text_file"),
        "{tools:?}"
    );
    let result = &Llmock::tool_results(&bodies[1])[0];
    assert_eq!(result["is_error"], false, "{result}");
    assert!(
        result["content"].to_string().contains("ship on fridays"),
        "{result}"
    );

    // Without the switch, the skill's program is not started: its instructions still apply.
    let mock2 = Llmock::start().unwrap();
    let q = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-sweny-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock2.url("/anthropic"));
    for file in [
        ".sweny/skills/code-standards/SKILL.md",
        ".sweny/skills/notes/SKILL.md",
        "review.yml",
    ] {
        q.write(file, &p.read(file));
    }
    mock2.scenario(&json!([{ "type": "reply", "text": "Reviewed.", "times": 1 }]));
    let run = q.run("review.yml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let tools = mock2.bodies()[0]["tools"].to_string();
    assert!(!tools.contains("mcp__notes"), "{tools}");
    assert!(
        run.warnings()
            .iter()
            .any(|w| w.contains("SWENY_ALLOW_SKILL_STDIO_COMMAND=1")),
        "{:?}",
        run.warnings()
    );
}

#[test]
fn requires_skips_or_fails_a_node_before_its_model_is_asked_and_tools_narrow_its_servers() {
    let Some(server) = files_server() else { return };
    let Some(mock) = Llmock::start() else { return };
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-sweny-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    let root = p.path().canonicalize().unwrap();
    p.write(
        ".mcp.json",
        &json!({ "mcpServers": { "files": { "command": server, "args": [root] } } }).to_string(),
    );
    p.write(
        "flow.yml",
        r"id: fix
name: Fix
entry: triage
nodes:
  triage:
    name: Triage
    instruction: Decide what to do.
    tools: { allow: [read_text_file, list_directory], deny: [list_directory] }
    output:
      type: object
      properties: { recommendation: { type: string } }
      required: [recommendation]
  implement:
    name: Implement
    instruction: Implement the fix.
    requires:
      output_matches: [{ path: triage.recommendation, equals: implement }]
      on_fail: skip
  report:
    name: Report
    instruction: Report on the repository.
    requires: { output_required: [input.repo, triage.recommendation] }
edges:
  - { from: triage, to: implement }
  - { from: implement, to: report }
",
    );
    mock.scenario(&json!([
        { "type": "reply", "text": "{\"recommendation\": \"skip\"}", "times": 1 },
    ]));
    let run = p.run("flow.yml", &[]);
    // `report` fails its pre-condition (no input named `repo`), so the run fails.
    assert_ne!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 1, "only triage asked its model");
    let mut tools = Llmock::tool_names(&bodies[0]);
    tools.retain(|name| name.starts_with("mcp__"));
    assert_eq!(tools, ["mcp__files__read_text_file"]);
    assert_eq!(run.stage_status("implement"), "skipped");
    let warnings = run.warnings();
    assert!(
        warnings.iter().any(|w| w.contains(
            "skipped: requires failed:\noutput_matches `triage.recommendation`: wanted equals \"implement\", got \"skip\""
        )),
        "{warnings:?}"
    );
    assert_eq!(run.stage_status("report"), "failed");
    let failed = run.events_named("StageFailed");
    let reason = failed[0].to_string();
    assert!(
        reason.contains("output_required `input.repo`: `repo` is missing"),
        "{reason}"
    );

    // Given the input, `report` runs.
    mock.scenario(&json!([
        { "type": "reply", "text": "{\"recommendation\": \"skip\"}", "times": 1 },
        { "type": "reply", "text": "Reported.", "times": 1 },
    ]));
    let p2 = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-sweny-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    p2.write("flow.yml", &p.read("flow.yml"));
    let run = p2.run("flow.yml", &["--input", "repo=acme/api"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stage_status("report"), "succeeded");
}

/// The filesystem MCP server from npm (`scripts/test-peers.sh`), if installed.
fn files_server() -> Option<std::path::PathBuf> {
    let server = trellis_test::cache_dir().join("mcp/node_modules/.bin/mcp-server-filesystem");
    if server.exists() {
        Some(server)
    } else {
        trellis_test::missing_peer(
            "@modelcontextprotocol/server-filesystem (scripts/test-peers.sh)",
        );
        None
    }
}

/// A project on `mock` with a notes file, the filesystem server as `files`, and `workflow`.
fn notes_project(mock: &Llmock, server: &Path, name: &str, workflow: &str) -> Project {
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-sweny-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    let root = p.path().canonicalize().unwrap();
    p.write(
        ".mcp.json",
        &json!({ "mcpServers": { "files": { "command": server, "args": [root] } } }).to_string(),
    );
    p.write("notes.md", "The login page times out: OFF-7.\n");
    p.write(name, workflow);
    p
}

/// The model's scripted call reading `notes.md` through the `files` server.
fn read_notes() -> Value {
    json!({ "type": "reply", "tool_calls": [
        { "name": "mcp__files__read_text_file", "arguments": { "path": "notes.md" } },
    ], "times": 1 })
}

/// An agent that must have searched before it answers: the node's `verify` names the tool as SWEny
/// names a skill's tools (`<server>_<tool>`), and checks the node's own output.
const VERIFIED: &str = r"id: verified
name: Verified
entry: investigate
nodes:
  investigate:
    name: Investigate
    instruction: Look for the notes, then name the issue.
    verify:
      any_tool_called: [files_read_text_file]
      no_tool_called: [shell]
      output_matches: [{ path: issue, matches: '^[A-Z]+-[0-9]+$' }]
    output:
      type: object
      properties: { issue: { type: string } }
      required: [issue]
edges: []
";

#[test]
fn verify_fails_a_node_whose_agent_skipped_the_tool_or_gave_a_bad_output() {
    let Some(server) = files_server() else { return };
    let Some(mock) = Llmock::start() else { return };
    let project = || notes_project(&mock, &server, "verified.yml", VERIFIED);
    let read = read_notes();

    // It read the notes (the server's real answer reached the model) and named the issue.
    let p = project();
    mock.scenario(
        &json!([read, { "type": "reply", "text": "{\"issue\": \"OFF-7\"}", "times": 1 }]),
    );
    let run = p.run("verified.yml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(
        mock.bodies()[1]
            .to_string()
            .contains("The login page times out: OFF-7."),
        "the model was shown the file"
    );

    // It answered without reading, and in the wrong shape: the node fails, saying both.
    let p = project();
    mock.scenario(&json!([{ "type": "reply", "text": "{\"issue\": \"off-7\"}", "times": 1 }]));
    let run = p.run("verified.yml", &[]);
    assert_ne!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stage_status("investigate"), "failed");
    let reason = run.events_named("StageFailed")[0].to_string();
    assert!(
        reason.contains(
            "verify failed:\\nany_tool_called: none of files_read_text_file answered without an error (no tool was called)\\noutput_matches `issue`: wanted matches /^[A-Z]+-[0-9]+$/, got \\\"off-7\\\""
        ),
        "{reason}"
    );

    // A read of a file that is not there answers with an error: it does not count either.
    let p = project();
    mock.scenario(&json!([
        { "type": "reply", "tool_calls": [
            { "name": "mcp__files__read_text_file", "arguments": { "path": "missing.md" } },
        ], "times": 1 },
        { "type": "reply", "text": "{\"issue\": \"OFF-7\"}", "times": 1 },
    ]));
    let run = p.run("verified.yml", &[]);
    assert_eq!(run.stage_status("investigate"), "failed");
    let reason = run.events_named("StageFailed")[0].to_string();
    assert!(
        reason.contains("(called: mcp__files__read_text_file)"),
        "{reason}"
    );
}

/// SWEny's `eval`: a function, a value and a judge evaluator, a retry that sends the agent back
/// with what failed, and a later node reading a verdict.
const EVALUATED: &str = r"id: evaluated
name: Evaluated
entry: investigate
nodes:
  investigate:
    name: Investigate
    instruction: Look for the notes, then name the issue.
    eval:
      - name: searched
        kind: function
        rule: { any_tool_called: [files_read_text_file] }
      - name: well_formed
        kind: value
        rule: { output_matches: [{ path: issue, matches: '^[A-Z]+-[0-9]+$' }] }
      - name: grounded
        kind: judge
        rubric: The issue named is one the notes mention.
    judge_model: claude-haiku-4-5
    retry: { max: 1, instruction: { reflect: Which step did you skip? } }
    output:
      type: object
      properties: { issue: { type: string } }
      required: [issue]
  report:
    name: Report
    instruction: Report the issue.
    requires:
      output_matches: [{ path: investigate.evals.grounded.pass, equals: true }]
edges:
  - { from: investigate, to: report }
";

#[test]
fn eval_checks_an_answer_sends_the_agent_back_and_a_judge_rules_on_its_rubric() {
    let Some(server) = files_server() else { return };
    let Some(mock) = Llmock::start() else { return };
    let project = || notes_project(&mock, &server, "evaluated.yml", EVALUATED);
    let read = read_notes();
    let reply = |text: &str| json!({ "type": "reply", "text": text, "times": 1 });
    let verdict = |word: &str| {
        reply(&json!({ "reasoning": "The notes name OFF-7.", "verdict": word }).to_string())
    };

    // The first answer skipped the notes and is lower case: sent back, told what failed; the
    // second passes, and `report` reads the judge's verdict.
    let p = project();
    mock.scenario(&json!([
        reply("{\"issue\": \"off-7\"}"),
        verdict("yes"),
        read,
        reply("{\"issue\": \"OFF-7\"}"),
        verdict("Yes"),
        reply("Reported."),
    ]));
    let run = p.run("evaluated.yml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 6);
    // The judge was shown the rubric and the answer, on its own model.
    let judge = bodies[1].to_string();
    assert_eq!(bodies[1]["model"], "claude-haiku-4-5");
    assert!(
        judge.contains("The issue named is one the notes mention."),
        "{judge}"
    );
    assert!(judge.contains(r#"\"issue\": \"off-7\""#), "{judge}");
    // The agent was sent back with every failure and the author's question.
    let sent_back = bodies[2]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .to_string();
    for part in [
        "did not pass this step's checks (attempt 1 of 2)",
        "eval failed (policy: all_pass):",
        "  - searched (function): any_tool_called: none of files_read_text_file answered without an error (no tool was called)",
        "  - well_formed (value): output_matches `issue`: wanted matches /^[A-Z]+-[0-9]+$/, got \\\"off-7\\\"",
        "Which step did you skip?",
    ] {
        assert!(sent_back.contains(part), "{part}: {sent_back}");
    }
    assert!(
        !sent_back.contains("grounded"),
        "the judge passed: {sent_back}"
    );
    assert!(
        bodies[3]
            .to_string()
            .contains("The login page times out: OFF-7.")
    );
    let evals = run_support::read_json(
        &run_support::stage_dir(&run.record(), "investigate").join("evals.json"),
    );
    assert_eq!(evals["grounded"]["pass"], true);
    assert_eq!(evals["grounded"]["model"]["model"], "claude-haiku-4-5");
    assert_eq!(evals["searched"]["pass"], true);
    assert!(evals["searched"].get("model").is_none());
    assert_eq!(run.stage_status("report"), "succeeded");

    // A judge that says no, twice: the node fails, saying why.
    let p = project();
    mock.scenario(&json!([
        read,
        reply("{\"issue\": \"OFF-7\"}"),
        verdict("no"),
        reply("{\"issue\": \"OFF-7\"}"),
        verdict("no"),
    ]));
    let run = p.run("evaluated.yml", &[]);
    assert_ne!(run.code(), Some(0));
    assert_eq!(run.stage_status("investigate"), "failed");
    let reason = run.events_named("StageFailed")[0].to_string();
    assert!(
        reason.contains(
            "eval failed (policy: all_pass):\\n  - grounded (judge): the judge said `no`, not `yes`: The notes name OFF-7."
        ),
        "{reason}"
    );
    assert!(
        run.warnings()
            .iter()
            .any(|w| w.starts_with("investigate: checks failed; sent back (1 of 1)")),
        "{:?}",
        run.warnings()
    );
}

#[test]
fn a_workflows_inline_skill_reaches_the_nodes_naming_it() {
    let Some(mock) = Llmock::start() else { return };
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-sweny-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    p.write(
        "postmortem.yml",
        r"id: postmortem
name: Postmortem
entry: draft
skills:
  sre-rubric:
    name: SRE rubric
    instruction: Score completeness, root cause depth and action items from 1 to 5.
nodes:
  draft:
    name: Draft
    instruction: Write the postmortem.
    skills: [sre-rubric]
edges: []
",
    );
    let out = p
        .command(&["validate", "--format", "json", "postmortem.yml"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{report}");
    assert_eq!(report["files"][0]["diagnostics"], json!([]), "{report}");
    mock.scenario(&json!([{ "type": "reply", "text": "Drafted.", "times": 1 }]));
    let run = p.run("postmortem.yml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let body = &mock.bodies()[0];
    let prompt = body["messages"][0].to_string();
    assert!(
        prompt.contains("## Skill: sre-rubric") && prompt.contains("Score completeness"),
        "{prompt}"
    );
    assert!(
        body["system"]
            .to_string()
            .contains("`sre-rubric`: SRE rubric"),
        "{}",
        body["system"]
    );

    // An inline skill without instructions is a validation error.
    p.write(
        "bad.yml",
        "id: bad\nname: Bad\nentry: a\nskills:\n  empty: { name: Empty }\nnodes:\n  a: { name: A, instruction: Go. }\nedges: []\n",
    );
    let out = p.command(&["validate", "bad.yml"]).output().unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("skill `empty` needs a non-empty `instruction`"),
        "{text}"
    );
}
