#!/usr/bin/env bash
# Runs every test, installing what it needs first (idempotent), on PostgreSQL 15, 16, 17 and 18
# (PG_MAJORS overrides the list):
#   1. cargo fmt --check, cargo clippy -D warnings, the released-scripts rule
#   2. per major: cargo pgrx test (pure Rust unit/property tests and #[pg_test]s in a
#      preloaded server), the release package installed from its tarball, pg_regress, and
#      the integration tests against real clusters (tests/integration)
# .ci/run calls exactly this script.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
started=$SECONDS
export PG_MAJORS="${PG_MAJORS:-15 16 17 18}"
# This run's clusters (pgrx's test cluster, pg_regress's, the integration tests') live here,
# so that two runs on one machine do not collide; removed when every test passed.
SNOWFLAKE_RUN_DIR=""
use_run_dir
export SNOWFLAKE_IT_BASE="$SNOWFLAKE_RUN_DIR/it"

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

    log "PostgreSQL $major: integration tests (real clusters)"
    (cd "$REPO_ROOT/tests/integration" && /usr/bin/python3 -m unittest discover -v -p 'test_*.py')
    log "PostgreSQL $major: passed ($((SECONDS - started)) s so far)"
done

rm -rf "$SNOWFLAKE_RUN_DIR"
log "All tests passed on PostgreSQL ${PG_MAJORS} in $((SECONDS - started)) s"
