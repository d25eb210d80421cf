#!/usr/bin/env bash
# Runs every test, installing what it needs first (idempotent):
#   1. cargo fmt --check and cargo clippy -D warnings
#   2. cargo pgrx test: pure Rust unit/property tests and #[pg_test]s in a preloaded server
#   3. pg_regress: the SQL surface and its error messages (tests/pg_regress)
#   4. integration tests against real clusters (tests/integration)
# .ci/run calls exactly this script.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
started=$SECONDS

"$REPO_ROOT/scripts/setup.sh"

log "cargo fmt --check"
cargo fmt --check

log "cargo clippy"
cargo clippy --all-targets --no-default-features --features "pg${PG_MAJOR} pg_test" -- -D warnings

log "cargo pgrx test (unit, property and #[pg_test] tests)"
PGRX_TEST_DIR=/var/tmp/snowflake-pgrx-test
mkdir -p "$PGRX_TEST_DIR"
chown postgres: "$PGRX_TEST_DIR"
cargo pgrx test "pg${PG_MAJOR}" --runas postgres --pgdata "$PGRX_TEST_DIR/data"

# cargo pgrx test installed a build with test functions; replace it with the release build.
install_extension

log "pg_regress"
"$REPO_ROOT/scripts/regress.sh"

log "Integration tests (real clusters)"
(cd "$REPO_ROOT/tests/integration" && /usr/bin/python3 -m unittest discover -v -p 'test_*.py')

log "All tests passed in $((SECONDS - started)) s"
