//! `parallel-fan-in` (error): the branches of a parallel node meet at a fan-in node.
//!
//! A `component` node runs each outgoing edge's chain of nodes as a branch, up to the nearest
//! `tripleoctagon` fan-in that every branch reaches; the fan-in merges their results. If the branches
//! never meet at one, the engine cannot tell where a branch ends. A branch may hold a fan-out of its own;
//! its branches meet at their own fan-in first. The fan-in is resolved once, at compile time
//! ([`ParallelConfig::fan_in`](crate::node_kind::ParallelConfig::fan_in)), and the engine uses the
//! same answer:
//!
//! ```dot
//! fan [shape=component]
//! fan -> lint -> exit
//! fan -> test -> exit   // error: the branches of `fan` never meet at a fan-in node
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "parallel-fan-in",
    severity: Severity::Error,
    summary: "parallel branches meet at a fan-in node",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for (index, node, config) in workflow
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(index, node)| match &node.kind {
            NodeKind::Parallel(config) => Some((index, node, config)),
            _ => None,
        })
    {
        if workflow.outgoing(index).next().is_none() {
            out.push(
                RULE.diagnostic(
                    format!("parallel node `{}` has no branches", node.id),
                    node.span,
                )
                .with_label("no outgoing edges")
                .with_help(
                    "add one edge per branch, each leading to a shared `tripleoctagon` fan-in node",
                ),
            );
        } else if config.fan_in.is_none() {
            out.push(
                RULE.diagnostic(
                    format!("the branches of `{}` never meet at a fan-in node", node.id),
                    node.span,
                )
                .with_label("branches start here")
                .with_help("route every branch into one `shape=tripleoctagon` node"),
            );
        }
    }
}
