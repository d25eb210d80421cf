//! The generator's state machine, in plain Rust (no pgrx).
//!
//! Given the last state and a wall-clock reading (milliseconds since the epoch), decide the
//! next `(timestamp, sequence)`. The caller holds the shared-memory lock around [`Generator::next`]
//! and does any waiting after releasing it.
//!
//! The ID clock (`last_timestamp`) never goes backwards. When the wall clock falls behind it
//! (a step back, or more than 4,096 IDs in one millisecond), the generator keeps counting
//! from the ID clock, "borrowing" future milliseconds, as long as the ID clock stays at most
//! [`ClockPolicy::max_drift_ms`] ahead of the wall clock. Beyond that it asks the caller to
//! wait, if the wait is short ([`ClockPolicy::max_wait_ms`]), or fails.

use crate::layout::{MAX_SEQUENCE, MAX_TIMESTAMP};

/// How far the ID clock may run ahead of the wall clock, and how long a caller may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockPolicy {
    /// Largest lead of the ID clock over the wall clock, in ms. 0 is strict Twitter
    /// behaviour: an exhausted millisecond is waited out, any step back is an error.
    pub max_drift_ms: u64,
    /// Longest wait the generator asks for, in ms; a larger lead is an error. At least 1, so
    /// that an exhausted millisecond can always be waited out.
    pub max_wait_ms: u64,
}

impl ClockPolicy {
    /// The default: absorb steps back of up to 1 s, wait out up to 10 ms more.
    pub const DEFAULT: ClockPolicy = ClockPolicy {
        max_drift_ms: 1_000,
        max_wait_ms: 10,
    };
}

impl Default for ClockPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The generator's state. `Copy` and plain data, so it can live in shared memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Generator {
    /// Whether anything was issued (or a floor set) since the state was created.
    started: bool,
    /// Timestamp of the last ID issued (the ID clock).
    last_timestamp: u64,
    /// Sequence of the last ID issued.
    sequence: u16,
    /// Highest wall-clock reading seen, to measure steps back.
    wall_high: u64,
}

/// What the generator decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Issue this ID. The state has advanced.
    Issued(Issued),
    /// Nothing issued: release the lock, wait until the wall clock reaches `wall_ms`, retry.
    WaitUntil {
        /// Wall-clock millisecond (since the epoch) to wait for.
        wall_ms: u64,
    },
}

/// One issued `(timestamp, sequence)` and how it came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issued {
    /// Milliseconds since the epoch.
    pub timestamp: u64,
    /// Sequence within that millisecond.
    pub sequence: u16,
    /// How far the wall clock had stepped back behind the highest reading seen (0: none).
    pub step_back_ms: u64,
    /// Whether this ID took a millisecond ahead of the wall clock.
    pub ahead_ms: u64,
}

/// Why no ID can be issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerateError {
    /// The wall clock is too far behind the ID clock to borrow or wait.
    ClockBehind {
        /// Size of the step back, ms (highest reading seen minus this reading).
        step_back_ms: u64,
        /// How far ahead of the wall clock the next ID would be, ms.
        ahead_ms: u64,
        /// The policy's bound.
        max_drift_ms: u64,
    },
    /// The next ID's timestamp does not fit 41 bits.
    TimestampExhausted {
        /// The timestamp that did not fit.
        timestamp: u64,
    },
}

impl Generator {
    /// A fresh generator whose first ID will be at least at `floor` (the resume point after a
    /// restart): every ID it issues has a timestamp greater than or equal to `floor`.
    pub fn starting_at(floor: u64) -> Generator {
        Generator {
            started: false,
            last_timestamp: floor,
            sequence: 0,
            wall_high: 0,
        }
    }

    /// Timestamp of the last ID issued, if any.
    pub fn last_timestamp(&self) -> Option<u64> {
        self.started.then_some(self.last_timestamp)
    }

    /// Decides the next ID for the wall-clock reading `wall` (ms since the epoch).
    #[inline]
    pub fn next(&mut self, wall: u64, policy: ClockPolicy) -> Result<Next, GenerateError> {
        let step_back_ms = self.wall_high.saturating_sub(wall);
        self.wall_high = self.wall_high.max(wall);

        let (timestamp, sequence) = if wall > self.last_timestamp {
            (wall, 0)
        } else if !self.started {
            // Fresh state with a floor at or ahead of the wall clock: start at the floor.
            (self.last_timestamp, 0)
        } else if self.sequence < MAX_SEQUENCE {
            (self.last_timestamp, self.sequence + 1)
        } else {
            (self.last_timestamp + 1, 0)
        };

        let ahead_ms = timestamp - timestamp.min(wall);
        if ahead_ms > policy.max_drift_ms {
            let excess = ahead_ms - policy.max_drift_ms;
            if excess <= policy.max_wait_ms.max(1) {
                return Ok(Next::WaitUntil {
                    wall_ms: timestamp - policy.max_drift_ms,
                });
            }
            return Err(GenerateError::ClockBehind {
                step_back_ms,
                ahead_ms,
                max_drift_ms: policy.max_drift_ms,
            });
        }
        if timestamp > MAX_TIMESTAMP {
            return Err(GenerateError::TimestampExhausted { timestamp });
        }

        self.started = true;
        self.last_timestamp = timestamp;
        self.sequence = sequence;
        Ok(Next::Issued(Issued {
            timestamp,
            sequence,
            step_back_ms,
            ahead_ms,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: ClockPolicy = ClockPolicy::DEFAULT;
    const STRICT: ClockPolicy = ClockPolicy {
        max_drift_ms: 0,
        max_wait_ms: 10,
    };

    fn issue(g: &mut Generator, wall: u64, policy: ClockPolicy) -> (u64, u16) {
        match g.next(wall, policy) {
            Ok(Next::Issued(i)) => (i.timestamp, i.sequence),
            other => panic!("expected an ID at wall {wall}, got {other:?}"),
        }
    }

    #[test]
    fn same_millisecond_counts_up() {
        let mut g = Generator::default();
        assert_eq!(issue(&mut g, 100, P), (100, 0));
        assert_eq!(issue(&mut g, 100, P), (100, 1));
        assert_eq!(issue(&mut g, 100, P), (100, 2));
        assert_eq!(issue(&mut g, 101, P), (101, 0));
        assert_eq!(g.last_timestamp(), Some(101));
    }

    #[test]
    fn first_id_can_be_at_timestamp_zero() {
        let mut g = Generator::default();
        assert_eq!(g.last_timestamp(), None);
        assert_eq!(issue(&mut g, 0, P), (0, 0));
        assert_eq!(issue(&mut g, 0, P), (0, 1));
    }

    #[test]
    fn exhaustion_borrows_the_next_millisecond() {
        let mut g = Generator::default();
        for seq in 0..=MAX_SEQUENCE {
            assert_eq!(issue(&mut g, 100, P), (100, seq));
        }
        match g.next(100, P).unwrap() {
            Next::Issued(i) => {
                assert_eq!((i.timestamp, i.sequence, i.ahead_ms), (101, 0, 1));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn strict_policy_waits_for_the_next_millisecond() {
        let mut g = Generator::default();
        for _ in 0..=MAX_SEQUENCE {
            issue(&mut g, 100, STRICT);
        }
        let before = g;
        assert_eq!(g.next(100, STRICT), Ok(Next::WaitUntil { wall_ms: 101 }));
        assert_eq!(g.last_timestamp, before.last_timestamp);
        assert_eq!(g.sequence, before.sequence);
        assert_eq!(issue(&mut g, 101, STRICT), (101, 0));
    }

    #[test]
    fn small_step_back_continues_from_the_id_clock() {
        let mut g = Generator::default();
        assert_eq!(issue(&mut g, 5_000, P), (5_000, 0));
        match g.next(4_995, P).unwrap() {
            Next::Issued(i) => {
                assert_eq!((i.timestamp, i.sequence), (5_000, 1));
                assert_eq!(i.step_back_ms, 5);
                assert_eq!(i.ahead_ms, 5);
            }
            other => panic!("{other:?}"),
        }
        // The clock catches up: back to normal.
        assert_eq!(issue(&mut g, 5_001, P), (5_001, 0));
    }

    #[test]
    fn step_slightly_beyond_the_bound_is_waited_out() {
        let mut g = Generator::default();
        issue(&mut g, 5_000, P);
        // 1005 ms back: 5 ms beyond the 1000 ms bound, within the 10 ms wait.
        assert_eq!(g.next(3_995, P), Ok(Next::WaitUntil { wall_ms: 4_000 }));
        assert_eq!(issue(&mut g, 4_000, P), (5_000, 1));
    }

    #[test]
    fn large_step_back_is_an_error_with_its_size() {
        let mut g = Generator::default();
        issue(&mut g, 50_000, P);
        assert_eq!(
            g.next(45_000, P),
            Err(GenerateError::ClockBehind {
                step_back_ms: 5_000,
                ahead_ms: 5_000,
                max_drift_ms: 1_000
            })
        );
        // Nothing was issued; a later reading past the ID clock works again.
        assert_eq!(issue(&mut g, 50_001, P), (50_001, 0));
    }

    #[test]
    fn strict_policy_errors_on_any_real_step_back() {
        let mut g = Generator::default();
        issue(&mut g, 1_000, STRICT);
        // 1 ms back: wait 1 ms (sequence space is left in ms 1000... but drift bound is 0).
        assert_eq!(g.next(999, STRICT), Ok(Next::WaitUntil { wall_ms: 1_000 }));
        assert!(matches!(
            g.next(900, STRICT),
            Err(GenerateError::ClockBehind {
                step_back_ms: 100,
                ..
            })
        ));
    }

    #[test]
    fn floor_after_restart() {
        // Durable mark at 10_000 and the clock is behind it by 20 ms.
        let mut g = Generator::starting_at(10_000);
        assert_eq!(g.last_timestamp(), None);
        assert_eq!(issue(&mut g, 9_980, P), (10_000, 0));
        assert_eq!(issue(&mut g, 9_980, P), (10_000, 1));
        // The clock is ahead of the floor.
        let mut g = Generator::starting_at(10_000);
        assert_eq!(issue(&mut g, 10_050, P), (10_050, 0));
    }

    #[test]
    fn refuses_beyond_41_bits() {
        let mut g = Generator::default();
        assert_eq!(issue(&mut g, MAX_TIMESTAMP, P), (MAX_TIMESTAMP, 0));
        assert_eq!(
            g.next(MAX_TIMESTAMP + 1, P),
            Err(GenerateError::TimestampExhausted {
                timestamp: MAX_TIMESTAMP + 1
            })
        );
    }

    fn policies() -> impl Strategy<Value = ClockPolicy> {
        (0u64..50, 0u64..20).prop_map(|(max_drift_ms, max_wait_ms)| ClockPolicy {
            max_drift_ms,
            max_wait_ms,
        })
    }

    proptest! {
        /// Whatever the clock does (forwards, still, backwards, jumps), every issued ID is
        /// strictly greater than the one before, the ID clock never leads the wall clock by
        /// more than the bound, and a WaitUntil or an error changes nothing but `wall_high`.
        #[test]
        fn issued_ids_strictly_increase(
            policy in policies(),
            start in 0u64..1_000_000,
            steps in proptest::collection::vec((-60i64..60, 1usize..3000), 1..60),
        ) {
            let mut g = Generator::default();
            let mut wall = start;
            let mut last: Option<(u64, u16)> = None;
            for (delta, calls) in steps {
                wall = wall.saturating_add_signed(delta);
                for _ in 0..calls {
                    let before = g;
                    match g.next(wall, policy) {
                        Ok(Next::Issued(i)) => {
                            let id = (i.timestamp, i.sequence);
                            if let Some(prev) = last {
                                prop_assert!(id > prev, "{id:?} after {prev:?}");
                            }
                            prop_assert!(i.timestamp <= wall + policy.max_drift_ms);
                            prop_assert!(i.sequence <= MAX_SEQUENCE);
                            last = Some(id);
                        }
                        Ok(Next::WaitUntil { wall_ms }) => {
                            prop_assert!(wall_ms > wall);
                            prop_assert!(wall_ms - wall <= policy.max_wait_ms.max(1));
                            prop_assert_eq!((g.last_timestamp, g.sequence), (before.last_timestamp, before.sequence));
                            // Model the wait: the caller sleeps until wall_ms.
                            wall = wall_ms;
                        }
                        Err(GenerateError::ClockBehind { ahead_ms, .. }) => {
                            prop_assert!(ahead_ms > policy.max_drift_ms + policy.max_wait_ms.max(1));
                            prop_assert_eq!((g.last_timestamp, g.sequence), (before.last_timestamp, before.sequence));
                        }
                        Err(e) => prop_assert!(false, "unexpected {e:?}"),
                    }
                }
            }
        }

        /// With the clock moving forward only, the generator never errors and uses every
        /// sequence number before moving on (no gaps inside a millisecond).
        #[test]
        fn dense_when_clock_is_monotonic(
            policy in policies(),
            advances in proptest::collection::vec((0u64..3, 1usize..5000), 1..20),
        ) {
            let mut g = Generator::default();
            let mut wall = 1_000u64;
            let mut last: Option<(u64, u16)> = None;
            for (advance, calls) in advances {
                wall += advance;
                for _ in 0..calls {
                    let issued = loop {
                        match g.next(wall, policy).unwrap() {
                            Next::Issued(i) => break i,
                            Next::WaitUntil { wall_ms } => wall = wall_ms,
                        }
                    };
                    if let Some((t, s)) = last {
                        if issued.timestamp == t {
                            prop_assert_eq!(issued.sequence, s + 1);
                        } else {
                            prop_assert_eq!(issued.sequence, 0);
                            prop_assert!(s == MAX_SEQUENCE || issued.timestamp == wall);
                        }
                    }
                    last = Some((issued.timestamp, issued.sequence));
                }
            }
        }
    }
}
