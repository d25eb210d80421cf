"""Real registry servers on loopback for the registry tests: a three-member etcd cluster, a
Redis master and replica watched by three Sentinels, a PostgreSQL coordinator with a
streaming standby, and test certificates made with the openssl CLI.

Every fixture takes free ports, keeps its files under harness.BASE, and has start/stop and
the faults its scenarios inject (SIGKILL, SIGSTOP/SIGCONT, a failover, a restart from
empty). etcd and Redis run as root (they do not mind); PostgreSQL runs as the postgres OS
user (harness.Cluster). Waits poll the real state (etcdctl, redis-cli, psql) with a
deadline: no fixed sleeps stand for "the server is up".
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid

from harness import BASE, HANG_GUARD, Cluster, wait_until
from ports import free_port, free_ports  # noqa: F401 (the fixtures' ports; re-exported)


# --------------------------------------------------------------------------------------
# ports, processes, files

def port_open(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class ServerExited(AssertionError):
    """A test server exited by itself while a fixture waited for it."""


def wait_started(proc, ready, what, log_path=None, timeout=HANG_GUARD):
    """Waits until the server `proc` is `ready()`. Fails at once if it exits first, with its
    exit code and log tail: a server that cannot bind its port exits, and a wait for it
    would only time out (or, worse, be answered by whatever holds that port)."""
    def check():
        if proc.poll() is not None:
            tail = ""
            if log_path:
                try:
                    with open(log_path, errors="replace") as f:
                        tail = "\n" + "".join(f.readlines()[-15:])
                except OSError as e:
                    tail = f" (no log: {e})"
            raise ServerExited(f"{what} exited by itself (exit code {proc.returncode}){tail}")
        return ready()
    wait_until(check, timeout=timeout, what=what)


def signal_process(proc, sig=signal.SIGKILL, timeout=15):
    """Signals a Popen if it still runs, continuing it first (a stopped process must see its
    SIGTERM). After SIGKILL or SIGTERM it is reaped: a SIGTERM not obeyed within `timeout`
    seconds becomes a SIGKILL, so no caller waits forever on a wedged server."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        proc.send_signal(sig)
    except ProcessLookupError:
        return
    if sig in (signal.SIGKILL, signal.SIGTERM):
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def postgres_readable(path, mode):
    """Gives a file to the postgres OS user with `mode` (keys 0600, certificates 0644)."""
    shutil.chown(path, "postgres", "postgres")
    os.chmod(path, mode)


def write_password_file(path, password):
    """A password file as snowflake.registry_password_file expects it: the password on one
    line, mode 0600, owned by postgres."""
    with open(path, "w") as f:
        f.write(password + "\n")
    postgres_readable(path, 0o600)
    return path


# --------------------------------------------------------------------------------------
# certificates

class TestCA:
    """Paths made by make_test_ca."""

    def __init__(self, **paths):
        self.__dict__.update(paths)

    def __repr__(self):
        return f"TestCA({self.__dict__})"


def make_test_ca(directory):
    """A CA, a server certificate it signs for CN 127.0.0.1 (SAN IP 127.0.0.1, DNS
    localhost), and a second, unrelated CA (for "wrong CA" tests), with the openssl CLI.
    Returns a TestCA with ca, ca_key, server_cert, server_key, wrong_ca (paths). Everything
    is readable by the postgres OS user; the keys are its own, mode 0600 (PostgreSQL's
    ssl_key_file demands that)."""
    d = _fresh(directory)
    shutil.chown(d, "postgres", "postgres")
    p = {name: os.path.join(d, name) for name in
         ("ca.pem", "ca.key", "server.pem", "server.key", "server.csr", "san.cnf",
          "wrong-ca.pem", "wrong-ca.key")}

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    for cert, key, cn in ((p["ca.pem"], p["ca.key"], "snowflake test CA"),
                          (p["wrong-ca.pem"], p["wrong-ca.key"], "snowflake unrelated CA")):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
            "-days", "2", "-subj", f"/CN={cn}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    with open(p["san.cnf"], "w") as f:
        f.write("basicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth,clientAuth\n"
                "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", p["server.key"], "-out",
        p["server.csr"], "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", p["server.csr"], "-CA", p["ca.pem"], "-CAkey", p["ca.key"],
        "-CAcreateserial", "-out", p["server.pem"], "-days", "2", "-extfile", p["san.cnf"])
    for name in os.listdir(d):
        path = os.path.join(d, name)
        postgres_readable(path, 0o600 if name.endswith(".key") else 0o644)
    return TestCA(dir=d, ca=p["ca.pem"], ca_key=p["ca.key"], server_cert=p["server.pem"],
                  server_key=p["server.key"], wrong_ca=p["wrong-ca.pem"])


# --------------------------------------------------------------------------------------
# etcd

class EtcdCluster:
    """n etcd members (Debian's etcd-server 3.4) on loopback, data under BASE. Default
    heartbeat (100 ms) and election timeout (1 s) unless given. tls: a TestCA; then clients
    use https (peers stay on plain http, on loopback)."""

    def __init__(self, n=3, tls=None, prefix=None, heartbeat_ms=None, election_ms=None):
        self.n = n
        self.tls = tls
        self.prefix = prefix
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        ports = free_ports(2 * n)
        self.client_ports = ports[:n]
        self.peer_ports = ports[n:]
        self.dir = os.path.join(BASE, f"etcd{self.client_ports[0]}")
        self.procs = [None] * n
        self.token = None
        self.names = [f"m{i}" for i in range(n)]
        self.auth = None  # (user, password) once enable_auth ran: etcdctl uses root

    # -- addresses ---------------------------------------------------------------------
    @property
    def scheme(self):
        return "https" if self.tls else "http"

    def endpoints(self, members=None):
        members = range(self.n) if members is None else members
        return [f"127.0.0.1:{self.client_ports[i]}" for i in members]

    def uri(self, user=None):
        base = ("etcds" if self.tls else "etcd") + "://"
        if user:
            base += f"{user}@"
        base += ",".join(self.endpoints())
        if self.prefix:
            base += self.prefix
        return base

    def data_dir(self, i):
        return os.path.join(self.dir, self.names[i])

    # -- lifecycle ---------------------------------------------------------------------
    def _spawn(self, i, state):
        initial = ",".join(f"{self.names[j]}=http://127.0.0.1:{self.peer_ports[j]}"
                           for j in range(self.n))
        client = f"{self.scheme}://127.0.0.1:{self.client_ports[i]}"
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        cmd = ["etcd", "--name", self.names[i], "--data-dir", self.data_dir(i),
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", initial, "--initial-cluster-token", self.token,
               "--initial-cluster-state", state, "--log-level", "warn", "--logger", "zap",
               "--log-outputs", os.path.join(self.dir, f"{self.names[i]}.log")]
        if self.heartbeat_ms:
            cmd += ["--heartbeat-interval", str(self.heartbeat_ms)]
        if self.election_ms:
            cmd += ["--election-timeout", str(self.election_ms)]
        if self.tls:
            cmd += ["--cert-file", self.tls.server_cert, "--key-file", self.tls.server_key]
        self.procs[i] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)

    def start(self, timeout=HANG_GUARD):
        """A new cluster (a new --initial-cluster-token) on empty data directories."""
        os.makedirs(BASE, exist_ok=True)
        _fresh(self.dir)
        self.token = f"snowflake-{uuid.uuid4().hex[:12]}"
        for i in range(self.n):
            self._spawn(i, "new")
        self.wait_healthy(timeout=timeout)
        return self

    def wait_healthy(self, members=None, timeout=HANG_GUARD):
        """Waits until every listed member (default: every one not killed on purpose)
        answers and the cluster has a leader. A member that exited by itself counts, so
        that the wait fails at once rather than settle for the others."""
        if members is None:
            members = [i for i in range(self.n) if self.procs[i] is not None]

        def healthy():
            r = self.etcdctl("endpoint", "health", endpoints=self.endpoints(members),
                             check=False, timeout=5)
            return r.returncode == 0 and self.leader(check=False) is not None
        self.wait_for(healthy, members, f"etcd members {members} healthy", timeout)

    def wait_for(self, condition, members, what, timeout=HANG_GUARD):
        """Waits until `condition()`. Fails at once if one of `members` exited by itself (a
        member that cannot bind its ports exits: waiting for it would only time out); both
        that failure and a timeout carry what the members say (`diagnosis`)."""
        def check():
            gone = {i: self.procs[i].returncode for i in members
                    if self.procs[i] is not None and self.procs[i].poll() is not None}
            if gone:
                raise ServerExited(f"etcd member(s) exited by themselves (index: exit code) "
                                   f"{gone}; ports client {self.client_ports} peer "
                                   f"{self.peer_ports}\n{self.diagnosis()}")
            return condition()
        try:
            wait_until(check, timeout=timeout, what=what)
        except ServerExited:
            raise
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.diagnosis()}") from None

    def running(self, i):
        return self.procs[i] is not None and self.procs[i].poll() is None

    def kill(self, i):
        """SIGKILL of member i."""
        signal_process(self.procs[i], signal.SIGKILL)
        self.procs[i] = None

    def stop(self, i):
        """SIGSTOP of member i: its sockets stay open, nothing answers."""
        os.kill(self.procs[i].pid, signal.SIGSTOP)

    def cont(self, i):
        os.kill(self.procs[i].pid, signal.SIGCONT)

    def restart(self, i, timeout=HANG_GUARD):
        """Starts member i again on its data directory (after kill), or kills and restarts it."""
        if self.running(i):
            self.kill(i)
        self._spawn(i, "existing")
        self.wait_healthy(timeout=timeout)

    def wipe_and_restart_all(self, timeout=HANG_GUARD):
        """Every member SIGKILLed, every data directory deleted, a new empty cluster on the
        same ports: a registry that restarted empty."""
        for i in range(self.n):
            self.kill(i)
        self.auth = None
        self.start(timeout=timeout)

    def snapshot(self, name="snap.db"):
        """`etcdctl snapshot save` from member 0; returns the file."""
        path = os.path.join(self.dir, name)
        self.etcdctl("snapshot", "save", path, endpoints=self.endpoints([0]))
        return path

    def restore_all(self, snapshot, timeout=HANG_GUARD):
        """The whole cluster restored from `snapshot`, as an operator restores a backup:
        prepare_restore, then swap_restored."""
        self.swap_restored(self.prepare_restore(snapshot), timeout=timeout)

    def prepare_restore(self, snapshot):
        """`etcdctl snapshot restore` of `snapshot` into fresh data directories beside the
        members' (same names and ports, a new cluster token), done ahead when a test needs
        the restore itself to be only the members' restart (swap_restored). Returns the
        token."""
        token = f"snowflake-restored-{uuid.uuid4().hex[:8]}"
        initial = ",".join(f"{self.names[j]}=http://127.0.0.1:{self.peer_ports[j]}"
                           for j in range(self.n))
        for i in range(self.n):
            target = self.data_dir(i) + ".restored"
            shutil.rmtree(target, ignore_errors=True)
            r = subprocess.run(
                ["etcdctl", "snapshot", "restore", snapshot, "--name", self.names[i],
                 "--initial-cluster", initial, "--initial-cluster-token", token,
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
                 "--data-dir", target],
                capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
            if r.returncode != 0:
                raise RuntimeError(f"etcdctl snapshot restore: {r.stderr}")
        return token

    def swap_restored(self, token, timeout=HANG_GUARD):
        """Every member SIGKILLed, the directories prepare_restore made swapped in, the
        members started, and a wait until the cluster is healthy."""
        for i in range(self.n):
            self.kill(i)
        for i in range(self.n):
            shutil.rmtree(self.data_dir(i), ignore_errors=True)
            os.rename(self.data_dir(i) + ".restored", self.data_dir(i))
        self.token = token
        for i in range(self.n):
            self._spawn(i, "existing")
        self.wait_healthy(timeout=timeout)

    def close(self):
        """Kills every member and removes the data directories."""
        for i in range(self.n):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- client ------------------------------------------------------------------------
    def etcdctl(self, *args, endpoints=None, check=True, timeout=15, json_out=False):
        cmd = ["etcdctl", "--endpoints", ",".join(endpoints or self.endpoints()),
               "--dial-timeout", "2s", "--command-timeout", "5s"]
        if self.tls:
            cmd += ["--cacert", self.tls.ca]
        if self.auth:
            cmd += ["--user", f"{self.auth[0]}:{self.auth[1]}"]
        if json_out:
            cmd += ["-w", "json"]
        try:
            r = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout,
                               env={**os.environ, "ETCDCTL_API": "3"})
        except subprocess.TimeoutExpired as e:
            r = subprocess.CompletedProcess(e.cmd, 124, "", "timeout")
        if check and r.returncode != 0:
            raise AssertionError(f"etcdctl {args}: {r.stdout}{r.stderr}")
        return r

    def status(self, members=None, timeout=4):
        """{member index: endpoint status dict} for the members that answer, of `members`
        (default: every running one), each asked for at most `timeout` s."""
        live = [i for i in range(self.n) if self.running(i)] if members is None else members
        out = {}
        for i in live:  # one by one: a stopped member must not hide the others
            r = self.etcdctl("endpoint", "status", endpoints=self.endpoints([i]), check=False,
                             json_out=True, timeout=timeout)
            if r.returncode == 0:
                try:
                    out[i] = json.loads(r.stdout)[0]["Status"]
                except (ValueError, KeyError, IndexError):
                    pass
        return out

    def diagnosis(self, lines=15):
        """What each member says (its endpoint status, the tail of its log), for a wait that
        timed out: a stress run once waited 120 s for an election in vain, and the cluster
        was gone before anyone could look (issue 37)."""
        out = [f"status: {self.status()}"]
        for name in self.names:
            path = os.path.join(self.dir, f"{name}.log")
            try:
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-lines:]
            except OSError as e:
                tail = [f"({e})\n"]
            out.append(f"--- {name}.log\n" + "".join(tail))
        return "\n".join(out)

    def leader(self, check=True):
        """Index of the member that leads (as the answering members agree), or None."""
        status = self.status()
        ids = {s["header"]["member_id"]: i for i, s in status.items()}
        leaders = {s.get("leader") for s in status.values()}
        found = [ids[lead] for lead in leaders if lead in ids]
        if len(found) == 1 and len(leaders) == 1:
            return found[0]
        if check:
            raise AssertionError(f"etcd: no single leader: {status}")
        return None

    def member_id(self, i):
        """Member i's id (as etcd reports it in its status header)."""
        return self.status()[i]["header"]["member_id"]

    def move_leader(self, i, timeout=HANG_GUARD):
        """Makes member i the leader (etcdctl move-leader, sent to the current leader)."""
        leader = self.leader()
        if leader == i:
            return
        self.etcdctl("move-leader", format(self.member_id(i), "x"),
                     endpoints=self.endpoints([leader]))
        wait_until(lambda: self.leader(check=False) == i, timeout=timeout,
                   what=f"etcd member m{i} to lead")

    def cluster_id(self):
        for s in self.status().values():
            return s["header"]["cluster_id"]
        return None

    def enable_auth(self, user, password, prefix="/snowflake"):
        """Auth on: root (password 'rootpw') and `user` with a read-write role on `prefix`.
        The registry's lease calls need no extra permission."""
        self.etcdctl("user", "add", "root:rootpw")
        self.etcdctl("role", "add", "root")
        self.etcdctl("user", "grant-role", "root", "root")
        self.etcdctl("role", "add", "snowflake")
        self.etcdctl("role", "grant-permission", "snowflake", "--prefix=true", "readwrite", prefix)
        self.etcdctl("user", "add", f"{user}:{password}")
        self.etcdctl("user", "grant-role", user, "snowflake")
        self.etcdctl("auth", "enable")
        self.auth = ("root", "rootpw")


# --------------------------------------------------------------------------------------
# Redis with Sentinel

MASTER_NAME = "snowflake"


class _RedisProc:
    def __init__(self, port, directory):
        self.port = port
        self.dir = directory
        self.proc = None


class SentinelSet:
    """A Redis master and one replica (no persistence) and three Sentinels watching master
    `snowflake` (quorum 2, down-after 1 s, failover-timeout 3 s). tls: a TestCA; then every
    server and Sentinel listens on TLS only (--port 0), replication and Sentinel's links use
    TLS. password: requirepass on the data servers (Sentinels know it through auth-pass)
    and on the Sentinels (sentinel-pass between them): the node sends the master's password
    only to an address that authenticated sentinels name, or over TLS (issue 35)."""

    def __init__(self, tls=None, password=None, down_after_ms=1000, failover_timeout_ms=3000):
        self.tls = tls
        self.password = password
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        ports = free_ports(5)
        self.dir = os.path.join(BASE, f"sentinel{ports[0]}")
        self.servers = [_RedisProc(p, os.path.join(self.dir, f"redis{p}")) for p in ports[:2]]
        self.sentinels = [_RedisProc(p, os.path.join(self.dir, f"sentinel{p}")) for p in ports[2:]]
        self.killed = None  # the server kill_master killed

    def uri(self, db=None):
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"{scheme}://{hosts}/{MASTER_NAME}" + (f"/{db}" if db is not None else "")

    # -- lifecycle ---------------------------------------------------------------------
    def _tls_args(self):
        t = self.tls
        return ["--tls-cert-file", t.server_cert, "--tls-key-file", t.server_key,
                "--tls-ca-cert-file", t.ca, "--tls-auth-clients", "no"]

    def _spawn_server(self, s, replica_of=None):
        os.makedirs(s.dir, exist_ok=True)
        cmd = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--daemonize", "no", "--dir", s.dir, "--logfile", os.path.join(s.dir, "log"),
               "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        if self.tls:
            cmd += ["--port", "0", "--tls-port", str(s.port), "--tls-replication", "yes"]
            cmd += self._tls_args()
        else:
            cmd += ["--port", str(s.port)]
        if self.password:
            cmd += ["--requirepass", self.password, "--masterauth", self.password]
        if replica_of:
            cmd += ["--replicaof", "127.0.0.1", str(replica_of)]
        s.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_started(s.proc, lambda: self.cli(s.port, "PING", check=False) == "PONG",
                     f"redis-server {s.port}", os.path.join(s.dir, "log"))

    def _spawn_sentinel(self, s, master_port):
        os.makedirs(s.dir, exist_ok=True)
        conf = os.path.join(s.dir, "sentinel.conf")  # Sentinel rewrites it: its own copy
        lines = ["bind 127.0.0.1", "daemonize no", f"dir {s.dir}",
                 f"logfile {os.path.join(s.dir, 'log')}"]
        if self.tls:
            lines += ["port 0", f"tls-port {s.port}", "tls-replication yes",
                      f"tls-cert-file {self.tls.server_cert}",
                      f"tls-key-file {self.tls.server_key}",
                      f"tls-ca-cert-file {self.tls.ca}", "tls-auth-clients no"]
        else:
            lines += [f"port {s.port}"]
        lines += [f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2",
                  f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
                  f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}",
                  f"sentinel parallel-syncs {MASTER_NAME} 1"]
        if self.password:
            lines += [f"sentinel auth-pass {MASTER_NAME} {self.password}",
                      f"requirepass {self.password}", f"sentinel sentinel-pass {self.password}"]
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(conf, 0o644)
        s.proc = subprocess.Popen(["redis-sentinel", conf], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_started(s.proc, lambda: self.cli(s.port, "PING", check=False, sentinel=True) == "PONG",
                     f"redis-sentinel {s.port}", os.path.join(s.dir, "log"))

    def start(self, timeout=HANG_GUARD):
        os.makedirs(BASE, exist_ok=True)
        _fresh(self.dir)
        master, replica = self.servers
        self._spawn_server(master)
        self._spawn_server(replica, replica_of=master.port)
        self.wait_replica_synced(replica.port, master.port)
        for s in self.sentinels:
            self._spawn_sentinel(s, master.port)
        self.wait_sentinels_ready(timeout=timeout)
        return self

    def wait_replica_synced(self, replica_port, master_port, timeout=HANG_GUARD):
        def synced():
            info = self.info(replica_port, "replication")
            return (info.get("master_port") == str(master_port)
                    and info.get("master_link_status") == "up"
                    and info.get("master_sync_in_progress") == "0")
        wait_until(synced, timeout=timeout, what=f"redis {replica_port} in sync with {master_port}")

    def wait_sentinels_ready(self, timeout=HANG_GUARD):
        """Every Sentinel knows the master, the other two Sentinels and the replicas: a
        failover can start as soon as the master dies."""
        def ready():
            for s in self.sentinels:
                m = self.sentinel_master(s.port)
                if not m or int(m.get("num-other-sentinels", 0)) < 2 or int(m.get("num-slaves", 0)) < 1:
                    return False
                if "s_down" in m.get("flags", "") or "o_down" in m.get("flags", ""):
                    return False
            return True
        wait_until(ready, timeout=timeout, what="the Sentinels to know each other and the replica")

    def close(self):
        """Kills every server and Sentinel and removes their directories."""
        for s in self.sentinels + self.servers:
            signal_process(s.proc, signal.SIGKILL)
            s.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- client ------------------------------------------------------------------------
    def cli(self, port, *args, check=True, sentinel=False):
        cmd = ["redis-cli", "-h", "127.0.0.1", "-p", str(port)]
        if self.tls:
            cmd += ["--tls", "--cacert", self.tls.ca]
        if self.password:
            cmd += ["--no-auth-warning", "-a", self.password]
        try:
            r = subprocess.run(cmd + list(args), text=True, capture_output=True, timeout=5)
        except subprocess.TimeoutExpired:
            if check:
                raise
            return ""
        if check and r.returncode != 0:
            raise AssertionError(f"redis-cli {port} {args}: {r.stderr}")
        return r.stdout.strip()

    def info(self, port, section):
        out = {}
        for line in self.cli(port, "INFO", section, check=False).splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                out[k] = v.strip()
        return out

    def sentinel_master(self, sentinel_port):
        lines = self.cli(sentinel_port, "SENTINEL", "MASTER", MASTER_NAME, check=False,
                         sentinel=True).splitlines()
        return dict(zip(lines[0::2], lines[1::2])) if len(lines) >= 2 else {}

    def master_port(self, sentinel_index=None):
        """The master's port as a Sentinel reports it (the first that answers)."""
        order = self.sentinels if sentinel_index is None else [self.sentinels[sentinel_index]]
        for s in order:
            lines = self.cli(s.port, "SENTINEL", "get-master-addr-by-name", MASTER_NAME,
                             check=False, sentinel=True).splitlines()
            if len(lines) == 2:
                return int(lines[1])
        return None

    def role(self, port):
        return self.info(port, "replication").get("role")

    def server(self, port):
        return next(s for s in self.servers if s.port == port)

    # -- faults ------------------------------------------------------------------------
    def kill_master(self):
        """SIGKILL of the current master's process; returns its port."""
        port = self.master_port()
        s = self.server(port)
        signal_process(s.proc, signal.SIGKILL)
        s.proc = None
        self.killed = s
        return port

    def wait_failover(self, old_port, timeout=HANG_GUARD):
        """Waits until every Sentinel names a master other than old_port and that server
        says it is a master; returns the new master's port."""
        def done():
            ports = {self.master_port(i) for i in range(len(self.sentinels))}
            if len(ports) != 1:
                return False
            port = ports.pop()
            return port not in (None, old_port) and self.role(port) == "master"
        wait_until(done, timeout=timeout, what=f"a Sentinel failover away from {old_port}")
        return self.master_port()

    def restart_killed(self, timeout=HANG_GUARD):
        """Brings back the server kill_master killed, empty, as a replica of the current
        master (Sentinel would demote it anyway)."""
        s, self.killed = self.killed, None
        master = self.master_port()
        self._spawn_server(s, replica_of=master)
        self.wait_replica_synced(s.port, master, timeout=timeout)


# --------------------------------------------------------------------------------------
# PostgreSQL coordinator with a standby

class CoordinatorPair:
    """A PostgreSQL coordinator (primary) and its streaming standby, both on loopback TCP.
    The registry's role `registry` owns database `registry` (it creates the tables at the
    first claim). tls: a TestCA; then both servers have ssl=on with its server certificate.
    password: the role's password, and scram-sha-256 for it over TCP."""

    ROLE = "registry"
    DB = "registry"

    def __init__(self, tls=None, password=None, bin_dir=None):
        self.tls = tls
        self.password = password
        ports = free_ports(2)
        settings = {"listen_addresses": "'127.0.0.1'", "wal_level": "replica",
                    "max_wal_senders": "5", "wal_keep_size": "'64MB'"}
        if tls:
            settings.update({"ssl": "on", "ssl_cert_file": f"'{tls.server_cert}'",
                             "ssl_key_file": f"'{tls.server_key}'"})
        self.nodes = [Cluster(f"coord{ports[0]}a", dict(settings), port=ports[0], bin_dir=bin_dir),
                      Cluster(f"coord{ports[0]}b", dict(settings), port=ports[1], bin_dir=bin_dir)]
        self.primary_index = 0

    @property
    def primary(self):
        return self.nodes[self.primary_index]

    @property
    def standby(self):
        return self.nodes[1 - self.primary_index]

    def uri(self, query="target_session_attrs=read-write"):
        hosts = ",".join(f"127.0.0.1:{c.port}" for c in self.nodes)
        return f"postgresql://{self.ROLE}@{hosts}/{self.DB}" + (f"?{query}" if query else "")

    def start(self):
        p = self.primary
        p.init()
        if self.password:
            # Local connections (the tests, replication) stay trusted; TCP asks the role.
            hba = os.path.join(p.data, "pg_hba.conf")
            with open(hba) as f:
                lines = f.read()
            with open(hba, "w") as f:
                f.write(f"host all {self.ROLE} 127.0.0.1/32 scram-sha-256\n" + lines)
        p.start()
        p.sql(f"CREATE ROLE {self.ROLE} LOGIN" +
              (f" PASSWORD '{self.password}'" if self.password else ""))
        p.sql(f"CREATE DATABASE {self.DB} OWNER {self.ROLE}")
        self._standby_of(self.standby, p)
        return self

    def _standby_of(self, standby, primary):
        # Nothing dirty left: pg_basebackup's spread checkpoint is then immediate (after
        # CREATE DATABASE it otherwise paces its writes over minutes).
        primary.sql("CHECKPOINT")
        standby.init_standby_of(primary)
        standby.start()
        standby.walreceiver_pid()

    def registry_sql(self, query, params=None):
        """A statement in the registry's database on the current primary."""
        return self.primary.sql(query, params, dbname=self.DB)

    def fail_over(self):
        """The primary stops at once (pg_ctl -m immediate: a crash, its unflushed WAL lost to
        the standby only if not yet streamed), the standby is promoted. Returns seconds."""
        started = time.monotonic()
        old = self.primary
        old.stop("immediate")
        self.standby.promote()
        self.primary_index = 1 - self.primary_index
        wait_until(lambda: self.primary.one("SELECT NOT pg_is_in_recovery()"),
                   what="the promoted coordinator to accept writes")
        return time.monotonic() - started

    def swap_back(self):
        """Rebuilds the failed server as a standby of the promoted one (a fresh base backup):
        the pair is whole again, with the roles swapped."""
        self._standby_of(self.standby, self.primary)

    def close(self):
        for c in self.nodes:
            c.destroy()


# --------------------------------------------------------------------------------------
# plain Redis with a password (requirepass)

class PasswordRedis:
    """A redis-server (no persistence but SAVE on demand) that requires a password (or
    none: password=None)."""

    def __init__(self, password):
        self.password = password
        self.port = free_ports(1)[0]
        self.proc = None

    def uri(self, db=0):
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self):
        self.dir = d = _fresh(os.path.join(BASE, f"redis{self.port}"))
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", d, "--dbfilename", "dump.rdb"]
            + (["--requirepass", self.password] if self.password else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_started(self.proc, lambda: self.cli("PING", check=False) == "PONG",
                     f"redis-server {self.port}")
        return self

    def save_copy(self):
        """SAVE, and a copy of the dump kept aside; returns its path."""
        self.cli("SAVE")
        copy = os.path.join(self.dir, "copy.rdb")
        shutil.copyfile(os.path.join(self.dir, "dump.rdb"), copy)
        return copy

    def restart_from(self, copy):
        """SIGKILL, then started again from `copy` (an older dump): a registry restored."""
        signal_process(self.proc)
        shutil.copyfile(copy, os.path.join(self.dir, "dump.rdb"))
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", self.dir,
             "--dbfilename", "dump.rdb"]
            + (["--requirepass", self.password] if self.password else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_started(self.proc, lambda: self.cli("PING", check=False) == "PONG",
                     f"redis-server {self.port}")

    def cli(self, *args, check=True):
        auth = ["--no-auth-warning", "-a", self.password] if self.password else []
        r = subprocess.run(["redis-cli", "-p", str(self.port), *auth, *args], text=True,
                           capture_output=True, timeout=5)
        if check and r.returncode != 0:
            raise AssertionError(r.stderr)
        return r.stdout.strip()

    def close(self):
        signal_process(self.proc)
        self.proc = None
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)
