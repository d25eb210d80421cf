//! The files in the data directory (state, origins, prepared holds), WAL replay of them,
//! and the LOG lines of a resume after a promotion and of adopted origins.

use super::*;

/// Reading or writing the state file failed.
pub fn state_file(err: &io::Error, writing: bool) -> SnowflakeError {
    data_file(
        durable::STATE_FILE,
        err,
        writing,
        "The file in the data directory records the ID layout of this cluster. No ID was issued.",
        "Restore the file from a backup of this data directory (or a standby's copy). Removing it is safe only if the clock is past every ID already issued and no stored ID was generated with a different snowflake.epoch.",
    )
}

/// Reading or writing one of the extension's files in the data directory failed; `if_invalid`
/// is the HINT when the contents are damaged (otherwise: permissions and free space).
fn data_file(
    name: &str,
    err: &io::Error,
    writing: bool,
    detail: &str,
    if_invalid: &str,
) -> SnowflakeError {
    let damaged = err.kind() == io::ErrorKind::InvalidData;
    SnowflakeError::new(
        if damaged {
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED
        } else {
            PgSqlErrorCode::ERRCODE_IO_ERROR
        },
        format!(
            "could not {} file \"{name}\": {err}",
            if writing { "write" } else { "read" }
        ),
        detail,
        if damaged {
            if_invalid
        } else {
            "Check the permissions and free space of the data directory."
        },
    )
}

/// WAL replay found a state file it cannot read: replacing it could move the lease back.
pub fn state_file_in_replay(err: &io::Error) -> SnowflakeError {
    SnowflakeError::new(
        if err.kind() == io::ErrorKind::InvalidData {
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED
        } else {
            PgSqlErrorCode::ERRCODE_IO_ERROR
        },
        format!("could not read file \"{}\" during WAL replay: {err}", durable::STATE_FILE),
        "The file may hold a lease beyond the one being replayed; replacing it could let a promoted server reissue IDs. Recovery stops.",
        "Restore the file from the primary (it is safe to copy the primary's file over it), or fix its permissions, and start the server again.",
    )
}

/// LOG at the first ID after a promotion (with a worker id set in the configuration).
pub fn promoted_resume(
    plan: &ResumePlan,
    now_unix_ms: i64,
    lead_ms: i64,
    margin_ms: i64,
    skipped: u32,
) -> LogLine {
    let skipped = if skipped > 0 {
        format!(" {skipped} timeline(s) since the newest lease each add as much again.")
    } else {
        String::new()
    };
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!(
            "snowflake: promoted; IDs resume at {}, {} ms ahead of this server's clock",
            ms(plan.floor_unix_ms),
            plan.lead_ms(now_unix_ms)
        ),
        format!(
            "The old primary may have written leases this server never received. Its clock was seen {lead_ms} ms ahead of this server's; the resume point adds its largest lease reach and a margin of {margin_ms} ms.{skipped}"
        ),
        "No action is needed: IDs are issued from the resume point at once, ahead of the clock by at most that much, until the clock catches up.",
    ).into_log()
}

/// The origins file could not be read or written.
pub fn origins_file(err: &io::Error, writing: bool) -> SnowflakeError {
    data_file(
        durable::ORIGINS_FILE,
        err,
        writing,
        "The file in the data directory lists the clusters whose IDs this server took over. No ID was issued.",
        "Remove the file: the server then takes those clusters' IDs over again, which only makes it wait once.",
    )
}

/// The prepared-transaction file (the watermark's holds) could not be read or written.
pub fn prepared_file(err: &io::Error, writing: bool) -> SnowflakeError {
    data_file(
        snowflake_core::watermark::PREPARED_FILE,
        err,
        writing,
        "The file in the data directory lists the smallest snowflake ID each prepared transaction holds, for snowflake_safe_upto().",
        "Commit or roll back the prepared transactions (pg_prepared_xacts), then remove the file.",
    )
}

/// The LOG line written when this server takes over IDs other clusters issued: `count`
/// clusters, the first of them (smallest identifier) named.
pub fn adopted_origins(
    first_system_identifier: u64,
    count: usize,
    floor_unix_ms: i64,
    reach_ms: i64,
) -> LogLine {
    let clusters = if count == 1 {
        format!("the cluster with system identifier {first_system_identifier}")
    } else {
        format!("{count} other clusters (system identifiers {first_system_identifier} and more)")
    };
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!(
            "snowflake: this database's IDs were issued by {clusters}; IDs resume at {}",
            ms(floor_unix_ms)
        ),
        format!(
            "Table snowflake_origin names another cluster (pg_upgrade, or a dump restored here), whose lease this server cannot see. The resume point is {reach_ms} ms past this server's clock: the furthest that cluster could have issued IDs ahead of its clock with this server's snowflake.max_clock_drift and snowflake.lease_window."
        ),
        "snowflake_next() waits for it, once; the file snowflake.origins in the data directory records that it was done.",
    ).into_log()
}
