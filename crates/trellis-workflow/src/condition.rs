//! Compiled edge conditions and their evaluation. Conditions are parsed (by `trellis-syntax`) and
//! compiled here at workflow compile time: keys are resolved, outcome words and regexes checked, so
//! evaluation at run time cannot fail.
//!
//! Semantics: `outcome` is the stage status (either vocabulary); `preferred_label` compares labels the
//! way edge selection does (accelerators stripped, case and surrounding space ignored); any other key is a
//! context lookup (`context.` prefix optional), which may continue as a dotted path into a JSON value
//! (`output.audit.verdict`). `=`/`!=` compare numerically when both sides are numbers,
//! otherwise as text (a missing key is the empty string). `>`, `<`, `>=`, `<=` are false unless both sides
//! are numbers. `contains` tests array membership or substring; `matches` applies the regex to the text.
//! Both are false for a missing key. A bare key is true when its value is non-empty, not `false`, not `0`.

use regex::Regex;
use serde_json::Value;
use trellis_syntax::Span;
use trellis_syntax::condition::{CompareOp, CondExpr, ConditionSyntaxError};

use crate::label::normalize_label;
use crate::outcome::StageStatus;

/// What a condition reads at run time. The engine implements this over its run context.
pub trait ConditionScope {
    fn outcome(&self) -> Option<StageStatus>;
    fn preferred_label(&self) -> Option<&str>;
    /// A context value by key (without the `context.` prefix).
    fn context_value(&self, key: &str) -> Option<Value>;
}

/// What a clause's key refers to.
#[derive(Debug, Clone, PartialEq)]
pub enum ConditionKey {
    Outcome,
    PreferredLabel,
    Context(String),
}

#[derive(Debug, Clone)]
enum Node {
    Or(Vec<Node>),
    And(Vec<Node>),
    Not(Box<Node>),
    Compare {
        key: ConditionKey,
        op: CompareOp,
        value: String,
        number: Option<f64>,
        status: Option<StageStatus>,
        regex: Option<Regex>,
    },
    Truthy(ConditionKey),
}

/// A compiled condition.
#[derive(Debug, Clone)]
pub struct Condition {
    source: String,
    root: Node,
    /// Outcome words of its own the condition compares with (`outcome=needs_dod`), and where in the
    /// condition text; they compare with the preferred label (see [`Condition::custom_outcomes`]).
    custom_outcomes: Vec<(String, trellis_syntax::Span)>,
}

impl PartialEq for Condition {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// Why a condition does not compile. Spans are inside the condition text.
pub type ConditionError = ConditionSyntaxError;

impl Condition {
    /// Parses and compiles a condition.
    pub fn compile(text: &str) -> Result<Condition, ConditionError> {
        let expr = trellis_syntax::condition::parse_condition(text)?;
        let mut custom_outcomes = Vec::new();
        Ok(Condition {
            source: text.trim().to_owned(),
            root: compile_node(&expr, &mut custom_outcomes)?,
            custom_outcomes,
        })
    }

    /// The outcome words that are none of Trellis's statuses nor a likely typo of one
    /// (`outcome=needs_dod`, as Attractor's and Fabro's templates write), with their place in the
    /// condition text. Stages end with a status; a custom word is what a stage's model names as its
    /// outcome or preferred label in its routing directive, so `outcome=needs_dod` compares with the
    /// preferred label.
    pub fn custom_outcomes(&self) -> &[(String, trellis_syntax::Span)] {
        &self.custom_outcomes
    }

    /// The condition as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// A condition that did not compile, kept so its edge still counts as conditional for the
    /// graph rules. It never holds; a workflow with it is invalid and never runs.
    pub(crate) fn unparsed(source: &str) -> Self {
        Self {
            source: source.to_owned(),
            root: Node::Or(Vec::new()),
            custom_outcomes: Vec::new(),
        }
    }

    pub fn evaluate(&self, scope: &dyn ConditionScope) -> bool {
        eval(&self.root, scope)
    }
}

fn compile_node(
    expr: &CondExpr,
    custom: &mut Vec<(String, trellis_syntax::Span)>,
) -> Result<Node, ConditionError> {
    Ok(match expr {
        CondExpr::Or(terms) => Node::Or(
            terms
                .iter()
                .map(|t| compile_node(t, custom))
                .collect::<Result<_, _>>()?,
        ),
        CondExpr::And(terms) => Node::And(
            terms
                .iter()
                .map(|t| compile_node(t, custom))
                .collect::<Result<_, _>>()?,
        ),
        CondExpr::Not(inner) => Node::Not(Box::new(compile_node(inner, custom)?)),
        CondExpr::Truthy { key } => Node::Truthy(resolve_key(&key.value)),
        CondExpr::Compare { key, op, value } => {
            if matches!(op.value, CompareOp::Eq | CompareOp::Ne)
                && let Some(classes) = fabro_failure_class(&key.value, &value.value, value.span)?
            {
                return Ok(any_of(&resolve_key(&key.value), op.value, classes));
            }
            let mut resolved = resolve_key(&key.value);
            let status = if resolved == ConditionKey::Outcome
                && matches!(op.value, CompareOp::Eq | CompareOp::Ne)
            {
                if let Ok(status) = value.value.parse::<StageStatus>() {
                    Some(status)
                } else {
                    custom_outcome(&value.value, value.span)?;
                    custom.push((value.value.clone(), value.span));
                    resolved = ConditionKey::PreferredLabel;
                    None
                }
            } else {
                None
            };
            let regex = if op.value == CompareOp::Matches {
                Some(Regex::new(&value.value).map_err(|e| ConditionError {
                    message: format!("invalid regular expression `{}`", value.value),
                    span: value.span,
                    help: Some(format!(
                        "regex {}",
                        e.to_string().lines().last().unwrap_or_default().trim()
                    )),
                })?)
            } else {
                None
            };
            let number = value
                .value
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite());
            if matches!(
                op.value,
                CompareOp::Gt | CompareOp::Lt | CompareOp::Ge | CompareOp::Le
            ) && number.is_none()
            {
                return Err(ConditionError {
                    message: format!(
                        "`{}` compares numbers, but `{}` is not a number",
                        op.value.as_str(),
                        value.value
                    ),
                    span: value.span,
                    help: Some("use `=` or `contains` to compare text".into()),
                });
            }
            Node::Compare {
                key: resolved,
                op: op.value,
                value: value.value.clone(),
                number,
                status,
                regex,
            }
        }
    })
}

/// An outcome word that is none of the statuses: a likely typo of one (`sucess`, within two edits)
/// is an error; any other is the workflow's own word.
fn custom_outcome(word: &str, span: trellis_syntax::Span) -> Result<(), ConditionError> {
    let lower = word.trim().to_ascii_lowercase();
    let near = StageStatus::WORDS
        .iter()
        .map(|known| (strsim::damerau_levenshtein(&lower, known), *known))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance);
    match near {
        Some((_, known)) => Err(ConditionError {
            message: format!("unknown outcome `{word}`"),
            span,
            help: Some(format!(
                "did you mean `{known}`? outcomes are {}",
                StageStatus::ACCEPTED
            )),
        }),
        None => Ok(()),
    }
}

/// Fabro's failure classes, and Trellis's classes (`failure_class` in the context) each stands
/// for: a Fabro workflow's `failure_class=transient_infra` holds after a timeout as Fabro's does.
/// `budget_exhausted` is a class of both; Fabro's `canceled` (a cancelled run routes nowhere) and
/// its reserved `compilation_loop` and `structural` stand for none. Every Trellis class is in one
/// list (`trellis-engine`'s `FailureClass` tests say so).
pub const FABRO_FAILURE_CLASSES: &[(&str, &[&str])] = &[
    (
        "transient_infra",
        &["timeout", "could_not_start", "transient", "retry_requested"],
    ),
    ("deterministic", &["stage_failed", "configuration"]),
    ("budget_exhausted", &["budget_exhausted"]),
    ("canceled", &[]),
    ("compilation_loop", &[]),
    ("structural", &[]),
];

/// The Trellis classes a comparison of `failure_class` with one of Fabro's words stands for; `None`
/// for another key or a Trellis class, which compare as written. A word that is no class is an
/// error: the comparison could never hold.
fn fabro_failure_class(
    key: &str,
    word: &str,
    span: trellis_syntax::Span,
) -> Result<Option<&'static [&'static str]>, ConditionError> {
    if key.strip_prefix("context.").unwrap_or(key) != "failure_class" {
        return Ok(None);
    }
    let word = word.trim();
    if let Some((_, classes)) = FABRO_FAILURE_CLASSES
        .iter()
        .find(|(fabro, _)| fabro.eq_ignore_ascii_case(word))
    {
        return Ok(Some(classes));
    }
    // A Trellis class compares as written; every one is in a list.
    if FABRO_FAILURE_CLASSES
        .iter()
        .any(|(_, classes)| classes.contains(&word))
    {
        return Ok(None);
    }
    let mut known: Vec<&str> = Vec::new();
    let trellis = FABRO_FAILURE_CLASSES
        .iter()
        .flat_map(|(_, classes)| *classes);
    for class in trellis.chain(FABRO_FAILURE_CLASSES.iter().map(|(fabro, _)| fabro)) {
        if !known.contains(class) {
            known.push(class);
        }
    }
    let near = crate::rules::closest(word, known.iter().copied())
        .map(|class| format!("did you mean `{class}`? "))
        .unwrap_or_default();
    Err(ConditionError {
        message: format!("unknown failure class `{word}`"),
        span,
        help: Some(format!("{near}failure classes are {}", known.join(", "))),
    })
}

/// `key` compared with each of `classes`: `=` holds for any of them, `!=` for none (an empty
/// list never holds with `=`).
fn any_of(key: &ConditionKey, op: CompareOp, classes: &[&str]) -> Node {
    let each = classes
        .iter()
        .map(|class| Node::Compare {
            key: key.clone(),
            op,
            value: (*class).to_owned(),
            number: None,
            status: None,
            regex: None,
        })
        .collect();
    if op == CompareOp::Eq {
        Node::Or(each)
    } else {
        Node::And(each)
    }
}

fn resolve_key(key: &str) -> ConditionKey {
    match key {
        "outcome" => ConditionKey::Outcome,
        "preferred_label" => ConditionKey::PreferredLabel,
        _ => ConditionKey::Context(key.strip_prefix("context.").unwrap_or(key).to_owned()),
    }
}

/// The text form of a context value, as conditions compare it.
fn value_text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn as_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(_) | Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

fn lookup(key: &ConditionKey, scope: &dyn ConditionScope) -> Option<Value> {
    match key {
        ConditionKey::Outcome => scope
            .outcome()
            .map(|s| Value::String(s.as_str().to_owned())),
        ConditionKey::PreferredLabel => {
            scope.preferred_label().map(|l| Value::String(l.to_owned()))
        }
        ConditionKey::Context(k) => context_lookup(k, scope),
    }
}

/// A context value by key; when the whole key is absent, a dotted path into a JSON value stored under a
/// shorter key (`output.audit.verdict` reads field `verdict` of `output.audit`).
fn context_lookup(key: &str, scope: &dyn ConditionScope) -> Option<Value> {
    if let Some(value) = scope.context_value(key) {
        return Some(value);
    }
    let mut split = key.len();
    while let Some(dot) = key[..split].rfind('.') {
        if let Some(mut value) = scope.context_value(&key[..dot]) {
            for field in key[dot + 1..].split('.') {
                value = match value {
                    Value::Object(mut map) => map.remove(field)?,
                    Value::Array(mut items) => {
                        let index: usize = field.parse().ok()?;
                        (index < items.len()).then(|| items.swap_remove(index))?
                    }
                    _ => return None,
                };
            }
            return Some(value);
        }
        split = dot;
    }
    None
}

fn truthy(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Array(items)) => !items.is_empty(),
        Some(Value::Object(map)) => !map.is_empty(),
        Some(other) => {
            let text = value_text(other);
            let text = text.trim();
            !(text.is_empty() || text == "false" || text == "0")
        }
    }
}

fn eval(node: &Node, scope: &dyn ConditionScope) -> bool {
    match node {
        Node::Or(terms) => terms.iter().any(|t| eval(t, scope)),
        Node::And(terms) => terms.iter().all(|t| eval(t, scope)),
        Node::Not(inner) => !eval(inner, scope),
        Node::Truthy(key) => truthy(lookup(key, scope).as_ref()),
        Node::Compare {
            key,
            op,
            value,
            number,
            status,
            regex,
        } => {
            if let (ConditionKey::Outcome, Some(expected)) = (key, status) {
                let equal = scope.outcome() == Some(*expected);
                return if *op == CompareOp::Eq { equal } else { !equal };
            }
            let actual = lookup(key, scope);
            match op {
                CompareOp::Eq | CompareOp::Ne => {
                    let equal = match (actual.as_ref().and_then(as_number), number) {
                        (Some(a), Some(b)) => {
                            (a - b).abs() < f64::EPSILON * a.abs().max(b.abs()).max(1.0)
                        }
                        _ if *key == ConditionKey::PreferredLabel => {
                            normalize_label(&actual.as_ref().map(value_text).unwrap_or_default())
                                == normalize_label(value)
                        }
                        _ => actual.as_ref().map(value_text).unwrap_or_default() == *value,
                    };
                    equal == (*op == CompareOp::Eq)
                }
                CompareOp::Gt | CompareOp::Lt | CompareOp::Ge | CompareOp::Le => {
                    let (Some(a), Some(b)) = (actual.as_ref().and_then(as_number), number) else {
                        return false;
                    };
                    match op {
                        CompareOp::Gt => a > *b,
                        CompareOp::Lt => a < *b,
                        CompareOp::Ge => a >= *b,
                        _ => a <= *b,
                    }
                }
                CompareOp::Contains => match actual {
                    None | Some(Value::Null) => false,
                    Some(Value::Array(items)) => {
                        items.iter().any(|item| value_text(item) == *value)
                    }
                    Some(other) => value_text(&other).contains(value.as_str()),
                },
                CompareOp::Matches => match actual {
                    None | Some(Value::Null) => false,
                    Some(other) => regex
                        .as_ref()
                        .is_some_and(|r| r.is_match(&value_text(&other))),
                },
            }
        }
    }
}

/// Maps a condition error's span (inside the condition text) to the source, given the attribute value.
pub fn error_span(value: &trellis_syntax::ast::Value, error: &ConditionError) -> Span {
    value.source_span(error.span)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;

    struct Scope {
        outcome: Option<StageStatus>,
        label: Option<&'static str>,
        context: HashMap<&'static str, Value>,
    }

    impl ConditionScope for Scope {
        fn outcome(&self) -> Option<StageStatus> {
            self.outcome
        }
        fn preferred_label(&self) -> Option<&str> {
            self.label
        }
        fn context_value(&self, key: &str) -> Option<Value> {
            self.context.get(key).cloned()
        }
    }

    fn scope() -> Scope {
        Scope {
            outcome: Some(StageStatus::Succeeded),
            label: Some("[A] Approve"),
            context: HashMap::from([
                ("score", json!(85)),
                ("count", json!("3")),
                ("tests_passed", json!(true)),
                ("flag_zero", json!("0")),
                ("flag_false", json!("false")),
                ("empty", json!("")),
                ("log", json!("build failed: error E42")),
                ("tags", json!(["fast", "safe"])),
                ("version", json!("v2.1.0")),
                ("name", json!("alpha")),
                ("internal.node_visit_count", json!(5)),
                ("output.audit", json!({"verdict": "pass", "scores": [3, 9]})),
            ]),
        }
    }

    fn check(text: &str) -> bool {
        Condition::compile(text)
            .unwrap_or_else(|e| panic!("{text}: {e:?}"))
            .evaluate(&scope())
    }

    #[test]
    fn a_custom_outcome_compares_with_the_preferred_label_and_a_typo_is_an_error() {
        let condition = Condition::compile("outcome=needs_dod").unwrap();
        assert_eq!(condition.custom_outcomes().len(), 1);
        let mut named = scope();
        named.label = Some("needs_dod");
        assert!(condition.evaluate(&named));
        assert!(!condition.evaluate(&scope()));
        assert!(check("outcome!=needs_dod"));
        let typo = Condition::compile("outcome=sucess").unwrap_err();
        assert!(typo.help.unwrap().contains("did you mean `success`"));
        assert!(Condition::compile("outcome=skiped").is_err());
    }

    #[test]
    fn fabros_failure_classes_stand_for_trellis_classes() {
        let mut failed = scope();
        failed.context.insert("failure_class", json!("timeout"));
        let holds = |text: &str| Condition::compile(text).unwrap().evaluate(&failed);
        assert!(holds("failure_class=transient_infra") && holds("failure_class=Transient_Infra"));
        assert!(holds(
            "context.failure_class=transient_infra && failure_class=timeout"
        ));
        assert!(!holds("failure_class=deterministic") && holds("failure_class!=deterministic"));
        assert!(!holds("failure_class!=transient_infra"));
        // A class Trellis never gives never holds, and any other key compares as written.
        assert!(!holds("failure_class=canceled") && holds("failure_class!=canceled"));
        assert!(!check("name=transient_infra"));
        // A word that is no class could never hold: an error naming the classes.
        let typo = Condition::compile("failure_class=transient_infr").unwrap_err();
        assert_eq!(typo.message, "unknown failure class `transient_infr`");
        let help = typo.help.unwrap();
        assert!(
            help.starts_with("did you mean `transient_infra`? failure classes are timeout, ")
                && help.ends_with(
                    "budget_exhausted, transient_infra, deterministic, canceled, compilation_loop, structural"
                ),
            "{help}"
        );
        assert!(Condition::compile("context.failure_class!=flaky").is_err());
        assert!(Condition::compile("failure_class contains time").is_ok());
    }

    #[test]
    fn equality_on_outcomes_accepts_both_vocabularies() {
        assert!(check("outcome=success"));
        assert!(check("outcome=succeeded"));
        assert!(!check("outcome=fail"));
        assert!(check("outcome!=fail"));
        assert!(check("outcome!=failed"));
        assert!(!check("outcome=partial_success"));
    }

    #[test]
    fn equality_and_inequality_on_context() {
        assert!(check("context.tests_passed=true"));
        assert!(check("tests_passed=true"));
        assert!(check("score=85"));
        assert!(check("score=85.0"));
        assert!(check("count=3"));
        assert!(check("name=alpha"));
        assert!(check("name!=beta"));
        assert!(check("missing!=x"));
        assert!(check("missing=\"\""));
        assert!(check("preferred_label=approve"));
        assert!(check("preferred_label=\"[A] Approve\""));
    }

    #[test]
    fn numeric_comparisons() {
        assert!(check("context.score > 80"));
        assert!(!check("context.score < 80"));
        assert!(check("context.score >= 85"));
        assert!(check("context.score <= 85"));
        assert!(check("count < 5"));
        assert!(check("context.internal.node_visit_count >= 5"));
    }

    #[test]
    fn numeric_comparison_on_non_numbers_is_false() {
        assert!(!check("name > 1"));
        assert!(!check("name < 1"));
        assert!(!check("tags >= 0"));
        assert!(!check("missing <= 100"));
    }

    #[test]
    fn contains_on_strings_and_arrays() {
        assert!(check("context.log contains error"));
        assert!(!check("context.log contains warning"));
        assert!(check("tags contains fast"));
        assert!(!check("tags contains fas"));
        assert!(!check("missing contains x"));
    }

    #[test]
    fn matches_uses_regexes() {
        assert!(check(r"context.version matches ^v\d+"));
        assert!(check(r"version matches ^v2\."));
        assert!(!check("version matches ^v3"));
        assert!(!check("missing matches .*"));
    }

    #[test]
    fn dotted_keys_reach_into_json_values() {
        assert!(check("context.output.audit.verdict=pass"));
        assert!(check("output.audit.scores.1 > 5"));
        assert!(!check("output.audit.missing"));
        assert!(!check("output.audit.scores.7 > 0"));
    }

    #[test]
    fn truthiness() {
        assert!(check("tests_passed"));
        assert!(check("name"));
        assert!(check("tags"));
        assert!(!check("flag_zero"));
        assert!(!check("flag_false"));
        assert!(!check("empty"));
        assert!(!check("missing"));
    }

    #[test]
    fn logic_and_grouping() {
        assert!(check("outcome=success && context.tests_passed=true"));
        assert!(!check("outcome=fail && tests_passed"));
        assert!(check("outcome=fail || tests_passed"));
        assert!(check("!outcome=fail"));
        assert!(!check("!outcome=success"));
        // && binds tighter than ||: (fail && x) || name
        assert!(check("outcome=fail && missing || name"));
        assert!(!check("outcome=fail && (missing || name)"));
    }

    #[test]
    fn compile_errors() {
        assert!(
            Condition::compile("outcome=sucess")
                .unwrap_err()
                .message
                .contains("unknown outcome")
        );
        let err = Condition::compile("x matches (").unwrap_err();
        assert!(
            err.message.contains("invalid regular expression"),
            "{err:?}"
        );
        assert_eq!(err.span, Span::new(10, 11));
        assert!(
            Condition::compile("score > high")
                .unwrap_err()
                .message
                .contains("not a number")
        );
    }
}
