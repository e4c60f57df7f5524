//! The checkpoint: everything needed to continue a run after the process stops — where each line of
//! execution goes next (the main [`Track`] and, during a fan-out, one track per branch, nested as
//! fan-outs nest), the context, visit and edge counts, and the stages that finished.
//!
//! It is kept as a snapshot (`checkpoint.json`, written when a run starts and when it stops) plus a
//! journal (`journal.jsonl`): after every stage one [`JournalEntry`] is appended that holds only what
//! the stage changed — its stage record, the context keys it set, the counts it bumped. Replaying the
//! entries after the snapshot's [`Checkpoint::journal`] gives the checkpoint as of the last stage, so
//! what is written per stage does not grow with the run. [`Checkpoint::apply`] is the one place a
//! change is made, both while running and when replaying.
//!
//! The finished stages' records live in the journal only: a running engine keeps their count, not
//! the records, so its memory does not grow with the run's history, and a reader of the record
//! collects them from every entry.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use trellis_workflow::StageStatus;

use crate::outcome::Outcome;

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    WaitingForInput,
    /// Stopped on request (Ctrl-C, the web app's cancel button); resumable.
    Cancelled,
    /// Stopped from outside (SIGTERM or SIGHUP, the server stopping), or found `running` with no
    /// process left to run it (killed, the machine restarted); resumable. The engine itself reports
    /// [`RunStatus::Cancelled`]: the run library (`trellis-run`) records this one.
    Interrupted,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::WaitingForInput => "waiting_for_input",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Interrupted => "interrupted",
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(self, RunStatus::Succeeded | RunStatus::Failed)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One finished stage attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
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

/// A key of a [`Tracked`] map (a node id, or an edge's `from->to#index`): shared, not copied, by
/// the map, its record of what changed, the journal entry and the record's own copy of the
/// checkpoint, which would otherwise each hold a copy of every key — in a long run, the most of
/// what grows with it.
pub type Key = std::sync::Arc<str>;

/// A map of counts or statuses that remembers what changed since the last [`Tracked::take_change`],
/// so a journal entry holds only that. Read it as the map it derefs to; change it through its methods.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "BTreeMap<Key, V>")]
#[serde(bound(deserialize = "V: Deserialize<'de>"))]
pub struct Tracked<V> {
    map: BTreeMap<Key, V>,
    cleared: bool,
    changed: BTreeSet<Key>,
}

impl<V> From<BTreeMap<Key, V>> for Tracked<V> {
    fn from(map: BTreeMap<Key, V>) -> Self {
        Self {
            map,
            cleared: false,
            changed: BTreeSet::new(),
        }
    }
}

impl<V: Serialize> Serialize for Tracked<V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.map.serialize(serializer)
    }
}

impl<V: PartialEq> PartialEq for Tracked<V> {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl<V> std::ops::Deref for Tracked<V> {
    type Target = BTreeMap<Key, V>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<V> Default for Tracked<V> {
    fn default() -> Self {
        Self::from(BTreeMap::new())
    }
}

impl<V> Tracked<V> {
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl<V: Clone> Tracked<V> {
    /// Sets `key`; a key the map holds already is kept, not made again.
    pub fn insert(&mut self, key: &str, value: V) {
        let key = match self.map.get_key_value(key) {
            Some((held, _)) => Key::clone(held),
            None => Key::from(key),
        };
        self.changed.insert(Key::clone(&key));
        self.map.insert(key, value);
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.changed.clear();
        self.cleared = true;
    }

    /// The same values, with nothing marked as changed: what a new track starts from.
    #[must_use]
    pub fn fresh_copy(&self) -> Self {
        Self::from(self.map.clone())
    }

    /// What changed since the last call, and forgets it.
    pub fn take_change(&mut self) -> MapChange<V> {
        let set = std::mem::take(&mut self.changed)
            .into_iter()
            .filter_map(|key| {
                let value = self.map.get(&key)?.clone();
                Some((key, value))
            })
            .collect();
        MapChange {
            clear: std::mem::take(&mut self.cleared),
            set,
        }
    }

    fn apply(&mut self, change: &MapChange<V>) {
        if change.clear {
            self.map.clear();
        }
        for (key, value) in &change.set {
            self.map.insert(Key::clone(key), value.clone());
        }
    }
}

impl Tracked<u32> {
    /// Adds one to the count under `key`.
    pub fn bump(&mut self, key: &str) {
        let count = self.map.get(key).copied().unwrap_or(0);
        self.insert(key, count + 1);
    }
}

/// How a [`Tracked`] map changed: emptied first (a loop restart), then these keys set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "V: Serialize", deserialize = "V: Deserialize<'de>"))]
pub struct MapChange<V> {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clear: bool,
    #[serde(default = "BTreeMap::new", skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<Key, V>,
}

impl<V> Default for MapChange<V> {
    fn default() -> Self {
        Self {
            clear: false,
            set: BTreeMap::new(),
        }
    }
}

impl<V> MapChange<V> {
    pub fn is_empty(&self) -> bool {
        !self.clear && self.set.is_empty()
    }
}

/// Where one line of execution stands: the main run, or one parallel branch.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Track {
    /// The node to execute next; `None` when this track is over.
    pub next_node: Option<String>,
    pub context: BTreeMap<String, Value>,
    /// Executions per node id.
    pub visits: Tracked<u32>,
    /// Times each edge was followed, keyed `from->to#index`.
    pub edge_counts: Tracked<u32>,
    /// The outcome of the last stage (conditional nodes pass it through).
    pub last_outcome: Option<Outcome>,
    /// The edge (its index) followed into `next_node`, for edge-level fidelity and threads; none
    /// after a jump (a retry target, a fan-in) or at a branch's start.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub incoming_edge: Option<usize>,
    /// The latest status of every goal-gate node executed so far.
    #[serde(default)]
    pub goal_gates: Tracked<StageStatus>,
    /// How often each failure signature ([`crate::Failure::signature`]) ended a stage, for the
    /// graph's `loop_restart_signature_limit`: kept across loop restarts and successes.
    #[serde(default, skip_serializing_if = "Tracked::is_empty")]
    pub failure_signatures: Tracked<u32>,
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
    visits: Tracked<u32>,
    edge_counts: Tracked<u32>,
    last_outcome: Option<Outcome>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    incoming_edge: Option<usize>,
    #[serde(default, skip_serializing_if = "Tracked::is_empty")]
    goal_gates: Tracked<StageStatus>,
    #[serde(default, skip_serializing_if = "Tracked::is_empty")]
    failure_signatures: Tracked<u32>,
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
                incoming_edge: record.incoming_edge,
                goal_gates: record.goal_gates,
                failure_signatures: record.failure_signatures,
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
            incoming_edge: track.incoming_edge,
            goal_gates: track.goal_gates,
            failure_signatures: track.failure_signatures,
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
    /// The finished stage attempts, as a reader of the record collects them (a running engine
    /// keeps this empty and counts them in `stage_count`; records written before the journal hold
    /// them here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageRecord>,
    /// How many stage attempts finished.
    #[serde(default)]
    pub stage_count: usize,
    /// How many artifacts they captured.
    #[serde(default)]
    pub artifact_count: usize,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub failure: Option<String>,
    /// The number of the last journal entry this checkpoint includes (0: none; a record written
    /// before the journal existed has no entries either).
    #[serde(default)]
    pub journal: u64,
}

/// What one save appended to the journal: the counters as they stand and every change since the
/// previous entry, in the order they were made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Entries are numbered from 1, one after the other.
    pub n: u64,
    pub rank: u32,
    pub steps: u32,
    pub seq: u64,
    pub changes: Vec<Change>,
}

/// One change to a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// A stage attempt finished.
    Stage(Box<StageRecord>),
    /// A step of the track at `path` ended.
    Track(Box<TrackChange>),
    /// A fan-out began (or continued after a resume) on the track at `path`: its branches are now
    /// tracks of their own.
    ParallelStarted {
        path: Vec<String>,
        progress: Box<ParallelProgress>,
    },
    /// The branch at `path` reached its fan-in.
    BranchFinished {
        path: Vec<String>,
        result: Box<BranchResult>,
    },
}

/// What a step changed on one track.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrackChange {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
    pub next_node: Option<String>,
    pub last_outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incoming_edge: Option<usize>,
    /// The context keys set, with their values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "MapChange::is_empty")]
    pub visits: MapChange<u32>,
    #[serde(default, skip_serializing_if = "MapChange::is_empty")]
    pub edge_counts: MapChange<u32>,
    #[serde(default, skip_serializing_if = "MapChange::is_empty")]
    pub goal_gates: MapChange<StageStatus>,
    #[serde(default, skip_serializing_if = "MapChange::is_empty")]
    pub failure_signatures: MapChange<u32>,
    /// The track's fan-out is over.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parallel_ended: bool,
}

impl TrackChange {
    /// What `track` changed since its last change was taken, with `context` the changed keys
    /// (`parallel_ended` is for the caller, who knows whether a fan-out was recorded).
    pub fn take(path: &[String], track: &mut Track, context: BTreeMap<String, Value>) -> Self {
        Self {
            path: path.to_vec(),
            next_node: track.next_node.clone(),
            last_outcome: track.last_outcome.clone(),
            incoming_edge: track.incoming_edge,
            context,
            visits: track.visits.take_change(),
            edge_counts: track.edge_counts.take_change(),
            goal_gates: track.goal_gates.take_change(),
            failure_signatures: track.failure_signatures.take_change(),
            parallel_ended: false,
        }
    }
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
            stage_count: 0,
            artifact_count: 0,
            failure: None,
            journal: 0,
        }
    }

    /// Makes one change. A change for a track that is not there (a branch of a fan-out that has
    /// ended) changes nothing.
    pub fn apply(&mut self, change: &Change) {
        match change {
            Change::Stage(record) => {
                self.count(record);
                self.stages.push((**record).clone());
            }
            Change::Track(change) => {
                let Some(track) = self.track.at_mut(&change.path) else {
                    return;
                };
                track.next_node.clone_from(&change.next_node);
                track.last_outcome.clone_from(&change.last_outcome);
                track.incoming_edge = change.incoming_edge;
                for (key, value) in &change.context {
                    track.context.insert(key.clone(), value.clone());
                }
                track.visits.apply(&change.visits);
                track.edge_counts.apply(&change.edge_counts);
                track.goal_gates.apply(&change.goal_gates);
                track.failure_signatures.apply(&change.failure_signatures);
                if change.parallel_ended {
                    track.parallel = None;
                }
            }
            Change::ParallelStarted { path, progress } => {
                if let Some(track) = self.track.at_mut(path) {
                    track.parallel = Some(progress.clone());
                }
            }
            Change::BranchFinished { path, result } => {
                if let Some(branch) = self.track.branch_mut(path) {
                    branch.track.next_node = None;
                    branch.result = Some((**result).clone());
                }
            }
        }
    }

    /// Counts a finished stage.
    pub fn count(&mut self, record: &StageRecord) {
        self.stage_count += 1;
        self.artifact_count += record.details.artifacts.len();
    }

    /// Sets the counts from the stages held (a record written before the journal existed).
    pub fn recount(&mut self) {
        let stages = std::mem::take(&mut self.stages);
        (self.stage_count, self.artifact_count) = (0, 0);
        for record in &stages {
            self.count(record);
        }
        self.stages = stages;
    }

    /// Replays one journal entry (entries must come in order; see [`JournalEntry::n`]).
    pub fn replay(&mut self, entry: &JournalEntry) {
        for change in &entry.changes {
            self.apply(change);
        }
        self.rank = entry.rank;
        self.steps = entry.steps;
        self.seq = entry.seq;
        self.journal = entry.n;
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
