//! Waiting the PostgreSQL way: latch waits that end on postmaster death, show as wait event
//! `Extension` in `pg_stat_activity`, and let cancels and terminations through at once.
//! Also the monotonic clock, which a step of the wall clock does not move.

use pgrx::prelude::*;

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
