//! The custom WAL resource manager that carries lease extensions to standbys (PG15+).
//!
//! One record type, `LEASE`: the new lease end and the layout. Redo (on a standby, and in
//! crash recovery) merges it into the state file, so a promoted standby resumes after
//! every lease whose record it received. No relation, buffer or per-call lock is involved:
//! a record is written only when the lease is extended (at most once per
//! `snowflake.lease_window` under steady load).

use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicU8, Ordering};

use pgrx::prelude::*;

use crate::durable::{self, LeaseRecord, StateFile};
use crate::settings::format_unix_ms;

/// `info` bits of a lease record (the high nibble is the resource manager's).
const XLOG_SNOWFLAKE_LEASE: u8 = 0x10;
/// Low bits of `xl_info` reserved by PostgreSQL.
const XLR_INFO_MASK: u8 = 0x0F;

/// The id registered at startup (0: not registered).
static RMGR_ID: AtomicU8 = AtomicU8::new(0);

/// Registers the resource manager. Call from `_PG_init` while preloading.
#[cfg(not(any(feature = "pg13", feature = "pg14")))]
pub fn register(rmgr_id: u8) {
    let mut data = pg_sys::RmgrData {
        rm_name: c"snowflake".as_ptr(),
        rm_redo: Some(redo),
        rm_desc: Some(desc),
        rm_identify: Some(identify),
        ..Default::default()
    };
    // SAFETY: called while preloading; PostgreSQL copies the struct, and the name is static.
    unsafe { pg_sys::RegisterCustomRmgr(rmgr_id, &mut data) };
    RMGR_ID.store(rmgr_id, Ordering::Relaxed);
}

/// PG13/14 have no custom resource managers: leases are only written to the state file.
#[cfg(any(feature = "pg13", feature = "pg14"))]
pub fn register(_rmgr_id: u8) {}

/// WAL-logs a lease extension; returns the record's end LSN, or 0 when there is nothing to
/// wait for (no resource manager on this major, or no synchronous replication).
///
/// Local durability comes from the state file (fsync'd before this is called). The record
/// is for standbys: with synchronous replication it is flushed here and the caller waits
/// for the standby; otherwise the WAL writer flushes it within `wal_writer_delay`, so that a
/// bulk insert does not pay a synchronous flush of all its WAL once per lease window.
pub fn log_lease(record: &LeaseRecord) -> u64 {
    let rmgr_id = RMGR_ID.load(Ordering::Relaxed);
    if rmgr_id == 0 {
        return 0;
    }
    let bytes = record.encode();
    // SAFETY: the standard insertion sequence; `bytes` outlives XLogInsert.
    unsafe {
        pg_sys::XLogBeginInsert();
        pg_sys::XLogRegisterData(bytes.as_ptr().cast_mut().cast(), bytes.len() as _);
        let lsn = pg_sys::XLogInsert(rmgr_id, XLOG_SNOWFLAKE_LEASE);
        if !synchronous_replication() {
            return 0;
        }
        pg_sys::XLogFlush(lsn);
        lsn
    }
}

/// Whether this session's commits wait for synchronous standbys (SyncRepRequested() and a
/// non-empty synchronous_standby_names).
fn synchronous_replication() -> bool {
    // SAFETY: plain reads of GUC globals in this backend.
    unsafe {
        let names = pg_sys::SyncRepStandbyNames;
        pg_sys::max_wal_senders > 0
            && pg_sys::synchronous_commit
                > pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_LOCAL_FLUSH as std::ffi::c_int
            && !names.is_null()
            && *names != 0
    }
}

/// Waits until synchronous standbys (if `synchronous_standby_names` is set and the
/// session's `synchronous_commit` asks for it) have the lease record, as a commit would.
/// Returns false if the wait ended without their confirmation (a cancel or a terminate
/// request): the caller then issues nothing.
pub fn wait_for_sync_standbys(lsn: u64) -> bool {
    if lsn == 0 {
        return true;
    }
    // SAFETY: a backend with a PGPROC; returns at once without synchronous standbys.
    // SyncRepWaitForLSN expects interrupts held off (it handles cancel and die itself).
    unsafe {
        pg_sys::InterruptHoldoffCount += 1;
        pg_sys::SyncRepWaitForLSN(lsn, false);
        pg_sys::InterruptHoldoffCount -= 1;
    }
    pgrx::check_for_interrupts!();
    confirmed_by_standbys(lsn)
}

/// Whether the synchronous standbys have confirmed `lsn` at the session's
/// `synchronous_commit` level (remote_write, on = remote flush, remote_apply).
fn confirmed_by_standbys(lsn: u64) -> bool {
    use pg_sys::SyncCommitLevel::*;
    // SAFETY: WalSndCtl lives in shared memory for the server's lifetime; an aligned 64-bit
    // read is atomic, and a stale value only makes this answer false.
    unsafe {
        let mode = match pg_sys::synchronous_commit as u32 {
            SYNCHRONOUS_COMMIT_REMOTE_WRITE => 0,
            SYNCHRONOUS_COMMIT_REMOTE_APPLY => 2,
            _ => 1,
        };
        let ctl = pg_sys::WalSndCtl;
        ctl.is_null() || std::ptr::read_volatile(&(*ctl).lsn[mode]) >= lsn
    }
}

/// # Safety
/// `record` is a valid reader state positioned on one of our records.
unsafe fn record_payload<'a>(record: *mut pg_sys::XLogReaderState) -> (u8, &'a [u8]) {
    unsafe {
        let decoded = (*record).record;
        let info = (*decoded).header.xl_info & !XLR_INFO_MASK;
        let data = std::slice::from_raw_parts(
            (*decoded).main_data as *const u8,
            (*decoded).main_data_len as usize,
        );
        (info, data)
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn redo(record: *mut pg_sys::XLogReaderState) {
    // SAFETY: PostgreSQL calls redo with a valid record of this resource manager.
    let (info, data) = unsafe { record_payload(record) };
    let lease = match (info, LeaseRecord::decode(data)) {
        (XLOG_SNOWFLAKE_LEASE, Some(lease)) => lease,
        _ => pgrx::error!(
            "snowflake: unknown WAL record (info {info:#x}, {} bytes)",
            data.len()
        ),
    };
    let dir = crate::api::data_dir();
    // A damaged file is replaced by what the WAL says; the WAL is the newer truth here.
    let existing = durable::read(&dir).ok().flatten();
    if let Some(state) = StateFile::merged(existing.as_ref(), &lease) {
        if let Err(e) = durable::write(&dir, &state) {
            // Recovery must not continue without the lease on disk.
            pgrx::error!(
                "snowflake: could not write \"{}\" during WAL replay: {e}",
                durable::STATE_FILE
            );
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn desc(buf: pg_sys::StringInfo, record: *mut pg_sys::XLogReaderState) {
    // SAFETY: PostgreSQL calls desc with a valid record of this resource manager.
    let (_, data) = unsafe { record_payload(record) };
    let text = match LeaseRecord::decode(data) {
        Some(r) => format!(
            "lease end {} ({}); epoch {}",
            r.lease_end_unix_ms,
            format_unix_ms(r.lease_end_unix_ms),
            r.layout.epoch_ms
        ),
        None => format!("unreadable ({} bytes)", data.len()),
    };
    let text = CString::new(text).unwrap_or_default();
    // SAFETY: buf is the caller's StringInfo.
    unsafe { pg_sys::appendStringInfoString(buf, text.as_ptr()) };
}

#[pg_guard]
unsafe extern "C-unwind" fn identify(info: u8) -> *const c_char {
    if info & !XLR_INFO_MASK == XLOG_SNOWFLAKE_LEASE {
        c"LEASE".as_ptr()
    } else {
        std::ptr::null()
    }
}
