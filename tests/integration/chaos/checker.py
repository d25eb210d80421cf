"""The chaos campaign: the checker, (a) to (d) of the package's docstring over everything a
schedule's writers recorded, and its report."""

import bisect
from collections import Counter, defaultdict

from .plan import NOT_FAULTS, describe


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
    # How long each composite fault played waited for its moment (schedule.Schedule._moment).
    result["moment_waits_s"] = sorted(getattr(s, "moment_waits", []))
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
