//! The commit-order watermark, `snowflake_safe_upto()`: a value below which no transaction
//! still in flight on this server holds an ID, so that a reader polling
//! `id >= cursor AND id < snowflake_safe_upto()` never skips a row that commits late.
//!
//! - Every backend has a slot in shared memory (indexed like `ProcGlobal->allProcs`). Its
//!   transaction's first issuing call stores there, under the generator's lock, a lower
//!   bound of every ID it will be given; the slot is cleared when the top-level transaction
//!   ends (after its commit is visible). Subtransactions share their parent's slot, and
//!   parallel workers write their leader's.
//! - A transaction that is prepared keeps its bound in `snowflake.prepared` (fsync'd before
//!   the PREPARE completes, and WAL-logged for standbys) until COMMIT or ROLLBACK PREPARED:
//!   it stays in flight across restarts and promotions.
//! - The reader takes the generator's lock to read the next ID's lower bound, then the
//!   smallest slot and prepared hold. A slot stored before that lock is seen; an ID issued
//!   after it is above the bound.

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};

use crate::generation::shmem;
use crate::generation::wal;
use crate::server;
use crate::server::errors::{self, OrRaise};
use snowflake_core::generator::Generator;
use snowflake_core::watermark::{self as holds, PreparedHold, PreparedHolds};

/// The backends' slots, `SLOT_COUNT` of them, set up by the startup hook. A slot holds its
/// bound plus one, so that 0 means no hold even for a bound of 0 (a fresh cluster's).
static mut SLOTS: *const AtomicU64 = ptr::null();
static mut SLOT_COUNT: usize = 0;
static mut PREV_SHMEM_REQUEST: Option<unsafe extern "C-unwind" fn()> = None;
static mut PREV_SHMEM_STARTUP: Option<unsafe extern "C-unwind" fn()> = None;

/// Whether this backend's transaction has stored its bound (reset when it ends).
static HOLDING: AtomicBool = AtomicBool::new(false);

/// What shared memory knows of the prepared-transaction file.
#[derive(Debug, Clone, Copy, Default)]
pub struct PreparedState {
    /// The file was read (and rewritten) since shared memory was set up.
    loaded: bool,
    /// Hold lines in the file as last read or written (0: the reader skips the file).
    lines: u32,
    /// Holds in flight when the file was last rewritten.
    live: u32,
    /// The file ends with a whole line of the current format: it may be appended to.
    appendable: bool,
}

// SAFETY: plain `Copy` data without pointers.
unsafe impl PGRXSharedMemory for PreparedState {}

/// Serializes the prepared-transaction file's readers and writers.
// SAFETY: a name of its own; pgrx allocates the lock in `_PG_init` (`pg_shmem_init!`).
static PREPARED: PgLwLock<PreparedState> = unsafe { PgLwLock::new(c"snowflake_prepared") };

/// Requests the slots and the lock, and registers the transaction callback. Call only while
/// preloading.
pub fn init() {
    pg_shmem_init!(PREPARED);
    wal::on_prepared_hold_redo(redo_prepared_hold);
    // SAFETY: single-threaded postmaster start; hooks are chained as PostgreSQL expects.
    unsafe {
        PREV_SHMEM_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        PREV_SHMEM_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
        pg_sys::RegisterXactCallback(Some(on_xact_event), ptr::null_mut());
    }
}

/// One slot per regular backend: those come first in `ProcGlobal->allProcs`.
fn slot_count() -> usize {
    // SAFETY: MaxBackends is final by the time shared memory is requested.
    unsafe { pg_sys::MaxBackends as usize }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    // SAFETY: chaining the previous hook, then requesting space while PostgreSQL allows it.
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(slot_count() * size_of::<AtomicU64>());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: the standard ShmemInitStruct sequence under AddinShmemInitLock (entry 21 of the
    // main LWLock array); the memory is zeroed by whoever creates it.
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP {
            prev();
        }
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let count = slot_count();
        let mut found = false;
        let memory = pg_sys::ShmemInitStruct(
            c"snowflake_watermark".as_ptr(),
            count * size_of::<AtomicU64>(),
            &mut found,
        );
        if !found {
            ptr::write_bytes(memory.cast::<u8>(), 0, count * size_of::<AtomicU64>());
        }
        SLOTS = memory.cast::<AtomicU64>();
        SLOT_COUNT = count;
        pg_sys::LWLockRelease(init_lock);
    }
}

/// The slots.
fn slots() -> &'static [AtomicU64] {
    // SAFETY: set once by the startup hook (inherited at fork), never freed; empty if unset.
    unsafe {
        if SLOTS.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(SLOTS, SLOT_COUNT)
        }
    }
}

/// This transaction's slot: the backend's own, or its parallel leader's.
fn own_slot() -> Option<&'static AtomicU64> {
    // SAFETY: MyProc and ProcGlobal are set for every backend that runs SQL; a parallel
    // worker's lockGroupLeader is its leader, which outlives it.
    let index = unsafe {
        let me = pg_sys::MyProc;
        if me.is_null() || pg_sys::ProcGlobal.is_null() {
            return None;
        }
        let leader = (*me).lockGroupLeader;
        let proc = if pg_sys::ParallelWorkerNumber >= 0 && !leader.is_null() {
            leader
        } else {
            me
        };
        proc.offset_from((*pg_sys::ProcGlobal).allProcs)
    };
    usize::try_from(index).ok().and_then(|i| slots().get(i))
}

/// A slot's value for a bound (IDs and bounds are never negative).
fn encode(bound: i64) -> u64 {
    bound.max(0) as u64 + 1
}

/// The bound a slot holds, if any.
fn decode(slot: u64) -> Option<i64> {
    slot.checked_sub(1).map(|b| b as i64)
}

/// Called under the generator's lock before an issuing attempt: the first time in a
/// transaction, stores a lower bound of every ID it is about to be given. One flag test
/// otherwise. False: this process has no slot (a bug; the caller issues nothing).
#[inline]
pub(crate) fn hold(generator: &Generator, node: shmem::Node) -> bool {
    HOLDING.load(Ordering::Relaxed) || hold_first(generator, node)
}

#[cold]
fn hold_first(generator: &Generator, node: shmem::Node) -> bool {
    let bound = encode(generator.next_id_floor(node.datacenter_id, node.worker_id));
    let Some(slot) = own_slot() else {
        return false;
    };
    // A parallel worker may share the slot with its leader: keep the smaller bound.
    let mut current = slot.load(Ordering::Relaxed);
    while current == 0 || current > bound {
        match slot.compare_exchange(current, bound, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => break,
            Err(seen) => current = seen,
        }
    }
    HOLDING.store(true, Ordering::Relaxed);
    true
}

/// Transaction ends: clear the slot (its commit is already visible at COMMIT), and keep a
/// prepared transaction's bound durably before the PREPARE completes.
#[pg_guard]
unsafe extern "C-unwind" fn on_xact_event(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    if slots().is_empty() {
        return;
    }
    // SAFETY: a plain global read.
    let parallel_worker = unsafe { pg_sys::ParallelWorkerNumber >= 0 };
    match event {
        XACT_EVENT_PRE_PREPARE => {
            if let Some(bound) = own_slot().and_then(|s| decode(s.load(Ordering::Acquire))) {
                keep_prepared(bound).or_raise("PREPARE TRANSACTION");
            }
        }
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE => {
            if !parallel_worker {
                if let Some(slot) = own_slot() {
                    if slot.load(Ordering::Relaxed) != 0 {
                        slot.store(0, Ordering::Release);
                    }
                }
            }
            HOLDING.store(false, Ordering::Relaxed);
        }
        XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_PARALLEL_ABORT => {
            HOLDING.store(false, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// Records a transaction being prepared with its bound: the file first, fsync'd, then the
/// WAL record, both before the PREPARE is written (a standby that replays the PREPARE has
/// replayed the hold). File before WAL, as for the lease: a base backup whose start
/// checkpoint comes after the record copies a file that has the hold.
fn keep_prepared(bound: i64) -> errors::Result<()> {
    // SAFETY: inside a transaction that is being prepared; assigns its xid if it had none.
    let full_xid = unsafe { pg_sys::GetTopFullTransactionId().value };
    let hold = PreparedHold {
        full_xid,
        min_id: bound,
    };
    add_hold(hold)?;
    wal::log_prepared_hold(&hold);
    Ok(())
}

/// Adds a replayed hold to the file (WAL redo: standby, or crash recovery).
fn redo_prepared_hold(hold: PreparedHold) -> errors::Result<()> {
    add_hold(hold)
}

/// Adds `hold` to the file: one appended line, fsync'd. The file is rewritten instead,
/// without the holds of ended transactions, the first time after a start (a crash may have
/// cut an append short) and whenever it has grown to twice its live holds
/// (`holds::needs_compaction`), so that it stays as small as what is in flight and each
/// hold costs one small write on average, on the primary and in replay alike.
fn add_hold(hold: PreparedHold) -> errors::Result<()> {
    let dir = server::data_dir();
    let mut state = PREPARED.exclusive();
    if state.loaded
        && state.appendable
        && !holds::needs_compaction(state.lines as usize, state.live as usize)
    {
        holds::append(&dir, &hold).map_err(|e| errors::prepared_file(&e, true))?;
        state.lines += 1;
        return Ok(());
    }
    let mut file = read(&mut state)?;
    file.retain_in_flight(in_flight);
    file.add(hold);
    store(&mut state, &file)
}

/// Reads the file, and notes what shared memory must know of it.
fn read(state: &mut PreparedState) -> errors::Result<PreparedHolds> {
    let file = holds::read(&server::data_dir()).map_err(|e| errors::prepared_file(&e, false))?;
    state.loaded = true;
    state.lines = file.lines as u32;
    state.appendable = file.appendable;
    Ok(file.holds)
}

/// Rewrites the file with exactly `file`'s holds.
fn store(state: &mut PreparedState, file: &PreparedHolds) -> errors::Result<()> {
    holds::write(&server::data_dir(), file).map_err(|e| errors::prepared_file(&e, true))?;
    state.lines = file.holds.len() as u32;
    state.live = state.lines;
    state.appendable = true;
    Ok(())
}

/// Whether the transaction is still in flight (prepared, or being prepared).
fn in_flight(full_xid: u64) -> bool {
    // SAFETY: plain calls; TransactionIdIsInProgress takes ProcArrayLock itself, and the
    // commit log is kept up to date by replay.
    unsafe {
        let next = pg_sys::ReadNextFullTransactionId().value;
        if full_xid >= next {
            return true;
        }
        // One that is 2^31 transactions old has certainly ended, whatever its 32-bit xid
        // says now.
        if next - full_xid >= 1 << 31 {
            return false;
        }
        let xid = pg_sys::TransactionId::from(full_xid as u32);
        if !pg_sys::RecoveryInProgress() {
            return pg_sys::TransactionIdIsInProgress(xid);
        }
        // In replay, the process array does not know prepared transactions (without
        // hot_standby): the commit log does. Older than the oldest xid it keeps means ended;
        // a transaction a crash cut short before its PREPARE stays until the promotion.
        !pg_sys::TransactionIdPrecedes(xid, oldest_xid())
            && !pg_sys::TransactionIdDidCommit(xid)
            && !pg_sys::TransactionIdDidAbort(xid)
    }
}

/// The oldest transaction id whose commit status is still kept.
fn oldest_xid() -> pg_sys::TransactionId {
    // SAFETY: shared memory set up at start; a 32-bit aligned read.
    unsafe {
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        let oldest = (*pg_sys::TransamVariables).oldestXid;
        #[cfg(not(any(feature = "pg17", feature = "pg18")))]
        let oldest = (*pg_sys::ShmemVariableCache).oldestXid;
        oldest
    }
}

/// The smallest bound of the prepared transactions still in flight; ended ones are dropped
/// from the file.
fn prepared_min() -> errors::Result<Option<i64>> {
    let mut state = PREPARED.exclusive();
    if state.loaded && state.lines == 0 {
        return Ok(None);
    }
    let mut file = read(&mut state)?;
    // Rewritten if a hold ended, or appears twice, or the last append was cut short.
    let duplicates = state.lines as usize != file.holds.len();
    if file.retain_in_flight(in_flight) || duplicates || !state.appendable {
        store(&mut state, &file)?;
    }
    Ok(file.min_id())
}

/// `snowflake_safe_upto()`, once the caller checked the configuration
/// (`lease::generation_config`).
pub(crate) fn safe_upto() -> errors::Result<i64> {
    let bound = {
        let shared = shmem::GENERATOR.share();
        shared
            .generator
            .next_id_floor(shared.node.datacenter_id, shared.node.worker_id)
    };
    let held = slots()
        .iter()
        .filter_map(|s| decode(s.load(Ordering::Acquire)))
        .min();
    let prepared = prepared_min()?;
    Ok(held.into_iter().chain(prepared).fold(bound, i64::min))
}
