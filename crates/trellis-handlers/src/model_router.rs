//! Model-judged routing: when a stage's edges carry natural-language `when` conditions, a model reads the
//! route-eval view (the workflow input and every prior node's result) and picks the condition that holds,
//! or "none of the above" where an unconditional edge stands as the default. Its answer is constrained by
//! the provider's structured output to `{"reason": ..., "choice": <a live choice>}`; an answer that still
//! names no live choice is returned as such (the engine takes the default edge or stops the run). The
//! prompt and the answer are kept in the stage's directory (`router.prompt.md`, `router.response.md`).

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use trellis_engine::Emitter;
use trellis_engine::services::{NONE_OF_THE_ABOVE, RouteChoice, RouteRequest, Router};
use trellis_llm::{Client, Message, Request, ResponseSchema};

use crate::model_call::ModelCall;
use crate::routing_directive::json_objects;

pub struct ModelRouter {
    client: Arc<Client>,
    /// The model that judges (`router_model`); the workflow's model, or the configured default, when `None`.
    model: Option<String>,
}

impl ModelRouter {
    pub fn new(client: Arc<Client>, model: Option<String>) -> Self {
        Self { client, model }
    }
}

/// The answers the model may give: each option's id, and "none of the above" where there is a default.
fn choices(request: &RouteRequest<'_>) -> Vec<String> {
    let mut ids: Vec<String> = request.options.iter().map(|o| o.id.clone()).collect();
    if request.default.is_some() {
        ids.push(NONE_OF_THE_ABOVE.to_owned());
    }
    ids
}

/// The JSON Schema of an answer: an assessment first (so a constrained model reasons before it
/// chooses; properties are written in name order, and `assessment` sorts before `choice`), then one of
/// the live choices.
pub fn answer_schema(choices: &[String]) -> Value {
    json!({
        "type": "object",
        "properties": {
            "assessment": { "type": "string" },
            "choice": { "type": "string", "enum": choices },
        },
        "required": ["assessment", "choice"],
        "additionalProperties": false,
    })
}

fn prompt(request: &RouteRequest<'_>) -> String {
    // Choices first, then the data, then the question: a small model reads the data last, and
    // restates its key facts before it chooses (the `assessment` it writes first).
    let view = serde_json::to_string_pretty(request.view).unwrap_or_default();
    let mut text = format!(
        "A workflow must choose where to go after node `{}`. These are the choices, each with the \
         condition under which it is right:\n",
        request.node_id
    );
    for option in request.options {
        let _ = writeln!(text, "- `{}`: {}", option.id, option.when);
    }
    if let Some(default) = request.default {
        let _ = writeln!(
            text,
            "- `{NONE_OF_THE_ABOVE}`: none of the conditions above holds (the workflow goes on to `{default}`)"
        );
    }
    let choices = choices(request);
    let _ = write!(
        text,
        "\nHere is what the workflow knows (its input and the results of the nodes that ran):\n\
         ```json\n{view}\n```\n\n\
         Read the data above carefully. First restate the key facts in a few words, then pick the one \
         choice whose condition those facts match.\n\
         Answer with one JSON object: {{\"assessment\": \"<the key facts, in a few words>\", \
         \"choice\": \"<one of: {}>\"}}.",
        choices.join(", ")
    );
    text
}

/// Reads an answer: the last JSON object's `choice` (an id, or an option's number counting from 1, 0 for
/// none of the above), or the whole answer as an id. Returns the option index (`None` for none of the
/// above or no live choice), the answer as given, and the reason.
fn read_answer(text: &str, request: &RouteRequest<'_>) -> (Option<usize>, String, Option<String>) {
    let object = json_objects(text)
        .into_iter()
        .rev()
        .find(|o| o.get("choice").is_some());
    let reason = object
        .as_ref()
        .and_then(|o| o.get("assessment").or_else(|| o.get("reason")))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let given = match object.as_ref().and_then(|o| o.get("choice")) {
        Some(Value::String(s)) => s.trim().to_owned(),
        Some(other) => other.to_string(),
        None => text
            .trim()
            .trim_matches(['"', '`', '\'', '.'])
            .trim()
            .to_owned(),
    };
    let wanted = given.trim_matches(['"', '`', '\'']).to_ascii_lowercase();
    let by_id = request
        .options
        .iter()
        .position(|o| o.id.to_ascii_lowercase() == wanted);
    let by_number = wanted
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_sub(1))
        .filter(|&i| i < request.options.len());
    let answer: String = given.chars().take(200).collect();
    (by_id.or(by_number), answer, reason)
}

/// Writes the router's prompt or answer into the stage's directory.
async fn keep(dir: Option<&std::path::Path>, name: &str, text: &str) {
    if let Some(dir) = dir {
        let _ = crate::prompt::write_record_file(dir, name, text).await;
    }
}

#[async_trait]
impl Router for ModelRouter {
    async fn choose(
        &self,
        request: &RouteRequest<'_>,
        events: &dyn Emitter,
    ) -> Result<RouteChoice, String> {
        let mut call = ModelCall::new(
            &self.client,
            events,
            request.node_id,
            self.model.as_deref(),
            None,
        )
        .map_err(|outcome| outcome.failure_reason().unwrap_or_default().to_owned())?;
        let prompt = prompt(request);
        keep(request.record_dir, "router.prompt.md", &prompt).await;
        let ask = Request {
            messages: vec![Message::user(prompt)],
            max_tokens: Some(512),
            temperature: Some(0.0),
            response_schema: Some(ResponseSchema {
                name: "route".into(),
                schema: answer_schema(&choices(request)),
            }),
            ..Request::default()
        };
        let response = call
            .ask(&ask)
            .await
            .map_err(|outcome| outcome.failure_reason().unwrap_or_default().to_owned())?;
        keep(request.record_dir, "router.response.md", &response.text).await;
        let (choice, answer, reason) = read_answer(&response.text, request);
        Ok(RouteChoice {
            choice,
            answer,
            reason,
            model: Some(call.details()),
        })
    }
}

#[cfg(test)]
mod tests {
    use trellis_engine::services::RouteOption;

    use super::*;

    fn options() -> Vec<RouteOption> {
        vec![
            RouteOption {
                id: "deploy".into(),
                target: "deploy".into(),
                when: "the tests passed".into(),
            },
            RouteOption {
                id: "fix".into(),
                target: "fix".into(),
                when: "the tests failed".into(),
            },
        ]
    }

    fn request<'a>(options: &'a [RouteOption], view: &'a Value) -> RouteRequest<'a> {
        RouteRequest {
            node_id: "test",
            options,
            default: Some("report"),
            view,
            record_dir: None,
        }
    }

    #[test]
    fn answers_name_a_choice_by_id_or_number() {
        let (options, view) = (options(), json!({}));
        let request = request(&options, &view);
        let read = |text: &str| read_answer(text, &request);
        assert_eq!(
            read("{\"reason\": \"green\", \"choice\": \"deploy\"}"),
            (Some(0), "deploy".into(), Some("green".into()))
        );
        assert_eq!(read("I think {\"choice\": \"FIX\"}").0, Some(1));
        assert_eq!(read("{\"choice\": 2}").0, Some(1), "a number counts from 1");
        assert_eq!(read("1").0, Some(0), "a bare number is an answer");
        assert_eq!(read("`fix`").0, Some(1));
        assert_eq!(read("{\"choice\": \"none_of_the_above\"}").0, None);
        let (choice, answer, _) = read("{\"highest_severity\": \"low\", \"novel_count\": 0}");
        assert_eq!(choice, None, "an answer outside the choices names none");
        assert!(answer.contains("highest_severity"), "{answer}");
    }

    #[test]
    fn the_prompt_shows_the_view_and_the_choices_and_the_schema_allows_only_them() {
        let options = options();
        let view = json!({ "results": { "test": { "passed": false } } });
        let text = prompt(&request(&options, &view));
        assert!(text.contains("\"passed\": false"), "{text}");
        assert!(text.contains("- `deploy`: the tests passed\n- `fix`: the tests failed\n- `none_of_the_above`: none of the conditions above holds (the workflow goes on to `report`)"), "{text}");
        let schema = answer_schema(&choices(&request(&options, &view)));
        assert_eq!(
            schema["properties"]["choice"]["enum"],
            json!(["deploy", "fix", "none_of_the_above"])
        );
        let no_default = RouteRequest {
            default: None,
            ..request(&options, &view)
        };
        assert_eq!(choices(&no_default), ["deploy", "fix"]);
    }
}
