#!/usr/bin/env bash
# Installs what building and testing need, skipping what is already there:
# Debian packages, cargo-pgrx 0.18.1, and `cargo pgrx init` for PostgreSQL 15.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PACKAGES=(
    "postgresql-${PG_MAJOR}" "postgresql-server-dev-${PG_MAJOR}" "postgresql-client-${PG_MAJOR}"
    libclang-dev clang pkg-config sudo faketime libfaketime python3-psycopg
)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "Installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # Debian's package starts a "main" cluster on port 5432; we never use it.
    pg_ctlcluster "$PG_MAJOR" main stop 2>/dev/null || true
fi

if [ "$(cargo pgrx --version 2>/dev/null || true)" != "cargo-pgrx 0.18.1" ]; then
    log "Installing cargo-pgrx 0.18.1 (about 5 minutes)"
    cargo install cargo-pgrx --version 0.18.1 --locked
fi

if ! grep -qs "^pg${PG_MAJOR} = \"${PG_CONFIG}\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    log "Registering PostgreSQL ${PG_MAJOR} with pgrx"
    cargo pgrx init "--pg${PG_MAJOR}" "$PG_CONFIG"
fi
