"""A coordinator registry hosted by one of the nodes it gives worker ids to: the shape of a
Citus cluster (docs/citus.md), whose coordinator is its workers' registry and also issues
IDs for the statements it receives. Every node has the same settings (worker_id = 'auto',
the host's URI), the host included, and nothing else: no per-node configuration. Citus is
not needed for what is checked here (it cannot be built by the test command): the claims,
a node joining while the others write, the host restarted cleanly and crash-restarted, and
the host stopped with a smart shutdown, which its own registry worker's connection (and
every node's) held for ever before the coordinator client replaced aged connections, and a
role taking every free connection slot of the host, which must not stop a connected node."""

import subprocess
import time
import unittest

import psycopg

from harness import HANG_GUARD, Cluster, assert_live, report_figure, wait_live, wait_until
from fixtures.clusters import PRELOAD, TTL, TTL_S, Writer
from fixtures.ids import duplicates, workers_of
from fixtures.registries import free_port
from fixtures.waits import claim_state, logged_failure_causes, wait_claimed

REGISTRY_DB = "snowflake_registry"
HEARTBEAT_S = TTL_S / 5
# A registry's new incarnation settles for claim_ttl + claim_ttl / 5 before it grants a free
# id (docs/fleets.md).
SETTLE_S = TTL_S + TTL_S / 5
# The coordinator client replaces a connection older than 3 x claim_ttl at its next request
# (registry/src/postgres.rs), one heartbeat later at most.
CONNECTION_LIFETIME_S = 3 * TTL_S
# The worker's release at shutdown waits at most 1 s (src/fleet/runner.rs).
SHUTDOWN_RELEASE_S = 1.0
# What PostgreSQL 15 to 18 say to a role that is not a superuser when only reserved slots are
# left, and to anyone when no slot is left at all.
NO_SLOT = ("remaining connection slots are reserved", "too many clients already")


class RegistryOnANode(unittest.TestCase):
    def setUp(self):
        port = free_port()
        # The nodes connect as a role of their own, not a superuser (docs/citus.md): a
        # superuser could take the slots that superuser_reserved_connections keeps.
        self.uri = f"'postgresql://snowflake_node@127.0.0.1:{port}/{REGISTRY_DB}'"
        self.host = self.cluster(f"host{port}", port, listen_addresses="'127.0.0.1'",
                                 max_connections="20")
        self.host.init()
        self.host.start()
        self.host.sql("CREATE ROLE snowflake_node LOGIN")
        self.host.sql(f"CREATE DATABASE {REGISTRY_DB} OWNER snowflake_node")
        self.host.sql("CREATE EXTENSION snowflake")

    def cluster(self, name, port=None, **extra):
        """A node with the fleet's settings, the same on every node."""
        settings = {
            "shared_preload_libraries": PRELOAD,
            "snowflake.worker_id": "auto",
            "snowflake.datacenter_id": "1",
            "snowflake.registry": self.uri,
            "snowflake.claim_ttl": f"'{TTL}'",
            "snowflake.clock_behind_action": "wait",
        }
        settings.update(extra)
        c = Cluster(name, settings, port=port or free_port())
        self.addCleanup(c.destroy)
        return c

    def join(self, name):
        c = self.cluster(f"{name}{free_port()}")
        c.init()
        c.start()
        c.sql("CREATE EXTENSION snowflake")
        return c

    def writers(self, nodes):
        ws = [Writer(c) for c in nodes]
        for w in ws:
            w.start()
        for w in ws:
            w.running()
        return ws

    @staticmethod
    def stop(writers):
        for w in writers:
            w.stop.set()
        for w in writers:
            w.join()

    def assert_no_duplicate(self, writers, *more):
        dup = duplicates(*[w.got for w in writers], *more)
        self.assertEqual(dup, [], f"{len(dup)} IDs issued twice")

    def holders(self):
        return self.host.sql(
            "SELECT worker_id FROM snowflake_claims WHERE holder IS NOT NULL ORDER BY 1",
            dbname=REGISTRY_DB)

    def test_every_node_claims_its_own_id_and_so_does_a_node_that_joins(self):
        nodes = [self.host, self.join("a"), self.join("b")]
        claimed = [wait_claimed(c) for c in nodes]
        self.assertEqual(len(set(claimed)), 3, claimed)
        writers = self.writers(nodes)
        joiner = self.join("joiner")
        joined = wait_claimed(joiner)
        self.assertNotIn(joined, claimed)
        writers += self.writers([joiner])
        self.stop(writers)
        self.assert_no_duplicate(writers)
        for w, worker in zip(writers, claimed + [joined]):
            self.assertEqual(workers_of(w.cluster, w.got), {worker}, w.cluster.name)
        self.assertEqual([r[0] for r in self.holders()], sorted(claimed + [joined]))

    def test_the_host_restarted_and_crash_restarted_issues_no_id_twice(self):
        """The host's restart is its registry's new incarnation: the host, a newcomer with a
        new postmaster, waits for the settle before it claims again; the other nodes keep
        their ids (re-asserted) and issue while their fences last."""
        a, b = self.join("a"), self.join("b")
        for c in (self.host, a, b):
            wait_claimed(c)
        writers = self.writers([self.host, a, b])
        for mode, what in (("fast", "a clean restart"), ("immediate", "a crash restart")):
            self.host.stop(mode)
            self.host.start()
            started = time.monotonic()
            # A first request may meet the server still starting (retried a heartbeat
            # later); then the settle, then the claim at the next heartbeat.
            took = wait_live(lambda: claim_state(self.host)[0] == "held",
                             SETTLE_S + 2 * HEARTBEAT_S, since=started,
                             what=f"the host's claim after {what}")
            report_figure(f"the host's claim after {what}",
                          f"{took:.2f} s after the server accepted connections (settle "
                          f"{SETTLE_S:.1f} s)")
            issued = len(writers[0].got)
            wait_until(lambda: len(writers[0].got) > issued + 500,
                       what="the host's writer issuing again")
        self.stop(writers)
        self.assert_no_duplicate(writers)
        report_figure("errors of the other nodes meanwhile",
                      f"{len(writers[1].errors)} and {len(writers[2].errors)} (55000 while fenced)")

    def test_a_smart_shutdown_of_the_host_completes(self):
        """pg_ctl stop -m smart waits for every client session: the nodes' registry
        connections to the host, its own worker's among them, are replaced when older than
        3 x claim_ttl, and a host in shutdown refuses the new ones, so the shutdown ends.
        Before, it waited for ever (and the host refused every other new connection)."""
        a, b = self.join("a"), self.join("b")
        for c in (self.host, a, b):
            wait_claimed(c)
        writers = self.writers([a, b])
        began = time.monotonic()
        r = subprocess.run(["runuser", "-u", "postgres", "--", f"{self.host.bin}/pg_ctl", "-D",
                            self.host.data, "-m", "smart", "-w", "-t", str(HANG_GUARD), "stop"],
                           capture_output=True, text=True)
        took = time.monotonic() - began
        if r.returncode != 0:
            self.host.stop("immediate")
        self.assertEqual(r.returncode, 0, f"smart shutdown of the host: {r.stdout}{r.stderr}")
        assert_live(self, took, CONNECTION_LIFETIME_S + 2 * HEARTBEAT_S + SHUTDOWN_RELEASE_S,
                    began, "smart shutdown of a node hosting the registry")
        # The nodes fenced meanwhile; back with the host, they issue again, and nothing twice.
        self.host.start()
        for c in (self.host, a, b):
            wait_claimed(c)
        for w in writers:
            issued = len(w.got)
            wait_until(lambda w=w, issued=issued: len(w.got) > issued + 500,
                       what=f"{w.cluster.name} issuing again")
        self.stop(writers)
        self.assert_no_duplicate(writers, self.host.one("SELECT snowflake_next_batch(1000)"))

    def registry_sessions(self):
        return {r[0] for r in self.host.sql(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'snowflake registry'")}

    def take_every_free_slot(self, held):
        """Connects as the role filler until the host has no slot left for a role that is not
        a superuser, and returns the registry sessions then (one per node).

        A refused connection does not show that: the test's own sessions come and go (a
        superuser's takes a slot while it lasts, and its backend ends after the client has
        gone), and a node may be replacing its connection (made first: the new one took a
        slot, and the old one is about to give its own back). So the host is counted: the
        slots are full when the filler's sessions and the nodes' take every slot but the
        reserved ones. A session still starting (not yet shown) or ending (no longer shown)
        makes the count smaller, never larger, and the filler then tries again. A node
        whose request failed meanwhile drops its connection: the filler gives a slot back
        rather than take the one it needs."""
        def full():
            # Only the filler's sessions still held: a closed one shows until its backend
            # has ended.
            fillers, registry, slots = self.host.sql(
                "SELECT count(*) FILTER (WHERE pid = ANY(%s)),"
                " count(*) FILTER (WHERE application_name = 'snowflake registry'),"
                " current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"
                " - coalesce(current_setting('reserved_connections', true)::int, 0)"
                " FROM pg_stat_activity WHERE backend_type = 'client backend'",
                ([f.info.backend_pid for f in held],))[0]
            if registry < 3:
                if held:
                    held.pop().close()
                return False
            if registry == 3 and fillers + registry >= slots:
                return True
            try:
                held.append(psycopg.connect(host=self.host.dir, port=self.host.port,
                                            user="filler", dbname="postgres"))
            except psycopg.OperationalError:
                pass  # a slot taken for a while: counted again
            return False

        wait_until(full, what="every slot of the host taken")
        return self.registry_sessions()

    def test_a_role_taking_every_free_slot_stops_no_connected_node(self):
        """A connection past its lifetime is replaced by one made first: with every free
        slot of the host taken by an ordinary role, each node keeps its session and renews
        on it. A first version closed the old connection first, and so gave its slot away:
        this test saw every session replaced (the node got its own slot back, the filler
        here not trying again), and an adversarial review's filler, connecting in a loop,
        took the freed slots and stopped the whole fleet for 50 s.

        A session may still be replaced for another reason: a request that failed (a
        timeout on a loaded machine) drops the connection, and the node connects again into
        the slot it freed. The node logs the failure's cause; where one other than a refused
        slot is logged, a replaced session is a figure, not a failure. The renewals are
        asserted in every case."""
        a, b = self.join("a"), self.join("b")
        nodes = (self.host, a, b)
        for c in nodes:
            wait_claimed(c)
        writers = self.writers([a, b])
        self.host.sql("CREATE ROLE filler LOGIN")
        held = []
        self.addCleanup(lambda: [f.close() for f in held])
        logged = {c.name: len(c.log()) for c in nodes}
        # A node logs a failure's cause only when it differs from the last one, until a
        # success: with a renewal of each node after `logged`, every failure from then on
        # is in the part of the log read below.
        expires = [c.one("SELECT claim_expires_at FROM snowflake_stats") for c in nodes]
        for c, e in zip(nodes, expires):
            wait_until(lambda c=c, e=e: c.one(
                "SELECT claim_expires_at > %s FROM snowflake_stats", (e,)),
                what=f"{c.name} renewing")
        # Read once the slots are taken: a connection that passed its lifetime while the
        # filler was still connecting was rightly replaced (CI saw it, on a loaded machine).
        sessions = self.take_every_free_slot(held)
        began = self.host.one("SELECT clock_timestamp()")
        since = time.monotonic()
        # Renewed after every connection passed its lifetime: its claim then expires later
        # than that renewal's earliest time plus claim_ttl.
        wait_live(lambda: all(c.one(
            "SELECT claim_expires_at > %s::timestamptz + make_interval(secs => %s) FROM snowflake_stats",
            (began, CONNECTION_LIFETIME_S + HEARTBEAT_S + TTL_S)) for c in nodes),
            CONNECTION_LIFETIME_S + 2 * HEARTBEAT_S, since=since,
            what="every node renewing past its connection's lifetime, with no slot free")
        kept = sessions & self.registry_sessions()
        # A node that closed its connection before making the new one logs a refused
        # connection (no slot), or nothing when it got its own slot back: only another
        # cause, logged first, shows a connection dropped after a failed request.
        dropped = {c.name: cause for c in nodes
                   for cause in logged_failure_causes(c.log()[logged[c.name]:])
                   if not any(refused in cause for refused in NO_SLOT)}
        if dropped:
            report_figure("registry sessions kept with no slot free",
                          f"{len(kept)} of {len(sessions)}; a request failed meanwhile: "
                          f"{dropped} (its connection dropped and made again)")
        else:
            self.assertEqual(kept, sessions,
                             "the nodes kept their sessions while no slot was free")
        for f in held:
            f.close()
        held.clear()
        # With slots free again the sessions are replaced.
        wait_until(lambda: not (sessions & self.registry_sessions()),
                   what="the registry sessions replaced once slots are free")
        self.stop(writers)
        self.assert_no_duplicate(writers)
