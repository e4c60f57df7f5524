//! An agent node's post-conditions, checked once its answer has passed its output schema: SWEny's
//! `verify` and its `eval` evaluators (`value` and `function` rules, and `judge`s: a model's verdict
//! on a rubric). Every evaluator's verdict is kept in the stage's `evals.json` and in the context
//! (`evals.<node>`, by evaluator name, which a later node sees as `<node>.evals`); judges' prompts
//! and answers beside it (`judge.<name>.prompt.md`, `.response.md`), their tokens in the stage's
//! usage. With `retry`, an answer that fails is sent back to the agent, in the same conversation,
//! with what failed.

use std::fmt::Write as _;

use serde_json::{Map, Value, json};
use trellis_engine::{ModelDetails, Outcome, Stage};
use trellis_llm::{Client, Message, Request, ResponseSchema, Usage};
use trellis_workflow::node_kind::LlmConfig;
use trellis_workflow::requires::{EvalCheck, Evaluator, RetryGuidance, ToolCall};

use crate::model_call::ModelCall;
use crate::prompt::write_stage_file;
use crate::routing_directive::json_objects;
use crate::skills;

/// The model client judges ask, and the tokens they used (which the stage's usage includes).
pub(crate) struct Judges<'a> {
    client: Option<&'a Client>,
    usage: parking_lot::Mutex<Usage>,
}

impl<'a> Judges<'a> {
    pub(crate) fn new(client: Option<&'a Client>) -> Self {
        Self {
            client,
            usage: parking_lot::Mutex::default(),
        }
    }

    /// What the judges asked so far used.
    pub(crate) fn usage(&self) -> Usage {
        *self.usage.lock()
    }
}

/// What the node's post-conditions say of an answer: `None` when they hold, else every failure (one
/// line each, under `verify failed:` and `eval failed (policy: all_pass):`). `outcome` is the
/// answer's (its structured output is the data checked, else the response `text`); it gets the
/// evaluators' verdicts.
pub(crate) async fn failures(
    stage: &Stage<'_>,
    llm: &LlmConfig,
    judges: &Judges<'_>,
    outcome: &mut Outcome,
    text: &str,
    calls: &[ToolCall],
) -> Option<String> {
    let checks = &llm.checks;
    if !checks.after_answer() {
        return None;
    }
    let data = outcome
        .context_updates
        .get(&trellis_engine::keys::output_of(&stage.node.id))
        .cloned()
        .unwrap_or_else(|| Value::String(text.to_owned()));
    let mut report = Vec::new();
    if let Some(verify) = &checks.verify
        && let Err(reasons) = verify.check(calls, &data, skills::is_call)
    {
        report.push(format!("verify failed:\n{reasons}"));
    }
    if !checks.evals.is_empty() {
        let mut verdicts = Map::new();
        let mut failed = String::new();
        for evaluator in &checks.evals {
            let (pass, reasoning, model) =
                evaluate(stage, llm, judges, evaluator, &data, calls).await;
            if !pass {
                let _ = write!(
                    failed,
                    "\n  - {} ({}): {}",
                    evaluator.name,
                    evaluator.kind(),
                    reasoning.replace('\n', "; ")
                );
            }
            let mut verdict =
                json!({ "kind": evaluator.kind(), "pass": pass, "reasoning": reasoning });
            if let Some(model) = model {
                // What the judge's model was and cost.
                verdict["model"] = json!(model);
            }
            verdicts.insert(evaluator.name.clone(), verdict);
        }
        let verdicts = Value::Object(verdicts);
        write_stage_file(
            stage,
            "evals.json",
            &serde_json::to_string_pretty(&verdicts).unwrap_or_default(),
        )
        .await;
        outcome
            .context_updates
            .insert(trellis_engine::keys::evals_of(&stage.node.id), verdicts);
        if !failed.is_empty() {
            report.push(format!("eval failed (policy: all_pass):{failed}"));
        }
    }
    (!report.is_empty()).then(|| report.join("\n"))
}

/// The message that sends the agent back after its answer failed the checks (`retry`).
pub(crate) fn retry_message(
    guidance: &RetryGuidance,
    failures: &str,
    attempt: u32,
    max: u32,
) -> String {
    let mut message = format!(
        "Your answer did not pass this step's checks (attempt {attempt} of {}):\n\n{failures}\n\n",
        max + 1
    );
    match guidance {
        RetryGuidance::Failures => {}
        RetryGuidance::Text(text) => {
            let _ = write!(message, "{}\n\n", text.trim());
        }
        RetryGuidance::Reflect(question) => {
            let _ = write!(
                message,
                "Before you go on, think this over and say briefly what you will do differently: {}\n\n",
                question.trim()
            );
        }
    }
    message.push_str(
        "Do what the checks ask for (call the tools they name, fix the output), then give your \
         whole answer again, in the same form as before.",
    );
    message
}

/// One evaluator's verdict, why, and the judge's model and usage (for a judge that was asked).
async fn evaluate(
    stage: &Stage<'_>,
    llm: &LlmConfig,
    judges: &Judges<'_>,
    evaluator: &Evaluator,
    data: &Value,
    calls: &[ToolCall],
) -> (bool, String, Option<ModelDetails>) {
    match &evaluator.check {
        EvalCheck::Rule { rule, .. } => match rule.check(calls, data, skills::is_call) {
            Ok(()) => (true, String::new(), None),
            Err(reasons) => (false, reasons, None),
        },
        EvalCheck::Judge {
            rubric,
            pass_when,
            model,
        } => {
            let Some(client) = judges.client else {
                return (
                    false,
                    "no model is configured to judge with (set a provider's API key, or a local model)"
                        .to_owned(),
                    None,
                );
            };
            let model = model.as_deref().or(llm.checks.judge_model.as_deref());
            let provider = model.is_none().then_some(llm.provider.as_deref()).flatten();
            let model = model.or(llm.model.as_deref());
            let mut call =
                match ModelCall::new(client, stage.emitter, &stage.node.id, model, provider) {
                    Ok(call) => call,
                    Err(outcome) => {
                        return (
                            false,
                            format!(
                                "the judge's model cannot be used: {}",
                                outcome.failure_reason().unwrap_or_default()
                            ),
                            None,
                        );
                    }
                };
            let prompt = judge_prompt(rubric, pass_when, data, calls);
            let file = crate::mcp::plain_name(&evaluator.name);
            write_stage_file(stage, &format!("judge.{file}.prompt.md"), &prompt).await;
            let request = Request {
                messages: vec![Message::user(prompt)],
                max_tokens: Some(512),
                temperature: Some(0.0),
                response_schema: Some(ResponseSchema {
                    name: "verdict".into(),
                    schema: json!({
                        "type": "object",
                        "properties": {
                            "reasoning": { "type": "string" },
                            "verdict": { "type": "string" },
                        },
                        "required": ["reasoning", "verdict"],
                        "additionalProperties": false,
                    }),
                }),
                ..Request::default()
            };
            // A judge whose answer cannot be read (or that failed) is asked once more.
            let mut answers = String::new();
            for _ in 0..2 {
                let Ok(response) = call.ask(&request).await else {
                    continue;
                };
                let _ = write!(answers, "{}\n\n", response.text);
                if let Some((verdict, reasoning)) = read_verdict(&response.text) {
                    write_stage_file(stage, &format!("judge.{file}.response.md"), &answers).await;
                    let pass = verdict == *pass_when;
                    let reasoning = if pass {
                        reasoning
                    } else {
                        format!("the judge said `{verdict}`, not `{pass_when}`: {reasoning}")
                    };
                    judges.usage.lock().add(call.usage);
                    return (pass, reasoning, Some(call.details()));
                }
            }
            write_stage_file(stage, &format!("judge.{file}.response.md"), &answers).await;
            judges.usage.lock().add(call.usage);
            (
                false,
                "judge parse failure: no verdict in two answers".to_owned(),
                Some(call.details()),
            )
        }
    }
}

fn judge_prompt(rubric: &str, pass_when: &str, data: &Value, calls: &[ToolCall]) -> String {
    let data = match data {
        Value::String(text) => text.clone(),
        other => format!(
            "```json\n{}\n```",
            serde_json::to_string_pretty(other).unwrap_or_default()
        ),
    };
    let mut trace = String::new();
    for call in calls {
        let _ = writeln!(
            trace,
            "- {} ({})",
            call.tool,
            if call.succeeded { "answered" } else { "failed" }
        );
    }
    if trace.is_empty() {
        trace.push_str("(none)\n");
    }
    format!(
        "You judge whether one step of a workflow met its rubric.\n\n## Rubric\n\n{}\n\n\
         ## The step's result\n\n{data}\n\n## The tools it called, in order\n\n{trace}\n\
         Answer with one JSON object: {{\"reasoning\": \"<one or two sentences>\", \
         \"verdict\": \"<one word>\"}}. The verdict is `{pass_when}` when the rubric is met, and \
         another word (such as `no`) when it is not.",
        rubric.trim()
    )
}

/// The verdict (one word, lower case) and reasoning of a judge's answer: its last JSON object's,
/// else a bare word.
fn read_verdict(text: &str) -> Option<(String, String)> {
    let word = |s: &str| {
        let s = s
            .trim()
            .trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase();
        (!s.is_empty() && !s.contains(char::is_whitespace)).then_some(s)
    };
    if let Some(object) = json_objects(text)
        .into_iter()
        .rev()
        .find(|o| o.contains_key("verdict"))
    {
        let verdict = object
            .get("verdict")
            .and_then(Value::as_str)
            .and_then(word)?;
        let reasoning = object
            .get("reasoning")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        return Some((verdict, reasoning));
    }
    word(text).map(|verdict| (verdict, String::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_judges_verdict_is_its_json_or_one_word() {
        assert_eq!(
            read_verdict(
                "Thinking...\n{\"reasoning\": \"Tests were added.\", \"verdict\": \"Yes\"}"
            ),
            Some(("yes".to_owned(), "Tests were added.".to_owned()))
        );
        assert_eq!(
            read_verdict("  no. "),
            Some(("no".to_owned(), String::new()))
        );
        assert_eq!(read_verdict("I am not sure about this"), None);
        assert_eq!(read_verdict("{\"verdict\": \"\"}"), None);
    }

    #[test]
    fn the_retry_message_says_what_failed_and_what_the_author_asked() {
        let text = retry_message(
            &RetryGuidance::Reflect("Which tool did you skip?".into()),
            "eval failed (policy: all_pass):\n  - searched (function): ...",
            1,
            2,
        );
        assert!(text.starts_with("Your answer did not pass this step's checks (attempt 1 of 3):"));
        assert!(text.contains("  - searched (function): ..."));
        assert!(text.contains(
            "think this over and say briefly what you will do differently: Which tool did you skip?"
        ));
        assert_eq!(
            crate::mcp::plain_name("tests present/ok"),
            "tests_present_ok"
        );
    }
}
