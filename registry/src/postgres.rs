//! The PostgreSQL coordinator client (through `tokio-postgres`, driven by a runtime of its
//! own on the request thread): one transaction per step, committed synchronously. The records
//! and their rules are described in the parent module.
//!
//! Every request is bounded in time (the connection by the registry timeout, then the
//! transaction by another: `tokio::time::timeout_at` ends it whatever the server sends) and
//! in bytes: the connection reads through [`Bounded`], which refuses more than
//! [`MAX_REPLY_BYTES`] per request (a coordinator streaming a 2 GiB message made the client
//! grow its buffer until the allocation failed and the server crash-restarted: issue 35).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use postgres_protocol::escape::escape_identifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::{Host, SslMode, TargetSessionAttrs};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::{
    parse_registry_id, wall_ms, ClaimReply, ClaimRequest, Observed, Options, Registry,
    RegistryError, RenewReply, Result,
};
use snowflake_core::claim::{self, ClockSample, RequestAge, RequestTokens};
use snowflake_core::registry_rules::{self, ClaimDecision, LiveClaim};
use snowflake_core::registry_uri::{pgpass_lookup, split_libpq_extras, LibpqExtras};

/// The coordinator's tables, created on first use in the URI's schema (`snowflake_schema`,
/// default `public`; also in docs/registries.md), `{s}` standing for the quoted schema. The
/// unlogged table holds a token that crash recovery, a base backup and a standby all start
/// without: a new token is a new incarnation.
///
/// Every statement of this client names its tables with their schema and its functions and
/// operators in `pg_catalog`, and the connection's search_path is `pg_catalog` only: no object
/// another role of the coordinator creates is ever used instead (issue 35: look-alike tables
/// earlier on the default search_path split the fleet, without a reconnection). SQL syntax
/// that the grammar turns into a `pg_catalog` call (`extract(... FROM ...)`, `greatest`,
/// `CASE`) needs no qualification.
const COORDINATOR_DDL: &str = "\
CREATE TABLE IF NOT EXISTS {s}.snowflake_registry (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    incarnation   pg_catalog.text NOT NULL,
    born_unix_ms  bigint  NOT NULL,
    epoch_unix_ms bigint  NOT NULL
);
CREATE UNLOGGED TABLE IF NOT EXISTS {s}.snowflake_registry_instance (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    token     pg_catalog.text NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.snowflake_claims (
    datacenter_id      integer NOT NULL,
    worker_id          integer NOT NULL,
    holder             pg_catalog.text,
    expires_unix_ms    bigint,
    high_water_unix_ms bigint,
    floor_unix_ms      bigint,
    released_unix_ms   bigint,
    ttl_ms             bigint,
    PRIMARY KEY (datacenter_id, worker_id)
);
ALTER TABLE {s}.snowflake_claims ADD COLUMN IF NOT EXISTS floor_unix_ms bigint;
ALTER TABLE {s}.snowflake_claims ADD COLUMN IF NOT EXISTS released_unix_ms bigint;
ALTER TABLE {s}.snowflake_claims ADD COLUMN IF NOT EXISTS ttl_ms bigint;";

/// How many of the columns this version added to `snowflake_claims` (COORDINATOR_OBJECTS
/// lists them) a complete table has.
const ADDED_COLUMNS: usize = 3;

/// The three tables' names.
const TABLES: [&str; 3] = [
    "snowflake_registry",
    "snowflake_registry_instance",
    "snowflake_claims",
];

/// The owners of the schema ($1), of the tables of that name in it ($2), and of the
/// database (for a schema owned by `pg_database_owner`), with whether each is a superuser;
/// the columns the tables have of those this version added; and the connecting role.
const COORDINATOR_OBJECTS: &str = "\
SELECT 'schema'::pg_catalog.text, n.nspname::pg_catalog.text, o.rolname::pg_catalog.text, o.rolsuper
  FROM pg_catalog.pg_namespace n
  JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) n.nspowner
 WHERE n.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.name
UNION ALL
SELECT 'table', c.relname::pg_catalog.text, o.rolname::pg_catalog.text, o.rolsuper
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
  JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) c.relowner
 WHERE n.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.name
   AND c.relname OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.name[])
UNION ALL
SELECT 'database', d.datname::pg_catalog.text, o.rolname::pg_catalog.text, o.rolsuper
  FROM pg_catalog.pg_database d
  JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) d.datdba
 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
UNION ALL
SELECT 'column', a.attname::pg_catalog.text, NULL, NULL
  FROM pg_catalog.pg_attribute a
  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE n.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.name
   AND c.relname OPERATOR(pg_catalog.=) 'snowflake_claims'::pg_catalog.name
   AND a.attname OPERATOR(pg_catalog.=) ANY ('{floor_unix_ms,released_unix_ms,ttl_ms}'::pg_catalog.name[])
   AND NOT a.attisdropped
UNION ALL
SELECT 'elsewhere', n.nspname::pg_catalog.text, NULL, NULL
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE c.relname OPERATOR(pg_catalog.=) 'snowflake_claims'::pg_catalog.name
   AND n.nspname OPERATOR(pg_catalog.<>) $1::pg_catalog.name
   AND c.relpersistence OPERATOR(pg_catalog.<>) 't'::pg_catalog.\"char\"
UNION ALL
SELECT 'me', session_user::pg_catalog.text, NULL, NULL";

/// Makes this incarnation's token: once (the unlogged table is empty after a crash restart,
/// in a base backup, and on a standby), and again whenever the stored token was not made for
/// these tables. The token names the three tables it was made for (their oids, and their
/// files: a TRUNCATE makes a new one), because a restore from `pg_dump` into the running
/// coordinator writes the dumped token back (pg_dump copies unlogged tables' rows) beside
/// older claims, with the same start time: without that, the registry did not settle, and a
/// newcomer was given a live holder's id from the restored rows (helper-16's review: 8,150
/// to 15,650 duplicates). `$1`: the schema, `$2`: the tables' names.
const PG_INSTANCE_TOKEN: &str = "\
INSERT INTO {s}.snowflake_registry_instance AS i (token)
SELECT pg_catalog.md5(pg_catalog.random()::pg_catalog.text OPERATOR(pg_catalog.||) pg_catalog.clock_timestamp()::pg_catalog.text OPERATOR(pg_catalog.||) pg_catalog.pg_backend_pid()::pg_catalog.text)
       OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||)
       pg_catalog.string_agg(c.oid::pg_catalog.text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) pg_catalog.pg_relation_filenode(c.oid)::pg_catalog.text, ',' ORDER BY c.relname)
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE n.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.name
   AND c.relname OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.name[])
ON CONFLICT (singleton) DO UPDATE SET token = excluded.token
 WHERE pg_catalog.split_part(i.token, ' ', 2) OPERATOR(pg_catalog.<>) pg_catalog.split_part(excluded.token, ' ', 2)";

/// The coordinator's clock (ms) and incarnation: its postmaster's start time (which changes
/// whenever it starts, from a restored copy too) and its instance token (which changes at a
/// crash restart, which keeps the start time, at a promotion, and at a restore of the
/// tables from `pg_dump`: [`PG_INSTANCE_TOKEN`]).
const PG_NOW: &str = "\
SELECT (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::bigint,
       pg_catalog.pg_postmaster_start_time()::pg_catalog.text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) (SELECT token FROM {s}.snowflake_registry_instance)";

const PG_REGISTRY_INSERT: &str = "\
INSERT INTO {s}.snowflake_registry (incarnation, born_unix_ms, epoch_unix_ms) \
VALUES ($1::pg_catalog.text, $2::bigint, $3::bigint) ON CONFLICT (singleton) DO NOTHING";

/// With the registry's id: an md5 of the coordinator's system identifier, its database and
/// the registry table's oid, which a restore, a base backup and a promotion keep and another
/// cluster, database or schema does not (NULL for a role that may not read the system
/// identifier: the id is then unknown).
const PG_REGISTRY_LOCK: &str = "\
SELECT incarnation, born_unix_ms, epoch_unix_ms, \
       (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::bigint, \
       CASE WHEN pg_catalog.has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE') \
            THEN pg_catalog.md5((SELECT system_identifier FROM pg_catalog.pg_control_system())::pg_catalog.text \
                 OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) pg_catalog.current_database()::pg_catalog.text \
                 OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) tableoid::pg_catalog.text) END \
  FROM {s}.snowflake_registry FOR UPDATE";

const PG_REGISTRY_REBORN: &str = "\
UPDATE {s}.snowflake_registry SET incarnation = $1::pg_catalog.text, born_unix_ms = $2::bigint";

const PG_HOLD: &str = "\
INSERT INTO {s}.snowflake_claims AS c \
  (datacenter_id, worker_id, holder, expires_unix_ms, high_water_unix_ms, floor_unix_ms, ttl_ms) \
VALUES ($1::integer, $2::integer, $3::pg_catalog.text, $4::bigint, $5::bigint, $7::bigint, $8::bigint) \
ON CONFLICT (datacenter_id, worker_id) DO UPDATE \
  SET holder = excluded.holder, expires_unix_ms = excluded.expires_unix_ms, ttl_ms = excluded.ttl_ms, \
      high_water_unix_ms = greatest(c.high_water_unix_ms, excluded.high_water_unix_ms), \
      floor_unix_ms = CASE WHEN $6::boolean THEN excluded.floor_unix_ms ELSE c.floor_unix_ms END, \
      released_unix_ms = NULL";

const PG_FREE_FLOOR: &str = "\
SELECT high_water_unix_ms, released_unix_ms FROM {s}.snowflake_claims \
 WHERE datacenter_id OPERATOR(pg_catalog.=) $1::integer AND worker_id OPERATOR(pg_catalog.=) $2::integer";

const PG_LIVE: &str = "\
SELECT worker_id, holder, floor_unix_ms, ttl_ms, high_water_unix_ms FROM {s}.snowflake_claims \
 WHERE datacenter_id OPERATOR(pg_catalog.=) $1::integer AND holder IS NOT NULL \
   AND expires_unix_ms OPERATOR(pg_catalog.>) $2::bigint";

const PG_HOLDER: &str = "\
SELECT holder, high_water_unix_ms FROM {s}.snowflake_claims \
 WHERE datacenter_id OPERATOR(pg_catalog.=) $1::integer AND worker_id OPERATOR(pg_catalog.=) $2::integer \
   AND holder IS NOT NULL AND expires_unix_ms OPERATOR(pg_catalog.>) $3::bigint";

const PG_RELEASE: &str = "\
UPDATE {s}.snowflake_claims SET holder = NULL, expires_unix_ms = NULL, ttl_ms = NULL, \
  released_unix_ms = CASE WHEN $4::bigint IS NULL THEN NULL \
                          ELSE greatest($4::bigint, floor_unix_ms) END, \
  high_water_unix_ms = greatest(high_water_unix_ms, $4::bigint, floor_unix_ms) \
WHERE datacenter_id OPERATOR(pg_catalog.=) $1::integer AND worker_id OPERATOR(pg_catalog.=) $2::integer \
  AND holder OPERATOR(pg_catalog.=) ANY ($3::pg_catalog.text[])";

/// The statements of this client, with the schema filled in.
struct Statements {
    /// The schema's name, for the statements that take it as a parameter.
    schema: String,
    ddl: String,
    instance_token: String,
    now: String,
    registry_insert: String,
    registry_lock: String,
    registry_reborn: String,
    hold: String,
    free_floor: String,
    live: String,
    holder: String,
    release: String,
}

impl Statements {
    fn new(schema: &str) -> Self {
        let s = escape_identifier(schema);
        let f = |sql: &str| sql.replace("{s}", &s);
        Statements {
            schema: schema.to_string(),
            ddl: f(COORDINATOR_DDL),
            instance_token: f(PG_INSTANCE_TOKEN),
            now: f(PG_NOW),
            registry_insert: f(PG_REGISTRY_INSERT),
            registry_lock: f(PG_REGISTRY_LOCK),
            registry_reborn: f(PG_REGISTRY_REBORN),
            hold: f(PG_HOLD),
            free_floor: f(PG_FREE_FLOOR),
            live: f(PG_LIVE),
            holder: f(PG_HOLDER),
            release: f(PG_RELEASE),
        }
    }
}

/// The most a request may read from the coordinator, connection included: the largest
/// answer is the claims of one datacenter (at most 1,024 rows of about 120 bytes).
pub(crate) const MAX_REPLY_BYTES: usize = 1 << 20;

/// What a connection may still read in the current request.
#[derive(Debug)]
struct Budget {
    left: AtomicUsize,
    exceeded: AtomicBool,
}

impl Budget {
    fn reset(&self) {
        self.left.store(MAX_REPLY_BYTES, Ordering::Relaxed);
        self.exceeded.store(false, Ordering::Relaxed);
    }
}

/// A socket of either kind.
trait Io: AsyncRead + AsyncWrite + Unpin + Send + Sync + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + std::fmt::Debug> Io for T {}

/// A socket that reads at most what the budget allows, then fails every read: the client
/// library never holds more than [`MAX_REPLY_BYTES`] of a reply, whatever length the server
/// announces or sends.
#[derive(Debug)]
struct Bounded {
    inner: Box<dyn Io>,
    budget: Arc<Budget>,
}

impl AsyncRead for Bounded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let left = this.budget.left.load(Ordering::Relaxed);
        if left == 0 {
            this.budget.exceeded.store(true, Ordering::Relaxed);
            return Poll::Ready(Err(std::io::Error::other(format!(
                "the coordinator sent more than {MAX_REPLY_BYTES} bytes for one request"
            ))));
        }
        // The read goes into the initialized front of the unfilled part, at most `left`
        // bytes, so that no `unsafe` is needed to mark what it filled (zeroing a few
        // kilobytes costs nothing next to a network round trip).
        let room = left.min(buf.remaining());
        let mut limited = ReadBuf::new(buf.initialize_unfilled_to(room));
        match Pin::new(&mut this.inner).poll_read(cx, &mut limited) {
            Poll::Ready(Ok(())) => {
                let n = limited.filled().len();
                buf.advance(n);
                this.budget.left.fetch_sub(n, Ordering::Relaxed);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// One transaction, each statement run to the transaction's deadline.
struct Tx<'a> {
    rt: &'a tokio::runtime::Runtime,
    tx: tokio_postgres::Transaction<'a>,
    deadline: Instant,
}

impl Tx<'_> {
    fn run<T>(
        &self,
        f: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        run_until(self.rt, self.deadline, f)
    }

    fn execute(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        self.run(self.tx.execute(sql, params))
    }

    fn query(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        self.run(self.tx.query(sql, params))
    }

    fn query_one(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row> {
        self.run(self.tx.query_one(sql, params))
    }

    fn query_opt(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>> {
        self.run(self.tx.query_opt(sql, params))
    }

    fn batch_execute(&mut self, sql: &str) -> Result<()> {
        self.run(self.tx.batch_execute(sql))
    }
}

/// Runs `f` on `rt` until `deadline` (the connection's task is driven meanwhile).
fn run_until<T, E: Into<RegistryError>>(
    rt: &tokio::runtime::Runtime,
    deadline: Instant,
    f: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    rt.block_on(async { tokio::time::timeout_at(deadline.into(), f).await })
        .map_err(|_| RegistryError("the coordinator did not answer in time".into()))?
        .map_err(Into::into)
}

/// How long a connection to the coordinator serves, in request bounds (a fifth of
/// `claim_ttl` each): 3 x `claim_ttl`, then the next request tries to replace it. A smart
/// shutdown of the coordinator (`pg_ctl stop -m smart`) waits for every session and refuses
/// new ones (57P03), so a connection kept for ever kept it waiting for ever: on a node that
/// is its own fleet's registry (a Citus coordinator, docs/citus.md), its own registry
/// worker's connection did. The new connection is made first, and the old one kept if it
/// cannot be had for any other reason (every slot taken by another role, a changed
/// password, a frozen host listed first): a node that is connected goes on as before.
/// The cost is one connection (and one check of the tables) per node per lifetime.
const CONNECTION_LIFETIME_IN_TIMEOUTS: u32 = 15;

/// No host of the URI took a connection: why, and the indexes of the hosts that refused it
/// because they are shutting down (57P03).
struct NotConnected {
    error: RegistryError,
    shutting_down: Vec<usize>,
}

/// One host took no connection: why, and whether it refused because it is shutting down.
struct HostRefused {
    error: RegistryError,
    shutting_down: bool,
}

impl From<RegistryError> for HostRefused {
    fn from(error: RegistryError) -> Self {
        HostRefused {
            error,
            shutting_down: false,
        }
    }
}

/// A PostgreSQL coordinator.
pub struct PgRegistry {
    config: tokio_postgres::Config,
    tls: postgres_openssl::MakeTlsConnector,
    client: Option<tokio_postgres::Client>,
    /// The task that drives the connection of `client` (spawned on `rt`).
    connection_task: Option<tokio::task::JoinHandle<()>>,
    /// When `client` was connected; it is replaced once older than `lifetime`.
    connected_at: Instant,
    lifetime: Duration,
    /// The URI's host index of `client`.
    connected_host: usize,
    rt: tokio::runtime::Runtime,
    budget: Arc<Budget>,
    timeout: Duration,
    created: bool,
    /// TLS is required because the URI names no sslmode and there is a password to send
    /// (the errors then say how to allow clear text).
    tls_by_default: bool,
    /// The schema of the tables, and the role that must own it and them (None: the
    /// connecting role).
    schema: String,
    owner: Option<String>,
    sql: Statements,
}

impl PgRegistry {
    pub(super) fn new(uri: &str, options: &Options) -> Result<Self> {
        let mut extras = split_libpq_extras(uri.trim()).map_err(RegistryError)?;
        let mut config: tokio_postgres::Config = extras.uri.parse()?;
        let timeout = options.timeout;
        let ms = timeout.as_millis();
        // search_path = pg_catalog: nothing another role creates can stand in for what the
        // statements use (they name everything with its schema besides). A client's startup
        // options take precedence over the role's and the database's own settings.
        // synchronous_commit = on: a claim is acknowledged only once it survives a crash of
        // the coordinator (and reached its synchronous standbys), whatever the server's
        // default says.
        config
            .connect_timeout(timeout)
            .tcp_user_timeout(timeout)
            .keepalives_idle(Duration::from_secs(5))
            .application_name("snowflake registry")
            .options(format!(
                "-c search_path=pg_catalog -c synchronous_commit=on -c statement_timeout={ms} -c lock_timeout={ms} -c idle_in_transaction_session_timeout={}",
                ms * 2
            ));
        if config.get_password().is_none() {
            if let Some(password) = pgpass_password(&config, &extras, options)? {
                config.password(password);
            }
        }
        // A fleet credential goes in clear text only where the URI asks for that: without
        // sslmode, a client with a password requires TLS (libpq's default, prefer, falls
        // back to clear text when the server refuses TLS, or when a machine in between
        // answers for it). Password-less setups (trust, peer, certificates) keep prefer.
        let tls_by_default = !extras.sslmode_given && config.get_password().is_some();
        if tls_by_default {
            extras.sslmode = "require".into();
        }
        // libpq's rule: require with a root certificate file given checks the certificate
        // against it, as verify-ca. snowflake.registry_ca_file counts as one.
        if extras.sslmode == "require"
            && (extras.sslrootcert.is_some() || options.ca_file.is_some())
        {
            extras.sslmode = "verify-ca".into();
        }
        config.ssl_mode(match extras.sslmode.as_str() {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            _ => SslMode::Require,
        });
        let tls = pg_tls(&extras, options)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| RegistryError(format!("could not start the coordinator client: {e}")))?;
        Ok(PgRegistry {
            config,
            tls,
            client: None,
            connection_task: None,
            connected_at: Instant::now(),
            connected_host: 0,
            lifetime: timeout * CONNECTION_LIFETIME_IN_TIMEOUTS,
            rt,
            budget: Arc::new(Budget {
                left: AtomicUsize::new(MAX_REPLY_BYTES),
                exceeded: AtomicBool::new(false),
            }),
            timeout,
            created: false,
            tls_by_default,
            sql: Statements::new(&extras.schema),
            schema: extras.schema,
            owner: extras.owner,
        })
    }

    /// Connects to the first host of the URI that answers (and accepts writes, with
    /// `target_session_attrs=read-write`), within `deadline`, through [`Bounded`].
    fn connect(
        &mut self,
        deadline: Instant,
    ) -> std::result::Result<tokio_postgres::Client, NotConnected> {
        let hosts = self.config.get_hosts().to_vec();
        let ports = self.config.get_ports().to_vec();
        let hostaddrs = self.config.get_hostaddrs().to_vec();
        let mut errors = Vec::new();
        let mut shutting_down = Vec::new();
        for (i, host) in hosts.iter().enumerate() {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match self.connect_one(host, hostaddrs.get(i).copied(), port, deadline) {
                Ok(client) => {
                    self.connected_host = i;
                    return Ok(client);
                }
                Err(e) => {
                    if e.shutting_down {
                        shutting_down.push(i);
                    }
                    errors.push(e.error.0);
                }
            }
        }
        Err(NotConnected {
            error: RegistryError(if errors.is_empty() {
                "the coordinator URI names no host".into()
            } else {
                errors.join("; ")
            }),
            shutting_down,
        })
    }

    fn connect_one(
        &mut self,
        host: &Host,
        hostaddr: Option<std::net::IpAddr>,
        port: u16,
        deadline: Instant,
    ) -> std::result::Result<tokio_postgres::Client, HostRefused> {
        let budget = Arc::clone(&self.budget);
        let (socket, name, unix): (Box<dyn Io>, String, bool) = match host {
            Host::Tcp(name) => {
                let address = hostaddr.map_or(name.clone(), |a| a.to_string());
                let stream = run_until(&self.rt, deadline, async {
                    tokio::net::TcpStream::connect((address.as_str(), port)).await
                })
                .map_err(|e| RegistryError(format!("{name}:{port}: {}", e.0)))?;
                let _ = stream.set_nodelay(true);
                set_tcp_user_timeout(&stream, self.timeout);
                (Box::new(stream), name.clone(), false)
            }
            Host::Unix(dir) => {
                let path = dir.join(format!(".s.PGSQL.{port}"));
                let stream = run_until(&self.rt, deadline, async {
                    tokio::net::UnixStream::connect(&path).await
                })
                .map_err(|e| RegistryError(format!("{}: {}", path.display(), e.0)))?;
                (Box::new(stream), String::new(), true)
            }
        };
        let stream = Bounded {
            inner: socket,
            budget,
        };
        let tls = MakeTlsConnect::<Bounded>::make_tls_connect(&mut self.tls, &name)
            .map_err(RegistryError::from)?;
        let mut config = self.config.clone();
        if unix {
            // As libpq: no TLS over a Unix socket.
            config.ssl_mode(SslMode::Disable);
        }
        let mut shutting_down = false;
        let connected = run_until(&self.rt, deadline, async {
            config.connect_raw(stream, tls).await.inspect_err(|e| {
                shutting_down = e.code() == Some(&SqlState::CANNOT_CONNECT_NOW);
            })
        });
        let (client, connection) = connected.map_err(|e| HostRefused {
            error: if self.tls_by_default && !unix && e.0.contains("does not support TLS") {
                RegistryError(format!(
                    "{name}:{port}: the server refused TLS, and without sslmode in the URI the password is sent only over TLS (turn ssl on at the coordinator, or write sslmode=prefer in the URI to send the password in clear text)"
                ))
            } else {
                e
            },
            shutting_down,
        })?;
        // The connection's task runs whenever a request drives the runtime.
        self.connection_task = Some(self.rt.spawn(async {
            let _ = connection.await;
        }));
        if config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite {
            let rows = run_until(
                &self.rt,
                deadline,
                client.simple_query("SHOW transaction_read_only"),
            )?;
            let read_only = rows.iter().any(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0) == Some("on"),
                _ => false,
            });
            if read_only {
                return Err(RegistryError(format!(
                    "{name}:{port}: the server does not accept writes"
                ))
                .into());
            }
        }
        Ok(client)
    }

    /// Replaces the connection, older than its lifetime ([`CONNECTION_LIFETIME_IN_TIMEOUTS`]),
    /// by a new one made first. Without a new one, the old one stays in use (tried again at
    /// the next request), unless its own host refused because it is shutting down: then it
    /// is closed as well, and the error returned, so that the shutdown can end.
    fn replace_connection(&mut self, deadline: Instant) -> Result<()> {
        let old_task = self.connection_task.take();
        let old_host = self.connected_host;
        match self.connect(deadline) {
            Ok(client) => {
                self.client = Some(client);
                self.connected_at = Instant::now();
                self.created = false;
                self.close(old_task, deadline);
                Ok(())
            }
            Err(e) if e.shutting_down.contains(&old_host) => {
                self.client = None;
                self.created = false;
                self.close(old_task, deadline);
                Err(e.error)
            }
            Err(_) => {
                self.connection_task = old_task;
                Ok(())
            }
        }
    }

    /// Waits (until `deadline` at most) for the task of a connection whose client was
    /// dropped: it sends Terminate and ends, so the session is over on the coordinator.
    fn close(&self, task: Option<tokio::task::JoinHandle<()>>, deadline: Instant) {
        if let Some(task) = task {
            let _ = run_until(&self.rt, deadline, async {
                let _ = task.await;
                Ok::<(), RegistryError>(())
            });
        }
    }

    /// Runs `f` in one transaction; drops the connection after any error. The connection
    /// may take the registry timeout, and the transaction another.
    fn transaction<T>(
        &mut self,
        f: impl FnOnce(&mut Tx<'_>, &Statements) -> Result<T>,
    ) -> Result<T> {
        self.budget.reset();
        let result = self.transaction_inner(f);
        let result = if self.budget.exceeded.load(Ordering::Relaxed) {
            Err(RegistryError(format!(
                "the coordinator sent more than {MAX_REPLY_BYTES} bytes for one request; the connection was closed"
            )))
        } else {
            result
        };
        if result.is_err() {
            // Check the tables again on the next connection: a coordinator rebuilt empty (a
            // new data directory) has none, and the nodes must not need a restart for it.
            self.client = None;
            self.created = false;
        }
        result
    }

    fn transaction_inner<T>(
        &mut self,
        f: impl FnOnce(&mut Tx<'_>, &Statements) -> Result<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + self.timeout;
        if self.client.is_some() && self.connected_at.elapsed() >= self.lifetime {
            self.replace_connection(deadline)?;
        }
        if self.client.is_none() {
            self.client = Some(self.connect(deadline).map_err(|e| e.error)?);
            self.connected_at = Instant::now();
        }
        let deadline = Instant::now() + self.timeout;
        let client = self.client.as_mut().expect("connected above");
        let tx = run_until(&self.rt, deadline, client.transaction())?;
        let mut tx = Tx {
            rt: &self.rt,
            tx,
            deadline,
        };
        if !self.created {
            // Checked on every new connection, before any use: the schema and the tables are
            // owned by the expected role (or a superuser), and none is missing.
            let missing = check_objects(&mut tx, &self.schema, self.owner.as_deref())?;
            if missing != Missing::Nothing {
                let ddl = if missing == Missing::Schema {
                    format!(
                        "CREATE SCHEMA {};\n{}",
                        escape_identifier(&self.schema),
                        self.sql.ddl
                    )
                } else {
                    self.sql.ddl.clone()
                };
                // Only when a table or column is missing: CREATE ... IF NOT EXISTS still
                // needs CREATE on the schema, which a least-privilege role does not have.
                tx.batch_execute(&ddl).map_err(|e| {
                    RegistryError(format!(
                        "the coordinator's tables in schema \"{}\" are missing or from an older version, and creating them failed: {}",
                        self.schema, e.0
                    ))
                })?;
                // What was created is checked like what was found.
                if check_objects(&mut tx, &self.schema, self.owner.as_deref())? != Missing::Nothing
                {
                    return Err(RegistryError(format!(
                        "the coordinator's tables in schema \"{}\" are still incomplete after creating them",
                        self.schema
                    )));
                }
            }
        }
        let value = f(&mut tx, &self.sql)?;
        let Tx { rt, tx, deadline } = tx;
        run_until(rt, deadline, tx.commit())?;
        self.created = true;
        Ok(value)
    }
}

/// The kernel's bound on unacknowledged data (as libpq's `tcp_user_timeout`). A failure
/// leaves the request's own deadline as the only bound, as before the option existed.
fn set_tcp_user_timeout(stream: &tokio::net::TcpStream, timeout: Duration) {
    let _ = socket2::SockRef::from(stream).set_tcp_user_timeout(Some(timeout));
}

/// What [`check_objects`] found missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    Nothing,
    /// A table, or a column this version added.
    Tables,
    /// The schema itself (and so the tables).
    Schema,
}

/// Checks that the schema and the tables found in it are owned by the expected role (the
/// URI's `snowflake_owner`, else the connecting role), by a superuser, or (a schema only) by
/// `pg_database_owner` of a database so owned; and that the tables are not elsewhere when
/// missing here (creating them here would start a second registry, splitting the fleet).
/// Says what is missing.
fn check_objects(client: &mut Tx<'_>, schema: &str, owner: Option<&str>) -> Result<Missing> {
    let rows = client.query(COORDINATOR_OBJECTS, &[&schema, &TABLES.as_slice()])?;
    let mut me = String::new();
    let mut schema_owner = None;
    let mut database_owner = None;
    let mut tables: Vec<(String, String, bool)> = Vec::new();
    let mut columns = 0;
    let mut elsewhere: Vec<String> = Vec::new();
    for row in &rows {
        let kind: String = row.get(0);
        let name: String = row.get(1);
        let owner_of: Option<String> = row.get(2);
        let superuser: Option<bool> = row.get(3);
        let owned = || {
            (
                owner_of.clone().unwrap_or_default(),
                superuser.unwrap_or(false),
            )
        };
        match kind.as_str() {
            "me" => me = name,
            "schema" => schema_owner = Some(owned()),
            "database" => database_owner = Some(owned()),
            "table" => {
                let (o, s) = owned();
                tables.push((name, o, s));
            }
            "column" => columns += 1,
            "elsewhere" => elsewhere.push(name),
            _ => {}
        }
    }
    let expected = owner.map_or(me.clone(), str::to_string);
    let trusted = |(name, superuser): &(String, bool)| *superuser || *name == expected;
    let refuse = |what: String, by: &str| {
        RegistryError(format!(
            "{what} on the coordinator is owned by role \"{by}\", not by \"{expected}\" (the {}) nor by a superuser: another role could change or replace what it holds, so the registry is not used; see docs/registries.md for the coordinator's setup",
            if owner.is_some() { "role that snowflake_owner names" } else { "connecting role; snowflake_owner in the URI names another" }
        ))
    };
    let Some(schema_owned) = schema_owner else {
        if let Some(other) = elsewhere.first() {
            return Err(tables_elsewhere(schema, other));
        }
        return Ok(Missing::Schema);
    };
    let schema_trusted = trusted(&schema_owned)
        || (schema_owned.0 == "pg_database_owner" && database_owner.as_ref().is_some_and(trusted));
    if !schema_trusted {
        return Err(refuse(format!("schema \"{schema}\""), &schema_owned.0));
    }
    for (table, o, s) in &tables {
        if !trusted(&(o.clone(), *s)) {
            return Err(refuse(format!("table \"{schema}\".\"{table}\""), o));
        }
    }
    if tables.len() == TABLES.len() && columns == ADDED_COLUMNS {
        return Ok(Missing::Nothing);
    }
    if !tables.iter().any(|(t, _, _)| t == "snowflake_claims") {
        if let Some(other) = elsewhere.first() {
            return Err(tables_elsewhere(schema, other));
        }
    }
    Ok(Missing::Tables)
}

/// The tables are in another schema than the one the URI names (as earlier versions could
/// leave them, on the connecting role's search_path).
fn tables_elsewhere(schema: &str, other: &str) -> RegistryError {
    RegistryError(format!(
        "the coordinator's tables are not in schema \"{schema}\" but in schema \"{other}\"; this version looks for them only in the schema the URI names (snowflake_schema, default public) and will not start a second registry beside them: add snowflake_schema={other} to the URI, or move the tables (docs/registries.md)"
    ))
}

/// The password from a `.pgpass`-style file, as libpq finds it: the URI's `passfile`, else
/// `snowflake.registry_password_file`, else `PGPASSFILE`, else `~/.pgpass` of the server's
/// OS user (only when it exists). The first host of the URI that has an entry gives it.
fn pgpass_password(
    config: &tokio_postgres::Config,
    extras: &LibpqExtras,
    options: &Options,
) -> Result<Option<String>> {
    let explicit = extras
        .passfile
        .clone()
        .or_else(|| options.password_file.clone());
    let file = match explicit {
        Some(f) => f,
        None => match std::env::var("PGPASSFILE")
            .ok()
            .or_else(|| std::env::var("HOME").ok().map(|h| format!("{h}/.pgpass")))
        {
            Some(f) if std::path::Path::new(&f).exists() => f,
            _ => return Ok(None),
        },
    };
    // snowflake.registry_password_file follows PostgreSQL's rule for ssl_key_file (root's
    // with group read is fine, as a Kubernetes secret mounts it); libpq's own files keep
    // libpq's: no group or other access.
    let from_setting = extras.passfile.is_none() && options.password_file.as_ref() == Some(&file);
    let text = super::read_private_file(&file, from_setting, options.effective_uid)?;
    let user = config.get_user().unwrap_or("");
    let database = config.get_dbname().unwrap_or(user);
    let ports = config.get_ports();
    for (i, host) in config.get_hosts().iter().enumerate() {
        let Host::Tcp(host) = host else {
            continue;
        };
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        if let Some(p) = pgpass_lookup(&text, host, port, database, user) {
            return Ok(Some(p));
        }
    }
    Ok(None)
}

/// The TLS connector for the URI's `sslmode`: verify-ca and verify-full check the server's
/// certificate against `sslrootcert` (or `snowflake.registry_ca_file`: all the file's
/// certificates and only those, as libpq; the system's CAs without either), and verify-full
/// its host name too; require (with no root certificate given) and prefer encrypt without
/// checking, as libpq.
fn pg_tls(extras: &LibpqExtras, options: &Options) -> Result<postgres_openssl::MakeTlsConnector> {
    let builder = if extras.verifies_certificate() {
        let ca = extras
            .sslrootcert
            .clone()
            .or_else(|| options.ca_file.clone());
        match ca {
            // SslConnector::builder trusts the system's CAs: the file's store replaces them.
            Some(file) => super::tls_connector_builder(Some(&file))?.0,
            None => {
                let mut builder =
                    openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())?;
                builder.set_verify(openssl::ssl::SslVerifyMode::PEER);
                builder
            }
        }
    } else {
        let mut builder =
            openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())?;
        builder.set_verify(openssl::ssl::SslVerifyMode::NONE);
        builder
    };
    let mut connector = postgres_openssl::MakeTlsConnector::new(builder.build());
    if !extras.verifies_host() {
        connector.set_callback(|config, _| {
            config.set_verify_hostname(false);
            Ok(())
        });
    }
    Ok(connector)
}

/// The registry row, locked: (now, born, recorded epoch), with the incarnation renewed if
/// the coordinator changed. `now` is read after the lock, so that a wait for it counts in
/// the request's age.
fn pg_registry_row(
    tx: &mut Tx<'_>,
    sql: &Statements,
    epoch_unix_ms: i64,
) -> Result<(i64, i64, i64, Option<u64>)> {
    tx.execute(&sql.instance_token, &[&sql.schema, &TABLES.as_slice()])?;
    let row = tx.query_one(&sql.now, &[])?;
    let first_now: i64 = row.get(0);
    let incarnation: String = row.get(1);
    tx.execute(
        &sql.registry_insert,
        &[&incarnation, &first_now, &epoch_unix_ms],
    )?;
    let row = tx.query_one(&sql.registry_lock, &[])?;
    let recorded: String = row.get(0);
    let mut born: i64 = row.get(1);
    let epoch: i64 = row.get(2);
    let now: i64 = row.get(3);
    let registry_id = row
        .get::<_, Option<String>>(4)
        .as_deref()
        .and_then(parse_registry_id);
    if recorded != incarnation && epoch == epoch_unix_ms {
        tx.execute(&sql.registry_reborn, &[&incarnation, &now])?;
        born = now;
    }
    Ok((now, born, epoch, registry_id))
}

/// Holds `worker_id` for the request's token: the claim's expiry, the mark (only rises),
/// no released value. `floor`: Some(f) sets the holder's floor (a free grant: f, or None
/// when nothing was recorded), None keeps it (a renewal).
fn pg_hold(
    tx: &mut Tx<'_>,
    sql: &Statements,
    request: &ClaimRequest,
    worker_id: u8,
    now: i64,
    floor: Option<Option<i64>>,
) -> Result<()> {
    let dc = i32::from(request.datacenter_id);
    let w = i32::from(worker_id);
    let (set_floor, floor) = match floor {
        Some(f) => (true, f),
        None => (false, None),
    };
    tx.execute(
        &sql.hold,
        &[
            &dc,
            &w,
            &request.tokens.write,
            &(now + request.ttl_ms as i64),
            &request.cap_unix_ms,
            &set_floor,
            &floor,
            &(request.ttl_ms as i64),
        ],
    )?;
    Ok(())
}

/// A live claim's row as the claim step reads it.
struct LiveRow {
    worker_id: u8,
    holder: String,
    floor_unix_ms: Option<i64>,
    /// The holder's `claim_ttl` (ms).
    ttl_ms: Option<i64>,
    high_water_unix_ms: Option<i64>,
}

/// The floor a free grant of `worker_id` gets (see [`claim::free_grant_floor_unix_ms`]).
fn pg_free_floor(
    tx: &mut Tx<'_>,
    sql: &Statements,
    datacenter_id: u8,
    worker_id: u8,
) -> Result<Option<i64>> {
    let row = tx.query_opt(
        &sql.free_floor,
        &[&i32::from(datacenter_id), &i32::from(worker_id)],
    )?;
    Ok(row.and_then(|r| claim::free_grant_floor_unix_ms(r.get(0), r.get(1))))
}

impl PgRegistry {
    /// Runs one step: the registry row, the epoch and the request's age checked first.
    fn step<R>(
        &mut self,
        request: &ClaimRequest,
        on_epoch: impl FnOnce(i64) -> Result<R>,
        on_rejected: impl FnOnce(RequestAge) -> R,
        f: impl FnOnce(&mut Tx<'_>, &Statements, i64, i64) -> Result<R>,
    ) -> Result<(R, Observed)> {
        let (reply, now, born, registry_id) = self.transaction(|tx, sql| {
            let (now, born, epoch, id) = pg_registry_row(tx, sql, request.epoch_unix_ms)?;
            if epoch != request.epoch_unix_ms {
                return Ok((on_epoch(epoch)?, now, born, id));
            }
            match request.timing().request_age(request.sent_unix_ms, now) {
                RequestAge::Fresh => Ok((f(tx, sql, now, born)?, now, born, id)),
                age => Ok((on_rejected(age), now, born, id)),
            }
        })?;
        let observed = Observed {
            sample: ClockSample {
                sent_unix_ms: request.sent_unix_ms,
                received_unix_ms: wall_ms(),
                registry_unix_ms: now,
                registry_resolution_ms: 0,
            },
            born_unix_ms: born,
            registry_id,
            sample_age_ms: 0,
        };
        Ok((reply, observed))
    }
}

impl Registry for PgRegistry {
    fn claim(&mut self, request: &ClaimRequest) -> Result<(ClaimReply, Observed)> {
        self.step(
            request,
            |epoch| {
                Ok(ClaimReply::EpochMismatch {
                    registry_epoch_unix_ms: epoch,
                })
            },
            ClaimReply::Rejected,
            |tx, sql, now, born| {
                let rows = tx.query(&sql.live, &[&i32::from(request.datacenter_id), &now])?;
                let rows: Vec<LiveRow> = rows
                    .iter()
                    .map(|r| LiveRow {
                        worker_id: r.get::<_, i32>(0) as u8,
                        holder: r.get(1),
                        floor_unix_ms: r.get(2),
                        ttl_ms: r.get(3),
                        high_water_unix_ms: r.get(4),
                    })
                    .collect();
                let live: Vec<LiveClaim<'_>> = rows
                    .iter()
                    .map(|c| LiveClaim {
                        worker_id: c.worker_id,
                        holder: &c.holder,
                        from_before_loss: false,
                        holder_ttl_ms: c.ttl_ms.map(|t| t.max(0) as u64),
                        floor_unix_ms: c.floor_unix_ms,
                        high_water_unix_ms: c.high_water_unix_ms,
                    })
                    .collect();
                let settle = request.claim_timing().settle_wait_ms(born, now);
                let decision = registry_rules::decide_claim(request, settle, &live);
                let free_floor = match decision {
                    ClaimDecision::Own { worker_id, .. } => {
                        pg_hold(tx, sql, request, worker_id, now, None)?;
                        None
                    }
                    ClaimDecision::Free { worker_id } => {
                        let floor = pg_free_floor(tx, sql, request.datacenter_id, worker_id)?;
                        pg_hold(tx, sql, request, worker_id, now, Some(floor))?;
                        floor
                    }
                    _ => None,
                };
                Ok(decision.reply(0, free_floor))
            },
        )
    }

    fn renew(
        &mut self,
        request: &ClaimRequest,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> Result<(RenewReply, Observed)> {
        self.step(
            request,
            |_| {
                Err(RegistryError(
                    "the registry now records another epoch for the fleet".into(),
                ))
            },
            RenewReply::Rejected,
            |tx, sql, now, born| {
                let row = tx.query_opt(
                    &sql.holder,
                    &[
                        &i32::from(request.datacenter_id),
                        &i32::from(worker_id),
                        &now,
                    ],
                )?;
                let holder: Option<String> = row.as_ref().map(|r| r.get(0));
                let live = holder.as_deref().map(|h| LiveClaim {
                    worker_id,
                    holder: h,
                    from_before_loss: false,
                    holder_ttl_ms: None,
                    floor_unix_ms: None,
                    high_water_unix_ms: None,
                });
                let reassert = reassert_known_born
                    .is_some_and(|known| request.timing().may_reassert(known, born, now));
                // The id's mark: beside its live row, or (no live row) its own, read only
                // when the claim may be taken back (else the answer is Lost whatever it is).
                let high_water_unix_ms: Option<i64> = match &row {
                    Some(r) => r.get(1),
                    None if reassert => tx
                        .query_opt(
                            &sql.free_floor,
                            &[&i32::from(request.datacenter_id), &i32::from(worker_id)],
                        )?
                        .and_then(|r| r.get::<_, Option<i64>>(0)),
                    None => None,
                };
                let reply = registry_rules::decide_renew(
                    request,
                    live.as_ref(),
                    high_water_unix_ms,
                    reassert,
                );
                if let RenewReply::Renewed { .. } = reply {
                    // A claim taken back (no live row) gets no floor of its own.
                    let floor = if live.is_some() { None } else { Some(None) };
                    pg_hold(tx, sql, request, worker_id, now, floor)?;
                }
                Ok(reply)
            },
        )
    }

    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        tokens: &RequestTokens,
        released_unix_ms: Option<i64>,
    ) -> Result<()> {
        let held: Vec<&str> = std::iter::once(&tokens.write)
            .chain(&tokens.held)
            .map(String::as_str)
            .collect();
        self.transaction(|tx, sql| {
            tx.execute(
                &sql.release,
                &[
                    &i32::from(datacenter_id),
                    &i32::from(worker_id),
                    &held,
                    &released_unix_ms,
                ],
            )?;
            Ok(())
        })
    }

    fn password(&self) -> Option<&str> {
        self.config
            .get_password()
            .and_then(|p| std::str::from_utf8(p).ok())
    }
}
