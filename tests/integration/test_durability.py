"""Durability under real faults: clock steps (libfaketime), crashes, immediate shutdown,
and promotion of a streaming standby whose clock is behind.

Every test checks the same guarantee: no ID is issued twice, and every new ID is greater
than every ID issued before it (per client while running; globally across a restart).
"""

import itertools
import os
import signal
import threading
import time
import unittest

import psycopg

from harness import HANG_GUARD, PG_BIN, Cluster, as_postgres, error_of, wait_until

PRELOAD = "'snowflake'"
TABLE = """CREATE TABLE IF NOT EXISTS t (
               id bigint PRIMARY KEY DEFAULT snowflake_next(),
               client int NOT NULL,
               n int NOT NULL)"""


class Load:
    """Clients inserting batches through the DEFAULT until stopped; errors are collected."""

    def __init__(self, pg, clients=2, batch=200, first_client=0):
        self.pg = pg
        self.batch = batch
        self.stop_flag = threading.Event()
        self.errors = []
        self.rows = [0] * clients
        self.statements = [0] * clients  # finished, inserted or failed
        self.threads = [threading.Thread(target=self.run, args=(first_client + k, k))
                        for k in range(clients)]

    def run(self, client, slot):
        n = 0
        with self.pg.connect() as conn:
            while not self.stop_flag.is_set():
                try:
                    conn.execute(
                        "INSERT INTO t (client, n) SELECT %s, g FROM generate_series(%s::int, %s::int) g",
                        (client, n, n + self.batch - 1))
                    self.rows[slot] += self.batch
                except psycopg.Error as e:
                    self.errors.append((e.sqlstate, e.diag.message_primary))
                    time.sleep(0.05)
                self.statements[slot] += 1
                n += self.batch

    def __enter__(self):
        for th in self.threads:
            th.start()
        return self

    def running(self, rows=1000):
        """Waits until every client has inserted `rows` rows: the load is under way."""
        wait_until(lambda: min(self.rows) >= rows, what=f"{rows} rows from every client")

    def tried_again(self, what):
        """Waits until every client has finished another statement (inserted or failed)
        after this call: the fault just made was met by the load, however loaded the
        machine (a fixed sleep gave no such certainty)."""
        # A statement under way may have started before: wait for two more from each.
        seen = list(self.statements)
        wait_until(lambda: all(now >= before + 2 for now, before in zip(self.statements, seen)),
                   what=what)

    def __exit__(self, *exc):
        self.stop_flag.set()
        for th in self.threads:
            th.join()


def assert_unique_and_increasing(test, pg):
    total, distinct = pg.sql("SELECT count(*), count(DISTINCT id) FROM t")[0]
    test.assertEqual(total, distinct)
    bad = pg.one("""SELECT count(*) FROM (
                        SELECT id, lag(id) OVER (PARTITION BY client ORDER BY n) AS prev FROM t) s
                     WHERE id <= prev""")
    test.assertEqual(bad, 0)
    return total


class LiveClockSteps(unittest.TestCase):
    """The clock steps back while clients insert."""

    @classmethod
    def setUpClass(cls):
        cls.pg = Cluster("clock", {
            "shared_preload_libraries": PRELOAD,
            "snowflake.worker_id": "2",
        }).init()
        cls.pg.use_faketime("+0")
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION snowflake")
        cls.pg.sql(TABLE)

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()

    def setUp(self):
        self.pg.sql("TRUNCATE t")
        self.pg.set_clock_offset("+0")
        self.reload(snowflake__clock_behind_action="error", snowflake__max_clock_drift="1000")
        # Start with an ID clock that is not ahead of the wall clock (scenario: real time past
        # max_clock_drift, 1 s, the most an earlier test's IDs can be ahead).
        time.sleep(1.2)

    def reload(self, **settings):
        self.pg.reload(**settings)

    def test_steps_of_milliseconds(self):
        before = self.pg.stats()["clock_steps_back"]
        with Load(self.pg) as load:
            load.running()
            # A step of a few ms is seen only if an ID is asked for within those few ms, which
            # a loaded machine may not do for one step. So step on, 3 to 8 ms at a time, until
            # the generator has seen one (at most 40 steps, about 200 ms: inside the 1 s bound).
            offset_ms = 0
            for n, step_ms in enumerate(itertools.islice(itertools.cycle((3, 5, 4, 8)), 40)):
                offset_ms -= step_ms
                self.pg.set_clock_offset(f"{offset_ms / 1000:.3f}")
                time.sleep(0.3)
                if n >= 3 and self.pg.stats()["clock_steps_back"] > before:
                    break
        self.assertEqual(load.errors, [])
        self.assertGreater(min(load.rows), 0)
        assert_unique_and_increasing(self, self.pg)
        self.assertGreaterEqual(self.pg.stats()["clock_steps_back"] - before, 1)

    def test_step_of_seconds_within_the_drift_bound(self):
        # 1.5 s back, inside a 2 s bound: IDs keep counting from the ID clock.
        self.reload(snowflake__max_clock_drift="2s")
        with Load(self.pg) as load:
            load.running()
            self.pg.set_clock_offset("-1.5")
            load.tried_again("the load after the step")
            time.sleep(1.0)  # scenario: the load runs on behind the step
        self.assertEqual(load.errors, [])
        assert_unique_and_increasing(self, self.pg)
        s = self.pg.stats()
        self.assertGreaterEqual(s["largest_step_back_ms"], 1400)
        self.assertIn("system clock moved backwards", self.pg.log())

    def test_step_beyond_the_bound_errors(self):
        with Load(self.pg) as load:
            load.running()
            self.pg.set_clock_offset("-5")
            wait_until(lambda: load.errors, what="a refusal after the step")
            time.sleep(1.0)  # scenario: the load goes on meeting the step
        self.assertGreater(len(load.errors), 0)
        for sqlstate, message in load.errors:
            self.assertEqual(sqlstate, "58000")
            self.assertRegex(message, r"^system clock moved backwards by \d+ ms$")
        assert_unique_and_increasing(self, self.pg)

    def test_step_beyond_the_bound_waits_when_configured(self):
        # max_clock_wait is far above the 2.5 s step: what is tested is that the load waits
        # instead of failing, not how late a loaded machine wakes it (the cap itself is
        # tested by the pg_regress and #[pg_test] suites).
        self.reload(snowflake__clock_behind_action="wait", snowflake__max_clock_wait="30s")
        before = self.pg.stats()["waits"]
        with Load(self.pg) as load:
            load.running()
            self.pg.set_clock_offset("-2.5")
            wait_until(lambda: self.pg.stats()["waits"] > before, what="a wait after the step")
            time.sleep(3.0)  # scenario: the load goes on behind the step
        self.assertEqual(load.errors, [])
        assert_unique_and_increasing(self, self.pg)
        self.assertGreater(self.pg.stats()["waits"], before)


class RestartAfterFaults(unittest.TestCase):
    """Shared memory is lost; the clock is set back 30 s; the lease must carry the floor."""

    @classmethod
    def setUpClass(cls):
        cls.pg = Cluster("crash", {
            "shared_preload_libraries": PRELOAD,
            "snowflake.worker_id": "6",
            "snowflake.max_clock_drift": "'60s'",
            "restart_after_crash": "on",
        }).init()
        cls.pg.use_faketime("+0")
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION snowflake")
        cls.pg.sql(TABLE)

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()

    def issue_some(self):
        """Inserts rows and returns the largest ID any client has seen (stored or not)."""
        self.pg.sql("INSERT INTO t (client, n) SELECT 0, g FROM generate_series(1, 20000) g")
        returned = self.pg.one("SELECT max(x) FROM (SELECT snowflake_next() x FROM generate_series(1, 20000)) s")
        return max(returned, self.pg.one("SELECT max(id) FROM t"))

    def check_new_ids_above(self, highest):
        first = self.pg.one("SELECT snowflake_next()")
        self.assertGreater(first, highest)
        self.pg.sql("INSERT INTO t (client, n) SELECT 1, g FROM generate_series(1, 20000) g")
        self.assertGreater(self.pg.one("SELECT min(id) FROM t WHERE client = 1"), highest)
        assert_unique_and_increasing(self, self.pg)
        self.pg.sql("DELETE FROM t")

    def test_backend_killed_with_clock_back(self):
        self.pg.set_clock_offset("+0")
        highest = self.issue_some()
        self.pg.set_clock_offset("-30")
        victim = self.pg.connect()
        pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
        sleeper = threading.Thread(target=lambda: self._sleep(victim))
        sleeper.start()
        wait_until(lambda: self.pg.sql(
            f"SELECT wait_event FROM pg_stat_activity WHERE pid = {pid}") == [("PgSleep",)],
            what="the victim sleeping")
        os.kill(pid, signal.SIGKILL)
        sleeper.join()
        # The postmaster reinitialises shared memory and recovers; connect() retries.
        wait_until(lambda: "terminated by signal 9" in self.pg.log(), what="the crash in the log")
        self.check_new_ids_above(highest)

    @staticmethod
    def _sleep(conn):
        try:
            conn.execute("SELECT pg_sleep(30)")
        except psycopg.Error:
            pass

    def test_immediate_shutdown_then_restart_with_clock_back(self):
        self.pg.set_clock_offset("+0")
        highest = self.issue_some()
        self.pg.stop("immediate")
        self.pg.set_clock_offset("-30")
        self.pg.start()
        self.check_new_ids_above(highest)

    def borrow_ahead(self, lead_s):
        """Issues blocks of 4,096 IDs (a whole millisecond each) until the highest ID issued is
        more than `lead_s` ahead of the clock read once the statement has issued them all, and
        returns that ID. IDs run ahead of the clock only while they are issued faster than it
        advances (up to max_clock_drift): a loaded machine may need more than one round."""
        highest = [0]

        def borrowed():
            top, lead = self.pg.sql(
                "SELECT h, extract(epoch FROM snowflake_to_timestamp(h) - clock_timestamp()) "
                "FROM (SELECT max(snowflake_next_block(4096)) + 4095 AS h "
                "      FROM generate_series(1, 5000) OFFSET 0) s")[0]
            highest[0] = max(highest[0], top)
            return lead > lead_s
        wait_until(borrowed, what=f"IDs borrowed {lead_s} s ahead of the clock")
        return highest[0]

    def test_restart_never_refuses_a_sane_clock(self):
        # Issue 28: with max_clock_drift = lease_window, a lease written right after IDs were
        # borrowed ahead reaches drift + window past the clock. A restart must wait for it
        # (no 58000), straight away and after a clock set back and restored; only while the
        # clock really is set back does it refuse. A 5 s window and drift keep the resume
        # point several seconds ahead whatever the restarts cost on a loaded machine.
        drift_s = window_s = 5
        # The furthest a lease reaches past its writer's clock with these settings (IDs
        # borrowed max_clock_drift ahead, then the window and its widening by at most one
        # more window): the last lease was written no earlier than its end less this.
        reach_cap_s = drift_s + window_s + max(window_s, 0.1)
        self.pg.configure(snowflake__max_clock_drift=f"'{drift_s}s'",
                          snowflake__lease_window=f"'{window_s}s'")
        try:
            self.pg.set_clock_offset("+0")
            self.pg.restart()
            for clock_games in (False, True):
                with self.subTest(clock_set_back_and_restored=clock_games):
                    highest = self.borrow_ahead(lead_s=2)
                    lease_end = self.pg.one("SELECT lease_end FROM snowflake_stats").timestamp()
                    self.pg.stop("immediate")
                    if clock_games:
                        self.pg.set_clock_offset("-30")
                    self.pg.start()
                    if clock_games:
                        # 30 s back is further than max_clock_drift behind the time the lease
                        # was written only if the restart took less than 25 s; after a slower
                        # one (a loaded machine) the clock is within the drift of it, and
                        # waiting is right. So the call reads a stopped clock (libfaketime's
                        # absolute time) 30 s further back than max_clock_drift before the
                        # earliest the lease can have been written, whatever the restart cost.
                        set_back = lease_end - reach_cap_s - drift_s - 30
                        with self.pg.connect() as conn:
                            self.pg.set_clock_offset(
                                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(set_back)))
                            e = error_of(conn, "SELECT snowflake_next()")
                        # Refused at once for the clock behind the lease: not waited on, which
                        # a stopped clock would end with "system clock is not advancing".
                        self.assertEqual(e.sqlstate, "58000")
                        self.assertRegex(e.diag.message_primary,
                                         r"^system clock (moved backwards by|is) \d+ ms")
                        self.assertIn(f"at most {drift_s * 1000} ms is allowed",
                                      e.diag.message_detail)
                        self.pg.set_clock_offset("+0")
                    with self.pg.connect() as conn:
                        conn.execute(f"SET statement_timeout = '{HANG_GUARD}s'")  # a hang guard
                        first = conn.execute("SELECT snowflake_next()").fetchone()[0]
                    self.assertGreater(first, highest)
        finally:
            self.pg.set_clock_offset("+0")
            self.pg.configure(snowflake__max_clock_drift="'60s'", snowflake__lease_window=None)
            self.pg.restart()

    def test_restart_with_clock_back_beyond_the_bound_refuses(self):
        # With the default 1 s bound, a clock 30 s behind the lease cannot be absorbed:
        # the generator refuses (nothing duplicated) until the clock catches up.
        self.pg.set_clock_offset("+0")
        highest = self.issue_some()
        self.pg.stop("immediate")
        self.pg.configure(snowflake__max_clock_drift="'1s'")
        self.pg.set_clock_offset("-30")
        self.pg.start()
        try:
            with self.pg.connect() as conn:
                e = error_of(conn, "SELECT snowflake_next()")
                self.assertEqual(e.sqlstate, "58000")
            self.pg.set_clock_offset("+0")
            self.assertGreater(self.pg.one("SELECT snowflake_next()"), highest)
        finally:
            self.pg.configure(snowflake__max_clock_drift="'60s'")
            self.pg.restart()


class StandbyPromotion(unittest.TestCase):
    """A standby whose clock lags the primary's by 20 s is promoted after the primary stops."""

    def test_promoted_standby_continues_above_the_old_primary(self):
        # The failover floor covers IDs the primary may have borrowed up to max_clock_drift
        # ahead: with 60 s of drift and a clock 20 s behind, the first IDs wait about 22 s.
        settings = {
            "shared_preload_libraries": PRELOAD,
            "snowflake.worker_id": "4",
            "snowflake.max_clock_drift": "'60s'",
            "snowflake.clock_behind_action": "'wait'",
            "snowflake.max_clock_wait": "'60s'",
        }
        primary = Cluster("promo-primary", settings).init()
        standby = Cluster("promo-standby", settings)
        try:
            primary.start()
            primary.sql("CREATE EXTENSION snowflake")
            primary.sql(TABLE)
            # IDs before the base backup, then a checkpoint: their lease records precede the
            # backup's redo point and are never replayed; the copied state file carries them.
            primary.sql("INSERT INTO t (client, n) SELECT 0, g FROM generate_series(1, 5000) g")
            primary.sql("CHECKPOINT")

            standby.init_standby_of(primary)
            standby.use_faketime("-20")
            standby.start()

            # More IDs after the backup: their lease records reach the standby by streaming.
            # A longer lease window makes the point: IDs far below the lease end are safe.
            primary.reload(snowflake__lease_window="'5s'")
            primary.wait_lease_passed()  # so that a new record is written
            primary.sql("INSERT INTO t (client, n) SELECT 1, g FROM generate_series(1, 5000) g")
            returned = primary.one("SELECT max(x) FROM (SELECT snowflake_next() x FROM generate_series(1, 5000)) s")
            highest = max(returned, primary.one("SELECT max(id) FROM t"))
            writes = primary.stats()["lease_writes"]
            self.assertGreaterEqual(writes, 1)

            standby.wait_replayed(primary)

            with standby.connect() as conn:
                e = error_of(conn, "SELECT snowflake_next()")
                self.assertEqual(e.sqlstate, "25006")
                # Stats work on the standby and show the replayed lease.
                lease_ok = conn.execute(
                    "SELECT lease_end > snowflake_to_timestamp(%s) FROM snowflake_stats", (highest,)).fetchone()[0]
                self.assertTrue(lease_ok)

            primary.stop()
            as_postgres(f"{PG_BIN}/pg_ctl", "-D", standby.data, "-w", "promote", capture=True)
            self.assertFalse(standby.one("SELECT pg_is_in_recovery()"))
            # The promoted node's clock is 20 s behind, yet its IDs start above the old primary's.
            first = standby.one("SELECT snowflake_next()")
            self.assertGreater(first, highest)
            standby.sql("INSERT INTO t (client, n) SELECT 2, g FROM generate_series(1, 5000) g")
            self.assertGreater(standby.one("SELECT min(id) FROM t WHERE client = 2"), highest)
            assert_unique_and_increasing(self, standby)
        finally:
            standby.destroy()
            primary.destroy()


class SynchronousReplication(unittest.TestCase):
    """With a synchronous standby, a lease is used only once the standby has its record."""

    def test_lease_waits_for_the_synchronous_standby(self):
        settings = {
            "shared_preload_libraries": PRELOAD,
            "snowflake.worker_id": "5",
        }
        primary = Cluster("sync-primary", settings).init()
        standby = Cluster("sync-standby", settings)
        try:
            primary.start()
            primary.sql("CREATE EXTENSION snowflake")
            standby.init_standby_of(primary)
            standby.start()
            primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.sql("SELECT pg_reload_conf()")
            primary.wait_sync_standby()
            # With the standby streaming, leases are confirmed and IDs come at once.
            first = primary.one("SELECT snowflake_next()")
            self.assertGreater(first, 0)
            standby.stop()
            primary.wait_lease_passed()  # the next ID needs a new lease
            with primary.connect() as conn:
                conn.execute("SET statement_timeout = '1500ms'")
                started = time.monotonic()
                e = error_of(conn, "SELECT snowflake_next()")
                waited = time.monotonic() - started
                # The lease waited for the standby like a commit would; the timeout cancels
                # it exactly as anywhere else in PostgreSQL, and nothing is issued (a commit
                # would proceed: it is already durable locally).
                self.assertGreaterEqual(waited, 1.4)
                self.assertEqual(e.sqlstate, "57014")
                self.assertEqual(e.diag.message_primary, "canceling statement due to statement timeout")
                self.assertIsNone(e.diag.message_detail)
            standby.start()
            second = primary.one("SELECT snowflake_next()")
            self.assertGreater(second, first)
        finally:
            standby.destroy()
            primary.destroy()


class LeaseCost(unittest.TestCase):
    """Under a bulk run the lease is written at most about once per window."""

    def test_lease_writes_per_window(self):
        pg = Cluster("lease", {
            "shared_preload_libraries": PRELOAD,
            "snowflake.worker_id": "8",
        }).init()
        try:
            pg.start()
            pg.sql("CREATE EXTENSION snowflake")
            before = pg.stats()["lease_writes"]
            started = time.monotonic()
            span_ms = pg.one("""SELECT max(x) - min(x) FROM (
                                    SELECT (snowflake_decode(snowflake_next())).unix_ms x
                                      FROM generate_series(1, 3000000)) s""")
            elapsed = time.monotonic() - started
            writes = pg.stats()["lease_writes"] - before
            # One write per 1 s window of ID time (plus the first one).
            self.assertLessEqual(writes, span_ms // 1000 + 2, f"{writes} writes in {elapsed:.1f} s")
            self.assertGreaterEqual(writes, 1)
        finally:
            pg.destroy()


if __name__ == "__main__":
    unittest.main(verbosity=2)
