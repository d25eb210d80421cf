#!/usr/bin/env python3
"""A/B of two builds of the library on one cluster: the per-row cost of snowflake_next()
and snowflake_next_batch() in one statement, and the per-transaction cost of a transaction
that asks for one ID (pgbench, one client), with nextval() measured in the same round as a
yardstick. The per-transaction figure is the one that includes what a transaction's start
and end cost the extension (the watermark's hold is taken once per transaction and released
at its end).

Rounds alternate the builds (A B, B A, ...): each swaps the library file, restarts the
server, discards one warm-up query, then times each expression once. On a shared, noisy
machine the paired figure (B's over A's in adjacent runs) is the one to read.
Run by scripts/bench-ab.sh, which builds both libraries and the cluster."""
import argparse
import os
import shutil
import statistics
import subprocess

import psycopg

from bench import pgbench_tps, timed

# In both tables the first entry, nextval(), is the yardstick of its round.
QUERIES = {
    "nextval()": "SELECT count(nextval('ab_seq')) FROM generate_series(1, {n})",
    "snowflake_next()": "SELECT count(snowflake_next()) FROM generate_series(1, {n})",
    "snowflake_next_batch(4096) x n/4096":
        "SELECT sum(cardinality(snowflake_next_batch(4096))) FROM generate_series(1, {n} / 4096)",
}


# One transaction per pgbench script execution (autocommit), one client.
TRANSACTIONS = {
    "nextval(), one per transaction": "SELECT nextval('ab_seq');",
    "snowflake_next(), one per transaction": "SELECT snowflake_next();",
}


def restart(args):
    subprocess.run(["runuser", "-u", "postgres", "--", f"{args.pg_bin}/pg_ctl", "-D", args.data,
                    "-w", "-l", os.path.join(args.data, "server.log"), "restart"],
                   check=True, capture_output=True)


def transactions_per_s(args, script):
    """pgbench with one client for --txn-seconds; returns its tps (without connection time)."""
    path = os.path.join(args.workdir, "ab-txn.sql")
    with open(path, "w") as f:
        f.write(script + "\n")
    os.chmod(path, 0o644)
    return pgbench_tps(args.pg_bin, args.data, args.port, path, 1, args.txn_seconds)


def compare(per_round, q, yardstick):
    """For measure `q`: each build's median, each build's median relative to `yardstick` in
    the same round, and the median of B over A in the same round."""
    med = {n: statistics.median(t[q] for t in per_round[n]) for n in ("A", "B")}
    rel = {n: statistics.median(t[q] / t[yardstick] for t in per_round[n]) for n in ("A", "B")}
    paired = statistics.median(b[q] / a[q] for a, b in zip(per_round["A"], per_round["B"]))
    return med, rel, paired


def summary(args, times_of, tps_of):
    """The medians as Markdown lines."""
    lines = [f"{args.rounds} rounds alternating the builds; {args.rows:,} rows per statement, "
             f"{args.txn_seconds} s of pgbench (1 client) per transaction kind. Medians. "
             "\"Paired\" is B over A in the same round.", "",
             "| measure | A | B | A, of nextval() | B, of nextval() | paired B/A |",
             "|---|---:|---:|---:|---:|---:|"]
    for q in QUERIES:
        med, rel, paired = compare(times_of, q, next(iter(QUERIES)))
        lines.append(f"| `{q}`, time | {med['A'] * 1000:.0f} ms | {med['B'] * 1000:.0f} ms | "
                     f"{rel['A']:.2f} | {rel['B']:.2f} | **{paired:.3f}** |")
    for q in TRANSACTIONS:
        med, rel, paired = compare(tps_of, q, next(iter(TRANSACTIONS)))
        lines.append(f"| `{q}`, transactions/s | {med['A']:.0f} | {med['B']:.0f} | "
                     f"{rel['A']:.2f} | {rel['B']:.2f} | **{paired:.3f}** |")
    lines += ["", "Times: below 1 is B faster. Transactions per second: above 1 is B faster."]
    return lines


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
    p.add_argument("--txn-seconds", type=int, default=3)
    p.add_argument("--workdir", required=True, help="a directory the postgres user can read")
    p.add_argument("--markdown", help="also write the summary table to this file")
    args = p.parse_args()
    times_of = {"A": [], "B": []}  # per round: {query: seconds}
    tps_of = {"A": [], "B": []}  # per round: {transaction kind: transactions per second}
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
            tps = {q: transactions_per_s(args, script) for q, script in TRANSACTIONS.items()}
            times_of[name].append(times)
            tps_of[name].append(tps)
            print(f"round {r + 1} {name}: " + ", ".join(
                [f"{q} {t * 1000:.0f} ms" for q, t in times.items()]
                + [f"{q} {t:.0f} tps" for q, t in tps.items()]), flush=True)
    lines = summary(args, times_of, tps_of)
    print("\n" + "\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
