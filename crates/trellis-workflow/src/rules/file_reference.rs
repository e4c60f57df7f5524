//! `file-reference` (error): `@path` references point to readable files.
//!
//! `prompt="@prompts/plan.md"` and `output_schema="@schemas/x.json"` load a file relative to the
//! workflow file; `~` is the home directory and `..` works as usual. A missing file fails validation
//! with the path that was tried, rather than the run failing later:
//!
//! ```dot
//! plan [shape=tab, prompt="@prompts/plan.md"]   // error if prompts/plan.md does not exist
//! ```

use std::path::{Path, PathBuf};

use trellis_syntax::ast::Value;
use trellis_syntax::{Diagnostic, Severity};

use crate::rules::Rule;

pub const RULE: Rule = Rule {
    code: "file-reference",
    severity: Severity::Error,
    summary: "@file references point to readable files",
};

/// Resolves a reference against the workflow's directory, expanding a leading `~`.
pub fn resolve_path(reference: &str, base_dir: &Path) -> PathBuf {
    if (reference == "~" || reference.starts_with("~/"))
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(reference.trim_start_matches('~').trim_start_matches('/'));
    }
    base_dir.join(reference)
}

/// Checks that a referenced file exists (without reading it).
pub(crate) fn check_exists(
    key: &str,
    value: &Value,
    reference: &str,
    base_dir: &Path,
    out: &mut Vec<Diagnostic>,
) -> Option<PathBuf> {
    let path = resolve_path(reference.trim(), base_dir);
    let problem = match std::fs::metadata(&path) {
        Ok(meta) => match trellis_syntax::source::non_regular(&meta) {
            None if meta.len() > trellis_syntax::source::MAX_SOURCE_BYTES => format!(
                "`{key}` refers to `{reference}`, which is too large ({} bytes; the limit is 16 MiB)",
                meta.len()
            ),
            None => return Some(path),
            Some(what) => format!("`{key}` refers to `{reference}`, which is {what}, not a file"),
        },
        Err(_) => format!("`{key}` refers to `{reference}`, which does not exist"),
    };
    out.push(
        RULE.diagnostic(problem, value.span)
            .with_label(format!("looked for {}", path.display()))
            .with_help("paths are relative to the workflow file"),
    );
    None
}

/// For `@path` values, the file's path and text; for other values, the value itself.
pub(crate) fn load(
    key: &str,
    value: &Value,
    base_dir: &Path,
    out: &mut Vec<Diagnostic>,
) -> Option<(Option<PathBuf>, String)> {
    let Some(reference) = value.text.strip_prefix('@') else {
        return Some((None, value.text.clone()));
    };
    let path = check_exists(key, value, reference, base_dir, out)?;
    match std::fs::read_to_string(&path) {
        Ok(text) => Some((Some(path), text)),
        Err(error) => {
            out.push(
                RULE.diagnostic(
                    format!("cannot read `{reference}` for `{key}`: {error}"),
                    value.span,
                )
                .with_label(path.display().to_string()),
            );
            None
        }
    }
}
