//! `start-node` (error): the workflow has exactly one entry.
//!
//! In DOT, exactly one node is a start node (`shape=Mdiamond`, `type=start`, or the id `start`/`Start`
//! with no other shape): with none the engine does not know where to begin, with two it cannot choose.
//! In YAML the entry is `entry:` (or `start:`), which must name a node (`MISSING_ENTRY`, see `sweny`).
//!
//! ```dot
//! digraph G { plan [shape=tab, prompt="..."]; exit [shape=Msquare]; plan -> exit }   // error: no start node
//! ```

use trellis_syntax::ast::SourceFormat;
use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::{Rule, report_extra_nodes};
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "start-node",
    severity: Severity::Error,
    summary: "exactly one start node (DOT); `start:` names a node (YAML)",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    if workflow.format == SourceFormat::Yaml {
        let entry = &crate::rules::sweny::MISSING_ENTRY;
        if let Some(name) = workflow.graph.attributes.get("start")
            && workflow.node_index(name).is_none()
        {
            let span = workflow
                .graph
                .attr_spans
                .get("start")
                .copied()
                .unwrap_or(workflow.header_span);
            let mut diagnostic = entry
                .diagnostic(format!("`entry` names `{name}`, which is not a node"), span)
                .with_label("no such node");
            if let Some(near) =
                crate::rules::closest(name, workflow.nodes.iter().map(|n| n.id.as_str()))
            {
                diagnostic = diagnostic.with_help(format!("did you mean `{near}`?"));
            }
            out.push(diagnostic);
        } else if !workflow.graph.attributes.contains_key("start") && !workflow.nodes.is_empty() {
            out.push(
                entry
                    .diagnostic("the workflow has no `entry`", workflow.header_span)
                    .with_help(format!(
                        "add `entry: {}` (the node the workflow starts at)",
                        workflow.nodes[0].id
                    )),
            );
        } else if workflow.nodes.is_empty() {
            out.push(
                RULE.diagnostic("the workflow has no nodes", workflow.header_span)
                    .with_help("list the stages under `nodes:`"),
            );
        }
        return;
    }
    let starts: Vec<_> = workflow
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, NodeKind::Start))
        .collect();
    match starts.as_slice() {
        [] => out.push(
            RULE.diagnostic("the workflow has no start node", workflow.header_span)
                .with_label("in this workflow")
                .with_help("add `start [shape=Mdiamond]` and an edge from it to the first stage"),
        ),
        [_] => {}
        several => report_extra_nodes(
            &RULE,
            "start",
            several,
            "a workflow has exactly one start node",
            out,
        ),
    }
}
