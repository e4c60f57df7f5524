//! What a stage produced: its status, routing hints, context updates and, when it failed, why and
//! whether trying again could help. Retryability is a typed property, never read from a message.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::details::StageDetails;
use trellis_workflow::StageStatus;

/// Why a stage failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The stage did its work and reported failure (a non-zero exit, a model saying `failed`).
    StageFailed,
    /// The stage ran past its `timeout`.
    Timeout,
    /// The stage could not start (a process that would not spawn).
    CouldNotStart,
    /// A transient service error (rate limit, overload, network).
    Transient,
    /// The stage asked to be tried again.
    RetryRequested,
    /// The workflow or the engine was misconfigured (no model, missing file).
    Configuration,
    /// The stage ran out of what it was given: an agent's `max_turns`, a model's context window.
    BudgetExhausted,
}

impl FailureClass {
    /// Whether another attempt could succeed (DESIGN.md §3, retries).
    pub fn retryable(self) -> bool {
        matches!(
            self,
            FailureClass::Timeout
                | FailureClass::CouldNotStart
                | FailureClass::Transient
                | FailureClass::RetryRequested
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::StageFailed => "stage_failed",
            FailureClass::Timeout => "timeout",
            FailureClass::CouldNotStart => "could_not_start",
            FailureClass::Transient => "transient",
            FailureClass::RetryRequested => "retry_requested",
            FailureClass::Configuration => "configuration",
            FailureClass::BudgetExhausted => "budget_exhausted",
        }
    }

    /// Every class.
    pub const ALL: [FailureClass; 7] = [
        FailureClass::StageFailed,
        FailureClass::Timeout,
        FailureClass::CouldNotStart,
        FailureClass::Transient,
        FailureClass::RetryRequested,
        FailureClass::Configuration,
        FailureClass::BudgetExhausted,
    ];
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub class: FailureClass,
    pub reason: String,
}

/// The result of one stage attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub status: StageStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preferred_label: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub suggested_next_ids: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub context_updates: BTreeMap<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub files_touched: Vec<String>,
    /// What the handler records beside the outcome (model and usage, script and output, artifacts):
    /// written into `status.json`, kept with the stage record, and shown in later stages' preambles.
    #[serde(flatten, default)]
    pub details: StageDetails,
    /// The directory of the stage attempt that produced it (routing records its decision there).
    #[serde(skip)]
    pub stage_dir: Option<std::path::PathBuf>,
}

impl Outcome {
    pub fn new(status: StageStatus) -> Self {
        Self {
            status,
            preferred_label: None,
            suggested_next_ids: Vec::new(),
            context_updates: BTreeMap::new(),
            failure: None,
            files_touched: Vec::new(),
            details: StageDetails::default(),
            stage_dir: None,
        }
    }

    pub fn success() -> Self {
        Self::new(StageStatus::Succeeded)
    }

    pub fn failed(class: FailureClass, reason: impl Into<String>) -> Self {
        let mut outcome = Self::new(StageStatus::Failed);
        outcome.failure = Some(Failure {
            class,
            reason: reason.into(),
        });
        outcome
    }

    #[must_use]
    pub fn with_update(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.context_updates.insert(key.into(), value.into());
        self
    }

    pub fn retryable(&self) -> bool {
        self.status == StageStatus::Failed
            && self.failure.as_ref().is_some_and(|f| f.class.retryable())
    }

    pub fn failure_reason(&self) -> Option<&str> {
        self.failure.as_ref().map(|f| f.reason.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Conditions read Fabro's failure classes as sets of these: every class is in exactly one set,
    /// and every word of a set is a class.
    #[test]
    fn fabros_failure_classes_cover_each_class_once() {
        let sets = trellis_workflow::condition::FABRO_FAILURE_CLASSES;
        for class in FailureClass::ALL {
            let holding: Vec<&str> = sets
                .iter()
                .filter(|(_, classes)| classes.contains(&class.as_str()))
                .map(|(fabro, _)| *fabro)
                .collect();
            assert_eq!(holding.len(), 1, "{}: {holding:?}", class.as_str());
        }
        for (fabro, classes) in sets {
            for word in *classes {
                assert!(
                    FailureClass::ALL.iter().any(|c| c.as_str() == *word),
                    "{fabro}: {word}"
                );
            }
        }
    }
}
