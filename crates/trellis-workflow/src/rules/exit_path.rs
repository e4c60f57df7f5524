//! `exit-path` (error): every reachable node has a path to the exit (DOT).
//!
//! A run that reaches a node with no way onward to the exit fails there. Such dead ends are reported up
//! front, with the node they start at; a node meant to end the run is an exit node (`shape=Msquare`):
//!
//! ```dot
//! start -> plan -> exit
//! plan -> notes      // error: there is no path from `notes` to `exit`
//! ```
//!
//! YAML workflows end at any terminal node, so the rule applies to DOT only.

use trellis_syntax::ast::SourceFormat;
use trellis_syntax::{Diagnostic, Severity};

use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "exit-path",
    severity: Severity::Error,
    summary: "every reachable node can reach the exit (DOT)",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    let exits: Vec<_> = workflow.exit_nodes().collect();
    if workflow.format != SourceFormat::Dot || exits.is_empty() {
        return;
    }
    let Some(start) = workflow.start else { return };
    let reachable = workflow.reachable([start], false);
    let reaches_exit = workflow.reachable(exits.iter().copied(), true);
    let exit = &workflow.nodes[exits[0]].id;
    for (index, node) in workflow.nodes.iter().enumerate() {
        // Report where paths fall off: the first node of each dead region, not everything after it
        // (a node with no edge in is reached by a retry-target jump).
        let boundary = index == start
            || workflow.incoming(index).next().is_none()
            || workflow.incoming(index).any(|e| reaches_exit[e.from]);
        if !(reachable[index] && !reaches_exit[index] && boundary) {
            continue;
        }
        let diagnostic = if workflow.outgoing(index).next().is_none() {
            RULE.diagnostic(
                format!(
                    "node `{}` is a dead end: it has no outgoing edges and is not an exit, so a run that reaches it fails there",
                    node.id
                ),
                node.span,
            )
            .with_help(format!(
                "add an edge that leads on towards `{exit}`; if the run should end here, make it an exit node (`shape=Msquare`)"
            ))
        } else {
            RULE.diagnostic(
                format!(
                    "there is no path from `{}` to `{exit}`: a run that reaches it can never finish",
                    node.id
                ),
                node.span,
            )
            .with_help(format!("add an edge that leads on towards `{exit}`"))
        };
        out.push(diagnostic.with_label("the run would stop here"));
    }
}
