//! `trellis-handlers` provides the handlers that do work: shell and Python commands, waits, human
//! gates (with their interviewers), and model stages, with routing-directive extraction. [`standard_handlers`] registers them beside the
//! engine's control-flow handlers.

pub mod artifacts;
pub mod command;
pub mod human;
pub mod interviewer;
pub mod model;
pub mod routing_directive;
pub mod wait;

use std::sync::Arc;

use trellis_engine::Handlers;

/// Every handler a run needs, by node type.
pub fn standard_handlers() -> Handlers {
    let mut handlers = Handlers::with_control_flow();
    handlers.register("command", Arc::new(command::CommandHandler));
    handlers.register("wait", Arc::new(wait::WaitHandler));
    handlers.register("human", Arc::new(human::HumanHandler));
    handlers.register("prompt", Arc::new(model::ModelHandler));
    handlers.register("agent", Arc::new(model::ModelHandler));
    handlers
}
