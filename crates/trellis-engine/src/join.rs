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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(join_policy: JoinPolicy, error_policy: ErrorPolicy) -> ParallelConfig {
        ParallelConfig {
            join_policy,
            error_policy,
            max_parallel: 4,
            fan_in: None,
        }
    }

    fn branch(id: &str, status: StageStatus, score: Option<f64>) -> BranchResult {
        BranchResult {
            id: id.to_owned(),
            status,
            failure_reason: None,
            updated_keys: Vec::new(),
            last_response: None,
            output: None,
            score,
        }
    }

    #[test]
    fn each_policy_needs_its_number_of_successes() {
        assert_eq!(successes_needed(JoinPolicy::WaitAll, 5), 5);
        assert_eq!(successes_needed(JoinPolicy::FirstSuccess, 5), 1);
        assert_eq!(successes_needed(JoinPolicy::KOfN(2), 5), 2);
        // More than there are branches: all of them.
        assert_eq!(successes_needed(JoinPolicy::KOfN(9), 5), 5);
        // A quorum rounds up, and is at least one branch and at most all.
        assert_eq!(successes_needed(JoinPolicy::Quorum(0.5), 5), 3);
        assert_eq!(successes_needed(JoinPolicy::Quorum(0.6), 5), 3);
        assert_eq!(successes_needed(JoinPolicy::Quorum(0.01), 5), 1);
        assert_eq!(successes_needed(JoinPolicy::Quorum(1.0), 5), 5);
        assert_eq!(successes_needed(JoinPolicy::Quorum(0.5), 1), 1);
    }

    #[test]
    fn the_fan_out_status_follows_the_join_and_error_policies() {
        use ErrorPolicy::{Continue, FailFast, Ignore};
        use JoinPolicy::{KOfN, WaitAll};
        use StageStatus::{Failed, PartiallySucceeded, Succeeded};
        // (join, error, succeeded, failed, needed) → status
        let cases = [
            (WaitAll, Continue, 3, 0, 3, Succeeded),
            (WaitAll, Continue, 2, 1, 3, PartiallySucceeded),
            (WaitAll, Continue, 0, 3, 3, Failed),
            (WaitAll, FailFast, 2, 1, 3, Failed),
            (WaitAll, Ignore, 2, 1, 2, Succeeded),
            (KOfN(2), Continue, 2, 0, 2, Succeeded),
            (KOfN(2), Continue, 2, 1, 2, PartiallySucceeded),
            (KOfN(2), Continue, 1, 2, 2, Failed),
            (KOfN(2), Ignore, 2, 5, 2, Succeeded),
            (KOfN(2), Ignore, 1, 0, 2, Failed),
            (KOfN(2), FailFast, 3, 1, 2, Failed),
        ];
        for (join, error, succeeded, failed, needed, expected) in cases {
            assert_eq!(
                fan_out_status(&config(join, error), succeeded, failed, needed),
                expected,
                "{join} {error:?}: {succeeded} succeeded, {failed} failed, {needed} needed"
            );
        }
    }

    #[test]
    fn a_failed_fan_out_says_how_many_succeeded_and_carries_the_results() {
        let results = [
            branch("a", StageStatus::Succeeded, None),
            branch("b", StageStatus::Failed, None),
        ];
        let outcome = fan_out_outcome(
            &config(JoinPolicy::KOfN(2), ErrorPolicy::Continue),
            1,
            1,
            2,
            2,
            &results,
        );
        assert_eq!(outcome.status, StageStatus::Failed);
        assert_eq!(
            outcome.failure_reason(),
            Some("1 of 2 branches succeeded; the join policy `k_of_n(2)` needs 2")
        );
        let listed = &outcome.context_updates[keys::PARALLEL_RESULTS];
        assert_eq!(listed[0]["id"], "a");
        assert_eq!(listed[1]["status"], "failed");
    }

    #[test]
    fn the_best_branch_ranks_by_status_then_score_then_id() {
        use StageStatus::{Failed, PartiallySucceeded, Skipped, Succeeded};
        assert!(best_branch(&[]).is_none());
        let by_status = [
            branch("a", Failed, Some(9.0)),
            branch("b", Skipped, None),
            branch("c", PartiallySucceeded, None),
            branch("d", Succeeded, None),
        ];
        assert_eq!(best_branch(&by_status).unwrap().id, "d");
        let by_score = [
            branch("a", Succeeded, Some(0.2)),
            branch("b", Succeeded, Some(0.9)),
            branch("c", Succeeded, None),
        ];
        assert_eq!(best_branch(&by_score).unwrap().id, "b");
        let by_id = [branch("z", Succeeded, None), branch("m", Succeeded, None)];
        assert_eq!(best_branch(&by_id).unwrap().id, "m");
        let partial_beats_skipped = [
            branch("a", Skipped, None),
            branch("b", PartiallySucceeded, None),
        ];
        assert_eq!(best_branch(&partial_beats_skipped).unwrap().id, "b");
    }
}
