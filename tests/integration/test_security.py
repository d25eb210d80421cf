"""Security probes: attacks by roles that are not superusers (or by inputs nobody checked),
each reproduced against a real cluster, with the behaviour the extension must show instead.

1. RegistryPasswordIsNeverShown: the password of snowflake.registry, in any URI form, reaches
   no ordinary role (snowflake_stats, snowflake_next()'s error, pg_settings) and no log line.
2. PlantedOrigin*: a database owner plants a snowflake_origin table (120,000 fake system
   identifiers, or another epoch) to stall every database's first snowflake_next(), flood
   the log, write the data directory, or change how IDs decode.
3. ConvertColumnEscalation: a superuser's snowflake_convert_column() runs a CHECK function
   of another role's referencing table with superuser rights.
4. ParallelCreateTableAs: the first call of a backend inside a parallel CREATE TABLE AS
   (or SELECT INTO, materialized view) fails with an internal error.
5. NonUtf8Databases / 7: text arguments in LATIN1 and SQL_ASCII databases, and a seeded
   random sweep of byte strings: input errors with their SQLSTATE, never XX000.
6. OversizedSerial: a serial longer than PostgreSQL's 1 GB text limit is 54000.
7. Across every class: no error is XX000 or carries Rust text (see assertCleanError).
8. HostileSearchPath: look-alike functions and operators in a schema earlier in the
   caller's search_path are never called by the extension.
"""

import os
import random
import subprocess
import threading
import time
import unittest

import psycopg

from harness import Cluster, error_of, wait_until
from fixtures.registries import free_port

PRELOAD = "'snowflake'"
# Discord's documented example ID; on our layout it decodes too.
SOME_ID = 1541815603606036480
TWITTER_EPOCH_MS = 1288834974657  # the default epoch
OTHER_EPOCH_MS = 1420070400000    # 2015-01-01 00:00:00 UTC
# Text that only a Rust panic or a Rust error's Debug form puts into an error.
RUST_TEXT = ("panicked", "Utf8Error", "should be valid UTF-8", "assertion failed", ".rs:", "unwrap")
ADOPTED_LOG = "IDs were issued by the cluster with system identifier"



def connect(pg, user="postgres", dbname="postgres", **kwargs):
    """A connection to `pg` as `user` (trust authentication)."""
    return psycopg.connect(host=pg.dir, port=pg.port, user=user, dbname=dbname,
                           autocommit=True, **kwargs)


class SecurityCase(unittest.TestCase):
    """One cluster per class; every error any probe meets goes through assertCleanError."""

    pg = None

    @classmethod
    def start_cluster(cls, name, preload=True, **settings):
        base = {"shared_preload_libraries": PRELOAD, "snowflake.worker_id": "1"} if preload else {}
        base.update(settings)
        cls.pg = Cluster(name, base)
        cls.addClassCleanup(cls.pg.destroy)
        cls.pg.init()
        # A backtrace must never reach a client, even with RUST_BACKTRACE set.
        cls.pg.env.update({"RUST_BACKTRACE": "1"})
        cls.pg.start()

    def assertCleanError(self, e, what=""):
        """A real SQLSTATE (not XX000) and no Rust text in message, detail or hint."""
        self.assertIsNotNone(e.sqlstate, f"{what}: no SQLSTATE ({e})")
        self.assertNotEqual(e.sqlstate, "XX000", f"{what}: internal error: {e}")
        for field in (str(e), e.diag.message_primary, e.diag.message_detail, e.diag.message_hint):
            for rust in RUST_TEXT:
                self.assertNotIn(rust, field or "", f"{what}: Rust text reached the client: {field!r}")

    def failing(self, conn, query, params=None):
        """Runs a statement that must fail; returns its (clean) error."""
        e = error_of(conn, query, params)
        self.assertCleanError(e, query)
        return e

    def outcome(self, conn, query, params=None):
        """(None, rows) or (SQLSTATE, error) of one statement; an error must be clean."""
        try:
            cur = conn.execute(query, params)
            return None, (cur.fetchall() if cur.description else None)
        except psycopg.Error as e:
            self.assertCleanError(e, query)
            self.assertFalse(conn.closed, f"{query}: the session ended ({e})")
            return e.sqlstate, e


# ---------------------------------------------------------------------------------------
# 1. The registry's password


class RegistryPasswordIsNeverShown(SecurityCase):
    """snowflake.registry may hold a password (in the userinfo, percent-encoded or not, or
    in a password= parameter). With the registry down, an ordinary role reads
    snowflake_stats, provokes snowflake_next()'s 55000 error and looks at pg_settings; the
    server log is read too. The password must appear in none of them, while the view still
    names the registry's scheme, user, host:port and database to the superuser, and only its
    scheme to the ordinary role: neither the registry's address nor its client's error text
    reaches a role that may not read snowflake.registry."""

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()  # nothing listens there: the registry is down
        cls.host = f"127.0.0.1:{cls.port}"
        cls.start_cluster("sec-registry", **{
            "snowflake.worker_id": "auto", "snowflake.datacenter_id": "1",
            "snowflake.claim_ttl": "'2s'",
            "snowflake.registry": f"'redis://{cls.host}/0'"})
        cls.pg.sql("CREATE EXTENSION snowflake")
        cls.pg.sql("CREATE ROLE mallory LOGIN NOSUPERUSER")

    def forms(self):
        """(URI, password fragment that must never appear, scheme, user shown, ending)."""
        h = self.host
        return [
            (f"postgresql://reguser:Pa/ssw0rd@{h}/db", "ssw0rd", "postgresql", "reguser", f"{h}/db"),
            (f"postgresql://reguser:Pa%2Fssw0rd@{h}/db", "ssw0rd", "postgresql", "reguser", f"{h}/db"),
            (f"postgresql://reguser@{h}/db?password=Sekr3tQ", "Sekr3t", "postgresql", "reguser", f"{h}/db"),
            (f"postgresql://{h}/db?user=reguser&sslmode=disable&password=Sekr3tQ", "Sekr3t",
             "postgresql", None, f"{h}/db"),
            (f"postgresql://reguser:Pa?ssw0rd@{h}/db", "ssw0rd", "postgresql", "reguser", f"{h}/db"),
            (f"redis://:R3disPw@{h}/0", "R3disPw", "redis", None, f"{h}/0"),
            (f"redis://default:R3disPw@{h}", "R3disPw", "redis", "default", h),
            (f"rediss://default:TlsR3disPw@{h}:6380/0", "TlsR3disPw", "rediss", "default", f"{h}:6380/0"),
            (f"redis+sentinel://:S3ntinelPw@{h}:26379,{h}:26380/mymaster", "S3ntinelPw",
             "redis+sentinel", None, f"{h}:26380/mymaster"),
            (f"etcd://snowuser:Etcd5ecretPw@{h}:2379,{h}:2380/snow", "Etcd5ecretPw", "etcd", "snowuser",
             f"{h}:2380/snow"),
        ]

    def test_password_forms(self):
        for uri, secret, scheme, user, ending in self.forms():
            with self.subTest(uri=uri):
                # Every place is checked before the subtest fails: the report lists them all.
                problems = []

                def hidden(text, where):
                    # The fragment is common to the raw, percent-encoded and -decoded forms.
                    if secret in (text or ""):
                        problems.append(f"the password leaked in {where}: {text!r}"[:600])

                def display(shown, who):
                    if shown is None:
                        problems.append(f"{who}: snowflake_stats.registry is NULL")
                        return
                    for ok, what in ((shown.startswith(f"{scheme}://"), f"starts with {scheme}://"),
                                     (self.host in shown, f"shows the host {self.host}"),
                                     ("?" not in shown, "shows no query parameters"),
                                     (shown.endswith(ending), f"ends with {ending}"),
                                     (user is None or user in shown, f"shows the user {user}")):
                        if not ok:
                            problems.append(f"{who}: snowflake_stats.registry {shown!r} is not as expected: "
                                            f"it should have {what}")

                log_from = len(self.pg.log())
                self.pg.stop()
                self.pg.configure(snowflake__registry=f"'{uri}'")
                self.pg.start()
                wait_until(lambda: self.pg.one("SELECT claim_status FROM snowflake_stats") != "starting",
                           what="the registry worker's first attempt")
                with connect(self.pg, "mallory") as m:
                    shown = m.execute("SELECT registry FROM snowflake_stats").fetchone()[0]
                    hidden(shown, "snowflake_stats (ordinary role)")
                    # An ordinary role sees the kind of registry, not its hosts or users
                    # (snowflake.registry is a superuser-only setting).
                    if shown != f"{scheme}://…":
                        problems.append(f"mallory: snowflake_stats.registry is {shown!r}, not {scheme}://…")

                    e = self.failing(m, "SELECT snowflake_next()")
                    if e.sqlstate != "55000":
                        problems.append(f"snowflake_next() gave {e.sqlstate}, not 55000: {e}")
                    for name in ("message_primary", "message_detail", "message_hint", "context"):
                        hidden(getattr(e.diag, name), f"snowflake_next()'s {name} (ordinary role)")
                        # Nor the registry's address, or what the registry or its client said.
                        for shown_to_all in (str(self.port), "127.0.0.1", "onnection", "os error"):
                            if shown_to_all in (getattr(e.diag, name) or ""):
                                problems.append(f"snowflake_next()'s {name} shows {shown_to_all!r} "
                                                f"to an ordinary role: {getattr(e.diag, name)!r}")

                    settings = m.execute("""SELECT name, setting, reset_val, boot_val FROM pg_settings
                                             WHERE name LIKE 'snowflake.%'""").fetchall()
                    hidden(repr(settings), "pg_settings (ordinary role)")
                    hidden(repr(m.execute("SHOW ALL").fetchall()), "SHOW ALL (ordinary role)")
                    for q in ("SELECT current_setting('snowflake.registry')",
                              "SELECT current_setting('snowflake.registry', true)"):
                        state, got = self.outcome(m, q)
                        hidden(str(got) if state else repr(got), f"{q} (ordinary role)")
                with self.pg.connect() as su:
                    shown = su.execute("SELECT registry FROM snowflake_stats").fetchone()[0]
                    hidden(shown, "snowflake_stats (superuser)")
                    display(shown, "the superuser")
                    e = self.failing(su, "SELECT snowflake_next()")
                    for name in ("message_primary", "message_detail", "message_hint", "context"):
                        hidden(getattr(e.diag, name), f"snowflake_next()'s {name} (superuser)")
                    if self.host not in (e.diag.message_primary or ""):
                        problems.append(f"the superuser's error does not name the registry: {e.diag.message_primary!r}")
                for line in self.pg.log()[log_from:].splitlines():
                    hidden(line, "the server log")
                if problems:
                    self.fail("\n".join(problems))
        # And the whole log of every form, once more.
        log = self.pg.log()
        for uri, secret, *_ in self.forms():
            self.assertFalse(secret in log, f"the password of {uri} is in the server log")


# ---------------------------------------------------------------------------------------
# 2. A planted snowflake_origin


def plant(pg, db, epoch_ms, member, rows=120_000):
    """As `dbowner` (owner of `db`, not a superuser): the trusted extension at 0.2.0 (before
    snowflake_origin existed), then a public.snowflake_origin of its own with `rows` random
    system identifiers recording `epoch_ms`; `member`: also made a member of the extension."""
    pg.sql(f"CREATE DATABASE {db} OWNER dbowner")
    # Earlier versions are for superusers only (sql/snowflake--0.1.0.control): as installed by
    # its database owner while 0.2.0 was trusted, the extension is then made dbowner's.
    pg.sql("CREATE EXTENSION snowflake VERSION '0.2.0'", dbname=db)
    pg.sql("UPDATE pg_extension SET extowner = 'dbowner'::regrole WHERE extname = 'snowflake'", dbname=db)
    with connect(pg, "dbowner", db) as c:
        c.execute("""CREATE TABLE public.snowflake_origin (system_identifier bigint, epoch_unix_ms bigint,
                                                           recorded_at timestamptz DEFAULT now())""")
        c.execute("SELECT setseed(0.5)")
        c.execute("""INSERT INTO public.snowflake_origin (system_identifier, epoch_unix_ms)
                     SELECT ((random() - 0.5) * 1.8e19)::bigint, %s FROM generate_series(1, %s)""",
                  (epoch_ms, rows))
        if member:
            c.execute("ALTER EXTENSION snowflake ADD TABLE public.snowflake_origin")


def bounded(fn, limit):
    """Runs fn() in a thread; (True, its result or exception) or (False, None) after
    `limit` seconds."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as e:  # noqa: BLE001 - handed to the caller
            box["result"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    return (not t.is_alive()), box.get("result")


# The decode functions that version 0.2.0 (the planted databases' version) has.
DECODE_QUERIES = [f"SELECT snowflake_to_timestamp({SOME_ID})",
                  f"SELECT (snowflake_decode({SOME_ID})).ts",
                  f"SELECT snowflake_format({SOME_ID}) ->> 'ts'"]


class _PlantedOriginTests:
    """The tests shared by the preloading clusters (mixed into SecurityCase classes)."""

    EPOCH_MS = TWITTER_EPOCH_MS
    MEMBER = False
    # Hang guards, not bounds on speed: a first call that takes longer than FIRST_CALL_TIMEOUT
    # is cancelled (a failure), one that ignores the cancel for STALL_LIMIT is the stall.
    FIRST_CALL_TIMEOUT = "30s"
    STALL_LIMIT = 60  # seconds

    @classmethod
    def setUpClass(cls):
        cls.start_cluster(cls.NAME)
        cls.pg.sql("CREATE ROLE dbowner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        cls.pg.sql("CREATE DATABASE clean")
        with cls.pg.connect("clean") as c:
            c.execute("CREATE EXTENSION snowflake")
        plant(cls.pg, "planted", cls.EPOCH_MS, cls.MEMBER)
        plant(cls.pg, "planted_upd", cls.EPOCH_MS, cls.MEMBER)

    def first_call(self, user, db):
        """The first snowflake_next() of a fresh backend, under statement_timeout =
        FIRST_CALL_TIMEOUT: (id or the psycopg error, seconds)."""
        started = time.monotonic()
        with connect(self.pg, user, db) as c:
            c.execute(f"SET statement_timeout = '{self.FIRST_CALL_TIMEOUT}'")
            try:
                got = c.execute("SELECT snowflake_next()").fetchone()[0]
            except psycopg.Error as e:
                got = e
        return got, time.monotonic() - started

    def test_first_call_ignores_the_planted_table(self):
        log_from = len(self.pg.log())
        results = {}

        def planted():
            results["planted"] = self.first_call("dbowner", "planted")

        attacker = threading.Thread(target=planted, daemon=True)
        attacker.start()
        # The victim's first call starts once the attacker's holds the lock every first
        # call takes (its log lines have begun), or once the attacker's call has ended.
        wait_until(lambda: not attacker.is_alive() or ADOPTED_LOG in self.pg.log()[log_from:],
                   what="the attacker's call")
        done, victim = bounded(lambda: self.first_call("postgres", "clean"), self.STALL_LIMIT)
        attacker.join(self.STALL_LIMIT)
        if not done or attacker.is_alive():
            # Uninterruptible: only a server stop ends it (and frees the class's cluster).
            self.pg.stop("immediate")
            self.pg.start()
            self.fail(f"a first snowflake_next() stalled for more than {self.STALL_LIMIT} s "
                      f"(victim done: {done}, attacker done: {not attacker.is_alive()})")
        # Every consequence is checked before the test fails: the report lists them all.
        problems = []
        got, elapsed = results["planted"]
        if isinstance(got, psycopg.Error):
            self.assertCleanError(got, "snowflake_next() in planted")
            problems.append(f"snowflake_next() in planted failed after {elapsed:.1f} s: "
                            f"{got.sqlstate} {got.diag.message_primary}")
        self.assertNotIsInstance(victim, Exception, victim)
        vgot, velapsed = victim
        if isinstance(vgot, psycopg.Error):
            self.assertCleanError(vgot, "snowflake_next() in clean")
            problems.append(f"snowflake_next() in another database failed after {velapsed:.1f} s: "
                            f"{vgot.sqlstate} {vgot.diag.message_primary}")
        adopted = self.pg.log()[log_from:].count(ADOPTED_LOG)
        if adopted:
            problems.append(f"the server log has {adopted} lines \"{ADOPTED_LOG} ...\"")
        if os.path.exists(os.path.join(self.pg.data, "snowflake.origins")):
            problems.append("the planted table made the server write $PGDATA/snowflake.origins")
        if isinstance(got, int):
            # The ID decodes the same in the planted database as in a clean one.
            with connect(self.pg, "dbowner", "planted") as c:
                state, here = self.outcome(c, "SELECT snowflake_to_timestamp(%s)", (got,))
            with self.pg.connect("clean") as c:
                there = c.execute("SELECT snowflake_to_timestamp(%s)", (got,)).fetchall()
            if (state, here) != (None, there):
                problems.append(f"the ID decodes as {here} in planted, as {there} in clean")
        if problems:
            self.fail("\n".join(problems))

    def test_decoding_ignores_the_planted_table(self):
        log_from = len(self.pg.log())
        # A fresh backend in the planted database decodes first (no ID generated there).
        queries = DECODE_QUERIES
        for q in queries:
            with self.subTest(query=q):
                with connect(self.pg, "dbowner", "planted") as c:
                    state, here = self.outcome(c, q)
                    self.assertIsNone(state, f"{q} in planted: {here}")
                with self.pg.connect("clean") as c:
                    there = c.execute(q).fetchall()
                self.assertEqual(here, there)
        self.assertNotIn(ADOPTED_LOG, self.pg.log()[log_from:])

    def test_update_does_not_adopt_the_planted_table(self):
        log_from = len(self.pg.log())
        sysid = self.pg.one("SELECT system_identifier FROM pg_control_system()")
        own_table = """SELECT c.oid::regclass::text, r.rolsuper
                         FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
                         JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
                          AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
                         JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake'
                        WHERE c.relname = 'snowflake_origin'"""
        with connect(self.pg, "dbowner", "planted_upd") as c:
            c.execute("SET statement_timeout = '30s'")
            state, e = self.outcome(c, "ALTER EXTENSION snowflake UPDATE")
            version = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'snowflake'").fetchone()[0]
            if state is not None:
                self.assertEqual(version, "0.2.0", "a failed update left another version")
                c.execute("ALTER TABLE public.snowflake_origin RENAME TO planted_origin")
                state, e = self.outcome(c, "ALTER EXTENSION snowflake UPDATE")
                self.assertIsNone(state, f"the update failed once the planted table was renamed: {e}")
            version = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'snowflake'").fetchone()[0]
            self.assertEqual(version, c.execute("""SELECT default_version FROM pg_available_extensions
                                                    WHERE name = 'snowflake'""").fetchone()[0])
            rows = c.execute("SELECT system_identifier FROM public.snowflake_origin").fetchall()
            self.assertEqual(rows, [(sysid,)], "the extension's snowflake_origin is not its own")
        with self.pg.connect("planted_upd") as su:
            self.assertEqual(su.execute(own_table).fetchall(), [("snowflake_origin", True)],
                             "the extension's snowflake_origin must be a superuser's table")
        self.assertNotIn(ADOPTED_LOG, self.pg.log()[log_from:])


class PlantedOrigin(_PlantedOriginTests, SecurityCase):
    """A database owner's public.snowflake_origin (not the extension's): 120,000 fake system
    identifiers with the default epoch. Before: the first snowflake_next() stalls holding a
    lock every database's first call needs, logs a line per identifier and writes
    snowflake.origins. After: ignored."""

    NAME = "sec-planted"


class PlantedOriginAsMember(_PlantedOriginTests, SecurityCase):
    """The same, but the database owner (who owns the trusted extension) made the planted
    table a member with ALTER EXTENSION ... ADD TABLE: still not a superuser's table, still
    ignored."""

    NAME = "sec-planted-member"
    MEMBER = True


class PlantedOriginOtherEpoch(_PlantedOriginTests, SecurityCase):
    """The planted rows record an epoch of 2015: before, snowflake_next() and the decode
    functions in that database refuse (55000), or decode with the wrong epoch; after, the
    table is ignored."""

    NAME = "sec-planted-epoch"
    EPOCH_MS = OTHER_EPOCH_MS


class PlantedOriginWithoutPreload(SecurityCase):
    """Without shared_preload_libraries, the IMMUTABLE decode functions use the epoch that
    snowflake_origin records: a planted table (member or not) must not change how IDs decode
    compared with a clean database of the same server."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster("sec-planted-nopreload", preload=False)
        cls.pg.sql("CREATE ROLE dbowner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        cls.pg.sql("CREATE DATABASE clean")
        with cls.pg.connect("clean") as c:
            c.execute("CREATE EXTENSION snowflake")
        plant(cls.pg, "planted", OTHER_EPOCH_MS, False, rows=1000)
        plant(cls.pg, "planted_member", OTHER_EPOCH_MS, True, rows=1000)

    def test_decoding_ignores_the_planted_table(self):
        queries = DECODE_QUERIES
        with self.pg.connect("clean") as c:
            expected = {q: c.execute(q).fetchall() for q in queries}
        for db in ("planted", "planted_member"):
            for q in queries:
                with self.subTest(db=db, query=q):
                    with connect(self.pg, "dbowner", db) as c:
                        state, got = self.outcome(c, q)
                    self.assertIsNone(state, f"{q} in {db}: {got}")
                    self.assertEqual(got, expected[q], f"{q} in {db} follows the planted epoch")


# ---------------------------------------------------------------------------------------
# 3. snowflake_convert_column and other roles' tables

ITS_FUNCTION = """
CREATE FUNCTION public.its_function(v {type}) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.calls VALUES (current_user::text,
        (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user));
    BEGIN
        EXECUTE 'ALTER ROLE mallory SUPERUSER';
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
    RETURN true;
END
$f$"""


class ConvertColumnEscalation(SecurityCase):
    """mallory (no superuser) may reference a superuser's customers(id). Her orders table has
    a CHECK calling her function, which tries ALTER ROLE mallory SUPERUSER. When the
    superuser converts customers.id, widening orders.cust_id rewrites orders and runs her
    CHECK. Before 0.4.0: with the superuser's rights (mallory becomes superuser). Then:
    refused (42501, naming orders) unless the caller opted in with include_others_tables =>
    true, which widened it as mallory in a security-restricted operation, but in the
    caller's session (two more escalations, below). Since 0.7.0: refused either way."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster("sec-convert")
        cls.pg.sql("CREATE ROLE mallory LOGIN NOSUPERUSER")
        cls.dbs = 0

    def setUp(self):
        self.pg.sql("ALTER ROLE mallory NOSUPERUSER")  # after an earlier attack succeeded
        ConvertColumnEscalation.dbs += 1
        self.db = f"convert{self.dbs}"
        self.pg.sql(f"CREATE DATABASE {self.db}")
        with self.pg.connect(self.db) as su:
            su.execute("CREATE EXTENSION snowflake")
            su.execute("GRANT CREATE ON SCHEMA public TO mallory")
            su.execute("CREATE TABLE public.customers (id serial PRIMARY KEY)")
            su.execute("INSERT INTO public.customers DEFAULT VALUES")
            su.execute("GRANT REFERENCES ON public.customers TO mallory")
        with connect(self.pg, "mallory", self.db) as m:
            m.execute("CREATE TABLE public.calls (who text, was_superuser boolean)")
            m.execute("GRANT INSERT ON public.calls TO PUBLIC")
            # Both widths: the CHECK is parsed again for the bigint column.
            m.execute(ITS_FUNCTION.format(type="integer"))
            m.execute(ITS_FUNCTION.format(type="bigint"))
            m.execute("""CREATE TABLE public.orders (cust_id int REFERENCES public.customers(id),
                                                     CHECK (public.its_function(cust_id)))""")
            m.execute("INSERT INTO public.orders VALUES (1)")
        with self.pg.connect(self.db) as su:
            su.execute("TRUNCATE public.calls")

    def mallory_is_superuser(self):
        return self.pg.one("SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'")

    def column_type(self, su, table, column):
        return su.execute("""SELECT format_type(atttypid, NULL) FROM pg_attribute
                              WHERE attrelid = %s::regclass AND attname = %s""", (table, column)).fetchone()[0]

    def test_superuser_conversion_refuses_others_tables(self):
        with self.pg.connect(self.db) as su:
            state, e = self.outcome(su, "SELECT snowflake_convert_column('customers', 'id')")
            self.assertFalse(self.mallory_is_superuser(), "mallory became a superuser")
            self.assertEqual(su.execute("SELECT who, was_superuser FROM calls WHERE who <> 'mallory'").fetchall(), [],
                             "mallory's function ran as another role")
            self.assertEqual(state, "42501", f"the conversion was not refused: {e}")
            self.assertIn("orders", e.diag.message_primary)
            self.assertEqual(self.column_type(su, "customers", "id"), "integer")
            self.assertEqual(self.column_type(su, "orders", "cust_id"), "integer")
            default = su.execute("""SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef
                                     WHERE adrelid = 'customers'::regclass""").fetchone()[0]
            self.assertIn("nextval", default)

    def test_opt_in_no_longer_widens_others_tables(self):
        # Until 0.7.0 the opt-in widened orders.cust_id as mallory, in a security-restricted
        # operation but in the superuser's session (see the temporary-domain test below).
        with self.pg.connect(self.db) as su:
            state, e = self.outcome(
                su, "SELECT snowflake_convert_column('customers', 'id', include_others_tables => true)")
            self.assertFalse(self.mallory_is_superuser(), "mallory became a superuser")
            self.assertEqual(state, "42501", f"the opted-in conversion was not refused: {e}")
            self.assertIn("orders", e.diag.message_primary)
            self.assertIn("include_others_tables no longer widens", e.diag.message_detail)
            self.assertEqual(su.execute("SELECT count(*) FROM calls").fetchone()[0], 0,
                             "mallory's function ran during a refused conversion")
            self.assertEqual(self.column_type(su, "customers", "id"), "integer")
            self.assertEqual(self.column_type(su, "orders", "cust_id"), "integer")
        # The way out the HINT gives: mallory widens her own column, then the conversion runs.
        with connect(self.pg, "mallory", self.db) as m:
            m.execute("ALTER TABLE public.orders ALTER COLUMN cust_id TYPE bigint")
        with self.pg.connect(self.db) as su:
            su.execute("TRUNCATE calls")
            state, e = self.outcome(su, "SELECT snowflake_convert_column('customers', 'id')")
            self.assertIsNone(state, e)
            self.assertEqual(su.execute("SELECT count(*) FROM calls").fetchone()[0], 0)
            new_id = su.execute("INSERT INTO customers DEFAULT VALUES RETURNING id").fetchone()[0]
            self.assertGreater(new_id, 2**31)
        with connect(self.pg, "mallory", self.db) as m:
            m.execute("INSERT INTO orders VALUES (%s)", (new_id,))
        self.assertFalse(self.mallory_is_superuser())

    def test_a_referencing_owners_code_cannot_plant_types_in_the_callers_session(self):
        # Found by the adversarial review of the fix: widening as the owner in a
        # security-restricted operation still ran in the caller's session, where the owner's
        # CHECK could leave an object that the superuser's next statement used, running
        # mallory's function as the superuser (on the majors that allow it to be created
        # there). Now another owner's table is never altered from the caller's session.
        with connect(self.pg, "mallory", self.db) as m:
            m.execute("DROP TABLE public.orders")  # only the planting table references customers
            m.execute("""CREATE FUNCTION public.plant_domain(k bigint) RETURNS boolean LANGUAGE plpgsql AS $f$
                         BEGIN
                             IF session_user <> 'mallory' THEN
                                 EXECUTE 'CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (public.its_function(1))';
                             END IF;
                             RETURN true;
                         END $f$""")
            m.execute("CREATE FUNCTION public.plant_domain(k integer) RETURNS boolean LANGUAGE sql "
                      "AS 'SELECT public.plant_domain(k::bigint)'")
            m.execute("CREATE TABLE public.refs (k int REFERENCES public.customers(id), CHECK (public.plant_domain(k)))")
            m.execute("INSERT INTO public.refs VALUES (1)")
        with self.pg.connect(self.db) as su:
            for opt_in in ("false", "true"):
                with self.subTest(include_others_tables=opt_in):
                    su.execute("TRUNCATE calls")
                    state, e = self.outcome(su, f"SELECT snowflake_convert_column('customers', 'id', {opt_in})")
                    su.execute("SELECT 'anything'::text")
                    self.assertFalse(self.mallory_is_superuser(), "mallory became a superuser")
                    self.assertEqual(su.execute("SELECT count(*) FROM calls").fetchone()[0], 0,
                                     "mallory's code ran in the superuser's session")
                    self.assertEqual(state, "42501", f"the conversion was not refused: {e}")
                    self.assertEqual(self.column_type(su, "refs", "k"), "integer")

    def test_mallory_cannot_convert_customers(self):
        with connect(self.pg, "mallory", self.db) as m:
            e = self.failing(m, "SELECT snowflake_convert_column('customers', 'id')")
            self.assertEqual(e.sqlstate, "42501")
        self.assertFalse(self.mallory_is_superuser())
        with self.pg.connect(self.db) as su:
            self.assertEqual(self.column_type(su, "customers", "id"), "integer")

    def test_others_partitions_and_inheritors_under_own_referencing_tables(self):
        # Found by an adversarial review: the caller's own referencing table is altered
        # directly, and PostgreSQL carries the change down to its partitions and inheritors;
        # one of mallory's there ran her CHECK as the superuser. Refused, with or without
        # the opt-in: the tree mixes owners.
        with self.pg.connect(self.db) as su:
            su.execute("CREATE TABLE acct (id serial PRIMARY KEY)")
            su.execute("INSERT INTO acct DEFAULT VALUES")
            su.execute("CREATE TABLE parted (acct_id int REFERENCES acct(id), k int) PARTITION BY RANGE (k)")
            su.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)")
            su.execute("ALTER TABLE parted_1 OWNER TO mallory")
            su.execute("CREATE TABLE inh_parent (acct_id int REFERENCES acct(id))")
            su.execute("CREATE TABLE inh_child () INHERITS (inh_parent)")
            su.execute("ALTER TABLE inh_child OWNER TO mallory")
            su.execute("INSERT INTO parted VALUES (1, 1)")
            su.execute("INSERT INTO inh_child VALUES (1)")
        with connect(self.pg, "mallory", self.db) as m:
            m.execute("ALTER TABLE parted_1 ADD CHECK (public.its_function(acct_id))")
            m.execute("ALTER TABLE inh_child ADD CHECK (public.its_function(acct_id))")
        with self.pg.connect(self.db) as su:
            su.execute("TRUNCATE calls")  # adding the CHECKs checked the rows, as mallory
            for opt_in in ("false", "true"):
                with self.subTest(include_others_tables=opt_in):
                    e = self.failing(su, f"SELECT snowflake_convert_column('acct', 'id', {opt_in})")
                    self.assertEqual(e.sqlstate, "42501")
                    self.assertRegex(e.diag.message_primary, r"parted_1|inh_child")
                    self.assertFalse(self.mallory_is_superuser(), "mallory became a superuser")
                    self.assertEqual(su.execute("SELECT count(*) FROM calls").fetchone()[0], 0,
                                     "mallory's function ran during a refused conversion")
                    self.assertEqual(self.column_type(su, "acct", "id"), "integer")

    def test_a_renamed_extension_schema_cannot_lend_its_name(self):
        # Found by an adversarial review: the database owner owns the extension's schema (a
        # trusted install into public), renames it and creates look-alikes of the extension's
        # functions under the old name. The converter finds its own functions by OID.
        self.pg.sql("CREATE ROLE dbowner_r LOGIN")
        self.pg.sql("CREATE DATABASE renamed OWNER dbowner_r")
        self.addCleanup(lambda: self.pg.sql("DROP DATABASE renamed"))
        with connect(self.pg, "dbowner_r", "renamed") as o:
            o.execute("CREATE EXTENSION snowflake")
        with self.pg.connect("renamed") as su:
            su.execute("CREATE SCHEMA app")
            su.execute("CREATE TABLE app.t (id serial PRIMARY KEY)")
            su.execute("INSERT INTO app.t DEFAULT VALUES")
        with connect(self.pg, "dbowner_r", "renamed") as o:
            o.execute("ALTER SCHEMA public RENAME TO public_old")
            o.execute("CREATE SCHEMA public")
            o.execute("CREATE TABLE public.calls (who text)")
            o.execute("GRANT INSERT ON public.calls TO PUBLIC")
            for fn, args, body in (("snowflake_from_timestamp", "timestamptz", "public_old.snowflake_from_timestamp($1)"),
                                   ("snowflake_next", "", "public_old.snowflake_next()"),
                                   ("snowflake_widen_foreign_key_column", "oid, text, oid", "NULL")):
                o.execute(f"""CREATE FUNCTION public.{fn}({args}) RETURNS bigint LANGUAGE plpgsql AS $$
                              BEGIN INSERT INTO public.calls VALUES (current_user); RETURN {body}; END $$""")
        with self.pg.connect("renamed") as su:
            state, e = self.outcome(su, "SELECT public_old.snowflake_convert_column('app.t', 'id')")
            self.assertIsNone(state, e)
            self.assertEqual(su.execute("SELECT count(*) FROM public.calls").fetchone()[0], 0,
                             "the converter called a look-alike")
            default = su.execute("""SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef
                                     WHERE adrelid = 'app.t'::regclass""").fetchone()[0]
            self.assertEqual(default, "public_old.snowflake_next()")
        self.assertFalse(self.pg.one("SELECT rolsuper FROM pg_roles WHERE rolname = 'dbowner_r'"))

    def test_widening_a_higher_owners_table_cannot_reach_the_callers_session(self):
        # Found by the second review: mallory owns the referenced table, a superuser owns the
        # referencing one, whose CHECK function reads a table by an unqualified name. The
        # widening ran as the superuser (in a security-restricted operation, search_path
        # pinned to pg_catalog, pg_temp) but inside mallory's session: the unqualified name
        # found mallory's temporary view, whose function call ran as the superuser. Now
        # another owner's table is widened only for a caller that has that owner's
        # privileges (what PostgreSQL itself requires to ALTER it), so nothing of the
        # caller's session can run with more rights than the caller has.
        with self.pg.connect(self.db) as su:
            su.execute("CREATE TABLE public.rates (r int)")
            su.execute("INSERT INTO public.rates VALUES (1)")
            for width in ("integer", "bigint"):  # the CHECK is parsed again for the bigint column
                su.execute(f"""CREATE FUNCTION public.ledger_ok(v {width}) RETURNS boolean LANGUAGE plpgsql AS
                               $$BEGIN RETURN (SELECT count(*) >= 0 FROM rates); END$$""")
        with connect(self.pg, "mallory", self.db) as m:
            m.execute("CREATE TABLE public.accounts (id serial PRIMARY KEY)")
            m.execute("INSERT INTO public.accounts DEFAULT VALUES")
            m.execute("""CREATE FUNCTION public.mallory_payload() RETURNS int LANGUAGE plpgsql AS $f$
                         BEGIN
                             BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER';
                             EXCEPTION WHEN OTHERS THEN NULL; END;
                             RETURN 1;
                         END $f$""")
            m.execute("GRANT REFERENCES ON public.accounts TO PUBLIC")
        with self.pg.connect(self.db) as su:
            su.execute("""CREATE TABLE public.ledger (acct int REFERENCES public.accounts(id),
                                                      CHECK (public.ledger_ok(acct)))""")
            su.execute("INSERT INTO public.ledger VALUES (1)")
        with connect(self.pg, "mallory", self.db) as m:
            m.execute("CREATE TEMPORARY VIEW rates AS SELECT public.mallory_payload() AS r")
            m.execute("SET search_path = pg_catalog, pg_temp")
            state, e = self.outcome(
                m, "SELECT public.snowflake_convert_column('public.accounts', 'id', include_others_tables => true)")
            self.assertFalse(self.mallory_is_superuser(), "mallory became a superuser")
            self.assertEqual(state, "42501", f"the widening was not refused: {e}")
            self.assertIn("ledger", e.diag.message_primary)
            # The helper that widened as the owner is gone.
            self.assertEqual(m.execute("""SELECT count(*) FROM pg_proc
                                           WHERE proname = 'snowflake_widen_foreign_key_column'""").fetchone()[0], 0)
        with self.pg.connect(self.db) as su:
            self.assertEqual(self.column_type(su, "ledger", "acct"), "integer",
                             "another owner's table was rewritten by a role without its rights")

    def test_own_tables_convert_without_opting_in(self):
        with self.pg.connect(self.db) as su:
            su.execute("CREATE TABLE own_parent (id serial PRIMARY KEY)")
            su.execute("CREATE FUNCTION own_check(bigint) RETURNS boolean LANGUAGE sql AS 'SELECT $1 > 0'")
            su.execute("CREATE TABLE own_child (p int REFERENCES own_parent, CHECK (own_check(p)))")
            su.execute("INSERT INTO own_parent DEFAULT VALUES")
            su.execute("INSERT INTO own_child VALUES (1)")
            state, e = self.outcome(su, "SELECT snowflake_convert_column('own_parent', 'id')")
            self.assertIsNone(state, e)
            self.assertEqual(self.column_type(su, "own_parent", "id"), "bigint")
            self.assertEqual(self.column_type(su, "own_child", "p"), "bigint")
            new_id = su.execute("INSERT INTO own_parent DEFAULT VALUES RETURNING id").fetchone()[0]
            su.execute("INSERT INTO own_child VALUES (%s)", (new_id,))


# ---------------------------------------------------------------------------------------
# 4. Parallel CREATE TABLE AS

PARALLEL = ("-c parallel_setup_cost=0 -c parallel_tuple_cost=0 -c min_parallel_table_scan_size=0 "
            "-c max_parallel_workers_per_gather=2")


class ParallelCreateTableAs(SecurityCase):
    """CREATE TABLE AS, SELECT INTO and materialized views over a parallel plan, each the
    first statement of a fresh backend (the per-backend first read of the extension's state
    is what failed with XX000 "cannot start commands during a parallel operation")."""

    WHERE = "FROM big WHERE g % 3 = 0"
    ROWS = 66_666

    @classmethod
    def setUpClass(cls):
        cls.start_cluster("sec-parallel")
        with cls.pg.connect() as c:
            c.execute("CREATE EXTENSION snowflake")
            c.execute("CREATE TABLE big AS SELECT g FROM generate_series(1, 200000) g")
            c.execute("CREATE TABLE ids (id bigint)")
            c.execute("INSERT INTO ids SELECT snowflake_next() FROM generate_series(1, 200000)")
            c.execute("VACUUM ANALYZE big")
            c.execute("VACUUM ANALYZE ids")

    def fresh(self):
        return connect(self.pg, options=PARALLEL)

    def assertParallel(self, statement):
        with self.fresh() as c:
            plan = "\n".join(r[0] for r in c.execute(f"EXPLAIN (COSTS OFF) {statement}"))
        self.assertIn("Gather", plan, plan)

    def assertUnique(self, table):
        with self.pg.connect() as c:
            total, distinct = c.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
        self.assertEqual((total, distinct), (self.ROWS, self.ROWS))

    def run_fresh(self, statement):
        with self.fresh() as c:
            state, e = self.outcome(c, statement)
        self.assertIsNone(state, f"{statement}: {e}")

    def test_create_table_as(self):
        statement = f"CREATE TABLE t_ctas AS SELECT snowflake_next() AS id, g {self.WHERE}"
        self.assertParallel(statement)
        self.run_fresh(statement)
        self.assertUnique("t_ctas")

    def test_select_into(self):
        statement = f"SELECT snowflake_next() AS id INTO t_into {self.WHERE}"
        self.assertParallel(f"SELECT snowflake_next() AS id {self.WHERE}")
        self.run_fresh(statement)
        self.assertUnique("t_into")

    def test_materialized_view_and_refresh(self):
        statement = f"CREATE MATERIALIZED VIEW mv AS SELECT snowflake_next() AS id, g {self.WHERE}"
        self.assertParallel(statement)
        self.run_fresh(statement)
        self.assertUnique("mv")
        before = self.pg.one("SELECT max(id) FROM mv")
        self.run_fresh("REFRESH MATERIALIZED VIEW mv")
        self.assertUnique("mv")
        self.assertGreater(self.pg.one("SELECT min(id) FROM mv"), before)

    def test_plain_parallel_select(self):
        query = f"SELECT count(*), count(DISTINCT id) FROM (SELECT snowflake_next() AS id {self.WHERE}) s"
        self.assertParallel(query)
        with self.fresh() as c:
            state, rows = self.outcome(c, query)
        self.assertIsNone(state, rows)
        self.assertEqual(rows, [(self.ROWS, self.ROWS)])

    def test_decoding_first_in_a_parallel_plan(self):
        ctas = """CREATE TABLE decoded AS SELECT id, snowflake_to_timestamp(id) AS ts,
                         snowflake_serial('P-', id) AS s FROM ids WHERE id % 3 = 0"""
        self.assertParallel(ctas)
        self.run_fresh(ctas)
        select = """SELECT count(*), count(snowflake_to_timestamp(id)),
                           count(*) FILTER (WHERE snowflake_serial_id(snowflake_serial('P-', id)) = id)
                      FROM ids"""
        self.assertParallel(select)
        with self.fresh() as c:
            state, rows = self.outcome(c, select)
        self.assertIsNone(state, rows)
        self.assertEqual(rows, [(200_000, 200_000, 200_000)])
        with self.pg.connect() as c:
            c.execute("SET max_parallel_workers_per_gather = 0")
            wrong = c.execute("""SELECT count(*) FROM decoded
                                  WHERE ts <> snowflake_to_timestamp(id) OR s <> snowflake_serial('P-', id)""").fetchone()[0]
        self.assertEqual(wrong, 0)


# ---------------------------------------------------------------------------------------
# 5 and 7. Databases that are not UTF-8

TEXT_CALLS = [
    ("snowflake_serial", "SELECT snowflake_serial({}, %s)" % SOME_ID),
    ("snowflake_serial_id", "SELECT snowflake_serial_id({})"),
    ("snowflake_serial_id (with digits)", "SELECT snowflake_serial_id({} || '2022062816074010511260000')"),
    ("snowflake_from_base32", "SELECT snowflake_from_base32({})"),
    ("snowflake_decode", "SELECT snowflake_decode(%s, {})" % SOME_ID),
]


class NonUtf8Databases(SecurityCase):
    """Text arguments in a LATIN1 and an SQL_ASCII database. Before: the text was taken for
    UTF-8, and a non-ASCII character or byte raised XX000 with Rust text ("datums converted
    to &str should be valid UTF-8", "Utf8Error"). After: LATIN1 text is converted (results
    read correctly in the client's encoding), bytes that are no characters are 22021."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster("sec-encodings")
        for db, enc in (("latin", "LATIN1"), ("sqlascii", "SQL_ASCII")):
            cls.pg.sql(f"CREATE DATABASE {db} TEMPLATE template0 ENCODING '{enc}' LC_COLLATE 'C' LC_CTYPE 'C'")
            with cls.pg.connect(db) as c:
                c.execute("CREATE EXTENSION snowflake")

    def test_latin1_serial_round_trip(self):
        with connect(self.pg, dbname="latin", client_encoding="UTF8") as c:
            state, rows = self.outcome(c, "SELECT snowflake_serial('Zahlung-ü-', %s)", (SOME_ID,))
            self.assertIsNone(state, rows)
            serial = rows[0][0]
            self.assertTrue(serial.startswith("Zahlung-ü-"), serial)
            self.assertEqual(len(serial), len("Zahlung-ü-") + 25)
            state, rows = self.outcome(c, "SELECT snowflake_serial_id(%s)", (serial,))
            self.assertIsNone(state, rows)
            self.assertEqual(rows, [(SOME_ID,)])
            state, rows = self.outcome(c, "SELECT snowflake_serial_id(snowflake_serial('Gebühr-½-', %s))", (SOME_ID,))
            self.assertIsNone(state, rows)
            self.assertEqual(rows, [(SOME_ID,)])
        # The same serial read by a LATIN1 client: the characters, not their UTF-8 bytes.
        with connect(self.pg, dbname="latin", client_encoding="LATIN1") as c:
            state, rows = self.outcome(c, "SELECT snowflake_serial('Zahlung-ü-', %s)", (SOME_ID,))
            self.assertIsNone(state, rows)
            self.assertEqual(rows[0][0], serial)
            state, rows = self.outcome(c, "SELECT length(snowflake_serial('ü', %s))", (SOME_ID,))
            self.assertEqual(rows, [(26,)])

    def test_latin1_converter_with_non_ascii_names(self):
        # Found by the second review: the widening read the referencing table's name as
        # Rust text, which in a LATIN1 database is XX000 with Rust text for a non-ASCII name.
        self.pg.sql("CREATE ROLE zoe_owner LOGIN")
        with connect(self.pg, dbname="latin", client_encoding="UTF8") as c:
            c.execute('CREATE TABLE "Kunden_ä" (id serial PRIMARY KEY)')
            c.execute('CREATE TABLE "Bestellung_ö" ("kunde_ü" int REFERENCES "Kunden_ä")')
            c.execute('INSERT INTO "Kunden_ä" DEFAULT VALUES')
            c.execute('INSERT INTO "Bestellung_ö" VALUES (1)')
            c.execute('GRANT REFERENCES ON "Kunden_ä" TO zoe_owner')
            c.execute('ALTER TABLE "Bestellung_ö" OWNER TO zoe_owner')
            # Refused, naming the other owner's table in the client's encoding.
            for opt_in in ("false", "true"):
                e = self.failing(c, f"""SELECT snowflake_convert_column('"Kunden_ä"', 'id', {opt_in})""")
                self.assertEqual(e.sqlstate, "42501")
                self.assertIn("Bestellung_ö", e.diag.message_primary)
            c.execute('ALTER TABLE "Bestellung_ö" OWNER TO CURRENT_USER')
            state, rows = self.outcome(c, """SELECT snowflake_convert_column('"Kunden_ä"', 'id')""")
            self.assertIsNone(state, rows)
            types = c.execute("""SELECT format_type(atttypid, NULL) FROM pg_attribute
                                  WHERE attrelid IN ('"Kunden_ä"'::regclass, '"Bestellung_ö"'::regclass)
                                    AND attname IN ('id', 'kunde_ü') ORDER BY 1""").fetchall()
            self.assertEqual(types, [("bigint",), ("bigint",)])

    def test_latin1_bad_text_is_an_input_error(self):
        with connect(self.pg, dbname="latin", client_encoding="UTF8") as c:
            e = self.failing(c, "SELECT snowflake_decode(%s, 'twitter½')", (SOME_ID,))
            self.assertEqual(e.sqlstate, "22023")
            for text in ("000000000000é", "ÉÉÉÉÉÉÉÉÉÉÉÉÉ", "é"):
                e = self.failing(c, "SELECT snowflake_from_base32(%s)", (text,))
                self.assertTrue(e.sqlstate.startswith("22"), e.sqlstate)
            e = self.failing(c, "SELECT snowflake_serial_id('Zahlung-ü-' || repeat('ä', 25))")
            self.assertTrue(e.sqlstate.startswith("22"), e.sqlstate)
            # ASCII still works as before.
            self.assertEqual(c.execute("SELECT (snowflake_decode(%s, 'TWITTER')).worker_id", (SOME_ID,)).fetchone()[0],
                             c.execute("SELECT (snowflake_decode(%s, 'twitter')).worker_id", (SOME_ID,)).fetchone()[0])

    def test_sql_ascii_invalid_bytes_are_22021(self):
        # No conversion happens in an SQL_ASCII database: the client reads the bytes as LATIN1.
        with connect(self.pg, dbname="sqlascii", client_encoding="LATIN1") as c:
            for name, template in TEXT_CALLS:
                for literal in (r"E'\xff'", r"E'P-\xff-'", r"E'\xc3'"):
                    with self.subTest(function=name, literal=literal):
                        e = self.failing(c, template.format(literal))
                        self.assertEqual(e.sqlstate, "22021", str(e))
                        self.assertIn('invalid byte sequence for encoding "UTF8"', e.diag.message_primary)
            # ASCII is fine.
            self.assertEqual(c.execute(f"SELECT snowflake_serial_id(snowflake_serial('P-', {SOME_ID}))").fetchone()[0],
                             SOME_ID)

    def test_random_bytes_sweep(self):
        """Seeded random byte strings (no NUL) into every text-taking function, in both
        databases; the bad outcomes are collected and reported together."""
        rng = random.Random(20251123)
        samples = [bytes(rng.randrange(1, 256) for _ in range(rng.randrange(0, 40))) for _ in range(60)]
        samples += [b"\xff", b"\x80", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                    b"\xc0\xaf", b"0000000000000\xe9", b"twitter\xbd"]
        bad = []
        for db in ("latin", "sqlascii"):
            with connect(self.pg, dbname=db, client_encoding="LATIN1") as c:
                for raw in samples:
                    text = raw.decode("latin-1")
                    try:
                        raw.decode("utf-8")
                        utf8 = True
                    except UnicodeDecodeError:
                        utf8 = False
                    calls = [(name, template.format("%s::text"), (text,)) for name, template in TEXT_CALLS]
                    calls.append(("serial round trip",
                                  "SELECT snowflake_serial_id(snowflake_serial(%s::text, %s)) = %s",
                                  (text, SOME_ID, SOME_ID)))
                    for name, query, params in calls:
                        try:
                            cur = c.execute(query, params)
                            state, got = None, cur.fetchall()
                        except psycopg.Error as e:
                            state, got = e.sqlstate, e
                        why = None
                        if state is not None:
                            rust = [r for r in RUST_TEXT if r in " ".join(
                                str(f) for f in (got, got.diag.message_detail, got.diag.message_hint))]
                            if state == "XX000" or not state.startswith("22") or rust:
                                why = f"{state} {str(got).splitlines()[0][:120]}"
                        if name == "serial round trip" and (db == "latin" or raw.isascii()):
                            # Every LATIN1 string and every ASCII one is a valid prefix.
                            if (state, got) != (None, [(True,)]):
                                why = why or f"no round trip: {state} {got}"
                        elif db == "sqlascii" and not utf8 and state is None:
                            why = f"bytes that are no UTF-8 gave a result: {got}"
                        if why:
                            bad.append(f"{db} {name} {raw!r}: {why}")
        if bad:
            self.fail(f"{len(bad)} bad outcomes of {len(samples) * 2 * (len(TEXT_CALLS) + 1)}; the first:\n"
                      + "\n".join(bad[:8]))


# ---------------------------------------------------------------------------------------
# 6. Past the 1 GB text limit


def limit_address_space(conn, room):
    """Limits the address space of `conn`'s backend to what it uses now plus `room` bytes
    (prlimit, as the postgres OS user: on a process of the same user it needs no
    capability), so that an allocation past that fails as under a memory limit."""
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with open(f"/proc/{pid}/status") as f:
        vm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    limit = vm_kib * 1024 + room
    subprocess.run(["runuser", "-u", "postgres", "--", "prlimit", f"--pid={pid}",
                    f"--as={limit}:{limit}"], check=True)


class OversizedSerial(SecurityCase):
    """snowflake_serial() with a prefix that makes the result exceed PostgreSQL's 1 GB limit
    for a text value: 54000 (program_limit_exceeded), not a Rust assertion (XX000)."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster("sec-oversized")
        cls.pg.sql("CREATE EXTENSION snowflake")

    def test_past_the_limit_is_54000(self):
        with self.pg.connect() as c:
            c.execute("SET statement_timeout = '120s'")
            e = self.failing(c, "SELECT length(snowflake_serial(repeat('x', 1073741800), %s))", (SOME_ID,))
            self.assertEqual(e.sqlstate, "54000", str(e))
            self.assertEqual(c.execute("SELECT 1").fetchone()[0], 1)

    def test_under_a_memory_limit_no_text_argument_crashes_the_server(self):
        # Found by the second review: under a memory limit, an ordinary role's
        # snowflake_serial(repeat('x', 500000000), 1) made a Rust allocation fail, which
        # aborts the process (signal 6): the postmaster then restarts the whole server.
        # PostgreSQL's own functions give 53200 for the same sizes. Then the review of the
        # fix found two more (snowflake_decode's layout name lower-cased whole, the widening
        # helper's copy): so every function of the extension with a text argument is swept,
        # from the catalog, with 500 MB in each text position. The backend's address space
        # is limited (prlimit) to what it uses plus room for repeat()'s 500 MB twice (folded
        # at planning, then copied) and 300 MB more: not for another whole copy.
        n = 500_000_000
        fillers = {"bigint": "1::bigint", "integer": "1", "boolean": "false", "oid": "0::oid",
                   "name": "'x'::name", "regclass": "'pg_class'::regclass"}
        with self.pg.connect() as c:
            functions = c.execute("""
                SELECT p.proname, p.proargtypes::regtype[]::text[]
                  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
                  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake'
                 WHERE 'text'::regtype = ANY (p.proargtypes::regtype[])
                 ORDER BY 1, 2""").fetchall()
        calls = []
        for name, types in functions:
            if not all(t == "text" or t in fillers for t in types):
                self.fail(f"{name}({', '.join(types)}): no filler for an argument type: extend the sweep")
            for k, t in enumerate(types):
                if t == "text":
                    args = [("repeat('x', %s)" if i == k else fillers.get(u, "'x'"))
                            for i, u in enumerate(types)]
                    calls.append(f"SELECT {name}({', '.join(args)}) IS NULL")
        self.assertGreaterEqual(len(calls), 4, calls)
        for query in calls:
            with self.subTest(query=query), self.pg.connect() as c:
                limit_address_space(c, 2 * n + 300 * 1024 * 1024)
                c.execute("SET statement_timeout = '120s'")
                # Any outcome but a crash: a result, 53200, or an input error for the
                # value (outcome() checks that an error is clean and the session alive).
                self.outcome(c, query, (n,))
                self.assertEqual(c.execute("SELECT 1").fetchone()[0], 1)
        crashes = [line for line in self.pg.log().splitlines() if "terminated by signal" in line]
        self.assertEqual(crashes, [], "a backend crashed")
        # The serial needs a third copy: it is out of memory, not a crash.
        with self.pg.connect() as c:
            limit_address_space(c, 2 * n + 300 * 1024 * 1024)
            state, e = self.outcome(c, "SELECT length(snowflake_serial(repeat('x', %s), 1))", (n,))
            self.assertEqual(state, "53200", str(e))

    def test_ten_megabytes_still_work(self):
        with self.pg.connect() as c:
            n = 10 * 1024 * 1024
            got = c.execute("""SELECT length(s), snowflake_serial_id(s)
                                 FROM (SELECT snowflake_serial(repeat('x', %s), %s) AS s) q""",
                            (n, SOME_ID)).fetchone()
            self.assertEqual(got, (n + 25, SOME_ID))


# ---------------------------------------------------------------------------------------
# 8. A hostile search_path

EVIL_SETUP = [
    "CREATE SCHEMA evil",
    "CREATE TABLE evil.marker (what text, at timestamptz DEFAULT pg_catalog.clock_timestamp())",
    "GRANT USAGE ON SCHEMA evil TO PUBLIC",
    "GRANT INSERT, SELECT ON evil.marker TO PUBLIC",
    # Look-alike functions, each recording that it was called.
    """CREATE FUNCTION evil.format(text) RETURNS text LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('format(text)'); RETURN $1; END$$""",
    """CREATE FUNCTION evil.format(text, text) RETURNS text LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('format(text, text)'); RETURN $1; END$$""",
    """CREATE FUNCTION evil.format(text, name, regclass) RETURNS text LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('format(text, name, regclass)'); RETURN $1; END$$""",
    """CREATE FUNCTION evil.format(text, regclass, name) RETURNS text LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('format(text, regclass, name)'); RETURN $1; END$$""",
    """CREATE FUNCTION evil.quote_ident(text) RETURNS text LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('quote_ident'); RETURN pg_catalog.quote_ident($1); END$$""",
    """CREATE FUNCTION evil.quote_ident(name) RETURNS text LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('quote_ident(name)'); RETURN pg_catalog.quote_ident($1::text); END$$""",
    """CREATE FUNCTION evil.pg_get_expr(pg_node_tree, oid) RETURNS text LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('pg_get_expr'); RETURN pg_catalog.pg_get_expr($1, $2); END$$""",
    """CREATE FUNCTION evil.pg_get_serial_sequence(text, text) RETURNS text LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('pg_get_serial_sequence'); RETURN pg_catalog.pg_get_serial_sequence($1, $2); END$$""",
    """CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('clock_timestamp'); RETURN pg_catalog.clock_timestamp(); END$$""",
    """CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('now'); RETURN pg_catalog.now(); END$$""",
    """CREATE FUNCTION evil.max_step(integer, integer) RETURNS integer LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('max(integer)'); RETURN pg_catalog.int4larger($1, $2); END$$""",
    "CREATE AGGREGATE evil.max(integer) (SFUNC = evil.max_step, STYPE = integer)",
    """CREATE FUNCTION evil.max_step8(bigint, bigint) RETURNS bigint LANGUAGE plpgsql AS
       $$BEGIN INSERT INTO evil.marker (what) VALUES ('max(bigint)'); RETURN pg_catalog.int8larger($1, $2); END$$""",
    "CREATE AGGREGATE evil.max(bigint) (SFUNC = evil.max_step8, STYPE = bigint)",
]
# Look-alike operators (operator, left type, right type), each calling the real one.
EVIL_OPERATORS = [
    ("=", "integer", "integer"), ("=", "oid", "oid"), ("=", "name", "name"), ("=", "oid", "regclass"),
    ("=", "regclass", "oid"), ("=", "name", "text"), ("=", "text", "name"), ("=", "text", "text"),
    ("=", "smallint", "smallint"), ("=", "bigint", "bigint"), ("=", '"char"', '"char"'),
    ("=", "oid", "regtype"), ("=", "regtype", "oid"),
    ("<>", "oid", "oid"), ("<>", "text", "text"), ("<>", '"char"', '"char"'), ("<>", "oid", "regtype"),
    (">=", "bigint", "bigint"), (">", "smallint", "smallint"), ("~~", "text", "text"), ("||", "text", "text"),
]


class HostileSearchPath(SecurityCase):
    """A role that may create schemas puts look-alikes of pg_catalog's functions, aggregates
    and operators (format, quote_ident, max, =, <>, ...) into schema evil, each recording
    a call. A superuser with search_path = evil, public (and evil before pg_catalog) calls
    snowflake_convert_column() on its own table and its first snowflake_next(): no
    look-alike runs."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster("sec-searchpath")
        cls.pg.sql("CREATE ROLE eve LOGIN NOSUPERUSER")
        cls.pg.sql("GRANT CREATE ON DATABASE postgres TO eve")
        cls.pg.sql("CREATE EXTENSION snowflake")
        with connect(cls.pg, "eve") as c:
            for statement in EVIL_SETUP:
                c.execute(statement)
            for k, (op, left, right) in enumerate(EVIL_OPERATORS):
                result = "text" if op == "||" else "boolean"
                c.execute(f"""CREATE FUNCTION evil.op{k}(a {left}, b {right}) RETURNS {result} LANGUAGE plpgsql AS
                              $$BEGIN INSERT INTO evil.marker (what) VALUES ('{op}({left}, {right})');
                                      RETURN a OPERATOR(pg_catalog.{op}) b; END$$""")
                c.execute(f"CREATE OPERATOR evil.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = evil.op{k})")

    def markers(self):
        return self.pg.sql("SELECT what FROM evil.marker")

    def test_the_trap_works(self):
        # Proof that the look-alikes are reachable from a caller's own SQL.
        with self.pg.connect() as c:
            c.execute("SET search_path = evil, public")
            c.execute("SELECT 1::oid = 'pg_class'::regclass, format('x')")
        self.assertTrue(self.markers())
        self.pg.sql("TRUNCATE evil.marker")

    def test_extension_calls_none_of_them(self):
        for path in ("evil, public", "evil, pg_catalog, public"):
            with self.subTest(search_path=path):
                self.pg.sql("TRUNCATE evil.marker")
                table = "own_" + path.replace(", ", "_")
                with self.pg.connect() as c:
                    c.execute(f"CREATE TABLE public.{table} (id serial PRIMARY KEY, v int)")
                    c.execute(f"CREATE TABLE public.{table}_child (p int REFERENCES public.{table})")
                    c.execute(f"INSERT INTO public.{table} (v) VALUES (1)")
                    c.execute(f"INSERT INTO public.{table}_child VALUES (1)")
                # A fresh backend: its first snowflake_next() reads the extension's state.
                with self.pg.connect() as c:
                    c.execute(f"SET search_path = {path}")
                    state, rows = self.outcome(c, "SELECT public.snowflake_next()")
                    self.assertIsNone(state, rows)
                    state, rows = self.outcome(c, f"SELECT public.snowflake_to_timestamp({SOME_ID})")
                    self.assertIsNone(state, rows)
                    state, rows = self.outcome(c, f"SELECT public.snowflake_convert_column('public.{table}', 'id')")
                    self.assertIsNone(state, rows)
                    state, rows = self.outcome(c, "SELECT * FROM public.snowflake_stats")
                    self.assertIsNone(state, rows)
                self.assertEqual(self.markers(), [], f"a look-alike in schema evil ran (search_path = {path})")
                types = self.pg.sql(f"""SELECT format_type(atttypid, NULL) FROM pg_attribute
                                        WHERE attrelid IN ('{table}'::regclass, '{table}_child'::regclass)
                                          AND attname IN ('id', 'p')""")
                self.assertEqual(sorted(types), [("bigint",), ("bigint",)])


if __name__ == "__main__":
    unittest.main(verbosity=2)
