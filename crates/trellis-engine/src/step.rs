//! How a track advances: [`Engine::walk`] repeats [`Engine::step`] — execute the next node, whatever
//! its kind, and decide where to go — persisting the track after every step. The main run and every
//! parallel branch walk the same way; a branch walks until it reaches its fan-in. Branches nest: a
//! fan-out or a sub-workflow inside a branch is just another step.

use trellis_workflow::node_kind::{Fidelity, ParallelConfig};
use trellis_workflow::{NodeIndex, NodeKind, SourceFormat, StageStatus, Workflow};

use crate::attempt::Work;
use crate::checkpoint::Track;
use crate::context::{ConditionView, RunContext, resolve_blob};
use crate::details::ModelDetails;
use crate::engine::{Engine, EngineError, WalkEnd, blocking};
use crate::event::{EdgeChoice, EventKind, RouteDecision};
use crate::handler::{Attempt, Conversation};
use crate::hooks::{HookContext, HookDecision, HookEvent};
use crate::keys;
use crate::outcome::{FailureClass, Outcome};
use crate::routing::{self, Route};
use crate::services::{Pace, Pacer, RouteOption, RouteRequest};

/// Where a step sends the track.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Follow the selected edge (its index) to its node.
    Edge(usize),
    /// Go to a node without an edge: a retry target, or a fan-out's fan-in.
    Jump(NodeIndex),
    /// Follow a `loop_restart` edge (its index): visit counts and goal-gate results start afresh.
    LoopRestart(usize),
    /// The track is over.
    End,
    /// The stage waits for input.
    Wait,
    /// The stage parked the run ([`Attempt::Parked`]).
    Park,
}

/// How often a node on a loop no edge bounds may run in a dry run when neither it (`max_visits`)
/// nor the graph (`max_node_visits`) says: its stages succeed with canned answers, so a loop that
/// waits for a real one would go round until the step budget.
pub(crate) const DRY_RUN_VISITS: u32 = 10;

impl Engine {
    /// Steps along `track` until it ends, waits, or reaches `stop_at` (a branch's fan-in). `path` names
    /// the track in the checkpoint (empty for the main run, branch ids below it).
    pub(crate) async fn walk(
        &self,
        path: &[String],
        track: &mut Track,
        context: &RunContext,
        stop_at: Option<NodeIndex>,
        degrade_full: bool,
    ) -> Result<WalkEnd, EngineError> {
        let walked = self
            .steps_along(path, track, context, stop_at, degrade_full)
            .await;
        // A step's save handed ahead is waited for however the walk ends (its error after the
        // walk's own).
        let settled = self.settle_save().await;
        let end = walked?;
        settled.map(|()| end)
    }

    /// The steps of [`Engine::walk`].
    async fn steps_along(
        &self,
        path: &[String],
        track: &mut Track,
        context: &RunContext,
        stop_at: Option<NodeIndex>,
        mut degrade_full: bool,
    ) -> Result<WalkEnd, EngineError> {
        loop {
            let Some(node_id) = track.next_node.clone() else {
                return Ok(WalkEnd::Finished);
            };
            let index = self
                .workflow
                .node_index(&node_id)
                .ok_or(EngineError::UnknownNode { node: node_id })?;
            if stop_at == Some(index) {
                return Ok(WalkEnd::Reached);
            }
            // A branch that runs into the exit ends there; only the main track finishes the run.
            if stop_at.is_some() && matches!(self.workflow.nodes[index].kind, NodeKind::Exit) {
                return Ok(WalkEnd::Finished);
            }
            if let Some(pacer) = self.pacer(path, index)
                && pacer.next_stage(&self.workflow.nodes[index].id).await == Pace::Park
            {
                return Ok(WalkEnd::Parked);
            }
            let next = self
                .step(path, track, index, context, &mut degrade_full)
                .await?;
            track.incoming_edge = match next {
                Next::Edge(edge) | Next::LoopRestart(edge) => Some(edge),
                _ => None,
            };
            let target = match next {
                Next::Wait => {
                    self.persist(path, track, context).await?;
                    return Ok(WalkEnd::Waiting);
                }
                Next::Park => {
                    self.persist(path, track, context).await?;
                    return Ok(WalkEnd::Parked);
                }
                Next::End => None,
                Next::Jump(to) => Some(to),
                Next::Edge(edge) => Some(self.workflow.edges[edge].to),
                Next::LoopRestart(edge) => {
                    let to = self.workflow.edges[edge].to;
                    track.visits.clear();
                    track.goal_gates.clear();
                    self.emit(
                        Some(&self.workflow.nodes[index].id),
                        EventKind::LoopRestarted {
                            to: self.workflow.nodes[to].id.clone(),
                        },
                    );
                    Some(to)
                }
            };
            track.next_node = target.map(|to| self.workflow.nodes[to].id.clone());
            if target.is_none() || target == stop_at {
                // The walk ends here: the caller saves what this stage changed with what follows
                // (the run's end, a branch's result), in one entry and one sync, not two.
                self.recorder.change_track(path, track, context);
                return Ok(target.map_or(WalkEnd::Finished, |_| WalkEnd::Reached));
            }
            let node_id = &self.workflow.nodes[index].id;
            if self.saves_ahead(path) {
                // The next stage's directory waits for this save on the record lane, and the
                // save is told of once that directory is made ([`Engine::settle_save`]).
                self.recorder.change_track(path, track, context);
                let saved = (node_id.clone(), track.next_node.clone());
                self.recorder.save_ahead(self.seq(), saved).await;
                continue;
            }
            self.persist(path, track, context).await?;
            self.emit(
                Some(node_id),
                EventKind::CheckpointSaved {
                    next_node: track.next_node.clone(),
                },
            );
            if self.listens(HookEvent::CheckpointSaved) {
                self.hook(HookContext::new(HookEvent::CheckpointSaved).node(node_id))
                    .await?;
            }
        }
    }

    /// Whether a step on `path` saves what it changed ahead ([`Recorder::save_ahead`]): on a run's
    /// main track, where the next stage is the only work that follows, when no `checkpoint_saved`
    /// hook waits for the save and no pacer keeps the working tree with it.
    ///
    /// [`Recorder::save_ahead`]: crate::record::Recorder::save_ahead
    fn saves_ahead(&self, path: &[String]) -> bool {
        path.is_empty()
            && self.services.pacer.is_none()
            && !self.listens(HookEvent::CheckpointSaved)
    }

    /// The pacer asked before the node at `index`: only a run's main track is paced (a
    /// sub-workflow's child run has a pacer only when its parent's gave it one), and not at its
    /// start or exit.
    pub(crate) fn pacer(&self, path: &[String], index: NodeIndex) -> Option<&dyn Pacer> {
        let pacer = self.services.pacer.as_deref()?;
        let main_track = path.is_empty()
            && !matches!(
                self.workflow.nodes[index].kind,
                NodeKind::Start | NodeKind::Exit
            );
        main_track.then_some(pacer)
    }

    /// Executes one node of any kind on `track` and decides where the track goes next.
    pub(crate) async fn step(
        &self,
        path: &[String],
        track: &mut Track,
        index: NodeIndex,
        context: &RunContext,
        degrade_full: &mut bool,
    ) -> Result<Next, EngineError> {
        let node = &self.workflow.nodes[index];
        if matches!(node.kind, NodeKind::Exit)
            && let Some(target) = self.unmet_goal_gate(track)?
        {
            return Ok(Next::Jump(target));
        }
        if self.steps() >= self.settings.max_steps {
            return Err(EngineError::StepBudget {
                steps: self.steps(),
            });
        }
        let visit = track.visits.get(node.id.as_str()).copied().unwrap_or(0) + 1;
        if let Some((limit, dry_run_default)) = self.visit_limit(index)
            && visit > limit
        {
            return Err(EngineError::VisitLimit {
                node: node.id.clone(),
                limit,
                dry_run_default,
            });
        }
        context.set(keys::CURRENT_NODE, node.id.clone());
        context.set(keys::NODE_VISIT_COUNT, visit);
        let stage_hooks = !matches!(node.kind, NodeKind::Start | NodeKind::Exit);
        let skipped = if stage_hooks {
            match self.stage_start_hooks(node).await? {
                Ok(skipped) => skipped,
                Err(target) => return Ok(Next::Jump(target)),
            }
        } else {
            None
        };
        let conversation = self.conversation(index, track.incoming_edge, context, degrade_full);
        let attempt = if let Some(outcome) = skipped {
            Attempt::Finished(outcome)
        } else {
            self.attempts(path, track, index, visit, context, &conversation)
                .await?
        };
        let outcome = match attempt {
            Attempt::Finished(outcome) => outcome,
            Attempt::WaitingForInput if path.is_empty() => return Ok(Next::Wait),
            // Only a stage given the pacer parks, and only the main track's are.
            Attempt::Parked => return Ok(Next::Park),
            Attempt::WaitingForInput => {
                return Err(EngineError::Configuration {
                    node: node.id.clone(),
                    reason: "a human gate inside a parallel branch needs its answer up front (--answers or --auto-approve)".into(),
                });
            }
        };
        track.visits.insert(&node.id, visit);
        // A setup problem (no model, an invalid child workflow) is not an outcome to route on: it stops
        // the run with its reason, in a branch as anywhere else.
        if let Some(failure) = outcome
            .failure
            .as_ref()
            .filter(|f| f.class == FailureClass::Configuration)
        {
            return Err(EngineError::Configuration {
                node: node.id.clone(),
                reason: failure.reason.clone(),
            });
        }
        self.apply_outcome(context, &node.id, &outcome).await?;
        if stage_hooks {
            self.stage_end_hooks(node, &outcome).await?;
        }
        if !matches!(node.kind, NodeKind::Conditional) {
            // A conditional passes the failure before it through: not a failure of its own.
            self.count_failure(track, &node.id, &outcome)?;
        }
        if node.common.goal_gate {
            track.goal_gates.insert(&node.id, outcome.status);
        }
        let next = match &node.kind {
            NodeKind::Exit => Next::End,
            NodeKind::Parallel(ParallelConfig {
                fan_in: Some(fan_in),
                ..
            }) => Next::Jump(*fan_in),
            _ => self.route(track, index, &outcome, context).await?,
        };
        track.last_outcome = Some(outcome);
        track.parallel = None;
        Ok(next)
    }

    /// Runs the attempts at a node of any kind: its handler, its branches, or its child workflow.
    async fn attempts(
        &self,
        path: &[String],
        track: &mut Track,
        index: NodeIndex,
        visit: u32,
        context: &RunContext,
        conversation: &Conversation,
    ) -> Result<Attempt, EngineError> {
        let node = &self.workflow.nodes[index];
        let (previous, work) = match &node.kind {
            NodeKind::Parallel(config) => (
                None,
                Work::FanOut {
                    path,
                    track,
                    config,
                },
            ),
            NodeKind::SubWorkflow(config) => (
                track.last_outcome.as_ref(),
                Work::Child(&config.workflow, self.pacer(path, index)),
            ),
            _ => (
                track.last_outcome.as_ref(),
                Work::Handler(self.handler_of(node)?, self.pacer(path, index)),
            ),
        };
        self.run_attempts(index, visit, context, previous, conversation, work)
            .await
    }

    /// The hooks before a stage: `stage_start` (and `parallel_start` for a fan-out). `Ok(Some)`: the
    /// stage is skipped with this outcome; `Err`: a hook sends the run to that node instead.
    async fn stage_start_hooks(
        &self,
        node: &trellis_workflow::Node,
    ) -> Result<Result<Option<Outcome>, NodeIndex>, EngineError> {
        if self.listens(HookEvent::StageStart) {
            match self
                .hook(stage_context(HookEvent::StageStart, node))
                .await?
            {
                HookDecision::Skip { .. } => return Ok(Ok(Some(skipped_by_hook()))),
                HookDecision::Override { edge_to, .. } => {
                    return Ok(Err(self.hook_target(HookEvent::StageStart, &edge_to)?));
                }
                HookDecision::Proceed | HookDecision::Block { .. } => {}
            }
        }
        if matches!(node.kind, NodeKind::Parallel(_)) && self.listens(HookEvent::ParallelStart) {
            self.hook(stage_context(HookEvent::ParallelStart, node))
                .await?;
        }
        Ok(Ok(None))
    }

    /// The hooks after a stage: `parallel_complete` for a fan-out, then `stage_complete` or
    /// `stage_failed`.
    async fn stage_end_hooks(
        &self,
        node: &trellis_workflow::Node,
        outcome: &Outcome,
    ) -> Result<(), EngineError> {
        if matches!(node.kind, NodeKind::Parallel(_)) && self.listens(HookEvent::ParallelComplete) {
            self.hook(stage_context(HookEvent::ParallelComplete, node))
                .await?;
        }
        let event = if outcome.status == StageStatus::Failed {
            HookEvent::StageFailed
        } else {
            HookEvent::StageComplete
        };
        if self.listens(event) {
            let mut hook = stage_context(event, node);
            hook.status = Some(outcome.status.as_str().to_owned());
            hook.failure_reason = outcome.failure_reason().map(str::to_owned);
            self.hook(hook).await?;
        }
        Ok(())
    }

    /// Where an `edge_selected` hook sends the run instead of the chosen edge, if it does.
    async fn edge_override(
        &self,
        hook: Option<HookContext>,
    ) -> Result<Option<NodeIndex>, EngineError> {
        let Some(hook) = hook else {
            return Ok(None);
        };
        match self.hook(hook).await? {
            HookDecision::Override { edge_to, .. } => {
                Ok(Some(self.hook_target(HookEvent::EdgeSelected, &edge_to)?))
            }
            _ => Ok(None),
        }
    }

    /// Counts a stage that failed the way retrying does not mend (`stage_failed`) by its signature,
    /// when the graph sets `loop_restart_signature_limit`, and stops the run once one signature
    /// has come that many times (Fabro's circuit breaker).
    fn count_failure(
        &self,
        track: &mut Track,
        node_id: &str,
        outcome: &Outcome,
    ) -> Result<(), EngineError> {
        let Some(limit) = self.workflow.graph.failure_repeat_limit else {
            return Ok(());
        };
        let Some(failure) = outcome.failure.as_ref().filter(|f| {
            outcome.status == StageStatus::Failed && f.class == FailureClass::StageFailed
        }) else {
            return Ok(());
        };
        let signature = failure.signature(node_id);
        track.failure_signatures.bump(&signature);
        if track.failure_signatures[signature.as_str()] >= limit {
            return Err(EngineError::FailureRepeated {
                node: node_id.to_owned(),
                signature,
                limit,
            });
        }
        Ok(())
    }

    /// A node's visit limit: its own `max_visits`, else the graph's `max_node_visits`, else in a dry
    /// run, on a loop no edge bounds, [`DRY_RUN_VISITS`] (Fabro's); and whether it is that default.
    fn visit_limit(&self, index: NodeIndex) -> Option<(u32, bool)> {
        let set = self.workflow.nodes[index]
            .common
            .max_visits
            .or(self.workflow.graph.max_node_visits);
        match set {
            Some(limit) => Some((limit, false)),
            None => self
                .dry_run_looping
                .get(index)
                .copied()
                .unwrap_or(false)
                .then_some((DRY_RUN_VISITS, true)),
        }
    }

    /// The goal gate that is not met, if any: the next node of its retry-target chain, or an error when
    /// the chain has no node that can still run.
    fn unmet_goal_gate(&self, track: &Track) -> Result<Option<NodeIndex>, EngineError> {
        let unmet = track
            .goal_gates
            .iter()
            .find(|(_, s)| !matches!(s, StageStatus::Succeeded | StageStatus::PartiallySucceeded));
        let Some((gate, status)) = unmet else {
            return Ok(None);
        };
        let index = self
            .workflow
            .node_index(gate)
            .ok_or_else(|| EngineError::UnknownNode {
                node: gate.to_string(),
            })?;
        let target = self.retry_target(index, track);
        self.emit(
            Some(gate),
            EventKind::GoalGateUnmet {
                status: *status,
                retry_target: target.map(|t| self.workflow.nodes[t].id.clone()),
            },
        );
        match target {
            Some(target) => Ok(Some(target)),
            None => Err(EngineError::GoalGateUnmet {
                node: gate.to_string(),
                status: *status,
            }),
        }
    }

    /// The first node of the retry-target chain (resolved at compile time) that can still run: a
    /// target whose visit limit is spent is passed over for the next, so `fallback_retry_target`
    /// takes over from an exhausted `retry_target`.
    fn retry_target(&self, index: NodeIndex, track: &Track) -> Option<NodeIndex> {
        self.workflow.nodes[index]
            .retry_targets
            .iter()
            .copied()
            .find(|&target| {
                let visits = track
                    .visits
                    .get(self.workflow.nodes[target].id.as_str())
                    .copied()
                    .unwrap_or(0);
                self.visit_limit(target)
                    .is_none_or(|(limit, _)| visits < limit)
            })
    }

    /// Resolves the fidelity and thread of the node about to run (the edge it came in by, then the
    /// node, then the graph), mirrored into the context document as `internal.fidelity` and
    /// `internal.thread_id`. The first node after a resume gets `summary:high` instead of `full`:
    /// its conversation thread is gone with the old process.
    fn conversation(
        &self,
        index: NodeIndex,
        incoming: Option<usize>,
        context: &RunContext,
        degrade_full: &mut bool,
    ) -> Conversation {
        let node = &self.workflow.nodes[index];
        let Some(llm) = node.kind.llm() else {
            return Conversation::default();
        };
        let edge = incoming
            .and_then(|i| self.workflow.edges.get(i))
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
        context.set(
            keys::THREAD_ID,
            thread
                .clone()
                .map_or(serde_json::Value::Null, serde_json::Value::String),
        );
        Conversation { fidelity, thread }
    }

    /// Chooses the edge out of a finished stage (DESIGN.md §3, routing order). A failed stage with
    /// nowhere to go takes its retry-target chain; a YAML node without edges ends the track.
    async fn route(
        &self,
        track: &mut Track,
        index: NodeIndex,
        outcome: &Outcome,
        context: &RunContext,
    ) -> Result<Next, EngineError> {
        let node = &self.workflow.nodes[index];
        // SWEny semantics: a failed node ends the run unless it is `fail_soft`.
        if self.workflow.format == SourceFormat::Yaml
            && outcome.status == StageStatus::Failed
            && !node.common.fail_soft
        {
            return Err(EngineError::NodeFailed {
                node: node.id.clone(),
                reason: outcome.failure_reason().unwrap_or("it failed").to_owned(),
            });
        }
        let view = ConditionView {
            context,
            outcome: Some(outcome.status),
            preferred_label: outcome.preferred_label.as_deref(),
            blobs: &*self.services.blobs,
        };
        // What the router cost and decided, when a model judged `when` edges.
        let (mut router, mut decision) = (None, None);
        let edge = match routing::select(&self.workflow, index, outcome, &view, &track.edge_counts)
        {
            Route::Edge(edge) => Some(edge),
            Route::AskModel {
                candidates,
                fallback,
            } => {
                let judged = self
                    .ask_router(index, &candidates, fallback, context, outcome)
                    .await?;
                router = judged.model;
                decision = Some(judged.decision);
                Some(judged.edge)
            }
            Route::NoEdges if self.workflow.format == SourceFormat::Yaml => return Ok(Next::End),
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
        let Some(edge_index) = edge else {
            if outcome.status == StageStatus::Failed
                && let Some(target) = self.retry_target(index, track)
            {
                self.emit(
                    Some(&node.id),
                    EventKind::EdgeSelected(EdgeChoice {
                        to: self.workflow.nodes[target].id.clone(),
                        reason: Some("retry_target".into()),
                        ..EdgeChoice::default()
                    }),
                );
                return Ok(Next::Jump(target));
            }
            return Err(EngineError::NoEdge {
                node: node.id.clone(),
                outcome: outcome.status,
                tried: Vec::new(),
            });
        };
        let edge = &self.workflow.edges[edge_index];
        if edge.loop_restart {
            // A loop restart begins the loop afresh: edge bounds count again from zero.
            track.edge_counts.clear();
        }
        track
            .edge_counts
            .bump(&routing::key_of(&self.workflow, edge));
        let choice = EdgeChoice {
            to: self.workflow.nodes[edge.to].id.clone(),
            label: edge.label.clone(),
            condition: edge.condition.as_ref().map(|c| c.source().to_owned()),
            when: edge.when.clone(),
            loop_restart: edge.loop_restart,
            reason: None,
            router,
            decision,
        };
        if choice.decision.is_some()
            && let Some(dir) = &outcome.stage_dir
        {
            self.recorder.queue_routing(dir, choice.clone());
        }
        let hook = self
            .listens(HookEvent::EdgeSelected)
            .then(|| edge_context(&node.id, &choice));
        self.emit(Some(&node.id), EventKind::EdgeSelected(choice));
        if let Some(target) = self.edge_override(hook).await? {
            return Ok(Next::Jump(target));
        }
        Ok(if edge.loop_restart {
            Next::LoopRestart(edge_index)
        } else {
            Next::Edge(edge_index)
        })
    }

    /// Asks the router to judge `when` edges, showing it the route-eval view of the context (blob
    /// references replaced by their values). An answer that names no live choice takes the default
    /// edge, or stops the run naming the node and the answer.
    async fn ask_router(
        &self,
        index: NodeIndex,
        candidates: &[usize],
        fallback: Option<usize>,
        context: &RunContext,
        outcome: &Outcome,
    ) -> Result<Judged, EngineError> {
        let node = &self.workflow.nodes[index];
        let options = route_options(&self.workflow, candidates);
        let Some(router) = &self.services.router else {
            return Err(EngineError::Routing {
                node: node.id.clone(),
                reason: "no model is configured".into(),
            });
        };
        let (blobs, workflow) = (self.services.blobs.clone(), self.workflow.clone());
        let snapshot = context.snapshot();
        let view = blocking(move || {
            let resolved = snapshot
                .into_iter()
                .map(|(key, value)| (key, resolve_blob(value, &*blobs)))
                .collect();
            crate::route_view::route_view(&workflow, &resolved)
        })
        .await;
        let default = fallback.map(|e| self.workflow.nodes[self.workflow.edges[e].to].id.clone());
        let request = RouteRequest {
            node_id: &node.id,
            options: &options,
            default: default.as_deref(),
            view: &view,
            record_dir: outcome.stage_dir.as_deref(),
        };
        let answer =
            router
                .choose(&request, self)
                .await
                .map_err(|reason| EngineError::Routing {
                    node: node.id.clone(),
                    reason,
                })?;
        let chosen = answer
            .choice
            .and_then(|choice| candidates.get(choice).copied())
            .or(fallback);
        let Some(edge) = chosen else {
            let ids: Vec<&str> = options.iter().map(|o| o.id.as_str()).collect();
            return Err(EngineError::Routing {
                node: node.id.clone(),
                reason: format!(
                    "the model's answer `{}` names none of the choices ({}), and no unconditional edge stands as a default",
                    answer.answer,
                    ids.join(", ")
                ),
            });
        };
        Ok(Judged {
            edge,
            model: answer.model,
            decision: RouteDecision {
                choices: options,
                default,
                answer: answer.answer,
                reason: answer.reason,
            },
        })
    }
}

/// What hooks are told about a node's stage.
fn stage_context(event: HookEvent, node: &trellis_workflow::Node) -> HookContext {
    let mut context = HookContext::new(event).node(&node.id);
    context.node_label = Some(node.label().to_owned());
    context.handler_type = Some(node.kind.type_name().to_owned());
    context
}

/// What hooks are told about the edge chosen out of `from`.
fn edge_context(from: &str, choice: &EdgeChoice) -> HookContext {
    let mut context = HookContext::new(HookEvent::EdgeSelected).node(from);
    context.edge_from = Some(from.to_owned());
    context.edge_to = Some(choice.to.clone());
    context.edge_label.clone_from(&choice.label);
    context
}

/// The outcome of a stage a `stage_start` hook passed over (its reason is in the hook's event).
fn skipped_by_hook() -> Outcome {
    Outcome::new(StageStatus::Skipped)
}

/// A router's verdict as the engine follows it.
struct Judged {
    edge: usize,
    model: Option<ModelDetails>,
    decision: RouteDecision,
}

/// The options a router is shown for `when` edges: each named by its target's id (`target#2`, ... when
/// several edges share a target).
pub(crate) fn route_options(workflow: &Workflow, candidates: &[usize]) -> Vec<RouteOption> {
    let targets: Vec<&str> = candidates
        .iter()
        .map(|&e| workflow.nodes[workflow.edges[e].to].id.as_str())
        .collect();
    candidates
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            let target = targets[i];
            let before = targets[..i].iter().filter(|t| **t == target).count();
            let shared = targets.iter().filter(|t| **t == target).count() > 1;
            RouteOption {
                id: if shared {
                    format!("{target}#{}", before + 1)
                } else {
                    target.to_owned()
                },
                target: target.to_owned(),
                when: workflow.edges[e].when.clone().unwrap_or_default(),
            }
        })
        .collect()
}
