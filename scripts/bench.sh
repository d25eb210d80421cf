#!/usr/bin/env bash
# The benchmark suite (not part of the tests: benchmarks never gate CI on timing).
# Builds the release library, starts its own cluster, runs bench/bench.py, and writes
# bench/results.json, bench/results.md and bench/chart.svg.
#   scripts/bench.sh                  full run (about 13 minutes)
#   scripts/bench.sh --quick          smaller sizes, for a smoke test
#   scripts/bench.sh --baseline REV   also section 7: this build against revision REV, in the
#                                     same run (scripts/bench-ab.sh; about 8 more minutes)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

quick=0
baseline=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --baseline) baseline="${2:?--baseline needs a revision}"; shift ;;
        *) echo "usage: scripts/bench.sh [--quick] [--baseline REV]" >&2; exit 2 ;;
    esac
    shift
done

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
out="$REPO_ROOT/bench"
if [ "$quick" = 1 ]; then
    out="$DIR"  # a smoke run does not replace the published results
    extra=(--rows 1000000 --repeat 3 --clients 1 2 --pgbench-seconds 3 --pgbench-repeat 1
           --storage-rows 200000)
fi
PG_BIN="$PG_BIN" /usr/bin/python3 "$REPO_ROOT/bench/bench.py" --host "$DIR/data" --port "$PORT" \
    --workdir "$DIR" --out "$out" "${extra[@]}"

[ -n "$baseline" ] || exit 0
# Section 7: before and after, on a cluster of its own (bench-ab.sh makes and removes its own
# run directory), with this cluster stopped so that it does not compete.
cluster_stop "$DIR/data"
ab_rows=()
[ "$quick" = 0 ] || ab_rows=(--rows 200000 --rounds 4 --txn-seconds 1)
SNOWFLAKE_RUN_DIR="" "$REPO_ROOT/scripts/bench-ab.sh" "$baseline" "${ab_rows[@]}" --markdown "$DIR/ab.md"
{
    echo
    echo "## 7. Before and after: revision \`$(git -C "$REPO_ROOT" rev-parse --short "$baseline")\` (A) against this build (B)"
    echo
    cat "$DIR/ab.md"
} >>"$out/results.md"
