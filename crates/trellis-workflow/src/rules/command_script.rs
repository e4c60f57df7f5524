//! `command-script` (error): command nodes have a script.
//!
//! A `parallelogram` node runs its `script` (in `sh`, or Python with `language="python"`). Without one
//! there is nothing to run:
//!
//! ```dot
//! test [shape=parallelogram, label="Run tests"]   // error: `test` has no script
//! ```

use trellis_syntax::{Diagnostic, Severity, Span};

use crate::rules::Rule;

pub const RULE: Rule = Rule {
    code: "command-script",
    severity: Severity::Error,
    summary: "command nodes have a script",
};

/// The node's script, or `None` (reported) when it has none.
pub(crate) fn require(
    node: &str,
    script: Option<String>,
    span: Span,
    out: &mut Vec<Diagnostic>,
) -> Option<String> {
    match script {
        Some(script) if !script.trim().is_empty() => Some(script),
        _ => {
            out.push(
                RULE.diagnostic(format!("command node `{node}` has no script"), span)
                    .with_label("needs a script")
                    .with_help("add `script=\"make test\"`"),
            );
            None
        }
    }
}
