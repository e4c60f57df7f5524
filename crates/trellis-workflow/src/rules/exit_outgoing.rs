//! `exit-outgoing` (error): no edge leaves the exit node.
//!
//! Reaching the exit ends the run, so an edge out of it could never be taken:
//!
//! ```dot
//! exit -> plan   // error: the run has ended at `exit`
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "exit-outgoing",
    severity: Severity::Error,
    summary: "no edges out of the exit node",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for exit in workflow.exit_nodes() {
        for edge in workflow.outgoing(exit) {
            out.push(
                RULE.diagnostic(
                    format!(
                        "edge `{} -> {}` leaves the exit node",
                        workflow.nodes[exit].id, workflow.nodes[edge.to].id
                    ),
                    edge.span,
                )
                .with_label("the run ends at the exit node; this edge is never taken")
                .with_help("remove the edge, or route through another node before the exit"),
            );
        }
    }
}
