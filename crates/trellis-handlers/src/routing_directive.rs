//! Routing directives in model responses (the outputs document): the last balanced JSON object in the
//! text that has a recognised routing field — `outcome`, `failure_reason`, `preferred_next_label`,
//! `suggested_next_ids`, `context_updates` — fenced, inline or at the end. Plain extraction ignores
//! fields of the wrong type; `output_schema="routing"` validates them ([`validate_routing`]) so a
//! malformed directive is repaired instead of silently ignored.

use serde_json::{Map, Value};
use trellis_engine::{FailureClass, Outcome};
use trellis_workflow::StageStatus;

/// The routing fields a directive may carry.
pub const ROUTING_FIELDS: &[&str] = &[
    "outcome",
    "failure_reason",
    "preferred_next_label",
    "suggested_next_ids",
    "context_updates",
];

/// How much of a response is scanned for JSON (the end of it, where directives go).
const SCAN_LIMIT: usize = 256 * 1024;
/// Bytes the scan may step over in all: every `{` may start a scan to the end, so without a budget a
/// response full of unmatched braces would take quadratic time.
const SCAN_BUDGET: usize = 32 * SCAN_LIMIT;

/// A parsed routing directive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoutingDirective {
    pub outcome: Option<StageStatus>,
    pub failure_reason: Option<String>,
    pub preferred_next_label: Option<String>,
    pub suggested_next_ids: Vec<String>,
    pub context_updates: Map<String, Value>,
}

/// Every balanced `{...}` in `text` that parses as a JSON object, in order. Braces inside JSON strings
/// do not count; a candidate that does not parse is searched for objects inside it.
pub fn json_objects(text: &str) -> Vec<Map<String, Value>> {
    let start = text.len().saturating_sub(SCAN_LIMIT);
    let start = (start..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    let bytes = &text.as_bytes()[start..];
    let mut found = Vec::new();
    let mut from = 0;
    let mut budget = SCAN_BUDGET;
    while let Some(offset) = bytes[from..].iter().position(|&b| b == b'{') {
        let open = from + offset;
        if budget == 0 {
            break;
        }
        match balanced_end(&bytes[open..], &mut budget) {
            Some(len) => match serde_json::from_slice::<Value>(&bytes[open..open + len]) {
                Ok(Value::Object(object)) => {
                    found.push(object);
                    from = open + len;
                }
                _ => from = open + 1,
            },
            None => from = open + 1,
        }
    }
    found
}

/// The length of the balanced object starting at `bytes[0] == b'{'`, if it closes within `budget`.
fn balanced_end(bytes: &[u8], budget: &mut usize) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        *budget = budget.checked_sub(1)?;
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

fn has_routing_field(object: &Map<String, Value>) -> bool {
    ROUTING_FIELDS.iter().any(|f| object.contains_key(*f))
}

/// Whether `text` holds a JSON object with a routing field (well typed or not).
pub fn has_directive(text: &str) -> bool {
    json_objects(text).iter().any(has_routing_field)
}

/// The last object in `text` with a routing field, leniently read: fields of the wrong type are ignored.
pub fn extract(text: &str) -> Option<RoutingDirective> {
    let object = json_objects(text)
        .into_iter()
        .rev()
        .find(has_routing_field)?;
    Some(read(&object, &mut Vec::new()))
}

/// Strict reading for `output_schema="routing"`: the last object with a routing field must exist and
/// every routing field in it must have its type. The error lists every problem, for the repair turn.
pub fn validate_routing(text: &str) -> Result<RoutingDirective, String> {
    let Some(object) = json_objects(text).into_iter().rev().find(has_routing_field) else {
        return Err(format!(
            "no JSON object with a routing field ({}) was found",
            ROUTING_FIELDS.join(", ")
        ));
    };
    let mut problems = Vec::new();
    let directive = read(&object, &mut problems);
    if problems.is_empty() {
        Ok(directive)
    } else {
        Err(problems.join("; "))
    }
}

fn read(object: &Map<String, Value>, problems: &mut Vec<String>) -> RoutingDirective {
    let mut directive = RoutingDirective::default();
    // A word that is no status is the workflow's own outcome (`needs_dod`): conditions compare it
    // with the preferred label, unless the directive names one.
    let mut custom_outcome = None;
    if let Some(value) = object.get("outcome") {
        match value.as_str().map(|s| (s, s.parse::<StageStatus>())) {
            Some((_, Ok(status))) => directive.outcome = Some(status),
            Some((word, Err(()))) if !word.trim().is_empty() => {
                custom_outcome = Some(word.trim().to_owned());
            }
            _ => problems.push(format!(
                "`outcome` must be one of {} (or a word of the workflow's own), found {value}",
                StageStatus::ACCEPTED
            )),
        }
    }
    for (field, slot) in [
        ("failure_reason", &mut directive.failure_reason),
        ("preferred_next_label", &mut directive.preferred_next_label),
    ] {
        if let Some(value) = object.get(field) {
            match value.as_str() {
                Some(text) => *slot = Some(text.to_owned()),
                None => problems.push(format!("`{field}` must be a string, found {value}")),
            }
        }
    }
    if directive.preferred_next_label.is_none() {
        directive.preferred_next_label = custom_outcome;
    }
    if let Some(value) = object.get("suggested_next_ids") {
        match value.as_array().map(|items| {
            items
                .iter()
                .map(|i| i.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
        }) {
            Some(Some(ids)) => directive.suggested_next_ids = ids,
            _ => problems.push(format!(
                "`suggested_next_ids` must be a list of node ids, found {value}"
            )),
        }
    }
    if let Some(value) = object.get("context_updates") {
        match value.as_object() {
            Some(updates) => directive.context_updates.clone_from(updates),
            None => problems.push(format!(
                "`context_updates` must be an object, found {value}"
            )),
        }
    }
    directive
}

impl RoutingDirective {
    /// Applies the directive to a stage's outcome: status, failure reason, routing hints, updates.
    pub fn apply(self, outcome: &mut Outcome) {
        if let Some(status) = self.outcome {
            outcome.status = status;
            if status == StageStatus::Failed {
                let reason = self
                    .failure_reason
                    .clone()
                    .unwrap_or_else(|| "the model reported failure".to_owned());
                *outcome = Outcome {
                    failure: Some(trellis_engine::Failure {
                        class: FailureClass::StageFailed,
                        reason,
                    }),
                    ..outcome.clone()
                };
            }
        }
        if self.preferred_next_label.is_some() {
            outcome.preferred_label = self.preferred_next_label;
        }
        if !self.suggested_next_ids.is_empty() {
            outcome.suggested_next_ids = self.suggested_next_ids;
        }
        outcome.context_updates.extend(self.context_updates);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn finds_the_last_object_with_a_routing_field() {
        let text = "I reviewed it. {\"note\": \"not routing\"}\nSome {braces} in prose and a \"quote.\n```json\n{\"preferred_next_label\": \"fix\", \"context_updates\": {\"coverage\": 72}}\n```\nThen: {\"unrelated\": 1}";
        let directive = extract(text).unwrap();
        assert_eq!(directive.preferred_next_label.as_deref(), Some("fix"));
        assert_eq!(directive.context_updates["coverage"], json!(72));
    }

    #[test]
    fn braces_inside_strings_and_unparseable_wrappers() {
        let text = r#"Wrapped { not json but {"outcome": "fail", "failure_reason": "tests {3} failed"} inside }"#;
        let directive = extract(text).unwrap();
        assert_eq!(directive.outcome, Some(StageStatus::Failed));
        assert_eq!(
            directive.failure_reason.as_deref(),
            Some("tests {3} failed")
        );
        assert!(extract("no json at all").is_none());
        assert!(extract("{\"only\": \"other fields\"}").is_none());
        assert!(
            extract("{\"outcome\": \"succeeded\"").is_none(),
            "an unclosed object is not a directive"
        );
    }

    #[test]
    fn later_directives_win_and_both_vocabularies_parse() {
        let text = r#"{"outcome": "success"} then {"outcome": "partially_succeeded", "suggested_next_ids": ["b", "a"]}"#;
        let directive = extract(text).unwrap();
        assert_eq!(directive.outcome, Some(StageStatus::PartiallySucceeded));
        assert_eq!(directive.suggested_next_ids, ["b", "a"]);
    }

    #[test]
    fn strict_validation_reports_every_wrong_type() {
        let error = validate_routing(r#"{"outcome": 7, "preferred_next_label": 3, "suggested_next_ids": "a", "context_updates": []}"#).unwrap_err();
        assert!(error.contains("`outcome` must be one of"), "{error}");
        assert!(
            error.contains("`preferred_next_label` must be a string"),
            "{error}"
        );
        assert!(
            error.contains("`suggested_next_ids` must be a list"),
            "{error}"
        );
        assert!(
            error.contains("`context_updates` must be an object"),
            "{error}"
        );
        assert!(
            validate_routing("nothing here")
                .unwrap_err()
                .starts_with("no JSON object with a routing field")
        );
        assert_eq!(
            validate_routing(r#"{"preferred_next_label": "approve"}"#)
                .unwrap()
                .preferred_next_label
                .as_deref(),
            Some("approve")
        );
        // Lenient extraction keeps the good fields of a malformed directive.
        let lenient = extract(r#"{"outcome": 7, "preferred_next_label": "fix"}"#).unwrap();
        assert_eq!(
            (lenient.outcome, lenient.preferred_next_label.as_deref()),
            (None, Some("fix"))
        );
        // A word of the workflow's own is its preferred label, unless the directive names one.
        let custom = validate_routing(r#"{"outcome": "needs_dod"}"#).unwrap();
        assert_eq!(
            (custom.outcome, custom.preferred_next_label.as_deref()),
            (None, Some("needs_dod"))
        );
        let named = extract(r#"{"outcome": "needs_dod", "preferred_next_label": "fix"}"#).unwrap();
        assert_eq!(named.preferred_next_label.as_deref(), Some("fix"));
    }

    #[test]
    fn applying_sets_status_reason_hints_and_updates() {
        let mut outcome = Outcome::success();
        extract(r#"{"outcome": "failed", "failure_reason": "tests failed", "preferred_next_label": "fix", "context_updates": {"tests_passed": false}}"#)
            .unwrap()
            .apply(&mut outcome);
        assert_eq!(outcome.status, StageStatus::Failed);
        assert_eq!(outcome.failure_reason(), Some("tests failed"));
        assert!(
            !outcome.retryable(),
            "a model's own failure is routed, not retried"
        );
        assert_eq!(outcome.preferred_label.as_deref(), Some("fix"));
        assert_eq!(outcome.context_updates["tests_passed"], json!(false));
    }

    #[test]
    fn pathological_input_is_handled() {
        let many = "{".repeat(5_000);
        assert!(extract(&many).is_none());
        let started = std::time::Instant::now();
        assert!(extract(&"{".repeat(2_000_000)).is_none());
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "bounded work"
        );
        let text = format!("{}{{\"outcome\": \"success\"}}", "é{".repeat(1000));
        assert_eq!(
            extract(&text).unwrap().outcome,
            Some(StageStatus::Succeeded)
        );
    }
}
