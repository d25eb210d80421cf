#!/usr/bin/env python3
"""The manual's small figures, reproducible: what a lease renewal costs (docs/guarantees.md),
what snowflake_safe_upto() costs by max_connections (docs/functions.md), and what the row
type check adds to snowflake_decode() (docs/functions.md). Each figure is a median over
repeated runs in throwaway clusters of the installed extension; run it on a quiet machine.

    PG_MAJOR=17 /usr/bin/python3 bench/figures.py        (as root; about 3 minutes)

Prints one line per figure, with the date, the PostgreSQL version and the machine's CPUs,
to paste into the pages.
"""

import datetime
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
os.environ.setdefault("SNOWFLAKE_IT_BASE", "/var/tmp/snowflake-figures")

from harness import Cluster  # noqa: E402

SETTINGS = {"shared_preload_libraries": "'snowflake'", "snowflake.worker_id": "1"}


def median_ms(conn, sql, runs):
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        conn.execute(sql).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def cluster(name, **extra):
    c = Cluster(name, {**SETTINGS, **extra}).init()
    c.start()
    c.sql("CREATE EXTENSION snowflake")
    return c


def lease_windows():
    """1 M IDs in one statement (below the cap of 4,096 per ms, so no run borrows from the
    next: each starts once the ID clock is back at the wall clock) at three lease windows:
    no renewal, the default, 100 a second; with the lease writes each run made."""
    out = []
    for window in ("1h", "1s", "10ms"):
        # A cluster each: a lease written under a longer window would cover the next runs.
        c = cluster(f"fig-lease-{window}", **{"snowflake.lease_window": f"'{window}'"})
        try:
            times, writes = [], []
            with c.connect() as conn:
                for _ in range(5):
                    while conn.execute("SELECT drift_ms > 0 FROM snowflake_stats").fetchone()[0]:
                        time.sleep(0.05)
                    before = conn.execute("SELECT lease_writes FROM snowflake_stats").fetchone()[0]
                    started = time.perf_counter()
                    conn.execute("SELECT count(snowflake_next()) FROM generate_series(1, 1000000)")
                    times.append((time.perf_counter() - started) * 1000)
                    writes.append(conn.execute("SELECT lease_writes FROM snowflake_stats").fetchone()[0] - before)
            out.append(f"lease_window {window}: {statistics.median(times):.0f} ms, "
                       f"{statistics.median(writes):.0f} lease writes")
        finally:
            c.destroy()
    return "1 M IDs in one statement, median of 5: " + "; ".join(out)


def safe_upto():
    """20,000 calls of snowflake_safe_upto() in one statement, median of 5, per max_connections."""
    out = []
    for connections in (100, 10000):
        c = cluster(f"fig-safe{connections}", max_connections=str(connections))
        try:
            with c.connect() as conn:
                ms = median_ms(conn, "SELECT count(snowflake_safe_upto()) FROM generate_series(1, 20000)", 5)
            out.append(f"max_connections {connections}: {ms * 1000 / 20000:.2f} µs per call")
        finally:
            c.destroy()
    return "snowflake_safe_upto(), 20,000 calls, median of 5: " + ", ".join(out)


def decode():
    """A million decodes, median of 5: the row type's check is paid once per call site."""
    c = cluster("fig-decode")
    try:
        with c.connect() as conn:
            decode_ms = median_ms(conn, "SELECT count((snowflake_decode(g)).worker_id) "
                                        "FROM generate_series(1, 1000000) g", 5)
            floor_ms = median_ms(conn, "SELECT count(snowflake_to_timestamp(g)) "
                                       "FROM generate_series(1, 1000000) g", 5)
        return (f"1 M calls, median of 5: snowflake_decode() {decode_ms * 1000 / 1e6:.3f} µs, "
                f"snowflake_to_timestamp() {floor_ms * 1000 / 1e6:.3f} µs per call")
    finally:
        c.destroy()


def main():
    with_server = cluster("fig-version")
    try:
        version = with_server.one("SHOW server_version")
    finally:
        with_server.destroy()
    print(f"{datetime.date.today()}, PostgreSQL {version}, {os.cpu_count()} CPUs "
          f"(PG_MAJOR={os.environ.get('PG_MAJOR', '15')}), bench/figures.py:")
    for figure in (lease_windows, safe_upto, decode):
        print("- " + figure())


if __name__ == "__main__":
    main()
