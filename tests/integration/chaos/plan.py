"""The chaos campaign: the schedule, a pure function of the seed."""

import random
import time
from collections import Counter

from fixtures.clusters import TTL
from fixtures.ids import TWITTER_EPOCH_MS, decode

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
