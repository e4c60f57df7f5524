//! `sub-workflow` (error): sub-workflow nodes name a child workflow file that exists.
//!
//! A `house` node runs another workflow file, given by `workflow` (or `stack.child_dotfile`), relative
//! to this one. The file must exist when the parent is validated:
//!
//! ```dot
//! build [shape=house, workflow="build.fabro"]
//! ```

use std::path::{Path, PathBuf};

use trellis_syntax::ast::Value;
use trellis_syntax::{Diagnostic, Severity, Span};

use crate::rules::{Rule, file_reference};

pub const RULE: Rule = Rule {
    code: "sub-workflow",
    severity: Severity::Error,
    summary: "sub-workflow nodes name an existing workflow file",
};

/// The child workflow's path, or `None` (reported) when missing.
pub(crate) fn require(
    node: &str,
    value: Option<&Value>,
    base_dir: &Path,
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
    let reference = value.text.trim_start_matches('@');
    let path = file_reference::resolve_path(reference.trim(), base_dir);
    if path.is_file() {
        return Some(path);
    }
    out.push(
        RULE.diagnostic(
            format!("child workflow `{reference}` of `{node}` does not exist"),
            value.span,
        )
        .with_label(format!("looked for {}", path.display())),
    );
    None
}
