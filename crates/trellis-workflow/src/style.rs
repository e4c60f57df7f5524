//! Applying the model stylesheet. For each model node and each property (`model`, `provider`,
//! `reasoning_effort`, `backend`), the matching rule with the highest specificity wins (`*` < shape <
//! `.class` < `#id`), the later rule on ties; an attribute written on the node is never overridden.

use trellis_syntax::Spanned;
use trellis_syntax::ast::Value;
use trellis_syntax::stylesheet::{Selector, Stylesheet};

/// The stylesheet's value for `property` on a node, with the span of the value inside the sheet text.
pub(crate) fn lookup<'a>(
    sheet: &'a Stylesheet,
    property: &str,
    id: &str,
    shape: &str,
    classes: &[trellis_syntax::ast::Text],
) -> Option<&'a Spanned<String>> {
    let mut best: Option<(u8, &Spanned<String>)> = None;
    for rule in &sheet.rules {
        let Some(specificity) = rule
            .selectors
            .iter()
            .filter(|s| match &s.value {
                Selector::Universal => true,
                Selector::Shape(name) => name == shape,
                Selector::Class(class) => classes.iter().any(|c| c == class),
                Selector::Id(name) => name == id,
            })
            .map(|s| s.value.specificity())
            .max()
        else {
            continue;
        };
        for declaration in rule
            .declarations
            .iter()
            .filter(|d| d.property.value == property)
        {
            if best.is_none_or(|(b, _)| specificity >= b) {
                best = Some((specificity, &declaration.value));
            }
        }
    }
    best.map(|(_, value)| value)
}

/// Turns a stylesheet value into an attribute value whose span points into the source file.
pub(crate) fn as_value(sheet_value: &Value, found: &Spanned<String>) -> Value {
    Value::plain(
        found.value.clone(),
        trellis_syntax::ast::ValueKind::Bare,
        sheet_value.source_span(found.span),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specificity_then_order() {
        let (sheet, _) = trellis_syntax::stylesheet::parse_stylesheet(
            "* { model: a; } tab { model: b; } .x { model: c; } #n { model: d; } .y { model: e; }",
        );
        let model = |id: &str, shape: &str, classes: &[&str]| {
            let classes: Vec<trellis_syntax::ast::Text> =
                classes.iter().map(|c| (*c).into()).collect();
            lookup(&sheet, "model", id, shape, &classes).map(|v| v.value.clone())
        };
        assert_eq!(model("m", "box", &[]).as_deref(), Some("a"));
        assert_eq!(model("m", "tab", &[]).as_deref(), Some("b"));
        assert_eq!(model("m", "tab", &["x"]).as_deref(), Some("c"));
        assert_eq!(model("n", "tab", &["x"]).as_deref(), Some("d"));
        assert_eq!(model("m", "box", &["x", "y"]).as_deref(), Some("e"));
    }
}
