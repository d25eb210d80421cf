"""Integration tests of the foundation against real PostgreSQL clusters.

What only a real server shows: many connections at once, parallel workers, restarts, a
missing preload, a bad postgresql.conf, a changed epoch, a hot standby.
"""

import os
import threading
import unittest

from harness import Cluster, error_of

PRELOAD = "'snowflake'"


class ConcurrentInserts(unittest.TestCase):
    """Four clients insert a million rows through a column DEFAULT."""

    CLIENTS = 4
    ROWS_PER_CLIENT = 250_000
    BATCH = 10_000

    @classmethod
    def setUpClass(cls):
        cls.pg = Cluster("concurrency", {
            "shared_preload_libraries": PRELOAD,
            "snowflake.worker_id": "5",
            "snowflake.datacenter_id": "9",
            "max_parallel_workers_per_gather": "2",
        }).init()
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION snowflake")
        cls.pg.sql("""CREATE TABLE t (
                          id bigint PRIMARY KEY DEFAULT snowflake_next(),
                          client int NOT NULL,
                          n int NOT NULL)""")
        errors = []

        def client(k):
            try:
                with cls.pg.connect() as conn:
                    for start in range(0, cls.ROWS_PER_CLIENT, cls.BATCH):
                        # Rows of one statement get their DEFAULT in generate_series order,
                        # so n is this client's insertion order.
                        conn.execute(
                            "INSERT INTO t (client, n) SELECT %s, g FROM generate_series(%s::int, %s::int) g",
                            (k, start, start + cls.BATCH - 1))
            except Exception as e:  # reported by the test
                errors.append(e)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(cls.CLIENTS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        cls.load_errors = errors

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()

    def test_all_rows_distinct_and_decode_to_the_node(self):
        self.assertEqual(self.load_errors, [])
        total, distinct, ok_node = self.pg.sql("""
            SELECT count(*), count(DISTINCT id),
                   count(*) FILTER (WHERE (snowflake_decode(id)).worker_id = 5
                                      AND (snowflake_decode(id)).datacenter_id = 9)
              FROM t""")[0]
        expected = self.CLIENTS * self.ROWS_PER_CLIENT
        self.assertEqual(total, expected)
        self.assertEqual(distinct, expected)
        self.assertEqual(ok_node, expected)

    def test_each_client_sees_strictly_increasing_ids(self):
        bad = self.pg.one("""
            SELECT count(*) FROM (
                SELECT id, lag(id) OVER (PARTITION BY client ORDER BY n) AS prev FROM t) s
             WHERE id <= prev""")
        self.assertEqual(bad, 0)
        per_client = self.pg.sql("SELECT client, count(*) FROM t GROUP BY 1 ORDER BY 1")
        self.assertEqual(per_client, [(k, self.ROWS_PER_CLIENT) for k in range(self.CLIENTS)])

    def test_ids_sit_inside_the_load_window_and_use_the_sequence(self):
        # A million IDs at <= 4,096 per ms span at least 245 ms.
        span_ms, max_seq = self.pg.sql("""
            SELECT max((snowflake_decode(id)).unix_ms) - min((snowflake_decode(id)).unix_ms),
                   max((snowflake_decode(id)).sequence) FROM t""")[0]
        self.assertGreaterEqual(span_ms, 1_000_000 // 4096)
        self.assertLessEqual(max_seq, 4095)

    def test_range_query_uses_the_primary_key(self):
        self.pg.sql("ANALYZE t")
        lo, hi = self.pg.sql("""
            SELECT to_char(ts, 'YYYY-MM-DD HH24:MI:SS.MS+00'),
                   to_char(ts + interval '5 ms', 'YYYY-MM-DD HH24:MI:SS.MS+00')
              FROM (SELECT snowflake_to_timestamp(min(id)) AT TIME ZONE 'UTC' AS ts FROM t) s""")[0]
        query = f"""SELECT count(*) FROM t
                     WHERE id >= snowflake_from_timestamp('{lo}')
                       AND id <  snowflake_from_timestamp('{hi}')"""
        plan = "\n".join(r[0] for r in self.pg.sql("EXPLAIN " + query))
        self.assertIn("t_pkey", plan)
        self.assertRegex(plan, r"Index (Only )?Scan|Bitmap Index Scan")
        self.assertGreater(self.pg.one(query), 0)

    def test_parallel_workers_share_the_generator(self):
        with self.pg.connect() as conn:
            for s in ("SET parallel_setup_cost = 0", "SET parallel_tuple_cost = 0",
                      "SET min_parallel_table_scan_size = 0", "SET max_parallel_workers_per_gather = 2"):
                conn.execute(s)
            q = "SELECT snowflake_next() AS id FROM t"
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN (ANALYZE, VERBOSE, COSTS OFF, TIMING OFF) " + q).fetchall())
            self.assertIn("Parallel Seq Scan", plan)
            self.assertRegex(plan, r"Workers Launched: [12]")
            self.assertIn("Output: snowflake_next()", plan)
            total, distinct = conn.execute(
                f"SELECT count(*), count(DISTINCT id) FROM ({q}) s").fetchone()
            self.assertEqual(total, distinct)

    def test_restart_continues_above_every_issued_id(self):
        before = self.pg.one("SELECT max(id) FROM t")
        self.pg.restart()
        after = self.pg.one("SELECT snowflake_next()")
        self.assertGreater(after, before)


class Misconfiguration(unittest.TestCase):
    """What a DBA sees when postgresql.conf is wrong: errors naming the setting, never FATAL."""

    @classmethod
    def setUpClass(cls):
        cls.pg = Cluster("config", {}).init()
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION snowflake")

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()

    def reconfigure(self, **settings):
        self.pg.stop()
        base = {"shared_preload_libraries": None, "snowflake__worker_id": None,
                "snowflake__datacenter_id": None, "snowflake__epoch": None}
        self.pg.configure(**{**base, **settings})
        self.pg.start()

    def next_error(self, conn):
        return error_of(conn, "SELECT snowflake_next()")

    def test_without_preload(self):
        self.reconfigure(snowflake__worker_id="1")
        with self.pg.connect() as conn:
            e = self.next_error(conn)
            self.assertEqual(e.sqlstate, "55000")
            self.assertEqual(e.diag.message_primary,
                             'snowflake must be loaded via "shared_preload_libraries"')
            self.assertIn("shared_preload_libraries", e.diag.message_hint)
            # The session survives and decoding works.
            self.assertEqual(conn.execute("SELECT 1").fetchone()[0], 1)
            self.assertEqual(conn.execute(
                "SELECT (snowflake_decode(1541815603606036480)).worker_id").fetchone()[0], 26)
            self.assertEqual(conn.execute(
                "SELECT snowflake_from_timestamp('2010-11-04 01:42:54.658+00')").fetchone()[0],
                1 << 22)
            # A session still cannot change the settings.
            e = error_of(conn, "SET snowflake.worker_id = 3")
            self.assertEqual(e.sqlstate, "55P02")
            decode = "SELECT (snowflake_decode(1541815603606036480)).unix_ms"
            before = conn.execute(decode).fetchone()[0]
            self.assertEqual(before, 1656432460105)
            # Without preload a reload can change snowflake.epoch; decoding must not follow
            # it (the functions are IMMUTABLE): it uses the epoch the database records.
            conn.execute("ALTER SYSTEM SET snowflake.epoch = '2016-04-30 11:18:25.796+00'")
            self.pg.reload_conf()
        with self.pg.connect() as conn:
            self.assertEqual(conn.execute("SHOW snowflake.epoch").fetchone()[0],
                             "2016-04-30 11:18:25.796+00")
            self.assertEqual(conn.execute(decode).fetchone()[0], before)
            conn.execute("ALTER SYSTEM RESET snowflake.epoch")
            self.pg.reload_conf()
        # A fresh CREATE EXTENSION also works without preload.
        self.pg.sql("DROP EXTENSION snowflake")
        self.pg.sql("CREATE EXTENSION snowflake")

    def test_worker_id_unset(self):
        self.reconfigure(shared_preload_libraries=PRELOAD)
        with self.pg.connect() as conn:
            e = self.next_error(conn)
            self.assertEqual(e.sqlstate, "55000")
            self.assertEqual(e.diag.message_primary, "snowflake.worker_id is not set")
            self.assertIn("snowflake.worker_id", e.diag.message_hint)
            self.assertEqual(conn.execute("SELECT 1").fetchone()[0], 1)
        self.assertIn("WARNING:  snowflake.worker_id is not set", self.pg.log())

    def test_worker_id_out_of_range(self):
        self.reconfigure(shared_preload_libraries=PRELOAD, snowflake__worker_id="40")
        with self.pg.connect() as conn:
            e = self.next_error(conn)
            self.assertEqual(e.sqlstate, "55000")
            self.assertEqual(e.diag.message_primary,
                             'invalid value for parameter "snowflake.worker_id": "40"')
            self.assertIn("(0 .. 31)", e.diag.message_detail)

    def test_datacenter_id_not_a_number(self):
        self.reconfigure(shared_preload_libraries=PRELOAD, snowflake__worker_id="1",
                         snowflake__datacenter_id="'east'")
        with self.pg.connect() as conn:
            e = self.next_error(conn)
            self.assertEqual(e.sqlstate, "55000")
            self.assertEqual(e.diag.message_primary,
                             'invalid value for parameter "snowflake.datacenter_id": "east"')

    def test_epoch_in_the_future(self):
        self.reconfigure(shared_preload_libraries=PRELOAD, snowflake__worker_id="1",
                         snowflake__epoch="'2999-01-01 00:00:00+00'")
        with self.pg.connect() as conn:
            e = self.next_error(conn)
            self.assertEqual(e.sqlstate, "55000")
            self.assertEqual(e.diag.message_primary, "snowflake.epoch is in the future")
            self.assertIn("2999-01-01 00:00:00.000+00", e.diag.message_detail)

    def test_epoch_unparseable(self):
        self.reconfigure(shared_preload_libraries=PRELOAD, snowflake__worker_id="1",
                         snowflake__epoch="'2015-01-01 00:00:00'")
        with self.pg.connect() as conn:
            e = self.next_error(conn)
            self.assertEqual(e.sqlstate, "55000")
            self.assertIn("has no time zone", e.diag.message_detail)
            # Decoding needs the epoch too, and refuses rather than guessing.
            e = error_of(conn, "SELECT snowflake_to_timestamp(0)")
            self.assertEqual(e.sqlstate, "55000")

    def test_changed_epoch_is_refused_until_restored(self):
        discord = "'2015-01-01T00:00:00Z'"
        state = os.path.join(self.pg.data, "snowflake.state")
        if os.path.exists(state):
            os.remove(state)
        # The database records the epoch too (table snowflake_origin): say it changed.
        self.pg.sql("UPDATE snowflake_origin SET epoch_unix_ms = 1420070400000")
        self.reconfigure(shared_preload_libraries=PRELOAD, snowflake__worker_id="1",
                         snowflake__epoch=discord)
        first = self.pg.one("SELECT snowflake_next()")
        ts = self.pg.one("SELECT snowflake_to_timestamp(%s) > now() - interval '1 minute'", (first,))
        self.assertTrue(ts)
        # Change the epoch: generation and decoding both refuse, naming the recorded epoch.
        self.reconfigure(shared_preload_libraries=PRELOAD, snowflake__worker_id="1")
        with self.pg.connect() as conn:
            for q in ("SELECT snowflake_next()", f"SELECT snowflake_to_timestamp({first})"):
                e = error_of(conn, q)
                self.assertEqual(e.sqlstate, "55000")
                self.assertEqual(e.diag.message_primary,
                                 "snowflake.epoch does not match the epoch recorded for this cluster")
                self.assertIn("2015-01-01 00:00:00.000+00", e.diag.message_hint)
        # Restore it: everything works again, and IDs keep increasing.
        self.reconfigure(shared_preload_libraries=PRELOAD, snowflake__worker_id="1",
                         snowflake__epoch="'1420070400000'")
        self.assertGreater(self.pg.one("SELECT snowflake_next()"), first)
        self.pg.stop()
        os.remove(state)
        self.pg.start()
        self.pg.sql("UPDATE snowflake_origin SET epoch_unix_ms = 1288834974657")


class HotStandby(unittest.TestCase):
    """A standby made with pg_basebackup -R has the primary's worker id: it must not generate."""

    @classmethod
    def setUpClass(cls):
        cls.primary = Cluster("primary", {
            "shared_preload_libraries": PRELOAD, "snowflake.worker_id": "3"}).init()
        cls.primary.start()
        cls.primary.sql("CREATE EXTENSION snowflake")
        cls.issued = cls.primary.one("SELECT snowflake_next()")
        cls.standby = Cluster("standby").init_standby_of(cls.primary)
        cls.standby.start()

    @classmethod
    def tearDownClass(cls):
        cls.standby.destroy()
        cls.primary.destroy()

    def test_generation_is_refused_in_recovery(self):
        with self.standby.connect() as conn:
            self.assertTrue(conn.execute("SELECT pg_is_in_recovery()").fetchone()[0])
            e = error_of(conn, "SELECT snowflake_next()")
            self.assertEqual(e.sqlstate, "25006")
            self.assertEqual(e.diag.message_primary,
                             "cannot execute snowflake_next() during recovery")
            self.assertIn("primary", e.diag.message_hint)

    def test_decoding_works_on_the_standby(self):
        worker = self.standby.one("SELECT (snowflake_decode(%s)).worker_id", (self.issued,))
        self.assertEqual(worker, 3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
