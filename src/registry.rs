//! The registry clients: Redis (through the `redis` crate, with Lua scripts so that every
//! step is atomic on the server) and a PostgreSQL coordinator (through the `postgres` crate,
//! one transaction per step, committed synchronously). No pgrx here: only the background
//! worker calls this, never a backend and never the postmaster.
//!
//! Both keep the same records (see the README, "Fleets"):
//! - the registry's incarnation and when it began ("born"), and the fleet's epoch. The
//!   incarnation changes whenever the registry may have lost writes it acknowledged: any
//!   restart of Redis (its `run_id`) or a promotion of a replica (its `master_replid`); any
//!   restart, crash restart, restore or promotion of the coordinator (its postmaster's start
//!   time and a token in an unlogged table, which crash recovery, a base backup and a
//!   standby all start empty). A new incarnation settles: no free id for one `ttl`;
//! - per (datacenter, worker): the holder's token, expiring `ttl` after its last renewal;
//! - per (datacenter, worker): the high-water mark, the highest cap ever granted (Unix ms),
//!   which only rises; the floor handed to the current holder; and what the last holder
//!   recorded at a clean release (the next holder's floor instead of the mark).
//!
//! Every request carries the holder's clock at its send; the registry writes nothing for a
//! request whose clock is ahead of its own by more than the allowed skew, or that arrives
//! too late to be inside the fence it would renew ([`ClaimTiming::request_age`]).

use std::time::Duration;

use snowflake_core::claim::{self, ClaimChoice, ClaimTiming, ClockSample, Granted, RequestAge};
use snowflake_core::secrets::{redacted, without_secrets};

/// A failed request, as text for the log and for callers' DETAIL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryError(pub String);

impl<E: std::fmt::Display> From<E> for RegistryError {
    fn from(e: E) -> Self {
        RegistryError(e.to_string())
    }
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, RegistryError>;

/// What a claim or a renewal asks for.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// `snowflake.datacenter_id`.
    pub datacenter_id: u8,
    /// The ids to try, in order (see [`claim::claim_order`]).
    pub order: &'a [u8],
    /// This server's token (new at every postmaster start).
    pub token: &'a str,
    /// `snowflake.claim_ttl` in ms.
    pub ttl_ms: u64,
    /// This server's clock when it sent the request (Unix ms).
    pub sent_unix_ms: i64,
    /// The cap this claim grants if it succeeds (Unix ms): recorded as high-water mark.
    pub cap_unix_ms: i64,
    /// The fleet's epoch (Unix ms).
    pub epoch_unix_ms: i64,
}

impl ClaimRequest<'_> {
    fn timing(&self) -> ClaimTiming {
        ClaimTiming::new(self.ttl_ms)
    }
}

/// The registry's answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimReply {
    /// The id is this server's now.
    Granted {
        /// The worker id.
        worker_id: u8,
        /// Own (this token held it) or free.
        granted: Granted,
        /// Where IDs under the claim must start, as far as the registry knows (Unix ms):
        /// above the id's mark for a free id, the floor recorded then for an own one. None:
        /// never recorded, or lost with the registry's data (which then settled first).
        floor_unix_ms: Option<i64>,
    },
    /// The registry began recently (new, restarted, restored): free ids in this long.
    Settling {
        /// ms.
        wait_ms: u64,
    },
    /// Every id is held by another node.
    Exhausted {
        /// How many ids there are in the datacenter.
        taken: u32,
    },
    /// The registry records another epoch for the fleet.
    EpochMismatch {
        /// The registry's epoch (Unix ms).
        registry_epoch_unix_ms: i64,
    },
    /// Not acted on: the request's clock or age (see [`RequestAge`]).
    Rejected(RequestAge),
}

/// The registry's answer to a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewReply {
    /// Renewed; the cap is recorded.
    Renewed,
    /// The id is no longer this server's (`holder`: who has it, if anyone).
    Lost {
        /// The other holder's token, or None if the claim is gone and may not be re-asserted.
        holder: Option<String>,
    },
    /// Not acted on: the request's clock or age (see [`RequestAge`]).
    Rejected(RequestAge),
}

/// What came with an answer besides the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The registry's clock against ours.
    pub sample: ClockSample,
    /// When the registry's current incarnation began (its clock, Unix ms).
    pub born_unix_ms: i64,
}

/// One registry. Every call is one request (or one transaction) bounded by the timeout.
pub trait Registry {
    /// Claims an id.
    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<(ClaimReply, Observed)>;
    /// Renews `worker_id`, recording `cap_unix_ms`. With `reassert_known_born` (the
    /// incarnation's birth this holder last saw), takes the claim back if the registry lost
    /// it since, while it still settles ([`ClaimTiming::may_reassert`]).
    fn renew(
        &mut self,
        request: &ClaimRequest<'_>,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> Result<(RenewReply, Observed)>;
    /// Releases `worker_id` if this token holds it. `released_unix_ms`: the highest
    /// timestamp this holder could have issued, the next holder's floor (None: leave the
    /// id's mark as it is, for a claim given back unused).
    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        token: &str,
        released_unix_ms: Option<i64>,
    ) -> Result<()>;
}

/// Which kind of registry a `snowflake.registry` URI names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `redis://` (or `rediss://` is refused: no TLS in this build).
    Redis,
    /// `postgresql://` or `postgres://`.
    Postgres,
}

/// The kind of registry `uri` names, or None.
pub fn kind_of(uri: &str) -> Option<Kind> {
    let lower = uri.trim().to_ascii_lowercase();
    if lower.starts_with("redis://") {
        Some(Kind::Redis)
    } else if lower.starts_with("postgresql://") || lower.starts_with("postgres://") {
        Some(Kind::Postgres)
    } else {
        None
    }
}

/// Opens a client for `uri` (connecting lazily). Every error it returns, now and from its
/// requests, has the URI's secrets removed: client libraries may quote what they parsed.
pub fn open(uri: &str, timeout: Duration) -> Result<Box<dyn Registry>> {
    let opened: Result<Box<dyn Registry>> = match kind_of(uri) {
        Some(Kind::Redis) => RedisRegistry::new(uri, timeout).map(|r| Box::new(r) as _),
        Some(Kind::Postgres) => PgRegistry::new(uri, timeout).map(|r| Box::new(r) as _),
        None => Err(RegistryError(format!(
            "unsupported registry URI \"{}\"",
            redacted(uri)
        ))),
    };
    match opened {
        Ok(inner) => Ok(Box::new(WithoutSecrets {
            inner,
            uri: uri.to_string(),
        })),
        Err(e) => Err(e.without_secrets_of(uri)),
    }
}

impl RegistryError {
    fn without_secrets_of(self, uri: &str) -> RegistryError {
        RegistryError(without_secrets(&self.0, uri))
    }
}

/// A registry whose errors never carry the URI's secrets.
struct WithoutSecrets {
    inner: Box<dyn Registry>,
    uri: String,
}

impl Registry for WithoutSecrets {
    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<(ClaimReply, Observed)> {
        self.inner
            .claim(request)
            .map_err(|e| e.without_secrets_of(&self.uri))
    }

    fn renew(
        &mut self,
        request: &ClaimRequest<'_>,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> Result<(RenewReply, Observed)> {
        self.inner
            .renew(request, worker_id, reassert_known_born)
            .map_err(|e| e.without_secrets_of(&self.uri))
    }

    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        token: &str,
        released_unix_ms: Option<i64>,
    ) -> Result<()> {
        self.inner
            .release(datacenter_id, worker_id, token, released_unix_ms)
            .map_err(|e| e.without_secrets_of(&self.uri))
    }
}

fn wall_ms() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

// ---------------------------------------------------------------------------------------
// Redis

/// Checks the registry record (incarnation, epoch) and the request's age, and leaves `now`
/// (Redis time, ms) and `born` set. A new incarnation means Redis restarted, was replaced,
/// or a replica took over: its data may be older than what holders were told, so it begins
/// again ("born" now) and settles. Every reply starts with a word, `now` and `born`.
///
/// ARGV: 1 incarnation, 2 epoch, 3 dc, 4 token, 5 ttl, 6 cap, 7 sent, 8 largest lead of
/// `sent` over `now`, 9 largest age; then the script's own.
const REDIS_PRELUDE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reg = 'snowflake:registry'
local m = redis.call('HMGET', reg, 'born_ms', 'run_id', 'epoch_ms')
if m[3] and m[3] ~= ARGV[2] then return {'epoch', now, 0, tonumber(m[3])} end
local born = tonumber(m[1])
if (not born) or m[2] ~= ARGV[1] then
  born = now
  redis.call('HSET', reg, 'born_ms', now, 'run_id', ARGV[1], 'epoch_ms', ARGV[2])
end
local sent = tonumber(ARGV[7])
if sent - now > tonumber(ARGV[8]) then return {'ahead', now, born} end
if now - sent > tonumber(ARGV[9]) then return {'stale', now, born} end
local dc = ARGV[3]
local function key(kind, w) return 'snowflake:' .. kind .. ':' .. dc .. ':' .. w end
local function hold(w, token, ttl, cap)
  redis.call('SET', key('claim', w), token, 'PX', ttl)
  local prev = tonumber(redis.call('GET', key('high_water', w)))
  if (not prev) or prev < cap then redis.call('SET', key('high_water', w), cap) end
  redis.call('DEL', key('released', w))
end
"#;

/// ARGV: the prelude's, then the ids in order (from 10).
const REDIS_CLAIM: &str = r#"
local token = ARGV[4]
local ttl = tonumber(ARGV[5])
local cap = tonumber(ARGV[6])
for i = 10, #ARGV do
  local w = ARGV[i]
  if redis.call('GET', key('claim', w)) == token then
    hold(w, token, ttl, cap)
    return {'own', now, born, tonumber(w), tonumber(redis.call('GET', key('floor', w)))}
  end
end
local wait = born + ttl - now
if wait > 0 then return {'settling', now, born, wait} end
for i = 10, #ARGV do
  local w = ARGV[i]
  if redis.call('EXISTS', key('claim', w)) == 0 then
    local mark = tonumber(redis.call('GET', key('released', w)) or redis.call('GET', key('high_water', w)))
    hold(w, token, ttl, cap)
    if mark then
      redis.call('SET', key('floor', w), mark + 1)
      return {'free', now, born, tonumber(w), mark + 1}
    end
    redis.call('DEL', key('floor', w))
    return {'free', now, born, tonumber(w)}
  end
end
return {'exhausted', now, born, #ARGV - 9}
"#;

/// ARGV: the prelude's, then 10 worker, 11 the incarnation's birth the holder knows ('' to
/// never re-assert).
const REDIS_RENEW: &str = r#"
local token = ARGV[4]
local w = ARGV[10]
local v = redis.call('GET', key('claim', w))
if v == token then
  hold(w, token, tonumber(ARGV[5]), tonumber(ARGV[6]))
  return {'renewed', now, born}
end
local known = tonumber(ARGV[11])
if (not v) and known and known ~= born and born + tonumber(ARGV[5]) > now then
  hold(w, token, tonumber(ARGV[5]), tonumber(ARGV[6]))
  return {'renewed', now, born}
end
if v then return {'lost', now, born, v} end
return {'lost', now, born}
"#;

/// KEYS: claim, high water, released, floor. ARGV: token, released ('' for none). The mark
/// only rises; the released value (never below the holder's floor) is the next floor.
const REDIS_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
local v = tonumber(ARGV[2])
if v then
  local floor = tonumber(redis.call('GET', KEYS[4]))
  if floor and floor > v then v = floor end
  local hw = tonumber(redis.call('GET', KEYS[2]))
  if (not hw) or hw < v then redis.call('SET', KEYS[2], v) end
  redis.call('SET', KEYS[3], v)
end
return 1
"#;

/// A Redis registry.
pub struct RedisRegistry {
    client: redis::Client,
    timeout: Duration,
    connection: Option<redis::Connection>,
    claim: redis::Script,
    renew: redis::Script,
    release: redis::Script,
}

impl RedisRegistry {
    fn new(uri: &str, timeout: Duration) -> Result<Self> {
        Ok(RedisRegistry {
            client: redis::Client::open(uri)?,
            timeout,
            connection: None,
            claim: redis::Script::new(&format!("{REDIS_PRELUDE}{REDIS_CLAIM}")),
            renew: redis::Script::new(&format!("{REDIS_PRELUDE}{REDIS_RENEW}")),
            release: redis::Script::new(REDIS_RELEASE),
        })
    }

    fn connection(&mut self) -> Result<&mut redis::Connection> {
        if self.connection.is_none() {
            let c = self.client.get_connection_with_timeout(self.timeout)?;
            c.set_read_timeout(Some(self.timeout))?;
            c.set_write_timeout(Some(self.timeout))?;
            self.connection = Some(c);
        }
        Ok(self.connection.as_mut().expect("connected above"))
    }

    /// Runs `f` on the connection; drops the connection after any error.
    fn with<T>(&mut self, f: impl FnOnce(&mut redis::Connection) -> Result<T>) -> Result<T> {
        let result = f(self.connection()?);
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    /// Runs one of the prelude's scripts for `request` with `extra` arguments; returns the
    /// reply's word and the rest, and what was observed.
    fn invoke(
        con: &mut redis::Connection,
        script: &redis::Script,
        request: &ClaimRequest<'_>,
        extra: &[String],
    ) -> Result<(String, Vec<redis::Value>, Observed)> {
        let incarnation = redis_incarnation(con)?;
        let timing = request.timing();
        let mut invocation = script.prepare_invoke();
        invocation
            .arg(incarnation)
            .arg(request.epoch_unix_ms)
            .arg(request.datacenter_id)
            .arg(request.token)
            .arg(request.ttl_ms)
            .arg(request.cap_unix_ms)
            .arg(request.sent_unix_ms)
            .arg(timing.max_request_lead_ms())
            .arg(timing.max_request_age_ms());
        for arg in extra {
            invocation.arg(arg);
        }
        let value: redis::Value = invocation.invoke(con)?;
        let received = wall_ms();
        let redis::Value::Array(items) = value else {
            return Err(RegistryError(format!("unexpected reply {value:?}")));
        };
        let mut items = items.into_iter();
        let word: String = redis::from_redis_value(items.next().unwrap_or(redis::Value::Nil))?;
        let now: i64 = redis::from_redis_value(items.next().unwrap_or(redis::Value::Nil))?;
        let born: i64 = redis::from_redis_value(items.next().unwrap_or(redis::Value::Nil))?;
        let observed = Observed {
            sample: ClockSample {
                sent_unix_ms: request.sent_unix_ms,
                received_unix_ms: received,
                registry_unix_ms: now,
            },
            born_unix_ms: born,
        };
        Ok((word, items.collect(), observed))
    }
}

/// What identifies this Redis server's data: its `run_id` (new at every start, so a restart,
/// a restore or a replacement shows) and its replication id (new whenever it is promoted, so
/// a failover shows, even back to a server whose `run_id` the registry recorded earlier:
/// it resynchronized from the other one in between and may have lost writes).
fn redis_incarnation(con: &mut redis::Connection) -> Result<String> {
    let server: String = redis::cmd("INFO").arg("server").query(con)?;
    let replication: String = redis::cmd("INFO").arg("replication").query(con)?;
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|s| s.trim().to_string())
    };
    let run_id =
        field(&server, "run_id:").ok_or_else(|| RegistryError("INFO has no run_id".into()))?;
    let replid = field(&replication, "master_replid:").unwrap_or_default();
    Ok(format!("{run_id}/{replid}"))
}

fn int_at(rest: &[redis::Value], i: usize) -> Result<Option<i64>> {
    match rest.get(i) {
        None | Some(redis::Value::Nil) => Ok(None),
        Some(v) => Ok(Some(redis::from_redis_value(v.clone())?)),
    }
}

/// The request-age verdicts of the prelude.
fn rejected(word: &str) -> Option<RequestAge> {
    match word {
        "ahead" => Some(RequestAge::Ahead),
        "stale" => Some(RequestAge::Stale),
        _ => None,
    }
}

impl Registry for RedisRegistry {
    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<(ClaimReply, Observed)> {
        let script = self.claim.clone();
        self.with(|con| {
            let ids: Vec<String> = request.order.iter().map(|w| w.to_string()).collect();
            let (word, rest, observed) = Self::invoke(con, &script, request, &ids)?;
            let int = |i| int_at(&rest, i);
            let worker = |i| -> Result<u8> {
                int(i)?
                    .and_then(|w| u8::try_from(w).ok())
                    .ok_or_else(|| RegistryError("a reply without a worker id".into()))
            };
            let reply = match word.as_str() {
                "own" => ClaimReply::Granted {
                    worker_id: worker(0)?,
                    granted: Granted::Own,
                    floor_unix_ms: int(1)?,
                },
                "free" => ClaimReply::Granted {
                    worker_id: worker(0)?,
                    granted: Granted::Free,
                    floor_unix_ms: int(1)?,
                },
                "settling" => ClaimReply::Settling {
                    wait_ms: int(0)?.unwrap_or(0).max(0) as u64,
                },
                "exhausted" => ClaimReply::Exhausted {
                    taken: int(0)?.unwrap_or(0) as u32,
                },
                "epoch" => ClaimReply::EpochMismatch {
                    registry_epoch_unix_ms: int(0)?.unwrap_or(0),
                },
                other => match rejected(other) {
                    Some(age) => ClaimReply::Rejected(age),
                    None => return Err(RegistryError(format!("unexpected reply \"{other}\""))),
                },
            };
            Ok((reply, observed))
        })
    }

    fn renew(
        &mut self,
        request: &ClaimRequest<'_>,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> Result<(RenewReply, Observed)> {
        let script = self.renew.clone();
        self.with(|con| {
            let extra = [
                worker_id.to_string(),
                reassert_known_born
                    .map(|b| b.to_string())
                    .unwrap_or_default(),
            ];
            let (word, rest, observed) = Self::invoke(con, &script, request, &extra)?;
            let reply = match word.as_str() {
                "renewed" => RenewReply::Renewed,
                "lost" => RenewReply::Lost {
                    holder: match rest.first() {
                        Some(v @ redis::Value::BulkString(_)) => {
                            Some(redis::from_redis_value(v.clone())?)
                        }
                        _ => None,
                    },
                },
                "epoch" => {
                    return Err(RegistryError(
                        "the registry now records another epoch for the fleet".into(),
                    ))
                }
                other => match rejected(other) {
                    Some(age) => RenewReply::Rejected(age),
                    None => return Err(RegistryError(format!("unexpected reply \"{other}\""))),
                },
            };
            Ok((reply, observed))
        })
    }

    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        token: &str,
        released_unix_ms: Option<i64>,
    ) -> Result<()> {
        let script = self.release.clone();
        self.with(|con| {
            let key = |kind: &str| format!("snowflake:{kind}:{datacenter_id}:{worker_id}");
            let _: i64 = script
                .key(key("claim"))
                .key(key("high_water"))
                .key(key("released"))
                .key(key("floor"))
                .arg(token)
                .arg(released_unix_ms.map(|v| v.to_string()).unwrap_or_default())
                .invoke(con)?;
            Ok(())
        })
    }
}

// ---------------------------------------------------------------------------------------
// PostgreSQL coordinator

/// The coordinator's tables, created on first use (also in the README). The unlogged table
/// holds a token that crash recovery, a base backup and a standby all start without: a new
/// token is a new incarnation.
pub const COORDINATOR_DDL: &str = "\
CREATE TABLE IF NOT EXISTS snowflake_registry (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    incarnation   text    NOT NULL,
    born_unix_ms  bigint  NOT NULL,
    epoch_unix_ms bigint  NOT NULL
);
CREATE UNLOGGED TABLE IF NOT EXISTS snowflake_registry_instance (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    token     text    NOT NULL
);
CREATE TABLE IF NOT EXISTS snowflake_claims (
    datacenter_id      integer NOT NULL,
    worker_id          integer NOT NULL,
    holder             text,
    expires_unix_ms    bigint,
    high_water_unix_ms bigint,
    floor_unix_ms      bigint,
    released_unix_ms   bigint,
    PRIMARY KEY (datacenter_id, worker_id)
);
ALTER TABLE snowflake_claims ADD COLUMN IF NOT EXISTS floor_unix_ms bigint;
ALTER TABLE snowflake_claims ADD COLUMN IF NOT EXISTS released_unix_ms bigint;";

/// Whether the tables exist as this version needs them (on the connection's search_path).
const COORDINATOR_TABLES_PRESENT: &str = "\
SELECT to_regclass('snowflake_registry') IS NOT NULL
   AND to_regclass('snowflake_registry_instance') IS NOT NULL
   AND (SELECT count(*) = 2 FROM pg_attribute
         WHERE attrelid = to_regclass('snowflake_claims')
           AND attname IN ('floor_unix_ms', 'released_unix_ms') AND NOT attisdropped)";

/// Makes this incarnation's token, once (the unlogged table is empty after a crash restart,
/// in a base backup, and on a standby).
const PG_INSTANCE_TOKEN: &str = "\
INSERT INTO snowflake_registry_instance (token)
VALUES (md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text))
ON CONFLICT (singleton) DO NOTHING";

/// The coordinator's clock (ms) and incarnation: its postmaster's start time (which changes
/// whenever it starts, from a restored copy too) and its instance token (which changes at a
/// crash restart, which keeps the start time, and at a promotion).
const PG_NOW: &str = "\
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
       pg_postmaster_start_time()::text || ' ' || (SELECT token FROM snowflake_registry_instance)";

/// A PostgreSQL coordinator.
pub struct PgRegistry {
    config: postgres::Config,
    client: Option<postgres::Client>,
    created: bool,
}

impl PgRegistry {
    fn new(uri: &str, timeout: Duration) -> Result<Self> {
        let mut config: postgres::Config = uri.parse()?;
        let ms = timeout.as_millis();
        // synchronous_commit = on: a claim is acknowledged only once it survives a crash of
        // the coordinator (and reached its synchronous standbys), whatever the server's
        // default says.
        config
            .connect_timeout(timeout)
            .tcp_user_timeout(timeout)
            .keepalives_idle(Duration::from_secs(5))
            .application_name("snowflake registry")
            .options(&format!(
                "-c synchronous_commit=on -c statement_timeout={ms} -c lock_timeout={ms} -c idle_in_transaction_session_timeout={}",
                ms * 2
            ));
        Ok(PgRegistry {
            config,
            client: None,
            created: false,
        })
    }

    /// Runs `f` in one transaction; drops the connection after any error.
    fn transaction<T>(
        &mut self,
        f: impl FnOnce(&mut postgres::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        if self.client.is_none() {
            self.client = Some(self.config.connect(postgres::NoTls)?);
        }
        let client = self.client.as_mut().expect("connected above");
        let result = (|| {
            if !self.created {
                // Only when a table or column is missing: CREATE ... IF NOT EXISTS still needs
                // CREATE on the schema, which a least-privilege registry role does not have.
                let present: bool = client.query_one(COORDINATOR_TABLES_PRESENT, &[])?.get(0);
                if !present {
                    client.batch_execute(COORDINATOR_DDL).map_err(|e| {
                        RegistryError(format!(
                            "the coordinator's tables are missing or from an older version, and creating them failed: {e}"
                        ))
                    })?;
                }
                self.created = true;
            }
            let mut tx = client.transaction()?;
            let value = f(&mut tx)?;
            tx.commit()?;
            Ok(value)
        })();
        if result.is_err() {
            // Check the tables again on the next connection: a coordinator rebuilt empty (a
            // new data directory) has none, and the nodes must not need a restart for it.
            self.client = None;
            self.created = false;
        }
        result
    }
}

/// The registry row, locked: (now, born, recorded epoch), with the incarnation renewed if
/// the coordinator changed. `now` is read after the lock, so that a wait for it counts in
/// the request's age.
fn pg_registry_row(
    tx: &mut postgres::Transaction<'_>,
    epoch_unix_ms: i64,
) -> Result<(i64, i64, i64)> {
    tx.execute(PG_INSTANCE_TOKEN, &[])?;
    let row = tx.query_one(PG_NOW, &[])?;
    let first_now: i64 = row.get(0);
    let incarnation: String = row.get(1);
    tx.execute(
        "INSERT INTO snowflake_registry (incarnation, born_unix_ms, epoch_unix_ms) \
         VALUES ($1, $2, $3) ON CONFLICT (singleton) DO NOTHING",
        &[&incarnation, &first_now, &epoch_unix_ms],
    )?;
    let row = tx.query_one(
        "SELECT incarnation, born_unix_ms, epoch_unix_ms, \
                (extract(epoch FROM clock_timestamp()) * 1000)::bigint \
         FROM snowflake_registry FOR UPDATE",
        &[],
    )?;
    let recorded: String = row.get(0);
    let mut born: i64 = row.get(1);
    let epoch: i64 = row.get(2);
    let now: i64 = row.get(3);
    if recorded != incarnation && epoch == epoch_unix_ms {
        tx.execute(
            "UPDATE snowflake_registry SET incarnation = $1, born_unix_ms = $2",
            &[&incarnation, &now],
        )?;
        born = now;
    }
    Ok((now, born, epoch))
}

/// Holds `worker_id` for the request's token: the claim's expiry, the mark (only rises),
/// no released value. `floor`: Some(f) sets the holder's floor (a free grant: f, or None
/// when nothing was recorded), None keeps it (a renewal).
fn pg_hold(
    tx: &mut postgres::Transaction<'_>,
    request: &ClaimRequest<'_>,
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
        "INSERT INTO snowflake_claims AS c \
           (datacenter_id, worker_id, holder, expires_unix_ms, high_water_unix_ms, floor_unix_ms) \
         VALUES ($1, $2, $3, $4, $5, $7) \
         ON CONFLICT (datacenter_id, worker_id) DO UPDATE \
           SET holder = excluded.holder, expires_unix_ms = excluded.expires_unix_ms, \
               high_water_unix_ms = greatest(c.high_water_unix_ms, excluded.high_water_unix_ms), \
               floor_unix_ms = CASE WHEN $6 THEN excluded.floor_unix_ms ELSE c.floor_unix_ms END, \
               released_unix_ms = NULL",
        &[
            &dc,
            &w,
            &request.token,
            &(now + request.ttl_ms as i64),
            &request.cap_unix_ms,
            &set_floor,
            &floor,
        ],
    )?;
    Ok(())
}

/// The floor a free grant of `worker_id` gets (see [`claim::free_grant_floor_unix_ms`]).
fn pg_free_floor(
    tx: &mut postgres::Transaction<'_>,
    datacenter_id: u8,
    worker_id: u8,
) -> Result<Option<i64>> {
    let row = tx.query_opt(
        "SELECT high_water_unix_ms, released_unix_ms FROM snowflake_claims \
         WHERE datacenter_id = $1 AND worker_id = $2",
        &[&i32::from(datacenter_id), &i32::from(worker_id)],
    )?;
    Ok(row.and_then(|r| claim::free_grant_floor_unix_ms(r.get(0), r.get(1))))
}

impl PgRegistry {
    /// Runs one step: the registry row, the epoch and the request's age checked first.
    fn step<R>(
        &mut self,
        request: &ClaimRequest<'_>,
        on_epoch: impl FnOnce(i64) -> Result<R>,
        on_rejected: impl FnOnce(RequestAge) -> R,
        f: impl FnOnce(&mut postgres::Transaction<'_>, i64, i64) -> Result<R>,
    ) -> Result<(R, Observed)> {
        let (reply, now, born) = self.transaction(|tx| {
            let (now, born, epoch) = pg_registry_row(tx, request.epoch_unix_ms)?;
            if epoch != request.epoch_unix_ms {
                return Ok((on_epoch(epoch)?, now, born));
            }
            match request.timing().request_age(request.sent_unix_ms, now) {
                RequestAge::Fresh => Ok((f(tx, now, born)?, now, born)),
                age => Ok((on_rejected(age), now, born)),
            }
        })?;
        let observed = Observed {
            sample: ClockSample {
                sent_unix_ms: request.sent_unix_ms,
                received_unix_ms: wall_ms(),
                registry_unix_ms: now,
            },
            born_unix_ms: born,
        };
        Ok((reply, observed))
    }
}

impl Registry for PgRegistry {
    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<(ClaimReply, Observed)> {
        self.step(
            request,
            |epoch| {
                Ok(ClaimReply::EpochMismatch {
                    registry_epoch_unix_ms: epoch,
                })
            },
            ClaimReply::Rejected,
            |tx, now, born| {
                let rows = tx.query(
                    "SELECT worker_id, holder, floor_unix_ms FROM snowflake_claims \
                     WHERE datacenter_id = $1 AND holder IS NOT NULL AND expires_unix_ms > $2",
                    &[&i32::from(request.datacenter_id), &now],
                )?;
                let live: Vec<(u8, String, Option<i64>)> = rows
                    .iter()
                    .map(|r| (r.get::<_, i32>(0) as u8, r.get(1), r.get(2)))
                    .collect();
                let holders: Vec<(u8, &str)> =
                    live.iter().map(|(w, t, _)| (*w, t.as_str())).collect();
                let settle = request.timing().settle_wait_ms(born, now);
                Ok(
                    match claim::choose_worker(request.order, &holders, request.token, settle) {
                        ClaimChoice::Own(w) => {
                            pg_hold(tx, request, w, now, None)?;
                            ClaimReply::Granted {
                                worker_id: w,
                                granted: Granted::Own,
                                floor_unix_ms: live
                                    .iter()
                                    .find(|(id, _, _)| *id == w)
                                    .and_then(|(_, _, f)| *f),
                            }
                        }
                        ClaimChoice::Free(w) => {
                            let floor = pg_free_floor(tx, request.datacenter_id, w)?;
                            pg_hold(tx, request, w, now, Some(floor))?;
                            ClaimReply::Granted {
                                worker_id: w,
                                granted: Granted::Free,
                                floor_unix_ms: floor,
                            }
                        }
                        ClaimChoice::Settling(wait_ms) => ClaimReply::Settling { wait_ms },
                        ClaimChoice::Exhausted(taken) => ClaimReply::Exhausted { taken },
                    },
                )
            },
        )
    }

    fn renew(
        &mut self,
        request: &ClaimRequest<'_>,
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
            |tx, now, born| {
                let holder: Option<String> = tx
                    .query_opt(
                        "SELECT holder FROM snowflake_claims WHERE datacenter_id = $1 \
                         AND worker_id = $2 AND holder IS NOT NULL AND expires_unix_ms > $3",
                        &[
                            &i32::from(request.datacenter_id),
                            &i32::from(worker_id),
                            &now,
                        ],
                    )?
                    .map(|r| r.get(0));
                let reassert = reassert_known_born
                    .is_some_and(|known| request.timing().may_reassert(known, born, now));
                Ok(match holder {
                    Some(h) if h == request.token => {
                        pg_hold(tx, request, worker_id, now, None)?;
                        RenewReply::Renewed
                    }
                    None if reassert => {
                        pg_hold(tx, request, worker_id, now, Some(None))?;
                        RenewReply::Renewed
                    }
                    other => RenewReply::Lost { holder: other },
                })
            },
        )
    }

    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        token: &str,
        released_unix_ms: Option<i64>,
    ) -> Result<()> {
        self.transaction(|tx| {
            tx.execute(
                "UPDATE snowflake_claims SET holder = NULL, expires_unix_ms = NULL, \
                   released_unix_ms = CASE WHEN $4::bigint IS NULL THEN NULL \
                                          ELSE greatest($4::bigint, floor_unix_ms) END, \
                   high_water_unix_ms = greatest(high_water_unix_ms, $4::bigint, floor_unix_ms) \
                 WHERE datacenter_id = $1 AND worker_id = $2 AND holder = $3",
                &[
                    &i32::from(datacenter_id),
                    &i32::from(worker_id),
                    &token,
                    &released_unix_ms,
                ],
            )?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert_eq!(kind_of("redis://127.0.0.1:6379/0"), Some(Kind::Redis));
        assert_eq!(kind_of("postgresql://u@h:5432/db"), Some(Kind::Postgres));
        assert_eq!(kind_of("postgres://u@h/db"), Some(Kind::Postgres));
        assert_eq!(kind_of("http://x"), None);
    }
}
