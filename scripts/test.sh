#!/usr/bin/env bash
# Runs every test, installing what it needs first (idempotent), on PostgreSQL 15, 16, 17 and 18
# (PG_MAJORS overrides the list):
#   1. cargo fmt --check, cargo clippy -D warnings, the released-scripts rule, the docs' links
#   2. per major: cargo pgrx test (pure Rust unit/property tests and #[pg_test]s in a
#      preloaded server), the release .deb built, installed and removed with apt
#      (scripts/test-deb.sh), installed again, and pg_regress against it; on the last major,
#      the container recipes' steps as scripts (scripts/test-containers.sh)
#   3. the integration tests against real clusters (tests/integration), IT_JOBS majors at a
#      time (default 4: all of them); beside them, at the lowest CPU priority, the PGXN
#      distribution (scripts/check-dist.sh: META.json validated, the zip built and installed)
#      lintian on every package, and the previous release's package (built from its commit,
#      then cached)
#   4. on DEB_UPGRADE_MAJORS, once their suites are done: that package installed with apt,
#      used, and upgraded in place to this one (scripts/test-deb.sh --upgrade)
# .ci/run calls exactly this script.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$REPO_ROOT/scripts/packaging.sh"
cd "$REPO_ROOT"
started=$SECONDS
export PG_MAJORS="${PG_MAJORS:-15 16 17 18}"
# The apt upgrade from the previous release's package is the same on every major (dpkg
# replaces the files, ALTER EXTENSION UPDATE runs the same scripts); building that release
# costs 3 to 5 minutes a major the first time (then it is cached), so one major by default.
# (17 when the run has it, else the run's last major.)
DEB_UPGRADE_MAJORS="${DEB_UPGRADE_MAJORS:-$([[ " $PG_MAJORS " == *" 17 "* ]] && echo 17 || echo "${PG_MAJORS##* }")}"
for major in $DEB_UPGRADE_MAJORS; do
    [[ " $PG_MAJORS " == *" $major "* ]] || { echo "DEB_UPGRADE_MAJORS: $major is not in PG_MAJORS ($PG_MAJORS)" >&2; exit 2; }
done
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

log "Documentation: every link and anchor of README.md, CHANGELOG.md and docs/"
/usr/bin/python3 "$REPO_ROOT/scripts/check-docs.py"

debs=()
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

    # cargo pgrx test installed a build with test functions; the release package replaces
    # it, installed with apt the way docs/install.md tells a DBA to, after lintian and an
    # install, upgrade and removal. pg_regress and the integration tests run against it.
    deb="$(package_extension)"
    "$REPO_ROOT/scripts/test-deb.sh" "$deb" --no-lintian
    debs+=("$deb")
    if [ "$major" = "${PG_MAJORS##* }" ]; then
        "$REPO_ROOT/scripts/test-containers.sh" --docker-steps "$deb"
    fi

    log "PostgreSQL $major: pg_regress"
    "$REPO_ROOT/scripts/regress.sh"

    log "PostgreSQL $major: built, unit-tested and regress-tested ($((SECONDS - started)) s so far)"
done

# The integration suites mostly wait (leases, TTLs, clock steps): two at once took as long
# as one (about 10 minutes on 2 cores). So IT_JOBS of them run at once (default 4, every
# major), each in its own directory and log; the builds above are done by now, so the
# 17 -> 18 pg_upgrade test finds 17's install. A failed suite fails the run.
# The PGXN distribution builds its own copy of the crates (about 3 minutes of compiling):
# at nice 19 it takes only the CPU the waiting suites leave.
(
    use_major "${PG_MAJORS%% *}"
    exec nice -n 19 "$REPO_ROOT/scripts/check-dist.sh"
) >"$SNOWFLAKE_RUN_DIR/dist.log" 2>&1 &
dist_pid=$!
# The previous release's packages for the upgrade test, built meanwhile in the same way.
(
    renice -n 19 "$BASHPID" >/dev/null
    for major in $DEB_UPGRADE_MAJORS; do
        use_major "$major"
        previous_release_deb
    done
) >"$SNOWFLAKE_RUN_DIR/previous-release.log" 2>&1 &
previous_pid=$!
# lintian on every package (an error fails the run; warnings are printed, see docs/install.md).
(
    renice -n 19 "$BASHPID" >/dev/null
    for deb in "${debs[@]}"; do
        echo "lintian $(basename "$deb")"
        lintian --fail-on error --display-level ">=warning" "$deb" 2>&1 |
            { grep -v "^running with root privileges" || true; }
    done
) >"$SNOWFLAKE_RUN_DIR/lintian.log" 2>&1 &
lintian_pid=$!
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
    [ "$rc" = 0 ] || failed+=("PostgreSQL $m integration tests")
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
dist_rc=0
wait "$dist_pid" || dist_rc=$?
log "PGXN distribution: $([ "$dist_rc" = 0 ] && echo passed || echo "FAILED (exit $dist_rc)")"
cat "$SNOWFLAKE_RUN_DIR/dist.log" >&2
[ "$dist_rc" = 0 ] || failed+=("PGXN distribution")

lintian_rc=0
wait "$lintian_pid" || lintian_rc=$?
log "lintian: $([ "$lintian_rc" = 0 ] && echo "no error" || echo "FAILED (exit $lintian_rc)")"
cat "$SNOWFLAKE_RUN_DIR/lintian.log" >&2
[ "$lintian_rc" = 0 ] || failed+=("lintian")

# The upgrade from the previous release's package, now that no suite uses the extension.
previous_rc=0
wait "$previous_pid" || previous_rc=$?
if [ "$previous_rc" != 0 ]; then
    cat "$SNOWFLAKE_RUN_DIR/previous-release.log" >&2
    failed+=("building the previous release's package")
else
    for major in $DEB_UPGRADE_MAJORS; do
        use_major "$major"
        "$REPO_ROOT/scripts/test-deb.sh" "$(this_release_deb)" --upgrade --no-lintian ||
            failed+=("PostgreSQL $major: apt upgrade from the previous release")
    done
fi
if [ "${#failed[@]}" -gt 0 ]; then
    log "Failed: ${failed[*]}; clusters and logs kept in $SNOWFLAKE_RUN_DIR"
    exit 1
fi

rm -rf "$SNOWFLAKE_RUN_DIR"
log "All tests passed on PostgreSQL ${PG_MAJORS} in $((SECONDS - started)) s"
