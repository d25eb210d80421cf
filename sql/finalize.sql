-- Objects that depend on the functions. Names are schema-qualified with @extschema@ so that
-- the script does not depend on search_path.
CREATE VIEW @extschema@.snowflake_stats AS SELECT * FROM @extschema@.snowflake_stats();
GRANT SELECT ON @extschema@.snowflake_stats TO PUBLIC;
COMMENT ON VIEW @extschema@.snowflake_stats IS 'The snowflake generator''s state and counters (one row)';

COMMENT ON FUNCTION @extschema@.snowflake_next() IS
    'Next snowflake ID: unique on this server, greater than every ID issued before';
COMMENT ON FUNCTION @extschema@.snowflake_decode(bigint) IS
    'Splits a snowflake ID into time, datacenter id, worker id and sequence';
COMMENT ON FUNCTION @extschema@.snowflake_to_timestamp(bigint) IS
    'Time a snowflake ID was generated (millisecond precision)';
COMMENT ON FUNCTION @extschema@.snowflake_from_timestamp(timestamptz) IS
    'Smallest snowflake ID of the millisecond containing the timestamp';
COMMENT ON FUNCTION @extschema@.snowflake_stats() IS
    'The snowflake generator''s state and counters (one row)';
