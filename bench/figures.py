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
    """5 M IDs in one statement at three lease windows: no renewal, the default, 100 a second."""
    c = cluster("fig-lease")
    try:
        out = []
        for window in ("1h", "1s", "10ms"):
            c.reload(**{"snowflake.lease_window": f"'{window}'"})
            with c.connect() as conn:
                conn.execute("SELECT snowflake_next()")
                ms = median_ms(conn, "SELECT count(snowflake_next()) FROM generate_series(1, 5000000)", 3)
            out.append(f"lease_window {window}: {ms:.0f} ms")
        return "5 M IDs in one statement, median of 3: " + ", ".join(out)
    finally:
        c.destroy()


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
