//! `parallel-fan-in` (error): the branches of a parallel node meet at a fan-in node.
//!
//! A `component` node runs each outgoing edge's chain of nodes as a branch, up to the nearest
//! `tripleoctagon` fan-in that every branch reaches; the fan-in merges their results. If the branches
//! never meet at one, the engine cannot tell where a branch ends:
//!
//! ```dot
//! fan [shape=component]
//! fan -> lint -> exit
//! fan -> test -> exit   // error: the branches of `fan` never meet at a fan-in node
//! ```

use std::collections::BTreeSet;

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::Rule;
use crate::workflow::{NodeIndex, Workflow};

pub const RULE: Rule = Rule {
    code: "parallel-fan-in",
    severity: Severity::Error,
    summary: "parallel branches meet at a fan-in node",
};

/// The fan-in nodes reachable from `from` without passing through another fan-in.
fn fan_ins_reached(workflow: &Workflow, from: NodeIndex) -> BTreeSet<NodeIndex> {
    let mut found = BTreeSet::new();
    let mut seen = vec![false; workflow.nodes.len()];
    let mut stack = vec![from];
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut seen[n], true) {
            continue;
        }
        if matches!(workflow.nodes[n].kind, NodeKind::FanIn(_)) {
            found.insert(n);
            continue;
        }
        stack.extend(workflow.outgoing(n).map(|e| e.to).filter(|&m| !seen[m]));
    }
    found
}

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for (index, node) in workflow
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| matches!(n.kind, NodeKind::Parallel(_)))
    {
        let mut common: Option<BTreeSet<NodeIndex>> = None;
        for edge in workflow.outgoing(index) {
            let reached = fan_ins_reached(workflow, edge.to);
            common = Some(match common {
                None => reached,
                Some(set) => set.intersection(&reached).copied().collect(),
            });
        }
        match common {
            None => out.push(
                RULE.diagnostic(
                    format!("parallel node `{}` has no branches", node.id),
                    node.span,
                )
                .with_label("no outgoing edges")
                .with_help(
                    "add one edge per branch, each leading to a shared `tripleoctagon` fan-in node",
                ),
            ),
            Some(set) if set.is_empty() => out.push(
                RULE.diagnostic(
                    format!("the branches of `{}` never meet at a fan-in node", node.id),
                    node.span,
                )
                .with_label("branches start here")
                .with_help("route every branch into one `shape=tripleoctagon` node"),
            ),
            Some(_) => {}
        }
    }
}
