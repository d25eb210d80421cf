#!/usr/bin/env python3
"""A/B of two builds of the library on one cluster: the per-row cost of snowflake_next()
and snowflake_next_batch(), with nextval() measured in the same round as a yardstick.

Rounds alternate the builds (A B, B A, ...): each swaps the library file, restarts the
server, discards one warm-up query, then times each expression once. On a shared, noisy
machine the paired figure (B's time over A's in adjacent runs) is the one to read.
Run by scripts/bench-ab.sh, which builds both libraries and the cluster."""
import argparse
import os
import shutil
import statistics
import subprocess
import time

import psycopg

QUERIES = {
    "nextval()": "SELECT count(nextval('ab_seq')) FROM generate_series(1, {n})",
    "snowflake_next()": "SELECT count(snowflake_next()) FROM generate_series(1, {n})",
    "snowflake_next_batch(4096) x n/4096":
        "SELECT sum(cardinality(snowflake_next_batch(4096))) FROM generate_series(1, {n} / 4096)",
}


def restart(args):
    subprocess.run(["runuser", "-u", "postgres", "--", f"{args.pg_bin}/pg_ctl", "-D", args.data,
                    "-w", "-l", os.path.join(args.data, "server.log"), "restart"],
                   check=True, capture_output=True)


def timed(conn, sql):
    started = time.perf_counter()
    conn.execute(sql)
    return time.perf_counter() - started


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pg-bin", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--installed", required=True, help="the library path the server loads")
    p.add_argument("--a", required=True, help="library file of build A")
    p.add_argument("--b", required=True, help="library file of build B")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args()
    times_of = {"A": [], "B": []}  # per round: {query: seconds}
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            # A new file renamed into place: the running server keeps its mapping of the old one
            # (overwriting a loaded library in place crashes it).
            shutil.copyfile(args.a if name == "A" else args.b, args.installed + ".new")
            os.replace(args.installed + ".new", args.installed)
            restart(args)
            with psycopg.connect(host=args.data, port=args.port, user="postgres",
                                 dbname="postgres", autocommit=True) as conn:
                conn.execute("CREATE SEQUENCE IF NOT EXISTS ab_seq")
                conn.execute("SET max_parallel_workers_per_gather = 0")
                conn.execute(QUERIES["snowflake_next()"].format(n=args.rows))  # warm-up
                times = {q: timed(conn, sql.format(n=args.rows)) for q, sql in QUERIES.items()}
            times_of[name].append(times)
            print(f"round {r + 1} {name}: " + ", ".join(
                f"{q} {t * 1000:.0f} ms" for q, t in times.items()), flush=True)
    print(f"\n{args.rounds} rounds, {args.rows:,} rows. Medians: time in ms; time relative to "
          "nextval() in the same round; B's time over A's in the same round (paired; below 1 "
          "is B faster):")
    for q in QUERIES:
        med = {n: statistics.median(t[q] for t in times_of[n]) * 1000 for n in ("A", "B")}
        rel = {n: statistics.median(t[q] / t["nextval()"] for t in times_of[n]) for n in ("A", "B")}
        paired = statistics.median(b[q] / a[q] for a, b in zip(times_of["A"], times_of["B"]))
        print(f"  {q}: A {med['A']:.0f} ms ({rel['A']:.2f} of nextval), "
              f"B {med['B']:.0f} ms ({rel['B']:.2f} of nextval); B/A {paired:.3f}")

if __name__ == "__main__":
    main()
