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

/// The ids of the nodes the file declares (not those an edge alone brought in), collected once.
fn declared(workflow: &Workflow) -> Vec<&str> {
    workflow
        .nodes
        .iter()
        .filter(|n| n.declared)
        .map(|n| n.id.as_str())
        .collect()
}

/// "Did you mean" for the first problems only: each suggestion compares the id with every declared
/// one, and only the first problems are shown anyway, so a file with thousands of undeclared ids
/// stays linear.
const SUGGESTED: usize = trellis_syntax::diagnostic::MAX_DIAGNOSTICS;

/// The declared id nearest `id`, while suggestions are still made.
fn suggestion<'a>(id: &str, declared: &[&'a str], made: &mut usize) -> Option<&'a str> {
    if *made >= SUGGESTED {
        return None;
    }
    *made += 1;
    closest(id, declared.iter().copied())
}

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    if workflow.format == SourceFormat::Yaml {
        check_yaml(workflow, out);
        return;
    }
    let declared = declared(workflow);
    let mut made = 0;
    for node in workflow.nodes.iter().filter(|n| !n.declared) {
        let implicit_ok = workflow.format == SourceFormat::Dot
            && matches!(node.kind, NodeKind::Start | NodeKind::Exit);
        if implicit_ok
            || node.attr_spans.contains_key("shape")
            || node.attr_spans.contains_key("type")
        {
            continue;
        }
        let help = match suggestion(&node.id, &declared, &mut made) {
            Some(near) => format!("did you mean `{near}`?"),
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
    let declared = declared(workflow);
    let mut made = 0;
    for edge in &workflow.edges {
        for (end, rule, field) in [
            (edge.from, &UNKNOWN_EDGE_SOURCE, "from"),
            (edge.to, &UNKNOWN_EDGE_TARGET, "to"),
        ] {
            let node = &workflow.nodes[end];
            if node.declared {
                continue;
            }
            let help = match suggestion(&node.id, &declared, &mut made) {
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
