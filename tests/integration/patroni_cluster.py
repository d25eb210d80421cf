"""A real Patroni cluster on a one-member etcd, on loopback TCP, for test_ha.

Every process runs as the ``postgres`` OS user (initdb and pg_ctl refuse root), started with
subprocess.Popen(user=...) so that the recorded pid is the process itself (runuser would fork
and hand back its own pid). Everything lives in <BASE>/<name>; every process started here has
its working directory inside it (etcd and Patroni by Popen's cwd, each postmaster and its
children in their data directory), which is how stop() finds and ends them all, the orphaned
backends of a killed postmaster included, and touches nothing else.

Ports: etcd's client port is the base, its peer port base + 1, node i listens on base + 10 + i
(PostgreSQL) and base + 20 + i (Patroni's REST API), all on 127.0.0.1. The caller picks a base
per PostgreSQL major so that parallel runs of the suite on other majors do not collide.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request

import psycopg

from fixtures.processes import alive
from harness import BASE, HANG_GUARD, PG_BIN, wait_until

PROCESS_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/var/lib/postgresql",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
}


def port_is_free(port):
    """Whether a server could listen on 127.0.0.1:port now (with SO_REUSEADDR, as etcd and
    PostgreSQL do, so that TIME_WAIT leftovers of a previous run do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def http_get(url, timeout=1.0):
    """(status, body) of a GET, or (None, None) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        return None, None


def processes_under(root):
    """Pids of every process whose working directory is `root` or below it."""
    root = os.path.realpath(root)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root + os.sep):
            found.append(int(entry))
    return found


def spawn(cmd, cwd, log_path):
    """Starts `cmd` as the postgres user, in its own session, output to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, cwd=cwd, env=PROCESS_ENV, user="postgres", group="postgres",
                                extra_groups=[], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def make_dir(path):
    os.makedirs(path, exist_ok=True)
    shutil.chown(path, "postgres", "postgres")
    return path


class Node:
    """One Patroni member and the PostgreSQL server it manages."""

    def __init__(self, cluster, index):
        self.name = f"node{index}"
        self.pg_port = cluster.port_base + 10 + index
        self.rest_port = cluster.port_base + 20 + index
        self.dir = os.path.join(cluster.dir, self.name)
        self.data = os.path.join(self.dir, "data")
        self.config = os.path.join(self.dir, "patroni.json")
        self.log = os.path.join(self.dir, "patroni.log")
        self.proc = None
        self.lost = False

    def postmaster_pid(self):
        """The first line of postmaster.pid, if that process is alive and is this node's."""
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                pid = int(f.readline())
        except (FileNotFoundError, ValueError):
            return None
        try:
            if os.path.realpath(os.readlink(f"/proc/{pid}/cwd")) != os.path.realpath(self.data):
                return None
        except OSError:
            return None
        return pid if alive(pid) else None

    def status(self):
        """Patroni's /patroni document (role, state, ...), or None."""
        code, body = http_get(f"http://127.0.0.1:{self.rest_port}/patroni")
        if code is None or not body:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def is_primary(self):
        s = self.status()
        return bool(s) and s.get("role") in ("master", "primary") and s.get("state") == "running"

    def connect(self, **kw):
        return psycopg.connect(host="127.0.0.1", port=self.pg_port, user="postgres",
                               dbname="postgres", autocommit=True, connect_timeout=2, **kw)

    def sql(self, query, params=None):
        with self.connect() as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else None


class PatroniCluster:
    """etcd + `nodes` Patroni members, created in <BASE>/<name>."""

    def __init__(self, name, port_base, parameters, nodes=2, bin_dir=None):
        self.name = name
        self.dir = os.path.join(BASE, name)
        self.port_base = port_base
        self.parameters = dict(parameters)
        self.bin = bin_dir or PG_BIN
        self.etcd_port, self.etcd_peer_port = port_base, port_base + 1
        self.etcd_proc = None
        self.nodes = [Node(self, i) for i in range(nodes)]

    # -- lifecycle ---------------------------------------------------------------------
    def ports(self):
        return [self.etcd_port, self.etcd_peer_port] + \
            [p for n in self.nodes for p in (n.pg_port, n.rest_port)]

    def start(self, timeout=HANG_GUARD):
        """etcd, then every Patroni member; returns once there is a leader and every replica
        streams from it."""
        busy = [p for p in self.ports() if not port_is_free(p)]
        if busy:
            raise RuntimeError(f"ports {busy} on 127.0.0.1 are in use (a leftover of another run? "
                               "SNOWFLAKE_HA_PORT_BASE moves them)")
        self.stop()  # leftovers of an earlier run in the same BASE
        shutil.rmtree(self.dir, ignore_errors=True)
        make_dir(BASE)
        make_dir(self.dir)
        self._start_etcd()
        for node in self.nodes:
            self._start_patroni(node)
        wait_until(lambda: self.leader() is not None, timeout=timeout, what="a Patroni leader")
        self.wait_streaming(timeout=timeout)

    def _start_etcd(self):
        d = make_dir(os.path.join(self.dir, "etcd"))
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self.etcd_proc = spawn(
            ["etcd", "--name", "e1", "--data-dir", os.path.join(d, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"e1={peer}", "--initial-cluster-state", "new",
             "--initial-cluster-token", self.name],
            d, os.path.join(d, "etcd.log"))

        def healthy():
            if self.etcd_proc.poll() is not None:
                raise RuntimeError(f"etcd exited:\n{self.tail(os.path.join(d, 'etcd.log'))}")
            code, body = http_get(f"{client}/health")
            return code == 200 and b"true" in body

        wait_until(healthy, what="etcd")

    def _config(self, node):
        hba = ["local all all trust", "local replication all trust",
               "host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust"]
        parameters = {
            "wal_level": "replica",
            "hot_standby": "on",
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "wal_keep_size": "128MB",
            "wal_log_hints": "on",
            "unix_socket_directories": node.dir,
            "logging_collector": "on",
            "log_directory": "log",
            "log_filename": "postgresql-%Y%m%d%H%M%S.log",
            "log_line_prefix": "%m [%p] ",
            **self.parameters,
        }
        return {
            "scope": self.name,
            "namespace": "/service/",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{node.rest_port}",
                        "connect_address": f"127.0.0.1:{node.rest_port}"},
            "etcd3": {"host": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": 10, "loop_wait": 1, "retry_timeout": 3,
                    "maximum_lag_on_failover": 1048576,
                    "postgresql": {"use_pg_rewind": True, "use_slots": True},
                },
                "initdb": [{"encoding": "UTF8"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": node.data,
                "bin_dir": self.bin,
                "pgpass": os.path.join(node.dir, "pgpass"),
                "use_unix_socket": True,
                "authentication": {"superuser": {"username": "postgres"},
                                   "replication": {"username": "postgres"},
                                   "rewind": {"username": "postgres"}},
                "parameters": parameters,
                "pg_hba": hba,
            },
            "watchdog": {"mode": "off"},
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False,
                     "nosync": False},
        }

    def _start_patroni(self, node):
        make_dir(node.dir)
        with open(node.config, "w") as f:  # JSON is YAML
            json.dump(self._config(node), f, indent=1)
        shutil.chown(node.config, "postgres", "postgres")
        node.proc = spawn(["patroni", node.config], node.dir, node.log)

    def stop(self):
        """Ends every process of the cluster, whatever state a test left it in: Patroni first
        (so that it restarts nothing), then each postmaster by SIGQUIT (an immediate shutdown
        that ends its children), then SIGKILL for anything still running under the
        cluster's directory (orphaned backends of a killed postmaster, etcd)."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait()
        if os.path.isdir(self.dir):
            for node in self.nodes:
                pid = node.postmaster_pid()
                if pid:
                    os.kill(pid, signal.SIGQUIT)
            # Cleanup: waits (at most HANG_GUARD) and then kills whatever is left.
            wait_until(lambda: not any(n.postmaster_pid() for n in self.nodes), fail=False)
            for pid in processes_under(self.dir):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            wait_until(lambda: not any(alive(p) for p in processes_under(self.dir)), fail=False)
            for node in self.nodes:
                self._remove_orphaned_shm(node)
        if self.etcd_proc is not None:
            if self.etcd_proc.poll() is None:
                self.etcd_proc.kill()
            self.etcd_proc.wait()

    def _remove_orphaned_shm(self, node):
        """A postmaster killed with SIGKILL leaves its (small) System V segment behind;
        removes it once nothing is attached. Its id is on line 7 of postmaster.pid."""
        try:
            with open(os.path.join(node.data, "postmaster.pid")) as f:
                lines = f.read().splitlines()
            shmid = int(lines[6].split()[1])
        except (OSError, IndexError, ValueError):
            return
        try:
            with open("/proc/sysvipc/shm") as f:
                rows = [r.split() for r in f.read().splitlines()[1:]]
        except OSError:
            return
        for r in rows:  # key shmid perms size cpid lpid nattch ...
            if int(r[1]) == shmid and int(r[6]) == 0:
                subprocess.run(["ipcrm", "-m", str(shmid)], check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def destroy(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            os.rmdir(BASE)  # the last user of a run's directory removes it
        except OSError:
            pass

    # -- state -------------------------------------------------------------------------
    def leader(self):
        """The node that Patroni runs as a running primary, or None."""
        for node in self.nodes:
            if not node.lost and node.is_primary():
                return node
        return None

    def others(self, node):
        return [n for n in self.nodes if n is not node and not n.lost]

    def wait_streaming(self, timeout=HANG_GUARD):
        """Waits until every live replica streams from the leader (so it may be promoted)."""
        def streaming():
            leader = self.leader()
            if leader is None:
                return False
            want = {n.name for n in self.others(leader)}
            try:
                rows = leader.sql("SELECT application_name FROM pg_stat_replication "
                                  "WHERE state = 'streaming'")
            except psycopg.Error:
                return False
            return want <= {r[0] for r in rows}

        wait_until(streaming, timeout=timeout, what="every replica streaming from the leader")

    def conninfo(self):
        """libpq's multi-host form over every node: the client follows the leader."""
        hosts = ",".join("127.0.0.1" for _ in self.nodes)
        ports = ",".join(str(n.pg_port) for n in self.nodes)
        return (f"host={hosts} port={ports} dbname=postgres user=postgres "
                "target_session_attrs=read-write connect_timeout=2")

    # -- faults ------------------------------------------------------------------------
    def switchover(self, leader, candidate, timeout=HANG_GUARD):
        """A planned switchover with patronictl; returns its output."""
        r = subprocess.run(["patronictl", "-c", leader.config, "switchover", "--leader",
                            leader.name, "--candidate", candidate.name, "--force"],
                           text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, env=PROCESS_ENV)
        if r.returncode != 0:
            raise RuntimeError(f"patronictl switchover failed:\n{r.stdout}")
        return r.stdout

    def lose(self, node):
        """The loss of a node's machine: SIGKILL its Patroni process, then its postmaster.
        (The postmaster's children notice its death and exit; stop() ends any that linger.)"""
        postmaster = node.postmaster_pid()
        node.lost = True
        os.kill(node.proc.pid, signal.SIGKILL)
        if postmaster:
            os.kill(postmaster, signal.SIGKILL)
        node.proc.wait()

    # -- diagnostics -------------------------------------------------------------------
    @staticmethod
    def tail(path, chars=3000):
        try:
            with open(path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return "(no log)"

    def server_log(self, node):
        """Everything the node's PostgreSQL logged so far (all its log files, oldest first)."""
        d = os.path.join(node.data, "log")
        names = sorted(os.listdir(d)) if os.path.isdir(d) else []
        out = []
        for name in names:
            with open(os.path.join(d, name), errors="replace") as f:
                out.append(f.read())
        return "".join(out)

    def diagnostics(self):
        out = []
        for node in self.nodes:
            out.append(f"--- {node.name} patroni.log (tail)\n{self.tail(node.log)}")
            logs = sorted(
                os.path.join(node.data, "log", f) for f in
                (os.listdir(os.path.join(node.data, "log"))
                 if os.path.isdir(os.path.join(node.data, "log")) else []))
            if logs:
                out.append(f"--- {node.name} {logs[-1]} (tail)\n{self.tail(logs[-1])}")
        return "\n".join(out)
