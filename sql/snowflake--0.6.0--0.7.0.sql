-- snowflake 0.6.0 -> 0.7.0: registries with no single point of failure (issue 26): etcd,
-- Redis Sentinel, a multi-host PostgreSQL coordinator, TLS and password files (the new clients
-- and the settings snowflake.registry_ca_file and snowflake.registry_password_file are in the
-- library); issue 35: SQL that names every function, operator and type it calls.
\echo Use "ALTER EXTENSION snowflake UPDATE TO '0.7.0'" to load this file. \quit

-- snowflake_worker_collisions(): its query names pg_catalog's operators and types
-- (OPERATOR(pg_catalog.>>), ::pg_catalog.int4), as every SQL the extension ships does. The
-- function's search_path already limited them to pg_catalog; now nothing depends on it.
CREATE OR REPLACE FUNCTION @extschema@.snowflake_worker_collisions(tbl regclass, id_column name, origin_column name)
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
