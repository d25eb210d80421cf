# shellcheck shell=bash
# Shared helpers for the scripts in this directory. Source it; do not run it.
# Everything runs as root (as CI does); PostgreSQL servers run as the "postgres" OS user,
# because initdb and pg_ctl refuse root.

set -euo pipefail
# Without it, a function called as "$(f)" runs with -e off: its failing steps pass unseen.
shopt -s inherit_errexit

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Installation prefix of a major, as Debian and PGDG lay it out: 15 is Debian's package; the
# others are built from source packages by scripts/build-pg.sh into a local package.
pg_prefix_of() { echo "/usr/lib/postgresql/$1"; }
# pg_config of a major.
pg_config_of() { echo "$(pg_prefix_of "$1")/bin/pg_config"; }

# use_major N: points PG_MAJOR, PG_CONFIG and PG_BIN at PostgreSQL N.
use_major() {
    PG_MAJOR="$1"
    PG_CONFIG="$(pg_config_of "$1")"
    PG_BIN="$(dirname "$PG_CONFIG")"
    export PG_MAJOR PG_CONFIG PG_BIN
}
use_major "${PG_MAJOR:-15}"
export PATH="${HOME}/.cargo/bin:${PATH}"
# Python libraries from PyPI that Debian 12 lacks (SQLAlchemy 2), for the client examples.
PYLIB=/opt/snowflake-pylib
# shellcheck disable=SC2034 # setup.sh's
SQLALCHEMY_VERSION=2.1.9
export PYLIB
# ruff, the Python linter of scripts/lint.sh (from PyPI, pinned; setup.sh installs it here).
# shellcheck disable=SC2034 # setup.sh's and lint.sh's
RUFF_DIR=/opt/snowflake-ruff RUFF_VERSION=0.17.5

log() { printf '\n==> %s\n' "$*" >&2; }

# use_run_dir: points SNOWFLAKE_RUN_DIR at a private directory for this run's clusters (a new
# one unless the caller exported one: test.sh does, for all its scripts). Two runs on one
# machine never share a path; servers listen only on a Unix socket inside their own
# directory, so they never share a socket either, whatever the port number.
use_run_dir() {
    if [ -z "${SNOWFLAKE_RUN_DIR:-}" ]; then
        SNOWFLAKE_RUN_DIR="$(mktemp -d /var/tmp/snowflake-run.XXXXXX)"
        export SNOWFLAKE_RUN_DIR
    fi
    # The postgres OS user must reach the clusters inside.
    chmod 755 "$SNOWFLAKE_RUN_DIR"
}

# require_free_space DIR GIB WHAT: stops the run at once, with the numbers and what to
# delete, when the file system holding DIR has less than GIB GiB free. A full disk otherwise
# shows up half an hour later as scattered "No space left on device" failures of unrelated
# tests (initdb, openssl, etcd, inserts), which is how a CI run once failed.
require_free_space() {
    local dir="$1" need_gib="$2" what="$3" avail_kib
    avail_kib="$(df --output=avail -k "$dir" | tail -1 | tr -d ' ')"
    if [ "$avail_kib" -lt $((need_gib * 1024 * 1024)) ]; then
        echo "error: $((avail_kib / 1024 / 1024)) GiB free on the file system of $dir; $what needs $need_gib GiB" >&2
        local leftovers
        # shellcheck disable=SC2010 # mktemp names them: no odd characters
        leftovers="$(ls -d /var/tmp/snowflake-run.* 2>/dev/null | grep -v "^${SNOWFLAKE_RUN_DIR:-none}\$" || true)"
        if [ -n "$leftovers" ]; then
            echo "hint: the clusters and logs kept by earlier failed runs can be deleted:" >&2
            # shellcheck disable=SC2086 # one word a directory
            du -sh $leftovers >&2 || true
        fi
        exit 1
    fi
}

# start_cpu_hogs: the test command's stress mode. One busy loop per core at normal priority,
# for as long as the calling script lives: each loop ends by itself once its parent is gone
# (a killed run leaves no hog behind), and the script's exit stops them at once.
start_cpu_hogs() {
    local cores i parent="$BASHPID" # read here: in the background command below it would
    cores="$(nproc)"                #   be the child's own pid
    CPU_HOGS=()
    for ((i = 0; i < cores; i++)); do
        # The parent's pid is passed, not read at start: a parent killed while Python
        # starts would otherwise leave a hog that never ends.
        /usr/bin/python3 -c '
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(100000):
        pass
' "$parent" &
        CPU_HOGS+=("$!")
    done
    CPU_HOGS_STARTED=$SECONDS
    trap stop_cpu_hogs EXIT
    sleep 1
    for i in "${CPU_HOGS[@]}"; do
        kill -0 "$i" 2>/dev/null || { echo "error: a CPU hog of the stress mode did not start" >&2; exit 1; }
    done
    log "Stress mode: $cores CPU hogs (a busy loop per core, normal priority) for the whole run"
}

# stop_cpu_hogs: stops the hogs and says how much CPU they took, so that a stress run shows it
# was one (CPU seconds from /proc, the 14th and 15th fields of stat: user and system ticks).
stop_cpu_hogs() {
    local pid ticks=0 fields
    for pid in "${CPU_HOGS[@]}"; do
        if fields="$(cut -d' ' -f14,15 "/proc/$pid/stat" 2>/dev/null)"; then
            ticks=$((ticks + ${fields% *} + ${fields#* }))
        fi
        kill "$pid" 2>/dev/null || true
    done
    log "Stress mode: the hogs took $((ticks / $(getconf CLK_TCK))) CPU seconds in $((SECONDS - CPU_HOGS_STARTED)) s"
}

# shlib_depends [-lDIR] FILE...: the Depends line that the ELF files need, as dpkg-shlibdeps
# computes it for a Debian package (libraries found in a -l directory are the package's own).
shlib_depends() {
    local tmp out rc=0
    tmp="$(mktemp -d)"
    mkdir "$tmp/debian"
    printf 'Source: local\n\nPackage: local\nArchitecture: any\n' >"$tmp/debian/control"
    out="$(cd "$tmp" && dpkg-shlibdeps -O --ignore-missing-info "$@")" || rc=$?
    rm -rf "$tmp"
    [ "$rc" = 0 ] && [ -n "$out" ] || { echo "shlib_depends: dpkg-shlibdeps failed on $*" >&2; return 1; }
    sed -n 's/^shlibs:Depends=//p' <<<"$out"
}

# Runs a command as the postgres OS user, keeping the given environment.
as_postgres() { runuser -u postgres -- "$@"; }

# cluster_init DIR: a fresh data directory owned by postgres, trust auth for local sockets.
cluster_init() {
    local dir="$1"
    rm -rf "$dir"
    mkdir -p "$dir"
    chown postgres: "$dir"
    as_postgres "$PG_BIN/initdb" -D "$dir" -U postgres -A trust --no-sync >/dev/null
}

# cluster_conf DIR LINE...: appends settings to postgresql.conf.
cluster_conf() {
    local dir="$1"
    shift
    printf '%s\n' "$@" >>"$dir/postgresql.conf"
}

# cluster_start DIR PORT: starts the server with its socket in DIR.
cluster_start() {
    local dir="$1" port="$2"
    as_postgres "$PG_BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
        -o "-p $port -k $dir -c listen_addresses=''" start >/dev/null
}

# cluster_stop DIR [MODE]: stops the server if it runs.
cluster_stop() {
    local dir="$1" mode="${2:-fast}"
    if [ -f "$dir/postmaster.pid" ]; then
        as_postgres "$PG_BIN/pg_ctl" -D "$dir" -m "$mode" -w stop >/dev/null || true
    fi
}

# cluster_fresh DIR PORT SETTING...: replaces DIR (owned by postgres) with a new cluster in
# DIR/data that preloads the library, applies the settings, and starts it on PORT.
cluster_fresh() {
    local dir="$1" port="$2"
    shift 2
    cluster_stop "$dir/data" immediate
    rm -rf "$dir"
    mkdir -p "$dir"
    chown postgres: "$dir"
    cluster_init "$dir/data"
    cluster_conf "$dir/data" "shared_preload_libraries = 'snowflake'" "$@"
    cluster_start "$dir/data" "$port"
}

# cluster_psql DIR PORT ARGS...: psql as postgres against the cluster.
cluster_psql() {
    local dir="$1" port="$2"
    shift 2
    "$PG_BIN/psql" -X -h "$dir" -p "$port" -U postgres "$@"
}

# Builds the release library and installs it into PostgreSQL's directories, with the
# install script of every released version (pgrx copies only the upgrade scripts).
install_extension() {
    log "Building and installing the extension (release) for PostgreSQL ${PG_MAJOR}"
    (cd "$REPO_ROOT" && cargo pgrx install --release --pg-config "$PG_CONFIG" \
        --no-default-features --features "pg${PG_MAJOR}")
    install_released_scripts "$("$PG_CONFIG" --sharedir)/extension"
    # The secondary control files (earlier versions for superusers only: docs/upgrades.md).
    install -m 644 "$REPO_ROOT"/sql/snowflake--*.control "$("$PG_CONFIG" --sharedir)/extension/"
}

# build_revision_library REV WORKTREE OUT: builds an earlier revision's library (release)
# from a git worktree at WORKTREE with its own target directory (kept in
# /var/tmp/snowflake-ab-target, so a second build compiles only what changed); copies it to OUT.
build_revision_library() {
    local rev="$1" worktree="$2" out="$3" target=/var/tmp/snowflake-ab-target
    log "Building revision $rev (release) for PostgreSQL ${PG_MAJOR}"
    git -C "$REPO_ROOT" worktree add --detach "$worktree" "$rev" >/dev/null
    (cd "$worktree" && CARGO_TARGET_DIR="$target" cargo pgrx package \
        --pg-config "$PG_CONFIG" --no-default-features --features "pg${PG_MAJOR}" >&2)
    cp "$target/release/snowflake-pg${PG_MAJOR}$("$PG_CONFIG" --pkglibdir)/snowflake.so" "$out"
}

# install_released_scripts DEST [TREE]: copies the frozen install scripts of earlier releases
# (TREE/sql/snowflake--<version>.sql; TREE defaults to this checkout) into DEST.
install_released_scripts() {
    local dest="$1" tree="${2:-$REPO_ROOT}" f
    for f in "$tree"/sql/snowflake--*.sql; do
        case "$(basename "$f")" in
            snowflake--*--*.sql) ;; # upgrade scripts: pgrx copies them
            *) install -m 644 "$f" "$dest/" ;;
        esac
    done
}
