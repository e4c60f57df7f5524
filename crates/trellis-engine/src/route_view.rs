//! What a model judging `when` edges is shown: the route-eval view (the edges-and-routing page). It holds
//! the workflow's input and every prior node's result — its structured output when it has one, else its
//! response text — and the rest of the run context. A node whose output schema declares `properties`
//! is shown with only those top-level keys (a declared key it did not emit as `null`, its `evals`
//! namespace kept, nested values passed whole): prose beside the structured payload never reaches the
//! router, while later prompts still see everything. Long text is cut with a marker saying how much.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use trellis_workflow::Workflow;
use trellis_workflow::node_kind::OutputSchema;

use crate::keys;

/// Text longer than this (in characters) is cut in the view.
pub const MAX_TEXT: usize = 4_000;

/// Cuts long strings anywhere in `value`, saying how much was cut.
pub fn cut(value: Value) -> Value {
    match value {
        Value::String(text) => Value::String(cut_text(text)),
        Value::Array(items) => Value::Array(items.into_iter().map(cut).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, cut(v))).collect()),
        other => other,
    }
}

fn cut_text(text: String) -> String {
    let count = text.chars().count();
    if count <= MAX_TEXT {
        return text;
    }
    let kept: String = text.chars().take(MAX_TEXT).collect();
    format!(
        "{kept}… [cut: {} more characters of {count}]",
        count - MAX_TEXT
    )
}

/// The top-level keys a node's output schema declares, when it declares any.
fn declared_keys(workflow: &Workflow, node: usize) -> Option<Vec<String>> {
    let llm = workflow.nodes[node].kind.llm()?;
    let Some(OutputSchema::JsonSchema { schema, .. }) = &llm.output_schema else {
        return None;
    };
    let properties = schema.get("properties")?.as_object()?;
    (!properties.is_empty()).then(|| properties.keys().cloned().collect())
}

/// A result seen through its node's schema: only the declared keys (missing ones `null`) and `evals`.
fn scoped(result: Option<&Value>, declared: &[String]) -> Value {
    let object = result.and_then(Value::as_object);
    let mut view: Map<String, Value> = declared
        .iter()
        .map(|key| {
            let value = object
                .and_then(|o| o.get(key))
                .cloned()
                .unwrap_or(Value::Null);
            (key.clone(), value)
        })
        .collect();
    if let Some(evals) = object.and_then(|o| o.get("evals")) {
        view.insert("evals".into(), evals.clone());
    }
    Value::Object(view)
}

/// Keys the view shows elsewhere (results, input) or never (the last response again, branch internals,
/// the engine's bookkeeping of the stage).
fn shown_elsewhere(key: &str) -> bool {
    // The stage's `outcome` and failure reason stay: they are what a router judges a command by.
    const STAGE_NOISE: &[&str] = &[
        keys::CURRENT_NODE,
        keys::PREFERRED_LABEL,
        keys::LAST_STAGE,
        keys::FAILURE_CLASS,
        keys::FAILURE_SIGNATURE,
    ];
    keys::is_bookkeeping(key)
        || STAGE_NOISE.contains(&key)
        || key == keys::INPUT
        || key == keys::LAST_RESPONSE
        || key == keys::PARALLEL_RESULTS
        || key.starts_with(keys::RESPONSE_PREFIX)
        || key.starts_with(keys::OUTPUT_PREFIX)
}

/// The route-eval view of `context` (blob references already replaced by their values):
/// `{"input": ..., "goal": ..., "results": {node: result}, "context": {other keys}}`, the parts that
/// are empty left out. Results are in the workflow's node order.
pub fn route_view(workflow: &Workflow, context: &BTreeMap<String, Value>) -> Value {
    let mut view = Map::new();
    if let Some(input) = context.get(keys::INPUT) {
        view.insert("input".into(), cut(input.clone()));
    }
    if let Some(goal) = workflow.graph.goal.as_deref().filter(|g| !g.is_empty()) {
        view.insert("goal".into(), json!(goal));
    }
    let mut results = Map::new();
    for (index, node) in workflow.nodes.iter().enumerate() {
        let output = context.get(&keys::output_of(&node.id));
        let response = context.get(&keys::response_of(&node.id));
        if output.is_none() && response.is_none() {
            continue;
        }
        let result = match declared_keys(workflow, index) {
            Some(declared) => scoped(output, &declared),
            None => output.or(response).cloned().unwrap_or(Value::Null),
        };
        results.insert(node.id.clone(), cut(result));
    }
    if !results.is_empty() {
        view.insert("results".into(), Value::Object(results));
    }
    let rest: Map<String, Value> = context
        .iter()
        .filter(|(key, _)| !shown_elsewhere(key))
        .map(|(key, value)| (key.clone(), cut(value.clone())))
        .collect();
    if !rest.is_empty() {
        view.insert("context".into(), Value::Object(rest));
    }
    Value::Object(view)
}

#[cfg(test)]
mod tests {
    use trellis_workflow::{CompileOptions, compile_text};

    use super::*;

    fn workflow(yaml: &str) -> Workflow {
        let (_, compiled) = compile_text("w.yaml", yaml, &CompileOptions::default());
        compiled
            .workflow
            .unwrap_or_else(|| panic!("{:?}", compiled.diagnostics))
    }

    const TRIAGE: &str = "start: investigate\nnodes:\n  investigate:\n    prompt: look\n    output_schema:\n      type: object\n      properties:\n        novel_count: { type: integer }\n        highest_severity: { type: string }\n        details: { type: object }\n  notes:\n    prompt: write\n  done:\n    type: command\n    script: \"true\"\nedges:\n  - { from: investigate, to: notes }\n  - { from: notes, to: done }\n";

    #[test]
    fn a_schema_scopes_a_result_to_its_declared_keys() {
        let w = workflow(TRIAGE);
        let context: BTreeMap<String, Value> = [
            (
                "output.investigate",
                json!({ "novel_count": 2, "summary": "long prose", "details": { "inner": "kept" }, "evals": { "sane": { "pass": true } } }),
            ),
            ("response.investigate", json!("Here is my prose. {\"novel_count\": 2}")),
            ("response.notes", json!("the notes")),
            ("last_response", json!("the notes")),
            ("input", json!({ "repo": "x" })),
            ("outcome", json!("succeeded")),
            ("internal.run_id", json!("R")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let view = route_view(&w, &context);
        assert_eq!(
            view["results"]["investigate"],
            json!({ "novel_count": 2, "highest_severity": null, "details": { "inner": "kept" }, "evals": { "sane": { "pass": true } } })
        );
        assert_eq!(
            view["results"]["notes"], "the notes",
            "no schema: the whole result"
        );
        assert_eq!(view["input"], json!({ "repo": "x" }));
        assert_eq!(view["context"], json!({ "outcome": "succeeded" }));
        let text = view.to_string();
        assert!(!text.contains("long prose") && !text.contains("Here is my prose"));
    }

    #[test]
    fn a_node_without_output_yet_shows_its_declared_keys_as_null_once_it_ran() {
        let w = workflow(TRIAGE);
        let ran: BTreeMap<String, Value> =
            [("response.investigate".to_owned(), json!("no JSON at all"))].into();
        assert_eq!(
            route_view(&w, &ran)["results"]["investigate"],
            json!({ "novel_count": null, "highest_severity": null, "details": null })
        );
        assert!(route_view(&w, &BTreeMap::new()).get("results").is_none());
    }

    #[test]
    fn long_text_is_cut_with_a_marker_that_says_how_much() {
        let long = "x".repeat(MAX_TEXT + 250);
        let cut = cut(json!({ "a": [long] }));
        let text = cut["a"][0].as_str().unwrap();
        assert!(text.ends_with(&format!(
            "… [cut: 250 more characters of {}]",
            MAX_TEXT + 250
        )));
        assert_eq!(text.chars().filter(|c| *c == 'x').count(), MAX_TEXT);
    }
}
