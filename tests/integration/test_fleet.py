"""Several primaries with distinct worker ids insert concurrently; PostgreSQL's logical
replication fans every row into a hub. Every row arrives exactly once, without key
conflicts, and snowflake_decode tells the nodes apart. A misconfigured node that reuses a
worker id is caught by snowflake_worker_collisions()."""

import threading
import unittest

from harness import Cluster, wait_until

TABLE = """CREATE TABLE events (
               id bigint PRIMARY KEY DEFAULT snowflake_next(),
               node text NOT NULL DEFAULT current_setting('cluster_name'),
               payload int NOT NULL)"""
ROWS_PER_NODE = 60_000


def node(name, worker):
    return Cluster(name, {
        "shared_preload_libraries": "'snowflake'",
        "snowflake.worker_id": str(worker),
        "snowflake.datacenter_id": "1",
        "wal_level": "logical",
        "cluster_name": f"'{name}'",
        # The hub runs one apply worker per node, plus table-sync workers.
        "max_logical_replication_workers": "12",
        "max_worker_processes": "20",
    })


class LogicalReplicationFanIn(unittest.TestCase):

    def test_fan_in_to_a_hub(self):
        nodes = [node(f"node{k}", k) for k in (1, 2, 3)]
        hub = node("hub", 9)
        rogue = node("rogue", 1)  # same worker id as node1: a misconfiguration
        everything = nodes + [hub, rogue]
        try:
            for c in everything:
                c.init()
                c.start()
                c.sql("CREATE EXTENSION snowflake")
                c.sql(TABLE)
            for c in nodes + [rogue]:
                c.sql("CREATE PUBLICATION events_pub FOR TABLE events")
            for c in nodes:
                hub.sql(f"""CREATE SUBSCRIPTION sub_{c.name}
                              CONNECTION 'host={c.dir} port={c.port} user=postgres dbname=postgres'
                              PUBLICATION events_pub""")

            def load(c):
                with c.connect() as conn:
                    for start in range(0, ROWS_PER_NODE, 5000):
                        conn.execute("INSERT INTO events (payload) SELECT g FROM generate_series(%s::int, %s::int) g",
                                     (start, start + 4999))

            threads = [threading.Thread(target=load, args=(c,)) for c in nodes]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

            expected = ROWS_PER_NODE * len(nodes)
            wait_until(lambda: hub.one("SELECT count(*) FROM events") >= expected,
                       what="every row replicated to the hub")
            total, distinct = hub.sql("SELECT count(*), count(DISTINCT id) FROM events")[0]
            self.assertEqual(total, expected)
            self.assertEqual(distinct, expected)
            # The decoded worker id identifies the node of every row.
            by_worker = hub.sql("""SELECT (snowflake_decode(id)).worker_id, node, count(*)
                                     FROM events GROUP BY 1, 2 ORDER BY 1""")
            self.assertEqual(by_worker, [(k, f"node{k}", ROWS_PER_NODE) for k in (1, 2, 3)])
            self.assertEqual(hub.sql("SELECT * FROM snowflake_worker_collisions('events', 'id', 'node')"), [])
            # No subscription worker hit a key conflict.
            self.assertNotIn("duplicate key value", hub.log())

            # A fourth node that reuses worker id 1 is reported.
            rogue.sql("INSERT INTO events (payload) SELECT g FROM generate_series(1, 1000) g")
            hub.sql(f"""CREATE SUBSCRIPTION sub_rogue
                          CONNECTION 'host={rogue.dir} port={rogue.port} user=postgres dbname=postgres'
                          PUBLICATION events_pub""")
            wait_until(lambda: hub.one("SELECT count(*) FROM events WHERE node = 'rogue'") >= 1000,
                       what="the rogue's rows replicated to the hub")
            collisions = hub.sql("SELECT datacenter_id, worker_id, origins FROM snowflake_worker_collisions('events', 'id', 'node')")
            self.assertEqual(collisions, [(1, 1, ["node1", "rogue"])])
        finally:
            for c in [hub] + nodes + [rogue]:
                c.destroy()


if __name__ == "__main__":
    unittest.main(verbosity=2)
