//! Run files (Fabro's run configuration, `trellis run run.toml`) and template inputs end to end
//! through the real `trellis` binary: Fabro's `c-i.fabro`/`run-c-i.toml` pair, a run file with every
//! section, prepare steps, the stage environment, model fallbacks (llmock), hooks of each type with
//! their decisions, and resuming a run started from a run file.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use run_support::{Project, Run, stage_dir};
use serde_json::{Value, json};
use trellis_test::Llmock;

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/run-files")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn prompt_of(run: &Run, node: &str) -> String {
    std::fs::read_to_string(stage_dir(&run.record(), node).join("prompt.md")).unwrap()
}

/// What a command stage printed.
fn printed(run: &Run, node: &str) -> String {
    std::fs::read_to_string(stage_dir(&run.record(), node).join("stdout.log"))
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn fabros_c_i_pair_validates_and_runs_with_its_inputs() {
    let p = Project::new();
    p.write("c-i.fabro", &fixture("c-i.fabro"));
    p.write("run-c-i.toml", &fixture("run-c-i.toml"));
    // Alone, the workflow names an input nobody gave: an error naming it, where, and how to give it.
    let alone = p.command(&["validate", "c-i.fabro"]).output().unwrap();
    assert_eq!(alone.status.code(), Some(1));
    let text = stdout(&alone);
    assert!(
        text.contains("undefined template variable `language` in node `test`")
            && text.contains("undefined template variable `language` in node `setup`")
            && text.contains("`--input language=VALUE`"),
        "{text}"
    );
    // The report says that inputs alone would make it valid.
    let json = p
        .command(&["validate", "--format", "json", "c-i.fabro"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["files"][0]["needs_inputs"], true, "{report}");
    // With its run file, or the input on the command line, it validates.
    let with_file = p.command(&["validate", "run-c-i.toml"]).output().unwrap();
    assert_eq!(with_file.status.code(), Some(0), "{}", stdout(&with_file));
    assert!(stdout(&with_file).starts_with("Run file: "));
    let with_input = p
        .command(&["validate", "c-i.fabro", "-V", "language=go"])
        .output()
        .unwrap();
    assert_eq!(with_input.status.code(), Some(0), "{}", stdout(&with_input));

    let run = p.run("run-c-i.toml", &["--simulate"]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.stages(), ["start", "setup", "test", "exit"]);
    assert!(
        prompt_of(&run, "test").ends_with("Run the rust test suite and report every failure."),
        "{}",
        prompt_of(&run, "test")
    );
    // The script saw the input, and the run file's goal (over the graph's).
    assert_eq!(
        printed(&run, "setup"),
        "setting up rust for Run the CI pipeline"
    );
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(run.record().join("run.json")).unwrap())
            .unwrap();
    assert_eq!(meta["goal"], "Run the CI pipeline");
    assert_eq!(meta["settings"]["inputs"]["language"], "rust");
    assert!(meta["run_file"].as_str().unwrap().ends_with("run-c-i.toml"));
    assert_eq!(
        std::fs::read_to_string(run.record().join("run.toml")).unwrap(),
        fixture("run-c-i.toml")
    );
    // `--input` (`-V`, as Fabro spells it) wins over the file, and `--goal` over both goals.
    let again = p.run(
        "run-c-i.toml",
        &["--simulate", "-V", "language=go", "--goal", "Go green"],
    );
    assert_eq!(again.code(), Some(0), "{}", again.stderr());
    assert!(prompt_of(&again, "test").contains("Run the go test suite"));
    assert_eq!(printed(&again, "setup"), "setting up go for Go green");
}

#[test]
fn escapes_keep_template_text_and_a_misspelt_input_is_named() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         show [shape=parallelogram, script=\"echo '{% raw %}{{ inputs.x }}{% endraw %}' {{ '{{' }} {{ inputs.tag }}; docker ps --format '{{.Names}}' >/dev/null 2>&1; echo $HOME >/dev/null\"]\n \
         ask [shape=tab, prompt=\"Tag {{ inputs.tag }}, costs $$5, {% raw %}$literal{% endraw %}\"]\n \
         start -> show -> ask -> exit\n}\n",
    );
    let run = p.run("w.fabro", &["--simulate", "--input", "tag=v2"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(printed(&run, "show"), "{{ inputs.x }} {{ v2");
    assert!(
        prompt_of(&run, "ask").ends_with("Tag v2, costs $5, $literal"),
        "{}",
        prompt_of(&run, "ask")
    );
    let misspelt = p
        .command(&["validate", "w.fabro", "--input", "tags=v2"])
        .output()
        .unwrap();
    let text = stdout(&misspelt);
    assert_eq!(misspelt.status.code(), Some(1));
    assert!(
        text.contains("undefined template variable `tag` in node `show`")
            && text.contains("did you mean `tags`? the inputs are tags"),
        "{text}"
    );
}

const COMPLETE: &str = r#"_version = 1

[workflow]
graph = "flows/ship.fabro"

[run]
goal = "Ship release 1.4"
working_dir = "work"

[run.model]
name = "claude-sonnet-4-5"
fallbacks = ["openai", "..."]

[[run.prepare.steps]]
script = "echo prepared > prepared.txt"

[[run.prepare.steps]]
command = ["sh", "-c", "echo $STEP_NOTE >> prepared.txt"]
env = { STEP_NOTE = "second step" }

[run.sandbox]
provider = "daytona"

[run.sandbox.env]
NODE_ENV = "production"
REGION_URL = "https://api.{{ env.TEST_REGION }}.example.com"

[run.checkpoint]
exclude_globs = ["**/node_modules/**"]

[run.inputs]
version = "1.4.0"

[run.artifacts]
include = ["coverage/**"]

[run.agent.mcps.files]
type = "stdio"
command = ["mcp-files", "--root", "."]
startup_timeout = "30s"

[run.pull_request]
enabled = true

[[run.hooks]]
id = "no-deploys"
event = "stage_start"
script = "echo '{\"decision\": \"skip\", \"reason\": \"deploys are off today\"}'"
matcher = "^deploy$"

[[run.hooks]]
name = "context-check"
event = "stage_complete"
script = "cp \"$FABRO_HOOK_CONTEXT\" \"hook-$FABRO_NODE_ID.json\"; cat > \"stdin-$FABRO_NODE_ID.json\""
matcher = "build"
blocking = true

[[run.hooks]]
name = "done"
event = "run_complete"
script = "sleep 0.3; echo $FABRO_EVENT > run-complete.txt"
"#;

const SHIP: &str = r#"digraph Ship {
    graph [goal="Ship it"]
    start  [shape=Mdiamond]
    exit   [shape=Msquare]
    build  [shape=parallelogram, script="echo \"$NODE_ENV $REGION_URL {{ inputs.version }}\" > build.txt; mkdir -p coverage node_modules/x; echo 91 > coverage/summary.txt; cat build.txt"]
    notes  [shape=tab, prompt="Write release notes for $version."]
    deploy [shape=parallelogram, script="echo deployed > deployed.txt"]
    start -> build -> notes -> deploy -> exit
}
"#;

/// Regression: a working directory named with `..` was kept as written, which the sandbox may fail
/// to enter (`../../../../tmp/escape`: "bwrap: Can't chdir"). It is resolved whole: the stages run
/// there and the record names it plainly.
#[test]
fn a_run_files_working_directory_named_with_dot_dots_is_resolved() {
    let p = Project::new();
    p.write(
        "flows/w.fabro",
        "digraph W { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         make [shape=parallelogram, script=\"echo made > made.txt\"]\n \
         start -> make -> exit [condition=\"outcome=success\"] }",
    );
    p.write(
        "flows/run.toml",
        "graph = \"w.fabro\"\n[run]\nworking_dir = \"../elsewhere/../work/here/..\"\n",
    );
    let run = p.run("flows/run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let work = p.path().join("work");
    assert_eq!(
        std::fs::read_to_string(work.join("made.txt")).unwrap(),
        "made\n"
    );
    let recorded = run_support::read_json(&run.record().join("run.json"));
    assert_eq!(
        recorded["settings"]["work_dir"],
        work.canonicalize().unwrap().display().to_string()
    );
}

#[test]
fn a_run_file_with_every_section_validates_and_runs() {
    let p = Project::new().with_env("TEST_REGION", "eu");
    p.write("flows/ship.fabro", SHIP);
    p.write("run.toml", COMPLETE);
    let validated = p.command(&["validate", "run.toml"]).output().unwrap();
    let text = stdout(&validated);
    assert_eq!(validated.status.code(), Some(0), "{text}");
    for warning in [
        "provider = \"daytona\"",
        "`[run.pull_request]` is ignored",
        "`...` in `[run.model] fallbacks`",
    ] {
        assert!(text.contains(warning), "{warning}: {text}");
    }

    let run = p.run("run.toml", &["--simulate"]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert!(run.stderr().contains("daytona"), "{}", run.stderr());
    let work = p.path().join("work");
    // Prepare steps ran first, in the working directory, each recorded.
    assert_eq!(
        std::fs::read_to_string(work.join("prepared.txt")).unwrap(),
        "prepared\nsecond step\n"
    );
    let steps = run.events_named("Run.PrepareStep");
    assert_eq!(steps.len(), 2);
    assert!(steps.iter().all(|s| s["succeeded"] == true));
    assert!(run.record().join("prepare/02/status.json").is_file());
    // The stage environment, with the caller's variable, and the run's input.
    assert_eq!(
        std::fs::read_to_string(work.join("build.txt"))
            .unwrap()
            .trim(),
        "production https://api.eu.example.com 1.4.0"
    );
    assert!(prompt_of(&run, "notes").ends_with("Write release notes for 1.4.0."));
    // The artifact glob captured the coverage report; node_modules is not a touched file.
    assert!(
        run.record()
            .join("artifacts/build/attempt-1/coverage/summary.txt")
            .is_file()
    );
    // The stage_start hook skipped the deploy stage, with its reason.
    assert!(!work.join("deployed.txt").exists());
    let hooks = run.events_named("Hook.Completed");
    let skip = hooks
        .iter()
        .find(|h| h["hook"] == "no-deploys")
        .expect("the deploy hook ran");
    assert_eq!(skip["node_id"], "deploy");
    assert_eq!(skip["decision"], "skip");
    assert_eq!(skip["reason"], "deploys are off today");
    assert_eq!(
        hooks.iter().filter(|h| h["hook"] == "no-deploys").count(),
        1,
        "the matcher limits it to deploy: {hooks:?}"
    );
    // The context file a command hook is given.
    let context: Value =
        serde_json::from_str(&std::fs::read_to_string(work.join("hook-build.json")).unwrap())
            .unwrap();
    assert_eq!(context["event"], "stage_complete");
    assert_eq!(context["node_id"], "build");
    assert_eq!(context["handler_type"], "command");
    assert_eq!(context["status"], "succeeded");
    assert_eq!(context["workflow_name"], "Ship");
    // The same context on standard input, as Fabro gives it to a hook on the host.
    assert_eq!(
        std::fs::read_to_string(work.join("stdin-build.json")).unwrap(),
        std::fs::read_to_string(work.join("hook-build.json")).unwrap()
    );
    // The non-blocking hook finished before the run's record closed.
    assert_eq!(
        std::fs::read_to_string(work.join("run-complete.txt"))
            .unwrap()
            .trim(),
        "run_complete"
    );
    assert!(
        hooks
            .iter()
            .any(|h| h["hook"] == "done" && h["blocking"] == false)
    );
    // `trellis show` lists the prepare steps and every hook run.
    let run_id = run.summary["run_id"].as_str().unwrap();
    let show = stdout(&p.command(&["show", run_id]).output().unwrap());
    assert!(
        show.contains("Prepare:") && show.contains("echo prepared > prepared.txt"),
        "{show}"
    );
    assert!(
        show.contains("Hooks:")
            && show.contains("no-deploys")
            && show.contains("stage_start deploy")
            && show.contains("deploys are off today"),
        "{show}"
    );
    // Recorded: the file, the working directory, the model, the globs.
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(run.record().join("run.json")).unwrap())
            .unwrap();
    assert_eq!(meta["settings"]["model"], "claude-sonnet-4-5");
    assert_eq!(meta["settings"]["artifacts"], json!(["coverage/**"]));
    assert!(
        meta["settings"]["work_dir"]
            .as_str()
            .unwrap()
            .ends_with("work")
    );
}

#[test]
fn a_failing_prepare_step_fails_the_run_before_any_stage() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n t [shape=parallelogram, script=\"touch ran\"]\n start -> t -> exit\n}\n",
    );
    p.write(
        "run.toml",
        "[workflow]\ngraph = \"w.fabro\"\n[[run.prepare.steps]]\nscript = \"echo installing; echo 'no such package' >&2; exit 3\"\n",
    );
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(1), "{}", run.stderr());
    let error = run.summary["error"].as_str().unwrap();
    assert!(
        error.starts_with("prepare step 1 (`echo installing;")
            && error.contains("failed: exit 3: no such package"),
        "{error}"
    );
    assert_eq!(
        run.events_named("StageStarted"),
        [] as [serde_json::Value; 0]
    );
    assert!(!p.path().join("ran").exists());
    let status: Value = serde_json::from_str(
        &std::fs::read_to_string(run.record().join("prepare/01/status.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(status["status"], "failed");
    assert!(
        std::fs::read_to_string(run.record().join("prepare/01/output"))
            .unwrap()
            .contains("installing")
    );
    assert_eq!(run.events_named("WorkflowRunFailed").len(), 1);
}

#[test]
fn blocking_command_hooks_block_with_their_reason_and_time_out() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n a [shape=parallelogram, script=\"touch a-ran\"]\n start -> a -> exit\n}\n",
    );
    p.write(
        "block.toml",
        "graph = \"w.fabro\"\n[[hooks]]\nname = \"freeze\"\nevent = \"stage_start\"\ncommand = \"echo 'the release is frozen'; exit 2\"\n",
    );
    let run = p.run("block.toml", &[]);
    assert_eq!(run.code(), Some(1), "{}", run.stderr());
    assert_eq!(
        run.summary["error"],
        "a hook blocked the run at stage_start: hook `freeze`: the release is frozen"
    );
    assert!(!p.path().join("a-ran").exists());
    // A hook that outlasts its timeout blocks too (command hooks do not fail open).
    p.write(
        "slow.toml",
        "graph = \"w.fabro\"\n[[hooks]]\nname = \"slow\"\nevent = \"run_start\"\nscript = \"sleep 10\"\ntimeout = \"300ms\"\n",
    );
    let started = std::time::Instant::now();
    let run = p.run("slow.toml", &[]);
    assert_eq!(run.code(), Some(1));
    assert!(started.elapsed() < std::time::Duration::from_secs(8));
    let error = run.summary["error"].as_str().unwrap();
    assert!(
        error.contains("hook `slow`: timed out after 300ms"),
        "{error}"
    );
    // Any other exit blocks with the code.
    p.write(
        "crash.toml",
        "graph = \"w.fabro\"\n[[hooks]]\nevent = \"stage_start\"\ncommand = [\"sh\", \"-c\", \"exit 7\"]\n",
    );
    let run = p.run("crash.toml", &[]);
    assert!(
        run.summary["error"]
            .as_str()
            .unwrap()
            .contains("hook exited with code 7"),
        "{}",
        run.summary
    );
}

/// A one-route HTTP server on loopback: it keeps each request's body and answers `reply`.
fn http_server(reply: &'static str) -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = bodies.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            kept.lock()
                .unwrap()
                .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
            let _ = write!(
                reader.get_mut(),
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                reply.len()
            );
        }
    });
    (url, bodies)
}

#[test]
fn an_http_hook_is_posted_the_context_and_can_send_the_run_elsewhere() {
    let (url, bodies) =
        http_server(r#"{"decision": "override", "edge_to": "b", "reason": "b is safer"}"#);
    let p = Project::new().with_env("HOOK_TOKEN", "tok-123-secret-value");
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n pick [shape=parallelogram, script=\"true\"]\n \
         a [shape=parallelogram, script=\"touch a-ran\"]\n b [shape=parallelogram, script=\"touch b-ran\"]\n \
         start -> pick -> a -> exit\n pick -> b [condition=\"outcome=fail\"]\n b -> exit\n}\n",
    );
    p.write(
        "run.toml",
        &format!(
            "graph = \"w.fabro\"\n[[hooks]]\nname = \"router\"\nevent = \"edge_selected\"\ntype = \"http\"\nurl = \"{url}\"\ntls = \"off\"\nmatcher = \"^a$\"\nallowed_env_vars = [\"HOOK_TOKEN\"]\n[hooks.headers]\nAuthorization = \"Bearer $HOOK_TOKEN\"\n"
        ),
    );
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert!(p.path().join("b-ran").exists() && !p.path().join("a-ran").exists());
    assert_eq!(run.stages(), ["start", "pick", "b", "exit"]);
    let bodies = bodies.lock().unwrap();
    assert_eq!(
        bodies.len(),
        1,
        "the matcher fires on the edge to `a` only: {bodies:?}"
    );
    assert_eq!(bodies[0]["event"], "edge_selected");
    assert_eq!(bodies[0]["edge_from"], "pick");
    assert_eq!(bodies[0]["edge_to"], "a");
    let hook = &run.events_named("Hook.Completed")[0];
    assert_eq!(hook["decision"], "override");
    assert_eq!(hook["hook_type"], "http");
    // An HTTP hook that cannot be reached fails open.
    p.write(
        "down.toml",
        "graph = \"w.fabro\"\n[[hooks]]\nevent = \"run_start\"\ntype = \"http\"\nurl = \"http://127.0.0.1:9/hook\"\ntls = \"off\"\n",
    );
    let run = p.run("down.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let hook = &run.events_named("Hook.Completed")[0];
    assert_eq!(hook["decision"], "proceed");
    assert!(hook["error"].as_str().is_some(), "{hook}");
}

const KEY: &str = "sk-ant-test-run-files-7f3a";

/// A project whose Anthropic provider is `mock`.
fn anthropic(mock: &Llmock) -> Project {
    Project::new()
        .with_env("ANTHROPIC_API_KEY", KEY)
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
}

/// A project whose Anthropic and OpenAI providers are both `mock`.
fn anthropic_and_openai(mock: &Llmock) -> Project {
    anthropic(mock)
        .with_env("OPENAI_API_KEY", "sk-openai-test")
        .with_env("OPENAI_BASE_URL", &mock.url("/v1"))
}

#[test]
fn a_prompt_hook_shows_the_model_the_context_and_its_no_blocks() {
    let Some(mock) = Llmock::start() else { return };
    let p = anthropic(&mock);
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n migrate [shape=parallelogram, script=\"touch migrated\"]\n start -> migrate -> exit\n}\n",
    );
    p.write(
        "run.toml",
        "graph = \"w.fabro\"\n[[hooks]]\nname = \"guard\"\nevent = \"stage_start\"\ntype = \"prompt\"\nprompt = \"Is it safe to run a database migration now?\"\nmodel = \"haiku\"\n",
    );
    mock.scenario(&json!([{ "type": "reply", "text": "{\"ok\": false, \"reason\": \"it is Friday\"}", "times": 1 }]));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(1), "{}", run.stderr());
    assert_eq!(
        run.summary["error"],
        "a hook blocked the run at stage_start: hook `guard`: it is Friday"
    );
    assert!(!p.path().join("migrated").exists());
    // What the model was shown: the instructions and the event's context.
    let body = &mock.bodies()[0];
    assert_eq!(body["model"], "claude-haiku-4-5");
    let shown = body["messages"][0]["content"][0]["text"].as_str().unwrap();
    assert!(
        shown.starts_with("Is it safe to run a database migration now?")
            && shown.contains("\"node_id\": \"migrate\"")
            && shown.contains("\"event\": \"stage_start\""),
        "{shown}"
    );
    // A model error fails open: the stage runs.
    mock.reset();
    mock.scenario(&json!([{ "type": "fail", "status": 400, "times": 1 }]));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(p.path().join("migrated").exists());
    let hook = &run.events_named("Hook.Completed")[0];
    assert_eq!(hook["decision"], "proceed");
    assert!(hook["error"].as_str().unwrap().contains("400"), "{hook}");
}

/// A project whose one stage writes the test results, and whose run file has a blocking
/// `run_complete` agent hook, `verify`, with `rounds` rounds of tool calls.
fn verification_agent(mock: &Llmock, rounds: u32) -> Project {
    let p = anthropic(mock);
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n test [shape=parallelogram, script=\"echo '2 of 9 tests failed' > results.txt\"]\n start -> test -> exit\n}\n",
    );
    p.write(
        "run.toml",
        &format!("graph = \"w.fabro\"\n[[hooks]]\nname = \"verify\"\nevent = \"run_complete\"\ntype = \"agent\"\nprompt = \"Verify that all tests pass.\"\nmodel = \"sonnet\"\nmax_tool_rounds = {rounds}\nblocking = true\n"),
    );
    p
}

/// Fabro's post-run verification agent: it looks with its tools, then its `ok: false` fails the
/// run with its reason; one that runs out of `max_tool_rounds` proceeds.
#[test]
fn an_agent_hook_looks_with_its_tools_before_it_decides() {
    let Some(mock) = Llmock::start() else { return };
    let p = verification_agent(&mock, 3);
    mock.scenario(&json!([
        { "type": "reply", "times": 1, "tool_calls": [
            { "name": "shell", "arguments": { "command": "cat results.txt" } },
        ]},
        { "type": "reply", "times": 1, "text": "{\"ok\": false, \"reason\": \"2 of 9 tests failed\"}" },
    ]));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(1), "{}", run.stderr());
    assert_eq!(
        run.summary["error"],
        "a hook blocked the run at run_complete: hook `verify`: 2 of 9 tests failed"
    );
    // What the model was shown: the instructions, the event's context and the tools; then what
    // its command printed.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0]["model"], "claude-sonnet-4-5");
    let system = bodies[0]["system"].to_string();
    assert!(system.contains("answer with JSON only"), "{system}");
    let shown = bodies[0]["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        shown.starts_with("Verify that all tests pass.")
            && shown.contains("\"event\": \"run_complete\""),
        "{shown}"
    );
    let tools = Llmock::tool_names(&bodies[0]);
    assert!(
        [
            "shell",
            "read_file",
            "write_file",
            "edit_file",
            "grep",
            "glob"
        ]
        .iter()
        .all(|t| tools.iter().any(|offered| offered == t)),
        "{tools:?}"
    );
    let printed = Llmock::tool_results(&bodies[1]);
    assert!(
        printed[0]["content"]
            .as_str()
            .unwrap()
            .contains("2 of 9 tests failed"),
        "{printed:?}"
    );
    let hook = &run.events_named("Hook.Completed")[0];
    assert_eq!(hook["hook_type"], "agent");
    assert_eq!(hook["decision"], "block");
    assert!(
        run.stderr()
            .contains("· hook verify at run_complete: block: 2 of 9 tests failed"),
        "{}",
        run.stderr()
    );
    // What it did is kept in the run's record.
    let transcript =
        std::fs::read_to_string(run.record().join("hooks/0001-run_complete.agent.jsonl")).unwrap();
    assert!(
        transcript.contains("\"target\":\"cat results.txt\""),
        "{transcript}"
    );
}

/// An agent hook that runs out of `max_tool_rounds` before it answers lets the run go on (agent
/// hooks fail open), and `trellis run` says so.
#[test]
fn an_agent_hook_out_of_rounds_proceeds() {
    let Some(mock) = Llmock::start() else { return };
    let p = verification_agent(&mock, 1);
    mock.scenario(&json!([
        { "type": "reply", "times": 2, "tool_calls": [
            { "name": "read_file", "arguments": { "path": "results.txt" } },
        ]},
    ]));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(mock.bodies().len(), 2);
    let hook = &run.events_named("Hook.Completed")[0];
    assert_eq!(hook["decision"], "proceed");
    assert!(
        hook["error"]
            .as_str()
            .unwrap()
            .contains("used up `max_tool_rounds` (1) without answering"),
        "{hook}"
    );
    assert!(
        run.stderr().contains(
            "! hook verify at run_complete could not decide, so the run goes on: used up"
        ),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_provider_failure_falls_back_to_the_next_model() {
    let Some(mock) = Llmock::start() else { return };
    let p = anthropic_and_openai(&mock);
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n ask [shape=tab, prompt=\"Say hi\", max_retries=0]\n start -> ask -> exit\n}\n",
    );
    p.write(
        "run.toml",
        "graph = \"w.fabro\"\n[run.model]\nname = \"claude-sonnet-4-5\"\nfallbacks = [\"openai\"]\n",
    );
    mock.scenario(&json!([
        { "type": "fail", "status": 529, "times": 4, "match": { "provider": "anthropic" } },
        { "type": "reply", "text": "hi from the fallback", "times": 1, "match": { "provider": "openai" } }
    ]));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    assert_eq!(run.context("response.ask"), "hi from the fallback");
    let warning = run
        .events_named("ModelWarning")
        .into_iter()
        .find(|w| w["message"].as_str().unwrap().contains("falling back"))
        .expect("a fallback warning");
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .contains("anthropic/claude-sonnet-4-5 failed")
            && warning["message"]
                .as_str()
                .unwrap()
                .ends_with("falling back to openai/gpt-5"),
        "{warning}"
    );
    let bodies = mock.bodies();
    assert_eq!(bodies.first().unwrap()["model"], "claude-sonnet-4-5");
    assert_eq!(bodies.last().unwrap()["model"], "gpt-5");
    // A failure that is the user's own (a bad key) does not fall back.
    mock.reset();
    mock.scenario(&json!([{ "type": "fail", "status": 401, "times": 1, "match": { "provider": "anthropic" } }]));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(1));
    assert_eq!(mock.bodies().len(), 1);
}

/// The provider that answered `node`'s stage, as its `status.json` records it.
fn provider_of(run: &Run, node: &str) -> Value {
    run_support::read_json(&stage_dir(&run.record(), node).join("status.json"))["provider"].clone()
}

/// Fabro's `--model` and `--provider`: over the run file's `[run.model]`, for the nodes that name
/// no model, and kept for the rest of the run when it resumes.
#[test]
fn the_command_lines_model_and_provider_hold_for_nodes_that_name_none_and_on_resume() {
    let Some(mock) = Llmock::start() else { return };
    let p = anthropic_and_openai(&mock);
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         first [shape=tab, prompt=\"Say one\"]\n \
         named [shape=tab, prompt=\"Say two\", model=\"claude-haiku-4-5\"]\n \
         gate [shape=hexagon, label=\"Go on?\"]\n last [shape=tab, prompt=\"Say three\"]\n \
         start -> first -> named -> gate\n gate -> last [label=\"[Y] Yes\"]\n last -> exit\n}\n",
    );
    p.write(
        "run.toml",
        "graph = \"w.fabro\"\n[run.model]\nname = \"claude-sonnet-4-5\"\n",
    );
    mock.scenario(&json!([{ "type": "reply", "text": "ok", "times": 3 }]));
    // A model the catalog does not know goes to the provider named for it.
    let args = ["--model", "my-finetune", "--provider", "openai"];
    let run = p.run("run.toml", &args);
    assert_eq!(run.code(), Some(3), "waits at the gate: {}", run.stderr());
    let run_id = run.summary["run_id"].as_str().unwrap().to_owned();
    let settings = &run_support::read_json(&run.record().join("run.json"))["settings"];
    assert_eq!(settings["model"], "my-finetune");
    assert_eq!(settings["provider"], "openai");
    let resumed = p.resume(&run_id, &["--auto-approve"]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    let asked: Vec<Value> = mock.bodies().iter().map(|b| b["model"].clone()).collect();
    assert_eq!(asked, ["my-finetune", "claude-haiku-4-5", "my-finetune"]);
    assert_eq!(
        ["first", "named", "last"].map(|node| provider_of(&resumed, node)),
        ["openai", "anthropic", "openai"]
    );
    // Fabro's graph attributes `default_model` and `default_provider` are the lowest layer.
    p.write(
        "g.fabro",
        "digraph G {\n graph [default_model=\"my-finetune\", default_provider=\"openai\"]\n \
         start [shape=Mdiamond]\n exit [shape=Msquare]\n ask [shape=tab, prompt=\"Say hi\"]\n \
         start -> ask -> exit\n}\n",
    );
    mock.reset();
    mock.scenario(&json!([{ "type": "reply", "text": "ok", "times": 2 }]));
    let by_graph = p.run("g.fabro", &[]);
    assert_eq!(by_graph.code(), Some(0), "{}", by_graph.stderr());
    assert!(
        !by_graph.stderr().contains("unknown graph attribute"),
        "{}",
        by_graph.stderr()
    );
    assert_eq!(provider_of(&by_graph, "ask"), "openai");
    let by_flag = p.run("g.fabro", &["--model", "claude-haiku-4-5"]);
    assert_eq!(by_flag.code(), Some(0), "{}", by_flag.stderr());
    assert_eq!(provider_of(&by_flag, "ask"), "anthropic");
    let asked: Vec<Value> = mock.bodies().iter().map(|b| b["model"].clone()).collect();
    assert_eq!(asked, ["my-finetune", "claude-haiku-4-5"]);
    // A provider that is none is a usage error, on the command line as in a run file.
    let typo = p
        .command(&["run", "w.fabro", "--provider", "opneai"])
        .output()
        .unwrap();
    assert_eq!(typo.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&typo.stderr).contains(
            "unknown provider `opneai`: use anthropic, openai, gemini, openai-compatible or local"
        ),
        "{}",
        String::from_utf8_lossy(&typo.stderr)
    );
    p.write(
        "typo.toml",
        "graph = \"w.fabro\"\n[run.model]\nprovider = \"opneai\"\n",
    );
    let typo = p.command(&["validate", "typo.toml"]).output().unwrap();
    assert_eq!(typo.status.code(), Some(1));
    let said = String::from_utf8_lossy(&typo.stderr);
    assert!(
        said.contains("typo.toml: `[run.model] provider`: unknown provider `opneai`"),
        "{said}"
    );
}

#[test]
fn resume_uses_the_recorded_run_file() {
    let p = Project::new().with_env("TEST_REGION", "us");
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         before [shape=parallelogram, script=\"echo $REGION >> seen.txt\"]\n \
         gate [shape=hexagon, label=\"Go on?\"]\n \
         after [shape=parallelogram, script=\"echo $REGION {{ inputs.tier }} >> seen.txt\"]\n \
         start -> before -> gate\n gate -> after [label=\"[Y] Yes\"]\n after -> exit\n}\n",
    );
    p.write(
        "run.toml",
        "graph = \"w.fabro\"\n[run.inputs]\ntier = \"gold\"\n[run.sandbox.env]\nREGION = \"{{ env.TEST_REGION }}\"\n[[hooks]]\nevent = \"run_start\"\nscript = \"echo start >> starts.txt\"\n",
    );
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(3), "waits at the gate: {}", run.stderr());
    let run_id = run.summary["run_id"].as_str().unwrap().to_owned();
    // The run file may change or go; the run keeps the one it started with.
    std::fs::remove_file(p.path().join("run.toml")).unwrap();
    let resumed = p.resume(&run_id, &["--auto-approve"]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    assert_eq!(p.read("seen.txt"), "us\nus gold\n");
    assert_eq!(p.read("starts.txt"), "start\nstart\n");
}

#[test]
fn tool_hooks_refuse_calls_and_run_after_writes() {
    let Some(mock) = Llmock::start() else { return };
    let p = anthropic(&mock);
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"Write the notes\", model=\"sonnet\"]\n start -> fix -> exit\n}\n",
    );
    p.write(
        "run.toml",
        r#"graph = "w.fabro"

[[hooks]]
name = "no-shell"
event = "pre_tool_use"
matcher = "^shell$"
script = "echo 'shells are off in this run'; exit 2"

[[hooks]]
name = "mirror"
event = "post_tool_use"
matcher = "write_file|edit_file"
blocking = true
script = "cp notes.md mirror.md"
"#,
    );
    mock.scenario(&json!([
        { "type": "reply", "times": 1, "tool_calls": [
            { "name": "write_file", "arguments": { "path": "notes.md", "content": "release notes" } },
        ]},
        { "type": "reply", "times": 1, "tool_calls": [
            { "name": "shell", "arguments": { "command": "touch shell-ran" } },
        ]},
        { "type": "reply", "times": 1, "text": "Done." },
    ]));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    // The post_tool_use hook ran after the write, before the model's next turn.
    assert_eq!(p.read("mirror.md"), "release notes");
    // The shell call was refused, and the model was shown why.
    assert!(!p.path().join("shell-ran").exists());
    let bodies = mock.bodies();
    let refused = Llmock::tool_results(&bodies[2]);
    let shown = refused.last().unwrap()["content"].as_str().unwrap();
    assert!(
        shown.contains("refused by the run's hooks: hook `no-shell`: shells are off in this run"),
        "{shown}"
    );
    let hooks = run.events_named("Hook.Completed");
    let names: Vec<(&str, &str)> = hooks
        .iter()
        .map(|h| (h["hook"].as_str().unwrap(), h["decision"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("mirror", "proceed"), ("no-shell", "block")]);
    assert!(hooks.iter().all(|h| h["node_id"] == "fix"));
}

#[test]
fn inputs_fill_in_a_workflows_structure_before_it_is_parsed() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         {{ inputs.step }} [shape=parallelogram, script=\"echo step {{ inputs.step }}\"]\n \
         start -> {{ inputs.step }} -> exit\n}\n",
    );
    let run = p.run("w.fabro", &["--simulate", "--input", "step=lint"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "lint", "exit"]);
    assert_eq!(printed(&run, "lint"), "step lint");
    let missing = p.command(&["validate", "w.fabro"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let text = stdout(&missing);
    assert!(
        text.contains("undefined template variable `step` in the workflow's structure"),
        "{text}"
    );
}

/// Windows editors save UTF-8 with a byte order mark: an inputs file, an answers file and a prompt
/// file so saved read as they do without it (JSON that parses, a prompt that opens with its text).
#[test]
fn files_saved_with_a_byte_order_mark_read_as_without_it() {
    let p = Project::new();
    p.write("inputs.json", "\u{feff}{\"tag\": \"v2\"}");
    p.write("answers.json", "\u{feff}{\"ask\": \"A\"}");
    p.write("prompt.md", "\u{feff}Tag {{ inputs.tag }}.\n");
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         show [shape=parallelogram, script=\"echo {{ inputs.tag }}\"]\n \
         ask [shape=hexagon, label=\"Ship?\"]\n write [shape=tab, prompt=\"@prompt.md\"]\n \
         start -> show -> ask\n ask -> write [label=\"[A] Approve\"]\n \
         ask -> exit [label=\"[R] Reject\"]\n write -> exit\n}\n",
    );
    let run = p.run(
        "w.fabro",
        &[
            "--simulate",
            "--inputs",
            "inputs.json",
            "--answers",
            "answers.json",
        ],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(printed(&run, "show"), "v2");
    assert_eq!(run.stages(), ["start", "show", "ask", "write", "exit"]);
    assert_eq!(prompt_of(&run, "write"), "Tag v2.\n");
}

#[test]
fn hooks_merge_across_the_config_file_the_project_and_the_run_file() {
    let p = Project::new();
    p.write(
        ".config/trellis/config.toml",
        "[[hooks]]\nid = \"notify\"\nevent = \"run_complete\"\nscript = \"echo user >> layers.txt\"\nblocking = true\n",
    );
    p.write(
        ".fabro/project.toml",
        "_version = 1\n[run.model]\nname = \"claude-sonnet-4-5\"\n\n[[hooks]]\nid = \"notify\"\nevent = \"run_complete\"\nscript = \"echo project >> layers.txt\"\nblocking = true\n\n[[run.hooks]]\nevent = \"run_start\"\nscript = \"echo project-start >> layers.txt\"\n",
    );
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n start -> exit\n}\n",
    );
    p.write(
        "run.toml",
        "graph = \"w.fabro\"\n[[hooks]]\nevent = \"run_complete\"\nscript = \"echo run >> layers.txt\"\nblocking = true\n",
    );
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(
        run.stderr()
            .contains("reads only a project file's hooks; `run.model` is not applied"),
        "{}",
        run.stderr()
    );
    // The project's `notify` replaced the user's where it stood; the run file's hook follows.
    assert_eq!(p.read("layers.txt"), "project-start\nproject\nrun\n");
    // A workflow run without a run file has the other two layers.
    std::fs::remove_file(p.path().join("layers.txt")).unwrap();
    let plain = p.run("w.fabro", &[]);
    assert_eq!(plain.code(), Some(0), "{}", plain.stderr());
    assert_eq!(p.read("layers.txt"), "project-start\nproject\n");
    // A project's hook may not leave the sandbox.
    p.write(
        ".fabro/project.toml",
        "[[hooks]]\nname = \"escape\"\nevent = \"run_start\"\nscript = \"true\"\nsandbox = false\n",
    );
    let refused = p.run("w.fabro", &[]);
    assert_ne!(refused.code(), Some(0));
    assert!(
        refused
            .stderr()
            .contains("hook `escape` asks to run outside the sandbox"),
        "{}",
        refused.stderr()
    );
    // A project file that is not TOML stops the run, saying so once, with the parser's place.
    p.write(".fabro/project.toml", "[[hooks]\n");
    let broken = p.run("w.fabro", &[]);
    assert_eq!(broken.code(), Some(2), "{}", broken.stderr());
    assert!(
        broken
            .stderr()
            .starts_with("error: the run's hooks cannot be used:\n")
            && broken.stderr().contains("TOML parse error at line 1"),
        "{}",
        broken.stderr()
    );
    assert!(!broken.stderr().contains("warning"), "{}", broken.stderr());
}

/// A pipe where Trellis looks for a project's file (left by a cloned repository, or a stage of an
/// earlier run): a plain open waits for a writer forever.
#[test]
fn a_pipe_where_a_project_file_is_looked_for_is_named_not_waited_on() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n start -> exit\n}\n",
    );
    std::fs::create_dir_all(p.path().join(".fabro")).unwrap();
    for name in [".fabro/project.toml", ".mcp.json"] {
        nix::unistd::mkfifo(&p.path().join(name), nix::sys::stat::Mode::S_IRWXU).unwrap();
    }
    let mut child = p
        .command(&["run", "w.fabro"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_mins(1);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run waited on a pipe");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    // Its hooks would silently not run: the run does not start.
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the run's hooks cannot be used:\n")
            && stderr
                .contains(".fabro/project.toml: cannot read it: it is a pipe, not a regular file"),
        "{stderr}"
    );
    // Nothing ran: no record of a run that could not start.
    assert!(!p.run_exists());
}

/// A cloned repository's project file that links to a file of the user's elsewhere: read, it would
/// put the user's secret in a parse error's quoted line, on a terminal or in a CI log.
#[test]
fn a_project_file_linking_out_of_the_project_is_not_followed() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n start -> exit\n}\n",
    );
    let home = tempfile::tempdir().unwrap();
    let secret = home.path().join(".git-credentials");
    std::fs::write(&secret, "https://me:ghp_s3cr3tT0ken@github.com\n").unwrap();
    std::fs::create_dir_all(p.path().join(".fabro")).unwrap();
    std::os::unix::fs::symlink(&secret, p.path().join(".fabro/project.toml")).unwrap();
    let output = p.command(&["run", "w.fabro"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(".fabro/project.toml: cannot read it: it leads outside")
            && stderr.contains("; hooks of your own go in your config file or a run file you name"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cr3t"), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("s3cr3t"));
    assert!(!p.run_exists());
}

#[test]
fn a_secret_the_run_file_writes_out_stays_out_of_the_record_and_resume_reads_it_again() {
    const TOKEN: &str = "tok-literal-0123456789abcdef";
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         before [shape=parallelogram, script=\"echo ${#API_TOKEN} >> lengths.txt; echo $API_TOKEN\"]\n \
         gate [shape=hexagon, label=\"Go on?\"]\n \
         after [shape=parallelogram, script=\"echo ${#API_TOKEN} >> lengths.txt\"]\n \
         start -> before -> gate\n gate -> after [label=\"[Y] Yes\"]\n after -> exit\n}\n",
    );
    p.write(
        "run.toml",
        &format!("graph = \"w.fabro\"\n[run.sandbox.env]\nAPI_TOKEN = \"{TOKEN}\"\n"),
    );
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(3), "{}", run.stderr());
    let recorded = std::fs::read_to_string(run.record().join("run.toml")).unwrap();
    assert!(recorded.contains("[redacted API_TOKEN]"), "{recorded}");
    for entry in walkdir(&run.record()) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(TOKEN),
            "{} holds the token",
            entry.display()
        );
    }
    let run_id = run.summary["run_id"].as_str().unwrap().to_owned();
    let resumed = p.resume(&run_id, &["--auto-approve"]);
    assert_eq!(resumed.code(), Some(0), "{}", resumed.stderr());
    let length = TOKEN.len().to_string();
    assert_eq!(p.read("lengths.txt"), format!("{length}\n{length}\n"));
}

fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walkdir(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn hooks_fire_at_every_lifecycle_point_of_a_run() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         checks [shape=component, join_policy=\"wait_all\", max_parallel=1]\n \
         a [shape=parallelogram, script=\"true\"]\n \
         merge [shape=tripleoctagon]\n \
         slow [shape=parallelogram, script=\"sleep 5\", timeout=\"300ms\", max_retries=1, retry_policy=\"linear\"]\n \
         start -> checks\n checks -> a -> merge\n merge -> slow\n slow -> exit [condition=\"outcome=fail\"]\n}\n",
    );
    let events = [
        "run_start",
        "sandbox_ready",
        "stage_start",
        "stage_complete",
        "stage_failed",
        "stage_retrying",
        "edge_selected",
        "parallel_start",
        "parallel_complete",
        "checkpoint_saved",
        "sandbox_cleanup",
        "run_complete",
    ];
    let mut hooks = String::new();
    for event in events {
        let _ = writeln!(
            hooks,
            "[[hooks]]\nevent = \"{event}\"\nblocking = true\nscript = \"echo $FABRO_EVENT ${{FABRO_NODE_ID:--}} >> fired.txt\"\n"
        );
    }
    p.write("run.toml", &format!("graph = \"w.fabro\"\n{hooks}"));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}\n{}", run.summary, run.stderr());
    let fired = p.read("fired.txt");
    for expected in [
        "run_start -",
        "sandbox_ready -",
        "parallel_start checks",
        "stage_start a",
        "stage_complete a",
        "parallel_complete checks",
        "stage_retrying slow",
        "stage_failed slow",
        "edge_selected slow",
        "checkpoint_saved slow",
        "sandbox_cleanup -",
        "run_complete -",
    ] {
        assert!(fired.lines().any(|l| l == expected), "{expected}:\n{fired}");
    }
    // Start and exit are no stages of the user's: no stage hooks fire for them.
    assert!(!fired.contains("stage_start start"), "{fired}");
    assert_eq!(fired.lines().next(), Some("run_start -"));
    assert_eq!(fired.lines().last(), Some("run_complete -"));
    // A run that fails ends with `run_failed`, told why.
    p.write(
        "fails.fabro",
        "digraph F {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n t [shape=parallelogram, script=\"exit 1\"]\n start -> t\n t -> exit [condition=\"outcome=success\"]\n}\n",
    );
    p.write(
        "fails.toml",
        "graph = \"fails.fabro\"\n[[hooks]]\nevent = \"run_failed\"\nblocking = true\nscript = \"jq -r .failure_reason \\\"$FABRO_HOOK_CONTEXT\\\" > why.txt 2>/dev/null || cat \\\"$FABRO_HOOK_CONTEXT\\\" > why.txt\"\n",
    );
    let failed = p.run("fails.toml", &[]);
    assert_eq!(failed.code(), Some(1));
    assert!(
        p.read("why.txt").contains("no edge from `t`"),
        "{}",
        p.read("why.txt")
    );
}
