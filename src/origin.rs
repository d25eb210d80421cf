//! The database's own record of where its IDs came from: table `snowflake_origin`, one row
//! per cluster that installed or updated the extension in this database, with that
//! cluster's system identifier and the epoch its IDs use.
//!
//! The state file lives in the data directory, and pg_upgrade and pg_dump leave it behind.
//! The table is an extension configuration table: both carry it. So a server that finds a
//! row of another cluster knows that IDs already exist in this database whose lease it
//! cannot see (see `lease::adopt_origins`), and a server whose `snowflake.epoch` differs from
//! a row's refuses to generate or decode instead of silently using the wrong epoch.
//!
//! Read through SPI, with every name schema-qualified, once per backend: the callers cache
//! their success (`lease::READY`, `decode::epoch`).

use pgrx::prelude::*;

use crate::errors::{self, SnowflakeError};
use snowflake_core::layout::Epoch;

/// One row of `snowflake_origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OriginRow {
    /// The system identifier of the cluster that wrote the row.
    pub system_identifier: u64,
    /// The epoch of its IDs (Unix ms).
    pub epoch_unix_ms: i64,
}

/// Finds the table in the extension's schema; `None` where the SQL objects predate it
/// (version 0.2.0 and earlier, before `ALTER EXTENSION snowflake UPDATE`).
const FIND_TABLE: &str = "\
SELECT pg_catalog.quote_ident(n.nspname) \
  FROM pg_catalog.pg_extension e \
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace \
  JOIN pg_catalog.pg_class c ON c.relnamespace OPERATOR(pg_catalog.=) n.oid \
 WHERE e.extname OPERATOR(pg_catalog.=) 'snowflake' \
   AND c.relname OPERATOR(pg_catalog.=) 'snowflake_origin'";

/// The rows of this database's `snowflake_origin` table (none if the table does not exist).
pub(crate) fn rows() -> Result<Vec<OriginRow>, SnowflakeError> {
    let unreadable = |e: pgrx::spi::SpiError| errors::origin_table_unreadable(&e.to_string());
    Spi::connect(|client| {
        let found = client
            .select(FIND_TABLE, Some(1), &[])
            .map_err(unreadable)?;
        let schema: Option<String> = if found.is_empty() {
            None
        } else {
            found.first().get_one().map_err(unreadable)?
        };
        let Some(schema) = schema else {
            return Ok(Vec::new());
        };
        let query = format!(
            "SELECT system_identifier, epoch_unix_ms FROM {schema}.snowflake_origin \
             WHERE system_identifier IS NOT NULL AND epoch_unix_ms IS NOT NULL"
        );
        let mut rows = Vec::new();
        for row in client
            .select(query.as_str(), None, &[])
            .map_err(unreadable)?
        {
            let sysid = row.get::<i64>(1).map_err(unreadable)?;
            let epoch = row.get::<i64>(2).map_err(unreadable)?;
            if let (Some(sysid), Some(epoch)) = (sysid, epoch) {
                if Epoch::from_unix_ms(epoch).is_none() {
                    return Err(errors::origin_row_invalid(epoch));
                }
                rows.push(OriginRow {
                    // The SQL bigint holds the unsigned identifier's bits.
                    system_identifier: sysid as u64,
                    epoch_unix_ms: epoch,
                });
            }
        }
        Ok(rows)
    })
}

/// The epoch this database's rows record (`None`: no rows). Rows that disagree are an
/// error: no single epoch decodes all of this database's IDs.
pub(crate) fn recorded_epoch() -> Result<Option<Epoch>, SnowflakeError> {
    let rows = rows()?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    if let Some(other) = disagreeing(&rows, first.epoch_unix_ms) {
        return Err(errors::origin_epochs_disagree(
            first.epoch_unix_ms,
            other.epoch_unix_ms,
        ));
    }
    // rows() refused every epoch out of range.
    Ok(Epoch::from_unix_ms(first.epoch_unix_ms))
}

/// Refuses if a row records another epoch than `epoch`. The caller caches a success for
/// the backend (`decode::epoch`).
pub(crate) fn check_epoch(epoch: Epoch) -> Result<(), SnowflakeError> {
    epoch_agrees(&rows()?, epoch)
}

/// Refuses if one of `rows` records another epoch than `epoch`.
pub(crate) fn epoch_agrees(rows: &[OriginRow], epoch: Epoch) -> Result<(), SnowflakeError> {
    match disagreeing(rows, epoch.unix_ms()) {
        Some(r) => Err(errors::origin_epoch_mismatch(
            r.epoch_unix_ms,
            epoch.unix_ms(),
        )),
        None => Ok(()),
    }
}

/// The first of `rows` that records another epoch than `epoch_unix_ms`.
fn disagreeing(rows: &[OriginRow], epoch_unix_ms: i64) -> Option<&OriginRow> {
    rows.iter().find(|r| r.epoch_unix_ms != epoch_unix_ms)
}

/// This cluster's system identifier (`pg_control_system().system_identifier`).
pub(crate) fn own_system_identifier() -> u64 {
    // SAFETY: reads a value fixed for the life of the cluster.
    unsafe { pg_sys::GetSystemIdentifier() }
}
