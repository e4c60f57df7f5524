//! `edge-target` (error): edges connect declared nodes.
//!
//! In YAML every `from` and `to` must be a key of `nodes`. In DOT an edge may mention a node that is
//! never declared (it is created with the current defaults), which is almost always a typo: such a node
//! would be an agent with no prompt. Undeclared nodes are allowed only when their id makes them a start
//! or exit node.
//!
//! ```dot
//! plan [shape=tab, prompt="Plan"]
//! start -> pln -> exit   // error: `pln` is never declared; did you mean `plan`?
//! ```

use trellis_syntax::ast::SourceFormat;
use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::{Rule, closest};
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "edge-target",
    severity: Severity::Error,
    summary: "edges connect declared nodes",
};

/// The ids of the nodes the file declares (not those an edge alone brought in).
fn declared(workflow: &Workflow) -> impl Iterator<Item = &str> {
    workflow
        .nodes
        .iter()
        .filter(|n| n.declared)
        .map(|n| n.id.as_str())
}

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    if workflow.format == SourceFormat::Yaml {
        check_yaml(workflow, out);
        return;
    }
    for node in workflow.nodes.iter().filter(|n| !n.declared) {
        let implicit_ok = workflow.format == SourceFormat::Dot
            && matches!(node.kind, NodeKind::Start | NodeKind::Exit);
        if implicit_ok
            || node.attr_spans.contains_key("shape")
            || node.attr_spans.contains_key("type")
        {
            continue;
        }
        let help = match closest(&node.id, declared(workflow)) {
            Some(near) => format!("did you mean `{near}`?"),
            None if workflow.format == SourceFormat::Yaml => {
                format!("declare `{}` under `nodes:`", node.id)
            }
            None => format!("declare it: `{} [label=\"...\", ...]`", node.id),
        };
        out.push(
            RULE.diagnostic(
                format!("edge refers to `{}`, which is never declared", node.id),
                node.span,
            )
            .with_label("not declared")
            .with_help(help),
        );
    }
}

/// YAML: each edge whose `from` or `to` names no node (`UNKNOWN_EDGE_SOURCE`, `UNKNOWN_EDGE_TARGET`).
fn check_yaml(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    use crate::rules::sweny::{UNKNOWN_EDGE_SOURCE, UNKNOWN_EDGE_TARGET};
    for edge in &workflow.edges {
        for (end, rule, field) in [
            (edge.from, &UNKNOWN_EDGE_SOURCE, "from"),
            (edge.to, &UNKNOWN_EDGE_TARGET, "to"),
        ] {
            let node = &workflow.nodes[end];
            if node.declared {
                continue;
            }
            let help = match closest(&node.id, declared(workflow)) {
                Some(near) => format!("did you mean `{near}`?"),
                None => format!("declare `{}` under `nodes:`", node.id),
            };
            out.push(
                rule.diagnostic(
                    format!("the edge's `{field}` is `{}`, which is not a node", node.id),
                    edge.span,
                )
                .with_label("no such node")
                .with_help(help),
            );
        }
    }
}
