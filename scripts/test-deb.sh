#!/usr/bin/env bash
# Tests one major's Debian package the way a DBA uses it, with apt:
#   1. lintian: an error fails; warnings are printed (each judged in docs/install.md);
#   2. with --upgrade: the previous release's package (built from its commit, see
#      packaging/previous-release) installed and used by a cluster, then upgraded in place to
#      DEB; after a restart, ALTER EXTENSION UPDATE and new IDs above the old ones;
#      without: DEB installed and used;
#   3. apt-get remove: the library and the extension's files are gone (and, on 18 and later,
#      the CloudNativePG image volume layout tested meanwhile: scripts/test-containers.sh);
#   4. DEB installed again and checked file by file (dpkg --verify), for the suites that follow;
#      its copyright file names every crate the library links (against `cargo tree`).
#   scripts/test-deb.sh DEB [--upgrade] [--no-lintian]     (PG_MAJOR: the package's major)
# (The test command runs lintian on every package at once, beside the integration tests.)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$REPO_ROOT/scripts/packaging.sh"
deb="$(realpath "$1")"   # apt-get takes a path only with a directory
shift
upgrade=""
lint=1
for option in "$@"; do
    case "$option" in
        --upgrade) upgrade=--upgrade ;;
        --no-lintian) lint=0 ;;
        *) echo "usage: scripts/test-deb.sh DEB [--upgrade] [--no-lintian]" >&2; exit 2 ;;
    esac
done
use_run_dir
pkg="$(deb_name)"
version="$(dpkg-deb -f "$deb" Version)"
lib="$("$PG_CONFIG" --pkglibdir)/snowflake.so"
control="$("$PG_CONFIG" --sharedir)/extension/snowflake.control"
dir="$SNOWFLAKE_RUN_DIR/deb-pg$PG_MAJOR"
port=$((5470 + PG_MAJOR))

fail() { echo "test-deb.sh: PostgreSQL $PG_MAJOR: $*" >&2; exit 1; }
# Waits for the dpkg lock (apt-daily, another run) instead of failing at once.
apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=600 "$@" >/dev/null; }
status() { dpkg-query -W -f='${Status} ${Version}' "$pkg" 2>/dev/null || true; }
sql() { cluster_psql "$dir/data" "$port" -qAt -v ON_ERROR_STOP=1 -c "$1"; }
expect() { [ "$2" = "$3" ] || fail "$1: expected '$3', got '$2'"; }

if [ "$lint" = 1 ]; then
    log "PostgreSQL $PG_MAJOR: lintian $(basename "$deb")"
    lintian --fail-on error --display-level ">=warning" "$deb" >&2 || fail "lintian found errors"
fi

# A previous run, or cargo pgrx test, may have left files: start from no package.
if dpkg-query -W "$pkg" >/dev/null 2>&1; then
    apt_get purge "$pkg"
fi
if [ "$upgrade" = --upgrade ]; then
    old_deb="$(previous_release_deb)"
    old_version="$(dpkg-deb -f "$old_deb" Version)"
    log "PostgreSQL $PG_MAJOR: apt-get install $(basename "$old_deb"), then upgrade to $version"
    apt_get install "$old_deb"
    expect "installed" "$(status)" "install ok installed $old_version"
else
    log "PostgreSQL $PG_MAJOR: apt-get install $(basename "$deb")"
    apt_get install "$deb"
    old_version="$version"
fi
cluster_fresh "$dir" "$port" "snowflake.worker_id = 7"
sql "CREATE EXTENSION snowflake"
expect "extension version" "$(sql "SELECT extversion FROM pg_extension WHERE extname = 'snowflake'")" "${old_version%-*}"
sql "CREATE TABLE t (id bigint PRIMARY KEY DEFAULT snowflake_next(), n int)"
sql "INSERT INTO t (n) SELECT generate_series(1, 1000)"
if [ "$upgrade" = --upgrade ]; then
    apt_get install "$deb"
    expect "upgraded" "$(status)" "install ok installed $version"
    # The running server keeps the old library loaded until it restarts.
    cluster_stop "$dir/data"
    cluster_start "$dir/data" "$port"
    sql "ALTER EXTENSION snowflake UPDATE"
    expect "updated extension" "$(sql "SELECT extversion FROM pg_extension WHERE extname = 'snowflake'")" "${version%-*}"
    sql "INSERT INTO t (n) SELECT generate_series(1001, 2000)"
    expect "IDs after the upgrade above the ones before" \
        "$(sql "SELECT count(DISTINCT id) || ' ' || (min(id) FILTER (WHERE n > 1000) > max(id) FILTER (WHERE n <= 1000)) FROM t")" \
        "2000 true"
fi
expect "IDs decode to the worker" "$(sql "SELECT count(*) FROM t WHERE (snowflake_decode(id)).worker_id <> 7")" "0"
cluster_stop "$dir/data"

log "PostgreSQL $PG_MAJOR: apt-get remove $pkg"
apt_get remove "$pkg"
[ "$(status)" != "install ok installed $version" ] || fail "still installed after apt-get remove"
[ ! -e "$lib" ] || fail "$lib left behind by apt-get remove"
[ ! -e "$control" ] || fail "$control left behind by apt-get remove"
# With nothing of snowflake in the server's directories, the CloudNativePG image volume
# layout of the same package (PostgreSQL 18 and later: extension_control_path).
if [ "$PG_MAJOR" -ge 18 ]; then
    "$REPO_ROOT/scripts/test-containers.sh" --image-volume "$deb"
fi

log "PostgreSQL $PG_MAJOR: apt-get install $(basename "$deb") for the suites"
apt_get install "$deb"
expect "installed" "$(status)" "install ok installed $version"
dpkg --verify "$pkg" || fail "installed files differ from the package"
# The copyright file names every crate linked into the library. Checked against `cargo tree`
# (not the cargo metadata walk that wrote it): its normal dependencies but procedural macros,
# path crates aside.
copyright="/usr/share/doc/$pkg/copyright"
crates=0
while read -r name crate_version _; do
    grep -qxF "Files: vendor/$name-${crate_version#v}/*" "$copyright" ||
        fail "$copyright does not name the crate $name ${crate_version#v}, which the library links"
    crates=$((crates + 1))
done < <(cd "$REPO_ROOT" && cargo tree --locked -e normal,no-proc-macro --prefix none --format '{p}' \
    --target "$(rustc -vV | sed -n 's/^host: //p')" -p snowflake --no-default-features --features "pg$PG_MAJOR" |
    grep -v ' (/' | sed 's/ (\*)$//' | sort -u)
[ "$crates" -gt 100 ] || fail "cargo tree listed only $crates crates"
expect "crate paragraphs in $copyright" "$(grep -c '^Files: vendor/[^/]*/\*$' "$copyright")" "$crates"
rm -rf "$dir"
