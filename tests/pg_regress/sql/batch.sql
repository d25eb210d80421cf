-- Pins snowflake_next_batch() and snowflake_next_block(): sizes, ordering, reservation,
-- and their class-22 errors.
-- An exhausted millisecond may raise a WARNING (the first of the server, then none for an
-- hour: snowflake.warning_interval in scripts/regress.sh), depending on the machine's speed;
-- hide it. Batches of more than 4,096 IDs never raise it.
SET client_min_messages = error;
SELECT cardinality(snowflake_next_batch(1)) AS one,
       cardinality(snowflake_next_batch(10000)) AS ten_thousand;

-- Strictly increasing within a batch, and every batch above everything before it.
WITH b AS (SELECT snowflake_next_batch(20000) AS ids),
     e AS (SELECT u.id, u.n FROM b, unnest(b.ids) WITH ORDINALITY AS u(id, n))
SELECT count(*) AS n,
       count(DISTINCT id) AS distinct_ids,
       bool_and(id > prev) AS strictly_increasing,
       bool_and((snowflake_decode(id)).worker_id = 1) AS worker_1
  FROM (SELECT id, lag(id, 1, 0::bigint) OVER (ORDER BY n) AS prev FROM e) s;
SELECT (SELECT max(x) FROM unnest(snowflake_next_batch(5000)) x) < (snowflake_next_batch(1))[1]
       AS later_batch_is_greater;

-- A block: n consecutive IDs in one millisecond; later IDs are above the whole block.
SELECT snowflake_next_block(50) AS first \gset
SELECT (snowflake_decode(:first)).sequence + 49 <= 4095 AS fits_in_the_millisecond,
       (snowflake_decode(:first + 49)).unix_ms = (snowflake_decode(:first)).unix_ms AS same_millisecond,
       snowflake_next() > :first + 49 AS next_is_above_the_block,
       snowflake_next_block(4096) > :first + 49 AS full_block_is_above;

-- Master and details pre-assigned in one round trip.
CREATE TABLE invoices (id bigint PRIMARY KEY, customer text NOT NULL);
CREATE TABLE invoice_lines (id bigint PRIMARY KEY,
                            invoice_id bigint NOT NULL REFERENCES invoices, item text NOT NULL);
DO $$
DECLARE
    ids bigint[] := snowflake_next_batch(4);
BEGIN
    INSERT INTO invoices VALUES (ids[1], 'ACME');
    INSERT INTO invoice_lines VALUES (ids[2], ids[1], 'bolts'), (ids[3], ids[1], 'nuts'),
                                     (ids[4], ids[1], 'washers');
END $$;
SELECT count(*) AS lines, bool_and(l.id > i.id) AS details_after_master
  FROM invoices i JOIN invoice_lines l ON l.invoice_id = i.id;
DROP TABLE invoice_lines, invoices;

-- Errors: class 22.
SELECT snowflake_next_batch(0);
\echo SQLSTATE :SQLSTATE
SELECT snowflake_next_batch(-5);
\echo SQLSTATE :SQLSTATE
SELECT snowflake_next_batch(1000001);
\echo SQLSTATE :SQLSTATE
SELECT snowflake_next_block(0);
\echo SQLSTATE :SQLSTATE
SELECT snowflake_next_block(4097);
\echo SQLSTATE :SQLSTATE
SELECT snowflake_next_batch(NULL) IS NULL AS batch_null, snowflake_next_block(NULL) IS NULL AS block_null;
