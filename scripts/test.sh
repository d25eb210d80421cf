#!/usr/bin/env bash
# Runs every test, installing what it needs first (idempotent), on PostgreSQL 15, 16, 17 and 18
# (PG_MAJORS overrides the list):
#   1. cargo fmt --check, cargo clippy -D warnings, the released-scripts rule
#   2. per major: cargo pgrx test (pure Rust unit/property tests and #[pg_test]s in a
#      preloaded server), the release package installed from its tarball, and pg_regress
#   3. the integration tests against real clusters (tests/integration), IT_JOBS majors at a
#      time (default 4: all of them)
# .ci/run calls exactly this script.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
started=$SECONDS
export PG_MAJORS="${PG_MAJORS:-15 16 17 18}"
# This run's clusters (pgrx's test cluster, pg_regress's, the integration tests') live here,
# so that two runs on one machine do not collide; removed when every test passed.
SNOWFLAKE_RUN_DIR=""
use_run_dir
# Measured peaks of a warm run: about 1.5 GiB of clusters and logs in the run directory, and
# up to 9 GiB of cargo builds under target/ (four majors, debug and release) on a cold one.
require_free_space "$SNOWFLAKE_RUN_DIR" 4 "this run's clusters and logs"
require_free_space "$REPO_ROOT" 12 "a cold build of four majors under target/"

"$REPO_ROOT/scripts/setup.sh"

log "cargo fmt --check"
cargo fmt --check

log "The pure core: cargo clippy and cargo test (no PostgreSQL needed)"
cargo clippy -p snowflake-core --all-targets -- -D warnings
cargo test -p snowflake-core

log "Released SQL scripts"
"$REPO_ROOT/scripts/check-released.sh"

for major in $PG_MAJORS; do
    use_major "$major"
    # Each major compiles its own cfg branches: lint them all, not only the default's.
    log "PostgreSQL $major: cargo clippy"
    cargo clippy --all-targets --no-default-features --features "pg$major pg_test" -- -D warnings

    log "PostgreSQL $major: cargo pgrx test (unit, property and #[pg_test] tests)"
    PGRX_TEST_DIR="$SNOWFLAKE_RUN_DIR/pgrx-test-pg$major"
    mkdir -p "$PGRX_TEST_DIR"
    chown postgres: "$PGRX_TEST_DIR"
    cargo pgrx test "pg$major" --runas postgres --pgdata "$PGRX_TEST_DIR/data"

    # cargo pgrx test installed a build with test functions; install the release package
    # the way the README tells a DBA to: unpack the tarball over /.
    tarball="$(package_extension)"
    tar -C / -xzf "$tarball"

    log "PostgreSQL $major: pg_regress"
    "$REPO_ROOT/scripts/regress.sh"

    log "PostgreSQL $major: built, unit-tested and regress-tested ($((SECONDS - started)) s so far)"
done

# The integration suites mostly wait (leases, TTLs, clock steps): two at once took as long
# as one (about 10 minutes on 2 cores). So IT_JOBS of them run at once (default 4, every
# major), each in its own directory and log; the builds above are done by now, so the
# 17 -> 18 pg_upgrade test finds 17's install. A failed suite fails the run.
it_jobs="${IT_JOBS:-4}"
log "Integration tests (real clusters) on PostgreSQL ${PG_MAJORS}, ${it_jobs} majors at a time"
declare -A suite_pid=()
failed=()
# finish_suite MAJOR: waits for that major's suite and prints its log.
finish_suite() {
    local m="$1" rc=0
    wait "${suite_pid[$m]}" || rc=$?
    log "PostgreSQL $m: integration tests $([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)") ($((SECONDS - started)) s so far)"
    cat "$SNOWFLAKE_RUN_DIR/it-pg$m.log" >&2
    [ "$rc" = 0 ] || failed+=("$m")
    unset "suite_pid[$m]"
}
running=()
for major in $PG_MAJORS; do
    if [ "${#running[@]}" -ge "$it_jobs" ]; then
        finish_suite "${running[0]}"
        running=("${running[@]:1}")
    fi
    (
        use_major "$major"
        export SNOWFLAKE_IT_BASE="$SNOWFLAKE_RUN_DIR/it-pg$major"
        cd "$REPO_ROOT/tests/integration"
        exec /usr/bin/python3 -m unittest discover -v -p 'test_*.py'
    ) >"$SNOWFLAKE_RUN_DIR/it-pg$major.log" 2>&1 &
    suite_pid[$major]=$!
    running+=("$major")
    log "PostgreSQL $major: integration tests started (log: $SNOWFLAKE_RUN_DIR/it-pg$major.log)"
done
for major in "${running[@]}"; do
    finish_suite "$major"
done
if [ "${#failed[@]}" -gt 0 ]; then
    log "Integration tests failed on PostgreSQL ${failed[*]}; clusters and logs kept in $SNOWFLAKE_RUN_DIR"
    exit 1
fi

rm -rf "$SNOWFLAKE_RUN_DIR"
log "All tests passed on PostgreSQL ${PG_MAJORS} in $((SECONDS - started)) s"
