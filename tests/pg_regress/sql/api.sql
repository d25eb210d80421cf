-- Pins the SQL surface: function signatures, volatility, strictness, parallel safety,
-- the snowflake_parts type, and the settings with their contexts.
SELECT p.proname,
       pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result,
       p.provolatile AS volatility, p.proisstrict AS strict, p.proparallel AS parallel
  FROM pg_proc p
  JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowflake'
 ORDER BY p.proname, arguments;

SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_attribute a
 WHERE a.attrelid = 'snowflake_parts'::regclass AND a.attnum > 0
 ORDER BY a.attnum;

SELECT name, setting, unit, context, vartype
  FROM pg_settings WHERE name LIKE 'snowflake.%' ORDER BY name;

-- Settings that decide uniqueness cannot be changed by a session.
SET snowflake.worker_id = 5;
\echo SQLSTATE :SQLSTATE
SET snowflake.datacenter_id = 5;
\echo SQLSTATE :SQLSTATE
SET snowflake.epoch = '2015-01-01 00:00:00+00';
\echo SQLSTATE :SQLSTATE
ALTER ROLE CURRENT_USER SET snowflake.worker_id = 5;
\echo SQLSTATE :SQLSTATE
-- The clock policy is reloadable by the administrator, but not per session.
SET snowflake.max_clock_drift = '1h';
\echo SQLSTATE :SQLSTATE
SET snowflake.lease_window = '1min';
\echo SQLSTATE :SQLSTATE
-- The prefix is reserved: misspelt settings are refused.
SET snowflake.workerid = 5;
\echo SQLSTATE :SQLSTATE

-- Table snowflake_origin: which cluster issued this database's IDs, with which epoch. It is
-- a configuration table (pg_dump and pg_upgrade carry it), readable by all, written by the
-- install script only.
SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull
  FROM pg_attribute a
 WHERE a.attrelid = 'snowflake_origin'::regclass AND a.attnum > 0
 ORDER BY a.attnum;
SELECT count(*) AS rows,
       bool_and(o.system_identifier = s.system_identifier) AS this_cluster,
       bool_and(o.epoch_unix_ms = 1288834974657) AS twitter_epoch
  FROM snowflake_origin o, pg_control_system() s;
SELECT c.relname, a.privilege_type AS granted_to_public
  FROM pg_extension e, unnest(e.extconfig) AS cfg(oid) JOIN pg_class c ON c.oid = cfg.oid,
       aclexplode(c.relacl) a
 WHERE e.extname = 'snowflake' AND a.grantee = 0;
