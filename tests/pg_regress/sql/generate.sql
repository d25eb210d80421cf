-- Pins generation through SQL: the configured node ids appear in every ID, IDs increase,
-- they sit close to the clock, and they work as a column DEFAULT.
SELECT snowflake_next() > snowflake_from_timestamp(now() - interval '1 minute') AS after_recent,
       snowflake_next() < snowflake_from_timestamp(clock_timestamp() + interval '2 seconds') AS before_soon;

-- 50,000 single calls may use up a millisecond's 4,096 IDs on a fast machine, and the first
-- exhausted millisecond of the server raises a WARNING: hide it, as it depends on the speed.
SET client_min_messages = error;
SELECT count(*) AS n,
       count(DISTINCT id) AS distinct_ids,
       bool_and((snowflake_decode(id)).worker_id = 1) AS worker_1,
       bool_and((snowflake_decode(id)).datacenter_id = 2) AS datacenter_2,
       bool_and(id > prev) AS strictly_increasing
  FROM (SELECT id, lag(id, 1, 0::bigint) OVER (ORDER BY n) AS prev
          FROM (SELECT n, snowflake_next() AS id FROM generate_series(1, 50000) n) g) s;
RESET client_min_messages;

-- As a DEFAULT, with a master row and detail rows pre-assigned in one transaction.
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowflake_next(), customer text NOT NULL);
CREATE TABLE order_lines (
    id bigint PRIMARY KEY DEFAULT snowflake_next(),
    order_id bigint NOT NULL REFERENCES orders,
    item text NOT NULL
);
BEGIN;
SELECT snowflake_next() AS order_id \gset
INSERT INTO orders (id, customer) VALUES (:order_id, 'ACME');
INSERT INTO order_lines (order_id, item) VALUES (:order_id, 'bolts'), (:order_id, 'nuts');
COMMIT;
SELECT count(*) AS lines,
       bool_and(l.id > o.id) AS lines_after_order,
       bool_and((snowflake_decode(l.id)).worker_id = 1) AS worker_1
  FROM orders o JOIN order_lines l ON l.order_id = o.id;

-- Generated columns and expression indexes need IMMUTABLE functions.
CREATE TABLE events (
    id bigint PRIMARY KEY DEFAULT snowflake_next(),
    created timestamptz GENERATED ALWAYS AS (snowflake_to_timestamp(id)) STORED
);
CREATE INDEX events_worker ON events (((snowflake_decode(id)).worker_id));
INSERT INTO events SELECT FROM generate_series(1, 1000);
SELECT count(*), bool_and(created = snowflake_to_timestamp(id)) FROM events;

-- Range queries on snowflake_from_timestamp() bounds can use the primary key.
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT id FROM events
 WHERE id >= snowflake_from_timestamp('2026-01-01 00:00:00+00')
   AND id <  snowflake_from_timestamp('2026-01-02 00:00:00+00');
RESET enable_seqscan;

-- Partition bounds accept the function too (it is folded to a constant).
CREATE TABLE log (id bigint NOT NULL DEFAULT snowflake_next()) PARTITION BY RANGE (id);
CREATE TABLE log_2026 PARTITION OF log
    FOR VALUES FROM (snowflake_from_timestamp('2026-01-01 00:00:00+00'))
                 TO (snowflake_from_timestamp('2027-01-01 00:00:00+00'));
SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'log_2026';

DROP TABLE order_lines, orders, events, log;

-- Monitoring: one row, as a function or a view.
SELECT worker_id, datacenter_id, epoch,
       ids_issued >= 51000 AS counted,
       lease_end > last_issued AS lease_covers_last,
       lease_writes >= 1 AS lease_written,
       drift_ms >= 0 AS drift_known
  FROM snowflake_stats;
SELECT count(*) FROM snowflake_stats();
