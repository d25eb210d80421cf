"""TCP ports for the test servers (etcd, Redis, coordinators, hostile listeners).

A port handed out here stays unused from the moment it is chosen until its server binds it,
however many suites run at once (the test command runs one per major, each building its
fixtures in threads):

- Ports come from below Linux's ephemeral range (net.ipv4.ip_local_port_range), so no
  client socket (etcdctl, redis-cli, a node's registry connection) and no bind to port 0
  can take one. A port chosen by binding port 0 and closing it was free only at that
  instant: a client connection could take it as its local port before the server bound it,
  and the server (an etcd member) then exited, its cluster never healthy (issue 36, a CI
  run at stop 43).
- Each process claims blocks of the range with an exclusive flock on a file per block in
  LOCK_DIR, held until the process exits (even by SIGKILL: the kernel drops the lock). Two
  processes never share a block.
- A process hands each port of its blocks out once, claiming another block when they are
  used up, and only a port nothing is bound to (not even a TIME_WAIT leftover). Fixtures
  name their directories after their first port, so a port comes again only when the whole
  range is used up, and then only after every other port of the process had its turn.

Fixed ports elsewhere stay out of the range: test_ha's Patroni suite uses 26000 to 26399.
"""

import atexit
import errno
import fcntl
import os
import socket
import sys
import threading

LOCK_DIR = os.environ.get("SNOWFLAKE_PORT_LOCK_DIR", "/tmp/snowflake-test-ports")
RANGE_START = 27000  # above test_ha's fixed ports
BLOCK = 250
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range():
    """(low, high) of the ports the kernel gives client sockets and binds to port 0."""
    with open(EPHEMERAL_RANGE_FILE) as f:
        low, high = (int(x) for x in f.read().split())
    return low, high


def bindable(port):
    """Whether nothing at all is bound to 127.0.0.1:port (no listener, no connection, no
    TIME_WAIT leftover): bound without SO_REUSEADDR, so stricter than any server."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise


class PortAllocator:
    def __init__(self, lock_dir=LOCK_DIR, start=RANGE_START, end=None, block=BLOCK):
        if end is None:
            end = ephemeral_range()[0]
        if end - start < block:
            raise RuntimeError(
                f"no room for test ports below the ephemeral range: {start} to {end} "
                f"(net.ipv4.ip_local_port_range starts at {ephemeral_range()[0]}); "
                "raise its low end above 28000")
        self.lock_dir = lock_dir
        self.start, self.end, self.block = start, end, block
        self.mutex = threading.Lock()
        self.blocks = []  # (first port, fd holding its flock)
        self.cursor = 0  # index into the ports of self.blocks, in turn
        self.handed_out = 0

    def _claim_block(self):
        """Claims the first free block; False if every block is taken."""
        os.makedirs(self.lock_dir, exist_ok=True)
        for first in range(self.start, self.end - self.block + 1, self.block):
            fd = os.open(os.path.join(self.lock_dir, f"block-{first}"), os.O_CREAT | os.O_RDWR,
                         0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another process's (or already ours: flock is per open)
                os.close(fd)
                continue
            self.blocks.append((first, fd))
            return True
        return False

    def _ours(self):
        return len(self.blocks) * self.block

    def _port_at(self, index):
        first, _ = self.blocks[index // self.block]
        return first + index % self.block

    def _next_port(self):
        """The next port of our blocks in turn; a new block when they are used up, and only
        when none is left, our first port again."""
        if self.cursor == self._ours() and not self._claim_block():
            if not self.blocks:
                raise RuntimeError(f"every block of test ports {self.start}-{self.end} is "
                                   f"taken by other processes (locks in {self.lock_dir})")
            self.cursor = 0
        port = self._port_at(self.cursor)
        self.cursor += 1
        return port

    def take(self, n):
        """n distinct ports, each bindable now and reserved for this process. A port is
        handed out once per process, unless the whole range is used up (then again, after
        every other port of ours had its turn, and only if nothing is bound to it)."""
        out = []
        with self.mutex:
            misses = 0
            while len(out) < n:
                port = self._next_port()
                if port not in out and bindable(port):
                    out.append(port)
                    self.handed_out += 1
                    misses = 0
                else:
                    misses += 1
                    if misses > self._ours():
                        raise RuntimeError(f"no bindable test port left in {self.blocks} "
                                           f"(range {self.start}-{self.end})")
        return out


_allocator = None
_allocator_mutex = threading.Lock()


def free_ports(n):
    """n distinct loopback ports that nothing uses and nothing else will take before this
    process's server binds them (see the module's docstring)."""
    global _allocator
    with _allocator_mutex:
        if _allocator is None:
            _allocator = PortAllocator()
    return _allocator.take(n)


def free_port():
    return free_ports(1)[0]


@atexit.register
def _report():
    """How many ports this process took (a figure for sizing the range), on stderr."""
    if _allocator is not None and _allocator.blocks:
        first = [b for b, _ in _allocator.blocks]
        sys.stderr.write(f"test ports: {_allocator.handed_out} handed out from "
                         f"{len(first)} block(s) of {_allocator.block} ({first})\n")
