#!/usr/bin/env python3
"""A randomized fault campaign ("chaos") for snowflake.worker_id = 'auto', with a checker.

Jepsen-style: a fleet of PostgreSQL servers ("nodes") claims worker ids from one registry
(Redis, a PostgreSQL coordinator, a three-member etcd cluster, or a Redis master and replica
behind three Sentinels) in a datacenter whose other ids are held by fake live
servers, so that ids are reused all the time. Writer threads (2 per node) take IDs
continuously and record every acknowledged one with the real time its request was sent and
acknowledged. Meanwhile a schedule of faults, made up front from the seed alone, is played:
SIGKILL / SIGSTOP of backends, of the registry worker and of whole nodes, clean and immediate
restarts, clock steps (clock shim), registry kills, empty restarts, crash restarts with
unflushed writes, restores from old copies, and clones of running nodes started beside them;
for etcd also one member killed, frozen or restarted (the leader or another), the whole
cluster wiped or restored from an older `etcdctl snapshot save`; for Sentinel the master
killed (failover, the old one back as a replica), frozen past the failover (a stale master
when it continues), a sentinel or the replica killed, and manual failovers.
At the end the checker looks at the whole history:

  (a) no acknowledged ID twice, across all nodes and all time;
  (b) the IDs of each writer session strictly increase in acknowledgement order;
  (c) per (datacenter, worker): an ID acknowledged before another ID was requested, by
      another node, is lower (otherwise two nodes held the id at once, or a floor was wrong);
  (d) per node: time spent refusing, errors by SQLSTATE; IDs checked; faults by kind.

Besides the single faults, composite ones aim at the ways ids change hands: "handover" (a
holder goes away, by a clean restart, a kill, a freeze or its clock stepped back, maybe after
reserving IDs ahead of its clock and with the registry restarted empty meanwhile, while
another node waits for an id; when that node gets the id: nothing, a crash restart, its
clock stepped back, or both), "claim_then_crash" (a node claims anew and crash-restarts at
once), "claim_then_registry_crash" (a node claims anew, a rival waits, the coordinator
crash-restarts losing the claim) and "registry_empty_then_clock". The plan leaves nodes - 1,
nodes or nodes + 1 ids free (so ids change hands often), gives most nodes a
standing clock offset within the allowed skew, and writers sometimes reserve thousands of
blocks at once (IDs ahead of the clock, up to the claim's cap).

Usage (from tests/integration, as root, PG_BIN/PG_MAJOR/SNOWFLAKE_IT_BASE as for the tests):
    python3 chaos.py --minutes 10 --seed 42 --registry both [--nodes 3] [--schedules K]
    python3 chaos.py --seed 42 --registry pg --dry-run        (print the schedules only)
    python3 chaos.py --seed 4 --minutes 1.2 --registry redis --schedules 1 --kinds handover
    python3 chaos.py --minutes 30 --registry etcd|sentinel|all   (all: the four alternate)
Schedule i of seed S is a pure function of (S, i, registry, nodes, length, ttl, free, kinds):
the same arguments replay the same schedule (--only I runs schedule I alone). What happens
when it is played still depends on timing (a fault finding its node busy is skipped, and
reported so). Exit status 1 when the checker found a duplicate or an order violation, 2 on a
usage or setup error. Liveness (nodes not issuing again after every fault was undone) is
reported, not failed.
"""

import argparse
import atexit
import base64
import bisect
import glob
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from array import array
from collections import Counter, defaultdict

import psycopg

import harness
from harness import Cluster, as_postgres, wait_until
from fixtures.registries import free_ports, signal_process
from fixtures.clusters import TTL, node
from fixtures.ids import TWITTER_EPOCH_MS, decode
from fixtures.processes import alive, kill_server, postmaster_pid, registry_worker_pid, signal_pending
from fixtures.registries import Coordinator, Redis
from fixtures.waits import wait_claimed

WORKERS_PER_DC = 32


def ttl_ms_of(ttl):
    t = ttl.strip("'")
    if t.endswith("ms"):
        return int(t[:-2])
    if t.endswith("s"):
        return int(float(t[:-1]) * 1000)
    return int(t)


def describe(i):
    ms, dc, w, seq = decode(i, TWITTER_EPOCH_MS)
    stamp = time.strftime("%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}"
    return f"{i} (ts {stamp} = {ms}, dc {dc}, worker {w}, seq {seq})"


# ----------------------------------------------------------------------------------------
# The schedule: a pure function of the seed

NODE_KINDS = {
    "backend_kill": 7,        # SIGKILL a writer's backend: the node crash-restarts
    "worker_kill": 7,         # SIGKILL the registry worker: crash restart
    "node_kill": 7,           # SIGKILL postmaster and children, down a while, start again
    "worker_stop": 5,         # SIGSTOP the registry worker, SIGCONT later
    "backend_stop": 4,        # SIGSTOP an issuing backend, SIGCONT later
    "node_stop": 5,           # SIGSTOP every process of the node, SIGCONT later
    "restart_clean": 4,       # pg_ctl stop -m fast + start
    "restart_immediate": 5,   # pg_ctl stop -m immediate + start
    "clock_step": 12,         # clock stepped (inside or beyond the allowed skew), back later
    "clone": 3,               # pg_basebackup of the running node started beside it a while
    "claim_then_crash": 4,    # whole node killed and restarted; right after its claim, SIGKILL
                              # of a backend or the registry worker (crash restart)
    "handover": 14,           # a holder (maybe after IDs reserved ahead of its clock) goes away
                              # (clean restart, kill, freeze, clock stepped back, maybe with the
                              # registry restarted empty meanwhile) while another node waits
                              # for an id; when that one gets it: nothing, a crash restart, or
                              # its clock stepped back
}
REGISTRY_KINDS = {
    "registry_kill": 4,             # killed (unflushed writes lost), down a while, started
    "registry_restart_clean": 2,    # stopped cleanly and started, data intact
    "registry_restart_empty": 4,    # killed, started with nothing
    "registry_restore_old": 3,      # killed, started from an older copy
    "registry_snapshot": 4,         # (not a fault) a copy kept for registry_restore_old
    "registry_empty_then_clock": 3,  # restarted empty, then a node's clock steps
}
PG_ONLY_KINDS = {
    "registry_crash_unflushed": 5,   # SIGKILL of a coordinator backend: crash restart that
                                     # loses async commits, same postmaster start time
    "claim_then_registry_crash": 4,  # a node claims anew, then the coordinator crash-restarts
}
# etcd: the generic registry kinds act on the whole cluster (registry_kill: every member
# SIGKILLed, down a while, started on its data; registry_restart_empty: every data directory
# wiped, same ports and cluster token; registry_restore_old: `etcdctl snapshot restore` of an
# older `snapshot save` into fresh data directories, same names, ports and token).
ETCD_KINDS = {
    "registry_kill": 2,
    "registry_restart_clean": 1,
    "etcd_member_kill": 6,       # one member (the leader or another) SIGKILLed, down a while
    "etcd_member_stop": 5,       # one member (the leader or another) SIGSTOPped, SIGCONT later
    "etcd_member_restart": 3,    # one member stopped cleanly (SIGTERM) and started
}
# Sentinel: the generic registry kinds act on the current master (registry_kill: SIGKILLed,
# started again from its last dump as a master, whatever the sentinels did meanwhile).
SENTINEL_KINDS = {
    "sentinel_master_kill": 5,   # master SIGKILLed, the sentinels fail over, the old one
                                 # started again later (empty) as a replica of the new one
    "sentinel_master_stop": 4,   # master SIGSTOPped (mostly past the failover: when it
                                 # continues, a master that no majority names), SIGCONT later
    "sentinel_kill": 3,          # one sentinel SIGKILLed, down a while
    "sentinel_replica_kill": 3,  # the replica SIGKILLed, started again empty as a replica
    "sentinel_failover": 2,      # SENTINEL FAILOVER (a switchover: a new replication id)
    "sentinel_split_then_loss": 3,  # master frozen until the sentinels fail over, continued
                                    # (a stale master, not yet demoted), and `gap` s later the
                                    # new master lost (killed; killed and started again at
                                    # once from its dump; or SENTINEL FAILOVER): the
                                    # sentinels may fail back to the stale one
}
REGISTRY_SPECIFIC = {"pg": PG_ONLY_KINDS, "etcd": ETCD_KINDS, "sentinel": SENTINEL_KINDS}
REGISTRIES = ("redis", "pg", "etcd", "sentinel")
NOT_FAULTS = {"registry_snapshot"}


class Event:
    def __init__(self, seq, t, kind, target, params):
        self.seq, self.t, self.kind, self.target, self.params = seq, t, kind, target, params

    def as_dict(self):
        return {"seq": self.seq, "t": self.t, "kind": self.kind, "target": self.target,
                "params": self.params}

    def __str__(self):
        params = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"#{self.seq:<3} t={self.t:7.2f}s  {self.kind:26} {self.target:9} {params}"


class Plan:
    """Everything random about one schedule, drawn from random.Random(seed/index/...)."""

    def __init__(self, seed, index, registry, nodes=3, seconds=60.0, ttl=TTL, free=None,
                 mean_gap=3.0, only_kinds=None):
        self.seed, self.index, self.registry, self.nodes = seed, index, registry, nodes
        self.seconds, self.ttl = float(seconds), ttl
        self.ttl_ms = ttl_ms_of(ttl)
        rng = random.Random(f"snowflake-chaos/{seed}/{index}/{registry}/{nodes}/{seconds}/{ttl}")
        self.datacenter = rng.randrange(1, 32)
        # Ids left free: one fewer than nodes (one node always waits for an id, and takes
        # the next one that lapses: ids change hands all the time), one per node (a clone or
        # a restarted node waits), or one more.
        self.free_count = free if free else max(1, rng.choice([nodes - 1, nodes - 1, nodes,
                                                               nodes + 1]))
        self.free_ids = sorted(rng.sample(range(WORKERS_PER_DC), self.free_count))
        self.fake_ids = [w for w in range(WORKERS_PER_DC) if w not in self.free_ids]
        self.node_names = [f"n{k + 1}" for k in range(nodes)]
        # Clocks of real machines differ: most nodes run a standing offset within the allowed
        # skew (claim_ttl / 5); some allow the ID clock further ahead of the wall clock.
        skew = self.ttl_ms // 5
        self.base_clock = {n: (rng.randint(-skew * 9 // 10, skew * 9 // 10)
                               if rng.random() < 0.7 else 0) for n in self.node_names}
        self.max_clock_drift = {n: rng.choice(["1s", "1s", "3s"]) for n in self.node_names}
        self.writer_seeds = {f"{n}/{j}": rng.getrandbits(32) for n in self.node_names
                             for j in range(2)}
        self.clone_seeds = [rng.getrandbits(32) for _ in range(64)]
        kinds = dict(NODE_KINDS)
        kinds.update(REGISTRY_KINDS)
        kinds.update(REGISTRY_SPECIFIC.get(registry, {}))
        if only_kinds:
            kinds = {k: v for k, v in kinds.items() if k in only_kinds}
            if not kinds:
                raise ValueError(f"no fault kind of {sorted(only_kinds)} applies to {registry}")
        self.kinds = kinds
        self.events = self._events(rng, mean_gap)

    def _events(self, rng, mean_gap):
        ttl = self.ttl_ms / 1000.0
        names, weights = zip(*sorted(self.kinds.items()))
        events, clones = [], Counter()
        t = 1.0
        while True:
            t += rng.expovariate(1.0 / mean_gap)
            if t > self.seconds - 2:
                break
            # Faults alone (most), or a burst of 2-3 overlapping ones, mostly on one node.
            burst = 1 if rng.random() < 0.7 else rng.randint(2, 3)
            target = rng.choice(self.node_names)
            at = t
            for _ in range(burst):
                kind = rng.choices(names, weights)[0]
                if rng.random() > 0.7:
                    target = rng.choice(self.node_names)
                left = max(0.5, self.seconds - at)
                p = {}
                if kind in ("node_kill", "registry_kill"):
                    p["down"] = round(rng.uniform(0.2, 4.0), 2)
                elif kind in ("worker_stop", "node_stop", "backend_stop"):
                    # Mostly past claim_ttl (the claim lapses meanwhile), sometimes shorter.
                    lo, hi = (ttl * 1.1, ttl * 3.0) if rng.random() < 0.75 else (0.2, ttl)
                    p["for"] = round(min(rng.uniform(lo, hi), left), 2)
                    if kind == "backend_stop":
                        p["writer"] = rng.randrange(2)
                elif kind == "backend_kill":
                    p["writer"] = rng.randrange(2)
                elif kind in ("clock_step", "registry_empty_then_clock"):
                    p.update(self._clock(rng, left))
                    if kind == "registry_empty_then_clock":
                        p["after"] = round(rng.uniform(0.0, ttl * 1.5), 2)
                elif kind == "clone":
                    clones[target] += 1
                    p["name"] = f"{target}c{clones[target]}"
                    p["life"] = round(min(rng.uniform(4.0, 20.0), max(2.0, left)), 2)
                elif kind in ("claim_then_crash", "claim_then_registry_crash"):
                    p["down"] = round(rng.uniform(0.1, 1.0), 2)
                    p["delay"] = round(rng.uniform(0.0, 0.4), 2)
                    if kind == "claim_then_crash":
                        p["victim"] = rng.choice(["backend", "worker"])
                    else:
                        p["rival"] = rng.choice([n for n in self.node_names if n != target]
                                                or [target])
                        p["cut"] = round(rng.uniform(ttl * 0.5, ttl * 1.5), 2)
                elif kind == "registry_crash_unflushed":
                    p["stall"] = round(rng.uniform(0.0, 3.0), 2)
                elif kind == "registry_restore_old":
                    p["which"] = round(rng.random(), 3)  # 0: the oldest copy, 1: the latest
                elif kind in ("etcd_member_kill", "etcd_member_stop", "etcd_member_restart"):
                    p["which"] = rng.choice(["leader", "follower"])
                    p["pick"] = rng.randrange(2)
                    if kind == "etcd_member_kill":
                        p["down"] = round(rng.uniform(0.3, 3 * ttl), 2)
                    elif kind == "etcd_member_stop":
                        p["for"] = round(min(rng.uniform(0.3, 3 * ttl), left), 2)
                elif kind == "sentinel_master_kill":
                    p["down"] = round(rng.uniform(0.3, 2 * ttl), 2)  # after the failover
                elif kind == "sentinel_master_stop":
                    lo, hi = (ttl * 1.5, ttl * 4.0) if rng.random() < 0.75 else (0.2, ttl * 0.4)
                    p["for"] = round(min(rng.uniform(lo, hi), max(0.5, left)), 2)
                elif kind == "sentinel_split_then_loss":
                    p["extra"] = round(rng.uniform(0.0, ttl), 2)  # frozen after the failover
                    p["gap"] = round(rng.uniform(0.0, 1.5), 2)
                    p["how"] = rng.choice(["kill", "restart", "failover"])
                    p["down"] = round(rng.uniform(0.3, 2 * ttl), 2)
                elif kind == "sentinel_kill":
                    p["which"] = rng.randrange(3)
                    p["down"] = round(rng.uniform(0.5, 5 * ttl), 2)
                elif kind == "sentinel_replica_kill":
                    p["down"] = round(rng.uniform(0.3, 2 * ttl), 2)
                elif kind == "handover":
                    p.update(self._handover(rng, left))
                    if p["clone_of"] == target:
                        p["clone_of"] = self.node_names[(self.node_names.index(target) + 1)
                                                        % len(self.node_names)]
                if kind in ("registry_restart_empty", "registry_empty_then_clock") \
                        and self.registry == "pg":
                    # A DBA creates the coordinator's tables again (docs/registries.md's DDL), or not: the
                    # nodes then have to create them.
                    p["ddl"] = rng.random() < 0.85
                if (kind.startswith(("registry_", "etcd_", "sentinel_"))
                        and kind != "registry_empty_then_clock"):
                    tgt = "registry"
                else:
                    tgt = target
                events.append(Event(len(events), round(at, 3), kind, tgt, p))
                at += rng.uniform(0.0, 1.5)
        events.sort(key=lambda e: e.t)
        for k, e in enumerate(events):
            e.seq = k
        return events

    def _handover(self, rng, left):
        ttl, skew = self.ttl_ms / 1000.0, self.ttl_ms // 5
        p = {"how": rng.choice(["clean", "kill", "freeze", "clock_back"]),
             "ahead": rng.choice([0, rng.randint(50, 900)])}
        if p["how"] == "kill":
            p["down"] = round(rng.uniform(ttl * 0.5, ttl * 2.5), 2)
        elif p["how"] == "freeze":
            p["down"] = round(rng.uniform(ttl * 1.2, ttl * 3.0), 2)
        elif p["how"] == "clock_back":
            p["ms"] = -rng.randint(2 * skew, 5 * self.ttl_ms)
            p["down"] = round(rng.uniform(ttl, ttl * 4), 2)
        if p["how"] in ("kill", "freeze"):
            p["empty"] = rng.random() < 0.35
            if p["empty"] and self.registry == "pg":
                p["ddl"] = True
        p["then"] = rng.choice(["none", "crash_backend", "crash_worker", "clock_back",
                                "crash_clock_back"])
        if p["then"] in ("clock_back", "crash_clock_back"):
            p["then_ms"] = -rng.randint(skew + skew // 4, 3 * self.ttl_ms)
            p["then_hold"] = round(rng.uniform(0.5, 3 * ttl), 2)
        p["watch"] = round(min(max(2.0, left), 5 * ttl + p.get("down", 0)), 2)
        p["clone_of"] = rng.choice(self.node_names)  # the waiter, if no node waits: a clone
        p["cold"] = rng.random() < 0.6  # of the copy taken at the start (its lease is old)
        return p

    def _clock(self, rng, left):
        skew = self.ttl_ms // 5  # the allowed skew
        if rng.random() < 0.4:
            ms = rng.randint(max(10, skew // 10), max(11, skew - skew // 8))  # inside
        else:
            ms = rng.randint(skew + skew // 4, max(skew + skew // 4 + 1, 3 * self.ttl_ms))
        if rng.random() < 0.55:
            ms = -ms
        return {"ms": ms, "hold": round(min(rng.uniform(1.0, 10.0), max(0.5, left)), 2)}

    def header(self):
        return (f"schedule {self.index}: seed={self.seed} registry={self.registry} "
                f"nodes={self.nodes} seconds={self.seconds:g} claim_ttl={self.ttl} "
                f"datacenter={self.datacenter} free_ids={self.free_ids} "
                f"({len(self.fake_ids)} held by fake servers) clocks={self.base_clock} "
                f"max_clock_drift={self.max_clock_drift} events={len(self.events)}")

    def text(self):
        return "\n".join([self.header()] + ["  " + str(e) for e in self.events])


# ----------------------------------------------------------------------------------------
# Processes

def procs_in(datadir):
    """Pids of the processes whose working directory is `datadir` (every PostgreSQL process
    of that server chdirs there), including ones forked after a pgrep would have run."""
    real = os.path.realpath(datadir)
    found = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            if os.readlink(f"{d}/cwd") == real:
                found.append(int(d[6:]))
        except OSError:
            pass
    return [p for p in found if alive(p)]


def signal_node(c, sig):
    """fixtures.processes.kill_server (the postmaster, then its children), then every other
    process of the server (a child forked meanwhile, or one gone before its signal)."""
    try:
        pids = kill_server(c, sig)
    except (OSError, ValueError):
        pids = []
    more = [p for p in procs_in(c.data) if p not in pids]
    for p in more:
        send(p, sig)
    return pids + more


def send(pid, sig):
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def is_postgres(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"postgres" in f.read()
    except OSError:
        return False


# ----------------------------------------------------------------------------------------
# Registries (variants of fixtures.registries' servers, with persistence, copies and fake holders)

class RespClient:
    """A minimal Redis client (RESP over a socket) for the fake holders' refresher."""

    def __init__(self, port, timeout=1.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def close(self):
        self.sock.close()

    def call(self, *args):
        out = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = str(a).encode()
            out.append(f"${len(b)}\r\n".encode() + b + b"\r\n")
        self.sock.sendall(b"".join(out))
        return self._reply()

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("redis closed the connection")
                self.buf += chunk
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data.decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")


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


REGISTRIES_DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
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


# ----------------------------------------------------------------------------------------
# etcd (three members) and Redis Sentinel (a master, a replica, three sentinels)

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


# ----------------------------------------------------------------------------------------
# Nodes and writers

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


# ----------------------------------------------------------------------------------------
# One schedule

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
        if not n.lock.acquire(blocking=False):
            return "skipped: node busy"
        try:
            if not n.up or not postmaster_pid(n.cluster):
                return "skipped: node down"
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
        locked = []
        try:
            for n in (a, b):
                if n in locked:
                    continue
                if not n.lock.acquire(blocking=False):
                    return "skipped: node busy"
                locked.append(n)
            if not all(n.up and postmaster_pid(n.cluster) for n in locked):
                return "skipped: node down"
            if not self.registry_lock.acquire(blocking=False):
                return "skipped: registry busy"
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
            for n in locked:
                n.lock.release()

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
        if not holder.lock.acquire(blocking=False):
            return "skipped: node busy"
        watcher = extra = None
        done = threading.Event()
        try:
            if not holder.up:
                return "skipped: node down"
            st, worker = self._claim_state(holder)
            if st != "held":
                return f"skipped: the holder's claim is {st}"
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
                wait_until(lambda: self._claim_state(clone)[0] in ("exhausted", "held"),
                           timeout=15, fail=False)
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


# ----------------------------------------------------------------------------------------
# The checker

def check(s):
    """Runs checks (a)-(d) over everything the schedule's writers recorded."""
    writers = [w for n in s.nodes.values() for w in n.writers]
    sessions = s.sessions
    node_of_session = [x[0] for x in sessions]
    t0 = s.t0_ns
    result = {"seed": s.plan.seed, "schedule": s.plan.index, "registry": s.plan.registry,
              "nodes": s.plan.nodes, "seconds": s.plan.seconds}
    result["ids_checked"] = sum(w.run_len[k] for w in writers
                                for _, _, _, lo, hi in w.requests() for k in range(lo, hi))
    result["requests"] = sum(len(w.r_ack) for w in writers)

    def origin(wi, r_sent, r_ack, sess):
        name, inc, label, pid = sessions[sess]
        return {"node": name, "incarnation": inc, "writer": label, "pid": pid,
                "sent_s": round((r_sent - t0) / 1e9, 3), "ack_s": round((r_ack - t0) / 1e9, 3)}

    # Every run with its request: (start, end exclusive, writer, sent, ack, session)
    runs = []
    for wi, w in enumerate(writers):
        for sent, ack, sess, lo, hi in w.requests():
            for k in range(lo, hi):
                st = w.run_start[k]
                runs.append((st, st + w.run_len[k], wi, sent, ack, sess))

    # (a) duplicates: IDs covered by more than one run (sorted by start, the part of a run
    # below the highest end so far is covered twice)
    runs.sort()
    dup_count = 0
    dup_examples = []
    cross = 0
    top = None
    for run in runs:
        if top is not None and run[0] < top[1]:
            n = min(run[1], top[1]) - run[0]
            dup_count += n
            if node_of_session[run[5]] != node_of_session[top[5]]:
                cross += n
            if len(dup_examples) < 8:
                dup_examples.append({
                    "id": describe(run[0]), "count": n,
                    "origins": [origin(top[2], top[3], top[4], top[5]),
                                origin(run[2], run[3], run[4], run[5])]})
        if top is None or run[1] > top[1]:
            top = run
    result["duplicates"] = dup_count
    result["duplicates_across_nodes"] = cross
    result["duplicate_examples"] = dup_examples

    # (b) per session, strictly increasing in ack order
    order_violations = 0
    order_examples = []
    for w in writers:
        last = {}
        for sent, ack, sess, lo, hi in w.requests():
            prev = last.get(sess)
            for k in range(lo, hi):
                st = w.run_start[k]
                if prev is not None and st <= prev:
                    order_violations += 1
                    if len(order_examples) < 5:
                        order_examples.append({"session": sessions[sess][:3],
                                               "previous": describe(prev), "then": describe(st)})
                prev = st + w.run_len[k] - 1
            last[sess] = prev
    result["session_order_violations"] = order_violations
    result["session_order_examples"] = order_examples

    # (c) per (datacenter, worker): b.ack < a.sent, other node => max(b) < min(a)
    groups = defaultdict(list)    # dc << 5 | worker -> [(sent, ack, node, min, max)]
    per_node = defaultdict(list)  # node -> [(sent, ack, min, max)]
    for w in writers:
        for sent, ack, sess, lo, hi in w.requests():
            name = node_of_session[sess]
            span = {}
            for k in range(lo, hi):
                st = w.run_start[k]
                en = st + w.run_len[k] - 1
                key = (st >> 12) & 1023  # datacenter << 5 | worker
                m = span.get(key)
                span[key] = (st, en) if m is None else (min(m[0], st), max(m[1], en))
            for key, (mn, mx) in span.items():
                groups[key].append((sent, ack, name, mn, mx))
            if span:
                per_node[name].append((sent, ack, min(v[0] for v in span.values()),
                                       max(v[1] for v in span.values())))
    overlap = 0
    overlap_examples = []
    workers_seen = {}
    for key, reqs in groups.items():
        workers_seen[f"{key >> 5}/{key & 31}"] = sorted({r[2] for r in reqs})
        by_ack = sorted(reqs, key=lambda r: r[1])
        by_sent = sorted(reqs, key=lambda r: r[0])
        best1 = best2 = None  # (max id, node, request); best2: the best of the other nodes
        k = 0
        for a in by_sent:
            while k < len(by_ack) and by_ack[k][1] < a[0]:
                b = by_ack[k]
                k += 1
                if best1 is None or b[2] == best1[1]:
                    if best1 is None or b[4] > best1[0]:
                        best1 = (b[4], b[2], b)
                elif b[4] > best1[0]:
                    best2, best1 = best1, (b[4], b[2], b)
                elif best2 is None or b[4] > best2[0]:
                    best2 = (b[4], b[2], b)
            other = best1 if best1 is not None and best1[1] != a[2] else best2
            if other is not None and other[0] >= a[3]:
                overlap += 1
                if len(overlap_examples) < 8:
                    b = other[2]
                    overlap_examples.append({
                        "earlier": {"node": b[2], "id": describe(b[4]),
                                    "ack_s": round((b[1] - t0) / 1e9, 3)},
                        "later": {"node": a[2], "id": describe(a[3]),
                                  "sent_s": round((a[0] - t0) / 1e9, 3)}})
    result["overlap_violations"] = overlap
    result["overlap_examples"] = overlap_examples
    result["worker_ids_used"] = dict(sorted(workers_seen.items()))

    # (informational) per node, over all its sessions and restarts: real-time order
    node_order = {}
    for name, reqs in per_node.items():
        by_ack = sorted(reqs, key=lambda r: r[1])
        by_sent = sorted(reqs, key=lambda r: r[0])
        best, k, bad = None, 0, 0
        for a in by_sent:
            while k < len(by_ack) and by_ack[k][1] < a[0]:
                best = by_ack[k][3] if best is None else max(best, by_ack[k][3])
                k += 1
            if best is not None and best >= a[2]:
                bad += 1
        if bad:
            node_order[name] = bad
    result["node_order_regressions"] = node_order

    # (d) refusal time, errors by SQLSTATE, per node
    refusing, errors, ids_per_node = {}, {}, {}
    messages = Counter()
    for name, n in s.nodes.items():
        acks = sorted(a for w in n.writers for a in w.r_ack)
        errs = sorted(e for w in n.writers for e in w.err_t)
        starts = [w.first_t for w in n.writers if w.first_t]
        ends = [w.last_t for w in n.writers if w.last_t]
        if not starts:
            continue
        bounds = [min(starts)] + acks + [max(ends + acks[-1:])]
        total = longest = 0
        for lo, hi in zip(bounds, bounds[1:]):
            k = bisect.bisect_right(errs, lo)
            if k < len(errs) and errs[k] <= hi:
                total += hi - lo
                longest = max(longest, hi - lo)
        refusing[name] = {"seconds": round(total / 1e9, 2), "longest": round(longest / 1e9, 2)}
        c = Counter()
        for w in n.writers:
            c.update(w.errors)
        errors[name] = dict(sorted(c.items()))
        for w in n.writers:
            messages.update(w.messages)
        ids_per_node[name] = sum(w.id_count for w in n.writers)
    result["refusing"] = refusing
    result["error_messages"] = dict(messages.most_common(12))
    result["errors"] = errors
    result["ids_per_node"] = ids_per_node
    result["recovered_after_heal"] = getattr(s, "recovered", {})
    result["recovered_expected"] = getattr(s, "recovered_expected", 0)
    result["heal_wait_s"] = 10 * s.plan.ttl_ms / 1000.0
    result["liveness_ok"] = sum(result["recovered_after_heal"].values()) >= result["recovered_expected"]
    result["faults"] = {k: dict(v) for k, v in sorted(s.outcomes.items())}
    result["handovers_seen"] = dict(s.handovers)
    result["timeline"] = sorted(s.timeline, key=lambda e: e["start_s"])
    result["faults_injected"] = sum(v["done"] for k, v in s.outcomes.items()
                                    if k not in NOT_FAULTS)
    result["member_fault_gaps"] = member_fault_gaps(s)
    result["notes"] = s.notes
    result["ok"] = dup_count == 0 and order_violations == 0 and overlap == 0
    return result


# Faults after which no node should stop issuing for long: one etcd member of three lost,
# one sentinel of three lost.
MEMBER_FAULTS = {"etcd_member_kill", "etcd_member_stop", "etcd_member_restart", "sentinel_kill"}


def member_fault_gaps(s):
    """(informational) For each played member fault: the longest time, over the nodes with
    no fault of their own meanwhile, between two acknowledged IDs of the node within the
    fault and 2 s after it. Nodes waiting for an id (none issued in the window) are left out."""
    node_busy = defaultdict(list)
    registry_busy = []
    for e in s.timeline:
        if e.get("target") in s.nodes:
            node_busy[e["target"]].append((e["start_s"], e["end_s"]))
        elif e.get("kind") not in NOT_FAULTS and e["result"] == "done":
            registry_busy.append((e["start_s"], e["end_s"], e))
        if e.get("kind") == "registry_empty_then_clock":
            registry_busy.append((e["start_s"], e["end_s"], e))
    out = []
    for e in s.timeline:
        if e.get("kind") not in MEMBER_FAULTS or e["result"] != "done":
            continue
        lo, hi = e["start_s"], e["end_s"] + 2.0
        if any(x is not e and a <= hi and b >= lo - 3.0 for a, b, x in registry_busy):
            continue  # another registry fault meanwhile (or just before): not one member
        worst = None
        for name, n in s.nodes.items():
            if n.is_clone or any(a <= hi and b >= lo - 1.0 for a, b in node_busy[name]):
                continue
            lo_ns, hi_ns = s.t0_ns + int(lo * 1e9), s.t0_ns + int(hi * 1e9)
            acks = sorted(a for w in n.writers for a in w.r_ack if lo_ns <= a <= hi_ns)
            if not acks:
                continue
            pts = [lo_ns] + acks + [hi_ns]
            gap = max(b - a for a, b in zip(pts, pts[1:])) / 1e9
            if worst is None or gap > worst[0]:
                worst = (round(gap, 2), name)
        if worst is not None:
            out.append({"kind": e["kind"], "start_s": lo, "longest_gap_s": worst[0],
                        "node": worst[1]})
    return out


# ----------------------------------------------------------------------------------------
# Campaigns

def human(result):
    lines = [
        f"schedule {result['schedule']} (seed {result['seed']}, {result['registry']}, "
        f"{result['seconds']:g} s of faults, {result.get('wall_seconds', '?')} s wall): "
        f"{'OK' if result['ok'] else 'FOUND PROBLEMS'}",
        f"  IDs checked {result['ids_checked']} in {result['requests']} requests; "
        f"faults injected {result['faults_injected']}",
        f"  duplicates {result['duplicates']} ({result['duplicates_across_nodes']} across nodes), "
        f"session order violations {result['session_order_violations']}, "
        f"overlapping-ownership violations {result['overlap_violations']}",
        "  faults: " + ", ".join(f"{k} {v.get('done', 0)}"
                                 + (f" (+{v['skipped']} skipped)" if v.get("skipped") else "")
                                 + (f" (+{v['failed']} FAILED)" if v.get("failed") else "")
                                 for k, v in result["faults"].items()),
    ]
    for name, r in result["refusing"].items():
        lines.append(f"  {name}: {result['ids_per_node'].get(name, 0)} IDs, refusing "
                     f"{r['seconds']} s (longest {r['longest']} s), errors {result['errors'][name]}")
    if result.get("error_messages"):
        lines.append("  errors: " + "; ".join(f"{k} x{v}" for k, v in result["error_messages"].items()))
    gaps = result.get("member_fault_gaps")
    if gaps:
        g = sorted(x["longest_gap_s"] for x in gaps)
        lines.append(f"  (info) one registry member lost ({len(g)} faults): longest pause in "
                     f"issuing of an otherwise untouched node: median {g[len(g) // 2]} s, "
                     f"max {g[-1]} s")
    if result["node_order_regressions"]:
        lines.append(f"  (info) same-node real-time order regressions: {result['node_order_regressions']}")
    for ex in result["duplicate_examples"][:5]:
        lines.append(f"  duplicate {ex['id']}")
        for o in ex["origins"]:
            lines.append(f"      from {o['node']} (incarnation {o['incarnation']}, {o['writer']}) "
                         f"sent {o['sent_s']} s ack {o['ack_s']} s")
    for ex in result["overlap_examples"][:5]:
        lines.append(f"  overlap: {ex['earlier']['node']} acked {ex['earlier']['id']} at "
                     f"{ex['earlier']['ack_s']} s; later {ex['later']['node']} sent at "
                     f"{ex['later']['sent_s']} s got {ex['later']['id']}")
    times = [o["sent_s"] for ex in result["duplicate_examples"] for o in ex["origins"]]
    times += [ex["later"]["sent_s"] for ex in result["overlap_examples"]]
    if times:
        first = min(times)
        lines.append(f"  first problem at {first} s; faults played around it:")
        for e in result.get("timeline", []):
            if e["end_s"] >= first - 15 and e["start_s"] <= first + 1:
                lines.append(f"      {e['start_s']:7.2f}-{e['end_s']:7.2f} s  {e['event']}  "
                             f"[{e['result']}]")
    for ex in result["session_order_examples"][:3]:
        lines.append(f"  session order: {ex}")
    for note in result["notes"]:
        lines.append(f"  note: {note}")
    rec = result["recovered_after_heal"]
    if sum(rec.values()) < result.get("recovered_expected", len(rec)):
        lines.append(f"  LIVENESS: {result.get('heal_wait_s')} s after every fault was undone, "
                     f"fewer than {result.get('recovered_expected')} nodes issue IDs: {rec}")
    if "kept" in result:
        lines.append(f"  clusters and logs kept in {result['kept']}")
    return "\n".join(lines)


def schedule_seconds(minutes, schedules):
    """Fault-phase length of each schedule: its share of the wall time less setup/cooldown."""
    return max(15.0, round(minutes * 60.0 / schedules - 12.0, 1))


def registry_of(registry, index):
    """both: Redis and the coordinator alternate; all: Redis, coordinator, etcd, Sentinel."""
    if registry == "both":
        return ["redis", "pg"][index % 2]
    if registry == "all":
        return list(REGISTRIES)[index % len(REGISTRIES)]
    return registry


def plans(seed, minutes, registry, nodes=3, schedules=None, ttl=TTL, free=None, kinds=None):
    if schedules is None:
        schedules = max(1, round(minutes / 5.0))
        if registry == "both":
            schedules = max(2, schedules)
        elif registry == "all":
            schedules = max(len(REGISTRIES), schedules)
    seconds = schedule_seconds(minutes, schedules)
    return [Plan(seed, i, registry_of(registry, i), nodes, seconds, ttl, free,
                 only_kinds=kinds) for i in range(schedules)]


def run_plan(plan, verbose=True, keep=False):
    return Schedule(plan, verbose=verbose, keep=keep).run()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--registry", choices=list(REGISTRIES) + ["both", "all"], default="both",
                    help="both: redis and pg alternating; all: redis, pg, etcd, sentinel")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--schedules", type=int, default=None)
    ap.add_argument("--only", type=int, action="append",
                    help="run only schedule I of the campaign (repeatable)")
    ap.add_argument("--free", type=int, default=None,
                    help="worker ids left free for the nodes (default nodes + 1)")
    ap.add_argument("--ttl", default=TTL, help="snowflake.claim_ttl (default %(default)s)")
    ap.add_argument("--kinds", default=None,
                    help="comma-separated fault kinds to draw from (default: all); "
                         "e.g. claim_then_registry_crash,clock_step")
    ap.add_argument("--dry-run", action="store_true", help="print the schedules and exit")
    ap.add_argument("--keep", action="store_true", help="keep data directories and logs")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--keep-going", action="store_true",
                    help="run every schedule even after one found a problem")
    args = ap.parse_args(argv)
    if args.nodes < 1 or (args.free or args.nodes + 1) > WORKERS_PER_DC:
        ap.error("bad --nodes/--free")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    print(f"chaos: seed {seed} (replay: --seed {seed} --minutes {args.minutes:g} "
          f"--registry {args.registry} --nodes {args.nodes}"
          + (f" --schedules {args.schedules}" if args.schedules else "")
          + (f" --free {args.free}" if args.free else "")
          + (f" --ttl {args.ttl}" if args.ttl != TTL else "")
          + (f" --kinds {args.kinds}" if args.kinds else "") + ")", flush=True)
    kinds = set(args.kinds.split(",")) if args.kinds else None
    unknown = (kinds or set()) - set(NODE_KINDS) - set(REGISTRY_KINDS) - set(PG_ONLY_KINDS) \
        - set(ETCD_KINDS) - set(SENTINEL_KINDS)
    if unknown:
        ap.error(f"unknown fault kinds {sorted(unknown)}")
    ps = plans(seed, args.minutes, args.registry, args.nodes, args.schedules,
               args.ttl.strip("'"), args.free, kinds)
    if args.only:
        ps = [p for p in ps if p.index in args.only]
    for p in ps:
        print(p.text(), flush=True)
    if args.dry_run:
        return 0

    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    results = []
    failed = False
    not_run = []
    for p in ps:
        try:
            r = run_plan(p, verbose=not args.quiet, keep=args.keep)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            print(f"chaos: schedule {p.index} could not run: {e}", flush=True)
            if not args.keep_going:
                return 2
            not_run.append(p.index)  # --keep-going: the others still run; exit status 2
            continue
        results.append(r)
        print(human(r), flush=True)
        print("CHAOS-RESULT " + json.dumps(r, default=str), flush=True)
        if not r["ok"]:
            failed = True
            if not args.keep_going:
                break
    summary = {
        "seed": seed, "schedules": [r["schedule"] for r in results],
        "registries": [r["registry"] for r in results],
        "faults": dict(sum((Counter({k: v.get("done", 0) for k, v in r["faults"].items()})
                            for r in results), Counter())),
        "faults_injected": sum(r["faults_injected"] for r in results),
        "fault_seconds": round(sum(r["seconds"] for r in results), 1),
        "wall_seconds": round(sum(r.get("wall_seconds", 0) for r in results), 1),
        "member_fault_gaps_s": sorted(g["longest_gap_s"] for r in results
                                      for g in r.get("member_fault_gaps", [])),
        "ids_checked": sum(r["ids_checked"] for r in results),
        "duplicates": sum(r["duplicates"] for r in results),
        "session_order_violations": sum(r["session_order_violations"] for r in results),
        "overlap_violations": sum(r["overlap_violations"] for r in results),
        "refusing_seconds": {f"{r['schedule']}/{n}": v["seconds"]
                             for r in results for n, v in r["refusing"].items()},
        "failed_schedules": [r["schedule"] for r in results if not r["ok"]],
        "schedules_not_run": not_run,
        "ok": not failed,
    }
    print("CHAOS-SUMMARY " + json.dumps(summary), flush=True)
    print(f"chaos: seed {seed}: {len(results)} schedule(s), {summary['faults_injected']} faults, "
          f"{summary['ids_checked']} IDs checked, {summary['duplicates']} duplicates, "
          f"{summary['session_order_violations']} session order violations, "
          f"{summary['overlap_violations']} overlap violations: "
          f"{'OK' if not failed else 'FAILED'}", flush=True)
    return 1 if failed else 2 if not_run else 0


if __name__ == "__main__":
    sys.exit(main())
