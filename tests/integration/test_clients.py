"""Real clients and real dumps: the examples under examples/ run against a cluster, and a
database with converted tables survives pg_dump and pg_restore into another cluster."""

import json
import os
import subprocess
import unittest

from harness import PG_BIN, Cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRELOAD = "'snowflake'"


class Examples(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.pg = Cluster("examples", {
            "shared_preload_libraries": PRELOAD, "snowflake.worker_id": "9"}).init()
        cls.pg.start()
        cls.pg.sql("CREATE EXTENSION snowflake")

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()

    def env(self):
        return {**os.environ, "PGHOST": self.pg.dir, "PGPORT": str(self.pg.port),
                "PGUSER": "postgres", "PGDATABASE": "postgres"}

    def check_orders(self):
        bad = self.pg.one("""SELECT count(*) FROM order_lines l JOIN orders o ON o.id = l.order_id
                              WHERE l.id <= o.id OR (snowflake_decode(l.id)).worker_id <> 9""")
        self.assertEqual(bad, 0)

    def test_python_psycopg(self):
        out = subprocess.run(["/usr/bin/python3", os.path.join(REPO, "examples/python/master_detail.py")],
                             env=self.env(), check=True, capture_output=True, text=True).stdout
        self.assertEqual(out.count("from worker 9"), 3, out)
        self.check_orders()

    def test_python_sqlalchemy(self):
        """SQLAlchemy 2: a server_default key read back by RETURNING, and master/detail
        with IDs pre-assigned by snowflake_next_batch (scripts/setup.sh installs it)."""
        env = {**self.env(), "PYTHONPATH": os.environ.get("PYLIB", "/opt/snowflake-pylib")}
        out = subprocess.run(["/usr/bin/python3", os.path.join(REPO, "examples/python/sqlalchemy_models.py")],
                             env=env, check=True, capture_output=True, text=True).stdout
        lines = out.splitlines()
        self.assertEqual(len(lines), 2, out)
        for line in lines:
            order_id = int(line.split()[2].rstrip(","))
            line_ids = [int(x) for x in line.split("[")[1].rstrip("]").split(", ")]
            self.assertTrue(all(i > order_id for i in line_ids), line)
            self.assertEqual(self.pg.one("SELECT (snowflake_decode(%s)).worker_id", (order_id,)), 9)
        bad = self.pg.one("""SELECT count(*) FROM sa_order_lines l JOIN sa_orders o ON o.id = l.order_id
                              WHERE l.id <= o.id""")
        self.assertEqual(bad, 0)
        self.assertEqual(self.pg.one("SELECT count(*) FROM sa_order_lines"), 5)

    def test_node_pg(self):
        """Node.js with npm's pg: the ID as a string (exact), as BigInt, never as Number,
        and in JSON through snowflake_format (scripts/setup.sh runs npm ci)."""
        out = subprocess.run(["node", os.path.join(REPO, "examples/node/index.js")],
                             env=self.env(), check=True, capture_output=True, text=True).stdout
        got = json.loads(out)
        stored = self.pg.one("SELECT max(id)::text FROM notes")
        self.assertEqual(got["id"], stored)
        self.assertEqual(got["typeofDefault"], "string")
        self.assertEqual(got["bigint"], stored)
        self.assertEqual((got["typeofParsed"], got["parsedEqual"]), ("bigint", True))
        self.assertLess(got["distinctAsNumber"], 10)  # ten IDs, fewer Numbers
        self.assertEqual(got["body"], "hello from Node")
        self.assertEqual(got["formatted"]["id"], stored)
        self.assertEqual(got["formatted"]["worker_id"], 9)
        self.assertEqual(got["sequence"], got["formatted"]["sequence"])
        self.assertEqual(got["unixMs"], got["formatted"]["unix_ms"])

    def test_rust_tokio_postgres(self):
        manifest = os.path.join(REPO, "examples/rust/Cargo.toml")
        target = os.path.join(REPO, "target/examples")
        conninfo = f"host={self.pg.dir} port={self.pg.port} user=postgres dbname=postgres"
        out = subprocess.run(["cargo", "run", "--quiet", "--manifest-path", manifest,
                              "--target-dir", target, "--", conninfo],
                             check=True, capture_output=True, text=True).stdout
        self.assertEqual(out.count("line "), 3, out)
        self.check_orders()

    def test_sql_only_forms(self):
        with self.pg.connect() as conn:
            conn.execute("""CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, customer text NOT NULL);
                            CREATE TABLE IF NOT EXISTS order_lines (
                                id bigint PRIMARY KEY, order_id bigint NOT NULL REFERENCES orders,
                                item text NOT NULL)""")
            # The CTE form from docs/functions.md.
            conn.execute("""
                WITH ids AS (SELECT snowflake_next_batch(3) AS a),
                     o AS (INSERT INTO orders (id, customer) SELECT a[1], 'CTE Ltd' FROM ids RETURNING id)
                INSERT INTO order_lines (id, order_id, item)
                SELECT ids.a[k + 1], o.id, item
                  FROM ids, o, unnest(ARRAY['bolts', 'nuts']) WITH ORDINALITY AS t(item, k)""")
            n = conn.execute("""SELECT count(*) FROM order_lines l JOIN orders o ON o.id = l.order_id
                                 WHERE o.customer = 'CTE Ltd'""").fetchone()[0]
            self.assertEqual(n, 2)
        self.check_orders()


class ConvertDumpRestore(unittest.TestCase):
    """Convert serial/identity tables, dump them, restore into another cluster, keep going."""

    def test_convert_then_dump_and_restore(self):
        src = Cluster("dump-src", {"shared_preload_libraries": PRELOAD, "snowflake.worker_id": "10"}).init()
        dst = Cluster("dump-dst", {"shared_preload_libraries": PRELOAD, "snowflake.worker_id": "11"}).init()
        try:
            src.start()
            dst.start()
            src.sql("CREATE DATABASE app")
            with src.connect("app") as conn:
                conn.execute("CREATE EXTENSION snowflake")
                conn.execute("CREATE TABLE customers (id serial PRIMARY KEY, name text)")
                conn.execute("""CREATE TABLE orders (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                                     customer_id int REFERENCES customers)""")
                conn.execute("INSERT INTO customers (name) SELECT 'c' || g FROM generate_series(1, 100) g")
                conn.execute("INSERT INTO orders (customer_id) SELECT 1 + g % 100 FROM generate_series(1, 1000) g")
                with conn.transaction():
                    conn.execute("SELECT snowflake_convert_column('customers', 'id')")
                    conn.execute("SELECT snowflake_convert_column('orders', 'id')")
                conn.execute("INSERT INTO customers (name) VALUES ('new')")
                new_customer = conn.execute("SELECT id FROM customers WHERE name = 'new'").fetchone()[0]
                conn.execute("INSERT INTO orders (customer_id) VALUES (%s)", (new_customer,))
                highest = conn.execute("SELECT max(id) FROM orders").fetchone()[0]

            dump = os.path.join(src.dir, "app.dump")
            subprocess.run(["runuser", "-u", "postgres", "--", f"{PG_BIN}/pg_dump", "-Fc",
                            "-h", src.dir, "-p", str(src.port), "-U", "postgres", "-f", dump, "app"],
                           check=True, capture_output=True)
            dst.sql("CREATE DATABASE app")
            subprocess.run(["runuser", "-u", "postgres", "--", f"{PG_BIN}/pg_restore", "--exit-on-error",
                            "-h", dst.dir, "-p", str(dst.port), "-U", "postgres", "-d", "app", dump],
                           check=True, capture_output=True)

            with dst.connect("app") as conn:
                counts = conn.execute("SELECT (SELECT count(*) FROM customers), (SELECT count(*) FROM orders)").fetchone()
                self.assertEqual(counts, (101, 1001))
                default = conn.execute("""SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef
                                           WHERE adrelid = 'orders'::regclass""").fetchone()[0]
                self.assertEqual(default, "snowflake_next()")
                conn.execute("INSERT INTO orders (customer_id) VALUES (1)")
                restored_next = conn.execute("SELECT max(id) FROM orders").fetchone()[0]
                self.assertGreater(restored_next, highest)
                self.assertEqual(conn.execute("SELECT (snowflake_decode(%s)).worker_id", (restored_next,)).fetchone()[0], 11)
        finally:
            src.destroy()
            dst.destroy()


if __name__ == "__main__":
    unittest.main(verbosity=2)
