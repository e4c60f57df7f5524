//! `agent-tools` (error): an agent node's `allowed_tools` and `disallowed_tools` name tools the
//! built-in agent has.
//!
//! The tools are `read_file`, `write_file`, `edit_file`, `shell`, `grep`, `glob`, `list_dir`,
//! `read_many_files`, `web_fetch`, `web_search` and `apply_patch` (these four only when
//! `allowed_tools` names them), and the sub-agent tools `spawn_agent`, `send_input`, `wait`,
//! `close_agent`. A name that is none of them would fail the stage when it starts, after the stages
//! before it ran:
//!
//! ```dot
//! fix [prompt="Fix the tests", allowed_tools="read_file,shel"]   // error: `shel` is no tool; did you mean `shell`?
//! ```
//!
//! Nodes run by a CLI or an ACP agent (`backend="cli"`, `"acp"`) do not use these lists: the
//! `cli-backend` rule says so instead.

use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::{AGENT_TOOLS, Backend, NodeKind};
use crate::rules::{self, Rule};
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "agent-tools",
    severity: Severity::Error,
    summary: "an agent node's allowed_tools and disallowed_tools name tools the agent has",
};

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for node in &workflow.nodes {
        let NodeKind::Agent(llm) = &node.kind else {
            continue;
        };
        if llm.backend != Backend::Api {
            continue;
        }
        let lists = [
            (
                "allowed_tools",
                llm.allowed_tools.as_deref().unwrap_or_default(),
            ),
            ("disallowed_tools", llm.disallowed_tools.as_slice()),
        ];
        for (attribute, names) in lists {
            for name in names.iter().filter(|n| !AGENT_TOOLS.contains(&n.as_str())) {
                let span = node.attr_spans.get(attribute).copied().unwrap_or(node.span);
                let help = if let Some(near) = rules::closest(name, AGENT_TOOLS.iter().copied()) {
                    format!("did you mean `{near}`?")
                } else {
                    format!("the tools are {}", AGENT_TOOLS.join(", "))
                };
                out.push(
                    RULE.diagnostic(
                        format!(
                            "agent node `{}`: `{name}` in {attribute} is no tool of the agent",
                            node.id
                        ),
                        span,
                    )
                    .with_label("unknown tool")
                    .with_help(help),
                );
            }
        }
    }
}
