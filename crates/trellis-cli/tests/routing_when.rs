//! Natural-language `when` routing end to end, as the edges-and-routing page says, with llmock as the
//! router's model: what the model is asked (the choices, the route-eval view, the answer schema) is read
//! back from llmock's request log, what it decided from the events and `status.json`.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;

use std::time::Duration;

use run_support::{Project, read_json, stage_dir, wait_for};
use serde_json::{Value, json};
use trellis_test::Llmock;

fn project(mock: &Llmock) -> Project {
    Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
}

fn replies(mock: &Llmock, texts: &[&str]) {
    let behaviors: Vec<Value> = texts
        .iter()
        .map(|t| json!({ "type": "reply", "text": t, "times": 1 }))
        .collect();
    mock.scenario(&Value::Array(behaviors));
}

fn answer(choice: &str, reason: &str) -> String {
    json!({ "reason": reason, "choice": choice }).to_string()
}

/// The router requests llmock received (those with the `route` answer tool).
fn router_requests(mock: &Llmock) -> Vec<Value> {
    mock.requests()
        .into_iter()
        .map(|r| r["body"].clone())
        .filter(|b| b["tool_choice"]["name"] == "route")
        .collect()
}

/// The choices a router request allowed.
fn allowed(request: &Value) -> Vec<String> {
    let tool = request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "route")
        .unwrap();
    tool["input_schema"]["properties"]["choice"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

fn prompt_of(request: &Value) -> String {
    request["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The JSON view the router was shown (the block between the code fences of its prompt).
fn view_of(request: &Value) -> Value {
    let prompt = prompt_of(request);
    let start = prompt.find("```json\n").unwrap() + 8;
    let end = start + prompt[start..].find("\n```").unwrap();
    serde_json::from_str(&prompt[start..end]).unwrap()
}

const BRANCH: &str = "entry: check\nnodes:\n  check: { type: command, script: echo tests failed }\n  ship: { type: command, script: echo shipped }\n  fix: { type: command, script: echo fixing }\nedges:\n  - { from: check, to: ship, when: the tests passed }\n  - { from: check, to: fix, when: the tests failed }\n";

#[test]
fn one_unconditional_edge_is_followed_without_asking_a_model_and_a_node_without_edges_ends_the_run()
{
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.yaml",
        "entry: a\nnodes:\n  a: { type: command, script: echo a }\n  b: { type: command, script: echo b }\nedges:\n  - { from: a, to: b }\n",
    );
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        run.stages(),
        ["a", "b"],
        "b, with no edges out, is terminal"
    );
    assert!(mock.requests().is_empty(), "no model was asked");
    assert!(
        run.events_named("EdgeSelected")[0]
            .get("decision")
            .is_none()
    );
}

#[test]
fn the_models_choice_is_followed_and_recorded_with_its_reason() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.yaml", BRANCH);
    replies(&mock, &[&answer("fix", "the output says the tests failed")]);
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.stages(), ["check", "fix"]);
    let requests = router_requests(&mock);
    assert_eq!(requests.len(), 1);
    assert_eq!(
        allowed(&requests[0]),
        ["ship", "fix"],
        "no default: none of the above is not offered"
    );
    let prompt = prompt_of(&requests[0]);
    assert!(
        prompt.contains("- `ship`: the tests passed\n- `fix`: the tests failed"),
        "{prompt}"
    );
    assert_eq!(
        view_of(&requests[0])["context"]["command.output"],
        "tests failed\n"
    );

    let edge = &run.events_named("EdgeSelected")[0];
    assert_eq!(edge["to"], "fix");
    assert_eq!(edge["decision"]["answer"], "fix");
    assert_eq!(
        edge["decision"]["reason"],
        "the output says the tests failed"
    );
    assert_eq!(
        edge["decision"]["choices"][1],
        json!({ "id": "fix", "target": "fix", "when": "the tests failed" })
    );
    assert!(edge["router"]["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let status = read_json(&stage_dir(&run.record(), "check").join("status.json"));
    assert_eq!(status["routing"]["decision"], edge["decision"]);
    assert_eq!(status["routing"]["to"], "fix");
    let kept = std::fs::read_to_string(stage_dir(&run.record(), "check").join("router.prompt.md"))
        .unwrap();
    assert_eq!(kept, prompt);
    let answered =
        std::fs::read_to_string(stage_dir(&run.record(), "check").join("router.response.md"))
            .unwrap();
    assert!(answered.contains("\"choice\":\"fix\""), "{answered}");
}

#[test]
fn an_answer_that_names_no_choice_takes_the_default_edge() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.yaml",
        &format!("{BRANCH}  - {{ from: check, to: report }}\n").replace(
            "edges:",
            "  report: { type: command, script: echo reported }\nedges:",
        ),
    );
    replies(
        &mock,
        &["{\"highest_severity\": \"low\", \"novel_count\": 0}"],
    );
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.stages(), ["check", "report"]);
    assert_eq!(
        allowed(&router_requests(&mock)[0]),
        ["ship", "fix", "none_of_the_above"]
    );
    let edge = &run.events_named("EdgeSelected")[0];
    assert_eq!(edge["decision"]["default"], "report");
    assert!(
        edge["decision"]["answer"]
            .as_str()
            .unwrap()
            .contains("highest_severity")
    );
}

#[test]
fn an_answer_that_names_no_choice_without_a_default_stops_the_run_naming_node_and_answer() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write("w.yaml", BRANCH);
    replies(&mock, &[&answer("banana", "no idea")]);
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(1), "{}", run.summary);
    let error = run.summary["error"].as_str().unwrap();
    assert!(error.contains("`check`"), "{error}");
    assert!(error.contains("`banana`"), "{error}");
    assert!(error.contains("ship, fix"), "{error}");
    assert_eq!(run.stages(), ["check"]);
}

#[test]
fn an_exhausted_edge_is_no_longer_offered() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.yaml",
        "entry: work\nnodes:\n  work: { type: command, script: echo work }\n  again: { type: command, script: echo again }\n  done: { type: command, script: echo done }\nedges:\n  - { from: work, to: again, when: more work is needed, max_iterations: 1 }\n  - { from: work, to: done, when: the work is finished }\n  - { from: again, to: work }\n",
    );
    replies(
        &mock,
        &[&answer("again", "more"), &answer("done", "finished")],
    );
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.stages(), ["work", "again", "work", "done"]);
    let requests = router_requests(&mock);
    assert_eq!(allowed(&requests[0]), ["again", "done"]);
    assert_eq!(
        allowed(&requests[1]),
        ["done"],
        "the spent edge is excluded"
    );
}

#[test]
fn the_router_sees_a_schema_nodes_declared_keys_only() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    p.write(
        "w.yaml",
        "entry: investigate\ninputs:\n  repo: { type: string, default: acme/api }\nnodes:\n  investigate:\n    instruction: Investigate the new reports.\n    output:\n      type: object\n      properties:\n        novel_count: { type: integer }\n        highest_severity: { type: string }\n  file: { type: command, script: echo filed }\n  skip: { type: command, script: echo skipped }\nedges:\n  - { from: investigate, to: file, when: novel_count is greater than 0 }\n  - { from: investigate, to: skip, when: novel_count is 0 }\n",
    );
    replies(
        &mock,
        &[
            "{\"novel_count\": 2, \"summary\": \"I read every report carefully and I feel strongly we should skip\"}",
            &answer("file", "two novel reports"),
        ],
    );
    let run = p.run("w.yaml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.stages(), ["investigate", "file"]);
    let request = &router_requests(&mock)[0];
    let view = view_of(request);
    assert_eq!(
        view["results"],
        json!({ "investigate": { "novel_count": 2, "highest_severity": null } }),
        "declared keys only, a missing one as null"
    );
    assert_eq!(view["input"], json!({ "repo": "acme/api" }));
    let prompt = prompt_of(request);
    assert!(
        !prompt.contains("feel strongly"),
        "prose never reaches the router: {prompt}"
    );
    // Later prompts still see everything.
    assert_eq!(
        run.context("output.investigate")["summary"],
        "I read every report carefully and I feel strongly we should skip"
    );
}

#[test]
fn a_bounded_retry_loop_killed_mid_run_keeps_its_counts_when_resumed() {
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    // The second test run hangs the first time, so the run can be killed there.
    p.write(
        "w.yaml",
        "entry: implement\nnodes:\n  implement: { type: command, script: echo implemented >> implement.log }\n  test:\n    type: command\n    script: |\n      n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count\n      if [ $n -eq 2 ] && [ ! -f resumed ]; then sleep 60; fi\n      echo tests failed\n  done: { type: command, script: echo done }\nedges:\n  - { from: implement, to: test }\n  - { from: test, to: implement, when: tests failed, max_iterations: 3 }\n  - { from: test, to: done, when: all tests passed }\n",
    );
    replies(
        &mock,
        &[
            &answer("implement", "failed"),
            &answer("implement", "failed"),
            &answer("implement", "failed"),
            &answer("done", "only choice"),
        ],
    );
    let mut child = p.spawn_run("w.yaml");
    wait_for("the second test run", Duration::from_secs(30), || {
        p.read("count").trim() == "2"
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        router_requests(&mock).len(),
        1,
        "one decision before the kill"
    );
    p.write("resumed", "");
    let id = p
        .only_run()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let run = p.resume(&id, &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(
        p.read("implement.log").lines().count(),
        4,
        "the first implement and three loops, no more"
    );
    let requests = router_requests(&mock);
    assert_eq!(requests.len(), 4);
    assert_eq!(allowed(&requests[2]), ["implement", "done"]);
    assert_eq!(
        allowed(&requests[3]),
        ["done"],
        "the third loop spent the edge, across the resume"
    );
    let checkpoint = run.checkpoint();
    assert_eq!(checkpoint["status"], "succeeded");
}

#[test]
fn each_provider_is_asked_for_a_constrained_answer_and_router_model_picks_the_model() {
    let Some(mock) = Llmock::start() else { return };
    let cases: [(&str, &str, &str); 4] = [
        ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "/anthropic"),
        ("OPENAI_API_KEY", "OPENAI_BASE_URL", "/v1"),
        ("GEMINI_API_KEY", "GEMINI_BASE_URL", "/gemini"),
        (
            "OPENAI_COMPATIBLE_API_KEY",
            "OPENAI_COMPATIBLE_BASE_URL",
            "/v1",
        ),
    ];
    for (key, base, path) in cases {
        mock.reset();
        let p = Project::new()
            .with_env(key, "sk-test")
            .with_env(base, &mock.url(path));
        let flow = if key == "ANTHROPIC_API_KEY" {
            format!("router_model: claude-haiku-4-5\n{BRANCH}")
        } else {
            BRANCH.to_owned()
        };
        p.write("w.yaml", &flow);
        replies(&mock, &[&answer("fix", "failed")]);
        let run = p.run("w.yaml", &[]);
        assert_eq!(
            run.code(),
            Some(0),
            "{key}: {}\n{}",
            run.summary,
            run.stderr()
        );
        assert_eq!(run.stages(), ["check", "fix"], "{key}");
        let requests = mock.requests();
        assert_eq!(requests.len(), 1, "{key}");
        let body = &requests[0]["body"];
        let expected = json!(["ship", "fix"]);
        match key {
            "ANTHROPIC_API_KEY" => {
                assert_eq!(body["tool_choice"]["name"], "route");
                assert_eq!(allowed(body), ["ship", "fix"]);
                assert!(
                    body["model"].as_str().unwrap().contains("haiku"),
                    "router_model: {}",
                    body["model"]
                );
            }
            "OPENAI_API_KEY" => {
                let format = &body["text"]["format"];
                assert_eq!(format["type"], "json_schema", "{body}");
                assert_eq!(format["strict"], true);
                assert_eq!(format["schema"]["properties"]["choice"]["enum"], expected);
            }
            "GEMINI_API_KEY" => {
                let config = &body["generationConfig"];
                assert_eq!(config["responseMimeType"], "application/json", "{body}");
                assert_eq!(
                    config["responseSchema"]["properties"]["choice"]["enum"],
                    expected
                );
            }
            _ => {
                let format = &body["response_format"];
                assert_eq!(format["type"], "json_schema", "{body}");
                assert_eq!(
                    format["json_schema"]["schema"]["properties"]["choice"]["enum"],
                    expected
                );
            }
        }
    }
}
