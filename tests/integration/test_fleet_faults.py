"""snowflake.worker_id = 'auto' under the faults of the fleet bug report: one test per path
by which two nodes issued the same ID (and one liveness path). Each test injects the real
fault (a coordinator crash restart with unflushed commits, a node's own crash restart, a
renewal held up in the network, clock steps through tests/clockshim, an empty Redis, a Redis
failover back to a demoted master) and asserts the product guarantee: no ID twice across
nodes (path 6: a bounded wait or 55000; path 7: the registry also settles).

Registries are touched only through the documented keys and tables, and only to set up
(other ids held by live fake servers: Redis.hold / Coordinator.hold). Everything else is
asserted on the IDs the nodes return and the SQLSTATEs they raise.

Timing: claim_ttl is 5 s in most tests (heartbeat 1 s, fence 2.5 s, allowed skew 1 s), 2 s
where the window needs to be short (paths 5 and 6). The other ids of the datacenter are held
by fake live servers, so that a waiting node can only get the one id the scenario is about.

A small TCP proxy (Proxy) stands between a node and its registry where the network matters:
it can pass, drop (a partition: connections closed and refused), or hold the requests that
match a predicate in flight and deliver them later, in order (a network that delays packets).
"""

import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
import unittest

import psycopg

from harness import BASE, HANG_GUARD, PG_MAJOR, Cluster, clock_shim_lib, error_of, \
    report_figure, twin_shim_lib, wait_live, wait_until, write_clock_offset
from fixtures.clusters import Writer, node
from fixtures.ids import duplicates, ids
from fixtures.processes import kill_server, signal_pending
from fixtures.registries import Coordinator, EtcdCluster, Redis, free_port, wait_started
from fixtures.waits import fence_line, refusal, wait_claimed, wait_status

DC = 1
WORKERS = 32


# --------------------------------------------------------------------------------------
# helpers

class Uri:
    """A registry address for node(): e.g. a proxy in front of the real registry."""

    def __init__(self, uri):
        self._uri = uri

    def uri(self):
        return self._uri


def status(c):
    return c.one("SELECT claim_status FROM snowflake_stats()")


def after_renewal(c, timeout=HANG_GUARD):
    """Returns just after the registry worker's next successful renewal (the claim's expiry
    moves): the node then holds a fresh fence of claim_ttl / 2."""
    with c.connect() as conn:
        query = "SELECT claim_expires_at FROM snowflake_stats()"
        first = conn.execute(query).fetchone()[0]
        if not wait_until(lambda: conn.execute(query).fetchone()[0] != first, timeout=timeout,
                          poll=0.005, fail=False):
            raise AssertionError(f"{c.name}: no renewal in {timeout} s")
    return time.monotonic()


def reserve_blocks(c, n):
    """n blocks of 4,096 IDs (snowflake_next_block): n whole milliseconds, run ahead of the
    clock. Returns the first ID of each block."""
    return c.one("SELECT array_agg(snowflake_next_block(4096)) FROM generate_series(1, %s)", (n,))


def in_blocks(block_firsts, values):
    """How many of `values` fall in the reserved blocks: a block of 4,096 is a whole
    millisecond of one (datacenter, worker), so an ID is in it when its top 52 bits match."""
    keys = {b >> 12 for b in block_firsts}
    return sum(1 for v in values if v >> 12 in keys)


def kill_a_backend(c):
    """SIGKILL of one backend: the postmaster lives on and crash-restarts the server."""
    restarts = c.log().count("all server processes terminated; reinitializing")
    conn = c.connect()
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    os.kill(pid, signal.SIGKILL)
    try:
        conn.close()
    except Exception:  # noqa: BLE001
        pass
    return restarts


def wait_crash_restarted(c, restarts_before, timeout=HANG_GUARD):
    wait_until(lambda: c.log().count("all server processes terminated; reinitializing") > restarts_before,
               timeout=timeout, what=f"{c.name}: crash restart")
    c.one("SELECT 1")  # retries while the server recovers


def last_claim(c):
    """The node's last "claimed worker id" LOG line and its DETAIL (how it was granted)."""
    lines = c.log().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if "snowflake: claimed worker id" in lines[i]:
            return " / ".join(line.split("  ", 1)[-1] for line in lines[i:i + 2])
    return None


def redis_info(r, section, field):
    for line in r.cli("INFO", section).splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return None


# --------------------------------------------------------------------------------------
# a TCP proxy that can partition or delay

class _Link:
    """One proxied connection."""

    def __init__(self, proxy, client, upstream):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.client_open = True
        self.holding = False
        self.buffer = bytearray()
        self.deliver_now = threading.Event()
        self.delivered = threading.Event()

    def run(self):
        try:
            self._pump()
        except OSError:
            pass
        finally:
            self.delivered.set()
            for s in (self.client, self.upstream):
                try:
                    s.close()
                except OSError:
                    pass

    def _pump(self):
        c, u, proxy = self.client, self.upstream, self.proxy
        while not proxy.stopped:
            if proxy.mode == "drop" and not self.holding:
                return
            if self.holding and self.deliver_now.is_set():
                # The delayed data reaches the server now, after everything the client did
                # since (it may have given up and closed long ago: the server still gets it).
                u.sendall(bytes(self.buffer))
                self.buffer.clear()
                self.holding = False
                if not self.client_open:
                    u.shutdown(socket.SHUT_WR)
                self.delivered.set()
            watch = [u] + ([c] if self.client_open else [])
            readable, _, _ = select.select(watch, [], [], 0.02)
            if c in readable:
                data = c.recv(65536)
                if not data:
                    self.client_open = False
                    if not self.holding:
                        return
                    continue
                with proxy.lock:
                    if not self.holding and proxy.mode == "hold" and proxy.hold_if(bytes(data)):
                        self.holding = True
                        proxy.held.append(self)
                    held = self.holding
                    if held:
                        self.buffer += data
                if not held:
                    before_if, before = proxy.before_if, proxy.before
                    if before_if is not None and before_if(bytes(data)):
                        before()
                    u.sendall(data)
            if u in readable:
                data = u.recv(65536)
                if not data:
                    return
                if self.client_open:
                    try:
                        c.sendall(data)
                    except OSError:
                        self.client_open = False

    def deliver(self, timeout=HANG_GUARD):
        self.deliver_now.set()
        self.delivered.wait(timeout)


class Proxy:
    """Between nodes and a registry on 127.0.0.1:target_port. Modes: "pass"; "drop" (every
    connection closed, new ones refused: a partition); "hold" (a connection whose client
    sends data matching hold_if keeps that and all its later data in flight until
    release()). In any mode, data that matches before_if is passed on only after before()
    has run (another client's write slipped in just ahead of it)."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.mode = "pass"
        self.hold_if = lambda data: True
        self.before_if = None
        self.before = None
        self.lock = threading.Lock()
        self.held = []
        self.stopped = False
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def redis_uri(self):
        return f"'redis://127.0.0.1:{self.port}/0'"

    def pg_uri(self):
        return f"'postgresql://postgres@127.0.0.1:{self.port}/postgres'"

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.stopped or self.mode == "drop":
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            threading.Thread(target=_Link(self, client, upstream).run, daemon=True).start()

    def hold(self, predicate):
        with self.lock:
            self.hold_if = predicate
            self.mode = "hold"

    def release(self):
        """Delivers everything held, connection by connection in the order it was held,
        then passes everything."""
        while True:
            with self.lock:
                held, self.held = self.held, []
                if not held:
                    self.mode = "pass"
                    return
            for link in held:
                link.deliver()
                time.sleep(0.05)

    def close(self):
        self.stopped = True
        self.listener.close()


class RedisServer(Redis):
    """A redis-server with its own directory and immediate diskless full syncs, for
    replication."""

    def __init__(self):
        super().__init__()
        self.dir = os.path.join(BASE, f"redis{self.port}")

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", self.dir,
             "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.environment())
        wait_started(self.proc, lambda: self.cli("PING", check=False) == "PONG",
                     f"redis-server {self.port}")

    def environment(self):
        """The server's environment (a subclass adds to it)."""
        return dict(os.environ)

    def run_id(self):
        return redis_info(self, "server", "run_id")

    def follow(self, master):
        self.cli("REPLICAOF", "127.0.0.1", str(master.port))
        wait_until(lambda: redis_info(self, "replication", "master_link_status") == "up"
                   and redis_info(self, "replication", "master_sync_in_progress") == "0",
                   what=f"redis {self.port} in sync with {master.port}")

    def promote(self):
        self.cli("REPLICAOF", "NO", "ONE")


class ShiftedRedis(RedisServer):
    """A redis-server under tests/clockshim: its wall clock (Redis's TIME, which the claim
    scripts read) is shifted by `clock_ms`, set before each start: a registry restarted on
    another host, with another clock."""

    def __init__(self):
        super().__init__()
        self.clock_file = os.path.join(self.dir, "clock-offset")
        self.clock_ms = 0

    def environment(self):
        write_clock_offset(self.clock_file, self.clock_ms)
        return {**os.environ, "LD_PRELOAD": clock_shim_lib(),
                "SNOWFLAKE_CLOCK_OFFSET_FILE": self.clock_file}

    def script_calls(self):
        """Scripts run so far (EVAL, EVALSHA): the nodes' requests."""
        calls = 0
        for line in self.cli("INFO", "commandstats").splitlines():
            if line.startswith(("cmdstat_eval:", "cmdstat_evalsha:")):
                calls += int(line.split("calls=", 1)[1].split(",", 1)[0])
        return calls


class LossyCoordinator(Coordinator):
    """A coordinator that acknowledges commits before they are durable."""

    def __init__(self):
        super().__init__()
        self.cluster.configure(synchronous_commit="off", wal_writer_delay="'10s'")


# --------------------------------------------------------------------------------------

class FleetFaultBase(unittest.TestCase):
    def setUp(self):
        self.clusters = []
        self.writers = []

    def tearDown(self):
        for w in self.writers:
            w.stop.set()
        for w in self.writers:
            w.join(5)
        for c in self.clusters:
            c.destroy()

    def started(self, registry):
        registry.start()
        if isinstance(registry, Coordinator):
            self.addCleanup(registry.cluster.destroy)
        else:
            if isinstance(registry, RedisServer):
                self.addCleanup(shutil.rmtree, registry.dir, True)
            self.addCleanup(registry.stop)
        return registry

    def proxy(self, port):
        p = Proxy(port)
        self.addCleanup(p.close)
        return p

    def new(self, name, registry, ttl_s, clock_ms=None, **settings):
        extra = {"snowflake.claim_ttl": f"'{ttl_s}s'"}
        extra.update({k.replace("__", "."): v for k, v in settings.items()})
        c = node(f"{name}{free_port()}", registry, datacenter=DC, **extra)
        self.clusters.append(c)
        c.init()
        if clock_ms is not None:
            c.use_clock_shim(clock_ms)
        return c

    @staticmethod
    def up(c):
        c.start()
        c.sql("CREATE EXTENSION IF NOT EXISTS snowflake")

    def writer(self, c):
        w = Writer(c)
        self.writers.append(w)
        w.start()
        return w

    @staticmethod
    def stop_writers(*writers):
        for w in writers:
            w.stop.set()
        for w in writers:
            w.join(10)

    @staticmethod
    def hold_all_but(registry, keep):
        for w in range(WORKERS):
            if w != keep:
                registry.hold(DC, w)


# --------------------------------------------------------------------------------------
# 20. the coordinator's database restored from pg_dump while it runs

class CoordinatorRestoredFromDump(FleetFaultBase):

    def test_20_a_coordinator_restored_from_pg_dump_settles(self):
        """helper-16's review. A DBA restores the coordinator's database from a pg_dump made
        earlier, into the running coordinator (dropdb, createdb, pg_restore): the same
        postmaster start time, and pg_dump copies the unlogged table's token, so the
        registry did not see a loss, and a newcomer was given a live holder's id from the
        restored rows at once (8,150 to 15,650 duplicates). Holder O (claim_ttl 10 s) is cut
        off right after a renewal, still issuing under its fence; the registry is restored
        to a dump whose claim of O's id has expired; newcomer N, with only that id free,
        must find the registry settling, and be given the id only after it: no ID twice."""
        ttl = 10
        coord = Coordinator()
        self.started(coord)
        k = coord.cluster
        k.sql("CREATE DATABASE registry")
        proxy = self.proxy(k.port)
        o = self.new("o", Uri(f"'postgresql://postgres@127.0.0.1:{proxy.port}/registry'"), ttl)
        n = self.new("n", Uri(f"'postgresql://postgres@127.0.0.1:{k.port}/registry'"), ttl)
        self.up(o)
        w = wait_claimed(o)
        for other in range(WORKERS):
            if other != w:
                k.sql("""INSERT INTO snowflake_claims (datacenter_id, worker_id, holder, expires_unix_ms)
                         VALUES (%s, %s, 'someone-else', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 3600000)""",
                      (DC, other), dbname="registry")
        wr_o = self.writer(o)
        wr_o.running(200)
        dump = os.path.join(k.dir, "registry.dump")

        def pg_tool(name, *args):
            subprocess.run(["runuser", "-u", "postgres", "--", f"{k.bin}/{name}", "-h", "127.0.0.1",
                            "-p", str(k.port), "-U", "postgres", *args], check=True, capture_output=True)
        pg_tool("pg_dump", "-Fc", "-f", dump, "registry")
        dumped_expiry = k.sql("SELECT expires_unix_ms FROM snowflake_claims WHERE datacenter_id = %s "
                              "AND worker_id = %s", (DC, w), dbname="registry")[0][0]
        born_before = k.sql("SELECT born_unix_ms FROM snowflake_registry", dbname="registry")[0][0]
        wait_until(lambda: k.sql("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint > %s",
                                 (dumped_expiry,), dbname="registry")[0][0],
                   what="the dumped claim expired")
        after_renewal(o)
        proxy.mode = "drop"  # O issues on under its fence, unheard
        pg_tool("dropdb", "--force", "registry")
        pg_tool("createdb", "registry")
        pg_tool("pg_restore", "-d", "registry", dump)
        self.up(n)
        seen = set()
        wr_n = self.writer(n)
        self.assertEqual(wait_claimed(n, seen=seen), w)
        wait_until(lambda: status(o) != "held", what="O's fence ended")
        marks = len(wr_n.got)
        wait_until(lambda: len(wr_n.got) > marks + 500, what="N writing")
        self.stop_writers(wr_o, wr_n)
        born_after = k.sql("SELECT born_unix_ms FROM snowflake_registry", dbname="registry")[0][0]
        dup = len(duplicates(wr_o.got, wr_n.got))
        report_figure("coordinator restored from pg_dump while it ran", (
            f"claim_ttl {ttl} s; O {len(wr_o.got)} IDs, N {len(wr_n.got)} IDs; N's statuses "
            f"{sorted(seen)}; {dup} duplicates"))
        self.assertEqual(dup, 0, f"{dup} duplicate IDs between O and N")
        self.assertIn("settling", seen, "the restored registry did not settle")
        self.assertGreater(born_after, born_before, "no new incarnation after the restore")


# --------------------------------------------------------------------------------------
# 1. the coordinator forgets a claim at its crash restart

class CoordinatorCrashRestart(FleetFaultBase):

    def test_1_crash_restart_of_the_coordinator_forgets_a_claim(self):
        """Path 1. The coordinator runs with synchronous_commit = off (wal_writer_delay =
        10s); node A is granted worker id w, whose row is acknowledged but not yet written;
        a coordinator backend is killed with SIGKILL and PostgreSQL crash-restarts without
        the row. pg_postmaster_start_time() is unchanged, so the registry must still count
        the restart as a loss: node B (waiting for an id) must not get w while A may still
        issue under its fence (A's link to the coordinator is cut meanwhile, as the crash
        cuts it anyway, so that B's claim is not raced by A's re-assertion)."""
        ttl = 5
        coord = LossyCoordinator()
        self.started(coord)
        pa = self.proxy(coord.cluster.port)
        a = self.new("a", Uri(pa.pg_uri()), ttl)
        b = self.new("b", coord, ttl)
        self.up(a)

        def registry_row():
            try:
                return coord.cluster.one("SELECT count(*) FROM snowflake_registry") == 1
            except psycopg.Error:
                return False
        # A's first contact made the tables and the registry row; the new registry settles.
        wait_until(registry_row, what="the registry row")
        for w in range(1, WORKERS):
            coord.hold(DC, w)
        # Everything so far is durable (an XLOG_SWITCH record is flushed at once) ...
        coord.cluster.one("SELECT pg_switch_wal()")
        # ... and nothing after: the WAL writer, the one process that writes asynchronous
        # commits out, is stopped (a wal_writer_delay that has not elapsed yet).
        walwriter = coord.cluster.one(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
        os.kill(walwriter, signal.SIGSTOP)
        self.addCleanup(lambda: subprocess.run(["kill", "-CONT", str(walwriter)],
                                               capture_output=True))
        self.assertNotEqual(status(a), "held", "setup: A claimed before the WAL writer stopped")
        wa = wait_claimed(a)
        self.assertEqual(wa, 0)
        wr_a = self.writer(a)
        wr_a.running(200)
        self.up(b)
        wait_status(b, "exhausted")

        after_renewal(a)
        pa.mode = "drop"
        held_since = time.monotonic()
        # The crash: SIGKILL of a backend; the postmaster SIGQUITs the rest, the WAL writer
        # included (it exits as soon as it runs again), and reinitializes.
        conn = coord.cluster.connect()
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: signal_pending(walwriter, signal.SIGQUIT),
                   what="the postmaster's SIGQUIT to the WAL writer")
        os.kill(walwriter, signal.SIGCONT)
        try:
            conn.close()
        except Exception:  # noqa: BLE001  (its backend was killed)
            pass
        coord.cluster.one("SELECT 1")  # back after crash recovery
        try:  # for the failure message only
            row = coord.cluster.sql(
                "SELECT holder IS NOT NULL, expires_unix_ms FROM snowflake_claims "
                "WHERE datacenter_id = %s AND worker_id = %s", (DC, wa))
        except psycopg.Error as e:
            row = str(e)

        wb = wait_claimed(b)
        wr_b = self.writer(b)
        # Until A's fence has surely passed (it cannot renew), then A may talk again.
        time.sleep(max(0.5, held_since + ttl / 2 + 0.5 - time.monotonic()))
        pa.mode = "pass"
        time.sleep(0.3)
        self.stop_writers(wr_a, wr_b)
        dup = len(duplicates(wr_a.got, wr_b.got))
        self.assertEqual(dup, 0,
                         f"{dup} duplicate IDs: A ({len(wr_a.got)} IDs, worker {wa}) and B "
                         f"({len(wr_b.got)} IDs, worker {wb}); the row of worker {wa} after "
                         f"the crash restart: {row or 'gone'}")


# --------------------------------------------------------------------------------------
# 2, 4, 6: paths through the high-water mark, on both registries

class MarkScenarios:
    make_registry = None

    def test_2_claim_floor_lost_at_the_nodes_crash_restart(self):
        """Path 2. B holds id w with its clock 0.9 s ahead (allowed skew: 1 s) and reserves
        blocks up to its cap, then stops cleanly: the mark it leaves is above IDs it issued
        ahead of real time. A (clock 0.9 s behind) takes the freed id with a floor above the
        mark, kept only in shared memory and in the registry worker. One backend of A is
        SIGKILLed before A's first ID: A crash-restarts with the same postmaster (same
        token), gets w back as its own, and must still start above the mark."""
        ttl = 5
        reg = self.started(self.make_registry())
        b = self.new("b", reg, ttl, clock_ms=900, snowflake__max_clock_drift="'3s'")
        a = self.new("a", reg, ttl, clock_ms=-900)
        self.up(b)
        wb = wait_claimed(b)
        self.hold_all_but(reg, wb)
        self.up(a)
        wait_status(a, "exhausted")

        after_renewal(b)
        blocks = reserve_blocks(b, 2200)
        b.stop()  # releases wb, leaving a mark above its blocks
        self.assertEqual(wait_claimed(a), wb)
        restarts = kill_a_backend(a)  # before A's first ID
        wait_crash_restarted(a, restarts)
        self.assertEqual(wait_claimed(a), wb)
        wr_a = self.writer(a)
        time.sleep(3.5)
        wait_until(lambda: len(wr_a.got) >= 200, what="IDs from A")
        self.stop_writers(wr_a)
        dup = in_blocks(blocks, wr_a.got)
        self.assertEqual(dup, 0, f"{dup} of A's {len(wr_a.got)} IDs repeat IDs of B's "
                                 f"{len(blocks)} reserved blocks (worker {wb}); A after its "
                                 f"crash restart: {last_claim(a)}")

    def test_4_clock_step_back_lowers_the_mark(self):
        """Path 4. A holds id w and reserves blocks up to its cap; its clock then steps back
        10 s. The clock check refuses A, but the give-back that follows must not replace
        the mark by one computed from the wrong clock. B (clock 0.9 s behind, waiting for an
        id) then gets w and must start above A's blocks."""
        ttl = 5
        reg = self.started(self.make_registry())
        a = self.new("a", reg, ttl, clock_ms=0, snowflake__max_clock_drift="'3s'")
        b = self.new("b", reg, ttl, clock_ms=-900)
        self.up(a)
        wa = wait_claimed(a)
        self.hold_all_but(reg, wa)
        self.up(b)
        wait_status(b, "exhausted")
        wr_b = self.writer(b)

        after_renewal(a)
        blocks = reserve_blocks(a, 2300)
        a.shift_clock_ms(-10_000)
        self.assertEqual(wait_claimed(b), wa)
        # B's clock passes the end of A's blocks (at most 2.5 s past A's renewal, real time)
        # within about 3.5 s.
        time.sleep(3.5)
        self.stop_writers(wr_b)
        dup = in_blocks(blocks, wr_b.got)
        self.assertEqual(dup, 0, f"{dup} of B's {len(wr_b.got)} IDs repeat IDs of A's "
                                 f"{len(blocks)} reserved blocks (worker {wa})")

    def test_6_clock_a_day_ahead_does_not_poison_the_id(self):
        """Path 6 (liveness). A's clock jumps a day ahead: its renewal records a mark a day
        ahead before the clock check refuses it. The next holder of that id (fresh node B,
        max_clock_wait = 2s, statement_timeout = 30s) must not sleep in snowflake_next()
        until statement_timeout: it uses another id, or fails quickly with 55000 naming the
        registry and the mark; never 57014."""
        ttl = 2
        max_wait_s = 2
        reg = self.started(self.make_registry())
        a = self.new("a", reg, ttl, clock_ms=0)
        self.up(a)
        wa = wait_claimed(a)
        before = ids(a, 100)
        a.shift_clock_ms(86_400_000)
        wait_status(a, "refused")
        a.stop()
        time.sleep(ttl + 0.5)  # A's last renewal lapses: the id is free, with A's mark
        b = self.new("b", reg, ttl, snowflake__max_clock_wait=f"'{max_wait_s}s'")
        self.up(b)
        wait_until(lambda: status(b) not in ("starting", "unreachable"),
                   what="B's first claim")
        got_worker = b.one("SELECT worker_id FROM snowflake_stats()")
        result = {}
        conn = b.connect()
        # The old code slept until statement_timeout: a hang guard far above the bound.
        conn.execute(f"SET statement_timeout = '{HANG_GUARD}s'")

        def call():
            started = time.monotonic()
            try:
                result["id"] = conn.execute("SELECT snowflake_next()").fetchone()[0]
            except psycopg.Error as e:
                result["error"] = e
            result["s"] = time.monotonic() - started

        t = threading.Thread(target=call, daemon=True)
        started = time.monotonic()
        t.start()
        # Liveness from the settings: max_clock_wait, and a claim_ttl for the registry
        # requests it may make (docs/testing.md#timing-in-the-tests).
        try:
            wait_live(lambda: not t.is_alive(), max_wait_s + ttl, started,
                      what="snowflake_next() on B")
        except AssertionError as late:
            conn.cancel()
            t.join(HANG_GUARD)
            conn.close()
            self.fail(f"snowflake_next() on B (claim status {status(b)}, worker id "
                      f"{got_worker}; A's was {wa}) still sleeping: {late} "
                      f"(max_clock_wait {max_wait_s} s); cancelled: "
                      f"{getattr(result.get('error'), 'sqlstate', None)}")
        conn.close()
        if "error" in result:
            e = result["error"]
            text = " ".join(filter(None, [e.diag.message_primary, e.diag.message_detail]))
            self.assertEqual(e.sqlstate, "55000", text)
            self.assertIn("registry", text.lower())
            self.assertTrue("mark" in text.lower() or "high-water" in text.lower()
                            or "high water" in text.lower(), text)
        else:
            self.assertNotIn(result["id"], before)


class MarkScenariosRedis(MarkScenarios, FleetFaultBase):
    make_registry = Redis


class MarkScenariosCoordinator(MarkScenarios, FleetFaultBase):
    make_registry = Coordinator


# --------------------------------------------------------------------------------------
# 3, 5, 7: Redis

class RedisFaults(FleetFaultBase):

    def test_3_delayed_renewal_reasserts_a_lapsed_claim(self):
        """Path 3. A's renewal is sent while its fence holds (so it may re-assert a claim
        Redis lost) and is held up in the network (proxy). A fences itself, its claim lapses,
        B (waiting) takes the id above A's mark, reserves blocks ahead (clock 0.8 s ahead),
        and stops cleanly. Then the delayed renewal reaches Redis and finds no claim: it
        must not give the id back to A, whose next claim would then be its own, with no
        floor, under B's blocks (A's clock is 0.8 s behind)."""
        ttl = 5
        redis = self.started(Redis())
        for w in range(1, WORKERS):
            redis.hold(DC, w)
        pa = self.proxy(redis.port)
        a = self.new("a", Uri(pa.redis_uri()), ttl, clock_ms=-800)
        b = self.new("b", redis, ttl, clock_ms=800, snowflake__max_clock_drift="'3s'")
        self.up(a)
        wa = wait_claimed(a)
        self.up(b)
        wait_status(b, "exhausted")
        wr_a = self.writer(a)
        wr_a.running(200)

        after_renewal(a)
        pa.hold(lambda data: b"EVAL" in data)  # the scripts; INFO passes
        wait_until(lambda: status(a) in ("fenced", "unreachable"),
                   what="A fencing itself")
        self.assertEqual(wait_claimed(b), wa)
        after_renewal(b)
        blocks = reserve_blocks(b, 2000)
        b.stop()  # releases the id
        pa.release()  # the renewal sent with A's fence arrives now, then the rest
        wait_claimed(a)
        time.sleep(3)
        self.stop_writers(wr_a)
        dup = in_blocks(blocks, wr_a.got) + len(duplicates(wr_a.got))
        self.assertEqual(dup, 0, f"{dup} of A's {len(wr_a.got)} IDs repeat IDs of B's "
                                 f"{len(blocks)} reserved blocks (worker {wa}); A's last "
                                 f"claim: {last_claim(a)}")

    def test_19_renewals_go_on_while_other_ids_are_claimed(self):
        """A renewal depends on its own id's claim only. The datacenter's version (raised
        whenever an id that was free is held) guards a claim, which is decided among all
        the datacenter's ids; renewals that compared it too failed whenever another id was
        claimed between their read and their write (issue 37's fifth review: among 31
        holders at a 20 ms round trip a node lost its claim three times in 90 s). Here the
        version is raised just before every write of A's (the proxy runs INCR, then passes
        the write on): every renewal of A's must succeed, while a claim by B under the same
        interference finds its view stale at each attempt and holds nothing until the
        interference stops. Counted in writes, not time."""
        ttl = 2
        redis = self.started(Redis())
        proxy = self.proxy(redis.port)
        raised = []

        def is_write(data):
            # REDIS_HOLD's call: EVALSHA (or EVAL), the script, 0 keys and 14 arguments.
            return data.startswith(b"*17\r\n")

        # INCR on a connection of the test's own, not a redis-cli process per write: under
        # load a process start can outlast the request's limit (claim_ttl / 5, 400 ms), and
        # the renewal it holds up then fails for a reason this test is not about.
        versions = socket.create_connection(("127.0.0.1", redis.port), timeout=HANG_GUARD)
        self.addCleanup(versions.close)
        key = f"snowflake:version:{DC}".encode()
        one_at_a_time = threading.Lock()  # A's and B's connections are pumped by two threads

        def raise_version():
            with one_at_a_time:
                incr()
            raised.append(1)

        def incr():
            versions.sendall(b"*2\r\n$4\r\nINCR\r\n$%d\r\n%s\r\n" % (len(key), key))
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = versions.recv(64)
                if not chunk:
                    raise AssertionError("Redis closed the test's connection")
                reply += chunk
            if not reply.startswith(b":"):
                raise AssertionError(f"INCR answered {reply!r}")

        def a_fenced():
            """Whether A was fenced. A renewal refused for the version is the defect:
            "changed under each of" in A's log while it held. A renewal that timed out on a
            loaded machine fences A first ("stopped issuing"), and its claims after that meet
            the interference as B's do (a figure)."""
            log_a = a.log()
            changed = log_a.find("changed under each of")
            fenced = log_a.find(fence_line(wa))
            if fenced < 0:
                self.assertLess(changed, 0, "a renewal of A's was refused for the version")
                return False
            self.assertTrue(changed < 0 or changed > fenced,
                            "a renewal of A's was refused for the version before A was fenced")
            report_figure("A fenced under the interference", "a renewal timed out (load)")
            return True

        def a_holds_wa():
            self.assertEqual(status(a), "held")
            self.assertEqual(a.one("SELECT worker_id FROM snowflake_stats()"), wa)

        a = self.new("a", Uri(proxy.redis_uri()), ttl)
        self.up(a)
        wa = wait_claimed(a)
        proxy.before_if, proxy.before = is_write, raise_version
        wait_until(lambda: len(raised) >= 10, what="ten of A's renewals under interference")
        if not a_fenced():
            a_holds_wa()
        b = self.new("b", Uri(proxy.redis_uri()), ttl)
        self.up(b)
        wait_until(lambda: "changed under each of" in b.log(),
                   what="B's claim finding its view stale at every attempt")
        self.assertNotEqual(status(b), "held")
        proxy.before_if = None
        wb = wait_claimed(b)
        if not a_fenced():
            self.assertNotEqual(wa, wb)
            a_holds_wa()
        else:  # A claims again once the interference stops, beside B
            self.assertNotEqual(wait_claimed(a), wb)

    def test_5_redis_restarted_empty_then_new_holders_clock_steps_back(self):
        """Path 5. Holder H (worker w) dies; Redis restarts empty and, once settled, grants w
        to C with no mark. C's clock steps back 5 s right after the grant, before its next
        renewal (the only place the clock is compared with Redis's). C must not issue the
        timestamps H issued 3 s earlier."""
        ttl = 2
        redis = self.started(Redis())
        for w in range(1, WORKERS):
            redis.hold(DC, w)
        h = self.new("h", redis, ttl)
        c = self.new("c", redis, ttl, clock_ms=0)
        self.up(h)
        wh = wait_claimed(h)
        self.up(c)
        wait_status(c, "exhausted")
        wr_h = self.writer(h)
        wr_h.running(200)
        time.sleep(4)  # H issues for 4 s more
        kill_server(h)  # no release
        self.stop_writers(wr_h)
        redis.stop()
        redis.start()  # empty
        conn = c.connect()
        self.assertEqual(wait_claimed(c), wh)
        c.shift_clock_ms(-5000)
        got_c, errors = [], []
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                got_c.extend(conn.execute("SELECT snowflake_next_batch(50)").fetchone()[0])
            except psycopg.Error as e:
                errors.append(e.sqlstate)
                time.sleep(0.02)
        conn.close()
        dup = len(duplicates(wr_h.got, got_c))
        self.assertEqual(dup, 0, f"{dup} of C's {len(got_c)} IDs (worker {wh}, then "
                                 f"{sorted(set(errors))}) repeat H's ({len(wr_h.got)} IDs)")

    def test_7_failover_back_to_a_recorded_run_id_is_a_loss(self):
        """Path 7. R1 is master, R2 its replica; the registry records R1's run_id. R2 is
        promoted (a failover no node reached), B then claims its id on R1 alone; R1 is
        demoted under R2 (a full resync drops B's claim and mark) and promoted back. Its
        run_id is the recorded one, yet the registry lost data: it must settle (free ids
        only claim_ttl later), so C (waiting) does not get B's id while B still issues (B's
        link to Redis is cut meanwhile, so that B's re-assertion does not race C's claim)."""
        ttl = 5
        r1 = self.started(RedisServer())
        r2 = self.started(RedisServer())
        r2.follow(r1)
        for w in range(1, WORKERS):
            r1.hold(DC, w)
        pb = self.proxy(r1.port)
        b = self.new("b", Uri(pb.redis_uri()), ttl)
        c = self.new("c", r1, ttl)
        self.up(b)
        r1_id = r1.run_id()
        # The registry's record of R1 (its incarnation, whatever it is made of) has reached R2.
        wait_until(lambda: r1.cli("HGET", "snowflake:registry", "run_id") != ""
                   and r2.cli("HGET", "snowflake:registry", "run_id")
                   == r1.cli("HGET", "snowflake:registry", "run_id")
                   and r2.cli("EXISTS", f"snowflake:claim:{DC}:{WORKERS - 1}") == "1",
                   what="the registry record on R2")
        r2.promote()  # R1's writes from now on reach R2 no more
        self.assertNotEqual(status(b), "held", "setup: B claimed before R2 was promoted")
        wb = wait_claimed(b)
        wr_b = self.writer(b)
        wr_b.running(200)
        self.up(c)
        wait_status(c, "exhausted")

        after_renewal(b)
        pb.mode = "drop"
        cut_since = time.monotonic()
        r1.follow(r2)  # resync: B's claim and mark are gone
        r1.promote()
        self.assertEqual(r1.run_id(), r1_id)
        r2.follow(r1)
        seen = set()
        wc = wait_claimed(c, seen=seen)
        wr_c = self.writer(c)
        time.sleep(max(0.5, cut_since + ttl / 2 + 0.5 - time.monotonic()))
        pb.mode = "pass"
        time.sleep(0.3)
        self.stop_writers(wr_b, wr_c)
        dup = len(duplicates(wr_b.got, wr_c.got))
        self.assertEqual(dup, 0, f"{dup} duplicate IDs: B ({len(wr_b.got)} IDs, worker {wb}) "
                                 f"and C ({len(wr_c.got)} IDs, worker {wc}); C's statuses: {sorted(seen)}")
        self.assertIn("settling", seen, "the registry did not settle after the failover back to R1")


FLEET_ASSUMPTIONS_MAJOR = os.environ.get("SNOWFLAKE_FLEET_ASSUMPTIONS_MAJOR", "17")


@unittest.skipUnless(PG_MAJOR == FLEET_ASSUMPTIONS_MAJOR,
                     f"runs on PostgreSQL {FLEET_ASSUMPTIONS_MAJOR} only "
                     "(SNOWFLAKE_FLEET_ASSUMPTIONS_MAJOR): it checks the registry's rules")
class FleetAssumptions(FleetFaultBase):
    """Issue 37's assumptions at their edges (docs/fleets.md, "What the claim rules
    assume"): registry hosts with other clocks (path 3), and the procedure for changing
    claim_ttl on a running fleet (path 1)."""

    def holder_cut_off_then_registry_restarted(self, ttl_h, ttl_c, clock_h_ms, clock_c_ms,
                                               jump_ms, what, c_refused_first=False,
                                               c_restarted=False):
        """Holder H (claim_ttl `ttl_h`, clock `clock_h_ms` off the registry's) writes under
        worker w, the datacenter's only free id; right after one of its renewals it is cut
        off from Redis, which restarts empty with its clock `jump_ms` back. Newcomer C
        (claim_ttl `ttl_c`, clock `clock_c_ms` off the old registry's) starts then; its
        first request begins the new incarnation and it is granted w once that settled,
        with no mark (the registry is empty), so its IDs start at its own clock. C writes
        until its clock has passed H's last timestamp by a second. `c_refused_first`: C
        runs already before the cut, refused beside H (its claim_ttl out of ratio);
        `c_restarted`: C is then stopped, and started again right after the loss (a new
        postmaster, its memory gone).
        Returns the duplicates (and reports the figures)."""
        redis = self.started(ShiftedRedis())
        for w in range(1, WORKERS):
            redis.hold(DC, w)
        ph = self.proxy(redis.port)
        h = self.new("h", Uri(ph.redis_uri()), ttl_h, clock_ms=clock_h_ms)
        c = self.new("c", redis, ttl_c, clock_ms=clock_c_ms)
        self.up(h)
        wh = wait_claimed(h)
        wr_h = self.writer(h)
        wr_h.running(200)
        if c_refused_first:
            self.up(c)
            self.assertIn("claim_ttl", refusal(c).diag.message_detail)
            if c_restarted:
                c.stop()  # started again after the loss: a new postmaster, its memory gone

        renewed_at = after_renewal(h)
        ph.mode = "drop"  # H's renewals reach no registry from now on
        redis.stop()
        redis.clock_ms = -jump_ms
        redis.start()  # empty, on the "other host"
        restarted_in = time.monotonic() - renewed_at
        if c_restarted:
            c.start()  # its first request begins the new incarnation
        elif not c_refused_first:
            self.up(c)  # its first request begins the new incarnation
        seen = set()
        self.assertEqual(wait_claimed(c, seen=seen), wh)
        granted_after = time.monotonic() - renewed_at
        wr_c = self.writer(c)
        wr_c.running(200)
        # H's fence has ended (it stopped issuing long before C's grant, whatever the build);
        # C writes until its clock has passed H's last timestamp by a second.
        wait_until(lambda: status(h) != "held", what="H's claim lapsed")
        self.stop_writers(wr_h)
        h_last_ms = max(wr_h.got) >> 22
        wait_until(lambda: (wr_c.got[-1] >> 22) > h_last_ms + 1000,
                   what="C's IDs past H's last timestamp")
        self.stop_writers(wr_c)
        self.assertIn("settling", seen, "C was granted the id without the registry settling")
        dup = len(duplicates(wr_h.got, wr_c.got))
        gap_ms = (min(wr_c.got) >> 22) - h_last_ms
        report_figure(what, (
            f"claim_ttl H {ttl_h} s, C {ttl_c} s; registry clock {-jump_ms} ms after its "
            f"restart; H {clock_h_ms:+} ms, C {clock_c_ms:+} ms from the old registry's clock; "
            f"restarted {restarted_in:.2f} s after H's last renewal, C granted after "
            f"{granted_after:.2f} s; H {len(wr_h.got)} IDs (then {sorted(set(wr_h.errors))}), "
            f"C {len(wr_c.got)} IDs; C's first timestamp {gap_ms} ms above H's last; "
            f"{dup} duplicates"))
        return dup, f"H ({len(wr_h.got)} IDs) and C ({len(wr_c.got)} IDs) on worker {wh}; " \
                    f"C's first timestamp is {gap_ms} ms above H's last"

    def test_12_a_server_refused_for_its_claim_ttl_settles_for_the_holders(self):
        """Issue 37, path 1 with the misconfigured server running: holder H at 10 s, newcomer
        C at 5 s refused beside it (so it issues nothing). H is cut off right after a
        renewal and Redis restarts empty: the records of H's claim_ttl are gone. C settles
        for the 10 s its refusal named (12 s), not its own 5 s (6 s), so it is given H's id
        only after H's fence ended: no ID twice (settling for its own claim_ttl, as before
        issue 37's last change: 29,200 duplicates, C's first timestamp 1,019 ms below H's
        last)."""
        dup, detail = self.holder_cut_off_then_registry_restarted(
            10, 5, clock_h_ms=1900, clock_c_ms=-950, jump_ms=0,
            what="claim_ttl 5 s refused beside 10 s, then the registry lost", c_refused_first=True)
        self.assertEqual(dup, 0, f"{dup} duplicate IDs: {detail}")

    def test_12b_the_longer_claim_ttl_survives_a_restart_of_the_refused_server(self):
        """test_12 with C stopped after its refusal and started again right after the loss
        (a new postmaster): C reads the longer claim_ttl back from
        $PGDATA/snowflake.fleet_ttl and still settles for it. (Kept in memory only, as on
        04945bb, the restart forgot it: C settled for its own claim_ttl, 344,250 duplicates,
        its first timestamp 1,658 ms below H's last.)"""
        dup, detail = self.holder_cut_off_then_registry_restarted(
            10, 5, clock_h_ms=1900, clock_c_ms=-950, jump_ms=0,
            what="claim_ttl 5 s refused beside 10 s, restarted, then the registry lost",
            c_refused_first=True, c_restarted=True)
        self.assertEqual(dup, 0, f"{dup} duplicate IDs: {detail}")

    def test_11_etcd_refuses_a_claim_ttl_out_of_ratio(self):
        """test_registry's claim_ttl refusal (Redis, the coordinator), on etcd: the holder's
        claim_ttl is in its marks. A holds at 4 s; B at 2 s is refused with the numbers; C
        at 3.2 s claims."""
        etcd = EtcdCluster(1)
        self.addCleanup(etcd.close)
        etcd.start()
        uri = Uri(f"'{etcd.uri()}'")
        a = self.new("ea", uri, 4)
        self.up(a)
        wait_claimed(a)
        b = self.new("eb", uri, 2)
        self.up(b)
        e = refusal(b)
        self.assertEqual(e.sqlstate, "55000")
        self.assertIn("snowflake.claim_ttl from 4000 ms to 4000 ms; this server's is 2000 ms",
                      e.diag.message_detail)
        c = self.new("ec", uri, 3.2)
        self.up(c)
        wait_claimed(c)

    def test_8_redis_restarted_empty_on_a_host_whose_clock_is_behind(self):
        """Redis restarts empty on a host whose clock is J = 0.28 x claim_ttl behind the old
        one (within the 0.3 x claim_ttl that docs/fleets.md allows), as after a rescheduled
        pod or a failover to another host. Holder H's clock is 0.19 x claim_ttl ahead of the
        old host's, newcomer C's 0.19 x claim_ttl behind the new host's: each passes its own
        clock check. The settle (claim_ttl + claim_ttl / 5, since issue 37) covers H's
        fence, both skews and the jump: no ID twice. (With 0.7.0's settle of claim_ttl, C's
        first IDs fell 1.2 s of timestamps below H's last: 19,850 duplicates.)"""
        dup, detail = self.holder_cut_off_then_registry_restarted(
            10, 10, clock_h_ms=1900, clock_c_ms=-(2800 + 1900), jump_ms=2800,
            what="registry host clock behind")
        self.assertEqual(dup, 0, f"{dup} duplicate IDs: {detail}")

    def test_10_claim_ttl_lowered_by_a_fifth_survives_a_registry_loss(self):
        """docs/fleets.md's procedure for changing claim_ttl on a running fleet: steps of at
        most a fifth. Mid-change, holder H still has 10 s and newcomer C already 8 s when
        Redis restarts empty; H's clock 0.19 x 10 s ahead, C's 0.19 x 8 s behind. C's settle
        is its own (9.6 s), yet it covers H's fence (5 s) and both skews: no ID twice.
        (Beyond the procedure, C at 5 s is given the id while H's timestamps are still
        ahead of its clock: issue 37's open path 1.)"""
        dup, detail = self.holder_cut_off_then_registry_restarted(
            10, 8, clock_h_ms=1900, clock_c_ms=-1500, jump_ms=0,
            what="claim_ttl 10 s -> 8 s mid-change")
        self.assertEqual(dup, 0, f"{dup} duplicate IDs: {detail}")

    def test_9_a_registry_clock_jump_beyond_the_settle_is_reported(self):
        """The settle covers a registry clock up to 3/10 of claim_ttl behind its previous
        one; further back, a server that saw both incarnations reports it (the WARNING of
        docs/troubleshooting.md). Node C waits for an id (all held by fake servers) while
        Redis restarts empty twice: first with its clock 0.28 x claim_ttl behind (covered:
        no warning), then, C's clock moved along so that it passes its own check, another
        0.35 x claim_ttl behind (warned, with the numbers)."""
        ttl = 10
        redis = self.started(ShiftedRedis())
        self.hold_all_but(redis, keep=None)
        c = self.new("c", redis, ttl, clock_ms=-1900)
        self.up(c)
        wait_status(c, "exhausted")
        warning = "came back with a clock"

        def restart(clock_ms):
            redis.stop()
            redis.clock_ms = clock_ms
            redis.start()  # empty
            self.hold_all_but(redis, keep=None)  # before the settle ends: C gets no id
            wait_status(c, "settling")  # C saw the new incarnation
            wait_status(c, "exhausted")

        restart(-2800)
        self.assertNotIn(warning, c.log(), "a jump the settle covers was reported")
        # C's clock moves while it waits; two of its requests are answered after that (so
        # its last view of the registry's clock is the moved one) before the next restart.
        c.shift_clock_ms(-1900 - 2800)
        calls = redis.script_calls()
        wait_until(lambda: redis.script_calls() >= calls + 2, what="two requests of C")
        restart(-2800 - 3500)
        try:
            wait_until(lambda: warning in c.log(), what="the WARNING of a registry clock jump")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{c.log()[-3000:]}") from None
        line = next(line for line in c.log().splitlines() if warning in line)
        self.assertRegex(line, r"WARNING:.*came back with a clock 3[45]\d\d ms behind")
        print(f"\n    {line}", flush=True)

    def copy_with_memory(self, a, twin, **settings):
        """Copy B of running node A as a copy made with its memory looks to the registry:
        A's data directory copied while A is stopped (SIGSTOP; its token file, claim file
        and durable lease), A's postmaster token (`twin`: tests/twinshim's environment,
        which A runs under too) and A's port (its own socket directory, so no clash), so
        the same tokens. `settings` override A's. Returns B, not started."""
        b = Cluster(f"copy{free_port()}", {**a.settings, **settings}, port=a.port)
        self.clusters.append(b)
        pids = kill_server(a, signal.SIGSTOP)
        try:
            b._fresh_dir()
            subprocess.run(["cp", "-a", a.data, b.data], check=True)
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        os.remove(os.path.join(b.data, "postmaster.pid"))
        b.write_settings()
        b.env = dict(twin)
        return b

    def memory_copy_is_refused(self, registry, what):
        """Issue 37: a running server copied with its memory (a VM cloned or reverted with its
        memory, a restored process snapshot) has the same claim token and generator state as
        the original. Node A (claim_ttl 4 s) holds worker w and writes; it is stopped
        (SIGSTOP), its data directory copied, and copy B started from it, with A's
        postmaster token and port (tests/twinshim: B is A to the registry), while A goes on.
        With the same token both renewed w for ever and both wrote under it (0.7.0: 531,450,
        712,800 and 527,300 duplicates in 5 s on Redis, the coordinator, etcd); with a
        token drawn for every grant and renewal, the registry keeps w for the first copy to
        write and refuses the other within two fence reaches (claim_ttl). Asserts: the two
        stop sharing w within that bound (liveness, from the settings and the measured
        scheduling delay) once B holds a claim, and no ID is issued twice. Whether the refused
        copy's log names a copy (it does when B took w first) is reported."""
        ttl = 4
        twin = {"LD_PRELOAD": twin_shim_lib(), "SNOWFLAKE_TWIN_RANDOM": os.urandom(16).hex()}
        a = self.new("twin", registry, ttl)
        a.env = dict(twin)
        self.up(a)
        w = wait_claimed(a)
        wr_a = self.writer(a)
        wr_a.running(200)
        b = self.copy_with_memory(a, twin)
        self.up(b)
        wait_claimed(b)
        started = time.monotonic()
        wr_b = self.writer(b)

        def holds(c):
            row = c.sql("SELECT claim_status, worker_id FROM snowflake_stats()")[0]
            return row == ("held", w)

        shared = []  # the times both copies were seen holding w

        def apart():
            both = holds(a) and holds(b)
            if both:
                shared.append(time.monotonic() - started)
            return not both

        try:
            took = wait_live(apart, ttl, since=started,
                             what=f"copies A and B of one server no longer both hold worker {w}")
        except AssertionError as e:
            self.stop_writers(wr_a, wr_b)
            raise AssertionError(f"{e}; {len(duplicates(wr_a.got, wr_b.got))} duplicate IDs so far "
                                 f"(A {len(wr_a.got)}, B {len(wr_b.got)})") from None
        # Both go on writing (the refused copy under another id, or after a new claim).
        marks = len(wr_a.got), len(wr_b.got)
        wait_until(lambda: len(wr_a.got) > marks[0] + 500 and len(wr_b.got) > marks[1] + 500,
                   what="both copies writing after the refusal")
        self.stop_writers(wr_a, wr_b)
        dup = len(duplicates(wr_a.got, wr_b.got))
        logs = a.log() + b.log()
        refused = "a copy of this server made with its memory" in logs
        report_figure(what, (
            f"claim_ttl {ttl} s; both copies seen holding worker {w} "
            f"{'until ' + format(max(shared), '.2f') + ' s' if shared else 'never'} after B's "
            f"claim, apart after {took:.2f} s; A {len(wr_a.got)} IDs, B {len(wr_b.got)} IDs; "
            f"{dup} duplicates; A's log {'names' if refused else 'does not name'} a copy"))
        self.assertEqual(dup, 0, f"{dup} duplicate IDs between the copies")

    def test_13_a_memory_copy_is_refused_by_redis(self):
        self.memory_copy_is_refused(self.started(RedisServer()), "memory copy, Redis")

    def test_14_a_memory_copy_is_refused_by_the_coordinator(self):
        self.memory_copy_is_refused(self.started(Coordinator()), "memory copy, coordinator")

    def test_15_a_memory_copy_is_refused_by_etcd(self):
        etcd = EtcdCluster(1)
        self.addCleanup(etcd.close)
        etcd.start()
        self.memory_copy_is_refused(Uri(f"'{etcd.uri()}'"), "memory copy, etcd")

    def test_16_a_server_moved_to_another_registry_is_refused(self):
        """Issue 37: one registry per fleet. Two registries serving one fleet (another Redis
        database, etcd prefix or coordinator schema; a move by rolling restart) each grant
        every id. A server records the registry it claimed from (its address and the id the
        registry made with its first record) and claims nothing from a registry whose address
        and id both differ: refused with the cause, until the deliberate move of
        docs/fleets.md (here: the claim file removed while the server is stopped). The same
        registry at another address, and the same address after the registry lost its data,
        are not refused. (0.7.0 claimed from the second registry at once.)"""
        redis = self.started(RedisServer())

        def at(address, db):
            return {"snowflake__registry": f"'redis://{address}:{redis.port}/{db}'"}

        a = self.new("mover", Uri(f"'redis://127.0.0.1:{redis.port}/0'"), 4)
        self.up(a)
        first = wait_claimed(a)
        a.stop()

        def restart_with(**settings):
            a.configure(**settings)
            a.start()
            wait_until(lambda: status(a) in ("held", "refused"),
                       what=f"{a.name}: a claim or a refusal")
            return status(a)

        # The same registry at another address: its id is the same.
        self.assertEqual(restart_with(**at("localhost", 0)), "held")
        a.stop()
        # Another database of the same server: another registry.
        self.assertEqual(restart_with(**at("127.0.0.1", 1)), "refused",
                         "claimed from a second registry of the fleet")
        with a.connect() as conn:
            e = error_of(conn, "SELECT snowflake_next()")
        self.assertEqual(e.sqlstate, "55000")
        self.assertIn(f"last claimed worker ids from registry redis://localhost:{redis.port}/0",
                      e.diag.message_detail)
        self.assertIn("is another registry", e.diag.message_detail)
        a.stop()
        # The deliberate move: the claim file removed while the server is stopped.
        os.remove(os.path.join(a.data, "snowflake.claim"))
        self.assertEqual(restart_with(), "held")
        a.stop()
        # The same address after the registry lost its data (a new id): a loss, which the
        # registry settles for, not another registry.
        redis.stop()
        redis.start()  # empty
        self.assertEqual(restart_with(), "held")
        report_figure("another registry", (
            f"worker {first} from redis db 0; the same registry at another address claimed; "
            f"db 1 refused (55000: {e.diag.message_detail[:80]}...); claimed after the claim "
            f"file was removed; claimed again after db 1's server restarted empty"))

    def test_17_a_registry_back_with_an_older_token_keeps_the_holder(self):
        """Every renewal writes a new token, so a registry that lost its last writes (Redis
        restarted from a dump a few renewals old, an AOF missing its last second, a replica
        that missed the last renewal, an etcd snapshot) holds an older token of its holder.
        The holder still counts the tokens it drew recently as its own and re-asserts its
        claim: the same id, never stopped. (The first version of the rotation knew only the
        last two: the holder was told its claim was lost, stopped for 6 s and logged that a
        copy of it had renewed; issue 37's review of it.) Redis is saved right after a
        renewal, two more renewals follow, then it is SIGKILLed and restarted from that
        dump."""
        ttl = 5
        redis = self.started(RedisServer())
        a = self.new("older", redis, ttl)
        self.up(a)
        w = wait_claimed(a)
        wr = self.writer(a)
        wr.running(200)
        after_renewal(a)
        redis.cli("SAVE")
        after_renewal(a)
        after_renewal(a)
        errors_before = len(wr.errors)
        redis.proc.send_signal(signal.SIGKILL)
        redis.proc.wait()
        redis.start()  # the same directory: from the dump, with the older token
        killed_at = time.monotonic()
        # The next renewals reach the new incarnation: a re-assertion, then plain ones.
        after_renewal(a)
        after_renewal(a)
        self.stop_writers(wr)
        # Told its claim was lost (a fence that ran out because the machine held a renewal
        # up is liveness, not this: the holder then takes its id back by its token).
        told = ("no longer has this server's claim", "gave worker id",
                "for another server with this server's host name")
        lost = [line for line in a.log().splitlines() if any(t in line for t in told)]
        report_figure("registry back with an older token", (
            f"claim_ttl {ttl} s; worker {w} before, "
            f"{a.one('SELECT worker_id FROM snowflake_stats()')} after; "
            f"{len(wr.errors) - errors_before} errors after the restart; "
            f"{time.monotonic() - killed_at:.2f} s watched"))
        self.assertEqual(lost, [], "the holder was told its claim was lost")
        self.assertEqual(status(a), "held")
        self.assertEqual(a.one("SELECT worker_id FROM snowflake_stats()"), w)

    def test_18_a_memory_copys_release_does_not_hand_the_id_below_the_other(self):
        """A copy of a running server takes the id back by the token it shares with the
        original, then is stopped cleanly: its release must not let a third server start
        below what the original, cut off but still inside its fence, issues. Node A
        (claim_ttl 10 s, through a proxy) holds the datacenter's only free id; node D waits
        for one; A is cut off right after a renewal and copy B of it (tests/twinshim) claims
        the id as its own and is stopped. The release now gives D at least the id's mark
        from before B's claim, above A's last cap: no ID twice. (Before, B's release gave
        D its own floor: 637,350 duplicates between A and D; issue 37's review of the token
        rotation. 0.7.0 had the same path.)"""
        ttl = 10
        redis = self.started(RedisServer())
        self.hold_all_but(redis, 0)
        proxy = self.proxy(redis.port)
        twin = {"LD_PRELOAD": twin_shim_lib(), "SNOWFLAKE_TWIN_RANDOM": os.urandom(16).hex()}
        a = self.new("origin", Uri(proxy.redis_uri()), ttl)
        a.env = dict(twin)
        self.up(a)
        self.assertEqual(wait_claimed(a), 0)
        wr_a = self.writer(a)
        wr_a.running(200)
        d = self.new("third", redis, ttl)
        self.up(d)
        wait_status(d, "exhausted")
        wr_d = self.writer(d)
        after_renewal(a)
        proxy.mode = "drop"  # A issues on under its fence, unheard
        b = self.copy_with_memory(a, twin, **{"snowflake.registry": redis.uri()})
        b.start()
        self.assertEqual(wait_claimed(b), 0)
        b.stop("fast")  # a clean release of worker 0
        self.assertEqual(wait_claimed(d), 0)
        wait_until(lambda: status(a) != "held", what="A's fence ended")
        marks = len(wr_d.got)
        wait_until(lambda: len(wr_d.got) > marks + 500, what="D writing after A stopped")
        self.stop_writers(wr_a, wr_d)
        dup = len(duplicates(wr_a.got, wr_d.got))
        gap_ms = (min(v for v in wr_d.got) >> 22) - (max(wr_a.got) >> 22)
        report_figure("memory copy released beside its cut-off original", (
            f"claim_ttl {ttl} s; A {len(wr_a.got)} IDs, D {len(wr_d.got)} IDs; D's first "
            f"timestamp {gap_ms} ms from A's last; {dup} duplicates"))
        self.assertEqual(dup, 0, f"{dup} duplicate IDs between A and D")


def tearDownModule():
    # The shims' libraries, built in this run's directory (harness.shim_lib).
    for name in ("clockshim.so", "twinshim.so"):
        lib = os.path.join(BASE, name)
        if os.path.exists(lib):
            os.remove(lib)
    try:
        os.rmdir(BASE)
    except OSError:
        pass


if __name__ == "__main__":
    unittest.main()
