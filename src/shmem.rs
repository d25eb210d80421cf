//! Shared memory: the generator state behind one LWLock, the durable-state bookkeeping
//! behind a second LWLock (held across file and WAL writes, so that I/O never happens under
//! the generator's lock), and lock-free counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic, PgLwLock};

use crate::generator::{Events, Generator};
use crate::ratelimit::RateLimiter;

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
}

// SAFETY: plain `Copy` data without pointers.
unsafe impl PGRXSharedMemory for SharedGenerator {}

/// Durable-state bookkeeping shared by every backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct SharedDurable {
    /// The state file was read and the generator resumed since shared memory was set up.
    pub loaded: bool,
    /// Durable lease end (exclusive), as a timestamp since the epoch.
    pub lease_end: u64,
    /// End LSN of the WAL record of that lease (0 if none).
    pub lease_lsn: u64,
    /// Lease extensions written since start.
    pub lease_writes: u64,
}

// SAFETY: plain `Copy` data without pointers.
unsafe impl PGRXSharedMemory for SharedDurable {}

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
pub static GENERATOR: PgLwLock<SharedGenerator> = unsafe { PgLwLock::new(c"snowflake_generator") };

/// Durable state. May be held across file and WAL writes. Lock order: DURABLE, then GENERATOR.
pub static DURABLE: PgLwLock<SharedDurable> = unsafe { PgLwLock::new(c"snowflake_durable") };

/// Lock-free counters.
pub static COUNTERS: PgAtomic<Counters> = unsafe { PgAtomic::new(c"snowflake_counters") };

/// Set in `_PG_init` when loading from `shared_preload_libraries`; inherited by every
/// backend the postmaster forks. Without it the statics above point nowhere.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Requests shared memory and LWLocks. Call only while preloading.
pub fn init() {
    pg_shmem_init!(GENERATOR);
    pg_shmem_init!(DURABLE);
    pg_shmem_init!(COUNTERS);
    PRELOADED.store(true, Ordering::Relaxed);
}

/// Whether the shared state exists in this server.
#[inline]
pub fn is_available() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}
