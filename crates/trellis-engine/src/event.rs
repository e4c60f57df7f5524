//! Events: every event of a run as one serde-tagged enum, [`EventKind`] — the contract the terminal
//! display, `trellis events`, the event log and (later) the server's stream all read. One JSON object
//! per line: `{seq, ts, run_id, node_id?, event, ...fields}`, named as the specification names them
//! (`StageCompleted`, `WorkflowRunCompleted`, ...) and DESIGN.md §3 for the rest.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use trellis_workflow::StageStatus;
use trellis_workflow::node_kind::{HandlerKind, JoinPolicy};

use crate::checkpoint::RunStatus;
pub use crate::details::{Artifact, ModelDetails, TokenUsage};

/// One event of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub ts: String,
    pub run_id: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub node_id: Option<String>,
    /// The sub-agent whose activity this is (`agent-1`, its own `agent-1.1`); none for the stage's
    /// own agent and everything else.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub agent_id: Option<String>,
    #[serde(flatten)]
    pub kind: EventKind,
}

impl Event {
    /// The event's name (`StageCompleted`, ...).
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// The event's own fields, without its name, for display.
    pub fn fields(&self) -> serde_json::Map<String, Value> {
        let mut fields = match serde_json::to_value(&self.kind) {
            Ok(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        fields.remove("event");
        fields
    }
}

/// What happened. The variant name is the event's name in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event")]
pub enum EventKind {
    WorkflowRunStarted(RunStart),
    WorkflowRunResumed(RunStart),
    WorkflowRunCompleted {
        status: RunStatus,
        stages: usize,
        /// Artifacts the run's stages captured (the outputs document).
        artifact_count: usize,
    },
    WorkflowRunFailed {
        status: RunStatus,
        error: Option<String>,
    },
    WorkflowRunWaitingForInput {
        node: Option<String>,
    },
    WorkflowRunCancelled {
        status: RunStatus,
        /// The stage the run was stopped in; `resume` runs it again.
        node: Option<String>,
        stages: usize,
    },
    StageStarted {
        visit: u32,
        attempt: u32,
        dir: String,
        /// The handler type (`command`, `prompt`, ...).
        #[serde(rename = "type")]
        handler: HandlerKind,
        /// A sub-workflow stage's child workflow file.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        workflow: Option<String>,
    },
    StageCompleted(StageEnd),
    StageFailed(StageEnd),
    StageRetrying {
        attempt: u32,
        next_attempt: u32,
        delay_ms: u64,
        reason: Option<String>,
    },
    EdgeSelected(EdgeChoice),
    LoopRestarted {
        to: String,
    },
    CheckpointSaved {
        next_node: Option<String>,
    },
    GoalGateUnmet {
        status: StageStatus,
        /// Where the run goes back to; none when the gate has no retry target left (the run fails).
        #[serde(skip_serializing_if = "Option::is_none", default)]
        retry_target: Option<String>,
    },
    HumanGateAsked {
        prompt: String,
        options: Vec<String>,
        freeform: bool,
    },
    HumanGateAnswered {
        label: String,
        text: Option<String>,
        /// The gate's `human.default_choice`, taken when its timeout ran out.
        default_after_timeout: bool,
    },
    ParallelStarted {
        branches: Vec<String>,
        fan_in: String,
        join_policy: JoinPolicy,
        max_parallel: u32,
    },
    ParallelBranchCompleted {
        branch: String,
        status: StageStatus,
        failure_reason: Option<String>,
    },
    ParallelCompleted {
        status: StageStatus,
        succeeded: usize,
        failed: usize,
        cancelled: usize,
    },
    ModelCallStarted {
        model: String,
        provider: String,
        turn: u32,
    },
    ModelCallCompleted(ModelCallEnd),
    ModelCallRetrying {
        error: String,
        kind: String,
        attempt: u32,
        delay_ms: u64,
    },
    ModelWarning {
        message: String,
    },
    /// A piece of a model's answer as it streams. Live only: never written to the event log (the
    /// stage's files keep the answer); `trellis run --verbose` prints it.
    ModelTextDelta {
        text: String,
    },
    /// An agent stage's loop begins a turn.
    #[serde(rename = "Agent.TurnStarted")]
    AgentTurnStarted {
        turn: u32,
    },
    /// An agent turn's answer came: the tokens it took, the cached part of its input included.
    #[serde(rename = "Agent.TurnCompleted")]
    AgentTurnCompleted {
        turn: u32,
        usage: TokenUsage,
    },
    #[serde(rename = "Agent.ToolCallStarted")]
    AgentToolCallStarted {
        call_id: String,
        tool: String,
        /// The path, command or pattern, for one-line displays.
        target: String,
        arguments: Value,
    },
    #[serde(rename = "Agent.ToolCallCompleted")]
    AgentToolCallCompleted(ToolCallEnd),
    #[serde(rename = "Agent.LoopDetected")]
    AgentLoopDetected {
        period: usize,
        tools: Vec<String>,
    },
    /// A person's steering message reached the agent's next model call.
    #[serde(rename = "Agent.SteeringReceived")]
    AgentSteeringReceived {
        turn: u32,
        text: String,
    },
    /// A steering message came after the agent's last model call: it never reached the model.
    #[serde(rename = "Agent.SteeringUndelivered")]
    AgentSteeringUndelivered {
        text: String,
    },
    #[serde(rename = "Agent.ContextWindowWarning")]
    AgentContextWindowWarning {
        estimated_tokens: u64,
        context_window_size: u64,
        usage_percent: u64,
    },
    #[serde(rename = "Agent.CompactionStarted")]
    AgentCompactionStarted {
        estimated_tokens: u64,
        context_window_size: u64,
    },
    #[serde(rename = "Agent.CompactionCompleted")]
    AgentCompactionCompleted {
        original_turn_count: usize,
        preserved_turn_count: usize,
        summary_token_estimate: u64,
        tracked_file_count: usize,
    },
    #[serde(rename = "Agent.Error")]
    AgentError {
        message: String,
    },
    /// An agent started a sub-agent (`spawn_agent`); its own activity follows under its `agent_id`.
    #[serde(rename = "Agent.SubagentSpawned")]
    AgentSubagentSpawned {
        subagent: String,
        task: String,
        depth: u32,
    },
    /// A sub-agent answered (it may be sent more with `send_input`).
    #[serde(rename = "Agent.SubagentCompleted")]
    AgentSubagentCompleted {
        subagent: String,
        turns: u32,
        text: String,
    },
    /// A sub-agent stopped without an answer (its model failed).
    #[serde(rename = "Agent.SubagentFailed")]
    AgentSubagentFailed {
        subagent: String,
        error: String,
    },
    /// A sub-agent was stopped: by `close_agent`, or because its stage ended.
    #[serde(rename = "Agent.SubagentClosed")]
    AgentSubagentClosed {
        subagent: String,
    },
    /// A lifecycle hook ran (a run file's hooks): which, at what point, how long, and what it
    /// decided (blocking hooks) or why it could not run.
    #[serde(rename = "Hook.Completed")]
    HookCompleted {
        hook: String,
        /// The lifecycle event it fired at (`stage_start`, ...).
        hook_event: String,
        /// `command`, `http`, `prompt` or `agent`.
        hook_type: String,
        blocking: bool,
        /// `proceed`, `skip`, `block` or `override`.
        decision: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        reason: Option<String>,
        duration_ms: u64,
        /// Why the hook itself failed (a timeout, a model error): it failed open or closed as its
        /// type does.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        error: Option<String>,
    },
    /// One of a run file's prepare steps ran, before the first stage.
    #[serde(rename = "Run.PrepareStep")]
    PrepareStep {
        step: usize,
        command: String,
        succeeded: bool,
        /// `exit 0`, `exit 1`, `timed out`, ...
        note: String,
        duration_ms: u64,
    },
    /// An event this version does not know (a log written by a newer one).
    #[serde(other)]
    Unknown,
}

/// `WorkflowRunStarted` and `WorkflowRunResumed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStart {
    pub workflow: String,
    pub goal: Option<String>,
    pub next_node: Option<String>,
}

/// `StageCompleted` and `StageFailed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageEnd {
    pub status: StageStatus,
    pub visit: u32,
    pub attempt: u32,
    pub duration_ms: u64,
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub files_touched: Vec<String>,
    /// Model stages: which model answered, and what it cost.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub usage: Option<TokenUsage>,
    /// What the model calls cost in US dollars, where it was reported.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cost_usd: Option<f64>,
    /// Command stages: the artifacts captured, and those left out with the reason.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub artifacts: Vec<Artifact>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub artifacts_skipped: Vec<Artifact>,
}

/// `EdgeSelected`: an edge followed, or a jump to a retry target (`reason`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EdgeChoice {
    pub to: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub condition: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub when: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub loop_restart: bool,
    /// Why the run went there without an edge (`retry_target`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// The model that judged `when` edges, and what it cost.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub router: Option<ModelDetails>,
    /// What the model was asked and answered, when it judged `when` edges.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub decision: Option<RouteDecision>,
}

/// A model's routing decision: the choices it was shown (the default edge as `none_of_the_above`), its
/// answer and the reason it gave.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteDecision {
    pub choices: Vec<RouteOption>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub default: Option<String>,
    pub answer: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
}

/// `ModelCallCompleted`: the answer's model, usage and stop reason, or the error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCallEnd {
    pub model: String,
    pub provider: String,
    pub turn: u32,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub usage: Option<TokenUsage>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stop_reason: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// The error's kind (`rate_limit`, `auth`, ...).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kind: Option<String>,
}

/// `Agent.ToolCallCompleted`: how a tool call ended, with its whole output (the model was shown
/// `shown_chars` characters of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallEnd {
    pub call_id: String,
    pub tool: String,
    pub target: String,
    pub is_error: bool,
    pub duration_ms: u64,
    pub output_chars: usize,
    pub shown_chars: usize,
    /// A short word on the result (`exit 101`, `timed out`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub note: Option<String>,
    pub output: String,
}

impl EventKind {
    /// The event's name in the log.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::WorkflowRunStarted(_) => "WorkflowRunStarted",
            EventKind::WorkflowRunResumed(_) => "WorkflowRunResumed",
            EventKind::WorkflowRunCompleted { .. } => "WorkflowRunCompleted",
            EventKind::WorkflowRunFailed { .. } => "WorkflowRunFailed",
            EventKind::WorkflowRunWaitingForInput { .. } => "WorkflowRunWaitingForInput",
            EventKind::WorkflowRunCancelled { .. } => "WorkflowRunCancelled",
            EventKind::StageStarted { .. } => "StageStarted",
            EventKind::StageCompleted(_) => "StageCompleted",
            EventKind::StageFailed(_) => "StageFailed",
            EventKind::StageRetrying { .. } => "StageRetrying",
            EventKind::EdgeSelected(_) => "EdgeSelected",
            EventKind::LoopRestarted { .. } => "LoopRestarted",
            EventKind::CheckpointSaved { .. } => "CheckpointSaved",
            EventKind::GoalGateUnmet { .. } => "GoalGateUnmet",
            EventKind::HumanGateAsked { .. } => "HumanGateAsked",
            EventKind::HumanGateAnswered { .. } => "HumanGateAnswered",
            EventKind::ParallelStarted { .. } => "ParallelStarted",
            EventKind::ParallelBranchCompleted { .. } => "ParallelBranchCompleted",
            EventKind::ParallelCompleted { .. } => "ParallelCompleted",
            EventKind::ModelCallStarted { .. } => "ModelCallStarted",
            EventKind::ModelCallCompleted(_) => "ModelCallCompleted",
            EventKind::ModelCallRetrying { .. } => "ModelCallRetrying",
            EventKind::ModelWarning { .. } => "ModelWarning",
            EventKind::AgentTurnStarted { .. } => "Agent.TurnStarted",
            EventKind::ModelTextDelta { .. } => "ModelTextDelta",
            EventKind::AgentToolCallStarted { .. } => "Agent.ToolCallStarted",
            EventKind::AgentToolCallCompleted(_) => "Agent.ToolCallCompleted",
            EventKind::AgentTurnCompleted { .. } => "Agent.TurnCompleted",
            EventKind::AgentLoopDetected { .. } => "Agent.LoopDetected",
            EventKind::AgentSteeringReceived { .. } => "Agent.SteeringReceived",
            EventKind::AgentSteeringUndelivered { .. } => "Agent.SteeringUndelivered",
            EventKind::AgentContextWindowWarning { .. } => "Agent.ContextWindowWarning",
            EventKind::AgentCompactionStarted { .. } => "Agent.CompactionStarted",
            EventKind::AgentCompactionCompleted { .. } => "Agent.CompactionCompleted",
            EventKind::AgentError { .. } => "Agent.Error",
            EventKind::AgentSubagentSpawned { .. } => "Agent.SubagentSpawned",
            EventKind::AgentSubagentCompleted { .. } => "Agent.SubagentCompleted",
            EventKind::AgentSubagentFailed { .. } => "Agent.SubagentFailed",
            EventKind::AgentSubagentClosed { .. } => "Agent.SubagentClosed",
            EventKind::HookCompleted { .. } => "Hook.Completed",
            EventKind::PrepareStep { .. } => "Run.PrepareStep",
            EventKind::Unknown => "Unknown",
        }
    }

    /// Whether the event is only for live displays and not kept in the event log.
    pub fn is_live_only(&self) -> bool {
        matches!(self, EventKind::ModelTextDelta { .. })
    }

    /// Whether the event says that something which may take a while has begun (a run, a stage, a
    /// retry's wait, a question, a model call, a tool call): a reader of the log — and the record
    /// after a kill — should see it at once, not with the next batch of lines.
    pub fn starts_work(&self) -> bool {
        matches!(
            self,
            EventKind::WorkflowRunStarted(_)
                | EventKind::WorkflowRunResumed(_)
                | EventKind::StageStarted { .. }
                | EventKind::StageRetrying { .. }
                | EventKind::HumanGateAsked { .. }
                | EventKind::ParallelStarted { .. }
                | EventKind::ModelCallStarted { .. }
                | EventKind::ModelCallRetrying { .. }
                | EventKind::AgentTurnStarted { .. }
                | EventKind::AgentToolCallStarted { .. }
        )
    }

    /// Whether the event ends the run's process (it finished, failed, waits or was cancelled).
    pub fn ends_run(&self) -> bool {
        matches!(
            self,
            EventKind::WorkflowRunCompleted { .. }
                | EventKind::WorkflowRunFailed { .. }
                | EventKind::WorkflowRunWaitingForInput { .. }
                | EventKind::WorkflowRunCancelled { .. }
        )
    }
}

/// A natural-language edge for a model to judge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteOption {
    /// The answer that picks it: the target node's id (with `#n` when two edges share a target).
    pub id: String,
    pub target: String,
    pub when: String,
}

/// Emits an event into the run's stream, for a node (or the run as a whole).
pub trait Emitter: Send + Sync {
    /// Emits `event` for `node`, as the activity of the sub-agent `agent` when one is given.
    fn emit_from(&self, node: Option<&str>, agent: Option<&str>, event: EventKind);

    /// An owned emitter that emits as this one does, for work that outlives the call handed this
    /// one (a hook running in the background); none where there is no such thing.
    fn detached(&self) -> Option<std::sync::Arc<dyn Emitter>> {
        None
    }

    fn emit(&self, node: Option<&str>, event: EventKind) {
        self.emit_from(node, None, event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(kind: EventKind) -> Value {
        serde_json::to_value(Event {
            seq: 3,
            ts: "2026-11-23T12:00:00.000Z".into(),
            run_id: "R".into(),
            node_id: Some("test".into()),
            agent_id: None,
            kind,
        })
        .unwrap()
    }

    #[test]
    fn events_keep_the_log_format_and_read_back() {
        let event = line(EventKind::StageStarted {
            visit: 1,
            attempt: 2,
            dir: "002-test@1".into(),
            handler: HandlerKind::Command,
            workflow: None,
        });
        assert_eq!(
            event,
            serde_json::json!({
                "seq": 3, "ts": "2026-11-23T12:00:00.000Z", "run_id": "R", "node_id": "test",
                "event": "StageStarted", "visit": 1, "attempt": 2, "dir": "002-test@1", "type": "command",
            })
        );
        let back: Event = serde_json::from_value(event).unwrap();
        assert_eq!(back.name(), "StageStarted");
        assert_eq!(back.fields()["type"], "command");
        assert!(matches!(
            back.kind,
            EventKind::StageStarted {
                handler: HandlerKind::Command,
                ..
            }
        ));

        let event = line(EventKind::ParallelStarted {
            branches: vec!["a".into(), "b".into()],
            fan_in: "join".into(),
            join_policy: JoinPolicy::KOfN(2),
            max_parallel: 4,
        });
        assert_eq!(event["join_policy"], "k_of_n(2)");
        let back: Event = serde_json::from_value(event).unwrap();
        assert!(matches!(
            back.kind,
            EventKind::ParallelStarted {
                join_policy: JoinPolicy::KOfN(2),
                ..
            }
        ));
    }

    /// One line of every event kind, as the log holds them.
    const EVERY_KIND: &[&str] = &[
        r#"{"event":"WorkflowRunStarted","workflow":"w","goal":null,"next_node":"start"}"#,
        r#"{"event":"WorkflowRunResumed","workflow":"w","goal":"g","next_node":"a"}"#,
        r#"{"event":"WorkflowRunCompleted","status":"succeeded","stages":3,"artifact_count":0}"#,
        r#"{"event":"WorkflowRunFailed","status":"failed","error":"boom"}"#,
        r#"{"event":"WorkflowRunWaitingForInput","node":"gate"}"#,
        r#"{"event":"WorkflowRunCancelled","status":"cancelled","node":"a","stages":1}"#,
        r#"{"event":"StageStarted","visit":1,"attempt":1,"dir":"001-a@1","type":"command"}"#,
        r#"{"event":"StageCompleted","status":"succeeded","visit":1,"attempt":1,"duration_ms":5,"failure_reason":null,"files_touched":[]}"#,
        r#"{"event":"StageFailed","status":"failed","visit":1,"attempt":2,"duration_ms":5,"failure_reason":"exit 1","files_touched":[]}"#,
        r#"{"event":"StageRetrying","attempt":1,"next_attempt":2,"delay_ms":500,"reason":"busy"}"#,
        r#"{"event":"EdgeSelected","to":"b","label":"Yes"}"#,
        r#"{"event":"LoopRestarted","to":"a"}"#,
        r#"{"event":"CheckpointSaved","next_node":"b"}"#,
        r#"{"event":"GoalGateUnmet","status":"failed","retry_target":"a"}"#,
        r#"{"event":"HumanGateAsked","prompt":"Ship?","options":["Yes","No"],"freeform":false}"#,
        r#"{"event":"HumanGateAnswered","label":"Yes","text":null,"default_after_timeout":false}"#,
        r#"{"event":"ParallelStarted","branches":["a","b"],"fan_in":"join","join_policy":"wait_all","max_parallel":4}"#,
        r#"{"event":"ParallelBranchCompleted","branch":"a","status":"succeeded","failure_reason":null}"#,
        r#"{"event":"ParallelCompleted","status":"succeeded","succeeded":2,"failed":0,"cancelled":0}"#,
        r#"{"event":"ModelCallStarted","model":"m","provider":"p","turn":1}"#,
        r#"{"event":"ModelCallCompleted","model":"m","provider":"p","turn":1,"duration_ms":9}"#,
        r#"{"event":"ModelCallRetrying","error":"429","kind":"rate_limit","attempt":1,"delay_ms":200}"#,
        r#"{"event":"ModelWarning","message":"careful"}"#,
        r#"{"event":"ModelTextDelta","text":"Hel"}"#,
        r#"{"event":"Agent.TurnStarted","turn":2}"#,
        r#"{"event":"Agent.TurnCompleted","turn":2,"usage":{"input_tokens":900,"output_tokens":40,"cached_tokens":850,"reasoning_tokens":0}}"#,
        r#"{"event":"Agent.ToolCallStarted","call_id":"c1","tool":"shell","target":"ls","arguments":{"command":"ls"}}"#,
        r#"{"event":"Agent.ToolCallCompleted","call_id":"c1","tool":"shell","target":"ls","is_error":false,"duration_ms":3,"output_chars":10,"shown_chars":10,"output":"a\nb"}"#,
        r#"{"event":"Agent.LoopDetected","period":2,"tools":["read_file","grep"]}"#,
        r#"{"event":"Agent.SteeringReceived","turn":3,"text":"use tabs"}"#,
        r#"{"event":"Agent.SteeringUndelivered","text":"too late"}"#,
        r#"{"event":"Agent.ContextWindowWarning","estimated_tokens":90,"context_window_size":100,"usage_percent":90}"#,
        r#"{"event":"Agent.CompactionStarted","estimated_tokens":90,"context_window_size":100}"#,
        r#"{"event":"Agent.CompactionCompleted","original_turn_count":9,"preserved_turn_count":3,"summary_token_estimate":40,"tracked_file_count":2}"#,
        r#"{"event":"Agent.Error","message":"no tools"}"#,
        r#"{"event":"Agent.SubagentSpawned","subagent":"agent-1","task":"t","depth":1}"#,
        r#"{"event":"Agent.SubagentCompleted","subagent":"agent-1","turns":2,"text":"done"}"#,
        r#"{"event":"Agent.SubagentFailed","subagent":"agent-1","error":"e"}"#,
        r#"{"event":"Agent.SubagentClosed","subagent":"agent-1"}"#,
        r#"{"event":"Run.PrepareStep","step":1,"command":"npm ci","succeeded":true,"note":"exit 0","duration_ms":900}"#,
        r#"{"event":"Hook.Completed","hook":"pre-check","hook_event":"stage_start","hook_type":"command","blocking":true,"decision":"skip","reason":"off","duration_ms":3}"#,
    ];

    /// The kind's place in the enum: a new kind does not compile until this names it (and then
    /// [`EVERY_KIND`] needs a line for it).
    fn ordinal(kind: &EventKind) -> usize {
        match kind {
            EventKind::WorkflowRunStarted(_) => 0,
            EventKind::WorkflowRunResumed(_) => 1,
            EventKind::WorkflowRunCompleted { .. } => 2,
            EventKind::WorkflowRunFailed { .. } => 3,
            EventKind::WorkflowRunWaitingForInput { .. } => 4,
            EventKind::WorkflowRunCancelled { .. } => 5,
            EventKind::StageStarted { .. } => 6,
            EventKind::StageCompleted(_) => 7,
            EventKind::StageFailed(_) => 8,
            EventKind::StageRetrying { .. } => 9,
            EventKind::EdgeSelected(_) => 10,
            EventKind::LoopRestarted { .. } => 11,
            EventKind::CheckpointSaved { .. } => 12,
            EventKind::GoalGateUnmet { .. } => 13,
            EventKind::HumanGateAsked { .. } => 14,
            EventKind::HumanGateAnswered { .. } => 15,
            EventKind::ParallelStarted { .. } => 16,
            EventKind::ParallelBranchCompleted { .. } => 17,
            EventKind::ParallelCompleted { .. } => 18,
            EventKind::ModelCallStarted { .. } => 19,
            EventKind::ModelCallCompleted(_) => 20,
            EventKind::ModelCallRetrying { .. } => 21,
            EventKind::ModelWarning { .. } => 22,
            EventKind::ModelTextDelta { .. } => 23,
            EventKind::AgentTurnStarted { .. } => 24,
            EventKind::AgentTurnCompleted { .. } => 25,
            EventKind::AgentToolCallStarted { .. } => 26,
            EventKind::AgentToolCallCompleted(_) => 27,
            EventKind::AgentLoopDetected { .. } => 28,
            EventKind::AgentSteeringReceived { .. } => 29,
            EventKind::AgentSteeringUndelivered { .. } => 30,
            EventKind::AgentContextWindowWarning { .. } => 31,
            EventKind::AgentCompactionStarted { .. } => 32,
            EventKind::AgentCompactionCompleted { .. } => 33,
            EventKind::AgentError { .. } => 34,
            EventKind::AgentSubagentSpawned { .. } => 35,
            EventKind::AgentSubagentCompleted { .. } => 36,
            EventKind::AgentSubagentFailed { .. } => 37,
            EventKind::AgentSubagentClosed { .. } => 38,
            EventKind::HookCompleted { .. } => 39,
            EventKind::PrepareStep { .. } => 40,
            EventKind::Unknown => usize::MAX,
        }
    }

    #[test]
    fn every_kind_reads_back_under_its_name() {
        let mut seen = Vec::new();
        for text in EVERY_KIND {
            let written: Value = serde_json::from_str(text).unwrap();
            let kind: EventKind = serde_json::from_value(written.clone()).unwrap();
            assert_ne!(kind, EventKind::Unknown, "{text}");
            assert_eq!(written["event"], kind.name(), "{text}");
            // Written again, the line has the same name and fields.
            let again = serde_json::to_value(&kind).unwrap();
            for (key, value) in written.as_object().unwrap() {
                if !value.is_null() {
                    assert_eq!(&again[key], value, "{text}: `{key}`");
                }
            }
            seen.push(ordinal(&kind));
        }
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..EVERY_KIND.len()).collect::<Vec<_>>(),
            "one line per kind"
        );
    }

    #[test]
    fn an_unknown_name_reads_as_unknown() {
        let unknown: Event = serde_json::from_value(serde_json::json!({
            "seq": 1, "ts": "t", "run_id": "R", "event": "SomethingNewer", "x": 1
        }))
        .unwrap();
        assert_eq!(unknown.kind, EventKind::Unknown);
    }
}
