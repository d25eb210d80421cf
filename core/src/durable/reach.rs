//! Lease-reach arithmetic: how far past the writer's clock a lease reaches, and the most it
//! can reach under given settings.

/// How far past the clock a new lease reaches (ms): the window, widened by twice the
/// duration of the previous renewal (at most [`max_widening_ms`]). A renewal slower than the
/// window would otherwise be stale on arrival, again and again; widened, the next one still
/// leaves room for IDs when it completes.
pub fn lease_reach_ms(window_ms: i64, last_renewal_ms: i64) -> i64 {
    window_ms
        + last_renewal_ms
            .saturating_mul(2)
            .clamp(0, max_widening_ms(window_ms))
}

/// The largest widening: the window itself, and at least 100 ms so that tiny windows still
/// outlast a write to storage and a synchronous standby's round trip.
pub fn max_widening_ms(window_ms: i64) -> i64 {
    window_ms.max(100)
}

/// The furthest a lease written with this window can reach past the writer's clock: IDs
/// borrowed up to `max_drift_ms` ahead of it, then the window and its largest widening.
pub fn reach_cap_ms(window_ms: i64, max_drift_ms: i64) -> i64 {
    max_drift_ms + window_ms + max_widening_ms(window_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_reach_widens_after_slow_renewals_up_to_the_cap() {
        assert_eq!(lease_reach_ms(1_000, 0), 1_000);
        assert_eq!(lease_reach_ms(1_000, 2), 1_004);
        assert_eq!(lease_reach_ms(1_000, 5_000), 2_000);
        assert_eq!(lease_reach_ms(1, 4), 9);
        assert_eq!(lease_reach_ms(1, 1_000), 101);
        assert_eq!(reach_cap_ms(1, 0), 101);
        assert_eq!(reach_cap_ms(1_000, 0), 2_000);
        assert_eq!(reach_cap_ms(1_000, 1_000), 3_000);
        for (w, r) in [(1, 0), (1, 50), (10, 7), (1_000, 999), (3_600_000, 1)] {
            assert!(lease_reach_ms(w, r) <= reach_cap_ms(w, 0));
            // A lease past IDs borrowed up to the drift bound stays within the cap.
            for drift in [0, 1_000, 27_000] {
                assert!(drift + lease_reach_ms(w, r) <= reach_cap_ms(w, drift));
            }
            assert!(lease_reach_ms(w, r) >= w);
        }
    }
}
