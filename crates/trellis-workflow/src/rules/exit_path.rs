//! `exit-path` (error): every reachable node has a path to the exit (DOT).
//!
//! A run that reaches a node with no way onward to the exit stops there with an error. Such dead ends are
//! reported up front, with the node they start at:
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
        // Report where paths fall off: the first node of each dead region, not everything after it.
        let boundary = index == start || workflow.incoming(index).any(|e| reaches_exit[e.from]);
        if reachable[index] && !reaches_exit[index] && boundary {
            let message = if workflow.outgoing(index).next().is_none() {
                format!(
                    "node `{}` is a dead end: it has no outgoing edges and is not the exit",
                    node.id
                )
            } else {
                format!("there is no path from `{}` to `{exit}`", node.id)
            };
            out.push(
                RULE.diagnostic(message, node.span)
                    .with_label("the run would stop here")
                    .with_help(format!("add an edge that leads on towards `{exit}`")),
            );
        }
    }
}
