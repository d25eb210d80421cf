#!/usr/bin/env bash
# A/B benchmark of an earlier revision (A) against the working tree (B), on one cluster:
# the per-call cost of snowflake_next() and snowflake_next_batch() and the cost of a
# transaction asking for one ID, relative to nextval(), rounds alternating the two
# libraries (bench/ab.py). For "same figures within noise" checks after a refactor, and for
# the before/after section of scripts/bench.sh --baseline.
#   scripts/bench-ab.sh REV [--rows N] [--rounds N] [--txn-seconds N] [--markdown FILE]
#       (defaults 1,000,000 rows, 12 rounds, 3 s; PostgreSQL 15 unless PG_MAJOR is set)
# Revision A is built from a git worktree with its own target directory (kept in
# /var/tmp/snowflake-ab-target, so a second run rebuilds only what changed).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

rev="${1:?usage: scripts/bench-ab.sh REV [--rows N] [--rounds N] [--txn-seconds N] [--markdown FILE]}"
shift
use_run_dir
DIR="$SNOWFLAKE_RUN_DIR/ab"
PORT=55610  # names the socket in $DIR only: no TCP listener
PG_MAJORS="$PG_MAJOR" "$REPO_ROOT/scripts/setup.sh"
libdir="$("$PG_CONFIG" --pkglibdir)"

# B: the working tree, installed with its SQL (both builds share the SQL surface).
install_extension
cp "$libdir/snowflake.so" "$SNOWFLAKE_RUN_DIR/b.so"

# On any exit: stop the cluster, put B's library back (by rename: the file may be loaded),
# drop the worktree and the run directory.
worktree="$SNOWFLAKE_RUN_DIR/ab-worktree"
restore() {
    cluster_stop "$DIR/data"
    cp "$SNOWFLAKE_RUN_DIR/b.so" "$libdir/snowflake.so.new" && mv "$libdir/snowflake.so.new" "$libdir/snowflake.so"
    git -C "$REPO_ROOT" worktree remove --force "$worktree" 2>/dev/null || true
    rm -rf "$SNOWFLAKE_RUN_DIR"
}
trap restore EXIT

# A: the earlier revision's library only.
build_revision_library "$rev" "$worktree" "$SNOWFLAKE_RUN_DIR/a.so"

cluster_fresh "$DIR" "$PORT" \
    "snowflake.worker_id = 1" \
    "synchronous_commit = off" \
    "shared_buffers = '256MB'" \
    "autovacuum = off"
cluster_psql "$DIR/data" "$PORT" -q -c "CREATE EXTENSION snowflake"

log "A = $rev, B = working tree"
/usr/bin/python3 "$REPO_ROOT/bench/ab.py" --pg-bin "$PG_BIN" --data "$DIR/data" --port "$PORT" \
    --installed "$libdir/snowflake.so" --a "$SNOWFLAKE_RUN_DIR/a.so" --b "$SNOWFLAKE_RUN_DIR/b.so" \
    --workdir "$SNOWFLAKE_RUN_DIR" "$@"
