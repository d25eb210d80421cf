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
//!
//! Durability: the generator only issues timestamps below its lease end, a high-water mark
//! that the caller has made durable (file + WAL) beforehand. Past it, [`Next::NeedLease`]
//! tells the caller to extend the lease ([`Generator::extend_lease`]) and retry. After a
//! restart the generator resumes at the durable lease end ([`Generator::resume`]), so it
//! never reissues an ID, whatever the clock says.

use crate::layout::{pack, EpochMs, Parts, MAX_SEQUENCE, MAX_TIMESTAMP};

/// How far the ID clock may run ahead of the wall clock, and how long a caller may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockPolicy {
    /// Largest lead of the ID clock over the wall clock, in ms. 0 is strict Twitter
    /// behaviour: an exhausted millisecond is waited out, any step back is an error.
    pub max_drift_ms: u64,
    /// Longest wait the generator asks for, in ms; a larger lead is an error. At least 1, so
    /// that an exhausted millisecond can always be waited out.
    pub max_wait_ms: u64,
    /// Sequence number a new millisecond starts at: 0 (Twitter's behaviour), or a random
    /// value below [`RANDOM_START_SPAN`] drawn by the caller for each call, so that at low
    /// traffic IDs are not all even (`snowflake.sequence_start = random`). A contiguous run
    /// starts low enough to fit.
    pub first_sequence: u16,
}

/// With `snowflake.sequence_start = random`, a new millisecond starts at a sequence number
/// below this: the low 8 bits of IDs are then uniform at low traffic, and a saturated
/// millisecond gives 4,096 minus the start IDs (3.1% fewer on average, 6.2% at worst).
pub const RANDOM_START_SPAN: u16 = 256;

impl ClockPolicy {
    /// The default: absorb steps back of up to 1 s, wait out up to 10 ms more.
    pub const DEFAULT: ClockPolicy = ClockPolicy {
        max_drift_ms: crate::settings::DEFAULT_MAX_CLOCK_DRIFT_MS as u64,
        max_wait_ms: 10,
        first_sequence: 0,
    };
}

impl Default for ClockPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Counters of what the generator saw; read by `snowflake_stats()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Events {
    /// IDs issued.
    pub issued: u64,
    /// Times a caller found the current millisecond's 4,096 sequence numbers used up.
    pub exhaustions: u64,
    /// Times the wall clock read earlier than the reading before it.
    pub steps_back: u64,
    /// Largest distance seen between the highest clock reading and a later, lower one (ms).
    pub largest_step_back_ms: u64,
}

/// Why the generator resumed where it did. Decides what a caller meets while the clock is
/// still behind the resume point, before the first ID.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Resumed {
    /// A restart: the resume point is at most one lease ahead of the clock. Not a clock
    /// fault: callers wait for it, whatever the clock policy.
    #[default]
    Restart,
    /// At the restart, the clock was further behind the resume point than one lease reaches:
    /// it was set back while the server was down, or IDs had been borrowed ahead of it. Once
    /// the clock is back within `max_clock_drift` of `written` and the resume point within
    /// `reach_ms` of it, this is an ordinary restart and callers wait; until then the clock
    /// policy applies, and the error reports the real step (0 if the clock did not step).
    ClockBehind {
        /// How far the clock was behind the time the last lease was written (ms).
        step_back_ms: u64,
        /// When the last lease was written, on its writer's clock (ms since the epoch).
        written: u64,
        /// How far past `written` that lease may lawfully reach (ms).
        reach_ms: u64,
    },
    /// Promoted: the resume point is above every ID the old primary can have issued, and
    /// may be ahead of this server's clock. IDs are issued from it at once, up to
    /// `lead_allowance_ms` ahead of the clock, until the clock catches up (see
    /// [`Generator::lead_allowance_ms`]).
    Promoted {
        /// How far ahead of the clock IDs may run meanwhile (ms): the resume point's lead
        /// over the clock when it was decided.
        lead_allowance_ms: u64,
    },
}

/// The generator's state. `Copy` and plain data, so it can live in shared memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Generator {
    /// Whether anything was issued since the state was created.
    started: bool,
    /// Why the floor (the initial `last_timestamp`) is where it is.
    resumed: Resumed,
    /// Timestamp of the last ID issued (the ID clock); before the first ID, the floor.
    last_timestamp: u64,
    /// Sequence of the last ID issued.
    sequence: u16,
    /// Highest wall-clock reading seen, to measure steps back.
    wall_high: u64,
    /// The previous wall-clock reading, to detect a new step back.
    wall_last: u64,
    /// Timestamps below this are covered by the durable lease; 0 means none.
    lease_end: u64,
    /// After a promotion, how far ahead of the wall clock IDs may run (ms) instead of
    /// `max_drift_ms`, until an ID is issued within `max_drift_ms` of the clock; 0 otherwise.
    lead_allowance_ms: u64,
    /// What happened so far.
    events: Events,
}

/// What the generator decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Issue this ID. The state has advanced.
    Issued(Issued),
    /// Nothing issued: release the lock, wait until the wall clock reaches `wall_ms`, retry.
    WaitUntil {
        /// Wall-clock millisecond (since the epoch) to wait for.
        wall_ms: EpochMs,
    },
    /// Nothing issued: make a lease covering `timestamp` durable, extend, retry.
    NeedLease {
        /// The timestamp the next ID would have.
        timestamp: EpochMs,
        /// The wall clock at the decision.
        wall: EpochMs,
    },
}

/// What the generator needs before it can issue: every [`Next`] but `Issued`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A durable lease covering the next ID's timestamp (ms since the epoch).
    Lease {
        /// The timestamp the next ID would have.
        timestamp: EpochMs,
    },
    /// The wall clock at this millisecond since the epoch.
    Clock {
        /// Wall-clock millisecond (since the epoch) to wait for.
        wall_ms: EpochMs,
    },
}

impl Next {
    /// The run issued, or what the generator needs before it can issue.
    #[inline]
    pub fn issued(self) -> Result<Issued, Need> {
        match self {
            Next::Issued(run) => Ok(run),
            Next::NeedLease { timestamp, .. } => Err(Need::Lease { timestamp }),
            Next::WaitUntil { wall_ms } => Err(Need::Clock { wall_ms }),
        }
    }
}

/// Issued IDs: `count` consecutive sequence numbers from `sequence` in one millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issued {
    /// Milliseconds since the epoch.
    pub timestamp: EpochMs,
    /// First sequence number within that millisecond.
    pub sequence: u16,
    /// How many consecutive sequence numbers were issued (1 for a single ID).
    pub count: u16,
    /// How far the wall clock had stepped back behind the highest reading seen (0: none).
    pub step_back_ms: u64,
    /// How far this ID's timestamp is ahead of the wall clock (ms; 0 normally).
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
    /// The generator after a restart or a promotion: every new ID has a timestamp at or above
    /// `floor`; IDs below `lease_end` (the durable lease) may be issued without a new lease.
    pub fn resume(floor: EpochMs, lease_end: EpochMs, resumed: Resumed) -> Generator {
        let lead_allowance_ms = match resumed {
            Resumed::Promoted { lead_allowance_ms } => lead_allowance_ms,
            _ => 0,
        };
        Generator {
            last_timestamp: floor.0,
            lease_end: lease_end.0,
            resumed,
            lead_allowance_ms,
            ..Generator::default()
        }
    }

    /// How far ahead of the wall clock IDs may run now, beyond the clock policy's
    /// `max_drift_ms` (0: no more than it). After a promotion the resume point may be ahead
    /// of this server's clock by up to the old primary's lease reach (and the old primary's
    /// clock lead, after an unclean failover): IDs are issued from it at once, and may stay
    /// that far ahead (a load near 4,096 IDs/ms keeps the ID clock from falling back) until
    /// one is issued within `max_drift_ms` of the clock. A lease written meanwhile reaches
    /// this much further past the clock, and records it for the next promotion.
    pub fn lead_allowance_ms(&self) -> u64 {
        self.lead_allowance_ms
    }

    /// Raises the resume point to `floor` (never lowers it): every later ID has a timestamp at
    /// or above it. A later ID below the floor is waited for, as after a restart.
    pub fn raise_floor(&mut self, floor: EpochMs) {
        let floor = floor.0;
        // Started or not, the next ID may have `last_timestamp` (a higher sequence, or the
        // floor itself): any floor above it moves the generator.
        if floor > self.last_timestamp {
            self.started = false;
            self.resumed = Resumed::Restart;
            self.last_timestamp = floor;
            self.sequence = 0;
        }
    }

    /// Withdraws the lease: nothing more is issued until [`Generator::extend_lease`] grants
    /// a new one (used when the worker-id claim is fenced).
    pub fn revoke_lease(&mut self) {
        self.lease_end = 0;
    }

    /// The ID clock: at or above every timestamp issued, and at the floor before the first.
    pub fn position(&self) -> EpochMs {
        EpochMs(self.last_timestamp)
    }

    /// A lower bound of every ID issued from now on by this generator as node
    /// (`datacenter_id`, `worker_id`): just above the last ID issued, or the first ID of
    /// the resume point before anything was issued.
    pub fn next_id_floor(&self, datacenter_id: u8, worker_id: u8) -> i64 {
        let timestamp = EpochMs(self.last_timestamp);
        if self.started {
            pack(Parts {
                timestamp,
                datacenter_id,
                worker_id,
                sequence: self.sequence,
            })
            .saturating_add(1)
        } else {
            pack(Parts {
                timestamp,
                datacenter_id: 0,
                worker_id: 0,
                sequence: 0,
            })
        }
    }

    /// Timestamp of the last ID issued, if any.
    pub fn last_timestamp(&self) -> Option<EpochMs> {
        self.started.then_some(EpochMs(self.last_timestamp))
    }

    /// Extends the lease to `lease_end` (never shrinks it). Call only once that lease is durable.
    pub fn extend_lease(&mut self, lease_end: EpochMs) {
        self.lease_end = self.lease_end.max(lease_end.0);
    }

    /// The counters.
    pub fn events(&self) -> Events {
        self.events
    }

    /// Decides the next ID for the wall-clock reading `wall` (ms since the epoch).
    #[inline]
    pub fn next(&mut self, wall: EpochMs, policy: ClockPolicy) -> Result<Next, GenerateError> {
        self.next_run(wall, policy, 1, false)
    }

    /// Decides the next run of up to `want` (1..=4096) consecutive IDs within one millisecond.
    /// With `contiguous`, the run has exactly `want` IDs: if the current millisecond has
    /// fewer sequence numbers left, the run starts at sequence 0 of the next one.
    #[inline]
    pub fn next_run(
        &mut self,
        wall: EpochMs,
        policy: ClockPolicy,
        want: u16,
        contiguous: bool,
    ) -> Result<Next, GenerateError> {
        let wall = wall.0;
        debug_assert!((1..=MAX_SEQUENCE + 1).contains(&want));
        let step_back_ms = self.wall_high.saturating_sub(wall);
        if wall < self.wall_last {
            self.events.steps_back += 1;
            self.events.largest_step_back_ms = self.events.largest_step_back_ms.max(step_back_ms);
        }
        self.wall_last = wall;
        self.wall_high = self.wall_high.max(wall);

        // Where a new millisecond starts: a contiguous run must fit in it.
        let first = if contiguous {
            policy.first_sequence.min(MAX_SEQUENCE + 1 - want)
        } else {
            policy.first_sequence.min(MAX_SEQUENCE)
        };
        let (timestamp, sequence) = if wall > self.last_timestamp {
            (wall, first)
        } else if !self.started {
            // Fresh state with a floor at or ahead of the wall clock: start at the floor.
            (self.last_timestamp, first)
        } else if self.sequence < MAX_SEQUENCE {
            (self.last_timestamp, self.sequence + 1)
        } else {
            self.events.exhaustions += 1;
            (self.last_timestamp + 1, first)
        };
        let left = MAX_SEQUENCE - sequence + 1;
        let (timestamp, sequence) = if contiguous && left < want {
            (timestamp + 1, first)
        } else {
            (timestamp, sequence)
        };
        let count = want.min(MAX_SEQUENCE - sequence + 1);

        let ahead_ms = timestamp - timestamp.min(wall);
        let max_drift_ms = policy.max_drift_ms.max(self.lead_allowance_ms);
        if ahead_ms > max_drift_ms {
            let excess = ahead_ms - max_drift_ms;
            let wait = Next::WaitUntil {
                wall_ms: EpochMs(timestamp - max_drift_ms),
            };
            if excess <= policy.max_wait_ms.max(1) {
                return Ok(wait);
            }
            return match (self.started, self.resumed) {
                (false, Resumed::Restart) => Ok(wait),
                (
                    false,
                    Resumed::ClockBehind {
                        written, reach_ms, ..
                    },
                ) if wall.saturating_add(max_drift_ms) >= written
                    && timestamp <= written.saturating_add(reach_ms) =>
                {
                    // The clock is back where the lease was written (within the drift
                    // allowed): waiting for the resume point is a restart's wait.
                    Ok(wait)
                }
                (false, Resumed::ClockBehind { step_back_ms, .. }) => {
                    Err(GenerateError::ClockBehind {
                        step_back_ms,
                        ahead_ms,
                        max_drift_ms,
                    })
                }
                // Promoted, and the clock stepped back since the resume point was decided.
                (true, _) | (false, Resumed::Promoted { .. }) => Err(GenerateError::ClockBehind {
                    step_back_ms,
                    ahead_ms,
                    max_drift_ms,
                }),
            };
        }
        if timestamp > MAX_TIMESTAMP {
            return Err(GenerateError::TimestampExhausted { timestamp });
        }
        if timestamp >= self.lease_end {
            return Ok(Next::NeedLease {
                timestamp: EpochMs(timestamp),
                wall: EpochMs(wall),
            });
        }

        if ahead_ms <= policy.max_drift_ms {
            // The clock caught up with the resume point of a promotion.
            self.lead_allowance_ms = 0;
        }
        self.events.issued += u64::from(count);
        self.started = true;
        self.last_timestamp = timestamp;
        self.sequence = sequence + (count - 1);
        Ok(Next::Issued(Issued {
            timestamp: EpochMs(timestamp),
            sequence,
            count,
            step_back_ms,
            ahead_ms,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The generator after a restart whose durable lease ended at `lease_end`.
    fn resume_at(lease_end: u64) -> Generator {
        Generator::resume(EpochMs(lease_end), EpochMs(lease_end), Resumed::Restart)
    }

    const P: ClockPolicy = ClockPolicy::DEFAULT;
    const STRICT: ClockPolicy = ClockPolicy {
        max_drift_ms: 0,
        max_wait_ms: 10,
        first_sequence: 0,
    };

    /// A generator with an unbounded lease, for tests about the clock.
    fn unleased() -> Generator {
        let mut g = Generator::default();
        g.extend_lease(EpochMs(u64::MAX));
        g
    }

    fn issue(g: &mut Generator, wall: u64, policy: ClockPolicy) -> (u64, u16) {
        match g.next(EpochMs(wall), policy) {
            Ok(Next::Issued(i)) => (i.timestamp.0, i.sequence),
            other => panic!("expected an ID at wall {wall}, got {other:?}"),
        }
    }

    #[test]
    fn same_millisecond_counts_up() {
        let mut g = unleased();
        assert_eq!(issue(&mut g, 100, P), (100, 0));
        assert_eq!(issue(&mut g, 100, P), (100, 1));
        assert_eq!(issue(&mut g, 100, P), (100, 2));
        assert_eq!(issue(&mut g, 101, P), (101, 0));
        assert_eq!(g.last_timestamp(), Some(EpochMs(101)));
        assert_eq!(g.events().issued, 4);
    }

    #[test]
    fn a_raised_floor_is_waited_for_then_issued_from() {
        let mut g = unleased();
        assert_eq!(issue(&mut g, 100, P), (100, 0));
        assert_eq!(issue(&mut g, 100, P), (100, 1));
        // Far beyond the drift bound: the caller waits, whatever the clock policy.
        g.raise_floor(EpochMs(5_000));
        assert_eq!(g.last_timestamp(), None);
        assert_eq!(
            g.next(EpochMs(101), STRICT),
            Ok(Next::WaitUntil {
                wall_ms: EpochMs(5_000)
            })
        );
        assert_eq!(issue(&mut g, 5_000, STRICT), (5_000, 0));
        assert_eq!(issue(&mut g, 5_000, STRICT), (5_000, 1));
        // A floor at or below what was issued changes nothing.
        g.raise_floor(EpochMs(5_000));
        g.raise_floor(EpochMs(10));
        assert_eq!(issue(&mut g, 5_000, STRICT), (5_000, 2));
        // The next millisecond as floor: no more IDs in this one, even at the same clock.
        g.raise_floor(EpochMs(5_001));
        assert_eq!(
            g.next(EpochMs(5_000), STRICT),
            Ok(Next::WaitUntil {
                wall_ms: EpochMs(5_001)
            })
        );
        assert_eq!(issue(&mut g, 5_001, STRICT), (5_001, 0));
        // A floor the clock has passed: IDs follow the clock.
        g.raise_floor(EpochMs(6_000));
        assert_eq!(issue(&mut g, 7_000, STRICT), (7_000, 0));
    }

    #[test]
    fn first_id_can_be_at_timestamp_zero() {
        let mut g = unleased();
        assert_eq!(g.last_timestamp(), None);
        assert_eq!(issue(&mut g, 0, P), (0, 0));
        assert_eq!(issue(&mut g, 0, P), (0, 1));
    }

    #[test]
    fn exhaustion_borrows_the_next_millisecond() {
        let mut g = unleased();
        for seq in 0..=MAX_SEQUENCE {
            assert_eq!(issue(&mut g, 100, P), (100, seq));
        }
        match g.next(EpochMs(100), P).unwrap() {
            Next::Issued(i) => {
                assert_eq!((i.timestamp.0, i.sequence, i.ahead_ms), (101, 0, 1));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(g.events().exhaustions, 1);
    }

    #[test]
    fn strict_policy_waits_for_the_next_millisecond() {
        let mut g = unleased();
        for _ in 0..=MAX_SEQUENCE {
            issue(&mut g, 100, STRICT);
        }
        let before = g;
        assert_eq!(
            g.next(EpochMs(100), STRICT),
            Ok(Next::WaitUntil {
                wall_ms: EpochMs(101)
            })
        );
        assert_eq!(g.last_timestamp, before.last_timestamp);
        assert_eq!(g.sequence, before.sequence);
        assert_eq!(issue(&mut g, 101, STRICT), (101, 0));
    }

    #[test]
    fn small_step_back_continues_from_the_id_clock() {
        let mut g = unleased();
        assert_eq!(issue(&mut g, 5_000, P), (5_000, 0));
        match g.next(EpochMs(4_995), P).unwrap() {
            Next::Issued(i) => {
                assert_eq!((i.timestamp.0, i.sequence), (5_000, 1));
                assert_eq!(i.step_back_ms, 5);
                assert_eq!(i.ahead_ms, 5);
            }
            other => panic!("{other:?}"),
        }
        // Still behind, no new step: counted once.
        assert_eq!(issue(&mut g, 4_996, P), (5_000, 2));
        // The clock catches up: back to normal.
        assert_eq!(issue(&mut g, 5_001, P), (5_001, 0));
        assert_eq!(g.events().steps_back, 1);
        assert_eq!(g.events().largest_step_back_ms, 5);
    }

    #[test]
    fn step_slightly_beyond_the_bound_is_waited_out() {
        let mut g = unleased();
        issue(&mut g, 5_000, P);
        // 1005 ms back: 5 ms beyond the 1000 ms bound, within the 10 ms wait.
        assert_eq!(
            g.next(EpochMs(3_995), P),
            Ok(Next::WaitUntil {
                wall_ms: EpochMs(4_000)
            })
        );
        assert_eq!(issue(&mut g, 4_000, P), (5_000, 1));
    }

    #[test]
    fn large_step_back_is_an_error_with_its_size() {
        let mut g = unleased();
        issue(&mut g, 50_000, P);
        assert_eq!(
            g.next(EpochMs(45_000), P),
            Err(GenerateError::ClockBehind {
                step_back_ms: 5_000,
                ahead_ms: 5_000,
                max_drift_ms: 1_000
            })
        );
        assert_eq!(g.events().largest_step_back_ms, 5_000);
        // Nothing was issued; a later reading past the ID clock works again.
        assert_eq!(issue(&mut g, 50_001, P), (50_001, 0));
    }

    #[test]
    fn strict_policy_errors_on_any_real_step_back() {
        let mut g = unleased();
        issue(&mut g, 1_000, STRICT);
        // 1 ms back: the drift bound is 0, so wait 1 ms.
        assert_eq!(
            g.next(EpochMs(999), STRICT),
            Ok(Next::WaitUntil {
                wall_ms: EpochMs(1_000)
            })
        );
        assert!(matches!(
            g.next(EpochMs(900), STRICT),
            Err(GenerateError::ClockBehind {
                step_back_ms: 100,
                ..
            })
        ));
    }

    #[test]
    fn refuses_beyond_41_bits() {
        let mut g = unleased();
        assert_eq!(issue(&mut g, MAX_TIMESTAMP, P), (MAX_TIMESTAMP, 0));
        assert_eq!(
            g.next(EpochMs(MAX_TIMESTAMP + 1), P),
            Err(GenerateError::TimestampExhausted {
                timestamp: MAX_TIMESTAMP + 1
            })
        );
    }

    #[test]
    fn lease_gates_issuing() {
        let mut g = Generator::default();
        assert_eq!(
            g.next(EpochMs(100), P),
            Ok(Next::NeedLease {
                timestamp: EpochMs(100),
                wall: EpochMs(100)
            })
        );
        assert_eq!(g.last_timestamp(), None);
        g.extend_lease(EpochMs(1_100));
        assert_eq!(issue(&mut g, 100, P), (100, 0));
        assert_eq!(issue(&mut g, 1_099, P), (1_099, 0));
        assert_eq!(
            g.next(EpochMs(1_100), P),
            Ok(Next::NeedLease {
                timestamp: EpochMs(1_100),
                wall: EpochMs(1_100)
            })
        );
        // Extending never shrinks.
        g.extend_lease(EpochMs(500));
        assert_eq!(g.lease_end, 1_100);
    }

    #[test]
    fn resume_after_restart_starts_at_the_lease_end() {
        // Durable lease end 10_000, clock 20 ms behind it.
        let mut g = resume_at(10_000);
        assert_eq!(g.last_timestamp(), None);
        assert_eq!(
            g.next(EpochMs(9_980), P),
            Ok(Next::NeedLease {
                timestamp: EpochMs(10_000),
                wall: EpochMs(9_980)
            })
        );
        g.extend_lease(EpochMs(11_000));
        assert_eq!(issue(&mut g, 9_980, P), (10_000, 0));
        assert_eq!(issue(&mut g, 9_980, P), (10_000, 1));
        // The clock ahead of the lease end: the clock wins.
        let mut g = resume_at(10_000);
        g.extend_lease(EpochMs(20_000));
        assert_eq!(issue(&mut g, 10_050, P), (10_050, 0));
        // A restart within the lease: the clock is behind the resume point by design, and
        // callers wait for it whatever the policy (not an error, not a "step back").
        let mut g = resume_at(10_000);
        g.extend_lease(EpochMs(11_000));
        assert_eq!(
            g.next(EpochMs(5_000), P),
            Ok(Next::WaitUntil {
                wall_ms: EpochMs(9_000)
            })
        );
        assert_eq!(
            g.next(EpochMs(5_000), STRICT),
            Ok(Next::WaitUntil {
                wall_ms: EpochMs(10_000)
            })
        );
        assert_eq!(issue(&mut g, 9_000, P), (10_000, 0));
        // Once started, a clock behind the ID clock is a real step back again.
        assert!(matches!(
            g.next(EpochMs(5_000), P),
            Err(GenerateError::ClockBehind { .. })
        ));
    }

    #[test]
    fn resume_with_the_clock_set_back_reports_the_real_step() {
        let mut g = Generator::resume(
            EpochMs(10_000),
            EpochMs(10_000),
            Resumed::ClockBehind {
                step_back_ms: 30_000,
                written: 40_000,
                reach_ms: 2_000,
            },
        );
        assert_eq!(
            g.next(EpochMs(5_000), P),
            Err(GenerateError::ClockBehind {
                step_back_ms: 30_000,
                ahead_ms: 5_000,
                max_drift_ms: 1_000
            })
        );
        // A wait policy long enough still waits.
        let patient = ClockPolicy {
            max_drift_ms: 1_000,
            max_wait_ms: 10_000,
            first_sequence: 0,
        };
        assert_eq!(
            g.next(EpochMs(5_000), patient),
            Ok(Next::WaitUntil {
                wall_ms: EpochMs(9_000)
            })
        );
    }

    #[test]
    fn random_start_begins_each_millisecond_there_and_blocks_still_fit() {
        let mut g = unleased();
        let at = |first_sequence| ClockPolicy {
            first_sequence,
            ..ClockPolicy::DEFAULT
        };
        let issued = |n: Next| match n {
            Next::Issued(i) => (i.timestamp.0, i.sequence, i.count),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            issued(g.next(EpochMs(100), at(201)).unwrap()),
            (100, 201, 1)
        );
        // Within the millisecond the sequence just counts on, whatever the next draw.
        assert_eq!(issued(g.next(EpochMs(100), at(7)).unwrap()), (100, 202, 1));
        assert_eq!(issued(g.next(EpochMs(101), at(7)).unwrap()), (101, 7, 1));
        // A run takes what is left of the millisecond: 4,096 - 8.
        assert_eq!(
            issued(g.next_run(EpochMs(101), at(9), 4096, false).unwrap()),
            (101, 8, 4088)
        );
        // Exhausted: the next millisecond starts at the new draw.
        assert_eq!(
            issued(g.next(EpochMs(101), at(255)).unwrap()),
            (102, 255, 1)
        );
        // A block of 4,096 starts at 0 of a new millisecond; one of 4,000 at most at 96.
        assert_eq!(
            issued(g.next_run(EpochMs(102), at(255), 4096, true).unwrap()),
            (103, 0, 4096)
        );
        assert_eq!(
            issued(g.next_run(EpochMs(104), at(255), 4000, true).unwrap()),
            (104, 96, 4000)
        );
    }

    #[test]
    fn a_promoted_generator_issues_from_its_resume_point_at_once() {
        // The resume point is 5 s ahead of this server's clock: no wait, no error.
        let promoted = Resumed::Promoted {
            lead_allowance_ms: 5_000,
        };
        let mut g = Generator::resume(EpochMs(10_000), EpochMs(8_000), promoted);
        assert_eq!(g.lead_allowance_ms(), 5_000);
        assert_eq!(
            g.next(EpochMs(5_000), P),
            Ok(Next::NeedLease {
                timestamp: EpochMs(10_000),
                wall: EpochMs(5_000)
            })
        );
        g.extend_lease(EpochMs(20_000));
        assert_eq!(issue(&mut g, 5_000, P), (10_000, 0));
        // A full millisecond later, the ID clock moves on as far ahead as it was.
        for _ in 1..4096 {
            issue(&mut g, 5_000, P);
        }
        assert_eq!(issue(&mut g, 5_001, P), (10_001, 0));
        // Further ahead than the allowance (the clock stepped back): the clock policy.
        assert!(matches!(
            g.next(EpochMs(4_000), P),
            Err(GenerateError::ClockBehind {
                ahead_ms: 6_001,
                max_drift_ms: 5_000,
                ..
            })
        ));
        // Once an ID is issued within max_clock_drift of the clock, the allowance ends.
        assert_eq!(issue(&mut g, 8_000, P), (10_001, 1));
        assert_eq!(g.lead_allowance_ms(), 5_000);
        assert_eq!(issue(&mut g, 9_500, P), (10_001, 2));
        assert_eq!(g.lead_allowance_ms(), 0);
        assert_eq!(issue(&mut g, 10_002, P), (10_002, 0));
        assert!(matches!(
            g.next(EpochMs(8_000), P),
            Err(GenerateError::ClockBehind {
                max_drift_ms: 1_000,
                ..
            })
        ));
    }

    #[test]
    fn a_clock_stepped_back_after_promotion_follows_the_clock_policy() {
        let promoted = Resumed::Promoted {
            lead_allowance_ms: 2_000,
        };
        let mut g = Generator::resume(EpochMs(10_000), EpochMs(20_000), promoted);
        assert!(matches!(
            g.next(EpochMs(7_000), P),
            Err(GenerateError::ClockBehind {
                ahead_ms: 3_000,
                ..
            })
        ));
        let patient = ClockPolicy {
            max_wait_ms: 10_000,
            ..P
        };
        assert_eq!(
            g.next(EpochMs(7_000), patient),
            Ok(Next::WaitUntil {
                wall_ms: EpochMs(8_000)
            })
        );
        assert_eq!(issue(&mut g, 8_000, P), (10_000, 0));
    }

    fn run(g: &mut Generator, wall: u64, want: u16, contiguous: bool) -> (u64, u16, u16) {
        match g.next_run(EpochMs(wall), P, want, contiguous) {
            Ok(Next::Issued(i)) => (i.timestamp.0, i.sequence, i.count),
            other => panic!("expected a run, got {other:?}"),
        }
    }

    #[test]
    fn runs_fill_the_millisecond_then_continue() {
        let mut g = unleased();
        assert_eq!(run(&mut g, 100, 4000, false), (100, 0, 4000));
        // Only 96 left in ms 100: a run takes them, the next starts in ms 101.
        assert_eq!(run(&mut g, 100, 500, false), (100, 4000, 96));
        assert_eq!(run(&mut g, 100, 500, false), (101, 0, 500));
        assert_eq!(g.events().issued, 4596);
    }

    #[test]
    fn contiguous_blocks_never_straddle_milliseconds() {
        let mut g = unleased();
        assert_eq!(run(&mut g, 100, 4000, true), (100, 0, 4000));
        assert_eq!(run(&mut g, 100, 100, true), (101, 0, 100));
        assert_eq!(issue(&mut g, 100, P), (101, 100));
        assert_eq!(run(&mut g, 200, 4096, true), (200, 0, 4096));
        assert_eq!(run(&mut g, 200, 1, true), (201, 0, 1));
    }

    fn policies() -> impl Strategy<Value = ClockPolicy> {
        (
            0u64..50,
            0u64..20,
            prop_oneof![Just(0u16), 0..RANDOM_START_SPAN],
        )
            .prop_map(|(max_drift_ms, max_wait_ms, first_sequence)| ClockPolicy {
                max_drift_ms,
                max_wait_ms,
                first_sequence,
            })
    }

    proptest! {
        /// After a promotion whose resume point is up to a minute ahead of the clock, and a
        /// clock that only moves forwards: no call fails or waits beyond an exhausted
        /// millisecond, every ID is at or above the resume point and above the one before,
        /// and none is further ahead of the clock than the resume point was.
        #[test]
        fn a_promoted_generator_never_refuses_a_forward_clock(
            policy in policies(),
            lead in 0u64..60_000,
            start in 0u64..1_000_000,
            steps in proptest::collection::vec((0u64..50, 1usize..5000), 1..40),
        ) {
            let floor = start + lead;
            let mut g = Generator::resume(EpochMs(floor), EpochMs(u64::MAX), Resumed::Promoted { lead_allowance_ms: lead });
            let mut wall = start;
            let mut last = None;
            for (delta, calls) in steps {
                wall += delta;
                for _ in 0..calls {
                    match g.next(EpochMs(wall), policy) {
                        Ok(Next::Issued(i)) => {
                            let id = (i.timestamp.0, i.sequence);
                            prop_assert!(id.0 >= floor);
                            prop_assert!(i.timestamp.0 <= wall + lead.max(policy.max_drift_ms));
                            if let Some(prev) = last {
                                prop_assert!(id > prev);
                            }
                            last = Some(id);
                        }
                        Ok(Next::WaitUntil { wall_ms: EpochMs(w) }) => {
                            prop_assert!(w - wall <= policy.max_wait_ms.max(1));
                            wall = w;
                        }
                        other => prop_assert!(false, "{:?} at wall {}", other, wall),
                    }
                }
            }
        }
    }

    proptest! {
        /// Whatever the clock does (forwards, still, backwards, jumps) and however often the
        /// server crashes, every issued ID is strictly greater than every earlier one, the ID
        /// clock never leads the wall clock by more than the bound, and a WaitUntil, a
        /// NeedLease or an error changes no issued state. A crash keeps only the durable
        /// lease end; the generator resumes from it.
        #[test]
        fn issued_ids_strictly_increase_across_crashes(
            policy in policies(),
            window in 1u64..40,
            start in 0u64..1_000_000,
            steps in proptest::collection::vec((-60i64..60, 1usize..3000, proptest::bool::weighted(0.1)), 1..60),
        ) {
            let mut g = Generator::default();
            let mut durable_lease_end = 0u64;
            let mut wall = start;
            let mut last: Option<(u64, u16)> = None;
            for (delta, calls, crash) in steps {
                wall = wall.saturating_add_signed(delta);
                if crash {
                    g = resume_at(durable_lease_end);
                }
                for _ in 0..calls {
                    let before = g;
                    match g.next(EpochMs(wall), policy) {
                        Ok(Next::Issued(i)) => {
                            let id = (i.timestamp.0, i.sequence);
                            if let Some(prev) = last {
                                prop_assert!(id > prev, "{id:?} after {prev:?}");
                            }
                            // The watermark's bound held before the call: no ID below it.
                            let packed = pack(Parts { timestamp: i.timestamp, datacenter_id: 3, worker_id: 7, sequence: i.sequence });
                            prop_assert!(packed >= before.next_id_floor(3, 7));
                            prop_assert!(packed < g.next_id_floor(3, 7));
                            prop_assert!(i.timestamp.0 <= wall + policy.max_drift_ms);
                            prop_assert!(i.timestamp.0 < durable_lease_end);
                            prop_assert!(i.sequence <= MAX_SEQUENCE);
                            last = Some(id);
                        }
                        Ok(Next::WaitUntil { wall_ms: EpochMs(wall_ms) }) => {
                            prop_assert!(wall_ms > wall);
                            if before.last_timestamp().is_some() {
                                prop_assert!(wall_ms - wall <= policy.max_wait_ms.max(1));
                            } else {
                                // Before the first ID after a restart: at most up to the
                                // resume point (the durable lease end).
                                prop_assert!(wall_ms <= durable_lease_end.max(wall + policy.max_wait_ms.max(1)));
                            }
                            prop_assert_eq!((g.last_timestamp, g.sequence), (before.last_timestamp, before.sequence));
                            wall = wall_ms; // the caller sleeps until then
                        }
                        Ok(Next::NeedLease { timestamp: EpochMs(timestamp), wall: EpochMs(w) }) => {
                            prop_assert_eq!(w, wall);
                            prop_assert!(timestamp >= g.lease_end);
                            prop_assert_eq!((g.last_timestamp, g.sequence), (before.last_timestamp, before.sequence));
                            durable_lease_end = durable_lease_end.max(timestamp.max(wall) + window);
                            g.extend_lease(EpochMs(durable_lease_end));
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

        /// Runs and blocks interleaved with single IDs never overlap and always increase.
        #[test]
        fn runs_never_overlap(
            calls in proptest::collection::vec((0u64..2, 1u16..=4096, proptest::bool::ANY), 1..200),
        ) {
            let mut g = unleased();
            let mut wall = 10u64;
            let mut next_free: Option<(u64, u16)> = None; // smallest ID not yet issued
            for (advance, want, contiguous) in calls {
                wall += advance;
                let i = loop {
                    match g.next_run(EpochMs(wall), ClockPolicy::DEFAULT, want, contiguous).unwrap() {
                        Next::Issued(i) => break i,
                        Next::WaitUntil { wall_ms } => wall = wall_ms.0,
                        Next::NeedLease { .. } => unreachable!(),
                    }
                };
                if contiguous {
                    prop_assert_eq!(i.count, want);
                }
                prop_assert!(i.count >= 1 && i.count <= want);
                prop_assert!(u32::from(i.sequence) + u32::from(i.count) <= 4096);
                if let Some(free) = next_free {
                    prop_assert!((i.timestamp.0, i.sequence) >= free);
                }
                let end = u32::from(i.sequence) + u32::from(i.count);
                next_free = Some(if end == 4096 { (i.timestamp.0 + 1, 0) } else { (i.timestamp.0, end as u16) });
            }
        }

        /// With the clock moving forward only, the generator never errors and uses every
        /// sequence number from the first one before moving on (no gaps inside a millisecond).
        #[test]
        fn dense_when_clock_is_monotonic(
            policy in policies(),
            advances in proptest::collection::vec((0u64..3, 1usize..5000), 1..20),
        ) {
            let mut g = unleased();
            let mut wall = 1_000u64;
            let mut last: Option<(u64, u16)> = None;
            for (advance, calls) in advances {
                wall += advance;
                for _ in 0..calls {
                    let issued = loop {
                        match g.next(EpochMs(wall), policy).unwrap() {
                            Next::Issued(i) => break i,
                            Next::WaitUntil { wall_ms } => wall = wall_ms.0,
                            Next::NeedLease { .. } => unreachable!(),
                        }
                    };
                    if let Some((t, s)) = last {
                        if issued.timestamp.0 == t {
                            prop_assert_eq!(issued.sequence, s + 1);
                        } else {
                            prop_assert_eq!(issued.sequence, policy.first_sequence);
                            prop_assert!(s == MAX_SEQUENCE || issued.timestamp.0 == wall);
                        }
                    }
                    last = Some((issued.timestamp.0, issued.sequence));
                }
            }
        }
    }
}
