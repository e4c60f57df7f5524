//! The agent task suite: small coding tasks, each one agent node on the local model (Qwen2.5-Coder
//! 1.5B), judged by a command rather than by the agent's word; beside it, the same tasks on the same
//! model through two peer agents, `mini-swe-agent` and `aider` (each from `PyPI`, in a venv under
//! `~/.cache/trellis/`), talking to a llama-server started the way Trellis starts its own. Printed,
//! never asserted.
//!
//! `cargo bench -p trellis-cli --bench agent_tasks` (all tasks; `TRELLIS_AGENT_TASKS=fix-add,rename`
//! for some of them; `TRELLIS_AGENT_PEER=0` for Trellis alone, `TRELLIS_AGENT_PEER=aider` or `=mini`
//! for one peer).
//!
//! Each task is a folder of `benches/agent_tasks/`: `task.md` (what the agent is asked), `files/`
//! (the working directory it starts from) and `check.sh` (run by bash in the working directory
//! afterwards, with `$FIXTURE` the untouched files: exit 0 means solved).

#![allow(
    clippy::disallowed_methods,
    reason = "benchmarks set up and read files around the binaries they run"
)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The longest one agent may work on one task.
const TASK_TIME: Duration = Duration::from_mins(3);
/// Turns (Trellis) or steps (the peer) one task may take.
const TURNS: u32 = 30;
/// The context window both agents' servers get: Trellis's default for the local model.
const CONTEXT: u32 = 16_384;
/// The peers, each at the version the README's figures were taken with.
const MINI_VERSION: &str = "2.4.6";
const AIDER_VERSION: &str = "0.86.2";

/// A peer agent: how it is named, installed and run.
#[derive(Clone, Copy)]
enum Peer {
    Mini,
    Aider,
}

impl Peer {
    const ALL: [Peer; 2] = [Peer::Mini, Peer::Aider];

    /// Its short name (`TRELLIS_AGENT_PEER`, the rows).
    fn name(self) -> &'static str {
        match self {
            Peer::Mini => "mini",
            Peer::Aider => "aider",
        }
    }

    /// Its package and version, as the report names it.
    fn package(self) -> String {
        match self {
            Peer::Mini => format!("mini-swe-agent {MINI_VERSION}"),
            Peer::Aider => format!("aider-chat {AIDER_VERSION}"),
        }
    }

    /// Its program, installed once into a venv under `~/.cache/trellis/PACKAGE-VERSION/`.
    fn install(self) -> Result<PathBuf, String> {
        let (package, version, program) = match self {
            Peer::Mini => ("mini-swe-agent", MINI_VERSION, "mini"),
            Peer::Aider => ("aider-chat", AIDER_VERSION, "aider"),
        };
        installed(package, version, program)
    }

    fn run(self, program: &Path, server: &Server, task: &Path, dir: &Path) -> Outcome {
        match self {
            Peer::Mini => mini_run(program, server, task, dir),
            Peer::Aider => aider_run(program, server, task, dir),
        }
    }
}

/// What one agent did on one task.
#[derive(Default)]
struct Outcome {
    solved: bool,
    took: Duration,
    turns: u64,
    tool_calls: u64,
    input: u64,
    cached: u64,
    output: u64,
    /// Why it ended unsolved, when that is known.
    note: String,
}

fn main() {
    let Some(files) = trellis_test::local_model_files() else {
        println!(
            "agent tasks: skipped (the local model is not installed; run scripts/local-model.sh)"
        );
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/agent_tasks");
    let only = std::env::var("TRELLIS_AGENT_TASKS").ok();
    let mut tasks: Vec<String> = std::fs::read_dir(&root)
        .expect("the task folder")
        .filter_map(Result::ok)
        .filter(|e| e.path().join("task.md").is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|t| t == name))
        })
        .collect();
    tasks.sort();
    // Outside this repository, as a user's project would be: a task's crate inside it would be
    // taken for a member of Trellis's own workspace.
    let work = tempfile::Builder::new()
        .prefix("trellis-agent-tasks-")
        .tempdir()
        .expect("a temp dir");
    // `TRELLIS_AGENT_KEEP=1` keeps the working directories, run records and trajectories to read.
    let work_path = if std::env::var("TRELLIS_AGENT_KEEP").as_deref() == Ok("1") {
        println!("working directories kept in {}", work.path().display());
        work.keep()
    } else {
        work.path().to_path_buf()
    };
    let asked = std::env::var("TRELLIS_AGENT_PEER").ok();
    let peers: Vec<(Peer, Result<PathBuf, String>)> = Peer::ALL
        .into_iter()
        .map(|peer| {
            let wanted = asked
                .as_deref()
                .is_none_or(|a| a.split(',').any(|name| name == peer.name()));
            let program = if wanted {
                peer.install()
            } else {
                Err(format!(
                    "not asked for (TRELLIS_AGENT_PEER={})",
                    asked.as_deref().unwrap_or_default()
                ))
            };
            (peer, program)
        })
        .collect();
    let server = peers
        .iter()
        .any(|(_, program)| program.is_ok())
        .then(|| Server::start(&files.server, &files.default_model));

    println!(
        "agent tasks on Qwen2.5-Coder-1.5B (local), {} tasks; each judged by its check.sh",
        tasks.len()
    );
    let mut rows = Vec::new();
    for task in &tasks {
        let dir = root.join(task);
        let ours = trellis(&dir, &work_path.join(format!("trellis-{task}")));
        println!("  {task:<16} trellis {}", line(&ours));
        let mut theirs = Vec::new();
        for (peer, program) in &peers {
            let outcome = match (program, &server) {
                (Ok(program), Some(server)) => {
                    let dir_of_peer = work_path.join(format!("{}-{task}", peer.name()));
                    let outcome = peer.run(program, server, &dir, &dir_of_peer);
                    println!("  {:<16} {:<7} {}", "", peer.name(), line(&outcome));
                    Some(outcome)
                }
                _ => None,
            };
            theirs.push(outcome);
        }
        rows.push((task.clone(), ours, theirs));
    }
    report(&rows, &peers);
}

/// One line of figures.
fn line(outcome: &Outcome) -> String {
    let mut text = format!(
        "{} {:>6.1}s {:>3} turns {:>3} calls  in {:>7} cached {:>7} out {:>6}",
        if outcome.solved {
            "solved  "
        } else {
            "UNSOLVED"
        },
        outcome.took.as_secs_f64(),
        outcome.turns,
        outcome.tool_calls,
        outcome.input,
        outcome.cached,
        outcome.output,
    );
    if !outcome.note.is_empty() {
        let _ = write!(text, "  ({})", outcome.note);
    }
    text
}

/// The median of sorted `times`: the middle one, or the mean of the middle two of an even count
/// (until 2026-11-29 the upper of the two).
fn median(times: &[Duration]) -> Duration {
    match times.len() {
        0 => Duration::ZERO,
        count if count % 2 == 1 => times[count / 2],
        count => (times[count / 2 - 1] + times[count / 2]) / 2,
    }
}

/// A task's name and how each agent did: Trellis, then each peer in [`Peer::ALL`] that ran.
type Row = (String, Outcome, Vec<Option<Outcome>>);

fn report(rows: &[Row], peers: &[(Peer, Result<PathBuf, String>)]) {
    let total = |pick: &dyn Fn(&Row) -> Option<&Outcome>| {
        let outcomes: Vec<&Outcome> = rows.iter().filter_map(pick).collect();
        let solved = outcomes.iter().filter(|o| o.solved).count();
        let mut times: Vec<Duration> = outcomes.iter().map(|o| o.took).collect();
        times.sort();
        (solved, outcomes.len(), median(&times))
    };
    let (solved, count, median) = total(&|row| Some(&row.1));
    println!(
        "trellis: {solved} of {count} solved [≥ 10 of 12], median {:.1}s per task [≤ 60 s]",
        median.as_secs_f64()
    );
    for (at, (peer, program)) in peers.iter().enumerate() {
        match program {
            Ok(_) => {
                let (peer_solved, peer_count, peer_median) =
                    total(&|row| row.2.get(at).and_then(Option::as_ref));
                println!(
                    "{}: {peer_solved} of {peer_count} solved, median {:.1}s per task  [trellis ≥ it: {}]",
                    peer.package(),
                    peer_median.as_secs_f64(),
                    if solved >= peer_solved { "yes" } else { "no" }
                );
            }
            Err(why) => println!("{}: skipped ({why})", peer.package()),
        }
    }
}

/// A task's working directory, fresh from its files.
fn fresh(task: &Path, dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("mkdir");
    let files = task.join("files");
    if files.is_dir() {
        let status = Command::new("cp")
            .arg("-r")
            .arg(files.join("."))
            .arg(dir)
            .status()
            .expect("cp runs");
        assert!(status.success());
    }
}

/// Runs the task's judge in `dir`.
fn judged(task: &Path, dir: &Path) -> bool {
    Command::new("bash")
        .arg(task.join("check.sh"))
        .current_dir(dir)
        .env("FIXTURE", task.join("files"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `command` in a process group of its own, quiet, for at most [`TASK_TIME`] (past that the
/// whole group is killed); whether it ended by itself, and how long it took.
fn run_for_task_time(mut command: Command) -> (bool, Duration) {
    use std::os::unix::process::CommandExt as _;
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("the agent starts");
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return (true, started.elapsed());
        }
        if started.elapsed() > TASK_TIME {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            return (false, started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The task as one agent node on the local model.
fn trellis(task: &Path, dir: &Path) -> Outcome {
    fresh(task, dir);
    let prompt = std::fs::read_to_string(task.join("task.md")).expect("task.md");
    let workflow = format!(
        "digraph Task {{\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  work [prompt=\"{}\", provider=\"local\", max_turns={TURNS}]\n  start -> work -> exit\n}}\n",
        prompt.trim().replace('\\', "\\\\").replace('"', "\\\"")
    );
    let runs = dir.with_extension("runs");
    let file = dir.with_extension("fabro");
    std::fs::write(&file, workflow).expect("write");
    let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
    command
        .arg("run")
        .arg(&file)
        .args(["--json", "--runs-dir"])
        .arg(&runs)
        .current_dir(dir)
        .env("TRELLIS_CACHE_DIR", trellis_test::cache_dir())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("GEMINI_API_KEY");
    let (finished, took) = run_for_task_time(command);
    let status = std::fs::read_dir(&runs)
        .ok()
        .and_then(|mut runs| runs.next())
        .and_then(Result::ok)
        .and_then(|run| std::fs::read_dir(run.path().join("stages")).ok())
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .find(|stage| stage.file_name().to_string_lossy().contains("-work@"))
        .and_then(|stage| std::fs::read_to_string(stage.path().join("status.json")).ok())
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .unwrap_or(Value::Null);
    let number = |value: &Value| value.as_u64().unwrap_or(0);
    let usage = &status["usage"];
    let solved = judged(task, dir);
    let note = note(finished, solved, status["failure"]["reason"].as_str());
    Outcome {
        solved,
        took,
        turns: number(&status["turns"]),
        tool_calls: number(&status["tool_calls"]),
        input: number(&usage["input_tokens"]),
        cached: number(&usage["cached_tokens"]),
        output: number(&usage["output_tokens"]),
        note,
    }
}

/// A llama-server for the peer, started as Trellis starts its own (same model, context, template).
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(binary: &Path, model: &Path) -> Self {
        let port = trellis_test::http::free_port();
        let threads = std::thread::available_parallelism().map_or(2, usize::from);
        let child = Command::new(binary)
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--ctx-size", &CONTEXT.to_string(), "--parallel", "1"])
            .args(["--threads", &threads.to_string()])
            .args(trellis_llm::local::SERVER_TUNING)
            .args(["--alias", "qwen2.5-coder-1.5b", "--jinja", "--no-webui"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("llama-server starts");
        let server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        trellis_test::http::wait_for_port(port, "llama-server");
        // It answers 503 while it loads the model.
        let deadline = Instant::now() + Duration::from_mins(2);
        while trellis_test::http::Request::new(port, "GET", "/health")
            .send()
            .status
            != 200
        {
            assert!(
                Instant::now() < deadline,
                "llama-server did not load the model"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The task through mini-swe-agent, on `server`.
fn mini_run(mini: &Path, server: &Server, task: &Path, dir: &Path) -> Outcome {
    fresh(task, dir);
    let prompt = std::fs::read_to_string(task.join("task.md")).expect("task.md");
    let trajectory = dir.with_extension("traj.json");
    let mut command = Command::new(mini);
    command
        .args(["--yolo", "--exit-immediately", "--cost-limit", "0"])
        // Its text-based variant: the model writes one bash block per step (a 1.5B model calls no
        // native tools).
        .args([
            "-c",
            "mini_textbased.yaml",
            "--model-class",
            "litellm_textbased",
        ])
        .arg("-c")
        .arg(format!("model.model_kwargs.api_base={}/v1", server.url))
        .args(["-c", "model.model_kwargs.api_key=none"])
        .args(["-c", "model.model_kwargs.temperature=0.0"])
        .arg("-c")
        .arg(format!("agent.step_limit={TURNS}"))
        .args(["-m", "openai/qwen2.5-coder-1.5b"])
        .arg("-t")
        .arg(prompt.trim())
        .arg("-o")
        .arg(&trajectory)
        .current_dir(dir)
        .env("MSWEA_COST_TRACKING", "ignore_errors")
        .env("MSWEA_CONFIGURED", "true")
        .env("MSWEA_SILENT_STARTUP", "1")
        .env("OPENAI_API_KEY", "none");
    let (finished, took) = run_for_task_time(command);
    let trajectory: Value = std::fs::read_to_string(&trajectory)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null);
    let messages = trajectory["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let answers: Vec<&Value> = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    let usage = |field: &str| -> u64 {
        answers
            .iter()
            .map(|m| {
                let usage = &m["extra"]["response"]["usage"];
                match field {
                    "cached" => usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
                    other => usage[other].as_u64(),
                }
                .unwrap_or(0)
            })
            .sum()
    };
    let solved = judged(task, dir);
    let exit = trajectory["info"]["exit_status"]
        .as_str()
        .unwrap_or_default();
    Outcome {
        solved,
        took,
        turns: answers.len() as u64,
        tool_calls: answers.len() as u64,
        input: usage("prompt_tokens"),
        cached: usage("cached"),
        output: usage("completion_tokens"),
        note: note(finished, solved, Some(exit)),
    }
}

/// The task through aider, on `server`: every file of the task's working directory added to its
/// chat (as a user hands aider the files to work on), the task as its one message, its "whole"
/// edit format (the model writes each file it changes whole; a 1.5B model's diffs do not apply),
/// confirmations answered yes; no git, no repository map.
fn aider_run(aider: &Path, server: &Server, task: &Path, dir: &Path) -> Outcome {
    fresh(task, dir);
    let prompt = std::fs::read_to_string(task.join("task.md")).expect("task.md");
    let history = dir.with_extension("aider.md");
    let mut command = Command::new(aider);
    command
        .args(["--model", "openai/qwen2.5-coder-1.5b"])
        .arg("--openai-api-base")
        .arg(format!("{}/v1", server.url))
        .args(["--openai-api-key", "none", "--edit-format", "whole"])
        .args([
            "--yes-always",
            "--no-git",
            "--no-auto-commits",
            "--map-tokens",
            "0",
        ])
        .args([
            "--no-show-model-warnings",
            "--no-check-update",
            "--analytics-disable",
        ])
        .args(["--no-stream", "--no-pretty", "--no-show-release-notes"])
        .arg("--chat-history-file")
        .arg(&history)
        .arg("--input-history-file")
        .arg(dir.with_extension("aider.input"))
        .args(["--message", prompt.trim()])
        .args(files_under(dir))
        .current_dir(dir)
        // Its model price list is fetched from the network unless told to use its own copy.
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True");
    let (finished, took) = run_for_task_time(command);
    let history = std::fs::read_to_string(&history).unwrap_or_default();
    // `> Tokens: 1.2k sent, 84 received.` after each model call (aider rounds to hundreds past
    // a thousand).
    let calls: Vec<(u64, u64)> = history
        .lines()
        .filter_map(|l| l.trim_start_matches("> ").strip_prefix("Tokens: "))
        .map(|l| {
            let count = |word: &str| {
                l.split(", ")
                    .find_map(|part| part.trim_end_matches(['.', ' ']).strip_suffix(word))
                    .map_or(0, aider_count)
            };
            (count(" sent"), count(" received"))
        })
        .collect();
    let solved = judged(task, dir);
    Outcome {
        solved,
        took,
        turns: calls.len() as u64,
        tool_calls: history.matches("> Applied edit to ").count() as u64,
        input: calls.iter().map(|c| c.0).sum(),
        cached: 0,
        output: calls.iter().map(|c| c.1).sum(),
        note: note(finished, solved, None),
    }
}

/// A count as aider prints it: `84`, or `1.2k` past a thousand.
fn aider_count(text: &str) -> u64 {
    let text = text.trim();
    let Some(thousands) = text.strip_suffix('k') else {
        return text.parse().unwrap_or(0);
    };
    let (whole, tenths) = thousands.split_once('.').unwrap_or((thousands, "0"));
    whole.parse::<u64>().unwrap_or(0) * 1000 + tenths.parse::<u64>().unwrap_or(0) * 100
}

/// Every file under `dir`, as paths relative to it.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if let Ok(relative) = path.strip_prefix(dir) {
                files.push(relative.to_path_buf());
            }
        }
    }
    files.sort();
    files
}

/// Why an agent's task ended unsolved, in a few words: stopped at the time limit, else what it said.
fn note(finished: bool, solved: bool, why: Option<&str>) -> String {
    if !finished {
        format!("stopped after {} s", TASK_TIME.as_secs())
    } else if solved {
        String::new()
    } else {
        why.unwrap_or_default().chars().take(80).collect()
    }
}

/// `program` of `package` at `version`, in a venv made once under
/// `~/.cache/trellis/PACKAGE-VERSION/`.
fn installed(package: &str, version: &str, program: &str) -> Result<PathBuf, String> {
    let venv = trellis_test::cache_dir().join(format!("{package}-{version}"));
    let path = venv.join("bin").join(program);
    if path.is_file() {
        return Ok(path);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .map_err(|e| format!("python3: {e}"))?;
    if !made.success() {
        return Err("python3 -m venv failed".to_owned());
    }
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "-q", &format!("{package}=={version}")])
        .status()
        .map_err(|e| format!("pip: {e}"))?;
    if installed.success() && path.is_file() {
        Ok(path)
    } else {
        Err(format!("pip could not install {package}=={version}"))
    }
}
