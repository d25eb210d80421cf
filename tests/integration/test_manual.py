"""The manual's procedures, run as the manual writes them (issue 38): changing the epoch
before any ID exists (docs/configuration.md, "Choosing the epoch"), uninstalling
(docs/install.md, "Uninstall"), and the claim of docs/migrating.md that new IDs are above
pgEdge's. When a step here changes, the page must change with it.
"""

import os
import re
import unittest

from harness import Cluster, error_of, wait_until

PRELOAD = "'snowflake'"
EPOCH_2015 = "'2015-01-01 00:00:00+00'"
EPOCH_2015_MS = 1420070400000

# docs/install.md, Uninstall, step 1: what in this database uses the extension's objects.
USES_QUERY = """
SELECT pg_describe_object(d.classid, d.objid, d.objsubid)
  FROM pg_depend d
  JOIN pg_depend member ON member.classid = d.refclassid AND member.objid = d.refobjid
 WHERE member.refclassid = 'pg_extension'::regclass
   AND member.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'snowflake')
   AND member.deptype = 'e'
   AND d.deptype = 'n'
   AND NOT EXISTS (SELECT FROM pg_depend own          -- not the extension's own objects
                    WHERE own.classid = d.classid AND own.objid = d.objid
                      AND (own.deptype = 'e'
                           OR own.deptype = 'i' AND EXISTS (
                                  SELECT FROM pg_depend m
                                   WHERE m.classid = own.refclassid
                                     AND m.objid = own.refobjid AND m.deptype = 'e')))
 ORDER BY 1
"""

SETTINGS = {
    "shared_preload_libraries": PRELOAD,
    "snowflake.worker_id": "1",
    "wal_level": "replica",
}


def doc_settings():
    """The settings table of docs/configuration.md: name -> (default, range) cells."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                        "configuration.md")
    rows = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"\|\s*`(snowflake\.[a-z_]+)`\s*\|([^|]*)\|([^|]*)\|", line)
            if m:
                rows[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    return rows


MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000}


def in_ms(text):
    """`10s`, `1ms`, `10min`, `1h`, `0` -> ms."""
    m = re.fullmatch(r"(\d+)\s*(ms|s|min|h)?", text.strip().strip("`"))
    if not m:
        raise ValueError(text)
    return int(m.group(1)) * MS[m.group(2) or "ms"]


class SettingsTable(unittest.TestCase):
    """docs/configuration.md's settings table against what the server reports in
    pg_settings: every default, range and enum value as the table writes it."""

    def test_defaults_and_ranges_match_pg_settings(self):
        pg = Cluster("settingstable", dict(SETTINGS)).init()
        self.addCleanup(pg.destroy)
        pg.start()
        docs = doc_settings()
        rows = pg.sql("SELECT name, vartype, boot_val, min_val, max_val, unit, enumvals "
                      "FROM pg_settings WHERE name LIKE 'snowflake.%'")
        self.assertEqual(sorted(docs), sorted(r[0] for r in rows))
        for name, vartype, boot, lo, hi, unit, enumvals in rows:
            default, range_ = docs[name]
            with self.subTest(setting=name):
                if vartype == "integer" and unit == "ms":
                    self.assertEqual(in_ms(default), int(boot))
                    low, _, high = range_.partition("..")
                    self.assertEqual(in_ms(low), int(lo))
                    if high.strip():
                        self.assertEqual(in_ms(high), int(hi))
                    else:
                        self.assertEqual(int(hi), 2**31 - 1)  # written "0 .."
                elif vartype == "integer":
                    self.assertEqual(int(default.strip("`")), int(boot))
                    self.assertEqual(range_, f"{lo} .. {hi}")
                elif vartype == "enum":
                    self.assertEqual(default.strip("`"), boot)
                    self.assertEqual(re.findall(r"`([a-z]+)`", range_), list(enumvals))
                elif boot:
                    self.assertEqual(default.strip("`"), boot)
                else:
                    self.assertTrue(default.startswith("*(none"), default)


class EpochChosenLate(unittest.TestCase):
    """CREATE EXTENSION ran before the preload and the epoch were configured, so every
    database recorded Twitter's epoch; no ID exists. The recipe records the new one: in one
    database by recreating the extension, in the other by updating snowflake_origin."""

    def setUp(self):
        self.pg = Cluster("epochlate").init()
        self.addCleanup(self.pg.destroy)

    def test_the_recipe_records_the_new_epoch(self):
        pg = self.pg
        pg.start()
        pg.sql("CREATE EXTENSION snowflake")
        pg.sql("CREATE DATABASE other")
        pg.sql("CREATE EXTENSION snowflake", dbname="other")
        pg.stop()
        pg.configure(**SETTINGS, snowflake__epoch=EPOCH_2015)
        pg.start()
        for db in ("postgres", "other"):
            with pg.connect(db) as conn:
                e = error_of(conn, "SELECT snowflake_next()")
            self.assertEqual(e.sqlstate, "55000")
            self.assertIn("does not match the epoch recorded in this database",
                          e.diag.message_primary)
        # Step 1: no ID was issued, so there is no state file to remove.
        self.assertFalse(os.path.exists(os.path.join(pg.data, "snowflake.state")))
        # Step 2, both ways.
        pg.sql(f"UPDATE snowflake_origin SET epoch_unix_ms = {EPOCH_2015_MS}")
        pg.sql("DROP EXTENSION snowflake", dbname="other")
        pg.sql("CREATE EXTENSION snowflake", dbname="other")
        # Step 3: new sessions.
        for db in ("postgres", "other"):
            with pg.connect(db) as conn:
                late = conn.execute(
                    "SELECT abs(extract(epoch FROM snowflake_to_timestamp(snowflake_next()) "
                    "- now())) < 60, (SELECT epoch_unix_ms FROM snowflake_origin)").fetchone()
            self.assertEqual(late, (True, EPOCH_2015_MS), db)


class FromPgedge(unittest.TestCase):
    """docs/migrating.md: with the default epoch, every new ID is above every ID pgEdge's
    extension can have issued up to now (41 bits of ms since 2023-01-01, then any node and
    counter), with a second to spare for its clocks."""

    def test_new_ids_are_above_pgedges(self):
        pg = Cluster("frompgedge", dict(SETTINGS)).init()
        self.addCleanup(pg.destroy)
        pg.start()
        pg.sql("CREATE EXTENSION snowflake")
        # PostgreSQL gives << and | one precedence, left to right: every shift is bracketed
        # (unbracketed, the layout's bits were shifted again and wrapped around, and the
        # test began to fail on 2026-12-01).
        ours, pgedge_max = pg.sql(
            "SELECT snowflake_next(), "
            "(((extract(epoch FROM clock_timestamp()) * 1000)::bigint + 1000 - 1672531200000) "
            "<< 22) | (1023 << 12) | 4095")[0]
        self.assertGreater(ours, pgedge_max)


class Uninstall(unittest.TestCase):
    """The uninstall procedure on a primary with a streaming standby: every use found and
    moved off (a default, a generated column, a view), the extension dropped, the WAL made
    free of its records, both servers restarted without the library, the data intact."""

    def setUp(self):
        self.primary = Cluster("uninstp", dict(SETTINGS)).init()
        self.addCleanup(self.primary.destroy)
        self.primary.start()
        self.primary.sql("CREATE EXTENSION snowflake")
        self.primary.sql(
            "CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_next(), "
            "created timestamptz GENERATED ALWAYS AS (snowflake_to_timestamp(id)) STORED, "
            "item text)")
        self.primary.sql("CREATE VIEW recent AS "
                         "SELECT id, snowflake_to_timestamp(id) AS at FROM orders")
        self.primary.sql("INSERT INTO orders (item) SELECT 'x' FROM generate_series(1, 100)")

    def without_the_library(self, c):
        c.configure(shared_preload_libraries=None, snowflake__worker_id=None)

    def test_the_procedure(self):
        primary = self.primary
        standby = Cluster("uninsts").init_standby_of(primary)
        self.addCleanup(standby.destroy)
        standby.start()
        standby.walreceiver_pid()
        before = primary.sql("SELECT id, created FROM orders ORDER BY id")

        # 1. Find what uses the extension.
        uses = [r[0] for r in primary.sql(USES_QUERY)]
        self.assertEqual(uses, ["default value for column created of table orders",
                                "default value for column id of table orders",
                                "rule _RETURN on view recent"])
        with primary.connect() as conn:
            e = error_of(conn, "DROP EXTENSION snowflake")
        self.assertEqual(e.sqlstate, "2BP01")

        # 2. Move each off.
        primary.sql("ALTER TABLE orders ALTER COLUMN id DROP DEFAULT")
        primary.sql("ALTER TABLE orders ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY")
        primary.sql("SELECT setval(pg_get_serial_sequence('orders', 'id'), "
                    "(SELECT max(id) FROM orders))")
        primary.sql("ALTER TABLE orders ALTER COLUMN created DROP EXPRESSION")
        primary.sql("DROP VIEW recent")
        self.assertEqual(primary.sql(USES_QUERY), [])

        # 3. Drop it.
        primary.sql("DROP EXTENSION snowflake")

        # 4. No WAL that needs the library: a checkpoint on the primary, replayed and
        # followed by a restartpoint on the standby; then both restart without it.
        primary.sql("CHECKPOINT")
        standby.wait_replayed(primary)
        standby.sql("CHECKPOINT")
        standby.stop()
        self.without_the_library(standby)
        standby.start()
        primary.stop("fast")
        self.without_the_library(primary)
        primary.start()

        self.assertEqual(primary.sql("SELECT id, created FROM orders ORDER BY id"), before)
        primary.sql("INSERT INTO orders (item) VALUES ('after')")
        new_id = primary.one("SELECT id FROM orders WHERE item = 'after'")
        self.assertGreater(new_id, before[-1][0])
        standby.wait_replayed(primary)
        self.assertEqual(standby.one("SELECT count(*) FROM orders"), 101)

        # 5. The files the extension left in the data directories.
        for c in (primary, standby):
            left = sorted(f for f in os.listdir(c.data) if f.startswith("snowflake."))
            self.assertTrue(set(left) <= {"snowflake.state", "snowflake.origins",
                                          "snowflake.prepared", "snowflake.claim",
                                          "snowflake.claim_token", "snowflake.fleet_ttl"},
                            left)

    def test_without_the_checkpoint_the_server_does_not_start(self):
        """Step 4's reason: a crash after the last ID leaves WAL that only the library can
        replay, and a server started without it refuses."""
        primary = self.primary
        primary.stop("immediate")
        self.without_the_library(primary)
        self.assertFalse(primary.start(check=False))
        wait_until(lambda: "resource manager" in primary.log(), what="the replay error")
        self.assertIn("shared_preload_libraries", primary.log())
        # Back with the library, it recovers; the procedure then works.
        primary.configure(**SETTINGS)
        primary.start()
        self.assertEqual(primary.one("SELECT count(*) FROM orders"), 100)


if __name__ == "__main__":
    unittest.main()
