-- snowflake 0.4.0 -> 0.5.0: fleet identity under faults (issue 24). No SQL object changes:
-- the fixes are in the library (the registry worker, the claim file, the registry clients).
-- snowflake_stats.claim_status gains the value 'mark_ahead'.
\echo Use "ALTER EXTENSION snowflake UPDATE TO '0.5.0'" to load this file. \quit
