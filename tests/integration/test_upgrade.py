"""Upgrades and restores (issue 9): the state file stays in the old data directory, but table
snowflake_origin travels with the database. A server that receives a database whose IDs
another cluster issued resumes past every lease that cluster could have written, IDs
borrowed ahead of the clock included, and refuses to generate or decode with another epoch.

Both tests borrow IDs far ahead of the clock on the old cluster (snowflake_next_block takes a
whole millisecond per call, so 25,000 calls put the ID clock about 25 s ahead), then move the
database while the old IDs are still in the new server's future.
"""

import os
import shutil
import re
import subprocess
import unittest

from harness import BASE, PG_BIN, PG_MAJOR, Cluster, as_postgres, error_of

EPOCH = "'2021-01-01 00:00:00+00'"
# Drift allows the borrowing; a small window keeps the resume wait close to the drift.
SETTINGS = {
    "shared_preload_libraries": "'snowflake'",
    "snowflake.max_clock_drift": "'30s'",
    "snowflake.lease_window": "'100ms'",
}


def borrow_ahead(conn, blocks=25_000):
    """Issues `blocks` whole milliseconds in one statement and returns the highest ID issued
    and how far (ms) its time is ahead of the clock."""
    first = conn.execute("SELECT max(snowflake_next_block(4096)) FROM generate_series(1, %s)",
                         (blocks,)).fetchone()[0]
    highest = first + 4095
    ahead = conn.execute("""SELECT (extract(epoch FROM snowflake_to_timestamp(%s) - clock_timestamp()) * 1000)::bigint""",
                         (highest,)).fetchone()[0]
    return highest, ahead


def prepare_origin(test, pg):
    """A database `app` with the extension, stored IDs and IDs borrowed about 25 s ahead.
    Returns (highest ID issued, the stored IDs with their decoded times)."""
    pg.sql("CREATE DATABASE app")
    with pg.connect("app") as conn:
        conn.execute("CREATE EXTENSION snowflake")
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_next(), n int)")
        conn.execute("INSERT INTO t (n) SELECT g FROM generate_series(1, 1000) g")
        highest, ahead = borrow_ahead(conn)
        test.assertGreater(ahead, 20_000, "the old cluster did not borrow far enough ahead")
        conn.execute("INSERT INTO t (id, n) VALUES (%s, 0)", (highest,))
        stored = conn.execute("SELECT id, snowflake_to_timestamp(id) FROM t ORDER BY id").fetchall()
    return highest, stored


def issue_after_move(test, pg, highest, stored):
    """On the server that received `app`: the first IDs come after every old one (waiting for
    the resume point), old IDs decode as before, and the takeover is logged and recorded."""
    with pg.connect("app") as conn:
        conn.execute("SET statement_timeout = '90s'")
        first = conn.execute("SELECT snowflake_next()").fetchone()[0]
        batch = conn.execute("SELECT snowflake_next_batch(10000)").fetchone()[0]
        conn.execute("INSERT INTO t (n) SELECT g FROM generate_series(1, 1000) g")
        new_rows = conn.execute("SELECT count(*) FROM t WHERE id > %s", (highest,)).fetchone()[0]
        decoded = conn.execute("SELECT id, snowflake_to_timestamp(id) FROM t WHERE id <= %s ORDER BY id",
                               (highest,)).fetchall()
    test.assertGreater(first, highest)
    test.assertGreater(min(batch), highest)
    test.assertEqual(new_rows, 1000)
    test.assertEqual(decoded, stored)
    test.assertRegex(pg.log(), r"IDs were issued by the cluster with system identifier \d+; IDs resume at")
    test.assertTrue(os.path.exists(os.path.join(pg.data, "snowflake.origins")))


class DumpAndRestore(unittest.TestCase):
    """pg_dump of a database whose IDs run 25 s ahead of the clock, restored at once into
    another cluster with the same worker id (a replacement server)."""

    def test_restored_database_resumes_past_the_origin(self):
        src = Cluster("restore-src", {**SETTINGS, "snowflake.worker_id": "7", "snowflake.epoch": EPOCH})
        dst = Cluster("restore-dst", {**SETTINGS, "snowflake.worker_id": "7", "snowflake.epoch": EPOCH})
        self.addCleanup(src.destroy)
        self.addCleanup(dst.destroy)
        src.init().start()
        dst.init().start()
        highest, stored = prepare_origin(self, src)
        dump = os.path.join(src.dir, "app.dump")
        as_postgres(f"{PG_BIN}/pg_dump", "-Fc", "-h", src.dir, "-p", str(src.port), "-U", "postgres",
                    "-f", dump, "app", capture=True)
        dst.sql("CREATE DATABASE app")
        as_postgres(f"{PG_BIN}/pg_restore", "--exit-on-error", "-h", dst.dir, "-p", str(dst.port),
                    "-U", "postgres", "-d", "app", dump, capture=True)
        # Both clusters' rows: the restore's CREATE EXTENSION wrote dst's, the dump src's.
        with dst.connect("app") as conn:
            origins = {r[0] for r in conn.execute("SELECT system_identifier FROM snowflake_origin")}
        self.assertEqual(len(origins), 2)
        issue_after_move(self, dst, highest, stored)
        # Recorded: a restart does not take the origin over again (no second wait logged).
        dst.restart()
        with dst.connect("app") as conn:
            self.assertGreater(conn.execute("SELECT snowflake_next()").fetchone()[0], highest)
        self.assertEqual(len(re.findall("IDs resume at", dst.log())), 1)


def _old_major_bin():
    """PostgreSQL 17's binaries when this run tests 18 and 17 has this build installed."""
    bin17 = "/usr/lib/postgresql/17/bin"
    if PG_MAJOR != "18" or not os.path.exists(f"{bin17}/pg_config"):
        return None
    share = subprocess.run([f"{bin17}/pg_config", "--sharedir"], text=True,
                           capture_output=True).stdout.strip()
    ours = subprocess.run([f"{PG_BIN}/pg_config", "--sharedir"], text=True,
                          capture_output=True).stdout.strip()
    try:
        with open(f"{share}/extension/snowflake.control") as a, open(f"{ours}/extension/snowflake.control") as b:
            return bin17 if a.read() == b.read() else None
    except OSError:
        return None


OLD_BIN = _old_major_bin()


@unittest.skipUnless(OLD_BIN, "runs in the PostgreSQL 18 stage, with this build installed in 17")
class PgUpgrade(unittest.TestCase):
    """pg_upgrade 17 -> 18 with IDs borrowed 25 s ahead and a custom epoch, which the new
    configuration first forgets."""

    def test_upgrade_keeps_ids_unique_and_the_epoch(self):
        old = Cluster("upgrade-17", {**SETTINGS, "snowflake.worker_id": "9", "snowflake.epoch": EPOCH},
                      bin_dir=OLD_BIN)
        new = Cluster("upgrade-18", {**SETTINGS, "snowflake.worker_id": "9"})
        self.addCleanup(old.destroy)
        self.addCleanup(new.destroy)
        # PostgreSQL 18's initdb enables data checksums by default; pg_upgrade needs both alike.
        old.init("--data-checksums").start()
        highest, stored = prepare_origin(self, old)
        old.stop()
        new.init()
        work = os.path.join(BASE, "pg_upgrade-work")
        os.makedirs(work, exist_ok=True)
        # Removed before the clusters' own cleanup, so that the run's base directory goes too.
        self.addCleanup(shutil.rmtree, work, True)
        os.chown(work, *_postgres_ids())
        r = subprocess.run(["runuser", "-u", "postgres", "--", f"{PG_BIN}/pg_upgrade",
                            "-b", OLD_BIN, "-B", PG_BIN, "-d", old.data, "-D", new.data,
                            "-p", str(old.port), "-P", str(new.port), "-s", work, "--no-sync"],
                           cwd=work, text=True, capture_output=True)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        new.start()
        # The epoch line was forgotten: refuse rather than generate or decode with another epoch.
        with new.connect("app") as conn:
            for query in ("SELECT snowflake_next()", f"SELECT snowflake_to_timestamp({highest})"):
                e = error_of(conn, query)
                self.assertEqual(e.sqlstate, "55000", query)
                self.assertIn("does not match the epoch recorded in this database", e.diag.message_primary)
                self.assertIn("snowflake.epoch = '2021-01-01", e.diag.message_hint)
        self.assertFalse(os.path.exists(os.path.join(new.data, "snowflake.state")))
        new.stop()
        new.configure(snowflake__epoch=EPOCH)
        new.start()
        issue_after_move(self, new, highest, stored)


def _postgres_ids():
    import pwd
    p = pwd.getpwnam("postgres")
    return p.pw_uid, p.pw_gid


if __name__ == "__main__":
    unittest.main(verbosity=2)
