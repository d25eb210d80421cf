-- Composite types, created first. The row returned by snowflake_decode(): one ID split into its fields.
CREATE TYPE snowflake_parts AS (
    ts            timestamptz,  -- generation time, millisecond precision
    unix_ms       bigint,       -- the same time in Unix milliseconds
    datacenter_id integer,      -- bits 17-21
    worker_id     integer,      -- bits 12-16
    sequence      integer       -- bits 0-11: position within the millisecond
);
COMMENT ON TYPE snowflake_parts IS 'Fields of a snowflake ID, as returned by snowflake_decode()';

-- The row returned by snowflake_stats(): the generator's configuration, position and counters.
CREATE TYPE snowflake_stats_row AS (
    worker_id            integer,      -- snowflake.worker_id, or the claimed one (NULL if none)
    datacenter_id        integer,      -- snowflake.datacenter_id (NULL if unusable)
    epoch                timestamptz,  -- snowflake.epoch
    last_issued          timestamptz,  -- time of the last ID issued since start (NULL: none)
    drift_ms             bigint,       -- how far the ID clock is ahead of the wall clock now
    lease_end            timestamptz,  -- durable lease: no ID was issued at or after this
    ids_issued           bigint,       -- IDs issued since start
    sequence_exhaustions bigint,       -- milliseconds whose 4,096 IDs ran out
    clock_steps_back     bigint,       -- times the clock read earlier than before
    largest_step_back_ms bigint,       -- largest step back seen
    lease_writes         bigint,       -- lease extensions written (file + WAL) since start
    waits                bigint,       -- times a caller slept for the clock
    worker_id_source     text,         -- 'configuration', or 'registry' (snowflake.worker_id = auto)
    registry             text,         -- snowflake.registry without its password (registry only)
    claim_status         text,         -- starting, held, unreachable, settling, exhausted, fenced, refused, mark_ahead
    claim_expires_at     timestamptz   -- when the registry lets the claim go unless renewed
);
COMMENT ON TYPE snowflake_stats_row IS 'Row returned by snowflake_stats()';

-- The row returned by snowflake_melt(): one ID as bytes and bits, with its fields.
CREATE TYPE snowflake_melted AS (
    bytes         bytea,        -- the 8 bytes, big-endian (network order)
    bits          text,         -- the 64 bits, most significant first
    ts            timestamptz,  -- generation time, millisecond precision
    unix_ms       bigint,       -- the same time in Unix milliseconds
    datacenter_id integer,      -- bits 17-21
    worker_id     integer,      -- bits 12-16
    sequence      integer       -- bits 0-11
);
COMMENT ON TYPE snowflake_melted IS 'A snowflake ID as bytes and bits with its fields, as returned by snowflake_melt()';
