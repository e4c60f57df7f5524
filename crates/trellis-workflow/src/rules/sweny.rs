//! The structural checks of YAML (SWEny) workflows carry SWEny's own codes, so a SWEny user recognises
//! them: `MISSING_ENTRY` (no `entry`, or one that names no node), `UNKNOWN_EDGE_SOURCE` and
//! `UNKNOWN_EDGE_TARGET` (an edge names a node that does not exist), `UNREACHABLE_NODE` (breadth-first
//! from `entry`), `SELF_LOOP` (a self-loop without `max_iterations`), `UNBOUNDED_CYCLE` (with bounded edges
//! and self-loops removed, a depth-first search still finds a back edge) and `AMBIGUOUS_EDGES` (two or
//! more unconditional edges out of one node: an error in YAML; in DOT a warning naming the edge that can
//! never be taken). The loader's own checks: `inputs` (the declared inputs), `workflow-type`, and
//! `ignored-field` (a SWEny field Trellis accepts but does not implement yet: one warning per field).
//!
//! ```yaml
//! entry: check
//! nodes:
//!   check: { instruction: Run the tests }
//!   ship: { instruction: Ship it }
//!   fix: { instruction: Fix it }
//! edges:
//!   - { from: check, to: ship }
//!   - { from: check, to: fix }     # AMBIGUOUS_EDGES: which one?
//! ```

use trellis_syntax::ast::SourceFormat;
use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::Rule;
use crate::workflow::{Edge, Workflow};

pub const MISSING_ENTRY: Rule = Rule {
    code: "MISSING_ENTRY",
    severity: Severity::Error,
    summary: "YAML: `entry` names a node",
};
pub const UNKNOWN_EDGE_SOURCE: Rule = Rule {
    code: "UNKNOWN_EDGE_SOURCE",
    severity: Severity::Error,
    summary: "YAML: an edge's `from` is a node",
};
pub const UNKNOWN_EDGE_TARGET: Rule = Rule {
    code: "UNKNOWN_EDGE_TARGET",
    severity: Severity::Error,
    summary: "YAML: an edge's `to` is a node",
};
pub const UNREACHABLE_NODE: Rule = Rule {
    code: "UNREACHABLE_NODE",
    severity: Severity::Error,
    summary: "YAML: every node is reachable from `entry`",
};
pub const SELF_LOOP: Rule = Rule {
    code: "SELF_LOOP",
    severity: Severity::Error,
    summary: "YAML: a self-loop has `max_iterations`",
};
pub const UNBOUNDED_CYCLE: Rule = Rule {
    code: "UNBOUNDED_CYCLE",
    severity: Severity::Error,
    summary: "YAML: every cycle has an edge with `max_iterations`",
};
pub const AMBIGUOUS_EDGES: Rule = Rule {
    code: "AMBIGUOUS_EDGES",
    severity: Severity::Error,
    summary: "at most one unconditional edge leaves a node (DOT: a warning)",
};
pub const INPUTS: Rule = Rule {
    code: "inputs",
    severity: Severity::Error,
    summary: "YAML `inputs` are typed string, number, boolean or string[], with matching defaults and enums",
};
pub const WORKFLOW_TYPE: Rule = Rule {
    code: "workflow-type",
    severity: Severity::Warning,
    summary: "YAML `workflow_type` is one of SWEny's types (SWEny adds types: another is a warning)",
};
pub const IGNORED_FIELD: Rule = Rule {
    code: "ignored-field",
    severity: Severity::Warning,
    summary: "SWEny fields Trellis does not implement yet (judge_budget) are named",
};

/// Whether routing can choose between several edges out of a node of this kind without a condition:
/// a model's routing directive or a person picks among them, or they all run (a fan-out).
fn chooses_without_conditions(kind: &NodeKind) -> bool {
    matches!(
        kind,
        NodeKind::Agent(_)
            | NodeKind::Prompt(_)
            | NodeKind::Human(_)
            | NodeKind::Parallel(_)
            | NodeKind::Conditional
            | NodeKind::FanIn(_)
    )
}

/// `AMBIGUOUS_EDGES`.
pub fn check_ambiguous(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    let yaml = workflow.format == SourceFormat::Yaml;
    for (index, node) in workflow.nodes.iter().enumerate() {
        if !yaml && chooses_without_conditions(&node.kind) {
            continue;
        }
        let unconditional: Vec<&Edge> = workflow
            .outgoing(index)
            .filter(|e| e.when.is_none() && e.condition.is_none() && (yaml || e.label.is_none()))
            .collect();
        let [first, second, rest @ ..] = unconditional.as_slice() else {
            continue;
        };
        let target = |e: &Edge| workflow.nodes[e.to].id.clone();
        if yaml {
            let mut others = vec![format!("`{}`", target(second))];
            others.extend(rest.iter().map(|e| format!("`{}`", target(e))));
            out.push(
                AMBIGUOUS_EDGES
                    .diagnostic(
                        format!(
                            "node `{}` has {} unconditional edges (to `{}`, {}): the next node is ambiguous",
                            node.id,
                            unconditional.len(),
                            target(first),
                            others.join(", ")
                        ),
                        second.span,
                    )
                    .with_secondary(first.span, "first unconditional edge")
                    .with_help("give all but one a `when` condition"),
            );
            continue;
        }
        // DOT: the highest weight, then the lexically first target, is always taken.
        let taken = unconditional
            .iter()
            .min_by(|a, b| {
                b.weight
                    .cmp(&a.weight)
                    .then_with(|| target(a).cmp(&target(b)))
            })
            .map(|e| e.index);
        for edge in unconditional.iter().filter(|e| Some(e.index) != taken) {
            out.push(
                Diagnostic::new(
                    AMBIGUOUS_EDGES.code,
                    Severity::Warning,
                    format!(
                        "the edge `{}` -> `{}` can never be taken: `{}` has another unconditional edge that always wins",
                        node.id,
                        target(edge),
                        node.id
                    ),
                    edge.span,
                )
                .with_label("never taken")
                .with_help("give it a `condition`, or remove it"),
            );
        }
    }
}
