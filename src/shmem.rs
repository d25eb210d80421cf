//! Shared memory: the generator state behind one LWLock, the durable-state bookkeeping
//! behind a second LWLock (held across file and WAL writes, so that I/O never happens under
//! the generator's lock), and lock-free counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic, PgLwLock};

use crate::generator::{Events, Generator};

/// Generator state shared by every backend of the server.
#[derive(Debug, Clone, Copy, Default)]
pub struct SharedGenerator {
    /// The state machine (with its lease end and event counters).
    pub generator: Generator,
    /// Event counters as of the last WARNING, to report what happened since.
    pub warned: Events,
    /// Unix ms of the last WARNING (rate limit).
    pub last_warning_unix_ms: i64,
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
