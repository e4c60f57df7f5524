//! `attribute-alias` (note): an attribute is written under another engine's name.
//!
//! Workflows written for Attractor engines and for Fabro use a few attribute names of their own. They
//! are read as Trellis's names, and the first use of each in a file is noted, so a migrating user
//! learns the canonical name (`trellis graph` prints it):
//!
//! | written | read as |
//! |---|---|
//! | `tool_command` (Attractor) | `script` |
//! | `stack.child_workflow` (Fabro) | `workflow` |
//! | `stack.child_dotfile` (Fabro, older) | `workflow` |
//!
//! ```dot
//! test [shape=parallelogram, tool_command="cargo test"]   // note: read as `script`
//! ```
//!
//! A node that sets both names keeps the canonical one, with a warning.

use std::collections::BTreeSet;

use trellis_syntax::{Diagnostic, Severity};

use crate::flatten::FlatGraph;
use crate::rules::Rule;

pub const RULE: Rule = Rule {
    code: "attribute-alias",
    severity: Severity::Note,
    summary: "attributes under another engine's name are read as Trellis's",
};

/// Node attribute aliases and the names they stand for.
pub const ALIASES: &[(&str, &str)] = &[
    ("tool_command", "script"),
    ("stack.child_workflow", "workflow"),
    ("stack.child_dotfile", "workflow"),
];

/// Renames aliased node attributes to their canonical names before lowering, noting the first use
/// of each alias.
pub(crate) fn apply(graph: &mut FlatGraph, out: &mut Vec<Diagnostic>) {
    let mut noted = BTreeSet::new();
    for node in &mut graph.nodes {
        for (alias, canonical) in ALIASES {
            let Some(mut attr) = node.attrs.remove(*alias) else {
                continue;
            };
            let explicit = node.explicit.remove(*alias).is_some();
            if node.attrs.contains_key(*canonical) {
                out.push(
                    Diagnostic::new(
                        RULE.code,
                        Severity::Warning,
                        format!(
                            "`{}` sets both `{canonical}` and `{alias}`; `{alias}` is ignored",
                            node.id.name
                        ),
                        attr.key.span,
                    )
                    .with_label("ignored")
                    .with_help(format!("remove `{alias}`")),
                );
                continue;
            }
            if noted.insert(*alias) {
                out.push(
                    RULE.diagnostic(
                        format!("`{alias}` is read as `{canonical}`"),
                        attr.key.span,
                    )
                    .with_label(format!("`{canonical}` in Trellis"))
                    .with_help(format!(
                        "write `{canonical}` to use the canonical name; this note is shown once per file"
                    )),
                );
            }
            attr.key.name = (*canonical).into();
            if explicit {
                node.explicit.insert((*canonical).to_owned(), ());
            }
            node.attrs.insert((*canonical).to_owned(), attr);
        }
    }
}
