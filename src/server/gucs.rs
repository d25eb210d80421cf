//! The GUCs, and validated views of them: the server-start settings parsed once at preload.
//!
//! The settings that decide uniqueness are strings so that a malformed or out-of-range value
//! in `postgresql.conf` reaches [`snowflake_core::settings`] and makes generation refuse with an error
//! naming the setting, instead of PostgreSQL silently keeping the built-in default (an int
//! GUC would). The integer and enum settings are PostgreSQL's own types; a value PostgreSQL
//! rejects at server start is remembered and refuses generation too ([`rejected_at_start`]).
//!
//! With `shared_preload_libraries` they are `PGC_POSTMASTER`: only `postgresql.conf` or
//! `ALTER SYSTEM` plus a restart change them. When the library is loaded later (CREATE
//! EXTENSION without preload), defining a `PGC_POSTMASTER` GUC would be FATAL, so they are
//! `PGC_SIGHUP` instead; sessions still cannot `SET` them, generation is refused anyway, and
//! decoding does not read them (see `decode::epoch`).

use std::cell::RefCell;
use std::ffi::{c_void, CStr, CString};
use std::sync::OnceLock;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};
use pgrx::prelude::*;

use snowflake_core::generator::ClockPolicy;
use snowflake_core::layout::Epoch;
use snowflake_core::settings::{self, Config, SettingError};

/// What `snowflake_next()` does when the clock is further behind the ID clock than
/// `snowflake.max_clock_drift` allows.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClockBehindAction {
    /// Raise an error (SQLSTATE 58000); nothing is issued.
    #[name = c"error"]
    Error,
    /// Sleep (without holding any lock) until the clock is close enough, up to
    /// `snowflake.max_clock_wait`; then raise the error.
    #[name = c"wait"]
    Wait,
}

/// Which sequence number a new millisecond starts at (`snowflake.sequence_start`).
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum SequenceStart {
    /// 0, as Twitter's generator: at low traffic every ID is even.
    #[name = c"zero"]
    Zero,
    /// A random number below 256, so that `id % n` spreads evenly at low traffic.
    #[name = c"random"]
    Random,
}

/// Default of `snowflake.rmgr_id`, the custom WAL resource manager id (see docs/configuration.md).
pub const DEFAULT_RMGR_ID: i32 = 182;

static MAX_CLOCK_DRIFT: GucSetting<i32> =
    GucSetting::<i32>::new(settings::DEFAULT_MAX_CLOCK_DRIFT_MS as i32);
static CLOCK_BEHIND_ACTION: GucSetting<ClockBehindAction> =
    GucSetting::<ClockBehindAction>::new(ClockBehindAction::Error);
static SEQUENCE_START: GucSetting<SequenceStart> =
    GucSetting::<SequenceStart>::new(SequenceStart::Zero);
static MAX_CLOCK_WAIT: GucSetting<i32> =
    GucSetting::<i32>::new(settings::DEFAULT_MAX_CLOCK_WAIT_MS as i32);
static LEASE_WINDOW: GucSetting<i32> =
    GucSetting::<i32>::new(settings::DEFAULT_LEASE_WINDOW_MS as i32);
static RMGR_ID: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_RMGR_ID);
static WARNING_INTERVAL: GucSetting<i32> =
    GucSetting::<i32>::new(settings::DEFAULT_WARNING_INTERVAL_MS as i32);

static WORKER_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static DATACENTER_ID: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(settings::DEFAULT_DATACENTER_ID));
static REGISTRY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static REGISTRY_CA_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static REGISTRY_PASSWORD_FILE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);
static CLAIM_TTL: GucSetting<i32> =
    GucSetting::<i32>::new(snowflake_core::claim::DEFAULT_CLAIM_TTL_MS as i32);
static EPOCH: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(settings::DEFAULT_EPOCH));

/// The server-start settings, parsed once in the postmaster while it preloads the library
/// (they are `PGC_POSTMASTER`, so nothing changes them until a restart). Backends inherit
/// it at fork. Unset when the library was loaded without preload.
static AT_START: OnceLock<AtStart> = OnceLock::new();

/// The parsed server-start settings.
struct AtStart {
    config: Result<Config, SettingError>,
    epoch: Result<Epoch, SettingError>,
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
    // The string settings have no hooks: the library, not PostgreSQL, checks their values
    // (see the module comment).
    type StringSetting = (
        &'static CStr,
        &'static CStr,
        &'static CStr,
        &'static GucSetting<Option<CString>>,
        GucFlags,
    );
    let strings: [StringSetting; 6] = [
        (
            c"snowflake.worker_id",
            c"Worker id (0-31) stored in bits 12-16 of every ID this server generates, or auto.",
            c"Required: snowflake_next() refuses to run until it is set. Give every server that generates IDs its own worker/datacenter pair, or set auto to claim one from snowflake.registry.",
            &WORKER_ID,
            GucFlags::default(),
        ),
        (
            c"snowflake.datacenter_id",
            c"Datacenter id (0-31) stored in bits 17-21 of every ID this server generates.",
            c"Defaults to 0.",
            &DATACENTER_ID,
            GucFlags::default(),
        ),
        (
            c"snowflake.epoch",
            c"Time that ID timestamp 0 stands for: an ISO-8601 timestamp with time zone, or Unix milliseconds.",
            c"Set it before CREATE EXTENSION: each database records the epoch in force then, and the data directory at the first ID; neither may change while IDs exist. Defaults to Twitter's epoch.",
            &EPOCH,
            GucFlags::default(),
        ),
        (
            c"snowflake.registry",
            c"Registry that hands out worker ids when snowflake.worker_id = auto: redis[s]://HOST:PORT[/DB], redis[s]+sentinel://HOST:PORT[,...]/MASTER[/DB], postgresql://USER@HOST:PORT[,...]/DB or etcd[s]://HOST:PORT[,...][/PREFIX].",
            c"Only superusers can read it (it may hold a password; snowflake.registry_password_file keeps it out).",
            &REGISTRY,
            GucFlags::SUPERUSER_ONLY,
        ),
        (
            c"snowflake.registry_ca_file",
            c"CA certificates (PEM) that TLS connections to the registry trust, all of them and no others: rediss://, rediss+sentinel://, etcds://, and the coordinator without sslrootcert (its sslmode=require then checks the CA, as verify-ca).",
            c"Empty: the system's trusted certificates.",
            &REGISTRY_CA_FILE,
            GucFlags::SUPERUSER_ONLY,
        ),
        (
            c"snowflake.registry_password_file",
            c"File holding the registry's password, so that snowflake.registry need not: its first line for Redis, Sentinel and etcd, .pgpass lines for a PostgreSQL coordinator.",
            c"It must be private: the server's OS user's with no group or other access (0600), or root's with at most group read (0640).",
            &REGISTRY_PASSWORD_FILE,
            GucFlags::SUPERUSER_ONLY,
        ),
    ];
    for (name, short, long, cell, flags) in strings {
        GucRegistry::define_string_guc(name, short, long, cell, context(), flags);
    }
    let placeholders = CHECKED_BY_POSTGRES.map(placeholder_value);
    // SAFETY: the hooks cannot panic; they only clear per-backend caches or flags.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            CHECKED_BY_POSTGRES[CLAIM_TTL_SLOT],
            c"How long the registry keeps a worker id claim after its last renewal.",
            c"The claim is renewed every fifth of this; a server that cannot renew stops issuing IDs half of it after its last renewal.",
            &CLAIM_TTL,
            snowflake_core::claim::MIN_CLAIM_TTL_MS as i32,
            snowflake_core::claim::MAX_CLAIM_TTL_MS as i32,
            context(),
            GucFlags::UNIT_MS,
            None,
            Some(accepted::<CLAIM_TTL_SLOT>),
            None,
        );
        define_policy_gucs(preloading);
        reserve_prefix();
    }
    note_rejected_at_start(&placeholders);
    if preloading {
        let worker_id = raw(&WORKER_ID);
        let datacenter_id = raw(&DATACENTER_ID);
        let epoch = raw(&EPOCH);
        let registry = raw(&REGISTRY);
        let _ = AT_START.set(AtStart {
            config: Config::parse(
                worker_id.as_deref(),
                datacenter_id.as_deref(),
                epoch.as_deref(),
                registry.as_deref(),
            ),
            epoch: settings::parse_epoch_setting(epoch.as_deref()),
        });
    }
}

/// # Safety
/// Called from `init` only (GUC definition at library load).
unsafe fn define_policy_gucs(preloading: bool) {
    let ms = GucFlags::UNIT_MS;
    let name = |slot: usize| CHECKED_BY_POSTGRES[slot];
    // SAFETY: the assign hook cannot panic (see `accepted`).
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            name(MAX_CLOCK_DRIFT_SLOT),
            c"Largest lead of the ID clock over the wall clock.",
            c"Steps back of the clock and bursts above 4,096 IDs per millisecond are absorbed by running the ID clock ahead of the wall clock, up to this much. 0 is strict Twitter behaviour.",
            &MAX_CLOCK_DRIFT,
            0,
            3_600_000,
            GucContext::Sighup,
            ms,
            None,
            Some(accepted::<MAX_CLOCK_DRIFT_SLOT>),
            None,
        );
        GucRegistry::define_enum_guc_with_hooks(
            name(CLOCK_BEHIND_ACTION_SLOT),
            c"What to do when the clock is further behind than snowflake.max_clock_drift: error or wait.",
            c"error raises SQLSTATE 58000 and issues nothing; wait sleeps (holding no lock) up to snowflake.max_clock_wait, then raises the error.",
            &CLOCK_BEHIND_ACTION,
            GucContext::Sighup,
            GucFlags::default(),
            None,
            Some(accepted::<CLOCK_BEHIND_ACTION_SLOT>),
            None,
        );
        GucRegistry::define_enum_guc_with_hooks(
            name(SEQUENCE_START_SLOT),
            c"Sequence number each new millisecond starts at: zero or random.",
            c"zero is Twitter's behaviour (at low traffic every ID is even); random starts each millisecond at a random number below 256, so that id % n spreads evenly, at the cost of up to 255 of the 4,096 IDs of a saturated millisecond.",
            &SEQUENCE_START,
            GucContext::Sighup,
            GucFlags::default(),
            None,
            Some(accepted::<SEQUENCE_START_SLOT>),
            None,
        );
        GucRegistry::define_int_guc_with_hooks(
            name(MAX_CLOCK_WAIT_SLOT),
            c"Longest wait for the clock when snowflake.clock_behind_action = wait.",
            c"",
            &MAX_CLOCK_WAIT,
            1,
            3_600_000,
            GucContext::Sighup,
            ms,
            None,
            Some(accepted::<MAX_CLOCK_WAIT_SLOT>),
            None,
        );
        GucRegistry::define_int_guc_with_hooks(
            name(LEASE_WINDOW_SLOT),
            c"How far ahead each durable lease reaches.",
            c"Before issuing an ID beyond the durable lease, the lease is extended by this much and written to disk and WAL. Larger: fewer writes; the IDs after a crash restart jump ahead by up to this much.",
            &LEASE_WINDOW,
            1,
            3_600_000,
            GucContext::Sighup,
            ms,
            None,
            Some(accepted::<LEASE_WINDOW_SLOT>),
            None,
        );
        GucRegistry::define_int_guc_with_hooks(
            name(WARNING_INTERVAL_SLOT),
            c"Shortest interval between two WARNINGs about clock steps and exhausted milliseconds.",
            c"The events are counted in snowflake_stats() whatever this is.",
            &WARNING_INTERVAL,
            0,
            i32::MAX,
            GucContext::Sighup,
            ms,
            None,
            Some(accepted::<WARNING_INTERVAL_SLOT>),
            None,
        );
        GucRegistry::define_int_guc_with_hooks(
            name(RMGR_ID_SLOT),
            c"Custom WAL resource manager id used for lease records (128-255).",
            c"Change it only if another extension uses the same id, and only after a clean shutdown.",
            &RMGR_ID,
            128,
            255,
            if preloading {
                GucContext::Postmaster
            } else {
                GucContext::Sighup
            },
            GucFlags::default(),
            None,
            Some(accepted::<RMGR_ID_SLOT>),
            None,
        );
    }
}

/// The integer and enum settings, which PostgreSQL parses itself. A malformed value in
/// `postgresql.conf` at server start only gets a WARNING from PostgreSQL, which then keeps
/// the built-in default; generation refuses instead (see [`rejected_at_start`]). On a
/// reload PostgreSQL keeps the last good value and logs the bad one, so only the start
/// needs this. Indexed by the `*_SLOT` constants.
const CHECKED_BY_POSTGRES: [&CStr; CHECKED_COUNT] = [
    c"snowflake.claim_ttl",
    c"snowflake.max_clock_drift",
    c"snowflake.clock_behind_action",
    c"snowflake.max_clock_wait",
    c"snowflake.lease_window",
    c"snowflake.warning_interval",
    c"snowflake.rmgr_id",
    c"snowflake.sequence_start",
];
/// How many settings [`CHECKED_BY_POSTGRES`] lists (and slots in `REJECTED`).
const CHECKED_COUNT: usize = 8;
const CLAIM_TTL_SLOT: usize = 0;
const MAX_CLOCK_DRIFT_SLOT: usize = 1;
const CLOCK_BEHIND_ACTION_SLOT: usize = 2;
const MAX_CLOCK_WAIT_SLOT: usize = 3;
const LEASE_WINDOW_SLOT: usize = 4;
const WARNING_INTERVAL_SLOT: usize = 5;
const RMGR_ID_SLOT: usize = 6;
const SEQUENCE_START_SLOT: usize = 7;

thread_local! {
    /// Per slot: the value PostgreSQL rejected at server start, until a later value is
    /// accepted. Set in the postmaster; backends inherit it at fork.
    static REJECTED: RefCell<[Option<String>; CHECKED_COUNT]> =
        const { RefCell::new([const { None }; CHECKED_COUNT]) };
}

/// The value set for `name` in the configuration before the library defined it (a
/// placeholder), if any.
fn placeholder_value(name: &CStr) -> Option<String> {
    // SAFETY: a lookup by name; missing_ok, so an unknown name gives NULL instead of ERROR.
    let value = unsafe { pg_sys::GetConfigOption(name.as_ptr(), true, false) };
    (!value.is_null())
        // SAFETY: GetConfigOption returns a NUL-terminated string owned by the GUC system.
        .then(|| {
            // SAFETY: GetConfigOption returned a NUL-terminated string (not NULL: checked)
            // owned by the GUC system, copied here before anything can change it.
            unsafe { CStr::from_ptr(value) }
                .to_string_lossy()
                .into_owned()
        })
}

/// After definition: remembers each configured value that PostgreSQL's own parser rejects
/// (checked again with `changeVal = false`, which validates without assigning or logging).
fn note_rejected_at_start(placeholders: &[Option<String>; CHECKED_COUNT]) {
    for (slot, value) in placeholders.iter().enumerate() {
        let Some(value) = value else { continue };
        let Ok(c_value) = CString::new(value.as_str()) else {
            continue;
        };
        // SAFETY: validates a value for a defined variable; with elevel DEBUG5 a bad value
        // returns 0 instead of raising an error. A valid one returns -1 ("not applied",
        // as changeVal is false).
        let outcome = unsafe {
            pg_sys::set_config_option(
                CHECKED_BY_POSTGRES[slot].as_ptr(),
                c_value.as_ptr(),
                pg_sys::GucContext::PGC_POSTMASTER,
                pg_sys::GucSource::PGC_S_FILE,
                pg_sys::GucAction::GUC_ACTION_SET,
                false,
                pg_sys::DEBUG5 as i32,
                false,
            )
        };
        if outcome == 0 {
            set_rejected(slot, Some(value.clone()));
        }
    }
}

/// Records (or, with `None`, forgets) the rejected value of the setting in `slot`. Cannot
/// panic: the assign hook calls it.
fn set_rejected(slot: usize, value: Option<String>) {
    REJECTED.with(|r| {
        if let Ok(mut r) = r.try_borrow_mut() {
            r[slot] = value;
        }
    });
}

/// Assign hook: a value of the setting in `SLOT` was accepted (a reload brought a good one),
/// so an earlier rejection no longer stands. Cannot panic.
unsafe extern "C-unwind" fn accepted<const SLOT: usize>(_newval: i32, _extra: *mut c_void) {
    set_rejected(SLOT, None);
}

/// The first integer or enum setting whose configured value PostgreSQL rejected at server
/// start and that no accepted value has replaced since.
pub fn rejected_at_start() -> Option<SettingError> {
    REJECTED.with(|r| {
        let r = r.borrow();
        r.iter().enumerate().find_map(|(slot, value)| {
            value.as_ref().map(|value| SettingError::RejectedAtStart {
                name: setting_name(CHECKED_BY_POSTGRES[slot]),
                value: value.clone(),
            })
        })
    })
}

fn setting_name(name: &'static CStr) -> &'static str {
    name.to_str().unwrap_or("snowflake")
}

/// The clock policy from the settings (cheap: reads three integers).
#[inline]
pub fn clock_policy() -> ClockPolicy {
    let max_wait_ms = match CLOCK_BEHIND_ACTION.get() {
        // Only the 1 ms needed to finish an exhausted millisecond at the drift bound.
        ClockBehindAction::Error => 1,
        ClockBehindAction::Wait => MAX_CLOCK_WAIT.get() as u64,
    };
    ClockPolicy {
        max_drift_ms: MAX_CLOCK_DRIFT.get() as u64,
        max_wait_ms,
        first_sequence: 0,
    }
}

/// How far ahead of this server's clock a claimed worker id's floor may be and still be
/// used: `snowflake.max_clock_drift` + `snowflake.max_clock_wait` (whatever
/// `clock_behind_action` says: a claim's floor is waited for like a restart's).
pub fn usable_floor_lead_ms() -> i64 {
    snowflake_core::claim::ClaimTiming::usable_floor_lead_ms(
        MAX_CLOCK_DRIFT.get() as u64,
        MAX_CLOCK_WAIT.get() as u64,
    )
}

/// `snowflake.sequence_start` is `random`.
#[inline]
pub fn random_sequence_start() -> bool {
    SEQUENCE_START.get() == SequenceStart::Random
}

/// `snowflake.lease_window` in ms.
#[inline]
pub fn lease_window_ms() -> u64 {
    LEASE_WINDOW.get() as u64
}

/// `snowflake.warning_interval` in ms.
#[inline]
pub fn warning_interval_ms() -> i64 {
    i64::from(WARNING_INTERVAL.get())
}

/// `snowflake.rmgr_id`.
pub fn rmgr_id() -> u8 {
    RMGR_ID.get() as u8
}

#[cfg(any(feature = "pg13", feature = "pg14"))]
unsafe fn reserve_prefix() {
    // SAFETY: a static NUL-terminated prefix; called from `_PG_init` only.
    unsafe { pg_sys::EmitWarningsOnPlaceholders(c"snowflake".as_ptr()) }
}

/// Warns about misspelt `snowflake.*` settings and refuses new ones in sessions.
#[cfg(not(any(feature = "pg13", feature = "pg14")))]
unsafe fn reserve_prefix() {
    // SAFETY: a static NUL-terminated prefix; called from `_PG_init` only.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"snowflake".as_ptr()) }
}

fn raw(setting: &GucSetting<Option<CString>>) -> Option<String> {
    setting
        .get()
        .map(|s| CStr::to_string_lossy(&s).into_owned())
}

/// The validated configuration for generation, as parsed at server start. `None` without
/// preload (generation refuses before it asks).
pub fn config() -> Option<Result<Config, SettingError>> {
    AT_START.get().map(|at_start| at_start.config.clone())
}

/// `snowflake.registry` as configured (None: unset or empty).
pub fn registry() -> Option<String> {
    raw(&REGISTRY)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// `snowflake.registry_ca_file` (None: unset or empty).
pub fn registry_ca_file() -> Option<String> {
    raw(&REGISTRY_CA_FILE)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// `snowflake.registry_password_file` (None: unset or empty).
pub fn registry_password_file() -> Option<String> {
    raw(&REGISTRY_PASSWORD_FILE)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The claim timing from `snowflake.claim_ttl`.
pub fn claim_timing() -> snowflake_core::claim::ClaimTiming {
    snowflake_core::claim::ClaimTiming::new(CLAIM_TTL.get() as u64)
}

/// The validated epoch alone, as parsed at server start, for the decode functions (which
/// need no worker id). `None` without preload: then no setting decides how IDs decode (a
/// reload could change it under an IMMUTABLE function); see `decode::epoch`.
pub fn epoch() -> Option<Result<Epoch, SettingError>> {
    AT_START.get().map(|at_start| at_start.epoch.clone())
}

/// Whether the current role may see `snowflake.registry` and what the registry said: a
/// superuser or a member of `pg_read_all_settings`, PostgreSQL's own rule for a
/// superuser-only setting. Other roles see which kind of registry it is and the claim's
/// state, never its hosts, its users or a registry's own text (which may name other
/// servers and their claim tokens).
pub fn caller_may_read_registry() -> bool {
    // SAFETY: plain catalog lookups of the current user, in a backend.
    unsafe {
        pg_sys::superuser()
            || pg_sys::has_privs_of_role(
                pg_sys::GetUserId(),
                pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_SETTINGS),
            )
    }
}

/// `snowflake.registry` as the current role may see it: the redacted URI
/// (`scheme://[user@]hosts[/database]`) for a role that may read the setting, and only its
/// scheme (`redis://…`) for any other.
pub fn registry_for_caller() -> Option<String> {
    let uri = registry()?;
    if caller_may_read_registry() {
        return Some(snowflake_core::secrets::redacted(&uri));
    }
    Some(snowflake_core::secrets::scheme_only(&uri))
}
