//! `goal-gate-retry` (warning): goal gates say where to retry.
//!
//! When the run reaches the exit, every executed `goal_gate=true` node must have succeeded; if one did
//! not, the run goes to its retry target (node `retry_target`, node `fallback_retry_target`, then the
//! graph's). With none anywhere the run simply fails, which is allowed but rarely what was meant:
//!
//! ```dot
//! test [shape=parallelogram, script="make test", goal_gate=true]   // warning: no retry target
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "goal-gate-retry",
    severity: Severity::Warning,
    summary: "goal gates have a retry target",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    let graph_target =
        workflow.graph.retry_target.is_some() || workflow.graph.fallback_retry_target.is_some();
    for node in workflow.nodes.iter().filter(|n| n.common.goal_gate) {
        if graph_target
            || node.common.retry_target().is_some()
            || node.common.fallback_retry_target().is_some()
        {
            continue;
        }
        let span = node.span_of("goal_gate");
        out.push(
            RULE.diagnostic(
                format!(
                    "goal gate `{}` has no retry target: if it fails, the run fails",
                    node.id
                ),
                span,
            )
            .with_label("goal gate without retry configuration")
            .with_help("add `retry_target=\"<node>\"` to the node, or `retry_target` to the graph"),
        );
    }
}
