//! How long to wait before trying again: the one backoff of the workspace, for stage retries (the
//! engine) and model-call retries (`trellis-llm`).

use std::time::Duration;

/// Exponential backoff: `initial × factor^(retry − 1)` before retry `retry` (1 for the first),
/// at most `max`, then spread by `jitter`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub factor: f64,
    pub max: Duration,
}

impl Backoff {
    /// The wait before retry `retry` (1 for the first retry), with `jitter` a number in `[0, 1)`
    /// (random, or derived from the clock where a test must be able to predict it): the wait lies
    /// between three quarters of the backoff and the whole of it, so callers that failed together
    /// spread out and no wait is ever longer than `max`.
    pub fn delay(&self, retry: u32, jitter: f64) -> Duration {
        let exponent = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
        // In seconds as a float: a large exponent overflows to infinity, which the cap then takes.
        let grown = self.initial.as_secs_f64() * self.factor.max(0.0).powi(exponent);
        let capped = if grown.is_nan() {
            0.0
        } else {
            grown.min(self.max.as_secs_f64())
        };
        Duration::from_secs_f64(capped * (1.0 - jitter.clamp(0.0, 1.0) * 0.25))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_by_the_factor_up_to_the_cap_and_jitter_only_shortens() {
        let backoff = Backoff {
            initial: Duration::from_millis(500),
            factor: 2.0,
            max: Duration::from_mins(1),
        };
        assert_eq!(backoff.delay(1, 0.0), Duration::from_millis(500));
        assert_eq!(backoff.delay(2, 0.0), Duration::from_secs(1));
        assert_eq!(backoff.delay(4, 0.0), Duration::from_secs(4));
        assert_eq!(backoff.delay(30, 0.0), Duration::from_mins(1));
        assert_eq!(backoff.delay(u32::MAX, 0.0), Duration::from_mins(1));
        assert_eq!(backoff.delay(3, 1.0), Duration::from_millis(1500));
        for jitter in [0.0, 0.3, 0.7, 0.99] {
            let d = backoff.delay(3, jitter);
            assert!(
                d >= Duration::from_millis(1500) && d <= Duration::from_secs(2),
                "{d:?}"
            );
        }
        // A factor below one (or zero) never makes a wait negative.
        let shrinking = Backoff {
            factor: 0.0,
            ..backoff
        };
        assert_eq!(shrinking.delay(3, 0.0), Duration::ZERO);
    }
}
