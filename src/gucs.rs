//! The GUCs, and cached, validated views of them.
//!
//! All three are strings so that a malformed or out-of-range value in `postgresql.conf`
//! reaches [`crate::settings`] and makes generation refuse with an error naming the setting,
//! instead of PostgreSQL silently keeping the built-in default (an int GUC would).
//!
//! With `shared_preload_libraries` they are `PGC_POSTMASTER`: only `postgresql.conf` or
//! `ALTER SYSTEM` plus a restart change them. When the library is loaded later (CREATE
//! EXTENSION without preload), defining a `PGC_POSTMASTER` GUC would be FATAL, so they are
//! `PGC_SIGHUP` instead; sessions still cannot `SET` them, and generation is refused anyway.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;

use crate::layout::Epoch;
use crate::settings::{self, Config, SettingError};

static WORKER_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static DATACENTER_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"0"));
static EPOCH: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"2010-11-04 01:42:54.657+00"));

thread_local! {
    /// Per-backend cache of the parsed settings; cleared by the assign hooks.
    static CONFIG: RefCell<Option<Result<Config, SettingError>>> = const { RefCell::new(None) };
    static EPOCH_CACHE: RefCell<Option<Result<Epoch, SettingError>>> = const { RefCell::new(None) };
}

/// Registers the GUCs. `preloading` selects the context (see the module comment).
pub fn init(preloading: bool) {
    let context = || {
        if preloading {
            GucContext::Postmaster
        } else {
            GucContext::Sighup
        }
    };
    // SAFETY: the hooks cannot panic; they only clear per-backend caches.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake.worker_id",
            c"Worker id (0-31) stored in bits 12-16 of every ID this server generates.",
            c"Required: snowflake_next() refuses to run until it is set. Give every server that generates IDs its own worker/datacenter pair.",
            &WORKER_ID,
            context(),
            GucFlags::default(),
            None,
            Some(invalidate_caches),
            None,
        );
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake.datacenter_id",
            c"Datacenter id (0-31) stored in bits 17-21 of every ID this server generates.",
            c"Defaults to 0.",
            &DATACENTER_ID,
            context(),
            GucFlags::default(),
            None,
            Some(invalidate_caches),
            None,
        );
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake.epoch",
            c"Time that ID timestamp 0 stands for: an ISO-8601 timestamp with time zone, or Unix milliseconds.",
            c"Fixed for the lifetime of a cluster once the first ID is generated. Defaults to Twitter's epoch.",
            &EPOCH,
            context(),
            GucFlags::default(),
            None,
            Some(invalidate_caches),
            None,
        );
        reserve_prefix();
    }
}

#[cfg(any(feature = "pg13", feature = "pg14"))]
unsafe fn reserve_prefix() {
    unsafe { pg_sys::EmitWarningsOnPlaceholders(c"snowflake".as_ptr()) }
}

/// Warns about misspelt `snowflake.*` settings and refuses new ones in sessions.
#[cfg(not(any(feature = "pg13", feature = "pg14")))]
unsafe fn reserve_prefix() {
    unsafe { pg_sys::MarkGUCPrefixReserved(c"snowflake".as_ptr()) }
}

#[pg_guard]
unsafe extern "C-unwind" fn invalidate_caches(_newval: *const c_char, _extra: *mut c_void) {
    CONFIG.with(|c| c.borrow_mut().take());
    EPOCH_CACHE.with(|c| c.borrow_mut().take());
}

fn raw(setting: &GucSetting<Option<CString>>) -> Option<String> {
    setting
        .get()
        .map(|s| CStr::to_string_lossy(&s).into_owned())
}

/// The validated configuration for generation (cached per backend).
pub fn config() -> Result<Config, SettingError> {
    CONFIG.with(|cell| {
        cell.borrow_mut()
            .get_or_insert_with(|| {
                Config::parse(
                    raw(&WORKER_ID).as_deref(),
                    raw(&DATACENTER_ID).as_deref(),
                    raw(&EPOCH).as_deref(),
                )
            })
            .clone()
    })
}

/// The validated epoch alone, for the decode functions (which need no worker id).
pub fn epoch() -> Result<Epoch, SettingError> {
    EPOCH_CACHE.with(|cell| {
        cell.borrow_mut()
            .get_or_insert_with(|| settings::parse_epoch_setting(raw(&EPOCH).as_deref()))
            .clone()
    })
}
