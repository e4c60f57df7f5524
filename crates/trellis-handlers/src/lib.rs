//! `trellis-handlers` provides the handlers that do work: shell and Python commands, waits, human
//! gates (with their interviewers), agent nodes (the `trellis-agent` loop), prompt nodes and prompted fan-ins on `trellis-llm` models (with
//! preambles, routing directives and structured output), and the model router for `when` edges.
//! [`standard_handlers`] registers them beside the engine's control-flow handlers.

mod acp;
pub mod agent;
pub mod artifacts;
mod checks;
pub mod cli_agent;
pub mod command;
pub mod fan_in;
pub mod hooks;
pub mod human;
pub mod interviewer;
pub mod mcp;
pub mod model_call;
pub mod model_router;
pub mod output_schema;
pub mod permissions;
pub mod preamble;
pub mod prompt;
pub mod routing_directive;
mod simple_command;
pub mod skills;
pub mod steering;
pub mod wait;

use std::sync::Arc;

use trellis_engine::Handlers;
use trellis_llm::Client;
use trellis_process::sandbox::Sandbox;
use trellis_workflow::node_kind::HandlerKind;

/// What a workflow's stages need from this machine, checked before a run's first stage so a run
/// does not fail halfway for want of it: the skills agent nodes name (and their variables), and the
/// Brave Search key of an agent allowed `web_search`. `run_servers` are the MCP servers the run
/// adds to the workflow's (a run file's). `Err` lists every problem, one per line.
pub fn preflight(
    workflow: &trellis_workflow::Workflow,
    run_servers: &[(String, trellis_workflow::mcp_config::ServerConfig)],
    work_dir: &std::path::Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    let mut problems = Vec::new();
    let key = trellis_agent::web::SEARCH_KEY;
    let has_key = env(key).is_some_and(|k| !k.trim().is_empty());
    for node in &workflow.nodes {
        let Some(llm) = node.kind.llm() else {
            continue;
        };
        let names = |list: &[String]| list.iter().any(|n| n == "web_search");
        let searches = llm.backend == trellis_workflow::node_kind::Backend::Api
            && llm.allowed_tools.as_deref().is_some_and(names)
            && !names(&llm.disallowed_tools);
        if searches && !has_key {
            problems.push(format!(
                "node `{}`: `web_search` needs a Brave Search API key in {key}",
                node.id
            ));
        }
    }
    if let Err(skills) = skills::preflight(workflow, run_servers, work_dir, env) {
        problems.push(skills);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Every handler a run needs, by node type. Model stages use `client`; without one they fail with a
/// clear message (dry runs simulate them). Commands and agents' shells run in `sandbox`.
pub fn standard_handlers(client: Option<Arc<Client>>, sandbox: &Arc<Sandbox>) -> Handlers {
    let mut handlers = Handlers::with_control_flow();
    handlers.register(
        HandlerKind::Command,
        Arc::new(command::CommandHandler::new(sandbox.clone())),
    );
    handlers.register(HandlerKind::Wait, Arc::new(wait::WaitHandler));
    handlers.register(HandlerKind::Human, Arc::new(human::HumanHandler));
    let threads = Arc::new(prompt::Threads::default());
    handlers.register(
        HandlerKind::Prompt,
        Arc::new(prompt::PromptHandler::new(client.clone(), threads.clone())),
    );
    handlers.register(
        HandlerKind::Agent,
        Arc::new(agent::AgentHandler::new(
            client.clone(),
            threads,
            sandbox.clone(),
        )),
    );
    handlers.register(
        HandlerKind::FanIn,
        Arc::new(fan_in::ModelFanIn::new(client)),
    );
    handlers
}

#[cfg(test)]
mod tests {
    use trellis_workflow::node_kind::KINDS;

    #[test]
    fn every_kind_resolves_to_a_handler() {
        let handlers = super::standard_handlers(None, &std::sync::Arc::new(super::Sandbox::none()));
        for spec in KINDS {
            assert!(
                handlers.runs(spec.kind),
                "no handler for {} nodes",
                spec.type_name
            );
        }
    }
}
