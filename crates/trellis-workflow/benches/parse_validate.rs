//! Benchmark: parse + compile + validate generated workflows of 1,000 and 10,000 nodes, and print the
//! figures (`cargo bench -p trellis-workflow`). The generated graphs mix every common node kind,
//! subgraphs with classes, a stylesheet, conditions and loops, so every rule has real work to do.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::time::{Duration, Instant};

use trellis_syntax::SourceFile;
use trellis_workflow::{CompileOptions, compile};

fn measure(nodes: usize, iterations: usize) {
    let text = trellis_test::workflows::generated(nodes);
    let file = SourceFile::new(format!("generated-{nodes}.fabro"), text);
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let parsed = trellis_syntax::parse(&file);
        let compiled = compile(&file, parsed, &CompileOptions::default());
        times.push(started.elapsed());
        assert!(
            compiled.workflow.is_some(),
            "{:?}",
            compiled.diagnostics.first()
        );
        assert!(
            compiled.diagnostics.is_empty(),
            "{:?}",
            compiled.diagnostics.first()
        );
    }
    times.sort();
    let median = times[times.len() / 2];
    let per_node = median / u32::try_from(nodes).unwrap_or(u32::MAX);
    println!(
        "parse+validate {nodes:>6} nodes ({:>7} bytes): min {:>9.3?}  median {:>9.3?}  ({:.2?}/node)",
        file.text().len(),
        times[0],
        median,
        per_node,
    );
    if nodes >= 10_000 && median > Duration::from_secs(1) {
        println!("  !! over the 1 s budget for 10,000 nodes");
    }
}

fn main() {
    measure(1_000, 50);
    measure(10_000, 10);
}
