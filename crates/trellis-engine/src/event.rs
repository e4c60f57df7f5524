//! Events: one JSON object per line, `{seq, ts, run_id, event, node_id?, ...payload}`, named as the
//! specification names them (`StageCompleted`, `WorkflowRunCompleted`, ...).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub ts: String,
    pub run_id: String,
    pub event: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub node_id: Option<String>,
    #[serde(flatten)]
    pub payload: Map<String, Value>,
}

/// Event names.
pub mod names {
    pub const RUN_STARTED: &str = "WorkflowRunStarted";
    pub const RUN_RESUMED: &str = "WorkflowRunResumed";
    pub const RUN_COMPLETED: &str = "WorkflowRunCompleted";
    pub const RUN_FAILED: &str = "WorkflowRunFailed";
    pub const RUN_WAITING: &str = "WorkflowRunWaitingForInput";
    pub const RUN_CANCELLED: &str = "WorkflowRunCancelled";
    pub const STAGE_STARTED: &str = "StageStarted";
    pub const STAGE_COMPLETED: &str = "StageCompleted";
    pub const STAGE_FAILED: &str = "StageFailed";
    pub const STAGE_RETRYING: &str = "StageRetrying";
    pub const EDGE_SELECTED: &str = "EdgeSelected";
    pub const LOOP_RESTARTED: &str = "LoopRestarted";
    pub const CHECKPOINT_SAVED: &str = "CheckpointSaved";
    pub const GOAL_GATE_UNMET: &str = "GoalGateUnmet";
    pub const HUMAN_GATE_ASKED: &str = "HumanGateAsked";
    pub const HUMAN_GATE_ANSWERED: &str = "HumanGateAnswered";
    pub const PARALLEL_STARTED: &str = "ParallelStarted";
    pub const PARALLEL_BRANCH_COMPLETED: &str = "ParallelBranchCompleted";
    pub const PARALLEL_COMPLETED: &str = "ParallelCompleted";
}
