-- snowflake 0.2.0 -> 0.3.0: table snowflake_origin (survives pg_upgrade and pg_dump), and the
-- worker-id claim in snowflake_stats().
-- Pin its checksum in sql/released.sha256 when 0.3.0 is released; never edit it after that.
\echo Use "ALTER EXTENSION snowflake UPDATE TO '0.3.0'" to load this file. \quit

-- Which cluster issued this database's IDs, and with which epoch. The state file in the data
-- directory stays behind when pg_upgrade or a dump and restore moves the database; this table
-- (an extension configuration table) moves with it. A server that finds a row of another
-- cluster here places its IDs past every lease that cluster could have written before it
-- issues any, and a server with another snowflake.epoch refuses to generate or decode.
CREATE TABLE @extschema@.snowflake_origin (
    system_identifier bigint NOT NULL,
    epoch_unix_ms     bigint NOT NULL,
    recorded_at       timestamptz NOT NULL DEFAULT pg_catalog.now()
);
INSERT INTO @extschema@.snowflake_origin (system_identifier, epoch_unix_ms)
SELECT s.system_identifier,
       pg_catalog.round(EXTRACT(epoch FROM @extschema@.snowflake_to_timestamp(0))
                        OPERATOR(pg_catalog.*) 1000)::bigint
  FROM pg_catalog.pg_control_system() s;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.snowflake_origin', '');
REVOKE ALL ON @extschema@.snowflake_origin FROM PUBLIC;
GRANT SELECT ON @extschema@.snowflake_origin TO PUBLIC;
COMMENT ON TABLE @extschema@.snowflake_origin IS
    'Which cluster issued this database''s snowflake IDs, and with which epoch (carried by pg_upgrade and pg_dump)';

-- snowflake_stats(): where the worker id comes from, and the registry claim.
ALTER TYPE @extschema@.snowflake_stats_row
    ADD ATTRIBUTE worker_id_source text,
    ADD ATTRIBUTE registry text,
    ADD ATTRIBUTE claim_status text,
    ADD ATTRIBUTE claim_expires_at timestamptz;
-- The view was expanded to the old columns when it was created: add the new ones (at the end,
-- as CREATE OR REPLACE VIEW allows; grants and comment stay).
CREATE OR REPLACE VIEW @extschema@.snowflake_stats AS SELECT * FROM @extschema@.snowflake_stats();
