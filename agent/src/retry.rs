//! How the session retries a model turn whose provider failed
//! transiently (ADR 0510).

use std::time::Duration;

/// How the session asks a turn again when its provider failed
/// transiently (an error event mid-stream, 5xx, 429, a dropped
/// connection, a cut stream): one loop for every provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts at one turn, the first included; after that many
    /// transient failures in a row the session suspends.
    pub max_attempts: u32,
    /// The first wait when the provider asks none; doubled after each
    /// failure, with jitter (between half and all of it).
    pub base_delay: Duration,
    /// No wait is longer: a provider asking more (Retry-After, reset
    /// headers) suspends the session at once instead.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait after failure number `failed` (1-based): what the
    /// provider asked when it asked (`None` when that is past
    /// `max_delay`), else the backoff with jitter.
    pub fn wait(&self, failed: u32, asked: Option<Duration>) -> Option<Duration> {
        if let Some(a) = asked {
            return (a <= self.max_delay).then_some(a);
        }
        let shift = failed.saturating_sub(1).min(16);
        let backoff = self
            .base_delay
            .saturating_mul(1u32 << shift)
            .min(self.max_delay);
        Some(backoff.mul_f64(0.5 + 0.5 * jitter()))
    }
}

/// A fraction in [0, 1), different each call (the standard library's
/// per-process random hash keys, mixed with the time): enough to keep
/// clients that failed together from retrying together.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_asked_is_honoured_up_to_the_cap_and_the_backoff_doubles_with_jitter() {
        let p = RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        };
        assert_eq!(
            p.wait(1, Some(Duration::from_secs(1))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(p.wait(1, Some(Duration::from_secs(3))), None);
        for (failed, full) in [(1, 100), (2, 200), (3, 400), (30, 2000)] {
            for _ in 0..20 {
                let w = p.wait(failed, None).unwrap_or_default();
                assert!(
                    w >= Duration::from_millis(full / 2) && w <= Duration::from_millis(full),
                    "failure {failed}: {w:?}"
                );
            }
        }
    }
}
