//! `thread-fidelity` (warning): `thread_id` is used with `full` fidelity.
//!
//! Nodes share a conversation thread only when they run with `fidelity="full"`; with any other fidelity
//! each node starts a fresh conversation from a preamble and `thread_id` has no effect:
//!
//! ```dot
//! implement [prompt="...", thread_id="impl"]   // warning: fidelity is `compact`, so the thread is not shared
//! ```
//!
//! Full fidelity may come from the node, the graph's `default_fidelity`, or an incoming edge.

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::Fidelity;
use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "thread-fidelity",
    severity: Severity::Warning,
    summary: "thread_id is used with full fidelity",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for (index, node) in workflow.nodes.iter().enumerate() {
        let Some(llm) = node.kind.llm() else { continue };
        if llm.thread_id.is_none() || !node.attr_spans.contains_key("thread_id") {
            continue;
        }
        let fidelity = llm
            .fidelity
            .or(workflow.graph.default_fidelity)
            .unwrap_or(Fidelity::Compact);
        if fidelity == Fidelity::Full
            || workflow
                .incoming(index)
                .any(|e| e.fidelity == Some(Fidelity::Full))
        {
            continue;
        }
        out.push(
            RULE.diagnostic(
                format!(
                    "`thread_id` on `{}` has no effect with `{fidelity}` fidelity",
                    node.id
                ),
                node.attr_spans["thread_id"],
            )
            .with_label("thread is not shared")
            .with_help("add `fidelity=\"full\"` to share the conversation, or remove `thread_id`"),
        );
    }
}
