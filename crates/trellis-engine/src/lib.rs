//! `trellis-engine` executes a compiled [`Workflow`](trellis_workflow::Workflow): the run loop, edge
//! selection, the run context, outcomes, retries, goal gates, visit limits, checkpoints and events. It
//! sees the outside world only through the traits in [`services`] and [`handler`]; it never touches a
//! process, an HTTP client or the file layout of the run record.
//!
//! Its modules are layered, bottom up (`tests/layers.rs` keeps it so):
//!
//! - data: context keys, outcomes, details, settings, blobs, the checkpoint and its journal, events,
//!   `status.json`, and the join policies ([`join`]);
//! - seams: [`services`] (the run store, blobs, events, clock, interviewer, router) and [`handler`];
//! - the record (what the engine writes through the store), the control-flow handlers and edge
//!   selection ([`routing`]);
//! - the core, [`engine`]: the [`Engine`], its events, and the run loop;
//! - the drivers, each an `impl Engine` block: a stage's attempts, one step of a track, fan-outs
//!   ([`parallel`]) and sub-workflows.

mod attempt;
pub mod blob;
pub mod checkpoint;
pub mod context;
mod control;
pub mod details;
pub mod engine;
pub mod event;
pub mod handler;
pub mod hooks;
pub mod join;
pub mod keys;
pub mod outcome;
pub mod parallel;
mod record;
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
