//! The issuing driver: every function that hands out IDs runs the generator through here.
//! One attempt holds the generator's lock for a few loads and stores; whatever the
//! generator needs first (the clock to reach a millisecond, a longer durable lease, the
//! synchronous standbys' confirmation) is done between attempts with no lock held, and
//! interrupts are serviced there.
//!
//! Nothing here raises: every path returns its error to the SQL function that called it
//! (`functions::api`), which raises it. The configuration comes from that function too,
//! checked there (`lease::generation_config`), since its errors name the function. The
//! function's name comes along only for the clock WARNING, which is written in the middle
//! of a call (a WARNING changes nothing for the caller) and names its source function.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::generation::lease;
use crate::generation::shmem::{self, Node};
use crate::generation::wal;
use crate::generation::watermark;
use crate::server;
use crate::server::errors::{self, SnowflakeError};
use crate::server::gucs;
use crate::server::rows::Int8Array;
use snowflake_core::generator::{
    ClockPolicy, GenerateError, Generator, Issued, Need, Next, RANDOM_START_SPAN,
};
use snowflake_core::layout::{self, Epoch, EpochMs, Parts, UnixMs};
use snowflake_core::settings::{check_epoch_at, Config};

/// The next ID (`snowflake_next()`): unique among all backends of this server, and greater
/// than every ID this server issued before it, including before a restart or crash.
pub(crate) fn next_id(config: &Config, function: &'static str) -> errors::Result<i64> {
    let (node, run) = drive_one(config, function, |g, wall, policy| g.next(wall, policy))?;
    Ok(id_of(node, &run, 0))
}

/// The first of `n` (1 ..= 4,096) contiguous reserved IDs in one millisecond
/// (`snowflake_next_block()`).
pub(crate) fn next_block(config: &Config, function: &'static str, n: u16) -> errors::Result<i64> {
    let (node, block) = drive_one(config, function, |g, wall, policy| {
        g.next_run(wall, policy, n, true)
    })?;
    Ok(id_of(node, &block, 0))
}

/// Fills `ids` with strictly increasing IDs (`snowflake_next_batch()`), written straight
/// into the result array: runs of up to 4,096 per millisecond, one run per hold of the
/// generator's lock, so other sessions get IDs in between and a cancel is serviced between
/// runs, with nothing left to build after the last millisecond.
pub(crate) fn fill_batch(
    config: &Config,
    function: &'static str,
    ids: &mut Int8Array,
) -> errors::Result<()> {
    let bulk = ids.remaining() > 4096;
    drive(config, function, bulk, |g, wall, policy, node| {
        let want = ids.remaining().min(4096) as u16;
        let run = match g.next_run(wall, policy, want, false)?.issued() {
            Ok(run) => run,
            Err(need) => return Ok(Took::Wait(need)),
        };
        for k in 0..run.count {
            ids.push(id_of(node, &run, k));
        }
        Ok(if ids.remaining() > 0 {
            Took::Part
        } else {
            Took::All
        })
    })
}

/// What one attempt under the generator's lock asks `drive` to do next.
enum Pending {
    /// Everything wanted was issued.
    Done,
    /// Part was issued: release the lock, service interrupts, and go on.
    More,
    /// Wait for the clock or extend the lease, then try again.
    Act(Need),
    /// Wait for the synchronous standbys to confirm the lease record ending at this LSN.
    Confirm(u64),
    /// Give up: the generator refused.
    Fail(GenerateError),
    /// Give up: the wall clock is outside the epoch's 41-bit range.
    OutsideEpoch,
    /// Give up: this process has no watermark slot (a bug).
    NoWatermarkSlot,
}

/// What a caller's `take` did with the generator in one attempt (it issues into its own
/// result as it goes).
enum Took {
    /// Everything wanted is issued.
    All,
    /// Part is issued; call again (after the lock was released).
    Part,
    /// Nothing more now: the generator asks for this first.
    Wait(Need),
}

/// Most lease renewals one call makes in a row without issuing anything. Each renewal
/// widens the next one (see `durable::lease_reach_ms`), so even storage slower than the
/// window needs two; more means renewals keep taking longer than a widened lease.
const MAX_RENEWALS_PER_CALL: u32 = 8;

/// One attempt under the generator's lock: read the clock once, let `take` issue what it
/// can, and decide (rate-limited, server-wide) whether clock events need a WARNING, which is
/// emitted after the lock is released. With a random sequence start, each attempt draws
/// where a new millisecond would begin.
#[inline]
fn attempt(
    config: &Config,
    policy: ClockPolicy,
    random_start: bool,
    bulk: bool,
    take: &mut impl FnMut(&mut Generator, EpochMs, ClockPolicy, Node) -> Result<Took, GenerateError>,
) -> (Pending, Option<errors::ClockWarning>) {
    let mut shared = shmem::GENERATOR.exclusive();
    if let Some(lsn) = lease::unconfirmed(&mut shared) {
        return (Pending::Confirm(lsn), None);
    }
    let now = server::now_unix_ms();
    let node = shared.node;
    if !watermark::hold(&shared.generator, node) {
        return (Pending::NoWatermarkSlot, None);
    }
    let policy = if random_start {
        ClockPolicy {
            first_sequence: server::random_below(RANDOM_START_SPAN),
            ..policy
        }
    } else {
        policy
    };
    let pending = match config.epoch.timestamp_of(UnixMs(now)) {
        Ok(wall) => match take(&mut shared.generator, wall, policy, node) {
            Ok(Took::All) => Pending::Done,
            Ok(Took::Part) => Pending::More,
            Ok(Took::Wait(need)) => Pending::Act(need),
            Err(e) => Pending::Fail(e),
        },
        Err(_) => Pending::OutsideEpoch,
    };
    let events = shared.generator.events();
    let new_event = events.steps_back != shared.noticed.steps_back
        || events.exhaustions != shared.noticed.exhaustions;
    let mut report = false;
    // A batch that asked for more than one millisecond's worth exhausts milliseconds by
    // design: only a step back is news then. Its own exhaustions are left out of the next
    // report's count; events held back earlier stay in it.
    let expected = bulk && events.steps_back == shared.noticed.steps_back;
    if new_event && expected {
        shared.warned.exhaustions += events.exhaustions - shared.noticed.exhaustions;
        shared.noticed = events;
    } else if new_event {
        shared.noticed = events;
        let interval = gucs::warning_interval_ms() as u64;
        report = shared.warnings.allow(server::monotonic_ms(), interval);
    }
    let warning = if report {
        let since = shared.warned;
        shared.warned = events;
        let ahead_ms = shared
            .generator
            .last_timestamp()
            .map(|t| config.epoch.to_unix(t).0 - now)
            .unwrap_or(0);
        Some(errors::ClockWarning {
            since,
            now: events,
            ahead_ms,
            // After a promotion, IDs may run further ahead: the bound in force.
            max_drift_ms: policy
                .max_drift_ms
                .max(shared.generator.lead_allowance_ms()),
        })
    } else {
        None
    };
    (pending, warning)
}

/// Runs `take` under the generator's lock until it has issued everything it wants (it
/// returns `Took::All`). Between attempts, with no lock held, services interrupts, waits for
/// the clock or the standbys, or extends the durable lease, as asked; returns the errors.
/// `bulk`: the call asked for more than one millisecond's worth of IDs, so exhausted
/// milliseconds are expected and not warned about.
fn drive(
    config: &Config,
    function: &'static str,
    bulk: bool,
    mut take: impl FnMut(&mut Generator, EpochMs, ClockPolicy, Node) -> Result<Took, GenerateError>,
) -> errors::Result<()> {
    let policy = gucs::clock_policy();
    let random_start = gucs::random_sequence_start();
    let mut renewals = 0;
    loop {
        let (pending, warning) = attempt(config, policy, random_start, bulk, &mut take);
        if let Some(w) = warning {
            w.report(function);
        }
        match pending {
            Pending::Done => return Ok(()),
            Pending::More => {
                renewals = 0;
                Ok(())
            }
            Pending::Confirm(lsn) => {
                wal::wait_for_confirmation(lsn);
                Ok(())
            }
            Pending::Act(Need::Lease { timestamp }) => {
                renewals += 1;
                if renewals > MAX_RENEWALS_PER_CALL {
                    let last = shmem::COUNTERS
                        .get()
                        .last_renewal_ms
                        .load(Ordering::Relaxed);
                    return Err(errors::renewals_too_slow(
                        renewals - 1,
                        last,
                        gucs::lease_window_ms(),
                    ));
                }
                lease::renew(config, timestamp)
            }
            Pending::Act(Need::Clock { wall_ms }) => wait_for_clock(config.epoch, wall_ms),
            Pending::Fail(e) => Err(errors::generate(e, config.epoch)),
            Pending::OutsideEpoch => {
                Err(match check_epoch_at(config.epoch, server::now_unix_ms()) {
                    Err(problem) => errors::epoch_problem(problem),
                    Ok(()) => errors::clock_stalled(0),
                })
            }
            Pending::NoWatermarkSlot => Err(SnowflakeError::internal(
                "snowflake: this process has no watermark slot".into(),
            )),
        }?;
        pgrx::check_for_interrupts!();
    }
}

/// Runs `next` through `drive` until it issues one run, and returns that run with the
/// pair it was issued under.
fn drive_one(
    config: &Config,
    function: &'static str,
    mut next: impl FnMut(&mut Generator, EpochMs, ClockPolicy) -> Result<Next, GenerateError>,
) -> errors::Result<(Node, Issued)> {
    let mut one = None;
    drive(
        config,
        function,
        false,
        |g, wall, policy, node| match next(g, wall, policy)?.issued() {
            Ok(run) => {
                one = Some((node, run));
                Ok(Took::All)
            }
            Err(need) => Ok(Took::Wait(need)),
        },
    )?;
    one.ok_or_else(|| SnowflakeError::internal("no ID was issued".into()))
}

/// The ID of an issued run's `offset`-th member.
#[inline]
fn id_of(node: Node, issued: &Issued, offset: u16) -> i64 {
    layout::pack(Parts {
        timestamp: issued.timestamp,
        datacenter_id: node.datacenter_id,
        worker_id: node.worker_id,
        sequence: issued.sequence + offset,
    })
}

/// Waits, without any lock held, until the wall clock reaches `wall_ms` (ms since the epoch).
/// Interruptible; fails if the clock does not advance.
fn wait_for_clock(epoch: Epoch, wall_ms: EpochMs) -> errors::Result<()> {
    shmem::COUNTERS.get().waits.fetch_add(1, Ordering::Relaxed);
    let UnixMs(target) = epoch.to_unix(wall_ms);
    let started = Instant::now();
    // The wait is known in advance; allow slack for a loaded machine, then call the clock stalled.
    let limit = Duration::from_millis((target - server::now_unix_ms()).max(0) as u64 + 1_000);
    loop {
        let remaining = target - server::now_unix_ms();
        if remaining <= 0 {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(errors::clock_stalled(started.elapsed().as_millis() as u64));
        }
        if remaining > 1 {
            server::sleep_ms((remaining - 1).min(100));
        } else {
            // Less than a millisecond to go: spin. Sleeping can lose the CPU for a scheduler
            // tick, leaving whole milliseconds of sequence space unused.
            std::hint::spin_loop();
            pgrx::check_for_interrupts!();
        }
    }
}
