//! Parallel fan-out and fan-in (DESIGN.md §3). A branch is the chain of nodes from one outgoing edge of
//! the fan-out node up to, not including, the fan-in node: the nearest `tripleoctagon` every branch
//! reaches. Each branch runs on a deep copy of the context, at most `max_parallel` at a time; branch
//! updates reach the main context only through `parallel.results` (one entry per branch, in declaration
//! order) and the fan-in's `parallel.fan_in.best_id` / `best_outcome`.
//!
//! `join_policy` decides when the merge may proceed — `wait_all`, `first_success`, `k_of_n(N)`,
//! `quorum(F)` — and branches still running then are cancelled (their processes killed). `error_policy`:
//! `continue` waits for the policy, `fail_fast` stops at the first failed branch, `ignore` leaves failed
//! branches out of the count and the results.
//!
//! Each branch's progress is checkpointed after every one of its stages ([`ParallelProgress`]): a run
//! killed during a fan-out resumes every unfinished branch at the stage it was in, and reuses the results
//! of finished ones.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use trellis_workflow::node_kind::{ErrorPolicy, JoinPolicy, ParallelConfig};
use trellis_workflow::{NodeIndex, NodeKind, StageStatus};

use crate::checkpoint::Checkpoint;
use crate::context::RunContext;
use crate::engine::{Engine, EngineError, Ledger};
use crate::event::names;
use crate::keys;
use crate::outcome::{FailureClass, Outcome};

/// One branch's result, as `parallel.results` records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BranchResult {
    id: String,
    status: StageStatus,
    failure_reason: Option<String>,
    updated_keys: Vec<String>,
    last_response: Option<Value>,
    score: Option<f64>,
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
pub struct BranchProgress {
    /// The branch's next node; `None` once it has finished.
    pub next: Option<String>,
    pub context: BTreeMap<String, Value>,
    /// The context at the fan-out, to tell which keys the branch updated.
    pub before: BTreeMap<String, Value>,
    pub visits: BTreeMap<String, u32>,
    pub edge_counts: BTreeMap<String, u32>,
    pub last_outcome: Option<Outcome>,
    pub result: Option<BranchResult>,
}

impl BranchResult {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id, "status": self.status, "failure_reason": self.failure_reason,
            "updated_keys": self.updated_keys, "last_response": self.last_response, "score": self.score,
        })
    }
}

/// How many branches must succeed before the merge may proceed.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "branch counts are small and the fraction is in (0, 1]"
)]
fn successes_needed(policy: JoinPolicy, total: usize) -> usize {
    match policy {
        JoinPolicy::WaitAll => total,
        JoinPolicy::FirstSuccess => 1,
        JoinPolicy::KOfN(n) => (n as usize).min(total),
        JoinPolicy::Quorum(fraction) => ((fraction * total as f64).ceil() as usize).clamp(1, total),
    }
}

/// The fan-out stage's outcome, carrying `parallel.results`.
fn fan_out_outcome(
    config: &ParallelConfig,
    succeeded: usize,
    failed: usize,
    needed: usize,
    total: usize,
    results: &[BranchResult],
) -> Outcome {
    let status = fan_out_status(config, succeeded, failed, needed);
    let mut outcome = if status == StageStatus::Failed {
        Outcome::failed(
            FailureClass::StageFailed,
            format!(
                "{succeeded} of {total} branches succeeded; the join policy `{}` needs {needed}",
                config.join_policy
            ),
        )
    } else {
        Outcome::new(status)
    };
    outcome.context_updates.insert(
        keys::PARALLEL_RESULTS.into(),
        Value::Array(results.iter().map(BranchResult::to_json).collect()),
    );
    outcome
}

/// The fan-out's own status: failed under `fail_fast` with any failure; succeeded when enough branches
/// succeeded and none counted as failed; partially succeeded when some work succeeded; else failed.
fn fan_out_status(
    config: &ParallelConfig,
    succeeded: usize,
    failed: usize,
    needed: usize,
) -> StageStatus {
    let counted_failures = if config.error_policy == ErrorPolicy::Ignore {
        0
    } else {
        failed
    };
    if config.error_policy == ErrorPolicy::FailFast && failed > 0 {
        StageStatus::Failed
    } else if succeeded >= needed && counted_failures == 0 {
        StageStatus::Succeeded
    } else if succeeded >= needed || (config.join_policy == JoinPolicy::WaitAll && succeeded > 0) {
        StageStatus::PartiallySucceeded
    } else {
        StageStatus::Failed
    }
}

/// The order in which outcomes rank when choosing the best branch.
fn status_rank(status: StageStatus) -> u8 {
    match status {
        StageStatus::Succeeded => 0,
        StageStatus::PartiallySucceeded => 1,
        StageStatus::Skipped => 2,
        StageStatus::Failed => 3,
    }
}

/// Branch results as they arrived, and why collection stopped early (if it did).
struct Collected {
    results: Vec<Option<BranchResult>>,
    succeeded: usize,
    failed: usize,
    stop_reason: Option<&'static str>,
}

/// The nearest fan-in node every branch of `fan_out` reaches (fewest steps from the farthest branch).
pub(crate) fn fan_in_of(engine: &Engine, fan_out: NodeIndex) -> Option<NodeIndex> {
    let workflow = &engine.workflow;
    let mut worst: HashMap<NodeIndex, (usize, usize)> = HashMap::new();
    let starts: Vec<NodeIndex> = workflow.outgoing(fan_out).map(|e| e.to).collect();
    for &start in &starts {
        let mut distance = vec![usize::MAX; workflow.nodes.len()];
        let mut queue = VecDeque::from([start]);
        distance[start] = 0;
        while let Some(n) = queue.pop_front() {
            if matches!(workflow.nodes[n].kind, NodeKind::FanIn(_)) {
                let entry = worst.entry(n).or_insert((0, 0));
                entry.0 = entry.0.max(distance[n]);
                entry.1 += 1;
                continue;
            }
            for edge in workflow.outgoing(n) {
                if distance[edge.to] == usize::MAX {
                    distance[edge.to] = distance[n] + 1;
                    queue.push_back(edge.to);
                }
            }
        }
    }
    worst
        .into_iter()
        .filter(|(_, (_, reached_by))| *reached_by == starts.len())
        .min_by(|(a, (da, _)), (b, (db, _))| {
            da.cmp(db)
                .then_with(|| workflow.nodes[*a].id.cmp(&workflow.nodes[*b].id))
        })
        .map(|(n, _)| n)
}

impl Engine {
    /// Runs a fan-out node: every branch, then the merge. Returns the fan-out's outcome and the fan-in
    /// node to continue at.
    pub(crate) async fn run_parallel(
        &self,
        ledger: &Ledger,
        cp: &Checkpoint,
        index: NodeIndex,
        visit: u32,
        config: &ParallelConfig,
        context: &RunContext,
    ) -> Result<(Outcome, Option<String>), EngineError> {
        let node = &self.workflow.nodes[index];
        let Some(fan_in) = fan_in_of(self, index) else {
            return Ok((
                Outcome::failed(
                    FailureClass::Configuration,
                    format!("the branches of `{}` never meet at a fan-in node", node.id),
                ),
                None,
            ));
        };
        let starts: Vec<NodeIndex> = self.workflow.outgoing(index).map(|e| e.to).collect();
        let rank = ledger.next_rank();
        let dir = self.stage_dir(rank, &node.id, visit).await?;
        let branch_ids: Vec<&str> = starts
            .iter()
            .map(|&s| self.workflow.nodes[s].id.as_str())
            .collect();
        self.emit(
            names::PARALLEL_STARTED,
            Some(&node.id),
            json!({ "branches": branch_ids, "fan_in": self.workflow.nodes[fan_in].id, "join_policy": config.join_policy.to_string(), "max_parallel": config.max_parallel }),
        );
        let started = std::time::Instant::now();
        // A resumed fan-out continues from its checkpointed progress; a new one starts every branch.
        let progress = match &cp.parallel {
            Some(progress) if progress.node == node.id && progress.visit == visit => {
                progress.clone()
            }
            _ => self.fresh_progress(cp, &node.id, visit, &starts, context),
        };
        let progress = Mutex::new(progress);
        let semaphore = Semaphore::new(config.max_parallel.max(1) as usize);
        let mut running: FuturesUnordered<_> = starts
            .iter()
            .enumerate()
            .map(|(position, &start)| {
                let (semaphore, progress) = (&semaphore, &progress);
                let id = self.workflow.nodes[start].id.clone();
                async move {
                    let _permit = semaphore.acquire().await;
                    (
                        position,
                        self.run_branch(ledger, cp, context, &id, fan_in, progress)
                            .await,
                    )
                }
            })
            .collect();
        let total = starts.len();
        let needed = successes_needed(config.join_policy, total);
        let Collected {
            results,
            succeeded,
            failed,
            stop_reason,
        } = self
            .collect(&node.id, &mut running, config, needed, total)
            .await?;
        // Dropping the remaining futures cancels those branches and kills their processes.
        drop(running);
        let cancelled = results.iter().filter(|r| r.is_none()).count();
        let results = self.settle(results, &starts, config.error_policy, stop_reason);
        let outcome = fan_out_outcome(config, succeeded, failed, needed, total, &results);
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.emit(
            names::PARALLEL_COMPLETED,
            Some(&node.id),
            json!({ "status": outcome.status, "succeeded": succeeded, "failed": failed, "cancelled": cancelled }),
        );
        let mut status_json = crate::engine::status_json(&outcome, &node.id, visit, 1, duration_ms);
        status_json["cancelled_branches"] = json!(cancelled);
        self.finish_stage(
            ledger,
            rank,
            &dir,
            &node.id,
            visit,
            &outcome,
            duration_ms,
            status_json,
        )
        .await?;
        Ok((outcome, Some(self.workflow.nodes[fan_in].id.clone())))
    }

    /// Final results in declaration order: cancelled branches as skipped, failed ones left out under
    /// `error_policy=ignore`.
    fn settle(
        &self,
        results: Vec<Option<BranchResult>>,
        starts: &[NodeIndex],
        error_policy: ErrorPolicy,
        stop_reason: Option<&str>,
    ) -> Vec<BranchResult> {
        results
            .into_iter()
            .zip(starts)
            .map(|(result, &start)| {
                result.unwrap_or_else(|| BranchResult {
                    id: self.workflow.nodes[start].id.clone(),
                    status: StageStatus::Skipped,
                    failure_reason: Some(format!(
                        "cancelled: {}",
                        stop_reason.unwrap_or("the fan-out ended")
                    )),
                    updated_keys: Vec::new(),
                    last_response: None,
                    score: None,
                })
            })
            .filter(|r| !(error_policy == ErrorPolicy::Ignore && r.status == StageStatus::Failed))
            .collect()
    }

    /// Saves the checkpoint with the fan-out's current progress.
    async fn save_progress(
        &self,
        ledger: &Ledger,
        cp: &Checkpoint,
        main: &RunContext,
        progress: &Mutex<ParallelProgress>,
    ) -> Result<(), EngineError> {
        let _turn = self.save_turn.lock().await;
        let mut snapshot = cp.clone();
        snapshot.parallel = Some(
            progress
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        );
        self.save_in_turn(&mut snapshot, ledger, main).await
    }

    /// Progress for a fan-out that starts now: every branch at its first node, on the current context.
    fn fresh_progress(
        &self,
        cp: &Checkpoint,
        node: &str,
        visit: u32,
        starts: &[NodeIndex],
        context: &RunContext,
    ) -> ParallelProgress {
        let snapshot = context.snapshot();
        let branches = starts
            .iter()
            .map(|&start| {
                let id = self.workflow.nodes[start].id.clone();
                let state = BranchProgress {
                    next: Some(id.clone()),
                    context: snapshot.clone(),
                    before: snapshot.clone(),
                    visits: cp.visits.clone(),
                    edge_counts: cp.edge_counts.clone(),
                    last_outcome: None,
                    result: None,
                };
                (id, state)
            })
            .collect();
        ParallelProgress {
            node: node.to_owned(),
            visit,
            branches,
        }
    }

    /// Takes branch results as they finish until all are in or the policies say to stop.
    async fn collect<F>(
        &self,
        node_id: &str,
        running: &mut FuturesUnordered<F>,
        config: &ParallelConfig,
        needed: usize,
        total: usize,
    ) -> Result<Collected, EngineError>
    where
        F: std::future::Future<Output = (usize, Result<BranchResult, EngineError>)>,
    {
        let mut collected = Collected {
            results: vec![None; total],
            succeeded: 0,
            failed: 0,
            stop_reason: None,
        };
        while let Some((position, result)) = running.next().await {
            let result = result?;
            self.emit(
                names::PARALLEL_BRANCH_COMPLETED,
                Some(node_id),
                json!({ "branch": result.id, "status": result.status, "failure_reason": result.failure_reason }),
            );
            let failed = result.status == StageStatus::Failed;
            if matches!(
                result.status,
                StageStatus::Succeeded | StageStatus::PartiallySucceeded
            ) {
                collected.succeeded += 1;
            } else if failed {
                collected.failed += 1;
            }
            collected.results[position] = Some(result);
            if failed && config.error_policy == ErrorPolicy::FailFast {
                collected.stop_reason = Some("a branch failed (error_policy=fail_fast)");
                break;
            }
            if config.join_policy != JoinPolicy::WaitAll && collected.succeeded >= needed {
                collected.stop_reason = Some("the join policy was satisfied");
                break;
            }
        }
        Ok(collected)
    }

    /// Runs (or continues) one branch on its own copy of the context, from its next node up to the
    /// fan-in, checkpointing its progress after every stage.
    async fn run_branch(
        &self,
        ledger: &Ledger,
        cp: &Checkpoint,
        main: &RunContext,
        id: &str,
        fan_in: NodeIndex,
        progress: &Mutex<ParallelProgress>,
    ) -> Result<BranchResult, EngineError> {
        let lock = || {
            progress
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let state = lock().branches[id].clone();
        if let Some(result) = state.result {
            return Ok(result);
        }
        let branch = RunContext::from_map(state.context);
        let (mut visits, mut edge_counts, mut last) =
            (state.visits, state.edge_counts, state.last_outcome);
        let mut current = state
            .next
            .as_deref()
            .and_then(|n| self.workflow.node_index(n));
        while let Some(index) = current
            .filter(|&i| i != fan_in && !matches!(self.workflow.nodes[i].kind, NodeKind::Exit))
        {
            let node = &self.workflow.nodes[index];
            if ledger.steps() >= self.settings.max_steps {
                return Err(EngineError::StepBudget {
                    steps: ledger.steps(),
                });
            }
            let visit = visits.get(&node.id).copied().unwrap_or(0) + 1;
            if let Some(limit) = node
                .common
                .max_visits
                .or(self.workflow.graph.max_node_visits)
                && visit > limit
            {
                last = Some(Outcome::failed(
                    FailureClass::StageFailed,
                    format!("node `{}` reached its visit limit of {limit}", node.id),
                ));
                break;
            }
            visits.insert(node.id.clone(), visit);
            branch.set(keys::CURRENT_NODE, node.id.clone());
            branch.set(keys::NODE_VISIT_COUNT, visit);
            self.set_fidelity_keys(index, &branch, &mut false);
            let mut outcome = self
                .execute_with_retries(ledger, index, visit, &branch, last.as_ref())
                .await?;
            if outcome.waiting_for_input {
                outcome = Outcome::failed(
                    FailureClass::Configuration,
                    format!(
                        "human gate `{}` inside a parallel branch needs its answer up front (--answers or --auto-approve)",
                        node.id
                    ),
                );
            }
            self.apply_outcome(&branch, &node.id, &outcome).await?;
            current = match self
                .next_node(&mut edge_counts, index, &outcome, &branch)
                .await
            {
                Ok(next) => next.and_then(|(id, _)| self.workflow.node_index(&id)),
                Err(_) => None,
            };
            last = Some(outcome);
            {
                let mut guard = lock();
                let saved = guard
                    .branches
                    .get_mut(id)
                    .expect("every branch has progress");
                saved.next = current.map(|i| self.workflow.nodes[i].id.clone());
                saved.context = branch.snapshot();
                saved.visits.clone_from(&visits);
                saved.edge_counts.clone_from(&edge_counts);
                saved.last_outcome.clone_from(&last);
            }
            self.save_progress(ledger, cp, main, progress).await?;
        }
        let result = branch_result(
            id,
            &state.before,
            &branch.snapshot(),
            &last.unwrap_or_else(Outcome::success),
        );
        {
            let mut guard = lock();
            let saved = guard
                .branches
                .get_mut(id)
                .expect("every branch has progress");
            saved.next = None;
            saved.result = Some(result.clone());
        }
        self.save_progress(ledger, cp, main, progress).await?;
        Ok(result)
    }
}

/// A finished branch's result: its last outcome, the keys it changed (engine keys aside), its last
/// response and score.
fn branch_result(
    id: &str,
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
    last: &Outcome,
) -> BranchResult {
    const ENGINE_KEYS: &[&str] = &[
        keys::CURRENT_NODE,
        keys::OUTCOME,
        keys::PREFERRED_LABEL,
        keys::FAILURE_CLASS,
        keys::FAILURE_REASON,
        keys::FAILURE_SIGNATURE,
    ];
    let updated_keys = after
        .iter()
        .filter(|(k, v)| {
            !k.starts_with("internal.")
                && !ENGINE_KEYS.contains(&k.as_str())
                && before.get(*k) != Some(*v)
        })
        .map(|(k, _)| k.clone())
        .collect();
    BranchResult {
        id: id.to_owned(),
        status: last.status,
        failure_reason: last.failure_reason().map(str::to_owned),
        updated_keys,
        last_response: after
            .get(keys::LAST_RESPONSE)
            .filter(|v| before.get(keys::LAST_RESPONSE) != Some(*v))
            .cloned(),
        score: after.get("score").and_then(Value::as_f64),
    }
}

/// Picks the best branch from `parallel.results`: status rank, then score (higher first), then id.
pub(crate) fn best_branch(results: &[Value]) -> Option<(String, String)> {
    results
        .iter()
        .filter_map(|r| {
            let id = r.get("id")?.as_str()?.to_owned();
            let status: StageStatus = r.get("status")?.as_str()?.parse().ok()?;
            let score = r
                .get("score")
                .and_then(Value::as_f64)
                .unwrap_or(f64::NEG_INFINITY);
            Some((id, status, score))
        })
        .min_by(|a, b| {
            status_rank(a.1)
                .cmp(&status_rank(b.1))
                .then_with(|| b.2.total_cmp(&a.2))
                .then_with(|| a.0.cmp(&b.0))
        })
        .map(|(id, status, _)| (id, status.as_str().to_owned()))
}
