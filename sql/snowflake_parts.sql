-- The row returned by snowflake_decode(): one ID split into its fields.
CREATE TYPE snowflake_parts AS (
    ts            timestamptz,  -- generation time, millisecond precision
    unix_ms       bigint,       -- the same time in Unix milliseconds
    datacenter_id integer,      -- bits 17-21
    worker_id     integer,      -- bits 12-16
    sequence      integer       -- bits 0-11: position within the millisecond
);
COMMENT ON TYPE snowflake_parts IS 'Fields of a snowflake ID, as returned by snowflake_decode()';
