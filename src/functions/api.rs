//! The SQL-facing functions: argument checks, then one call into the module that does the
//! work (`driver` issues, `decode` decodes, `stats` reports). This is where errors leave:
//! the modules below return them, and each function here raises them as itself
//! ([`OrRaise::or_raise`]). Each is annotated for what it
//! is: the generating ones VOLATILE, the decoding ones IMMUTABLE STRICT (they depend only on
//! the ID and the epoch, fixed since server start), all PARALLEL SAFE. Text arguments and
//! results are [`DbText`]: converted from and to the database encoding.

use pgrx::composite_type;
use pgrx::prelude::*;

use crate::functions::decode;
use crate::functions::stats;
use crate::generation::driver;
use crate::generation::lease;
use crate::generation::watermark;
use crate::server::dbtext::DbText;
use crate::server::errors::{self, OrRaise};
use crate::server::rows::{cell, parts_row, result_row, timestamptz, unix_ms_of, Int8Array};
use snowflake_core::foreign::{ForeignLayout, ForeignParts, LAYOUT_NAMES};
use snowflake_core::layout;
use snowflake_core::settings::format_rfc3339;
use snowflake_core::text;

extension_sql_file!("../../sql/types.sql", name = "types", bootstrap);
extension_sql_file!("../../sql/finalize.sql", name = "finalize", finalize);

/// Generates the next ID: unique among all backends of this server, and greater than every
/// ID this server issued before it, including before a restart or crash.
///
/// VOLATILE: every call returns a new value.
/// PARALLEL SAFE: the generator lives in shared memory behind an LWLock, and parallel
/// workers attach to the same segment and lock as their leader, so IDs generated in a worker
/// are as unique as any other (nothing is cached per backend, unlike `nextval()`).
#[pg_extern(volatile, parallel_safe)]
fn snowflake_next() -> i64 {
    const NAME: &str = "snowflake_next";
    let config = lease::generation_config(NAME).or_raise(NAME);
    driver::next_id(&config, NAME).or_raise(NAME)
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
    let mut ids = Int8Array::for_call(fcinfo, NAME, n as usize).or_raise(NAME);
    let config = lease::generation_config(NAME).or_raise(NAME);
    driver::fill_batch(&config, NAME, &mut ids).or_raise(NAME);
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
    let config = lease::generation_config(NAME).or_raise(NAME);
    driver::next_block(&config, NAME, n as u16).or_raise(NAME)
}

/// The commit-order watermark: no transaction still in flight on this server (including
/// prepared ones) holds an ID below it. A reader that polls
/// `id >= cursor AND id < snowflake_safe_upto()` and then moves its cursor to that value
/// sees every row once, whatever order the writers commit in.
///
/// VOLATILE: it moves as transactions end. PARALLEL RESTRICTED: it may rewrite the
/// prepared-transaction file (dropping ended transactions), which a worker should not do.
#[pg_extern(volatile, parallel_restricted)]
fn snowflake_safe_upto() -> i64 {
    const NAME: &str = "snowflake_safe_upto";
    lease::generation_config(NAME).or_raise(NAME);
    watermark::safe_upto().or_raise(NAME)
}

/// Splits an ID into its time, datacenter, worker and sequence.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_decode(
    id: i64,
    fcinfo: pg_sys::FunctionCallInfo,
) -> composite_type!('static, "snowflake_parts") {
    const NAME: &str = "snowflake_decode";
    let (parts, unix_ms) = decode::decoded(id).or_raise(NAME);
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
    .or_raise(NAME)
}

/// Decodes an ID made by another generator: `twitter`, `discord`, `instagram`, `sonyflake`,
/// `pgedge` or `mastodon` (see docs/functions.md for how their fields map onto `snowflake_parts`). Does not
/// depend on any setting.
#[pg_extern(immutable, strict, parallel_safe, name = "snowflake_decode")]
fn snowflake_decode_layout(
    id: i64,
    layout: DbText,
    fcinfo: pg_sys::FunctionCallInfo,
) -> composite_type!('static, "snowflake_parts") {
    const NAME: &str = "snowflake_decode";
    let Some(known) = ForeignLayout::from_name(layout.as_str()) else {
        errors::unknown_layout(layout.as_str(), &LAYOUT_NAMES).raise(NAME)
    };
    let parts = known.decode(id).map_err(errors::layout).or_raise(NAME);
    parts_row(fcinfo, NAME, &parts).or_raise(NAME)
}

/// The ID's 8 bytes (big-endian) and 64 bits as text, with its decoded fields.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_melt(
    id: i64,
    fcinfo: pg_sys::FunctionCallInfo,
) -> composite_type!('static, "snowflake_melted") {
    const NAME: &str = "snowflake_melt";
    let (parts, unix_ms) = decode::decoded(id).or_raise(NAME);
    result_row(
        fcinfo,
        NAME,
        [
            cell("bytes", id.to_be_bytes().to_vec()),
            cell("bits", format!("{id:064b}")),
            cell("ts", timestamptz(unix_ms).or_raise(NAME)),
            cell("unix_ms", unix_ms),
            cell("datacenter_id", i32::from(parts.datacenter_id)),
            cell("worker_id", i32::from(parts.worker_id)),
            cell("sequence", i32::from(parts.sequence)),
        ],
    )
    .or_raise(NAME)
}

/// A business serial (payment or order number): `prefix`, the ID's UTC time as
/// `YYYYMMDDHHMISSmmm`, then datacenter (2 digits), worker (2) and sequence (4). Serials of
/// one prefix sort like their IDs. IMMUTABLE: it depends on the ID and the recorded epoch.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_serial(prefix: DbText, id: i64) -> DbText {
    const NAME: &str = "snowflake_serial";
    let epoch = decode::epoch().or_raise(NAME);
    let serial = text::to_serial(prefix.as_str(), id, epoch)
        .map_err(errors::text)
        .or_raise(NAME);
    DbText(serial)
}

/// The ID of a serial made by `snowflake_serial()`, whatever its prefix (the last 25
/// characters are the digits).
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_serial_id(serial: DbText) -> i64 {
    const NAME: &str = "snowflake_serial_id";
    let epoch = decode::epoch().or_raise(NAME);
    text::from_serial(serial.as_str(), epoch)
        .map_err(errors::text)
        .or_raise(NAME)
}

/// The ID as 13 characters of Crockford base32, upper case and zero-padded, so that text
/// order (C collation) is numeric order. Does not depend on any setting.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_to_base32(id: i64) -> String {
    text::to_base32(id)
        .map_err(errors::text)
        .or_raise("snowflake_to_base32")
}

/// The ID of 13 characters of Crockford base32, in either case (I and L read as 1, O as 0).
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_from_base32(text: DbText) -> i64 {
    text::from_base32(text.as_str())
        .map_err(errors::text)
        .or_raise("snowflake_from_base32")
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
    let (parts, unix_ms) = decode::decoded(id).or_raise("snowflake_format");
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
    const NAME: &str = "snowflake_to_timestamp";
    let (_, unix_ms) = decode::decoded(id).or_raise(NAME);
    timestamptz(unix_ms).or_raise(NAME)
}

/// The smallest ID of the millisecond containing `ts` (datacenter, worker and sequence 0),
/// for range queries: `id >= snowflake_from_timestamp(a) AND id < snowflake_from_timestamp(b)`.
#[pg_extern(immutable, strict, parallel_safe)]
fn snowflake_from_timestamp(ts: TimestampWithTimeZone) -> i64 {
    const NAME: &str = "snowflake_from_timestamp";
    if !ts.is_finite() {
        errors::infinite_timestamp().raise(NAME);
    }
    let epoch = decode::epoch().or_raise(NAME);
    epoch
        .first_id_at(unix_ms_of(ts))
        .map_err(errors::layout)
        .or_raise(NAME)
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
    stats::row(fcinfo, NAME).or_raise(NAME)
}
