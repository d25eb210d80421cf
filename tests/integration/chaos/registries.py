"""The chaos campaign: registries (variants of fixtures.registries' servers, with
persistence, copies and fake holders)."""

import os
import shutil
import signal
import subprocess
import time

import psycopg
import redis

import harness
from fixtures.processes import alive, signal_pending
from fixtures.registries import Coordinator, Redis
from harness import as_postgres, wait_until

from .plan import WORKERS_PER_DC
from .processes import send


class RespClient:
    """A connection to a Redis server or sentinel whose replies come back as RESP has them
    (python3-redis's Connection, without the client class's per-command parsing): "+OK" as
    "OK", integers, strings, lists, None; an error reply raises. For the fake holders'
    refresher and the Sentinel set's probes."""

    def __init__(self, port, timeout=1.0):
        self.conn = redis.Connection(host="127.0.0.1", port=port, socket_timeout=timeout,
                                     socket_connect_timeout=timeout, decode_responses=True)
        self.conn.connect()

    def close(self):
        self.conn.disconnect()

    def call(self, *args):
        self.conn.send_command(*(str(a) for a in args))
        return self.conn.read_response()


FAKE_REDIS_LUA = """
local n = 0
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if (not v) or v == ARGV[i + 1] then
    redis.call('SET', k, ARGV[i + 1], 'PX', ARGV[1])
    n = n + 1
  end
end
return n
"""


OCCUPY_REDIS_LUA = """
local got = {}
for i, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 0 and tostring(i - 1) ~= ARGV[3] then
    redis.call('SET', k, ARGV[1], 'PX', ARGV[2])
    got[#got + 1] = i - 1
  end
end
return got
"""

FREE_REDIS_LUA = """
for i, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[1] then redis.call('DEL', k) end
end
return 1
"""


class ChaosRedis(Redis):
    """fixtures.registries.Redis with its dump file in a directory of its own: copies of it can be
    kept (SAVE), and it can be started from the current dump, an older copy, or nothing."""

    kind = "redis"

    def __init__(self, root):
        super().__init__()
        self.dir = os.path.join(root, f"redis{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.dump = os.path.join(self.dir, "dump.rdb")
        self.copies = []
        self.log = open(os.path.join(self.dir, "redis.log"), "ab")

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", self.dir,
             "--dbfilename", "dump.rdb"],
            stdout=self.log, stderr=self.log)
        harness.wait_until(lambda: self.cli("PING", check=False) == "PONG",
                           what="redis-server to start")

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        self.stop()  # SIGKILL: what was not saved is lost

    def save(self):
        return self.cli("SAVE", check=False) == "OK"

    def restart_clean(self, down):
        self.save()
        self.stop()
        time.sleep(down)
        self.start()

    def restart_kill(self, down):
        self.stop()
        time.sleep(down)
        self.start()  # from the last dump: everything since is lost

    def restart_empty(self, down, ddl=False):
        self.stop()
        if os.path.exists(self.dump):
            os.remove(self.dump)
        time.sleep(down)
        self.start()

    def snapshot(self):
        if not self.save():
            return None
        path = os.path.join(self.dir, f"copy{len(self.copies)}.rdb")
        shutil.copyfile(self.dump, path)
        self.copies.append(path)
        return path

    def restore(self, copy, down):
        self.stop()
        shutil.copyfile(copy, self.dump)
        time.sleep(down)
        self.start()

    def make_tables(self):
        pass

    def refresh_fakes(self, state, datacenter, fake_ids, ttl_ms):
        client = state.get("client")
        try:
            if client is None:
                client = state["client"] = RespClient(self.port)
            keys = [f"snowflake:claim:{datacenter}:{w}" for w in fake_ids]
            tokens = [f"fake-{w}" for w in fake_ids]
            return client.call("EVAL", FAKE_REDIS_LUA, len(keys), *keys, ttl_ms, *tokens)
        except Exception:  # noqa: BLE001  (down or restarting: try again next round)
            if client is not None:
                client.close()
            state["client"] = None
            return None

    def _eval(self, script, datacenter, *args):
        keys = [f"snowflake:claim:{datacenter}:{w}" for w in range(WORKERS_PER_DC)]
        try:
            client = RespClient(self.port)
            try:
                return client.call("EVAL", script, len(keys), *keys, *args)
            finally:
                client.close()
        except Exception:  # noqa: BLE001
            return None

    def occupy_free(self, datacenter, token, ttl_ms, exclude=-1):
        """Claims of another server on every free id but `exclude` (not renewed). Returns
        their ids."""
        return self._eval(OCCUPY_REDIS_LUA, datacenter, token, ttl_ms, exclude)

    def free(self, datacenter, token):
        self._eval(FREE_REDIS_LUA, datacenter, token)

    def close(self):
        self.stop()
        self.log.close()


REGISTRIES_DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "docs",
                              "registries.md")


def documented_ddl():
    """The coordinator's DDL as docs/registries.md gives it to a DBA: the campaign's DBA runs
    exactly that, so the manual's statements stay tested. IF NOT EXISTS added: a node may
    create the tables at the same moment."""
    with open(REGISTRIES_DOC) as f:
        text = f.read()
    start = text.index("CREATE TABLE public.snowflake_registry (")
    end = text.index("-- The nodes' user needs", start)
    return (text[start:end]
            .replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ")
            .replace("CREATE UNLOGGED TABLE ", "CREATE UNLOGGED TABLE IF NOT EXISTS "))

FAKE_PG_UPSERT = """
INSERT INTO snowflake_claims AS c
       (datacenter_id, worker_id, holder, expires_unix_ms, high_water_unix_ms)
SELECT %(dc)s, w, 'fake-' || w, (extract(epoch FROM clock_timestamp()) * 1000)::bigint + %(ttl)s, 0
  FROM unnest(%(ws)s::int[]) AS w
ON CONFLICT (datacenter_id, worker_id) DO UPDATE
   SET holder = excluded.holder, expires_unix_ms = excluded.expires_unix_ms
 WHERE (c.holder = excluded.holder
        AND c.expires_unix_ms < (extract(epoch FROM clock_timestamp()) * 1000)::bigint + %(ttl)s / 2)
    OR c.holder IS NULL OR c.expires_unix_ms IS NULL
    OR c.expires_unix_ms <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint"""
# (A fake renews its row only in the second half of its TTL: little WAL, so that the last
# asynchronous commits before a crash stay unwritten as long as they would in a quiet fleet.)


class ChaosCoordinator(Coordinator):
    """fixtures.registries.Coordinator that commits asynchronously with a lazy WAL writer, so that a
    crash restart (same postmaster start time) loses the last commits; copies are taken with
    pg_basebackup while it runs."""

    kind = "pg"

    def __init__(self, root):
        super().__init__()
        self.cluster.configure(synchronous_commit="off", wal_writer_delay="'10s'",
                               checkpoint_timeout="'1h'", max_connections="100")
        self.copies_dir = f"{self.cluster.dir}-copies"
        os.makedirs(self.copies_dir, exist_ok=True)
        shutil.chown(self.copies_dir, "postgres", "postgres")
        self.copies = []

    def running(self):
        return self.cluster.running()

    def kill(self):
        self.cluster.stop("immediate")

    def restart_clean(self, down):
        self.cluster.stop("fast")
        time.sleep(down)
        self.cluster.start()

    def restart_kill(self, down):
        self.cluster.stop("immediate")  # unflushed async commits are lost, restart seen
        time.sleep(down)
        self.cluster.start()

    def restart_empty(self, down, ddl=False):
        self.cluster.init()  # stops it and makes a new data directory
        time.sleep(down)
        self.cluster.start()
        if ddl:
            self.make_tables()

    def stall_wal_writer(self):
        """SIGSTOPs the WAL writer, the process that writes asynchronous commits out: as if
        its wal_writer_delay had not elapsed yet. Returns its pid."""
        pid = self.cluster.one("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
        if pid:
            os.kill(pid, signal.SIGSTOP)
        return pid

    def crash_unflushed(self, walwriter=None):
        """SIGKILL of one backend: the postmaster crash-restarts the coordinator. Commits not
        yet written by the WAL writer are gone, and pg_postmaster_start_time() is unchanged.
        A stalled WAL writer (stall_wal_writer) is continued once the postmaster's SIGQUIT
        is pending for it, so that it exits without writing."""
        conn = self.cluster.connect(retries=5)
        pid = conn.info.backend_pid
        os.kill(pid, signal.SIGKILL)
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
        if walwriter:
            wait_until(lambda: not alive(walwriter) or signal_pending(walwriter, signal.SIGQUIT),
                       timeout=5, poll=0.01, fail=False)
            send(walwriter, signal.SIGCONT)
        return pid

    def snapshot(self):
        path = os.path.join(self.copies_dir, f"copy{len(self.copies)}")
        r = as_postgres(f"{self.cluster.bin}/pg_basebackup", "-h", self.cluster.dir, "-p",
                        str(self.cluster.port), "-U", "postgres", "-D", path, "-X", "stream",
                        "-c", "fast", check=False, capture=True)
        if r.returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            return None
        self.copies.append(path)
        return path

    def restore(self, copy, down):
        self.cluster.stop("immediate")
        shutil.rmtree(self.cluster.data, ignore_errors=True)
        subprocess.run(["cp", "-a", copy, self.cluster.data], check=True)
        time.sleep(down)
        self.cluster.start()

    def make_tables(self):
        try:
            self.cluster.sql(documented_ddl())
        except psycopg.errors.UniqueViolation:
            pass  # a node created them at the same moment (CREATE TABLE IF NOT EXISTS races)

    def refresh_fakes(self, state, datacenter, fake_ids, ttl_ms):
        conn = state.get("conn")
        try:
            if conn is None or conn.closed or conn.broken:
                conn = state["conn"] = psycopg.connect(
                    host="127.0.0.1", port=self.cluster.port, user="postgres", dbname="postgres",
                    connect_timeout=1, autocommit=True)
                conn.execute("SET lock_timeout = '500ms'")
                conn.execute("SET statement_timeout = '1s'")
            with conn.transaction():
                present = conn.execute(
                    "SELECT to_regclass('snowflake_registry') IS NOT NULL "
                    "AND to_regclass('snowflake_claims') IS NOT NULL").fetchone()[0]
                if not present:
                    return None  # restarted empty: the nodes create the tables
                conn.execute("SELECT 1 FROM snowflake_registry FOR UPDATE")
                return conn.execute(FAKE_PG_UPSERT, {"dc": datacenter, "ttl": ttl_ms,
                                                     "ws": list(fake_ids)}).rowcount
        except Exception:  # noqa: BLE001
            try:
                if conn is not None:
                    conn.close()
            except Exception:  # noqa: BLE001
                pass
            state["conn"] = None
            return None

    def _sql(self, query, params):
        try:
            with psycopg.connect(host="127.0.0.1", port=self.cluster.port, user="postgres",
                                 dbname="postgres", connect_timeout=2, autocommit=True) as conn:
                with conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '1s'")
                    conn.execute("SELECT 1 FROM snowflake_registry FOR UPDATE")
                    cur = conn.execute(query, params)
                    return [r[0] for r in cur.fetchall()] if cur.description else []
        except Exception:  # noqa: BLE001
            return None

    def occupy_free(self, datacenter, token, ttl_ms, exclude=-1):
        """Claims of another server on every free id but `exclude` (not renewed). Returns
        their ids."""
        return self._sql("""
            INSERT INTO snowflake_claims AS c
                   (datacenter_id, worker_id, holder, expires_unix_ms, high_water_unix_ms)
            SELECT %(dc)s, w, %(token)s,
                   (extract(epoch FROM clock_timestamp()) * 1000)::bigint + %(ttl)s, 0
              FROM generate_series(0, 31) AS w WHERE w <> %(exclude)s
            ON CONFLICT (datacenter_id, worker_id) DO UPDATE
               SET holder = excluded.holder, expires_unix_ms = excluded.expires_unix_ms
             WHERE c.holder IS NULL OR c.expires_unix_ms IS NULL
                OR c.expires_unix_ms <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint
            RETURNING worker_id""", {"dc": datacenter, "token": token, "ttl": ttl_ms,
                                     "exclude": exclude})

    def free(self, datacenter, token):
        self._sql("UPDATE snowflake_claims SET holder = NULL, expires_unix_ms = NULL "
                  "WHERE datacenter_id = %(dc)s AND holder = %(token)s",
                  {"dc": datacenter, "token": token})

    def close(self):
        self.cluster.stop("immediate")
