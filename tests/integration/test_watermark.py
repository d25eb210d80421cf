"""The commit-order watermark, snowflake_safe_upto() (issue 11), with real sessions: writers
that commit out of order, subtransactions, parallel workers, prepared transactions across a
restart, a crash and a promotion, and the outbox reader of examples/python, which must see
every row exactly once while writers commit in random order."""

import os
import random
import sys
import threading
import time
import unittest

import psycopg

from harness import PG_MAJOR, Cluster, error_of, wait_until

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import outbox_reader  # noqa: E402

SETTINGS = {
    "shared_preload_libraries": "'snowflake'",
    "snowflake.worker_id": "5",
    "max_prepared_transactions": "10",
    "autovacuum": "off",
}


def upto(pg):
    return pg.one("SELECT snowflake_safe_upto()")


class Watermark(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.pg = Cluster("watermark", SETTINGS).init()
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION snowflake")

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()

    def open_xact(self):
        conn = self.pg.connect(autocommit=False)
        self.addCleanup(conn.close)
        return conn

    def test_out_of_order_commits_hold_it_at_the_smallest_in_flight_id(self):
        a, b = self.open_xact(), self.open_xact()
        first = a.execute("SELECT snowflake_next()").fetchone()[0]
        second = b.execute("SELECT snowflake_next()").fetchone()[0]
        self.assertLess(first, second)
        b.commit()
        # The later ID committed first: the watermark stays at or below the earlier one.
        self.assertLessEqual(upto(self.pg), first)
        a.commit()
        after = upto(self.pg)
        self.assertGreater(after, second)
        # With nothing in flight, it is the next ID's lower bound: never above the next ID.
        nxt = self.pg.one("SELECT snowflake_next()")
        self.assertLessEqual(after, nxt)

    def test_a_rolled_back_transaction_releases_it(self):
        a = self.open_xact()
        held = a.execute("SELECT snowflake_next_batch(3)").fetchone()[0][0]
        self.assertLessEqual(upto(self.pg), held)
        a.rollback()
        self.assertGreater(upto(self.pg), held)

    def test_subtransactions_hold_until_the_top_level_ends(self):
        a = self.open_xact()
        a.execute("SAVEPOINT s")
        held = a.execute("SELECT snowflake_next()").fetchone()[0]
        a.execute("ROLLBACK TO SAVEPOINT s")
        # Conservative: the ID of a rolled-back subtransaction is never written, but the
        # watermark keeps it until the transaction ends.
        self.assertLessEqual(upto(self.pg), held)
        a.execute("SAVEPOINT t")
        a.execute("SELECT snowflake_next()")
        a.execute("RELEASE SAVEPOINT t")
        self.assertLessEqual(upto(self.pg), held)
        a.commit()
        self.assertGreater(upto(self.pg), held)

    def test_parallel_workers_hold_for_their_leader(self):
        self.pg.sql("CREATE TABLE IF NOT EXISTS wide AS SELECT g FROM generate_series(1, 200000) g")
        self.pg.sql("ANALYZE wide")
        a = self.open_xact()
        force = "debug_parallel_query" if int(PG_MAJOR) >= 16 else "force_parallel_mode"
        for s in ["parallel_setup_cost = 0", "parallel_tuple_cost = 0",
                  "min_parallel_table_scan_size = 0", "max_parallel_workers_per_gather = 2",
                  f"{force} = on"]:
            a.execute(f"SET LOCAL {s}")
        plan = "\n".join(r[0] for r in a.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) SELECT min(snowflake_next()) FROM wide WHERE g % 1000 = 0"))
        self.assertIn("Workers Launched: 2", plan)
        held = a.execute(
            "SELECT min(snowflake_next()) FROM wide WHERE g % 1000 = 0").fetchone()[0]
        # The workers have exited; their IDs belong to the leader's open transaction.
        self.assertLessEqual(upto(self.pg), held)
        a.commit()
        self.assertGreater(upto(self.pg), held)

    def test_prepared_transactions_hold_it_across_restart_and_crash(self):
        self.pg.sql("CREATE TABLE IF NOT EXISTS prep (id bigint PRIMARY KEY DEFAULT snowflake_next())")
        a = self.open_xact()
        held = a.execute("INSERT INTO prep DEFAULT VALUES RETURNING id").fetchone()[0]
        a.execute("PREPARE TRANSACTION 'wm1'")
        a.close()
        # A prepared transaction without IDs holds nothing.
        b = self.open_xact()
        b.execute("SELECT 1")
        b.execute("PREPARE TRANSACTION 'wm_empty'")
        b.close()
        later = self.pg.one("SELECT snowflake_next()")
        self.assertLessEqual(upto(self.pg), held)
        self.pg.restart()
        self.assertLessEqual(upto(self.pg), held)
        self.pg.stop("immediate")  # a crash: shared memory is gone, the file is not
        self.pg.start()
        self.assertLessEqual(upto(self.pg), held)
        self.pg.sql("COMMIT PREPARED 'wm1'")
        self.assertGreater(upto(self.pg), later)
        self.pg.sql("ROLLBACK PREPARED 'wm_empty'")
        self.assertEqual(self.pg.one("SELECT count(*) FROM prep WHERE id = %s", (held,)), 1)

    def test_outbox_reader_sees_every_row_exactly_once(self):
        """Writers commit in random order with random delays after their insert; the
        example's reader polls concurrently and must see each committed row once, and no
        rolled-back row."""
        self.pg.sql(outbox_reader.SCHEMA)
        self.pg.sql("TRUNCATE outbox")
        committed, stop = [], threading.Event()
        lock = threading.Lock()

        def writer(seed):
            rng = random.Random(seed)
            with self.pg.connect(autocommit=False) as conn:
                for i in range(60):
                    ids = [conn.execute("INSERT INTO outbox (payload) VALUES (%s) RETURNING id",
                                        (f"w{seed}-{i}-{k}",)).fetchone()[0]
                           for k in range(rng.randint(1, 3))]
                    time.sleep(rng.random() * 0.03)
                    if rng.random() < 0.1:
                        conn.rollback()
                    else:
                        conn.commit()
                        with lock:
                            committed.extend(ids)

        seen = []
        reader_error = []

        def reader():
            try:
                with self.pg.connect() as conn:
                    r = outbox_reader.OutboxReader(conn)
                    while not stop.is_set():
                        seen.extend(row[0] for row in r.poll())
                        time.sleep(0.005)
                    seen.extend(row[0] for row in r.poll())
            except Exception as e:  # reported below
                reader_error.append(e)

        writers = [threading.Thread(target=writer, args=(s,)) for s in range(6)]
        r = threading.Thread(target=reader)
        r.start()
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        stop.set()
        r.join()
        self.assertEqual(reader_error, [])
        self.assertEqual(len(seen), len(set(seen)), "a row was read twice")
        self.assertEqual(sorted(seen), sorted(committed))
        self.assertGreater(len(committed), 200)

    def test_a_non_superuser_may_call_it(self):
        self.pg.sql("DROP ROLE IF EXISTS wm_reader")
        self.pg.sql("CREATE ROLE wm_reader LOGIN")
        with psycopg.connect(host=self.pg.dir, port=self.pg.port, user="wm_reader",
                             dbname="postgres", autocommit=True) as conn:
            issued = conn.execute("SELECT snowflake_next()").fetchone()[0]
            self.assertGreater(conn.execute("SELECT snowflake_safe_upto()").fetchone()[0], issued)


class SequenceStart(unittest.TestCase):
    """snowflake.sequence_start = random: reloadable, and at low traffic IDs are no longer
    all even, while they still strictly increase."""

    def test_random_start_spreads_low_traffic_ids(self):
        pg = Cluster("seqstart", SETTINGS).init()
        self.addCleanup(pg.destroy)
        pg.start()
        pg.sql("CREATE EXTENSION snowflake")
        query = "SELECT snowflake_next(), pg_sleep(0.002) FROM generate_series(1, 200)"
        zero = [r[0] for r in pg.sql(query)]
        self.assertTrue(all(i % 4096 == 0 for i in zero), "zero: every ID starts its millisecond at 0")
        with pg.connect() as conn:
            e = error_of(conn, "SET snowflake.sequence_start = 'random'")
            self.assertEqual(e.sqlstate, "55P02")
        pg.reload(snowflake__sequence_start="'random'")
        rand = [r[0] for r in pg.sql(query)]
        self.assertEqual(rand, sorted(rand))
        self.assertGreater(min(rand), max(zero))
        self.assertTrue(all(i % 4096 < 256 for i in rand))
        even = sum(1 for i in rand if i % 2 == 0)
        self.assertTrue(40 < even < 160, f"{even} even IDs of 200")
        self.assertEqual(len({i % 8 for i in rand}), 8)
        # A block of 4,096 still fits: it starts at 0 of a new millisecond.
        first = pg.one("SELECT snowflake_next_block(4096)")
        self.assertEqual(first % 4096, 0)


class WatermarkFailover(unittest.TestCase):
    """A prepared transaction replicated to a standby keeps holding the watermark after the
    standby is promoted: the hold travels in the WAL."""

    def test_prepared_hold_survives_promotion(self):
        primary = Cluster("wm-primary", SETTINGS).init()
        standby = Cluster("wm-standby")
        self.addCleanup(primary.destroy)
        self.addCleanup(standby.destroy)
        primary.start()
        primary.sql("CREATE EXTENSION snowflake")
        primary.sql("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_next())")
        standby.init_standby_of(primary)
        standby.start()
        standby.walreceiver_pid()
        with primary.connect(autocommit=False) as conn:
            held = conn.execute("INSERT INTO t DEFAULT VALUES RETURNING id").fetchone()[0]
            conn.execute("PREPARE TRANSACTION 'wm_failover'")
        primary.sql("INSERT INTO t DEFAULT VALUES")
        standby.wait_replayed(primary)
        with standby.connect() as conn:
            e = error_of(conn, "SELECT snowflake_safe_upto()")
            self.assertEqual(e.sqlstate, "25006")
        primary.stop("immediate")
        standby.promote()
        wait_until(lambda: not standby.one("SELECT pg_is_in_recovery()"), what="promotion")
        self.assertLessEqual(upto(standby), held)
        standby.sql("COMMIT PREPARED 'wm_failover'")
        self.assertGreater(upto(standby), held)


if __name__ == "__main__":
    unittest.main()
