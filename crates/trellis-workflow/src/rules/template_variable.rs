//! `template-variable` (error): prompts use only defined template variables.
//!
//! Prompts may say `$goal` or `{{ goal }}`; both expand to the workflow's goal (the `goal` graph
//! attribute, or `--goal` at run time). `$$` is a literal `$`. An undefined variable, or `$goal` in a
//! workflow without a goal, is an error rather than silently empty text:
//!
//! ```dot
//! plan [shape=tab, prompt="Plan $gaol"]   // error: undefined variable `gaol`
//! ```
//!
//! A `$` not followed by a letter (`$5`) is kept as written.

use trellis_syntax::{Diagnostic, Severity, Span};

use crate::rules::Rule;

pub const RULE: Rule = Rule {
    code: "template-variable",
    severity: Severity::Error,
    summary: "prompts use only defined template variables ($goal, {{ goal }})",
};

/// Expands `$goal`, `{{ goal }}` and `$$` in `text`; reports problems at `span` (the attribute value).
pub(crate) fn expand(
    text: &str,
    goal: Option<&str>,
    span: Span,
    node: &str,
    out: &mut Vec<Diagnostic>,
) -> String {
    let mut result = String::with_capacity(text.len());
    let mut rest = text;
    let mut reported = Vec::new();
    while let Some(i) = rest.find(['$', '{']) {
        result.push_str(&rest[..i]);
        rest = &rest[i..];
        let (name, consumed) = if let Some(after) = rest.strip_prefix("$$") {
            result.push('$');
            rest = after;
            continue;
        } else if let Some(after) = rest.strip_prefix('$') {
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if len == 0 || !after.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                result.push('$');
                rest = after;
                continue;
            }
            (&after[..len], 1 + len)
        } else if let Some(after) = rest.strip_prefix("{{") {
            let Some(end) = after.find("}}") else {
                result.push_str("{{");
                rest = after;
                continue;
            };
            (after[..end].trim(), 2 + end + 2)
        } else {
            result.push('{');
            rest = &rest[1..];
            continue;
        };
        if let ("goal", Some(goal)) = (name, goal) {
            result.push_str(goal);
        } else {
            if !reported.contains(&name) {
                reported.push(name);
                let diagnostic = if name == "goal" {
                    RULE.diagnostic(
                        format!("node `{node}` uses $goal, but the workflow has no goal"),
                        span,
                    )
                    .with_label("uses $goal")
                    .with_help("set `graph [goal=\"...\"]`, or pass `--goal` when running")
                } else {
                    RULE.diagnostic(format!("undefined template variable `{name}` in node `{node}`"), span)
                        .with_label(format!("`{name}` is not defined"))
                        .with_help("the only template variable is `goal` ($goal or {{ goal }}); write `$$` for a literal `$`")
                };
                out.push(diagnostic);
            }
            result.push_str(&rest[..consumed]);
        }
        rest = &rest[consumed..];
    }
    result.push_str(rest);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, goal: Option<&str>) -> (String, usize) {
        let mut out = Vec::new();
        let expanded = expand(text, goal, Span::default(), "n", &mut out);
        (expanded, out.len())
    }

    #[test]
    fn expands_both_forms() {
        assert_eq!(
            run("Plan: $goal. {{ goal }}! {{goal}}", Some("ship")),
            ("Plan: ship. ship! ship".into(), 0)
        );
        assert_eq!(
            run("costs $$5 and $5, {x}", Some("g")),
            ("costs $5 and $5, {x}".into(), 0)
        );
    }

    #[test]
    fn reports_undefined_variables_once() {
        assert_eq!(run("$goal $goal", None).1, 1);
        assert_eq!(run("$gaol {{ name }}", Some("g")).1, 2);
    }
}
