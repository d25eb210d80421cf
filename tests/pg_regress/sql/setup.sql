-- Installs the extension for the other files. The server preloads the library with
-- snowflake.worker_id = 1 and snowflake.datacenter_id = 2 (scripts/regress.sh).
CREATE EXTENSION snowflake;
