//! The SQL-facing functions. They convert types, call the pure modules and raise errors.

use std::cell::Cell;
use std::ffi::CStr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgrx::prelude::*;
use pgrx::{composite_type, PgTupleDesc};

use crate::durable::{self, LayoutCheck, LayoutRecord, StateFile};
use crate::errors::{self, SnowflakeError};
use crate::generator::{ClockPolicy, Next};
use crate::gucs;
use crate::layout::{self, Epoch, Parts};
use crate::settings::{check_epoch_at, Config};
use crate::shmem;

/// Unix milliseconds of PostgreSQL's timestamp origin, 2000-01-01T00:00:00Z.
const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;

extension_sql_file!(
    "../sql/snowflake_parts.sql",
    name = "snowflake_parts",
    bootstrap
);

thread_local! {
    /// This backend has seen the layout record match the configuration.
    static LAYOUT_VERIFIED: Cell<bool> = const { Cell::new(false) };
    /// Epoch that passed the decode-side check against the layout record.
    static DECODE_EPOCH: Cell<Option<Epoch>> = const { Cell::new(None) };
}

/// The wall clock in Unix milliseconds (`CLOCK_REALTIME`, which libfaketime can move).
#[inline]
fn now_unix_ms() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

fn data_dir() -> PathBuf {
    // SAFETY: DataDir is set before any backend runs SQL and never changes afterwards.
    let dir = unsafe { CStr::from_ptr(pg_sys::DataDir) };
    PathBuf::from(dir.to_string_lossy().into_owned())
}

/// Everything `snowflake_next()` needs before it may touch the generator.
fn generation_config(function: &'static str) -> errors::Result<Config> {
    if !shmem::is_available() {
        return Err(errors::not_preloaded(function));
    }
    let config = gucs::config().map_err(|e| errors::setting(&e))?;
    // SAFETY: plain function call; cheap once recovery has ended (cached in the backend).
    if unsafe { pg_sys::RecoveryInProgress() } {
        return Err(errors::in_recovery(function));
    }
    ensure_layout_recorded(&config)?;
    Ok(config)
}

/// Checks the layout record against the configuration, writing it on first use.
/// Runs the file I/O under the DURABLE lock, never under the generator's.
fn ensure_layout_recorded(config: &Config) -> errors::Result<()> {
    if LAYOUT_VERIFIED.get() {
        return Ok(());
    }
    // Never record an epoch that cannot generate now (in the future, or exhausted).
    check_epoch_at(config.epoch, now_unix_ms()).map_err(errors::epoch_problem)?;
    let configured = LayoutRecord::current(config.epoch);
    let result = {
        let mut shared = shmem::DURABLE.exclusive();
        if shared.layout_verified {
            Ok(())
        } else {
            let result = verify_or_record(&configured);
            shared.layout_verified = result.is_ok();
            result
        }
    };
    result?;
    LAYOUT_VERIFIED.set(true);
    Ok(())
}

fn verify_or_record(configured: &LayoutRecord) -> errors::Result<()> {
    let dir = data_dir();
    let state = durable::read(&dir).map_err(|e| errors::state_file(&e, false))?;
    match durable::check_layout(state.as_ref(), configured) {
        LayoutCheck::Matches => Ok(()),
        LayoutCheck::Differs { recorded } => Err(errors::layout_mismatch(&recorded, configured)),
        LayoutCheck::NotRecorded => {
            let state = StateFile {
                format: durable::FORMAT_VERSION,
                layout: *configured,
            };
            durable::write(&dir, &state).map_err(|e| errors::state_file(&e, true))
        }
    }
}

/// The epoch for decoding: the configured one, checked once per backend against the layout
/// record so that a changed `snowflake.epoch` never silently decodes old IDs wrong.
fn decode_epoch() -> errors::Result<Epoch> {
    let epoch = gucs::epoch().map_err(|e| errors::setting(&e))?;
    if DECODE_EPOCH.get() == Some(epoch) {
        return Ok(epoch);
    }
    let configured = LayoutRecord::current(epoch);
    let state = durable::read(&data_dir()).map_err(|e| errors::state_file(&e, false))?;
    if let LayoutCheck::Differs { recorded } = durable::check_layout(state.as_ref(), &configured) {
        return Err(errors::layout_mismatch(&recorded, &configured));
    }
    DECODE_EPOCH.set(Some(epoch));
    Ok(epoch)
}

/// Runs one attempt of the state machine under the generator's lock: read the clock, step.
#[inline]
fn step(config: &Config, policy: ClockPolicy) -> errors::Result<Next> {
    let outcome = {
        let mut shared = shmem::GENERATOR.exclusive();
        let now = now_unix_ms();
        match config.epoch.timestamp_of(now) {
            Ok(wall) => shared.generator.next(wall, policy).map_err(Some),
            Err(_) => Err(None),
        }
    };
    outcome.map_err(|err| match err {
        Some(e) => errors::generate(e, config.epoch),
        // Out of the epoch's range: report it with the clock reading.
        None => match check_epoch_at(config.epoch, now_unix_ms()) {
            Err(problem) => errors::epoch_problem(problem),
            Ok(()) => errors::clock_stalled(0),
        },
    })
}

/// Waits, without any lock held, until the wall clock reaches `wall_ms` (ms since the epoch).
fn wait_for_clock(epoch: Epoch, wall_ms: u64, policy: ClockPolicy) -> errors::Result<()> {
    let target = epoch.to_unix_ms(wall_ms);
    let started = Instant::now();
    // The generator asks for at most max_wait_ms; allow generous slack for a loaded machine.
    let limit = Duration::from_millis(policy.max_wait_ms.max(1) + 1_000);
    loop {
        let remaining = target - now_unix_ms();
        if remaining <= 0 {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(errors::clock_stalled(started.elapsed().as_millis() as u64));
        }
        if remaining > 1 {
            // SAFETY: plain sleep; interrupts are checked right after.
            unsafe { pg_sys::pg_usleep((remaining - 1) * 1_000) };
        } else {
            std::thread::yield_now();
        }
        pgrx::check_for_interrupts!();
    }
}

/// Generates the next ID: unique among all backends of this server, and greater than every
/// ID this server issued before it.
///
/// VOLATILE: every call returns a new value.
/// PARALLEL SAFE: the generator lives in shared memory behind an LWLock, and parallel
/// workers attach to the same segment and lock as their leader, so IDs generated in a worker
/// are as unique as any other (nothing is cached per backend, unlike `nextval()`).
#[pg_extern(volatile, parallel_safe)]
fn snowflake_next() -> i64 {
    const NAME: &str = "snowflake_next";
    let config = generation_config(NAME).unwrap_or_else(|e| e.raise(NAME));
    let policy = ClockPolicy::DEFAULT;
    loop {
        match step(&config, policy) {
            Ok(Next::Issued(issued)) => {
                return layout::pack_unchecked(Parts {
                    timestamp: issued.timestamp,
                    datacenter_id: config.datacenter_id,
                    worker_id: config.worker_id,
                    sequence: issued.sequence,
                });
            }
            Ok(Next::WaitUntil { wall_ms }) => {
                wait_for_clock(config.epoch, wall_ms, policy).unwrap_or_else(|e| e.raise(NAME))
            }
            Err(e) => e.raise(NAME),
        }
    }
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
    let tupdesc = result_tupdesc(fcinfo, NAME);
    let datums = [
        unix_ms_to_timestamptz(unix_ms).into_datum(),
        unix_ms.into_datum(),
        i32::from(parts.datacenter_id).into_datum(),
        i32::from(parts.worker_id).into_datum(),
        i32::from(parts.sequence).into_datum(),
    ];
    // SAFETY: the datums match snowflake_parts' column types, in order.
    unsafe { PgHeapTuple::from_datums(tupdesc, datums) }
        .unwrap_or_else(|e| SnowflakeError::internal(format!("{e}")).raise(NAME))
}

/// The tuple descriptor of the function's declared result type, looked up from the call
/// itself rather than by name, so that `search_path` cannot substitute another type.
fn result_tupdesc(
    fcinfo: pg_sys::FunctionCallInfo,
    function: &'static str,
) -> PgTupleDesc<'static> {
    let mut type_oid = pg_sys::InvalidOid;
    // SAFETY: fcinfo is the live call's; a NULL tupdesc output is allowed.
    let class =
        unsafe { pg_sys::get_call_result_type(fcinfo, &mut type_oid, std::ptr::null_mut()) };
    if class != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE {
        SnowflakeError::internal("snowflake_decode must return a composite type".into())
            .raise(function);
    }
    PgTupleDesc::for_composite_type_by_oid(type_oid).unwrap_or_else(|| {
        SnowflakeError::internal(format!("type {type_oid:?} is not a composite type"))
            .raise(function)
    })
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
