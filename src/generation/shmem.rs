//! Shared memory: the generator state behind one LWLock, the durable-state bookkeeping
//! behind a second LWLock (held across file and WAL writes, so that I/O never happens under
//! the generator's lock), and lock-free counters.
//!
//! # Lock protocol
//! Four LWLocks, each in a tranche of its own (named as the statics below, and the
//! watermark's `snowflake_prepared`), and one rule for each:
//! - [`GENERATOR`]: the hot path's only lock. Held for one clock read, the state machine's
//!   arithmetic and the watermark slot's store; never across I/O, a sleep or a wait for
//!   standbys. Nothing else is acquired while it is held.
//! - [`DURABLE`]: serializes lease writes. Held across the state file's write and fsync and
//!   the WAL insert of a lease record, and across the origins file when origins are
//!   adopted; released before the wait for synchronous standbys. It comes **before**
//!   GENERATOR (`lease::ensure_loaded`, `lease::adopt_origins`): a holder of GENERATOR never
//!   asks for DURABLE.
//! - [`CLAIM`]: the registry worker's report of its claim. Never held with another lock:
//!   readers copy it out (`*CLAIM.share()`), the worker writes it between its requests.
//! - `snowflake_prepared` (`watermark.rs`): the prepared transactions' file, held across that
//!   file's I/O; never held with another lock.
//!
//! No lock is held across a registry request (the worker's requests run on a thread of
//! their own and touch shared memory only with the reply), a wait for the clock or a wait
//! for standbys. An ERROR under a lock is safe: PostgreSQL's abort releases every LWLock
//! (`LWLockReleaseAll`), and pgrx's guards are dropped as the error unwinds. [`COUNTERS`]
//! are atomics, read and written outside any lock; [`CLAIM_SIGNAL`] is a condition variable
//! (its own spinlock), broadcast with no lock held.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic, PgLwLock};

use snowflake_core::claim::{ClaimStatus, Fence};
use snowflake_core::durable::LeaseRecord;
use snowflake_core::generator::{Events, Generator};
use snowflake_core::layout::EpochMs;
use snowflake_core::ratelimit::RateLimiter;

/// Generator state shared by every backend of the server.
#[derive(Debug, Clone, Copy, Default)]
pub struct SharedGenerator {
    /// The state machine (with its lease end and event counters).
    pub generator: Generator,
    /// End LSN of the newest lease record, the one that made `generator`'s lease end
    /// durable (0: none, or no WAL on this major). Whoever wrote it, and whatever their
    /// `synchronous_commit`, a session that asks for synchronous standbys issues nothing
    /// until they have confirmed it.
    pub lease_lsn: u64,
    /// The highest lease LSN known to be confirmed at remote flush (the strongest level a
    /// lease waits for), so that the hot path skips the check once it holds.
    pub confirmed_lsn: u64,
    /// Event counters as of the last WARNING, to report what happened since.
    pub warned: Events,
    /// Event counters as of the last look at the rate limiter: it is consulted once per new
    /// event, not once per call (its clock read is the hot path's most expensive step).
    pub noticed: Events,
    /// Rate limit of the WARNINGs (monotonic clock).
    pub warnings: RateLimiter,
    /// The (datacenter, worker) pair in the IDs: from the settings, or the claimed one.
    pub node: Node,
    /// What the worker-id claim allows ([`Fence::UNLIMITED`] with a configured worker id).
    /// Checked when a lease is extended, which is the only way past the generator's lease.
    pub fence: Fence,
    /// Timestamp (since the epoch) above every ID an earlier holder of the claimed pair
    /// could have issued; re-applied when the generator is resumed. 0: none.
    pub claim_floor: EpochMs,
}

/// A (datacenter, worker) pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Node {
    /// Datacenter id.
    pub datacenter_id: u8,
    /// Worker id.
    pub worker_id: u8,
}

// SAFETY: plain `Copy` data without pointers.
unsafe impl PGRXSharedMemory for SharedGenerator {}

/// Durable-state bookkeeping shared by every backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct SharedDurable {
    /// The state file was read and the generator resumed since shared memory was set up.
    pub loaded: bool,
    /// Durable lease end (exclusive), as a timestamp since the epoch.
    pub lease_end: EpochMs,
    /// End LSN of the WAL record of that lease (0 if none).
    pub lease_lsn: u64,
    /// Lease extensions written since start.
    pub lease_writes: u64,
    /// The newest lease record written since start: written again, unchanged, when a
    /// synchronous standby must be given new WAL to confirm (see `wal::wait_for_confirmation`).
    pub last_record: Option<LeaseRecord>,
}

// SAFETY: plain `Copy` data without pointers.
unsafe impl PGRXSharedMemory for SharedDurable {}

/// Longest detail text kept for a claim's state.
pub const CLAIM_DETAIL_LEN: usize = 400;

/// The registry worker's view of its claim, for callers' errors and `snowflake_stats()`.
#[derive(Debug, Clone, Copy)]
pub struct SharedClaim {
    /// Where the claim stands.
    pub status: ClaimStatus,
    /// The held pair (meaningful while `status` is `Held`).
    pub node: Node,
    /// When the registry lets the claim go unless renewed (this server's clock, Unix ms).
    pub expires_unix_ms: i64,
    /// Why the status is what it is (UTF-8, `detail_len` bytes).
    pub detail: [u8; CLAIM_DETAIL_LEN],
    /// Bytes used in `detail`.
    pub detail_len: u16,
}

impl Default for SharedClaim {
    fn default() -> Self {
        SharedClaim {
            status: ClaimStatus::Starting,
            node: Node::default(),
            expires_unix_ms: 0,
            detail: [0; CLAIM_DETAIL_LEN],
            detail_len: 0,
        }
    }
}

impl SharedClaim {
    /// Sets the detail text (truncated at a character boundary).
    pub fn set_detail(&mut self, text: &str) {
        let mut end = text.len().min(CLAIM_DETAIL_LEN);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.detail[..end].copy_from_slice(&text.as_bytes()[..end]);
        self.detail_len = end as u16;
    }

    /// The detail text.
    pub fn detail(&self) -> String {
        String::from_utf8_lossy(&self.detail[..usize::from(self.detail_len)]).into_owned()
    }
}

// SAFETY: plain `Copy` data without pointers.
unsafe impl PGRXSharedMemory for SharedClaim {}

/// Counters updated outside any lock.
#[derive(Debug, Default)]
pub struct Counters {
    /// Times a caller slept for the clock.
    pub waits: AtomicU64,
    /// How long the last lease renewal took, from its clock reading to the moment its lease
    /// could be used (ms). The next lease is widened by twice this.
    pub last_renewal_ms: AtomicU64,
}

// SAFETY: atomics only.
unsafe impl PGRXSharedMemory for Counters {}

/// The generator. Hold it only for a clock read and the state machine's arithmetic.
// SAFETY: a name of its own; pgrx allocates the lock in `_PG_init` (`pg_shmem_init!`).
pub static GENERATOR: PgLwLock<SharedGenerator> = unsafe { PgLwLock::new(c"snowflake_generator") };

/// Durable state. May be held across file and WAL writes. Lock order: DURABLE, then GENERATOR.
// SAFETY: a name of its own; pgrx allocates the lock in `_PG_init` (`pg_shmem_init!`).
pub static DURABLE: PgLwLock<SharedDurable> = unsafe { PgLwLock::new(c"snowflake_durable") };

/// The claim's state, written by the registry worker. Never held with another lock.
// SAFETY: a name of its own; pgrx allocates the lock in `_PG_init` (`pg_shmem_init!`).
pub static CLAIM: PgLwLock<SharedClaim> = unsafe { PgLwLock::new(c"snowflake_claim") };

/// Lock-free counters.
// SAFETY: a name of its own; pgrx allocates it in `_PG_init` (`pg_shmem_init!`).
pub static COUNTERS: PgAtomic<Counters> = unsafe { PgAtomic::new(c"snowflake_counters") };

/// Wakes the callers that wait for the registry worker to move the claim's fence
/// (`lease::wait_for_claim`): the worker broadcasts whenever it installs a claim, stops the
/// generator or reports a new state. A PostgreSQL condition variable, so that a waiting
/// caller wakes when the claim changes instead of polling for it.
pub struct ClaimSignal(std::cell::UnsafeCell<pg_sys::ConditionVariable>);

impl Default for ClaimSignal {
    /// An initialized condition variable. `ConditionVariableInit` only sets a spinlock and
    /// an empty list of process numbers (no pointer into itself), so the value may be moved
    /// into shared memory after it.
    fn default() -> Self {
        let mut cv = std::mem::MaybeUninit::<pg_sys::ConditionVariable>::zeroed();
        // SAFETY: initializes the zeroed value in place; it touches nothing else.
        unsafe { pg_sys::ConditionVariableInit(cv.as_mut_ptr()) };
        // SAFETY: zeroed, then initialized by ConditionVariableInit just above.
        ClaimSignal(std::cell::UnsafeCell::new(unsafe { cv.assume_init() }))
    }
}

// SAFETY: a condition variable, made for shared memory; its own spinlock guards it.
unsafe impl PGRXSharedMemory for ClaimSignal {}

impl ClaimSignal {
    /// Wakes every waiting caller. Call with no lock held.
    pub fn broadcast(&self) {
        // SAFETY: a condition variable in shared memory, initialized at its creation.
        unsafe { pg_sys::ConditionVariableBroadcast(self.0.get()) }
    }

    /// Registers this process as a waiter before its first look at the claim, so that a
    /// broadcast between the look and [`ClaimWait::sleep`] is not lost. The registration
    /// ends when the guard is dropped (an ERROR ends it too: the transaction's abort
    /// cancels the sleep).
    pub fn prepare(&self) -> ClaimWait<'_> {
        // SAFETY: as in `broadcast`; a process waits on one condition variable at a time.
        unsafe { pg_sys::ConditionVariablePrepareToSleep(self.0.get()) };
        ClaimWait { signal: self }
    }
}

/// A caller registered on [`ClaimSignal`] ([`ClaimSignal::prepare`]).
pub struct ClaimWait<'a> {
    signal: &'a ClaimSignal,
}

impl ClaimWait<'_> {
    /// Sleeps until a broadcast or `timeout_ms` (at most a second); services interrupts (a
    /// cancel raises).
    pub fn sleep(&self, timeout_ms: u64) {
        let timeout = timeout_ms.clamp(1, 1_000) as std::ffi::c_long;
        // SAFETY: as in `broadcast`; the wait event is the extensions' own.
        unsafe {
            pg_sys::ConditionVariableTimedSleep(
                self.signal.0.get(),
                timeout,
                pg_sys::PG_WAIT_EXTENSION,
            )
        };
    }
}

impl Drop for ClaimWait<'_> {
    fn drop(&mut self) {
        // SAFETY: ends this process's registration, if any. (It returns whether the process
        // was woken from PostgreSQL 16 on, nothing before: not needed here.)
        unsafe { pg_sys::ConditionVariableCancelSleep() };
    }
}

/// The claim's condition variable (see [`ClaimSignal`]).
// SAFETY: a name of its own; pgrx allocates it in `_PG_init` (`pg_shmem_init!`).
pub static CLAIM_SIGNAL: PgAtomic<ClaimSignal> =
    unsafe { PgAtomic::new(c"snowflake_claim_signal") };

/// Set in `_PG_init` when loading from `shared_preload_libraries`; inherited by every
/// backend the postmaster forks. Without it the statics above point nowhere.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Requests shared memory and LWLocks. Call only while preloading.
pub fn init() {
    pg_shmem_init!(GENERATOR);
    pg_shmem_init!(DURABLE);
    pg_shmem_init!(COUNTERS);
    pg_shmem_init!(CLAIM);
    pg_shmem_init!(CLAIM_SIGNAL);
    PRELOADED.store(true, Ordering::Relaxed);
}

/// Whether the shared state exists in this server.
#[inline]
pub fn is_available() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}
