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
COMMENT ON FUNCTION @extschema@.snowflake_next_batch(integer) IS
    'n strictly increasing snowflake IDs, reserved in one call';
COMMENT ON FUNCTION @extschema@.snowflake_next_block(integer) IS
    'First of n contiguous snowflake IDs (one millisecond, consecutive sequence numbers), reserved';
COMMENT ON FUNCTION @extschema@.snowflake_format(bigint) IS
    'The decoded snowflake ID as jsonb, with the ID as a string for JavaScript clients';
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

-- Moves a serial, identity or sequence-default column to DEFAULT snowflake_next().
-- search_path is pinned, and every object is schema-qualified, so that objects a user
-- creates elsewhere cannot be substituted.
-- Rights: it alters only tables the current role owns. Converting a table rewrites it, which
-- runs its owner's code (CHECK constraints, index expressions) with the caller's rights: run
-- by a superuser on another role's table, that code would run as the superuser. So the table
-- (and its partitions and inheritors) must be the caller's own, and so must every
-- referencing table that must be widened: another role's is refused, naming it, whatever
-- include_others_tables says. Until 0.7.0 that opt-in widened it as its owner in a
-- security-restricted operation, but in the caller's session: the owner's code could plant
-- a type in the caller's temporary schema (searched before pg_catalog for type names) and
-- run as the caller at its next cast, and the caller's temporary objects could capture the
-- owner's unqualified names. Only the owner's own session runs the owner's code safely. A
-- referencing table whose partitions or inheritors have other owners is refused: altering it
-- would run their code as its owner.
-- The extension's own functions are found by OID (members of the extension, owned by a
-- superuser), never by schema name: the owner of the extension's schema can rename it and
-- create look-alikes under the old name.
CREATE FUNCTION @extschema@.snowflake_convert_column(tbl regclass, col name, include_others_tables boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql STRICT
SET search_path = pg_catalog, pg_temp
AS $convert$
DECLARE
    att        record;
    kind       text;
    seq        text;
    fk_rels      pg_catalog.regclass[];
    fk_columns   name[];
    fk_owners    oid[];
    fk_inherited boolean[];
    fk_mixed     pg_catalog.regclass[];
    foreign_owner record;
    next_fn      pg_catalog.regproc;
    from_ts_fn   pg_catalog.regproc;
    max_value  bigint;
    first_new  bigint;
    rel_kind   "char";
    me         oid;
BEGIN
    SELECT c.relkind INTO rel_kind FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) tbl;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relation with OID % does not exist', tbl::pg_catalog.oid
            USING ERRCODE = 'undefined_table';
    END IF;
    IF rel_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% is not a table', tbl
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'snowflake_convert_column() converts a column of an ordinary or partitioned table.';
    END IF;

    SELECT pg_catalog.max(p.oid) FILTER (WHERE p.proname OPERATOR(pg_catalog.=) 'snowflake_next' AND p.pronargs OPERATOR(pg_catalog.=) 0),
           pg_catalog.max(p.oid) FILTER (WHERE p.proname OPERATOR(pg_catalog.=) 'snowflake_from_timestamp')
      INTO next_fn, from_ts_fn
      FROM pg_catalog.pg_extension e
      JOIN pg_catalog.pg_depend d ON d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) e.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
      JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.objid
      JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) p.proowner AND o.rolsuper
     WHERE e.extname OPERATOR(pg_catalog.=) 'snowflake';
    IF next_fn IS NULL OR from_ts_fn IS NULL THEN
        RAISE EXCEPTION 'the snowflake extension''s functions are missing or altered'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'snowflake_convert_column() calls snowflake_next() and snowflake_from_timestamp() as members of the extension owned by a superuser.',
                  HINT = 'Run ALTER EXTENSION snowflake UPDATE, or recreate the extension.';
    END IF;

    -- The table and everything that inherits from it must be the current role's own.
    SELECT r.oid INTO me FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER;
    SELECT o.rel, o.owner INTO foreign_owner
      FROM (WITH RECURSIVE tree(rel) AS (
                SELECT tbl::pg_catalog.oid
                UNION
                SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent OPERATOR(pg_catalog.=) t.rel)
            SELECT t.rel::pg_catalog.regclass AS rel, c.relowner::pg_catalog.regrole AS owner, c.relowner
              FROM tree t JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.rel) o
     WHERE o.relowner OPERATOR(pg_catalog.<>) me
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'permission denied to convert column "%" of relation %', col, tbl
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('Relation %s is owned by role %s, not by the current role %I. Converting rewrites it, which runs its owner''s code (CHECK constraints, index expressions) with the rights of the role that converts.', foreign_owner.rel, foreign_owner.owner, CURRENT_USER),
                  HINT = pg_catalog.format('Connect as role %s (the owner) and call snowflake_convert_column() there.', foreign_owner.owner);
    END IF;

    SELECT a.attnum, a.atttypid, a.attidentity, a.attgenerated,
           pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS default_expr
      INTO att
      FROM pg_catalog.pg_attribute a
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid OPERATOR(pg_catalog.=) a.attrelid AND d.adnum OPERATOR(pg_catalog.=) a.attnum
     WHERE a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attname OPERATOR(pg_catalog.=) col AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped;
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

    IF att.attgenerated OPERATOR(pg_catalog.<>) '' THEN
        kind := NULL;
    ELSIF att.attidentity IN ('a', 'd') THEN
        kind := 'identity';
    ELSIF att.default_expr LIKE 'nextval(%' THEN
        kind := 'sequence';
    ELSIF att.default_expr OPERATOR(pg_catalog.=) (next_fn::pg_catalog.text OPERATOR(pg_catalog.||) '()') THEN
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

    -- Foreign keys that reference the column must hold the new, larger values too, whatever
    -- the key's own type was. A foreign key of a partitioned table is widened on the
    -- partitioned table (which widens its partitions); its copies on the partitions are
    -- skipped. Checked before anything changes: another role's table is refused unless asked for.
    SELECT COALESCE(pg_catalog.array_agg(c.conrelid::pg_catalog.regclass), '{}'),
           COALESCE(pg_catalog.array_agg(a.attname), '{}'),
           COALESCE(pg_catalog.array_agg(r.relowner), '{}'),
           COALESCE(pg_catalog.array_agg(a.attinhcount OPERATOR(pg_catalog.>) 0 AND NOT r.relispartition), '{}'),
           COALESCE(pg_catalog.array_agg(mixed.rel), '{}')
      INTO fk_rels, fk_columns, fk_owners, fk_inherited, fk_mixed
      FROM pg_catalog.pg_constraint c
      CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(c.confkey), pg_catalog.unnest(c.conkey)) AS k(ref_att, own_att)
      JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.conrelid AND a.attnum OPERATOR(pg_catalog.=) k.own_att
      JOIN pg_catalog.pg_class r ON r.oid OPERATOR(pg_catalog.=) c.conrelid
      -- A partition or inheritor of the referencing table with another owner, if any.
      LEFT JOIN LATERAL (
            WITH RECURSIVE tree(rel) AS (
                SELECT c.conrelid
                UNION
                SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent OPERATOR(pg_catalog.=) t.rel)
            SELECT t.rel::pg_catalog.regclass AS rel
              FROM tree t JOIN pg_catalog.pg_class d ON d.oid OPERATOR(pg_catalog.=) t.rel
             WHERE d.relowner OPERATOR(pg_catalog.<>) r.relowner
             LIMIT 1) mixed ON true
     WHERE c.contype OPERATOR(pg_catalog.=) 'f' AND c.confrelid OPERATOR(pg_catalog.=) tbl
       AND k.ref_att OPERATOR(pg_catalog.=) att.attnum
       AND c.conparentid OPERATOR(pg_catalog.=) 0
       AND a.atttypid OPERATOR(pg_catalog.<>) 'pg_catalog.int8'::pg_catalog.regtype;
    FOR i IN 1 .. COALESCE(pg_catalog.array_length(fk_rels, 1), 0) LOOP
        IF fk_inherited[i] THEN
            RAISE EXCEPTION 'cannot widen inherited column "%" of relation %', fk_columns[i], fk_rels[i]
                USING ERRCODE = 'feature_not_supported',
                      DETAIL = pg_catalog.format('Its foreign key references %s.%I, which becomes bigint; the column is inherited from a parent table.', tbl, col),
                      HINT = pg_catalog.format('Widen the column on the topmost parent table (ALTER TABLE ... ALTER COLUMN %I TYPE bigint), then call snowflake_convert_column() again.', fk_columns[i]);
        END IF;
        IF fk_mixed[i] IS NOT NULL THEN
            RAISE EXCEPTION 'relation % has owners other than role %: relation % is owned by role %',
                            fk_rels[i], fk_owners[i]::pg_catalog.regrole, fk_mixed[i],
                            (SELECT m.relowner::pg_catalog.regrole FROM pg_catalog.pg_class m WHERE m.oid OPERATOR(pg_catalog.=) fk_mixed[i])
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = pg_catalog.format('Column %I of relation %s references %s.%I and must become bigint; altering it alters its partitions and inheritors too, which would run their owners'' code with the rights of the role that alters it.', fk_columns[i], fk_rels[i], tbl, col),
                      HINT = pg_catalog.format('Give every table of the tree under %s one owner (ALTER TABLE ... OWNER TO), after checking its code, then call snowflake_convert_column() again.', fk_rels[i]);
        END IF;
        IF fk_owners[i] OPERATOR(pg_catalog.<>) me THEN
            RAISE EXCEPTION 'column "%" of relation % references %.%, but relation % is owned by role %',
                            fk_columns[i], fk_rels[i], tbl, col, fk_rels[i], fk_owners[i]::pg_catalog.regrole
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = pg_catalog.format('The column must become bigint with %s.%I. Altering a table rewrites it, which runs its owner''s code; only a session of that owner runs it safely.%s', tbl, col,
                                                 CASE WHEN include_others_tables
                                                      THEN ' include_others_tables no longer widens other roles'' tables (since 0.7.0): that owner''s code could act on this session.'
                                                      ELSE '' END),
                      HINT = pg_catalog.format('Let role %s, connected as itself, run ALTER TABLE %s ALTER COLUMN %I TYPE bigint first, then call snowflake_convert_column() again.',
                                               fk_owners[i]::pg_catalog.regrole, fk_rels[i], fk_columns[i]);
        END IF;
    END LOOP;

    -- Existing values must stay below the IDs that will follow them.
    EXECUTE pg_catalog.format('SELECT pg_catalog.max(%I)::bigint FROM %s', col, tbl) INTO max_value;
    EXECUTE pg_catalog.format('SELECT %s(pg_catalog.clock_timestamp())', from_ts_fn) INTO first_new;
    IF max_value OPERATOR(pg_catalog.>=) first_new THEN
        RAISE EXCEPTION 'existing values of column "%" of relation % reach the snowflake ID range', col, tbl
            USING ERRCODE = 'numeric_value_out_of_range',
                  DETAIL = pg_catalog.format('The largest value is %s; new snowflake IDs start near %s.', max_value, first_new),
                  HINT = 'Renumber the existing rows below that value, or add a new column.';
    END IF;

    seq := pg_catalog.pg_get_serial_sequence(tbl::pg_catalog.text, col::pg_catalog.text);
    IF kind OPERATOR(pg_catalog.=) 'identity' THEN
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

    IF att.atttypid OPERATOR(pg_catalog.<>) 'pg_catalog.int8'::pg_catalog.regtype THEN
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint', tbl, col);
    END IF;
    FOR i IN 1 .. COALESCE(pg_catalog.array_length(fk_rels, 1), 0) LOOP
        -- Every referencing table is the caller's own (checked above).
        EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint', fk_rels[i], fk_columns[i]);
        RAISE NOTICE 'widened %.% to bigint', fk_rels[i], fk_columns[i];
    END LOOP;

    EXECUTE pg_catalog.format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT %s()', tbl, col, next_fn);
END
$convert$;
COMMENT ON FUNCTION @extschema@.snowflake_convert_column(regclass, name, boolean) IS
    'Moves a serial, identity or sequence-default column to DEFAULT snowflake_next(), widening it and referencing columns of the caller''s own tables to bigint';

-- Finds (datacenter id, worker id) pairs that arrive from more than one origin: two nodes
-- configured with the same pair, the one mistake that makes snowflake IDs collide.
-- origin_column must identify the node a row came from (e.g. a column with
-- DEFAULT current_setting('cluster_name') on every node).
CREATE FUNCTION @extschema@.snowflake_worker_collisions(tbl regclass, id_column name, origin_column name)
RETURNS TABLE (datacenter_id integer, worker_id integer, origins text[], ids bigint)
LANGUAGE plpgsql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $collisions$
BEGIN
    RETURN QUERY EXECUTE pg_catalog.format(
        'SELECT ((%1$I::pg_catalog.int8 OPERATOR(pg_catalog.>>) 17) OPERATOR(pg_catalog.&) 31::pg_catalog.int8)::pg_catalog.int4,
                ((%1$I::pg_catalog.int8 OPERATOR(pg_catalog.>>) 12) OPERATOR(pg_catalog.&) 31::pg_catalog.int8)::pg_catalog.int4,
                pg_catalog.array_agg(DISTINCT %2$I::pg_catalog.text ORDER BY %2$I::pg_catalog.text), pg_catalog.count(*)
           FROM %3$s
          GROUP BY 1, 2
         HAVING pg_catalog.count(DISTINCT %2$I) OPERATOR(pg_catalog.>) 1::pg_catalog.int8
          ORDER BY 1, 2',
        id_column, origin_column, tbl);
END
$collisions$;
COMMENT ON FUNCTION @extschema@.snowflake_worker_collisions(regclass, name, name) IS
    'Datacenter/worker id pairs that arrive from more than one origin (a fleet misconfiguration)';

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
-- This script runs as the bootstrap superuser in a trusted install: every call names its
-- schema and passes arguments of exactly the declared types, so that no look-alike overload
-- (e.g. a snowflake_to_timestamp(integer) in the extension's schema, which a database owner
-- may own) is a better match and runs instead (tests/integration/test_script_capture.py).
INSERT INTO @extschema@.snowflake_origin (system_identifier, epoch_unix_ms)
SELECT s.system_identifier,
       pg_catalog.round(EXTRACT(epoch FROM @extschema@.snowflake_to_timestamp(0::pg_catalog.int8))
                        OPERATOR(pg_catalog.*) 1000::pg_catalog.numeric)::pg_catalog.int8
  FROM pg_catalog.pg_control_system() s;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.snowflake_origin', '');
REVOKE ALL ON @extschema@.snowflake_origin FROM PUBLIC;
GRANT SELECT ON @extschema@.snowflake_origin TO PUBLIC;
COMMENT ON TABLE @extschema@.snowflake_origin IS
    'Which cluster issued this database''s snowflake IDs, and with which epoch (carried by pg_upgrade and pg_dump)';
