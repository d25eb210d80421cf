"""Transport trust (issue 35, attack 5): no registry password leaves the server in clear text
unless the URI asks for that, and no impostor that libpq, redis-cli or etcdctl would refuse
gets one.

- A coordinator URI with a password and no sslmode, to a server that refuses TLS: the
  password must not be sent (it was, in clear text).
- sslmode=require with sslrootcert: libpq then verifies the CA (as verify-ca); a self-signed
  impostor must not get the password (it did).
- etcds:// with snowflake.registry_ca_file holding two CAs, the etcd server's second: the
  file is the whole trust set, all its certificates (only the first was read).
- Sentinels that name an impostor as the master, on plain TCP, not authenticated (they take
  no password): the Redis password must not be sent to the address they name (it was).
- A CA file is the whole trust set: with SSL_CERT_FILE (OpenSSL's system store) naming the
  CA of an impostor's certificate and snowflake.registry_ca_file another CA, the coordinator
  (verify-full), rediss:// and etcds:// refuse the impostor (a control shows that without a
  CA file the same impostors are trusted, so SSL_CERT_FILE reaches the clients).
- A password in snowflake.registry gives a WARNING at start (pg_monitor reads it).

The impostors are Python socket servers in this process that record what they receive; the
etcd server is real. Every wait is on a condition: an impostor's record, or the log."""

import os
import socket
import ssl
import struct
import subprocess
import threading
import unittest

from harness import BASE, Cluster, wait_until
from fixtures.registries import EtcdCluster, free_port, make_test_ca, _fresh
from fixtures.waits import wait_claimed

PASSWORD = "Tr4nsp0rt-S3cret"



def recv_exact(conn, n):
    out = b""
    while len(out) < n:
        got = conn.recv(n - len(out))
        if not got:
            raise EOFError
        out += got
    return out


class Impostor(threading.Thread):
    """A TCP server on loopback that records, per connection, whether `PASSWORD` arrived
    ("password") or the connection ended without it ("no password"). `serve(conn)` speaks
    the protocol and returns the bytes that may carry the password."""

    def __init__(self):
        super().__init__(daemon=True)
        self.port = free_port()
        self.events = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.stopped = threading.Event()
        self.start()

    def run(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        got = b""
        conn.settimeout(10)
        try:
            got = self.serve(conn)
        except (OSError, EOFError, ssl.SSLError):
            pass
        if PASSWORD.encode() in got:
            self.record("password")
            conn.close()
            return
        try:
            while True:  # whatever else the client sends before it closes
                more = conn.recv(65536)
                if not more:
                    break
                got += more
        except (OSError, ssl.SSLError):
            pass
        conn.close()
        self.record("password" if PASSWORD.encode() in got else "no password")

    def record(self, event):
        with self.lock:
            self.events.append(event)

    def seen(self):
        with self.lock:
            return list(self.events)

    def close(self):
        self.stopped.set()
        self.sock.close()


class FakeCoordinator(Impostor):
    """A PostgreSQL server that refuses TLS ('N'), or accepts it with `tls_context` (a
    certificate no CA of the client signed), then asks for a clear-text password."""

    def __init__(self, tls_context=None):
        self.tls_context = tls_context
        super().__init__()

    def serve(self, conn):
        length, code = struct.unpack("!II", recv_exact(conn, 8))
        if length == 8 and code == 80877103 and self.tls_context is not None:  # SSLRequest
            conn.sendall(b"S")
            with self.tls_context.wrap_socket(conn, server_side=True) as tls:
                return self.startup(tls, struct.unpack("!I", recv_exact(tls, 4))[0])
        return self.startup(conn, length, code)

    def startup(self, conn, length, code=None):
        if code is None:
            recv_exact(conn, length - 4)  # the startup message
        elif length == 8 and code == 80877103:  # SSLRequest: refused
            conn.sendall(b"N")
            length = struct.unpack("!I", recv_exact(conn, 4))[0]
            recv_exact(conn, length - 4)  # the startup message
        else:
            recv_exact(conn, length - 8)
        conn.sendall(b"R" + struct.pack("!II", 8, 3))  # AuthenticationCleartextPassword
        kind = recv_exact(conn, 1)
        length = struct.unpack("!I", recv_exact(conn, 4))[0]
        got = kind + recv_exact(conn, length - 4)
        # Refuse it, so that the client closes at once (and any version of it: one that
        # blocked signals during a request would otherwise hold up the server's shutdown).
        fields = b"SFATAL\0C28P01\0Mimpostor\0\0"
        conn.sendall(b"E" + struct.pack("!I", 4 + len(fields)) + fields)
        return got


def resp_command(f):
    """One RESP command (an array of bulk strings) from the file `f`, or None at the end."""
    line = f.readline()
    if not line:
        return None
    n = int(line[1:])
    args = []
    for _ in range(n):
        size = int(f.readline()[1:])
        args.append(f.read(size + 2)[:-2])
    return args


class FakeRedis(Impostor):
    """The "master" the sentinels name, or a Redis server behind TLS with `tls_context`:
    records every command (AUTH carries the password)."""

    def __init__(self, tls_context=None):
        self.tls_context = tls_context
        super().__init__()

    def serve(self, conn):
        if self.tls_context is not None:
            with self.tls_context.wrap_socket(conn, server_side=True) as tls:
                return self.commands(tls)
        return self.commands(conn)

    def commands(self, conn):
        f = conn.makefile("rb")
        got = b""
        while (args := resp_command(f)) is not None:
            got += b" ".join(args)
            conn.sendall(b"-ERR impostor\r\n")
        return got


class FakeSentinel(Impostor):
    """A sentinel without a password (AUTH refused as Redis refuses it then) that names
    `master_port` on loopback as the master."""

    def __init__(self, master_port):
        self.master_port = master_port
        super().__init__()

    def serve(self, conn):
        f = conn.makefile("rb")
        got = b""
        while (args := resp_command(f)) is not None:
            got += b" ".join(args)
            verb = args[0].upper()
            if verb == b"AUTH":
                conn.sendall(b"-ERR AUTH <password> called without any password configured "
                             b"for the default user. Are you sure your configuration is "
                             b"correct?\r\n")
            elif verb == b"SENTINEL":
                fields = [b"name", b"snowflake", b"ip", b"127.0.0.1",
                          b"port", str(self.master_port).encode(), b"config-epoch", b"7"]
                conn.sendall(b"*%d\r\n" % len(fields)
                             + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in fields))
            else:
                conn.sendall(b"+OK\r\n")
        return got


def self_signed_context(directory):
    """A TLS server context with a self-signed certificate for 127.0.0.1 (an impostor's)."""
    cert, key = os.path.join(directory, "impostor.pem"), os.path.join(directory, "impostor.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


class TransportTrustTest(unittest.TestCase):
    """One node, restarted on each registry URI."""

    @classmethod
    def setUpClass(cls):
        cls.dir = os.path.join(BASE, "transport")
        _fresh(cls.dir)
        cls.ca = make_test_ca(os.path.join(cls.dir, "ca"))
        cls.node = Cluster("transport_node", {
            "shared_preload_libraries": "'snowflake'",
            "snowflake.worker_id": "auto",
            "snowflake.datacenter_id": "1",
            "snowflake.claim_ttl": "'2s'",
            "snowflake.registry": "'redis://127.0.0.1:1/0'",
        })
        cls.node.init()
        cls.node.start()
        cls.node.sql("CREATE EXTENSION snowflake")
        cls.node.stop()

    @classmethod
    def tearDownClass(cls):
        cls.node.destroy()

    def start_node_on(self, uri, env=None, **settings):
        self.node.stop()
        self.node.env = env or {}
        self.node.configure(**{"snowflake.registry": f"'{uri}'", **settings})
        self.log_from = len(self.node.log())
        self.node.start()
        self.addCleanup(self.node.stop)

    def new_log(self):
        """The server log since this test started the node."""
        return self.node.log()[self.log_from:]

    def impostor(self, fake):
        self.addCleanup(fake.close)
        return fake

    def assert_never_got_password(self, fake, what):
        wait_until(lambda: fake.seen(), what=f"a connection to {what} ended")
        self.assertNotIn("password", fake.seen(), f"{what} received the password")

    # -- the coordinator ---------------------------------------------------------------
    def test_no_sslmode_with_password_refuses_clear_text(self):
        fake = self.impostor(FakeCoordinator())
        self.start_node_on(f"postgresql://fleet:{PASSWORD}@127.0.0.1:{fake.port}/db")
        self.assert_never_got_password(fake, "a coordinator that refuses TLS")
        wait_until(lambda: "sslmode" in self.new_log(),
                   what="the log to say why (and name sslmode)")

    def test_explicit_sslmode_disable_still_sends(self):
        # The URI asks for clear text: the password goes (the control for the test above).
        fake = self.impostor(FakeCoordinator())
        self.start_node_on(
            f"postgresql://fleet:{PASSWORD}@127.0.0.1:{fake.port}/db?sslmode=disable")
        wait_until(lambda: "password" in fake.seen(),
                   what="the password over an explicit sslmode=disable")

    def test_require_with_root_cert_verifies_the_ca(self):
        fake = self.impostor(FakeCoordinator(self_signed_context(self.dir)))
        self.start_node_on(f"postgresql://fleet:{PASSWORD}@127.0.0.1:{fake.port}/db"
                           f"?sslmode=require&sslrootcert={self.ca.ca}")
        self.assert_never_got_password(fake, "a self-signed impostor (sslrootcert)")

    def test_require_with_registry_ca_file_verifies_the_ca(self):
        fake = self.impostor(FakeCoordinator(self_signed_context(self.dir)))
        self.start_node_on(f"postgresql://fleet:{PASSWORD}@127.0.0.1:{fake.port}/db"
                           "?sslmode=require",
                           **{"snowflake.registry_ca_file": f"'{self.ca.ca}'"})
        self.assert_never_got_password(fake, "a self-signed impostor (registry_ca_file)")

    # -- Sentinel ----------------------------------------------------------------------
    def test_unauthenticated_sentinels_do_not_get_the_password_sent_elsewhere(self):
        master = self.impostor(FakeRedis())
        sentinels = [self.impostor(FakeSentinel(master.port)) for _ in range(3)]
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in sentinels)
        self.start_node_on(f"redis+sentinel://:{PASSWORD}@{hosts}/snowflake")
        # Either the named master was reached (a connection to it ended), or the node
        # logged why it was not; then it must not have the password.
        refusal = "not sending the Redis password"
        wait_until(lambda: master.seen() or refusal in self.new_log(),
                   what="the node to reach the master the sentinels name, or to refuse")
        self.assertNotIn("password", master.seen(), "the master the sentinels named got it")
        self.assertIn(refusal, self.new_log())

    # -- etcd ----------------------------------------------------------------------------
    def test_etcd_ca_file_all_certificates(self):
        etcd = EtcdCluster(n=1, tls=self.ca)
        self.addCleanup(etcd.close)
        etcd.start()
        bundle = os.path.join(self.dir, "two-cas.pem")
        with open(bundle, "w") as out:
            for path in (self.ca.wrong_ca, self.ca.ca):
                with open(path) as f:
                    out.write(f.read())
        os.chmod(bundle, 0o644)
        self.start_node_on(etcd.uri(), **{"snowflake.registry_ca_file": f"'{bundle}'"})
        wait_claimed(self.node)

    # -- a CA file is the whole trust set ----------------------------------------------
    # The server's OpenSSL takes SSL_CERT_FILE as the system's CA store: here the CA that
    # signed the impostors' certificates (valid for 127.0.0.1), while the fleet's CA file
    # holds another CA. A client that trusts the system's store besides the file accepts them.
    def system_trusts_impostors(self):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca.server_cert, self.ca.server_key)
        return context, {"SSL_CERT_FILE": self.ca.ca}, {
            "snowflake.registry_ca_file": f"'{self.ca.wrong_ca}'"}

    def tearDown(self):
        self.node.configure(**{"snowflake.registry_ca_file": None})
        self.node.env = {}

    def test_coordinator_ca_file_excludes_the_system_store(self):
        context, env, settings = self.system_trusts_impostors()
        fake = self.impostor(FakeCoordinator(context))
        self.start_node_on(f"postgresql://fleet:{PASSWORD}@127.0.0.1:{fake.port}/db"
                           "?sslmode=verify-full", env=env, **settings)
        self.assert_never_got_password(fake, "a coordinator the system's CAs vouch for")

    def test_rediss_ca_file_excludes_the_system_store(self):
        context, env, settings = self.system_trusts_impostors()
        fake = self.impostor(FakeRedis(context))
        self.start_node_on(f"rediss://:{PASSWORD}@127.0.0.1:{fake.port}/0", env=env, **settings)
        self.assert_never_got_password(fake, "a Redis server the system's CAs vouch for")

    def test_control_the_system_store_is_the_impostors(self):
        # Without a CA file the system's store is trusted (documented): the impostors then
        # get the password, which shows that SSL_CERT_FILE reaches the server's clients and
        # so that the three tests around this one test what they say.
        context, env, _ = self.system_trusts_impostors()
        pg = self.impostor(FakeCoordinator(context))
        redis = self.impostor(FakeRedis(context))
        self.start_node_on(f"postgresql://fleet:{PASSWORD}@127.0.0.1:{pg.port}/db"
                           "?sslmode=verify-full", env=env)
        wait_until(lambda: "password" in pg.seen(),
                   what="the password over verify-full, the system's store trusted")
        self.start_node_on(f"rediss://:{PASSWORD}@127.0.0.1:{redis.port}/0", env=env)
        wait_until(lambda: "password" in redis.seen(),
                   what="the password over rediss://, the system's store trusted")

    def test_every_certificate_of_the_ca_file_is_trusted(self):
        # Guards (these two clients already read the whole file): the server's CA is the
        # file's second certificate; the legitimate server then gets the password.
        bundle = os.path.join(self.dir, "two-cas.pem")
        with open(bundle, "w") as out:
            for path in (self.ca.wrong_ca, self.ca.ca):
                with open(path) as f:
                    out.write(f.read())
        os.chmod(bundle, 0o644)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca.server_cert, self.ca.server_key)
        settings = {"snowflake.registry_ca_file": f"'{bundle}'"}
        pg = self.impostor(FakeCoordinator(context))
        redis = self.impostor(FakeRedis(context))
        self.start_node_on(f"postgresql://fleet:{PASSWORD}@127.0.0.1:{pg.port}/db"
                           "?sslmode=verify-full", **settings)
        wait_until(lambda: "password" in pg.seen(),
                   what="the password over verify-full, the CA second in the file")
        self.start_node_on(f"rediss://:{PASSWORD}@127.0.0.1:{redis.port}/0", **settings)
        wait_until(lambda: "password" in redis.seen(),
                   what="the password over rediss://, the CA second in the file")

    def test_etcds_ca_file_excludes_the_system_store(self):
        # A guard more than a reproduction: the unfixed build also claimed nothing here,
        # because its request for etcd's clock (its own TLS, the file's store only) failed
        # before the gRPC channel, which trusted the system's store too, was used.
        _, env, settings = self.system_trusts_impostors()
        etcd = EtcdCluster(n=1, tls=self.ca)
        self.addCleanup(etcd.close)
        etcd.start()
        self.start_node_on(etcd.uri(), env=env, **settings)
        def state():
            return self.node.one("SELECT claim_status FROM snowflake_stats()")
        # The worker logs each new cause of a failed request (the first: the certificate).
        wait_until(lambda: state() == "held" or "a request to registry" in self.new_log(),
                   what="a claim, or a failed request")
        self.assertNotEqual(state(), "held", "etcd trusted the system's CAs")

    # -- the setting -------------------------------------------------------------------
    def test_password_in_the_setting_warns_at_start(self):
        fake = self.impostor(FakeCoordinator())
        self.start_node_on(
            f"postgresql://fleet:{PASSWORD}@127.0.0.1:{fake.port}/db?sslmode=disable")
        wait_until(lambda: "registry_password_file" in self.new_log(),
                   what="a WARNING naming snowflake.registry_password_file")
        self.assertNotIn(PASSWORD, self.node.log())


if __name__ == "__main__":
    unittest.main()
