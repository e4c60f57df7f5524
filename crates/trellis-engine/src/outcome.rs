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

/// How much of a failure's normalised reason its signature keeps (Fabro's figure).
const SIGNATURE_REASON_CHARS: usize = 240;

impl Failure {
    /// The failure's fingerprint at `node_id` (the context's `failure_signature`, Fabro's format):
    /// `node|class|reason`, the reason lowercased, on one line, every run of digits written `<n>`
    /// and every hexadecimal string (`0x…`, or seven or more hex digits with a digit among them)
    /// `<hex>`, cut at 240 characters, so failures that differ only in a line number, a time or
    /// an id have one signature.
    pub fn signature(&self, node_id: &str) -> String {
        let reason: String = normalise(&self.reason)
            .chars()
            .take(SIGNATURE_REASON_CHARS)
            .collect();
        format!("{node_id}|{}|{reason}", self.class.as_str())
    }
}

/// A reason as a signature keeps it: see [`Failure::signature`].
fn normalise(reason: &str) -> String {
    let lower = reason.to_lowercase();
    let mut out = String::with_capacity(lower.len());
    let mut rest = lower.as_str();
    while let Some(c) = rest.chars().next() {
        if c.is_alphanumeric() || c == '_' {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let (word, after) = rest.split_at(end);
            if is_hex(word) {
                out.push_str("<hex>");
            } else {
                mask_digits(word, &mut out);
            }
            rest = after;
        } else if c.is_whitespace() {
            if !out.ends_with(' ') && !out.is_empty() {
                out.push(' ');
            }
            rest = rest.trim_start();
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out.truncate(out.trim_end().len());
    out
}

/// `word` with each run of digits in it written `<n>` (`42`, `31s`, `test_7`).
fn mask_digits(word: &str, out: &mut String) {
    let mut in_number = false;
    for c in word.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push_str("<n>");
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
}

/// `0x1f`, or a run of seven or more hex digits with a digit among them (a hash, an address), not
/// an English word made of the letters a to f.
fn is_hex(word: &str) -> bool {
    let hex = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_hexdigit());
    match word.strip_prefix("0x") {
        Some(digits) => hex(digits),
        None => word.len() >= 7 && hex(word) && word.bytes().any(|b| b.is_ascii_digit()),
    }
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

    /// Failures that differ only in numbers, ids or spacing share a signature; another reason,
    /// class or node does not.
    #[test]
    fn a_signature_masks_numbers_and_ids_but_not_words() {
        let failure = |class, reason: &str| Failure {
            class,
            reason: reason.to_owned(),
        };
        let sig = |reason: &str| failure(FailureClass::StageFailed, reason).signature("test");
        assert_eq!(
            sig(
                "The command exited with code 1:\n  FAILED test_add (line 42) in 0.31s, run 3f9a2c1d"
            ),
            "test|stage_failed|the command exited with code <n>: failed test_add (line <n>) in <n>.<n>s, run <hex>"
        );
        assert_eq!(
            sig("error at 0xDEADbeef"),
            "test|stage_failed|error at <hex>"
        );
        assert_eq!(
            sig("exit 2 at 10:04:59, pid 31337"),
            sig("exit 7  at 11:15:02, pid 4")
        );
        // Words of hex letters are words; digits in a name are masked like any others.
        assert_eq!(
            sig("deadbeef facade v2 x86_64"),
            "test|stage_failed|deadbeef facade v<n> x<n>_<n>"
        );
        assert_ne!(sig("test_add failed"), sig("test_sub failed"));
        assert_ne!(
            sig("x"),
            failure(FailureClass::Timeout, "x").signature("test")
        );
        assert_ne!(
            sig("x"),
            failure(FailureClass::StageFailed, "x").signature("lint")
        );
        // Cut at 240 characters of reason, on a character boundary.
        let long = sig(&"é".repeat(500));
        assert_eq!(long.chars().count(), "test|stage_failed|".len() + 240);
    }
}
