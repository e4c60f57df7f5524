//! Benchmark: the engine's own cost per stage (`cargo bench -p trellis-cli`), every figure next to its
//! target (issue "engine speed"):
//! - a chain of 1,000 `true` command stages run by `trellis run --sandbox none`, against a loop that
//!   starts `sh -c true` as often through Trellis's spawner, as a stage does (the same process work
//!   without the engine): the cost per stage over it; and what the sandboxes cost per command (the
//!   spawner and its reaping over a bare `sh -c true`, bubblewrap over them);
//! - the same chain in LangGraph 1.2 with its SQLite checkpointer, one `sh -c true` per node, when
//!   `python3` can install `langgraph==1.2.22` and `langgraph-checkpoint-sqlite` into a venv under
//!   `~/.cache/trellis/` (skipped with the reason otherwise), and the loop alone against it (the
//!   least the ratio can be on the host);
//! - the cost per stage at 250, 1,000, 2,000 and 10,000 stages, and 2,000 against 250;
//! - the cost a working tree of 20,000 ordinary files adds to each command stage;
//! - what storing a new output costs a stage (1,000 commands each printing a line of its own,
//!   against the same commands all printing one line);
//! - a 64-branch fan-out of `sleep 0.2` with `max_parallel=64`, against a shell starting the same 64
//!   commands (through `sh -c`, and directly), unconfined and in bubblewrap (the bubblewrap figures
//!   are skipped with the reason when a run in it fails here: `bwrap` missing, or no user namespaces);
//! - `trellis validate` of a generated 10,000-node workflow: time and peak memory;
//! - the peak memory of runs of 3 stages (the floor: one command), 1,000, 2,000 and 10,000 stages.
//!
//! Runs are `--sandbox none` unless a figure says otherwise: the engine's cost is measured apart from
//! the sandbox's, which is printed on its own line.
//!
//! Peak memory is the child's maximum resident set: each measured process is started by a copy of
//! this benchmark (`TRELLIS_BENCH_PEAK`), whose only child it is, so `getrusage(RUSAGE_CHILDREN)`
//! reports that process alone; `trellis` is read from disk for each (not from the pages the linker
//! left in the page cache, which add 2 MB or more).

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]
#![allow(clippy::doc_markdown, reason = "product names in prose")]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const PEAK_VAR: &str = "TRELLIS_BENCH_PEAK";

fn main() {
    if std::env::var_os(PEAK_VAR).is_some() {
        peak_of_child();
        return;
    }
    // On the project's disk, where run records normally live (not the system temp directory).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temp dir");
    let bench = Bench {
        dir: dir.path().to_path_buf(),
        work: dir.path().join("work"),
        runs: std::cell::Cell::new(0),
        bubblewrap: std::cell::OnceCell::new(),
    };
    std::fs::create_dir_all(&bench.work).expect("mkdir");
    println!("engine overhead (medians; targets in brackets)");

    // First, while the disk is quiet: the runs below leave it busy writing back for a while.
    fan_outs(&bench);

    let generated = bench.dir.join("generated.fabro");
    std::fs::write(&generated, trellis_test::workflows::generated(10_000)).expect("write");
    validate(&generated);

    let bare = Bench::median(3, || shell_loop(1_000));
    let shell = Bench::median(3, || spawner_loop(1_000));
    let mut per_stage = Vec::new();
    for stages in [250, 1_000, 2_000] {
        let file = bench.chain(stages);
        let took = Bench::median(3, || bench.time_run(&file, &bench.work));
        per_stage.push((stages, took));
    }
    let ten_thousand = bench.chain(10_000);
    per_stage.push((10_000, bench.time_run(&ten_thousand, &bench.work)));
    let engine_1000 = per_stage[1].1;
    println!(
        "chain of 1,000 `true` stages: trellis {engine_1000:.2?}, the same commands started by the spawner {shell:.2?}: {} per stage over the loop  [≤ 0.5 ms]",
        ms(engine_1000.saturating_sub(shell) / 1_000)
    );
    let chain = bench.chain(1_000);
    let reaper = ms(shell.saturating_sub(bare) / 1_000);
    match bench.bubblewrap() {
        Ok(()) => {
            let sandboxed =
                Bench::median(3, || bench.time_run_in(&chain, &bench.work, "bubblewrap"));
            println!(
                "the sandboxes, per command: the spawner {reaper} (over `sh -c true` alone, {bare:.2?} for 1,000), bubblewrap {} (1,000 stages in {sandboxed:.2?}, over the unconfined run)",
                ms(sandboxed.saturating_sub(engine_1000) / 1_000)
            );
        }
        Err(reason) => println!(
            "the sandboxes, per command: the spawner {reaper} (over `sh -c true` alone, {bare:.2?} for 1,000), bubblewrap skipped ({reason})"
        ),
    }
    let shell_per_stage = shell / 1_000;
    for (stages, took) in &per_stage {
        println!(
            "  {stages:>6} stages: {took:>9.2?}, {} per stage over the loop",
            ms(per(*took, *stages).saturating_sub(shell_per_stage))
        );
    }
    chatty(&bench, cost_of(per_stage[1], shell_per_stage));
    new_output(&bench);
    let cost = |i: usize| {
        let (stages, took) = per_stage[i];
        per(took, stages).saturating_sub(shell_per_stage)
    };
    println!(
        "per-stage cost at 2,000 stages against 250: {:.2}x  [≤ 1.25x]",
        cost(2).as_secs_f64() / cost(0).as_secs_f64().max(1e-9)
    );

    match langgraph(&bench.dir, 1_000) {
        // The loop alone against LangGraph is the least this ratio can be on the host: how
        // fast a program starts here against how fast Python runs.
        Ok(langgraph) => println!(
            "against LangGraph 1.2 + SQLite, 1,000 stages: trellis {engine_1000:.2?}, langgraph {langgraph:.2?}: {:.2}x (the loop alone: {:.2}x)  [≤ 0.35x]",
            engine_1000.as_secs_f64() / langgraph.as_secs_f64(),
            shell.as_secs_f64() / langgraph.as_secs_f64()
        ),
        Err(reason) => println!("against LangGraph 1.2 + SQLite: skipped ({reason})"),
    }

    let tree = bench.dir.join("tree");
    ordinary_files(&tree, 20_000);
    let chain = bench.chain(1_000);
    std::fs::copy(&chain, tree.join("chain.fabro")).expect("copy");
    let in_tree = Bench::median(3, || bench.time_run(&tree.join("chain.fabro"), &tree));
    println!(
        "working tree of 20,000 ordinary files: {} per command stage  [< 0.5 ms]",
        ms(in_tree.saturating_sub(engine_1000) / 1_000)
    );

    memory(&bench);
}

/// The engine's own cost of a stage of `stages` that took `took`, over the spawner's loop per command.
fn cost_of((stages, took): (usize, Duration), shell_per_stage: Duration) -> Duration {
    per(took, stages).saturating_sub(shell_per_stage)
}

/// What storing a stage's output costs: 1,000 commands that each print a line of their own (each a
/// new blob) against the same commands printing the line they all share (one blob).
fn new_output(bench: &Bench) {
    let chain = |name: &str, script: &str| {
        let path = bench.dir.join(format!("{name}.fabro"));
        let workflow = trellis_test::workflows::command_chain(998, script);
        std::fs::write(&path, workflow).expect("write");
        Bench::median(3, || bench.time_run(&path, &bench.work))
    };
    let shared = chain("shared-output", "date +%Y");
    let new = chain("new-output", "date +%s%N");
    println!(
        "chain of 1,000 commands each printing a line of its own: {new:.2?}, against the line they all share {shared:.2?}: {} per stage to store a new output",
        ms(new.saturating_sub(shared) / 1_000)
    );
}

/// Commands that print 10 MB each: the engine reads their pipes into the stage logs, and the
/// per-stage cost over the same commands writing to a file stays what it is for quiet ones; the
/// output never reaches the event log.
fn chatty(bench: &Bench, quiet: Duration) {
    const STAGES: usize = 20;
    const PRINT: &str = "yes line | head -c 10485760";
    let path = bench.dir.join("chatty.fabro");
    let mut chain =
        String::from("digraph Chatty {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n");
    for i in 0..STAGES {
        let _ = writeln!(chain, "  n{i} [shape=parallelogram, script=\"{PRINT}\"]");
    }
    chain.push_str("  start -> n0\n");
    for i in 1..STAGES {
        let _ = writeln!(chain, "  n{} -> n{i}", i - 1);
    }
    let _ = writeln!(chain, "  n{} -> exit\n}}", STAGES - 1);
    std::fs::write(&path, chain).expect("write");
    let log = bench.dir.join("chatty.log");
    let direct = Bench::median(3, || {
        let started = Instant::now();
        for _ in 0..STAGES {
            under_reaper(PRINT, std::fs::File::create(&log).expect("log"));
        }
        started.elapsed()
    });
    let mut events = 0;
    let took = Bench::median(3, || {
        let runs = bench.next_runs_dir();
        let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
        command
            .arg("run")
            .arg(&path)
            .args(["--json", "--sandbox", "none", "--runs-dir"])
            .arg(&runs)
            .current_dir(&bench.work);
        let took = time(command);
        events = trellis_store::list_runs(&runs)
            .first()
            .and_then(|run| std::fs::metadata(run.join("events.jsonl")).ok())
            .map_or(0, |m| m.len());
        took
    });
    println!(
        "chain of {STAGES} commands printing 10 MB each: trellis {took:.2?}, the same commands writing to a file under the reaper {direct:.2?}: {} per stage over them (quiet stages: {}), events.jsonl {} KB  [unchanged, small]",
        ms(took.saturating_sub(direct) / u32::try_from(STAGES).unwrap_or(1)),
        ms(quiet),
        events / 1024
    );
}

/// `trellis validate` of the generated workflow: CPU alone, which on this machine drifts by half
/// from one run to the next, so the median of 15 and the fastest beside it; and its peak.
fn validate(generated: &Path) {
    let mut validates: Vec<Duration> = (0..15)
        .map(|_| {
            let started = Instant::now();
            let status = Command::new(env!("CARGO_BIN_EXE_trellis"))
                .arg("validate")
                .arg(generated)
                .stdout(std::process::Stdio::null())
                .status()
                .expect("runs");
            assert!(status.success());
            started.elapsed()
        })
        .collect();
    validates.sort();
    let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
    command.arg("validate").arg(generated);
    println!(
        "validate of a 10,000-node workflow: {:.1?} (fastest {:.1?}), peak {}  [≤ 50 ms, < 50 MB]",
        validates[validates.len() / 2],
        validates[0],
        mb(peak(&command))
    );
}

/// The 64-branch fan-out against a shell starting the same commands, and in bubblewrap.
fn fan_outs(bench: &Bench) {
    let fan = bench.fan_out(64);
    // The three in turn, so that the machine's speed, which drifts, is the same for each.
    let (mut fan_times, mut shell_fans, mut direct_fans) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        fan_times.push(bench.time_run(&fan, &bench.work));
        shell_fans.push(shell_fan_out(64, "sh -c 'sleep 0.2'"));
        direct_fans.push(shell_fan_out(64, "sleep 0.2"));
    }
    let (fan_time, shell_fan, direct_fan) = (
        median_of(fan_times),
        median_of(shell_fans),
        median_of(direct_fans),
    );
    println!(
        "64 branches of `sleep 0.2`, max_parallel=64: {fan_time:.3?} (a shell starting the same 64 `sh -c`: {shell_fan:.3?}; the 64 `sleep` alone: {direct_fan:.3?}, {} over it)  [≤ 0.23 s]",
        ms(fan_time.saturating_sub(direct_fan))
    );
    match bench.bubblewrap() {
        Ok(()) => {
            let sandboxed_fan =
                Bench::median(3, || bench.time_run_in(&fan, &bench.work, "bubblewrap"));
            println!("  the same fan-out in bubblewrap: {sandboxed_fan:.3?}");
        }
        Err(reason) => println!("  the same fan-out in bubblewrap: skipped ({reason})"),
    }
}

/// The peak memory of runs: chains of 1,000 to 10,000 stages, and a loop of 10,001.
fn memory(bench: &Bench) {
    let mut peaks = String::new();
    // The floor the others stand on: what a run of one command takes (the executable's own pages
    // are most of it, and they move from machine to machine).
    for stages in [3, 1_000, 2_000, 10_000] {
        let runs = bench.next_runs_dir();
        let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
        command
            .arg("run")
            .arg(bench.chain(stages))
            .args(["--json", "--sandbox", "none", "--runs-dir"])
            .arg(runs)
            .current_dir(&bench.work);
        let _ = write!(peaks, "  {stages} stages: {}", mb(peak(&command)));
    }
    println!("peak memory of a run:{peaks}  [10,000 stages ≤ 25 MB, flat; 3 stages: the floor]");
    let runs = bench.next_runs_dir();
    let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
    command
        .arg("run")
        .arg(bench.loop_of(5_000))
        .args([
            "--json",
            "--sandbox",
            "none",
            "--max-steps",
            "20000",
            "--runs-dir",
        ])
        .arg(runs)
        .current_dir(&bench.work);
    println!(
        "peak memory of a 10,001-stage run of a 4-node loop: {}  [< 30 MB, flat]",
        mb(peak(&command))
    );
}

struct Bench {
    /// Workflow files and run records.
    dir: PathBuf,
    /// The (empty) working directory of the runs.
    work: PathBuf,
    /// Each run gets a runs directory of its own: deleting records between runs would make the file
    /// system slower at creating files for a while and blur the figures.
    runs: std::cell::Cell<u32>,
    bubblewrap: std::cell::OnceCell<Result<(), String>>,
}

impl Bench {
    fn next_runs_dir(&self) -> PathBuf {
        self.runs.set(self.runs.get() + 1);
        self.dir.join(format!("records/runs-{}", self.runs.get()))
    }

    fn median(times: usize, mut measure: impl FnMut() -> Duration) -> Duration {
        median_of((0..times).map(|_| measure()).collect())
    }

    fn time_run(&self, file: &Path, work_dir: &Path) -> Duration {
        self.time_run_in(file, work_dir, "none")
    }

    fn time_run_in(&self, file: &Path, work_dir: &Path, sandbox: &str) -> Duration {
        time(self.run(file, work_dir, sandbox))
    }

    /// `trellis run` of `file` in `work_dir`, in `sandbox`, with a runs directory of its own.
    fn run(&self, file: &Path, work_dir: &Path, sandbox: &str) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
        command
            .arg("run")
            .arg(file)
            .args(["--json", "--sandbox", sandbox, "--runs-dir"])
            .arg(self.next_runs_dir())
            .current_dir(work_dir);
        command
    }

    /// Whether a run in bubblewrap works here (`bwrap` installed, user namespaces allowed); `Err`
    /// with the run's first line of error otherwise. Asked once.
    fn bubblewrap(&self) -> Result<(), String> {
        self.bubblewrap
            .get_or_init(|| {
                let output = self
                    .run(&self.chain(3), &self.work, "bubblewrap")
                    .output()
                    .map_err(|error| error.to_string())?;
                if output.status.success() {
                    return Ok(());
                }
                let stderr = String::from_utf8_lossy(&output.stderr);
                Err(stderr
                    .lines()
                    .find(|line| !line.trim().is_empty())
                    .unwrap_or("the run failed")
                    .trim()
                    .to_owned())
            })
            .clone()
    }

    /// A chain of `true` commands that runs exactly `stages` stages (start and exit included).
    fn chain(&self, stages: usize) -> PathBuf {
        let path = self.dir.join(format!("chain-{stages}.fabro"));
        if path.exists() {
            return path;
        }
        let chain = trellis_test::workflows::command_chain(stages - 2, "true");
        std::fs::write(&path, chain).expect("write");
        path
    }

    /// A loop of two commands that runs `2 * rounds + 1` stages: the history grows, the workflow
    /// does not.
    fn loop_of(&self, rounds: usize) -> PathBuf {
        let path = self.dir.join("loop.fabro");
        std::fs::write(
            &path,
            format!(
                "digraph Loop {{\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  count [shape=parallelogram, script=\"f=count-$TRELLIS_RUN_ID; n=$(cat $f 2>/dev/null || echo 0); echo $((n+1)) > $f; test $n -lt {}\"]\n  again [shape=parallelogram, script=\"true\"]\n  start -> count\n  count -> again [condition=\"outcome=success\"]\n  count -> exit [condition=\"outcome=fail\"]\n  again -> count\n}}\n",
                rounds - 1
            ),
        )
        .expect("write");
        path
    }

    fn fan_out(&self, branches: usize) -> PathBuf {
        let mut fan =
            String::from("digraph Fan {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n");
        let _ = writeln!(
            fan,
            "  fan [shape=component, max_parallel={branches}]\n  merge [shape=tripleoctagon]\n  start -> fan\n  merge -> exit"
        );
        for i in 0..branches {
            let _ = writeln!(
                fan,
                "  b{i} [shape=parallelogram, script=\"sleep 0.2\"]\n  fan -> b{i} -> merge"
            );
        }
        fan.push_str("}\n");
        let path = self.dir.join("fan.fabro");
        std::fs::write(&path, fan).expect("write");
        path
    }
}

fn time(mut command: Command) -> Duration {
    let started = Instant::now();
    let output = command.output().expect("runs");
    let took = started.elapsed();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    took
}

fn shell_loop(stages: usize) -> Duration {
    let mut command = Command::new("sh");
    command.arg("-c").arg(format!(
        "i=0; while [ $i -lt {stages} ]; do sh -c true; i=$((i+1)); done"
    ));
    time(command)
}

/// `sh -c true`, `stages` times, one after the other, started by Trellis's spawner (which runs each
/// itself, as it does a chain's commands), with the environment and pipes an unconfined command
/// stage gets.
fn spawner_loop(stages: usize) -> Duration {
    use trellis_process::{reaper::Launcher, spawner};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let launcher = Launcher::beside(Path::new(env!("CARGO_BIN_EXE_trellis")));
    let env: Vec<_> = std::env::vars_os().collect();
    let env: Vec<_> = env
        .iter()
        .map(|(k, v)| (k.as_os_str(), v.as_os_str()))
        .collect();
    let dir = std::env::current_dir().expect("a working directory");
    let args = ["-c".as_ref(), "true".as_ref()];
    runtime.block_on(async {
        let started = Instant::now();
        for _ in 0..stages {
            let mut command = spawner::spawn(&launcher, &[], "sh".as_ref(), &args, &dir, &env)
                .expect("the spawner")
                .expect("starts");
            assert!(command.wait().await.expect("waits").success());
        }
        started.elapsed()
    })
}

/// `sh -c script` under the reaper, its standard output to `stdout`, its standard input a pipe held
/// open, as Trellis holds it.
fn under_reaper(script: &str, stdout: impl Into<std::process::Stdio>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trellis-reap"))
        .args(["--", "sh", "-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(stdout)
        .spawn()
        .expect("starts");
    // Held until the command ends (`wait` would close it first, which tells the reaper to stop).
    let input = child.stdin.take();
    assert!(child.wait().expect("waits").success());
    drop(input);
}

/// A shell starting `branches` copies of `each` at once and waiting for them: the process work of
/// the fan-out without the engine (`sh -c 'sleep 0.2'`, as a shell runs a script, or `sleep 0.2`
/// alone, the least a fan-out of it can take).
fn shell_fan_out(branches: usize, each: &str) -> Duration {
    let mut command = Command::new("sh");
    command.arg("-c").arg(format!(
        "i=0; while [ $i -lt {branches} ]; do {each} & i=$((i+1)); done; wait"
    ));
    time(command)
}

/// The middle one of `samples`.
fn median_of(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// The time per stage.
fn per(took: Duration, stages: usize) -> Duration {
    took / u32::try_from(stages).expect("a count that fits")
}

fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}

fn mb(kilobytes: Option<f64>) -> String {
    kilobytes.map_or_else(
        || "unknown".to_owned(),
        |kb| format!("{:.1} MB", kb / 1024.0),
    )
}

/// The peak resident set of `command`, in kilobytes, measured by a copy of this benchmark, with
/// the program read from disk (see [`read_from_disk`]).
fn peak(command: &Command) -> Option<f64> {
    read_from_disk(Path::new(command.get_program()));
    let mut measuring = Command::new(std::env::current_exe().ok()?);
    measuring
        .env(PEAK_VAR, "1")
        .arg(command.get_program())
        .args(command.get_args());
    if let Some(dir) = command.get_current_dir() {
        measuring.current_dir(dir);
    }
    let output = measuring.output().ok()?;
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

/// Drops `program`'s pages from the page cache, so that its next start reads it from disk as an
/// installed program is read. How the pages sit in the cache moves a run's resident set: a
/// program the linker has just written keeps the large folios its writes made, and a start maps
/// more of them (on 2026-11-28 a 3-stage run peaked at 17.1 MB straight after linking, 14.7 MB
/// with the same file read back from disk; a 10,000-stage run at 31.4 MB against 29.2 MB).
fn read_from_disk(program: &Path) {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    let Ok(file) = std::fs::File::open(program) else {
        return;
    };
    // Dirty pages stay in the cache: written back first.
    let _ = file.sync_all();
    let _ = posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
}

/// In the measuring copy: runs the command given as arguments and prints its peak resident set.
fn peak_of_child() {
    let mut args = std::env::args_os().skip(1);
    let program = args.next().expect("a program");
    let status = Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("runs");
    assert!(status.success(), "the measured command failed");
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    println!("{}", usage.max_rss());
}

/// `count` small files in folders of 20, two levels deep, as a source tree has them.
fn ordinary_files(root: &Path, count: usize) {
    for i in 0..count {
        let dir = root.join(format!("src/m{}/s{}", i / 400, (i / 20) % 20));
        if i % 20 == 0 {
            std::fs::create_dir_all(&dir).expect("mkdir");
        }
        std::fs::write(dir.join(format!("f{i}.py")), "x = 1\n").expect("write");
    }
}

/// The same chain in LangGraph with its SQLite checkpointer, timed as a whole process (as `trellis
/// run` is); `Err` with the reason when LangGraph cannot be installed here.
fn langgraph(dir: &Path, stages: usize) -> Result<Duration, String> {
    let python = langgraph_venv()?;
    let script = dir.join("langgraph_chain.py");
    std::fs::write(
        &script,
        format!(
            r#"import subprocess, sqlite3, sys
from typing import TypedDict
from langgraph.graph import StateGraph, START, END
from langgraph.checkpoint.sqlite import SqliteSaver

class State(TypedDict):
    n: int

def step(state):
    subprocess.run(["sh", "-c", "true"], check=True)
    return {{"n": state["n"] + 1}}

graph = StateGraph(State)
names = [f"n{{i}}" for i in range({stages})]
for name in names:
    graph.add_node(name, step)
graph.add_edge(START, names[0])
for a, b in zip(names, names[1:]):
    graph.add_edge(a, b)
graph.add_edge(names[-1], END)
saver = SqliteSaver(sqlite3.connect(sys.argv[1], check_same_thread=False))
app = graph.compile(checkpointer=saver)
out = app.invoke({{"n": 0}}, {{"configurable": {{"thread_id": "bench"}}, "recursion_limit": {limit}}})
assert out["n"] == {stages}
"#,
            limit = stages + 10
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut samples = Vec::new();
    for i in 0..3 {
        let started = Instant::now();
        let output = Command::new(&python)
            .arg(&script)
            .arg(dir.join(format!("langgraph-{i}.sqlite")))
            .output()
            .map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!(
                "the LangGraph chain failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        samples.push(started.elapsed());
    }
    samples.sort();
    Ok(samples[1])
}

/// A venv with LangGraph, made once under `~/.cache/trellis/langgraph-1.2.22/`.
fn langgraph_venv() -> Result<PathBuf, String> {
    let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
    let venv = PathBuf::from(home).join(".cache/trellis/langgraph-1.2.22");
    let python = venv.join("bin/python3");
    let ready = venv.join("installed");
    if ready.exists() {
        return Ok(python);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .map_err(|e| format!("python3 is not available: {e}"))?;
    if !made.status.success() {
        return Err(format!(
            "python3 cannot make a venv: {}",
            String::from_utf8_lossy(&made.stderr).trim()
        ));
    }
    let installed = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "langgraph==1.2.22",
            "langgraph-checkpoint-sqlite",
        ])
        .output()
        .map_err(|e| e.to_string())?;
    if !installed.status.success() {
        let error = String::from_utf8_lossy(&installed.stderr);
        return Err(format!(
            "pip cannot install langgraph==1.2.22: {}",
            error.lines().last().unwrap_or_default().trim()
        ));
    }
    std::fs::write(&ready, b"").map_err(|e| e.to_string())?;
    Ok(python)
}
