//! The validation rules, one per file. Each file's doc comment is the user documentation of its rule
//! (what it checks, why, an example) and declares a [`Rule`] with a stable code and severity.
//!
//! Two kinds of rule: *lowering rules* are checked conversions the lowering step calls while it turns
//! attribute text into typed values (a condition that does not parse, an `@file` that does not exist);
//! *graph rules* look at the finished [`Workflow`]. [`ALL`] lists every rule; [`GRAPH_CHECKS`] runs the
//! graph rules in order.

use trellis_syntax::{Diagnostic, Severity, Span};

use crate::node_kind::{Backend, LlmConfig, NodeKind};
use crate::workflow::{Node, Workflow};

pub mod agent_tools;
pub mod attribute_alias;
pub mod attribute_value;
pub mod cli_backend;
pub mod cli_provider;
pub mod command_script;
pub mod condition_syntax;
pub mod conditional_edges;
pub mod cycles;
pub mod duration_unit;
pub mod edge_target;
pub mod exit_node;
pub mod exit_outgoing;
pub mod exit_path;
pub mod fidelity_value;
pub mod file_reference;
pub mod goal_gate_retry;
pub mod human_freeform;
pub mod known_handler;
pub mod llm_prompt;
pub mod mcp_server;
pub mod node_id;
pub mod parallel_fan_in;
pub mod reachability;
pub mod retry_target;
pub mod start_incoming;
pub mod start_node;
pub mod stylesheet_property;
pub mod stylesheet_syntax;
pub mod sub_workflow;
pub mod sweny;
pub mod template_variable;
pub mod thread_fidelity;
pub mod unknown_attribute;
pub mod wait_duration;

/// A validation rule's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Stable kebab-case code shown with every diagnostic.
    pub code: &'static str,
    pub severity: Severity,
    /// One line for `trellis rules` and the docs.
    pub summary: &'static str,
}

impl Rule {
    pub fn diagnostic(&self, message: impl Into<String>, span: Span) -> Diagnostic {
        Diagnostic::new(self.code, self.severity, message, span)
    }
}

/// The code the parsers use for syntax errors (documented in `trellis-syntax`).
pub const SYNTAX: Rule = Rule {
    code: "syntax",
    severity: Severity::Error,
    summary: "the file parses as the DOT subset or the YAML workflow format",
};

/// Every rule, in the order their diagnostics are documented.
pub const ALL: &[&Rule] = &[
    &SYNTAX,
    &known_handler::RULE,
    &unknown_attribute::RULE,
    &attribute_alias::RULE,
    &attribute_value::RULE,
    &duration_unit::RULE,
    &condition_syntax::RULE,
    &stylesheet_syntax::RULE,
    &stylesheet_property::RULE,
    &file_reference::RULE,
    &mcp_server::RULE,
    &template_variable::RULE,
    &fidelity_value::RULE,
    &start_node::RULE,
    &node_id::RULE,
    &exit_node::RULE,
    &start_incoming::RULE,
    &exit_outgoing::RULE,
    &edge_target::RULE,
    &reachability::RULE,
    &exit_path::RULE,
    &llm_prompt::RULE,
    &command_script::RULE,
    &wait_duration::RULE,
    &sub_workflow::RULE,
    &conditional_edges::RULE,
    &retry_target::RULE,
    &goal_gate_retry::RULE,
    &human_freeform::RULE,
    &thread_fidelity::RULE,
    &cli_provider::RULE,
    &cli_backend::RULE,
    &agent_tools::RULE,
    &parallel_fan_in::RULE,
    &cycles::RULE,
    &sweny::MISSING_ENTRY,
    &sweny::UNKNOWN_EDGE_SOURCE,
    &sweny::UNKNOWN_EDGE_TARGET,
    &sweny::UNREACHABLE_NODE,
    &sweny::SELF_LOOP,
    &sweny::UNBOUNDED_CYCLE,
    &sweny::AMBIGUOUS_EDGES,
    &sweny::INPUTS,
    &sweny::WORKFLOW_TYPE,
    &sweny::IGNORED_FIELD,
];

/// A graph rule's check.
pub type GraphCheck = fn(&Workflow, &mut Vec<Diagnostic>);

/// The graph rules, run in this order after lowering.
pub const GRAPH_CHECKS: &[GraphCheck] = &[
    start_node::check,
    node_id::check,
    exit_node::check,
    start_incoming::check,
    exit_outgoing::check,
    edge_target::check,
    reachability::check,
    exit_path::check,
    llm_prompt::check,
    conditional_edges::check,
    retry_target::check,
    goal_gate_retry::check,
    human_freeform::check,
    thread_fidelity::check,
    cli_provider::check,
    cli_backend::check,
    agent_tools::check,
    parallel_fan_in::check,
    cycles::check,
    sweny::check_ambiguous,
];

/// Reports every node after the first of a kind there must be exactly one of (`start`, `exit`).
pub(crate) fn report_extra_nodes(
    rule: &Rule,
    what: &str,
    nodes: &[&Node],
    help: &str,
    out: &mut Vec<Diagnostic>,
) {
    let Some((first, rest)) = nodes.split_first() else {
        return;
    };
    for extra in rest {
        out.push(
            rule.diagnostic(
                format!(
                    "the workflow has more than one {what} node: `{}` and `{}`",
                    first.id, extra.id
                ),
                extra.span,
            )
            .with_label(format!("another {what} node"))
            .with_secondary(first.span, format!("first {what} node"))
            .with_help(help),
        );
    }
}

/// The agent nodes run by a coding-agent CLI (`backend="cli"`), with their settings.
pub(crate) fn cli_agents(workflow: &Workflow) -> impl Iterator<Item = (&Node, &LlmConfig)> {
    workflow.nodes.iter().filter_map(|node| match &node.kind {
        NodeKind::Agent(llm) if llm.backend == Backend::Cli => Some((node, &**llm)),
        _ => None,
    })
}

/// A word with its indefinite article: "an agent", "a prompt".
pub(crate) fn with_article(word: &str) -> String {
    let article = if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {word}")
}

/// The closest of `candidates` to `word`, for "did you mean" help.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), c))
        .filter(|(distance, c)| *distance <= (c.len() / 3).max(1) && *distance > 0)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| c)
}
