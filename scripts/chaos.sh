#!/usr/bin/env bash
# A long randomized fault campaign for snowflake.worker_id = 'auto' (tests/integration/chaos/):
# nodes claiming worker ids from Redis, a PostgreSQL coordinator, etcd (three members) or Redis
# Sentinel (master, replica, three sentinels) under kills, freezes, restarts, clock steps,
# registry losses (and member losses, failovers) and clones, then a checker over every ID issued.
#   scripts/chaos.sh --minutes 60 [--seed S] [--registry redis|pg|etcd|sentinel|both|all] [--nodes 3]
#                    [--schedules K] [--kinds K1,K2] [--major 15] [--no-install] [--keep-going] [--keep]
# The minutes are split into schedules (5 minutes each by default; with both (redis, pg) or all
# (redis, pg, etcd, sentinel) the registries alternate), each a fresh fleet. Without --seed a random seed is picked and printed; the
# same seed (and --minutes, --registry, --nodes, --schedules) replays the same schedules.
# Builds and installs the extension for the major first (like bench.sh) unless --no-install;
# with --no-install, PG_BIN in the environment (a bin directory whose installation has the
# extension) runs against another installation.
# Exit status: 0 clean, 1 the checker found duplicates or order violations (clusters and logs
# kept, path printed), 2 a setup error.
# lib.sh points PG_BIN at the major's installation: keep the caller's for --no-install.
caller_pg_bin="${PG_BIN:-}"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

minutes=60
seed=""
registry=both
extra=()
install=1
major="${PG_MAJOR:-15}"
pg_bin_override=""
usage() {
    echo "usage: scripts/chaos.sh --minutes N [--seed S] [--registry redis|pg|etcd|sentinel|both|all] [--nodes N]" \
         "[--schedules K] [--major M] [--no-install] [--keep-going] [--keep]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="${2:?}"; shift ;;
        --seed) seed="${2:?}"; shift ;;
        --registry) registry="${2:?}"; shift ;;
        --nodes|--schedules|--free|--ttl|--kinds|--only) extra+=("$1" "${2:?}"); shift ;;
        --major) major="${2:?}"; shift ;;
        --no-install) install=0 ;;
        --keep-going|--keep|--quiet) extra+=("$1") ;;
        -h|--help) usage ;;
        *) usage ;;
    esac
    shift
done
case "$registry" in redis|pg|etcd|sentinel|both|all) ;; *) usage ;; esac

if [ "$install" = 0 ] && [ -n "$caller_pg_bin" ]; then
    pg_bin_override="$caller_pg_bin"
fi
use_major "$major"
if [ -n "$pg_bin_override" ]; then
    PG_BIN="$pg_bin_override"
    export PG_BIN
fi
if [ "$install" = 1 ]; then
    PG_MAJORS="$major" "$REPO_ROOT/scripts/setup.sh"
    install_extension
fi
# Redis is needed for the fixtures of every registry kind the campaign may draw; etcd and
# Sentinel only when their schedules run.
tools=(redis-server redis-cli)
case "$registry" in
    etcd) tools+=(etcd etcdctl) ;;
    sentinel) tools+=(redis-sentinel) ;;
    all) tools+=(etcd etcdctl redis-sentinel) ;;
esac
for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null || { echo "chaos.sh: $tool is missing (scripts/setup.sh installs it: etcd-server, etcd-client, redis-sentinel)" >&2; exit 2; }
done

if [ -z "$seed" ]; then
    seed="$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"
    log "No --seed given: using seed $seed"
fi

SNOWFLAKE_RUN_DIR=""
use_run_dir
export SNOWFLAKE_IT_BASE="$SNOWFLAKE_RUN_DIR/chaos"
log "Chaos campaign: seed $seed, $minutes minutes, registry $registry, PostgreSQL $PG_MAJOR ($PG_BIN); clusters in $SNOWFLAKE_IT_BASE"
rc=0
(cd "$REPO_ROOT/tests/integration" && exec /usr/bin/python3 -m chaos --minutes "$minutes" \
    --seed "$seed" --registry "$registry" "${extra[@]}") || rc=$?
if [ "$rc" = 0 ]; then
    rm -rf "$SNOWFLAKE_RUN_DIR"
    log "Chaos campaign with seed $seed: nothing found"
else
    log "Chaos campaign with seed $seed: exit $rc; clusters and logs kept in $SNOWFLAKE_RUN_DIR"
fi
exit "$rc"
