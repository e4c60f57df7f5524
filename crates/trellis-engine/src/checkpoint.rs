//! The checkpoint: everything needed to continue a run after the process stops — where to go next, the
//! context, visit and edge counts, and the stages that finished. Written after every stage.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use trellis_workflow::StageStatus;

use crate::outcome::Outcome;

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    WaitingForInput,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::WaitingForInput => "waiting_for_input",
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(self, RunStatus::Succeeded | RunStatus::Failed)
    }
}

/// One finished stage attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageRecord {
    pub rank: u32,
    pub node_id: String,
    pub visit: u32,
    pub attempt: u32,
    pub status: StageStatus,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub failure_reason: Option<String>,
    pub dir: String,
    /// The handler's details (model, usage, script, files), for preambles.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub details: BTreeMap<String, Value>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub files_touched: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub run_id: String,
    pub status: RunStatus,
    /// The node to execute next; `None` when the run is over.
    pub next_node: Option<String>,
    pub context: BTreeMap<String, Value>,
    /// Executions per node id.
    pub visits: BTreeMap<String, u32>,
    /// Times each edge was followed, keyed `from->to#index`.
    pub edge_counts: BTreeMap<String, u32>,
    /// The last stage-directory rank used.
    pub rank: u32,
    /// Stages executed, for the run-wide step budget.
    pub steps: u32,
    /// The last event sequence number.
    pub seq: u64,
    pub stages: Vec<StageRecord>,
    /// The outcome of the last stage (conditional nodes pass it through).
    pub last_outcome: Option<Outcome>,
    /// The latest status of every goal-gate node executed so far.
    pub goal_gates: BTreeMap<String, StageStatus>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub failure: Option<String>,
    /// A parallel fan-out in progress, so a resume continues its branches.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parallel: Option<crate::parallel::ParallelProgress>,
}

impl Checkpoint {
    pub fn new(run_id: impl Into<String>, start: &str, context: BTreeMap<String, Value>) -> Self {
        Self {
            run_id: run_id.into(),
            status: RunStatus::Running,
            next_node: Some(start.to_owned()),
            context,
            visits: BTreeMap::new(),
            edge_counts: BTreeMap::new(),
            rank: 0,
            steps: 0,
            seq: 0,
            stages: Vec::new(),
            last_outcome: None,
            goal_gates: BTreeMap::new(),
            failure: None,
            parallel: None,
        }
    }
}

/// The key under which an edge's follow count is kept.
pub fn edge_key(from: &str, to: &str, index: usize) -> String {
    format!("{from}->{to}#{index}")
}
