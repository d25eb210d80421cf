-- snowflake 0.6.0 -> 0.7.0: registries with no single point of failure (issue 26): etcd,
-- Redis Sentinel, a multi-host PostgreSQL coordinator, TLS and password files. No SQL object
-- changes: the new clients and the settings snowflake.registry_ca_file and
-- snowflake.registry_password_file are in the library.
\echo Use "ALTER EXTENSION snowflake UPDATE TO '0.7.0'" to load this file. \quit
