"""The test fixtures' own guarantees, which every registry test rests on.

A CI run (stop 43) failed waiting 120 s for a new three-member etcd cluster to become
healthy. Its ports came from binding port 0 and closing the socket; anything on the machine
(a client connection of one of the four suites running at once, another suite's bind to
port 0) could take such a port before etcd bound it, and the member that could not bind
exited. ports.py now hands out ports nothing else can take, and a fixture whose server
exits fails at once with the server's own words.

The suite runs on one major only (the fixtures do not depend on it).
"""

import os
import socket
import subprocess
import sys
import unittest

from harness import PG_MAJOR
from ports import PortAllocator, bindable, ephemeral_range, free_ports
from fixtures.registries import EtcdCluster

FIXTURES_MAJOR = os.environ.get("SNOWFLAKE_FIXTURES_MAJOR", "15")
# The allocators under test take ports from here: below test_ha's fixed ports and the
# suites' own range (ports.RANGE_START), so that nothing else binds them.
TEST_RANGE = 23000

CHILD = """
import sys
sys.path.insert(0, {here!r})
from ports import PortAllocator
a = PortAllocator(lock_dir={lock_dir!r}, start={start}, end={end}, block={block})
print(" ".join(map(str, a.take({n}))), flush=True)
sys.stdin.read()  # holds its block until the parent closes stdin
"""


@unittest.skipUnless(PG_MAJOR == FIXTURES_MAJOR,
                     f"the fixture tests run on PostgreSQL {FIXTURES_MAJOR} only")
class Ports(unittest.TestCase):

    def lock_dir(self):
        d = os.path.join(os.environ.get("SNOWFLAKE_IT_BASE", "/var/tmp"),
                         f"port-locks-{self.id().rsplit('.', 1)[-1]}")
        os.makedirs(d, exist_ok=True)
        return d

    def test_ports_are_outside_the_ephemeral_range_and_free(self):
        """No client socket and no bind to port 0 can be given one of them."""
        low, high = ephemeral_range()
        ports = free_ports(20)
        self.assertEqual(len(set(ports)), 20)
        for p in ports:
            self.assertFalse(low <= p <= high, (p, low, high))
            self.assertTrue(bindable(p), p)

    def test_two_processes_never_share_a_port(self):
        """Three processes allocating from the same range at the same time get disjoint
        blocks (flock), never the same ports."""
        code = CHILD.format(here=os.path.dirname(os.path.abspath(__file__)),
                            lock_dir=self.lock_dir(), start=TEST_RANGE + 2000,
                            end=TEST_RANGE + 2200, block=50, n=30)
        children = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True) for _ in range(3)]
        try:
            got = [set(map(int, c.stdout.readline().split())) for c in children]
        finally:
            for c in children:
                c.stdin.close()
                c.wait(timeout=60)
                c.stdout.close()
        for g in got:
            self.assertEqual(len(g), 30, got)
        self.assertFalse(got[0] & got[1] or got[0] & got[2] or got[1] & got[2], got)

    def test_a_port_is_given_once_and_never_while_in_use(self):
        """Fixtures name their directories after their ports: a process gets each port
        once, skipping any that something is bound to; another block when its own are
        used up; its first port again only when the whole range is used up."""
        a = PortAllocator(lock_dir=self.lock_dir(), start=TEST_RANGE, end=TEST_RANGE + 1000,
                          block=50)
        first = a.take(1)[0]
        with socket.socket() as s:  # a server of an earlier test, still listening
            s.bind(("127.0.0.1", first + 1))
            s.listen()
            turn = a.take(48)
            self.assertEqual(turn, list(range(first + 2, first + 50)))
            more = a.take(60)
        self.assertEqual(len(a.blocks), 3)
        self.assertEqual(len(set(more)), 60)
        self.assertFalse(set(more) & (set(turn) | {first, first + 1}))

        one_block = PortAllocator(lock_dir=self.lock_dir() + "-small", start=TEST_RANGE + 1500,
                                  end=TEST_RANGE + 1550, block=50)
        first = one_block.take(1)[0]
        with socket.socket() as s:
            s.bind(("127.0.0.1", first + 1))
            s.listen()
            rest = one_block.take(48)
            self.assertEqual(one_block.take(1), [first])  # the range is used up
        self.assertNotIn(first + 1, rest)


@unittest.skipUnless(PG_MAJOR == FIXTURES_MAJOR,
                     f"the fixture tests run on PostgreSQL {FIXTURES_MAJOR} only")
class ServerThatCannotBind(unittest.TestCase):

    def test_etcd_member_that_cannot_bind_fails_the_start_at_once(self):
        """The fault of the CI run, reproduced: one member's peer port is taken before the
        member starts. The start fails with the member's exit and its log ("address
        already in use"), not after the 120 s guard with nothing to go on."""
        etcd = EtcdCluster(3, election_ms=500)
        self.addCleanup(etcd.close)
        squatter = socket.socket()
        self.addCleanup(squatter.close)
        squatter.bind(("127.0.0.1", etcd.peer_ports[1]))
        squatter.listen()
        with self.assertRaises(AssertionError) as caught:
            etcd.start()
        text = str(caught.exception)
        self.assertIn("exited by themselves", text)
        self.assertIn("address already in use", text)
        self.assertIn(str(etcd.peer_ports[1]), text)


if __name__ == "__main__":
    unittest.main()
