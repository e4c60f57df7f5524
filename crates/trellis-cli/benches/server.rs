//! `trellis serve` figures, printed next to their targets (never asserted: timings belong to a quiet
//! machine, not to tests): how long after an event is written 100 clients streaming one run receive it,
//! whether each received every event, and how long listing 1,000 runs takes.
//!
//! `cargo bench -p trellis-cli --bench server`

#![allow(
    clippy::disallowed_methods,
    reason = "benchmarks set up and read files around the binary they run"
)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use trellis_test::http::{Request, free_port, wait_for_port};

const CLIENTS: usize = 100;
const RUNS: usize = 1_000;

struct Serve(Child, u16);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path) -> Serve {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--workflows", "workflows", "--runs-dir", "runs"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("trellis serve starts");
    wait_for_port(port, "trellis serve");
    Serve(child, port)
}

/// Milliseconds since the epoch of an event's `ts` (`2026-11-23T21:24:25.208Z`).
fn millis_of(ts: &str) -> Option<u128> {
    let date = humantime::parse_rfc3339(ts).ok()?;
    Some(date.duration_since(UNIX_EPOCH).ok()?.as_millis())
}

fn now_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The value `percent`% of the way through `sorted`.
fn percentile(sorted: &[u128], percent: usize) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(sorted.len() - 1) * percent / 100]
}

fn main() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temp dir");
    std::fs::create_dir_all(dir.path().join("workflows")).unwrap();
    let stages: Vec<String> = (1..=40)
        .map(|i| format!("    s{i} [shape=parallelogram, script=\"sleep 0.02\"]\n"))
        .collect();
    let stages = stages.concat();
    let chain: Vec<String> = (1..=40).map(|i| format!("s{i}")).collect();
    std::fs::write(
        dir.path().join("workflows/steps.fabro"),
        format!(
            "digraph steps {{\n    start [shape=Mdiamond]\n    done [shape=Msquare]\n{stages}    start -> {} -> done\n}}\n",
            chain.join(" -> ")
        ),
    )
    .unwrap();
    println!("trellis serve (targets in brackets)");
    let server = serve(dir.path());
    let id = streams(server.1);
    listing(server.1, &dir.path().join("runs"), &id);
}

/// 100 clients stream one run from its start; prints whether each got every event, and how long after
/// an event was written it arrived. Returns the run's id.
fn streams(port: u16) -> String {
    let answer = Request::new(port, "POST", "/api/runs")
        .json(&json!({ "workflow": "steps.fabro" }))
        .send();
    let id = answer.json()["id"].as_str().unwrap().to_owned();
    let path = format!("/api/runs/{id}/events");
    let streams: Vec<_> = (0..CLIENTS)
        .map(|_| Request::new(port, "GET", &path).stream())
        .collect();
    let readers: Vec<_> = streams
        .into_iter()
        .map(|stream| {
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for event in stream {
                    if event.event == "end" {
                        break;
                    }
                    let received = now_millis();
                    let value: Value = event.json();
                    let written = value["ts"].as_str().and_then(millis_of);
                    seen.push((value["seq"].as_u64().unwrap_or(0), written, received));
                }
                seen
            })
        })
        .collect();
    let results: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let logged = Request::new(port, "GET", &format!("{path}?format=jsonl"))
        .send()
        .text()
        .lines()
        .count() as u64;
    let complete = results
        .iter()
        .filter(|seen| seen.iter().map(|s| s.0).eq(1..=logged))
        .count();
    // Only events written after the client connected measure delivery (the history is read at once).
    let connected_by = results
        .iter()
        .filter_map(|seen| seen.first().map(|s| s.2))
        .max()
        .unwrap_or(0);
    let mut latencies: Vec<u128> = results
        .iter()
        .flatten()
        .filter_map(|(_, written, received)| {
            written
                .filter(|w| *w > connected_by)
                .map(|w| received.saturating_sub(w))
        })
        .collect();
    latencies.sort_unstable();
    println!(
        "{CLIENTS} SSE clients on one run of {logged} events: {complete} of {CLIENTS} received every event  [all]"
    );
    println!(
        "event written → received by a client ({} deliveries): p50 {} ms, p99 {} ms, max {} ms  [≤ 50 ms]",
        latencies.len(),
        percentile(&latencies, 50),
        percentile(&latencies, 99),
        latencies.last().copied().unwrap_or(0)
    );

    id
}

/// Lists 1,000 runs: copies of run `id`'s record under fresh ids.
fn listing(port: u16, runs: &Path, id: &str) {
    let record = runs.join(id);
    for i in 0..RUNS {
        let copy = runs.join(format!("{}{i:05}", &id[..id.len() - 5]));
        if copy == record {
            continue;
        }
        std::fs::create_dir_all(&copy).unwrap();
        for entry in std::fs::read_dir(&record).unwrap().flatten() {
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
            }
        }
        let meta_path = copy.join("run.json");
        let mut meta: Value =
            serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
        meta["run_id"] = json!(copy.file_name().unwrap().to_string_lossy());
        std::fs::write(&meta_path, meta.to_string()).unwrap();
    }
    let listed = std::fs::read_dir(runs).unwrap().count();
    for (what, query) in [
        ("first page (50)", "/api/runs"),
        ("filtered by status", "/api/runs?status=succeeded&limit=20"),
    ] {
        let mut times: Vec<Duration> = (0..15)
            .map(|_| {
                let started = Instant::now();
                let answer = Request::new(port, "GET", query).send();
                let elapsed = started.elapsed();
                assert_eq!(answer.status, 200);
                assert_eq!(answer.json()["total"].as_u64(), Some(listed as u64));
                elapsed
            })
            .collect();
        times.sort();
        println!(
            "GET {query} over {listed} runs, {what}: {:.1?} median  [< 100 ms]",
            times[times.len() / 2]
        );
    }
}
