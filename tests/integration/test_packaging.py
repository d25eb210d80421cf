"""Upgrades and installation rights: the previous release updates in place to the same
objects a fresh install creates, and a non-superuser can install the (trusted) extension
without gaining any way to change what decides uniqueness."""

import unittest

import psycopg

from harness import Cluster, error_of

# Every object of the extension, with what defines it: signatures, result types,
# volatility/strictness/parallel safety, function bodies, type columns, view text.
FINGERPRINT = """
SELECT pg_describe_object(d.classid, d.objid, 0) AS object,
       CASE d.classid
         WHEN 'pg_proc'::regclass THEN
           (SELECT concat_ws(' | ', pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
                             p.provolatile, p.proisstrict, p.proparallel, p.prosecdef, p.proconfig::text,
                             CASE WHEN p.prolang = (SELECT l.oid FROM pg_language l WHERE l.lanname = 'c') THEN p.prosrc ELSE md5(p.prosrc) END,
                             obj_description(p.oid, 'pg_proc'))
              FROM pg_proc p WHERE p.oid = d.objid)
         WHEN 'pg_type'::regclass THEN
           (SELECT concat_ws(' | ', string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum),
                             obj_description(t.oid, 'pg_type'))
              FROM pg_type t LEFT JOIN pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0
             WHERE t.oid = d.objid GROUP BY t.oid)
         WHEN 'pg_class'::regclass THEN
           (SELECT concat_ws(' | ', pg_get_viewdef(c.oid), c.relacl::text, obj_description(c.oid, 'pg_class'))
              FROM pg_class c WHERE c.oid = d.objid)
       END AS definition
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
 WHERE e.extname = 'snowflake' AND d.deptype = 'e'
 ORDER BY 1
"""


class Upgrade(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.pg = Cluster("upgrade", {"shared_preload_libraries": "'snowflake'",
                                     "snowflake.worker_id": "12"}).init()
        cls.pg.start()

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()

    def test_previous_release_updates_in_place(self):
        self.pg.sql("CREATE DATABASE old")
        self.pg.sql("CREATE DATABASE fresh")
        with self.pg.connect("old") as conn:
            conn.execute("CREATE EXTENSION snowflake VERSION '0.1.0'")
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_next(), v int)")
            conn.execute("INSERT INTO t (v) SELECT g FROM generate_series(1, 1000) g")
            before = conn.execute("SELECT max(id) FROM t").fetchone()[0]
            # 0.1.0 has no stats and no batches.
            e = error_of(conn, "SELECT snowflake_next_batch(2)")
            self.assertEqual(e.sqlstate, "42883")
            conn.execute("ALTER EXTENSION snowflake UPDATE")
            version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'snowflake'").fetchone()[0]
            self.assertEqual(version, "0.7.0")
            # Behaviour after the update: the same table keeps working, new API present.
            conn.execute("INSERT INTO t (v) VALUES (1001)")
            self.assertGreater(conn.execute("SELECT max(id) FROM t").fetchone()[0], before)
            batch = conn.execute("SELECT snowflake_next_batch(3)").fetchone()[0]
            self.assertEqual(len(batch), 3)
            self.assertGreaterEqual(conn.execute("SELECT ids_issued FROM snowflake_stats").fetchone()[0], 1004)
            upgraded = conn.execute(FINGERPRINT).fetchall()
        with self.pg.connect("fresh") as conn:
            conn.execute("CREATE EXTENSION snowflake")
            fresh = conn.execute(FINGERPRINT).fetchall()
        self.assertEqual(upgraded, fresh)
        self.assertGreater(len(fresh), 10)


class TrustedInstall(unittest.TestCase):

    def test_non_superuser_installs_and_uses_it(self):
        pg = Cluster("trusted", {"shared_preload_libraries": "'snowflake'",
                                 "snowflake.worker_id": "13"}).init()
        try:
            pg.start()
            pg.sql("CREATE ROLE app LOGIN")
            pg.sql("CREATE DATABASE appdb OWNER app")
            conn = psycopg.connect(host=pg.dir, port=pg.port, user="app", dbname="appdb", autocommit=True)
            with conn:
                self.assertFalse(conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0])
                conn.execute("CREATE EXTENSION snowflake")
                conn.execute("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_next())")
                conn.execute("INSERT INTO t DEFAULT VALUES")
                self.assertEqual(conn.execute("SELECT (snowflake_decode(id)).worker_id FROM t").fetchone()[0], 13)
                self.assertEqual(conn.execute("SELECT worker_id FROM snowflake_stats").fetchone()[0], 13)
                # Nothing that decides uniqueness is within reach.
                for stmt in ("SET snowflake.worker_id = 1", "ALTER SYSTEM SET snowflake.worker_id = 1",
                             "SET snowflake.max_clock_drift = '1h'"):
                    e = error_of(conn, stmt)
                    self.assertIn(e.sqlstate, ("55P02", "42501"), stmt)
                # The extension's objects belong to the bootstrap superuser, not to app.
                owner = conn.execute("""SELECT pg_get_userbyid(proowner) FROM pg_proc
                                         WHERE proname = 'snowflake_next'""").fetchone()[0]
                self.assertEqual(owner, "postgres")
        finally:
            pg.destroy()


if __name__ == "__main__":
    unittest.main(verbosity=2)
