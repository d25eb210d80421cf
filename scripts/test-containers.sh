#!/usr/bin/env bash
# What of the container recipes can run without a container engine (this machine has only
# Docker's client), for the major in PG_MAJOR:
#   --docker-steps DEB   packaging/docker/Dockerfile's steps as scripts: build-deb.sh (the
#                        build stage; incremental after scripts/package.sh), install-image.sh
#                        (the final stage; apt skipped: DEB is installed already), and the
#                        image's initdb script run against a fresh cluster the way the official
#                        image runs it: settings from the environment, the extension in the
#                        application database and in template1, then the restart.
#   --image-volume DEB   packaging/cloudnative-pg's layout (extension-layout.sh) mounted the way
#                        CloudNativePG mounts it: a PostgreSQL 18 cluster with the image's
#                        share/ appended to extension_control_path and lib/ to
#                        dynamic_library_path, and nothing of snowflake in its own directories
#                        (run while DEB is removed: scripts/test-deb.sh does).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
mode="$1"
deb="$2"
use_run_dir
work="$SNOWFLAKE_RUN_DIR/containers-pg$PG_MAJOR"
port=$((5490 + PG_MAJOR))
rm -rf "$work"
mkdir -p "$work"
chmod 755 "$work"

fail() { echo "test-containers.sh: PostgreSQL $PG_MAJOR: $*" >&2; exit 1; }
sql() { local db="$1"; shift; cluster_psql "$work/pg/data" "$port" -d "$db" -qAt -v ON_ERROR_STOP=1 -c "$1"; }
expect() { [ "$2" = "$3" ] || fail "$1: expected '$3', got '$2'"; }

case "$mode" in
--docker-steps)
    log "PostgreSQL $PG_MAJOR: the Docker recipe's steps (packaging/docker), as scripts"
    built="$("$REPO_ROOT/packaging/docker/build-deb.sh" "$PG_MAJOR" "$work/out" | tail -1)"
    # The same package as scripts/package.sh's: the same control fields and file sums.
    dpkg-deb -e "$built" "$work/built.ctl"
    dpkg-deb -e "$deb" "$work/deb.ctl"
    diff -r "$work/built.ctl" "$work/deb.ctl" >&2 || fail "build-deb.sh made another package than scripts/package.sh"
    # The Dockerfile copies the scripts beside the package.
    cp "$REPO_ROOT"/packaging/docker/{install-image.sh,initdb-snowflake.sh} "$work/out/"
    printf "#shared_preload_libraries = ''\t# (change requires restart)\n" >"$work/sample"
    SKIP_APT=1 CONF_SAMPLE="$work/sample" INITDB_DIR="$work/initdb" \
        "$REPO_ROOT/packaging/docker/install-image.sh" "$work/out"
    # What the image's initdb makes of the sample, and its first start.
    cluster_init "$work/pg/data"
    cluster_conf "$work/pg/data" "$(grep '^shared_preload_libraries' "$work/sample")"
    cluster_start "$work/pg/data" "$port"
    sql postgres "CREATE DATABASE app"
    # The official entrypoint runs the scripts with the temporary server on a socket.
    as_postgres env PATH="$PG_BIN:$PATH" PGDATA="$work/pg/data" PGHOST="$work/pg/data" PGPORT="$port" \
        POSTGRES_USER=postgres POSTGRES_DB=app \
        SNOWFLAKE_WORKER_ID=5 SNOWFLAKE_DATACENTER_ID=2 SNOWFLAKE_EPOCH="2020-01-01 00:00:00+00" \
        "$work/initdb/50-snowflake.sh" >/dev/null
    expect "the epoch recorded at CREATE EXTENSION" \
        "$(sql app "SELECT epoch_unix_ms FROM snowflake_origin")" "1577836800000"
    cluster_stop "$work/pg/data"
    cluster_start "$work/pg/data" "$port"
    expect "worker id set" "$(sql postgres "SHOW snowflake.worker_id")" "5"
    expect "an ID from the application database" \
        "$(sql app "SELECT (p).worker_id || ' ' || (p).datacenter_id || ' ' || ((p).ts > now() - interval '1 minute') FROM (SELECT snowflake_decode(snowflake_next()) p) s")" \
        "5 2 true"
    sql postgres "CREATE DATABASE later"
    expect "a later database has the extension (template1)" \
        "$(sql later "SELECT extname FROM pg_extension WHERE extname = 'snowflake'")" "snowflake"
    ;;
--image-volume)
    [ "$PG_MAJOR" -ge 18 ] || fail "image volume extensions need PostgreSQL 18 (extension_control_path)"
    log "PostgreSQL $PG_MAJOR: the CloudNativePG image volume layout (packaging/cloudnative-pg)"
    [ ! -e "$("$PG_CONFIG" --pkglibdir)/snowflake.so" ] || fail "snowflake.so is installed: run while the package is removed"
    "$REPO_ROOT/packaging/cloudnative-pg/extension-layout.sh" "$deb" "$work/extensions/snowflake"
    chmod -R a+rX "$work/extensions"
    mount="$work/extensions/snowflake"
    cluster_init "$work/pg/data"
    # As CloudNativePG configures each mounted extension: appended after the defaults.
    cluster_conf "$work/pg/data" \
        "extension_control_path = '\$system:$mount/share'" \
        "dynamic_library_path = '\$libdir:$mount/lib'" \
        "shared_preload_libraries = 'snowflake'" \
        "snowflake.worker_id = 9"
    cluster_start "$work/pg/data" "$port"
    sql postgres "CREATE EXTENSION snowflake"
    expect "an ID from the mounted library" \
        "$(sql postgres "SELECT (snowflake_decode(snowflake_next())).worker_id")" "9"
    expect "C functions naming the library with a directory" \
        "$(sql postgres "SELECT count(*) FROM pg_proc WHERE probin LIKE '%snowflake%' AND probin <> 'snowflake'")" "0"
    ;;
*)
    echo "usage: scripts/test-containers.sh --docker-steps|--image-volume DEB" >&2
    exit 2
    ;;
esac
cluster_stop "$work/pg/data"
rm -rf "$work"
