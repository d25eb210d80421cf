//! The durable lease, on the generation side: the one-time checks before a backend's first
//! ID (settings, recovery, recorded layout, where IDs resume, origins to take over), and
//! the renewals that make each lease durable (state file, then WAL, then the synchronous
//! standbys a session asks for) before the generator may use it. The WAL side is `wal`;
//! the rules (how far a lease reaches, where IDs resume) are `snowflake_core::durable`.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use pgrx::prelude::*;

use crate::generation::origin;
use crate::generation::shmem::{self, Node};
use crate::generation::timeline;
use crate::generation::wal;
use crate::server;
use crate::server::errors;
use crate::server::gucs;
use snowflake_core::claim::{ClaimStatus, Fence};
use snowflake_core::durable::{
    self, AdoptedOrigin, Ancestry, LayoutCheck, LayoutRecord, LeaseRecord, ResumeKind, StateFile,
};
use snowflake_core::generator::{Generator, Resumed};
use snowflake_core::layout::{Epoch, EpochMs, UnixMs};
use snowflake_core::settings::{check_epoch_at, Config, WorkerId};

thread_local! {
    /// The configuration once generation succeeded in this backend: preloaded, settings
    /// valid, not in recovery, durable state loaded. None of that can change while the
    /// backend lives (the settings are PGC_POSTMASTER, a primary never re-enters recovery,
    /// and a crash restart ends every backend), so later calls skip the checks.
    static READY: Cell<Option<Config>> = const { Cell::new(None) };
}

/// Everything `snowflake_next()` needs before it may touch the generator.
#[inline]
pub(crate) fn generation_config(function: &'static str) -> errors::Result<Config> {
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
/// written after a promotion (with a worker id from the configuration). A promoted node
/// issues from its resume point at once, ahead of its clock if need be
/// (`Resumed::Promoted`). File I/O runs
/// under the DURABLE lock, never under the generator's. Called once per backend, before
/// READY is set.
fn ensure_loaded(config: &Config) -> errors::Result<()> {
    // Never record an epoch that cannot generate now (in the future, or exhausted).
    check_epoch_at(config.epoch, server::now_unix_ms()).map_err(errors::epoch_problem)?;
    let mut durable_state = shmem::DURABLE.exclusive();
    if !durable_state.loaded {
        let state = recorded_state(config.epoch)?;
        // What the WAL receiver last saw of the old primary's clock, if it still runs (with
        // no state file yet too: a promotion before the first lease record).
        let live_peer = wal::live_peer_clock(
            state
                .as_ref()
                .map_or(configured_reach_cap_ms(), |s| s.reach_cap_ms),
        );
        let timeline = wal::insertion_timeline();
        let lease_timeline = state.as_ref().map(|s| s.timeline);
        // Read only after a promotion: the timelines since the newest lease's.
        let ancestry = if lease_timeline.map_or(timeline > 1, |t| t != 0 && t != timeline) {
            timeline::ancestry(lease_timeline, timeline)
        } else {
            Ancestry::default()
        };
        let now = server::now_unix_ms();
        let plan = durable::plan_resume(
            state.as_ref(),
            timeline,
            ancestry,
            now,
            live_peer,
            configured_reach_cap_ms(),
        );
        let lease_end = state
            .map(|s| config.epoch.timestamp_or_zero(UnixMs(s.lease_end_unix_ms)))
            .unwrap_or_default();
        let floor = config.epoch.timestamp_or_zero(UnixMs(plan.floor_unix_ms));
        let (floor, resumed) = match (config.worker_id, plan.kind) {
            // With a worker id from the registry, a promoted node's identity is a new claim,
            // whose floor covers every earlier holder of that id, the old primary included:
            // the leases it may have written unseen need no floor here. The replayed lease
            // end is waited for, as after a restart.
            (WorkerId::Auto, ResumeKind::Failover { .. }) => (lease_end, Resumed::Restart),
            (
                WorkerId::Fixed(_),
                ResumeKind::Failover {
                    lead_ms,
                    margin_ms,
                    skipped,
                },
            ) => {
                errors::promoted_resume(&plan, now, lead_ms, margin_ms, skipped).write();
                (floor, plan.resumed(config.epoch, now))
            }
            _ => (floor, plan.resumed(config.epoch, now)),
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
                shared.generator = Generator::resume(floor, EpochMs(0), resumed);
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
pub(crate) fn recorded_state(epoch: Epoch) -> errors::Result<Option<StateFile>> {
    let configured = LayoutRecord::current(epoch);
    let state = durable::read(&server::data_dir()).map_err(|e| errors::state_file(&e, false))?;
    match durable::check_layout(state.as_ref(), &configured) {
        LayoutCheck::Differs { recorded } => Err(errors::layout_mismatch(&recorded, &configured)),
        LayoutCheck::Matches | LayoutCheck::NotRecorded => Ok(state),
    }
}

/// The durable lease end in Unix ms: from shared memory once this server has loaded its
/// state (its first ID), else what the state file says (not generating yet, or a standby).
/// None if there is no lease, or no epoch to convert the shared-memory one with.
pub(crate) fn durable_end_unix_ms(epoch: Option<Epoch>) -> Option<i64> {
    let durable_state = *shmem::DURABLE.share();
    if durable_state.loaded {
        epoch
            .filter(|_| durable_state.lease_end > EpochMs(0))
            .map(|e| e.to_unix(durable_state.lease_end).0)
    } else {
        durable::read(&server::data_dir())
            .ok()
            .flatten()
            .map(|s| s.lease_end_unix_ms)
            .filter(|ms| *ms > 0)
    }
}

/// Extends the durable lease so that it covers `timestamp`: state file first (fsync), then
/// a WAL record, and only then the generator's lease. The lease reaches
/// `lease_reach_ms` past the later of `timestamp` and the clock, read under the DURABLE lock
/// (so that waiting for that lock does not make the lease stale). A session that asks for
/// synchronous standbys waits for them to confirm the record before the lease is used,
/// whoever wrote it.
pub(crate) fn renew(config: &Config, timestamp: EpochMs) -> errors::Result<()> {
    let window = gucs::lease_window_ms() as i64;
    let (lease_end, lsn, wrote_at) = {
        let mut durable_state = shmem::DURABLE.exclusive();
        let mut wrote_at = None;
        if durable_state.lease_end <= timestamp {
            wrote_at = Some(server::monotonic_ms());
            let now = server::now_unix_ms();
            let wall = config.epoch.timestamp_of(UnixMs(now)).unwrap_or_default();
            let last_renewal = shmem::COUNTERS
                .get()
                .last_renewal_ms
                .load(Ordering::Relaxed);
            let reach = durable::lease_reach_ms(window, last_renewal as i64) as u64;
            let new_end = timestamp.max(wall).plus(reach).max(durable_state.lease_end);
            write_lease(&mut durable_state, config, new_end, now)?;
        }
        (durable_state.lease_end, durable_state.lease_lsn, wrote_at)
    };
    let level = wal::wait_for_confirmation(lsn);
    if let Some(started) = wrote_at {
        // From the clock reading the lease was computed from to the moment it can be used.
        let took = server::monotonic_ms().saturating_sub(started);
        let counters = shmem::COUNTERS.get();
        counters.last_renewal_ms.store(took, Ordering::Relaxed);
    }
    let mut shared = shmem::GENERATOR.exclusive();
    let fence = shared.fence;
    let granted_end = if fence == Fence::UNLIMITED {
        lease_end
    } else {
        if !fence.allows(config.epoch.to_unix(timestamp).0, server::mono_now()) {
            drop(shared);
            return wait_for_claim(config, timestamp);
        }
        lease_end.min(config.epoch.timestamp_or_zero(UnixMs(fence.cap_unix_ms)))
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
fn wait_for_claim(config: &Config, timestamp: EpochMs) -> errors::Result<()> {
    let timing = gucs::claim_timing();
    let UnixMs(wanted_unix_ms) = config.epoch.to_unix(timestamp);
    let started = server::mono_now();
    let wait = shmem::CLAIM_SIGNAL.get().prepare();
    loop {
        let fence = shmem::GENERATOR.share().fence;
        let now_mono = server::mono_now();
        if fence.allows(wanted_unix_ms, now_mono) {
            return Ok(());
        }
        let claim = *shmem::CLAIM.share();
        let waiting = matches!(claim.status, ClaimStatus::Starting | ClaimStatus::Held);
        if !waiting || now_mono.since(started) > timing.ttl_ms() {
            let registry = gucs::registry_for_caller().unwrap_or_default();
            // What the registry worker last reported can quote the registry's own text and
            // other servers' claims: only for roles that may read snowflake.registry.
            let mut detail = if gucs::caller_may_read_registry() {
                claim.detail()
            } else {
                format!("The registry worker's last report is in the server log; only superusers and members of pg_read_all_settings see it here (the claim's state: {}).", claim.status.name())
            };
            if claim.status == ClaimStatus::Held {
                detail = format!(
                    "The claim allows IDs up to {} ms past its last renewal; the next ID's time is {} ms past this server's clock, and the claim was not renewed in time.",
                    timing.fence_reach_ms(),
                    wanted_unix_ms - server::now_unix_ms()
                );
            }
            return Err(errors::claim_unavailable(
                claim.status,
                &detail,
                &registry,
                config.datacenter_id,
            ));
        }
        // Woken by the registry worker when the claim changes; the timeout is the TTL's
        // bound above, looked at again at least every second.
        wait.sleep(timing.ttl_ms().saturating_sub(now_mono.since(started)) + 1);
    }
}

/// Makes a lease ending at `new_end` (ms since the epoch) durable, computed at `now`: the
/// state file first (fsync), then the WAL record. Called under the DURABLE lock.
fn write_lease(
    durable_state: &mut shmem::SharedDurable,
    config: &Config,
    new_end: EpochMs,
    now: i64,
) -> errors::Result<()> {
    let record = LeaseRecord {
        lease_end_unix_ms: config.epoch.to_unix(new_end).0,
        layout: LayoutRecord::current(config.epoch),
        written_unix_ms: now,
        timeline: wal::insertion_timeline(),
        reach_cap_ms: recorded_reach_cap_ms(),
    };
    // File before WAL: a base backup taken after a record's checkpoint then always copies a
    // file at least as new as every record it will not replay.
    durable::write(&server::data_dir(), &StateFile::own(&record))
        .map_err(|e| errors::state_file(&e, true))?;
    durable_state.lease_lsn = wal::log_lease(&record);
    durable_state.last_record = Some(record);
    durable_state.lease_end = new_end;
    durable_state.lease_writes += 1;
    Ok(())
}

/// The furthest past its clock this server may place a lease now, as its lease records say:
/// the configured reach, plus, after a promotion and until the clock caught up with the
/// resume point, how far ahead of the clock IDs may run. The next node promoted counts on
/// it. Called under the DURABLE lock (which comes before the generator's).
fn recorded_reach_cap_ms() -> i64 {
    let allowance = shmem::GENERATOR.share().generator.lead_allowance_ms();
    configured_reach_cap_ms().saturating_add(allowance as i64)
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
    let foreign: Vec<u64> = rows
        .iter()
        .map(|r| r.system_identifier)
        .filter(|s| *s != own)
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    let dir = server::data_dir();
    let (floor, lsn) = {
        let mut durable_state = shmem::DURABLE.exclusive();
        let origins = durable::read_origins(&dir).map_err(|e| errors::origins_file(&e, false))?;
        let new = origins.not_covered(foreign);
        let Some(&first) = new.first() else {
            return Ok(());
        };
        let now = server::now_unix_ms();
        let reach = configured_reach_cap_ms();
        let floor_unix_ms = durable::adoption_floor_ms(now, reach);
        let floor = config.epoch.timestamp_or_zero(UnixMs(floor_unix_ms));
        if durable_state.lease_end < floor {
            write_lease(&mut durable_state, config, floor, now)?;
        }
        // One resume point covers every cluster taken over now: one LOG line, one write.
        errors::adopted_origins(first, new.len(), floor_unix_ms, reach).write();
        let origins = origins.with_all(new.into_iter().map(|system_identifier| AdoptedOrigin {
            system_identifier,
            adopted_unix_ms: now,
            floor_unix_ms,
        }));
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
pub(crate) fn unconfirmed(shared: &mut shmem::SharedGenerator) -> Option<u64> {
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
