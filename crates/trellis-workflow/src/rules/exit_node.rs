//! `exit-node` (error): the workflow can finish.
//!
//! In DOT, exactly one node is the exit (`shape=Msquare`, `type=exit`, or the id `exit`/`Exit`/`end`/
//! `End` with no other shape). In YAML, a node with no outgoing edges — or only edges with
//! `max_iterations`, which run out — is terminal, and at least one terminal node must be reachable from
//! the entry; otherwise the workflow could only loop forever.
//!
//! ```dot
//! digraph G { start [shape=Mdiamond]; a [shape=parallelogram, script="true"]; start -> a }   // error: no exit node
//! ```

use trellis_syntax::ast::SourceFormat;
use trellis_syntax::{Diagnostic, Severity};

use crate::rules::{Rule, report_extra_nodes};
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "exit-node",
    severity: Severity::Error,
    summary: "exactly one exit node (DOT); a reachable terminal node (YAML)",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    if workflow.format == SourceFormat::Yaml {
        let Some(start) = workflow.start else { return };
        let reachable = workflow.reachable([start], false);
        let can_end = (0..workflow.nodes.len())
            .any(|n| reachable[n] && workflow.outgoing(n).all(|e| e.max_iterations.is_some()));
        if !can_end {
            out.push(
                RULE.diagnostic("no terminal node is reachable: this workflow can never finish", workflow.header_span)
                    .with_help("a node with no outgoing edges ends the run; add one, or bound a loop with `max_iterations`"),
            );
        }
        return;
    }
    let exits: Vec<_> = workflow.exit_nodes().map(|i| &workflow.nodes[i]).collect();
    match exits.as_slice() {
        [] => out.push(
            RULE.diagnostic("the workflow has no exit node", workflow.header_span)
                .with_label("in this workflow")
                .with_help("add `exit [shape=Msquare]` and an edge into it from the last stage"),
        ),
        [_] => {}
        several => report_extra_nodes(
            &RULE,
            "exit",
            several,
            "route every finishing path into one exit node",
            out,
        ),
    }
}
