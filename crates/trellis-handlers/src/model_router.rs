//! Model-judged routing: when a stage's edges carry natural-language `when` conditions, a model reads
//! the run context and picks the option that holds, or "none of the above" (the engine then takes
//! the unconditional edge, if any).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use trellis_engine::services::{RouteOption, Router};
use trellis_llm::{Client, Message, Request};

use crate::preamble::clip;
use crate::routing_directive::json_objects;

/// Repair turns for an answer that picks no valid option.
const REPAIRS: u32 = 2;

pub struct ModelRouter {
    client: Arc<Client>,
    /// The model that judges; the configured default when `None`.
    model: Option<String>,
}

impl ModelRouter {
    pub fn new(client: Arc<Client>, model: Option<String>) -> Self {
        Self { client, model }
    }
}

fn prompt(node_id: &str, options: &[RouteOption], context: &BTreeMap<String, Value>) -> String {
    let mut text = format!(
        "You route a workflow. Stage `{node_id}` has just finished. Decide which condition holds, \
         judging only from the run context below.\n\n## Run context\n"
    );
    for (key, value) in context {
        if key.starts_with("internal.")
            || key.starts_with("graph.")
            || key.starts_with("response.")
            || key == "parallel.results"
        {
            continue;
        }
        let value = match value {
            Value::String(s) => clip(s, 300),
            other => clip(&other.to_string(), 300),
        };
        let _ = writeln!(text, "- {key}: {value}");
    }
    text.push_str("\n## Options\n");
    for (i, option) in options.iter().enumerate() {
        let _ = writeln!(
            text,
            "{}. {} (go to `{}`)",
            i + 1,
            option.when,
            option.target
        );
    }
    let _ = write!(
        text,
        "0. none of the above\n\nAnswer with one JSON object {{\"choice\": <number from 0 to {}>}}.",
        options.len()
    );
    text
}

/// The option number in an answer, checked against the number of options.
fn parse_choice(text: &str, count: usize) -> Result<usize, String> {
    let number = json_objects(text)
        .into_iter()
        .rev()
        .find_map(|o| o.get("choice").and_then(Value::as_u64))
        .ok_or_else(|| "the answer has no JSON object with a numeric `choice`".to_owned())?;
    let number = usize::try_from(number).unwrap_or(usize::MAX);
    if number > count {
        return Err(format!(
            "`choice` is {number}, but the options go from 0 to {count}"
        ));
    }
    Ok(number)
}

#[async_trait]
impl Router for ModelRouter {
    async fn choose(
        &self,
        node_id: &str,
        options: &[RouteOption],
        context: &BTreeMap<String, Value>,
    ) -> Result<Option<usize>, String> {
        let resolved = self
            .client
            .resolve(self.model.as_deref(), None)
            .map_err(|e| e.to_string())?;
        let mut request = Request {
            messages: vec![Message::user(prompt(node_id, options, context))],
            max_tokens: Some(256),
            temperature: Some(0.0),
            ..Request::default()
        };
        let mut problem = String::new();
        for _ in 0..=REPAIRS {
            let response = self
                .client
                .complete(&resolved, &request, &|_| {}, &|_, _, _| {})
                .await
                .map_err(|e| e.to_string())?;
            match parse_choice(&response.text, options.len()) {
                Ok(0) => return Ok(None),
                Ok(n) => return Ok(Some(n - 1)),
                Err(p) => {
                    request.messages.push(response.to_message());
                    request.messages.push(Message::user(format!(
                        "{p}. Answer again with only {{\"choice\": <number>}}."
                    )));
                    problem = p;
                }
            }
        }
        Err(format!(
            "the model gave no valid choice after {REPAIRS} repair attempt(s): {problem}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_numbers_within_the_options() {
        assert_eq!(
            parse_choice("I think the tests pass. {\"choice\": 2}", 3),
            Ok(2)
        );
        assert_eq!(parse_choice("{\"choice\": 0}", 3), Ok(0));
        assert!(parse_choice("{\"choice\": 4}", 3).is_err());
        assert!(parse_choice("option two", 3).is_err());
    }

    #[test]
    fn the_prompt_lists_options_and_context_without_internals() {
        let options = vec![
            RouteOption {
                target: "deploy".into(),
                when: "the tests passed".into(),
            },
            RouteOption {
                target: "fix".into(),
                when: "the tests failed".into(),
            },
        ];
        let context: BTreeMap<String, Value> = [
            ("outcome".to_owned(), Value::from("succeeded")),
            ("internal.run_id".to_owned(), Value::from("R")),
        ]
        .into();
        let text = prompt("test", &options, &context);
        assert!(text.contains("1. the tests passed (go to `deploy`)\n2. the tests failed (go to `fix`)\n0. none of the above"));
        assert!(text.contains("- outcome: succeeded") && !text.contains("internal.run_id"));
    }
}
