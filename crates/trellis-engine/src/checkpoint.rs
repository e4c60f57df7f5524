//! The checkpoint: everything needed to continue a run after the process stops — where each line of
//! execution goes next (the main [`Track`] and, during a fan-out, one track per branch, nested as
//! fan-outs nest), the context, visit and edge counts, and the stages that finished. Written after
//! every stage.

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
    /// Stopped on request (Ctrl-C, a signal, the server); resumable.
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::WaitingForInput => "waiting_for_input",
            RunStatus::Cancelled => "cancelled",
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
    /// The handler's details (model, usage, script, artifacts), for preambles and `trellis show`.
    #[serde(flatten, default)]
    pub details: crate::details::StageDetails,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub files_touched: Vec<String>,
}

/// Where one line of execution stands: the main run, or one parallel branch.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Track {
    /// The node to execute next; `None` when this track is over.
    pub next_node: Option<String>,
    pub context: BTreeMap<String, Value>,
    /// Executions per node id.
    pub visits: BTreeMap<String, u32>,
    /// Times each edge was followed, keyed `from->to#index`.
    pub edge_counts: BTreeMap<String, u32>,
    /// The outcome of the last stage (conditional nodes pass it through).
    pub last_outcome: Option<Outcome>,
    /// The latest status of every goal-gate node executed so far.
    #[serde(default)]
    pub goal_gates: BTreeMap<String, StageStatus>,
    /// A fan-out in progress on this track, so a resume continues its branches.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parallel: Option<Box<ParallelProgress>>,
}

impl Track {
    /// The track at `path` (branch ids, one per nested fan-out) below this one.
    pub fn at_mut(&mut self, path: &[String]) -> Option<&mut Track> {
        match path.split_first() {
            None => Some(self),
            Some((id, rest)) => self
                .parallel
                .as_mut()?
                .branches
                .get_mut(id)?
                .track
                .at_mut(rest),
        }
    }

    /// The branch at `path` (non-empty) below this track.
    pub fn branch_mut(&mut self, path: &[String]) -> Option<&mut BranchProgress> {
        let (id, parent) = path.split_last()?;
        self.at_mut(parent)?.parallel.as_mut()?.branches.get_mut(id)
    }
}

/// A fan-out in progress, checkpointed after every branch stage so a resumed run continues each branch
/// where it stopped and does not re-run finished branch stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParallelProgress {
    pub node: String,
    pub visit: u32,
    /// By branch start node id.
    pub branches: BTreeMap<String, BranchProgress>,
}

/// One branch's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "BranchRecord", into = "BranchRecord")]
pub struct BranchProgress {
    pub track: Track,
    /// The context at the fan-out, to tell which keys the branch updated.
    pub before: BTreeMap<String, Value>,
    /// Set once the branch has finished.
    pub result: Option<BranchResult>,
}

/// How a branch is written in `checkpoint.json`: its track's fields beside its own, the next node as
/// `next`.
#[derive(Serialize, Deserialize)]
struct BranchRecord {
    next: Option<String>,
    context: BTreeMap<String, Value>,
    visits: BTreeMap<String, u32>,
    edge_counts: BTreeMap<String, u32>,
    last_outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    goal_gates: BTreeMap<String, StageStatus>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    parallel: Option<Box<ParallelProgress>>,
    before: BTreeMap<String, Value>,
    result: Option<BranchResult>,
}

impl From<BranchRecord> for BranchProgress {
    fn from(record: BranchRecord) -> Self {
        Self {
            track: Track {
                next_node: record.next,
                context: record.context,
                visits: record.visits,
                edge_counts: record.edge_counts,
                last_outcome: record.last_outcome,
                goal_gates: record.goal_gates,
                parallel: record.parallel,
            },
            before: record.before,
            result: record.result,
        }
    }
}

impl From<BranchProgress> for BranchRecord {
    fn from(branch: BranchProgress) -> Self {
        let track = branch.track;
        Self {
            next: track.next_node,
            context: track.context,
            visits: track.visits,
            edge_counts: track.edge_counts,
            last_outcome: track.last_outcome,
            goal_gates: track.goal_gates,
            parallel: track.parallel,
            before: branch.before,
            result: branch.result,
        }
    }
}

/// One branch's result, as `parallel.results` records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BranchResult {
    pub id: String,
    pub status: StageStatus,
    pub failure_reason: Option<String>,
    /// Context keys the branch changed (engine keys aside).
    pub updated_keys: Vec<String>,
    pub last_response: Option<Value>,
    /// What the branch's last stage produced — a model's response or a command's output — cut with a
    /// marker when long, so a fan-in (or a model choosing among branches) can judge it.
    #[serde(default)]
    pub output: Option<String>,
    pub score: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub run_id: String,
    pub status: RunStatus,
    /// The main line of execution (its fields are written at the top level of `checkpoint.json`).
    #[serde(flatten)]
    pub track: Track,
    /// The last stage-directory rank used.
    pub rank: u32,
    /// Stages executed, for the run-wide step budget.
    pub steps: u32,
    /// The last event sequence number.
    pub seq: u64,
    pub stages: Vec<StageRecord>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub failure: Option<String>,
}

impl Checkpoint {
    pub fn new(run_id: impl Into<String>, start: &str, context: BTreeMap<String, Value>) -> Self {
        Self {
            run_id: run_id.into(),
            status: RunStatus::Running,
            track: Track {
                next_node: Some(start.to_owned()),
                context,
                ..Track::default()
            },
            rank: 0,
            steps: 0,
            seq: 0,
            stages: Vec::new(),
            failure: None,
        }
    }

    /// The node the run continues at (or waits at); `None` once it is over.
    pub fn next_node(&self) -> Option<&str> {
        self.track.next_node.as_deref()
    }
}

/// The key under which an edge's follow count is kept.
pub fn edge_key(from: &str, to: &str, index: usize) -> String {
    format!("{from}->{to}#{index}")
}
