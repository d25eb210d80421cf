#!/usr/bin/env python3
"""The benchmark suite: every figure in one run, side by side, against one cluster.

Run it through scripts/bench.sh (which builds the release library and starts the cluster).
Writes bench/results.json, bench/results.md and bench/chart.svg.

Ratios between generators measured in the same run are the headline: the machine is shared
and noisy, so absolute numbers are secondary. Every timing is the median of several runs,
and the runs of different generators are interleaved.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import psycopg

PG_BIN = os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")
HERE = os.path.dirname(os.path.abspath(__file__))
CAP_PER_MS = 4096


def connect(args):
    return psycopg.connect(host=args.host, port=args.port, user="postgres", dbname="postgres",
                           autocommit=True)


def timed(conn, sql):
    started = time.perf_counter()
    cur = conn.execute(sql)
    if cur.description:
        cur.fetchall()
    return time.perf_counter() - started


def set_drift(conn, value):
    conn.execute(f"ALTER SYSTEM SET snowflake.max_clock_drift = '{value}'")
    conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.3)
    # Let the ID clock fall back to the wall clock before measuring.
    time.sleep(1.2)


def per_row(conn, args, server_major):
    """1. SELECT count(f()) FROM generate_series(1, N), parallel workers off."""
    n = args.rows
    exprs = {
        "generate_series (floor)": "count(*)",
        "clock_timestamp()": "count(clock_timestamp())",
        "nextval()": "count(nextval('bench_seq'))",
        "gen_random_uuid()": "count(gen_random_uuid())",
        "snowflake_next()": "count(snowflake_next())",
    }
    if server_major >= 18:
        exprs["uuidv7()"] = "count(uuidv7())"
    if conn.execute("""SELECT count(*) FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
                        WHERE s.nspname = 'snowflake' AND p.proname = 'nextval'""").fetchone()[0]:
        exprs["pgEdge snowflake.nextval()"] = "count(snowflake.nextval())"
    conn.execute("CREATE SEQUENCE IF NOT EXISTS bench_seq")
    conn.execute("SET max_parallel_workers_per_gather = 0")
    conn.execute("SET client_min_messages = error")
    times = {name: [] for name in exprs}
    strict = []
    for _ in range(args.repeat):
        for name, expr in exprs.items():
            times[name].append(timed(conn, f"SELECT {expr} FROM generate_series(1, {n})"))
    set_drift(conn, 0)
    for _ in range(args.repeat):
        strict.append(timed(conn, f"SELECT count(snowflake_next()) FROM generate_series(1, {n})"))
    set_drift(conn, "1s")
    times["snowflake_next() strict (max_clock_drift = 0)"] = strict
    floor = statistics.median(times["generate_series (floor)"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({
            "expression": name,
            "median_s": med,
            "ids_per_s": n / med,
            "ns_per_call_above_floor": None if name.startswith("generate_series") else (med - floor) / n * 1e9,
            "runs": ts,
        })
    return rows


def cap_utilisation(conn, args):
    """2. In strict mode, IDs per used millisecond, for single calls and for batches."""
    set_drift(conn, 0)
    single, batch = [], []
    n = args.rows
    for _ in range(3):
        single.append(conn.execute(
            f"""SELECT count(*)::float8 / count(DISTINCT id >> 22)
                  FROM (SELECT snowflake_next() AS id FROM generate_series(1, {n})) s""").fetchone()[0])
        batch.append(conn.execute(
            """SELECT count(*)::float8 / count(DISTINCT x >> 22)
                 FROM unnest(snowflake_next_batch(1000000)) AS x""").fetchone()[0])
    set_drift(conn, "1s")
    return {
        "single_ids_per_used_ms": statistics.median(single),
        "batch_ids_per_used_ms": statistics.median(batch),
        "cap_per_ms": CAP_PER_MS,
        "single_utilisation": statistics.median(single) / CAP_PER_MS,
        "batch_utilisation": statistics.median(batch) / CAP_PER_MS,
    }


def batch_api(conn, args):
    """3. snowflake_next_batch(1000000): one call, and 8 calls back to back (sustained).

    In the default mode a single call borrows up to 1 s of future milliseconds, so it
    returns at memory speed; the sustained rate of several calls is bounded by the cap.
    """
    out = {}
    for label, drift in (("strict (max_clock_drift = 0)", 0), ("default (max_clock_drift = 1s)", "1s")):
        set_drift(conn, drift)
        one = [timed(conn, "SELECT cardinality(snowflake_next_batch(1000000))") for _ in range(args.repeat)]
        time.sleep(1.2)
        sustained = []
        for _ in range(3):
            sustained.append(timed(conn, """SELECT sum(cardinality(snowflake_next_batch(1000000)))
                                              FROM generate_series(1, 8)"""))
            time.sleep(1.2)
        out[label] = {
            "one_call_median_s": statistics.median(one),
            "one_call_ids_per_s": 1_000_000 / statistics.median(one),
            "sustained_median_s": statistics.median(sustained),
            "sustained_ids_per_s": 8_000_000 / statistics.median(sustained),
            "runs": one, "sustained_runs": sustained,
        }
    set_drift(conn, "1s")
    return out


def set_sequence_start(conn, value):
    conn.execute(f"ALTER SYSTEM SET snowflake.sequence_start = '{value}'")
    conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.3)


def sequence_start(conn, args):
    """6. snowflake.sequence_start: at low traffic (one ID per 2 ms), the share of even IDs
    and of the fullest of 8 shards (id % 8); saturated (strict mode), IDs per used ms."""
    out = {}
    for mode in ("zero", "random"):
        set_sequence_start(conn, mode)
        ids = [r[0] for r in conn.execute(
            "SELECT snowflake_next(), pg_sleep(0.002) FROM generate_series(1, 500)").fetchall()]
        shards = [sum(1 for i in ids if i % 8 == k) for k in range(8)]
        set_drift(conn, 0)
        per_ms = [conn.execute(
            f"""SELECT count(*)::float8 / count(DISTINCT id >> 22)
                  FROM (SELECT snowflake_next() AS id FROM generate_series(1, {args.rows})) s""").fetchone()[0]
            for _ in range(3)]
        set_drift(conn, "1s")
        out[mode] = {
            "low_traffic_even_share": sum(1 for i in ids if i % 2 == 0) / len(ids),
            "low_traffic_largest_of_8_shards": max(shards) / len(ids),
            "saturated_ids_per_used_ms": statistics.median(per_ms),
        }
    set_sequence_start(conn, "zero")
    return out


def key_tables(server_major):
    keys = {
        "snowflake_next()": "id bigint PRIMARY KEY DEFAULT snowflake_next()",
        "bigserial": "id bigserial PRIMARY KEY",
        "gen_random_uuid()": "id uuid PRIMARY KEY DEFAULT gen_random_uuid()",
    }
    if server_major >= 18:
        keys["uuidv7()"] = "id uuid PRIMARY KEY DEFAULT uuidv7()"
    return keys


def pgbench_tps(pg_bin, host, port, script, clients, seconds):
    """Runs pgbench as the postgres user on `script` (a file it can read) for `seconds`;
    returns its transactions per second (without connection time)."""
    cmd = ["runuser", "-u", "postgres", "--", f"{pg_bin}/pgbench", "-n", "-h", host,
           "-p", str(port), "-U", "postgres", "-c", str(clients),
           "-j", str(min(clients, 2)), "-T", str(seconds), "-f", script, "postgres"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return next(float(line.split("=")[1].split()[0]) for line in out.splitlines()
                if line.startswith("tps ="))


def pgbench(conn, args, server_major):
    """4. INSERT ... DEFAULT with pgbench at 1, 2, 4 and 8 clients."""
    keys = key_tables(server_major)
    results = {name: {} for name in keys}
    for i, (name, column) in enumerate(keys.items()):
        conn.execute(f"DROP TABLE IF EXISTS pgb_{i}")
        conn.execute(f"CREATE TABLE pgb_{i} ({column}, v int)")
    for clients in args.clients:
        for rep in range(args.pgbench_repeat):
            order = list(enumerate(keys))
            if rep % 2:
                order.reverse()
            for i, name in order:
                script = os.path.join(args.workdir, f"pgb_{i}.sql")
                with open(script, "w") as f:
                    f.write(f"INSERT INTO pgb_{i} (v) VALUES (1);\n")
                os.chmod(script, 0o644)
                tps = pgbench_tps(PG_BIN, args.host, args.port, script, clients, args.pgbench_seconds)
                results[name].setdefault(clients, []).append(tps)
    return {name: {c: statistics.median(v) for c, v in per.items()} for name, per in results.items()}


def storage(conn, args, server_major):
    """5. Load time, table and primary-key sizes at N rows; time-order vs random-order index."""
    n = args.storage_rows
    out = {}
    for name, column in key_tables(server_major).items():
        conn.execute("DROP TABLE IF EXISTS st, st_random")
        conn.execute(f"CREATE TABLE st ({column}, v int)")
        load = timed(conn, f"INSERT INTO st (v) SELECT g FROM generate_series(1, {n}) g")
        conn.execute("VACUUM ANALYZE st")
        table, index = conn.execute(
            "SELECT pg_relation_size('st'), pg_relation_size('st_pkey')").fetchone()
        idtype = "uuid" if "uuid" in name else "bigint"
        conn.execute(f"CREATE TABLE st_random (id {idtype} PRIMARY KEY)")
        random_load = timed(conn, "INSERT INTO st_random SELECT id FROM st ORDER BY random()")
        conn.execute("DROP TABLE IF EXISTS st_sorted")
        conn.execute(f"CREATE TABLE st_sorted (id {idtype} PRIMARY KEY)")
        sorted_load = timed(conn, "INSERT INTO st_sorted SELECT id FROM st ORDER BY id")
        random_index = conn.execute("SELECT pg_relation_size('st_random_pkey')").fetchone()[0]
        sorted_index = conn.execute("SELECT pg_relation_size('st_sorted_pkey')").fetchone()[0]
        out[name] = {
            "load_s": load, "table_bytes": table, "pkey_bytes": index,
            "pkey_bytes_time_order_inserts": sorted_index, "pkey_bytes_random_order_inserts": random_index,
            "time_order_insert_s": sorted_load, "random_order_insert_s": random_load,
        }
        conn.execute("DROP TABLE st, st_random, st_sorted")
    return out


def mb(b):
    return f"{b / 1048576:.0f} MB"


def write_markdown(res, path):
    lines = [f"# Benchmark results ({res['when']})", "",
             f"PostgreSQL {res['server_version']}, {res['cpus']} CPUs; {res['note']}", "",
             f"## 1. Per-row, one session: `SELECT count(f()) FROM generate_series(1, {res['rows']:,})`", "",
             f"Median of {res['repeat']} runs, parallel workers off.", "",
             "| expression | median time | IDs/s | ns per call above the floor |",
             "|---|---:|---:|---:|"]
    for r in res["per_row"]:
        ns = "" if r["ns_per_call_above_floor"] is None else f"{r['ns_per_call_above_floor']:.0f}"
        lines.append(f"| `{r['expression']}` | {r['median_s'] * 1000:.0f} ms | {r['ids_per_s'] / 1e6:.2f} M | {ns} |")
    h = res["headline"]
    lines += ["", f"- `snowflake_next()` / `nextval()` throughput: **{h['snowflake_vs_nextval']:.2f}x**",
              f"- per-call cost above the floor, `snowflake_next()` / `clock_timestamp()`: **{h['snowflake_vs_clock_cost']:.2f}x**",
              f"- `pgEdge snowflake.nextval()`: {res['pgedge']}", "",
              "## 2. Cap utilisation (strict mode, `snowflake.max_clock_drift = 0`)", "",
              f"- single calls: **{res['cap']['single_ids_per_used_ms']:.0f}** IDs per used millisecond "
              f"({res['cap']['single_utilisation'] * 100:.1f}% of 4,096)",
              f"- `snowflake_next_batch(1000000)`: **{res['cap']['batch_ids_per_used_ms']:.0f}** IDs per used millisecond "
              f"({res['cap']['batch_utilisation'] * 100:.1f}%)", "",
              "## 3. Batch API: `snowflake_next_batch(1000000)`", "",
              "| mode | one call | IDs/s, one call | 8 calls back to back | IDs/s, sustained |",
              "|---|---:|---:|---:|---:|"]
    for mode, b in res["batch"].items():
        lines.append(f"| {mode} | {b['one_call_median_s'] * 1000:.1f} ms | {b['one_call_ids_per_s'] / 1e6:.2f} M | "
                     f"{b['sustained_median_s'] * 1000:.0f} ms | {b['sustained_ids_per_s'] / 1e6:.2f} M |")
    lines += ["", "In the default mode a call borrows future milliseconds (up to `max_clock_drift`, 1 s) "
              "and returns at memory speed; 8 M IDs in a row still borrow most of that second, so the "
              "default-mode rates are bursts. Over longer runs every mode converges to 4,096 IDs per "
              "millisecond; the strict rows show that limit."]
    lines += ["", f"## 4. pgbench: `INSERT INTO t (v) VALUES (1)` with the key as DEFAULT "
              f"({res['pgbench_seconds']} s per run, median of {res['pgbench_repeat']}, synchronous_commit = off)", "",
              "| key | " + " | ".join(f"{c} client{'s' if c > 1 else ''}" for c in res["clients"]) + " |",
              "|---|" + "---:|" * len(res["clients"])]
    for name, per in res["pgbench"].items():
        lines.append(f"| `{name}` | " + " | ".join(f"{per[c]:.0f}" for c in res["clients"]) + " |")
    lines.append("| snowflake / bigserial | " + " | ".join(
        f"**{res['pgbench']['snowflake_next()'][c] / res['pgbench']['bigserial'][c]:.2f}**" for c in res["clients"]) + " |")
    lines += ["", f"The machine has {res['cpus']} cores: above 2 clients, clients queue for CPU.", "",
              f"## 5. Storage at {res['storage_rows']:,} rows", "",
              "| key | load | table | primary key | pkey, time-order inserts | pkey, random-order inserts |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, s in res["storage"].items():
        lines.append(f"| `{name}` | {s['load_s']:.1f} s | {mb(s['table_bytes'])} | {mb(s['pkey_bytes'])} | "
                     f"{mb(s['pkey_bytes_time_order_inserts'])} | {mb(s['pkey_bytes_random_order_inserts'])} |")
    lines += ["", "## 6. `snowflake.sequence_start`", "",
              "Low traffic: 500 IDs, one per 2 ms. Saturated: strict mode, single calls.", "",
              "| setting | even IDs, low traffic | fullest of 8 shards (`id % 8`), low traffic | IDs per used ms, saturated |",
              "|---|---:|---:|---:|"]
    for mode, r in res["sequence_start"].items():
        lines.append(f"| `{mode}` | {r['low_traffic_even_share'] * 100:.0f}% | "
                     f"{r['low_traffic_largest_of_8_shards'] * 100:.0f}% (even: 12.5%) | "
                     f"{r['saturated_ids_per_used_ms']:.0f} |")
    lines += ["", "![chart](chart.svg)", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_svg(res, path):
    """Two horizontal bar charts: per-row IDs/s, and pgbench TPS at each client count."""
    bars = [(r["expression"], r["ids_per_s"] / 1e6) for r in res["per_row"]]
    width, left, bar_h, gap = 820, 300, 18, 6
    top = 40
    height1 = top + len(bars) * (bar_h + gap) + 30
    groups = res["pgbench"]
    clients = res["clients"]
    height2 = 40 + len(clients) * (len(groups) * (bar_h - 4) + 14) + 40
    height = height1 + height2
    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           '<title>Per-row IDs per second, one session</title>',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="20" font-size="14" font-weight="bold">Per-row IDs per second (millions), one session, {res["rows"]:,} rows</text>']
    peak = max(v for _, v in bars) or 1
    for i, (name, v) in enumerate(bars):
        y = top + i * (bar_h + gap)
        w = (width - left - 80) * v / peak
        color = "#e15759" if name.startswith("snowflake") else "#4e79a7"
        out.append(f'<text x="{left - 8}" y="{y + 13}" text-anchor="end">{name}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
        out.append(f'<text x="{left + w + 5:.1f}" y="{y + 13}">{v:.2f}</text>')
    cap_x = left + (width - left - 80) * 4.096 / peak
    out.append(f'<line x1="{cap_x:.1f}" y1="{top - 5}" x2="{cap_x:.1f}" y2="{height1 - 25}" stroke="#333" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{cap_x + 3:.1f}" y="{height1 - 12}">4.096 M/s: one worker\'s cap</text>')
    y = height1 + 20
    out.append(f'<text x="10" y="{y}" font-size="14" font-weight="bold">pgbench INSERT transactions per second, by clients</text>')
    peak2 = max(v for per in groups.values() for v in per.values()) or 1
    y += 20
    for c in clients:
        out.append(f'<text x="10" y="{y + 12}" font-weight="bold">{c} client{"s" if c > 1 else ""}</text>')
        for k, (name, per) in enumerate(groups.items()):
            w = (width - left - 80) * per[c] / peak2
            out.append(f'<text x="{left - 8}" y="{y + 11}" text-anchor="end">{name}</text>')
            out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h - 6}" fill="{colors[k % len(colors)]}"/>')
            out.append(f'<text x="{left + w + 5:.1f}" y="{y + 11}">{per[c]:.0f}</text>')
            y += bar_h - 4
        y += 14
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--pgbench-seconds", type=int, default=8)
    p.add_argument("--pgbench-repeat", type=int, default=3)
    p.add_argument("--storage-rows", type=int, default=10_000_000)
    p.add_argument("--out", default=HERE)
    args = p.parse_args()

    with connect(args) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000
        conn.execute("CREATE EXTENSION IF NOT EXISTS snowflake")
        print("per-row ...", file=sys.stderr)
        rows = per_row(conn, args, major)
        print("cap utilisation ...", file=sys.stderr)
        cap = cap_utilisation(conn, args)
        print("batch ...", file=sys.stderr)
        batch = batch_api(conn, args)
        print("pgbench ...", file=sys.stderr)
        bench = pgbench(conn, args, major)
        print("storage ...", file=sys.stderr)
        store = storage(conn, args, major)
        print("sequence start ...", file=sys.stderr)
        starts = sequence_start(conn, args)

    by = {r["expression"]: r for r in rows}
    res = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "server_version": version,
        "cpus": os.cpu_count(),
        "note": "release build (fat LTO), shared_preload_libraries = 'snowflake', worker id 1",
        "rows": args.rows, "repeat": args.repeat,
        "per_row": rows, "cap": cap, "batch": batch,
        "clients": args.clients, "pgbench_seconds": args.pgbench_seconds,
        "pgbench_repeat": args.pgbench_repeat, "pgbench": bench,
        "storage_rows": args.storage_rows, "storage": store,
        "sequence_start": starts,
        "pgedge": "included" if "pgEdge snowflake.nextval()" in by else
                  "not installed, skipped (its extension is also named \"snowflake\", so it cannot be installed next to this one)",
        "headline": {
            "snowflake_vs_nextval": by["snowflake_next()"]["ids_per_s"] / by["nextval()"]["ids_per_s"],
            "snowflake_vs_clock_cost": by["snowflake_next()"]["ns_per_call_above_floor"]
            / by["clock_timestamp()"]["ns_per_call_above_floor"],
        },
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=2, default=str)
    write_markdown(res, os.path.join(args.out, "results.md"))
    write_svg(res, os.path.join(args.out, "chart.svg"))
    print(open(os.path.join(args.out, "results.md")).read())


if __name__ == "__main__":
    main()
