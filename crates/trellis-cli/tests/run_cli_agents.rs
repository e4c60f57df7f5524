//! Agent nodes with `backend="cli"` end to end through the real `trellis` binary. Stand-in `claude`,
//! `codex` and `gemini` executables on `PATH` record how they were called (arguments, standard input,
//! working directory), change files as the recorded session did, and print the recorded output in
//! each CLI's real format (`tests/fixtures/cli-agents/`, with the versions they follow). Each test
//! checks the run record, the events, `files_touched` and what the CLI was given.

#![allow(
    clippy::disallowed_macros,
    reason = "a test's message, which the test harness captures as it captures eprintln! alone"
)]
#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the code they run"
)]

mod run_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use run_support::{Project, Run, assert_process_group_gone, stage_dir};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cli-agents");
const CLAUDE_SESSION: &str = "5f1c9a52-3d6e-4b8a-9f0e-2c7d1b4a8e61";
const GEMINI_SESSION: &str = "c2b0b6c8-7a47-4d55-9a2e-0f3f5e1b9d3a";

/// A project whose `PATH` starts with a directory of stand-in CLIs kept outside it, with the record
/// of their calls beside them (so neither counts as a file the agent touched).
struct CliProject {
    project: Project,
    aside: tempfile::TempDir,
}

/// One call of a stand-in.
struct Call {
    args: Vec<String>,
    stdin: String,
    cwd: PathBuf,
}

impl Call {
    /// The value after `flag`.
    fn flag(&self, flag: &str) -> Option<&str> {
        let at = self.args.iter().position(|a| a == flag)?;
        self.args.get(at + 1).map(String::as_str)
    }

    fn has(&self, arg: &str) -> bool {
        self.args.iter().any(|a| a == arg)
    }
}

impl CliProject {
    fn new() -> Self {
        Self::with_path_tail(&std::env::var("PATH").unwrap_or_default())
    }

    /// With `tail` after the stand-ins on `PATH`.
    fn with_path_tail(tail: &str) -> Self {
        let aside = tempfile::tempdir().unwrap();
        std::fs::create_dir(aside.path().join("bin")).unwrap();
        let path = format!("{}:{tail}", aside.path().join("bin").display());
        let project = Project::new().with_env("PATH", &path);
        CliProject { project, aside }
    }

    /// Installs a stand-in for `program` that answers `--version` with `version`, records each call
    /// under `calls/`, then runs `body` (shell) in the working directory.
    fn stand_in(&self, program: &str, version: &str, body: &str) {
        let calls = self.aside.path().join("calls");
        let script = format!(
            "#!/bin/sh\n\
             # A stand-in for `{program}` ({version}): records how it was called, then plays a recorded session.\n\
             if [ \"$1\" = \"--version\" ]; then echo '{version}'; exit 0; fi\n\
             log='{calls}'\n\
             mkdir -p \"$log\"\n\
             n=$(( $(ls \"$log\" | grep -c 'args$') + 1 ))\n\
             printf '%s\\0' \"$@\" > \"$log/$n.args\"\n\
             pwd > \"$log/$n.cwd\"\n\
             cat > \"$log/$n.stdin\"\n\
             fixtures='{FIXTURES}'\n\
             {body}\n",
            calls = calls.display(),
        );
        let path = self.aside.path().join("bin").join(program);
        std::fs::write(&path, script).unwrap();
        let mut permissions = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&path, permissions).unwrap();
    }

    /// The stand-ins' calls, in order.
    fn calls(&self) -> Vec<Call> {
        let dir = self.aside.path().join("calls");
        (1..1000)
            .map(|n| dir.join(n.to_string()))
            .take_while(|base| base.with_extension("args").exists())
            .map(|base| Call {
                args: std::fs::read_to_string(base.with_extension("args"))
                    .unwrap()
                    .split_terminator('\0')
                    .map(str::to_owned)
                    .collect(),
                stdin: std::fs::read_to_string(base.with_extension("stdin")).unwrap_or_default(),
                cwd: PathBuf::from(
                    std::fs::read_to_string(base.with_extension("cwd"))
                        .unwrap()
                        .trim(),
                ),
            })
            .collect()
    }

    /// Makes the project a git repository with one commit of everything in it so far.
    fn git_commit_all(&self) -> bool {
        if Command::new("git").arg("--version").output().is_err() {
            trellis_test::missing_peer("git");
            return false;
        }
        for args in [
            &["init", "-q"][..],
            &["add", "-A"],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "-m",
                "start",
            ],
        ] {
            let status = Command::new("git")
                .args(args)
                .current_dir(self.project.path())
                .status()
                .unwrap();
            assert!(status.success(), "git {args:?}");
        }
        true
    }
}

fn status(run: &Run, node: &str) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(stage_dir(&run.record(), node).join("status.json")).unwrap(),
    )
    .unwrap()
}

fn stage_file(run: &Run, node: &str, name: &str) -> String {
    std::fs::read_to_string(stage_dir(&run.record(), node).join(name)).unwrap_or_default()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// The tool calls a stage's events report, as (tool, target, `is_error`).
fn tool_calls(run: &Run, node: &str) -> Vec<(String, String, bool)> {
    let started = run.events_named("Agent.ToolCallStarted");
    run.events_named("Agent.ToolCallCompleted")
        .into_iter()
        .filter(|e| e["node_id"] == node)
        .map(|e| {
            let id = &e["call_id"];
            assert!(
                started.iter().any(|s| &s["call_id"] == id),
                "{id} completed but never started"
            );
            (
                e["tool"].as_str().unwrap().to_owned(),
                e["target"].as_str().unwrap().to_owned(),
                e["is_error"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn failure(run: &Run, node: &str) -> String {
    status(run, node)["failure"]["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("no failure reason: {}", status(run, node)))
        .to_owned()
}

fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap()
}

const LIB_RS: &str = "pub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n";
/// The shell a stand-in runs to make the recorded session's fix.
const FIX_LIB_RS: &str =
    "printf 'pub fn add(a: i32, b: i32) -> i32 {\\n    a + b\\n}\\n' > src/lib.rs";

/// `fix` (an agent node with `attrs`) between start and exit, routed by its answer's label to `ship`
/// or `hold` (which a run without a directive would take: it is lexically first).
fn routed_workflow(attrs: &str) -> String {
    format!(
        "digraph W {{\n graph [goal=\"Fix the add function\"]\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         fix [prompt=\"Fix add in src/lib.rs\", backend=\"cli\"{attrs}]\n \
         ship [shape=parallelogram, script=\"echo shipping\"]\n hold [shape=parallelogram, script=\"echo holding\"]\n \
         start -> fix\n fix -> ship [label=\"ship\"]\n fix -> hold [label=\"hold\"]\n ship -> exit\n hold -> exit\n}}\n"
    )
}

fn one_agent(attrs: &str) -> String {
    format!(
        "digraph W {{\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         fix [prompt=\"Fix add in src/lib.rs\", backend=\"cli\"{attrs}]\n start -> fix -> exit\n}}\n"
    )
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one CLI stage checked whole: what the CLI got, the record, events, routing, files"
)]
fn claude_code_edits_in_a_git_repository_and_its_answer_routes() {
    let cli = CliProject::new();
    let p = &cli.project;
    p.write("src/lib.rs", LIB_RS);
    p.write("README.md", "# adder\n");
    p.write("AGENTS.md", "Always run the tests before finishing.\n");
    if !cli.git_commit_all() {
        return;
    }
    // Dirty before the stage: not a file the agent touched.
    p.write("README.md", "# adder, being fixed\n");
    p.write(
        "w.fabro",
        &routed_workflow(", model=\"sonnet\", reasoning_effort=\"medium\""),
    );
    cli.stand_in(
        "claude",
        "2.0.31 (Claude Code)",
        &format!(
            "{FIX_LIB_RS}\nmkdir -p notes && echo fixed > notes/fix.md\ncat \"$fixtures/claude/edit-and-answer.jsonl\""
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    // The answer's directive chose `ship` over the lexically first `hold`.
    assert_eq!(run.stages(), ["start", "fix", "ship", "exit"]);
    assert!(p.read("src/lib.rs").contains("a + b"));

    // What Claude Code was given: print mode with the stream format, the node's model and effort,
    // in the working directory, the prompt (with the goal and the project memory) on standard input.
    let calls = cli.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    for arg in ["-p", "--verbose"] {
        assert!(call.has(arg), "{:?}", call.args);
    }
    assert_eq!(call.flag("--output-format"), Some("stream-json"));
    assert_eq!(call.flag("--model"), Some("sonnet"));
    assert_eq!(call.flag("--effort"), Some("medium"));
    assert_eq!(call.flag("--resume"), None);
    assert_eq!(canonical(&call.cwd), canonical(p.path()));
    assert!(
        call.stdin.contains("Fix add in src/lib.rs"),
        "{}",
        call.stdin
    );
    assert!(
        call.stdin.contains("Always run the tests"),
        "{}",
        call.stdin
    );
    assert!(
        call.stdin.contains("Fix the add function"),
        "{}",
        call.stdin
    );
    assert_eq!(stage_file(&run, "fix", "prompt.md"), call.stdin);

    // The final answer is the response, in the record and the context.
    let answer = "Fixed `add`: it now adds its arguments, and the tests pass.\n\n{\"preferred_next_label\": \"ship\"}";
    assert_eq!(stage_file(&run, "fix", "response.md"), answer);
    assert_eq!(run.context("response.fix"), answer);

    // Usage, cost, session and files in status.json.
    let status = status(&run, "fix");
    assert_eq!(status["status"], "succeeded");
    assert_eq!(status["model"], "claude-sonnet-4-5-20250929");
    assert_eq!(status["provider"], "anthropic");
    assert_eq!(status["usage"]["input_tokens"], 18 + 36000 + 5120);
    assert_eq!(status["usage"]["cached_tokens"], 36000);
    assert_eq!(status["usage"]["output_tokens"], 412);
    assert_eq!(status["cost_usd"], 0.0421);
    assert_eq!(status["turns"], 4);
    assert_eq!(status["cli"], "claude");
    assert_eq!(status["session_id"], CLAUDE_SESSION);
    assert_eq!(status["tool_calls"], 3);
    assert_eq!(
        strings(&status["files_touched"]),
        ["notes/fix.md", "src/lib.rs"]
    );

    // The CLI's tool calls are run events, and the stage's end carries the files.
    assert_eq!(
        tool_calls(&run, "fix"),
        [
            ("Read".into(), "/home/dev/project/src/lib.rs".into(), false),
            ("Edit".into(), "/home/dev/project/src/lib.rs".into(), false),
            ("Bash".into(), "cargo test".into(), false),
        ]
    );
    let completed = run.events_named("StageCompleted");
    let fix = completed.iter().find(|e| e["node_id"] == "fix").unwrap();
    assert_eq!(
        strings(&fix["files_touched"]),
        ["notes/fix.md", "src/lib.rs"]
    );
    let call_end = &run.events_named("ModelCallCompleted")[0];
    assert_eq!(call_end["usage"]["output_tokens"], 412);

    // The transcript and the raw stream are kept.
    let transcript = stage_file(&run, "fix", "transcript.jsonl");
    assert!(transcript.contains("\"tool_call\""), "{transcript}");
    assert!(transcript.contains("I'll look at the add function first."));
    assert_eq!(
        stage_file(&run, "fix", "stdout.log"),
        std::fs::read_to_string(format!("{FIXTURES}/claude/edit-and-answer.jsonl")).unwrap()
    );

    // The progress display shows the calls under the stage.
    let stderr = run.stderr();
    assert!(stderr.contains("fix: Bash cargo test"), "{stderr}");
    assert_process_group_gone(&stage_dir(&run.record(), "fix"));
}

#[test]
fn codex_outside_git_tracks_files_by_snapshot_and_reports_its_commands() {
    let cli = CliProject::new();
    let p = &cli.project;
    p.write("src/lib.rs", LIB_RS);
    p.write("old.txt", "stale\n");
    p.write("keep.txt", "untouched\n");
    p.write(
        "w.fabro",
        &one_agent(", provider=\"openai\", reasoning_effort=\"low\""),
    );
    cli.stand_in(
        "codex",
        "codex-cli 0.58.0",
        &format!(
            "{FIX_LIB_RS}\nmkdir -p out && echo report > out/report.txt\nrm old.txt\ncat \"$fixtures/codex/edit-and-answer.jsonl\""
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let calls = cli.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.args[0], "exec");
    assert!(call.has("--json"), "{:?}", call.args);
    assert_eq!(call.flag("-c"), Some("model_reasoning_effort=\"low\""));
    assert_eq!(call.flag("--model"), None);
    assert_eq!(call.args.last().map(String::as_str), Some("-"));
    assert!(call.stdin.contains("Fix add in src/lib.rs"));

    let status = status(&run, "fix");
    assert_eq!(
        strings(&status["files_touched"]),
        ["old.txt", "out/report.txt", "src/lib.rs"]
    );
    assert_eq!(status["provider"], "openai");
    assert_eq!(status["model"], "codex default");
    assert_eq!(status["usage"]["input_tokens"], 24763);
    assert_eq!(status["usage"]["cached_tokens"], 24448);
    assert_eq!(status["usage"]["output_tokens"], 122);
    assert!(status.get("cost_usd").is_none(), "{status}");
    assert_eq!(status["session_id"], "0199a213-81c0-7800-8aa1-bbab2a035a53");
    assert_eq!(run.context("outcome"), "succeeded");
    assert!(
        stage_file(&run, "fix", "response.md").starts_with("Changed `add` to add its arguments.")
    );
    assert_eq!(
        tool_calls(&run, "fix"),
        [
            ("shell".into(), "bash -lc 'cat src/lib.rs'".into(), false),
            ("apply_patch".into(), String::new(), false),
            ("shell".into(), "bash -lc 'cargo test'".into(), true),
        ]
    );
    let notes: Vec<Value> = run
        .events_named("Agent.ToolCallCompleted")
        .iter()
        .map(|e| e["note"].clone())
        .collect();
    assert_eq!(notes[2], "exit 101");
    assert!(run.stderr().contains("fix: shell bash -lc 'cargo test'"));
}

#[test]
fn gemini_repairs_a_bad_answer_by_resuming_its_session() {
    let cli = CliProject::new();
    let p = &cli.project;
    p.write("src/lib.rs", LIB_RS);
    p.write(
        "w.fabro",
        &routed_workflow(
            ", provider=\"gemini\", model=\"gemini-2.5-pro\", output_schema=\"routing\"",
        )
        .replace("\"ship\"", "\"done\""),
    );
    cli.stand_in(
        "gemini",
        "0.16.0",
        &format!(
            "for a in \"$@\"; do [ \"$a\" = --resume ] && exec cat \"$fixtures/gemini/repaired.jsonl\"; done\n\
             {FIX_LIB_RS}\ncat \"$fixtures/gemini/edit-and-answer.jsonl\""
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stages(), ["start", "fix", "ship", "exit"]);
    let calls = cli.calls();
    assert_eq!(calls.len(), 2);
    // The prompt goes as `--prompt`, and the repair resumes the session the first call started.
    assert_eq!(calls[0].flag("--output-format"), Some("stream-json"));
    assert_eq!(calls[0].flag("--model"), Some("gemini-2.5-pro"));
    assert!(
        calls[0]
            .flag("--prompt")
            .unwrap()
            .contains("Fix add in src/lib.rs")
    );
    assert_eq!(calls[0].flag("--resume"), None);
    assert_eq!(calls[1].flag("--resume"), Some(GEMINI_SESSION));
    let repair = calls[1].flag("--prompt").unwrap();
    assert!(repair.contains("preferred_next_label"), "{repair}");

    let status = status(&run, "fix");
    assert_eq!(status["repairs"], 1);
    assert_eq!(status["usage"]["input_tokens"], 24939 + 25300);
    assert_eq!(status["model"], "gemini-2.5-pro");
    assert_eq!(strings(&status["files_touched"]), ["src/lib.rs"]);
    assert_eq!(
        stage_file(&run, "fix", "response.md"),
        "{\"outcome\": \"success\", \"preferred_next_label\": \"done\"}"
    );
    // The first answer, streamed in pieces after the last tool call, is in the repair log.
    let repairs = stage_file(&run, "fix", "repairs.md");
    assert!(
        repairs.contains("The add function now adds; the tests could not run here."),
        "{repairs}"
    );
    let calls = tool_calls(&run, "fix");
    assert_eq!(calls.len(), 3);
    assert_eq!(
        calls[2],
        ("run_shell_command".into(), "cargo test".into(), true)
    );
}

/// Runs `one_agent` with a stand-in `claude` running `body`, expecting the stage to fail: the
/// failure's reason and class, and whether the run failed.
fn failed_claude(body: &str) -> (String, String, bool) {
    let cli = CliProject::new();
    cli.project.write("w.fabro", &one_agent(""));
    cli.stand_in("claude", "2.0.31 (Claude Code)", body);
    let run = cli.project.run("w.fabro", &[]);
    assert_eq!(run.stage_status("fix"), "failed", "{}", run.stderr());
    let class = status(&run, "fix")["failure"]["class"]
        .as_str()
        .unwrap()
        .to_owned();
    (failure(&run, "fix"), class, run.code() != Some(0))
}

#[test]
fn a_cli_that_fails_gives_a_failure_naming_it_and_what_to_do() {
    let (reason, class, run_failed) =
        failed_claude("cat \"$fixtures/claude/not-logged-in.jsonl\"\nexit 1");
    assert!(
        reason.contains("`claude` (Claude Code) is not logged in: Invalid API key · Please run /login; run `claude` once and log in"),
        "{reason}"
    );
    // Not logged in is a setup problem: the run stops there.
    assert_eq!(class, "configuration");
    assert!(run_failed);

    let (reason, ..) = failed_claude("cat \"$fixtures/claude/error-result.jsonl\"\nexit 1");
    assert!(
        reason.starts_with("`claude` failed: API Error: 529"),
        "{reason}"
    );

    let (reason, ..) = failed_claude("cat \"$fixtures/claude/truncated.jsonl\"");
    assert!(
        reason.contains("the output of `claude` ended before its result (3 JSON line(s) read)"),
        "{reason}"
    );

    let (reason, ..) = failed_claude("echo 'fatal: the workspace is locked' >&2\nexit 3");
    assert_eq!(
        reason,
        "`claude` exited with code 3: fatal: the workspace is locked"
    );

    let (reason, ..) =
        failed_claude("printf '<html>\\n<body>Service Unavailable</body>\\n</html>\\n'");
    assert_eq!(
        reason,
        "`claude` printed output that is not its stream-json format; its output began:\n  > <html>\n  > <body>Service Unavailable</body>\n  > </html>"
    );
}

#[test]
fn a_codex_turn_that_failed_fails_the_stage_with_its_message() {
    let cli = CliProject::new();
    cli.project
        .write("w.fabro", &one_agent(", model=\"gpt-5-codex\""));
    cli.stand_in(
        "codex",
        "codex-cli 0.58.0",
        "cat \"$fixtures/codex/turn-failed.jsonl\"\nexit 1",
    );
    let run = cli.project.run("w.fabro", &[]);
    assert_eq!(run.stage_status("fix"), "failed");
    assert_eq!(cli.calls()[0].flag("--model"), Some("gpt-5-codex"));
    // No effort set: the CLI's own default, and no flag it might not know.
    assert_eq!(cli.calls()[0].flag("-c"), None);
    let reason = failure(&run, "fix");
    assert!(
        reason.starts_with("`codex` failed: stream disconnected before completion"),
        "{reason}"
    );
    // The reconnect notice on the way is an agent error event.
    assert_eq!(
        run.events_named("Agent.Error")[0]["message"],
        "Reconnecting... 1/5"
    );
}

#[test]
fn a_missing_cli_says_how_to_install_it() {
    // Only the system's directories on PATH: no CLI there.
    let cli = CliProject::with_path_tail("/usr/bin:/bin");
    if Path::new("/usr/bin/claude").exists() || Path::new("/bin/claude").exists() {
        eprintln!("skipping: claude is installed in /usr/bin");
        return;
    }
    cli.project.write("w.fabro", &one_agent(""));
    let run = cli.project.run("w.fabro", &[]);
    assert_ne!(run.code(), Some(0));
    let reason = failure(&run, "fix");
    assert_eq!(
        reason,
        "`claude` (Claude Code) is not installed or not on PATH: install it (`npm install -g @anthropic-ai/claude-code`) and log in, or remove backend=\"cli\" to use the built-in agent"
    );
    assert!(run.stderr().contains("not installed or not on PATH"));
}

#[test]
fn a_timed_out_cli_is_killed_with_everything_it_started() {
    let cli = CliProject::new();
    cli.project.write("w.fabro", &one_agent(", timeout=\"2s\""));
    let child_pid = cli.aside.path().join("child.pid");
    cli.stand_in(
        "claude",
        "2.0.31 (Claude Code)",
        &format!(
            "sleep 300 &\necho $! > '{}'\nhead -1 \"$fixtures/claude/edit-and-answer.jsonl\"\nsleep 300",
            child_pid.display()
        ),
    );
    let started = Instant::now();
    let run = cli.project.run("w.fabro", &[]);
    assert!(started.elapsed() < Duration::from_mins(1));
    assert_eq!(status(&run, "fix")["failure"]["class"], "timeout");
    assert_process_group_gone(&stage_dir(&run.record(), "fix"));
    let pid = std::fs::read_to_string(&child_pid).unwrap();
    run_support::wait_for("the CLI's child to be gone", Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .map_or(true, |stat| stat.contains(") Z "))
    });
}

#[test]
fn validate_warns_of_attributes_a_cli_ignores_and_rejects_a_provider_without_one() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         fix [prompt=\"Fix it\", backend=\"cli\", provider=\"openai\", max_turns=5, allowed_tools=\"read_file\"]\n \
         check [prompt=\"Check it\", backend=\"cli\", model=\"opus\", max_turns=3]\n \
         local [prompt=\"Try it\", backend=\"cli\", provider=\"local\"]\n \
         start -> fix -> check -> local -> exit\n}\n",
    );
    let output = p
        .command(&["validate", "w.fabro", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let diagnostics = report["files"][0]["diagnostics"]
        .as_array()
        .or_else(|| report["diagnostics"].as_array())
        .unwrap_or_else(|| panic!("{report}"))
        .clone();
    let of = |code: &str| -> Vec<(String, u64)> {
        diagnostics
            .iter()
            .filter(|d| d["rule"] == code)
            .map(|d| {
                (
                    d["message"].as_str().unwrap().to_owned(),
                    d["line"]
                        .as_u64()
                        .or_else(|| d["span"]["line"].as_u64())
                        .unwrap_or(0),
                )
            })
            .collect()
    };
    let warnings = of("cli-backend");
    assert_eq!(
        warnings.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(),
        [
            "`max_turns` on `fix` is ignored: Codex CLI (codex) does not support it",
            "`allowed_tools` on `fix` is ignored: Codex CLI (codex) does not support it",
        ],
        "{diagnostics:?}"
    );
    // Claude Code honours max_turns: no warning for `check`.
    let errors = of("cli-provider");
    assert_eq!(errors.len(), 1, "{diagnostics:?}");
    assert!(errors[0].0.contains("provider `local` has no agent CLI"));
}

#[test]
fn models_lists_the_clis_found_with_their_versions() {
    let cli = CliProject::with_path_tail("/usr/bin:/bin");
    cli.stand_in("claude", "2.0.31 (Claude Code)", "exit 0");
    cli.stand_in("gemini", "0.16.0", "exit 0");
    let output = cli.project.command(&["models", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let clis = report["clis"].as_array().unwrap();
    let version = |name: &str| {
        clis.iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{report}"))["version"]
            .clone()
    };
    assert_eq!(version("claude"), "2.0.31 (Claude Code)");
    assert_eq!(version("gemini"), "0.16.0");
    if !Path::new("/usr/bin/codex").exists() {
        assert_eq!(version("codex"), Value::Null);
    }
    let output = cli.project.command(&["models"]).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("claude (anthropic) 2.0.31 (Claude Code)"),
        "{text}"
    );
    assert!(
        text.contains("codex (openai)     not found on PATH"),
        "{text}"
    );
}
