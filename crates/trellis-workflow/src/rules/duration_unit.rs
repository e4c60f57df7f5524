//! `duration-unit` (warning): a duration has a unit.
//!
//! Durations are a whole number with a unit (`250ms`, `30s`, `15m`, `2h`, `1d`). Workflows written for
//! other engines often give a bare number of seconds; it is read as seconds, with a warning that says
//! so, rather than rejected:
//!
//! ```dot
//! test [shape=parallelogram, script="make test", timeout=600]   // warning: read as 600 seconds
//! ```
//!
//! A plain `0` (no timeout) needs no unit.

use std::time::Duration;

use trellis_syntax::ast::Value;
use trellis_syntax::{Diagnostic, Severity};

use crate::rules::Rule;

pub const RULE: Rule = Rule {
    code: "duration-unit",
    severity: Severity::Warning,
    summary: "a duration has a unit (a bare number is read as seconds)",
};

/// A bare whole number where a duration is expected, read as seconds with a warning.
pub(crate) fn seconds(key: &str, value: &Value, out: &mut Vec<Diagnostic>) -> Option<Duration> {
    let n = value.as_i64().filter(|n| *n > 0)?;
    out.push(
        RULE.diagnostic(
            format!("`{key}={n}` has no unit: it is read as {n} seconds"),
            value.span,
        )
        .with_label("seconds")
        .with_help(format!("write `{n}s` to say so")),
    );
    Some(Duration::from_secs(n.unsigned_abs()))
}
