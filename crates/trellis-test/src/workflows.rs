//! Generated workflows for the benchmarks.

use std::fmt::Write as _;

/// A workflow of `nodes` nodes that mixes every common node kind, subgraphs with classes, a
/// stylesheet, conditions and loops, so every validation rule has real work to do.
pub fn generated(nodes: usize) -> String {
    let mut dot = String::from(
        "digraph Generated {\n  graph [goal=\"Benchmark\", model_stylesheet=\"* { model: m1; } .hot { model: m2; } #n5 { model: m3; }\"]\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n",
    );
    let body = nodes - 2;
    for i in 0..body {
        if i % 100 == 0 {
            let _ = writeln!(
                dot,
                "  subgraph cluster_{i} {{\n    label=\"Group {i}\"\n    node [timeout=\"30s\"]"
            );
        }
        let _ = match i % 4 {
            0 => writeln!(
                dot,
                "    n{i} [shape=parallelogram, script=\"make step-{i}\"]"
            ),
            1 => writeln!(
                dot,
                "    n{i} [shape=tab, class=\"hot\", prompt=\"Do step {i} of $goal\"]"
            ),
            2 => writeln!(dot, "    n{i} [shape=diamond]"),
            _ => writeln!(dot, "    n{i} [prompt=\"Agent step {i}\", max_visits=3]"),
        };
        if i % 100 == 99 || i + 1 == body {
            dot.push_str("  }\n");
        }
    }
    dot.push_str("  start -> n0\n");
    for i in 0..body - 1 {
        if i % 4 == 2 {
            // A diamond: forward on success, back three nodes otherwise.
            let _ = writeln!(
                dot,
                "  n{i} -> n{} [condition=\"outcome=success && context.score >= 5\"]",
                i + 1
            );
            let _ = writeln!(dot, "  n{i} -> n{}", i.saturating_sub(3));
        } else {
            let _ = writeln!(dot, "  n{i} -> n{}", i + 1);
        }
    }
    let _ = writeln!(dot, "  n{} -> exit\n}}", body - 1);
    dot
}
