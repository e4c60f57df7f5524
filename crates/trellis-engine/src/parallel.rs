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
//! A branch is walked by the same step loop as the main run (`step`), so a branch may hold a
//! sub-workflow or a fan-out of its own. Each branch's track is checkpointed after every one of its
//! stages, under its fan-out's [`ParallelProgress`]: a run killed
//! during a fan-out resumes every unfinished branch at the stage it was in, and reuses the results of
//! finished ones.

use std::collections::BTreeMap;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::Value;
use tokio::sync::Semaphore;
use trellis_workflow::node_kind::{ErrorPolicy, JoinPolicy, ParallelConfig};
use trellis_workflow::{NodeIndex, StageStatus};

use crate::checkpoint::{BranchProgress, BranchResult, Change, ParallelProgress, Track};
use crate::context::{RunContext, reads_blobs, resolve_blob};
use crate::engine::{Engine, EngineError, blocking};
use crate::event::EventKind;
use crate::join::{fan_out_outcome, successes_needed};
use crate::keys;
use crate::outcome::{FailureClass, Outcome};
use crate::text::clip;

/// How much of a branch's last output `parallel.results` keeps.
const BRANCH_OUTPUT_CHARS: usize = 4_000;

/// Branch results as they arrived, and why collection stopped early (if it did).
struct Collected {
    results: Vec<Option<BranchResult>>,
    succeeded: usize,
    failed: usize,
    stop_reason: Option<&'static str>,
}

impl Engine {
    /// Runs one attempt at a fan-out node (the attempt path, `attempt`, makes its stage): every
    /// branch (each a walk of its own up to the fan-in, resumed from the checkpoint where one is in
    /// progress), then the join. Returns the fan-out's outcome, which carries `parallel.results` and
    /// is the join's verdict.
    pub(crate) async fn run_parallel(
        &self,
        path: &[String],
        track: &mut Track,
        index: NodeIndex,
        visit: u32,
        config: &ParallelConfig,
        context: &RunContext,
    ) -> Result<Outcome, EngineError> {
        let node = &self.workflow.nodes[index];
        let Some(fan_in) = config.fan_in else {
            return Ok(Outcome::failed(
                FailureClass::Configuration,
                format!("the branches of `{}` never meet at a fan-in node", node.id),
            ));
        };
        let starts: Vec<NodeIndex> = self.workflow.outgoing(index).map(|e| e.to).collect();
        let branch_ids: Vec<&str> = starts
            .iter()
            .map(|&s| self.workflow.nodes[s].id.as_str())
            .collect();
        self.emit(
            Some(&node.id),
            EventKind::ParallelStarted {
                branches: branch_ids.iter().map(|&id| id.to_owned()).collect(),
                fan_in: self.workflow.nodes[fan_in].id.clone(),
                join_policy: config.join_policy,
                max_parallel: config.max_parallel,
            },
        );
        // A resumed fan-out continues from its checkpointed progress; a new one starts every branch.
        let mut progress = match track.parallel.take() {
            Some(progress) if progress.node == node.id && progress.visit == visit => *progress,
            _ => fresh_progress(track, &node.id, visit, &branch_ids, context),
        };
        // Branches write their tracks below this one in the checkpoint from now on; the states
        // they start from are theirs.
        self.book().change(Change::ParallelStarted {
            path: path.to_vec(),
            progress: Box::new(progress.clone()),
        });
        // On the main track, a pacer runs each branch still to run as a unit of its own; the
        // fan-out is over for it when this lease drops, with the branches below.
        let pacer = self.pacer(path, index);
        let _fan_out = pacer.map(|pacer| {
            let to_run: Vec<String> = branch_ids
                .iter()
                .filter(|id| {
                    progress
                        .branches
                        .get(**id)
                        .is_none_or(|branch| branch.result.is_none())
                })
                .map(|&id| id.to_owned())
                .collect();
            pacer.fan_out(&node.id, &to_run)
        });
        let semaphore = Semaphore::new(config.max_parallel.max(1) as usize);
        let mut running: FuturesUnordered<_> = branch_ids
            .iter()
            .enumerate()
            .map(|(position, id)| {
                let semaphore = &semaphore;
                let branch_path: Vec<String> =
                    path.iter().cloned().chain([(*id).to_owned()]).collect();
                let state = progress
                    .branches
                    .remove(*id)
                    .unwrap_or_else(|| fresh_branch(id, track, context.snapshot()));
                async move {
                    let _permit = semaphore.acquire().await;
                    let lease = match pacer {
                        Some(pacer) if state.result.is_none() => {
                            Some(pacer.next_branch(&node.id, id).await)
                        }
                        _ => None,
                    };
                    let result = self.run_branch(branch_path, state, fan_in).await;
                    if let (Some(lease), Ok(result)) = (lease, &result) {
                        lease.end(result.status);
                    }
                    (position, result)
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
        let mut outcome = fan_out_outcome(config, succeeded, failed, needed, total, &results);
        outcome.details.cancelled_branches = Some(cancelled);
        self.emit(
            Some(&node.id),
            EventKind::ParallelCompleted {
                status: outcome.status,
                succeeded,
                failed,
                cancelled,
            },
        );
        Ok(outcome)
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
                    output: None,
                    score: None,
                })
            })
            .filter(|r| !(error_policy == ErrorPolicy::Ignore && r.status == StageStatus::Failed))
            .collect()
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
                Some(node_id),
                EventKind::ParallelBranchCompleted {
                    branch: result.id.clone(),
                    status: result.status,
                    failure_reason: result.failure_reason.clone(),
                },
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

    /// Runs (or continues) one branch on its own copy of the context: a walk from its next node up to
    /// the fan-in, checkpointed after every stage like any track. `path` names it in the checkpoint.
    fn run_branch(
        &self,
        path: Vec<String>,
        state: BranchProgress,
        fan_in: NodeIndex,
    ) -> futures::future::BoxFuture<'_, Result<BranchResult, EngineError>> {
        // Branches nest (a fan-out inside a branch walks branches of its own), so this future is
        // boxed: the recursion needs a future of known size.
        Box::pin(async move {
            if let Some(result) = state.result {
                return Ok(result);
            }
            let id = path.last().cloned().unwrap_or_default();
            let mut track = state.track;
            let context = RunContext::from_map(std::mem::take(&mut track.context));
            self.walk(&path, &mut track, &context, Some(fan_in), false)
                .await?;
            let after = context.snapshot();
            let output = self.branch_output(&after, &state.before).await;
            let result = branch_result(
                &id,
                &state.before,
                &after,
                track.last_outcome.as_ref().unwrap_or(&Outcome::success()),
                output,
            );
            self.book().change(Change::BranchFinished {
                path,
                result: Box::new(result.clone()),
            });
            self.save().await?;
            // The branch's last stage was saved with its result (see `walk`).
            self.emit(
                after.get(keys::CURRENT_NODE).and_then(Value::as_str),
                EventKind::CheckpointSaved {
                    next_node: track.next_node,
                },
            );
            Ok(result)
        })
    }

    /// The branch's last output, for the fan-in: the last stage's model response, else the command
    /// output it left, resolved from the blob store and cut with a marker when long.
    async fn branch_output(
        &self,
        after: &BTreeMap<String, Value>,
        before: &BTreeMap<String, Value>,
    ) -> Option<String> {
        let last = after.get(keys::CURRENT_NODE)?.as_str()?;
        let changed = |key: &str| {
            after
                .get(key)
                .filter(|v| before.get(key) != Some(*v))
                .cloned()
        };
        let value = changed(&keys::response_of(last)).or_else(|| changed(keys::COMMAND_OUTPUT))?;
        let blobs = self.services.blobs.clone();
        let value = if reads_blobs(&value) {
            blocking(move || resolve_blob(value, &*blobs)).await
        } else {
            resolve_blob(value, &*blobs)
        };
        let text = match value {
            Value::String(text) => text,
            other => other.to_string(),
        };
        Some(clip(text.trim_end(), BRANCH_OUTPUT_CHARS))
    }
}

/// Progress for a fan-out that starts now: every branch at its first node, on a copy of the current
/// context, with the counts of the track that forks.
fn fresh_progress(
    track: &Track,
    node: &str,
    visit: u32,
    branch_ids: &[&str],
    context: &RunContext,
) -> ParallelProgress {
    let snapshot = context.snapshot();
    let branches = branch_ids
        .iter()
        .map(|&id| (id.to_owned(), fresh_branch(id, track, snapshot.clone())))
        .collect();
    ParallelProgress {
        node: node.to_owned(),
        visit,
        branches,
    }
}

/// A branch that has not started: at its first node, on a copy of the fan-out's context.
fn fresh_branch(id: &str, track: &Track, snapshot: BTreeMap<String, Value>) -> BranchProgress {
    BranchProgress {
        track: Track {
            next_node: Some(id.to_owned()),
            context: snapshot.clone(),
            visits: track.visits.fresh_copy(),
            edge_counts: track.edge_counts.fresh_copy(),
            failure_signatures: track.failure_signatures.fresh_copy(),
            ..Track::default()
        },
        before: snapshot,
        result: None,
    }
}

/// A finished branch's result: its last outcome, the keys it changed (engine keys aside), its last
/// response, output and score.
fn branch_result(
    id: &str,
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
    last: &Outcome,
    output: Option<String>,
) -> BranchResult {
    let updated_keys = after
        .iter()
        .filter(|(k, v)| !keys::is_engine_key(k) && before.get(*k) != Some(*v))
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
        output,
        score: after.get("score").and_then(Value::as_f64),
    }
}
