"""The chaos campaign: a seed's schedules played one after another, and the command line
(python3 -m chaos)."""

import argparse
import json
import random
import signal
import sys
import traceback
from collections import Counter

from fixtures.clusters import TTL

from .checker import human
from .plan import (
    ETCD_KINDS,
    NODE_KINDS,
    PG_ONLY_KINDS,
    REGISTRIES,
    REGISTRY_KINDS,
    SENTINEL_KINDS,
    WORKERS_PER_DC,
    Plan,
)
from .schedule import Schedule


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
    ap = argparse.ArgumentParser(prog="python3 -m chaos",
                                 description=sys.modules[__package__].__doc__.split("\n\n")[0])
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
