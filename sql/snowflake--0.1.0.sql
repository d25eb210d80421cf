-- snowflake 0.1.0: the foundation (generator, decode, timestamps). RELEASED: never edit this
-- file; its checksum is pinned in sql/released.sha256 (checked by scripts/check-released.sh).
\echo Use "CREATE EXTENSION snowflake" to load this file. \quit

CREATE TYPE snowflake_parts AS (
    ts            timestamptz,  -- generation time, millisecond precision
    unix_ms       bigint,       -- the same time in Unix milliseconds
    datacenter_id integer,      -- bits 17-21
    worker_id     integer,      -- bits 12-16
    sequence      integer       -- bits 0-11: position within the millisecond
);
COMMENT ON TYPE snowflake_parts IS 'Fields of a snowflake ID, as returned by snowflake_decode()';

CREATE FUNCTION "snowflake_decode"(
	"id" bigint /* i64 */
) RETURNS snowflake_parts /* :: pgrx :: heap_tuple :: PgHeapTuple < '_, :: pgrx :: pgbox :: AllocatedByRust
> */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_decode_wrapper';
CREATE FUNCTION "snowflake_from_timestamp"(
	"ts" timestamp with time zone /* TimestampWithTimeZone */
) RETURNS bigint /* i64 */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_from_timestamp_wrapper';
CREATE FUNCTION "snowflake_next"() RETURNS bigint /* i64 */
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_next_wrapper';
CREATE FUNCTION "snowflake_to_timestamp"(
	"id" bigint /* i64 */
) RETURNS timestamp with time zone /* TimestampWithTimeZone */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'snowflake_to_timestamp_wrapper';
