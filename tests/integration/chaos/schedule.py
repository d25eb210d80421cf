"""The chaos campaign: one schedule played (fleet, faults, healing, cooldown, check)."""

import atexit
import glob
import os
import shutil
import signal
import subprocess
import threading
import time
import traceback
from collections import Counter, defaultdict

import psycopg

import harness
from fixtures.clusters import node
from fixtures.processes import alive, postmaster_pid, registry_worker_pid
from fixtures.waits import wait_claimed
from harness import Cluster, as_postgres, wait_until

from .checker import check
from .etcd_sentinel import ChaosEtcd, ChaosSentinel
from .fleet import Node, Writer
from .processes import is_postgres, procs_in, send, signal_node
from .registries import ChaosCoordinator, ChaosRedis


class Schedule:
    def __init__(self, plan, verbose=True, keep=False):
        self.plan = plan
        self.verbose = verbose
        self.keep = keep
        self.prefix = f"chaos{os.getpid()}-{plan.index}"
        self.registry = None
        self.nodes = {}       # every node ever started, clones included
        self.sessions = []    # (node name, incarnation, writer label, backend pid)
        self.session_lock = threading.Lock()
        self.print_lock = threading.Lock()
        self.outcomes = defaultdict(Counter)   # kind -> done/skipped/failed
        self.handovers = Counter()             # handovers seen, by the action that followed
        self.timeline = []                     # events as played (seconds since the start)
        self.notes = []
        self.fakes_stop = threading.Event()
        self.fake_thread = None
        self.t0 = time.monotonic()
        self.t0_ns = time.monotonic_ns()
        self.registry_lock = threading.Lock()
        self.sentinel_lock = threading.Lock()
        self.heal_at = None
        self.fault_start = None
        self.cold_copies = {}
        self.moment_waits = []  # how long each composite fault played waited for its moment

    # -- output ----------------------------------------------------------------------
    def say(self, msg):
        if self.verbose:
            with self.print_lock:
                print(f"[{time.monotonic() - self.t0:7.2f}] {msg}", flush=True)

    def new_session(self, node_, label, pid):
        with self.session_lock:
            self.sessions.append((node_.name, node_.incarnation, label, pid))
            return len(self.sessions) - 1

    # -- fleet -----------------------------------------------------------------------
    def _cluster(self, name):
        return node(f"{self.prefix}-{name}", self.registry, datacenter=self.plan.datacenter,
                    **{"snowflake.claim_ttl": f"'{self.plan.ttl}'",
                       "snowflake.max_clock_drift": f"'{self.plan.max_clock_drift[name]}'"})

    def _start(self, n):
        n.cluster.start()
        n.incarnation += 1
        n.up = True

    def _start_after_kill(self, n, pids):
        wait_until(lambda: not any(alive(p) for p in pids), timeout=15, fail=False)
        for _ in range(3):
            left = procs_in(n.cluster.data)
            for p in left:  # children forked after the kill (a crash restart in progress)
                send(p, signal.SIGKILL)
            wait_until(lambda: not any(alive(p) for p in left), timeout=10, fail=False)
            for stale in ([os.path.join(n.cluster.data, "postmaster.pid")]
                          + glob.glob(os.path.join(n.cluster.dir, ".s.PGSQL.*"))):
                try:
                    os.remove(stale)
                except FileNotFoundError:
                    pass
            if n.cluster.start(check=False):
                n.incarnation += 1
                n.up = True
                return
            time.sleep(0.5)
        raise RuntimeError(f"{n.name} did not start again\n{n.cluster.log()[-2000:]}")

    def _writers_for(self, n, seeds):
        for j, seed in enumerate(seeds):
            w = Writer(self, n, j, seed)
            n.writers.append(w)
            w.start()

    def setup(self):
        p = self.plan
        base = harness.BASE
        os.makedirs(base, exist_ok=True)
        self.registry = {"redis": ChaosRedis, "pg": ChaosCoordinator, "etcd": ChaosEtcd,
                         "sentinel": ChaosSentinel}[p.registry](base)
        self.registry.start()
        self.registry.make_tables()
        self.fake_state = {}
        n = self.registry.refresh_fakes(self.fake_state, p.datacenter, p.fake_ids, self.fake_ttl())
        if n is None:
            raise RuntimeError("could not place the fake claims")
        if p.registry == "pg":
            self.registry.cluster.sql("CHECKPOINT")  # the fakes' rows survive any crash
        self.fake_thread = threading.Thread(target=self._refresher, daemon=True)
        self.fake_thread.start()
        for name in p.node_names:
            self.nodes[name] = Node(name, self._cluster(name))
        harness.clock_shim_lib()  # built once, before the nodes start in parallel

        def bring_up(n):
            n.cluster.init()
            n.shifts["base"] = p.base_clock[n.name]
            n.cluster.use_clock_shim(n.offset())
            self._start(n)
            n.cluster.sql("CREATE EXTENSION IF NOT EXISTS snowflake")

        errors = []

        def guarded(n):
            try:
                bring_up(n)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=guarded, args=(n,)) for n in self.nodes.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        claimed = {n.name: self._wait_settled(n) for n in self.nodes.values()}
        self.say(f"claimed: {claimed}")
        if sum(1 for v in claimed.values() if isinstance(v, int)) < min(p.nodes, p.free_count):
            raise RuntimeError(f"the nodes did not claim their ids: {claimed}")
        if self.registry.snapshot() is None:
            self.say("note: the first registry copy failed")
        self.cold_copies = {}
        if any(e.kind == "handover" and e.params.get("cold") for e in p.events):
            for name, n in self.nodes.items():
                path = f"{n.cluster.dir}-cold"
                os.makedirs(path, exist_ok=True)
                shutil.chown(path, "postgres", "postgres")
                if self._basebackup(n, os.path.join(path, "data")) is None:
                    self.cold_copies[name] = os.path.join(path, "data")
        for name, n in self.nodes.items():
            self._writers_for(n, [p.writer_seeds[f"{name}/{j}"] for j in range(2)])

    def _wait_settled(self, n, timeout=60):
        """The node's claimed worker id, or 'exhausted' when every id is taken (fewer free
        ids than nodes)."""
        state = [None, None]

        def settled():
            state[:] = self._claim_state(n)
            return state[0] in ("held", "exhausted")
        if wait_until(settled, timeout=timeout, poll=0.1, fail=False):
            return state[1] if state[0] == "held" else state[0]
        st = state[0]
        raise RuntimeError(f"{n.name}: no claim, last status {st}\n{n.cluster.log()[-2000:]}")

    def fake_ttl(self):
        return max(10_000, 5 * self.plan.ttl_ms)

    def _refresher(self):
        p = self.plan
        period = min(1.0, p.ttl_ms / 4000.0)
        while not self.fakes_stop.wait(period):
            self.registry.refresh_fakes(self.fake_state, p.datacenter, p.fake_ids,
                                        self.fake_ttl())

    # -- faults ----------------------------------------------------------------------
    def run_event(self, ev):
        started = time.monotonic() - self.t0
        try:
            result = getattr(self, "do_" + ev.kind)(ev)
        except Exception as e:  # noqa: BLE001
            result = f"failed: {type(e).__name__}: {str(e).strip()[:300]}"
            if self.verbose:
                traceback.print_exc()
        self.timeline.append({"start_s": round(started, 2),
                              "end_s": round(time.monotonic() - self.t0, 2),
                              "event": str(ev), "kind": ev.kind, "target": ev.target,
                              "result": result or "done"})
        if result is None or result == "done":
            self.outcomes[ev.kind]["done"] += 1
            self.say(f"done    {ev}")
        elif result.startswith("failed"):
            self.outcomes[ev.kind]["failed"] += 1
            self.notes.append(f"#{ev.seq} {ev.kind} {ev.target}: {result}")
            self.say(f"FAILED  {ev}: {result}")
        else:
            self.outcomes[ev.kind]["skipped"] += 1
            self.say(f"skipped {ev}: {result}")

    def _node(self, ev):
        return self.nodes[ev.target]

    def _writer_pid(self, n, j):
        w = n.writers[j] if j < len(n.writers) else None
        pid = w.pid if w else None
        return pid if pid and is_postgres(pid) else None

    def do_backend_kill(self, ev):
        n = self._node(ev)
        pid = self._writer_pid(n, ev.params["writer"])
        if not n.up or not pid:
            return "skipped: no backend"
        send(pid, signal.SIGKILL)
        self.say(f"  {n.name}: SIGKILL backend {pid}")

    def do_worker_kill(self, ev):
        n = self._node(ev)
        pid = registry_worker_pid(n.cluster) if n.up else None
        if not pid:
            return "skipped: no registry worker"
        send(pid, signal.SIGKILL)
        self.say(f"  {n.name}: SIGKILL registry worker {pid}")

    def _stop_cont(self, pids, seconds):
        for p in pids:
            send(p, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            for p in pids:
                send(p, signal.SIGCONT)

    def do_worker_stop(self, ev):
        n = self._node(ev)
        pid = registry_worker_pid(n.cluster) if n.up else None
        if not pid:
            return "skipped: no registry worker"
        self.say(f"  {n.name}: SIGSTOP registry worker {pid} for {ev.params['for']} s")
        self._stop_cont([pid], ev.params["for"])

    def do_backend_stop(self, ev):
        n = self._node(ev)
        pid = self._writer_pid(n, ev.params["writer"])
        if not n.up or not pid:
            return "skipped: no backend"
        self.say(f"  {n.name}: SIGSTOP backend {pid} for {ev.params['for']} s")
        self._stop_cont([pid], ev.params["for"])

    def do_node_stop(self, ev):
        n = self._node(ev)
        if not n.lock.acquire(blocking=False):
            return "skipped: node busy"
        try:
            if not n.up or not postmaster_pid(n.cluster):
                return "skipped: node down"
            pids = signal_node(n.cluster, signal.SIGSTOP)
            self.say(f"  {n.name}: SIGSTOP {len(pids)} processes for {ev.params['for']} s")
            try:
                time.sleep(ev.params["for"])
            finally:
                for p in pids:
                    send(p, signal.SIGCONT)
        finally:
            n.lock.release()

    def _kill_node(self, n):
        pids = signal_node(n.cluster, signal.SIGKILL)
        n.up = False
        return pids

    def do_node_kill(self, ev):
        n = self._node(ev)
        if not n.lock.acquire(blocking=False):
            return "skipped: node busy"
        try:
            if not n.up or not postmaster_pid(n.cluster):
                return "skipped: node down"
            pids = self._kill_node(n)
            self.say(f"  {n.name}: SIGKILL of {len(pids)} processes, down {ev.params['down']} s")
            time.sleep(ev.params["down"])
            self._start_after_kill(n, pids)
        finally:
            n.lock.release()

    def _restart(self, ev, mode):
        n = self._node(ev)
        if not n.lock.acquire(blocking=False):
            return "skipped: node busy"
        try:
            if not n.up:
                return "skipped: node down"
            n.cluster.stop(mode)
            n.up = False
            if n.cluster.running():
                pids = signal_node(n.cluster, signal.SIGKILL)
                self.notes.append(f"#{ev.seq}: {n.name} did not stop ({mode}); killed")
                self._start_after_kill(n, pids)
            else:
                self._start(n)
        finally:
            n.lock.release()

    def do_restart_clean(self, ev):
        return self._restart(ev, "fast")

    def do_restart_immediate(self, ev):
        return self._restart(ev, "immediate")

    def _step_clock(self, n, key, ms, hold):
        n.set_shift(key, ms)
        self.say(f"  {n.name}: clock {ms:+d} ms for {hold} s (offset now {n.offset():+d})")
        try:
            time.sleep(hold)
        finally:
            n.set_shift(key, 0)
            self.say(f"  {n.name}: clock step {ms:+d} ms undone (offset now {n.offset():+d})")

    def do_clock_step(self, ev):
        self._step_clock(self._node(ev), ev.seq, ev.params["ms"], ev.params["hold"])

    def _basebackup(self, src, target):
        r = as_postgres(f"{src.cluster.bin}/pg_basebackup", "-h", src.cluster.dir, "-p",
                        str(src.cluster.port), "-U", "postgres", "-D", target, "-X",
                        "stream", "-c", "fast", check=False, capture=True)
        if r.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            return f"skipped: pg_basebackup failed: {r.stderr.strip()[:200]}"
        return None

    def _make_clone(self, src, name, cold=False):
        """A copy of the running node `src` started beside it with its settings and writers
        of its own: a pg_basebackup now, or (cold) the copy taken at the start of the
        schedule (a VM image started much later). Returns the new Node, or a reason."""
        c = Cluster(f"{self.prefix}-{name}", dict(src.cluster.settings))
        if cold and src.name in self.cold_copies:
            c._fresh_dir()
            subprocess.run(["cp", "-a", self.cold_copies[src.name], c.data], check=True)
        else:
            if not src.lock.acquire(blocking=False):
                return "skipped: node busy"
            try:
                if not src.up:
                    return "skipped: node down"
                c._fresh_dir()
                why = self._basebackup(src, c.data)
                if why:
                    shutil.rmtree(c.dir, ignore_errors=True)
                    return why
            finally:
                src.lock.release()
        c.write_settings()
        c.use_clock_shim(src.offset())
        clone = Node(name, c, is_clone=True)
        clone.shifts["base"] = src.offset()
        self.nodes[name] = clone
        self._start(clone)
        seeds = self.plan.clone_seeds[2 * (len(self.nodes) % 32):][:2]
        self._writers_for(clone, seeds)
        return clone

    def do_clone(self, ev):
        clone = self._make_clone(self._node(ev), ev.params["name"])
        if isinstance(clone, str):
            return clone
        self.say(f"  {clone.name}: clone of {ev.target} started beside it for {ev.params['life']} s")
        time.sleep(ev.params["life"])
        self.retire(clone)

    def retire(self, n):
        for w in n.writers:
            w.stop_event.set()
        n.retired = True
        with n.lock:
            for p in procs_in(n.cluster.data):
                send(p, signal.SIGCONT)
            n.cluster.stop("immediate")
            n.up = False
        for w in n.writers:
            if w.ident is not None:
                w.join(10)
        self.say(f"  {n.name}: retired")

    def _moment(self, nodes, ready=None, registry=False):
        """Waits for the moment of a composite fault: the lifecycle locks of `nodes` (and the
        registry's) taken, every one of them up, and `ready()` (True, or why not) true.
        Under load the composites before it on the same nodes last longer and a node takes
        longer to answer and to claim, so the moment comes later than the schedule says: the
        fault waits for it rather than be skipped, until the end of the fault phase (the
        plan's seconds: the hang guard of the wait). Returns None with the locks held (the
        caller releases them), or why it is skipped. The locks are taken all or none and
        released between two looks: no composite holds one while it waits for another (two
        would deadlock), nor keeps a node idle that a later composite could use meanwhile."""
        nodes = list(dict.fromkeys(nodes))
        locks = [n.lock for n in nodes] + ([self.registry_lock] if registry else [])
        why = ["node busy"]

        def looks_ready():
            if not all(n.up and not n.retired and postmaster_pid(n.cluster) for n in nodes):
                why[0] = "node down"
                return False
            r = True if ready is None else ready()
            if r is not True:
                why[0] = r
                return False
            return True

        def busy(lk):
            why[0] = "registry busy" if lk is self.registry_lock else "node busy"
            return False

        def came():
            # A look without the locks first: a look that takes them while it connects to
            # check readiness would make the simple faults, which take theirs without
            # waiting, skip. Then the locks, and the same look again under them.
            for lk in locks:
                if lk.locked():
                    return busy(lk)
            if not looks_ready():
                return False
            taken = []
            try:
                for lk in locks:
                    if not lk.acquire(blocking=False):
                        return busy(lk)
                    taken.append(lk)
                if looks_ready():
                    taken = []  # kept: the caller releases them
                    return True
                return False
            finally:  # also when a look raises: heal() would wait for them for ever
                for lk in reversed(taken):
                    lk.release()
        waited = time.monotonic()
        if wait_until(came, timeout=max(0.0, self.fault_start + self.plan.seconds - waited),
                      poll=0.25, fail=False):
            self.moment_waits.append(round(time.monotonic() - waited, 2))
            return None
        return f"skipped: {why[0]} until the end of the fault phase"

    def _release(self, nodes):
        for n in reversed(list(dict.fromkeys(nodes))):
            n.lock.release()

    def _claim_anew(self, n, down):
        """Kills the whole node, starts it again and waits until it holds a claim (a new
        token: it claims its old id only once that lapsed, or a free one)."""
        pids = self._kill_node(n)
        time.sleep(down)
        self._start_after_kill(n, pids)
        try:
            wait_claimed(n.cluster, timeout=5 * self.plan.ttl_ms / 1000.0)
            return True
        except AssertionError:  # every id taken: it waits
            return False

    def do_claim_then_crash(self, ev):
        n = self._node(ev)
        why = self._moment([n])
        if why:
            return why
        try:
            if not self._claim_anew(n, ev.params["down"]):
                return "skipped: restarted, but no id free to claim"
            time.sleep(ev.params["delay"])
            if ev.params["victim"] == "worker":
                pid = registry_worker_pid(n.cluster)
            else:
                pid = self._writer_pid(n, 0) or self._writer_pid(n, 1)
            if not pid:
                return "skipped: nothing to kill after the claim"
            send(pid, signal.SIGKILL)
            self.say(f"  {n.name}: claimed anew, then SIGKILL {ev.params['victim']} {pid}")
        finally:
            n.lock.release()

    def do_claim_then_registry_crash(self, ev):
        """The coordinator's WAL writer stalls; node A is killed and started again and claims
        (a row not written out); rival B is killed and started again and asks for an id;
        A's registry worker is stopped (its link cut) and the coordinator crash-restarts,
        losing A's claim; A's worker continues `cut` seconds later."""
        a, b = self._node(ev), self.nodes[ev.params["rival"]]

        def a_holds():
            # A claims anew only if it held an id (its old one lapses, or a free one): a
            # node that waits for an id would wait again after its restart.
            st = self._claim_state(a)[0]
            return True if st == "held" else f"{a.name}'s claim is {st}"
        why = self._moment([a, b], ready=a_holds, registry=True)
        if why:
            return why
        try:
            worker = walwriter = None
            try:
                walwriter = self.registry.stall_wal_writer()
                if not self._claim_anew(a, ev.params["down"]):
                    return "skipped: restarted, but no id free to claim"
                if b is not a:
                    pids = self._kill_node(b)
                    self._start_after_kill(b, pids)
                time.sleep(ev.params["delay"])
                worker = registry_worker_pid(a.cluster)
                if worker:
                    send(worker, signal.SIGSTOP)
                pid = self.registry.crash_unflushed(walwriter)
                walwriter = None
                self.say(f"  {a.name} claimed anew, {b.name} restarted, {a.name}'s registry "
                         f"worker stopped, coordinator backend {pid} SIGKILLed")
            finally:
                if walwriter:
                    send(walwriter, signal.SIGCONT)
                self.registry_lock.release()
            if worker:
                time.sleep(ev.params["cut"])
                send(worker, signal.SIGCONT)
        finally:
            self._release([a, b])

    def _claim_state(self, n, conn=None):
        """(claim_status, worker_id) of a node, or (None, None) if it does not answer."""
        try:
            if conn is not None:
                return conn.execute("SELECT claim_status, worker_id FROM snowflake_stats()").fetchone()
            with psycopg.connect(host=n.cluster.dir, port=n.cluster.port, user="postgres",
                                 dbname="postgres", autocommit=True, connect_timeout=2) as c:
                return c.execute("SELECT claim_status, worker_id FROM snowflake_stats()").fetchone()
        except Exception:  # noqa: BLE001
            return (None, None)

    def _ahead(self, n, k):
        """One request of k blocks of 4096 IDs on `n`: its IDs run ahead of its clock."""
        w = Writer(self, n, len(n.writers), 0)
        w.label = f"{n.name}/ahead"
        n.writers.append(w)
        try:
            w._connect()
            w.request("ahead", k)
        except Exception:  # noqa: BLE001
            pass
        finally:
            w._drop()

    def _watch_and_act(self, waiters, worker, ev, done):
        """Polls the waiting nodes; the first that holds `worker` (the holder's) gets the
        event's `then` action at once."""
        p = ev.params
        conns = {}
        try:
            for n in waiters:
                try:
                    conns[n.name] = psycopg.connect(
                        host=n.cluster.dir, port=n.cluster.port, user="postgres",
                        dbname="postgres", autocommit=True, connect_timeout=2)
                except Exception:  # noqa: BLE001
                    pass
            taker = []

            def taken():
                if done.is_set():
                    return True
                for n in waiters:
                    conn = conns.get(n.name)
                    if conn is None:
                        continue
                    st, w = self._claim_state(n, conn)
                    if st is None:
                        conns.pop(n.name, None)
                        continue
                    if st == "held" and w == worker:
                        taker.append(n)
                        return True
                return False
            wait_until(taken, timeout=p["watch"], poll=0.01, fail=False)
            if taker:
                return self._then(taker[0], ev)
            self.say(f"  handover #{ev.seq}: no waiting node took worker {worker}")
        finally:
            for c in conns.values():
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass

    def _then(self, n, ev):
        p = ev.params
        self.say(f"  handover #{ev.seq}: {n.name} took the id; then {p['then']}")
        self.handovers[p["then"]] += 1
        if p["then"] in ("crash_backend", "crash_clock_back"):
            pid = self._writer_pid(n, 0) or self._writer_pid(n, 1)
            if pid:
                send(pid, signal.SIGKILL)
        elif p["then"] == "crash_worker":
            pid = registry_worker_pid(n.cluster)
            if pid:
                send(pid, signal.SIGKILL)
        if p["then"] in ("clock_back", "crash_clock_back"):
            self._step_clock(n, f"h{ev.seq}", p["then_ms"], p["then_hold"])

    def do_handover(self, ev):
        p = ev.params
        holder = self._node(ev)
        held = [None]

        def holds():
            st, held[0] = self._claim_state(holder)
            return True if st == "held" else f"the holder's claim is {st}"
        why = self._moment([holder], ready=holds)
        if why:
            return why
        worker = held[0]
        watcher = extra = None
        done = threading.Event()
        try:
            waiters = [n for n in list(self.nodes.values())
                       if n is not holder and n.up and not n.retired
                       and self._claim_state(n)[0] not in ("held", None)]
            if not waiters:
                # Other servers take every free id meanwhile, and a clone of another node
                # starts and waits for one.
                ttl_ms = int((p["watch"] + p.get("down", 0) + 10) * 1000)
                filler = self.registry.occupy_free(self.plan.datacenter, f"temp-{ev.seq}", ttl_ms)
                if filler is None:
                    return "skipped: the registry does not answer"
                clone = self._make_clone(self.nodes[p["clone_of"]], f"{p['clone_of']}h{ev.seq}",
                                         cold=p["cold"])
                if isinstance(clone, str):
                    self.registry.free(self.plan.datacenter, f"temp-{ev.seq}")
                    return clone
                extra = (clone, filler)
                # A hang guard: the fault phase's end, or 5 claim_ttl (what a restarted node
                # is given to claim) for a clone started just before it.
                wait_until(lambda: self._claim_state(clone)[0] in ("exhausted", "held"),
                           timeout=max(self.fault_start + self.plan.seconds - time.monotonic(),
                                       5 * self.plan.ttl_ms / 1000.0), fail=False)
                if self._claim_state(clone)[0] != "exhausted":
                    return "skipped: the clone did not wait for an id"
                waiters = [clone]
            self.say(f"  handover #{ev.seq}: {holder.name} holds worker {worker}; waiting: "
                     f"{[n.name for n in waiters]}")
            if p["ahead"]:
                self._ahead(holder, p["ahead"])
            watcher = threading.Thread(target=self._watch_and_act,
                                       args=(waiters, worker, ev, done), daemon=True)
            watcher.start()
            how = p["how"]
            if how == "clean":
                holder.cluster.stop("fast")
                holder.up = False
                self._start(holder)
            elif how == "clock_back":
                self._step_clock(holder, f"g{ev.seq}", p["ms"], p["down"])
            else:
                pids = (self._kill_node(holder) if how == "kill"
                        else signal_node(holder.cluster, signal.SIGSTOP))
                try:
                    if p.get("empty") and self.registry_lock.acquire(blocking=False):
                        try:
                            self.registry.restart_empty(0.1, p.get("ddl", False))
                            self.say(f"  handover #{ev.seq}: registry restarted empty")
                            if extra is not None:
                                # The other servers re-assert their claims (after the live
                                # nodes have, within a heartbeat); the holder's id is free.
                                time.sleep(self.plan.ttl_ms / 4000.0)
                                self.registry.occupy_free(
                                    self.plan.datacenter, f"temp-{ev.seq}",
                                    int((p["watch"] + 10) * 1000), worker)
                        finally:
                            self.registry_lock.release()
                    time.sleep(p["down"])
                finally:
                    if how == "freeze":
                        for pid in pids:
                            send(pid, signal.SIGCONT)
                if how == "kill":
                    self._start_after_kill(holder, pids)
        finally:
            holder.lock.release()
            if watcher is not None:
                watcher.join(p["watch"] + 15)
                done.set()
            if extra is not None:
                self.retire(extra[0])
                self.registry.free(self.plan.datacenter, f"temp-{ev.seq}")

    # registry faults
    def _with_registry(self, fn):
        # etcd and Sentinel have faults of one member that last seconds: a registry fault
        # waits a while for them rather than be skipped.
        wait = 8.0 if self.plan.registry in ("etcd", "sentinel") else 0
        if not self.registry_lock.acquire(timeout=wait) if wait else \
                not self.registry_lock.acquire(blocking=False):
            return "skipped: registry busy"
        try:
            return fn()
        finally:
            self.registry_lock.release()

    def do_registry_kill(self, ev):
        return self._with_registry(lambda: self.registry.restart_kill(ev.params["down"]))

    def do_registry_restart_clean(self, ev):
        return self._with_registry(lambda: self.registry.restart_clean(0.2))

    def do_registry_restart_empty(self, ev):
        return self._with_registry(
            lambda: self.registry.restart_empty(0.1, ev.params.get("ddl", False)))

    def do_registry_crash_unflushed(self, ev):
        def crash():
            walwriter = self.registry.stall_wal_writer() if ev.params["stall"] else None
            try:
                time.sleep(ev.params["stall"])
                self.registry.crash_unflushed(walwriter)
            finally:
                if walwriter:
                    send(walwriter, signal.SIGCONT)
        return self._with_registry(crash)

    def do_registry_snapshot(self, ev):
        def snap():
            if self.registry.snapshot() is None:
                return "skipped: copy failed"
        return self._with_registry(snap)

    def do_registry_restore_old(self, ev):
        def restore():
            copies = self.registry.copies
            if not copies:
                return "skipped: no copy"
            k = min(len(copies) - 1, int(ev.params["which"] * len(copies)))
            self.say(f"  registry: restoring copy {k} of {len(copies)}")
            self.registry.restore(copies[k], 0.2)
        return self._with_registry(restore)

    # etcd: one member
    def _etcd_member(self, ev, fault):
        def act():
            reg = self.registry
            i = reg.pick_member(ev.params["which"], ev.params["pick"])
            if not reg.member_running(i):
                return "skipped: member down"
            lead = reg.leader()
            self.say(f"  etcd: member {reg.names[i]} "
                     f"({'the leader' if i == lead else 'not the leader'}): {ev.kind}")
            return fault(reg, i)
        return self._with_registry(act)

    def do_etcd_member_kill(self, ev):
        return self._etcd_member(ev, lambda reg, i: reg.member_kill(i, ev.params["down"]))

    def do_etcd_member_stop(self, ev):
        return self._etcd_member(
            ev, lambda reg, i: None if reg.member_stop(i, ev.params["for"]) else "skipped: down")

    def do_etcd_member_restart(self, ev):
        return self._etcd_member(ev, lambda reg, i: reg.member_restart(i))

    # Sentinel
    def do_sentinel_master_kill(self, ev):
        return self._with_registry(lambda: self.registry.master_kill(ev.params["down"]))

    def do_sentinel_master_stop(self, ev):
        def stop():
            r = self.registry.master_stop(ev.params["for"])
            if isinstance(r, str):
                return r
            self.say(f"  sentinel: master {r} was frozen {ev.params['for']} s; now "
                     f"the sentinels name {self.registry.master()}")
        return self._with_registry(stop)

    def do_sentinel_kill(self, ev):
        # Not under the registry lock: a sentinel down may overlap a master's loss (quorum 2
        # of the 3; the nodes need 2 of 3 to name the master).
        if not self.sentinel_lock.acquire(blocking=False):
            return "skipped: a sentinel is down already"
        try:
            self.say(f"  sentinel: sentinel {ev.params['which']} SIGKILLed for "
                     f"{ev.params['down']} s")
            self.registry.sentinel_kill(ev.params["which"], ev.params["down"])
        finally:
            self.sentinel_lock.release()

    def do_sentinel_split_then_loss(self, ev):
        p = ev.params
        return self._with_registry(lambda: self.registry.split_then_loss(
            p["extra"], p["gap"], p["how"], p["down"], self.say))

    def do_sentinel_replica_kill(self, ev):
        return self._with_registry(lambda: self.registry.replica_kill(ev.params["down"]))

    def do_sentinel_failover(self, ev):
        def failover():
            before = self.registry.master()
            r = self.registry.failover()
            if r:
                return r
            self.registry._wait(lambda: self.registry.master() not in (None, before), 15, None)
            self.say(f"  sentinel: failover from {before} to {self.registry.master()}")
        return self._with_registry(failover)

    def do_registry_empty_then_clock(self, ev):
        r = self._with_registry(
            lambda: self.registry.restart_empty(0.1, ev.params.get("ddl", False)))
        if r:
            return r
        time.sleep(ev.params["after"])
        self._step_clock(self._node(ev), ev.seq, ev.params["ms"], ev.params["hold"])

    # -- the run ---------------------------------------------------------------------
    def play(self):
        p = self.plan
        self.say(p.text())
        self.fault_start = time.monotonic()
        threads = []
        for ev in p.events:
            delay = self.fault_start + ev.t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t = threading.Thread(target=self.run_event, args=(ev,), daemon=True)
            t.start()
            threads.append(t)
        left = self.fault_start + p.seconds - time.monotonic()
        if left > 0:
            time.sleep(left)
        deadline = time.monotonic() + 120
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            self.notes.append("some fault threads were still running at the end")

    def heal(self):
        """Every process continued, clocks back, every node and the registry running."""
        self.say("healing: SIGCONT everything, clocks back, everything started")
        with self.registry_lock:
            if not self.registry.running():
                try:
                    self.registry.start()
                except Exception as e:  # noqa: BLE001  (checked anyway; liveness reported)
                    self.notes.append(f"healing: the registry did not come back: {e}")
                    self.say(f"healing: the registry did not come back: {e}")
        for n in list(self.nodes.values()):
            if n.retired:
                continue
            with n.lock:
                for p in procs_in(n.cluster.data):
                    send(p, signal.SIGCONT)
                with n.clock_lock:
                    base = n.shifts.get("base", 0)
                    n.shifts.clear()
                    n.shifts["base"] = base
                    n.cluster.shift_clock_ms(n.offset())
                if not n.cluster.running():
                    self._start_after_kill(n, [])
        self.heal_at = time.monotonic_ns()

    def cooldown(self):
        """Waits until every live node issues again (or 10 claim_ttl), then stops the writers."""
        live = [n for n in self.nodes.values() if not n.retired]
        # Every live node issues again, but with fewer free ids than nodes some must wait.
        expected = min(len(live), self.plan.free_count)

        def issuing(n):
            return any(len(w.r_ack) and w.r_ack[-1] > self.heal_at for w in n.writers)
        wait_until(lambda: sum(1 for n in live if issuing(n)) >= expected,
                   timeout=10 * self.plan.ttl_ms / 1000.0, poll=0.1, fail=False)
        time.sleep(0.5)
        self.recovered = {n.name: issuing(n) for n in live}
        self.recovered_expected = expected
        for n in self.nodes.values():
            for w in n.writers:
                w.stop_event.set()
        for n in self.nodes.values():
            for w in n.writers:
                if w.ident is not None:
                    w.join(15)

    def teardown(self, remove):
        self.fakes_stop.set()
        if self.fake_thread is not None:
            self.fake_thread.join(5)
        for key in ("conn", "client"):
            c = getattr(self, "fake_state", {}).get(key)
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass
        for n in self.nodes.values():
            try:
                for p in procs_in(n.cluster.data):
                    send(p, signal.SIGCONT)
                n.cluster.stop("immediate")
                for p in procs_in(n.cluster.data):
                    send(p, signal.SIGKILL)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        if self.registry is not None:
            try:
                self.registry.close()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        for n in self.nodes.values():
            for w in n.writers:
                w.stop_event.set()
                try:
                    if w.ident is not None:
                        w.join(5)
                except Exception:  # noqa: BLE001
                    pass
        if remove:
            for n in self.nodes.values():
                shutil.rmtree(n.cluster.dir, ignore_errors=True)
                shutil.rmtree(f"{n.cluster.dir}-cold", ignore_errors=True)
            if isinstance(self.registry, ChaosCoordinator):
                shutil.rmtree(self.registry.cluster.dir, ignore_errors=True)
                shutil.rmtree(self.registry.copies_dir, ignore_errors=True)
            elif isinstance(self.registry, ChaosRedis):
                shutil.rmtree(self.registry.dir, ignore_errors=True)
            elif hasattr(self.registry, "remove"):
                self.registry.remove()

    def run(self):
        started = time.monotonic()
        _LIVE.add(self)
        ok = False
        try:
            self.setup()
            self.play()
            self.heal()
            self.cooldown()
            result = check(self)
            ok = result["ok"]
        finally:
            self.teardown(remove=not self.keep and ok)
            _LIVE.discard(self)
        result["wall_seconds"] = round(time.monotonic() - started, 1)
        if not ok:
            result["kept"] = harness.BASE
        return result


_LIVE = set()


def _cleanup_all():
    for s in list(_LIVE):
        try:
            s.teardown(remove=False)
        except Exception:  # noqa: BLE001
            pass


atexit.register(_cleanup_all)
