//! `trellis-engine` executes a compiled [`Workflow`](trellis_workflow::Workflow): the run loop, edge
//! selection, the run context, outcomes, retries, goal gates, visit limits, checkpoints and events. It
//! sees the outside world only through the traits in [`services`] and [`handler`]; it never touches a
//! process, an HTTP client or the file layout of the run record.

mod attempt;
pub mod checkpoint;
pub mod context;
mod control;
pub mod details;
pub mod engine;
pub mod event;
pub mod handler;
pub mod keys;
pub mod outcome;
pub mod parallel;
pub mod route_view;
pub mod routing;
pub mod services;
pub mod settings;
pub mod status_file;
mod step;
mod sub_workflow;
pub mod text;

pub use attempt::retry_delay;
pub use checkpoint::{BranchResult, Checkpoint, RunStatus, StageRecord, Track};
pub use context::RunContext;
pub use control::{FanIn, join_verdict};
pub use details::{Artifact, ModelDetails, StageDetails, TokenUsage};
pub use engine::{Engine, EngineError, RunResult};
pub use event::Event;
pub use handler::{Attempt, Conversation, Emitter, Handler, Handlers, History, Services, Stage};
pub use outcome::{Failure, FailureClass, Outcome};
pub use settings::{RunMode, Settings};
pub use tokio_util::sync::CancellationToken;
