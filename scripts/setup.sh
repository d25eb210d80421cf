#!/usr/bin/env bash
# Installs what building and testing need, skipping what is already there:
# Debian packages, PostgreSQL 16/17/18 source builds (for the majors in PG_MAJORS),
# cargo-pgrx 0.18.1, `cargo pgrx init` for every major, cargo-deny, and the client libraries
# the examples use (SQLAlchemy 2 from PyPI into /opt/snowflake-pylib; npm's pg for
# examples/node).
#   PG_MAJORS="15 17 18" scripts/setup.sh      (default: 15)
#   SETUP_FOR=build scripts/setup.sh           what building a package needs, nothing else:
#                                              no registry servers, no client libraries
# It changes the machine it runs on (packages and services, local builds of PostgreSQL 16-18
# installed as postgresql-<major>): run it on a build or test machine, never on a database
# server (README, the warning under "Quick start").
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
majors="${PG_MAJORS:-15}"
setup_for="${SETUP_FOR:-test}"

# Rust comes from rustup, not from Debian (Debian 12's is far older than Cargo.toml's
# rust-version): check it first, and say how to get it.
RUST_NEEDED=1.95.0
rust_found="$(rustc --version 2>/dev/null | awk '{print $2}' || true)"
if [ -z "$rust_found" ] || ! printf '%s\n%s\n' "$RUST_NEEDED" "$rust_found" | sort -C -V; then
    cat >&2 <<MSG
setup.sh: Rust $RUST_NEEDED or later is needed; found: ${rust_found:-no rustc on PATH}.
Install it with rustup (see rustup.rs), as the user that builds:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain $RUST_NEEDED
then open a new shell (or: . "\$HOME/.cargo/env") and run this again.
MSG
    exit 1
fi

# What building the library and its package needs (SETUP_FOR=build), then what the tests
# add: the registries' servers, Patroni, the clock shims, the client examples' libraries.
PACKAGES=(
    postgresql-15 postgresql-server-dev-15 postgresql-client-15
    libclang-dev clang pkg-config dpkg-dev curl protobuf-compiler libprotobuf-dev libssl-dev
)
if [ "$setup_for" != build ]; then
    PACKAGES+=(
        sudo faketime libfaketime python3-psycopg python3-redis python3-pip openssl lintian unzip shellcheck
        redis-server redis-sentinel patroni etcd-server etcd-client
    )
fi
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
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # Debian's postgresql-15 package creates and starts a "main" cluster on port 5432, which
    # the tests never use: stop it only when this run installed that package (it is then
    # new and empty), never a cluster that was there before.
    if [[ " ${missing[*]} " == *" postgresql-15 "* ]]; then
        pg_ctlcluster 15 main stop 2>/dev/null || true
    fi
fi

for m in $majors; do
    [ "$m" = 15 ] || "$REPO_ROOT/scripts/build-pg.sh" "$m"
done

if [ "$(cargo pgrx --version 2>/dev/null || true)" != "cargo-pgrx 0.18.1" ]; then
    log "Installing cargo-pgrx 0.18.1 (about 5 minutes)"
    cargo install cargo-pgrx --version 0.18.1 --locked
fi

# cargo pgrx init rewrites the whole configuration: register every major that is present.
config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
args=()
needed=0
for m in 15 16 17 18; do
    pgc="$(pg_config_of "$m")"
    [ -x "$pgc" ] || continue
    args+=("--pg$m" "$pgc")
    grep -qs "^pg$m = \"$pgc\"" "$config" || needed=1
done
if [ "$needed" = 1 ]; then
    log "Registering PostgreSQL with pgrx: ${args[*]}"
    cargo pgrx init "${args[@]}"
fi

if [ "$setup_for" = build ]; then
    exit 0
fi

# cargo-deny, for the dependency policy of deny.toml (licences, bans, sources) that the test
# command checks; building does not need it.
if [ "$(cargo deny --version 2>/dev/null || true)" != "cargo-deny 0.18.9" ]; then
    log "Installing cargo-deny 0.18.9 (about 6 minutes)"
    cargo install cargo-deny --version 0.18.9 --locked
fi

# SQLAlchemy 2 for examples/python/sqlalchemy_models.py (Debian 12 ships 1.4), beside the
# system's psycopg: the tests run it with PYTHONPATH=/opt/snowflake-pylib.
if ! PYTHONPATH="$PYLIB" /usr/bin/python3 -c "import sqlalchemy, sys; sys.exit(sqlalchemy.__version__ != '$SQLALCHEMY_VERSION')" 2>/dev/null; then
    log "Installing SQLAlchemy $SQLALCHEMY_VERSION into $PYLIB"
    rm -rf "$PYLIB"
    /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
        --target "$PYLIB" "SQLAlchemy==$SQLALCHEMY_VERSION"
fi

# ruff for scripts/lint.sh (Debian 12 has none), pinned, in a directory of its own.
if [ "$("$RUFF_DIR/bin/ruff" --version 2>/dev/null || true)" != "ruff $RUFF_VERSION" ]; then
    log "Installing ruff $RUFF_VERSION into $RUFF_DIR"
    rm -rf "$RUFF_DIR"
    /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
        --target "$RUFF_DIR" "ruff==$RUFF_VERSION"
fi

# npm's pg driver for examples/node, as its package-lock.json pins it. The machine's Node.js
# comes with npm; without one, Debian's packages.
if ! command -v npm >/dev/null; then
    log "Installing Debian packages: nodejs npm"
    DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if [ ! -d "$REPO_ROOT/examples/node/node_modules/pg" ]; then
    log "Installing examples/node's dependencies (npm ci)"
    (cd "$REPO_ROOT/examples/node" && npm ci --no-audit --no-fund --loglevel=error)
fi
