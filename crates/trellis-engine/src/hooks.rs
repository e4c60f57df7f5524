//! Lifecycle hooks, the engine's side: the points a run reaches ([`HookEvent`]), what a hook is told
//! about one ([`HookContext`]), what blocking hooks decide ([`HookDecision`]), and the seam that runs
//! them ([`Hooks`], implemented in `trellis-handlers`). The engine asks at each point and follows the
//! decision: a `block` stops the run with the hook's reason, a `skip` passes over the stage, an
//! `override` sends the run to another node.

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::event::Emitter;

/// A point in a run's life that hooks fire at (Fabro's lifecycle events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HookEvent {
    RunStart,
    RunComplete,
    RunFailed,
    StageStart,
    StageComplete,
    StageFailed,
    StageRetrying,
    EdgeSelected,
    ParallelStart,
    ParallelComplete,
    SandboxReady,
    SandboxCleanup,
    CheckpointSaved,
    PreToolUse,
    PostToolUse,
    PostToolUseFailure,
}

impl HookEvent {
    pub const ALL: &'static [HookEvent] = &[
        HookEvent::RunStart,
        HookEvent::RunComplete,
        HookEvent::RunFailed,
        HookEvent::StageStart,
        HookEvent::StageComplete,
        HookEvent::StageFailed,
        HookEvent::StageRetrying,
        HookEvent::EdgeSelected,
        HookEvent::ParallelStart,
        HookEvent::ParallelComplete,
        HookEvent::SandboxReady,
        HookEvent::SandboxCleanup,
        HookEvent::CheckpointSaved,
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::PostToolUseFailure,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::RunStart => "run_start",
            HookEvent::RunComplete => "run_complete",
            HookEvent::RunFailed => "run_failed",
            HookEvent::StageStart => "stage_start",
            HookEvent::StageComplete => "stage_complete",
            HookEvent::StageFailed => "stage_failed",
            HookEvent::StageRetrying => "stage_retrying",
            HookEvent::EdgeSelected => "edge_selected",
            HookEvent::ParallelStart => "parallel_start",
            HookEvent::ParallelComplete => "parallel_complete",
            HookEvent::SandboxReady => "sandbox_ready",
            HookEvent::SandboxCleanup => "sandbox_cleanup",
            HookEvent::CheckpointSaved => "checkpoint_saved",
            HookEvent::PreToolUse => "pre_tool_use",
            HookEvent::PostToolUse => "post_tool_use",
            HookEvent::PostToolUseFailure => "post_tool_use_failure",
        }
    }

    /// The event a name stands for.
    pub fn parse(name: &str) -> Option<HookEvent> {
        Self::ALL.iter().copied().find(|e| e.as_str() == name)
    }

    /// Whether hooks on this event must finish before the run goes on, unless they say otherwise:
    /// the decision points.
    pub fn blocking_by_default(self) -> bool {
        matches!(
            self,
            HookEvent::RunStart
                | HookEvent::StageStart
                | HookEvent::EdgeSelected
                | HookEvent::PreToolUse
                | HookEvent::SandboxReady
        )
    }

    /// The fields of the context a hook's `matcher` is tested against (any may match); events
    /// without any always fire.
    pub fn matched_fields(self, context: &HookContext) -> Vec<&str> {
        let fields = match self {
            HookEvent::StageStart
            | HookEvent::StageComplete
            | HookEvent::StageFailed
            | HookEvent::StageRetrying => {
                vec![context.node_id.as_deref(), context.handler_type.as_deref()]
            }
            HookEvent::EdgeSelected => {
                vec![context.edge_from.as_deref(), context.edge_to.as_deref()]
            }
            HookEvent::PreToolUse | HookEvent::PostToolUse | HookEvent::PostToolUseFailure => {
                vec![context.tool_name.as_deref(), context.node_id.as_deref()]
            }
            HookEvent::CheckpointSaved => vec![context.node_id.as_deref()],
            _ => Vec::new(),
        };
        fields.into_iter().flatten().collect()
    }
}

/// What a hook is told about the point it fires at (its JSON is the hook's input; absent fields are
/// left out).
#[derive(Debug, Clone, Serialize)]
pub struct HookContext {
    pub event: HookEvent,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edge_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edge_to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edge_label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_input: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_output: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

impl HookContext {
    /// A context with only its event set.
    pub fn new(event: HookEvent) -> Self {
        Self {
            event,
            node_id: None,
            node_label: None,
            handler_type: None,
            status: None,
            edge_from: None,
            edge_to: None,
            edge_label: None,
            failure_reason: None,
            attempt: None,
            max_attempts: None,
            tool_name: None,
            tool_input: None,
            tool_call_id: None,
            tool_output: None,
            error_message: None,
        }
    }

    /// The same context about node `id`.
    #[must_use]
    pub fn node(mut self, id: &str) -> Self {
        self.node_id = Some(id.to_owned());
        self
    }
}

/// What the blocking hooks of one point decided, merged: `block` over `skip` and `override` over
/// `proceed`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HookDecision {
    #[default]
    Proceed,
    /// Pass over the stage.
    Skip { reason: Option<String> },
    /// Stop the run with an error.
    Block { reason: Option<String> },
    /// Go to node `edge_to` instead.
    Override {
        edge_to: String,
        reason: Option<String>,
    },
}

impl HookDecision {
    /// The decision's word, as events and hooks' JSON say it.
    pub fn as_str(&self) -> &'static str {
        match self {
            HookDecision::Proceed => "proceed",
            HookDecision::Skip { .. } => "skip",
            HookDecision::Block { .. } => "block",
            HookDecision::Override { .. } => "override",
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            HookDecision::Proceed => None,
            HookDecision::Skip { reason }
            | HookDecision::Block { reason }
            | HookDecision::Override { reason, .. } => reason.as_deref(),
        }
    }

    /// Whether this decision outranks `other` when several hooks decide.
    pub fn outranks(&self, other: &HookDecision) -> bool {
        fn rank(decision: &HookDecision) -> u8 {
            match decision {
                HookDecision::Proceed => 0,
                HookDecision::Skip { .. } | HookDecision::Override { .. } => 1,
                HookDecision::Block { .. } => 2,
            }
        }
        rank(self) > rank(other)
    }
}

/// Runs a run's hooks. The engine calls [`Hooks::fire`] at every point some hook listens to.
#[async_trait]
pub trait Hooks: Send + Sync {
    /// Whether any hook listens to `event` (the engine builds no context otherwise).
    fn listens(&self, event: HookEvent) -> bool;

    /// Runs the hooks of `context.event` that match it: blocking ones in order until one blocks (their
    /// decisions merged), the others in the background. Each hook run is reported through `events` as
    /// a `Hook.Completed` event.
    async fn fire(&self, context: HookContext, events: &dyn Emitter) -> HookDecision;

    /// Waits for the hooks running in the background (the run is ending).
    async fn drain(&self);
}
