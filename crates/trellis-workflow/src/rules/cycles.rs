//! `cycles` (error in YAML, warning in DOT): loops have a bound.
//!
//! YAML workflows follow the natural-language routing format: a self-loop must set `max_iterations`, and
//! every cycle must contain an edge with `max_iterations` (checked by removing bounded edges and
//! self-loops and searching what remains for a cycle). Anything else is invalid:
//!
//! ```yaml
//! edges:
//!   - { from: review, to: fix, when: "issues found" }   # error: review → fix → review has no bound
//!   - { from: fix, to: review }
//! ```
//!
//! In DOT, loops are normal (retry loops through a test gate, revise loops through a human gate), and the
//! engine stops runaways with `max_visits`, `max_node_visits` and a run-wide step budget. A DOT loop is
//! reported, as a warning, only when nothing in it can ever end it: no edge with `max_iterations`, no node
//! with `max_visits` (and no graph `max_node_visits`), no human gate, and no decision — no edge out of
//! the loop's nodes with a `condition` or `when`, nor a labelled edge out of a model node that a routing
//! directive could pick. A self-loop with a `when` condition and no `max_iterations` is always
//! reported (the routing page calls it structurally invalid): a model could keep choosing it.

use std::collections::HashSet;

use trellis_syntax::ast::SourceFormat;
use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::Rule;
use crate::workflow::{NodeIndex, Workflow};

pub const RULE: Rule = Rule {
    code: "cycles",
    severity: Severity::Error,
    summary: "loops are bounded (YAML: max_iterations; DOT: a warning for loops nothing can end)",
};

fn can_end_loop(workflow: &Workflow, members: &HashSet<NodeIndex>) -> bool {
    if workflow.graph.max_node_visits.is_some() {
        return true;
    }
    members.iter().any(|&n| {
        let node = &workflow.nodes[n];
        node.common.max_visits.is_some()
            || matches!(node.kind, NodeKind::Human(_))
            || workflow.outgoing(n).any(|e| {
                e.max_iterations.is_some()
                    || e.condition.is_some()
                    || e.when.is_some()
                    || (e.label.is_some()
                        && matches!(node.kind, NodeKind::Agent(_) | NodeKind::Prompt(_)))
            })
    })
}

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    let yaml = workflow.format == SourceFormat::Yaml;
    let severity = if yaml {
        Severity::Error
    } else {
        Severity::Warning
    };
    // Self-loops first: they have their own message.
    for edge in workflow
        .edges
        .iter()
        .filter(|e| e.from == e.to && e.max_iterations.is_none())
    {
        let members = HashSet::from([edge.from]);
        // A model-judged self-loop is invalid without a bound (the routing page), even in DOT.
        if !yaml && edge.when.is_none() && can_end_loop(workflow, &members) {
            continue;
        }
        let id = &workflow.nodes[edge.from].id;
        let message = if edge.when.is_some() {
            format!(
                "self-loop on `{id}` is taken when a model judges its `when` condition, with no `max_iterations` to end it"
            )
        } else {
            format!("self-loop on `{id}` has no `max_iterations`")
        };
        let code = if yaml {
            crate::rules::sweny::SELF_LOOP.code
        } else {
            RULE.code
        };
        out.push(
            Diagnostic::new(code, severity, message, edge.span)
                .with_label("unbounded self-loop")
                .with_help(if yaml {
                    "add `max_iterations: N` to the edge"
                } else {
                    "add `max_iterations=N` to the edge"
                }),
        );
    }
    for component in
        workflow.strongly_connected_components(|e| e.max_iterations.is_none() && e.from != e.to)
    {
        if component.len() < 2 {
            continue;
        }
        let members: HashSet<NodeIndex> = component.iter().copied().collect();
        if !yaml && can_end_loop(workflow, &members) {
            continue;
        }
        let mut ordered = component.clone();
        ordered.sort_unstable();
        let names: Vec<_> = ordered
            .iter()
            .map(|&n| format!("`{}`", workflow.nodes[n].id))
            .collect();
        // Point at the edge that closes the loop: the first in-loop edge into the earliest node.
        let closing = workflow
            .incoming(ordered[0])
            .find(|e| members.contains(&e.from) && e.max_iterations.is_none())
            .map_or(workflow.nodes[ordered[0]].span, |e| e.span);
        let message = if yaml {
            format!(
                "unbounded cycle through {}: no edge in it has `max_iterations`",
                names.join(", ")
            )
        } else {
            format!(
                "loop through {} can never end: nothing in it decides to leave",
                names.join(", ")
            )
        };
        let help = if yaml {
            "add `max_iterations: N` to an edge of the cycle"
        } else {
            "add `max_iterations=N` to an edge, `max_visits=N` to a node, or a conditional edge that leaves the loop"
        };
        let code = if yaml {
            crate::rules::sweny::UNBOUNDED_CYCLE.code
        } else {
            RULE.code
        };
        out.push(
            Diagnostic::new(code, severity, message, closing)
                .with_label("closes the loop")
                .with_help(help),
        );
    }
}
