//! The SQL-facing functions. They convert types, call the pure modules and raise errors.

use std::cell::Cell;
use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgrx::prelude::*;
use pgrx::{composite_type, AllocatedByRust};

use crate::errors::{self, SnowflakeError};
use crate::gucs;
use crate::origin;
use crate::rows::{cell, result_row, Int8Array};
use crate::shmem::{self, Node};
use crate::waits;
use crate::wal;
use snowflake_core::claim::{ClaimStatus, Fence};
use snowflake_core::durable::{
    self, AdoptedOrigin, LayoutCheck, LayoutRecord, LeaseRecord, ResumeKind, StateFile,
};
use snowflake_core::foreign::{ForeignLayout, ForeignParts, LAYOUT_NAMES};
use snowflake_core::generator::{ClockPolicy, GenerateError, Generator, Issued, Next, Resumed};
use snowflake_core::layout::{self, Epoch, Parts};
use snowflake_core::settings::{check_epoch_at, format_rfc3339, redacted, Config, WorkerId};

/// Unix milliseconds of PostgreSQL's timestamp origin, 2000-01-01T00:00:00Z.
const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;

extension_sql_file!("../sql/types.sql", name = "types", bootstrap);
extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);

thread_local! {
    /// The configuration once generation succeeded in this backend: preloaded, settings
    /// valid, not in recovery, durable state loaded. None of that can change while the
    /// backend lives (the settings are PGC_POSTMASTER, a primary never re-enters recovery,
    /// and a crash restart ends every backend), so later calls skip the checks.
    static READY: Cell<Option<Config>> = const { Cell::new(None) };
    /// Epoch that passed the decode-side check against the layout record.
    static DECODE_EPOCH: Cell<Option<Epoch>> = const { Cell::new(None) };
}

/// The wall clock in Unix milliseconds (`CLOCK_REALTIME`, which libfaketime can move).
#[inline]
pub(crate) fn now_unix_ms() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// The data directory (every backend's working directory).
pub(crate) fn data_dir() -> PathBuf {
    // SAFETY: DataDir is set before any backend runs SQL and never changes afterwards.
    let dir = unsafe { CStr::from_ptr(pg_sys::DataDir) };
    PathBuf::from(dir.to_string_lossy().into_owned())
}

/// Everything `snowflake_next()` needs before it may touch the generator.
#[inline]
fn generation_config(function: &'static str) -> errors::Result<Config> {
    match READY.get() {
        Some(config) => Ok(config),
        None => first_generation_config(function),
    }
}

#[cold]
fn first_generation_config(function: &'static str) -> errors::Result<Config> {
    // Parsed at preload, like shared memory: None means the library was not preloaded.
    let config = gucs::config()
        .ok_or_else(|| errors::not_preloaded(function))?
        .map_err(|e| errors::setting(&e))?;
    if let Some(rejected) = gucs::rejected_at_start() {
        return Err(errors::setting(&rejected));
    }
    // SAFETY: plain function call; cheap once recovery has ended (cached in the backend).
    if unsafe { pg_sys::RecoveryInProgress() } {
        return Err(errors::in_recovery(function));
    }
    ensure_loaded(&config)?;
    adopt_origins(&config)?;
    READY.set(Some(config));
    Ok(config)
}

/// Once per server start (and per crash restart, and after a promotion): check the recorded
/// layout against the configuration and decide where IDs resume (`durable::plan_resume`):
/// at the durable lease end after a restart, past every lease the old primary could have
/// written after a promotion. File I/O runs under the DURABLE lock, never under the
/// generator's. Called once per backend, before READY is set.
fn ensure_loaded(config: &Config) -> errors::Result<()> {
    // Never record an epoch that cannot generate now (in the future, or exhausted).
    check_epoch_at(config.epoch, now_unix_ms()).map_err(errors::epoch_problem)?;
    let mut durable_state = shmem::DURABLE.exclusive();
    if !durable_state.loaded {
        let state = recorded_state(config.epoch)?;
        let live_peer = state
            .as_ref()
            .and_then(|s| wal::live_peer_clock(s.reach_cap_ms));
        let plan = durable::plan_resume(
            state.as_ref(),
            wal::insertion_timeline(),
            now_unix_ms(),
            live_peer,
            durable::reach_cap_ms(gucs::lease_window_ms() as i64, 0),
        );
        let lease_end = state
            .map(|s| lease_timestamp(config.epoch, s.lease_end_unix_ms))
            .unwrap_or(0);
        let floor = lease_timestamp(config.epoch, plan.floor_unix_ms);
        let resumed = match plan.kind {
            ResumeKind::Fresh | ResumeKind::Restart => Resumed::Restart,
            ResumeKind::ClockBehind { step_back_ms } => Resumed::ClockBehind { step_back_ms },
            ResumeKind::Failover { lead_ms, margin_ms } => {
                errors::failover_resume(plan.floor_unix_ms, lead_ms, margin_ms).log();
                Resumed::Failover
            }
        };
        let mut shared = shmem::GENERATOR.exclusive();
        match config.worker_id {
            WorkerId::Fixed(worker_id) => {
                shared.generator = Generator::resume(floor, lease_end, resumed);
                shared.node = Node {
                    datacenter_id: config.datacenter_id,
                    worker_id,
                };
                shared.fence = Fence::UNLIMITED;
            }
            WorkerId::Auto => {
                // No lease yet: the first ID extends it, which checks the claim's fence.
                shared.generator = Generator::resume(floor, 0, resumed);
                let claim_floor = shared.claim_floor;
                shared.generator.raise_floor(claim_floor);
            }
        }
        shared.lease_lsn = 0;
        shared.confirmed_lsn = 0;
        durable_state.lease_end = lease_end;
        durable_state.loaded = true;
    }
    Ok(())
}

/// Reads the state file and refuses if its recorded layout differs from the one `epoch`
/// gives: stored IDs must never be generated or decoded under another layout.
fn recorded_state(epoch: Epoch) -> errors::Result<Option<StateFile>> {
    let configured = LayoutRecord::current(epoch);
    let state = durable::read(&data_dir()).map_err(|e| errors::state_file(&e, false))?;
    match durable::check_layout(state.as_ref(), &configured) {
        LayoutCheck::Differs { recorded } => Err(errors::layout_mismatch(&recorded, &configured)),
        LayoutCheck::Matches | LayoutCheck::NotRecorded => Ok(state),
    }
}

/// A lease end in Unix ms as a timestamp since the epoch (0 if at or before the epoch).
fn lease_timestamp(epoch: Epoch, lease_end_unix_ms: i64) -> u64 {
    lease_end_unix_ms.saturating_sub(epoch.unix_ms()).max(0) as u64
}

/// Extends the durable lease so that it covers `timestamp`: state file first (fsync), then
/// a WAL record, and only then the generator's lease. The lease reaches
/// `lease_reach_ms` past the later of `timestamp` and the clock, read under the DURABLE lock
/// (so that waiting for that lock does not make the lease stale). A session that asks for
/// synchronous standbys waits for them to confirm the record before the lease is used,
/// whoever wrote it.
fn renew_lease(config: &Config, timestamp: u64) -> errors::Result<()> {
    let window = gucs::lease_window_ms() as i64;
    let (lease_end, lsn, wrote_at) = {
        let mut durable_state = shmem::DURABLE.exclusive();
        let mut wrote_at = None;
        if durable_state.lease_end <= timestamp {
            wrote_at = Some(waits::monotonic_ms());
            let now = now_unix_ms();
            let wall = config.epoch.timestamp_of(now).unwrap_or(0);
            let last_renewal = shmem::COUNTERS
                .get()
                .last_renewal_ms
                .load(Ordering::Relaxed);
            let reach = durable::lease_reach_ms(window, last_renewal as i64) as u64;
            let new_end = timestamp
                .max(wall)
                .saturating_add(reach)
                .max(durable_state.lease_end);
            write_lease(&mut durable_state, config, new_end, now)?;
        }
        (durable_state.lease_end, durable_state.lease_lsn, wrote_at)
    };
    let level = wal::wait_for_confirmation(lsn);
    if let Some(started) = wrote_at {
        // From the clock reading the lease was computed from to the moment it can be used.
        let took = waits::monotonic_ms().saturating_sub(started);
        let counters = shmem::COUNTERS.get();
        counters.last_renewal_ms.store(took, Ordering::Relaxed);
    }
    let mut shared = shmem::GENERATOR.exclusive();
    let fence = shared.fence;
    let granted_end = if fence == Fence::UNLIMITED {
        lease_end
    } else {
        if !fence.allows(config.epoch.to_unix_ms(timestamp), waits::monotonic_ms()) {
            drop(shared);
            return wait_for_claim(config, timestamp);
        }
        lease_end.min(lease_timestamp(config.epoch, fence.cap_unix_ms))
    };
    shared.generator.extend_lease(granted_end);
    shared.lease_lsn = shared.lease_lsn.max(lsn);
    note_confirmed(&mut shared, lsn, level);
    Ok(())
}

/// Called when the claim's fence does not cover `timestamp`, the next ID's. Waits while that
/// can change soon: the registry worker is making its first attempt (just after a start or a
/// promotion), or it holds a claim whose next renewal will move the cap past `timestamp`
/// (an ID clock running ahead of the wall clock). Up to one claim TTL; then, or at once in
/// any other state, raises the error that explains the state. Ok: try again.
fn wait_for_claim(config: &Config, timestamp: u64) -> errors::Result<()> {
    let timing = gucs::claim_timing();
    let wanted_unix_ms = config.epoch.to_unix_ms(timestamp);
    let started = waits::monotonic_ms();
    loop {
        let fence = shmem::GENERATOR.share().fence;
        let now_mono = waits::monotonic_ms();
        if fence.allows(wanted_unix_ms, now_mono) {
            return Ok(());
        }
        let claim = *shmem::CLAIM.share();
        let waiting = matches!(claim.status, ClaimStatus::Starting | ClaimStatus::Held);
        if !waiting || now_mono.saturating_sub(started) > timing.ttl_ms() {
            let registry = gucs::registry().map(|r| redacted(&r)).unwrap_or_default();
            let mut detail = claim.detail();
            if claim.status == ClaimStatus::Held {
                detail = format!(
                    "The claim allows IDs up to {} ms past its last renewal; the next ID's time is {} ms past this server's clock, and the claim was not renewed in time.",
                    timing.fence_reach_ms(),
                    wanted_unix_ms - now_unix_ms()
                );
            }
            return Err(errors::claim_unavailable(
                claim.status,
                &detail,
                &registry,
                config.datacenter_id,
            ));
        }
        waits::sleep_ms(10);
    }
}

/// Makes a lease ending at `new_end` (ms since the epoch) durable, computed at `now`: the
/// state file first (fsync), then the WAL record. Called under the DURABLE lock.
fn write_lease(
    durable_state: &mut shmem::SharedDurable,
    config: &Config,
    new_end: u64,
    now: i64,
) -> errors::Result<()> {
    let record = LeaseRecord {
        lease_end_unix_ms: config.epoch.to_unix_ms(new_end),
        layout: LayoutRecord::current(config.epoch),
        written_unix_ms: now,
        timeline: wal::insertion_timeline(),
        reach_cap_ms: configured_reach_cap_ms(),
    };
    // File before WAL: a base backup taken after a record's checkpoint then always copies a
    // file at least as new as every record it will not replay.
    durable::write(&data_dir(), &StateFile::own(&record))
        .map_err(|e| errors::state_file(&e, true))?;
    durable_state.lease_lsn = wal::log_lease(&record);
    durable_state.lease_end = new_end;
    durable_state.lease_writes += 1;
    Ok(())
}

/// The furthest past its clock this server may place a lease with the current settings.
fn configured_reach_cap_ms() -> i64 {
    durable::reach_cap_ms(
        gucs::lease_window_ms() as i64,
        gucs::clock_policy().max_drift_ms as i64,
    )
}

/// Once per backend, before its first ID: checks this database's `snowflake_origin` rows
/// against the configured epoch, and takes over the IDs of every other cluster they name
/// (the database came through pg_upgrade, or a dump restored here) that this server has
/// not taken over yet. That cluster's lease stayed in its data directory; the resume point
/// moves past the furthest it could have reached ([`durable::adoption_floor_ms`]), durably
/// (state file, WAL) before the origin is recorded as taken over.
fn adopt_origins(config: &Config) -> errors::Result<()> {
    let rows = origin::rows()?;
    origin::epoch_agrees(&rows, config.epoch)?;
    let own = origin::own_system_identifier();
    let mut foreign: Vec<u64> = rows
        .iter()
        .map(|r| r.system_identifier)
        .filter(|s| *s != own)
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    foreign.sort_unstable();
    foreign.dedup();
    let dir = data_dir();
    let (floor, lsn) = {
        let mut durable_state = shmem::DURABLE.exclusive();
        let mut origins =
            durable::read_origins(&dir).map_err(|e| errors::origins_file(&e, false))?;
        foreign.retain(|s| !origins.covers(*s));
        if foreign.is_empty() {
            return Ok(());
        }
        let now = now_unix_ms();
        let reach = configured_reach_cap_ms();
        let floor_unix_ms = durable::adoption_floor_ms(now, reach);
        let floor = lease_timestamp(config.epoch, floor_unix_ms);
        if durable_state.lease_end < floor {
            write_lease(&mut durable_state, config, floor, now)?;
        }
        for system_identifier in foreign {
            origins = origins.with(AdoptedOrigin {
                system_identifier,
                adopted_unix_ms: now,
                floor_unix_ms,
            });
            errors::adopted_origin(system_identifier, floor_unix_ms, reach).log();
        }
        durable::write_origins(&dir, &origins).map_err(|e| errors::origins_file(&e, true))?;
        (floor, durable_state.lease_lsn)
    };
    let mut shared = shmem::GENERATOR.exclusive();
    shared.generator.extend_lease(floor);
    shared.generator.raise_floor(floor);
    shared.lease_lsn = shared.lease_lsn.max(lsn);
    Ok(())
}

/// Records that `lsn` was confirmed at `level`, if that is the strongest level.
#[inline]
fn note_confirmed(shared: &mut shmem::SharedGenerator, lsn: u64, level: Option<usize>) {
    if level == Some(pg_sys::SYNC_REP_WAIT_FLUSH as usize) {
        shared.confirmed_lsn = shared.confirmed_lsn.max(lsn);
    }
}

/// The lease LSN this session must see confirmed before it may issue, if any: the newest
/// lease record is not yet known to be confirmed, and the session asks for synchronous
/// standbys that have not confirmed it at its level. Called under the generator's lock;
/// a few loads when synchronous replication is off.
#[inline]
fn unconfirmed_lease(shared: &mut shmem::SharedGenerator) -> Option<u64> {
    let lsn = shared.lease_lsn;
    if lsn <= shared.confirmed_lsn {
        return None;
    }
    let level = wal::sync_wait_level()?;
    if wal::confirmed(lsn, level) {
        note_confirmed(shared, lsn, Some(level));
        return None;
    }
    Some(lsn)
}

/// The epoch for decoding, found once per backend.
/// - Preloaded: the configured one (fixed since server start), checked against the layout
///   record and this database's `snowflake_origin`, so that a changed `snowflake.epoch`
///   never silently decodes old IDs wrong.
/// - Not preloaded: the settings are reloadable then, and an IMMUTABLE function must not
///   depend on them. The epoch is the one `snowflake_origin` records for this database's
///   IDs, or Twitter's (the default) where it records none.
fn decode_epoch() -> errors::Result<Epoch> {
    if let Some(epoch) = DECODE_EPOCH.get() {
        return Ok(epoch);
    }
    let epoch = match gucs::epoch() {
        Some(configured) => {
            let epoch = configured.map_err(|e| errors::setting(&e))?;
            recorded_state(epoch)?;
            origin::check_epoch(epoch)?;
            epoch
        }
        None => origin::recorded_epoch()?.unwrap_or(Epoch::TWITTER),
    };
    DECODE_EPOCH.set(Some(epoch));
    Ok(epoch)
}

/// What one attempt under the generator's lock asks the caller to do next.
enum Pending {
    /// Everything wanted was issued.
    Done,
    /// Part was issued: release the lock, service interrupts, and go on.
    More,
    /// Wait for the clock or extend the lease, then try again.
    Act(Next),
    /// Wait for the synchronous standbys to confirm the lease record ending at this LSN.
    Confirm(u64),
    /// Give up: the generator refused.
    Fail(GenerateError),
    /// Give up: the wall clock is outside the epoch's 41-bit range.
    OutsideEpoch,
}

/// What `take` did with the generator in one attempt.
enum Took {
    /// Everything wanted is issued.
    All,
    /// Some is issued; call again (after the lock was released).
    Some,
    /// Nothing more now: the generator asks for this first.
    Wait(Next),
}

/// Most lease renewals one call makes in a row without issuing anything. Each renewal
/// widens the next one (see `durable::lease_reach_ms`), so even storage slower than the
/// window needs two; more means renewals keep taking longer than a widened lease.
const MAX_RENEWALS_PER_CALL: u32 = 8;

/// One attempt under the generator's lock: read the clock once, let `take` issue what it
/// can, and decide (rate-limited, server-wide) whether clock events need a WARNING, which is
/// emitted after the lock is released.
#[inline]
fn attempt(
    config: &Config,
    policy: ClockPolicy,
    bulk: bool,
    take: &mut impl FnMut(&mut Generator, u64, Node) -> Result<Took, GenerateError>,
) -> (Pending, Option<errors::ClockWarning>) {
    let mut shared = shmem::GENERATOR.exclusive();
    if let Some(lsn) = unconfirmed_lease(&mut shared) {
        return (Pending::Confirm(lsn), None);
    }
    let now = now_unix_ms();
    let node = shared.node;
    let pending = match config.epoch.timestamp_of(now) {
        Ok(wall) => match take(&mut shared.generator, wall, node) {
            Ok(Took::All) => Pending::Done,
            Ok(Took::Some) => Pending::More,
            Ok(Took::Wait(next)) => Pending::Act(next),
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
        report = shared.warnings.allow(waits::monotonic_ms(), interval);
    }
    let warning = if report {
        let since = shared.warned;
        shared.warned = events;
        let ahead_ms = shared
            .generator
            .last_timestamp()
            .map(|t| config.epoch.to_unix_ms(t) - now)
            .unwrap_or(0);
        Some(errors::ClockWarning {
            since,
            now: events,
            ahead_ms,
            max_drift_ms: policy.max_drift_ms,
        })
    } else {
        None
    };
    (pending, warning)
}

/// Runs `take` under the generator's lock until it has issued everything it wants (it
/// returns `Took::All`). Between attempts, with no lock held, services interrupts, waits for
/// the clock or the standbys, or extends the durable lease, as asked; raises the errors.
/// `bulk`: the call asked for more than one millisecond's worth of IDs, so exhausted
/// milliseconds are expected and not warned about.
fn drive(
    function: &'static str,
    bulk: bool,
    mut take: impl FnMut(&mut Generator, u64, ClockPolicy, Node) -> Result<Took, GenerateError>,
) {
    let config = generation_config(function).unwrap_or_else(|e| e.raise(function));
    let policy = gucs::clock_policy();
    let mut take = |g: &mut Generator, wall: u64, node: Node| take(g, wall, policy, node);
    let mut renewals = 0;
    loop {
        let (pending, warning) = attempt(&config, policy, bulk, &mut take);
        if let Some(w) = warning {
            w.report(function);
        }
        let step = match pending {
            Pending::Done => return,
            Pending::More => {
                renewals = 0;
                Ok(())
            }
            Pending::Confirm(lsn) => {
                wal::wait_for_confirmation(lsn);
                Ok(())
            }
            Pending::Act(Next::NeedLease { timestamp, .. }) => {
                renewals += 1;
                if renewals > MAX_RENEWALS_PER_CALL {
                    let last = shmem::COUNTERS
                        .get()
                        .last_renewal_ms
                        .load(Ordering::Relaxed);
                    Err(errors::renewals_too_slow(
                        renewals - 1,
                        last,
                        gucs::lease_window_ms(),
                    ))
                } else {
                    renew_lease(&config, timestamp)
                }
            }
            Pending::Act(Next::WaitUntil { wall_ms }) => wait_for_clock(config.epoch, wall_ms),
            Pending::Act(Next::Issued(_)) => Ok(()),
            Pending::Fail(e) => Err(errors::generate(e, config.epoch)),
            Pending::OutsideEpoch => Err(match check_epoch_at(config.epoch, now_unix_ms()) {
                Err(problem) => errors::epoch_problem(problem),
                Ok(()) => errors::clock_stalled(0),
            }),
        };
        step.unwrap_or_else(|e| e.raise(function));
        pgrx::check_for_interrupts!();
    }
}

/// Runs `step` through `drive` until it issues one run, and returns that run with the
/// pair it was issued under.
fn drive_one(
    function: &'static str,
    mut step: impl FnMut(&mut Generator, u64, ClockPolicy) -> Result<Next, GenerateError>,
) -> (Node, Issued) {
    let mut issued = None;
    drive(function, false, |g, wall, policy, node| {
        match step(g, wall, policy)? {
            Next::Issued(run) => {
                issued = Some((node, run));
                Ok(Took::All)
            }
            other => Ok(Took::Wait(other)),
        }
    });
    match issued {
        Some(issued) => issued,
        None => SnowflakeError::internal("no ID was issued".into()).raise(function),
    }
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
fn wait_for_clock(epoch: Epoch, wall_ms: u64) -> errors::Result<()> {
    shmem::COUNTERS.get().waits.fetch_add(1, Ordering::Relaxed);
    let target = epoch.to_unix_ms(wall_ms);
    let started = Instant::now();
    // The wait is known in advance; allow slack for a loaded machine, then call the clock stalled.
    let limit = Duration::from_millis((target - now_unix_ms()).max(0) as u64 + 1_000);
    loop {
        let remaining = target - now_unix_ms();
        if remaining <= 0 {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(errors::clock_stalled(started.elapsed().as_millis() as u64));
        }
        if remaining > 1 {
            waits::sleep_ms((remaining - 1).min(100));
        } else {
            // Less than a millisecond to go: spin. Sleeping can lose the CPU for a scheduler
            // tick, leaving whole milliseconds of sequence space unused.
            std::hint::spin_loop();
            pgrx::check_for_interrupts!();
        }
    }
}

/// Generates the next ID: unique among all backends of this server, and greater than every
/// ID this server issued before it, including before a restart or crash.
///
/// VOLATILE: every call returns a new value.
/// PARALLEL SAFE: the generator lives in shared memory behind an LWLock, and parallel
/// workers attach to the same segment and lock as their leader, so IDs generated in a worker
/// are as unique as any other (nothing is cached per backend, unlike `nextval()`).
#[pg_extern(volatile, parallel_safe)]
fn snowflake_next() -> i64 {
    let (node, issued) = drive_one("snowflake_next", |g, wall, policy| g.next(wall, policy));
    id_of(node, &issued, 0)
}

/// Largest `n` for `snowflake_next_batch(n)`.
pub const MAX_BATCH: i32 = 1_000_000;

/// `n` strictly increasing IDs, each greater than any ID issued before the call, taken in
/// runs of up to 4,096 per millisecond, one run per hold of the generator's lock: other
/// sessions get IDs in between, and a cancel is serviced between runs. PARALLEL SAFE for
/// the same reason as `snowflake_next()`.
#[pg_extern(volatile, parallel_safe)]
fn snowflake_next_batch(n: i32, fcinfo: pg_sys::FunctionCallInfo) -> Int8Array {
    const NAME: &str = "snowflake_next_batch";
    if !(1..=MAX_BATCH).contains(&n) {
        errors::bad_count("batch size", n, MAX_BATCH).raise(NAME);
    }
    let mut ids = Int8Array::for_call(fcinfo, NAME, n as usize);
    // IDs are written straight into the result array: a few microseconds per run of 4,096
    // under the lock, and nothing left to build after the last millisecond.
    drive(NAME, n > 4096, |g, wall, policy, node| {
        let want = ids.remaining().min(4096) as u16;
        match g.next_run(wall, policy, want, false)? {
            Next::Issued(run) => {
                for k in 0..run.count {
                    ids.push(id_of(node, &run, k));
                }
                Ok(if ids.remaining() > 0 {
                    Took::Some
                } else {
                    Took::All
                })
            }
            other => Ok(Took::Wait(other)),
        }
    });
    ids
}

/// The first of `n` contiguous IDs (first, first+1, ..., first+n-1), all in one millisecond
/// and reserved: no later call returns any of them. For ORM pooled optimizers and
/// application-side ID pools. PARALLEL SAFE for the same reason as `snowflake_next()`.
#[pg_extern(volatile, parallel_safe)]
fn snowflake_next_block(n: i32) -> i64 {
    const NAME: &str = "snowflake_next_block";
    let max = i32::from(layout::MAX_SEQUENCE) + 1;
    if !(1..=max).contains(&n) {
        errors::bad_count("block size", n, max).raise(NAME);
    }
    let (node, block) = drive_one(NAME, |g, wall, policy| {
        g.next_run(wall, policy, n as u16, true)
    });
    id_of(node, &block, 0)
}

fn unix_ms_to_timestamptz(unix_ms: i64) -> TimestampWithTimeZone {
    let micros = (unix_ms - PG_EPOCH_UNIX_MS) * 1_000;
    // Every epoch is at most year 9999 and 41 bits add ~70 years: always in range.
    TimestampWithTimeZone::try_from(micros).unwrap_or_else(|_| {
        errors::layout(layout::LayoutError::AfterRange {
            unix_ms,
            last_ms: unix_ms,
        })
        .raise("snowflake_decode")
    })
}

fn decoded(id: i64, function: &'static str) -> (Parts, i64) {
    let epoch = decode_epoch().unwrap_or_else(|e| e.raise(function));
    let parts = layout::unpack(id).unwrap_or_else(|e| errors::layout(e).raise(function));
    (parts, epoch.to_unix_ms(parts.timestamp))
}

/// Splits an ID into its time, datacenter, worker and sequence.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_decode(
    id: i64,
    fcinfo: pg_sys::FunctionCallInfo,
) -> composite_type!('static, "snowflake_parts") {
    const NAME: &str = "snowflake_decode";
    let (parts, unix_ms) = decoded(id, NAME);
    parts_row(
        fcinfo,
        NAME,
        &ForeignParts {
            unix_ms,
            datacenter_id: Some(i32::from(parts.datacenter_id)),
            worker_id: Some(i32::from(parts.worker_id)),
            sequence: i32::from(parts.sequence),
        },
    )
}

/// A `snowflake_parts` row.
fn parts_row(
    fcinfo: pg_sys::FunctionCallInfo,
    function: &'static str,
    parts: &ForeignParts,
) -> PgHeapTuple<'static, AllocatedByRust> {
    result_row(
        fcinfo,
        function,
        [
            cell("ts", unix_ms_to_timestamptz(parts.unix_ms)),
            cell("unix_ms", parts.unix_ms),
            cell("datacenter_id", parts.datacenter_id),
            cell("worker_id", parts.worker_id),
            cell("sequence", parts.sequence),
        ],
    )
}

/// Decodes an ID made by another generator: `twitter`, `discord`, `instagram`, `sonyflake`
/// or `pgedge` (see the README for how their fields map onto `snowflake_parts`). Does not
/// depend on any setting.
#[pg_extern(immutable, strict, parallel_safe, name = "snowflake_decode")]
fn snowflake_decode_layout(
    id: i64,
    layout: &str,
    fcinfo: pg_sys::FunctionCallInfo,
) -> composite_type!('static, "snowflake_parts") {
    const NAME: &str = "snowflake_decode";
    let Some(known) = ForeignLayout::from_name(layout) else {
        errors::unknown_layout(layout, &LAYOUT_NAMES).raise(NAME)
    };
    let parts = known
        .decode(id)
        .unwrap_or_else(|e| errors::layout(e).raise(NAME));
    parts_row(fcinfo, NAME, &parts)
}

/// The decoded parts as JSON, with the ID as a string (JavaScript numbers lose precision
/// above 2^53) and the time in RFC 3339 UTC.
#[derive(serde::Serialize)]
struct Formatted {
    id: String,
    ts: String,
    unix_ms: i64,
    datacenter_id: u8,
    worker_id: u8,
    sequence: u16,
}

/// The decoded ID as `jsonb`: `{"id": "…", "ts": "…Z", "unix_ms": …, "datacenter_id": …,
/// "worker_id": …, "sequence": …}`.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_format(id: i64) -> pgrx::JsonB {
    let (parts, unix_ms) = decoded(id, "snowflake_format");
    let formatted = Formatted {
        id: id.to_string(),
        ts: format_rfc3339(unix_ms),
        unix_ms,
        datacenter_id: parts.datacenter_id,
        worker_id: parts.worker_id,
        sequence: parts.sequence,
    };
    pgrx::JsonB(serde_json::to_value(formatted).unwrap_or_default())
}

/// The time an ID was generated (millisecond precision).
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_to_timestamp(id: i64) -> TimestampWithTimeZone {
    let (_, unix_ms) = decoded(id, "snowflake_to_timestamp");
    unix_ms_to_timestamptz(unix_ms)
}

/// The smallest ID of the millisecond containing `ts` (datacenter, worker and sequence 0),
/// for range queries: `id >= snowflake_from_timestamp(a) AND id < snowflake_from_timestamp(b)`.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_from_timestamp(ts: TimestampWithTimeZone) -> i64 {
    const NAME: &str = "snowflake_from_timestamp";
    if !ts.is_finite() {
        errors::infinite_timestamp().raise(NAME);
    }
    let epoch = decode_epoch().unwrap_or_else(|e| e.raise(NAME));
    let micros: i64 = ts.into_inner();
    let unix_ms = micros.div_euclid(1_000) + PG_EPOCH_UNIX_MS;
    epoch
        .first_id_at(unix_ms)
        .unwrap_or_else(|e| errors::layout(e).raise(NAME))
}

/// The generator's configuration, position and counters, for monitoring. Works on a hot
/// standby (the lease shown is what WAL replay has written).
///
/// VOLATILE: the counters change. PARALLEL SAFE: it only reads shared memory.
#[pg_extern(volatile, parallel_safe)]
fn snowflake_stats(
    fcinfo: pg_sys::FunctionCallInfo,
) -> composite_type!('static, "snowflake_stats_row") {
    const NAME: &str = "snowflake_stats";
    if !shmem::is_available() {
        errors::not_preloaded(NAME).raise(NAME);
    }
    let config = gucs::config().and_then(Result::ok);
    let epoch = config
        .map(|c| c.epoch)
        .or_else(|| gucs::epoch().and_then(Result::ok));
    let (generator, node) = {
        let shared = shmem::GENERATOR.share();
        (shared.generator, shared.node)
    };
    let claim = *shmem::CLAIM.share();
    let auto = config.is_some_and(|c| c.worker_id == WorkerId::Auto);
    let worker_id = match config.map(|c| c.worker_id) {
        Some(WorkerId::Fixed(w)) => Some(i32::from(w)),
        Some(WorkerId::Auto) if claim.status == ClaimStatus::Held => {
            Some(i32::from(node.worker_id))
        }
        _ => None,
    };
    let durable_state = *shmem::DURABLE.share();
    let waits = shmem::COUNTERS.get().waits.load(Ordering::Relaxed);
    let now = now_unix_ms();

    let last_issued_ms = epoch
        .zip(generator.last_timestamp())
        .map(|(e, t)| e.to_unix_ms(t));
    let lease_end_ms = if durable_state.loaded {
        epoch
            .filter(|_| durable_state.lease_end > 0)
            .map(|e| e.to_unix_ms(durable_state.lease_end))
    } else {
        // Not generating yet (or a standby): show what the state file says.
        durable::read(&data_dir())
            .ok()
            .flatten()
            .map(|s| s.lease_end_unix_ms)
            .filter(|ms| *ms > 0)
    };
    let events = generator.events();
    let as_i64 = |v: u64| v.min(i64::MAX as u64) as i64;
    let cells = [
        cell("worker_id", worker_id),
        cell("datacenter_id", config.map(|c| i32::from(c.datacenter_id))),
        cell("epoch", epoch.map(|e| unix_ms_to_timestamptz(e.unix_ms()))),
        cell("last_issued", last_issued_ms.map(unix_ms_to_timestamptz)),
        cell(
            "drift_ms",
            last_issued_ms.map(|ms| (ms - now).max(0)).unwrap_or(0),
        ),
        cell("lease_end", lease_end_ms.map(unix_ms_to_timestamptz)),
        cell("ids_issued", as_i64(events.issued)),
        cell("sequence_exhaustions", as_i64(events.exhaustions)),
        cell("clock_steps_back", as_i64(events.steps_back)),
        cell("largest_step_back_ms", as_i64(events.largest_step_back_ms)),
        cell("lease_writes", as_i64(durable_state.lease_writes)),
        cell("waits", as_i64(waits)),
        cell(
            "worker_id_source",
            config.map(|_| if auto { "registry" } else { "configuration" }),
        ),
        cell(
            "registry",
            gucs::registry().filter(|_| auto).map(|r| redacted(&r)),
        ),
        cell("claim_status", auto.then(|| claim.status.name())),
        cell(
            "claim_expires_at",
            (auto && claim.status == ClaimStatus::Held && claim.expires_unix_ms > 0)
                .then(|| unix_ms_to_timestamptz(claim.expires_unix_ms)),
        ),
    ];
    result_row(fcinfo, NAME, cells)
}
