//! Wait nodes pause for their `duration` (not in a dry run).

use async_trait::async_trait;
use trellis_engine::{Attempt, Handler, Outcome, Stage};
use trellis_workflow::NodeKind;

pub struct WaitHandler;

impl WaitHandler {
    /// Pauses for the node's duration.
    async fn outcome(&self, stage: &Stage<'_>) -> Outcome {
        if let NodeKind::Wait(config) = &stage.node.kind
            && !stage.settings.dry_run()
        {
            tokio::time::sleep(config.duration).await;
        }
        Outcome::success()
    }
}

#[async_trait]
impl Handler for WaitHandler {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        self.outcome(stage).await.into()
    }
}
