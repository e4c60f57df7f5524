//! `fidelity-value` (error): `fidelity` (node, edge) and `default_fidelity` (graph) are valid modes.
//!
//! The modes are `full`, `compact`, `summary:high`, `summary:medium`, `summary:low` and `truncate`. An
//! unknown mode would silently fall back to `compact`, so it is an error:
//!
//! ```dot
//! implement [fidelity="summary"]   // error: did you mean `summary:high`?
//! ```

use trellis_syntax::ast::Value;
use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::Fidelity;
use crate::rules::{Rule, closest};

pub const RULE: Rule = Rule {
    code: "fidelity-value",
    severity: Severity::Error,
    summary: "fidelity modes are full, compact, summary:high|medium|low or truncate",
};

pub(crate) fn parse(key: &str, value: &Value, out: &mut Vec<Diagnostic>) -> Option<Fidelity> {
    if let Ok(fidelity) = value.text.parse() {
        return Some(fidelity);
    }
    let near = closest(&value.text, Fidelity::WORDS.iter().copied()).or_else(|| {
        Fidelity::WORDS
            .iter()
            .copied()
            .find(|w| w.starts_with(value.text.trim()))
    });
    let help = match near {
        Some(near) => format!(
            "did you mean `{near}`? modes: {}",
            Fidelity::WORDS.join(", ")
        ),
        None => format!("modes: {}", Fidelity::WORDS.join(", ")),
    };
    out.push(
        RULE.diagnostic(format!("invalid {key} `{}`", value.text), value.span)
            .with_label("unknown fidelity mode")
            .with_help(help),
    );
    None
}
