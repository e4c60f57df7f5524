//! `trellis-handlers` provides the handlers that do work: shell and Python commands, waits, human
//! gates (with their interviewers), prompt nodes and prompted fan-ins on `trellis-llm` models (with
//! preambles, routing directives and structured output), and the model router for `when` edges.
//! [`standard_handlers`] registers them beside the engine's control-flow handlers.

pub mod artifacts;
pub mod command;
pub mod fan_in;
pub mod human;
pub mod interviewer;
pub mod model_call;
pub mod model_router;
pub mod output_schema;
pub mod preamble;
pub mod prompt;
pub mod routing_directive;
pub mod wait;

use std::sync::Arc;

use trellis_engine::Handlers;
use trellis_llm::Client;

/// Every handler a run needs, by node type. Model stages use `client`; without one they fail with a
/// clear message (dry runs simulate them).
pub fn standard_handlers(client: Option<Arc<Client>>) -> Handlers {
    let mut handlers = Handlers::with_control_flow();
    handlers.register("command", Arc::new(command::CommandHandler));
    handlers.register("wait", Arc::new(wait::WaitHandler));
    handlers.register("human", Arc::new(human::HumanHandler));
    let prompt = Arc::new(prompt::PromptHandler::new(client.clone()));
    handlers.register("prompt", prompt.clone());
    handlers.register("agent", prompt);
    handlers.register("parallel.fan_in", Arc::new(fan_in::ModelFanIn::new(client)));
    handlers
}
