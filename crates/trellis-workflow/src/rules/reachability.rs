//! `reachability` (error): every node is reachable from the start.
//!
//! A node no path leads to never runs. That is usually a missing or misspelt edge, so it is an error
//! rather than dead code that looks alive. A node that a retry target names (`retry_target`,
//! `fallback_retry_target`, on a node or the graph) is reached when a stage fails or a goal gate is
//! unmet, so it counts as reachable:
//!
//! ```dot
//! start -> plan -> exit
//! review [shape=tab, prompt="Review"]   // error: `review` is not reachable from `start`
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "reachability",
    severity: Severity::Error,
    summary: "every node is reachable from the start",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    let Some(start) = workflow.start else { return };
    let reachable = workflow.reachable([start], false);
    let rule = if workflow.format == trellis_syntax::ast::SourceFormat::Yaml {
        &crate::rules::sweny::UNREACHABLE_NODE
    } else {
        &RULE
    };
    // A second start node is `start-node`'s to report, not this rule's.
    for (node, _) in workflow.nodes.iter().zip(&reachable).filter(|(n, r)| {
        !**r && (n.declared || workflow.format == trellis_syntax::ast::SourceFormat::Dot)
            && !matches!(n.kind, crate::node_kind::NodeKind::Start)
    }) {
        out.push(
            rule.diagnostic(
                format!(
                    "node `{}` is not reachable from `{}`",
                    node.id, workflow.nodes[start].id
                ),
                node.span,
            )
            .with_label("never runs")
            .with_help("add an edge into it, or remove it"),
        );
    }
}
