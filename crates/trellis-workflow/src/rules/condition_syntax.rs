//! `condition-syntax` (error): edge conditions parse and compile.
//!
//! Conditions are checked when the workflow is compiled, never first at run time: syntax, outcome words
//! (`outcome=sucess` is a typo, not a condition that is always false), regular expressions after
//! `matches`, and numbers after `>`, `<`, `>=`, `<=`. The error points into the condition text:
//!
//! ```dot
//! gate -> deploy [condition="outcome=success &&"]   // error: the condition ends too early
//! ```
//!
//! An empty `condition=""` is treated as no condition, with a warning.

use trellis_syntax::ast::Value;
use trellis_syntax::{Diagnostic, Severity};

use crate::condition::Condition;
use crate::rules::Rule;

pub const RULE: Rule = Rule {
    code: "condition-syntax",
    severity: Severity::Error,
    summary: "edge conditions parse, with valid outcomes, numbers and regexes",
};

/// Compiles a `condition` attribute value, reporting problems at their exact place in the source.
pub(crate) fn compile(value: &Value, out: &mut Vec<Diagnostic>) -> Option<Condition> {
    if value.text.trim().is_empty() {
        out.push(
            Diagnostic::warning(
                RULE.code,
                "empty condition: this edge is unconditional",
                value.span,
            )
            .with_help(
                "remove the `condition` attribute, or write a condition such as `outcome=success`",
            ),
        );
        return None;
    }
    match Condition::compile(&value.text) {
        Ok(condition) => Some(condition),
        Err(error) => {
            let mut diagnostic = RULE
                .diagnostic(
                    format!("invalid condition: {}", error.message),
                    value.source_span(error.span),
                )
                .with_label("here");
            diagnostic.help = error.help;
            out.push(diagnostic);
            // The edge still has a condition for the graph rules (the workflow never runs).
            Some(Condition::unparsed(&value.text))
        }
    }
}
