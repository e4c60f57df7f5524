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
//! An empty `condition=""` is treated as no condition, with a warning. An outcome word of the
//! workflow's own (`outcome=needs_dod`, as Attractor's templates write) is a warning: stages end with
//! a status, so the clause compares with the stage's preferred label, which a model's routing
//! directive names (`{"outcome": "needs_dod"}` or `preferred_next_label`). A word within two edits of
//! a status (`outcome=sucess`) stays an error.

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
        Ok(condition) => {
            for (word, span) in condition.custom_outcomes() {
                out.push(
                    Diagnostic::warning(
                        RULE.code,
                        format!("`{word}` is not an outcome Trellis sets"),
                        value.source_span(*span),
                    )
                    .with_label("a custom outcome")
                    .with_help(format!(
                        "stages end {}; `outcome={word}` holds when the stage's model names `{word}` as its outcome or preferred label",
                        "success, partial_success, fail or skipped"
                    )),
                );
            }
            Some(condition)
        }
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
