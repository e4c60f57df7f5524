//! The security campaign's probes against what a workflow can make Trellis read and write: node ids
//! that would leave the run record, `@file` references to the process's environment, secrets in the
//! environment by name, in URLs and in encodings, workflows that include themselves, answers given
//! up front that fit no option, and output written to steer the terminal that shows it.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use base64::Engine as _;
use run_support::{Project, stage_dir};

const ESCAPING_YAML: &str = "id: escape\nname: Escape\nentry: start\nnodes:\n  start:\n    type: command\n    script: echo hi\n  \"../../../../tmp/x/ESCAPED/pwn\":\n    type: command\n    script: echo out\nedges:\n  - from: start\n    to: \"../../../../tmp/x/ESCAPED/pwn\"\n";

#[test]
fn a_yaml_node_id_cannot_write_outside_the_run_record() {
    let p = Project::new();
    p.write("escape.yml", ESCAPING_YAML);
    let validate = p.command(&["validate", "escape.yml"]).output().unwrap();
    assert_eq!(validate.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&validate.stdout);
    assert!(
        stdout.contains("error[node-id]: node id `../../../../tmp/x/ESCAPED/pwn` contains `/`"),
        "{stdout}"
    );
    for args in [&["--dry-run"][..], &[][..]] {
        let run = p.run("escape.yml", args);
        assert_eq!(run.code(), Some(1), "{}", run.stderr());
    }
    assert!(!p.run_exists(), "a run was recorded");
    assert!(!std::path::Path::new("/tmp/x/ESCAPED").exists());
}

#[test]
fn a_prompt_file_in_proc_is_refused_before_anything_is_recorded() {
    let p = Project::new().with_env("PROBE_API_KEY", "sk-probe-0123456789-NEVER");
    p.write(
        "leak.fabro",
        "digraph L { start [shape=Mdiamond]\n exit [shape=Msquare]\n leak [shape=tab, prompt=\"@/proc/self/environ\"]\n start -> leak -> exit }",
    );
    let run = p.run("leak.fabro", &["--dry-run"]);
    assert_eq!(run.code(), Some(1));
    let stderr = run.stderr();
    assert!(
        stderr.contains("`prompt` refers to `/proc/self/environ`, which is in /proc"),
        "{stderr}"
    );
    assert!(!stderr.contains("sk-probe"));
    assert!(!p.run_exists(), "a run was recorded");
    // A reference that climbs out of the workflow's directory needs the user's word.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("prompt.md"), "Say hi").unwrap();
    p.write(
        "climb.fabro",
        &format!(
            "digraph C {{ start [shape=Mdiamond]\n exit [shape=Msquare]\n hi [shape=tab, prompt=\"@{}\"]\n start -> hi -> exit }}",
            outside.path().join("prompt.md").display()
        ),
    );
    let refused = p.command(&["validate", "climb.fabro"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stdout).contains("outside the workflow's directory"));
    let allowed = p
        .command(&["validate", "climb.fabro", "--allow-dir"])
        .arg(outside.path())
        .output()
        .unwrap();
    assert_eq!(
        allowed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&allowed.stdout)
    );
}

#[test]
fn secrets_by_name_and_in_urls_never_reach_a_command() {
    let p = Project::new()
        .with_env("AWS_SECRET_ACCESS_KEY", "aws-secret-0123456789")
        .with_env("API_KEY", "plain-api-key-0123456789")
        .with_env("DATABASE_URL", "postgres://user:db-pass-0123456789@db/app")
        .with_env(
            "GOOGLE_APPLICATION_CREDENTIALS_JSON",
            "{\"k\":\"gcp-0123456789\"}",
        )
        .with_env("HARMLESS_SETTING", "visible-value");
    p.write(
        "env.fabro",
        "digraph E { start [shape=Mdiamond]\n exit [shape=Msquare]\n show [shape=parallelogram, script=\"env\"]\n start -> show -> exit }",
    );
    let run = p.run("env.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let out = std::fs::read_to_string(stage_dir(&run.record(), "show").join("stdout.log")).unwrap();
    assert!(out.contains("HARMLESS_SETTING=visible-value"), "{out}");
    for name in [
        "AWS_SECRET_ACCESS_KEY",
        "API_KEY",
        "DATABASE_URL",
        "GOOGLE_APPLICATION_CREDENTIALS_JSON",
    ] {
        assert!(
            !out.contains(&format!("{name}=")),
            "{name} reached the command"
        );
    }
}

#[test]
fn a_secret_passed_on_is_redacted_in_every_common_encoding() {
    let secret = "sk-encoded-0123456789abcdef";
    let p = Project::new().with_env("API_KEY", secret);
    // The node passes the key on, and the command prints it plainly and encoded.
    p.write(
        "enc.fabro",
        "digraph E { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         leak [shape=parallelogram, env=\"API_KEY\", script=\"echo plain $API_KEY; printf 'x%s' \\\"$API_KEY\\\" | base64 -w0; echo; printf '%s' \\\"$API_KEY\\\" | od -An -tx1 | tr -d ' \\\\n'; echo; python3 -c 'import os,urllib.parse;print(urllib.parse.quote(os.environ[\\\"API_KEY\\\"], safe=\\\"\\\"))'\"]\n \
         start -> leak -> exit }",
    );
    let run = p.run("enc.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let out = std::fs::read_to_string(stage_dir(&run.record(), "leak").join("stdout.log")).unwrap();
    let hex = secret.bytes().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    });
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("x{secret}"));
    assert!(out.contains("[redacted API_KEY]"), "{out}");
    for form in [secret, &hex, &b64[4..b64.len() - 4], "sk%2Dencoded"] {
        assert!(!out.contains(form), "`{form}` in: {out}");
    }
}

#[test]
fn a_workflow_that_includes_itself_is_invalid_and_never_runs() {
    let p = Project::new();
    // The campaign's repro: fan-out branches that run this very file.
    p.write(
        "self.fabro",
        "digraph R { start [shape=Mdiamond]\n exit [shape=Msquare]\n fan [shape=component]\n \
         a [shape=house, workflow=\"self.fabro\"]\n b [shape=house, workflow=\"self.fabro\"]\n \
         merge [shape=tripleoctagon]\n start -> fan\n fan -> a -> merge\n fan -> b -> merge\n merge -> exit }",
    );
    let validate = p.command(&["validate", "self.fabro"]).output().unwrap();
    assert_eq!(validate.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&validate.stdout);
    assert!(
        stdout.contains("leads into workflows that include themselves: self.fabro → self.fabro"),
        "{stdout}"
    );
    let started = Instant::now();
    let run = p.run("self.fabro", &["--max-steps", "50"]);
    assert_eq!(run.code(), Some(1));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(!p.run_exists(), "a run was recorded");
}

#[test]
fn sub_workflows_nesting_deeper_than_eight_stop_the_run_once() {
    let p = Project::new();
    // A chain of ten files, each running the next: no cycle, just too deep.
    for level in 0..10 {
        let body = if level < 9 {
            format!(
                "next [shape=house, workflow=\"level{}.fabro\"]\n start -> next -> exit",
                level + 1
            )
        } else {
            "leaf [shape=parallelogram, script=\"echo leaf\"]\n start -> leaf -> exit".to_owned()
        };
        p.write(
            &format!("level{level}.fabro"),
            &format!(
                "digraph L{level} {{ start [shape=Mdiamond]\n exit [shape=Msquare]\n {body} }}"
            ),
        );
    }
    let run = p.run("level0.fabro", &[]);
    assert_eq!(run.code(), Some(1), "{}", run.stderr());
    let error = run.summary["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error.contains("sub-workflows nest more than 8 deep at `next`"),
        "{error}"
    );
    assert_eq!(error.matches("nest more than").count(), 1, "{error}");
}

#[test]
fn the_step_budget_counts_the_stages_of_sub_workflows() {
    let p = Project::new();
    let stages = (0..30).fold(String::new(), |mut text, i| {
        let _ = writeln!(text, " s{i} [shape=parallelogram, script=\"true\"]");
        text
    });
    let chain: Vec<String> = (0..30).map(|i| format!("s{i}")).collect();
    p.write(
        "child.fabro",
        &format!(
            "digraph C {{ start [shape=Mdiamond]\n exit [shape=Msquare]\n{stages} start -> {} -> exit }}",
            chain.join(" -> ")
        ),
    );
    p.write(
        "parent.fabro",
        "digraph P { start [shape=Mdiamond]\n exit [shape=Msquare]\n sub [shape=house, workflow=\"child.fabro\"]\n start -> sub -> exit }",
    );
    let run = p.run("parent.fabro", &["--max-steps", "10"]);
    assert_eq!(run.code(), Some(1), "{}", run.stderr());
    let error = run.summary["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("executed 10 stages"), "{error}");
}

const GATE: &str = "digraph G { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
    bad [shape=parallelogram, script=\"echo the fail path\"]\n \
    ask [shape=hexagon, label=\"Ship?\"]\n start -> ask\n ask -> exit [label=\"[A] Approve\"]\n \
    ask -> bad [label=\"[R] Reject\"]\n bad -> exit }";

#[test]
fn an_answer_that_names_no_option_stops_before_the_run_starts() {
    let p = Project::new();
    p.write("gate.fabro", GATE);
    p.write("answers.json", "{\"ask\": \"bogus\"}");
    let run = p.run("gate.fabro", &["--answers", "answers.json"]);
    assert_eq!(run.code(), Some(2));
    assert!(
        run.stderr().contains(
            "the answer `bogus` for gate `ask` is not one of its options: [A] Approve, [R] Reject"
        ),
        "{}",
        run.stderr()
    );
    assert!(!p.run_exists(), "a run was recorded");
    p.write("answers.json", "{\"ask\": \"r\"}");
    let run = p.run("gate.fabro", &["--answers", "answers.json"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
}

#[test]
fn a_dry_run_never_waits_at_a_gate_timeout() {
    let p = Project::new();
    p.write(
        "timed.fabro",
        "digraph G { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         ask [shape=hexagon, label=\"Ship?\", timeout=\"1h\", human.default_choice=\"A\"]\n \
         start -> ask\n ask -> exit [label=\"[A] Approve\"]\n ask -> exit [label=\"[R] Reject\"] }",
    );
    let started = Instant::now();
    let run = p.run("timed.fabro", &["--dry-run"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// What a stage writes is shown in summary lines (the failure of `run`, `show`'s context) with its
/// control characters escaped: a hostile output cannot retitle the terminal, clear it or move the
/// cursor over what `trellis` drew.
#[test]
fn output_that_would_steer_the_terminal_is_shown_escaped() {
    let p = Project::new();
    p.write(
        "w.fabro",
        "digraph \"W\x1b[31m\" { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         c [shape=parallelogram, script=\"printf 'x\\033]0;pwned\\007y\\033[2J' >&2; exit 1\"]\n \
         start -> c -> exit }",
    );
    let validate = p.command(&["validate", "w.fabro"]).output().unwrap();
    let said = String::from_utf8_lossy(&validate.stdout);
    assert!(
        said.starts_with("Workflow: W\\u{1b}[31m (3 nodes"),
        "{said:?}"
    );
    let run = p.run("w.fabro", &[]);
    assert!(!run.stderr().contains('\x1b'), "{:?}", run.stderr());
    assert!(
        run.stderr()
            .contains("the command exited with code 1: x\\u{1b}]0;pwned\\u{7}y\\u{1b}[2J"),
        "{}",
        run.stderr()
    );
    let id = run
        .record()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let show = p.command(&["show", &id]).output().unwrap();
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(!shown.contains('\x1b'), "{shown:?}");
    assert!(
        shown.contains("command.stderr = x\\u{1b}]0;pwned\\u{7}y\\u{1b}[2J"),
        "{shown}"
    );
    // `trellis logs` prints the output whole, as it was written.
    let logs = p.command(&["logs", &id, "c"]).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&logs.stderr),
        "x\x1b]0;pwned\x07y\x1b[2J"
    );
}
