//! `file-reference` (error): `@path` references point to readable files inside the workflow's tree.
//!
//! `prompt="@prompts/plan.md"`, `output_schema="@schemas/x.json"` and `workflow="child.fabro"` load a
//! file relative to the workflow file; `~` is the home directory and `..` works as usual. A missing
//! file fails validation with the path that was tried, rather than the run failing later:
//!
//! ```dot
//! plan [shape=tab, prompt="@prompts/plan.md"]   // error if prompts/plan.md does not exist
//! ```
//!
//! A workflow may come from anyone, and what it reads is recorded with the run and shown to models, so
//! a reference must stay inside the workflow's directory — or the git repository it is in — or a
//! directory the user names (`--allow-dir DIR`), after symbolic links are followed. `/proc`, `/sys` and
//! `/dev` are never read (`@/proc/self/environ` would hand over every key of the environment):
//!
//! ```dot
//! leak [shape=tab, prompt="@/proc/self/environ"]   // error: /proc is never read
//! peek [shape=tab, prompt="@../../.ssh/id_rsa"]    // error: outside the workflow's directory
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

/// Where references of one workflow resolve, and the directories they may reach.
#[derive(Debug, Clone)]
pub struct FileScope {
    base_dir: PathBuf,
    /// Canonical directories a referenced file must be inside.
    roots: Vec<PathBuf>,
}

/// Directories whose files are views of the running system, never workflow inputs.
const SYSTEM_DIRS: &[&str] = &["/proc", "/sys", "/dev"];

impl FileScope {
    /// References resolve against `base_dir` and may reach it, the git repository it is in, and
    /// `allowed`.
    pub fn new(base_dir: &Path, allowed: &[PathBuf]) -> Self {
        // A file named without a folder has an empty parent: the current directory.
        let base_dir = if base_dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            base_dir
        };
        let base = std::fs::canonicalize(base_dir)
            .or_else(|_| std::path::absolute(base_dir))
            .unwrap_or_else(|_| base_dir.to_path_buf());
        let repository = base
            .ancestors()
            .find(|dir| dir.join(".git").exists())
            .map(Path::to_path_buf);
        let roots = std::iter::once(base)
            .chain(repository)
            .chain(
                allowed
                    .iter()
                    .filter_map(|dir| std::fs::canonicalize(dir).ok()),
            )
            .collect();
        Self {
            base_dir: base_dir.to_path_buf(),
            roots,
        }
    }

    /// Why `path` (which exists) may not be read, if it may not.
    fn refusal(&self, path: &Path) -> Option<String> {
        let real = std::fs::canonicalize(path).ok()?;
        if let Some(system) = SYSTEM_DIRS.iter().find(|dir| real.starts_with(dir)) {
            return Some(format!(
                "is in {system}, a view of the running system that workflows never read"
            ));
        }
        (!self.roots.iter().any(|root| real.starts_with(root))).then(|| {
            format!(
                "is outside the workflow's directory ({}){}",
                self.roots[0].display(),
                if real == path {
                    String::new()
                } else {
                    format!(" at {}", real.display())
                }
            )
        })
    }
}

/// Resolves a reference against the workflow's directory, expanding a leading `~`.
pub fn resolve_path(reference: &str, base_dir: &Path) -> PathBuf {
    if (reference == "~" || reference.starts_with("~/"))
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(reference.trim_start_matches('~').trim_start_matches('/'));
    }
    base_dir.join(reference)
}

/// Checks that a referenced file exists inside the scope (without reading it).
pub(crate) fn check_exists(
    key: &str,
    value: &Value,
    reference: &str,
    files: &FileScope,
    out: &mut Vec<Diagnostic>,
) -> Option<PathBuf> {
    let path = resolve_path(reference.trim(), &files.base_dir);
    if let Some(why) = files.refusal(&path) {
        out.push(
            RULE.diagnostic(format!("`{key}` refers to `{reference}`, which {why}"), value.span)
                .with_label("not read")
                .with_help("references stay inside the workflow's directory or its git repository; pass --allow-dir DIR to read from another directory"),
        );
        return None;
    }
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
    files: &FileScope,
    out: &mut Vec<Diagnostic>,
) -> Option<(Option<PathBuf>, String)> {
    let Some(reference) = value.text.strip_prefix('@') else {
        return Some((None, value.text.as_str().to_owned()));
    };
    let path = check_exists(key, value, reference, files, out)?;
    match trellis_syntax::read_text(&path) {
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
