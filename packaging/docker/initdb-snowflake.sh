#!/usr/bin/env bash
# Runs once, when the container initializes an empty data directory (the official image's
# /docker-entrypoint-initdb.d), with the temporary server up. Writes the snowflake settings
# given as environment variables into postgresql.auto.conf and restarts that server (they
# take effect only at a server start, and CREATE EXTENSION records the epoch in effect in
# table snowflake_origin), then creates the extension in POSTGRES_DB and in template1, so
# that every database created later has it.
#   SNOWFLAKE_WORKER_ID (0-31, or auto), SNOWFLAKE_DATACENTER_ID, SNOWFLAKE_REGISTRY,
#   SNOWFLAKE_REGISTRY_PASSWORD_FILE, SNOWFLAKE_REGISTRY_CA_FILE, SNOWFLAKE_EPOCH
set -euo pipefail
run_sql() {
    psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-postgres}" "$@"
}
changed=0
for pair in worker_id:SNOWFLAKE_WORKER_ID datacenter_id:SNOWFLAKE_DATACENTER_ID \
    registry:SNOWFLAKE_REGISTRY registry_password_file:SNOWFLAKE_REGISTRY_PASSWORD_FILE \
    registry_ca_file:SNOWFLAKE_REGISTRY_CA_FILE epoch:SNOWFLAKE_EPOCH; do
    setting="snowflake.${pair%%:*}"
    variable="${pair#*:}"
    value="${!variable:-}"
    if [ -n "$value" ]; then
        # From standard input, so that psql quotes the value (:'v'); -c would not.
        run_sql --dbname postgres --set=v="$value" <<<"ALTER SYSTEM SET $setting = :'v'"
        changed=1
    fi
done
if [ "$changed" = 1 ]; then
    # pg_ctl restart starts it again with the entrypoint's options (postmaster.opts).
    pg_ctl -D "$PGDATA" -m fast -w restart >/dev/null
fi
for db in "${POSTGRES_DB:-postgres}" template1; do
    run_sql --dbname "$db" -c "CREATE EXTENSION IF NOT EXISTS snowflake"
done
