//! `stylesheet-syntax` (error): `model_stylesheet` parses.
//!
//! Rules are `selector { property: value; }` with selectors `*`, a shape name, `.class` or `#id`. Every
//! broken rule is reported (the parser recovers at the rule's closing brace) and points into the
//! stylesheet text:
//!
//! ```dot
//! graph [model_stylesheet="* { model claude-haiku-4-5 }"]   // error: expected `:` after `model`
//! ```

use trellis_syntax::ast::Value;
use trellis_syntax::stylesheet::{Stylesheet, parse_stylesheet};
use trellis_syntax::{Diagnostic, Severity};

use crate::rules::Rule;

pub const RULE: Rule = Rule {
    code: "stylesheet-syntax",
    severity: Severity::Error,
    summary: "the model stylesheet parses",
};

pub(crate) fn parse(value: &Value, out: &mut Vec<Diagnostic>) -> Stylesheet {
    let (sheet, errors) = parse_stylesheet(&value.text);
    for error in errors {
        out.push(
            RULE.diagnostic(
                format!("invalid stylesheet: {}", error.message),
                value.source_span(error.span),
            )
            .with_label("here")
            .with_help(
                "rules look like `.coding { model: claude-sonnet-4-5; reasoning_effort: high; }`",
            ),
        );
    }
    sheet
}
