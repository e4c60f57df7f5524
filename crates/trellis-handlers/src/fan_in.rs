//! Fan-in with a prompt: a model reads every branch's result and picks the best one. Without a prompt
//! (or in a dry run) the engine's own fan-in picks by status, score and id.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use trellis_engine::text::clip;
use trellis_engine::{
    Attempt, BranchResult, FailureClass, Handler, Outcome, Stage, join_verdict, keys,
};
use trellis_llm::{Client, Message, Request};
use trellis_workflow::StageStatus;

use crate::model_call::{ModelCall, Parsed};
use crate::prompt::{project_memory, response_updates, write_stage_file};
use crate::routing_directive::json_objects;

pub struct ModelFanIn {
    client: Option<Arc<Client>>,
}

impl ModelFanIn {
    pub fn new(client: Option<Arc<Client>>) -> Self {
        Self { client }
    }
}

/// The branch ids and statuses.
fn branches(results: &[BranchResult]) -> Vec<(String, String)> {
    results
        .iter()
        .map(|r| (r.id.clone(), r.status.as_str().to_owned()))
        .collect()
}

fn prompt(own: &str, results: &[BranchResult]) -> String {
    let mut text = format!("{own}\n\n## Branch results\n");
    for result in results {
        let _ = write!(text, "\n### {} ({})\n", result.id, result.status);
        if let Some(reason) = result.failure_reason.as_deref().filter(|r| !r.is_empty()) {
            let _ = writeln!(text, "Failure: {}", clip(reason, 500));
        }
        // The branch's output (a response or a command's output, already cut to size), else the
        // short last response.
        let last_response = result.last_response.as_ref().and_then(Value::as_str);
        let output = [result.output.as_deref(), last_response]
            .into_iter()
            .flatten()
            .find(|o| !o.trim().is_empty());
        match output {
            Some(output) => {
                let _ = writeln!(text, "Output:\n{}", output.trim_end());
            }
            None => text.push_str("(no output)\n"),
        }
    }
    let ids: Vec<String> = branches(results)
        .into_iter()
        .map(|(id, _)| format!("\"{id}\""))
        .collect();
    let _ = write!(
        text,
        "\nPick the best branch. End your answer with a JSON object {{\"best_id\": <one of {}>, \"reason\": \"<why>\"}}.",
        ids.join(", ")
    );
    text
}

/// The branch the answer picks, or what is wrong with the answer.
fn choice(text: &str, branches: &[(String, String)]) -> Result<(String, String), String> {
    let Some(id) = json_objects(text)
        .into_iter()
        .rev()
        .find_map(|o| o.get("best_id").and_then(Value::as_str).map(str::to_owned))
    else {
        return Err("the answer has no JSON object with a `best_id` field".into());
    };
    branches
        .iter()
        .find(|(b, _)| *b == id)
        .cloned()
        .ok_or_else(|| {
            let ids: Vec<&str> = branches.iter().map(|(b, _)| b.as_str()).collect();
            format!(
                "`best_id` is \"{id}\", which is not a branch (the branches are {})",
                ids.join(", ")
            )
        })
}

impl ModelFanIn {
    /// The merge: a model's choice when the fan-in has a prompt, else the engine's.
    async fn outcome(&self, stage: &Stage<'_>) -> Outcome {
        let (Some(llm), Some(client), false) = (
            stage.node.kind.llm(),
            &self.client,
            stage.settings.models_simulated(),
        ) else {
            return trellis_engine::FanIn::merge(stage);
        };
        let verdict = join_verdict(stage);
        // An unmet join policy fails the fan-in with the join's reason: there is nothing to choose.
        if let Some(failed) = verdict.clone().filter(|v| v.status == StageStatus::Failed) {
            return failed;
        }
        let results = BranchResult::read_all(stage.context, &*stage.services.blobs);
        let branches = branches(&results);
        if branches.is_empty() {
            return Outcome::failed(
                FailureClass::StageFailed,
                format!("fan-in `{}` found no branch results", stage.node.id),
            );
        }
        let mut call = match ModelCall::for_stage(client, stage) {
            Ok(call) => call,
            Err(outcome) => return *outcome,
        };
        let text = prompt(&llm.prompt, &results);
        write_stage_file(stage, "prompt.md", &text).await;
        let mut request = Request {
            system: if llm.project_memory {
                project_memory(stage).await
            } else {
                None
            },
            messages: vec![Message::user(text)],
            max_tokens: llm.max_tokens,
            ..Request::default()
        };
        let answer = call
            .ask_until(
                &mut request,
                llm.output_retries,
                |text| match choice(text, &branches) {
                    Ok(chosen) => Parsed::Valid(chosen),
                    Err(problem) => Parsed::Invalid(problem),
                },
                |problem| {
                    format!("{problem}. Reply again, ending with {{\"best_id\": \"<branch id>\"}}.")
                },
            )
            .await;
        let (response, (best_id, best_status), repairs) = match answer {
            Ok(shaped) => (shaped.response, shaped.value, shaped.repairs),
            Err(unshaped) => {
                let (outcome, last) =
                    call.unshaped_outcome(unshaped, "the model did not pick a branch");
                if let Some((response, log)) = last {
                    write_stage_file(stage, "response.md", &response.text).await;
                    write_stage_file(stage, "repairs.md", &log).await;
                }
                return outcome;
            }
        };
        write_stage_file(stage, "response.md", &response.text).await;
        // The fan-in reports the join's verdict; the model only chooses which branch is best.
        let mut outcome =
            verdict.unwrap_or_else(
                || match best_status.parse().unwrap_or(StageStatus::Failed) {
                    StageStatus::Failed => Outcome::failed(
                        FailureClass::StageFailed,
                        format!("the chosen branch `{best_id}` failed"),
                    ),
                    status => Outcome::new(status),
                },
            );
        response_updates(&mut outcome, &stage.node.id, &response.text);
        outcome
            .context_updates
            .insert(keys::FAN_IN_BEST_ID.into(), json!(best_id));
        outcome
            .context_updates
            .insert(keys::FAN_IN_BEST_OUTCOME.into(), json!(best_status));
        call.describe(&mut outcome);
        outcome.details.repairs = Some(repairs);
        outcome
    }
}

#[async_trait]
impl Handler for ModelFanIn {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        self.outcome(stage).await.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_choice_must_name_a_branch() {
        let branches = vec![
            ("a".to_owned(), "succeeded".to_owned()),
            ("b".to_owned(), "failed".to_owned()),
        ];
        assert_eq!(
            choice("B looks weaker. {\"best_id\": \"a\"}", &branches),
            Ok(branches[0].clone())
        );
        assert!(
            choice("{\"best_id\": \"c\"}", &branches)
                .unwrap_err()
                .contains("not a branch")
        );
        assert!(choice("a is best", &branches).is_err());
    }
}
