//! `snowflake_stats()`: what the generator, the durable lease and the registry claim look
//! like now, for monitoring.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;
use pgrx::AllocatedByRust;

use crate::generation::lease;
use crate::generation::shmem;
use crate::server;
use crate::server::errors;
use crate::server::gucs;
use crate::server::rows::{cell, result_row, timestamptz};
use snowflake_core::claim::ClaimStatus;
use snowflake_core::settings::WorkerId;

/// The `snowflake_stats_row` of `snowflake_stats()`: configuration, position and counters,
/// read from shared memory (and, before the first ID or on a standby, the state file).
pub(crate) fn row(
    fcinfo: pg_sys::FunctionCallInfo,
    function: &'static str,
) -> errors::Result<PgHeapTuple<'static, AllocatedByRust>> {
    if !shmem::is_available() {
        return Err(errors::not_preloaded(function));
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
    let now = server::now_unix_ms();

    let last_issued_ms = epoch
        .zip(generator.last_timestamp())
        .map(|(e, t)| e.to_unix(t).0);
    let lease_end_ms = lease::durable_end_unix_ms(epoch);
    let events = generator.events();
    let as_i64 = |v: u64| v.min(i64::MAX as u64) as i64;
    let cells = [
        cell("worker_id", worker_id),
        cell("datacenter_id", config.map(|c| i32::from(c.datacenter_id))),
        cell(
            "epoch",
            epoch.map(|e| timestamptz(e.unix_ms())).transpose()?,
        ),
        cell("last_issued", last_issued_ms.map(timestamptz).transpose()?),
        cell(
            "drift_ms",
            last_issued_ms.map(|ms| (ms - now).max(0)).unwrap_or(0),
        ),
        cell("lease_end", lease_end_ms.map(timestamptz).transpose()?),
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
        cell("registry", gucs::registry_for_caller().filter(|_| auto)),
        cell("claim_status", auto.then(|| claim.status.name())),
        cell(
            "claim_expires_at",
            (auto && claim.status == ClaimStatus::Held && claim.expires_unix_ms > 0)
                .then(|| timestamptz(claim.expires_unix_ms))
                .transpose()?,
        ),
    ];
    result_row(fcinfo, function, cells)
}
