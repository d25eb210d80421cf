//! A reading of the monotonic clock, as a type of its own. A fence's deadline and a
//! quarantine's end are monotonic instants, while a timestamp is wall-clock Unix ms: as two
//! integers, one could be compared with the other and compile. Durations stay plain `u64`
//! milliseconds.

/// Milliseconds of this host's monotonic clock (`CLOCK_MONOTONIC`): never moved by a step of
/// the wall clock, and meaningless on another host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonoMs(pub u64);

impl MonoMs {
    /// Before every reading.
    pub const ZERO: MonoMs = MonoMs(0);
    /// After every reading.
    pub const MAX: MonoMs = MonoMs(u64::MAX);

    /// `ms` later (saturating).
    pub fn plus(self, ms: u64) -> MonoMs {
        MonoMs(self.0.saturating_add(ms))
    }

    /// The milliseconds from `earlier` to this reading (0 if `earlier` is later).
    pub fn since(self, earlier: MonoMs) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(MonoMs(5).plus(3), MonoMs(8));
        assert_eq!(MonoMs::MAX.plus(1), MonoMs::MAX);
        assert_eq!(MonoMs(8).since(MonoMs(5)), 3);
        assert_eq!(MonoMs(5).since(MonoMs(8)), 0);
    }
}
