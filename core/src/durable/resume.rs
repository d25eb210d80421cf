//! Where a server resumes issuing IDs after a restart or a failover ([`plan_resume`]).
//!
//! Every lease carries the writer's clock, timeline and the furthest a lease of that server
//! may reach. A standby records, with each lease it replays, how far the primary's clock runs
//! ahead of its own ([`PeerClock`]). When a node generates for the first time on a timeline
//! other than the one its newest lease was written on (it was promoted), [`plan_resume`]
//! places the resume point past every lease the old primary could have written and the
//! standby never received.

use super::state::{PeerClock, StateFile};
use crate::generator::Resumed;
use crate::layout::{Epoch, UnixMs};

/// Why IDs resume where [`plan_resume`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeKind {
    /// Nothing recorded: a new cluster.
    Fresh,
    /// A restart on the timeline of the newest lease, with the clock at or after the time
    /// that lease was written and at most one lease reach behind its end: waiting for it is
    /// expected.
    Restart,
    /// A restart with the clock further behind the resume point than one lease reaches: the
    /// clock was set back while the server was down (`step_back_ms` > 0: it is earlier than
    /// when the newest lease was written), or IDs were borrowed ahead of the clock.
    ClockBehind {
        /// How far the clock is behind the time the newest lease was written (ms; 0: not).
        step_back_ms: u64,
        /// When the newest lease was written, on its writer's clock (Unix ms; 0: unknown).
        written_unix_ms: i64,
        /// How far past `written_unix_ms` that lease may lawfully reach (ms).
        reach_ms: i64,
    },
    /// Promoted (or restored to a new timeline) without knowing the old primary's last
    /// WAL: it may have written leases this node never received. The resume point covers
    /// them.
    Failover {
        /// The old primary's clock lead used (ms), 0 when unknown.
        lead_ms: i64,
        /// The safety margin added (ms).
        margin_ms: i64,
        /// Timelines between the newest lease's and this node's: primaries that may have
        /// issued IDs this node has no lease of (each adds one more reach, lead and margin).
        skipped: u32,
    },
}

/// Where a server resumes issuing IDs, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumePlan {
    /// Every new ID has a time at or after this (Unix ms).
    pub floor_unix_ms: i64,
    /// Why.
    pub kind: ResumeKind,
}

/// What a node just promoted knows of the timelines it descends from, read from its
/// timeline history (see [`crate::history`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ancestry {
    /// Timelines strictly between the newest lease's and this node's: primaries whose
    /// leases this node may never have seen.
    pub skipped: u32,
}

/// Margin for a failover floor (ms): 100 ms for the transit of the last message the standby
/// saw (its estimate of the lead is short by it), plus 500 ppm (the largest frequency
/// correction the kernel applies to a disciplined clock) of the time since that
/// observation, for the clocks' drift apart since then.
pub fn failover_margin_ms(since_observation_ms: i64) -> i64 {
    100 + since_observation_ms.max(0) / 2_000
}

impl ResumePlan {
    /// What the generator meets before its first ID after resuming so (`epoch` converts the
    /// lease writer's time to the generator's milliseconds; `now_unix_ms` is the clock the
    /// plan was made with).
    pub fn resumed(&self, epoch: Epoch, now_unix_ms: i64) -> Resumed {
        match self.kind {
            ResumeKind::Fresh | ResumeKind::Restart => Resumed::Restart,
            ResumeKind::ClockBehind {
                step_back_ms,
                written_unix_ms,
                reach_ms,
            } => Resumed::ClockBehind {
                step_back_ms,
                written: epoch.timestamp_or_zero(UnixMs(written_unix_ms)).0,
                reach_ms: reach_ms.max(0) as u64,
            },
            ResumeKind::Failover { .. } => Resumed::Promoted {
                lead_allowance_ms: self.lead_ms(now_unix_ms),
            },
        }
    }

    /// How far the resume point is ahead of the clock `now_unix_ms` (ms, 0 if not).
    pub fn lead_ms(&self, now_unix_ms: i64) -> u64 {
        (self.floor_unix_ms - now_unix_ms).max(0) as u64
    }
}

/// Where to resume, from the recorded state, the timeline the server now writes on, what it
/// knows of the timelines in between ([`Ancestry`]), its clock, the freshest observation of
/// the old primary's clock that shared memory still holds (the WAL receiver's last message;
/// lost at a restart), and the reach cap of the current settings
/// (`reach_cap_ms(lease_window, max_clock_drift)`).
///
/// A restart is lawful when the clock is not earlier than when the newest lease was
/// written and the resume point is within the larger of that reach and the one the lease's
/// writer recorded: the lease may reach that far past a sane clock (IDs borrowed up to
/// `max_clock_drift` ahead, the window, its widening after slow renewals), so waiting for
/// it is expected, never an error.
///
/// A node on another timeline than its newest lease's was promoted (or restored): the old
/// primary may have written leases this node never received (its last WAL cannot tell a
/// clean shutdown from a crash restart's end-of-recovery checkpoint). The floor is `now + max(lead, 0) + reach_cap + margin`: the old primary,
/// which died before this promotion, read at most `now + lead` on its clock, and never wrote
/// a lease further than `reach_cap` ahead of its clock (a lease written while it ran ahead
/// after its own promotion records that lead in its reach); this node itself (if it was a
/// primary before, rewound since) read at most `now` on its own. Each skipped timeline adds
/// one more `lead + reach_cap + margin`: its primary resumed at most that far past the one
/// before. With no state file, a node on a timeline after the first one may descend from a
/// primary that issued IDs it never received a lease of: the same floor, with the current
/// settings' reach.
pub fn plan_resume(
    state: Option<&StateFile>,
    timeline: u32,
    ancestry: Ancestry,
    now_unix_ms: i64,
    live_peer: Option<PeerClock>,
    restart_reach_ms: i64,
) -> ResumePlan {
    let promoted = match state {
        Some(s) => s.timeline != 0 && timeline != 0 && s.timeline != timeline,
        None => timeline > 1,
    };
    let lease = state.map_or(0, |s| s.lease_end_unix_ms);
    if promoted {
        let old_peer = state.and_then(|s| s.peer);
        let peer = match (old_peer, live_peer) {
            (Some(old), Some(new)) => Some(PeerClock::merged(Some(old), new)),
            (old, new) => new.or(old),
        };
        // Never less than this server's own clock: a node rewound (pg_rewind) from a former
        // primary may itself have written leases on the timeline it left.
        let lead_ms = peer.map_or(0, |p| p.lead_ms).max(0);
        let recorded_reach = state.map_or(restart_reach_ms, |s| s.reach_cap_ms);
        let reach = peer.map_or(recorded_reach, |p| p.reach_cap_ms.max(recorded_reach));
        let since = peer.map_or(0, |p| now_unix_ms - p.observed_unix_ms);
        let margin_ms = failover_margin_ms(since);
        let skipped = ancestry.skipped;
        let per_skipped = lead_ms
            .saturating_add(reach.max(restart_reach_ms))
            .saturating_add(margin_ms);
        let floor = now_unix_ms
            .saturating_add(lead_ms)
            .saturating_add(reach)
            .saturating_add(margin_ms)
            .saturating_add(per_skipped.saturating_mul(i64::from(skipped)));
        return ResumePlan {
            floor_unix_ms: floor.max(lease),
            kind: ResumeKind::Failover {
                lead_ms,
                margin_ms,
                skipped,
            },
        };
    }
    let Some(state) = state else {
        return ResumePlan {
            floor_unix_ms: 0,
            kind: ResumeKind::Fresh,
        };
    };
    // A restart with a sane clock resumes at most one reach past it, as the writer's
    // settings or the current ones allow; further is a clock fault for the policy to judge.
    let reach_ms = restart_reach_ms.max(state.reach_cap_ms);
    let kind = if now_unix_ms < state.written_unix_ms || lease - now_unix_ms > reach_ms {
        ResumeKind::ClockBehind {
            step_back_ms: (state.written_unix_ms - now_unix_ms).max(0) as u64,
            written_unix_ms: state.written_unix_ms,
            reach_ms,
        }
    } else {
        ResumeKind::Restart
    };
    ResumePlan {
        floor_unix_ms: lease,
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::reach::{lease_reach_ms, reach_cap_ms};
    use crate::durable::state::{peer, LayoutRecord};
    use crate::durable::wal_record::{record, LeaseRecord};

    #[test]
    fn resume_after_a_restart_or_with_the_clock_set_back() {
        assert_eq!(
            plan_resume(None, 1, Ancestry::default(), 123, None, 2_000).kind,
            ResumeKind::Fresh
        );
        let state = StateFile::own(&record(50_000)); // written at 49_000, timeline 1
        let plan = plan_resume(Some(&state), 1, Ancestry::default(), 49_500, None, 2_000);
        assert_eq!(
            plan,
            ResumePlan {
                floor_unix_ms: 50_000,
                kind: ResumeKind::Restart
            }
        );
        let plan = plan_resume(Some(&state), 1, Ancestry::default(), 19_000, None, 2_000);
        assert_eq!(plan.floor_unix_ms, 50_000);
        let set_back = ResumeKind::ClockBehind {
            step_back_ms: 30_000,
            written_unix_ms: 49_000,
            reach_ms: 2_000,
        };
        assert_eq!(plan.kind, set_back);
        // Written while the clock was behind (IDs borrowed ahead of it): more than one reach
        // behind the lease end is not a plain restart, though the clock did not step.
        let borrowed = StateFile {
            written_unix_ms: 10_000,
            ..state.clone()
        };
        let no_step = ResumeKind::ClockBehind {
            step_back_ms: 0,
            written_unix_ms: 10_000,
            reach_ms: 2_000,
        };
        assert_eq!(
            plan_resume(Some(&borrowed), 1, Ancestry::default(), 20_000, None, 2_000).kind,
            no_step
        );
        // The writer's recorded reach counts too (it may have allowed more borrowing).
        let wide = StateFile {
            reach_cap_ms: 61_000,
            ..borrowed.clone()
        };
        assert_eq!(
            plan_resume(Some(&wide), 1, Ancestry::default(), 20_000, None, 2_000).kind,
            ResumeKind::Restart
        );
        // Files of 0.2 know neither time nor timeline nor reach: the configured reach decides.
        let old = StateFile {
            written_unix_ms: 0,
            timeline: 0,
            reach_cap_ms: 0,
            ..state.clone()
        };
        let restart = plan_resume(Some(&old), 2, Ancestry::default(), 49_000, None, 2_000);
        assert_eq!(restart.kind, ResumeKind::Restart);
        assert_eq!(
            plan_resume(Some(&old), 2, Ancestry::default(), 40_000, None, 2_000).kind,
            ResumeKind::ClockBehind {
                step_back_ms: 0,
                written_unix_ms: 0,
                reach_ms: 2_000,
            }
        );
    }

    #[test]
    fn failover_covers_the_old_primarys_clock_and_reach() {
        // A standby whose clock is 5 s behind replayed a lease; it is promoted (timeline 2)
        // 3 s after its last observation of the primary.
        let state = StateFile::merged(None, &record(50_000), Some(peer(5_000, 44_000))).unwrap();
        let now = 47_000;
        let plan = plan_resume(Some(&state), 2, Ancestry::default(), now, None, 2_000);
        let margin = failover_margin_ms(3_000);
        assert_eq!(margin, 101);
        assert_eq!(plan.floor_unix_ms, now + 5_000 + 2_000 + margin);
        assert_eq!(
            plan.kind,
            ResumeKind::Failover {
                lead_ms: 5_000,
                margin_ms: margin,
                skipped: 0
            }
        );
        // A fresher observation still in shared memory counts too.
        let live = peer(6_000, 46_900);
        let plan = plan_resume(Some(&state), 2, Ancestry::default(), now, Some(live), 2_000);
        assert_eq!(
            plan.floor_unix_ms,
            now + 6_000 + 2_000 + failover_margin_ms(100)
        );
        // A primary whose clock was behind: this node's own clock still counts.
        let behind = StateFile::merged(None, &record(45_000), Some(peer(-9_000, 44_000))).unwrap();
        assert_eq!(
            plan_resume(Some(&behind), 2, Ancestry::default(), now, None, 2_000).floor_unix_ms,
            now + 2_000 + margin
        );
        // Never below a lease the standby did receive.
        let far = StateFile::merged(None, &record(90_000), Some(peer(0, 44_000))).unwrap();
        assert_eq!(
            plan_resume(Some(&far), 2, Ancestry::default(), now, None, 2_000).floor_unix_ms,
            90_000
        );
        // Nothing observed (a restore to a new timeline): the clocks are assumed equal.
        let own = StateFile::own(&record(50_000));
        assert_eq!(
            plan_resume(Some(&own), 2, Ancestry::default(), 60_000, None, 2_000).floor_unix_ms,
            60_000 + 2_000 + 100
        );
    }

    #[test]
    fn a_promotion_before_the_first_lease_record_covers_the_old_primary() {
        let unknown = Ancestry::default();
        // Timeline 1 is where every cluster starts: nothing came before it.
        assert_eq!(
            plan_resume(None, 1, unknown, 47_000, None, 2_000).kind,
            ResumeKind::Fresh
        );
        let plan = plan_resume(None, 2, unknown, 47_000, None, 2_000);
        assert_eq!(plan.floor_unix_ms, 47_000 + 2_000 + 100);
        // The WAL receiver's last view of the old primary's clock counts.
        let live = peer(3_000, 46_900);
        let plan = plan_resume(None, 2, unknown, 47_000, Some(live), 2_000);
        assert_eq!(
            plan.floor_unix_ms,
            47_000 + 3_000 + 2_000 + failover_margin_ms(100)
        );
        assert_eq!(
            plan.resumed(Epoch::TWITTER, 47_000),
            Resumed::Promoted {
                lead_allowance_ms: 5_100
            }
        );
    }

    #[test]
    fn each_skipped_timeline_adds_a_lead_a_reach_and_a_margin() {
        let state = StateFile::own(&record(50_000));
        let skipped = Ancestry { skipped: 2 };
        let plan = plan_resume(Some(&state), 4, skipped, 60_000, None, 3_000);
        // This node's settings reach further than the recorded ones: the skipped primaries
        // may have run with them.
        assert_eq!(plan.floor_unix_ms, 60_000 + 2_100 + 2 * 3_100);
        assert_eq!(
            plan.kind,
            ResumeKind::Failover {
                lead_ms: 0,
                margin_ms: 100,
                skipped: 2
            }
        );
    }

    proptest::proptest! {
        /// Two failovers in a row, A to B to C, with any clock offsets, transit, reach and
        /// timing. B resumes from its floor at once and issues up to its lead allowance ahead
        /// of its clock; its leases record that lead in their reach. Whether or not C
        /// received one of B's lease records, C's floor is above every ID B issued.
        #[test]
        fn repeated_failovers_stay_above_every_issued_id(
            clock_a in -5_000i64..5_000,
            clock_b in -5_000i64..5_000,
            clock_c in -5_000i64..5_000,
            transit in 0i64..100,
            base in 1i64..10_000,
            b_lived in 0i64..20_000,
            c_waited in 0i64..20_000,
            record_at in 0.0f64..=1.0,
            got_b_record in proptest::bool::ANY,
        ) {
            let t_b = 2_000_000_000_000i64; // true time of B's promotion
            let t_d = t_b + b_lived; // B dies
            let t_c = t_d + c_waited; // C promoted
            // What B and C recorded of A, replaying A's last lease.
            let a_lease = LeaseRecord { reach_cap_ms: base, written_unix_ms: t_b + clock_a, lease_end_unix_ms: t_b + clock_a + base, ..record(0) };
            let seen_a = |offset: i64| PeerClock { lead_ms: clock_a - offset - transit, observed_unix_ms: t_b - 1 + offset, reach_cap_ms: base };
            let at_b = StateFile::merged(None, &a_lease, Some(seen_a(clock_b))).unwrap();
            let plan_b = plan_resume(Some(&at_b), 2, Ancestry::default(), t_b + clock_b, None, base);
            let allowance = plan_b.lead_ms(t_b + clock_b) as i64;
            // B's highest ID, at its death: at most its lead allowance (or the drift, below
            // the base reach) ahead of its clock.
            let b_highest = (t_d + clock_b + allowance.max(base)).max(plan_b.floor_unix_ms);
            let seen_b = PeerClock { lead_ms: clock_b - clock_c - transit, observed_unix_ms: t_d + clock_c, reach_cap_ms: base + allowance };
            let plan_c = if got_b_record {
                let t_rec = t_b + ((t_d - t_b) as f64 * record_at) as i64;
                let b_lease = LeaseRecord {
                    reach_cap_ms: base + allowance,
                    written_unix_ms: t_rec + clock_b,
                    lease_end_unix_ms: t_rec + clock_b + allowance + base,
                    timeline: 2,
                    ..a_lease
                };
                let at_c = StateFile::merged(Some(&StateFile::merged(None, &a_lease, Some(seen_a(clock_c))).unwrap()), &b_lease, Some(seen_b)).unwrap();
                plan_resume(Some(&at_c), 3, Ancestry::default(), t_c + clock_c, None, base)
            } else {
                let at_c = StateFile::merged(None, &a_lease, Some(seen_a(clock_c))).unwrap();
                let skipped = Ancestry { skipped: 1 };
                plan_resume(Some(&at_c), 3, skipped, t_c + clock_c, Some(seen_b), base)
            };
            proptest::prop_assert!(plan_c.floor_unix_ms > b_highest, "{:?} vs {}", plan_c, b_highest);
        }
    }

    proptest::proptest! {
        /// Whatever the old primary's clock lead, reach and timing: if it wrote a lease at a
        /// time no later than the promotion, the failover floor is past that lease, provided
        /// the standby saw its lead within the transit the margin allows.
        #[test]
        fn failover_floor_is_past_every_unreceived_lease(
            lead in -60_000i64..60_000,
            transit in 0i64..100,
            observed_ago in 0i64..3_600_000,
            written_before_promotion in 0i64..7_200_000,
            reach_cap in 1i64..7_200_000,
            reach_frac in 0.0f64..=1.0,
        ) {
            let now = 2_000_000_000_000i64;
            let observed = now - observed_ago;
            // What the standby recorded: the lead, short by the message's transit.
            let seen = StateFile::merged(
                None,
                &LeaseRecord { reach_cap_ms: reach_cap, ..record(1) },
                Some(PeerClock { lead_ms: lead - transit, observed_unix_ms: observed, reach_cap_ms: reach_cap }),
            ).unwrap();
            // A lease the primary wrote (on its own clock) before the promotion.
            let written = now - written_before_promotion + lead;
            let lease_end = written + (reach_cap as f64 * reach_frac) as i64;
            let plan = plan_resume(Some(&seen), 2, Ancestry::default(), now, None, 2_000);
            proptest::prop_assert!(plan.floor_unix_ms >= lease_end);
        }
    }

    proptest::proptest! {
        /// A restart with a sane clock never raises an error, for every combination of
        /// settings the configuration accepts, before and after the restart: the lease may
        /// reach up to `reach_cap` past its writer's clock (IDs borrowed up to
        /// `max_clock_drift` ahead, the window, the widening after slow renewals), and a
        /// clock at or after that writer's (or behind it by no more than the drift now
        /// allowed) waits for the resume point instead of refusing. The wait never goes past
        /// the resume point, and a clock set back further than the drift is still refused.
        #[test]
        fn a_restart_with_a_sane_clock_never_refuses(
            window in 1i64..=3_600_000,
            drift in 0i64..=3_600_000,
            last_renewal in 0i64..=10_000_000,
            borrowed_frac in 0.0f64..=1.0,
            new_window in 1i64..=3_600_000,
            new_drift in 0i64..=3_600_000,
            clock_offset in -3_600_000i64..=100_000,
            wait_policy in proptest::bool::ANY,
            max_wait in 1u64..=3_600_000,
        ) {
            use crate::generator::{ClockPolicy, Generator, Next};
            let epoch = Epoch::TWITTER;
            let written = 1_800_000_000_000i64;
            let borrowed = (drift as f64 * borrowed_frac) as i64;
            let lease = written + borrowed + lease_reach_ms(window, last_renewal);
            let state = StateFile::own(&LeaseRecord {
                lease_end_unix_ms: lease,
                layout: LayoutRecord::current(epoch),
                written_unix_ms: written,
                timeline: 1,
                reach_cap_ms: reach_cap_ms(window, drift),
            });
            let now = written + clock_offset;
            let plan = plan_resume(Some(&state), 1, Ancestry::default(), now, None, reach_cap_ms(new_window, new_drift));
            proptest::prop_assert_eq!(plan.floor_unix_ms, lease);
            let floor = epoch.timestamp_or_zero(UnixMs(lease));
            let mut g = Generator::resume(floor, floor, plan.resumed(epoch, now));
            let policy = ClockPolicy {
                max_drift_ms: new_drift as u64,
                max_wait_ms: if wait_policy { max_wait } else { 1 },
                first_sequence: 0,
            };
            let wall = epoch.timestamp_or_zero(UnixMs(now));
            let sane = clock_offset >= -new_drift;
            match g.next(wall, policy) {
                Ok(Next::WaitUntil { wall_ms }) => proptest::prop_assert!(wall_ms <= floor),
                Ok(_) => {}
                Err(e) => {
                    proptest::prop_assert!(!sane, "refused a sane clock: {:?}", e);
                }
            }
            if !sane && !wait_policy {
                proptest::prop_assert!(g.next(wall, policy).is_err(), "a clock set back beyond the drift was not refused");
            }
        }
    }
}
