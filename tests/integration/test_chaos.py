"""A short randomized fault campaign (the chaos package) for snowflake.worker_id = 'auto': fixed seeds,
every registry (Redis, the PostgreSQL coordinator, etcd, Redis Sentinel), about 50 s each (3 nodes, claim_ttl 2 s, all but 3-4 worker ids of the
datacenter held by fake live servers). The checker must find no ID issued twice, no session
whose IDs do not increase, and no ID issued by one node under a (datacenter, worker) after a
higher one another node had issued under it. Long campaigns: scripts/chaos.sh.

Each schedule runs on one major of the test command: the faults are the same on every major,
and the four majors' suites run at once, so the schedules are spread over them to even out
their lengths (two on 15, two on 17, two on 18: 16 has the registry HA suite). When the run
lacks a schedule's major (PG_MAJORS), it runs on the run's first major;
SNOWFLAKE_CHAOS_MAJOR=N runs them all on N."""

import json
import os
import unittest

import chaos
from harness import PG_MAJOR, report_figure

FORCED_MAJOR = os.environ.get("SNOWFLAKE_CHAOS_MAJOR")
RUN_MAJORS = os.environ.get("PG_MAJORS", PG_MAJOR).split()
SECONDS = float(os.environ.get("SNOWFLAKE_CHAOS_SECONDS", "40"))  # of faults, per schedule


def on_major(preferred):
    """Runs the schedule only in the suite of its major (see the module's docstring)."""
    major = FORCED_MAJOR or (preferred if preferred in RUN_MAJORS else RUN_MAJORS[0])
    return unittest.skipUnless(PG_MAJOR == major,
                               f"this schedule runs on PostgreSQL {major} (test_chaos)")


class ShortChaosCampaign(unittest.TestCase):

    def campaign(self, seed, registry, kinds=None):
        plan = chaos.Plan(seed, 0, registry, nodes=3, seconds=SECONDS, only_kinds=kinds)
        result = chaos.run_plan(plan, verbose=False)
        report = chaos.human(result)
        print(f"\n{plan.text()}\n{report}", flush=True)
        # How long each node refused, and the pause of an untouched node while a registry
        # member was lost, are figures (they depend on the load as much as on the code):
        # reported into the test command's summary, never a pass/fail bound.
        for name, r in result["refusing"].items():
            report_figure(f"{registry} {name} refusing",
                          f"{r['seconds']} s (longest {r['longest']} s) of "
                          f"{result['seconds']:g} s of faults; {result['ids_per_node'].get(name, 0)}"
                          f" IDs; errors {result['errors'][name]}")
        gaps = sorted(x["longest_gap_s"] for x in result.get("member_fault_gaps") or [])
        if gaps:
            report_figure(f"{registry} pause of an untouched node while a member was lost",
                          f"median {gaps[len(gaps) // 2]} s, max {gaps[-1]} s "
                          f"({len(gaps)} faults)")
        played = result["faults_injected"]
        skipped = sum(v.get("skipped", 0) for v in result["faults"].values())
        waits = result.get("moment_waits_s") or []
        report_figure(f"{registry} seed {seed} faults played",
                      f"{played} played, {skipped} skipped"
                      + (f"; composites waited for their moment up to {waits[-1]} s "
                         f"(median {waits[len(waits) // 2]} s)" if waits else ""))
        # Not a vacuous run. A composite fault waits for its moment (its nodes free, the
        # holder holding an id) until the end of the fault phase, and is skipped only if it
        # did not come by then: on a loaded machine, where each composite lasts longer, a
        # 40 s schedule of composites plays fewer of them (none only if no holder held an
        # id in the whole phase).
        self.assertGreaterEqual(played, 1 if kinds else 4, report)
        self.assertGreater(result["ids_checked"], 1000, report)
        found = {k: result[k] for k in ("duplicates", "session_order_violations",
                                        "overlap_violations")}
        self.assertEqual(found, {"duplicates": 0, "session_order_violations": 0,
                                 "overlap_violations": 0},
                         f"{report}\n{json.dumps(result, default=str)[:4000]}")

    # Seeds whose schedules cover the most fault kinds (12 to 15 each), composites included.
    @on_major("17")
    def test_redis_seed_1(self):
        self.campaign(1, "redis")

    @on_major("15")
    def test_coordinator_seed_8(self):
        self.campaign(8, "pg")

    # Schedules of the composite faults by which ids change hands: they found duplicates in
    # 0.4.0 within a minute (a holder's blocks ahead of the clock and a clock step back at the
    # handover; a coordinator crash restart losing a fresh claim while a rival waits).
    @on_major("18")
    def test_redis_handovers_seed_4(self):
        self.campaign(4, "redis", kinds=["handover"])

    @on_major("15")
    def test_coordinator_lost_claims_seed_5(self):
        self.campaign(5, "pg", kinds=["claim_then_registry_crash", "handover"])

    # Three etcd members: a member (the leader or another) killed, frozen and restarted; the
    # cluster wiped and restarted empty, and restored from an older snapshot; handovers.
    @on_major("17")
    def test_etcd_seed_78(self):
        self.campaign(78, "etcd")

    # A Redis master and replica under three sentinels: the master killed (failover, the old
    # one back as a replica), frozen past the failover, restarted empty and from an old dump,
    # the replica killed, manual failovers, and three times a master frozen until the
    # failover, continued (a stale master the sentinels have not demoted yet) and the new
    # master switched away from at once (SENTINEL FAILOVER). Two free ids for three nodes:
    # one always waits. (This schedule found duplicates in 0.7.0: the stale master keeps its
    # run_id and replication id, so failing back to it is not a new incarnation.)
    @on_major("18")
    def test_sentinel_seed_82(self):
        self.campaign(82, "sentinel")


if __name__ == "__main__":
    unittest.main()
