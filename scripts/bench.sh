#!/usr/bin/env bash
# The benchmark suite (not part of the tests: benchmarks never gate CI on timing).
# Builds the release library, starts its own cluster, runs bench/bench.py, and writes
# bench/results.json, bench/results.md and bench/chart.svg.
#   scripts/bench.sh                 full run (about 10 minutes)
#   scripts/bench.sh --quick         smaller sizes, for a smoke test
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

use_run_dir
DIR="$SNOWFLAKE_RUN_DIR/bench"
PORT=55600  # names the socket in $DIR only: no TCP listener
PG_MAJORS="$PG_MAJOR" "$REPO_ROOT/scripts/setup.sh"
install_extension

cluster_fresh "$DIR" "$PORT" \
    "snowflake.worker_id = 1" \
    "synchronous_commit = off" \
    "shared_buffers = '1GB'" \
    "max_wal_size = '4GB'" \
    "max_connections = 50" \
    "autovacuum = off"
trap 'cluster_stop "$DIR/data"' EXIT

extra=()
if [ "${1:-}" = "--quick" ]; then
    extra=(--rows 1000000 --repeat 3 --clients 1 2 --pgbench-seconds 3 --pgbench-repeat 1
           --storage-rows 200000 --out "$DIR")
fi
PG_BIN="$PG_BIN" /usr/bin/python3 "$REPO_ROOT/bench/bench.py" --host "$DIR/data" --port "$PORT" \
    --workdir "$DIR" "${extra[@]}"
