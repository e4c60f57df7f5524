//! `cli-backend` (warning): an agent node run by a coding-agent CLI or an ACP agent sets no attribute
//! it ignores.
//!
//! With `backend="cli"` the node is handed to Claude Code, Codex CLI or Gemini CLI (by its provider),
//! which choose their own tools and limits. Attributes written on the node that the chosen CLI cannot
//! honour are reported here, once, rather than silently dropped at run time:
//!
//! ```dot
//! fix [prompt="Fix the tests", backend="cli", provider="openai", max_turns=5]
//! // warning: codex has no turn limit; `max_turns` is ignored
//! ```
//!
//! Never honoured: `permissions` (the CLIs run with their own prompts turned off), `mcp`, `skills`,
//! `allowed_tools`,
//! `disallowed_tools`, `max_tokens`, `thread_id` (each stage is a new
//! CLI session). Claude Code honours `max_turns` and `reasoning_effort`; Codex honours
//! `reasoning_effort`; Gemini CLI neither.

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::{AgentCli, Backend, NodeKind};
use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "cli-backend",
    severity: Severity::Warning,
    summary: "an agent node run by a CLI or an ACP agent sets no attribute it ignores",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for node in &workflow.nodes {
        let NodeKind::Agent(llm) = &node.kind else {
            continue;
        };
        let (ignored, why, by): (Vec<&str>, String, String) = match llm.backend {
            Backend::Api => continue,
            Backend::Cli => {
                let Ok(cli) = AgentCli::for_node(llm) else {
                    continue;
                };
                (
                    cli.unhonoured().to_vec(),
                    format!("{} ({cli}) does not support it", cli.product()),
                    cli.to_string(),
                )
            }
            Backend::Acp => (
                AgentCli::acp_unhonoured().collect(),
                "an ACP agent (backend=\"acp\") chooses its own tools, turns and limits".to_owned(),
                "an ACP agent".to_owned(),
            ),
        };
        for attribute in ignored {
            let Some(span) = node.attr_spans.get(attribute) else {
                continue;
            };
            out.push(
                RULE.diagnostic(
                    format!("`{attribute}` on `{}` is ignored: {why}", node.id),
                    *span,
                )
                .with_label(format!("not honoured by {by}"))
                .with_help(
                    "remove the attribute, or use the built-in agent (backend=\"api\") which honours it",
                ),
            );
        }
    }
}
