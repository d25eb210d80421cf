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
    python3 -m chaos --minutes 10 --seed 42 --registry both [--nodes 3] [--schedules K]
    python3 -m chaos --seed 42 --registry pg --dry-run        (print the schedules only)
    python3 -m chaos --seed 4 --minutes 1.2 --registry redis --schedules 1 --kinds handover
    python3 -m chaos --minutes 30 --registry etcd|sentinel|all   (all: the four alternate)
Schedule i of seed S is a pure function of (S, i, registry, nodes, length, ttl, free, kinds):
the same arguments replay the same schedule (--only I runs schedule I alone). What happens
when it is played still depends on timing (a fault finding its node busy is skipped, and
reported so). Exit status 1 when the checker found a duplicate or an order violation, 2 on a
usage or setup error. Liveness (nodes not issuing again after every fault was undone) is
reported, not failed.

The package, one module per part: plan (the schedule, a pure function of the seed),
processes, registries (the campaign's variants of fixtures.registries' servers),
etcd_sentinel (three etcd members; Redis behind three Sentinels), fleet (nodes and their
writers), schedule (one schedule played), checker, campaign (plans, main).
"""

from .campaign import main, plans, run_plan
from .checker import check, human
from .fleet import Node, Writer
from .plan import Plan
from .schedule import Schedule

__all__ = ["Node", "Plan", "Schedule", "Writer", "check", "human", "main", "plans", "run_plan"]
