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

/// A chain of `nodes` nodes that no statement declares (each an `edge-target` error): the path that
/// once compared every undeclared id with every node (24.7 s at 100,000 nodes).
fn measure_undeclared(nodes: usize) {
    use std::fmt::Write as _;
    let mut text =
        String::from("digraph U { start [shape=Mdiamond]; exit [shape=Msquare];\n start -> u0;\n");
    for i in 0..nodes {
        let _ = writeln!(text, " u{i} -> u{};", i + 1);
    }
    let _ = writeln!(text, " u{nodes} -> exit; }}");
    let file = SourceFile::new("undeclared.fabro", text);
    let started = Instant::now();
    let compiled = compile(
        &file,
        trellis_syntax::parse(&file),
        &CompileOptions::default(),
    );
    let took = started.elapsed();
    assert!(compiled.workflow.is_none());
    println!(
        "parse+validate {nodes:>6} undeclared nodes: {took:>9.3?}  [linear: about 10x the 10,000-node figure]"
    );
}

fn main() {
    measure(1_000, 50);
    measure(10_000, 10);
    measure_undeclared(100_000);
}
