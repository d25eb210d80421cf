//! Shared memory: the generator state behind one LWLock, and a second LWLock that serialises
//! writes of the durable state file (so file I/O never happens under the generator's lock).

use std::sync::atomic::{AtomicBool, Ordering};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};

use crate::generator::Generator;

/// Generator state shared by every backend of the server.
#[derive(Debug, Clone, Copy, Default)]
pub struct SharedGenerator {
    /// The state machine.
    pub generator: Generator,
}

// SAFETY: plain `Copy` data without pointers.
unsafe impl PGRXSharedMemory for SharedGenerator {}

/// Durable-state bookkeeping shared by every backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct SharedDurable {
    /// The layout record was checked (or written) since shared memory was initialised.
    pub layout_verified: bool,
}

// SAFETY: plain `Copy` data without pointers.
unsafe impl PGRXSharedMemory for SharedDurable {}

/// The generator. Hold it only for a clock read and the state machine's arithmetic.
pub static GENERATOR: PgLwLock<SharedGenerator> = unsafe { PgLwLock::new(c"snowflake_generator") };

/// Serialises reads and writes of the state file. May be held across file I/O.
pub static DURABLE: PgLwLock<SharedDurable> = unsafe { PgLwLock::new(c"snowflake_durable") };

/// Set in `_PG_init` when loading from `shared_preload_libraries`; inherited by every
/// backend the postmaster forks. Without it the locks above point nowhere.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Requests shared memory and LWLocks. Call only while preloading.
pub fn init() {
    pg_shmem_init!(GENERATOR);
    pg_shmem_init!(DURABLE);
    PRELOADED.store(true, Ordering::Relaxed);
}

/// Whether the shared state exists in this server.
#[inline]
pub fn is_available() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}
