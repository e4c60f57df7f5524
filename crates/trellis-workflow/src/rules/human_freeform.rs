//! `human-freeform` (error): a human gate has at most one freeform edge.
//!
//! An edge with `freeform=true` out of a human gate receives the person's own text instead of a fixed
//! choice. With two, the engine could not tell which one free text should follow:
//!
//! ```dot
//! approve -> plan [label="Other", freeform=true]
//! approve -> exit [label="Note", freeform=true]   // error: second freeform edge
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "human-freeform",
    severity: Severity::Error,
    summary: "human gates have at most one freeform edge",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for (index, node) in workflow
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| matches!(n.kind, NodeKind::Human(_)))
    {
        let mut freeform = workflow.outgoing(index).filter(|e| e.freeform);
        let Some(first) = freeform.next() else {
            continue;
        };
        for extra in freeform {
            out.push(
                RULE.diagnostic(
                    format!("human gate `{}` has more than one freeform edge", node.id),
                    extra.span,
                )
                .with_label("second freeform edge")
                .with_secondary(first.span, "first freeform edge")
                .with_help("keep `freeform=true` on one edge only"),
            );
        }
    }
}
