//! `cli-provider` (error): an agent node run by a coding-agent CLI has a provider with a CLI.
//!
//! `backend="cli"` runs `claude` for provider `anthropic`, `codex` for `openai` and `gemini` for
//! `gemini` (without a provider, the model's name decides, and Claude Code is the default). Any other
//! provider has no CLI, so the stage could only fail:
//!
//! ```dot
//! fix [prompt="Fix the tests", backend="cli", provider="local"]   // error: `local` has no agent CLI
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::AgentCli;
use crate::rules::{self, Rule};
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "cli-provider",
    severity: Severity::Error,
    summary: "an agent node run by a CLI has a provider with a CLI",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for (node, llm) in rules::cli_agents(workflow) {
        if let Err(problem) = AgentCli::for_node(llm) {
            let span = node
                .attr_spans
                .get("provider")
                .or_else(|| node.attr_spans.get("backend"))
                .copied()
                .unwrap_or(node.span);
            out.push(
                RULE.diagnostic(format!("agent node `{}`: {problem}", node.id), span)
                    .with_label("no CLI for this provider")
                    .with_help(
                        "set provider to anthropic, openai or gemini, or remove backend=\"cli\" to use the built-in agent",
                    ),
            );
        }
    }
}
