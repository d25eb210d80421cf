#!/usr/bin/env bash
# The test command, in two tiers:
#   scripts/test.sh            the full tier: every test, what CI runs (.ci/run calls exactly this)
#   scripts/test.sh --quick    the developer loop, minutes: formatting, lints, the core's tests,
#                              one major's #[pg_test]s, pg_regress and the fast integration
#                              suites (QUICK_MAJOR, default 15; QUICK_SUITES overrides the list)
# Both install what they need first (idempotent). SNOWFLAKE_TEST_STRESS=1 runs either with a
# CPU hog on every core for the whole run (a busy loop at normal priority): the suites must
# pass on a loaded machine too, since their timing rule (docs/testing.md) derives every
# liveness bound from the settings and the delays measured in the run.
# The full tier, on PostgreSQL 15, 16, 17 and 18 (PG_MAJORS overrides the list):
#   1. cargo fmt --check, cargo clippy -D warnings, the dependency policy (cargo deny), the
#      released-scripts rule, the docs' links
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
# Every run ends with the figures the suites reported instead of asserting (docs/testing.md).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$REPO_ROOT/scripts/packaging.sh"
cd "$REPO_ROOT"
tier=full
case "${1:-}" in
    "") ;;
    --quick) tier=quick ;;
    *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
started=$SECONDS
if [ "$tier" = quick ]; then
    export PG_MAJORS="${QUICK_MAJOR:-15}"
else
    export PG_MAJORS="${PG_MAJORS:-15 16 17 18}"
fi
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

# The jobs beside the integration suites run at the lowest CPU priority, so that they take
# only what the waiting suites leave; under the stress mode's hogs (normal priority) they
# would get nothing, so there they compete like everything else.
background_nice=19
if [ "${SNOWFLAKE_TEST_STRESS:-0}" = 1 ]; then
    start_cpu_hogs
    background_nice=0
fi

"$REPO_ROOT/scripts/setup.sh"

log "cargo fmt --check"
cargo fmt --check

log "The Python and the shell: ruff and shellcheck (scripts/lint.sh)"
"$REPO_ROOT/scripts/lint.sh"

log "The pure core: cargo clippy and cargo test (no PostgreSQL needed)"
cargo clippy -p snowflake-core --all-targets -- -D warnings
cargo test -p snowflake-core

log "The registry clients: cargo clippy, and their tests against a real Redis and etcd"
cargo clippy -p snowflake-registry --all-targets -- -D warnings
SNOWFLAKE_REQUIRE_REGISTRIES=1 cargo test -p snowflake-registry

log "Dependencies: licences, bans and sources (deny.toml)"
cargo deny --log-level error check licenses bans sources

log "Released SQL scripts"
"$REPO_ROOT/scripts/check-released.sh"

log "Documentation: every link and anchor of README.md, CHANGELOG.md and docs/"
/usr/bin/python3 "$REPO_ROOT/scripts/check-docs.py"

log "Documentation: every error message and setting of the code has its entry"
/usr/bin/python3 "$REPO_ROOT/scripts/check-errors.py"

# unit_test_major: clippy and cargo pgrx test for the current major (use_major).
unit_test_major() {
    # Each major compiles its own cfg branches: lint them all, not only the default's.
    log "PostgreSQL $PG_MAJOR: cargo clippy"
    cargo clippy --all-targets --no-default-features --features "pg$PG_MAJOR pg_test" -- -D warnings

    log "PostgreSQL $PG_MAJOR: cargo pgrx test (unit, property and #[pg_test] tests)"
    local test_dir="$SNOWFLAKE_RUN_DIR/pgrx-test-pg$PG_MAJOR"
    mkdir -p "$test_dir"
    chown postgres: "$test_dir"
    cargo pgrx test "pg$PG_MAJOR" --runas postgres --pgdata "$test_dir/data"
}

# print_figures: what the integration suites measured and reported instead of asserting
# (liveness figures: outages, errors while a registry member was lost, shutdown times).
print_figures() {
    local f m found=0
    for f in "$SNOWFLAKE_RUN_DIR"/it-pg*/figures.tsv; do
        [ -s "$f" ] || continue
        [ "$found" = 1 ] || log "Figures the integration suites reported (not pass/fail: docs/testing.md)"
        found=1
        m="${f%/figures.tsv}"
        m="${m##*/it-pg}"
        while IFS=$'\t' read -r test name text; do
            printf 'PostgreSQL %s  %s  %s: %s\n' "$m" "$test" "$name" "$text" >&2
        done <"$f"
    done
}

# print_durations: each major's slowest integration modules and its suite's total (wall
# seconds, from suite.py), for the time budget in docs/testing.md.
print_durations() {
    local f m
    for f in "$SNOWFLAKE_RUN_DIR"/it-pg*/durations.tsv; do
        [ -s "$f" ] || continue
        m="${f%/durations.tsv}"
        m="${m##*/it-pg}"
        printf 'PostgreSQL %s integration: %s s in all; slowest: %s\n' "$m" \
            "$(awk '{s += $1} END {print s}' "$f")" \
            "$(head -8 "$f" | awk '{printf "%s%s %s s", (NR > 1 ? ", " : ""), $2, $1}')" >&2
    done
}

if [ "$tier" = quick ]; then
    # The integration suites that start few clusters and wait on no lease or TTL (about
    # 3 minutes together); the full tier runs them all.
    QUICK_SUITES="${QUICK_SUITES:-test_foundation test_hostile test_security test_script_capture test_registry_transport test_fixtures test_chaos_checker test_check_errors}"
    use_major "$PG_MAJORS"
    unit_test_major
    # A debug build (the full tier installs the release package), with every released
    # version's script and control file, as the package has them.
    log "PostgreSQL $PG_MAJOR: installing a debug build"
    cargo pgrx install --pg-config "$PG_CONFIG" --no-default-features --features "pg$PG_MAJOR"
    install_released_scripts "$("$PG_CONFIG" --sharedir)/extension"
    install -m 644 "$REPO_ROOT"/sql/snowflake--*.control "$("$PG_CONFIG" --sharedir)/extension/"
    log "PostgreSQL $PG_MAJOR: pg_regress"
    "$REPO_ROOT/scripts/regress.sh"
    log "PostgreSQL $PG_MAJOR: the fast integration suites ($QUICK_SUITES)"
    rc=0
    (
        export SNOWFLAKE_IT_BASE="$SNOWFLAKE_RUN_DIR/it-pg$PG_MAJOR"
        cd "$REPO_ROOT/tests/integration"
        # shellcheck disable=SC2086 # a list of module names
        exec /usr/bin/python3 -m unittest -v $QUICK_SUITES
    ) || rc=$?
    print_figures
    if [ "$rc" != 0 ]; then
        log "Quick tier FAILED; clusters and logs kept in $SNOWFLAKE_RUN_DIR"
        exit 1
    fi
    rm -rf "$SNOWFLAKE_RUN_DIR"
    log "Quick tier passed on PostgreSQL $PG_MAJOR in $((SECONDS - started)) s (the full tier: scripts/test.sh)"
    exit 0
fi

debs=()
for major in $PG_MAJORS; do
    use_major "$major"
    unit_test_major

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
    exec nice -n "$background_nice" "$REPO_ROOT/scripts/check-dist.sh"
) >"$SNOWFLAKE_RUN_DIR/dist.log" 2>&1 &
dist_pid=$!
# The previous release's packages for the upgrade test, built meanwhile in the same way.
(
    renice -n "$background_nice" "$BASHPID" >/dev/null
    for major in $DEB_UPGRADE_MAJORS; do
        use_major "$major"
        previous_release_deb
    done
) >"$SNOWFLAKE_RUN_DIR/previous-release.log" 2>&1 &
previous_pid=$!
# lintian on every package (an error fails the run; warnings are printed, see docs/install.md).
(
    renice -n "$background_nice" "$BASHPID" >/dev/null
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
        exec /usr/bin/python3 suite.py  # unittest discover, timing each module
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
print_figures
print_durations
if [ "${#failed[@]}" -gt 0 ]; then
    log "Failed: ${failed[*]}; clusters and logs kept in $SNOWFLAKE_RUN_DIR"
    exit 1
fi

rm -rf "$SNOWFLAKE_RUN_DIR"
log "All tests passed on PostgreSQL ${PG_MAJORS} in $((SECONDS - started)) s$([ "${SNOWFLAKE_TEST_STRESS:-0}" = 1 ] && echo " (stress mode)")"
