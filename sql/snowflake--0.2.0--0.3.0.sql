-- snowflake 0.2.0 -> 0.3.0: table snowflake_origin (survives pg_upgrade and pg_dump), the
-- worker-id claim in snowflake_stats(), the commit-order watermark, serials, base32 and melt.
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

-- NULL arguments: STRICT, so a NULL table or column name gives NULL instead of an error that
-- shows "<NULL>" or the generated SQL.
ALTER FUNCTION @extschema@.snowflake_worker_collisions(regclass, name, name) STRICT;

-- snowflake_convert_column(): STRICT; a missing relation is 42P01; foreign keys are widened
-- whatever the key's own type was, and on the partitioned table rather than its partitions; a
-- default calling another schema's snowflake_next() is not taken for ours.
CREATE OR REPLACE FUNCTION @extschema@.snowflake_convert_column(tbl regclass, col name)
RETURNS void
LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp
AS $convert$
DECLARE
    att        record;
    kind       text;
    seq        text;
    fk         record;
    max_value  bigint;
    first_new  bigint;
    rel_kind   "char";
BEGIN
    SELECT c.relkind INTO rel_kind FROM pg_catalog.pg_class c WHERE c.oid = tbl;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relation with OID % does not exist', tbl::pg_catalog.oid
            USING ERRCODE = 'undefined_table';
    END IF;
    IF rel_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% is not a table', tbl
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'snowflake_convert_column() converts a column of an ordinary or partitioned table.';
    END IF;

    SELECT a.attnum, a.atttypid, a.attidentity, a.attgenerated,
           pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS default_expr
      INTO att
      FROM pg_catalog.pg_attribute a
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of relation % does not exist', col, tbl
            USING ERRCODE = 'undefined_column';
    END IF;

    IF att.atttypid NOT IN ('pg_catalog.int2'::pg_catalog.regtype,
                            'pg_catalog.int4'::pg_catalog.regtype,
                            'pg_catalog.int8'::pg_catalog.regtype) THEN
        RAISE EXCEPTION 'column "%" of relation % has type %', col, tbl,
                        pg_catalog.format_type(att.atttypid, NULL)
            USING ERRCODE = 'datatype_mismatch',
                  DETAIL = 'Snowflake IDs need an integer column: smallint, integer or bigint (widened to bigint).',
                  HINT = 'Add a new bigint column with DEFAULT snowflake_next() instead.';
    END IF;

    IF att.attgenerated <> '' THEN
        kind := NULL;
    ELSIF att.attidentity IN ('a', 'd') THEN
        kind := 'identity';
    ELSIF att.default_expr LIKE 'nextval(%' THEN
        kind := 'sequence';
    ELSIF att.default_expr = '@extschema@.snowflake_next()'::pg_catalog.regprocedure::pg_catalog.regproc::pg_catalog.text OPERATOR(pg_catalog.||) '()' THEN
        -- Compared by OID (regproc prints it as pg_get_expr does): a snowflake_next() of
        -- another schema is not ours.
        RAISE NOTICE 'column "%" of relation % already defaults to snowflake_next()', col, tbl;
        RETURN;
    END IF;
    IF kind IS NULL THEN
        RAISE EXCEPTION 'column "%" of relation % is not a serial, identity or sequence-default column', col, tbl
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = pg_catalog.format('Its default is %s.', COALESCE(att.default_expr, 'not set')),
                  HINT = pg_catalog.format('Set the default by hand: ALTER TABLE %s ALTER COLUMN %I SET DEFAULT snowflake_next();', tbl, col);
    END IF;

    -- Existing values must stay below the IDs that will follow them.
    EXECUTE pg_catalog.format('SELECT pg_catalog.max(%I)::bigint FROM %s', col, tbl) INTO max_value;
    first_new := @extschema@.snowflake_from_timestamp(pg_catalog.clock_timestamp());
    IF max_value >= first_new THEN
        RAISE EXCEPTION 'existing values of column "%" of relation % reach the snowflake ID range', col, tbl
            USING ERRCODE = 'numeric_value_out_of_range',
                  DETAIL = pg_catalog.format('The largest value is %s; new snowflake IDs start near %s.', max_value, first_new),
                  HINT = 'Renumber the existing rows below that value, or add a new column.';
    END IF;

    seq := pg_catalog.pg_get_serial_sequence(tbl::text, col::text);
    IF kind = 'identity' THEN
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', tbl, col);
    ELSE
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT', tbl, col);
        IF seq IS NOT NULL THEN
            -- A serial's own sequence goes with it, unless something else still uses it.
            BEGIN
                EXECUTE pg_catalog.format('DROP SEQUENCE %s', seq);
            EXCEPTION WHEN dependent_objects_still_exist THEN
                RAISE NOTICE 'sequence % is still used elsewhere and was kept', seq;
            END;
        END IF;
    END IF;

    IF att.atttypid <> 'pg_catalog.int8'::pg_catalog.regtype THEN
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint', tbl, col);
    END IF;
    -- Foreign keys that reference the column must hold the new, larger values too, whatever
    -- the key's own type was. A foreign key of a partitioned table is widened on the
    -- partitioned table (which widens its partitions); its copies on the partitions are skipped.
    FOR fk IN
        SELECT c.conrelid::pg_catalog.regclass AS rel, a.attname, a.atttypid, a.attinhcount,
               r.relispartition
          FROM pg_catalog.pg_constraint c
          CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(c.confkey), pg_catalog.unnest(c.conkey)) AS k(ref_att, own_att)
          JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.own_att
          JOIN pg_catalog.pg_class r ON r.oid = c.conrelid
         WHERE c.contype = 'f' AND c.confrelid = tbl AND k.ref_att = att.attnum
           AND c.conparentid = 0
    LOOP
        IF fk.atttypid <> 'pg_catalog.int8'::pg_catalog.regtype THEN
            IF fk.attinhcount > 0 AND NOT fk.relispartition THEN
                RAISE EXCEPTION 'cannot widen inherited column "%" of relation %', fk.attname, fk.rel
                    USING ERRCODE = 'feature_not_supported',
                          DETAIL = pg_catalog.format('Its foreign key references %s.%I, which becomes bigint; the column is inherited from a parent table.', tbl, col),
                          HINT = pg_catalog.format('Widen the column on the topmost parent table (ALTER TABLE ... ALTER COLUMN %I TYPE bigint), then call snowflake_convert_column() again.', fk.attname);
            END IF;
            EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint', fk.rel, fk.attname);
            RAISE NOTICE 'widened %.% to bigint', fk.rel, fk.attname;
        END IF;
    END LOOP;

    EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT @extschema@.snowflake_next()', tbl, col);
END
$convert$;

-- IDs for the programs and people that read them: the commit-order watermark, business
-- serials, sortable base32 text and snowflake_melt() (definitions as pgrx generates them).
CREATE TYPE @extschema@.snowflake_melted AS (
    bytes         bytea,        -- the 8 bytes, big-endian (network order)
    bits          text,         -- the 64 bits, most significant first
    ts            timestamptz,  -- generation time, millisecond precision
    unix_ms       bigint,       -- the same time in Unix milliseconds
    datacenter_id integer,      -- bits 17-21
    worker_id     integer,      -- bits 12-16
    sequence      integer       -- bits 0-11
);
COMMENT ON TYPE @extschema@.snowflake_melted IS 'A snowflake ID as bytes and bits with its fields, as returned by snowflake_melt()';

CREATE FUNCTION @extschema@.snowflake_safe_upto() RETURNS bigint
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_safe_upto_wrapper';
CREATE FUNCTION @extschema@.snowflake_serial("prefix" TEXT, "id" bigint) RETURNS TEXT
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_serial_wrapper';
CREATE FUNCTION @extschema@.snowflake_serial_id("serial" TEXT) RETURNS bigint
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_serial_id_wrapper';
CREATE FUNCTION @extschema@.snowflake_to_base32("id" bigint) RETURNS TEXT
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_to_base32_wrapper';
CREATE FUNCTION @extschema@.snowflake_from_base32("text" TEXT) RETURNS bigint
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_from_base32_wrapper';
CREATE FUNCTION @extschema@.snowflake_melt("id" bigint) RETURNS @extschema@.snowflake_melted
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'snowflake_melt_wrapper';
COMMENT ON FUNCTION @extschema@.snowflake_safe_upto() IS
    'Commit-order watermark: no transaction in flight on this server holds an ID below it';
COMMENT ON FUNCTION @extschema@.snowflake_serial(text, bigint) IS
    'Business serial: prefix, UTC time YYYYMMDDHHMISSmmm, datacenter, worker and sequence digits';
COMMENT ON FUNCTION @extschema@.snowflake_serial_id(text) IS
    'The snowflake ID of a serial made by snowflake_serial()';
COMMENT ON FUNCTION @extschema@.snowflake_to_base32(bigint) IS
    'The ID as 13 characters of Crockford base32 that sort like the IDs';
COMMENT ON FUNCTION @extschema@.snowflake_from_base32(text) IS
    'The ID of 13 characters of Crockford base32 (either case; I and L read as 1, O as 0)';
COMMENT ON FUNCTION @extschema@.snowflake_melt(bigint) IS
    'The ID as 8 big-endian bytes and 64 bits, with its decoded fields';
COMMENT ON FUNCTION @extschema@.snowflake_decode(bigint, text) IS
    'Decodes an ID of another generator: twitter, discord, instagram, sonyflake, pgedge or mastodon';
