//! A rate limiter for server-wide WARNINGs (plain Rust, no pgrx).
//!
//! It must be fed a monotonic clock: with the wall clock, a step back of N seconds would
//! silence the very warnings that report it for N seconds.

/// Lets an event through at most once per interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimiter {
    /// When an event was last let through (monotonic ms); None: never.
    last_ms: Option<u64>,
}

impl RateLimiter {
    /// Whether an event at `now_ms` may be reported; if so, it counts as the last one.
    pub fn allow(&mut self, now_ms: u64, interval_ms: u64) -> bool {
        match self.last_ms {
            Some(last) if now_ms.saturating_sub(last) < interval_ms => false,
            _ => {
                self.last_ms = Some(now_ms);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_event_passes_then_one_per_interval() {
        let mut r = RateLimiter::default();
        assert!(r.allow(5, 1_000));
        assert!(!r.allow(5, 1_000));
        assert!(!r.allow(1_004, 1_000));
        assert!(r.allow(1_005, 1_000));
        assert!(!r.allow(1_006, 1_000));
    }

    #[test]
    fn zero_interval_lets_everything_through() {
        let mut r = RateLimiter::default();
        assert!((0..5).all(|_| r.allow(7, 0)));
    }

    #[test]
    fn an_earlier_reading_never_unlocks_or_panics() {
        // A monotonic clock does not go back; if fed one that does, stay quiet, do not panic.
        let mut r = RateLimiter::default();
        assert!(r.allow(10_000, 1_000));
        assert!(!r.allow(3, 1_000));
    }
}
