"""High availability under Patroni: a snowflake writer against a bigserial writer through a
planned switchover and an unclean failover.

Reproduces a user's report: a two-node Patroni cluster on etcd, one client inserting into a
table with `DEFAULT snowflake_next()` and one into a `bigserial` table, both through libpq's
multi-host form with `target_session_attrs=read-write`; a `patronictl switchover`, then the
loss of the leader's machine (its Patroni process and its postmaster killed with SIGKILL).
The snowflake writer got errors of the extension's own (SQLSTATE 58000, "cannot issue
snowflake IDs for another 2099 ms after promotion") that the bigserial writer did not, and a
longer outage (12.0 s against 9.9 s). A key generator must not make a failover worse than a
sequence does.

One run, one cluster (Patroni 3.0.2, `loop_wait: 1`, `ttl: 10`, both nodes with
`snowflake.worker_id = 1`): writers start, ~3 s of steady writes; switchover to the replica,
~3 s after both writers are back; SIGKILL of the new leader (Patroni, then postmaster), ~3 s
after both writers are back on the survivor. Acceptance:
- the acknowledged snowflake IDs are distinct and strictly increasing in acknowledgement
  order; the acknowledged bigserial IDs are distinct (a sequence may jump);
- the snowflake writer gets no error of the extension's own. Errors are classified by
  SQLSTATE: connection errors (class 08, or no SQLSTATE at all: libpq could not connect or
  found no read-write server), 57P01/57P02/57P03 (shutdown, crash, cannot connect now),
  25006 (a standby), 40001/40P01 are HA errors, which both writers can get; any other
  SQLSTATE (58000, 55000, XX000, ...) or a message that mentions "snowflake" is the
  extension's own;
- for each phase, the snowflake writer's longest outage is at most 1.10 times the bigserial
  writer's + 0.3 s.

An outage is the longest time between two consecutive acknowledged inserts of one writer
within a phase's window: from the last acknowledgement before the action (the patronictl
call, the first SIGKILL) to the end of the phase (~3 s after both writers are back). The
figures and the errors by SQLSTATE of each writer are printed for the CI log.

Ports are TCP on 127.0.0.1 below Linux's ephemeral range (32768-60999), so that no client
socket of a parallel suite can take one: 26000 + 100 * (major - 15) and up
(SNOWFLAKE_HA_PORT_BASE overrides). The suite runs on one major only
(SNOWFLAKE_HA_MAJOR, 17 by default) to fit the test command's time budget.
"""

import collections
import os
import sys
import threading
import time
import unittest

import psycopg

from harness import HANG_GUARD, PG_MAJOR, report_figure, scheduling_delay, wait_live, wait_until
from patroni_cluster import PatroniCluster

HA_MAJOR = os.environ.get("SNOWFLAKE_HA_MAJOR", "17")
PORT_BASE = int(os.environ.get("SNOWFLAKE_HA_PORT_BASE", 26000 + 100 * (int(PG_MAJOR) - 15)))

STEADY_S = 3.0  # steady writing before the first action and after each recovery
RECOVERY_TIMEOUT_S = HANG_GUARD  # a hang guard: the outage itself is compared with a control
PACE_S = 0.005  # between two inserts of a writer
RETRY_S = 0.05  # between a failure and the next attempt

HA_SQLSTATES = {"57P01", "57P02", "57P03", "25006", "40001", "40P01"}
# snowflake's outage may exceed bigserial's (the control, measured in the same run) by this
# factor and slack, plus OUTAGE_LAG_STEPS times the scheduling delay measured meanwhile:
# each writer's outage has two ends, each a wake-up that may be late (docs/testing.md).
OUTAGE_FACTOR, OUTAGE_SLACK_S, OUTAGE_LAG_STEPS = 1.10, 0.3, 4


def error_code(e):
    """An error's SQLSTATE, or 'conn' when there is none (libpq could not connect, or found
    no read-write server among the hosts)."""
    return getattr(e, "sqlstate", None) or "conn"


def is_own(code, message):
    """Whether an error is the extension's own rather than one that HA causes to any client."""
    if "snowflake" in message.lower():
        return True
    return not (code == "conn" or code.startswith("08") or code in HA_SQLSTATES)


class Writer(threading.Thread):
    """One client inserting in a loop through the multi-host connection string; records the
    monotonic time and the ID of each acknowledged insert, and the time, code and message of
    each error (then reconnects after RETRY_S)."""

    def __init__(self, label, conninfo, table):
        super().__init__(daemon=True, name=f"writer-{label}")
        self.label = label
        self.conninfo = conninfo
        self.query = f"INSERT INTO {table} DEFAULT VALUES RETURNING id"
        self.acks = []  # (time, id)
        self.errors = []  # (time, code, message)
        self.stopping = threading.Event()

    def run(self):
        conn = None
        while not self.stopping.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.conninfo, autocommit=True)
                value = conn.execute(self.query).fetchone()[0]
                self.acks.append((time.monotonic(), value))
                self.stopping.wait(PACE_S)
            except psycopg.Error as e:
                message = (str(e).strip().splitlines() or [type(e).__name__])[0]
                self.errors.append((time.monotonic(), error_code(e), message))
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001 - the connection is gone either way
                        pass
                    conn = None
                self.stopping.wait(RETRY_S)
        if conn is not None:
            conn.close()

    def last_ack(self):
        return self.acks[-1][0] if self.acks else float("-inf")

    def finish(self):
        self.stopping.set()
        self.join(30)

    def longest_outage(self, start, end):
        """(gap, from, to): the longest time between consecutive acknowledgements in the window
        that opens with the last acknowledgement before `start` and closes at `end`."""
        times = [t for t, _ in self.acks if t <= end]
        before = [t for t in times if t <= start]
        points = [before[-1] if before else start] + [t for t in times if t > start] + [end]
        return max(((b - a, a, b) for a, b in zip(points, points[1:])), default=(0.0, start, end))

    def error_counts(self):
        return collections.Counter(code for _, code, _ in self.errors)

    def own_errors(self):
        return [e for e in self.errors if is_own(e[1], e[2])]


def report(*lines):
    print("\n".join(lines), file=sys.stderr, flush=True)


@unittest.skipUnless(PG_MAJOR == HA_MAJOR,
                     f"the Patroni suite runs on PostgreSQL {HA_MAJOR} only (SNOWFLAKE_HA_MAJOR), "
                     f"this run is {PG_MAJOR}")
class PatroniFailover(unittest.TestCase):

    def setUp(self):
        self.ha = PatroniCluster(f"ha{PG_MAJOR}", PORT_BASE, {
            "shared_preload_libraries": "snowflake",
            "snowflake.worker_id": 1,
        })
        self.addCleanup(self.ha.destroy)
        started = time.monotonic()
        try:
            self.ha.start()
            leader = self.ha.leader()
            leader.sql("CREATE EXTENSION snowflake")
            leader.sql("CREATE TABLE sf (id bigint PRIMARY KEY DEFAULT snowflake_next(), "
                       "at timestamptz DEFAULT clock_timestamp())")
            leader.sql("CREATE TABLE bs (id bigserial PRIMARY KEY, "
                       "at timestamptz DEFAULT clock_timestamp())")
            self.ha.wait_streaming()
        except BaseException:
            report(self.ha.diagnostics())
            raise
        report(f"\nPatroni cluster up in {time.monotonic() - started:.1f} s "
               f"(ports {self.ha.port_base}+, {self.ha.dir})")

    def wait_recovered(self, since, old_leader, what):
        """Waits until a node other than `old_leader` is the running primary and both writers
        have had an insert acknowledged after `since`: a time when the old leader could no
        longer acknowledge anything (the switchover done, the processes killed)."""
        def recovered():
            for w in self.writers:
                if not w.is_alive():
                    raise AssertionError(f"{w.label} writer died")
            leader = self.ha.leader()
            return (leader is not None and leader is not old_leader
                    and all(w.last_ack() > since for w in self.writers))

        wait_until(recovered, timeout=RECOVERY_TIMEOUT_S, what=f"recovery from the {what}")
        return self.ha.leader()

    def steady(self, since):
        """Lets both writers run STEADY_S (scenario), and requires that they write meanwhile
        (liveness: within STEADY_S plus the margin scaled by the measured scheduling delay)."""
        time.sleep(STEADY_S)
        for w in self.writers:
            wait_live(lambda: w.last_ack() > since, STEADY_S, since,
                      what=f"{w.label}: an insert in the steady period")

    def test_switchover_then_failover_like_a_sequence(self):
        conninfo = self.ha.conninfo()
        self.sf = Writer("snowflake", conninfo, "sf")
        self.bs = Writer("bigserial", conninfo, "bs")
        self.writers = [self.sf, self.bs]
        for w in self.writers:
            w.start()
            self.addCleanup(w.finish)
        phases = {}
        try:
            began = time.monotonic()
            wait_until(lambda: all(w.acks for w in self.writers), what="first inserts")
            self.steady(began)

            # A planned switchover to the replica.
            first = self.ha.leader()
            (candidate,) = self.ha.others(first)
            start = time.monotonic()
            self.ha.switchover(first, candidate)  # returns once the candidate is the leader
            second = self.wait_recovered(time.monotonic(), first, "switchover")
            self.assertIs(second, candidate)
            # It resumed past every lease the old leader could have written, ahead of its
            # clock, and issued from there at once (the outages below show it).
            wait_until(lambda: "snowflake: promoted; IDs resume at" in self.ha.server_log(second),
                       what="the promotion's LOG line")
            back = time.monotonic()
            self.steady(back)
            phases["switchover"] = (start, time.monotonic(), back - start)

            # The loss of the new leader's machine: an unclean failover to the old leader.
            self.ha.wait_streaming()
            start = time.monotonic()
            self.ha.lose(second)
            third = self.wait_recovered(time.monotonic(), second, "failover")
            wait_until(lambda: "snowflake: promoted; IDs resume at" in self.ha.server_log(third),
                       what="the promotion's LOG line")
            back = time.monotonic()
            self.steady(back)
            phases["failover"] = (start, time.monotonic(), back - start)
        except BaseException:
            report(self.ha.diagnostics())
            raise
        finally:
            for w in self.writers:
                w.finish()
        self.assertIs(third, first)
        self.check(phases)

    def check(self, phases):
        problems = []

        # IDs: distinct; snowflake strictly increasing in acknowledgement order.
        sf_ids = [v for _, v in self.sf.acks]
        bs_ids = [v for _, v in self.bs.acks]
        for label, ids in (("snowflake", sf_ids), ("bigserial", bs_ids)):
            dup = len(ids) - len(set(ids))
            if dup:
                problems.append(f"{label}: {dup} acknowledged IDs issued twice")
        backwards = [(a, b) for a, b in zip(sf_ids, sf_ids[1:]) if b <= a]
        if backwards:
            problems.append(f"snowflake: {len(backwards)} IDs not above the one acknowledged "
                            f"before (first: {backwards[0][1]} after {backwards[0][0]})")

        # Errors by SQLSTATE.
        counts = {w.label: w.error_counts() for w in self.writers}
        messages = {}
        for w in self.writers:
            for _, code, message in w.errors:
                messages.setdefault(code, message)
        lines = [f"{'SQLSTATE':<9} {'class':<5} {'snowflake':>9} {'bigserial':>9}  first message"]
        for code in sorted(set(counts["snowflake"]) | set(counts["bigserial"])):
            kind = "own" if is_own(code, messages[code]) else "HA"
            lines.append(f"{code:<9} {kind:<5} {counts['snowflake'][code]:>9} "
                         f"{counts['bigserial'][code]:>9}  {messages[code][:90]}")
        lines.append(f"{'acked':<15} {len(sf_ids):>9} {len(bs_ids):>9}")
        own = self.sf.own_errors()
        if own:
            problems.append(f"snowflake writer: {len(own)} errors of the extension's own "
                            f"(first: {own[0][1]} {own[0][2]})")

        # Outages per phase.
        outage_lines = []
        for phase, (start, end, recovered_after) in phases.items():
            sf_gap, sf_from, sf_to = self.sf.longest_outage(start, end)
            bs_gap, bs_from, bs_to = self.bs.longest_outage(start, end)
            lag = scheduling_delay(start, end)
            limit = OUTAGE_FACTOR * bs_gap + OUTAGE_SLACK_S + OUTAGE_LAG_STEPS * lag
            verdict = "ok" if sf_gap <= limit else "TOO LONG"
            outage_lines.append(
                f"{phase:<10}: snowflake {sf_gap:5.2f} s ({sf_from - start:+.2f}..{sf_to - start:+.2f}), "
                f"bigserial {bs_gap:5.2f} s ({bs_from - start:+.2f}..{bs_to - start:+.2f}); "
                f"limit {limit:.2f} s: {verdict}; recovery observed after {recovered_after:.2f} s")
            report_figure(f"{phase} outage", outage_lines[-1])
            if sf_gap > limit:
                problems.append(f"{phase}: snowflake outage {sf_gap:.2f} s > "
                                f"{OUTAGE_FACTOR} x {bs_gap:.2f} s + {OUTAGE_SLACK_S} s + "
                                f"{OUTAGE_LAG_STEPS} x {lag:.3f} s scheduling delay")

        report("errors by SQLSTATE (whole run):", *lines,
               "longest outage per phase (times from the action):", *outage_lines)
        self.assertFalse(problems, "\n" + "\n".join(problems))


if __name__ == "__main__":
    unittest.main()
