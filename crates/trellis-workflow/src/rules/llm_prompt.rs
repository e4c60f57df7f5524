//! `llm-prompt` (error): agent and prompt nodes have a prompt.
//!
//! A model node without instructions has nothing to do. The prompt may be inline or an `@file`:
//!
//! ```dot
//! plan [shape=tab, label="Plan"]   // error: `plan` has no prompt
//! ```
//!
//! A fan-in node's prompt is optional (without one, the best branch is picked by status).

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::NodeKind;
use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "llm-prompt",
    severity: Severity::Error,
    summary: "agent and prompt nodes have a prompt",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for node in workflow.nodes.iter().filter(|n| n.declared) {
        if let NodeKind::Agent(llm) | NodeKind::Prompt(llm) = &node.kind
            && llm.prompt.trim().is_empty()
        {
            let span = node.attr_spans.get("prompt").copied().unwrap_or(node.span);
            out.push(
                RULE.diagnostic(format!("{} node `{}` has no prompt", node.kind.type_name(), node.id), span)
                    .with_label("needs a prompt")
                    .with_help("add `prompt=\"...\"` or `prompt=\"@prompts/file.md\"`; for a shell step use `shape=parallelogram` with `script`"),
            );
        }
    }
}
