"""The chaos campaign: nodes and the writers that take IDs from them and record them."""

import random
import re
import threading
import time
from array import array
from collections import Counter

import psycopg


class Node:
    def __init__(self, name, cluster, is_clone=False):
        self.name, self.cluster, self.is_clone = name, cluster, is_clone
        self.lock = threading.Lock()  # lifecycle faults (kill, stop, restart) one at a time
        self.up = False
        self.retired = False
        self.incarnation = 0
        self.shifts = {}
        self.clock_lock = threading.Lock()
        self.writers = []

    def offset(self):
        return sum(self.shifts.values())

    def set_shift(self, key, ms):
        with self.clock_lock:
            if ms:
                self.shifts[key] = ms
            else:
                self.shifts.pop(key, None)
            self.cluster.shift_clock_ms(self.offset())


class Writer(threading.Thread):
    """Takes IDs from one node in a loop and records each acknowledged request: sent and ack
    times (time.monotonic_ns of this process), its session, and its IDs, kept as runs of
    consecutive IDs of one millisecond (array('q') starts, array('l') lengths): a batch of 50
    in one millisecond is one run, a block is one run."""

    # next: snowflake_next(); batch: snowflake_next_batch(50); block: snowflake_next_block(8);
    # ahead: K blocks of 4096 in one statement, which runs the node's IDs ahead of its clock
    # (up to its claim's cap), so that marks and floors matter.
    OPS = (("next", 0.40), ("batch", 0.30), ("block", 0.29), ("ahead", 0.01))

    def __init__(self, camp, node_, j, seed):
        super().__init__(daemon=True, name=f"writer-{node_.name}/{j}")
        self.camp, self.node, self.j = camp, node_, j
        self.label = f"{node_.name}/{j}"
        self.rng = random.Random(seed)
        self.r_sent, self.r_ack = array("q"), array("q")
        self.r_sess, self.r_off = array("q"), array("q")
        self.run_start, self.run_len = array("q"), array("l")
        self.id_count = 0
        self.err_t = array("q")
        self.errors = Counter()
        self.messages = Counter()
        self.stop_event = threading.Event()
        self.pid = None
        self.conn = None
        self.first_t = None
        self.last_t = None

    def _error(self, state):
        self.err_t.append(time.monotonic_ns())
        self.errors[state] += 1

    def _connect(self):
        c = self.node.cluster
        conn = psycopg.connect(host=c.dir, port=c.port, user="postgres", dbname="postgres",
                               autocommit=True, connect_timeout=2)
        self.pid = conn.info.backend_pid
        self.sess = self.camp.new_session(self.node, self.label, self.pid)
        self.conn = conn

    def _drop(self):
        conn, self.conn, self.pid = self.conn, None, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def _add(self, ids):
        starts, lens = self.run_start, self.run_len
        for i in ids:
            if lens and i == starts[-1] + lens[-1] and (i >> 12) == (starts[-1] >> 12) \
                    and len(starts) > self.r_off[-1]:
                lens[-1] += 1
            else:
                starts.append(i)
                lens.append(1)
            self.id_count += 1

    def _add_run(self, first, n):
        self.run_start.append(first)
        self.run_len.append(n)
        self.id_count += n

    def request(self, op, k=0):
        """One request on the open connection; records it if acknowledged. Returns whether
        it was (False: an error, counted; the connection dropped if it broke)."""
        sent = time.monotonic_ns()
        try:
            if op == "next":
                got = [self.conn.execute("SELECT snowflake_next()").fetchone()[0]]
            elif op == "batch":
                got = self.conn.execute("SELECT snowflake_next_batch(50)").fetchone()[0]
            elif op == "block":
                got = self.conn.execute("SELECT snowflake_next_block(8)").fetchone()[0]
            else:
                got = [r[0] for r in self.conn.execute(
                    "SELECT snowflake_next_block(4096) FROM generate_series(1, %s)",
                    (k,)).fetchall()]
            ack = time.monotonic_ns()
        except psycopg.Error as e:
            state = e.sqlstate or "connection"
            self._error(state)
            if e.sqlstate:
                text = re.sub(r"\b[a-z+]+://\S+", "URI", e.diag.message_primary or "")
                text = re.sub(r"\d+", "N", text)[:110]
                self.messages[f"{state} {text}"] += 1
            if self.conn.closed or self.conn.broken or e.sqlstate is None:
                self._drop()
            return False
        except Exception:  # noqa: BLE001
            self._error("client")
            self._drop()
            return False
        self.record(sent, ack, op, got)
        return True

    def record(self, sent, ack, op, got):
        """Records an acknowledged request of this writer's session: what the checker reads
        (test_chaos_checker feeds it histories through here)."""
        self.r_off.append(len(self.run_start))
        if op == "block":
            self._add_run(got, 8)
        elif op == "ahead":
            for first in got:
                self._add_run(first, 4096)
        else:
            self._add(got)
        # The request is complete only now (the checker reads these arrays at the end).
        self.r_sent.append(sent)
        self.r_ack.append(ack)
        self.r_sess.append(self.sess)
        self.last_t = ack

    def run(self):
        self.first_t = time.monotonic_ns()
        ops = [o for o, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        while not self.stop_event.is_set():
            if self.conn is None:
                try:
                    self._connect()
                except Exception:  # noqa: BLE001  (down, starting, frozen)
                    self._error("connect")
                    self.stop_event.wait(0.1)
                    continue
            op = self.rng.choices(ops, weights)[0]
            k = self.rng.randint(20, 300)
            if self.request(op, k):
                self.stop_event.wait(self.rng.uniform(0.002, 0.008))
            else:
                self.stop_event.wait(0.02 if self.conn is not None else 0.05)
        self.last_t = time.monotonic_ns()
        self._drop()

    def requests(self):
        """(sent, ack, session, first run, end run) of every complete request."""
        n = len(self.r_ack)
        offs = self.r_off
        for r in range(n):
            end = offs[r + 1] if r + 1 < len(offs) else len(self.run_start)
            yield self.r_sent[r], self.r_ack[r], self.r_sess[r], offs[r], end
