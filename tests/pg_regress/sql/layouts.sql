-- Pins snowflake_decode(id, layout) for other generators' IDs and snowflake_format().
SET TIME ZONE 'UTC';

-- Each row is a published example (see core/src/foreign.rs for the sources).
SELECT layout, d.*
  FROM (VALUES ('twitter', 1541815603606036480),       -- Wikipedia "Snowflake ID" example
               ('discord', 175928847299117063),        -- Discord developer docs, Snowflakes
               ('instagram', (1387263000::bigint << 23) | (1341 << 10) | 313), -- Instagram blog
               ('sonyflake', (100::bigint << 24) | (3 << 16) | 258),          -- sonyflake.go toID
               ('pgedge', 413334082185859072),         -- pgEdge snowflake.nextval() output, node 1
               ('pgedge', (1::bigint << 22) | (1023 << 12) | 4095), -- snowflake.c int64FromSnowflake
               ('mastodon', 103270115826048975)        -- Mastodon API docs, Status example
       ) AS v(layout, id),
       snowflake_decode(v.id, v.layout) AS d;

-- Names are case-insensitive; the function is IMMUTABLE and independent of settings.
SELECT (snowflake_decode(175928847299117063, 'DISCORD')).ts;
SELECT provolatile, proisstrict FROM pg_proc
 WHERE oid = 'snowflake_decode(bigint, text)'::regprocedure;

-- Errors: class 22.
SELECT snowflake_decode(1, 'ulid');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_decode(-1, 'sonyflake');
\echo SQLSTATE :SQLSTATE
-- Exactly the documented names: no trimming of spaces or line ends.
SELECT snowflake_decode(1, ' twitter ');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_decode(1, E'twitter\n');
\echo SQLSTATE :SQLSTATE

-- JSON for clients: the ID as a string (JavaScript loses precision above 2^53).
SELECT snowflake_format(1541815603606036480);
SELECT jsonb_typeof(snowflake_format(0) -> 'id') AS id_type,
       snowflake_format(NULL) IS NULL AS null_in_null_out;
