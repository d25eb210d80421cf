//! What every part of the extension asks of the server, below everything else (no module
//! here imports one outside it): its settings ([`gucs`]), its errors ([`errors`]: ereport
//! with SQLSTATE, DETAIL and HINT), text in the database's encoding ([`dbtext`]), datums
//! and composite rows ([`rows`]), and, here, the server
//! process itself: its data directory, the two clocks (the wall clock, which libfaketime and
//! NTP steps move, and the monotonic clock, which nothing moves), and waiting the PostgreSQL
//! way: latch waits that end on postmaster death, show as wait event `Extension` in
//! `pg_stat_activity`, and let cancels and terminations through at once. The functions
//! here import no other module of ours.

pub(crate) mod dbtext;
pub(crate) mod errors;
pub(crate) mod gucs;
pub(crate) mod rows;

use snowflake_core::mono::MonoMs;
use std::ffi::CStr;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use pgrx::prelude::*;

/// The data directory (every backend's working directory).
pub fn data_dir() -> PathBuf {
    // SAFETY: DataDir is set before any backend runs SQL and never changes afterwards.
    let dir = unsafe { CStr::from_ptr(pg_sys::DataDir) };
    PathBuf::from(dir.to_string_lossy().into_owned())
}

/// The wall clock in Unix milliseconds (`CLOCK_REALTIME`, which libfaketime can move).
#[inline]
pub fn now_unix_ms() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// Sleeps up to `ms` milliseconds (woken early by the latch), then services interrupts:
/// a cancel or `statement_timeout` raises PostgreSQL's own error there.
pub fn sleep_ms(ms: i64) {
    let events = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    // SAFETY: MyLatch is this backend's latch; WaitLatch/ResetLatch is the standard pattern.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            events as _,
            ms.max(1) as _,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}

/// Milliseconds of `CLOCK_MONOTONIC`: shared by every process of the machine, and never
/// moved by a step of the wall clock. For rate limits and durations.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000 + ts.tv_nsec as u64 / 1_000_000
}

/// The monotonic clock as an instant ([`MonoMs`]), for fences and quarantines.
pub fn mono_now() -> MonoMs {
    MonoMs(monotonic_ms())
}

/// This process's pseudo-random state (0: not seeded yet).
static RANDOM_STATE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A pseudo-random number below `span` (splitmix64, seeded per process from its pid and the
/// clock). Statistical spread only: nothing relies on it being unpredictable. Not `rand`'s
/// (linked through postgres-protocol): this runs on the hot path, in a few arithmetic steps.
pub fn random_below(span: u16) -> u16 {
    use std::sync::atomic::Ordering::Relaxed;
    let mut state = RANDOM_STATE.load(Relaxed);
    if state == 0 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        state = nanos ^ (u64::from(std::process::id()) << 32) | 1;
    }
    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    RANDOM_STATE.store(state, Relaxed);
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % u64::from(span.max(1))) as u16
}
