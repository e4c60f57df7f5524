//! Skills through the real `trellis` binary, with llmock as the model: discovered from the project's
//! skill directories, listed in the system prompt with a `use_skill` tool, expanded from `/name` in
//! a prompt, and made part of a node's prompt by `skills=`; a missing skill or variable keeps the
//! node from starting with a message naming them. The checks are on what the model was sent.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;

use run_support::Project;
use serde_json::{Value, json};
use trellis_test::Llmock;

fn project(mock: &Llmock) -> Project {
    let p = Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-skills-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    p.write(
        ".claude/skills/review/SKILL.md",
        "---\nname: review\ndescription: Review code for bugs\n---\n\nReview {{user_input}} line by line and list every bug.\n",
    );
    p.write(
        ".fabro/skills/commit/SKILL.md",
        "---\nname: commit\ndescription: Write a commit message\n---\nWrite the subject in the imperative, under 50 characters.\n",
    );
    p.write(
        "skills/deploy/SKILL.md",
        "---\nname: deploy\ndescription: Deploy the service\nconfig:\n  DEPLOY_TOKEN_FOR_TEST:\n    description: The deploy key\n    required: true\n---\nDeploy it.\n",
    );
    p
}

fn agent(attrs: &str, prompt: &str) -> String {
    format!(
        "digraph W {{\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"{prompt}\", model=\"sonnet\"{attrs}]\n start -> fix -> exit\n}}\n"
    )
}

/// The text of the system prompt of a request body (Anthropic: a string or text blocks).
fn system_of(body: &Value) -> String {
    match &body["system"] {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[test]
fn skills_are_listed_loaded_expanded_and_named_by_a_node() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &agent(", skills=\"commit\"", "/review the parser please"),
    );
    mock.scenario(&json!([
        { "type": "reply", "tool_calls": [{ "name": "use_skill", "arguments": { "skill_name": "review" } }], "times": 1 },
        { "type": "reply", "text": "No bugs found.", "times": 1 },
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    let system = system_of(&bodies[0]);
    assert!(system.contains("# Available Skills"), "{system}");
    assert!(
        system.contains("- `review`: Review code for bugs"),
        "{system}"
    );
    assert!(
        system.contains("- `commit`: Write a commit message"),
        "{system}"
    );
    let tools = bodies[0]["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t["name"] == "use_skill"), "{tools:?}");
    // The prompt: the named skill's instructions, then the expanded `/review`.
    let prompt = bodies[0]["messages"][0].to_string();
    assert!(
        prompt.contains("## Skill: commit")
            && prompt.contains("Write the subject in the imperative"),
        "{prompt}"
    );
    assert!(
        prompt.contains("Review the parser please line by line and list every bug."),
        "{prompt}"
    );
    assert!(!prompt.contains("/review"), "{prompt}");
    // `use_skill` answered with the skill's text.
    let results = Llmock::tool_results(&bodies[1]);
    assert_eq!(
        results[0]["content"],
        "Review {{user_input}} line by line and list every bug."
    );
}

#[test]
fn a_missing_skill_or_variable_stops_the_run_before_it_starts() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"Ship it\", model=\"sonnet\", skills=\"deploy,triage\"]\n check [prompt=\"Check\", model=\"sonnet\", skills=\"review\"]\n start -> fix -> check -> exit\n}\n",
    );
    mock.scenario(&json!([{ "type": "reply", "text": "never asked", "times": 1 }]));
    let out = p.command(&["run", "w.fabro"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the run cannot start"), "{stderr}");
    assert!(
        stderr.contains("node `fix`: no skill named `triage`"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "`deploy` needs environment variables that are not set: DEPLOY_TOKEN_FOR_TEST"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("node `check`"), "{stderr}");
    assert!(!p.run_exists(), "nothing started");
    assert!(mock.bodies().is_empty(), "the model was never called");
    // With the variable set and the missing skill dropped, it runs.
    p.write(
        "ok.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"Ship it\", model=\"sonnet\", skills=\"deploy\"]\n start -> fix -> exit\n}\n",
    );
    let out = p
        .command(&["run", "ok.fabro"])
        .env("DEPLOY_TOKEN_FOR_TEST", "set")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        mock.bodies()[0]["messages"][0]
            .to_string()
            .contains("## Skill: deploy")
    );
}

/// `validate --preflight` says what `trellis run` would find missing before its first stage (SWEny's
/// pre-flight), without running anything: a skill that is not there, a variable not set; a server a
/// run file configures counts as the skill of its name, as it does for the run.
#[test]
fn validate_preflight_says_what_this_machine_lacks() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.fabro", &agent(", skills=\"deploy,triage\"", "Ship it"));
    let out = p
        .command(&["validate", "--preflight", "w.fabro"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains(
            "w.fabro: valid\nw.fabro: cannot start here:\n  node `fix`: no skill named `triage`"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("DEPLOY_TOKEN_FOR_TEST"), "{stdout}");
    let out = p
        .command(&["validate", "--preflight", "--format", "json", "w.fabro"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let preflight = &report["files"][0]["preflight"];
    assert_eq!(preflight["ready"], false, "{report}");
    assert!(
        preflight["problems"][0]
            .as_str()
            .unwrap()
            .starts_with("node `fix`: "),
        "{report}"
    );
    // Without the flag nothing is asked of the machine.
    let out = p.command(&["validate", "w.fabro"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));

    // The variable set, the missing skill named by a run file's server instead: ready.
    p.write(
        "run.toml",
        "_version = 1\n[workflow]\ngraph = \"w.fabro\"\n[run.agent.mcps.triage]\ntype = \"stdio\"\ncommand = [\"triage-server\"]\n",
    );
    let out = p
        .command(&["validate", "--preflight", "run.toml"])
        .env("DEPLOY_TOKEN_FOR_TEST", "set")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("w.fabro: ready to run here"), "{stdout}");
    assert!(mock.bodies().is_empty(), "the model was never called");
    assert!(!p.run_exists(), "nothing started");
}
