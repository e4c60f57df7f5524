//! Join policies, pure: how many branches a fan-out needs, what its status is once they report, and
//! which branch is best. The fan-out driver (`parallel`) and the fan-in handler (`control`) both
//! decide by these, and the unit tests below pin them without running a branch.

use serde_json::Value;
use trellis_workflow::StageStatus;
use trellis_workflow::node_kind::{ErrorPolicy, JoinPolicy, ParallelConfig};

use crate::checkpoint::BranchResult;
use crate::context::{RunContext, resolve_blob};
use crate::keys;
use crate::outcome::{FailureClass, Outcome};

impl BranchResult {
    fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// How many branches must succeed before the merge may proceed.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "branch counts are small and the fraction is in (0, 1]"
)]
pub(crate) fn successes_needed(policy: JoinPolicy, total: usize) -> usize {
    match policy {
        JoinPolicy::WaitAll => total,
        JoinPolicy::FirstSuccess => 1,
        JoinPolicy::KOfN(n) => (n as usize).min(total),
        JoinPolicy::Quorum(fraction) => ((fraction * total as f64).ceil() as usize).clamp(1, total),
    }
}

/// The fan-out stage's outcome, carrying `parallel.results`.
pub(crate) fn fan_out_outcome(
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

impl BranchResult {
    /// The branch results a fan-in merges, from `parallel.results` (resolved from the blob store when
    /// the list grew past the blob threshold).
    pub fn read_all(context: &RunContext, blobs: &dyn crate::blob::BlobStore) -> Vec<BranchResult> {
        context
            .get(keys::PARALLEL_RESULTS)
            .map(|value| resolve_blob(value, blobs))
            .and_then(|value| serde_json::from_value(value).ok())
            .unwrap_or_default()
    }
}

/// The best branch: status rank, then score (higher first), then id.
pub fn best_branch(results: &[BranchResult]) -> Option<&BranchResult> {
    results.iter().min_by(|a, b| {
        let score = |r: &BranchResult| r.score.unwrap_or(f64::NEG_INFINITY);
        status_rank(a.status)
            .cmp(&status_rank(b.status))
            .then_with(|| score(b).total_cmp(&score(a)))
            .then_with(|| a.id.cmp(&b.id))
    })
}
