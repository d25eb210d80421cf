"""Real PostgreSQL clusters for the integration tests.

Runs as root (like CI); every server runs as the ``postgres`` OS user, because initdb and
pg_ctl refuse root. Each cluster lives in <BASE>/<name> with its Unix socket there and no TCP
listener, so two runs on one machine never share a port or a path: BASE is per process
(SNOWFLAKE_IT_BASE overrides it).
"""

import collections
import glob
import os
import shutil
import subprocess
import sys
import threading
import time
import unittest

import psycopg

PG_MAJOR = os.environ.get("PG_MAJOR", "15")
PG_BIN = os.environ.get("PG_BIN", f"/usr/lib/postgresql/{PG_MAJOR}/bin")
BASE = os.environ.get("SNOWFLAKE_IT_BASE", f"/var/tmp/snowflake-it-{os.getpid()}")

# Timing in the tests (docs/testing.md#timing-in-the-tests). A wait's timeout that only
# guards against a hang: generous on purpose, never an assertion about speed.
HANG_GUARD = 120
# A liveness bound is what the settings under test allow, plus LIVENESS_MARGIN_S, plus
# LAG_STEPS times the worst scheduling delay measured in this run over the timed interval
# (see scheduling_delay): a chain of that many wake-ups (worker tick, request, reply,
# backend, client) may each be that late on a loaded machine.
LIVENESS_MARGIN_S = 1.0
LAG_STEPS = 10
# The scheduling delay counted for a bound is measured from this long before the timed
# interval to its end: a short interval (a 50 ms statement) has too few samples of its own.
LAG_HISTORY_S = 10.0


class _LagSampler(threading.Thread):
    """Measures the scheduling delay of this run: sleeps PERIOD_S again and again and keeps
    how late each wake-up was. The test processes and the servers share the machine's cores,
    so a late wake-up here is a measure of how late theirs are (figures measured on a 2-core
    machine: docs/testing.md#timing-in-the-tests)."""

    PERIOD_S = 0.02

    def __init__(self):
        super().__init__(daemon=True, name="lag-sampler")
        self.samples = collections.deque(maxlen=500_000)  # (woke at, late by), monotonic s
        self.lock = threading.Lock()

    def run(self):
        while True:
            began = time.monotonic()
            time.sleep(self.PERIOD_S)
            woke = time.monotonic()
            with self.lock:
                self.samples.append((woke, max(0.0, woke - began - self.PERIOD_S)))

    def worst(self, since=None, until=None):
        worst = 0.0
        with self.lock:  # newest first, up to `since`: no copy of a long run's samples
            for woke, late in reversed(self.samples):
                if until is not None and woke > until + self.PERIOD_S:
                    continue
                if since is not None and woke < since:
                    break
                worst = max(worst, late)
        return worst


_LAG = _LagSampler()
_LAG.start()


def scheduling_delay(since=None, until=None):
    """The worst scheduling delay (s) measured in this run between the monotonic times
    `since` and `until` (default: from the start of the run, until now). A wake-up still
    pending counts as late by how long it has been pending."""
    worst = _LAG.worst(since, until)
    if until is None:
        with _LAG.lock:
            last = _LAG.samples[-1][0] if _LAG.samples else time.monotonic()
        worst = max(worst, time.monotonic() - last - _LagSampler.PERIOD_S)
    return worst


def lag_fits(slack_s, since, until=None):
    """Whether LAG_STEPS wake-ups, each as late as the worst scheduling delay measured from
    LAG_HISTORY_S before `since` to `until` (default: now), fit in `slack_s`: the condition
    under which a liveness promise that rests on that slack is asserted rather than
    reported. Returns (fits, the delay)."""
    lag = scheduling_delay(since - LAG_HISTORY_S, until)
    return LAG_STEPS * lag < slack_s, lag


def liveness_bound(settings_s, since=None, until=None):
    """A liveness bound (s): `settings_s`, what the settings under test allow, plus the
    margin, plus LAG_STEPS times the scheduling delay measured from LAG_HISTORY_S before
    `since` to `until` (default: now)."""
    start = None if since is None else since - LAG_HISTORY_S
    return settings_s + LIVENESS_MARGIN_S + LAG_STEPS * scheduling_delay(start, until)


def assert_live(test, took, settings_s, since, what):
    """A liveness assertion on a measured duration: `took` seconds from the monotonic time
    `since` must be under liveness_bound(settings_s) over that interval. Prints the figures."""
    bound = liveness_bound(settings_s, since, since + took)
    lag = scheduling_delay(since - LAG_HISTORY_S, since + took)
    print(f"\n{what}: {took:.3f} s (bound {bound:.2f} s: {settings_s:.2f} s from the settings, "
          f"scheduling delay {lag:.3f} s)", flush=True)
    test.assertLess(took, bound, f"{what} took {took:.2f} s; bound {bound:.2f} s = "
                    f"{settings_s:.2f} s from the settings + {LIVENESS_MARGIN_S} s + "
                    f"{LAG_STEPS} x {lag:.3f} s measured scheduling delay")


def wait_live(condition, settings_s, since=None, what="the condition"):
    """A liveness assertion: polls `condition` until it is true and fails the test if that
    takes longer after `since` (monotonic s; default now) than liveness_bound(settings_s)
    over the time waited. The bound is recomputed as it waits, so a machine that becomes
    loaded meanwhile widens it. Returns the seconds from `since` to the condition."""
    since = time.monotonic() if since is None else since
    while not condition():
        now = time.monotonic()
        bound = liveness_bound(settings_s, since)
        if now - since > bound:
            raise AssertionError(
                f"{what}: not after {now - since:.2f} s (bound {bound:.2f} s = {settings_s:.2f} s "
                f"from the settings + {LIVENESS_MARGIN_S} s + {LAG_STEPS} x "
                f"{scheduling_delay(since - LAG_HISTORY_S):.3f} s measured scheduling delay)")
        time.sleep(0.05)
    return time.monotonic() - since


def _current_test_id():
    """The id of the unittest test whose code is on this thread's stack, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, unittest.TestCase):
            return candidate.id()
        frame = frame.f_back
    return None


def report_figure(name: str, text: str) -> None:
    """A reported figure: what a test measured where a pass/fail bound would only say how
    loaded the machine was (docs/testing.md#timing-in-the-tests). Prints it and appends
    `<test id>\t<name>\t<text>` to BASE/figures.tsv, which the test command prints at the
    end of the run. Called from a thread outside the test, the line has the name alone in
    place of the test id."""
    def clean(v):
        return " ".join(str(v).split())  # one line, no tabs
    test_id = _current_test_id()
    print(f"\nfigure: {test_id or ''} {name}: {text}", flush=True)
    os.makedirs(BASE, exist_ok=True)
    with open(os.path.join(BASE, "figures.tsv"), "a") as f:
        f.write(f"{clean(test_id or name)}\t{clean(name)}\t{clean(text)}\n")


def _faketime_lib():
    """libfaketime's preload library for this machine's architecture (Debian's multiarch path)."""
    arch = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip()
    found = glob.glob(f"/usr/lib/{arch}/faketime/libfaketime.so.1") if arch else []
    found = found or sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError("libfaketime is not installed (Debian package libfaketime)")
    return found[0]


FAKETIME_LIB = _faketime_lib()

SHIMS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CLOCK_OFFSET_BYTES = 32  # the shim's offset file: a number of ms padded to this size


def write_clock_offset(path, shift_ms):
    """Writes the clock shim's offset file (ms from the real clock), in place: the processes
    that run under the shim map it, and see the new offset at once."""
    text = str(int(shift_ms)).ljust(CLOCK_OFFSET_BYTES).encode()
    with open(path, "r+b" if os.path.exists(path) else "wb") as f:
        f.write(text)


def shim_lib(name):
    """Builds tests/<name>/<name>.c (once per run) and returns the path of the library, for
    LD_PRELOAD."""
    os.makedirs(BASE, exist_ok=True)
    lib = os.path.join(BASE, f"{name}.so")
    if not os.path.exists(lib):
        tmp = f"{lib}.{os.getpid()}"
        source = os.path.join(SHIMS_DIR, name, f"{name}.c")
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", tmp, source, "-ldl"], check=True)
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)
    return lib


def clock_shim_lib():
    """tests/clockshim: shifts CLOCK_REALTIME of every process of a server, background
    workers included, which libfaketime does not reach under PostgreSQL 15."""
    return shim_lib("clockshim")


def twin_shim_lib():
    """tests/twinshim: the postmaster's random bytes of another server (see its source)."""
    return shim_lib("twinshim")

_next_port = [55500]


def as_postgres(*cmd, env=None, check=True, capture=False):
    """Runs a command as the postgres OS user."""
    full = ["runuser", "-u", "postgres", "--"]
    if env:
        full += ["env"] + [f"{k}={v}" for k, v in env.items()]
    full += list(cmd)
    return subprocess.run(full, check=check, text=True,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)


class Cluster:
    """One PostgreSQL data directory and the server running on it."""

    def __init__(self, name, settings=None, port=None, bin_dir=None):
        self.name = name
        self.bin = bin_dir or PG_BIN
        self.dir = os.path.join(BASE, name)
        self.data = os.path.join(self.dir, "data")
        self.port = port or _next_port[0]
        _next_port[0] += 1
        self.settings = dict(settings or {})
        self.faketime_file = os.path.join(self.dir, "faketime")
        self.env = {}

    # -- lifecycle ---------------------------------------------------------------------
    def _fresh_dir(self):
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        shutil.chown(self.dir, "postgres", "postgres")

    def init_standby_of(self, primary):
        """Makes this cluster a streaming standby of `primary` (pg_basebackup -R), with its
        own port and socket directory, and the primary's settings unless it has its own."""
        self._fresh_dir()
        as_postgres(f"{self.bin}/pg_basebackup", "-h", primary.dir, "-p", str(primary.port),
                    "-U", "postgres", "-D", self.data, "-R", "-X", "stream", capture=True)
        if not self.settings:
            self.settings = dict(primary.settings)
        self.write_settings()
        return self

    def init(self, *initdb_args):
        self._fresh_dir()
        as_postgres(f"{self.bin}/initdb", "-D", self.data, "-U", "postgres", "-A", "trust",
                    "--no-sync", *initdb_args, capture=True)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("\ninclude_if_exists = 'test.conf'\n")
        self.write_settings()
        return self

    def write_settings(self):
        path = os.path.join(self.data, "test.conf")
        base = {
            "port": str(self.port),
            "unix_socket_directories": f"'{self.dir}'",
            "listen_addresses": "''",
            "fsync": "on",
        }
        with open(path, "w") as f:
            for k, v in {**base, **self.settings}.items():
                f.write(f"{k} = {v}\n")
        shutil.chown(path, "postgres", "postgres")

    def configure(self, **settings):
        """Replaces settings (None removes one); takes effect at the next start."""
        for k, v in settings.items():
            key = k.replace("__", ".")
            if v is None:
                self.settings.pop(key, None)
            else:
                self.settings[key] = v
        self.write_settings()

    def use_faketime(self, offset="+0"):
        """Runs the server under libfaketime, with an offset that can change while it runs."""
        self.set_clock_offset(offset)
        self.env = {
            "LD_PRELOAD": FAKETIME_LIB,
            "FAKETIME_TIMESTAMP_FILE": self.faketime_file,
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_RESET": "1",
            # A real clock step (NTP, an operator) moves CLOCK_REALTIME only.
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def use_clock_shim(self, shift_ms=0):
        """Runs the server under tests/clockshim: its wall clock (every process, background
        workers included) is shifted by `shift_ms`, changeable while it runs."""
        self.clock_file = os.path.join(self.dir, "clock-offset")
        self.shift_clock_ms(shift_ms)
        self.env = {"LD_PRELOAD": clock_shim_lib(), "SNOWFLAKE_CLOCK_OFFSET_FILE": self.clock_file}

    def shift_clock_ms(self, shift_ms):
        """Sets the shim's offset (ms, from the real clock); takes effect at once in every
        process of the server."""
        write_clock_offset(self.clock_file, shift_ms)
        shutil.chown(self.clock_file, "postgres", "postgres")

    def set_clock_offset(self, offset):
        """Moves the server's clock, e.g. '-15s', '+0', '-500ms' is not supported: use seconds."""
        with open(self.faketime_file, "w") as f:
            f.write(offset + "\n")
        shutil.chown(self.faketime_file, "postgres", "postgres")

    def start(self, check=True):
        log = os.path.join(self.dir, "server.log")
        r = as_postgres(f"{self.bin}/pg_ctl", "-D", self.data, "-l", log, "-w", "-t",
                        str(HANG_GUARD), "start", env=self.env or None, check=False, capture=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"{self.name} did not start:\n{r.stdout}{r.stderr}\n{self.log()[-3000:]}")
        return r.returncode == 0

    def stop(self, mode="fast"):
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            as_postgres(f"{self.bin}/pg_ctl", "-D", self.data, "-m", mode, "-w", "stop",
                        check=False, capture=True)

    def restart(self):
        self.stop()
        self.start()

    def destroy(self):
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            os.rmdir(BASE)  # the last cluster of a run removes the run's directory
        except OSError:
            pass

    def reload(self, **settings):
        """Changes settings (see configure) and reloads the running server."""
        self.configure(**settings)
        self.reload_conf()

    def reload_conf(self):
        """pg_reload_conf(), then waits until the postmaster has read the file: every new
        backend has the new settings, and every open session takes them before its next
        command."""
        before = self.one("SELECT pg_conf_load_time()")
        self.sql("SELECT pg_reload_conf()")
        wait_until(lambda: self.one("SELECT pg_conf_load_time()") > before, what="the reload")

    def running(self):
        r = as_postgres(f"{self.bin}/pg_ctl", "-D", self.data, "status", check=False, capture=True)
        return r.returncode == 0

    def promote(self):
        as_postgres(f"{self.bin}/pg_ctl", "-D", self.data, "-w", "-t", str(HANG_GUARD), "promote",
                    capture=True)

    def walreceiver_pid(self, timeout=HANG_GUARD):
        """Pid of a standby's WAL receiver, once it streams."""
        pid = [None]

        def streaming():
            pid[0] = self.one("SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'")
            return pid[0]
        wait_until(streaming, timeout=timeout, what=f"{self.name}: a streaming WAL receiver")
        return pid[0]

    def wait_replayed(self, primary, timeout=HANG_GUARD):
        """Waits until this standby has replayed everything `primary` has flushed."""
        lsn = primary.one("SELECT pg_current_wal_flush_lsn()::text")
        wait_until(lambda: self.one("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)),
                   timeout=timeout, what=f"{self.name} to replay up to {lsn}")

    def wait_sync_standby(self, timeout=HANG_GUARD):
        """Waits until a primary reports a synchronous standby."""
        wait_until(lambda: self.one("SELECT count(*) FROM pg_stat_replication "
                                    "WHERE sync_state = 'sync'"),
                   timeout=timeout, what=f"{self.name}: a synchronous standby")

    # -- access -------------------------------------------------------------------------
    def connect(self, dbname="postgres", autocommit=True, retries=None):
        """A session; retries while the server starts up or recovers from a crash, for at
        most HANG_GUARD s (a guard against a server that never comes back), or `retries`
        attempts 0.2 s apart when given (a caller that expects the server to be down)."""
        deadline = time.monotonic() + HANG_GUARD
        attempt = 0
        while True:
            attempt += 1
            try:
                return psycopg.connect(host=self.dir, port=self.port, user="postgres",
                                       dbname=dbname, autocommit=autocommit)
            except psycopg.OperationalError:  # starting up / crash recovery
                if (attempt >= retries) if retries is not None else time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def sql(self, query, params=None, dbname="postgres"):
        """Runs one statement on a fresh connection; returns all rows (or None)."""
        with self.connect(dbname) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else None

    def one(self, query, params=None):
        rows = self.sql(query, params)
        return rows[0][0] if rows else None

    def stats(self):
        """The snowflake_stats row as a dict by column name."""
        with self.connect() as conn:
            cur = conn.execute("SELECT * FROM snowflake_stats")
            return dict(zip([c.name for c in cur.description], cur.fetchone()))

    def wait_lease_passed(self, timeout=HANG_GUARD):
        """Waits until the clock is past the durable lease, so that the next ID writes a new
        lease record. Sleeping one lease_window is not enough: a lease is widened by up to
        another window (at least 100 ms) after slow renewals, as on a loaded machine."""
        wait_until(lambda: self.one("SELECT lease_end < clock_timestamp() FROM snowflake_stats"),
                   timeout=timeout, what=f"{self.name}: the clock past the lease")

    def log(self):
        try:
            with open(os.path.join(self.dir, "server.log")) as f:
                return f.read()
        except FileNotFoundError:
            return ""


def wait_until(condition, timeout=HANG_GUARD, what="the condition", poll=0.05, fail=True):
    """Polls `condition` (every `poll` s) until it is true; fails the test after `timeout`
    seconds. For states a test waits for (a log line, a backend waiting); a fixed sleep would
    flake on a loaded machine. Sleeps that let real time pass (past a lease) stay sleeps. The
    timeout only guards against a hang (HANG_GUARD by default): a bound on speed is a
    liveness assertion, see wait_live. Returns True; with `fail=False`, a bounded wait whose
    caller goes on either way (or raises its own error), it returns False at the timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            if not fail:
                return False
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)
    return True


def error_of(conn, query, params=None):
    """Runs a statement that must fail; returns the psycopg error (its .sqlstate, .diag)."""
    try:
        conn.execute(query, params)
    except psycopg.Error as e:
        return e
    raise AssertionError(f"expected an error from: {query}")


class BatchClient(threading.Thread):
    """A client issuing snowflake_next_batch(`batch`) in a loop on its own session, keeping
    the highest ID of each returned batch in `returned` (what an application saw), until
    stopped or until a statement fails (the first error is kept in `failures`; a test that
    kills the server expects one). `then` runs after each batch on the same session.
    Used as a context manager: started on entry, stopped and joined on exit."""

    def __init__(self, pg, batch=500, pause=0.01, then=None):
        super().__init__(daemon=True)
        self.pg, self.batch, self.pause, self.then = pg, batch, pause, then
        self.returned, self.failures = [], []
        self.halt = threading.Event()

    def run(self):
        try:
            with self.pg.connect() as conn:
                while not self.halt.is_set():
                    self.returned.append(conn.execute(
                        "SELECT max(x) FROM unnest(snowflake_next_batch(%s)) x",
                        (self.batch,)).fetchone()[0])
                    if self.then:
                        conn.execute(self.then)
                    time.sleep(self.pause)
        except psycopg.Error as e:
            self.failures.append(e)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.halt.set()
        self.join()


def timed_one(test, pg, query, timeout):
    """Runs `query` on a new session with `statement_timeout`; fails the test with the
    SQLSTATE, the message and the time taken if it raises. Returns (its value, seconds)."""
    with pg.connect() as conn:
        conn.execute(f"SET statement_timeout = '{timeout}'")
        started = time.monotonic()
        try:
            value = conn.execute(query).fetchone()[0]
        except psycopg.Error as e:
            test.fail(f"{query} failed after {time.monotonic() - started:.2f} s: "
                      f"{e.sqlstate} {e.diag.message_primary}")
        return value, time.monotonic() - started
