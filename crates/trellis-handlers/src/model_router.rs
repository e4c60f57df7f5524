//! Model-judged routing: when a stage's edges carry natural-language `when` conditions, a model reads
//! the run context and picks the option that holds, or "none of the above" (the engine then takes
//! the unconditional edge, if any).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use trellis_engine::Emitter;
use trellis_engine::services::{RouteChoice, RouteOption, Router};
use trellis_engine::{keys, text::clip};
use trellis_llm::{Client, Message, Request};

use crate::model_call::{ModelCall, Parsed};
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
        if keys::is_bookkeeping(key)
            || key.starts_with("response.")
            || key == keys::PARALLEL_RESULTS
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
        events: &dyn Emitter,
    ) -> Result<RouteChoice, String> {
        let mut call =
            ModelCall::new(&self.client, events, node_id, self.model.as_deref(), None)
                .map_err(|outcome| outcome.failure_reason().unwrap_or_default().to_owned())?;
        let mut request = Request {
            messages: vec![Message::user(prompt(node_id, options, context))],
            max_tokens: Some(256),
            temperature: Some(0.0),
            ..Request::default()
        };
        let answer = call
            .ask_until(
                &mut request,
                REPAIRS,
                |text| match parse_choice(text, options.len()) {
                    Ok(n) => Parsed::Valid(n),
                    Err(problem) => Parsed::Invalid(problem),
                },
                |problem| format!("{problem}. Answer again with only {{\"choice\": <number>}}."),
            )
            .await;
        match answer {
            Ok(shaped) => Ok(RouteChoice {
                choice: shaped.value.checked_sub(1),
                model: Some(call.details()),
            }),
            Err(unshaped) => {
                let (outcome, _) =
                    call.unshaped_outcome(unshaped, "the model gave no valid choice");
                Err(outcome.failure_reason().unwrap_or_default().to_owned())
            }
        }
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
