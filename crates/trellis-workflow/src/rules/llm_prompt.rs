//! `llm-prompt` (error): agent and prompt nodes have a prompt.
//!
//! A model node without instructions has nothing to do. The prompt may be inline or an `@file`:
//!
//! ```dot
//! plan [shape=tab]   // error: `plan` has no prompt
//! ```
//!
//! A node with a `label` but no `prompt` is asked its label, as Fabro and Attractor do; that is a
//! warning, since a label is usually a title rather than instructions:
//!
//! ```dot
//! plan [shape=tab, label="Plan the change"]   // warning: the label is used as the prompt
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
    summary: "agent and prompt nodes have a prompt (a label stands in, with a warning)",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for node in workflow.nodes.iter().filter(|n| n.declared) {
        let (NodeKind::Agent(llm) | NodeKind::Prompt(llm)) = &node.kind else {
            continue;
        };
        let kind = node.kind.type_name();
        let with_prompt = node.attr_spans.contains_key("prompt");
        if !with_prompt
            && let Some(span) = node.attr_spans.get("label")
            && !llm.prompt.trim().is_empty()
        {
            out.push(
                Diagnostic::new(
                    RULE.code,
                    Severity::Warning,
                    format!(
                        "{kind} node `{}` has no prompt: its label is used as the prompt",
                        node.id
                    ),
                    *span,
                )
                .with_label("used as the prompt")
                .with_help(
                    "add `prompt=\"...\"` with the instructions, or `prompt=\"@prompts/file.md\"`",
                ),
            );
        } else if llm.prompt.trim().is_empty() {
            let span = node.span_of("prompt");
            out.push(
                RULE.diagnostic(format!("{kind} node `{}` has no prompt", node.id), span)
                    .with_label("needs a prompt")
                    .with_help(if workflow.format == trellis_syntax::ast::SourceFormat::Yaml {
                        "add `instruction: ...` or `instruction: ./prompts/file.md`; for a shell step use `type: command` with `script`"
                    } else {
                        "add `prompt=\"...\"` or `prompt=\"@prompts/file.md\"`; for a shell step use `shape=parallelogram` with `script`"
                    }),
            );
        }
    }
}
