//! Human gates: the options are the gate's outgoing edge labels (accelerators like `[A] Approve` give
//! the key); an edge with `freeform=true` takes free text. The interviewer answers; on `timeout` the
//! gate takes `human.default_choice` (at once in a dry run, which never waits); when nobody can answer (a non-interactive run) the run stops as
//! waiting for input, resumable with an answer. The choice becomes the preferred label that routing
//! follows, and `human.gate.selected`, `human.gate.label`, `human.gate.text` in the context.

use std::collections::HashMap;

use async_trait::async_trait;
use trellis_engine::event::EventKind;
use trellis_engine::services::{Answer, Choice, Question};
use trellis_engine::{Attempt, FailureClass, Handler, Outcome, Stage, keys};
use trellis_workflow::label::{accelerator, normalize_label};
use trellis_workflow::{NodeKind, Workflow};

pub struct HumanHandler;

/// The option an answer names: its accelerator key, or its label (accelerators and case ignored).
pub fn match_choice(answer: &str, choices: &[Choice]) -> Option<usize> {
    let answer = answer.trim();
    let mut chars = answer.chars();
    if let (Some(key), None) = (chars.next(), chars.next())
        && let Some(i) = choices
            .iter()
            .position(|c| c.key == Some(key.to_ascii_uppercase()))
    {
        return Some(i);
    }
    let wanted = normalize_label(answer);
    choices
        .iter()
        .position(|c| normalize_label(&c.label) == wanted)
}

/// The options of the gate at `index` (its outgoing edges' labels), and the label of its freeform edge.
pub fn choices_of(workflow: &Workflow, index: usize) -> (Vec<Choice>, Option<String>) {
    let mut choices = Vec::new();
    let mut freeform = None;
    for edge in workflow.outgoing(index) {
        let label = edge
            .label
            .clone()
            .unwrap_or_else(|| workflow.nodes[edge.to].id.clone());
        if edge.freeform {
            freeform = Some(label);
        } else {
            choices.push(Choice {
                key: accelerator(&label),
                label,
            });
        }
    }
    (choices, freeform)
}

/// What is wrong with answers given up front (`--answers`) for the gates of `workflow`: an answer to
/// a gate without a freeform edge must name one of its options. Gates the workflow does not have
/// (a sub-workflow's) are checked when they are asked.
pub fn check_answers<S: std::hash::BuildHasher>(
    workflow: &Workflow,
    answers: &HashMap<String, String, S>,
) -> Vec<String> {
    let mut problems: Vec<String> = answers
        .iter()
        .filter_map(|(gate, answer)| {
            let index = workflow.node_index(gate)?;
            if !matches!(workflow.nodes[index].kind, NodeKind::Human(_)) {
                return None;
            }
            let (choices, freeform) = choices_of(workflow, index);
            (freeform.is_none() && match_choice(answer, &choices).is_none())
                .then(|| not_a_choice(gate, answer, &choices))
        })
        .collect();
    problems.sort();
    problems
}

/// The message for an answer that names none of a gate's options.
fn not_a_choice(gate: &str, answer: &str, choices: &[Choice]) -> String {
    let options: Vec<&str> = choices.iter().map(|c| c.label.as_str()).collect();
    format!(
        "the answer `{answer}` for gate `{gate}` is not one of its options: {} (give a label or its key)",
        options.join(", ")
    )
}

/// The question a gate asks, and the label of its freeform edge.
pub fn question_for(stage: &Stage<'_>) -> (Question, Option<String>) {
    let index = stage
        .workflow
        .node_index(&stage.node.id)
        .unwrap_or_default();
    let (choices, freeform) = choices_of(stage.workflow, index);
    let question = Question {
        node_id: stage.node.id.clone(),
        prompt: stage.node.label().to_owned(),
        choices,
        freeform: freeform.is_some(),
        timeout: stage.node.common.timeout,
    };
    (question, freeform)
}

#[async_trait]
impl Handler for HumanHandler {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        let (mut question, freeform_label) = question_for(stage);
        // A dry run skips waits: a gate's timeout is spent at once (its default is taken).
        if stage.settings.dry_run() && question.timeout.is_some() {
            question.timeout = Some(std::time::Duration::ZERO);
        }
        let default_choice = match &stage.node.kind {
            NodeKind::Human(config) => config.default_choice.clone(),
            _ => None,
        };
        let labels: Vec<&str> = question.choices.iter().map(|c| c.label.as_str()).collect();
        stage.emitter.emit(
            Some(&stage.node.id),
            EventKind::HumanGateAsked {
                prompt: question.prompt.clone(),
                options: labels.iter().map(|&l| l.to_owned()).collect(),
                freeform: question.freeform,
            },
        );
        let answer = stage.services.interviewer.ask(&question).await;
        let timed_out = answer == Answer::TimedOut;
        let answer = match answer {
            Answer::TimedOut => match default_choice
                .as_deref()
                .and_then(|d| match_choice(d, &question.choices))
            {
                Some(choice) => Answer::Choice(choice),
                None => {
                    return Outcome::failed(
                        FailureClass::StageFailed,
                        format!(
                            "no answer to `{}` before its timeout, and no usable human.default_choice",
                            stage.node.id
                        ),
                    )
                    .into();
                }
            },
            other => other,
        };
        let answered = |label: &str, text: Option<&str>| {
            stage.emitter.emit(
                Some(&stage.node.id),
                EventKind::HumanGateAnswered {
                    label: label.to_owned(),
                    text: text.map(str::to_owned),
                    default_after_timeout: timed_out,
                },
            );
        };
        let outcome = match answer {
            Answer::Choice(i) if i < question.choices.len() => {
                answered(&question.choices[i].label, None);
                let choice = &question.choices[i];
                let selected = choice
                    .key
                    .map_or_else(|| choice.label.clone(), String::from);
                let mut outcome = Outcome::success()
                    .with_update(keys::HUMAN_SELECTED, selected)
                    .with_update(keys::HUMAN_LABEL, choice.label.clone());
                outcome.preferred_label = Some(choice.label.clone());
                outcome
            }
            Answer::Freeform(text) if freeform_label.is_some() => {
                let label = freeform_label.unwrap_or_default();
                answered(&label, Some(&text));
                let mut outcome = Outcome::success()
                    .with_update(keys::HUMAN_SELECTED, "freeform")
                    .with_update(keys::HUMAN_LABEL, label.clone())
                    .with_update(keys::HUMAN_TEXT, text);
                outcome.preferred_label = Some(label);
                outcome
            }
            // An answer given up front that fits no option is the user's mistake to correct, not
            // an outcome to route on: the run stops there, resumable with a right answer.
            Answer::Freeform(text) => Outcome::failed(
                FailureClass::Configuration,
                not_a_choice(&stage.node.id, &text, &question.choices),
            ),
            Answer::Unavailable | Answer::TimedOut | Answer::Choice(_) => {
                return Attempt::WaitingForInput;
            }
        };
        outcome.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_match_keys_and_labels() {
        let choices = vec![
            Choice {
                label: "[A] Approve".into(),
                key: Some('A'),
            },
            Choice {
                label: "[R] Revise".into(),
                key: Some('R'),
            },
            Choice {
                label: "Skip".into(),
                key: None,
            },
        ];
        assert_eq!(match_choice("a", &choices), Some(0));
        assert_eq!(match_choice("R", &choices), Some(1));
        assert_eq!(match_choice("revise", &choices), Some(1));
        assert_eq!(match_choice(" skip ", &choices), Some(2));
        assert_eq!(match_choice("[A] Approve", &choices), Some(0));
        assert_eq!(match_choice("maybe", &choices), None);
    }
}
