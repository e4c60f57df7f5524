//! The handler seam: every node kind is executed by a [`Handler`] looked up by its type name. The
//! engine owns the control-flow handlers (start, exit, conditional); `trellis-handlers` provides the
//! rest.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use trellis_workflow::node_kind::{Fidelity, HandlerKind};
use trellis_workflow::{Node, Workflow};

use crate::context::RunContext;
use crate::outcome::Outcome;
use crate::services::{BlobStore, Clock, Interviewer, Router, RunStore, Subscribers};
use crate::settings::Settings;

/// Everything a handler may use while executing one stage attempt.
pub struct Stage<'a> {
    pub workflow: &'a Workflow,
    pub node: &'a Node,
    pub context: &'a RunContext,
    /// This attempt's directory in the run record (`stages/001-plan@1`).
    pub dir: &'a Path,
    pub run_id: &'a str,
    pub visit: u32,
    pub attempt: u32,
    /// The previous stage's outcome (conditional nodes pass it through).
    pub previous: Option<&'a Outcome>,
    /// How a model stage continues the run's conversation (the default for other stages).
    pub conversation: &'a Conversation,
    /// The stage attempts finished before this one (for preambles); read only by handlers that need it.
    pub history: &'a dyn History,
    pub services: &'a Services,
    pub settings: &'a Settings,
    /// Emits events into the run's stream, numbered with the engine's sequence.
    pub emitter: &'a dyn Emitter,
    /// Cancelled when this attempt ends, however it ends (done, timed out, its branch no longer
    /// needed, the run stopped): work a handler hands to another thread or task watches it and
    /// stops, where dropping the attempt's future cannot reach.
    pub cancel: &'a tokio_util::sync::CancellationToken,
    /// The run's pacer, when this stage is on the paced main track (see [`crate::services::Pacer`]).
    pub pacer: Option<&'a dyn crate::services::Pacer>,
}

/// A model stage's fidelity and conversation thread, resolved by the engine from the edge it came
/// in by, the node and the graph (also mirrored into the context as `internal.fidelity` and
/// `internal.thread_id` for conditions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Conversation {
    pub fidelity: Fidelity,
    pub thread: Option<String>,
}

/// The run's finished stage attempts, in order.
#[async_trait::async_trait]
pub trait History: Send + Sync {
    /// The finished stage attempts, read from the run record (the engine does not keep them).
    async fn finished(&self) -> Vec<crate::checkpoint::StageRecord>;
}

pub use crate::event::Emitter;

/// The services of a run.
#[derive(Clone)]
pub struct Services {
    pub store: Arc<dyn RunStore>,
    pub blobs: Arc<dyn BlobStore>,
    pub events: Subscribers,
    pub clock: Arc<dyn Clock>,
    pub interviewer: Arc<dyn Interviewer>,
    pub router: Option<Arc<dyn Router>>,
    /// The run's lifecycle hooks (a run file's), if it has any.
    pub hooks: Option<Arc<dyn crate::hooks::Hooks>>,
    /// What paces the main track's stages, if anything does.
    pub pacer: Option<Arc<dyn crate::services::Pacer>>,
}

/// What one attempt at a stage came to.
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "returned once per stage attempt and matched at once; a box would only add an allocation"
)]
pub enum Attempt {
    /// The stage ran and has an outcome to route on.
    Finished(Outcome),
    /// The stage needs an answer nobody can give now (a human gate in a non-interactive run): the run
    /// stops as waiting for input, resumable with an answer.
    WaitingForInput,
    /// The stage handed its time to the run's pacer ([`Stage::pacer`]): the run parks, and the
    /// stage runs again when the run goes on.
    Parked,
}

impl From<Outcome> for Attempt {
    fn from(outcome: Outcome) -> Self {
        Attempt::Finished(outcome)
    }
}

#[async_trait]
pub trait Handler: Send + Sync {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt;
}

/// Handlers by node kind. Kinds the engine runs itself (fan-out, sub-workflow) have none; see
/// [`KINDS`](trellis_workflow::node_kind::KINDS).
#[derive(Clone, Default)]
pub struct Handlers {
    map: HashMap<HandlerKind, Arc<dyn Handler>>,
}

impl Handlers {
    pub fn register(&mut self, kind: HandlerKind, handler: Arc<dyn Handler>) {
        self.map.insert(kind, handler);
    }

    pub fn get(&self, kind: HandlerKind) -> Option<&Arc<dyn Handler>> {
        self.map.get(&kind)
    }

    /// Whether nodes of `kind` can run: a handler is registered, or the engine runs them itself.
    pub fn runs(&self, kind: HandlerKind) -> bool {
        kind.spec().engine_runs || self.map.contains_key(&kind)
    }
}
