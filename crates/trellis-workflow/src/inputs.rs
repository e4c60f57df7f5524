//! A run's input against the workflow's declared `inputs` (YAML): each declared field is typed
//! (`string`, `number`, `boolean`, `string[]`), may be `required`, may have a `default` and an `enum`.
//! Every problem is reported at once; keys the workflow does not declare pass through.

use serde_json::{Map, Value};

use crate::workflow::Workflow;

/// The workflow's declared inputs (the `inputs` graph attribute, as JSON), if any.
pub fn declared(workflow: &Workflow) -> Option<Map<String, Value>> {
    let text = workflow.graph.attributes.get("inputs")?;
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

fn type_of(field: &Value) -> &str {
    field
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("string")
}

/// Reads a `--input KEY=VALUE` value as the declared type (JSON when undeclared, else text).
pub fn parse_value(workflow: &Workflow, key: &str, text: &str) -> Value {
    let kind = declared(workflow)
        .and_then(|d| d.get(key).map(|f| type_of(f).to_owned()))
        .unwrap_or_default();
    match kind.as_str() {
        "string" => Value::String(text.to_owned()),
        "number" => text
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|n| serde_json::Number::from_f64(n).map(Value::Number))
            .map_or_else(
                || Value::String(text.to_owned()),
                |n| {
                    // Whole numbers stay integers.
                    text.trim().parse::<i64>().map_or(n, Value::from)
                },
            ),
        "boolean" => match text.trim() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => Value::String(text.to_owned()),
        },
        "string[]" if !text.trim_start().starts_with('[') => Value::Array(
            text.split(',')
                .map(|s| Value::String(s.trim().to_owned()))
                .filter(|v| v.as_str() != Some(""))
                .collect(),
        ),
        _ => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned())),
    }
}

fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The run's `input`: the provided values checked against the declaration, defaults filled in. Every
/// problem is returned at once, each naming its input.
pub fn resolve(workflow: &Workflow, provided: Map<String, Value>) -> Result<Value, Vec<String>> {
    let Some(declared) = declared(workflow) else {
        return Ok(Value::Object(provided));
    };
    let mut errors = Vec::new();
    let mut input = Map::new();
    for (name, field) in &declared {
        let kind = type_of(field);
        match provided.get(name).filter(|v| !v.is_null()) {
            None => {
                if let Some(default) = field.get("default") {
                    input.insert(name.clone(), default.clone());
                } else if field.get("required") == Some(&Value::Bool(true)) {
                    let what = field
                        .get("description")
                        .and_then(Value::as_str)
                        .map(|d| format!(" ({d})"))
                        .unwrap_or_default();
                    errors.push(format!(
                        "input `{name}`{what} is required: pass --input {name}=..."
                    ));
                }
            }
            Some(value) if !trellis_syntax::yaml::has_input_type(value, kind) => errors.push(
                format!("input `{name}` must be a {kind}, found {}", describe(value)),
            ),
            Some(value) => {
                if let Some(allowed) = field.get("enum").and_then(Value::as_array)
                    && !allowed.contains(value)
                {
                    let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
                    errors.push(format!(
                        "input `{name}` must be one of {}, found {value}",
                        list.join(", ")
                    ));
                    continue;
                }
                input.insert(name.clone(), value.clone());
            }
        }
    }
    for (name, value) in provided {
        if !declared.contains_key(&name) {
            input.insert(name, value);
        }
    }
    if errors.is_empty() {
        Ok(Value::Object(input))
    } else {
        Err(errors)
    }
}

/// A run's `input`, from what the caller gave (`--input`/`--inputs`, the API's `input`): a YAML workflow
/// always has one (`{}` at least), a DOT workflow only when it declares inputs or was given some.
pub fn for_run(
    workflow: &Workflow,
    provided: Map<String, Value>,
) -> Result<Option<Value>, Vec<String>> {
    let yaml = workflow.format == crate::SourceFormat::Yaml;
    if !yaml && provided.is_empty() && declared(workflow).is_none() {
        return Ok(None);
    }
    resolve(workflow, provided).map(Some)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{CompileOptions, compile_text};

    fn workflow() -> Workflow {
        compile_text(
            "w.yaml",
            "entry: a\ninputs:\n  repo: { type: string, required: true }\n  limit: { type: number, default: 5 }\n  dry: { type: boolean }\n  labels: { type: \"string[]\" }\n  level: { type: string, enum: [low, high] }\nnodes:\n  a: { instruction: Go. }\n",
            &CompileOptions::default(),
        )
        .1
        .workflow
        .unwrap()
    }

    #[test]
    fn values_are_read_as_their_declared_types_and_defaults_fill_in() {
        let w = workflow();
        assert_eq!(parse_value(&w, "limit", "12"), json!(12));
        assert_eq!(parse_value(&w, "dry", "true"), json!(true));
        assert_eq!(parse_value(&w, "labels", "bug, ui"), json!(["bug", "ui"]));
        assert_eq!(parse_value(&w, "repo", "42"), json!("42"));
        assert_eq!(parse_value(&w, "extra", "{\"a\": 1}"), json!({ "a": 1 }));
        let provided = json!({ "repo": "acme/api", "extra": 1 });
        let input = resolve(&w, provided.as_object().unwrap().clone()).unwrap();
        assert_eq!(input, json!({ "repo": "acme/api", "limit": 5, "extra": 1 }));
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let w = workflow();
        let provided = json!({ "limit": "many", "level": "medium", "labels": [1] });
        let errors = resolve(&w, provided.as_object().unwrap().clone()).unwrap_err();
        assert_eq!(errors.len(), 4, "{errors:?}");
        // In the order the workflow declares its inputs.
        assert!(errors[0].contains("input `repo` is required"), "{errors:?}");
        assert!(
            errors
                .iter()
                .any(|e| e.contains("input `labels` must be a string[]")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("`repo`") && e.contains("required"))
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("`level` must be one of \"low\", \"high\""))
        );
    }
}
