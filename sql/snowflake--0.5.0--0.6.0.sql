-- snowflake 0.5.0 -> 0.6.0: high availability without a pause (issue 25). No SQL object
-- changes: the fixes are in the library (where a promoted node resumes, the synchronous
-- wait, the prepared-transaction file).
\echo Use "ALTER EXTENSION snowflake UPDATE TO '0.6.0'" to load this file. \quit
