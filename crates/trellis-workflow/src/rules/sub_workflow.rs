//! `sub-workflow` (error): sub-workflow nodes name a child workflow file.
//!
//! A `house` node runs another workflow file, given by `workflow` (or `stack.child_workflow`), relative
//! to this one. Without one there is nothing to run; a file that does not exist is reported by
//! `file-reference`:
//!
//! ```dot
//! build [shape=house, workflow="build.fabro"]
//! ```

use std::path::PathBuf;

use trellis_syntax::ast::Value;
use trellis_syntax::{Diagnostic, Severity, Span};

use crate::rules::{Rule, file_reference};

pub const RULE: Rule = Rule {
    code: "sub-workflow",
    severity: Severity::Error,
    summary: "sub-workflow nodes name a child workflow file",
};

/// The child workflow's path, or `None` (reported) when missing.
pub(crate) fn require(
    node: &str,
    value: Option<&Value>,
    files: &file_reference::FileScope,
    span: Span,
    out: &mut Vec<Diagnostic>,
) -> Option<PathBuf> {
    let Some(value) = value.filter(|v| !v.text.trim().is_empty()) else {
        out.push(
            RULE.diagnostic(
                format!("sub-workflow node `{node}` names no workflow"),
                span,
            )
            .with_label("needs `workflow`")
            .with_help("add `workflow=\"child.fabro\"` (relative to this file)"),
        );
        return None;
    };
    file_reference::check_exists(
        "workflow",
        value,
        value.text.trim_start_matches('@'),
        files,
        out,
    )
}
