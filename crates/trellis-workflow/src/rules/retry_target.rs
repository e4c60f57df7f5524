//! `retry-target` (error): retry targets name existing nodes.
//!
//! `retry_target` and `fallback_retry_target`, on a node or on the graph, say where a failed stage (or an
//! unmet goal gate) sends the run. A target that does not exist would fail the run at the worst moment:
//!
//! ```dot
//! test [shape=parallelogram, script="make test", retry_target="implment"]   // error: no node `implment`
//! ```

use trellis_syntax::{Diagnostic, Severity, Span};

use crate::rules::{Rule, closest};
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "retry-target",
    severity: Severity::Error,
    summary: "retry targets name existing nodes",
};

fn check_target(
    workflow: &Workflow,
    key: &str,
    target: Option<&str>,
    spans: &crate::small_map::SmallMap<Span>,
    owner: &str,
    out: &mut Vec<Diagnostic>,
) {
    let Some(target) = target else { return };
    if workflow.node_index(target).is_some() {
        return;
    }
    let span = spans.get(key).copied().unwrap_or(workflow.header_span);
    let help = closest(target, workflow.nodes.iter().map(|n| n.id.as_str())).map_or_else(
        || "retry targets are node ids".to_owned(),
        |near| format!("did you mean `{near}`?"),
    );
    out.push(
        RULE.diagnostic(
            format!("{owner}`{key}` names `{target}`, which is not a node"),
            span,
        )
        .with_label("no such node")
        .with_help(help),
    );
}

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    let graph = &workflow.graph;
    check_target(
        workflow,
        "retry_target",
        graph.retry_target.as_deref(),
        &graph.attr_spans,
        "graph ",
        out,
    );
    check_target(
        workflow,
        "fallback_retry_target",
        graph.fallback_retry_target.as_deref(),
        &graph.attr_spans,
        "graph ",
        out,
    );
    for node in &workflow.nodes {
        if node.common.retry_target().is_none() && node.common.fallback_retry_target().is_none() {
            continue;
        }
        let owner = format!("node `{}`: ", node.id);
        check_target(
            workflow,
            "retry_target",
            node.common.retry_target(),
            &node.attr_spans,
            &owner,
            out,
        );
        check_target(
            workflow,
            "fallback_retry_target",
            node.common.fallback_retry_target(),
            &node.attr_spans,
            &owner,
            out,
        );
    }
}
