//! Table `snowflake_origin`: the epoch each database's IDs were made with.

use super::*;

/// Without preload, decoding takes the epoch from `snowflake_origin`, whose rows disagree.
pub fn origin_epochs_disagree(first_ms: i64, other_ms: i64) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        "table snowflake_origin records more than one epoch",
        format!(
            "Rows record epochs {} and {}; no single epoch decodes every ID in this database.",
            ms(first_ms),
            ms(other_ms)
        ),
        "Delete the rows that are wrong, or add snowflake to shared_preload_libraries and set snowflake.epoch, then restart the server.",
    )
}

/// This database's IDs were generated with another epoch than the configured one (its
/// `snowflake_origin` table says so; the state file may be gone, after pg_upgrade).
pub fn origin_epoch_mismatch(recorded_ms: i64, configured_ms: i64) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{} does not match the epoch recorded in this database", settings::EPOCH),
        format!(
            "Table snowflake_origin records that IDs in this database were generated with epoch {}, but {} is now {}. Decoding them with another epoch would give wrong times, and new IDs could repeat old ones.",
            ms(recorded_ms),
            settings::EPOCH,
            ms(configured_ms)
        ),
        format!(
            "Set {} = '{}' in postgresql.conf and restart the server.",
            settings::EPOCH,
            format_unix_ms(recorded_ms)
        ),
    )
}

/// Table `snowflake_origin` exists but cannot be read as the extension created it.
pub fn origin_table_unreadable(reason: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
        "could not read table snowflake_origin",
        format!("{reason}. The table records which cluster issued this database's IDs and with which epoch; no ID was issued."),
        "The table was altered: restore its definition (see docs/guarantees.md, \"Upgrades and restores\"), or recreate the extension.",
    )
}

/// A row of `snowflake_origin` records an epoch no server can have been configured with.
pub fn origin_row_invalid(epoch_unix_ms: i64) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        "table snowflake_origin holds an invalid epoch",
        format!("epoch_unix_ms = {epoch_unix_ms} is outside the range snowflake.epoch allows (Unix time 0 to 9999-12-31). The table records which cluster issued this database's IDs and with which epoch; no ID was issued."),
        "The table was edited: restore the row from a backup, or set epoch_unix_ms to the epoch the IDs were made with (see docs/guarantees.md, \"Upgrades and restores\").",
    )
}
