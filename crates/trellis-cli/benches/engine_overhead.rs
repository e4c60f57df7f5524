//! Benchmark: the engine's own cost per stage (`cargo bench -p trellis-cli`). Prints
//! - a generated 1,000-node chain of `true` commands run by `trellis run`, against a plain shell loop
//!   that starts `sh -c true` 1,000 times (the same process work without the engine), and the difference
//!   per stage;
//! - a 64-branch fan-out of `sleep 0.2` with `max_parallel=64`, against the 0.2 s ideal.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::fmt::Write;
use std::process::Command;
use std::time::{Duration, Instant};

fn time(mut command: Command) -> Duration {
    let started = Instant::now();
    let output = command.output().expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    started.elapsed()
}

fn trellis(dir: &std::path::Path, file: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
    command
        .args(["run", file, "--json", "--runs-dir"])
        .arg(dir.join("runs"))
        .current_dir(dir);
    command
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    // On the project's disk, where run records normally live (not the system temp directory).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temp dir");
    let stages = 1_000;
    let mut chain =
        String::from("digraph Chain {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n");
    for i in 0..stages {
        let _ = writeln!(chain, "  n{i} [shape=parallelogram, script=\"true\"]");
    }
    chain.push_str("  start -> n0\n");
    for i in 1..stages {
        let _ = writeln!(chain, "  n{} -> n{i}", i - 1);
    }
    let _ = writeln!(chain, "  n{} -> exit\n}}", stages - 1);
    std::fs::write(dir.path().join("chain.fabro"), chain).expect("write");

    let runs = 3;
    let engine = median(
        (0..runs)
            .map(|_| time(trellis(dir.path(), "chain.fabro")))
            .collect(),
    );
    let shell = median(
        (0..runs)
            .map(|_| {
                let mut command = Command::new("sh");
                command.arg("-c").arg(format!(
                    "i=0; while [ $i -lt {stages} ]; do sh -c true; i=$((i+1)); done"
                ));
                time(command)
            })
            .collect(),
    );
    let per_stage = engine.saturating_sub(shell) / stages;
    println!(
        "chain of {stages} `true` stages:   trellis {engine:>9.3?}   shell loop {shell:>9.3?}   engine cost {per_stage:.3?}/stage (target ≤ 2ms)"
    );

    let branches = 64;
    let mut fan = String::from("digraph Fan {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n");
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
    std::fs::write(dir.path().join("fan.fabro"), fan).expect("write");
    let fan_time = median(
        (0..runs)
            .map(|_| time(trellis(dir.path(), "fan.fabro")))
            .collect(),
    );
    println!(
        "fan-out of {branches} `sleep 0.2` branches: trellis {fan_time:>9.3?}   ideal 200ms   overhead {:.3?}",
        fan_time.saturating_sub(Duration::from_millis(200))
    );
}
