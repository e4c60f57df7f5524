//! Sub-workflow nodes (`house`): run a child workflow file as one stage. The child starts from a copy of
//! the parent's context ("context in"); the keys it changes come back as the stage's context updates
//! ("changes out"). Its record lives in the stage directory's `child/`, and its events join the parent's
//! stream under the run id `<parent>/<node>`. A pacer of the parent's main track may pace the child's
//! ([`Pacer::sub_workflow`]).

use std::path::Path;
use std::sync::Arc;

use trellis_workflow::CompileOptions;

use tokio_util::sync::CancellationToken;

use crate::checkpoint::RunStatus;
use crate::context::RunContext;
use crate::engine::{Engine, EngineError, blocking};
use crate::handler::Services;
use crate::keys;
use crate::outcome::{FailureClass, Outcome};
use crate::services::Pacer;

/// How deep sub-workflows may nest (a workflow that includes itself stops here, once: the error ends
/// the whole run rather than failing each level's stage in turn).
pub const MAX_DEPTH: u32 = 8;

impl Engine {
    /// Runs one attempt at a sub-workflow node (the attempt path, `attempt`, makes its stage):
    /// the child workflow at `path`, recorded in `dir`, stopped when `cancel` (the attempt's token)
    /// is.
    pub(crate) async fn run_child(
        &self,
        dir: &Path,
        path: &Path,
        context: &RunContext,
        node_id: &str,
        cancel: &CancellationToken,
        pacer: Option<&dyn Pacer>,
    ) -> Result<Outcome, EngineError> {
        if self.depth >= MAX_DEPTH {
            return Err(EngineError::NestingTooDeep {
                node: node_id.to_owned(),
                workflow: path.display().to_string(),
                limit: MAX_DEPTH,
            });
        }
        let options = CompileOptions {
            goal: self.workflow.graph.goal.clone(),
            base_dir: None,
            allowed_dirs: self.settings.allowed_dirs.clone(),
            inputs: self.settings.inputs.clone(),
            model: self.settings.model.clone(),
            attribute_texts: false,
        };
        let child_path = path.to_path_buf();
        let (file, compiled) =
            match blocking(move || trellis_workflow::load(&child_path, &options)).await {
                Ok(loaded) => loaded,
                Err(error) => {
                    return Ok(Outcome::failed(
                        FailureClass::Configuration,
                        format!("cannot load the child workflow: {error}"),
                    ));
                }
            };
        let Some(child) = compiled.workflow else {
            let first = compiled.diagnostics.iter().find(|d| d.is_error());
            let detail = first.map_or_else(String::new, |d| {
                let (line, column) = file.line_col(d.primary.span.start);
                format!(": {}:{line}:{column}: {}", file.name(), d.message)
            });
            return Ok(Outcome::failed(
                FailureClass::Configuration,
                format!("the child workflow is not valid{detail}"),
            ));
        };
        // The child's main track is paced only by the pacer this stage's gives it, while it runs.
        let (pacer, _paced) = pacer.and_then(|pacer| pacer.sub_workflow(node_id)).unzip();
        let services = Services {
            store: self.services.store.child(dir)?,
            pacer,
            ..self.services.clone()
        };
        let child_id = format!("{}/{node_id}", self.run_id);
        let mut engine = Engine::new(
            Arc::new(child),
            self.handlers.clone(),
            services,
            self.settings.clone(),
            child_id.clone(),
        );
        engine.seq = self.seq.clone();
        engine.spent = self.spent.clone();
        engine.depth = self.depth + 1;
        let parent = context.snapshot();
        let inherited = parent
            .iter()
            .filter(|(k, _)| !keys::is_engine_key(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let Some(checkpoint) = engine.first_checkpoint(inherited) else {
            return Ok(Outcome::failed(
                FailureClass::Configuration,
                "the child workflow has no start node",
            ));
        };
        // The child run stops with this attempt: the parent cancelled, or the attempt timed out.
        let result = Box::pin(engine.run(checkpoint, cancel)).await;
        // A runaway (too deep, out of steps) stops the whole run with the child's own error.
        if let Some(error @ (EngineError::NestingTooDeep { .. } | EngineError::StepBudget { .. })) =
            result.error
        {
            return Err(error);
        }
        let mut outcome = match result.status {
            RunStatus::Succeeded => Outcome::success(),
            RunStatus::WaitingForInput => Outcome::failed(
                FailureClass::Configuration,
                format!(
                    "the child workflow of `{node_id}` stopped at a human gate; give its answers up front (--answers or --auto-approve)"
                ),
            ),
            _ => Outcome::failed(
                FailureClass::StageFailed,
                format!(
                    "the child workflow failed: {}",
                    result
                        .error
                        .map_or_else(|| "unknown error".to_owned(), |e| e.to_string())
                ),
            ),
        };
        for (key, value) in &result.checkpoint.track.context {
            if !keys::is_engine_key(key) && parent.get(key) != Some(value) {
                outcome.context_updates.insert(key.clone(), value.clone());
            }
        }
        Ok(outcome)
    }
}
