#!/usr/bin/env python3
"""An outbox reader that sees every row exactly once, whatever order writers commit in.

Writers insert into `outbox` with `id DEFAULT snowflake_next()`. IDs are assigned at insert
and committed later, so a reader polling `id > last_seen` skips a row whose smaller ID
commits after a larger one. This reader reads only up to `snowflake_safe_upto()`: no
transaction still in flight holds an ID below it, so nothing can appear there later.

Uses psycopg 3 (Debian: python3-psycopg; PyPI: psycopg). Connection: the usual libpq
environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE).

    python3 outbox_reader.py          # creates the table, then prints rows as they commit
"""

import time

import psycopg

SCHEMA = """CREATE TABLE IF NOT EXISTS outbox (
                id      bigint PRIMARY KEY DEFAULT snowflake_next(),
                payload text NOT NULL)"""


class OutboxReader:
    """Reads `outbox` in ID order from a cursor (an ID; keep it durably in real use)."""

    def __init__(self, conn, cursor=0):
        # Autocommit: each statement takes a new snapshot. The watermark must be read
        # before the snapshot of the read (not inside a REPEATABLE READ transaction that
        # already took one), so that every transaction it counts as ended is visible.
        self.conn = conn
        self.conn.autocommit = True
        self.cursor = cursor

    def poll(self):
        """The rows committed since the last poll: cursor <= id < watermark, in ID order."""
        upto = self.conn.execute("SELECT snowflake_safe_upto()").fetchone()[0]
        rows = self.conn.execute(
            "SELECT id, payload FROM outbox WHERE id >= %s AND id < %s ORDER BY id",
            (self.cursor, upto)).fetchall()
        self.cursor = max(self.cursor, upto)
        return rows


def main():
    with psycopg.connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
        reader = OutboxReader(conn)
        while True:
            for row_id, payload in reader.poll():
                print(row_id, payload, flush=True)
            time.sleep(0.5)


if __name__ == "__main__":
    main()
