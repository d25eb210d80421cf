"""Durability under real replication (issue 9): every synchronous mode, sessions that cannot
weaken the guarantee, renewals that cannot spin, lease records that reach the WAL, replay
that never moves the lease back, restarts and warnings, long batches, and an asynchronous
failover after the unclean loss of a primary whose WAL the standby stopped receiving.

Each test reproduces the fault for real: a WAL receiver frozen with SIGSTOP (and killed with
SIGKILL), a primary stopped with `pg_ctl stop -m immediate`, clocks moved with libfaketime.
"""

import os
import signal
import threading
import time
import unittest

import psycopg

from harness import (HANG_GUARD, PG_BIN, BatchClient, Cluster, as_postgres, assert_live, error_of,
                     wait_live, wait_until)
from fixtures.clusters import settings_for, start_pair


class Frozen:
    """A WAL receiver stopped with SIGSTOP for the duration of a `with` block."""

    def __init__(self, standby):
        self.pid = standby.walreceiver_pid()

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def run_with_watchdog(test, pg, query, limit_s):
    """Runs `query` on a new connection; if it has not returned after `limit_s`, SIGKILLs its
    backend (a loop that ignores cancels can be ended no other way) and fails the test."""
    conn = pg.connect()
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    result = {}

    def work():
        try:
            result["rows"] = conn.execute(query).fetchall()
        except psycopg.Error as e:
            result["error"] = e

    th = threading.Thread(target=work)
    th.start()
    th.join(limit_s)
    if th.is_alive():
        os.kill(pid, signal.SIGKILL)
        th.join()
        test.fail(f"still running after {limit_s} s (backend killed): {query}")
    conn.close()
    if "error" in result:
        raise result["error"]
    return result["rows"]


class SynchronousModes(unittest.TestCase):
    """Items 1-4: what a session with synchronous replication may and may not receive."""

    def test_remote_apply_renewals_are_not_cancelled(self):
        # Lease records are not commits: the standby confirms them at flush, never at apply.
        primary, _ = start_pair(self, "apply", 11, sync=True, snowflake__lease_window="'10ms'")
        before = primary.stats()["lease_writes"]
        ids = []
        with primary.connect() as conn:
            conn.execute("SET synchronous_commit = remote_apply")
            for _ in range(200):
                ids.append(conn.execute("SELECT snowflake_next()").fetchone()[0])
                time.sleep(0.005)
        self.assertEqual(ids, sorted(set(ids)))
        self.assertGreater(primary.stats()["lease_writes"] - before, 20)

    def test_a_session_without_sync_cannot_weaken_the_others(self):
        primary, standby = start_pair(self, "weaken", 12, sync=True,
                                      snowflake__lease_window="'200ms'")
        first = primary.one("SELECT snowflake_next()")
        with Frozen(standby):
            primary.wait_lease_passed()  # the confirmed lease has run out
            primary.reload(snowflake__lease_window="'10s'")
            with primary.connect() as off:
                off.execute("SET synchronous_commit = off")
                # Writes a 10 s lease that the frozen standby never confirms.
                unconfirmed = off.execute("SELECT snowflake_next()").fetchone()[0]
            self.assertGreater(unconfirmed, first)
            with primary.connect() as on:
                on.execute("SET statement_timeout = '1500ms'")
                started = time.monotonic()
                e = error_of(on, "SELECT snowflake_next()")
                self.assertGreaterEqual(time.monotonic() - started, 1.4)
                self.assertEqual(e.sqlstate, "57014")
                self.assertNotIn("panicked", str(e.diag.message_detail or ""))
        # Confirmed now that the standby receives again.
        with primary.connect() as on:
            on.execute(f"SET statement_timeout = '{HANG_GUARD}s'")  # a hang guard
            self.assertGreater(on.execute("SELECT snowflake_next()").fetchone()[0], unconfirmed)

    def test_clearing_synchronous_standby_names_unblocks_at_once(self):
        primary, standby = start_pair(self, "unblock", 13, sync=True,
                                      snowflake__lease_window="'200ms'")
        first = primary.one("SELECT snowflake_next()")
        standby.stop("immediate")
        primary.wait_lease_passed()  # the next call writes a lease record and waits
        result = {}

        def call():
            with primary.connect() as conn:
                conn.execute(f"SET statement_timeout = '{HANG_GUARD}s'")  # a hang guard
                try:
                    result["id"] = conn.execute("SELECT snowflake_next()").fetchone()[0]
                except psycopg.Error as e:
                    result["error"] = e
                result["at"] = time.monotonic()

        th = threading.Thread(target=call)
        th.start()
        wait_until(lambda: primary.one(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'Extension'"
            " AND query = 'SELECT snowflake_next()'") == 1, what="the call waiting on the standby")
        self.assertTrue(th.is_alive(), "the lease did not wait for the synchronous standby")
        cleared = time.monotonic()
        primary.sql("ALTER SYSTEM SET synchronous_standby_names = ''")
        primary.sql("SELECT pg_reload_conf()")
        th.join(HANG_GUARD)
        self.assertNotIn("error", result)
        self.assertGreater(result["id"], first)
        # At once: nothing in the settings to wait for once the names are cleared.
        assert_live(self, result["at"] - cleared, 0.0, cleared, "the call unblocked after")
        # And every later call works without a standby.
        with primary.connect() as conn:
            conn.execute(f"SET statement_timeout = '{HANG_GUARD}s'")  # a hang guard
            ids = [conn.execute("SELECT snowflake_next()").fetchone()[0] for _ in range(3)]
            time.sleep(0.3)
            ids.append(conn.execute("SELECT snowflake_next()").fetchone()[0])
        self.assertEqual(ids, sorted(set(ids)))

    def test_one_millisecond_window_with_a_synchronous_standby_completes(self):
        # Every renewal (fsync, WAL flush, the standby's round trip) takes longer than the
        # window: each one is stale on arrival unless renewal makes progress anyway.
        primary, _ = start_pair(self, "tiny", 14, sync=True, snowflake__lease_window="'1ms'")
        rows = run_with_watchdog(self, primary, """
            SELECT count(*), count(DISTINCT x) FROM (
                SELECT snowflake_next() x FROM generate_series(1, 20000)) s""", HANG_GUARD)
        self.assertEqual(rows[0], (20000, 20000))


class AsynchronousPath(unittest.TestCase):
    """Items 4-5 without synchronous replication."""

    def test_one_millisecond_window_without_a_standby_completes(self):
        pg = Cluster("tiny-local", settings_for(20, snowflake__lease_window="'1ms'")).init()
        self.addCleanup(pg.destroy)
        pg.start()
        pg.sql("CREATE EXTENSION snowflake")
        rows = run_with_watchdog(self, pg, """
            SELECT count(*), count(DISTINCT x) FROM (
                SELECT snowflake_next() x FROM generate_series(1, 20000)) s""", HANG_GUARD)
        self.assertEqual(rows[0], (20000, 20000))

    def test_lease_record_reaches_the_standby_without_a_commit(self):
        # A transaction without an xid asks the WAL writer to flush at commit; one that stays
        # open (or aborts) never does. The lease record must not wait for it.
        primary, standby = start_pair(self, "flush", 15, snowflake__lease_window="'300ms'")
        primary.one("SELECT snowflake_next()")
        standby.wait_replayed(primary)
        primary.wait_lease_passed()
        with primary.connect(autocommit=False) as conn:
            conn.execute("SELECT snowflake_next()")  # renews the lease, then stays open
            lease_end = conn.execute("SELECT lease_end FROM snowflake_stats").fetchone()[0]

            def arrived():
                seen = standby.one("SELECT lease_end FROM snowflake_stats")
                return seen is not None and seen >= lease_end
            # Liveness: the WAL writer flushes within wal_writer_delay (200 ms), or 25 of them
            # when it hibernates (5 s); the record then streams at once. Without the fix it
            # never arrives while the transaction stays open.
            wait_live(arrived, 25 * 0.2, what="the lease record on the standby")
            conn.rollback()


class Replay(unittest.TestCase):
    """Item 6: a state file that cannot be read stops recovery instead of being replaced."""

    def test_unreadable_state_file_stops_replay(self):
        primary, standby = start_pair(self, "redo", 16, snowflake__lease_window="'200ms'")
        primary.one("SELECT snowflake_next()")
        standby.wait_replayed(primary)
        path = os.path.join(standby.data, "snowflake.state")
        with open(path, "w") as f:
            f.write("{damaged")
        primary.wait_lease_passed()
        primary.one("SELECT snowflake_next()")  # a new lease record
        primary.sql("CREATE TABLE flush_me ()")  # a commit flushes it to the standby
        wait_until(lambda: not standby.running(), what="the standby to stop replay")
        with open(path) as f:
            self.assertEqual(f.read(), "{damaged", "replay replaced a file it could not read")
        self.assertFalse(standby.running(), "recovery went on without the lease")
        self.assertIn('could not read file "snowflake.state"', standby.log())


class Restarts(unittest.TestCase):
    """Items 7-8 on one server."""

    def test_fast_restart_waits_out_the_lease_instead_of_failing(self):
        pg = Cluster("fast-restart", settings_for(17, snowflake__lease_window="'3s'",
                                                  snowflake__max_clock_drift="'1s'")).init()
        self.addCleanup(pg.destroy)
        pg.start()
        pg.sql("CREATE EXTENSION snowflake")
        highest = pg.one("SELECT max(x) FROM (SELECT snowflake_next() x FROM generate_series(1, 1000)) s")
        pg.stop("immediate")
        pg.start()
        with pg.connect() as conn:
            conn.execute(f"SET statement_timeout = '{HANG_GUARD}s'")  # a hang guard
            first = conn.execute("SELECT snowflake_next()").fetchone()[0]
        self.assertGreater(first, highest)
        self.assertNotIn("moved backwards by 0 ms", pg.log())

    def test_warnings_continue_after_a_step_back(self):
        pg = Cluster("warn-step", settings_for(21, snowflake__warning_interval="'1s'",
                                               snowflake__max_clock_drift="'120s'")).init()
        self.addCleanup(pg.destroy)
        pg.use_faketime("+0")
        pg.start()
        pg.sql("CREATE EXTENSION snowflake")
        pg.one("SELECT snowflake_next()")
        for offset in ("-30", "-60"):
            pg.set_clock_offset(offset)
            time.sleep(0.1)
            pg.one("SELECT snowflake_next()")
            time.sleep(1.5)  # scenario: longer than warning_interval (of real time)
        self.assertEqual(pg.log().count("WARNING:  snowflake: system clock moved backwards"), 2)


class LongBatches(unittest.TestCase):
    """Item 9: a batch of a million IDs does not keep the generator to itself."""

    def test_other_sessions_get_ids_while_a_batch_runs(self):
        pg = Cluster("batch-lock", settings_for(18)).init()
        self.addCleanup(pg.destroy)
        pg.start()
        pg.sql("CREATE EXTENSION snowflake")
        stop = threading.Event()
        singles = []

        def single():
            with pg.connect() as conn:
                while not stop.is_set():
                    singles.append(conn.execute("SELECT snowflake_next()").fetchone()[0])

        th = threading.Thread(target=single)
        th.start()
        batches = []

        def interleaved():
            return sum(1 for x in list(singles) for lo, hi, _ in batches if lo < x < hi)

        try:
            with pg.connect() as conn:
                # At least 6 batches; on a busy machine the other session may not be scheduled
                # during one batch's few hundred milliseconds, so go on (up to 30) until it was.
                for n in range(30):
                    batches.append(conn.execute("""
                        SELECT a[1], a[1000000],
                               (SELECT bool_and(x > p) FROM (
                                    SELECT x, lag(x) OVER (ORDER BY o) p
                                      FROM unnest(a) WITH ORDINALITY u(x, o)) q)
                          FROM (SELECT snowflake_next_batch(1000000) a) s""").fetchone())
                    if n >= 5 and interleaved() > 0:
                        break
        finally:
            stop.set()
            th.join()
        for lo, hi, increasing in batches:
            self.assertTrue(increasing)
        inside = interleaved()
        self.assertGreater(inside, 0, "no other session got an ID while a batch ran")
        ids = singles + [b[0] for b in batches] + [b[1] for b in batches]
        self.assertEqual(len(ids), len(set(ids)))


class BaseBackup(unittest.TestCase):
    """A standby made by pg_basebackup while leases are renewed every 20 ms, then promoted
    after the primary is lost: nothing the primary returned comes again."""

    def test_backup_taken_while_leases_renew(self):
        primary = Cluster("bb-primary", settings_for(22, snowflake__lease_window="'20ms'",
                                                     snowflake__clock_behind_action="'wait'")).init()
        standby = Cluster("bb-standby", {})
        self.addCleanup(primary.destroy)
        self.addCleanup(standby.destroy)
        primary.start()
        primary.sql("CREATE EXTENSION snowflake")
        with BatchClient(primary, batch=200, pause=0.002) as client:
            time.sleep(0.5)
            writes_before = primary.stats()["lease_writes"]
            standby.init_standby_of(primary)  # the copy runs while leases renew
            writes_during = primary.stats()["lease_writes"] - writes_before
            standby.start()
            standby.walreceiver_pid()
            time.sleep(1.0)
        self.assertEqual(client.failures, [])
        self.assertGreater(writes_during, 5, "no lease was renewed during the base backup")
        standby.wait_replayed(primary)
        highest = max(client.returned)
        primary.stop("immediate")
        standby.promote()
        with standby.connect() as conn:
            conn.execute(f"SET statement_timeout = '{HANG_GUARD}s'")  # a hang guard
            first = conn.execute("SELECT snowflake_next()").fetchone()[0]
            self.assertGreater(first, highest)


class Rewind(unittest.TestCase):
    """pg_rewind of an old primary that went on issuing IDs after its standby was promoted
    (split brain), borrowing 20 s ahead of its clock, made a standby of the new primary, and
    promoted in turn later. pg_rewind replaces its state file with the new primary's, whose
    clock is 10 s behind: the IDs it issues after its own promotion must still be above every
    ID it issued on the timeline it left, and above the new primary's."""

    def test_rewound_primary_promoted_later(self):
        old, new = start_pair(self, "rewind", 23, standby_offset="-10",
                              wal_log_hints="on", wal_keep_size="'256MB'",
                              snowflake__max_clock_drift="'60s'",
                              snowflake__clock_behind_action="'wait'",
                              snowflake__max_clock_wait="'30s'")
        old_ids = [old.one("SELECT max(x) FROM unnest(snowflake_next_batch(1000)) x")]
        new.wait_replayed(old)
        new.promote()
        # Split brain, and the old primary's ID clock runs 20 s ahead of its wall clock.
        old_ids.append(old.one("SELECT max(snowflake_next_block(4096)) + 4095 FROM generate_series(1, 20000)"))
        for _ in range(20):  # split brain: both issue
            old_ids.append(old.one("SELECT max(x) FROM unnest(snowflake_next_batch(1000)) x"))
            time.sleep(0.05)
        new_ids = [new.one("SELECT max(x) FROM unnest(snowflake_next_batch(1000)) x")]
        old.stop()
        r = as_postgres(f"{PG_BIN}/pg_rewind", f"--target-pgdata={old.data}",
                        f"--source-server=host={new.dir} port={new.port} user=postgres dbname=postgres",
                        check=False, capture=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # pg_rewind copied the new primary's configuration files: make the old one a standby
        # of the new one, on its own port and socket.
        old.write_settings()
        with open(os.path.join(old.data, "postgresql.auto.conf"), "w") as f:
            f.write(f"primary_conninfo = 'host={new.dir} port={new.port} user=postgres'\n")
        open(os.path.join(old.data, "standby.signal"), "w").close()
        old.start()
        old.walreceiver_pid()
        new_ids.append(new.one("SELECT max(x) FROM unnest(snowflake_next_batch(1000)) x"))
        old.wait_replayed(new)
        new.stop()
        old.promote()
        with old.connect() as conn:
            conn.execute(f"SET statement_timeout = '{HANG_GUARD}s'")  # a hang guard
            first = conn.execute("SELECT snowflake_next()").fetchone()[0]
        self.assertGreater(first, max(old_ids))
        self.assertGreater(first, max(new_ids))


class AsynchronousFailover(unittest.TestCase):
    """An asynchronous standby whose clock is 5 s behind stops receiving WAL (its WAL
    receiver is frozen, then killed); the primary goes on issuing IDs to a client for 3 s
    more, then dies without a clean shutdown; the standby is promoted. It issues at once,
    without an error, and no ID it issues is at or below any ID the old primary returned."""

    def test_promoted_standby_covers_leases_it_never_received(self):
        primary, standby = start_pair(
            self, "failover", 19, standby_offset="-5",
            snowflake__lease_window="'1s'", snowflake__max_clock_drift="'1s'",
            snowflake__clock_behind_action="'error'", snowflake__max_clock_wait="'30s'")
        primary.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_next(), n int)")
        with BatchClient(primary, then="INSERT INTO t (n) SELECT g FROM generate_series(1, 50) g"
                         ) as client:
            # Streaming: the standby has seen the primary's clock.
            wait_until(lambda: len(client.returned) >= 20 or client.failures,
                       what="the client issuing")
            standby.wait_replayed(primary)
            walreceiver = standby.walreceiver_pid()
            os.kill(walreceiver, signal.SIGSTOP)
            time.sleep(3.0)  # scenario: three more lease windows the standby never receives
            self.assertEqual(client.failures, [])
            primary.stop("immediate")  # the client's next statement fails: expected
        highest = max(client.returned)
        # The frozen receiver never reads what is left in its socket: kill it (the standby
        # restarts its processes and shared memory, and stays in recovery).
        os.kill(walreceiver, signal.SIGKILL)
        # Gone from /proc once the postmaster has reaped it (and so started its crash
        # handling); then wait for the standby to accept connections again.
        wait_until(lambda: not os.path.exists(f"/proc/{walreceiver}"), what="the receiver reaped")
        wait_until(lambda: standby.one("SELECT pg_is_in_recovery()"), what="the standby back")
        standby.promote()
        self.assertFalse(standby.one("SELECT pg_is_in_recovery()"))

        # Even with clock_behind_action = error, the promoted node issues at once from its
        # resume point, about 8 s ahead of its own clock (the old primary's lead, reach and
        # margin), above everything the old primary returned.
        with standby.connect() as conn:
            conn.execute(f"SET statement_timeout = '{HANG_GUARD}s'")  # a hang guard
            started = time.monotonic()
            first = conn.execute("SELECT snowflake_next()").fetchone()[0]
            # At once: a liveness bound with nothing to wait for in the settings.
            assert_live(self, time.monotonic() - started, 0.0, started,
                        "first ID after the failover")
            self.assertGreater(first, highest)
            ahead = conn.execute(
                "SELECT extract(epoch FROM snowflake_to_timestamp(%s) - clock_timestamp())",
                (first,)).fetchone()[0]
            self.assertGreater(ahead, 5.0)
            conn.execute("INSERT INTO t (n) SELECT g FROM generate_series(1, 5000) g")
            low = conn.execute("SELECT min(id) FROM t WHERE id > %s", (first,)).fetchone()[0]
            self.assertGreater(low, highest)
            total, distinct = conn.execute("SELECT count(*), count(DISTINCT id) FROM t").fetchone()
            self.assertEqual(total, distinct)


if __name__ == "__main__":
    unittest.main(verbosity=2)
