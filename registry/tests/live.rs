//! The clients against real registries, without PostgreSQL: a `redis-server` and an `etcd`
//! started for each test on free ports, driven through [`snowflake_registry::open`] as the
//! registry worker drives them. Seconds, where the integration suites need clusters.
//!
//! The servers come from Debian's packages, which the test command installs
//! (`scripts/setup.sh`). Without them a test says so and passes, unless
//! `SNOWFLAKE_REQUIRE_REGISTRIES=1` (set by `scripts/test.sh`), where it fails: the test
//! command must never skip them silently.
//!
//! Every wait is on a condition, bounded by what the registry itself says it needs (a
//! settling registry's `wait_ms`, a claim's `ttl`) plus a margin for a slow machine; no
//! assertion is about time.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use snowflake_core::claim::RequestTokens;
use snowflake_core::layout::TWITTER_EPOCH_MS;
use snowflake_registry::{open, ClaimReply, ClaimRequest, Options, Registry, RenewReply};

/// The `claim_ttl` of every request here: the shortest the setting allows, so that settles
/// and expiries take seconds.
const TTL_MS: u64 = 2_000;

/// Added to every wait the registry announces, for a slow or loaded machine. Only a failing
/// test ever waits that long.
const MARGIN: Duration = Duration::from_secs(30);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A fresh random token (32 hex digits, as the registry worker draws them).
fn token() -> String {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("read /dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A port nobody listens on now (the kernel's pick; the server binds it right after).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| PathBuf::from(dir).join(program))
        .find(|path| path.is_file())
}

/// The server binary, or None when the test should be skipped (see the module's text).
fn binary(program: &str) -> Option<PathBuf> {
    let found = which(program);
    if found.is_none() {
        if std::env::var("SNOWFLAKE_REQUIRE_REGISTRIES").as_deref() == Ok("1") {
            panic!("{program} is not installed (scripts/setup.sh installs it)");
        }
        eprintln!("skipped: {program} is not installed (scripts/setup.sh installs it)");
    }
    found
}

/// Waits until `ready` is true, or panics after `bound` naming `what`.
fn wait_until(what: &str, bound: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not after {bound:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A registry server of this test, killed and its directory removed at drop.
struct Server {
    child: Child,
    dir: PathBuf,
    uri: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("snowflake-registry-{name}-{}", token()));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

fn redis() -> Option<Server> {
    let program = binary("redis-server")?;
    let port = free_port();
    let dir = scratch_dir("redis");
    let child = Command::new(program)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server");
    let server = Server {
        child,
        dir,
        uri: format!("redis://127.0.0.1:{port}/0"),
    };
    wait_until("redis-server answers PING", MARGIN, || {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut reply = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    });
    Some(server)
}

fn etcd() -> Option<Server> {
    let program = binary("etcd")?;
    let (client, peer) = (free_port(), free_port());
    let dir = scratch_dir("etcd");
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new(program)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--name", "live", "--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("live={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    let server = Server {
        child,
        dir,
        uri: format!("etcd://127.0.0.1:{client}"),
    };
    wait_until("etcd reports itself healthy", MARGIN, || {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", client)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut reply = String::new();
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_ok()
            && stream.read_to_string(&mut reply).is_ok()
            && reply.contains("\"health\":\"true\"")
    });
    Some(server)
}

/// One server of the fleet, as its registry worker would speak for it.
struct Node {
    client: Box<dyn Registry>,
    tokens: RequestTokens,
    epoch_unix_ms: i64,
}

impl Node {
    fn new(uri: &str) -> Node {
        let options = Options {
            timeout: Duration::from_millis(TTL_MS / 5).max(Duration::from_secs(1)),
            ca_file: None,
            password_file: None,
            // No password file here: nothing compares a file's owner with it.
            effective_uid: 0,
        };
        let postmaster = token();
        Node {
            client: open(uri, &options).expect("open the registry"),
            tokens: RequestTokens {
                held: vec![postmaster.clone()],
                write: postmaster,
            },
            epoch_unix_ms: TWITTER_EPOCH_MS,
        }
    }

    fn request(&self, order: &[u8]) -> ClaimRequest {
        let sent = now_ms();
        ClaimRequest {
            datacenter_id: 1,
            order: order.to_vec(),
            tokens: self.tokens.clone(),
            ttl_ms: TTL_MS,
            sent_unix_ms: sent,
            cap_unix_ms: sent + 2 * TTL_MS as i64,
            epoch_unix_ms: self.epoch_unix_ms,
            fleet_ttl_ms: 0,
        }
    }

    /// The next write's token becomes the one held, as the worker does after a reply.
    fn rotate(&mut self) {
        let next = token();
        self.tokens.held.insert(0, self.tokens.write.clone());
        self.tokens.held.truncate(3);
        self.tokens.write = next;
    }

    fn claim(&mut self, order: &[u8]) -> ClaimReply {
        let request = self.request(order);
        let (reply, _) = self.client.claim(&request).expect("claim");
        if matches!(reply, ClaimReply::Granted { .. }) {
            self.rotate();
        }
        reply
    }

    /// Claims until the registry has settled (a new registry refuses free ids for a
    /// `claim_ttl`), then returns the first other reply.
    fn claim_settled(&mut self, order: &[u8]) -> ClaimReply {
        let mut reply = self.claim(order);
        let started = Instant::now();
        while let ClaimReply::Settling { wait_ms } = reply {
            assert!(
                started.elapsed() < Duration::from_millis(wait_ms) + MARGIN,
                "the registry still settles after {:?}",
                started.elapsed()
            );
            std::thread::sleep(Duration::from_millis(wait_ms.clamp(10, 200)));
            reply = self.claim(order);
        }
        reply
    }

    fn renew(&mut self, worker_id: u8) -> RenewReply {
        let request = self.request(&[worker_id]);
        let (reply, _) = self.client.renew(&request, worker_id, None).expect("renew");
        if matches!(reply, RenewReply::Renewed { .. }) {
            self.rotate();
        }
        reply
    }

    fn release(&mut self, worker_id: u8, released_unix_ms: i64) {
        let tokens = self.tokens.clone();
        self.client
            .release(1, worker_id, &tokens, Some(released_unix_ms))
            .expect("release");
    }
}

fn granted(reply: ClaimReply) -> (u8, Option<i64>) {
    match reply {
        ClaimReply::Granted {
            worker_id,
            floor_unix_ms,
            ..
        } => (worker_id, floor_unix_ms),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Two servers, one registry: distinct ids, renewals, a refusal, a release handed on with
/// its floor, and an expired claim handed on above its mark.
fn two_servers_share_nothing(uri: &str) {
    let mut a = Node::new(uri);
    let mut b = Node::new(uri);

    let (a_id, _) = granted(a.claim_settled(&[3, 4]));
    let (b_id, _) = granted(b.claim_settled(&[3, 4]));
    assert_ne!(a_id, b_id, "two servers were given one id");
    assert!(matches!(a.renew(a_id), RenewReply::Renewed { .. }));

    // Every id of the order is held: refused, and the holder keeps its id.
    assert!(
        matches!(b.claim(&[a_id]), ClaimReply::Exhausted { .. }),
        "a held id was not refused"
    );
    assert!(
        matches!(b.renew(a_id), RenewReply::Lost { holder: Some(_) }),
        "another server renewed a held id"
    );
    assert!(matches!(a.renew(a_id), RenewReply::Renewed { .. }));

    // A clean release hands the id on, floored at what the holder could have issued.
    let released = now_ms() + 5_000;
    a.release(a_id, released);
    let mut c = Node::new(uri);
    let (c_id, floor) = granted(c.claim(&[a_id]));
    assert_eq!(c_id, a_id);
    assert!(
        floor.is_some_and(|f| f >= released),
        "floor {floor:?} below the release at {released}"
    );
    assert!(
        matches!(a.renew(a_id), RenewReply::Lost { .. }),
        "a released holder renewed"
    );

    // A claim left to expire is handed on above every cap granted under it.
    let last_cap = c.request(&[c_id]).cap_unix_ms;
    assert!(matches!(c.renew(c_id), RenewReply::Renewed { .. }));
    let mut d = Node::new(uri);
    let mut reply = d.claim(&[c_id]);
    wait_until(
        "an unrenewed claim expires",
        Duration::from_millis(TTL_MS) + MARGIN,
        || {
            reply = d.claim(&[c_id]);
            !matches!(reply, ClaimReply::Exhausted { .. })
        },
    );
    let (d_id, floor) = granted(reply);
    assert_eq!(d_id, c_id);
    assert!(
        floor.is_some_and(|f| f >= last_cap),
        "floor {floor:?} below the last cap {last_cap}"
    );
}

/// A server of another epoch is refused; one whose clock is far ahead is not acted on.
fn foreign_requests_are_refused(uri: &str) {
    let mut a = Node::new(uri);
    granted(a.claim_settled(&[1]));

    let mut other_epoch = Node::new(uri);
    other_epoch.epoch_unix_ms = TWITTER_EPOCH_MS + 1;
    assert!(
        matches!(
            other_epoch.claim(&[2]),
            ClaimReply::EpochMismatch {
                registry_epoch_unix_ms: TWITTER_EPOCH_MS
            }
        ),
        "a server of another epoch was not refused"
    );

    let ahead = Node::new(uri);
    let mut request = ahead.request(&[2]);
    request.sent_unix_ms += 3_600_000;
    request.cap_unix_ms += 3_600_000;
    let (reply, _) = Node::new(uri).client.claim(&request).expect("claim");
    assert!(
        matches!(reply, ClaimReply::Rejected(_)),
        "a request from a clock an hour ahead was acted on: {reply:?}"
    );
}

#[test]
fn redis_two_servers_share_nothing() {
    if let Some(server) = redis() {
        two_servers_share_nothing(&server.uri);
    }
}

#[test]
fn redis_foreign_requests_are_refused() {
    if let Some(server) = redis() {
        foreign_requests_are_refused(&server.uri);
    }
}

#[test]
fn etcd_two_servers_share_nothing() {
    if let Some(server) = etcd() {
        two_servers_share_nothing(&server.uri);
    }
}

#[test]
fn etcd_foreign_requests_are_refused() {
    if let Some(server) = etcd() {
        foreign_requests_are_refused(&server.uri);
    }
}
