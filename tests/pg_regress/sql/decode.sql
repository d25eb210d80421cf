-- Pins decoding: published examples, field access, NULL handling, errors (with SQLSTATEs).
SET TIME ZONE 'UTC';

-- Wikipedia "Snowflake ID", section "Example": a 2022 tweet by @Wikipedia.
-- Expect 2022-06-28 16:07:40.105 UTC, machine id 378 = datacenter 11, worker 26, sequence 0.
SELECT * FROM snowflake_decode(1541815603606036480);
SELECT snowflake_to_timestamp(1541815603606036480);

-- Discord developer docs, "Snowflakes": 175928847299117063 has worker 1 (our datacenter
-- bits), process 0 (our worker bits), increment 7, and 41944705796 ms after its epoch.
-- This server uses Twitter's epoch, so only the fields and the offset carry over.
SELECT (d).datacenter_id, (d).worker_id, (d).sequence,
       (d).unix_ms - 1288834974657 AS ms_after_epoch
  FROM (SELECT snowflake_decode(175928847299117063) AS d) s;

-- The whole row, one field, NULL in gives NULL out.
SELECT (snowflake_decode(0)).*;
SELECT (snowflake_decode(9223372036854775807)).*;
SELECT (snowflake_decode(1541815603606036480)).worker_id;
SELECT snowflake_decode(NULL) IS NULL AS decode_null,
       snowflake_to_timestamp(NULL) IS NULL AS to_ts_null,
       snowflake_from_timestamp(NULL) IS NULL AS from_ts_null;

-- Use in WHERE, GROUP BY and aggregates.
CREATE TEMP TABLE ids (id bigint);
INSERT INTO ids VALUES (1541815603606036480), (1541815603606036481), (175928847299117063),
                       (((1000::bigint << 22) | (3 << 17) | (4 << 12) | 5));
SELECT (snowflake_decode(id)).datacenter_id AS dc, count(*), max((snowflake_decode(id)).sequence)
  FROM ids GROUP BY 1 ORDER BY 1;
SELECT id FROM ids WHERE (snowflake_decode(id)).worker_id = 4;

-- From a timestamp: the smallest ID of its millisecond; sub-millisecond digits are dropped.
SELECT snowflake_from_timestamp('2022-06-28 16:07:40.105+00');
SELECT snowflake_from_timestamp('2022-06-28 16:07:40.105999+00');
SELECT snowflake_from_timestamp('2010-11-04 01:42:54.657+00') AS first_ever,
       snowflake_from_timestamp('2080-07-10 17:30:30.208+00') AS last_ms;
SELECT snowflake_to_timestamp(snowflake_from_timestamp('2030-05-06 07:08:09.123+00'));

-- Errors: class 22. psql's :SQLSTATE shows each error's code.
SELECT snowflake_decode(-1);
\echo SQLSTATE :SQLSTATE
SELECT snowflake_to_timestamp(-9223372036854775808);
\echo SQLSTATE :SQLSTATE
SELECT snowflake_from_timestamp('2010-11-04 01:42:54.656+00');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_from_timestamp('2080-07-10 17:30:30.209+00');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_from_timestamp('infinity');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_from_timestamp('-infinity');
\echo SQLSTATE :SQLSTATE

-- An altered result type is an error naming the attribute (it crashed the server before
-- 0.3.0), and works again once restored.
ALTER TYPE snowflake_parts ALTER ATTRIBUTE worker_id TYPE text;
SELECT (snowflake_decode(1541815603606036480)).worker_id;
\echo SQLSTATE :SQLSTATE
ALTER TYPE snowflake_parts ALTER ATTRIBUTE worker_id TYPE integer;
ALTER TYPE snowflake_parts ADD ATTRIBUTE extra integer;
SELECT snowflake_decode(1541815603606036480, 'discord');
\echo SQLSTATE :SQLSTATE
ALTER TYPE snowflake_parts DROP ATTRIBUTE extra;
SELECT snowflake_decode(1541815603606036480);
