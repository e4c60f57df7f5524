//! `wait-duration` (error): wait nodes say how long to wait.
//!
//! An `insulator` node pauses for its `duration` (`30s`, `2m`, ...); the attribute is required:
//!
//! ```dot
//! cool_down [shape=insulator]   // error: `cool_down` has no duration
//! ```

use trellis_syntax::{Diagnostic, Severity, Span};

use crate::rules::Rule;

pub const RULE: Rule = Rule {
    code: "wait-duration",
    severity: Severity::Error,
    summary: "wait nodes have a duration",
};

/// Reports a wait node with no `duration`.
pub(crate) fn report_missing(node: &str, span: Span, out: &mut Vec<Diagnostic>) {
    out.push(
        RULE.diagnostic(format!("wait node `{node}` has no duration"), span)
            .with_label("needs a duration")
            .with_help("add `duration=\"30s\"`"),
    );
}
