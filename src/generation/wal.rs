//! The custom WAL resource manager that carries lease extensions to standbys (PG15+), and
//! the wait for synchronous standbys to confirm them.
//!
//! Two record types:
//! - `LEASE`: the new lease end, the layout, and the writer's clock, timeline and lease
//!   reach. Redo (on a standby, and in crash recovery) merges it into the state file, so a
//!   promoted standby resumes after every lease whose record it received, and past the
//!   leases it may have missed (see `durable::plan_resume`). No relation, buffer or per-call
//!   lock is involved: a record is written only when the lease is extended (at most about
//!   once per `snowflake.lease_window` under steady load).
//! - `PREPARED_HOLD`: a transaction being prepared and the smallest ID it holds, for the
//!   watermark (see `watermark`); redo adds it to `snowflake.prepared`.

use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use pgrx::prelude::*;

use snowflake_core::durable::{self, LeaseRecord, PeerClock, StateFile};
use snowflake_core::settings::format_unix_ms;
use snowflake_core::watermark::PreparedHold;

/// `info` bits of a lease record (the high nibble is the resource manager's).
const XLOG_SNOWFLAKE_LEASE: u8 = 0x10;
/// `info` bits of a prepared transaction's watermark hold.
const XLOG_SNOWFLAKE_PREPARED_HOLD: u8 = 0x20;
/// Low bits of `xl_info` reserved by PostgreSQL.
const XLR_INFO_MASK: u8 = 0x0F;
/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_UNIX_US: i64 = 946_684_800_000_000;

/// The id registered at startup (0: not registered).
static RMGR_ID: AtomicU8 = AtomicU8::new(0);

/// What replay does with a prepared-hold record: the watermark's, registered by it at
/// preload ([`on_prepared_hold_redo`]), so that this module does not depend on its user.
static PREPARED_HOLD_REDO: OnceLock<PreparedHoldRedo> = OnceLock::new();

/// Replays a prepared-hold record.
pub type PreparedHoldRedo = fn(PreparedHold) -> crate::server::errors::Result<()>;

/// Registers what replay does with prepared-hold records. Call from `_PG_init` while
/// preloading (before any replay).
pub fn on_prepared_hold_redo(redo: PreparedHoldRedo) {
    // A second registration (the library loaded twice) keeps the first: the same function.
    let _ = PREPARED_HOLD_REDO.set(redo);
}

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
    // A raw pointer: PostgreSQL 15 declares the parameter `RmgrData *`, 16+ `const`.
    unsafe { pg_sys::RegisterCustomRmgr(rmgr_id, &raw mut data) };
    RMGR_ID.store(rmgr_id, Ordering::Relaxed);
}

/// PG13/14 have no custom resource managers: leases are only written to the state file.
#[cfg(any(feature = "pg13", feature = "pg14"))]
pub fn register(_rmgr_id: u8) {}

/// WAL-logs a lease extension and returns the record's end LSN (0 when this major has no
/// custom resource managers).
///
/// Local durability comes from the state file (fsync'd before this is called). The record
/// is for standbys. It is not flushed here: a bulk insert would pay a synchronous flush of
/// all its WAL once per lease window. Instead the WAL writer is asked to flush it, as for an
/// asynchronous commit, so that it reaches the WAL (and the standbys) within
/// `wal_writer_delay` even if no commit follows; sessions that need synchronous standbys to
/// confirm it flush it themselves ([`wait_for_confirmation`]).
pub fn log_lease(record: &LeaseRecord) -> u64 {
    let Some(lsn) = insert(XLOG_SNOWFLAKE_LEASE, &record.encode()) else {
        return 0;
    };
    // SAFETY: a plain call after an insertion.
    unsafe { pg_sys::XLogSetAsyncXactLSN(lsn) };
    lsn
}

/// WAL-logs the smallest ID a transaction being prepared holds, so that a standby keeps it
/// in its own `snowflake.prepared` (the PREPARE record follows and flushes it).
pub fn log_prepared_hold(hold: &PreparedHold) {
    insert(XLOG_SNOWFLAKE_PREPARED_HOLD, &hold.encode());
}

/// Inserts one record of ours with `bytes` as its data; its end LSN, or `None` when this
/// major has no custom resource managers.
fn insert(info: u8, bytes: &[u8]) -> Option<u64> {
    let rmgr_id = RMGR_ID.load(Ordering::Relaxed);
    if rmgr_id == 0 {
        return None;
    }
    // SAFETY: the standard insertion sequence; `bytes` outlives XLogInsert.
    unsafe {
        pg_sys::XLogBeginInsert();
        pg_sys::XLogRegisterData(bytes.as_ptr().cast_mut().cast(), bytes.len() as _);
        Some(pg_sys::XLogInsert(rmgr_id, info))
    }
}

/// The timeline this server writes WAL on (0 on majors without custom resource managers,
/// where the lease is not in the WAL and timelines do not matter to it).
pub fn insertion_timeline() -> u32 {
    // SAFETY: valid once recovery has ended, which generation checks first.
    unsafe { pg_sys::GetWALInsertionTimeLine() }
}

/// Index into `WalSndCtl->lsn` of the position this session's lease records must reach on
/// the synchronous standbys, or `None` when it need not wait for any standby.
///
/// Mirrors `SyncRepWaitForLSN(lsn, commit = false)`: the session must ask for synchronous
/// replication (`synchronous_commit` above `local`), and the checkpointer must have
/// published a non-empty `synchronous_standby_names` (read from shared memory, so that
/// clearing it takes effect at once for every session). A record that is not a commit is
/// confirmed at remote flush at most: a standby reports its apply position for commits
/// only, so waiting for `remote_apply` would wait for an unrelated later report.
pub fn sync_wait_level() -> Option<usize> {
    // SAFETY: plain reads of this backend's settings and of a shared flag byte.
    unsafe {
        if !pg_sys::IsUnderPostmaster || pg_sys::max_wal_senders == 0 {
            return None;
        }
        let level = match pg_sys::synchronous_commit as u32 {
            pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_WRITE => pg_sys::SYNC_REP_WAIT_WRITE,
            pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_FLUSH
            | pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_APPLY => {
                pg_sys::SYNC_REP_WAIT_FLUSH
            }
            _ => return None,
        };
        let ctl = pg_sys::WalSndCtl;
        if ctl.is_null() {
            return None;
        }
        let status = std::ptr::read_volatile(&(*ctl).sync_standbys_status) as u32;
        let defined = if status & pg_sys::SYNC_STANDBY_INIT != 0 {
            status & pg_sys::SYNC_STANDBY_DEFINED != 0
        } else {
            // Not yet published by the checkpointer: decide from the setting itself.
            let names = pg_sys::SyncRepStandbyNames;
            !names.is_null() && *names != 0
        };
        defined.then_some(level as usize)
    }
}

/// Whether the synchronous standbys have confirmed `lsn` at `level`.
pub fn confirmed(lsn: u64, level: usize) -> bool {
    // SAFETY: WalSndCtl lives in shared memory for the server's lifetime; an aligned 64-bit
    // read is atomic, and a stale value only makes this answer false.
    unsafe {
        let ctl = pg_sys::WalSndCtl;
        ctl.is_null() || std::ptr::read_volatile(&(*ctl).lsn[level]) >= lsn
    }
}

/// How long a wait for the synchronous standbys lasts before they are given new WAL to
/// confirm (ms); doubled after each such nudge, up to [`MAX_NUDGE_INTERVAL_MS`].
const FIRST_NUDGE_AFTER_MS: u64 = 20;
/// The longest interval between two nudges of the same wait (ms).
const MAX_NUDGE_INTERVAL_MS: u64 = 1_000;

/// Waits until the synchronous standbys (if this session asks for them) have confirmed the
/// lease record ending at `lsn`. Returns the level that was confirmed (`None`: no standby
/// needed to confirm it).
///
/// Our own wait loop rather than `SyncRepWaitForLSN`: a cancel, `statement_timeout` or
/// `pg_terminate_backend` then ends the statement exactly as anywhere else in PostgreSQL
/// (no ID is issued), and clearing `synchronous_standby_names` ends the wait at once. The
/// loop polls every millisecond, which costs nothing next to the standby's round trip; the
/// wait shows in `pg_stat_activity` as wait event `Extension`.
///
/// A standby's confirmations count for synchronous replication only while it is a
/// synchronous standby: a record it flushed while `synchronous_standby_names` was empty is
/// confirmed only by its next report, which comes when new WAL arrives or after
/// `wal_receiver_status_interval` (10 s by default). A commit writes new WAL; a lease record
/// written earlier by an asynchronous session has none behind it. So when a wait lasts, the
/// newest lease record is written again (replay ignores a lease it already has), and the
/// wait goes on for that one: the standby answers as soon as it flushed it.
pub fn wait_for_confirmation(lsn: u64) -> Option<usize> {
    if lsn == 0 {
        return None;
    }
    // A standby can confirm only what was flushed here; the writer may not have flushed it.
    // SAFETY: not in recovery (generation checks it); XLogFlush returns at once if done.
    unsafe { pg_sys::XLogFlush(lsn) };
    let mut target = lsn;
    let mut patience_ms = FIRST_NUDGE_AFTER_MS;
    let mut since = crate::server::monotonic_ms();
    loop {
        let level = sync_wait_level()?;
        if confirmed(target, level) {
            return Some(level);
        }
        let now = crate::server::monotonic_ms();
        if now.saturating_sub(since) >= patience_ms {
            target = target.max(nudge());
            since = now;
            patience_ms = (patience_ms * 2).min(MAX_NUDGE_INTERVAL_MS);
        }
        crate::server::sleep_ms(1);
    }
}

/// Writes the newest lease record again and flushes it: new WAL that the synchronous
/// standbys confirm as soon as they flushed it. Its end LSN (0 if there is no record).
fn nudge() -> u64 {
    let record = crate::generation::shmem::DURABLE.share().last_record;
    let Some(lsn) = record.and_then(|r| insert(XLOG_SNOWFLAKE_LEASE, &r.encode())) else {
        return 0;
    };
    // SAFETY: as in wait_for_confirmation.
    unsafe { pg_sys::XLogFlush(lsn) };
    lsn
}

/// `Some(lead)` of the primary's clock over this server's, from what this standby's WAL
/// receiver last saw (the send time of the primary's last message minus its receipt time)
/// and from the lease record itself (its write time minus now). Both are lower bounds of the
/// real lead: short by the message's transit and by the replay lag, respectively.
fn observed_peer_clock(record: &LeaseRecord, now_unix_ms: i64) -> PeerClock {
    let from_record = (record.written_unix_ms > 0).then(|| record.written_unix_ms - now_unix_ms);
    let lead_ms = from_record
        .into_iter()
        .chain(receiver_lead_ms())
        .max()
        .unwrap_or(0);
    PeerClock {
        lead_ms,
        observed_unix_ms: now_unix_ms,
        reach_cap_ms: record.reach_cap_ms,
    }
}

/// The WAL receiver's view of the primary's clock lead (ms), if it has received anything
/// since this server's shared memory was set up.
fn receiver_lead_ms() -> Option<i64> {
    // SAFETY: WalRcv lives in shared memory; the two timestamps are aligned 64-bit values
    // written by the WAL receiver (a torn pair only makes one estimate slightly off).
    unsafe {
        let rcv = pg_sys::WalRcv;
        if rcv.is_null() {
            return None;
        }
        let sent = std::ptr::read_volatile(&(*rcv).lastMsgSendTime);
        let received = std::ptr::read_volatile(&(*rcv).lastMsgReceiptTime);
        // A WAL receiver that starts sets both to its own clock: not an observation.
        (sent != 0 && received != 0 && sent != received)
            .then(|| (sent - received).div_euclid(1_000))
    }
}

/// What this server, just promoted, still has in shared memory about the old primary's
/// clock (lost if it restarted since), for `durable::plan_resume`.
pub fn live_peer_clock(reach_cap_ms: i64) -> Option<PeerClock> {
    let lead_ms = receiver_lead_ms()?;
    // SAFETY: as in receiver_lead_ms.
    let received_us = unsafe { std::ptr::read_volatile(&(*pg_sys::WalRcv).lastMsgReceiptTime) };
    Some(PeerClock {
        lead_ms,
        observed_unix_ms: (received_us + PG_EPOCH_UNIX_US).div_euclid(1_000),
        reach_cap_ms,
    })
}

/// Whether WAL replay runs because this server is a standby (not crash recovery, where the
/// records are the server's own).
fn in_standby_mode() -> bool {
    // SAFETY: a plain read of the startup process's global.
    unsafe { pg_sys::StandbyMode }
}

/// # Safety
/// `record` is a valid reader state positioned on one of our records.
unsafe fn record_payload<'a>(record: *mut pg_sys::XLogReaderState) -> (u8, &'a [u8]) {
    // SAFETY: `record` is a valid reader state on one of our records (this function's
    // contract): its decoded record and main data live as long as the redo call.
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
    if info == XLOG_SNOWFLAKE_PREPARED_HOLD {
        match PreparedHold::decode(data) {
            Some(hold) => match PREPARED_HOLD_REDO.get() {
                Some(redo) => redo(hold).unwrap_or_else(|e| e.raise("snowflake_redo")),
                None => pgrx::error!("snowflake: no redo for prepared-hold records"),
            },
            None => pgrx::error!(
                "snowflake: unreadable prepared-hold record ({} bytes)",
                data.len()
            ),
        }
        return;
    }
    let lease = match (info, LeaseRecord::decode(data)) {
        (XLOG_SNOWFLAKE_LEASE, Some(lease)) => lease,
        _ => pgrx::error!(
            "snowflake: unknown WAL record (info {info:#x}, {} bytes)",
            data.len()
        ),
    };
    let dir = crate::server::data_dir();
    // Only a missing file means "no lease yet". A file that cannot be read may hold a lease
    // beyond this record's: replacing it could move the lease back, so recovery stops.
    let existing = match durable::read(&dir) {
        Ok(state) => state,
        Err(e) => crate::server::errors::state_file_in_replay(&e).raise("snowflake_redo"),
    };
    let peer = in_standby_mode().then(|| observed_peer_clock(&lease, crate::server::now_unix_ms()));
    if let Some(state) = StateFile::merged(existing.as_ref(), &lease, peer) {
        if let Err(e) = durable::write(&dir, &state) {
            // Recovery must not continue without the lease on disk.
            crate::server::errors::state_file(&e, true).raise("snowflake_redo");
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn desc(buf: pg_sys::StringInfo, record: *mut pg_sys::XLogReaderState) {
    // SAFETY: PostgreSQL calls desc with a valid record of this resource manager.
    let (info, data) = unsafe { record_payload(record) };
    let text = if info == XLOG_SNOWFLAKE_PREPARED_HOLD {
        match PreparedHold::decode(data) {
            Some(h) => format!(
                "prepared transaction {} holds IDs from {}",
                h.full_xid, h.min_id
            ),
            None => format!("unreadable ({} bytes)", data.len()),
        }
    } else {
        match LeaseRecord::decode(data) {
            Some(r) => format!(
                "lease end {} ({}); written {}; timeline {}; reach cap {} ms; epoch {}",
                r.lease_end_unix_ms,
                format_unix_ms(r.lease_end_unix_ms),
                r.written_unix_ms,
                r.timeline,
                r.reach_cap_ms,
                r.layout.epoch_ms
            ),
            None => format!("unreadable ({} bytes)", data.len()),
        }
    };
    let text = CString::new(text).unwrap_or_default();
    // SAFETY: buf is the caller's StringInfo.
    unsafe { pg_sys::appendStringInfoString(buf, text.as_ptr()) };
}

#[pg_guard]
unsafe extern "C-unwind" fn identify(info: u8) -> *const c_char {
    match info & !XLR_INFO_MASK {
        XLOG_SNOWFLAKE_LEASE => c"LEASE".as_ptr(),
        XLOG_SNOWFLAKE_PREPARED_HOLD => c"PREPARED_HOLD".as_ptr(),
        _ => std::ptr::null(),
    }
}
