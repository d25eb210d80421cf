#!/usr/bin/env bash
# Runs the pg_regress suite (tests/pg_regress) against a throwaway cluster that preloads the
# installed library with worker id 1 and datacenter id 2. Expects the extension installed.
# Usage: scripts/regress.sh [--update]   (--update copies results over the expected files)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

use_run_dir
DIR="$SNOWFLAKE_RUN_DIR/regress-pg$PG_MAJOR"
PORT=55432  # names the socket in $DIR only: no TCP listener
OUT="$DIR/out"
PG_REGRESS="$("$PG_CONFIG" --pkglibdir)/pgxs/src/test/regress/pg_regress"
SUITE="$REPO_ROOT/tests/pg_regress"

cluster_fresh "$DIR" "$PORT" \
    "snowflake.worker_id = 1" \
    "snowflake.datacenter_id = 2" \
    "snowflake.warning_interval = '1h'"
trap 'cluster_stop "$DIR/data" immediate' EXIT
# With --use-existing, pg_regress does not create the database.
cluster_psql "$DIR/data" "$PORT" -q -c "CREATE DATABASE snowflake_regress"

# setup first, then every other file in name order.
tests=(setup)
for f in "$SUITE"/sql/*.sql; do
    name="$(basename "$f" .sql)"
    [ "$name" = setup ] || tests+=("$name")
done

mkdir -p "$OUT"
cp -r "$SUITE/sql" "$SUITE/expected" "$OUT/"
chown -R postgres: "$OUT"
status=0
as_postgres "$PG_REGRESS" --use-existing --bindir="$PG_BIN" --inputdir="$OUT" --outputdir="$OUT" \
    --host="$DIR/data" --port="$PORT" --user=postgres --dbname=snowflake_regress \
    "${tests[@]}" || status=$?

if [ "${1:-}" = "--update" ]; then
    for t in "${tests[@]}"; do cp "$OUT/results/$t.out" "$SUITE/expected/$t.out"; done
    log "Updated expected files from $OUT/results"
elif [ "$status" -ne 0 ]; then
    cat "$OUT/regression.diffs" >&2 || true
fi
exit "$status"
