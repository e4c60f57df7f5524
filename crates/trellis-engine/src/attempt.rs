//! Running a work stage through its handler: one stage directory per attempt, the node's timeout
//! (when it sets none, the graph's `stall_timeout` for as long as it shows no progress), retries of
//! retryable failures with backoff, `status.json`, the stage record and the stage events. Also how
//! an outcome is merged into the context.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use trellis_process::backoff::Backoff;
use trellis_workflow::node_kind::{ParallelConfig, RetryPolicy};
use trellis_workflow::workflow::CommonConfig;
use trellis_workflow::{Node, NodeIndex, NodeKind, StageStatus};

use crate::checkpoint::{StageRecord, Track};
use crate::context::RunContext;
use crate::engine::{Engine, EngineError, blocking};
use crate::event::{EventKind, StageEnd};
use crate::handler::{Attempt, Conversation, Emitter, Handler, Stage};
use crate::keys;
use crate::outcome::{FailureClass, Outcome};
use crate::services::BLOB_THRESHOLD;
use crate::status_file::StatusFile;

/// How long an attempt may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// As long as it takes.
    Unbounded,
    /// The node's own `timeout`: at most this long, whatever the attempt is doing.
    Total(Duration),
    /// The graph's `stall_timeout`: as long as the attempt shows progress at least this often.
    Stall(Duration),
}

/// An attempt, failed with a timeout when it goes past its limit.
async fn bounded(
    limit: Limit,
    progress: Progress<'_>,
    execution: impl Future<Output = Result<Attempt, EngineError>>,
) -> Result<Attempt, EngineError> {
    match limit {
        Limit::Unbounded => execution.await,
        Limit::Total(limit) => tokio::time::timeout(limit, execution)
            .await
            .unwrap_or_else(|_| {
                Ok(Outcome::failed(
                    FailureClass::Timeout,
                    format!("timed out after {}", humantime::format_duration(limit)),
                )
                .into())
            }),
        Limit::Stall(stall) => watched(stall, progress, execution).await,
    }
}

/// Where an attempt shows progress: the events it emits (agent turns, tool calls, model text) and
/// the files of its stage directory (a command's or a CLI agent's output, as it is written).
#[derive(Clone, Copy)]
struct Progress<'p> {
    dir: &'p Path,
    events: &'p AtomicU64,
}

/// What an attempt had shown at one look: two looks that differ mean it made progress between them.
#[derive(Debug, Default, PartialEq, Eq)]
struct Signs {
    events: u64,
    bytes: u64,
    modified: Option<SystemTime>,
}

impl Progress<'_> {
    async fn signs(self) -> Signs {
        let dir = self.dir.to_path_buf();
        let (bytes, modified) = blocking(move || {
            #[expect(clippy::disallowed_methods, reason = "runs on the blocking pool")]
            let entries = std::fs::read_dir(dir);
            entries
                .into_iter()
                .flatten()
                .filter_map(|entry| entry.ok()?.metadata().ok())
                .filter(std::fs::Metadata::is_file)
                .fold((0, None), |(bytes, latest), file| {
                    (bytes + file.len(), latest.max(file.modified().ok()))
                })
        })
        .await;
        Signs {
            events: self.events.load(Ordering::Relaxed),
            bytes,
            modified,
        }
    }
}

/// An attempt that fails as stalled once it has shown no progress for `stall`. It is looked at
/// eight times a `stall`, so a stall is seen within an eighth of it.
async fn watched(
    stall: Duration,
    progress: Progress<'_>,
    execution: impl Future<Output = Result<Attempt, EngineError>>,
) -> Result<Attempt, EngineError> {
    let mut execution = std::pin::pin!(execution);
    let every = (stall / 8).max(Duration::from_millis(10));
    // An attempt's directory is new and empty, and it has emitted nothing: nothing to look at
    // before it starts.
    let mut seen = Signs::default();
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::select! {
            biased;
            done = &mut execution => return done,
            () = tokio::time::sleep(every) => {
                let now = progress.signs().await;
                if now != seen {
                    (seen, since) = (now, tokio::time::Instant::now());
                } else if since.elapsed() >= stall {
                    return Ok(Outcome::failed(
                        FailureClass::Timeout,
                        format!(
                            "stalled: no event and no output for {} (the graph's `stall_timeout`; a node's `timeout` replaces it)",
                            humantime::format_duration(stall)
                        ),
                    )
                    .into());
                }
            }
        }
    }
}

/// A stage's emitter: the engine's, counting what the stage emits for the stall watch.
struct Counted<'e> {
    engine: &'e Engine,
    events: AtomicU64,
}

impl Emitter for Counted<'_> {
    fn emit_from(&self, node: Option<&str>, agent: Option<&str>, event: EventKind) {
        self.events.fetch_add(1, Ordering::Relaxed);
        self.engine.emit_from(node, agent, event);
    }

    fn detached(&self) -> Option<Arc<dyn Emitter>> {
        self.engine.detached()
    }
}

/// Where one attempt runs: its node, visit and number, what it is given, its directory and token.
struct Place<'p> {
    index: NodeIndex,
    visit: u32,
    attempt: u32,
    context: &'p RunContext,
    previous: Option<&'p Outcome>,
    conversation: &'p Conversation,
    dir: &'p Path,
    cancel: &'p tokio_util::sync::CancellationToken,
}

/// What an attempt at a node runs: its handler, or one of the kinds the engine runs itself.
pub(crate) enum Work<'w> {
    /// The node's handler ([`Engine::handler_of`]), and the run's pacer when the node is on the
    /// paced main track.
    Handler(Arc<dyn Handler>, Option<&'w dyn crate::services::Pacer>),
    /// A fan-out: its branches, then the join, on `track` at `path`.
    FanOut {
        path: &'w [String],
        track: &'w mut Track,
        config: &'w ParallelConfig,
    },
    /// A sub-workflow: the child workflow file, and the run's pacer when the node is on the paced
    /// main track.
    Child(&'w Path, Option<&'w dyn crate::services::Pacer>),
}

impl Engine {
    fn max_attempts(&self, node: &Node) -> u32 {
        match node.common.retry_policy() {
            Some(policy) => policy.max_attempts,
            None => node
                .common
                .max_retries
                .unwrap_or(self.workflow.graph.default_max_retries)
                .saturating_add(1),
        }
    }

    /// The handler of a node the engine does not run itself.
    pub(crate) fn handler_of(&self, node: &Node) -> Result<Arc<dyn Handler>, EngineError> {
        self.handlers
            .get(node.kind.handler_kind())
            .cloned()
            .ok_or(EngineError::NoHandler {
                node: node.id.clone(),
                kind: node.kind.type_name(),
            })
    }

    /// How long one attempt may take: the node's `timeout`; else, while it shows progress, the
    /// graph's `stall_timeout`.
    fn time_limit(&self, node: &Node, work: &Work<'_>) -> Limit {
        let stall = self
            .workflow
            .graph
            .stall_timeout
            .map_or(Limit::Unbounded, Limit::Stall);
        match (work, &node.kind, node.common.timeout) {
            // A human gate waits as long as its own `timeout` says.
            (_, NodeKind::Human(_), _) => Limit::Unbounded,
            (_, _, Some(timeout)) => Limit::Total(timeout),
            // A fan-out or a child workflow is many stages, each watched on its own; a pause
            // shows no progress by design.
            (Work::FanOut { .. } | Work::Child(..), _, None) | (_, NodeKind::Wait(_), None) => {
                Limit::Unbounded
            }
            (Work::Handler(..), _, None) => stall,
        }
    }

    /// One attempt: the handler, the fan-out or the child workflow, within `limit`.
    async fn attempt_once(
        &self,
        work: &mut Work<'_>,
        place: Place<'_>,
        limit: Limit,
    ) -> Result<Attempt, EngineError> {
        let node = &self.workflow.nodes[place.index];
        let emitter = Counted {
            engine: self,
            events: AtomicU64::new(0),
        };
        let progress = Progress {
            dir: place.dir,
            events: &emitter.events,
        };
        match work {
            Work::Handler(handler, pacer) => {
                let stage = Stage {
                    workflow: &self.workflow,
                    node,
                    context: place.context,
                    dir: place.dir,
                    run_id: &self.run_id,
                    visit: place.visit,
                    attempt: place.attempt,
                    previous: place.previous,
                    conversation: place.conversation,
                    history: self,
                    services: &self.services,
                    settings: &self.settings,
                    emitter: &emitter,
                    cancel: place.cancel,
                    pacer: *pacer,
                };
                bounded(limit, progress, async { Ok(handler.execute(&stage).await) }).await
            }
            Work::FanOut {
                path,
                track,
                config,
            } => {
                // On the heap, as a child workflow is: a fan-out's future is many stages' size.
                let fan_out = Box::pin(self.run_parallel(
                    path,
                    track,
                    place.index,
                    place.visit,
                    config,
                    place.context,
                ));
                bounded(limit, progress, async { fan_out.await.map(Attempt::from) }).await
            }
            Work::Child(path, pacer) => {
                let child = Box::pin(self.run_child(
                    place.dir,
                    path,
                    place.context,
                    &node.id,
                    place.cancel,
                    *pacer,
                ));
                bounded(limit, progress, async { child.await.map(Attempt::from) }).await
            }
        }
    }

    /// Runs attempts at a node until one succeeds, fails for good, or the attempts run out: every
    /// kind of node, each attempt in a stage directory of its own, with `StageStarted`, the node's
    /// time limit, `status.json`, the stage record and retries of retryable failures. Each attempt
    /// gets a cancellation token of its own, a child of the run's, cancelled when the attempt ends
    /// however it ends (a timeout, a branch the join no longer needs, the run stopping).
    pub(crate) async fn run_attempts(
        &self,
        index: NodeIndex,
        visit: u32,
        context: &RunContext,
        previous: Option<&Outcome>,
        conversation: &Conversation,
        mut work: Work<'_>,
    ) -> Result<Attempt, EngineError> {
        let node = &self.workflow.nodes[index];
        let max_attempts = self.max_attempts(node).max(1);
        let limit = self.time_limit(node, &work);
        let mut attempt = 1;
        loop {
            // A fan-out's own stage does not count against the step budget; its branches' stages do.
            let rank = self.next_rank(!matches!(work, Work::FanOut { .. }));
            let dir = self.stage_dir(rank, &node.id, visit).await?;
            self.emit(
                Some(&node.id),
                EventKind::StageStarted {
                    visit,
                    attempt,
                    dir: dir_name(&dir),
                    handler: node.kind.handler_kind(),
                    workflow: match &work {
                        Work::Child(path, _) => Some(path.display().to_string()),
                        _ => None,
                    },
                },
            );
            let cancel = self.stage_token();
            let _cancel_on_end = cancel.clone().drop_guard();
            let started = self.services.clock.instant();
            let place = Place {
                index,
                visit,
                attempt,
                context,
                previous,
                conversation,
                dir: &dir,
                cancel: &cancel,
            };
            let executed = self.attempt_once(&mut work, place, limit).await?;
            let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let retries = keys::retry_count_of(&node.id);
            if attempt > 1 || context.get(&retries).is_some() {
                context.set(retries, attempt - 1);
            }
            let mut outcome = match executed {
                Attempt::Finished(outcome) => outcome,
                Attempt::WaitingForInput => {
                    // No outcome yet: the attempt's status says what it waits for.
                    let waiting = StatusFile::waiting(&node.id, visit, attempt, duration_ms);
                    self.recorder.write_status(&dir, waiting).await?;
                    return Ok(Attempt::WaitingForInput);
                }
                // Nor here: the attempt stays unfinished, set aside when the stage runs again.
                Attempt::Parked => return Ok(Attempt::Parked),
            };
            if let Some(excluded) = &self.excluded {
                outcome
                    .files_touched
                    .retain(|file| !excluded.is_match(file));
            }
            partial_if_allowed(&mut outcome, &node.common, attempt >= max_attempts);
            let status = StatusFile::finished(&outcome, &node.id, visit, attempt, duration_ms);
            let retrying = outcome.retryable() && attempt < max_attempts;
            if retrying {
                // On disk before the wait for the next attempt.
                self.recorder.write_status(&dir, status).await?;
            } else {
                self.recorder.queue_status(&dir, status);
            }
            self.record(stage_record(
                rank,
                &node.id,
                visit,
                attempt,
                &outcome,
                duration_ms,
                &dir,
            ));
            if retrying {
                let delay = retry_delay(&node.common, attempt, self.services.clock.now());
                self.emit(
                    Some(&node.id),
                    EventKind::StageRetrying {
                        attempt,
                        next_attempt: attempt + 1,
                        delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        reason: outcome.failure_reason().map(str::to_owned),
                    },
                );
                let mut hook =
                    crate::hooks::HookContext::new(crate::hooks::HookEvent::StageRetrying)
                        .node(&node.id);
                hook.handler_type = Some(node.kind.type_name().to_owned());
                hook.failure_reason = outcome.failure_reason().map(str::to_owned);
                hook.attempt = Some(attempt + 1);
                hook.max_attempts = Some(max_attempts);
                self.hook(hook).await?;
                tokio::time::sleep(delay).await;
                attempt += 1;
                continue;
            }
            self.emit_stage_end(&node.id, &outcome, visit, attempt, duration_ms);
            outcome.stage_dir = Some(dir);
            return Ok(Attempt::Finished(outcome));
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
        // Model stages say which model answered and what it cost; commands what they captured.
        let details = &outcome.details;
        let end = StageEnd {
            status: outcome.status,
            visit,
            attempt,
            duration_ms,
            failure_reason: outcome.failure_reason().map(str::to_owned),
            files_touched: outcome.files_touched.clone(),
            model: details.model.as_ref().map(|m| m.model.clone()),
            provider: details.model.as_ref().map(|m| m.provider.clone()),
            usage: details.model.as_ref().map(|m| m.usage),
            cost_usd: details.model.as_ref().and_then(|m| m.cost_usd),
            artifacts: details.artifacts.clone(),
            artifacts_skipped: details.artifacts_skipped.clone(),
        };
        let event = if outcome.status == StageStatus::Failed {
            EventKind::StageFailed(end)
        } else {
            EventKind::StageCompleted(end)
        };
        self.emit(Some(node_id), event);
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
            context.set(keys::FAILURE_SIGNATURE, failure.signature(node_id));
        }
        Ok(())
    }
}

/// A retryable failure with no retry left ends `partially_succeeded` on a node that allows it
/// (`allow_partial`); its failure stays said (`failure_reason`, `failure_class`).
fn partial_if_allowed(outcome: &mut Outcome, node: &CommonConfig, out_of_retries: bool) {
    if node.allow_partial && out_of_retries && outcome.retryable() {
        outcome.status = StageStatus::PartiallySucceeded;
    }
}

/// A stage directory's name (`003-test@1`).
pub(crate) fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn stage_record(
    rank: u32,
    node_id: &str,
    visit: u32,
    attempt: u32,
    outcome: &Outcome,
    duration_ms: u64,
    dir: &Path,
) -> StageRecord {
    StageRecord {
        rank,
        node_id: node_id.to_owned(),
        visit,
        attempt,
        status: outcome.status,
        duration_ms,
        failure_reason: outcome.failure_reason().map(str::to_owned),
        dir: dir_name(dir),
        details: outcome.details.clone(),
        files_touched: outcome.files_touched.clone(),
    }
}

/// The delay before attempt `attempt + 1`: the node's `retry_policy` schedule (0.5 s doubling
/// without one), capped at 60 s, jittered by the clock's sub-second digits (`now`), so a fixed clock
/// predicts it.
pub fn retry_delay(node: &CommonConfig, attempt: u32, now: SystemTime) -> Duration {
    let (initial, factor) = node
        .retry_policy()
        .map_or((Duration::from_millis(500), 2.0), |p| {
            (p.initial_delay, p.backoff_factor)
        });
    let nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let backoff = Backoff {
        initial,
        factor,
        max: RetryPolicy::MAX_DELAY,
    };
    backoff.delay(attempt, f64::from(nanos % 1000) / 1000.0)
}
