//! How often the local Qwen model, judging `when` edges with its answer constrained to the live
//! choices, routes a clear-cut bug report to the right branch: every case of
//! `trellis_test::workflows::TRIAGE_CASES`, each a `trellis run` of the small triage workflow. Printed,
//! never asserted (the test asserts 8 of 10 on the first ten).
//!
//! `cargo bench -p trellis-cli --bench routing_accuracy`

#![allow(
    clippy::disallowed_methods,
    reason = "benchmarks set up and read files around the binary they run"
)]

use std::process::Command;
use std::time::Instant;

use serde_json::Value;
use trellis_test::workflows::{TRIAGE_CASES, TRIAGE_ROUTER};

fn main() {
    if trellis_test::local_model_files().is_none() {
        println!(
            "routing accuracy: skipped (the local model is not installed; run scripts/local-model.sh)"
        );
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temp dir");
    std::fs::write(dir.path().join("triage.yml"), TRIAGE_ROUTER).expect("write");
    let started = Instant::now();
    let mut right = 0;
    let mut wrong = Vec::new();
    for (report, expected) in TRIAGE_CASES {
        let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .args(["run", "triage.yml", "--json", "--runs-dir", "runs"])
            .arg("--input")
            .arg(format!("report={report}"))
            .current_dir(dir.path())
            .env("TRELLIS_CACHE_DIR", trellis_test::cache_dir())
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .env_remove("GEMINI_API_KEY")
            .output()
            .expect("trellis runs");
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let events = std::fs::read_to_string(
            std::path::Path::new(summary["run_dir"].as_str().unwrap_or_default())
                .join("events.jsonl"),
        )
        .unwrap_or_default();
        let went = events
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["event"] == "EdgeSelected")
            .and_then(|e| e["to"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "(no decision)".to_owned());
        if went == *expected {
            right += 1;
        } else {
            wrong.push(format!("  {report} -> {went} (expected {expected})"));
        }
    }
    println!(
        "routing accuracy on the local Qwen model: {right} of {} clear-cut reports to the right branch ({:.0}%) in {:.0?}  [test: at least 8 of the first 10]",
        TRIAGE_CASES.len(),
        100.0 * f64::from(right) / f64::from(u32::try_from(TRIAGE_CASES.len()).unwrap_or(1)),
        started.elapsed()
    );
    for line in wrong {
        println!("{line}");
    }
}
