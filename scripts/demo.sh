#!/usr/bin/env bash
# Sets everything up and runs a short demo on a throwaway PostgreSQL cluster, left running.
#   scripts/demo.sh        install what is missing, build, (re)start the cluster, run the demo
#   scripts/demo.sh stop   stop the demo cluster
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR=/var/tmp/snowflake-demo
PORT="${DEMO_PORT:-5499}"

if [ "${1:-}" = "stop" ]; then
    cluster_stop "$DIR"
    echo "Demo cluster stopped. Remove it with: rm -rf $DIR"
    exit 0
fi

"$REPO_ROOT/scripts/setup.sh"
install_extension

if [ ! -f "$DIR/PG_VERSION" ]; then
    log "Creating a throwaway cluster in $DIR (worker id 1)"
    cluster_init "$DIR"
    cluster_conf "$DIR" \
        "shared_preload_libraries = 'snowflake'" \
        "snowflake.worker_id = 1" \
        "snowflake.datacenter_id = 0"
fi
# Restart so the server loads the library just built.
cluster_stop "$DIR"
log "Starting it on port $PORT"
cluster_start "$DIR" "$PORT"

log "Demo"
cluster_psql "$DIR" "$PORT" -v ON_ERROR_STOP=1 <<'SQL'
CREATE EXTENSION IF NOT EXISTS snowflake;
ALTER EXTENSION snowflake UPDATE;  -- a no-op unless an older version was installed
SET client_min_messages = warning;
DROP TABLE IF EXISTS order_lines, orders;
RESET client_min_messages;
CREATE TABLE orders (
    id       bigint PRIMARY KEY DEFAULT snowflake_next(),
    customer text NOT NULL
);
CREATE TABLE order_lines (
    id       bigint PRIMARY KEY DEFAULT snowflake_next(),
    order_id bigint NOT NULL REFERENCES orders,
    item     text NOT NULL
);

-- Pre-assign the master's ID and its details' IDs, then write them in one transaction.
BEGIN;
SELECT snowflake_next() AS order_id, snowflake_next() AS line_1, snowflake_next() AS line_2 \gset
INSERT INTO orders (id, customer) VALUES (:order_id, 'ACME Corp');
INSERT INTO order_lines (id, order_id, item) VALUES
    (:line_1, :order_id, '100 bolts'),
    (:line_2, :order_id, '100 nuts');
COMMIT;

\echo 'Master and detail rows:'
SELECT o.id AS order_id, o.customer, l.id AS line_id, l.item
  FROM orders o JOIN order_lines l ON l.order_id = o.id ORDER BY l.id;

\echo 'Every ID decodes back to its time, datacenter, worker and sequence:'
SELECT l.id, d.*
  FROM order_lines l, snowflake_decode(l.id) d ORDER BY l.id;

\echo 'Rows created in the last hour, found through the primary key:'
SELECT count(*) FROM order_lines
 WHERE id >= snowflake_from_timestamp(now() - interval '1 hour');
SQL

cat <<MSG

The demo cluster is running (PostgreSQL ${PG_MAJOR}, snowflake.worker_id = 1).
  Connect:  psql -h $DIR -p $PORT -U postgres
  Stop:     scripts/demo.sh stop
MSG
