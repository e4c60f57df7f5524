//! Control-flow handlers: start and exit succeed at once; a conditional node passes the previous
//! stage's outcome and preferred label through, so its edges test what came before it.

use async_trait::async_trait;
use trellis_workflow::StageStatus;

use crate::handler::{Handler, Stage};
use crate::outcome::Outcome;

/// Start and exit nodes: they mark the ends of the run and succeed at once.
pub struct Boundary;

#[async_trait]
impl Handler for Boundary {
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

/// Fan-in: picks the best branch from `parallel.results` (status rank, then score, then id) and
/// records it as `parallel.fan_in.best_id` / `best_outcome`; the fan-in's outcome is the best branch's.
/// A fan-in with a prompt asks a model to choose instead (`trellis-handlers` registers that one).
pub struct FanIn;

#[async_trait]
impl Handler for FanIn {
    async fn execute(&self, stage: &Stage<'_>) -> Outcome {
        let results = stage
            .context
            .get(crate::keys::PARALLEL_RESULTS)
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        let Some((best_id, best_outcome)) = crate::parallel::best_branch(&results) else {
            return Outcome::failed(
                crate::outcome::FailureClass::StageFailed,
                format!("fan-in `{}` found no branch results", stage.node.id),
            );
        };
        let status: StageStatus = best_outcome.parse().unwrap_or(StageStatus::Failed);
        let mut outcome = if status == StageStatus::Failed {
            Outcome::failed(
                crate::outcome::FailureClass::StageFailed,
                "no branch succeeded",
            )
        } else {
            Outcome::new(status)
        };
        outcome
            .context_updates
            .insert(crate::keys::FAN_IN_BEST_ID.into(), best_id.into());
        outcome
            .context_updates
            .insert(crate::keys::FAN_IN_BEST_OUTCOME.into(), best_outcome.into());
        outcome
    }
}
