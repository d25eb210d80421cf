//! snowflake: Twitter-style Snowflake IDs generated inside PostgreSQL.
//!
//! The pure logic lives in the `snowflake-core` crate (no pgrx). This crate is the glue,
//! grouped by concern:
//! - [`functions`]: what SQL calls (the functions, thin; decoding, stats, datum helpers);
//! - [`generation`]: issuing IDs and keeping them durable (the driver, the lease, shared
//!   memory, the WAL resource manager, the commit-order watermark, promotions, origins);
//! - [`fleet`]: the worker-id registry's background worker and its clients;
//! - [`server`]: what every part asks of the server: settings, errors, the data directory,
//!   clocks and waits.
//!
//! See docs/architecture.md.

use generation::{shmem, wal, watermark};
use pgrx::prelude::*;
use server::{errors, gucs};
use snowflake_core::settings;

mod fleet;
mod functions;
mod generation;
mod server;

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
    quiet_rust_backtraces();
    gucs::init(preloading);
    if preloading {
        shmem::init();
        watermark::init();
        wal::register(gucs::rmgr_id());
        warn_about_settings();
        if let Some(Ok(config)) = gucs::config() {
            fleet::register(&config);
        }
    }
}

/// PostgreSQL errors raised inside our Rust frames (a cancel during a wait, for instance)
/// pass through pgrx's panic hook, which puts a Rust backtrace into the error's DETAIL when
/// the server's environment has `RUST_BACKTRACE` set. Users must see exactly PostgreSQL's own
/// messages, so library backtraces are off unless `RUST_LIB_BACKTRACE` asks for them. Set
/// while the postmaster (or this backend) is still single-threaded; backends inherit it.
fn quiet_rust_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
}

/// Logs a WARNING at server start when the settings would make generation fail, so the
/// problem shows in the server log before the first `snowflake_next()` call.
fn warn_about_settings() {
    if let Some(rejected) = gucs::rejected_at_start() {
        errors::setting(&rejected).into_warning().write();
    }
    if gucs::registry().is_some_and(|uri| snowflake_core::secrets::holds_password(&uri)) {
        errors::registry_password_in_setting().write();
    }
    match gucs::config() {
        None => {}
        Some(Err(e)) => errors::setting(&e).into_warning().write(),
        Some(Ok(config)) => {
            if let settings::WorkerId::Fixed(worker_id) = config.worker_id {
                if gucs::registry().is_some() {
                    errors::registry_unused(worker_id).write();
                }
            }
        }
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
