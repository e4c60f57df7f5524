//! `conditional-edges` (warning): conditional (diamond) nodes branch on conditions.
//!
//! A diamond exists to route: it needs at least two outgoing edges, at least one with a `condition`
//! (the others act as fallbacks). With fewer it is a pass-through that routes nothing:
//!
//! ```dot
//! gate [shape=diamond]
//! gate -> review   // warning: `gate` has one outgoing edge and no conditions
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "conditional-edges",
    severity: Severity::Warning,
    summary: "conditional nodes have several outgoing edges, some with conditions",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for (index, node) in workflow.nodes.iter().enumerate().filter(|(i, n)| {
        matches!(n.kind, NodeKind::Conditional) && !workflow.unresolved.contains(i)
    }) {
        let edges = workflow.outgoing(index).count();
        let conditional = workflow
            .outgoing(index)
            .filter(|e| e.condition.is_some() || e.when.is_some())
            .count();
        if edges >= 2 && conditional >= 1 {
            continue;
        }
        let what = match (edges, conditional) {
            (0, _) => "no outgoing edges".to_owned(),
            (1, _) => format!(
                "one outgoing edge{}",
                if conditional == 0 {
                    " and no conditions"
                } else {
                    ""
                }
            ),
            (n, _) => format!("{n} outgoing edges but none has a condition"),
        };
        out.push(
            RULE.diagnostic(format!("conditional node `{}` has {what}", node.id), node.span)
                .with_label("routes nothing")
                .with_help("give it edges with `condition=\"...\"` plus a fallback edge, or make it a plain node"),
        );
    }
}
