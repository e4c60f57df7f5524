//! Steering a running agent: finds the stage a person's message is for, from the run's record, and
//! puts it in that stage's inbox (`trellis_handlers::steering`). `trellis steer`, the API and the web
//! page send through here, so they answer the same way: a message goes to a running built-in agent
//! stage or is refused with the reason — it is never accepted for nobody.

use std::collections::BTreeMap;

use trellis_engine::event::EventKind;
use trellis_handlers::steering;
use trellis_store::RunDir;

/// Where a message went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steered {
    pub node: String,
    /// The stage's directory (`003-fix@1`).
    pub dir: String,
}

/// Why a message was not sent.
#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    #[error("a steering message needs some text")]
    Empty,
    #[error("the run is not running, so no agent can read the message")]
    NotRunning,
    #[error("no agent stage is running in this run now; send the message while one runs")]
    NoAgent,
    #[error("`{node}` is not running now{}", running_list(.running))]
    NodeNotRunning { node: String, running: Vec<String> },
    #[error(
        "`{node}` takes no messages: only the built-in agent's stages do (not commands, prompts, gates or CLI agent backends, which get no input while they work)"
    )]
    NotTaking { node: String },
    #[error("several agent stages are running ({}): say which with `node`", .0.join(", "))]
    Ambiguous(Vec<String>),
    #[error("the run's record cannot be read: {0}")]
    Record(String),
    #[error(transparent)]
    Send(std::io::Error),
}

fn running_list(running: &[String]) -> String {
    if running.is_empty() {
        String::new()
    } else {
        format!(" (running: {})", running.join(", "))
    }
}

/// Sends `text` to the running agent stage of `node` (or to the one agent stage running). Reads the
/// record: call it on the blocking pool.
pub fn steer(record: &RunDir, text: &str, node: Option<&str>) -> Result<Steered, SteerError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(SteerError::Empty);
    }
    if !record.has_live_owner() {
        return Err(SteerError::NotRunning);
    }
    let running = running_stages(record)?;
    let stages = record.root().join("stages");
    let takes = |dir: &str| steering::takes_messages(&stages.join(dir));
    let (node, dir) = if let Some(node) = node {
        let Some(dir) = running.get(node) else {
            return Err(SteerError::NodeNotRunning {
                node: node.to_owned(),
                running: running.keys().cloned().collect(),
            });
        };
        if !takes(dir) {
            return Err(SteerError::NotTaking {
                node: node.to_owned(),
            });
        }
        (node.to_owned(), dir.clone())
    } else {
        let agents: Vec<(&String, &String)> =
            running.iter().filter(|(_, dir)| takes(dir)).collect();
        match agents.as_slice() {
            [] => return Err(SteerError::NoAgent),
            [(node, dir)] => ((*node).clone(), (*dir).clone()),
            several => {
                return Err(SteerError::Ambiguous(
                    several.iter().map(|(n, _)| (*n).clone()).collect(),
                ));
            }
        }
    };
    match steering::send(
        &stages.join(&dir),
        text,
        trellis_engine::engine::timestamp(),
    ) {
        Ok(()) => Ok(Steered { node, dir }),
        Err(steering::SendError::NotTaking) => Err(SteerError::NotTaking { node }),
        Err(steering::SendError::Io(e)) => Err(SteerError::Send(e)),
    }
}

/// The run's stages running now, by node: started and not ended, from its event log.
fn running_stages(record: &RunDir) -> Result<BTreeMap<String, String>, SteerError> {
    let run_id = record
        .meta()
        .map_err(|e| SteerError::Record(e.to_string()))?
        .run_id;
    let events = record
        .events()
        .map_err(|e| SteerError::Record(e.to_string()))?;
    let mut running = BTreeMap::new();
    for event in events.into_iter().filter(|e| e.run_id == run_id) {
        match (event.kind, event.node_id) {
            (EventKind::StageStarted { dir, .. }, Some(node)) => {
                running.insert(node, dir);
            }
            (EventKind::StageCompleted(_) | EventKind::StageFailed(_), Some(node)) => {
                running.remove(&node);
            }
            (kind, _) if kind.ends_run() => running.clear(),
            _ => {}
        }
    }
    Ok(running)
}
