//! snowflake: Twitter-style Snowflake IDs generated inside PostgreSQL.
//!
//! Pure logic (no pgrx): [`layout`], [`settings`], [`generator`], [`durable`], [`foreign`],
//! [`ratelimit`]. Glue: [`gucs`] (settings), [`shmem`] (shared memory), [`errors`], `wal`
//! (the custom WAL resource manager and the wait for synchronous standbys), `waits` (latch
//! waits, the monotonic clock) and `api` (SQL functions).

use pgrx::prelude::*;

pub mod durable;
pub mod foreign;
pub mod generator;
pub mod layout;
pub mod ratelimit;
pub mod settings;

mod api;
pub mod errors;
pub mod gucs;
pub mod shmem;
mod waits;
mod wal;

#[cfg(any(test, feature = "pg_test"))]
mod tests;

::pgrx::pg_module_magic!();

/// Library entry point. Like pg_stat_statements, it sets up shared memory only while
/// preloading; loaded later (CREATE EXTENSION without preload), it registers the settings and
/// the decode functions work, while `snowflake_next()` raises an error with a HINT.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: a plain global read, set by the postmaster while it loads preload libraries.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    gucs::init(preloading);
    if preloading {
        shmem::init();
        wal::register(gucs::rmgr_id());
        warn_about_settings();
    }
}

/// Logs a WARNING at server start when the settings would make generation fail, so the
/// problem shows in the server log before the first `snowflake_next()` call.
fn warn_about_settings() {
    if let Err(e) = gucs::config() {
        let err = errors::setting(&e);
        err.warn();
    }
}

/// Settings for `cargo pgrx test`: preload the library and set a worker id.
#[cfg(test)]
pub mod pg_test {
    /// Per-test setup (none needed).
    pub fn setup(_options: Vec<&str>) {}

    /// Lines appended to the test cluster's postgresql.conf.
    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![
            "shared_preload_libraries = 'snowflake'",
            "snowflake.worker_id = 7",
            "snowflake.datacenter_id = 3",
        ]
    }
}
