"""The chaos campaign: etcd (three members) and Redis Sentinel (a master, a replica, three
sentinels), with the faults the schedules inject into them."""

import base64
import http.client
import json
import math
import os
import shutil
import signal
import subprocess
import time
from collections import Counter

import harness
from fixtures.registries import free_ports, signal_process
from harness import wait_until

from .plan import WORKERS_PER_DC
from .processes import send
from .registries import FAKE_REDIS_LUA, FREE_REDIS_LUA, OCCUPY_REDIS_LUA, RespClient


def b64(text):
    return base64.b64encode(text.encode()).decode()


def unb64(text):
    return base64.b64decode(text).decode()


def prefix_end(prefix):
    """The range end that covers every key starting with `prefix` (etcd's --prefix)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class EtcdHttp:
    """etcd 3.4's JSON gateway on the client ports: POST /v3/... with base64 keys. Moves to
    the next member after a failed or timed-out request (a member killed or frozen)."""

    def __init__(self, ports, timeout=1.0):
        self.ports, self.timeout, self.k = list(ports), timeout, 0

    def call(self, path, body, tries=None):
        last = None
        for _ in range(tries or len(self.ports)):
            port = self.ports[self.k % len(self.ports)]
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=self.timeout)
                try:
                    conn.request("POST", path, json.dumps(body),
                                 {"Content-Type": "application/json"})
                    r = conn.getresponse()
                    data = json.loads(r.read() or b"{}")
                finally:
                    conn.close()
                if r.status != 200 or "error" in data:
                    raise RuntimeError(f"etcd {port} {path}: {r.status} {data}")
                return data
            except Exception as e:  # noqa: BLE001
                last = e
                self.k += 1
        raise last

    def grant(self, ttl_s):
        return self.call("/v3/lease/grant", {"TTL": int(ttl_s)})["ID"]

    def keepalive(self, lease):
        """Whether the lease still exists (and was renewed)."""
        r = self.call("/v3/lease/keepalive", {"ID": lease})
        return int(r.get("result", {}).get("TTL", 0)) > 0

    def revoke(self, lease):
        try:
            self.call("/v3/lease/revoke", {"ID": lease})
        except Exception:  # noqa: BLE001  (gone already)
            pass

    def range_prefix(self, prefix):
        r = self.call("/v3/kv/range", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))})
        return [{"key": unb64(kv["key"]), "value": unb64(kv.get("value", "")),
                 "lease": kv.get("lease", "0"), "mod": kv.get("mod_revision", "0")}
                for kv in r.get("kvs", [])]

    def put_if_absent(self, key, value, lease):
        r = self.call("/v3/kv/txn", {
            "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value), "lease": lease}}]})
        return bool(r.get("succeeded"))

    def put_if_mod(self, key, value, lease, mod):
        r = self.call("/v3/kv/txn", {
            "compare": [{"key": b64(key), "target": "MOD", "result": "EQUAL",
                         "mod_revision": str(mod)}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value), "lease": lease}}]})
        return bool(r.get("succeeded"))

    def delete_if_value(self, key, value):
        self.call("/v3/kv/txn", {
            "compare": [{"key": b64(key), "target": "VALUE", "result": "EQUAL",
                         "value": b64(value)}],
            "success": [{"request_delete_range": {"key": b64(key)}}]})

    def status(self, port):
        """(member id, leader id) as member `port` sees it."""
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=self.timeout)
        try:
            conn.request("POST", "/v3/maintenance/status", "{}",
                         {"Content-Type": "application/json"})
            data = json.loads(conn.getresponse().read() or b"{}")
        finally:
            conn.close()
        return data.get("header", {}).get("member_id"), data.get("leader")


class ChaosEtcd:
    """Three etcd members (Debian's etcd 3.4) on loopback, run as root, data under root.

    Elections: --heartbeat-interval 50 --election-timeout 500. A node fences claim_ttl / 2
    (1 s with claim_ttl = 2s) after its last renewal and renews every claim_ttl / 5; with
    etcd's defaults (100 ms / 1000 ms) a killed or frozen leader leaves the cluster without
    one for 1-2 s, longer than the fence, so every node would stop at each leader loss. With
    500 ms a new leader is elected within about 0.5-1 s (loopback round trips are far below
    the 50 ms heartbeat), so a member lost is what the README promises: nothing stops. (The
    minimum lease TTL, 1.5 election timeouts, is then below claim_ttl's 2 s.)

    Registry faults: the whole cluster SIGKILLed or stopped and started (data intact: etcd
    fsyncs its WAL), wiped and started empty on the same ports with the same cluster token
    (the same cluster id: only the missing PREFIX/fleet and the lower revision tell), or
    restored from an older `etcdctl snapshot save` (`snapshot restore` into fresh data
    directories, same names, ports and token); and one member killed, frozen or restarted."""

    kind = "etcd"
    PREFIX = "/snowflake"
    HEARTBEAT_MS = 50
    ELECTION_MS = 500

    def __init__(self, root):
        ports = free_ports(6)
        self.client_ports, self.peer_ports = ports[:3], ports[3:]
        self.dir = os.path.join(root, f"etcd{self.client_ports[0]}")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(os.path.join(self.dir, "copies"))
        self.names = ["e0", "e1", "e2"]
        self.token = f"snowflake-chaos-{self.client_ports[0]}"
        self.procs = [None, None, None]
        self.stopped = [False, False, False]
        self.copies = []
        self.http = EtcdHttp(self.client_ports)
        self.leases = {}  # occupy_free's token -> lease

    def uri(self):
        return "'etcd://" + ",".join(f"127.0.0.1:{p}" for p in self.client_ports) + "'"

    def data_dir(self, i):
        return os.path.join(self.dir, "data", self.names[i])

    def _spawn(self, i):
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports))
        client = f"http://127.0.0.1:{self.client_ports[i]}"
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        state = "existing" if os.path.isdir(os.path.join(self.data_dir(i), "member")) else "new"
        self.procs[i] = subprocess.Popen(
            ["etcd", "--name", self.names[i], "--data-dir", self.data_dir(i),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", initial, "--initial-cluster-token", self.token,
             "--initial-cluster-state", state,
             "--heartbeat-interval", str(self.HEARTBEAT_MS),
             "--election-timeout", str(self.ELECTION_MS),
             "--log-level", "warn", "--logger", "zap",
             "--log-outputs", os.path.join(self.dir, f"{self.names[i]}.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.stopped[i] = False

    def member_running(self, i):
        return self.procs[i] is not None and self.procs[i].poll() is None

    def running(self):
        return all(self.member_running(i) and not self.stopped[i] for i in range(3))

    def ready(self):
        """A linearizable read answers (a leader and a majority)."""
        try:
            self.http.call("/v3/kv/range", {"key": b64(self.PREFIX + "/fleet")}, tries=3)
            return True
        except Exception:  # noqa: BLE001
            return False

    def start(self, timeout=harness.HANG_GUARD):
        """Every member running (started if down, continued if frozen) and a leader."""
        for i in range(3):
            if self.member_running(i):
                if self.stopped[i]:
                    send(self.procs[i].pid, signal.SIGCONT)
                    self.stopped[i] = False
            else:
                self._spawn(i)
        if not wait_until(self.ready, timeout=timeout, fail=False):
            raise RuntimeError("etcd: no leader")

    def _signal(self, i, sig):
        signal_process(self.procs[i], sig)
        self.procs[i] = None
        self.stopped[i] = False

    def kill(self):
        for i in range(3):
            self._signal(i, signal.SIGKILL)

    def restart_kill(self, down):
        self.kill()
        time.sleep(down)
        self.start()

    def restart_clean(self, down):
        for i in range(3):
            self._signal(i, signal.SIGTERM)
        time.sleep(down)
        self.start()

    def restart_empty(self, down, ddl=False):
        self.kill()
        shutil.rmtree(os.path.join(self.dir, "data"), ignore_errors=True)
        time.sleep(down)
        self.start()

    def snapshot(self):
        path = os.path.join(self.dir, "copies", f"copy{len(self.copies)}.db")
        for port in self.client_ports:
            r = subprocess.run(["etcdctl", "--endpoints", f"127.0.0.1:{port}",
                                "--dial-timeout", "1s", "--command-timeout", "3s",
                                "snapshot", "save", path],
                               capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"},
                               timeout=20)
            if r.returncode == 0:
                self.copies.append(path)
                return path
        return None

    def restore(self, copy, down):
        self.kill()
        shutil.rmtree(os.path.join(self.dir, "data"), ignore_errors=True)
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports))
        for i in range(3):
            subprocess.run(["etcdctl", "snapshot", "restore", copy, "--name", self.names[i],
                            "--initial-cluster", initial, "--initial-cluster-token", self.token,
                            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
                            "--data-dir", self.data_dir(i)],
                           check=True, capture_output=True, env={**os.environ, "ETCDCTL_API": "3"})
        time.sleep(down)
        self.start()

    # one member
    def leader(self):
        """Index of the member the answering members name as leader, or None."""
        ids, leaders = {}, set()
        for i, port in enumerate(self.client_ports):
            if not self.member_running(i) or self.stopped[i]:
                continue
            try:
                mid, lead = self.http.status(port)
            except Exception:  # noqa: BLE001
                continue
            ids[mid] = i
            leaders.add(lead)
        found = [ids[x] for x in leaders if x in ids]
        return found[0] if len(found) == 1 else None

    def pick_member(self, which, pick):
        """The leader, or one of the other members (pick: 0 or 1)."""
        lead = self.leader()
        if which == "leader" and lead is not None:
            return lead
        others = [i for i in range(3) if i != lead]
        return others[pick % len(others)]

    def member_kill(self, i, down):
        self._signal(i, signal.SIGKILL)
        time.sleep(down)
        self._spawn(i)

    def member_stop(self, i, seconds):
        if not self.member_running(i):
            return False
        send(self.procs[i].pid, signal.SIGSTOP)
        self.stopped[i] = True
        try:
            time.sleep(seconds)
        finally:
            send(self.procs[i].pid, signal.SIGCONT)
            self.stopped[i] = False
        return True

    def member_restart(self, i):
        self._signal(i, signal.SIGTERM)
        time.sleep(0.2)
        self._spawn(i)

    # claims of other servers
    def _claims(self, datacenter):
        return f"{self.PREFIX}/claim/{datacenter}/"

    def make_tables(self):
        pass

    def refresh_fakes(self, state, datacenter, fake_ids, ttl_ms):
        """Fake live holders: key PREFIX/claim/DC/W = fake-W on one lease kept alive; the
        keys put again (on a new lease if it is gone) after a wipe or a restore."""
        try:
            lease = state.get("lease")
            if lease is not None and not self.http.keepalive(lease):
                lease = None
            if lease is None:
                lease = state["lease"] = self.http.grant(math.ceil(ttl_ms / 1000))
            prefix = self._claims(datacenter)
            have = {kv["key"]: kv for kv in self.http.range_prefix(prefix)}
            n = 0
            for w in fake_ids:
                key, token = f"{prefix}{w}", f"fake-{w}"
                kv = have.get(key)
                if kv is None:
                    n += self.http.put_if_absent(key, token, lease)
                elif kv["value"] == token and kv["lease"] != lease:
                    n += self.http.put_if_mod(key, token, lease, kv["mod"])
                elif kv["value"] == token:
                    n += 1
            return n
        except Exception:  # noqa: BLE001  (down, no leader, restarting: next round; a lost
            return None      # lease is found by the next keep-alive)

    def occupy_free(self, datacenter, token, ttl_ms, exclude=-1):
        try:
            lease = self.http.grant(max(1, math.ceil(ttl_ms / 1000)))
            self.leases.setdefault(token, []).append(lease)
            prefix = self._claims(datacenter)
            have = {kv["key"] for kv in self.http.range_prefix(prefix)}
            got = []
            for w in range(WORKERS_PER_DC):
                key = f"{prefix}{w}"
                if w != exclude and key not in have and self.http.put_if_absent(key, token, lease):
                    got.append(w)
            return got
        except Exception:  # noqa: BLE001
            return None

    def free(self, datacenter, token):
        try:
            for lease in self.leases.pop(token, []):
                self.http.revoke(lease)
            for kv in self.http.range_prefix(self._claims(datacenter)):
                if kv["value"] == token:
                    self.http.delete_if_value(kv["key"], token)
        except Exception:  # noqa: BLE001
            pass

    def close(self):
        self.kill()

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


SENTINEL_MASTER = "snowflake"


class ChaosSentinel:
    """A Redis master and a replica (redis-server 7, no automatic persistence: dumps by SAVE
    only, for copies and restores) watched by three redis-sentinel processes (quorum 2,
    down-after-milliseconds 800, failover-timeout 2000). Which server is the master changes
    with every failover: each fault asks the sentinels first.

    Registry faults (the generic kinds act on the current master): killed and started again
    from its last dump (as a master, whatever the sentinels did meanwhile: a stale master
    they demote), stopped cleanly and started, restarted empty, restarted from an older dump;
    and the Sentinel kinds: master SIGKILLed until the sentinels fail over, then started again
    empty as a replica of the new one; master SIGSTOPped (past the failover: a split brain
    when it continues, a master no majority names), a sentinel killed, the replica killed,
    and a manual SENTINEL FAILOVER."""

    kind = "sentinel"
    DOWN_AFTER_MS = 800
    FAILOVER_TIMEOUT_MS = 2000

    def __init__(self, root):
        ports = free_ports(5)
        self.server_ports, self.sentinel_ports = ports[:2], ports[2:]
        self.dir = os.path.join(root, f"sentinel{ports[0]}")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(os.path.join(self.dir, "copies"))
        self.procs = {}    # port -> Popen (servers and sentinels)
        self.stopped = set()
        self.copies = []
        self.started = False

    def uri(self):
        return ("'redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
                + f"/{SENTINEL_MASTER}'")

    def sdir(self, port):
        d = os.path.join(self.dir, str(port))
        os.makedirs(d, exist_ok=True)
        return d

    def dump(self, port):
        return os.path.join(self.sdir(port), "dump.rdb")

    def alive(self, port):
        p = self.procs.get(port)
        return p is not None and p.poll() is None

    def call(self, port, *args, timeout=1.0):
        c = RespClient(port, timeout=timeout)
        try:
            return c.call(*args)
        finally:
            c.close()

    def try_call(self, port, *args, timeout=1.0):
        try:
            return self.call(port, *args, timeout=timeout)
        except Exception:  # noqa: BLE001
            return None

    def _wait(self, cond, timeout, what):
        if wait_until(cond, timeout=timeout, fail=False):
            return True
        if what:
            raise RuntimeError(f"sentinel set: {what}")
        return False

    def _spawn_server(self, port, replica_of=None, empty=False):
        if empty and os.path.exists(self.dump(port)):
            os.remove(self.dump(port))
        log = os.path.join(self.sdir(port), "redis.log")
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--daemonize", "no", "--dir", self.sdir(port),
               "--dbfilename", "dump.rdb", "--logfile", log,
               "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        if replica_of:
            cmd += ["--replicaof", "127.0.0.1", str(replica_of)]
        self.procs[port] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
        self.stopped.discard(port)
        self._wait(lambda: self.try_call(port, "PING") == "PONG", harness.HANG_GUARD,
                   f"redis {port} did not start")

    def _spawn_sentinel(self, port, master_port):
        d = self.sdir(port)
        conf = os.path.join(d, "sentinel.conf")
        if not os.path.exists(conf):  # later starts: the file the sentinel rewrote
            with open(conf, "w") as f:
                f.write("\n".join([
                    "bind 127.0.0.1", f"port {port}", "daemonize no", f"dir {d}",
                    f"logfile {os.path.join(d, 'sentinel.log')}",
                    f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 2",
                    f"sentinel down-after-milliseconds {SENTINEL_MASTER} {self.DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {SENTINEL_MASTER} {self.FAILOVER_TIMEOUT_MS}",
                    f"sentinel parallel-syncs {SENTINEL_MASTER} 1", ""]))
        self.procs[port] = subprocess.Popen(["redis-sentinel", conf], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
        self.stopped.discard(port)
        self._wait(lambda: self.try_call(port, "PING") == "PONG", harness.HANG_GUARD,
                   f"sentinel {port} did not start")

    def named(self, port):
        r = self.try_call(port, "SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER,
                          timeout=0.5)
        return int(r[1]) if isinstance(r, list) and len(r) == 2 else None

    def master(self):
        """The master a majority of the sentinels name, or None."""
        votes = Counter(self.named(p) for p in self.sentinel_ports
                        if self.alive(p) and p not in self.stopped)
        votes.pop(None, None)
        for port, n in votes.items():
            if n >= 2:
                return port
        return None

    def role(self, port):
        r = self.try_call(port, "ROLE", timeout=0.5)
        return r[0] if isinstance(r, list) and r else None

    def healthy(self):
        m = self.master()
        return m is not None and self.alive(m) and m not in self.stopped \
            and self.role(m) == "master"

    def other(self, port):
        return next(p for p in self.server_ports if p != port)

    def start(self, timeout=harness.HANG_GUARD):
        """First: master, replica in sync, sentinels knowing both and each other. Later
        (healing): every process continued or started again, until a majority names a
        master that says it is one."""
        if not self.started:
            a, b = self.server_ports
            self._spawn_server(a)
            self._spawn_server(b, replica_of=a)
            self._wait(lambda: "master_link_status:up" in (self.try_call(b, "INFO", "replication")
                                                           or ""), 20, "replica not in sync")
            for s in self.sentinel_ports:
                self._spawn_sentinel(s, a)

            def known():
                for s in self.sentinel_ports:
                    r = self.try_call(s, "SENTINEL", "MASTER", SENTINEL_MASTER)
                    m = dict(zip(r[0::2], r[1::2])) if isinstance(r, list) else {}
                    if int(m.get("num-other-sentinels", 0)) < 2 or int(m.get("num-slaves", 0)) < 1:
                        return False
                return True
            self._wait(known, timeout, "the sentinels do not know each other")
            self.started = True
            return
        for port in list(self.stopped):
            if self.alive(port):
                send(self.procs[port].pid, signal.SIGCONT)
            self.stopped.discard(port)
        for s in self.sentinel_ports:
            if not self.alive(s):
                self._spawn_sentinel(s, self.server_ports[0])
        for port in self.server_ports:
            if not self.alive(port):
                m = self.master()
                self._spawn_server(port, replica_of=m if m and m != port else None,
                                   empty=bool(m and m != port))
        if not self._wait(self.healthy, timeout, None):
            self.rebuild()
        if not self._wait(self.healthy, timeout, None):
            raise RuntimeError(f"sentinel set: no master after healing "
                               f"(sentinels name {[self.named(p) for p in self.sentinel_ports]}, "
                               f"roles {[self.role(p) for p in self.server_ports]})")

    def rebuild(self):
        """Last resort of healing: a server that says it is a master (or the first) made the
        master, the other its replica, and every sentinel told to monitor it afresh."""
        m = next((p for p in self.server_ports if self.role(p) == "master"), self.server_ports[0])
        self.try_call(m, "REPLICAOF", "NO", "ONE")
        self.try_call(self.other(m), "REPLICAOF", "127.0.0.1", str(m))
        for s in self.sentinel_ports:
            self.try_call(s, "SENTINEL", "REMOVE", SENTINEL_MASTER)
            self.try_call(s, "SENTINEL", "MONITOR", SENTINEL_MASTER, "127.0.0.1", str(m), "2")
            for k, v in (("down-after-milliseconds", self.DOWN_AFTER_MS),
                         ("failover-timeout", self.FAILOVER_TIMEOUT_MS), ("parallel-syncs", 1)):
                self.try_call(s, "SENTINEL", "SET", SENTINEL_MASTER, k, str(v))

    def running(self):
        return all(self.alive(p) for p in self.server_ports + self.sentinel_ports) \
            and not self.stopped

    def _kill(self, port, sig=signal.SIGKILL):
        signal_process(self.procs.get(port), sig)
        self.procs[port] = None
        self.stopped.discard(port)

    def current_master(self):
        """The sentinels' master, or (no majority) a server that says it is one."""
        m = self.master()
        if m is None:
            m = next((p for p in self.server_ports if self.role(p) == "master"), None)
        return m

    def kill(self):
        m = self.current_master()
        if m:
            self._kill(m)

    # the generic registry faults, on the master
    def restart_kill(self, down):
        m = self.current_master()
        if m is None:
            return "skipped: no master"
        self._kill(m)
        time.sleep(down)
        self._spawn_server(m)  # from its last dump, as a master

    def restart_clean(self, down):
        m = self.current_master()
        if m is None:
            return "skipped: no master"
        self.try_call(m, "SAVE", timeout=5)
        self._kill(m, signal.SIGTERM)
        time.sleep(down)
        self._spawn_server(m)

    def restart_empty(self, down, ddl=False):
        m = self.current_master()
        if m is None:
            return "skipped: no master"
        self._kill(m)
        time.sleep(down)
        self._spawn_server(m, empty=True)

    def save(self, port):
        return self.try_call(port, "SAVE", timeout=5) == "OK"

    def snapshot(self):
        m = self.current_master()
        if m is None or not self.save(m):
            return None
        path = os.path.join(self.dir, "copies", f"copy{len(self.copies)}.rdb")
        shutil.copyfile(self.dump(m), path)
        self.copies.append(path)
        return path

    def restore(self, copy, down):
        m = self.current_master()
        if m is None:
            return "skipped: no master"
        self._kill(m)
        shutil.copyfile(copy, self.dump(m))
        time.sleep(down)
        self._spawn_server(m)

    # the Sentinel faults
    def master_kill(self, down, timeout=20):
        """SIGKILL of the master; once the sentinels name the other server (or after
        `timeout`) and `down` seconds more, the old master starts again empty as a replica
        of the new one (or, no failover, from its dump as the master)."""
        m = self.current_master()
        if m is None:
            return "skipped: no master"
        self._kill(m)
        failed_over = self._wait(lambda: self.master() not in (None, m), timeout, None)
        time.sleep(down)
        new = self.master()
        if failed_over and new not in (None, m):
            self._spawn_server(m, replica_of=new, empty=True)
            return None
        self._spawn_server(m)
        return "failed: no failover within 20 s; the old master started again"

    def master_stop(self, seconds):
        m = self.current_master()
        if m is None or not self.alive(m):
            return "skipped: no master"
        send(self.procs[m].pid, signal.SIGSTOP)
        self.stopped.add(m)
        try:
            time.sleep(seconds)
        finally:
            send(self.procs[m].pid, signal.SIGCONT)
            self.stopped.discard(m)
        return m

    def split_then_loss(self, extra, gap, how, down, say):
        """The master frozen until a majority names the other server, `extra` s more, then
        continued: a master that still says it is one, with the data of its freeze. `gap` s
        later the new master is lost. how = kill: SIGKILLed; once the sentinels name a master
        again (often the stale one, which they have not demoted yet) and `down` s more, it
        starts again empty as a replica. restart: SIGKILLed and started again at once from
        its dump (a new run_id: holders re-assert there; the sentinels may still fail over).
        failover: SENTINEL FAILOVER (to the stale one, the only other server)."""
        old = self.current_master()
        if old is None or not self.alive(old):
            return "skipped: no master"
        send(self.procs[old].pid, signal.SIGSTOP)
        self.stopped.add(old)
        try:
            failed_over = self._wait(lambda: self.master() not in (None, old), 20, None)
            time.sleep(extra)
        finally:
            send(self.procs[old].pid, signal.SIGCONT)
            self.stopped.discard(old)
        if not failed_over:
            return "skipped: no failover while the master was frozen"
        time.sleep(gap)
        new = self.master()
        if new in (None, old) or not self.alive(new):
            return f"skipped: the sentinels name {new} again already"
        roles = {p: self.role(p) for p in self.server_ports}
        if how == "failover":
            r = self.failover()
            self._wait(lambda: self.master() not in (None, new), 10, None)
            say(f"  sentinel: {old} frozen until the failover to {new}, continued (roles then "
                f"{roles}); SENTINEL FAILOVER {gap} s later: {r or 'started'}; now the "
                f"sentinels name {self.master()}")
            return None
        self._kill(new)
        if how == "restart":
            self._spawn_server(new)
            time.sleep(3.0)
            say(f"  sentinel: {old} frozen until the failover to {new}, continued (roles then "
                f"{roles}); {new} killed and started again {gap} s later; now the sentinels "
                f"name {self.master()}")
            return None
        self._wait(lambda: self.master() not in (None, new), 20, None)
        say(f"  sentinel: {old} frozen until the failover to {new}, continued (roles then "
            f"{roles}), {new} SIGKILLed {gap} s later; now the sentinels name {self.master()}")
        time.sleep(down)
        m = self.master()
        self._spawn_server(new, replica_of=m if m not in (None, new) else None,
                           empty=m not in (None, new))
        return None

    def sentinel_kill(self, k, down):
        port = self.sentinel_ports[k % 3]
        self._kill(port)
        time.sleep(down)
        self._spawn_sentinel(port, self.server_ports[0])

    def replica_kill(self, down):
        m = self.current_master()
        if m is None:
            return "skipped: no master"
        r = self.other(m)
        self._kill(r)
        time.sleep(down)
        m = self.current_master() or m
        self._spawn_server(r, replica_of=m if m != r else None, empty=m != r)

    def failover(self):
        for s in self.sentinel_ports:
            r = self.try_call(s, "SENTINEL", "FAILOVER", SENTINEL_MASTER, timeout=2)
            if r == "OK":
                return None
        return "skipped: no sentinel started a failover"

    # claims of other servers, on the master the sentinels name
    def _client(self, state):
        """A connection to the master the first answering sentinel names."""
        for s in self.sentinel_ports:
            if not self.alive(s) or s in self.stopped:
                continue
            port = self.named(s)
            if port is None:
                continue
            client = state.get("client")
            if client is not None and state.get("port") == port:
                return client
            if client is not None:
                client.close()
            state["client"], state["port"] = RespClient(port), port
            return state["client"]
        raise ConnectionError("no sentinel names a master")

    def refresh_fakes(self, state, datacenter, fake_ids, ttl_ms):
        try:
            client = self._client(state)
            keys = [f"snowflake:claim:{datacenter}:{w}" for w in fake_ids]
            tokens = [f"fake-{w}" for w in fake_ids]
            return client.call("EVAL", FAKE_REDIS_LUA, len(keys), *keys, ttl_ms, *tokens)
        except Exception:  # noqa: BLE001
            c = state.pop("client", None)
            if c is not None:
                c.close()
            return None

    def _eval(self, script, datacenter, *args):
        keys = [f"snowflake:claim:{datacenter}:{w}" for w in range(WORKERS_PER_DC)]
        state = {}
        try:
            return self._client(state).call("EVAL", script, len(keys), *keys, *args)
        except Exception:  # noqa: BLE001
            return None
        finally:
            if state.get("client") is not None:
                state["client"].close()

    def occupy_free(self, datacenter, token, ttl_ms, exclude=-1):
        return self._eval(OCCUPY_REDIS_LUA, datacenter, token, ttl_ms, exclude)

    def free(self, datacenter, token):
        self._eval(FREE_REDIS_LUA, datacenter, token)

    def make_tables(self):
        pass

    def close(self):
        for port in self.sentinel_ports + self.server_ports:
            self._kill(port)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)
