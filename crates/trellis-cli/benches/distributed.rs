//! Runs on Temporal, measured beside their targets (printed, never asserted): stages per second with
//! 1, 2 and 3 workers on `sleep 0.5` stages (want near-linear: 3 workers ≥ 2.5× one), and the
//! per-stage overhead of the Temporal backend beside the local engine's, on a real dev server.
//!
//! `cargo bench -p trellis-cli --bench distributed`

#![allow(
    clippy::disallowed_methods,
    reason = "benchmarks set up and read files around the binary they run"
)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use trellis_test::TemporalServer;
use trellis_test::workflows::command_chain;

/// Runs submitted at once per measurement, and their stages.
const RUNS: usize = 12;
const STAGES: usize = 5;
/// Stages a worker executes at once.
const SLOTS: usize = 2;
/// Stages of the chain the overhead is measured on.
const OVERHEAD_STAGES: usize = 50;

fn trellis(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trellis"));
    command
        .current_dir(dir)
        .env("TRELLIS_RUNS_DIR", dir.join("runs"))
        .env("XDG_CONFIG_HOME", dir.join(".config"))
        .env("TRELLIS_CACHE_DIR", dir.join(".cache"))
        .stdin(Stdio::null());
    command
}

struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(dir: &Path, server: &TemporalServer, name: &str) -> Worker {
    let log = dir.join(format!("{name}.log"));
    let child = trellis(dir)
        .args(["worker", "--temporal", &server.address()])
        .args(["--slots", &SLOTS.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("trellis worker starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("polling")) {
        assert!(Instant::now() < deadline, "the worker did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Worker(child)
}

/// Submits `RUNS` runs at once and waits for all to succeed; the seconds it took.
fn batch(dir: &Path, server: &TemporalServer) -> f64 {
    let started = Instant::now();
    let submitters: Vec<Child> = (0..RUNS)
        .map(|_| {
            trellis(dir)
                .args([
                    "run",
                    "sleepy.fabro",
                    "--temporal",
                    &server.address(),
                    "--detach",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let ids: Vec<String> = submitters
        .into_iter()
        .map(|c| {
            String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout)
                .trim()
                .to_owned()
        })
        .collect();
    let status = |id: &str| {
        std::fs::read_to_string(dir.join("runs").join(id).join("run.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .map(|m| m["status"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_mins(10);
    loop {
        let statuses: Vec<String> = ids.iter().map(|id| status(id)).collect();
        if statuses.iter().all(|s| s != "running") {
            assert!(
                statuses.iter().all(|s| s == "succeeded"),
                "runs did not all succeed: {statuses:?}"
            );
            return started.elapsed().as_secs_f64();
        }
        assert!(Instant::now() < deadline, "runs did not end in 10 minutes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wall seconds of one followed run of `file` (`extra` flags added).
fn followed(dir: &Path, file: &str, extra: &[&str]) -> f64 {
    let started = Instant::now();
    let status = trellis(dir)
        .args(["run", file])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{file} {extra:?} failed");
    started.elapsed().as_secs_f64()
}

fn main() {
    let Some(server) = TemporalServer::start() else {
        trellis_process::note!(
            "distributed: the Temporal CLI is missing; run scripts/test-peers.sh"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("sleepy.fabro"), command_chain(STAGES, "sleep 0.5")).unwrap();
    std::fs::write(
        dir.join("quick.fabro"),
        command_chain(OVERHEAD_STAGES, "true"),
    )
    .unwrap();

    println!(
        "distributed: {RUNS} runs of {STAGES} `sleep 0.5` stages at once, {SLOTS} slots per worker"
    );
    let mut workers = Vec::new();
    let mut rates = Vec::new();
    for count in 1..=3 {
        workers.push(worker(dir, &server, &format!("w{count}")));
        let seconds = batch(dir, &server);
        #[allow(clippy::cast_precision_loss, reason = "small counts")]
        let rate = (RUNS * STAGES) as f64 / seconds;
        rates.push(rate);
        println!("  {count} worker(s): {rate:6.2} stages/s ({seconds:.1} s)");
    }
    let speedup = rates[2] / rates[0];
    println!(
        "  3 workers vs 1: {speedup:.2}×  (target ≥ 2.50×: {})",
        if speedup >= 2.5 { "met" } else { "MISSED" }
    );
    workers.truncate(1);

    // The per-stage cost: a chain of quick stages, local and on Temporal (one worker), each the
    // best of three, and one stage's run for the constant per run.
    let best = |f: &dyn Fn() -> f64| (0..3).map(|_| f()).fold(f64::INFINITY, f64::min);
    std::fs::write(dir.join("one.fabro"), command_chain(1, "true")).unwrap();
    let address = server.address();
    let remote = ["--temporal", address.as_str()];
    let local_many = best(&|| followed(dir, "quick.fabro", &[]));
    let local_one = best(&|| followed(dir, "one.fabro", &[]));
    let remote_many = best(&|| followed(dir, "quick.fabro", &remote));
    let remote_one = best(&|| followed(dir, "one.fabro", &remote));
    #[allow(clippy::cast_precision_loss, reason = "small counts")]
    let per_stage = |many: f64, one: f64| (many - one) / (OVERHEAD_STAGES - 1) as f64 * 1000.0;
    println!("overhead: {OVERHEAD_STAGES} `true` stages, followed from `trellis run`");
    println!(
        "  local:    {:.2} ms per stage, {:.0} ms per run",
        per_stage(local_many, local_one),
        local_one * 1000.0
    );
    println!(
        "  temporal: {:.2} ms per stage, {:.0} ms per run (submit, hand to a worker, follow)",
        per_stage(remote_many, remote_one),
        remote_one * 1000.0
    );
}
