//! Control-flow handlers: start and exit succeed at once; a conditional node passes the previous
//! stage's outcome and preferred label through, so its edges test what came before it.

use async_trait::async_trait;
use trellis_workflow::StageStatus;

use crate::checkpoint::BranchResult;
use std::sync::Arc;

use trellis_workflow::node_kind::HandlerKind;

use crate::handler::{Attempt, Handler, Handlers, Stage};
use crate::outcome::{FailureClass, Outcome};

/// Start and exit nodes: they mark the ends of the run and succeed at once.
pub struct Boundary;

#[async_trait]
impl Handler for Boundary {
    async fn execute(&self, _stage: &Stage<'_>) -> Attempt {
        Outcome::success().into()
    }
}

pub struct Conditional;

#[async_trait]
impl Handler for Conditional {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        let mut outcome = Outcome::new(stage.previous.map_or(StageStatus::Succeeded, |p| p.status));
        if let Some(previous) = stage.previous {
            outcome
                .preferred_label
                .clone_from(&previous.preferred_label);
            // The failure is reported again, but it is not this node's to retry.
            outcome.failure = previous.failure.clone().map(|f| crate::outcome::Failure {
                class: FailureClass::StageFailed,
                ..f
            });
        }
        outcome.into()
    }
}

/// The join's verdict a fan-in reports: the status of the fan-out it merges (the previous stage, whose
/// outcome carries `parallel.results`), with the fan-out's failure reason when the join policy was not
/// met. `None` when the fan-in was reached some other way.
pub fn join_verdict(stage: &Stage<'_>) -> Option<Outcome> {
    let fan_out = stage.previous.filter(|o| {
        o.context_updates
            .contains_key(crate::keys::PARALLEL_RESULTS)
    })?;
    let mut verdict = Outcome::new(fan_out.status);
    verdict.failure.clone_from(&fan_out.failure);
    Some(verdict)
}

/// Fan-in: picks the best branch from `parallel.results` (status rank, then score, then id) and
/// records it as `parallel.fan_in.best_id` / `best_outcome`. Its outcome is the join's verdict, so an
/// unmet join policy fails the fan-in and a partial join lets `outcome=partial_success` edges match.
/// A fan-in with a prompt asks a model to choose instead (`trellis-handlers` registers that one).
pub struct FanIn;

#[async_trait]
impl Handler for FanIn {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        FanIn::merge(stage).into()
    }
}

impl FanIn {
    /// The merge without a model: the best branch by status, score and id, and the join's verdict.
    pub fn merge(stage: &Stage<'_>) -> Outcome {
        let results = BranchResult::read_all(stage.context, &*stage.services.blobs);
        let Some(best) = crate::join::best_branch(&results) else {
            return join_verdict(stage)
                .filter(|v| v.status == StageStatus::Failed)
                .unwrap_or_else(|| {
                    Outcome::failed(
                        FailureClass::StageFailed,
                        format!("fan-in `{}` found no branch results", stage.node.id),
                    )
                });
        };
        let mut outcome = join_verdict(stage).unwrap_or_else(|| match best.status {
            StageStatus::Failed => {
                Outcome::failed(FailureClass::StageFailed, "no branch succeeded")
            }
            status => Outcome::new(status),
        });
        outcome
            .context_updates
            .insert(crate::keys::FAN_IN_BEST_ID.into(), best.id.clone().into());
        outcome.context_updates.insert(
            crate::keys::FAN_IN_BEST_OUTCOME.into(),
            best.status.as_str().into(),
        );
        outcome
    }
}

impl Handlers {
    /// The control-flow handlers the engine owns.
    pub fn with_control_flow() -> Self {
        let mut handlers = Self::default();
        handlers.register(HandlerKind::Start, Arc::new(Boundary));
        handlers.register(HandlerKind::Exit, Arc::new(Boundary));
        handlers.register(HandlerKind::Conditional, Arc::new(Conditional));
        handlers.register(HandlerKind::FanIn, Arc::new(FanIn));
        handlers
    }
}
