//! Structured output (the outputs document): `output_schema="routing"` requires a well-typed routing
//! directive, and `output_schema="@schemas/x.json"` requires the response's last JSON object to match a
//! JSON Schema. A response that fails gets repair turns in the same conversation, with the problems
//! spelled out.

use serde_json::Value;
use trellis_engine::Outcome;
use trellis_workflow::node_kind::OutputSchema;

use crate::routing_directive::{self, ROUTING_FIELDS, RoutingDirective};

/// What a response yielded under its node's schema.
#[derive(Debug, Clone, PartialEq)]
pub enum Structured {
    /// No schema: the routing directive, if any, is read leniently.
    Free(Option<RoutingDirective>),
    Routing(RoutingDirective),
    /// The JSON object that matched the custom schema (stored at `output.<node>`).
    Json(Value),
}

impl Structured {
    /// Puts what the answer yielded into the stage's outcome: the routing directive's fields, or the
    /// custom schema's JSON at `output.<node>`.
    pub fn apply(self, outcome: &mut Outcome, node_id: &str) {
        match self {
            Structured::Free(Some(directive)) | Structured::Routing(directive) => {
                directive.apply(outcome);
            }
            Structured::Free(None) => {}
            Structured::Json(value) => {
                outcome
                    .context_updates
                    .insert(trellis_engine::keys::output_of(node_id), value);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum SchemaError {
    /// The response does not satisfy the schema; the text lists every problem.
    Invalid(String),
    /// The schema itself cannot be used.
    BadSchema(String),
}

/// Checks `text` against the node's schema.
pub fn check(schema: Option<&OutputSchema>, text: &str) -> Result<Structured, SchemaError> {
    match schema {
        None => Ok(Structured::Free(routing_directive::extract(text))),
        Some(OutputSchema::Routing) => routing_directive::validate_routing(text)
            .map(Structured::Routing)
            .map_err(SchemaError::Invalid),
        Some(OutputSchema::JsonSchema { schema, .. }) => {
            let validator = jsonschema::validator_for(schema).map_err(|e| {
                SchemaError::BadSchema(format!("the output schema is not a valid JSON Schema: {e}"))
            })?;
            let Some(object) = routing_directive::json_objects(text).pop() else {
                return Err(SchemaError::Invalid(
                    "the response contains no JSON object".to_owned(),
                ));
            };
            let value = Value::Object(object);
            let problems: Vec<String> = validator
                .iter_errors(&value)
                .take(10)
                .map(|e| {
                    let path = e.instance_path().to_string();
                    if path.is_empty() {
                        e.to_string()
                    } else {
                        format!("at {path}: {e}")
                    }
                })
                .collect();
            if problems.is_empty() {
                Ok(Structured::Json(value))
            } else {
                Err(SchemaError::Invalid(problems.join("; ")))
            }
        }
    }
}

/// The simplest value a JSON Schema accepts, for simulated answers: an object with every property,
/// the first of an `enum`, a `const` or `default`, the first `anyOf`/`oneOf` option, the minimum of a
/// number, and empty strings and arrays.
pub fn sample(schema: &Value) -> Value {
    if let Some(value) = schema.get("const").or_else(|| schema.get("default")) {
        return value.clone();
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    if let Some(first) = ["anyOf", "oneOf", "allOf"].iter().find_map(|k| {
        schema
            .get(*k)
            .and_then(Value::as_array)
            .and_then(|o| o.first())
    }) {
        return sample(first);
    }
    let kind = match schema.get("type") {
        Some(Value::Array(kinds)) => kinds.first().and_then(Value::as_str),
        Some(kind) => kind.as_str(),
        None if schema.get("properties").is_some() => Some("object"),
        None => None,
    };
    match kind {
        Some("object") => Value::Object(
            schema
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(name, property)| (name.clone(), sample(property)))
                .collect(),
        ),
        Some("array") => Value::Array(Vec::new()),
        Some("string") => Value::String(String::new()),
        Some("integer" | "number") => schema
            .get("minimum")
            .cloned()
            .unwrap_or_else(|| Value::from(0)),
        Some("boolean") => Value::Bool(true),
        _ => Value::Null,
    }
}

/// The corrective message of a repair turn.
pub fn repair_message(schema: &OutputSchema, problems: &str) -> String {
    match schema {
        OutputSchema::Routing => format!(
            "Your response did not contain a valid routing directive: {problems}.\n\
             Reply again as the original instructions asked, ending with one JSON object that has at least one \
             of the fields {} \
             (`outcome` is one of succeeded, failed, partially_succeeded, skipped; \
             `suggested_next_ids` is a list of strings; `context_updates` is an object).",
            ROUTING_FIELDS.join(", ")
        ),
        OutputSchema::JsonSchema { .. } => format!(
            "Your JSON did not match the required schema: {problems}.\n\
             Reply again with one corrected JSON object that is valid against the schema (an instance of it, \
             not the schema itself)."
        ),
    }
}

/// What the prompt adds for a custom schema, so the model knows the shape it must produce: an example
/// of the shape first (small models otherwise tend to answer with a copy of the schema), then the
/// schema itself for the exact rules.
pub fn instructions(schema: &OutputSchema) -> Option<String> {
    match schema {
        OutputSchema::Routing => None,
        OutputSchema::JsonSchema { schema, .. } => Some(format!(
            "End your answer with one JSON object of this shape:\n```json\n{}\n```\n\
             It must be valid against this JSON Schema:\n```json\n{}\n```",
            serde_json::to_string_pretty(&skeleton(schema, 0)).unwrap_or_default(),
            serde_json::to_string_pretty(schema).unwrap_or_default()
        )),
    }
}

/// An example instance of `schema`: its properties with placeholder values of their types.
fn skeleton(schema: &Value, depth: usize) -> Value {
    if depth > 8 {
        return Value::Null;
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(first) = ["oneOf", "anyOf", "allOf"].iter().find_map(|k| {
        schema
            .get(*k)
            .and_then(Value::as_array)
            .and_then(|v| v.first())
    }) {
        return skeleton(first, depth + 1);
    }
    let kind = match schema.get("type") {
        Some(Value::Array(kinds)) => kinds.first().and_then(Value::as_str).unwrap_or("string"),
        Some(Value::String(kind)) => kind.as_str(),
        _ if schema.get("properties").is_some() => "object",
        _ if schema.get("items").is_some() => "array",
        _ => "string",
    };
    match kind {
        "object" => Value::Object(
            schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|props| {
                    props
                        .iter()
                        .map(|(k, v)| (k.clone(), skeleton(v, depth + 1)))
                        .collect()
                })
                .unwrap_or_default(),
        ),
        "array" => Value::Array(vec![skeleton(
            schema.get("items").unwrap_or(&Value::Null),
            depth + 1,
        )]),
        "integer" => Value::from(0),
        "number" => Value::from(0.0),
        "boolean" => Value::Bool(true),
        "null" => Value::Null,
        _ => Value::from("..."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn audit_schema() -> OutputSchema {
        OutputSchema::JsonSchema {
            path: None,
            schema: json!({
                "type": "object",
                "required": ["verdict", "score"],
                "properties": {
                    "verdict": { "enum": ["approve", "reject"] },
                    "score": { "type": "integer", "minimum": 0, "maximum": 10 }
                }
            }),
        }
    }

    #[test]
    fn the_last_json_object_is_validated_against_the_schema() {
        let ok = check(
            Some(&audit_schema()),
            "Looks fine.\n```json\n{\"verdict\": \"approve\", \"score\": 8}\n```",
        );
        assert_eq!(
            ok,
            Ok(Structured::Json(
                json!({ "verdict": "approve", "score": 8 })
            ))
        );
        let Err(SchemaError::Invalid(problems)) = check(
            Some(&audit_schema()),
            "{\"verdict\": \"maybe\", \"score\": 11}",
        ) else {
            panic!("an invalid object passed");
        };
        assert!(
            problems.contains("/verdict") && problems.contains("/score"),
            "{problems}"
        );
        assert!(matches!(
            check(Some(&audit_schema()), "no json"),
            Err(SchemaError::Invalid(_))
        ));
    }

    #[test]
    fn the_instructions_show_an_example_of_the_shape() {
        let text = instructions(&audit_schema()).unwrap();
        assert!(
            text.contains("\"verdict\": \"approve\"") && text.contains("\"score\": 0"),
            "{text}"
        );
        let nested = json!({ "type": "object", "properties": { "steps": { "type": "array", "items": { "type": "string" } } } });
        assert_eq!(skeleton(&nested, 0), json!({ "steps": ["..."] }));
    }

    #[test]
    fn a_broken_schema_is_reported_as_such() {
        let schema = OutputSchema::JsonSchema {
            path: None,
            schema: json!({ "type": 12 }),
        };
        assert!(matches!(
            check(Some(&schema), "{}"),
            Err(SchemaError::BadSchema(_))
        ));
    }

    #[test]
    fn routing_schema_is_strict_and_no_schema_is_lenient() {
        let text = "{\"outcome\": 3, \"preferred_next_label\": \"fix\"}";
        assert!(matches!(
            check(Some(&OutputSchema::Routing), text),
            Err(SchemaError::Invalid(_))
        ));
        let Ok(Structured::Free(Some(directive))) = check(None, text) else {
            panic!("lenient extraction failed");
        };
        assert_eq!(directive.preferred_next_label.as_deref(), Some("fix"));
    }
}
