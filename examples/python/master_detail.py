#!/usr/bin/env python3
"""Pre-assign snowflake IDs for an order and its lines, write them in one transaction,
and read them back joined. Uses psycopg 3 (Debian: python3-psycopg; PyPI: psycopg).

Connection: the usual libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE).
"""

import psycopg

ITEMS = ["100 bolts", "100 nuts", "50 washers"]


def main():
    with psycopg.connect() as conn:  # one transaction, committed at the end of the block
        conn.execute("""CREATE TABLE IF NOT EXISTS orders (
                            id bigint PRIMARY KEY, customer text NOT NULL)""")
        conn.execute("""CREATE TABLE IF NOT EXISTS order_lines (
                            id bigint PRIMARY KEY,
                            order_id bigint NOT NULL REFERENCES orders,
                            item text NOT NULL)""")

        # One round trip for every ID the transaction needs.
        ids = conn.execute("SELECT snowflake_next_batch(%s)", (1 + len(ITEMS),)).fetchone()[0]
        order_id, line_ids = ids[0], ids[1:]

        conn.execute("INSERT INTO orders (id, customer) VALUES (%s, %s)", (order_id, "ACME Corp"))
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO order_lines (id, order_id, item) VALUES (%s, %s, %s)",
                [(line_id, order_id, item) for line_id, item in zip(line_ids, ITEMS)])

    with psycopg.connect() as conn:
        rows = conn.execute("""
            SELECT o.id, o.customer, l.id, l.item, (snowflake_decode(l.id)).worker_id
              FROM orders o JOIN order_lines l ON l.order_id = o.id
             WHERE o.id = %s ORDER BY l.id""", (order_id,)).fetchall()

    assert [r[3] for r in rows] == ITEMS, rows
    assert all(r[0] == order_id and r[2] > order_id for r in rows), rows
    for r in rows:
        # Send IDs to JavaScript as text: they exceed 2^53.
        print(f"order {r[0]} ({r[1]}): line {r[2]} '{r[3]}' from worker {r[4]}")


if __name__ == "__main__":
    main()
