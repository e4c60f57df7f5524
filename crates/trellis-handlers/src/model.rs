//! Prompt and agent nodes. Model providers come with model support; until then a real run fails such a
//! node with a clear "no model configured" error, and a dry run answers
//! `[Simulated] Response for stage: <id>`, writing `prompt.md` and `response.md` as a real stage would.

use async_trait::async_trait;
use trellis_engine::{FailureClass, Handler, Outcome, Stage, keys};

pub struct ModelHandler;

/// How much of a response `last_response` keeps.
const LAST_RESPONSE_CHARS: usize = 200;

#[async_trait]
impl Handler for ModelHandler {
    async fn execute(&self, stage: &Stage<'_>) -> Outcome {
        let Some(llm) = stage.node.kind.llm() else {
            return Outcome::success();
        };
        if !stage.settings.dry_run {
            return Outcome::failed(
                FailureClass::Configuration,
                format!(
                    "no model configured: {} node `{}` needs a model provider; run with --dry-run to simulate models",
                    stage.node.kind.type_name(),
                    stage.node.id
                ),
            );
        }
        let response = format!("[Simulated] Response for stage: {}", stage.node.id);
        let _ = tokio::fs::write(stage.dir.join("prompt.md"), &llm.prompt).await;
        let _ = tokio::fs::write(stage.dir.join("response.md"), &response).await;
        Outcome::success()
            .with_update(keys::LAST_STAGE, stage.node.id.clone())
            .with_update(
                keys::LAST_RESPONSE,
                response
                    .chars()
                    .take(LAST_RESPONSE_CHARS)
                    .collect::<String>(),
            )
            .with_update(format!("response.{}", stage.node.id), response)
    }
}
