//! Prompt nodes end to end through the real `trellis` binary, with llmock standing in for Anthropic's
//! API: scripted answers drive routing directives, structured output and its repair turns, shared
//! conversation threads, prompted fan-ins and model-judged `when` edges; faults drive retries.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use run_support::{Project, Run};
use serde_json::{Value, json};
use trellis_test::Llmock;

const KEY: &str = "sk-ant-test-NEVER-IN-THE-RECORD-7f3a";

fn project(mock: &Llmock) -> Project {
    Project::new()
        .with_env("ANTHROPIC_API_KEY", KEY)
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
}

fn replies(mock: &Llmock, texts: &[&str]) {
    let behaviors: Vec<Value> = texts
        .iter()
        .map(|t| json!({ "type": "reply", "text": t, "times": 1 }))
        .collect();
    mock.scenario(&Value::Array(behaviors));
}

fn workflow(body: &str) -> String {
    format!(
        "digraph W {{\n graph [goal=\"Ship the feature\"]\n start [shape=Mdiamond]\n exit [shape=Msquare]\n {body}\n}}\n"
    )
}

fn stage_file(run: &Run, stage_dir: &str, name: &str) -> String {
    std::fs::read_to_string(run.record().join("stages").join(stage_dir).join(name))
        .unwrap_or_else(|e| panic!("{stage_dir}/{name}: {e}"))
}

/// Every file of the run record, as text, for leak checks.
fn record_text(run: &Run) -> String {
    let mut all = String::new();
    for entry in walk(&run.record()) {
        all.push_str(&String::from_utf8_lossy(&std::fs::read(entry).unwrap()));
    }
    all
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn a_routing_directive_picks_the_edge_and_updates_the_context() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &workflow(
            "review [shape=tab, prompt=\"Review the change\", model=\"sonnet\"]\n \
             fix [shape=parallelogram, script=\"echo fixing\"]\n approve [shape=parallelogram, script=\"echo approved\"]\n \
             start -> review\n review -> approve [label=\"Approve\"]\n review -> fix [label=\"Fix\"]\n fix -> exit\n approve -> exit",
        ),
    );
    replies(
        &mock,
        &[
            "Coverage is too low.\n\n{\"preferred_next_label\": \"fix\", \"context_updates\": {\"coverage\": 72}}",
        ],
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.stages(), ["start", "review", "fix", "exit"]);
    assert_eq!(run.context("coverage"), 72);
    assert_eq!(run.context("last_stage"), "review");
    assert!(
        run.context("response.review")
            .as_str()
            .unwrap()
            .starts_with("Coverage is too low.")
    );
    assert_eq!(
        run.context("last_response"),
        run.context("response.review"),
        "short answers are kept whole"
    );
    // The stage files: the assembled prompt (preamble first), the response, and the status with usage.
    let prompt = stage_file(&run, "002-review@1", "prompt.md");
    assert!(
        prompt.starts_with("Goal: Ship the feature") && prompt.ends_with("Review the change"),
        "{prompt}"
    );
    assert!(
        stage_file(&run, "002-review@1", "response.md")
            .contains("\"preferred_next_label\": \"fix\"")
    );
    let status: Value =
        serde_json::from_str(&stage_file(&run, "002-review@1", "status.json")).unwrap();
    assert_eq!(status["model"], "claude-sonnet-4-5");
    assert_eq!(status["provider"], "anthropic");
    assert_eq!(status["preferred_label"], "fix");
    assert!(
        status["usage"]["output_tokens"].as_u64().unwrap() > 0,
        "{status}"
    );
    // The model's request: the catalog id for the alias, the prompt as the user message.
    let body = &mock.bodies()[0];
    assert_eq!(body["model"], "claude-sonnet-4-5");
    assert!(
        body["messages"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .ends_with("Review the change")
    );
    let events = run.events_named("ModelCallCompleted");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["node_id"], "review");
    assert!(
        !record_text(&run).contains(KEY),
        "the API key leaked into the run record"
    );
    // `trellis show` lists the model and its tokens by stage, and the run's total.
    let run_id = run.summary["run_id"].as_str().unwrap();
    let show = p.command(&["show", run_id]).output().unwrap();
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.contains("  claude-sonnet-4-5, ") && show.contains("  tokens: "),
        "{show}"
    );
}

#[test]
fn a_custom_output_schema_is_repaired_in_the_same_conversation() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "schemas/audit.json",
        r#"{"type": "object", "required": ["verdict", "score"], "properties": {"verdict": {"enum": ["approve", "reject"]}, "score": {"type": "integer", "minimum": 0, "maximum": 10}}}"#,
    );
    p.write(
        "w.fabro",
        &workflow("audit [shape=tab, prompt=\"Audit the change\", output_schema=\"@schemas/audit.json\"]\n start -> audit -> exit"),
    );
    replies(
        &mock,
        &[
            "{\"verdict\": \"maybe\", \"score\": 12}",
            "Fixed: {\"verdict\": \"approve\", \"score\": 8}",
        ],
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        run.context("output.audit"),
        json!({ "verdict": "approve", "score": 8 })
    );
    assert!(
        run.context("response.audit")
            .as_str()
            .unwrap()
            .starts_with("Fixed:")
    );
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2);
    let repair = bodies[1]["messages"].as_array().unwrap();
    assert_eq!(
        repair.len(),
        3,
        "prompt, invalid answer, corrective message: {repair:?}"
    );
    assert_eq!(repair[1]["role"], "assistant");
    let corrective = repair[2]["content"][0]["text"].as_str().unwrap();
    assert!(
        corrective.contains("/verdict") && corrective.contains("/score"),
        "{corrective}"
    );
    // The schema is shown to the model with the prompt.
    let prompt = stage_file(&run, "002-audit@1", "prompt.md");
    assert!(
        prompt.contains("It must be valid against this JSON Schema")
            && prompt.contains("\"verdict\": \"approve\""),
        "{prompt}"
    );
    assert!(stage_file(&run, "002-audit@1", "repairs.md").contains("\"maybe\""));
    let status: Value =
        serde_json::from_str(&stage_file(&run, "002-audit@1", "status.json")).unwrap();
    assert_eq!(status["repairs"], 1);
    assert_eq!(status["turns"], 2);
}

#[test]
fn output_that_stays_invalid_fails_the_node_after_its_repair_turns() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &workflow(
            "review [shape=tab, prompt=\"Review\", output_schema=\"routing\", output_retries=1]\n \
             handle [shape=parallelogram, script=\"echo handled\"]\n \
             start -> review\n review -> exit [condition=\"outcome=success\"]\n review -> handle [condition=\"outcome=fail\"]\n handle -> exit",
        ),
    );
    replies(
        &mock,
        &["{\"outcome\": 5}", "{\"suggested_next_ids\": \"exit\"}"],
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "review", "handle", "exit"]);
    let reason = run.context("failure_reason");
    assert!(
        reason.as_str().unwrap().starts_with("output schema validation failed after 1 repair attempt(s): `suggested_next_ids` must be a list"),
        "{reason}"
    );
    assert_eq!(
        mock.requests().len(),
        2,
        "one answer and one repair turn, no node retries"
    );
}

#[test]
fn full_fidelity_nodes_with_one_thread_share_the_conversation() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &workflow(
            "plan [shape=tab, prompt=\"Plan it\", fidelity=\"full\", thread_id=\"impl\"]\n \
             build [shape=tab, prompt=\"Build it\", fidelity=\"full\", thread_id=\"impl\"]\n \
             check [shape=tab, prompt=\"Check it\"]\n \
             start -> plan -> build -> check -> exit",
        ),
    );
    replies(&mock, &["PLAN-ANSWER", "BUILD-ANSWER", "CHECK-ANSWER"]);
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    let texts = |b: &Value| -> Vec<String> {
        b["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(
        texts(&bodies[1])[1..],
        ["PLAN-ANSWER".to_owned(), "Build it".to_owned()]
    );
    assert!(texts(&bodies[1])[0].ends_with("Plan it"));
    // A compact node gets a fresh conversation with the preamble of what came before.
    let check = texts(&bodies[2]);
    assert_eq!(check.len(), 1);
    assert!(
        check[0].contains("- **plan**: succeeded") && check[0].contains("BUILD-ANSWER"),
        "{}",
        check[0]
    );
    assert_eq!(run.context("internal.fidelity"), "compact");
}

#[test]
fn a_fan_in_with_a_prompt_takes_the_branch_the_model_picks() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &workflow(
            "fan [shape=component]\n a [shape=parallelogram, script=\"echo a\"]\n b [shape=parallelogram, script=\"echo b\"]\n \
             join [shape=tripleoctagon, prompt=\"Pick the branch with the best output\"]\n \
             start -> fan\n fan -> a\n fan -> b\n a -> join\n b -> join\n join -> exit",
        ),
    );
    replies(
        &mock,
        &[
            "Branch b is more thorough. {\"best_id\": \"nope\"}",
            "{\"best_id\": \"b\", \"reason\": \"thorough\"}",
        ],
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.context("parallel.fan_in.best_id"), "b");
    assert_eq!(run.context("parallel.fan_in.best_outcome"), "succeeded");
    let prompt = std::fs::read_to_string(
        std::fs::read_dir(run.record().join("stages"))
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().contains("join"))
            .unwrap()
            .path()
            .join("prompt.md"),
    )
    .unwrap();
    assert!(
        prompt.contains("### a (succeeded)") && prompt.contains("### b (succeeded)"),
        "{prompt}"
    );
}

#[test]
fn when_edges_are_judged_by_the_model() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.yaml",
        "entry: a\nnodes:\n  a: { type: command, script: echo tests failed }\n  b: { type: command, script: echo b }\n  c: { type: command, script: echo c }\n\
         edges:\n  - { from: a, to: b, when: the tests passed }\n  - { from: a, to: c, when: the tests failed }\n",
    );
    replies(&mock, &["{\"choice\": 2}"]);
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.stages(), ["a", "c"]);
    let prompt = mock.bodies()[0]["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        prompt.contains("- `b`: the tests passed\n- `c`: the tests failed"),
        "{prompt}"
    );
}

#[test]
fn rate_limits_are_retried_and_reported_as_events() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &workflow("ask [shape=tab, prompt=\"Hi\"]\n start -> ask -> exit"),
    );
    mock.scenario(&json!([
        { "type": "fail", "status": 429, "retry_after": 0.2, "times": 1 },
        { "type": "reply", "text": "hello", "times": 1 }
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.context("response.ask"), "hello");
    let retrying = run.events_named("ModelCallRetrying");
    assert_eq!(retrying.len(), 1);
    assert_eq!(retrying[0]["kind"], "rate_limit");
    assert!(retrying[0]["delay_ms"].as_u64().unwrap() >= 200);
}

/// A stream that breaks after the answer began is not the client's to retry (its text was shown):
/// the agent asks the same turn again, with the same conversation, up to three times.
#[test]
fn a_turn_whose_stream_breaks_part_way_is_asked_again_with_the_same_conversation() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &workflow("fix [prompt=\"Tell me a long story about a river\", model=\"sonnet\", max_retries=0]\n start -> fix -> exit"),
    );
    let story = "Once upon a time a river ran down from the hills, past the mill and the bridge, "
        .repeat(4);
    // The first answer breaks after six chunks; the turn asked again gets the second.
    mock.scenario(&json!([
        { "type": "reply", "text": story, "times": 1 },
        { "type": "stream_fault", "kind": "disconnect", "after_chunks": 6, "times": 1 },
        { "type": "reply", "text": "A river ran.", "times": 1 },
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0], bodies[1], "the turn was asked again as it was");
    let retrying = run.events_named("ModelCallRetrying");
    assert_eq!(retrying.len(), 1, "{retrying:?}");
    assert_eq!(retrying[0]["kind"], "network");
    assert_eq!(retrying[0]["attempt"], 2);
    assert!(
        retrying[0]["error"]
            .as_str()
            .unwrap()
            .ends_with("(after part of the answer had streamed)"),
        "{retrying:?}"
    );
    assert_eq!(run.context("response.fix"), "A river ran.");

    // A stream that keeps breaking fails the stage after three turn retries, as a transient
    // failure (the edge then leads on).
    mock.reset();
    mock.scenario(&json!([
        { "type": "reply", "text": story, "times": 4 },
        { "type": "stream_fault", "kind": "disconnect", "after_chunks": 6, "times": 4 },
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.events_named("StageFailed").len(), 1);
    assert_eq!(mock.bodies().len(), 4);
    assert_eq!(run.events_named("ModelCallRetrying").len(), 3);
    assert_eq!(run.context("failure_class"), "transient");
}

#[test]
fn provider_errors_fail_the_stage_clearly_without_the_key() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &workflow("ask [shape=tab, prompt=\"Hi\", max_retries=0]\n start -> ask -> exit"),
    );
    mock.scenario(&json!([{ "type": "fail", "status": 401, "times": 1 }]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(1));
    let error = run.summary["error"].as_str().unwrap();
    assert!(
        error.contains("auth error from anthropic (HTTP 401)"),
        "{error}"
    );
    assert!(!record_text(&run).contains(KEY));
    assert!(!run.stderr().contains(KEY));
    // A model whose provider has no key stops the run with what to set.
    p.write(
        "other.fabro",
        &workflow("ask [shape=tab, prompt=\"Hi\", model=\"gpt-5\"]\n start -> ask -> exit"),
    );
    let run = p.run("other.fabro", &[]);
    assert_eq!(run.code(), Some(1));
    assert!(
        run.summary["error"].as_str().unwrap().contains(
            "provider `openai` is not configured (needed by model `gpt-5`): set OPENAI_API_KEY"
        ),
        "{}",
        run.summary
    );
}

#[test]
fn resume_degrades_full_fidelity_to_a_detailed_summary_for_the_first_node() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.fabro",
        &workflow(
            "plan [shape=tab, prompt=\"Plan it\", fidelity=\"full\", thread_id=\"impl\"]\n \
             build [shape=tab, prompt=\"Build it\", fidelity=\"full\", thread_id=\"impl\", model=\"haiku\"]\n \
             start -> plan -> build -> exit",
        ),
    );
    // The second call (the only one to haiku) hangs long enough for the run to be killed in the middle of it.
    mock.scenario(&json!([
        { "type": "reply", "text": "PLAN-ANSWER", "times": 1 },
        { "type": "delay", "seconds": 30, "times": 1, "match": { "model": "claude-haiku-4-5" } }
    ]));
    let mut child = p.spawn_run("w.fabro");
    p.wait_for_event("ModelCallStarted", "build");
    child.kill().unwrap();
    child.wait().unwrap();
    mock.reset();
    replies(&mock, &["BUILD-ANSWER"]);
    let id = p
        .only_run()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let run = p.resume(&id, &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 1);
    let messages = bodies[0]["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        1,
        "the thread died with the process: {messages:?}"
    );
    let text = messages[0]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("### plan (succeeded)")
            && text.contains("PLAN-ANSWER")
            && text.ends_with("Build it"),
        "{text}"
    );
    let mut build_dirs: Vec<String> = std::fs::read_dir(run.record().join("stages"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("build"))
        .collect();
    build_dirs.sort();
    assert_eq!(
        build_dirs,
        ["003-build@1", "003-build@1.interrupted-1"],
        "the killed attempt keeps its directory"
    );
    let status: Value =
        serde_json::from_str(&stage_file(&run, &build_dirs[0], "status.json")).unwrap();
    assert_eq!(status["fidelity"], "summary:high");
}

#[test]
fn project_memory_is_the_system_prompt_and_edge_fidelity_wins() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("AGENTS.md", "Always answer in French.\n");
    p.write(
        "w.fabro",
        &workflow(
            "graph [default_fidelity=\"summary:low\"]\n \
             first [shape=tab, prompt=\"One\"]\n \
             second [shape=tab, prompt=\"Two\", fidelity=\"compact\"]\n \
             third [shape=tab, prompt=\"Three\", project_memory=false]\n \
             start -> first\n first -> second [fidelity=\"truncate\"]\n second -> third -> exit",
        ),
    );
    replies(&mock, &["UN", "DEUX", "TROIS"]);
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    let text = |i: usize| {
        bodies[i]["messages"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        bodies[0]["system"],
        "# AGENTS.md\n\nAlways answer in French."
    );
    assert!(
        bodies[2].get("system").is_none(),
        "project_memory=false sends no system prompt"
    );
    // The edge's truncate beats the node's compact: goal and run id only.
    let run_id = run.summary["run_id"].as_str().unwrap();
    assert_eq!(
        text(1),
        format!("Goal: Ship the feature\nRun: {run_id}\n\nTwo")
    );
    // The graph default applies where neither edge nor node says: outcomes only.
    assert!(
        text(2).contains("- **first**: succeeded\n- **second**: succeeded")
            && !text(2).contains("DEUX"),
        "{}",
        text(2)
    );
}

#[test]
fn the_stylesheet_picks_models_and_prompts_come_from_files() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("prompts/draft.md", "Draft the release notes for $goal.\n");
    p.write(
        "w.fabro",
        "digraph W {\n graph [goal=\"version 2\", model_stylesheet=\"* { model: claude-haiku-4-5; } #polish { model: claude-opus-4-5; reasoning_effort: low; }\"]\n \
         start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         draft [shape=tab, prompt=\"@prompts/draft.md\", max_tokens=100]\n polish [shape=tab, prompt=\"Polish it\", max_tokens=4096]\n \
         start -> draft -> polish -> exit\n}\n",
    );
    replies(&mock, &["DRAFT", "POLISHED"]);
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(bodies[0]["model"], "claude-haiku-4-5");
    assert_eq!(bodies[0]["max_tokens"], 100);
    let draft = bodies[0]["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        draft.ends_with("Draft the release notes for version 2.\n"),
        "{draft}"
    );
    assert_eq!(bodies[1]["model"], "claude-opus-4-5");
    // Low effort on a reasoning model: a quarter of the output budget for thinking.
    assert_eq!(bodies[1]["thinking"]["budget_tokens"], 1024);
}
