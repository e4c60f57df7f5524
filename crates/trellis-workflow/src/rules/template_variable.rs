//! `template-variable` (error): templates name only the goal and the run's inputs.
//!
//! A run's *inputs* are named values given with `--input NAME=VALUE` or by a run configuration file
//! (`[run.inputs]`, or `[vars]` in Fabro's older spelling). Templates name them, and the workflow's
//! goal (the `goal` graph attribute, or `--goal`):
//!
//! - in every attribute (a graph's `goal`, a command's `script`, a label, a condition, ...):
//!   `{{ inputs.NAME }}` and `{{ goal }}`. Other `{{ ... }}` text there is left as written (a shell
//!   script's `docker ps --format '{{.Names}}'`), and so is `$`.
//! - in prompts, besides: `$NAME` and `{{ NAME }}` (Fabro's older forms), `$goal`; `$$` is a literal `$`.
//!   Any other `$name` or `{{ name }}` in a prompt is an error rather than text the model is shown.
//!
//! Escaping: `{% raw %}...{% endraw %}` keeps its text as written, and `{{ '{{' }}` (any quoted text
//! in `{{ }}`) writes the quoted text. A `$` not followed by a letter (`$5`) is kept as written.
//!
//! An undefined variable is an error that names it, where it is used and the inputs there are:
//!
//! ```dot
//! plan [shape=tab, prompt="Plan $gaol"]   // error: undefined variable `gaol`
//! ```

use std::collections::BTreeMap;

use trellis_syntax::{Diagnostic, Severity, Span};

use crate::flatten::{AttrMap, FlatGraph};
use crate::rules::Rule;

pub const RULE: Rule = Rule {
    code: "template-variable",
    severity: Severity::Error,
    summary: "templates name only the goal and the run's inputs ({{ inputs.NAME }}, $NAME, $goal)",
};

/// Whether a file fails only for want of inputs: it has errors, and every one is this rule's (a
/// template naming an input, or the goal, the run does not give). Inputs or a goal would make it valid.
pub fn needs_inputs(diagnostics: &[Diagnostic]) -> bool {
    let mut errors = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .peekable();
    errors.peek().is_some() && errors.all(|d| d.code == RULE.code)
}

/// What templates may name: the workflow's goal and the run's inputs.
#[derive(Clone, Copy)]
pub struct Vars<'a> {
    pub goal: Option<&'a str>,
    pub inputs: &'a BTreeMap<String, String>,
}

/// Which forms a text expands.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forms {
    /// Any attribute: `{{ inputs.NAME }}`, `{{ goal }}`, raw blocks and quoted text.
    Attribute,
    /// A prompt: besides, `$NAME`, `{{ NAME }}`, `$goal` and `$$`.
    Prompt,
}

/// Where a template is, for messages: `node `plan``, `the graph`, `edge `a -> b`` (made only when
/// a message needs it).
pub(crate) type Place<'a> = &'a dyn Fn() -> String;

/// Attributes the prompt pass expands (their text may be a `@file` reference).
const PROMPT_ATTRIBUTES: &[&str] = &["prompt"];

/// Fills `{{ inputs.NAME }}` written in a DOT file's structure — outside its quoted strings and
/// comments, where an attribute value cannot hold it: a node id, an unquoted value — before the file
/// is parsed (Fabro's first expansion pass). Quoted values are expanded after parsing, where their
/// spans stay those of the file. `None` when the structure names no input; an undefined one is an
/// error at its place.
pub(crate) fn expand_structure(
    text: &str,
    inputs: &BTreeMap<String, String>,
    out: &mut Vec<Diagnostic>,
) -> Option<String> {
    // Most files hold no template at all: one fast search instead of a walk of the whole text.
    if !text.contains("{{") {
        return None;
    }
    let mut result = String::with_capacity(text.len());
    let mut changed = false;
    let mut rest = 0;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i = text[i..].find('\n').map_or(bytes.len(), |n| i + n);
            }
            b'#' if i == 0 || bytes[i - 1] == b'\n' => {
                i = text[i..].find('\n').map_or(bytes.len(), |n| i + n);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = text[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |n| i + 2 + n + 2);
            }
            b'{' if bytes.get(i + 1) == Some(&b'{') => {
                let Some(end) = text[i + 2..].find("}}") else {
                    break;
                };
                let expression = text[i + 2..i + 2 + end].trim();
                let consumed = 2 + end + 2;
                if let Some(name) = expression.strip_prefix("inputs.") {
                    let span = Span::from_range(i..i + consumed);
                    if let Some(value) = inputs.get(name) {
                        result.push_str(&text[rest..i]);
                        result.push_str(value);
                        rest = i + consumed;
                        changed = true;
                    } else {
                        let vars = Vars { goal: None, inputs };
                        out.push(undefined(name, name, vars, span, &|| {
                            "the workflow's structure".to_owned()
                        }));
                    }
                }
                i += consumed;
            }
            _ => i += 1,
        }
    }
    if !changed {
        return None;
    }
    result.push_str(&text[rest.min(text.len())..]);
    Some(result)
}

/// Expands `{{ inputs.NAME }}` and `{{ goal }}` in every attribute of the flat graph but prompts,
/// which are expanded when they are read (with the prompt forms). The graph's `goal` is expanded first
/// (with the inputs only), so the other attributes see the expanded goal; `goal_override` (`--goal`)
/// replaces it. Returns the goal.
pub(crate) fn expand_attributes(
    graph: &mut FlatGraph,
    inputs: &BTreeMap<String, String>,
    goal_override: Option<&str>,
    out: &mut Vec<Diagnostic>,
) -> Option<String> {
    let no_goal = Vars { goal: None, inputs };
    if let Some(attr) = graph.graph_attrs.get_mut("goal") {
        attr.value.text = expand(
            &attr.value.text,
            no_goal,
            Forms::Attribute,
            attr.value.span,
            &|| "the graph's goal".to_owned(),
            out,
        )
        .into();
    }
    let goal = goal_override.map(str::to_owned).or_else(|| {
        graph
            .graph_attrs
            .get("goal")
            .map(|attr| attr.value.text.as_str().to_owned())
    });
    let vars = Vars {
        goal: goal.as_deref(),
        inputs,
    };
    expand_map(
        &mut graph.graph_attrs,
        vars,
        &|| "the graph".to_owned(),
        out,
    );
    for node in &mut graph.nodes {
        let id = &node.id.name;
        expand_map(&mut node.attrs, vars, &|| format!("node `{id}`"), out);
    }
    for edge in &mut graph.edges {
        let (from, to) = (
            &graph.nodes[edge.from].id.name,
            &graph.nodes[edge.to].id.name,
        );
        expand_map(
            &mut edge.attrs,
            vars,
            &|| format!("edge `{from} -> {to}`"),
            out,
        );
    }
    goal
}

/// Expands the templates of one statement's attributes; `place` names it, for messages (made only
/// when an attribute holds a template: most hold none).
fn expand_map(attrs: &mut AttrMap, vars: Vars<'_>, place: Place<'_>, out: &mut Vec<Diagnostic>) {
    for (key, attr) in attrs.iter_mut() {
        if PROMPT_ATTRIBUTES.contains(&key) || key == "goal" {
            continue;
        }
        let text = &attr.value.text;
        if memchr_brace(text) && (text.contains("{{") || text.contains("{%")) {
            attr.value.text =
                expand(text, vars, Forms::Attribute, attr.value.span, place, out).into();
        }
    }
}

/// Whether `text` holds a `{` at all (one scan; the template forms all start with one).
fn memchr_brace(text: &str) -> bool {
    text.as_bytes().contains(&b'{')
}

/// Expands the templates of `forms` in `text`; reports problems at `span` (the attribute value), each
/// variable once.
pub(crate) fn expand(
    text: &str,
    vars: Vars<'_>,
    forms: Forms,
    span: Span,
    place: Place<'_>,
    out: &mut Vec<Diagnostic>,
) -> String {
    let prompt = forms == Forms::Prompt;
    let mut result = String::with_capacity(text.len());
    let mut rest = text;
    let mut reported: Vec<&str> = Vec::new();
    while let Some(i) = rest.find(['$', '{']) {
        result.push_str(&rest[..i]);
        rest = &rest[i..];
        // `{% raw %}...{% endraw %}`: the text between, as written.
        if let Some((inner, after)) = raw_block(rest) {
            result.push_str(inner);
            rest = after;
            continue;
        }
        let (name, consumed) = if let Some(after) = rest.strip_prefix("$$").filter(|_| prompt) {
            result.push('$');
            rest = after;
            continue;
        } else if let Some(after) = rest.strip_prefix('$').filter(|_| prompt) {
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
            let Some(end) = expression_end(after) else {
                result.push_str("{{");
                rest = after;
                continue;
            };
            let expression = after[..end].trim();
            if let Some(quoted) = quoted(expression) {
                result.push_str(quoted);
                rest = &after[end + 2..];
                continue;
            }
            (expression, 2 + end + 2)
        } else {
            result.push(rest.chars().next().unwrap_or('$'));
            rest = &rest[1..];
            continue;
        };
        let input = name.strip_prefix("inputs.");
        let value = match (name, input) {
            ("goal", _) => vars.goal,
            (_, Some(input)) => vars.inputs.get(input).map(String::as_str),
            (bare, None) if prompt => vars.inputs.get(bare).map(String::as_str),
            // Not a template of ours: left as written (a script's `{{.Names}}`).
            _ => {
                result.push_str(&rest[..consumed]);
                rest = &rest[consumed..];
                continue;
            }
        };
        if let Some(value) = value {
            result.push_str(value);
        } else {
            if !reported.contains(&name) {
                reported.push(name);
                out.push(undefined(name, input.unwrap_or(name), vars, span, place));
            }
            result.push_str(&rest[..consumed]);
        }
        rest = &rest[consumed..];
    }
    result.push_str(rest);
    result
}

/// Where the `}}` that closes an expression starting `text` is: past a quoted string it opens with
/// (`{{ "}}" }}`).
fn expression_end(text: &str) -> Option<usize> {
    let trimmed = text.trim_start();
    let skip = text.len() - trimmed.len();
    let quoted = trimmed
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .and_then(|quote| trimmed[1..].find(quote).map(|close| skip + 1 + close + 1));
    let from = quoted.unwrap_or(0);
    text[from..].find("}}").map(|end| from + end)
}

/// The text of a `{% raw %}` block at the start of `text` and what follows its `{% endraw %}`.
fn raw_block(text: &str) -> Option<(&str, &str)> {
    let (word, after) = tag(text)?;
    if word != "raw" {
        return None;
    }
    let mut search = 0;
    while let Some(at) = after[search..].find("{%") {
        let start = search + at;
        if let Some(("endraw", rest)) = tag(&after[start..]) {
            return Some((&after[..start], rest));
        }
        search = start + 2;
    }
    None
}

/// A `{% word %}` tag at the start of `text` (`{%- word -%}` too): the word and what follows.
fn tag(text: &str) -> Option<(&str, &str)> {
    let after = text.strip_prefix("{%")?;
    let end = after.find("%}")?;
    let word = after[..end].trim().trim_matches('-').trim();
    Some((word, &after[end + 2..]))
}

/// The text of a quoted expression (`'{{'`, `"}}"`).
fn quoted(expression: &str) -> Option<&str> {
    ['\'', '"'].into_iter().find_map(|quote| {
        expression
            .strip_prefix(quote)?
            .strip_suffix(quote)
            .filter(|inner| !inner.contains(quote))
    })
}

fn undefined(name: &str, input: &str, vars: Vars<'_>, span: Span, place: Place<'_>) -> Diagnostic {
    let place = place();
    if name == "goal" {
        return RULE
            .diagnostic(
                format!("{place} uses the goal, but the workflow has no goal"),
                span,
            )
            .with_label("uses the goal")
            .with_help("set `graph [goal=\"...\"]`, a run file's `[run] goal`, or pass `--goal`");
    }
    let known = if vars.inputs.is_empty() {
        "this run has no inputs".to_owned()
    } else {
        let names: Vec<&str> = vars.inputs.keys().map(String::as_str).collect();
        format!("the inputs are {}", names.join(", "))
    };
    let near = crate::rules::closest(input, vars.inputs.keys().map(String::as_str))
        .map_or_else(String::new, |near| format!("did you mean `{near}`? "));
    RULE.diagnostic(
        format!("undefined template variable `{input}` in {place}"),
        span,
    )
    .with_label(format!("`{input}` is not defined"))
    .with_help(format!(
        "{near}{known}; give it with `--input {input}=VALUE` or a run file's `[run.inputs]` (`goal` is the goal; `$$` writes a `$` in a prompt)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, goal: Option<&str>, forms: Forms) -> (String, usize) {
        let inputs = BTreeMap::from([("language".to_owned(), "rust".to_owned())]);
        let mut out = Vec::new();
        let vars = Vars {
            goal,
            inputs: &inputs,
        };
        let expanded = expand(
            text,
            vars,
            forms,
            Span::default(),
            &|| "node `n`".to_owned(),
            &mut out,
        );
        (expanded, out.len())
    }

    #[test]
    fn a_file_needs_inputs_only_when_every_error_is_a_template() {
        let template = RULE.diagnostic("undefined template variable `x`", Span::default());
        let warning = Diagnostic::new("cycles", Severity::Warning, "loop", Span::default());
        let other = Diagnostic::new("llm-prompt", Severity::Error, "no prompt", Span::default());
        assert!(needs_inputs(&[template.clone(), warning.clone()]));
        assert!(!needs_inputs(&[template, other]));
        assert!(!needs_inputs(&[warning]));
        assert!(!needs_inputs(&[]));
    }

    #[test]
    fn prompts_expand_every_form() {
        assert_eq!(
            run(
                "Plan: $goal. {{ goal }}! {{goal}} in $language, {{ language }}, {{ inputs.language }}",
                Some("ship"),
                Forms::Prompt
            ),
            ("Plan: ship. ship! ship in rust, rust, rust".into(), 0)
        );
        assert_eq!(
            run("costs $$5 and $5, {x}", Some("g"), Forms::Prompt),
            ("costs $5 and $5, {x}".into(), 0)
        );
    }

    #[test]
    fn attributes_expand_inputs_and_goal_and_leave_the_rest() {
        assert_eq!(
            run(
                "cargo test --lang {{ inputs.language }} # $HOME $$ {{.Names}} {{ goal }}",
                Some("ship"),
                Forms::Attribute
            ),
            (
                "cargo test --lang rust # $HOME $$ {{.Names}} ship".into(),
                0
            )
        );
        assert_eq!(run("{{ inputs.langauge }}", None, Forms::Attribute).1, 1);
    }

    #[test]
    fn escapes_keep_template_text() {
        assert_eq!(
            run(
                "{% raw %}{{ goal }} $x{% endraw %} and {{ '{{' }} goal {{ \"}}\" }}",
                None,
                Forms::Prompt
            ),
            ("{{ goal }} $x and {{ goal }}".into(), 0)
        );
        // An unclosed raw block is text, and its variables are still checked.
        assert_eq!(run("{% raw %}$gaol", Some("g"), Forms::Prompt).1, 1);
    }

    #[test]
    fn the_structure_is_filled_in_before_parsing_but_strings_and_comments_are_not() {
        let inputs = BTreeMap::from([("stage".to_owned(), "lint".to_owned())]);
        let mut out = Vec::new();
        let text = "digraph G { {{ inputs.stage }} [prompt=\"{{ inputs.stage }}\"] // {{ inputs.x }}\n start -> {{inputs.stage}} }";
        assert_eq!(
            expand_structure(text, &inputs, &mut out).as_deref(),
            Some(
                "digraph G { lint [prompt=\"{{ inputs.stage }}\"] // {{ inputs.x }}\n start -> lint }"
            )
        );
        assert_eq!(out, [] as [trellis_syntax::Diagnostic; 0]);
        assert_eq!(
            expand_structure("digraph G { a -> b }", &inputs, &mut out),
            None
        );
        expand_structure("digraph G { {{ inputs.stag }} }", &inputs, &mut out);
        assert_eq!(out.len(), 1);
        assert!(
            out[0]
                .message
                .contains("`stag` in the workflow's structure")
        );
    }

    #[test]
    fn reports_undefined_variables_once() {
        assert_eq!(run("$goal $goal", None, Forms::Prompt).1, 1);
        assert_eq!(run("$gaol {{ name }} $gaol", Some("g"), Forms::Prompt).1, 2);
        let inputs = BTreeMap::from([("language".to_owned(), "rust".to_owned())]);
        let mut out = Vec::new();
        let vars = Vars {
            goal: None,
            inputs: &inputs,
        };
        expand(
            "$langauge",
            vars,
            Forms::Prompt,
            Span::default(),
            &|| "node `test`".to_owned(),
            &mut out,
        );
        assert_eq!(
            out[0].message,
            "undefined template variable `langauge` in node `test`"
        );
        let help = out[0].help.as_deref().unwrap();
        assert!(help.contains("did you mean `language`?"), "{help}");
        assert!(help.contains("the inputs are language"), "{help}");
    }
}
