"""Registries that misbehave, and roles of the coordinator that attack it (issue 35).

- Attack 4: a registry that accepts and never answers, one that answers a byte at a time,
  and one that streams a reply without end: fast shutdown completes within a bound derived
  from snowflake.claim_ttl, a killed postmaster leaves no process behind (the server starts
  again), and nothing crash-restarts the server. For the coordinator and for Redis (etcd:
  the silent server).
- Attack 3: a role with only CREATE on the coordinator's database makes look-alike tables
  earlier on the nodes' search_path; nodes must not use them (two nodes held worker 0).
- Attack 6a: a registry URI with `%` before a non-ASCII character panicked the registry
  worker every second with the password in the panic text.

The fake registries are Python socket servers in this process; the coordinator is a real
PostgreSQL cluster."""

import glob
import os
import signal
import socket
import subprocess
import threading
import time
import unittest

import psycopg

from harness import (HANG_GUARD, LAG_HISTORY_S, LAG_STEPS, Cluster, report_figure,
                     scheduling_delay, wait_until)
from fixtures.processes import alive, children_of, postmaster_pid, registry_worker_pid
from fixtures.registries import free_port, wait_started
from fixtures.waits import logged_failure_causes

TTL = "2s"
TTL_MS = 2000
# The worker looks at SIGTERM and the postmaster every 50 ms whatever its request does
# (runner.rs), and gives the release at shutdown at most 1 s; each request also ends by the
# client's own deadlines (a fifth of claim_ttl for the connection, then for the request).
SHUTDOWN_RELEASE_S = 1.0
POLL_S = 0.05
# pg_ctl's own pace (it polls every 100 ms) and the shutdown checkpoint: at least this, or four
# times the fast shutdown of the same node measured in this run with a registry that refuses
# at once (the control), whichever is longer: the machine may be loaded (docs/testing.md).
PG_CTL_SLACK_S = 3.0
CONTROL_FACTOR = 4
# The old code waited for ever: give pg_ctl this long before calling it a hang.
PG_CTL_TIMEOUT_S = HANG_GUARD

SECRET = "S3cr\u20acT-pw"  # '%' before '€' panicked the percent-decoder



class FakeRegistry(threading.Thread):
    """A TCP server that accepts connections and then, per `mode`:
    - "silent": reads and never answers;
    - "slow": answers with the start of a reply that never ends, one byte every 50 ms;
    - "flood": answers with a reply that never ends, as fast as the client reads.
    `opening` is what a reply starts with (a message header of the protocol)."""

    def __init__(self, mode, opening=b"", filler=b"x"):
        super().__init__(daemon=True)
        self.mode = mode
        self.opening = opening
        self.filler = filler
        self.port = free_port()
        self.accepted = 0
        self.sent = 0
        self.stop_event = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.lock = threading.Lock()

    def run(self):
        while not self.stop_event.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with self.lock:
                self.accepted += 1
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        conn.settimeout(0.05)
        try:
            # The client speaks first in every protocol here; wait for its first bytes.
            got = b""
            while not got and not self.stop_event.is_set():
                try:
                    got = conn.recv(65536)
                except socket.timeout:
                    continue
                if got == b"":
                    return
            if self.mode == "silent":
                while not self.stop_event.is_set():
                    try:
                        if conn.recv(65536) == b"":
                            return
                    except socket.timeout:
                        pass
                return
            if self.mode == "slow":
                out = self.opening + self.filler * 1_000_000
                for i in range(len(out)):
                    if self.stop_event.is_set():
                        return
                    conn.sendall(out[i:i + 1])
                    self.sent += 1
                    time.sleep(0.05)
                return
            chunk = self.filler * (1 << 20)
            conn.settimeout(1)
            conn.sendall(self.opening)
            while not self.stop_event.is_set():
                try:
                    conn.sendall(chunk)
                    self.sent += len(chunk)
                except socket.timeout:
                    continue
        except OSError:
            return
        finally:
            conn.close()

    def close(self):
        self.stop_event.set()
        self.sock.close()
        self.join(5)


# A PostgreSQL server's first answer: an authentication request ('R') whose length says
# 2 GiB - 1, then its body without end.
PG_OPENING = b"R" + (0x7FFFFFFF).to_bytes(4, "big")
# A Redis reply: a bulk string of 2 GiB - 1 bytes.
REDIS_OPENING = b"$2147483647\r\n"


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


class HostileRegistryTest(unittest.TestCase):
    """One node, pointed at one fake registry per test."""

    @classmethod
    def setUpClass(cls):
        cls.node = Cluster("hostile_node", {
            "shared_preload_libraries": "'snowflake'",
            "snowflake.worker_id": "auto",
            "snowflake.datacenter_id": "1",
            "snowflake.claim_ttl": f"'{TTL}'",
            "snowflake.registry": "'redis://127.0.0.1:1/0'",
        })
        cls.node.init()
        cls.node.start()
        cls.node.sql("CREATE EXTENSION snowflake")
        began = time.monotonic()
        cls.node.stop()
        cls.control_stop_s = time.monotonic() - began
        cls.stop_bound_s = POLL_S + SHUTDOWN_RELEASE_S + max(PG_CTL_SLACK_S,
                                                             CONTROL_FACTOR * cls.control_stop_s)
        report_figure("control: fast shutdown with a refusing registry",
                      f"{cls.control_stop_s:.2f} s; bound before the scheduling delay "
                      f"{cls.stop_bound_s:.2f} s")

    @classmethod
    def tearDownClass(cls):
        cls.node.destroy()

    def setUp(self):
        # Whatever a failed test left running.
        self.addCleanup(self.node.stop, "immediate")

    def start_node_on(self, uri):
        self.node.stop("immediate")
        self.node.configure(**{"snowflake.registry": f"'{uri}'"})
        self.log_start = len(self.node.log())
        self.node.start()

    def new_log(self):
        return self.node.log()[self.log_start:]

    def fake(self, mode, opening=b""):
        f = FakeRegistry(mode, opening)
        f.start()
        self.addCleanup(f.close)
        return f

    def stop_bound(self, began, took):
        """The bound of a fast shutdown that began at `began` and took `took` s: the control's
        (setUpClass), plus LAG_STEPS times the scheduling delay measured meanwhile (the load
        may have grown since the control: docs/testing.md#timing-in-the-tests)."""
        return self.stop_bound_s + LAG_STEPS * scheduling_delay(began - LAG_HISTORY_S,
                                                                began + took)

    def assert_stop_within_bound(self, what, took, rc, detail=""):
        bound = self.stop_bound(self.stop_began, took)
        report_figure(f"{what}: fast shutdown", f"{took:.2f} s (bound {bound:.2f} s){detail}")
        self.assertEqual(rc, 0, f"{what}: pg_ctl stop -m fast failed after {took:.1f} s")
        self.assertLess(took, bound, f"{what}: fast shutdown took {took:.1f} s")

    def stop_timed(self):
        """Fast shutdown, timed (s); fails the test if pg_ctl gives up."""
        began = time.monotonic()
        self.stop_began = began
        r = subprocess.run(["runuser", "-u", "postgres", "--", f"{self.node.bin}/pg_ctl", "-D",
                            self.node.data, "-m", "fast", "-w", "-t", str(PG_CTL_TIMEOUT_S),
                            "stop"], capture_output=True, text=True)
        took = time.monotonic() - began
        if r.returncode != 0:
            # Leave nothing behind for the next test.
            self.node.stop("immediate")
        return took, r.returncode

    def assert_no_crash(self, what):
        log = self.new_log()
        self.assertNotIn("terminated by signal", log, f"{what}: a process crashed\n{log[-3000:]}")
        self.assertNotIn("panicked", log, f"{what}: a panic\n{log[-3000:]}")

    def shutdown_within_bound(self, fake, uri, what):
        self.start_node_on(uri)
        # The worker is inside a request to the fake registry.
        wait_until(lambda: fake.accepted >= 1, what=f"{what}: the worker to connect")
        if fake.mode != "silent":
            wait_until(lambda: fake.sent > 0, what=f"{what}: the fake registry to answer")
        took, rc = self.stop_timed()
        self.assert_stop_within_bound(what, took, rc)
        self.assert_no_crash(what)
        # And it starts again cleanly.
        self.node.start()
        self.assertEqual(self.node.one("SELECT 1"), 1)
        self.node.stop()

    # -- attack 4: the coordinator -------------------------------------------------------
    def test_coordinator_silent(self):
        f = self.fake("silent")
        self.shutdown_within_bound(f, f"postgresql://u@127.0.0.1:{f.port}/db?sslmode=disable",
                                   "coordinator silent")

    def test_coordinator_slow(self):
        f = self.fake("slow", PG_OPENING)
        self.shutdown_within_bound(f, f"postgresql://u@127.0.0.1:{f.port}/db?sslmode=disable",
                                   "coordinator slow")

    def flood(self, opening, uri, what):
        f = self.fake("flood", opening)
        self.start_node_on(uri.format(port=f.port))
        wait_until(lambda: registry_worker_pid(self.node), what="the registry worker")
        worker = registry_worker_pid(self.node)
        # Three requests in a row meet the endless reply; the worker's memory must not follow
        # what is sent (the old clients read on until the allocation failed and the server
        # crash-restarted). Checked all along, and the node stopped at once past the limit so
        # that the machine's memory is never at risk.
        limit_kib = 256 * 1024
        peak = [0]

        def bounded():
            rss = rss_kib(worker)
            peak[0] = max(peak[0], rss)
            if rss > limit_kib:
                self.node.stop("immediate")
                self.fail(f"{what}: the registry worker holds {rss >> 10} MiB "
                          f"after {f.sent >> 20} MiB sent")
            return f.accepted >= 3
        wait_until(bounded, what=f"{what}: three requests to meet the endless reply")
        took, rc = self.stop_timed()
        self.assert_stop_within_bound(
            what, took, rc, f"; {f.sent >> 20} MiB sent over {f.accepted} connections, worker's "
            f"resident memory at most {peak[0] >> 10} MiB seen (limit {limit_kib >> 10} MiB)")
        self.assert_no_crash(what)

    def test_coordinator_flood(self):
        self.flood(PG_OPENING, "postgresql://u@127.0.0.1:{port}/db?sslmode=disable",
                   "coordinator flood")

    def test_redis_flood(self):
        self.flood(REDIS_OPENING, "redis://127.0.0.1:{port}/0", "redis flood")

    def test_coordinator_silent_postmaster_killed(self):
        f = self.fake("silent")
        self.start_node_on(f"postgresql://u@127.0.0.1:{f.port}/db?sslmode=disable")
        wait_until(lambda: f.accepted >= 1, what="the worker to connect")
        pm = postmaster_pid(self.node)
        children = children_of(pm)
        os.kill(pm, signal.SIGKILL)
        began = time.monotonic()
        # Every child notices the postmaster's death and leaves (the worker within 50 ms of
        # its poll); allow the other processes their own pace.
        wait_until(lambda: not any(alive(p) for p in children), timeout=PG_CTL_TIMEOUT_S,
                   what="every process of the killed postmaster to end")
        report_figure("postmaster killed: its processes ended",
                      f"{time.monotonic() - began:.2f} s")
        # No process holds the shared memory now (PostgreSQL refuses to start while one
        # does: the old worker kept it). The killed postmaster itself stays a zombie where
        # nothing reaps orphans (this machine's init), and PostgreSQL takes the zombie's pid
        # in postmaster.pid for a live postmaster: remove the stale files, as the chaos campaign does.
        for stale in [os.path.join(self.node.data, "postmaster.pid")] + glob.glob(
                os.path.join(self.node.dir, ".s.PGSQL.*")):
            try:
                os.remove(stale)
            except FileNotFoundError:
                pass
        self.node.start()
        self.assertEqual(self.node.one("SELECT 1"), 1)
        self.node.stop()

    def test_claim_held_and_registry_frozen_at_shutdown(self):
        """The release at shutdown waits at most 1 s for a registry that stopped answering
        (SIGSTOP of a real redis-server) while the node held a claim."""
        port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(redis.wait)
        self.addCleanup(redis.kill)
        self.addCleanup(os.kill, redis.pid, signal.SIGCONT)
        wait_started(redis, lambda: subprocess.run(["redis-cli", "-p", str(port), "PING"],
                                                   capture_output=True, text=True).stdout.strip()
                     == "PONG", f"redis-server {port}")
        self.start_node_on(f"redis://127.0.0.1:{port}/0")
        wait_until(lambda: self.node.one("SELECT claim_status FROM snowflake_stats()")
                   == "held", what="a claim")
        os.kill(redis.pid, signal.SIGSTOP)
        took, rc = self.stop_timed()
        self.assert_stop_within_bound("claim held, registry frozen", took, rc)
        self.assertIn("could not release worker id", self.new_log())
        self.assert_no_crash("claim held, registry frozen")

    # -- attack 4: Redis and etcd --------------------------------------------------------
    def test_redis_silent(self):
        f = self.fake("silent")
        self.shutdown_within_bound(f, f"redis://127.0.0.1:{f.port}/0", "redis silent")

    def test_redis_slow(self):
        f = self.fake("slow", REDIS_OPENING)
        self.shutdown_within_bound(f, f"redis://127.0.0.1:{f.port}/0", "redis slow")

    def test_etcd_silent(self):
        f = self.fake("silent")
        self.shutdown_within_bound(f, f"etcd://127.0.0.1:{f.port}/snowflake", "etcd silent")

    # -- attack 6a -----------------------------------------------------------------------
    def test_percent_before_non_ascii_neither_panics_nor_shows_the_password(self):
        port = free_port()  # nothing listens
        for uri in (f"etcd://user:{SECRET.replace('€', '%€')}@127.0.0.1:{port}/x",
                    f"redis+sentinel://user:{SECRET.replace('€', '%€')}@127.0.0.1:{port}/m",
                    f"postgresql://u:{SECRET.replace('€', '%€')}@127.0.0.1:{port}/db"
                    f"?passfile=/nonexistent/%€x&sslmode=disable"):
            with self.subTest(uri=uri.split(":")[0]):
                self.start_node_on(uri)
                # Two requests at least have failed (each a panic in the old code).
                wait_until(lambda: self.node.one(
                    "SELECT claim_status FROM snowflake_stats()") in ("unreachable", "refused"),
                    what="the claim to be unreachable")
                with self.node.connect() as conn:
                    try:
                        conn.execute("SELECT snowflake_next()")
                        self.fail("an ID without a claim")
                    except psycopg.Error as e:
                        shown = f"{e.diag.message_primary} {e.diag.message_detail}"
                self.node.stop()
                log = self.new_log()
                for secret in (SECRET, SECRET.replace("€", "%€")):
                    self.assertNotIn(secret, log)
                    self.assertNotIn(secret, shown)
                self.assertNotIn("panicked", log, log[-2000:])
                self.assert_no_crash("percent URI")


class CoordinatorLookAlikeTest(unittest.TestCase):
    """Attack 3: a role with only CREATE on the coordinator's database."""

    def setUp(self):
        self.coord = Cluster(f"lookalike_coord{free_port()}",
                             {"listen_addresses": "'127.0.0.1'"}, port=free_port())
        self.coord.init()
        self.coord.start()
        self.addCleanup(self.coord.destroy)
        self.coord.sql("CREATE ROLE fleet LOGIN")
        self.coord.sql("CREATE ROLE intruder LOGIN")
        self.coord.sql("CREATE DATABASE reg OWNER fleet")
        self.coord.sql("GRANT CREATE ON DATABASE reg TO intruder")
        self.nodes = []

    def node(self, name, query=""):
        uri = f"postgresql://fleet@127.0.0.1:{self.coord.port}/reg?sslmode=disable{query}"
        c = Cluster(name, {
            "shared_preload_libraries": "'snowflake'",
            "snowflake.worker_id": "auto",
            "snowflake.datacenter_id": "1",
            "snowflake.claim_ttl": f"'{TTL}'",
            "snowflake.registry": f"'{uri}'",
        })
        c.init()
        c.start()
        self.addCleanup(c.destroy)
        c.sql("CREATE EXTENSION snowflake")
        return c

    def claimed(self, c):
        wait_until(lambda: c.one("SELECT claim_status FROM snowflake_stats()") == "held",
                   what=f"{c.name} to hold a claim")
        return c.one("SELECT worker_id FROM snowflake_stats()")

    def intruder_sql(self, sql):
        with psycopg.connect(host="127.0.0.1", port=self.coord.port, user="intruder",
                             dbname="reg", autocommit=True) as conn:
            conn.execute(sql)

    def test_look_alike_tables_are_never_used(self):
        a = self.node("lookalike_a")
        wa = self.claimed(a)
        # The intruder's schema comes first on fleet's default search_path ("$user", public),
        # with empty tables of the same names, writable by fleet.
        self.intruder_sql("""
            CREATE SCHEMA fleet;
            CREATE TABLE fleet.snowflake_registry (
                singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                incarnation text NOT NULL, born_unix_ms bigint NOT NULL,
                epoch_unix_ms bigint NOT NULL);
            CREATE UNLOGGED TABLE fleet.snowflake_registry_instance (
                singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                token text NOT NULL);
            CREATE TABLE fleet.snowflake_claims (
                datacenter_id integer NOT NULL, worker_id integer NOT NULL, holder text,
                expires_unix_ms bigint, high_water_unix_ms bigint, floor_unix_ms bigint,
                released_unix_ms bigint, ttl_ms bigint, PRIMARY KEY (datacenter_id, worker_id));
            GRANT USAGE ON SCHEMA fleet TO fleet;
            GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fleet TO fleet;
        """)
        b = self.node("lookalike_b")
        wb = self.claimed(b)
        # Both keep renewing for a while: two claim periods.
        deadline = time.monotonic() + 2 * TTL_MS / 1000
        while time.monotonic() < deadline:
            sa = a.sql("SELECT claim_status, worker_id FROM snowflake_stats()")[0]
            sb = b.sql("SELECT claim_status, worker_id FROM snowflake_stats()")[0]
            if sa[0] == "held" and sb[0] == "held":
                self.assertNotEqual(sa[1], sb[1], "two nodes hold one worker id")
            time.sleep(0.1)
        self.assertNotEqual(wa, wb)
        used = self.coord.sql("SELECT count(*) FROM fleet.snowflake_claims", dbname="reg")[0][0]
        self.assertEqual(used, 0, "a node wrote into the intruder's tables")
        held = self.coord.sql("SELECT count(*) FROM public.snowflake_claims "
                              "WHERE holder IS NOT NULL", dbname="reg")[0][0]
        self.assertEqual(held, 2)

    def test_schema_of_another_owner_is_refused(self):
        self.intruder_sql("CREATE SCHEMA trap; GRANT USAGE, CREATE ON SCHEMA trap TO fleet")
        c = self.node("lookalike_c", "&snowflake_schema=trap")
        why = 'schema "trap" on the coordinator is owned by role "intruder"'
        # A wait for the refusal itself: on a loaded machine a first request can also end
        # by its time limit (claim_ttl / 5), "unreachable" too, with another cause.
        details = []

        def refused():
            with c.connect() as conn:
                try:
                    conn.execute("SELECT snowflake_next()")
                except psycopg.Error as e:
                    details.append(e.diag.message_detail or "")
                    return why in details[-1]
                self.fail("an ID from a registry in another role's schema")
        wait_until(refused, what=f"the refusal (details seen: {details[-3:]})")
        self.assertEqual(c.one("SELECT claim_status FROM snowflake_stats()"), "unreachable")
        # And the server log says why once, not at every attempt: a cause is logged again
        # only after another cause came between (a request that timed out, under load).
        wait_until(lambda: why in c.log(), what="the refusal in the server log")
        causes = logged_failure_causes(c.log())
        repeats = sum(1 for a, b in zip(causes, causes[1:]) if a == b)
        self.assertEqual(repeats, 0, causes)
        self.assertGreaterEqual(len(causes), 1, c.log()[-3000:])
        tables = self.coord.sql("SELECT count(*) FROM pg_class c JOIN pg_namespace n "
                                "ON n.oid = c.relnamespace WHERE n.nspname = 'trap'",
                                dbname="reg")[0][0]
        self.assertEqual(tables, 0, "tables created in another role's schema")


if __name__ == "__main__":
    unittest.main()
