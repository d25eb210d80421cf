-- Pins the text forms of IDs: business serials, Crockford base32, and snowflake_melt().
SET TIME ZONE 'UTC';

-- Serials: prefix, UTC time YYYYMMDDHHMISSmmm, datacenter (2), worker (2), sequence (4).
-- 1541815603606036480 is the Wikipedia tweet: 2022-06-28 16:07:40.105, datacenter 11, worker 26.
SELECT snowflake_serial('PAY-', 1541815603606036480);
SELECT snowflake_serial('', 0) AS epoch_serial;
SELECT snowflake_serial_id('PAY-2022062816074010511260000');
SELECT snowflake_serial_id('Bestellung №7-2022062816074010511260000') AS any_prefix;
-- Serials of one prefix sort like their IDs (C collation).
SELECT bool_and(a < b) AS sorted
  FROM (SELECT snowflake_serial('ORD', id) COLLATE "C" AS a,
               lead(snowflake_serial('ORD', id)) OVER (ORDER BY id) COLLATE "C" AS b
          FROM unnest(ARRAY[0, 1, 4095, 4096, 131072, 4194304, 1541815603606036480,
                            9223372036854775807]) AS id) s
 WHERE b IS NOT NULL;
SELECT snowflake_serial(NULL, 1) IS NULL AS null_prefix, snowflake_serial_id(NULL) IS NULL AS null_serial;

-- Malformed serials: class 22, naming what is wrong.
\set VERBOSITY default
SELECT snowflake_serial_id('PAY-123');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_serial_id('PAY-20220628160740105112600x0');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_serial_id('PAY-2022023016074010511260000');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_serial_id('PAY-2022062816074010532260000');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_serial_id('PAY-2022062816074010511264096');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_serial_id('PAY-2001010100000000000000000');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_serial('PAY-', -1);
\echo SQLSTATE :SQLSTATE

-- Base32: 13 characters, upper case, zero-padded; text order is numeric order.
SELECT snowflake_to_base32(0) AS zero, snowflake_to_base32(32) AS thirty_two,
       snowflake_to_base32(1541815603606036480) AS tweet,
       snowflake_to_base32(9223372036854775807) AS max;
SELECT snowflake_from_base32('1ASD13XH1F800') AS upper,
       snowflake_from_base32('1asd13xh1f800') AS lower,
       snowflake_from_base32('0000000000OIL') = snowflake_from_base32('0000000000011') AS aliases;
SELECT bool_and(snowflake_to_base32(id) COLLATE "C" < snowflake_to_base32(id + step) COLLATE "C") AS sorted
  FROM unnest(ARRAY[0, 31, 1023, 4194303, 1541815603606036480]) AS id,
       unnest(ARRAY[1, 32, 1000000]) AS step;
SELECT snowflake_from_base32('ABC');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_from_base32('000000000000U');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_from_base32('8000000000000');
\echo SQLSTATE :SQLSTATE
SELECT snowflake_to_base32(-1);
\echo SQLSTATE :SQLSTATE

-- Melt: bytes (big-endian), bits, and the decoded fields.
SELECT * FROM snowflake_melt(1541815603606036480);
SELECT bytes, length(bits) AS bit_count, sequence FROM snowflake_melt(4095);
SELECT snowflake_melt(-1);
\echo SQLSTATE :SQLSTATE

-- Every new function: IMMUTABLE STRICT PARALLEL SAFE, no superuser needed.
SELECT p.oid::regprocedure, provolatile, proisstrict, proparallel, prosecdef
  FROM pg_proc p
 WHERE p.oid IN ('snowflake_serial(text, bigint)'::regprocedure, 'snowflake_serial_id(text)'::regprocedure,
                 'snowflake_to_base32(bigint)'::regprocedure, 'snowflake_from_base32(text)'::regprocedure,
                 'snowflake_melt(bigint)'::regprocedure)
 ORDER BY 1::text;
