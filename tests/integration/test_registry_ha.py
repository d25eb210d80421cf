"""snowflake.worker_id = 'auto' against registries without a single point of failure, on real
servers (registries.py): a three-member etcd cluster, Redis behind three Sentinels, and a
PostgreSQL coordinator with a streaming standby reached through libpq's multi-host URI; then
TLS (the right CA, an unrelated CA) and snowflake.registry_password_file for each kind.

Every fault scenario runs two nodes of one datacenter with a writer thread each, which keeps
every ID it was given and every error (time, SQLSTATE, text). Every scenario asserts that no
ID repeats across all nodes; the etcd faults a majority survives must not cost one error; the
others (a Sentinel failover, a coordinator failover, an etcd cluster restarted empty) must end
with the nodes issuing again by themselves within a bound derived from the claim timing, and
the registry must settle (a node that starts after the fault waits before it gets a free id).

A registry kind the installed extension does not know is skipped: a probe server is started
with such a URI and its claim error read (see `supported`).

Timing (core/src/claim.rs): a holder renews every ttl/5 (also each request's time limit),
retries a failed renewal ttl/10 later, and stops issuing ttl/2 after the start of its last
successful renewal. A registry that lost its data grants no free id for one ttl.

The registry clients do not depend on the PostgreSQL major, and these servers mostly wait, so
the suite runs on one major per test command (SNOWFLAKE_REGISTRY_HA_MAJOR, 16 by default: the
chaos campaign takes 15 and the Patroni suite 17, and the four majors' suites run at once).
"""

import grp
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

import psycopg

from harness import (BASE, HANG_GUARD, LAG_STEPS, PG_MAJOR, Cluster, lag_fits,
                     liveness_bound, report_figure, wait_live, wait_until)
from fixtures.ids import decode, duplicates
from fixtures.processes import registry_worker_pid
from fixtures.registries import (CoordinatorPair, EtcdCluster, PasswordRedis, SentinelSet, free_ports,
                                 make_test_ca, write_password_file)
from fixtures.waits import claim_error, claim_state, log_tail, wait_claimed

DC = 1

# etcd: a leader's loss costs an election, which the holders must ride out inside their
# fence. After a renewal that started at s, the next attempt comes at about s + ttl/5 and,
# failing, again every ttl/10; the fence ends at s + ttl/2. If the leader dies just before an
# attempt, the election must end within about ttl/5 for a later attempt to succeed in time.
# Members run with --election-timeout 500 ms (a new leader 0.5-1 s after the last heartbeat;
# the default 1 s would mean up to 2 s), so ttl = 10 s leaves 2 s for it: twice the worst
# election. A frozen member holds a request until its time limit (ttl/5); the client then
# starts the step over on the next member at once (issue 36: a failed step and its retry
# ttl/10 later used up the whole fence), which leaves ttl/10 for the election and delays.
ETCD_TTL = 10.0
ETCD_ELECTION_MS = 500
# Sentinel and the coordinator: a failover costs errors anyway (a Sentinel failover takes
# down-after 1 s plus an election, about 2-3 s, longer than any fence here); what matters is
# that the nodes come back by themselves, so a short ttl keeps the test quick.
SENTINEL_TTL = 4.0
COORD_TTL = 4.0


def log(msg):
    print(f"    [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# nodes

def node_settings(uri, ttl, **extra):
    settings = {
        "shared_preload_libraries": "'snowflake'",
        "snowflake.worker_id": "auto",
        "snowflake.datacenter_id": str(DC),
        "snowflake.registry": f"'{uri}'",
        "snowflake.claim_ttl": f"'{int(ttl * 1000)}ms'",
        "snowflake.clock_behind_action": "wait",
        "wal_level": "replica",
    }
    for k, v in extra.items():
        settings[k.replace("__", ".")] = f"'{v}'"
    return settings


_new_cluster_lock = threading.Lock()


def new_cluster(owner, name, settings):
    """A Cluster (harness numbers them: one at a time), destroyed by owner's cleanup."""
    with _new_cluster_lock:
        c = Cluster(f"{name}{free_ports(1)[0]}", settings)
    owner.addCleanup(c.destroy)
    return c


def start_nodes(owner, specs):
    """Creates and starts one node per (name, settings) at once (threads); `owner` (a test
    or a Bundle) destroys them. Returns the clusters in order."""
    nodes = [new_cluster(owner, name, settings) for name, settings in specs]
    errors = []

    def up(c):
        try:
            c.init()
            c.start()
            c.sql("CREATE EXTENSION snowflake")
        except Exception as e:  # noqa: BLE001
            errors.append((c.name, e))
    threads = [threading.Thread(target=up, args=(c,)) for c in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise AssertionError(f"nodes did not start: {errors}")
    return nodes


def init_node(owner, name, settings):
    """A node initialized but not started (to start it right after a fault)."""
    c = new_cluster(owner, name, settings)
    c.init()
    return c


def up(c):
    c.start()
    c.sql("CREATE EXTENSION snowflake")


class StatusWatcher(threading.Thread):
    """Samples a node's claim_status every 20 ms from its start (a newcomer's "settling"
    lasts one ttl at most: it must be seen while the test waits for other things)."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.seen = set()
        self.held_at = None
        self.worker_id = None
        self.stop_event = threading.Event()
        self.start()

    def run(self):
        conn = None
        while not self.stop_event.is_set():
            try:
                if conn is None:
                    conn = self.cluster.connect(retries=1)
                status, worker = conn.execute(
                    "SELECT claim_status, worker_id FROM snowflake_stats()").fetchone()
                self.seen.add(status)
                if status == "held" and self.held_at is None:
                    self.held_at, self.worker_id = time.monotonic(), worker
            except Exception:  # noqa: BLE001
                conn = None
            time.sleep(0.02)
        if conn is not None:
            conn.close()

    def wait_held(self, settings_s, since):
        """Liveness: the node claims within liveness_bound(settings_s) of `since`."""
        wait_live(lambda: self.held_at is not None, settings_s, since,
                  what=f"{self.cluster.name} to claim (statuses {sorted(self.seen)})")
        self.stop_event.set()
        return self.worker_id


def wait_claim_error(c, accept, timeout=HANG_GUARD):
    """Waits until snowflake_next() fails with an error whose text satisfies `accept`;
    returns it (fails with the last error seen). A wait: its timeout guards against a hang."""
    last = [None, None]

    def matching():
        e = claim_error(c)
        if e is not None:
            last[0] = e
            if accept(error_text(e)):
                last[1] = e
                return True
        return False
    try:
        wait_until(matching, timeout=timeout, what=f"{c.name}: a matching claim error")
    except AssertionError:
        raise AssertionError(f"{c.name}: no matching claim error in {timeout} s; last: "
                             f"{last[0] and error_text(last[0])}; status {claim_state(c)}\n"
                             f"{log_tail(c)}") from None
    return last[1]


def error_text(e):
    return " | ".join(x or "" for x in (e.diag.message_primary, e.diag.message_detail,
                                        e.diag.message_hint))


def etcd_counter(etcd, i, name):
    """A counter of member i's Prometheus metrics (its client port), 0 if absent."""
    url = f"{etcd.scheme}://127.0.0.1:{etcd.client_ports[i]}/metrics"
    context = ssl.create_default_context(cafile=etcd.tls.ca) if etcd.tls else None
    with urllib.request.urlopen(url, timeout=5, context=context) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


class ElectionWatch(threading.Thread):
    """Polls the members other than a stopped leader until one of them reports a leader
    among themselves: how long after `since` (monotonic s) the cluster had a new leader,
    or None if it had none before `stop()`."""

    def __init__(self, etcd, others, since):
        super().__init__(daemon=True)
        self.etcd, self.others, self.since = etcd, others, since
        self.ids = {etcd.member_id(i) for i in others}
        self.elected_after = None
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set() and self.elected_after is None:
            status = self.etcd.status(self.others, timeout=2)
            if any(st.get("leader") in self.ids for st in status.values()):
                self.elected_after = time.monotonic() - self.since
                return
            time.sleep(0.05)

    def stop(self):
        self.done.set()
        self.join(10)
        return self.elected_after


def connected_ports(pids):
    """{remote port: count} of the established TCP connections of `pids`."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                         text=True).stdout
    counts = {}
    for line in out.splitlines():
        if any(f"pid={p}," in line for p in pids):
            peer = line.split()[-2] if "users:" in line.split()[-1] else line.split()[-1]
            try:
                port = int(peer.rsplit(":", 1)[1])
            except (IndexError, ValueError):
                continue
            counts[port] = counts.get(port, 0) + 1
    return counts


# --------------------------------------------------------------------------------------
# writers

class Writer(threading.Thread):
    """Takes IDs from one node in a loop (batches of 50, a short pause between), keeping
    every acknowledged ID with the time of its batch, and every error with its time,
    SQLSTATE and text. A lost connection is an error too (sqlstate None), then reconnects."""

    def __init__(self, cluster, batch=50, pause=0.005):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.batch = batch
        self.pause = pause
        self.got = []
        self.ok_times = []
        self.errors = []  # (monotonic time, sqlstate, text)
        self.stop_event = threading.Event()

    def run(self):
        conn = None
        while not self.stop_event.is_set():
            try:
                if conn is None or conn.closed:
                    conn = self.cluster.connect(retries=1)
                values = conn.execute("SELECT snowflake_next_batch(%s)", (self.batch,)).fetchone()[0]
                self.got.extend(values)
                self.ok_times.append(time.monotonic())
                time.sleep(self.pause)
            except psycopg.Error as e:
                self.errors.append((time.monotonic(), e.sqlstate, error_text(e)))
                time.sleep(0.02)
            except Exception as e:  # noqa: BLE001
                self.errors.append((time.monotonic(), None, repr(e)))
                conn = None
                time.sleep(0.05)
        if conn is not None:
            conn.close()

    def running(self, n=500, timeout=HANG_GUARD):
        wait_until(lambda: len(self.got) >= n, timeout=timeout,
                   what=f"{n} IDs from {self.cluster.name}")

    def finish(self):
        self.stop_event.set()
        self.join(timeout=HANG_GUARD)

    def errors_since(self, t):
        return [e for e in self.errors if e[0] >= t]

    def resumed(self, since):
        """Whether the last event after `since` is a success that follows every error."""
        last_error = max([e[0] for e in self.errors], default=0.0)
        return bool(self.ok_times) and self.ok_times[-1] > max(since, last_error)

    def resume_time(self, since):
        """Seconds from `since` to the first success after the last error (0 if none failed
        after `since`)."""
        errs = self.errors_since(since)
        if not errs:
            return 0.0
        last = errs[-1][0]
        after = [t for t in self.ok_times if t > last]
        return (after[0] - since) if after else None

    def max_gap(self, since, until):
        """The longest time without a success between since and until."""
        times = [since] + [t for t in self.ok_times if since < t < until] + [until]
        return max(b - a for a, b in zip(times, times[1:]))

    def summary(self, since=0.0):
        errs = self.errors_since(since)
        states = {}
        for _, state, text in errs:
            states.setdefault(state, text)
        return (f"{self.cluster.name}: {len(self.got)} IDs, {len(errs)} errors"
                + (f" from +{errs[0][0] - since:.2f} s to +{errs[-1][0] - since:.2f} s: "
                   f"{states}" if errs else ""))


# --------------------------------------------------------------------------------------
# which registry kinds and settings the installed extension knows

_probe = {"cluster": None, "cache": {}}
UNSUPPORTED_MARKERS = ("unsupported registry uri", 'invalid value for parameter "snowflake.registry"')


def _probe_cluster():
    if _probe["cluster"] is None:
        c = Cluster(f"probe{free_ports(1)[0]}", node_settings("redis://127.0.0.1:1/0", 2.0))
        c.init()
        _probe["cluster"] = c
    return _probe["cluster"]


def has_setting(name):
    key = ("setting", name)
    if key not in _probe["cache"]:
        c = _probe_cluster()
        if not c.running():
            up(c)
        _probe["cache"][key] = bool(c.one("SELECT count(*) FROM pg_settings WHERE name = %s", (name,)))
    return _probe["cache"][key]


def supported(uri):
    """Whether the installed extension accepts a registry URI of this form: a probe server
    started with it (nothing listens there) must report a claim failure other than an
    unsupported URI."""
    key = ("uri", uri.split("://")[0])
    if key in _probe["cache"]:
        return _probe["cache"][key]
    c = _probe_cluster()
    c.stop()
    c.configure(**{"snowflake.registry": f"'{uri}'"})
    up_ok = c.start(check=False)
    verdict = False
    if up_ok:
        c.sql("CREATE EXTENSION IF NOT EXISTS snowflake")
        decided = [False]

        def tried():
            e = claim_error(c)
            text = error_text(e).lower() if e else ""
            if any(m in text for m in UNSUPPORTED_MARKERS) or "unsupported registry uri" in c.log().lower():
                return True
            if e is not None and "has not claimed a worker id yet" not in text:
                decided[0] = True  # it tried to reach the registry
                return True
            return False
        # A wait on the probe's answer, its timeout a hang guard: a short one made a loaded
        # run skip whole classes as "not supported" without a word.
        if not wait_until(tried, timeout=HANG_GUARD, poll=0.1, fail=False):
            raise AssertionError(f"the probe node neither tried {key[1]}:// "
                                 f"nor refused it in {HANG_GUARD} s\n{c.log()[-2000:]}")
        verdict = decided[0]
    _probe["cache"][key] = verdict
    return verdict


def require(case_cls, uri_example, *settings):
    for name in settings:
        if not has_setting(name):
            raise unittest.SkipTest(f"the installed extension has no {name}")
    if not supported(uri_example):
        raise unittest.SkipTest(f"the installed extension does not support {uri_example.split('://')[0]}:// registries")


_ca = {}
_ca_lock = threading.Lock()


def test_ca():
    """The run's test certificates (made once)."""
    with _ca_lock:
        if "ca" not in _ca:
            _ca["ca"] = make_test_ca(os.path.join(BASE, "test-ca"))
        return _ca["ca"]


test_ca.__test__ = False  # not a test, whatever its name


def tearDownModule():
    if _probe["cluster"] is not None:
        _probe["cluster"].destroy()
    shutil.rmtree(os.path.join(BASE, "test-ca"), ignore_errors=True)
    try:
        os.rmdir(BASE)
    except OSError:
        pass


# --------------------------------------------------------------------------------------

class Bundle:
    """What one test uses (a registry, its nodes), with their cleanups: closed by the test
    when it ends, or by the class when the test never ran."""

    def __init__(self):
        self._cleanups = []
        self._lock = threading.Lock()

    def addCleanup(self, fn, *args):  # noqa: N802  (TestCase's name, for start_nodes)
        with self._lock:
            self._cleanups.append((fn, args))

    def close(self):
        with self._lock:
            cleanups, self._cleanups = self._cleanups, []
        for fn, args in reversed(cleanups):
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001
                log(f"cleanup {fn}: {e!r}")


class Prepared:
    """The fixtures of a class's tests, built at once in background threads when the class
    starts: a new registry grants its first id only one claim_ttl after it began (it
    settles), so the setups overlap their waits instead of adding them up."""

    def __init__(self):
        self.jobs = {}

    def spawn(self, key, build):
        """build(bundle) returns what the test gets; runs now, in a thread."""
        job = {"bundle": Bundle(), "result": None, "error": None, "took": None}
        started = time.monotonic()

        def run():
            try:
                job["result"] = build(job["bundle"])
            except BaseException as e:  # noqa: BLE001
                job["error"] = e
            job["took"] = time.monotonic() - started
        job["thread"] = threading.Thread(target=run, daemon=True)
        job["thread"].start()
        self.jobs[key] = job

    def take(self, case, key, timeout=180):
        """The fixture for `key` (waits for it); the test closes it when it ends."""
        job = self.jobs[key]
        job["thread"].join(timeout)
        case.addCleanup(job["bundle"].close)
        if job["thread"].is_alive():
            raise AssertionError(f"fixture {key} not ready in {timeout} s")
        if job["error"] is not None:
            raise job["error"]
        log(f"fixture {key} was ready {job['took']:.1f} s after the class started")
        return job["result"]

    def close(self):
        for job in self.jobs.values():
            job["thread"].join(60)
            job["bundle"].close()


REGISTRY_HA_MAJOR = os.environ.get("SNOWFLAKE_REGISTRY_HA_MAJOR", "16")


@unittest.skipUnless(PG_MAJOR == REGISTRY_HA_MAJOR,
                     f"the registry HA suite runs on PostgreSQL {REGISTRY_HA_MAJOR} only "
                     "(SNOWFLAKE_REGISTRY_HA_MAJOR)")
class HABase(unittest.TestCase):
    TTL = 4.0

    @classmethod
    def prepare(cls, tls=None, password=None, **builds):
        """Starts building every fixture at once. The `tls` and `password` fixtures are
        built only if the installed extension has the setting they need (the suite also
        runs against older builds, to show what they get wrong); their tests skip if not."""
        if tls and has_setting("snowflake.registry_ca_file"):
            builds["tls"] = tls
        if password and has_setting("snowflake.registry_password_file"):
            builds["password"] = password
        cls.prep = Prepared()
        cls.addClassCleanup(cls.prep.close)
        for key, build in builds.items():
            cls.prep.spawn(key, build)

    def setUp(self):
        self.writers = []
        self.t_start = time.monotonic()

    def tearDown(self):
        for w in self.writers:
            w.finish()
        log(f"{self.id().rsplit('.', 1)[-1]}: {time.monotonic() - self.t_start:.1f} s")

    def take(self, key):
        return self.prep.take(self, key)

    def writing(self, *nodes):
        ws = [Writer(c) for c in nodes]
        for w in ws:
            w.start()
        self.writers += ws
        for w in ws:
            w.running()
        return ws

    def stop_writers(self, *ws):
        for w in ws:
            w.finish()

    def assert_no_duplicates(self, *lists, context=""):
        dup = duplicates(*lists)
        self.assertEqual(dup, [], f"{len(dup)} duplicate IDs {context}; first: "
                                  f"{[(d, decode(d)) for d in dup[:5]]}")

    def wait_resumed(self, writers, since, settings_s, what, outage=0.0):
        """Liveness: every writer issues again after its last error within
        liveness_bound(settings_s) of `since` (the settings' allowance, the margin and the
        scheduling delay measured in the run), and no error can still be on its way: past
        `outage` (how long the registry was away) plus a fence (ttl/2) plus a heartbeat,
        every claim granted before the fault has been renewed or has lapsed. Then one more
        second without an error. Returns each writer's resume time (0: it had no error)."""
        judged_from = since + outage + self.TTL / 2 + self.TTL / 5

        def done():
            return time.monotonic() >= judged_from and all(w.resumed(since) for w in writers)
        try:
            wait_live(done, settings_s, since, what=what)
        except AssertionError as e:
            raise AssertionError(f"{e}: "
                                 + "; ".join(w.summary(since) for w in writers) + "\n"
                                 + "\n".join(log_tail(w.cluster) for w in writers)) from None
        settled = time.monotonic()
        time.sleep(1.0)  # scenario: a second of real time after resuming
        self.assert_quiet_since(writers, settled, f"{what}: failed again after resuming")
        return [round(w.resume_time(since), 2) for w in writers]

    def assert_quiet_since(self, writers, since, what):
        """No writer failed a call since `since`. That rests on each renewal meanwhile
        completing within its fence: asserted when the scheduling delay measured over the
        interval left that room (LAG_STEPS times it below fence - heartbeat), as in
        assert_no_error; otherwise the errors are a figure. Only 55000 is ever allowed."""
        fits, lag = lag_fits(self.TTL / 2 - self.TTL / 5, since)
        errors = {w.cluster.name: [e[1] for e in w.errors_since(since)] for w in writers}
        self.assertEqual({c for es in errors.values() for c in es} - {"55000"}, set(),
                         f"{what}: {errors}")
        if fits:
            for w in writers:
                self.assertFalse(w.errors_since(since), f"{what}: {w.summary(since)}")
        elif any(errors.values()):
            report_figure(what, f"{errors}; scheduling delay {lag:.3f} s (not asserted)")

    def check_password(self, password, good, *refused):
        """The node given the password in its file issues; each refused node (no password,
        a wrong one) claims nothing and its error says why; the password is in no log."""
        self.assertEqual(len(set(good.one("SELECT snowflake_next_batch(1000)"))), 1000)
        for n in refused:
            e = wait_claim_error(n, lambda t: "auth" in t.lower() or "password" in t.lower())
            self.assertNotEqual(claim_state(n)[0], "held")
            log(f"{n.name} refused: {error_text(e)[:200]}")
        for n in (good, *refused):
            self.assertNotIn(password, n.log())

    def check_tls(self, fixture, scheme_word):
        """A node trusting the test CA claimed and issues; a node trusting an unrelated CA
        claims nothing, and its error names the registry and the certificate problem."""
        _, right, wrong = fixture
        got = right.one("SELECT snowflake_next_batch(1000)")
        self.assertEqual(len(set(got)), 1000)
        e = wait_claim_error(wrong, lambda t: any(w in t.lower() for w in ("certificate", "verif")))
        self.assertEqual(e.sqlstate, "55000")
        self.assertIn("registry", e.diag.message_primary)
        self.assertIn(scheme_word, error_text(e))
        self.assertNotEqual(claim_state(wrong)[0], "held")
        log(f"wrong CA: {error_text(e)[:300]}")


def started(bundle, registry):
    """`registry` started, and closed with the bundle."""
    bundle.addCleanup(registry.close)
    registry.start()
    return registry


def two_holders(bundle, uri, ttl, prefix, newcomer):
    """Two nodes holding claims on the registry at `uri`, and a third initialized but not
    started when `newcomer` (else None)."""
    settings = node_settings(uri, ttl)
    a, b = start_nodes(bundle, [(prefix + "a", settings), (prefix + "b", settings)])
    wa, wb = wait_claimed(a), wait_claimed(b)
    assert wa != wb, (wa, wb)
    return a, b, (init_node(bundle, prefix + "c", settings) if newcomer else None)


def two_holders_and_a_waiter(bundle, uri, ttl, prefix):
    """Three nodes on a registry whose datacenter has only two free ids (the caller has
    squatted the rest): returns the two that hold them, then the one left waiting."""
    settings = node_settings(uri, ttl)
    nodes = start_nodes(bundle, [(prefix + x, settings) for x in "abc"])

    def holders():
        return [n for n in nodes if claim_state(n)[0] == "held"]
    wait_until(lambda: len(holders()) == 2, timeout=HANG_GUARD,
               what="two of the three nodes holding the two free ids")
    a, b = holders()
    (c,) = [n for n in nodes if n not in (a, b)]
    return a, b, c


def tls_nodes(bundle, uri, ttl):
    """A node trusting the test CA (claimed) and one trusting an unrelated CA."""
    ca = test_ca()
    right, wrong = start_nodes(bundle, [
        ("tlsok", node_settings(uri, ttl, snowflake__registry_ca_file=ca.ca)),
        ("tlsbad", node_settings(uri, ttl, snowflake__registry_ca_file=ca.wrong_ca)),
    ])
    wait_claimed(right)
    return right, wrong


# --------------------------------------------------------------------------------------
# etcd

def etcd_cluster(bundle, **kw):
    return started(bundle, EtcdCluster(3, election_ms=ETCD_ELECTION_MS, **kw))


def etcd_pair(bundle, newcomer=False):
    """A new etcd cluster and two nodes holding claims (and a third node, initialized)."""
    etcd = etcd_cluster(bundle)
    return (etcd,) + two_holders(bundle, etcd.uri(), ETCD_TTL, "e", newcomer)


# The restore scenario renews fast so that the holder's freeze and the lapse fit in seconds.
ETCD_RESTORE_TTL = 4.0


def settle(ttl):
    """How long a registry that lost its data grants no free id (s): the ttl and the
    allowed skew, for a registry back on a host with another clock (ClaimTiming::settle_ms,
    issue 37)."""
    return ttl + ttl / 5


def etcd_quarantine(ttl):
    """How long an etcd grant (but a renewal) waits before its first ID, from its reply (s):
    the fence's reach, twice the allowed skew, the registry clock jump the settle allows and
    the registry clock's resolution (ClaimTiming::grant_quarantine_ms, issue 37)."""
    return ttl / 2 + 2 * ttl / 5 + 3 * ttl / 10 + 1.0


def etcd_squat(etcd, ids, ttl_s=900):
    """Fake live servers on `ids` of the datacenter (one long etcd lease), so that the nodes
    compete for the rest."""
    lease = etcd.etcdctl("lease", "grant", str(ttl_s)).stdout.split()[1]
    for w in ids:
        etcd.etcdctl("put", f"--lease={lease}", f"/snowflake/claim/{DC}/{w}", f"fake-{w}")


def etcd_trio(bundle):
    """An etcd cluster whose datacenter has two free ids, two nodes holding them and a
    third waiting for one."""
    etcd = etcd_cluster(bundle)
    etcd_squat(etcd, range(2, 32))
    return (etcd,) + two_holders_and_a_waiter(bundle, etcd.uri(), ETCD_RESTORE_TTL, "r")


ETCD_TLS_PREFIX = "/fleet-a/ids"


def etcd_tls(bundle):
    """Over TLS, and with a prefix of its own in the URI."""
    etcd = etcd_cluster(bundle, tls=test_ca(), prefix=ETCD_TLS_PREFIX)
    return (etcd,) + tls_nodes(bundle, etcd.uri(), ETCD_TTL)


ETCD_PASSWORD = "Etcd-Node-Pw-71"


def etcd_auth(bundle):
    etcd = etcd_cluster(bundle)
    etcd.enable_auth("snownode", ETCD_PASSWORD)
    d = os.path.join(etcd.dir, "pw")
    os.makedirs(d, exist_ok=True)
    good = write_password_file(os.path.join(d, "good"), ETCD_PASSWORD)
    bad = write_password_file(os.path.join(d, "bad"), "Not-The-Password-1")
    uri = etcd.uri(user="snownode")
    ok, ko = start_nodes(bundle, [
        ("epw", node_settings(uri, ETCD_TTL, snowflake__registry_password_file=good)),
        ("epwbad", node_settings(uri, ETCD_TTL, snowflake__registry_password_file=bad))])
    wait_claimed(ok)
    return etcd, ok, ko


class EtcdRegistry(HABase):
    TTL = ETCD_TTL

    @classmethod
    def setUpClass(cls):
        require(cls, "etcd://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        cls.prepare(leader=etcd_pair, frozen=etcd_pair,
                    wiped=lambda b: etcd_pair(b, newcomer=True), restored=etcd_trio,
                    cut_off=etcd_cut_off_holder, revived=etcd_one_free_id,
                    tls=etcd_tls, password=etcd_auth)

    def members_in_use(self, etcd, nodes):
        """{member index: connections of the nodes' registry workers to it}."""
        pids = [registry_worker_pid(c) for c in nodes]
        ports = connected_ports([p for p in pids if p])
        return {i: ports.get(p, 0) for i, p in enumerate(etcd.client_ports)}

    def assert_no_error(self, writers, since, until, what, slack_s, detail="", broken_by=None):
        """"No error while one member is lost" (docs/registries.md#etcd) is liveness: it
        rests on each holder completing a renewal within its fence, which leaves `slack_s`
        for the election and the machine's delays. So it is asserted (no error at all, no
        pause longer than a heartbeat plus the delays) when the scheduling delay measured
        over the interval kept within that slack (LAG_STEPS times it below `slack_s`) and
        nothing else broke the condition (`broken_by`: what did, measured by the caller),
        and otherwise only reported as a figure, the run's delay beside it. Always asserted: a
        node that fails a call refuses with 55000, nothing else. Returns whether the run
        kept within the slack (the no-error promise was asserted)."""
        fits, lag = lag_fits(slack_s, since, until)
        scheduled = fits and not broken_by
        errors = [e for w in writers for e in w.errors_since(since) if e[0] <= until]
        gaps = [round(w.max_gap(since, until), 2) for w in writers]
        report_figure(what, f"{len(errors)} errors, longest pauses {gaps} s, "
                      f"{sum(len(w.got) for w in writers)} IDs; scheduling delay {lag:.3f} s "
                      f"({'within' if fits else 'beyond'} the "
                      f"{slack_s:.1f} s slack{'; ' + broken_by if broken_by else ''}: "
                      f"{'asserted' if scheduled else 'not asserted'}){detail}")
        summaries = "; ".join(w.summary(since) for w in writers)
        self.assertEqual({e[1] for e in errors} - {"55000"}, set(), f"{what}: {summaries}")
        if not scheduled:
            return False
        self.assertEqual(errors, [], f"{what}: {summaries}\n"
                         + "\n".join(log_tail(w.cluster) for w in writers))
        for w, gap in zip(writers, gaps):
            self.assertLess(gap, self.TTL / 5 + LAG_STEPS * lag,
                            f"{what}: {w.cluster.name} issued nothing for {gap:.2f} s")
        return True

    def assert_holding(self, no_error_asserted, *nodes):
        """Every node holds a claim: at once when assert_no_error asserted that no call
        failed (no claim was lost); otherwise once it has claimed again, since a holder fenced
        on a loaded machine claims anew and an etcd grant is quarantined first (a wait whose
        timeout only guards against a hang)."""
        def holding():
            return [claim_state(n)[0] for n in nodes] == ["held"] * len(nodes)
        if no_error_asserted:
            self.assertTrue(holding(), [claim_state(n) for n in nodes])
        else:
            wait_until(holding, what=f"{', '.join(n.name for n in nodes)} holding a claim")

    def member_in_use(self, etcd, nodes):
        """The member the nodes' registry workers talk to (most connections), made the
        leader: a fault there costs both a lost or hung connection and an election."""
        in_use = self.members_in_use(etcd, nodes)
        member = max(in_use, key=in_use.get)
        self.assertGreater(in_use[member], 0, f"the nodes use no member: {in_use}")
        etcd.move_leader(member)
        return member, in_use

    def test_leader_killed_costs_no_error(self):
        """SIGKILL of the leader, the member the nodes talk to: two members remain, elect a
        leader and serve; the holders move to them without one failed call."""
        etcd, a, b, _ = self.take("leader")
        wa, wb = self.writing(a, b)
        leader, in_use = self.member_in_use(etcd, [a, b])
        etcd.kill(leader)
        killed_at = time.monotonic()
        etcd.wait_for(lambda: etcd.leader(check=False) not in (None, leader),
                      [i for i in range(etcd.n) if i != leader], "a new etcd leader")
        election = time.monotonic() - killed_at
        # Real time passes (scenario): a holder that could not renew stops ttl/2 after its
        # last renewal began; watch past that, a heartbeat and the election.
        time.sleep(max(0.0, killed_at + self.TTL / 2 + self.TTL / 5 + election - time.monotonic()))
        etcd.restart(leader)
        time.sleep(1.0)
        until = time.monotonic()
        self.stop_writers(wa, wb)
        # The refused connection moves a renewal to the next member at once: the renewal
        # due a heartbeat after the last one has the rest of the fence for the election.
        asserted = self.assert_no_error([wa, wb], killed_at, until, "etcd leader SIGKILL",
                                        slack_s=self.TTL / 2 - self.TTL / 5 - election,
                                        detail=f"; new leader after {election:.2f} s (node "
                                               f"connections per member {in_use})")
        self.assert_holding(asserted, a, b)
        self.assert_no_duplicates(wa.got, wb.got)

    def test_member_frozen_past_the_ttl(self):
        """SIGSTOP, for longer than claim_ttl, of the leader, the member the nodes talk to
        (their requests hang; nothing is refused), then SIGCONT.

        No error at all, as for a killed leader, under two conditions. Each holder
        completes a renewal within its fence, ttl/2 after the previous one began: the next
        one starts a heartbeat (ttl/5) later, the frozen member holds its first request for
        a time limit (ttl/5), and the client moves to the next member within the same
        step, which leaves ttl/10 for the election (0.5-1 s here) and the machine's delays.
        And etcd's own bug does not strike: woken, an etcd 3.4 ex-leader may revoke every
        lease it believes expired, the holders' among them (etcd issues 12528 and 15247;
        it did in half the runs on a loaded machine, issue 36), and a holder whose claim
        vanished has lost it (binding it again was tried, and an adversarial review got
        duplicates from it with a restore). Either broken, the errors are a figure; always
        asserted: no duplicate, only 55000, and both nodes issuing again within the bound
        of a lost claim (the outage, a settle, a new grant's quarantine, a heartbeat).

        In the worst phase (the renewal sent just before the freeze) the new leader must be
        there when the client moves on, with a reconnection, a clock read and a transaction
        still to come: an election that took over half of the ttl/10 (etcd randomizes its
        timeout between 0.5 and 1 s here) leaves too little, and is named as the cause."""
        etcd, a, b, _ = self.take("frozen")
        wa, wb = self.writing(a, b)
        victim, in_use = self.member_in_use(etcd, [a, b])
        others = [i for i in range(etcd.n) if i != victim]
        watch = ElectionWatch(etcd, others, 0.0)
        expired = "etcd_debugging_server_lease_expired_total"
        expired_before = {i: etcd_counter(etcd, i, expired) for i in range(etcd.n)}
        etcd.stop(victim)
        stopped_at = time.monotonic()
        watch.since = stopped_at
        watch.start()
        try:
            time.sleep(self.TTL + 1)
            moved = self.members_in_use(etcd, [a, b])
        finally:
            etcd.cont(victim)
        cont_at = time.monotonic()
        elected_after = watch.stop()
        etcd.wait_healthy(timeout=HANG_GUARD)
        outage = cont_at - stopped_at
        resumed = self.wait_resumed([wa, wb], stopped_at,
                                    outage + settle(self.TTL) + etcd_quarantine(self.TTL) + self.TTL / 5,
                                    "etcd member SIGSTOP", outage=outage)
        # Leases revoked by any member (the woken ex-leader, or another: a stress run saw
        # errors with none counted on the woken one, issue 37).
        revoked = sum(etcd_counter(etcd, i, expired) - expired_before[i] for i in range(etcd.n))
        until = time.monotonic()
        self.stop_writers(wa, wb)
        # The frozen member holds the first request of a renewal for its time limit (ttl/5)
        # and the client moves on within the same step: ttl/10 of the fence is left, for the
        # election and the machine's delays. An election that took (nearly) all of it, as
        # etcd's randomized timeout allows, leaves nothing: then the errors are a figure.
        slack = self.TTL / 10
        broken = []
        if revoked:
            broken.append(f"the members revoked {revoked:.0f} lease(s) (an etcd bug)")
        if elected_after is None or elected_after > slack / 2:
            broken.append(f"the election took {'more than the outage' if elected_after is None else format(elected_after, '.2f') + ' s'}, over half the {slack:.1f} s slack")
        asserted = self.assert_no_error(
            [wa, wb], stopped_at, until, "etcd member SIGSTOP", slack_s=slack,
            broken_by="; ".join(broken) or None,
            detail=f"; leader m{victim} stopped {outage:.1f} s, new leader after "
                   f"{'-' if elected_after is None else format(elected_after, '.2f')} s (node "
                   f"connections per member {in_use} before, {moved} meanwhile); writers "
                   f"resumed after {resumed} s")
        self.assert_holding(asserted, a, b)
        self.assert_no_duplicates(wa.got, wb.got)

    def test_cluster_restarted_empty_settles_and_resumes(self):
        """Every member killed and its data deleted, a new empty cluster on the same ports.
        The holders go on (or resume) by themselves; a node that starts after the loss waits
        for the registry to settle and gets an id of its own; no ID repeats."""
        etcd, a, b, c = self.take("wiped")
        before = (claim_state(a)[1], claim_state(b)[1])
        wa, wb = self.writing(a, b)
        wiped_at = time.monotonic()
        etcd.wipe_and_restart_all()
        back = time.monotonic() - wiped_at
        up(c)
        watch = StatusWatcher(c)
        # Bound: the cluster back; a settle (ttl + ttl/5) from when the registry noticed (the
        # first request after it is back: within a heartbeat); a holder whose claim the
        # wipe lost then claims it again from its first request after the settle (within a
        # heartbeat) and waits out the grant's quarantine; a heartbeat; then the margin and
        # the measured scheduling delay (liveness_bound).
        settings = back + settle(self.TTL) + 3 * self.TTL / 5 + etcd_quarantine(self.TTL)
        resumed = self.wait_resumed([wa, wb], wiped_at, settings, "etcd restarted empty",
                                    outage=back)
        wc = watch.wait_held(settings, wiped_at)
        bound = liveness_bound(settings, wiped_at)
        seen = watch.seen
        claimed_after = watch.held_at - wiped_at
        wn = self.writing(c)[0]
        time.sleep(1.0)
        self.stop_writers(wa, wb, wn)
        after = (claim_state(a)[1], claim_state(b)[1])
        report_figure("etcd restarted empty", f"back after {back:.2f} s; holders resumed after {resumed} s (bound "
            f"{bound:.1f} s), worker ids {before} -> {after}; newcomer got {wc} after "
            f"{claimed_after:.1f} s, statuses {sorted(seen)}; "
            + "; ".join(w.summary(wiped_at) for w in (wa, wb)))
        self.assertIn("settling", seen, "a node starting after the loss must wait for the registry")
        self.assertNotIn(wc, after)
        self.assert_no_duplicates(wa.got, wb.got, wn.got,
                                  context=f"(holders {before} -> {after}, newcomer {wc})")

    def test_restored_from_a_snapshot_takes_no_lapsed_claim_back(self):
        """etcd restored from a snapshot that still has node B's claim, after B's claim had
        lapsed (B's registry worker frozen past claim_ttl) and node C had taken the id. The
        restore brings B's lease back alive; C's registry worker is frozen right after a
        renewal, so C's sessions go on issuing under that id within their fence. B must not
        take the id back by its token: before that rule, an adversarial run of this
        scenario got 7,947 duplicate IDs. C is thawed later; no ID may repeat."""
        etcd, a, b, c = self.take("restored")
        ttl = ETCD_RESTORE_TTL
        writers = self.writing(a, b)
        waiting = Writer(c)  # C has no id yet: it issues once it takes B's
        waiting.start()
        self.writers.append(waiting)
        writers.append(waiting)
        snapshot = etcd.snapshot()
        b_worker = registry_worker_pid(b)
        os.kill(b_worker, signal.SIGSTOP)
        try:
            wait_until(lambda: claim_state(c)[0] == "held", timeout=HANG_GUARD,
                       what="C takes the id B's frozen worker let lapse")
        finally:
            os.kill(b_worker, signal.SIGCONT)
        wait_until(lambda: claim_state(b)[0] != "held", timeout=HANG_GUARD,
                   what="B, thawed, finds its claim gone")
        expires = c.one("SELECT claim_expires_at FROM snowflake_stats()")
        wait_until(lambda: c.one("SELECT claim_expires_at FROM snowflake_stats()") != expires,
                   timeout=HANG_GUARD, what="a renewal of C")
        c_worker = registry_worker_pid(c)
        os.kill(c_worker, signal.SIGSTOP)
        try:
            etcd.restore_all(snapshot)
            restored_at = time.monotonic()
            # B's old claim is in the store again, alive: B must not take it while C's
            # sessions still issue under C's fence.
            time.sleep(ttl / 2 + 1.0)
        finally:
            os.kill(c_worker, signal.SIGCONT)
        time.sleep(1.5 * ttl)
        self.stop_writers(*writers)
        log("etcd restored from a snapshot: "
            + "; ".join(w.summary(restored_at) for w in writers)
            + f"; claims now {[claim_state(n) for n in (a, b, c)]}")
        self.assert_no_duplicates(*(w.got for w in writers))

    def test_restore_loses_a_grant_whose_holder_is_cut_off(self):
        """Issue 37, path 2: etcd restored from a snapshot taken before node H was granted
        worker id w, while H is cut off from etcd (its registry worker SIGSTOPped right after
        a renewal: its sessions go on issuing under their fence), and the node clocks at
        opposite ends of the allowed skew (H ahead of etcd's clock by claim_ttl/5 less
        0.1 s, node B behind by as much). B starts after the restore, finds w free and takes
        it. 0.7.0 let B issue after its free-id wait (claim_ttl/2 + claim_ttl/5 from its
        first sight of w free), which has no clock term: B's first IDs were below what H
        had issued (600 duplicates in a run). Since issue 37 every etcd grant but a renewal is used only after its
        quarantine (claim_ttl/2 + 2 claim_ttl/5 + 1 s from its request's send). H is thawed
        once B issues past H's last ID; no ID may repeat."""
        etcd, h, b, w, token = self.take("cut_off")
        ttl = ETCD_CUTOFF_TTL
        wh = self.writing(h)[0]
        wait_renewal(h)
        h_worker = registry_worker_pid(h)
        os.kill(h_worker, signal.SIGSTOP)
        cut_at = time.monotonic()
        try:
            etcd.swap_restored(token)
            restored_at = time.monotonic()
            # The snapshot is from before H's grant: w is free in the restored store.
            self.assertEqual(etcd_claim_holder(etcd, w), None)
            up(b)
            wb = Writer(b)  # B has no id yet: it issues once it takes w
            wb.start()
            self.writers.append(wb)
            wait_until(lambda: wb.got, what="B issuing")
            self.assertEqual(claim_state(b), ("held", w), "B took another id than H's")
            # H's sessions stop at their fence (H's worker is still frozen), then B issues
            # past the last ID H gave: every millisecond both could use is behind.
            wait_until(lambda: wh.errors_since(cut_at), what="H's sessions at their fence")
            h_last = decode(wh.got[-1])[0]
            wait_until(lambda: decode(wb.got[-1])[0] > h_last, what="B past H's last ID")
        finally:
            os.kill(h_worker, signal.SIGCONT)
        # Thawed, H finds its claim gone (0.7.0: its renewal is refused) or claims again.
        wait_until(lambda: claim_state(h)[0] != "held", what="H, thawed, not holding")
        time.sleep(1.0)
        self.stop_writers(wh, wb)
        dup = duplicates(wh.got, wb.got)
        h_after = [t for t in wh.ok_times if t > cut_at]
        report_figure("etcd restored, holder cut off, clocks skewed",
                      f"claim_ttl {ttl:.0f} s, clocks H +{ETCD_CUTOFF_SKEW_MS} ms, B "
                      f"-{ETCD_CUTOFF_SKEW_MS} ms; restore took {restored_at - cut_at:.2f} s "
                      f"after H was cut off; H issued until +{h_after[-1] - cut_at:.2f} s "
                      f"after its cut-off ({len(wh.got)} IDs); B issued from "
                      f"+{wb.ok_times[0] - restored_at:.2f} s after the restore "
                      f"({len(wb.got)} IDs); H status after thaw {claim_state(h)}; "
                      f"{len(dup)} duplicates")
        # The scenario happened: H's sessions issued under its lost grant after the restore.
        self.assertTrue(any(t > restored_at for t in wh.ok_times),
                        f"H issued nothing after the restore ({restored_at - cut_at:.2f} s "
                        f"after its cut-off): the scenario did not happen")
        self.assert_no_duplicates(wh.got, wb.got,
                                  context=f"(H {h.name}, B {b.name}, worker id {w})")

    def test_holder_frozen_past_its_fence_renews_no_revived_claim(self):
        """A holder frozen past its fence must not renew a claim that a restore revived.
        Node H holds the only free id w; right after a renewal its registry worker is
        SIGSTOPped and a snapshot taken (H's claim and lease in it). H's claim lapses, node E
        takes w and issues; E's registry worker is SIGSTOPped right after a renewal (its
        sessions go on issuing under their fence). etcd is restored to the snapshot, which
        gives H's lease its time back, and H's worker thawed: it saw nothing of the lost
        history (its last read and write are in the snapshot). 0.7.0 renewed the claim by
        its token and issued while E's sessions still did (11,700 duplicates in a run); since issue
        37 a holder whose fence expired claims again, and the grant is quarantined. No ID
        may repeat."""
        etcd, h, e, w = self.take("revived")
        wh = self.writing(h)[0]
        we = Writer(e)  # E has no id yet: it issues once it takes w
        we.start()
        self.writers.append(we)
        wait_renewal(h)
        h_worker = registry_worker_pid(h)
        frozen = [h_worker]
        os.kill(h_worker, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            snapshot = etcd.snapshot("holder-frozen.db")
            token = etcd.prepare_restore(snapshot)
            wait_until(lambda: claim_state(e) == ("held", w), what="E takes H's lapsed id")
            wait_until(lambda: we.got, what="E issuing")
            wait_renewal(e)
            e_worker = registry_worker_pid(e)
            frozen.append(e_worker)
            os.kill(e_worker, signal.SIGSTOP)
            e_frozen_at = time.monotonic()
            etcd.swap_restored(token)
            restored_at = time.monotonic()
            # H's claim is in the store again, alive.
            self.assertTrue(etcd_claim_holder(etcd, w), "the restore did not revive H's claim")
            os.kill(h_worker, signal.SIGCONT)
            frozen.remove(h_worker)
            thawed_at = time.monotonic()
            # E's sessions stop at their fence; H issues again (0.7.0: at once, by its
            # token; since issue 37: after a new grant's quarantine).
            wait_until(lambda: we.errors_since(e_frozen_at), what="E's sessions at their fence")
            wait_until(lambda: any(t > thawed_at for t in wh.ok_times),
                       what="H issuing again")
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        wait_until(lambda: claim_state(e)[0] != "held", what="E, thawed, not holding")
        time.sleep(1.0)
        self.stop_writers(wh, we)
        dup = duplicates(wh.got, we.got)
        e_after = [t for t in we.ok_times if t > e_frozen_at]
        h_again = [t for t in wh.ok_times if t > thawed_at]
        report_figure("etcd restored, frozen holder's claim revived",
                      f"claim_ttl {ETCD_TTL:.0f} s; H frozen {thawed_at - frozen_at:.1f} s; "
                      f"restore took {restored_at - e_frozen_at:.2f} s after E was frozen; "
                      f"E issued until +{(e_after[-1] - e_frozen_at) if e_after else 0:.2f} s "
                      f"after its freeze ({len(we.got)} IDs); H issued again from "
                      f"+{h_again[0] - thawed_at:.2f} s after its thaw ({len(wh.got)} IDs); "
                      f"{len(dup)} duplicates")
        self.assertTrue(any(t > restored_at for t in we.ok_times),
                        "E issued nothing after the restore: the scenario did not happen")
        self.assert_no_duplicates(wh.got, we.got,
                                  context=f"(H {h.name}, E {e.name}, worker id {w})")

    def test_tls_right_and_wrong_ca(self):
        if "tls" not in self.prep.jobs:
            self.skipTest("no snowflake.registry_ca_file")
        fixture = self.take("tls")
        self.check_tls(fixture, "etcds://")
        etcd = fixture[0]
        keys = etcd.etcdctl("get", "--prefix", "--keys-only", "/").stdout.split()
        self.assertTrue(keys and all(k.startswith(ETCD_TLS_PREFIX + "/") for k in keys), keys)
        self.assertIn(f"{ETCD_TLS_PREFIX}/claim/{DC}/{claim_state(fixture[1])[1]}", keys)

    def test_password_file_with_auth(self):
        """Authentication on: the user in the URI, its password only in
        snowflake.registry_password_file. A wrong password claims nothing."""
        if "password" not in self.prep.jobs:
            self.skipTest("no snowflake.registry_password_file")
        etcd, ok, ko = self.take("password")
        self.check_password(ETCD_PASSWORD, ok, ko)
        self.assertIn("/snowflake/", etcd.etcdctl("get", "--prefix", "--keys-only", "/snowflake").stdout)


# --------------------------------------------------------------------------------------
# Redis Sentinel

def sentinel_set(bundle, **kw):
    return started(bundle, SentinelSet(**kw))


def sentinel_pair(bundle):
    s = sentinel_set(bundle)
    return (s,) + two_holders(bundle, s.uri(), SENTINEL_TTL, "s", newcomer=True)


def sentinel_tls(bundle):
    s = sentinel_set(bundle, tls=test_ca())
    return (s,) + tls_nodes(bundle, s.uri(), SENTINEL_TTL)


SENTINEL_PASSWORD = "Sentinel-Data-Pw-5"


def sentinel_password(bundle):
    s = sentinel_set(bundle, password=SENTINEL_PASSWORD)
    pw = write_password_file(os.path.join(s.dir, "password"), SENTINEL_PASSWORD)
    a, = start_nodes(bundle, [("spw", node_settings(s.uri(), SENTINEL_TTL,
                                                     snowflake__registry_password_file=pw))])
    wait_claimed(a)
    return s, a


class SentinelRegistry(HABase):
    TTL = SENTINEL_TTL

    @classmethod
    def setUpClass(cls):
        require(cls, "redis+sentinel://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/snowflake")
        cls.prepare(failover=sentinel_pair, tls=sentinel_tls, password=sentinel_password)

    def test_master_killed_sentinels_fail_over_nodes_resume(self):
        """SIGKILL of the master; the Sentinels promote the replica. The nodes issue again by
        themselves within: the failover, plus a settle (ttl + ttl/5) from when the registry
        noticed (the next renewal, within ttl/10 of the failover), plus a heartbeat, plus
        the margin. A node started after the failover waits for the registry to settle."""
        s, a, b, c = self.take("failover")
        wa, wb = self.writing(a, b)
        old = s.kill_master()
        killed_at = time.monotonic()
        new = s.wait_failover(old, timeout=HANG_GUARD)
        failover = time.monotonic() - killed_at
        up(c)
        watch = StatusWatcher(c)
        settings = failover + settle(self.TTL) + 3 * self.TTL / 10
        resumed = self.wait_resumed([wa, wb], killed_at, settings, "Sentinel failover",
                                    outage=failover)
        wc = watch.wait_held(settings, killed_at)
        bound = liveness_bound(settings, killed_at)
        seen = watch.seen
        s.restart_killed()  # the old master returns, empty, as a replica
        wn = self.writing(c)[0]
        rejoined = time.monotonic()
        time.sleep(1.0)
        self.stop_writers(wa, wb, wn)
        report_figure("Sentinel failover", f"master {old} killed; Sentinels promoted {new} after {failover:.2f} s; nodes "
            f"resumed after {resumed} s (bound {bound:.1f} s); newcomer claimed after "
            f"{watch.held_at - killed_at:.1f} s, statuses {sorted(seen)}; "
            + "; ".join(w.summary(killed_at) for w in (wa, wb)))
        self.assert_quiet_since((wa, wb, wn), rejoined, "errors after the old master rejoined")
        self.assertIn("settling", seen, "the registry did not settle after the failover")
        self.assertNotIn(wc, [claim_state(a)[1], claim_state(b)[1]])
        self.assert_no_duplicates(wa.got, wb.got, wn.got)

    def test_tls_right_and_wrong_ca(self):
        if "tls" not in self.prep.jobs:
            self.skipTest("no snowflake.registry_ca_file")
        self.check_tls(self.take("tls"), "rediss+sentinel://")

    def test_password_file_with_requirepass(self):
        """Master and replica require a password (the Sentinels know it); the node has it
        only in snowflake.registry_password_file."""
        if "password" not in self.prep.jobs:
            self.skipTest("no snowflake.registry_password_file")
        s, a = self.take("password")
        self.check_password(SENTINEL_PASSWORD, a)
        w = claim_state(a)[1]
        self.assertEqual(s.cli(s.master_port(), "EXISTS", f"snowflake:claim:{DC}:{w}"), "1")


# --------------------------------------------------------------------------------------
# plain Redis with a password file (a kind every build knows)

REDIS_PASSWORD = "Redis-Node-Pw-42"


def redis_password(bundle):
    r = PasswordRedis(REDIS_PASSWORD)
    bundle.addCleanup(r.close)
    r.start()
    d = os.path.join(r.dir, "pw")
    os.makedirs(d, exist_ok=True)
    good = write_password_file(os.path.join(d, "good"), REDIS_PASSWORD)
    lax = write_password_file(os.path.join(d, "lax"), REDIS_PASSWORD)
    os.chmod(lax, 0o644)
    # As a Kubernetes secret volume mounts it: root's, readable by the server's group.
    rooted = write_password_file(os.path.join(d, "rooted"), REDIS_PASSWORD)
    os.chown(rooted, 0, grp.getgrnam("postgres").gr_gid)
    os.chmod(rooted, 0o640)
    # Not a file: opening a FIFO to read would wait for a writer, forever.
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo, 0o600)
    shutil.chown(fifo, "postgres", "postgres")
    ttl = 4.0
    nodes = start_nodes(bundle, [
        ("rpw", node_settings(r.uri(), ttl, snowflake__registry_password_file=good)),
        ("rnopw", node_settings(r.uri(), ttl)),
        ("rlax", node_settings(r.uri(), ttl, snowflake__registry_password_file=lax)),
        ("rroot", node_settings(r.uri(), ttl, snowflake__registry_password_file=rooted)),
        ("rfifo", node_settings(r.uri(), ttl, snowflake__registry_password_file=fifo))])
    return (r,) + tuple(nodes)


REDIS_RESTORE_TTL = 4.0


def redis_trio(bundle):
    """A Redis (dumps on demand) whose datacenter has two free ids, two nodes holding them
    and a third waiting for one."""
    r = PasswordRedis(None).start()
    bundle.addCleanup(r.close)
    for w in range(2, 32):
        r.cli("SET", f"snowflake:claim:{DC}:{w}", f"fake-{w}", "PX", "3600000")
    return (r,) + two_holders_and_a_waiter(bundle, r.uri(), REDIS_RESTORE_TTL, "q")


class RedisRestored(HABase):
    TTL = REDIS_RESTORE_TTL

    @classmethod
    def setUpClass(cls):
        cls.prepare(trio=redis_trio)

    def test_restored_dump_gives_no_released_claim_back(self):
        """Redis restarted from a dump saved while node B held id W. Meanwhile B's registry
        worker restarted (SIGTERM: it released W, and came back with the same token) and node
        C took W; C's registry worker is frozen right after a renewal, so C's sessions go on
        issuing under W within their fence. The restored dump has B's claim of W again: B
        must not take it back (before the rule that a settling registry grants nothing, not
        even an own claim, this gave 7,372 duplicates to an adversarial run). No ID may
        repeat."""
        r, a, b, c = self.take("trio")
        ttl = REDIS_RESTORE_TTL
        wa, wb = self.writing(a, b)
        waiting = Writer(c)  # C has no id yet: it issues once it takes B's
        waiting.start()
        self.writers.append(waiting)
        for _ in range(10):
            wait_until(lambda: claim_state(b)[0] == "held", timeout=HANG_GUARD, what="B holding")
            w_b = claim_state(b)[1]
            expires = b.one("SELECT claim_expires_at FROM snowflake_stats()")
            wait_until(lambda: b.one("SELECT claim_expires_at FROM snowflake_stats()") != expires,
                       timeout=HANG_GUARD, what="a renewal of B")
            copy = r.save_copy()
            os.kill(registry_worker_pid(b), signal.SIGTERM)
            time.sleep(ttl / 2 + 0.5)
            if claim_state(c) == ("held", w_b):
                break
            # B's worker came back first and took its id again: once more.
        else:
            self.skipTest("C never took B's released id before B's worker took it back")
        expires = c.one("SELECT claim_expires_at FROM snowflake_stats()")
        wait_until(lambda: c.one("SELECT claim_expires_at FROM snowflake_stats()") != expires,
                   timeout=HANG_GUARD, what="a renewal of C")
        c_worker = registry_worker_pid(c)
        os.kill(c_worker, signal.SIGSTOP)
        try:
            r.restart_from(copy)
            restored_at = time.monotonic()
            # The dump's claim of W: B's, from before its release. Its TTL (claim_ttl from
            # B's last renewal) runs on while the steps above wait: on a loaded machine it can
            # be over before the restart, and the restore is then a plain one (a CI run at
            # stop 48 failed here). Reported, not asserted; no ID may repeat either way.
            if not r.cli("GET", f"snowflake:claim:{DC}:{w_b}"):
                report_figure("Redis restored from a dump",
                              "B's claim had expired in the dump before the restart: the "
                              "machine took longer than the claim's TTL for the steps")
            time.sleep(ttl / 2 + 1.0)
        finally:
            os.kill(c_worker, signal.SIGCONT)
        time.sleep(1.5 * ttl)
        self.stop_writers(wa, wb, waiting)
        log("Redis restored from a dump: "
            + "; ".join(w.summary(restored_at) for w in (wa, wb, waiting))
            + f"; claims now {[claim_state(n) for n in (a, b, c)]}")
        self.assert_no_duplicates(wa.got, wb.got, waiting.got)


class RedisPasswordFile(HABase):

    @classmethod
    def setUpClass(cls):
        if not has_setting("snowflake.registry_password_file"):
            raise unittest.SkipTest("the installed extension has no snowflake.registry_password_file")
        cls.prepare(password=redis_password)

    def test_password_only_in_the_file(self):
        """requirepass: the node with the password file claims, and so does one whose file is
        root's and readable by the server's group (PostgreSQL's rule for ssl_key_file: a
        Kubernetes secret volume); one without a password, one whose file others can read and
        one whose "file" is a FIFO (refused, not waited on) claim nothing; the password is in
        no log."""
        r, ok, nopw, lax, rooted, fifo = self.take("password")
        w = wait_claimed(ok)
        self.assertNotEqual(wait_claimed(rooted), w)
        self.assertNotIn(REDIS_PASSWORD, rooted.log())
        self.check_password(REDIS_PASSWORD, ok, nopw)
        self.assertEqual(r.cli("EXISTS", f"snowflake:claim:{DC}:{w}"), "1")
        e = wait_claim_error(lax, lambda t: "0600" in t or "mode" in t.lower())
        log(f"lax file: {error_text(e)[:200]}")
        e = wait_claim_error(fifo, lambda t: "regular file" in t)
        log(f"FIFO: {error_text(e)[:200]}")
        self.assertNotIn(REDIS_PASSWORD, lax.log())


# --------------------------------------------------------------------------------------
# PostgreSQL coordinator with a standby

def coordinator_pair(bundle, **kw):
    return started(bundle, CoordinatorPair(**kw))


def coordinator_nodes(bundle):
    pair = coordinator_pair(bundle)
    return (pair,) + two_holders(bundle, pair.uri(), COORD_TTL, "c", newcomer=True)


# The coordinator with TLS runs on Debian's PostgreSQL 15, whatever the nodes' major: the
# majors built from source by scripts/build-pg.sh have no SSL.
SSL_COORDINATOR_BIN = "/usr/lib/postgresql/15/bin"


def coordinator_tls(bundle):
    pair = coordinator_pair(bundle, tls=test_ca(), bin_dir=SSL_COORDINATOR_BIN)
    uri = pair.uri("target_session_attrs=read-write&sslmode=verify-full")
    return (pair,) + tls_nodes(bundle, uri, COORD_TTL)


COORD_PASSWORD = "Coord-Node-Pw-9"


def coordinator_password(bundle):
    pair = coordinator_pair(bundle, password=COORD_PASSWORD)
    pw = os.path.join(pair.primary.dir, "pgpass")
    write_password_file(pw, f"127.0.0.1:*:{pair.DB}:{pair.ROLE}:{COORD_PASSWORD}")
    # This pair has no TLS: a URI with a password to send and no sslmode would require it
    # (issue 35), so the clear text is asked for explicitly.
    uri = pair.uri("target_session_attrs=read-write&sslmode=disable")
    a, nopw = start_nodes(bundle, [
        ("cpw", node_settings(uri, COORD_TTL, snowflake__registry_password_file=pw)),
        ("cnopw", node_settings(uri, COORD_TTL))])
    wait_claimed(a)
    return pair, a, nopw


class CoordinatorFailover(HABase):
    TTL = COORD_TTL

    @classmethod
    def setUpClass(cls):
        require(cls, "postgresql://u@127.0.0.1:1,127.0.0.1:2/db?target_session_attrs=read-write")
        cls.prepare(failover=coordinator_nodes, tls=coordinator_tls,
                    password=coordinator_password)

    def test_primary_killed_standby_promoted_nodes_resume(self):
        """The coordinator's primary stops at once (immediate), its standby is promoted; the
        nodes follow through the multi-host URI (target_session_attrs=read-write). The
        promoted server's incarnation token (an unlogged table) is gone: the registry
        settles. Bound: the promotion, a settle (ttl + ttl/5), a retry and a heartbeat, the
        margin."""
        pair, a, b, c = self.take("failover")
        wa, wb = self.writing(a, b)
        pair.standby.wait_replayed(pair.primary)
        killed_at = time.monotonic()
        took = pair.fail_over()
        up(c)
        watch = StatusWatcher(c)
        settings = took + settle(self.TTL) + 3 * self.TTL / 10
        resumed = self.wait_resumed([wa, wb], killed_at, settings, "coordinator failover",
                                    outage=took)
        wc = watch.wait_held(settings, killed_at)
        bound = liveness_bound(settings, killed_at)
        seen = watch.seen
        wn = self.writing(c)[0]
        time.sleep(1.0)
        self.stop_writers(wa, wb, wn)
        report_figure("coordinator failover", f"failed over in {took:.2f} s; nodes resumed after {resumed} s (bound "
            f"{bound:.1f} s); newcomer claimed after {watch.held_at - killed_at:.1f} s, "
            f"statuses {sorted(seen)}; "
            + "; ".join(w.summary(killed_at) for w in (wa, wb)))
        self.assertIn("settling", seen, "the promoted coordinator did not settle")
        self.assertNotIn(wc, [claim_state(a)[1], claim_state(b)[1]])
        self.assert_no_duplicates(wa.got, wb.got, wn.got)

    def test_tls_right_and_wrong_ca(self):
        """sslmode=verify-full, the CA from snowflake.registry_ca_file."""
        if "tls" not in self.prep.jobs:
            self.skipTest("no snowflake.registry_ca_file")
        fixture = self.take("tls")
        pair = fixture[0]
        # TLS really is in use: the coordinator sees the registry's connections encrypted
        # (waited for: a node replaces its connection every 3 x claim_ttl).
        wait_until(lambda: pair.primary.one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
            "WHERE a.application_name = 'snowflake registry' AND s.ssl") >= 1,
            what="an encrypted registry connection on the coordinator")
        self.check_tls(fixture, "postgresql://")

    def test_pgpass_password_file(self):
        """The registry role needs a password (scram over TCP); the node has it only in a
        .pgpass-style snowflake.registry_password_file. A node without it claims nothing
        and says why."""
        if "password" not in self.prep.jobs:
            self.skipTest("no snowflake.registry_password_file")
        pair, a, nopw = self.take("password")
        self.check_password(COORD_PASSWORD, a, nopw)



# --------------------------------------------------------------------------------------
# etcd restores with a holder out of reach (issue 37)

# Issue 37, path 2: the default claim_ttl; the node clocks at opposite ends of the allowed
# skew (claim_ttl/5 each way, less 0.1 s).
ETCD_CUTOFF_TTL = ETCD_TTL
ETCD_CUTOFF_SKEW_MS = int(ETCD_CUTOFF_TTL * 1000) // 5 - 100


def wait_renewal(c):
    """Waits for the next renewal of c's claim (its expiry moves)."""
    query = "SELECT claim_expires_at FROM snowflake_stats()"
    expires = c.one(query)
    wait_until(lambda: c.one(query) != expires, what=f"a renewal of {c.name}")


def etcd_claim_holder(etcd, w):
    """The token in the claim key of worker id w (None if there is none)."""
    out = etcd.etcdctl("get", f"/snowflake/claim/{DC}/{w}", "--print-value-only").stdout.strip()
    return out or None


def etcd_cut_off_holder(bundle):
    """An etcd cluster whose datacenter has one free id w; node H (its clock ahead of etcd's
    by ETCD_CUTOFF_SKEW_MS) holds it, granted after a snapshot that has the fleet record and
    w free (prepared for a restore); node B (its clock behind by as much) initialized, not
    started. Returns (etcd, H, B, w, the prepared restore's token)."""
    etcd = etcd_cluster(bundle)
    etcd_squat(etcd, range(1, 32))
    settings = node_settings(etcd.uri(), ETCD_CUTOFF_TTL)
    h = new_cluster(bundle, "hcut", settings)
    h.init()
    h.use_clock_shim(ETCD_CUTOFF_SKEW_MS)
    up(h)
    # The registry begins (the fleet record) and settles for one ttl before any grant.
    wait_until(lambda: etcd.etcdctl("get", "/snowflake/fleet", "--keys-only").stdout.strip(),
               what="the fleet record")
    snapshot = etcd.snapshot("before-grant.db")
    w = wait_claimed(h)
    b = new_cluster(bundle, "bcut", settings)
    b.init()
    b.use_clock_shim(-ETCD_CUTOFF_SKEW_MS)
    return etcd, h, b, w, etcd.prepare_restore(snapshot)


def etcd_one_free_id(bundle):
    """An etcd cluster whose datacenter has one free id w, node H holding it and node E
    left waiting (exhausted). Returns (etcd, H, E, w)."""
    etcd = etcd_cluster(bundle)
    etcd_squat(etcd, range(1, 32))
    settings = node_settings(etcd.uri(), ETCD_TTL)
    nodes = start_nodes(bundle, [("rva", settings), ("rvb", settings)])
    wait_until(lambda: any(claim_state(n)[0] == "held" for n in nodes),
               what="one node holding the free id")
    h = next(n for n in nodes if claim_state(n)[0] == "held")
    (e,) = [n for n in nodes if n is not h]
    wait_until(lambda: claim_state(e)[0] == "exhausted", what="the other node exhausted")
    return etcd, h, e, claim_state(h)[1]


if __name__ == "__main__":
    unittest.main()
