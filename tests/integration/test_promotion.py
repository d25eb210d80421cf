"""Promotion and replication without needless waits: a synchronous session after
`synchronous_standby_names` was cleared and set again, a standby replaying thousands of
prepared transactions, a switchover after a clean shutdown, an unclean failover, and a standby promoted before
it received the old primary's first lease record.

Every fault is real: WAL receivers frozen with SIGSTOP and killed with SIGKILL, primaries
stopped with `pg_ctl stop -m fast` or `-m immediate`, `synchronous_standby_names` changed
with ALTER SYSTEM and a reload. Measured figures are printed to stderr.
"""

import os
import signal
import sys
import time
import unittest

import psycopg

from harness import (HANG_GUARD, BatchClient, assert_live, report_figure, timed_one,
                     wait_until)
from fixtures.clusters import start_pair


def note(text):
    print(f"\n    [{text}]", file=sys.stderr, flush=True)


def set_sync_names(primary, names):
    """ALTER SYSTEM SET synchronous_standby_names, reloaded, and waits until
    pg_stat_replication shows the standby in the state that follows ('sync' or 'async')."""
    primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
    primary.reload_conf()
    state = "sync" if names else "async"
    wait_until(lambda: primary.one("SELECT sync_state FROM pg_stat_replication") == state,
               what=f"sync_state = {state}")


def file_size(path):
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def kill_walreceiver_and_wait(standby, pid):
    """SIGKILLs a (frozen) WAL receiver; the postmaster treats it as a crash: it reinitialises
    shared memory and the standby stays in recovery. Waits until it accepts connections."""
    os.kill(pid, signal.SIGKILL)
    # Gone from /proc once the postmaster has reaped it (and so started its crash handling).
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), what="the WAL receiver reaped")
    wait_until(lambda: standby.one("SELECT pg_is_in_recovery()"), what="the standby back")


def timed_first_id(test, pg, timeout=f"{HANG_GUARD}s"):
    """snowflake_next() on a new session (see timed_one). Returns (id, seconds, started). The
    statement_timeout only guards against a hang: how long it took is asserted with a
    liveness bound (assert_live)."""
    started = time.monotonic()
    value, took = timed_one(test, pg, "SELECT snowflake_next()", timeout)
    return value, took, started


class SynchronousStall(unittest.TestCase):
    """A lease record written while the standby was asynchronous must not make a synchronous
    session wait for a confirmation that only the standby's next status report brings."""

    def test_sync_session_after_names_cleared_and_set_again(self):
        """Reproduces: an asynchronous session (synchronous_commit = local) writes lease
        records while `synchronous_standby_names` is empty; the standby receives and flushes
        them, but as an asynchronous standby its reports move no synchronous position. The
        names are set again; nothing else writes WAL (autovacuum off). A synchronous session
        then needs the newest lease record confirmed, and the standby, with nothing new to
        receive, reports again only after `wal_receiver_status_interval` (10 s).
        Acceptance: 20,000 IDs in one statement succeed, within a liveness bound (nothing to
        wait for in the settings, plus the margin scaled by the measured scheduling delay:
        docs/testing.md#timing-in-the-tests); the stall waited for the 10 s status report.
        Fault used: ALTER SYSTEM SET synchronous_standby_names = '' / '*' with reloads."""
        primary, standby = start_pair(self, "stall", 26, sync=True,
                                      snowflake__lease_window="'1ms'")
        self.assertEqual(standby.one("SHOW wal_receiver_status_interval"), "10s")
        primary.one("SELECT snowflake_next()")  # a lease the synchronous standby confirmed
        set_sync_names(primary, "")
        before = primary.stats()["lease_writes"]
        with primary.connect() as conn:
            conn.execute("SET synchronous_commit = local")
            for _ in range(20):
                conn.execute("SELECT snowflake_next()")
                time.sleep(0.01)  # past the 1 ms lease: every call writes a lease record
        self.assertGreater(primary.stats()["lease_writes"] - before, 5)
        standby.wait_replayed(primary)  # the standby flushed (and reported) the records
        set_sync_names(primary, "*")
        started = time.monotonic()
        count, took = timed_one(self, primary, "SELECT count(*) FROM (SELECT snowflake_next()"
                                " FROM generate_series(1, 20000)) s", f"{HANG_GUARD}s")
        self.assertEqual(count, 20000)
        assert_live(self, took, 0.0, started, "20,000 IDs in the synchronous session")


class PreparedHolds(unittest.TestCase):
    """A standby replays the holds of prepared transactions that have ended on the primary."""

    N = 3000

    def test_standby_file_stays_small_and_replay_keeps_up(self):
        """Reproduces: N = 3,000 transactions, each `BEGIN; SELECT snowflake_next(); PREPARE
        TRANSACTION` and then `COMMIT PREPARED`, on a primary with an asynchronous standby.
        The primary drops ended holds from its `snowflake.prepared`; the standby adds one hold
        per PREPARED_HOLD record and never drops it, rewriting (and fsyncing) an ever larger
        file at each one: N entries at the end, and a replay cost per record that grows with
        N (with one client connection the standby still kept up at N = 3,000 and 8,000 on
        the machine this was written on; with four, it fell 5 s behind at 8,000 and 38 s at
        12,000).
        Acceptance: its `snowflake.prepared` is no larger than max(the primary's, 4096
        bytes) (sizes, not entries: the file format may change). How long the standby took
        to catch up after the primary's last COMMIT PREPARED is a reported figure (it
        measures the machine's load as much as the replay; docs/testing.md#timing-in-the-tests).
        Fault used: none beyond load; a real streaming standby and real prepared
        transactions (max_prepared_transactions = 100 on both)."""
        primary, standby = start_pair(self, "holds", 27, max_prepared_transactions="100")
        self.assertEqual(standby.one("SHOW max_prepared_transactions"), "100")
        with primary.connect() as conn:
            started = time.monotonic()
            for i in range(self.N):
                conn.execute("BEGIN")
                conn.execute("SELECT snowflake_next()")
                conn.execute(f"PREPARE TRANSACTION 'p{i}'")
                conn.execute(f"COMMIT PREPARED 'p{i}'")
            loop_s = time.monotonic() - started
        finished = time.monotonic()
        target, lag_bytes = primary.sql(
            "SELECT pg_current_wal_flush_lsn()::text,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) FROM pg_stat_replication")[0]
        wait_until(lambda: standby.one("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                       (target,)), what="the standby's replay to catch up")
        caught_up = time.monotonic() - finished
        primary_size = file_size(os.path.join(primary.data, "snowflake.prepared"))
        standby_size = file_size(os.path.join(standby.data, "snowflake.prepared"))
        figures = (f"primary: {self.N} pairs in {loop_s:.1f} s ({self.N / loop_s:.0f} pairs/s);"
                   f" replay lag right after: {int(lag_bytes or 0)} bytes;"
                   f" caught up after: {caught_up:.2f} s;"
                   f" snowflake.prepared: primary {primary_size} bytes,"
                   f" standby {standby_size} bytes")
        report_figure("standby replay of 3,000 prepared transactions", figures)
        self.assertLessEqual(standby_size, max(primary_size, 4096), figures)


class Promotion(unittest.TestCase):
    """A promoted standby issues at once, above every ID its old primary issued."""

    def test_clean_switchover_with_a_minute_of_drift_issues_at_once(self):
        """Reproduces: a primary with max_clock_drift = 1min is stopped cleanly (`pg_ctl stop
        -m fast`: its standby receives everything, the shutdown checkpoint included) and the
        standby is promoted. The promoted node treats it as the loss of a primary and resumes
        past `max_clock_drift + 2 × lease_window` ahead of its clock, which is more than it
        may run ahead: with clock_behind_action = error it refuses (58000 `cannot issue
        snowflake IDs for another N ms after promotion`).
        Acceptance: the first snowflake_next() on the promoted node succeeds at once (a
        liveness bound: nothing to wait for in the settings, plus the margin scaled by the
        measured scheduling delay) and is above every ID the old primary issued.
        Fault used: a planned switchover (stop -m fast, then promote)."""
        primary, standby = start_pair(self, "switch", 28,
                                      snowflake__max_clock_drift="'1min'",
                                      snowflake__clock_behind_action="'error'")
        issued = []
        for _ in range(10):
            issued.append(primary.one("SELECT max(x) FROM unnest(snowflake_next_batch(1000)) x"))
            time.sleep(0.1)
        highest = max(issued)
        last = primary.one("SELECT pg_current_wal_lsn()::text")
        primary.stop("fast")
        # The standby replays past everything the primary wrote while it ran, then the
        # shutdown checkpoint: received WAL stops moving and is all replayed.
        wait_until(lambda: standby.one("SELECT pg_last_wal_replay_lsn() > %s::pg_lsn",
                                       (last,)), what="replay past the primary's last LSN")
        seen = {"lsn": None, "since": time.monotonic()}

        def settled():
            received, replayed = standby.sql(
                "SELECT pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text")[0]
            if received != seen["lsn"]:
                seen["lsn"], seen["since"] = received, time.monotonic()
                return False
            return received == replayed and time.monotonic() - seen["since"] >= 1.0

        wait_until(settled, what="received WAL settled and replayed")
        standby.promote()
        self.assertFalse(standby.one("SELECT pg_is_in_recovery()"))
        first, took, started = timed_first_id(self, standby)
        assert_live(self, took, 0.0, started, "first ID after the switchover")
        self.assertGreater(first, highest)

    def test_unclean_failover_issues_at_once_above_everything(self):
        """Reproduces: default settings (max_clock_drift 1s, lease_window 1s,
        clock_behind_action error), clocks in agreement. The standby's WAL receiver is frozen
        (SIGSTOP) while the primary goes on issuing IDs to a client for 2 s, then the primary
        dies (`pg_ctl stop -m immediate`), the frozen receiver is killed (SIGKILL: the standby
        reinitialises its shared memory) and the standby is promoted. It resumes at the
        failover floor, about 3 s ahead of its clock, beyond max_clock_drift: today the first
        calls fail with 58000 `cannot issue snowflake IDs for another N ms after promotion`.
        Acceptance: the first snowflake_next() succeeds at once (a liveness bound, as above),
        above every ID the old primary returned, and then 20,000 IDs in one statement succeed
        (distinct, all above the first).
        Fault used: SIGSTOP/SIGKILL of the WAL receiver, stop -m immediate of the primary."""
        primary, standby = start_pair(self, "unclean", 29)
        with BatchClient(primary) as client:
            wait_until(lambda: len(client.returned) >= 20 or client.failures,
                       what="the client issuing")
            self.assertEqual(client.failures, [])
            standby.wait_replayed(primary)  # streaming: the standby saw the primary's clock
            walreceiver = standby.walreceiver_pid()
            os.kill(walreceiver, signal.SIGSTOP)
            time.sleep(2.0)  # scenario: two lease windows the standby never receives
            primary.stop("immediate")
        highest = max(client.returned)
        kill_walreceiver_and_wait(standby, walreceiver)
        standby.promote()
        self.assertFalse(standby.one("SELECT pg_is_in_recovery()"))
        first, took, started = timed_first_id(self, standby)
        assert_live(self, took, 0.0, started, "first ID after the unclean failover")
        self.assertGreater(first, highest)
        with standby.connect() as conn:
            conn.execute(f"SET statement_timeout = '{HANG_GUARD}s'")  # a hang guard
            try:
                total, distinct, low = conn.execute(
                    "SELECT count(*), count(DISTINCT x), min(x) FROM ("
                    " SELECT snowflake_next() x FROM generate_series(1, 20000)) s").fetchone()
            except psycopg.Error as e:
                self.fail(f"20,000 IDs after the failover: {e.sqlstate} {e.diag.message_primary}")
        self.assertEqual((total, distinct), (20000, 20000))
        self.assertGreater(low, first)

    def test_promoted_before_the_first_lease_record(self):
        """Reproduces: the primary has never issued an ID when its standby's WAL receiver is
        frozen (SIGSTOP); then the primary issues its first IDs, borrowing about 10 s ahead
        of its clock (10,000 blocks of 4,096, max_clock_drift = 20s), so its first lease
        record exists only on the primary. The primary dies (stop -m immediate), the frozen
        receiver is killed (SIGKILL) and the standby, which has no `snowflake.state`, is
        promoted. Today it starts as a new cluster at its own clock, below the old primary's
        IDs.
        Acceptance: the promoted node's first ID is above every ID the old primary issued
        (clock_behind_action = wait; the statement_timeout only guards against a hang: this
        test is about order only).
        Fault used: SIGSTOP/SIGKILL of the WAL receiver, stop -m immediate of the primary."""
        primary, standby = start_pair(self, "firstlease", 30,
                                      snowflake__max_clock_drift="'20s'",
                                      snowflake__clock_behind_action="'wait'",
                                      snowflake__max_clock_wait="'30s'")
        self.assertFalse(os.path.exists(os.path.join(primary.data, "snowflake.state")),
                         "the primary wrote a lease before issuing")
        walreceiver = standby.walreceiver_pid()
        os.kill(walreceiver, signal.SIGSTOP)
        try:
            highest, ahead = primary.sql(
                "SELECT m, extract(epoch FROM snowflake_to_timestamp(m) - clock_timestamp())"
                " FROM (SELECT max(snowflake_next_block(4096)) + 4095 m"
                "       FROM generate_series(1, 10000)) s")[0]
            primary.stop("immediate")
        except BaseException:
            os.kill(walreceiver, signal.SIGCONT)
            raise
        note(f"the old primary's highest ID was {float(ahead):.2f} s ahead of its clock")
        self.assertFalse(os.path.exists(os.path.join(standby.data, "snowflake.state")),
                         "the standby has a lease file: the precondition does not hold")
        kill_walreceiver_and_wait(standby, walreceiver)
        standby.promote()
        self.assertFalse(standby.one("SELECT pg_is_in_recovery()"))
        first, took, _ = timed_first_id(self, standby)
        note(f"first ID of the promoted node in {took:.3f} s; it is "
             f"{((first - highest) >> 22) / 1000:.2f} s of ID time above the old maximum")
        self.assertGreater(first, highest)


if __name__ == "__main__":
    unittest.main(verbosity=2)
