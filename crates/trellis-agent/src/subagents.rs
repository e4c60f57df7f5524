//! Sub-agents, as Fabro has them: an agent's `spawn_agent`, `send_input`, `wait` and `close_agent`
//! tools start child sessions with their own history, talk to them and collect their answers.
//!
//! [`SubAgents`] is the tools' side (an [`ExternalTools`]): a spawn becomes a [`Spawned`] sent to
//! whoever runs the children — the agent handler, which builds each child's session on the stage's
//! model, tools and permissions and runs them with [`drive`] beside the parent, so children work while
//! the parent goes on. A child answers, then waits for more input until it is closed or its stage
//! ends (dropping [`drive`]'s future ends every child). Each agent may only reach the children it
//! started; ids say where a child sits (`agent-2` is the stage agent's second, `agent-2.1` that one's
//! first). `max_depth` bounds the nesting: a spawn beyond it is an error result.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use trellis_llm::ToolDef;

use crate::session::Inbox;
use crate::tools::{ExternalTools, ToolOutput};

/// The sub-agent tools' names.
pub const TOOL_NAMES: [&str; 4] = ["spawn_agent", "send_input", "wait", "close_agent"];

/// How a child's last round ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Its answer (the last text it wrote when it ran out of turns, with a word on that).
    Answered(String),
    /// Its model failed: why.
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    Running,
    Ended(Ending),
    Closed,
}

/// A child's status and the input sent to it that it has not taken yet.
#[derive(Debug)]
struct State {
    status: Status,
    queue: Vec<String>,
}

struct Child {
    /// The agent that started it (`None`: the stage's own).
    owner: Option<String>,
    state: Arc<watch::Sender<State>>,
    cancel: CancellationToken,
}

struct Shared {
    max_depth: u32,
    children: Mutex<HashMap<String, Child>>,
    /// Children started so far, per agent: the next id's number.
    started: Mutex<HashMap<Option<String>, u32>>,
    spawns: mpsc::UnboundedSender<Spawned>,
}

/// One agent's sub-agent tools.
#[derive(Clone)]
pub struct SubAgents {
    shared: Arc<Shared>,
    /// The agent these tools belong to (`None`: the stage's own).
    owner: Option<String>,
    depth: u32,
}

/// A child to start: its id, task and limits, its own sub-agent tools, and its line to the agent
/// that started it.
pub struct Spawned {
    pub id: String,
    pub task: String,
    pub max_turns: Option<u32>,
    /// 1 for the stage agent's children.
    pub depth: u32,
    /// The tools the child gets to start children of its own.
    pub tools: SubAgents,
    state: Arc<watch::Sender<State>>,
    cancel: CancellationToken,
}

impl SubAgents {
    /// The stage agent's tools, and where the children they start arrive.
    pub fn new(max_depth: u32) -> (Self, mpsc::UnboundedReceiver<Spawned>) {
        let (spawns, arrivals) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            max_depth,
            children: Mutex::default(),
            started: Mutex::default(),
            spawns,
        });
        let tools = Self {
            shared,
            owner: None,
            depth: 0,
        };
        (tools, arrivals)
    }

    /// Closes every child still running or waiting for input; their ids, to report.
    pub fn close_all(&self) -> Vec<String> {
        let children = self.shared.children.lock();
        let mut closed: Vec<String> = children
            .iter()
            .filter(|(_, child)| close(child))
            .map(|(id, _)| id.clone())
            .collect();
        closed.sort();
        closed
    }

    fn spawn(&self, arguments: &Value) -> Result<String, String> {
        let task = text_argument(arguments, "task")?;
        if self.depth >= self.shared.max_depth {
            return Err(format!(
                "sub-agents may nest {} level(s) deep here (max_subagent_depth), and this agent is \
                 at that depth: do the task yourself",
                self.shared.max_depth
            ));
        }
        let max_turns = match arguments.get("max_turns") {
            None | Some(Value::Null) => None,
            Some(value) => Some(
                value
                    .as_u64()
                    .filter(|n| *n >= 1)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        format!("`max_turns` must be a whole number of at least 1, got {value}")
                    })?,
            ),
        };
        let number = {
            let mut started = self.shared.started.lock();
            let count = started.entry(self.owner.clone()).or_insert(0);
            *count += 1;
            *count
        };
        let id = match &self.owner {
            None => format!("agent-{number}"),
            Some(owner) => format!("{owner}.{number}"),
        };
        let state = Arc::new(watch::Sender::new(State {
            status: Status::Running,
            queue: Vec::new(),
        }));
        let cancel = CancellationToken::new();
        let spawned = Spawned {
            id: id.clone(),
            task,
            max_turns,
            depth: self.depth + 1,
            tools: Self {
                shared: self.shared.clone(),
                owner: Some(id.clone()),
                depth: self.depth + 1,
            },
            state: state.clone(),
            cancel: cancel.clone(),
        };
        self.shared.children.lock().insert(
            id.clone(),
            Child {
                owner: self.owner.clone(),
                state,
                cancel,
            },
        );
        self.shared
            .spawns
            .send(spawned)
            .map_err(|_| "the stage is ending: no sub-agent can start now".to_owned())?;
        Ok(id)
    }

    /// The child `agent_id` names, if this agent started it.
    fn child(&self, arguments: &Value) -> Result<(String, Arc<watch::Sender<State>>), String> {
        let id = text_argument(arguments, "agent_id")?;
        let children = self.shared.children.lock();
        match children.get(&id) {
            Some(child) if child.owner == self.owner => Ok((id, child.state.clone())),
            _ => {
                let mine: Vec<&str> = children
                    .iter()
                    .filter(|(_, c)| c.owner == self.owner)
                    .map(|(id, _)| id.as_str())
                    .collect();
                Err(if mine.is_empty() {
                    format!("no sub-agent `{id}`: you have not started any (spawn_agent)")
                } else {
                    format!(
                        "no sub-agent `{id}` of yours; yours are: {}",
                        sorted(mine).join(", ")
                    )
                })
            }
        }
    }

    fn send_input(&self, arguments: &Value) -> Result<String, String> {
        let (id, state) = self.child(arguments)?;
        let message = text_argument(arguments, "message")?;
        let mut closed = false;
        state.send_modify(|state| {
            if state.status == Status::Closed {
                closed = true;
                return;
            }
            // A child that had answered works again; a working one reads it before its next turn.
            state.status = Status::Running;
            state.queue.push(message);
        });
        if closed {
            return Err(format!("sub-agent {id} was closed"));
        }
        Ok(format!(
            "Sent to {id}. Call wait with agent_id \"{id}\" for its answer."
        ))
    }

    async fn wait(&self, arguments: &Value) -> Result<String, String> {
        let (id, state) = self.child(arguments)?;
        let mut watching = state.subscribe();
        let status = watching
            .wait_for(|state| state.status != Status::Running)
            .await
            .map(|state| state.status.clone())
            .map_err(|_| format!("sub-agent {id} is gone"))?;
        match status {
            Status::Ended(Ending::Answered(text)) => {
                Ok(format!("Sub-agent {id} answered:\n{text}"))
            }
            Status::Ended(Ending::Failed(error)) => Err(format!("sub-agent {id} failed: {error}")),
            Status::Closed => Err(format!("sub-agent {id} was closed")),
            Status::Running => unreachable!("waited for the end of its round"),
        }
    }

    fn close_agent(&self, arguments: &Value) -> Result<String, String> {
        let (id, _) = self.child(arguments)?;
        // Its own children end with it.
        let prefix = format!("{id}.");
        let children = self.shared.children.lock();
        for (other, child) in children.iter() {
            if *other == id || other.starts_with(&prefix) {
                close(child);
            }
        }
        Ok(format!("Closed {id}."))
    }
}

/// The agent that started the sub-agent `id` (`agent-1` for `agent-1.2`; `None`: the stage's own
/// agent) — ids are made by `SubAgents` when it spawns one.
pub fn parent_of(id: &str) -> Option<&str> {
    id.rsplit_once('.').map(|(parent, _)| parent)
}

/// Closes `child` unless it was; whether it was running or waiting for input.
fn close(child: &Child) -> bool {
    let mut was_open = false;
    child.state.send_if_modified(|state| {
        was_open = state.status != Status::Closed;
        state.status = Status::Closed;
        was_open
    });
    child.cancel.cancel();
    was_open
}

fn sorted(mut ids: Vec<&str>) -> Vec<&str> {
    ids.sort_unstable();
    ids
}

fn text_argument(arguments: &Value, key: &str) -> Result<String, String> {
    match arguments.get(key).and_then(Value::as_str).map(str::trim) {
        Some(text) if !text.is_empty() => Ok(text.to_owned()),
        _ => Err(format!("`{key}` (a non-empty string) is required")),
    }
}

#[async_trait::async_trait]
impl ExternalTools for SubAgents {
    fn definitions(&self) -> Vec<ToolDef> {
        let agent_id = json!({ "type": "string", "description": "The id spawn_agent returned" });
        let tool = |name: &str, description: &str, parameters: Value| ToolDef {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters,
        };
        vec![
            tool(
                "spawn_agent",
                "Start a sub-agent: a new agent with its own conversation and your tools, working on \
                 `task` while you go on. Returns its id; call wait for its answer.",
                json!({
                    "type": "object",
                    "properties": {
                        "task": { "type": "string", "description": "Everything the sub-agent needs to know to do its task" },
                        "max_turns": { "type": "integer", "description": "The most turns it may take (default: no limit)" }
                    },
                    "required": ["task"]
                }),
            ),
            tool(
                "send_input",
                "Send a sub-agent more input: it reads it before its next turn, or starts again if it \
                 had answered.",
                json!({
                    "type": "object",
                    "properties": { "agent_id": agent_id, "message": { "type": "string" } },
                    "required": ["agent_id", "message"]
                }),
            ),
            tool(
                "wait",
                "Wait until a sub-agent answers, and get its answer.",
                json!({
                    "type": "object",
                    "properties": { "agent_id": agent_id },
                    "required": ["agent_id"]
                }),
            ),
            tool(
                "close_agent",
                "Stop a sub-agent (and any it started).",
                json!({
                    "type": "object",
                    "properties": { "agent_id": agent_id },
                    "required": ["agent_id"]
                }),
            ),
        ]
    }

    async fn call(&self, name: &str, arguments: &Value) -> Option<ToolOutput> {
        let result = match name {
            "spawn_agent" => self.spawn(arguments).map(|id| {
                format!("Started sub-agent {id}. Call wait with agent_id \"{id}\" for its answer.")
            }),
            "send_input" => self.send_input(arguments),
            "wait" => self.wait(arguments).await,
            "close_agent" => self.close_agent(arguments),
            _ => return None,
        };
        Some(result.map_or_else(ToolOutput::error, ToolOutput::ok))
    }
}

impl Spawned {
    /// Where the input sent to the child while it works comes from.
    pub fn inbox(&self) -> Box<dyn Inbox> {
        Box::new(ChildInbox(self.state.clone()))
    }

    /// Records how the child's round ended, unless input came meanwhile: then that input, for the
    /// next round (the child goes on without reporting).
    pub fn finish(&self, ending: Ending) -> Option<String> {
        let mut pending = None;
        self.state.send_if_modified(|state| {
            if state.status == Status::Closed {
                return false;
            }
            if state.queue.is_empty() {
                state.status = Status::Ended(ending);
                true
            } else {
                pending = Some(std::mem::take(&mut state.queue).join("\n\n"));
                false
            }
        });
        pending
    }

    /// Waits for input after an answer: the next round's, or `None` once the child is closed.
    pub async fn next_input(&self) -> Option<String> {
        let mut watching = self.state.subscribe();
        watching
            .wait_for(|state| state.status == Status::Closed || !state.queue.is_empty())
            .await
            .ok()?;
        let mut input = None;
        self.state.send_if_modified(|state| {
            if state.status != Status::Closed {
                input = Some(std::mem::take(&mut state.queue).join("\n\n"));
            }
            false
        });
        input
    }

    /// Cancelled when the child is closed.
    pub fn closed(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }
}

/// A child's input while it works, read before each of its turns.
struct ChildInbox(Arc<watch::Sender<State>>);

#[async_trait::async_trait]
impl Inbox for ChildInbox {
    async fn take(&self) -> Vec<String> {
        let mut taken = Vec::new();
        self.0.send_if_modified(|state| {
            taken = std::mem::take(&mut state.queue);
            false
        });
        taken
    }

    fn prefix(&self) -> &'static str {
        "Message from the agent that started you (take it into account now): "
    }
}

/// Runs every child that arrives, concurrently, with `start`; never ends by itself: the stage drops
/// it (and with it every child still running) when its own agent is done.
pub async fn drive<'a, F, Fut>(
    mut arrivals: mpsc::UnboundedReceiver<Spawned>,
    mut start: F,
) -> Infallible
where
    F: FnMut(Spawned) -> Fut,
    Fut: Future<Output = ()> + 'a,
{
    let mut running = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            arrival = arrivals.recv(), if open => match arrival {
                Some(spawned) => running.push(start(spawned)),
                None => open = false,
            },
            Some(()) = running.next(), if !running.is_empty() => {}
            // Nothing left to run or to come: wait to be dropped (a select with every branch off
            // would panic).
            () = std::future::pending::<()>(), if !open && running.is_empty() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn call(tools: &SubAgents, name: &str, arguments: Value) -> ToolOutput {
        tools.call(name, &arguments).await.unwrap()
    }

    #[tokio::test]
    async fn a_child_answers_takes_more_input_and_is_closed() {
        let (tools, mut arrivals) = SubAgents::new(1);
        let started = call(&tools, "spawn_agent", json!({ "task": "count" })).await;
        assert!(!started.is_error && started.content.contains("agent-1"));
        let child = arrivals.recv().await.unwrap();
        assert_eq!(
            (child.id.as_str(), child.task.as_str(), child.depth),
            ("agent-1", "count", 1)
        );

        // Input sent while it works reaches its next turn.
        call(
            &tools,
            "send_input",
            json!({ "agent_id": "agent-1", "message": "to 3" }),
        )
        .await;
        assert_eq!(child.inbox().take().await, ["to 3"]);
        assert_eq!(child.finish(Ending::Answered("1 2 3".into())), None);
        let answer = call(&tools, "wait", json!({ "agent_id": "agent-1" })).await;
        assert_eq!(answer.content, "Sub-agent agent-1 answered:\n1 2 3");

        // After its answer, input starts another round; a wait sees that round's end.
        call(
            &tools,
            "send_input",
            json!({ "agent_id": "agent-1", "message": "again" }),
        )
        .await;
        assert_eq!(child.next_input().await.as_deref(), Some("again"));
        let waiting = tokio::spawn({
            let tools = tools.clone();
            async move { call(&tools, "wait", json!({ "agent_id": "agent-1" })).await }
        });
        tokio::task::yield_now().await;
        child.finish(Ending::Failed("model down".into()));
        let failed = waiting.await.unwrap();
        assert!(failed.is_error && failed.content.contains("model down"));

        assert_eq!(tools.close_all(), ["agent-1"]);
        assert_eq!(child.next_input().await, None);
        let gone = call(
            &tools,
            "send_input",
            json!({ "agent_id": "agent-1", "message": "x" }),
        )
        .await;
        assert!(gone.is_error && gone.content.contains("closed"));
    }

    #[tokio::test]
    async fn depth_and_ownership_are_enforced() {
        let (tools, mut arrivals) = SubAgents::new(1);
        call(&tools, "spawn_agent", json!({ "task": "a" })).await;
        let child = arrivals.recv().await.unwrap();
        let deeper = call(&child.tools, "spawn_agent", json!({ "task": "b" })).await;
        assert!(deeper.is_error && deeper.content.contains("max_subagent_depth"));
        let theirs = call(&child.tools, "wait", json!({ "agent_id": "agent-1" })).await;
        assert!(theirs.is_error, "{}", theirs.content);
        let missing = call(&tools, "wait", json!({ "agent_id": "agent-9" })).await;
        assert_eq!(
            missing.content,
            "no sub-agent `agent-9` of yours; yours are: agent-1"
        );
        let bad = call(
            &tools,
            "spawn_agent",
            json!({ "task": "c", "max_turns": 0 }),
        )
        .await;
        assert!(bad.is_error && bad.content.contains("max_turns"));

        let (deep, mut arrivals) = SubAgents::new(2);
        call(&deep, "spawn_agent", json!({ "task": "a" })).await;
        let child = arrivals.recv().await.unwrap();
        call(&child.tools, "spawn_agent", json!({ "task": "b" })).await;
        let grandchild = arrivals.recv().await.unwrap();
        assert_eq!((grandchild.id.as_str(), grandchild.depth), ("agent-1.1", 2));
        assert_eq!(parent_of(&grandchild.id), Some("agent-1"));
        assert_eq!(parent_of("agent-1"), None);
        // Closing a child closes its own children.
        call(&deep, "close_agent", json!({ "agent_id": "agent-1" })).await;
        assert_eq!(grandchild.next_input().await, None);
        assert_eq!(deep.close_all(), [] as [String; 0]);
    }
}
