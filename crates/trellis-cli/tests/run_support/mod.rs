//! Shared helpers for end-to-end run tests: a scratch project directory, running the real binary in it
//! with its own runs directory, and reading the run record back.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Project {
    pub dir: tempfile::TempDir,
    /// Extra environment for every command (model providers, the model cache).
    pub env: Vec<(String, String)>,
}

/// Provider settings a developer's shell may hold; tests start without them.
const MODEL_VARIABLES: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "GEMINI_API_KEY",
    "GEMINI_BASE_URL",
    "OPENAI_COMPATIBLE_BASE_URL",
    "OPENAI_COMPATIBLE_API_KEY",
    "TRELLIS_CONFIG",
    "TRELLIS_MODEL",
    "TRELLIS_LLAMA_SERVER",
    "TRELLIS_LOCAL_MODEL",
    "TRELLIS_LOCAL_MODEL_ID",
];

pub struct Run {
    pub output: Output,
    pub summary: Value,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    pub fn record(&self) -> PathBuf {
        PathBuf::from(
            self.summary["run_dir"]
                .as_str()
                .unwrap_or_else(|| panic!("no run_dir in {}\n{}", self.summary, self.stderr())),
        )
    }

    pub fn checkpoint(&self) -> Value {
        checkpoint_of(&self.record())
    }

    pub fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.record().join("events.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad event line {l}: {e}")))
            .collect()
    }

    /// Node ids of finished stages, in order.
    pub fn stages(&self) -> Vec<String> {
        self.checkpoint()["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["node_id"].as_str().unwrap().to_owned())
            .collect()
    }

    pub fn context(&self, key: &str) -> Value {
        self.checkpoint()["context"][key].clone()
    }

    /// The ids in `parallel.results`, in order.
    pub fn branch_ids(&self) -> Vec<String> {
        self.context("parallel.results")
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The status of the first finished stage of `node`.
    pub fn stage_status(&self, node: &str) -> String {
        let checkpoint = self.checkpoint();
        let stage = checkpoint["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["node_id"] == node)
            .cloned();
        stage.unwrap_or_else(|| panic!("no stage of `{node}`"))["status"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    pub fn events_named(&self, name: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == name)
            .collect()
    }

    /// Each `ModelWarning` of the run, as `node: message`.
    pub fn warnings(&self) -> Vec<String> {
        self.events_named("ModelWarning")
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e["node_id"].as_str().unwrap_or(""),
                    e["message"].as_str().unwrap_or("")
                )
            })
            .collect()
    }
}

impl Run {
    /// Positions in the event log of `event` for `node`.
    pub fn positions(&self, event: &str, node: &str) -> Vec<usize> {
        self.events()
            .iter()
            .enumerate()
            .filter(|(_, e)| e["event"] == event && e["node_id"] == node)
            .map(|(i, _)| i)
            .collect()
    }

    /// Where `node`'s stage ended (completed or failed) in the event log, if it did.
    pub fn stage_end(&self, node: &str) -> Option<usize> {
        let mut ends = self.positions("StageCompleted", node);
        ends.extend(self.positions("StageFailed", node));
        ends.into_iter().min()
    }

    /// Where `node`'s first stage started in the event log.
    pub fn stage_start(&self, node: &str) -> usize {
        self.positions("StageStarted", node)
            .into_iter()
            .min()
            .unwrap_or_else(|| panic!("`{node}` never started"))
    }
}

/// Waits until the process group recorded in a stage directory's `process` file is gone. A stage
/// stopped before its command spawned has no group, and nothing to check. (Killed processes linger
/// as zombies until init reaps them, so this polls briefly.)
pub fn assert_process_group_gone(stage_dir: &Path) {
    wait_for(
        &format!("the processes of {} to be gone", stage_dir.display()),
        Duration::from_secs(5),
        || processes_of(stage_dir) == 0,
    );
}

/// Whether `pid` is running (not ended, nor ended and not yet waited for).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// How many processes carry the stage's `TRELLIS_STAGE_DIR`.
pub fn processes_of(stage_dir: &Path) -> usize {
    let marker = format!("TRELLIS_STAGE_DIR={}", stage_dir.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter(|e| {
            std::fs::read(e.path().join("environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|entry| entry == marker.as_bytes())
            })
        })
        .count()
}

/// The directory of `node`'s first stage attempt in a run record.
pub fn stage_dir(record: &Path, node: &str) -> PathBuf {
    std::fs::read_dir(record.join("stages"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split_once('-'))
                .is_some_and(|(_, rest)| rest.starts_with(&format!("{node}@")))
        })
        .min()
        .unwrap_or_else(|| panic!("no stage directory of `{node}`"))
}

/// Polls `done` until it holds, failing the test after `deadline`.
pub fn wait_for(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A run's checkpoint as `trellis show --json` reads it — the last snapshot with the journal
/// replayed — also while the run is going or after it was killed.
pub fn checkpoint_of(record: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("show")
        .arg(record)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    shown["checkpoint"].clone()
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

impl Project {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            env: Vec::new(),
        }
    }

    /// Adds an environment variable to every command of this project.
    #[must_use]
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, contents).unwrap();
        path
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path().join(name)).unwrap_or_default()
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
        command
            .args(args)
            .current_dir(self.path())
            .env("NO_COLOR", "1")
            .env("TRELLIS_RUNS_DIR", self.path().join("runs"))
            // No provider and no local model unless a test asks for them.
            .env("TRELLIS_CACHE_DIR", self.path().join(".no-model-cache"))
            .env("XDG_CONFIG_HOME", self.path().join(".config"));
        for name in MODEL_VARIABLES {
            command.env_remove(name);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command.stdin(std::process::Stdio::null());
        command
    }

    /// `trellis run FILE --json ARGS...`, with the JSON summary parsed.
    pub fn run(&self, file: &str, args: &[&str]) -> Run {
        let mut all = vec!["run", file, "--json"];
        all.extend_from_slice(args);
        Self::finish(self.command(&all).output().unwrap())
    }

    pub fn resume(&self, run_id: &str, args: &[&str]) -> Run {
        let mut all = vec!["resume", run_id, "--json"];
        all.extend_from_slice(args);
        Self::finish(self.command(&all).output().unwrap())
    }

    fn finish(output: Output) -> Run {
        let summary = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        Run { output, summary }
    }

    /// The directory of the project's only run.
    pub fn only_run(&self) -> PathBuf {
        let runs: Vec<PathBuf> = std::fs::read_dir(self.path().join("runs"))
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        assert_eq!(runs.len(), 1, "{runs:?}");
        runs[0].clone()
    }

    /// Starts `trellis run FILE` in the background, as a user would in another terminal.
    pub fn spawn_run(&self, file: &str) -> std::process::Child {
        self.command(&["run", file])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Whether the (only) run has its directory yet.
    pub fn run_exists(&self) -> bool {
        self.path().join("runs").is_dir()
            && std::fs::read_dir(self.path().join("runs"))
                .unwrap()
                .next()
                .is_some()
    }

    /// Waits until the run's event log shows `event` for `node`.
    pub fn wait_for_event(&self, event: &str, node: &str) {
        self.wait_for_event_within(event, node, Duration::from_secs(20));
    }

    /// Waits until the run's event log shows `event` for `node`, for at most `deadline`.
    pub fn wait_for_event_within(&self, event: &str, node: &str, deadline: Duration) {
        let (event, node) = (format!("\"{event}\""), format!("\"node_id\":\"{node}\""));
        wait_for(&format!("{event} of {node}"), deadline, || {
            self.run_exists()
                && std::fs::read_to_string(self.only_run().join("events.jsonl"))
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.contains(&event) && l.contains(&node))
        });
    }
}
