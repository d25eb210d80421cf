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
//! Trust: the rows decide where every session of the server resumes, so only the table the
//! extension's own script created counts: a member of the extension, owned by a superuser
//! (the install script runs as one, also for a trusted extension). A table of that name
//! that a database owner created, or added to the extension they own, is ignored.
//!
//! Read with the table access functions, not SPI, once per backend (the callers cache their
//! success: `lease::READY`, `decode::epoch`): SPI cannot run inside a parallel operation
//! (a parallel `CREATE TABLE AS` calls `snowflake_next()` in its leader and workers).

use std::ffi::CStr;
use std::ops::ControlFlow;

use pgrx::pg_sys;

use crate::server::errors::{self, SnowflakeError};
use snowflake_core::layout::Epoch;

/// One row of `snowflake_origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OriginRow {
    /// The system identifier of the cluster that wrote the row.
    pub system_identifier: u64,
    /// The epoch of its IDs (Unix ms).
    pub epoch_unix_ms: i64,
}

const EXTENSION: &CStr = c"snowflake";
const TABLE: &CStr = c"snowflake_origin";
const SYSTEM_IDENTIFIER: &CStr = c"system_identifier";
const EPOCH_UNIX_MS: &CStr = c"epoch_unix_ms";

/// The rows of this database's `snowflake_origin` table: none where the extension is not
/// installed here, where its version predates the table (0.2.0 and earlier, before `ALTER
/// EXTENSION snowflake UPDATE`), or where the table of that name is not the extension's own.
pub(crate) fn rows() -> Result<Vec<OriginRow>, SnowflakeError> {
    // SAFETY: catalog lookups and a heap scan under AccessShareLock, in a transaction (every
    // caller runs inside a SQL function call); errors unwind through pgrx's guard.
    unsafe {
        let Some(relid) = trusted_table() else {
            return Ok(Vec::new());
        };
        let system_identifier = column(relid, SYSTEM_IDENTIFIER)?;
        let epoch_unix_ms = column(relid, EPOCH_UNIX_MS)?;
        let mut rows = Vec::new();
        let invalid = scan(relid, |tuple, desc| {
            let (mut sysid_null, mut epoch_null) = (false, false);
            let sysid = pg_sys::heap_getattr(tuple, system_identifier, desc, &mut sysid_null);
            let epoch = pg_sys::heap_getattr(tuple, epoch_unix_ms, desc, &mut epoch_null);
            if sysid_null || epoch_null {
                return ControlFlow::Continue(());
            }
            let epoch = epoch.value() as i64;
            if Epoch::from_unix_ms(epoch).is_none() {
                return ControlFlow::Break(epoch);
            }
            rows.push(OriginRow {
                // The SQL bigint holds the unsigned identifier's bits.
                system_identifier: sysid.value() as u64,
                epoch_unix_ms: epoch,
            });
            ControlFlow::Continue(())
        });
        match invalid {
            Some(epoch) => Err(errors::origin_row_invalid(epoch)),
            None => Ok(rows),
        }
    }
}

/// The OID of the extension's own `snowflake_origin`, or None (see [`rows`]).
///
/// # Safety
/// Inside a transaction.
unsafe fn trusted_table() -> Option<pg_sys::Oid> {
    // SAFETY: inside a transaction (this function's contract), where catalog lookups may run.
    unsafe {
        let extension = pg_sys::get_extension_oid(EXTENSION.as_ptr(), true);
        if extension == pg_sys::InvalidOid {
            return None;
        }
        let relid = pg_sys::get_relname_relid(TABLE.as_ptr(), extension_schema(extension)?);
        if relid == pg_sys::InvalidOid
            || pg_sys::get_rel_relkind(relid) as u8 != pg_sys::RELKIND_RELATION
            || pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, relid) != extension
        {
            return None;
        }
        let owner = {
            let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            let owner = (*(*rel).rd_rel).relowner;
            pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            owner
        };
        pg_sys::superuser_arg(owner).then_some(relid)
    }
}

/// The schema the extension `extension` was installed in (`pg_extension.extnamespace`).
///
/// # Safety
/// Inside a transaction.
unsafe fn extension_schema(extension: pg_sys::Oid) -> Option<pg_sys::Oid> {
    // SAFETY: inside a transaction (this function's contract); the scan's tuples are read
    // only while `scan` holds them.
    unsafe {
        // pg_extension holds a row per installed extension: a scan is a handful of rows.
        scan(pg_sys::ExtensionRelationId, |tuple, _| {
            let form = pg_sys::GETSTRUCT(tuple) as *const pg_sys::FormData_pg_extension;
            if (*form).oid == extension {
                ControlFlow::Break((*form).extnamespace)
            } else {
                ControlFlow::Continue(())
            }
        })
    }
}

/// Calls `visit` with every tuple of the table `relid` and its descriptor until it breaks,
/// and returns what it broke with. Reads with the table access functions under
/// AccessShareLock and a registered catalog snapshot (no SPI: this runs inside parallel
/// operations too), servicing interrupts between tuples.
///
/// # Safety
/// Inside a transaction; `visit` gets tuples valid until it returns.
unsafe fn scan<B>(
    relid: pg_sys::Oid,
    mut visit: impl FnMut(pg_sys::HeapTuple, pg_sys::TupleDesc) -> ControlFlow<B>,
) -> Option<B> {
    // SAFETY: inside a transaction (this function's contract): the table is opened, scanned
    // and closed here, and `visit` sees each tuple only while the scan holds it.
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let desc = (*rel).rd_att;
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        let mut found = None;
        loop {
            pg_sys::check_for_interrupts!();
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            if let ControlFlow::Break(value) = visit(tuple, desc) {
                found = Some(value);
                break;
            }
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        found
    }
}

/// The attribute number of `name`, a bigint column of `relid`, or the error that the table
/// is not as the extension created it.
///
/// # Safety
/// Inside a transaction.
unsafe fn column(relid: pg_sys::Oid, name: &CStr) -> Result<i32, SnowflakeError> {
    // SAFETY: inside a transaction (this function's contract), where catalog lookups may run.
    unsafe {
        let attnum = pg_sys::get_attnum(relid, name.as_ptr());
        let name = name.to_string_lossy();
        if attnum <= 0 {
            return Err(errors::origin_table_unreadable(&format!(
                "column \"{name}\" does not exist"
            )));
        }
        if pg_sys::get_atttype(relid, attnum) != pg_sys::INT8OID {
            return Err(errors::origin_table_unreadable(&format!(
                "column \"{name}\" is not of type bigint"
            )));
        }
        Ok(i32::from(attnum))
    }
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
