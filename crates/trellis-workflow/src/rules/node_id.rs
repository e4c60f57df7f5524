//! `node-id` (error): a node id can name a stage directory, and only inside the run's record.
//!
//! Every stage of a run is recorded in a directory named after its node (`007-review@2`). So an id
//! may not hold a path separator (`/` or `\`), be `.` or `..`, hold NUL or another control character,
//! or be longer than 200 bytes (file systems limit a name to 255). YAML ids are free text, so this is
//! where a hostile id such as `../../../../tmp/pwn` stops:
//!
//! ```yaml
//! nodes:
//!   "../../etc/x":        # error: a node id may not contain `/`
//!     instruction: ...
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "node-id",
    severity: Severity::Error,
    summary: "node ids name stage directories: no `/`, `\\`, `..`, control characters, at most 200 bytes",
};

/// The longest node id: the stage directory adds a rank, a visit count and two separators.
pub const MAX_ID_BYTES: usize = 200;

/// What is wrong with `id` as the name of a stage directory, if anything.
fn problem(id: &str) -> Option<String> {
    if too_long(id) {
        return Some(format!(
            "node id `{}…` is {} bytes long; stage directories are named after node ids, so they may have at most {MAX_ID_BYTES}",
            id.chars().take(40).collect::<String>(),
            id.len()
        ));
    }
    let shown = id.escape_debug();
    if id.is_empty() || id == "." || id == ".." {
        return Some(format!("node id `{shown}` cannot name a stage directory"));
    }
    if let Some(c) = id.chars().find(|c| matches!(c, '/' | '\\')) {
        return Some(format!(
            "node id `{shown}` contains `{c}`; stage directories are named after node ids, which may not hold a path separator"
        ));
    }
    if id.chars().any(char::is_control) {
        return Some(format!(
            "node id `{shown}` contains a control character (NUL, a newline, ...)"
        ));
    }
    None
}

fn too_long(id: &str) -> bool {
    id.len() > MAX_ID_BYTES
}

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for node in &workflow.nodes {
        if let Some(message) = problem(&node.id) {
            let (label, help) = if too_long(&node.id) {
                (
                    "too long",
                    "use a shorter id, and put the description in `label`",
                )
            } else {
                (
                    "not usable as a node id",
                    "use letters, digits, `_`, `-` and `.`, and put the description in `label`",
                )
            };
            out.push(
                RULE.diagnostic(message, node.span)
                    .with_label(label)
                    .with_help(help),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::problem;

    #[test]
    fn ids_that_could_leave_the_record_or_break_a_name_are_refused() {
        for bad in [
            "../../../../tmp/x/ESCAPED/pwn",
            "a/b",
            "..",
            ".",
            "",
            "a\\b",
            "a\0b",
            "a\nb",
        ] {
            assert!(problem(bad).is_some(), "{bad:?}");
        }
        assert!(problem(&"x".repeat(201)).is_some());
        for good in [
            "read-bug-report",
            "a.b",
            "a..b",
            "Ünïcode",
            &"x".repeat(200),
        ] {
            assert!(problem(good).is_none(), "{good:?}");
        }
    }
}
