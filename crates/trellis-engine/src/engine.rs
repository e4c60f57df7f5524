//! The run loop: from the checkpoint's next node, execute each stage through its handler (with timeouts
//! and retries), merge its outcome into the context, record it, choose the next edge, checkpoint, and go
//! on until the exit node (or, in YAML, a terminal node). Goal gates are checked at the exit; visit
//! limits and a run-wide step budget stop runaways with a clear error.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use trellis_workflow::node_kind::{Fidelity, RetryPolicy};
use trellis_workflow::{Condition, NodeIndex, NodeKind, SourceFormat, StageStatus, Workflow};

use crate::checkpoint::{Checkpoint, RunStatus, StageRecord};
use crate::context::{ConditionView, RunContext};
use crate::event::{Event, names};
use crate::handler::{Handlers, Services, Settings, Stage};
use crate::keys;
use crate::outcome::{FailureClass, Outcome};
use crate::routing::{self, Route};
use crate::services::{BLOB_THRESHOLD, RouteOption};

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no edge from `{node}` matches its outcome `{outcome}`{}", tried_list(.tried))]
    NoEdge {
        node: String,
        outcome: StageStatus,
        tried: Vec<String>,
    },
    #[error("node `{node}` reached its visit limit of {limit}")]
    VisitLimit { node: String, limit: u32 },
    #[error(
        "the run executed {steps} stages without finishing, its step budget: a loop probably never ends"
    )]
    StepBudget { steps: u32 },
    #[error("no handler for {kind} nodes (node `{node}`)")]
    NoHandler { node: String, kind: &'static str },
    #[error("goal gate `{node}` ended {status} and no retry target is set")]
    GoalGateUnmet { node: String, status: StageStatus },
    #[error("stage `{node}` cannot run: {reason}")]
    Configuration { node: String, reason: String },
    #[error("the checkpoint names node `{node}`, which this workflow does not have")]
    UnknownNode { node: String },
    #[error(
        "choosing the edge out of `{node}` needs a model to judge its `when` conditions: {reason}"
    )]
    Routing { node: String, reason: String },
    #[error("cannot write the run record: {source}")]
    Store {
        #[from]
        source: std::io::Error,
    },
}

fn tried_list(tried: &[String]) -> String {
    if tried.is_empty() {
        String::new()
    } else {
        format!("; conditions tried: {}", tried.join("; "))
    }
}

/// How a run ended.
#[derive(Debug)]
pub struct RunResult {
    pub status: RunStatus,
    pub checkpoint: Checkpoint,
    pub error: Option<EngineError>,
}

/// Stage bookkeeping shared by concurrent branches: directory ranks, the step count, finished stages.
/// Folded back into the checkpoint before every save.
#[derive(Default)]
pub(crate) struct Ledger {
    rank: AtomicU32,
    steps: AtomicU32,
    stages: Mutex<Vec<StageRecord>>,
}

impl Ledger {
    fn from_checkpoint(cp: &Checkpoint) -> Self {
        Self {
            rank: AtomicU32::new(cp.rank),
            steps: AtomicU32::new(cp.steps),
            stages: Mutex::new(cp.stages.clone()),
        }
    }

    fn write_to(&self, cp: &mut Checkpoint) {
        cp.rank = self.rank.load(Ordering::SeqCst);
        cp.steps = self.steps.load(Ordering::SeqCst);
        cp.stages.clone_from(
            &self
                .stages
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }

    pub(crate) fn record(&self, record: StageRecord) {
        self.stages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(record);
    }

    pub(crate) fn steps(&self) -> u32 {
        self.steps.load(Ordering::SeqCst)
    }

    pub(crate) fn steps_add(&self, n: u32) {
        self.steps.fetch_add(n, Ordering::SeqCst);
    }

    pub(crate) fn next_rank(&self) -> u32 {
        self.rank.fetch_add(1, Ordering::SeqCst) + 1
    }
}

impl crate::handler::History for Ledger {
    fn finished(&self) -> Vec<StageRecord> {
        self.stages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Runs one workflow.
pub struct Engine {
    pub workflow: Arc<Workflow>,
    pub handlers: Arc<Handlers>,
    pub services: Services,
    pub settings: Settings,
    pub(crate) seq: Arc<AtomicU64>,
    pub(crate) run_id: String,
    /// Sub-workflow nesting depth (0 for the top-level run).
    pub(crate) depth: u32,
    /// Held while a checkpoint is taken and written.
    pub(crate) save_turn: tokio::sync::Mutex<()>,
}

/// Runs blocking file work on the blocking pool, off the async workers (DESIGN.md §5).
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// A stage attempt's `status.json`: its outcome plus where and when it ran.
pub(crate) fn status_json(
    outcome: &Outcome,
    node_id: &str,
    visit: u32,
    attempt: u32,
    duration_ms: u64,
) -> Value {
    let mut status = serde_json::to_value(outcome).unwrap_or_default();
    if let Value::Object(map) = &mut status {
        map.insert("node_id".into(), json!(node_id));
        map.insert("visit".into(), json!(visit));
        map.insert("attempt".into(), json!(attempt));
        map.insert("duration_ms".into(), json!(duration_ms));
    }
    status
}

/// The current time as RFC 3339 with milliseconds.
pub fn timestamp() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl Engine {
    pub fn new(
        workflow: Arc<Workflow>,
        handlers: Arc<Handlers>,
        services: Services,
        settings: Settings,
        run_id: impl Into<String>,
    ) -> Self {
        Self {
            workflow,
            handlers,
            services,
            settings,
            seq: Arc::new(AtomicU64::new(0)),
            run_id: run_id.into(),
            depth: 0,
            save_turn: tokio::sync::Mutex::new(()),
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// A fresh checkpoint for a new run: the start node next, the engine keys and any `--set` values.
    pub fn first_checkpoint(&self, initial: BTreeMap<String, Value>) -> Option<Checkpoint> {
        let start = self.workflow.start?;
        Some(Checkpoint::new(
            self.run_id.clone(),
            &self.workflow.nodes[start].id,
            initial,
        ))
    }
}

impl crate::handler::Emitter for Engine {
    fn emit(&self, event: &str, node: Option<&str>, payload: Value) {
        Engine::emit(self, event, node, payload);
    }
}

impl Engine {
    pub fn emit(&self, event: &str, node: Option<&str>, payload: Value) {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let payload = match payload {
            Value::Object(map) => map,
            Value::Null => serde_json::Map::new(),
            other => serde_json::Map::from_iter([("value".to_owned(), other)]),
        };
        self.services.events.emit(&Event {
            seq,
            ts: timestamp(),
            run_id: self.run_id.clone(),
            event: event.to_owned(),
            node_id: node.map(str::to_owned),
            payload,
        });
    }

    /// Saves the checkpoint (on the blocking pool: it writes and syncs a file). Saves are serialized, so
    /// a later state is never overwritten by an earlier one.
    pub(crate) async fn save(
        &self,
        cp: &mut Checkpoint,
        ledger: &Ledger,
        context: &RunContext,
    ) -> Result<(), EngineError> {
        let _turn = self.save_turn.lock().await;
        self.save_in_turn(cp, ledger, context).await
    }

    /// Saves the checkpoint; the caller holds `save_turn`.
    pub(crate) async fn save_in_turn(
        &self,
        cp: &mut Checkpoint,
        ledger: &Ledger,
        context: &RunContext,
    ) -> Result<(), EngineError> {
        ledger.write_to(cp);
        cp.context = context.snapshot();
        cp.seq = self.seq.load(Ordering::SeqCst);
        let (store, snapshot) = (self.services.store.clone(), cp.clone());
        blocking(move || store.save_checkpoint(&snapshot)).await?;
        Ok(())
    }

    /// Creates a stage attempt's directory (on the blocking pool).
    pub(crate) async fn stage_dir(
        &self,
        rank: u32,
        node: &str,
        visit: u32,
    ) -> Result<std::path::PathBuf, EngineError> {
        let (store, node) = (self.services.store.clone(), node.to_owned());
        Ok(blocking(move || store.stage_dir(rank, &node, visit)).await?)
    }

    /// Writes a stage attempt's `status.json` (on the blocking pool).
    pub(crate) async fn write_status(
        &self,
        dir: &std::path::Path,
        status: Value,
    ) -> Result<(), EngineError> {
        let (store, dir) = (self.services.store.clone(), dir.to_path_buf());
        Ok(blocking(move || store.write_status(&dir, &status)).await?)
    }

    /// Runs from `checkpoint` until the run ends or waits for input.
    pub async fn run(&self, mut cp: Checkpoint) -> RunResult {
        // A sub-workflow shares its parent's event sequence.
        if self.depth == 0 {
            self.seq.store(cp.seq, Ordering::SeqCst);
        }
        let context = RunContext::from_map(std::mem::take(&mut cp.context));
        self.set_engine_keys(&context);
        let resumed = !cp.stages.is_empty() || cp.status == RunStatus::WaitingForInput;
        cp.status = RunStatus::Running;
        self.emit(
            if resumed { names::RUN_RESUMED } else { names::RUN_STARTED },
            None,
            json!({ "workflow": self.workflow.name, "goal": self.workflow.graph.goal, "next_node": cp.next_node }),
        );
        let ledger = Ledger::from_checkpoint(&cp);
        let result = self.run_loop(&mut cp, &ledger, &context, resumed).await;
        ledger.write_to(&mut cp);
        let (status, error) = match result {
            Ok(status) => (status, None),
            Err(error) => {
                cp.failure = Some(error.to_string());
                (RunStatus::Failed, Some(error))
            }
        };
        cp.status = status;
        let (event, payload) = match status {
            RunStatus::Succeeded => (
                names::RUN_COMPLETED,
                json!({ "status": "succeeded", "stages": cp.stages.len() }),
            ),
            RunStatus::WaitingForInput => (names::RUN_WAITING, json!({ "node": cp.next_node })),
            _ => (
                names::RUN_FAILED,
                json!({ "status": "failed", "error": cp.failure }),
            ),
        };
        self.emit(event, None, payload);
        if let Err(error) = self.save(&mut cp, &ledger, &context).await {
            return RunResult {
                status: RunStatus::Failed,
                checkpoint: cp,
                error: Some(error),
            };
        }
        RunResult {
            status,
            checkpoint: cp,
            error,
        }
    }

    fn set_engine_keys(&self, context: &RunContext) {
        context.set(keys::RUN_ID, self.run_id.clone());
        context.set(keys::WORK_DIR, self.settings.work_dir.display().to_string());
        for (key, value) in &self.workflow.graph.attributes {
            context.set(format!("{}{key}", keys::GRAPH_PREFIX), value.clone());
        }
        if let Some(goal) = &self.workflow.graph.goal {
            context.set("graph.goal", goal.clone());
        }
    }

    /// Resolves the fidelity and thread of the node about to run (edge, then node, then graph; the
    /// context document) into `internal.fidelity` and `internal.thread_id`. The first node after a
    /// resume gets `summary:high` instead of `full`: its conversation thread is gone with the old process.
    pub(crate) fn set_fidelity_keys(
        &self,
        index: NodeIndex,
        context: &RunContext,
        degrade_full: &mut bool,
    ) {
        let node = &self.workflow.nodes[index];
        let Some(llm) = node.kind.llm() else {
            return;
        };
        let edge = context
            .get(keys::INCOMING_EDGE)
            .and_then(|v| v.as_u64())
            .and_then(|i| self.workflow.edges.get(usize::try_from(i).ok()?))
            .filter(|e| e.to == index);
        let mut fidelity = edge
            .and_then(|e| e.fidelity)
            .or(llm.fidelity)
            .or(self.workflow.graph.default_fidelity)
            .unwrap_or_default();
        if std::mem::take(degrade_full) && fidelity == Fidelity::Full {
            fidelity = Fidelity::SummaryHigh;
        }
        let thread = edge
            .and_then(|e| e.thread_id.clone())
            .or_else(|| llm.thread_id.clone())
            .or_else(|| self.workflow.graph.default_thread.clone());
        context.set(keys::FIDELITY, fidelity.as_str());
        context.set(keys::THREAD_ID, thread.map_or(Value::Null, Value::String));
    }

    async fn run_loop(
        &self,
        cp: &mut Checkpoint,
        ledger: &Ledger,
        context: &RunContext,
        resumed: bool,
    ) -> Result<RunStatus, EngineError> {
        let mut degrade_full = resumed;
        loop {
            let Some(node_id) = cp.next_node.clone() else {
                return Ok(RunStatus::Succeeded);
            };
            let index =
                self.workflow
                    .node_index(&node_id)
                    .ok_or_else(|| EngineError::UnknownNode {
                        node: node_id.clone(),
                    })?;
            let node = &self.workflow.nodes[index];
            if matches!(node.kind, NodeKind::Exit)
                && let Some(target) = self.check_goal_gates(cp)?
            {
                cp.next_node = Some(target);
                self.save(cp, ledger, context).await?;
                continue;
            }
            if ledger.steps() >= self.settings.max_steps {
                return Err(EngineError::StepBudget {
                    steps: ledger.steps(),
                });
            }
            let visit = cp.visits.get(&node_id).copied().unwrap_or(0) + 1;
            if let Some(limit) = node
                .common
                .max_visits
                .or(self.workflow.graph.max_node_visits)
                && visit > limit
            {
                return Err(EngineError::VisitLimit {
                    node: node_id,
                    limit,
                });
            }
            context.set(keys::CURRENT_NODE, node_id.clone());
            context.set(keys::NODE_VISIT_COUNT, visit);
            self.set_fidelity_keys(index, context, &mut degrade_full);
            let (outcome, jump) = match &node.kind {
                NodeKind::Parallel(config) => {
                    self.run_parallel(ledger, cp, index, visit, config, context)
                        .await?
                }
                NodeKind::SubWorkflow(config) => (
                    self.run_sub_workflow(ledger, index, visit, &config.workflow, context)
                        .await?,
                    None,
                ),
                _ => (
                    self.execute_with_retries(
                        ledger,
                        index,
                        visit,
                        context,
                        cp.last_outcome.as_ref(),
                    )
                    .await?,
                    None,
                ),
            };
            if outcome.waiting_for_input {
                self.save(cp, ledger, context).await?;
                return Ok(RunStatus::WaitingForInput);
            }
            // A setup problem (no model, an invalid child workflow) is not an outcome to route on.
            if let Some(failure) = outcome
                .failure
                .as_ref()
                .filter(|f| f.class == FailureClass::Configuration)
            {
                cp.visits.insert(node_id.clone(), visit);
                return Err(EngineError::Configuration {
                    node: node_id,
                    reason: failure.reason.clone(),
                });
            }
            cp.visits.insert(node_id.clone(), visit);
            self.apply_outcome(context, &node_id, &outcome).await?;
            if node.common.goal_gate {
                cp.goal_gates.insert(node_id.clone(), outcome.status);
            }
            cp.next_node = if matches!(node.kind, NodeKind::Exit) {
                None
            } else if let Some(fan_in) = jump {
                Some(fan_in)
            } else {
                self.follow_edge(cp, index, &outcome, context).await?
            };
            cp.last_outcome = Some(outcome);
            cp.parallel = None;
            self.save(cp, ledger, context).await?;
            self.emit(
                names::CHECKPOINT_SAVED,
                Some(&node_id),
                json!({ "next_node": cp.next_node }),
            );
        }
    }

    /// Chooses and follows the edge out of a stage. A `loop_restart` edge starts the loop afresh: visit
    /// counts and goal-gate results are cleared (edge counts are cleared by `next_node`).
    async fn follow_edge(
        &self,
        cp: &mut Checkpoint,
        index: NodeIndex,
        outcome: &Outcome,
        context: &RunContext,
    ) -> Result<Option<String>, EngineError> {
        match self
            .next_node(&mut cp.edge_counts, index, outcome, context)
            .await?
        {
            Some((target, true)) => {
                cp.visits.clear();
                cp.goal_gates.clear();
                self.emit(
                    names::LOOP_RESTARTED,
                    Some(&self.workflow.nodes[index].id),
                    json!({ "to": target }),
                );
                Ok(Some(target))
            }
            next => Ok(next.map(|(target, _)| target)),
        }
    }

    /// The goal gate that is not met, if any: its retry target, or an error when it has none.
    fn check_goal_gates(&self, cp: &Checkpoint) -> Result<Option<String>, EngineError> {
        let unmet = cp
            .goal_gates
            .iter()
            .find(|(_, s)| !matches!(s, StageStatus::Succeeded | StageStatus::PartiallySucceeded));
        let Some((gate, status)) = unmet else {
            return Ok(None);
        };
        let node = self
            .workflow
            .node(gate)
            .ok_or_else(|| EngineError::UnknownNode { node: gate.clone() })?;
        self.emit(
            names::GOAL_GATE_UNMET,
            Some(gate),
            json!({ "status": status }),
        );
        match self.retry_target(node) {
            Some(target) => Ok(Some(target)),
            None => Err(EngineError::GoalGateUnmet {
                node: gate.clone(),
                status: *status,
            }),
        }
    }

    /// The retry-target chain: node `retry_target`, node `fallback_retry_target`, then the graph's.
    fn retry_target(&self, node: &trellis_workflow::Node) -> Option<String> {
        let graph = &self.workflow.graph;
        [
            &node.common.retry_target,
            &node.common.fallback_retry_target,
            &graph.retry_target,
            &graph.fallback_retry_target,
        ]
        .into_iter()
        .flatten()
        .find(|t| self.workflow.node_index(t).is_some())
        .cloned()
    }

    fn max_attempts(&self, node: &trellis_workflow::Node) -> u32 {
        match node.common.retry_policy {
            Some(policy) => policy.max_attempts,
            None => node
                .common
                .max_retries
                .unwrap_or(self.workflow.graph.default_max_retries)
                .saturating_add(1),
        }
    }

    pub(crate) async fn execute_with_retries(
        &self,
        ledger: &Ledger,
        index: NodeIndex,
        visit: u32,
        context: &RunContext,
        previous: Option<&Outcome>,
    ) -> Result<Outcome, EngineError> {
        let node = &self.workflow.nodes[index];
        let handler = self
            .handlers
            .get(node.kind.type_name())
            .ok_or(EngineError::NoHandler {
                node: node.id.clone(),
                kind: node.kind.type_name(),
            })?
            .clone();
        let max_attempts = self.max_attempts(node).max(1);
        let timeout = node.common.timeout.or(self.workflow.graph.stall_timeout);
        let mut attempt = 1;
        loop {
            let rank = ledger.next_rank();
            ledger.steps.fetch_add(1, Ordering::SeqCst);
            let dir = self.stage_dir(rank, &node.id, visit).await?;
            let dir_name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            self.emit(names::STAGE_STARTED, Some(&node.id), json!({ "visit": visit, "attempt": attempt, "dir": dir_name, "type": node.kind.type_name() }));
            let stage = Stage {
                workflow: &self.workflow,
                node,
                context,
                dir: &dir,
                run_id: &self.run_id,
                visit,
                attempt,
                previous,
                history: ledger,
                services: &self.services,
                settings: &self.settings,
                emitter: self,
            };
            let started = Instant::now();
            let execution = handler.execute(&stage);
            let outcome = match timeout.filter(|_| !matches!(node.kind, NodeKind::Human(_))) {
                Some(limit) => tokio::time::timeout(limit, execution)
                    .await
                    .unwrap_or_else(|_| {
                        Outcome::failed(
                            FailureClass::Timeout,
                            format!("timed out after {}", humantime::format_duration(limit)),
                        )
                    }),
                None => execution.await,
            };
            let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let status = status_json(&outcome, &node.id, visit, attempt, duration_ms);
            self.write_status(&dir, status).await?;
            context.set(
                format!("{}{}", keys::RETRY_COUNT_PREFIX, node.id),
                attempt - 1,
            );
            if outcome.waiting_for_input {
                return Ok(outcome);
            }
            ledger.record(StageRecord {
                rank,
                node_id: node.id.clone(),
                visit,
                attempt,
                status: outcome.status,
                duration_ms,
                failure_reason: outcome.failure_reason().map(str::to_owned),
                dir: dir_name,
                details: outcome.details.clone(),
                files_touched: outcome.files_touched.clone(),
            });
            if outcome.retryable() && attempt < max_attempts {
                let delay = backoff(node.common.retry_policy, attempt);
                self.emit(
                    names::STAGE_RETRYING,
                    Some(&node.id),
                    json!({ "attempt": attempt, "next_attempt": attempt + 1, "delay_ms": delay.as_millis(), "reason": outcome.failure_reason() }),
                );
                tokio::time::sleep(delay).await;
                attempt += 1;
                continue;
            }
            self.emit_stage_end(&node.id, &outcome, visit, attempt, duration_ms);
            return Ok(outcome);
        }
    }

    /// Emits `StageCompleted`, or `StageFailed` for a failed outcome.
    fn emit_stage_end(
        &self,
        node_id: &str,
        outcome: &Outcome,
        visit: u32,
        attempt: u32,
        duration_ms: u64,
    ) {
        let event = if outcome.status == StageStatus::Failed {
            names::STAGE_FAILED
        } else {
            names::STAGE_COMPLETED
        };
        let mut payload = json!({
            "status": outcome.status, "visit": visit, "attempt": attempt, "duration_ms": duration_ms,
            "failure_reason": outcome.failure_reason(), "files_touched": outcome.files_touched,
        });
        // Model stages say which model answered and what it cost.
        for key in ["model", "provider", "usage"] {
            if let Some(value) = outcome.details.get(key) {
                payload[key] = value.clone();
            }
        }
        self.emit(event, Some(node_id), payload);
    }

    /// Ends a stage that ran in one attempt outside the handler path (a fan-out, a sub-workflow): writes
    /// its `status.json`, records it, and emits `StageCompleted` or `StageFailed`.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call per stage kind; a struct would only rename the list"
    )]
    pub(crate) async fn finish_stage(
        &self,
        ledger: &Ledger,
        rank: u32,
        dir: &std::path::Path,
        node_id: &str,
        visit: u32,
        outcome: &Outcome,
        duration_ms: u64,
        status: Value,
    ) -> Result<(), EngineError> {
        self.write_status(dir, status).await?;
        ledger.record(StageRecord {
            rank,
            node_id: node_id.to_owned(),
            visit,
            attempt: 1,
            status: outcome.status,
            duration_ms,
            failure_reason: outcome.failure_reason().map(str::to_owned),
            dir: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            details: outcome.details.clone(),
            files_touched: outcome.files_touched.clone(),
        });
        self.emit_stage_end(node_id, outcome, visit, 1, duration_ms);
        Ok(())
    }

    /// Merges a stage's outcome into the context: its updates (large values as blobs) and the engine keys.
    pub(crate) async fn apply_outcome(
        &self,
        context: &RunContext,
        node_id: &str,
        outcome: &Outcome,
    ) -> Result<(), EngineError> {
        let mut updates = outcome.context_updates.clone();
        for value in updates.values_mut() {
            if serde_json::to_string(value).map_or(0, |s| s.len()) > BLOB_THRESHOLD {
                let bytes = match &*value {
                    Value::String(text) => text.clone().into_bytes(),
                    other => serde_json::to_vec(other).unwrap_or_default(),
                };
                let blobs = self.services.blobs.clone();
                *value = Value::String(blocking(move || blobs.put(&bytes)).await?);
            }
        }
        context.merge(&updates);
        context.set(keys::OUTCOME, outcome.status.as_str());
        context.set(
            keys::PREFERRED_LABEL,
            outcome.preferred_label.clone().unwrap_or_default(),
        );
        // The failure keys describe the last failure (the context document): a later success keeps them.
        if let Some(failure) = &outcome.failure {
            context.set(keys::FAILURE_CLASS, failure.class.as_str());
            context.set(keys::FAILURE_REASON, failure.reason.clone());
            let first_line = failure.reason.lines().next().unwrap_or_default();
            context.set(
                keys::FAILURE_SIGNATURE,
                format!("{node_id}:{}:{first_line}", failure.class.as_str()),
            );
        }
        Ok(())
    }

    /// Chooses the next node; `None` ends the run (a YAML terminal node).
    pub(crate) async fn next_node(
        &self,
        edge_counts: &mut BTreeMap<String, u32>,
        index: NodeIndex,
        outcome: &Outcome,
        context: &RunContext,
    ) -> Result<Option<(String, bool)>, EngineError> {
        let node = &self.workflow.nodes[index];
        let view = ConditionView {
            context,
            outcome: Some(outcome.status),
            preferred_label: outcome.preferred_label.as_deref(),
            blobs: &*self.services.blobs,
        };
        let edge = match routing::select(&self.workflow, index, outcome, &view, edge_counts) {
            Route::Edge(edge) => Some(edge),
            Route::AskModel {
                candidates,
                fallback,
            } => {
                self.ask_router(node, &candidates, fallback, context)
                    .await?
            }
            Route::NoEdges if self.workflow.format == SourceFormat::Yaml => return Ok(None),
            Route::NoEdges => None,
            Route::NoMatch { tried } => {
                if outcome.status != StageStatus::Failed {
                    return Err(EngineError::NoEdge {
                        node: node.id.clone(),
                        outcome: outcome.status,
                        tried,
                    });
                }
                None
            }
        };
        let Some(edge) = edge else {
            // A failed node with nowhere to go tries its retry-target chain.
            if outcome.status == StageStatus::Failed
                && let Some(target) = self.retry_target(node)
            {
                self.emit(
                    names::EDGE_SELECTED,
                    Some(&node.id),
                    json!({ "to": target, "reason": "retry_target" }),
                );
                return Ok(Some((target, false)));
            }
            return Err(EngineError::NoEdge {
                node: node.id.clone(),
                outcome: outcome.status,
                tried: Vec::new(),
            });
        };
        let edge_index = edge;
        let edge = &self.workflow.edges[edge];
        let key = routing::key_of(&self.workflow, edge);
        if edge.loop_restart {
            // A loop restart begins the loop afresh: edge bounds count again from zero.
            edge_counts.clear();
        }
        *edge_counts.entry(key).or_insert(0) += 1;
        context.set(keys::INCOMING_EDGE, edge_index);
        let target = self.workflow.nodes[edge.to].id.clone();
        self.emit(
            names::EDGE_SELECTED,
            Some(&node.id),
            json!({ "to": target, "label": edge.label, "condition": edge.condition.as_ref().map(Condition::source), "when": edge.when, "loop_restart": edge.loop_restart }),
        );
        Ok(Some((target, edge.loop_restart)))
    }

    async fn ask_router(
        &self,
        node: &trellis_workflow::Node,
        candidates: &[usize],
        fallback: Option<usize>,
        context: &RunContext,
    ) -> Result<Option<usize>, EngineError> {
        let options: Vec<RouteOption> = candidates
            .iter()
            .map(|&e| RouteOption {
                target: self.workflow.nodes[self.workflow.edges[e].to].id.clone(),
                when: self.workflow.edges[e].when.clone().unwrap_or_default(),
            })
            .collect();
        let Some(router) = &self.services.router else {
            return Err(EngineError::Routing {
                node: node.id.clone(),
                reason: "no model is configured".into(),
            });
        };
        match router.choose(&node.id, &options, &context.snapshot()).await {
            Ok(Some(choice)) if choice < candidates.len() => Ok(Some(candidates[choice])),
            Ok(_) => Ok(fallback),
            Err(reason) => Err(EngineError::Routing {
                node: node.id.clone(),
                reason,
            }),
        }
    }
}

/// The delay before attempt `attempt + 1`: the policy's schedule (0.5 s doubling without one), capped at
/// 60 s, with up to 10% jitter.
pub fn backoff(policy: Option<RetryPolicy>, attempt: u32) -> Duration {
    let (initial, factor) = policy.map_or((Duration::from_millis(500), 2.0), |p| {
        (p.initial_delay, p.backoff_factor)
    });
    let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
    let delay = initial
        .mul_f64(factor.powi(exponent))
        .min(RetryPolicy::MAX_DELAY);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    delay + delay.mul_f64(f64::from(nanos % 1000) / 10_000.0)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use async_trait::async_trait;
    use trellis_syntax::SourceFile;
    use trellis_workflow::{CompileOptions, compile};

    use super::*;
    use crate::handler::{Handler, Stage};
    use crate::services::memory::{MemoryBlobs, MemoryEvents, NoAnswers};
    use crate::services::{BLOB_PREFIX, BlobStore, RunStore};

    /// A run store in a temporary directory that keeps the last checkpoint in memory.
    struct TestStore {
        root: PathBuf,
        checkpoint: Mutex<Option<Checkpoint>>,
    }

    impl RunStore for TestStore {
        fn stage_dir(&self, rank: u32, node: &str, visit: u32) -> std::io::Result<PathBuf> {
            let dir = self.root.join(format!("{rank:03}-{node}@{visit}"));
            std::fs::create_dir_all(&dir)?;
            Ok(dir)
        }
        fn write_status(&self, _dir: &Path, _status: &Value) -> std::io::Result<()> {
            Ok(())
        }
        fn save_checkpoint(&self, checkpoint: &Checkpoint) -> std::io::Result<()> {
            *self.checkpoint.lock().unwrap() = Some(checkpoint.clone());
            Ok(())
        }
        fn child(&self, dir: &Path) -> std::io::Result<Arc<dyn RunStore>> {
            Ok(Arc::new(TestStore {
                root: dir.join("child"),
                checkpoint: Mutex::default(),
            }))
        }
    }

    /// Produces a context value of 200,000 characters.
    struct Big;

    #[async_trait]
    impl Handler for Big {
        async fn execute(&self, _stage: &Stage<'_>) -> Outcome {
            Outcome::success()
                .with_update("big.value", "x".repeat(200_000))
                .with_update("small", "s")
        }
    }

    #[tokio::test]
    async fn large_values_become_blobs_that_conditions_still_read() {
        let text = "digraph B { start [shape=Mdiamond]\n exit [shape=Msquare]\n big [shape=parallelogram, script=\"-\"]\n other [shape=parallelogram, script=\"-\"]\n start -> big\n big -> exit [condition=\"big.value contains xxxx\"]\n big -> other\n other -> exit }";
        let file = SourceFile::new("b.fabro", text);
        let workflow = compile(
            &file,
            trellis_syntax::parse(&file),
            &CompileOptions::default(),
        )
        .workflow
        .unwrap();
        let mut handlers = Handlers::with_control_flow();
        handlers.register("command", Arc::new(Big));
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(TestStore {
            root: dir.path().to_path_buf(),
            checkpoint: Mutex::default(),
        });
        let blobs = Arc::new(MemoryBlobs::default());
        let services = Services {
            store: store.clone(),
            blobs: blobs.clone(),
            events: Arc::new(MemoryEvents::default()),
            interviewer: Arc::new(NoAnswers),
            router: None,
        };
        let engine = Engine::new(
            Arc::new(workflow),
            Arc::new(handlers),
            services,
            Settings::default(),
            "test-run",
        );
        let result = engine
            .run(engine.first_checkpoint(BTreeMap::new()).unwrap())
            .await;
        assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
        let nodes: Vec<&str> = result
            .checkpoint
            .stages
            .iter()
            .map(|s| s.node_id.as_str())
            .collect();
        assert_eq!(
            nodes,
            ["start", "big", "exit"],
            "the condition saw the real value"
        );
        let reference = result.checkpoint.context["big.value"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(reference.starts_with(BLOB_PREFIX), "{reference}");
        assert_eq!(blobs.get(&reference).unwrap().len(), 200_000);
        assert_eq!(
            result.checkpoint.context["small"], "s",
            "small values stay inline"
        );
        assert_eq!(
            store.checkpoint.lock().unwrap().as_ref().unwrap().context["big.value"],
            reference.as_str()
        );
    }
}
