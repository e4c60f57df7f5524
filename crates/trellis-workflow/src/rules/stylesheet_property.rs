//! `stylesheet-property` (warning): stylesheet rules set only properties the engine uses.
//!
//! The stylesheet assigns `model`, `provider`, `reasoning_effort` and `backend`. Any other property is
//! ignored, which is usually a typo, so it is reported as a warning:
//!
//! ```dot
//! graph [model_stylesheet="* { modle: claude-haiku-4-5; }"]   // warning: did you mean `model`?
//! ```

use trellis_syntax::ast::Value;
use trellis_syntax::stylesheet::Stylesheet;
use trellis_syntax::{Diagnostic, Severity};

use crate::rules::{Rule, closest};

pub const RULE: Rule = Rule {
    code: "stylesheet-property",
    severity: Severity::Warning,
    summary: "stylesheet properties are model, provider, reasoning_effort or backend",
};

/// The properties a stylesheet may set.
pub const PROPERTIES: &[&str] = &[
    "model",
    "provider",
    "reasoning_effort",
    "backend",
    "acp_command",
];

pub(crate) fn check(sheet: &Stylesheet, value: &Value, out: &mut Vec<Diagnostic>) {
    for declaration in sheet.rules.iter().flat_map(|r| &r.declarations) {
        let property = &declaration.property;
        if PROPERTIES.contains(&property.value.as_str()) {
            continue;
        }
        let help = match closest(&property.value, PROPERTIES.iter().copied()) {
            Some(near) => format!("did you mean `{near}`?"),
            None => format!("stylesheet properties: {}", PROPERTIES.join(", ")),
        };
        out.push(
            RULE.diagnostic(
                format!(
                    "unknown stylesheet property `{}` is ignored",
                    property.value
                ),
                value.source_span(property.span),
            )
            .with_label("unknown property")
            .with_help(help),
        );
    }
}
