//! Retries of one model call: exponential backoff with jitter, at least as long as the provider's
//! `Retry-After`, only for retryable errors and never once output has streamed. A call whose stream
//! broke after output began is the caller's to ask again (a turn retry, [`RetryPolicy::turn_delay`]):
//! what it streamed has already been shown.

use std::time::Duration;

use trellis_process::backoff::Backoff;

use crate::error::LlmError;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The waits between attempts. Its `max` is the longest backoff of our own; a longer
    /// `Retry-After` is still honoured, up to [`MAX_RETRY_AFTER`].
    pub backoff: Backoff,
}

/// The longest `Retry-After` we wait for; a provider asking for more fails the call.
pub const MAX_RETRY_AFTER: Duration = Duration::from_mins(5);

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            backoff: Backoff {
                initial: Duration::from_secs(1),
                factor: 2.0,
                max: Duration::from_mins(1),
            },
        }
    }
}

/// How often one turn is asked again after its stream broke part-way (Fabro's turn-level retries).
pub const TURN_RETRIES: u32 = 3;

impl RetryPolicy {
    /// The wait before turn retry `retry` (1 for the first) after `error`, or `None` when the error
    /// is not a stream that broke after output began (a transient kind, with `partial_output`), or
    /// the [`TURN_RETRIES`] are spent.
    pub fn turn_delay(&self, error: &LlmError, retry: u32) -> Option<Duration> {
        (error.partial_output && error.kind.retryable() && retry <= TURN_RETRIES)
            .then(|| self.backoff.delay(retry, fastrand::f64()))
    }

    /// The wait before attempt `next` (2 for the first retry), or `None` when the error must not be
    /// retried or the attempts are spent.
    pub fn delay(&self, error: &LlmError, next: u32) -> Option<Duration> {
        if !error.retryable() || next > self.max_attempts {
            return None;
        }
        if error.retry_after.is_some_and(|wait| wait > MAX_RETRY_AFTER) {
            return None;
        }
        let wait = self.backoff.delay(next - 1, fastrand::f64());
        Some(wait.max(error.retry_after.unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn error(kind: ErrorKind) -> LlmError {
        LlmError::new(kind, "test", "boom")
    }

    #[test]
    fn backoff_grows_and_stays_within_jitter_bounds() {
        let policy = RetryPolicy::default();
        for next in 2..=4 {
            let d = policy.delay(&error(ErrorKind::Server), next).unwrap();
            let base = Duration::from_secs(1 << (next - 2));
            assert!(d >= base * 3 / 4 && d <= base, "{d:?} for attempt {next}");
        }
        assert_eq!(policy.delay(&error(ErrorKind::Server), 5), None);
    }

    #[test]
    fn retry_after_is_a_floor() {
        let mut e = error(ErrorKind::RateLimit);
        e.retry_after = Some(Duration::from_secs(7));
        assert!(RetryPolicy::default().delay(&e, 2).unwrap() >= Duration::from_secs(7));
    }

    #[test]
    fn only_a_stream_broken_after_output_is_a_turn_retry_and_only_three_times() {
        let policy = RetryPolicy::default();
        let mut broken = error(ErrorKind::Network);
        assert_eq!(policy.turn_delay(&broken, 1), None, "no output yet");
        broken.partial_output = true;
        assert!(policy.turn_delay(&broken, 1).unwrap() <= Duration::from_secs(1));
        assert!(policy.turn_delay(&broken, TURN_RETRIES).is_some());
        assert_eq!(policy.turn_delay(&broken, TURN_RETRIES + 1), None);
        let mut refused = error(ErrorKind::BadRequest);
        refused.partial_output = true;
        assert_eq!(policy.turn_delay(&refused, 1), None);
    }

    #[test]
    fn non_retryable_and_partial_errors_are_not_retried() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay(&error(ErrorKind::Auth), 2), None);
        assert_eq!(policy.delay(&error(ErrorKind::BadRequest), 2), None);
        let mut partial = error(ErrorKind::Network);
        partial.partial_output = true;
        assert_eq!(policy.delay(&partial, 2), None);
    }
}
