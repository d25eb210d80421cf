# Shared helpers for the scripts in this directory. Source it; do not run it.
# Everything runs as root (as CI does); PostgreSQL servers run as the "postgres" OS user,
# because initdb and pg_ctl refuse root.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_MAJOR="${PG_MAJOR:-15}"
PG_BIN="/usr/lib/postgresql/${PG_MAJOR}/bin"
PG_CONFIG="${PG_BIN}/pg_config"
export PATH="${HOME}/.cargo/bin:${PATH}"

log() { printf '\n==> %s\n' "$*" >&2; }

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

# cluster_psql DIR PORT ARGS...: psql as postgres against the cluster.
cluster_psql() {
    local dir="$1" port="$2"
    shift 2
    "$PG_BIN/psql" -X -h "$dir" -p "$port" -U postgres "$@"
}

# Builds the release library and installs it into PostgreSQL's directories.
install_extension() {
    log "Building and installing the extension (release) for PostgreSQL ${PG_MAJOR}"
    (cd "$REPO_ROOT" && cargo pgrx install --release --pg-config "$PG_CONFIG" \
        --no-default-features --features "pg${PG_MAJOR}")
}
