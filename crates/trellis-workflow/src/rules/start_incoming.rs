//! `start-incoming` (error): no edge leads into the start node.
//!
//! The start node runs once, to begin the run; an edge back into it would restart the run's bookkeeping
//! rather than loop. Loop back to the first real stage instead:
//!
//! ```dot
//! review -> start [label="Again"]   // error: route to `plan`, the first stage, instead
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "start-incoming",
    severity: Severity::Error,
    summary: "no edges into the start node",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for (index, node) in workflow
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| matches!(n.kind, NodeKind::Start))
    {
        for edge in workflow.incoming(index) {
            out.push(
                RULE.diagnostic(
                    format!(
                        "edge `{} -> {}` leads into the start node",
                        workflow.nodes[edge.from].id, node.id
                    ),
                    edge.span,
                )
                .with_label("into the start node")
                .with_help("loop back to the first stage after the start node instead"),
            );
        }
    }
}
