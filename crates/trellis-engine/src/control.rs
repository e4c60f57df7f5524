//! Control-flow handlers: start and exit succeed at once; a conditional node passes the previous
//! stage's outcome and preferred label through, so its edges test what came before it.

use async_trait::async_trait;
use trellis_workflow::StageStatus;

use crate::handler::{Handler, Stage};
use crate::outcome::Outcome;

pub struct Start;

#[async_trait]
impl Handler for Start {
    async fn execute(&self, _stage: &Stage<'_>) -> Outcome {
        Outcome::success()
    }
}

pub struct Conditional;

#[async_trait]
impl Handler for Conditional {
    async fn execute(&self, stage: &Stage<'_>) -> Outcome {
        let mut outcome = Outcome::new(stage.previous.map_or(StageStatus::Succeeded, |p| p.status));
        if let Some(previous) = stage.previous {
            outcome
                .preferred_label
                .clone_from(&previous.preferred_label);
            // The failure is reported again, but it is not this node's to retry.
            outcome.failure = previous.failure.clone().map(|f| crate::outcome::Failure {
                class: crate::outcome::FailureClass::StageFailed,
                ..f
            });
        }
        outcome
    }
}
