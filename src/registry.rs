//! The registry clients: Redis (through the `redis` crate, with Lua scripts so that every
//! step is atomic on the server) and a PostgreSQL coordinator (through the `postgres` crate,
//! one transaction per step). No pgrx here: only the background worker calls this, never a
//! backend and never the postmaster.
//!
//! Both keep the same records (see the README, "Fleets"):
//! - the registry's incarnation and when it began ("born"), and the fleet's epoch;
//! - per (datacenter, worker): the holder's token, expiring `ttl` after its last renewal;
//! - per (datacenter, worker): the high-water mark, the highest cap ever granted (Unix ms).

use std::time::Duration;

use snowflake_core::claim::{self, ClaimChoice, ClockSample, Granted};
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

/// What a claim asks for.
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
    /// The cap this claim grants if it succeeds (Unix ms): recorded as high-water mark.
    pub cap_unix_ms: i64,
    /// The fleet's epoch (Unix ms).
    pub epoch_unix_ms: i64,
}

/// The registry's answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimReply {
    /// The id is this server's now.
    Granted {
        /// The worker id.
        worker_id: u8,
        /// Own (re-asserted) or free (with the earlier high-water mark).
        granted: Granted,
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
}

/// One registry. Every call is one request (or one transaction) bounded by the timeout.
pub trait Registry {
    /// Claims an id.
    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<(ClaimReply, ClockSample)>;
    /// Renews `worker_id`, recording `cap_unix_ms`; with `may_reassert`, takes it back if
    /// the registry lost it.
    fn renew(
        &mut self,
        request: &ClaimRequest<'_>,
        worker_id: u8,
        may_reassert: bool,
    ) -> Result<(RenewReply, ClockSample)>;
    /// Releases `worker_id` if this token holds it, leaving `high_water_unix_ms` as its mark.
    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        token: &str,
        high_water_unix_ms: i64,
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
    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<(ClaimReply, ClockSample)> {
        self.inner
            .claim(request)
            .map_err(|e| e.without_secrets_of(&self.uri))
    }

    fn renew(
        &mut self,
        request: &ClaimRequest<'_>,
        worker_id: u8,
        may_reassert: bool,
    ) -> Result<(RenewReply, ClockSample)> {
        self.inner
            .renew(request, worker_id, may_reassert)
            .map_err(|e| e.without_secrets_of(&self.uri))
    }

    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        token: &str,
        high_water_unix_ms: i64,
    ) -> Result<()> {
        self.inner
            .release(datacenter_id, worker_id, token, high_water_unix_ms)
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

/// Checks the registry record (incarnation, epoch) and leaves `now` (Redis time, ms) and
/// `born` set. A new `run_id` means Redis restarted or was replaced: its data may be older
/// than what holders were told, so it begins again ("born" now) and settles.
const REDIS_PRELUDE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reg = 'snowflake:registry'
local m = redis.call('HMGET', reg, 'born_ms', 'run_id', 'epoch_ms')
if m[3] and m[3] ~= ARGV[2] then return {'epoch', now, tonumber(m[3])} end
local born = tonumber(m[1])
if (not born) or m[2] ~= ARGV[1] then
  born = now
  redis.call('HSET', reg, 'born_ms', now, 'run_id', ARGV[1], 'epoch_ms', ARGV[2])
end
local dc = ARGV[3]
local function ck(w) return 'snowflake:claim:' .. dc .. ':' .. w end
local function hk(w) return 'snowflake:high_water:' .. dc .. ':' .. w end
local function hold(w, token, ttl, cap)
  redis.call('SET', ck(w), token, 'PX', ttl)
  local prev = redis.call('GET', hk(w))
  if (not prev) or tonumber(prev) < cap then redis.call('SET', hk(w), cap) end
  return prev
end
"#;

/// ARGV: run_id, epoch, dc, token, ttl, cap, then the ids in order.
const REDIS_CLAIM: &str = r#"
local token = ARGV[4]
local ttl = tonumber(ARGV[5])
local cap = tonumber(ARGV[6])
for i = 7, #ARGV do
  if redis.call('GET', ck(ARGV[i])) == token then
    hold(ARGV[i], token, ttl, cap)
    return {'own', now, tonumber(ARGV[i])}
  end
end
local wait = born + ttl - now
if wait > 0 then return {'settling', now, wait} end
for i = 7, #ARGV do
  if redis.call('EXISTS', ck(ARGV[i])) == 0 then
    local prev = hold(ARGV[i], token, ttl, cap)
    if prev then return {'free', now, tonumber(ARGV[i]), tonumber(prev)} end
    return {'free', now, tonumber(ARGV[i])}
  end
end
return {'exhausted', now, #ARGV - 6}
"#;

/// ARGV: run_id, epoch, dc, token, ttl, cap, worker, may_reassert.
const REDIS_RENEW: &str = r#"
local token = ARGV[4]
local v = redis.call('GET', ck(ARGV[7]))
if v == token or ((not v) and ARGV[8] == '1') then
  hold(ARGV[7], token, tonumber(ARGV[5]), tonumber(ARGV[6]))
  return {'renewed', now}
end
if v then return {'lost', now, v} end
return {'lost', now}
"#;

/// KEYS: claim, high water. ARGV: token, high water.
const REDIS_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0
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
}

/// The server's `run_id`, which changes whenever Redis restarts.
fn redis_run_id(con: &mut redis::Connection) -> Result<String> {
    let info: String = redis::cmd("INFO").arg("server").query(con)?;
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|s| s.trim().to_string())
        .ok_or_else(|| RegistryError("INFO server has no run_id".into()))
}

/// Reads one reply of the scripts: a word, Redis time, then integers or a text.
fn reply_parts(value: redis::Value) -> Result<(String, i64, Vec<redis::Value>)> {
    let redis::Value::Array(items) = value else {
        return Err(RegistryError(format!("unexpected reply {value:?}")));
    };
    let mut items = items.into_iter();
    let word: String = redis::from_redis_value(items.next().unwrap_or(redis::Value::Nil))?;
    let now: i64 = redis::from_redis_value(items.next().unwrap_or(redis::Value::Nil))?;
    Ok((word, now, items.collect()))
}

fn int_at(rest: &[redis::Value], i: usize) -> Result<Option<i64>> {
    match rest.get(i) {
        None | Some(redis::Value::Nil) => Ok(None),
        Some(v) => Ok(Some(redis::from_redis_value(v.clone())?)),
    }
}

fn base_args(
    invocation: &mut redis::ScriptInvocation<'_>,
    run_id: &str,
    request: &ClaimRequest<'_>,
) {
    invocation
        .arg(run_id)
        .arg(request.epoch_unix_ms)
        .arg(request.datacenter_id)
        .arg(request.token)
        .arg(request.ttl_ms)
        .arg(request.cap_unix_ms);
}

impl Registry for RedisRegistry {
    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<(ClaimReply, ClockSample)> {
        let script = self.claim.clone();
        self.with(|con| {
            let run_id = redis_run_id(con)?;
            let sent = wall_ms();
            let mut invocation = script.prepare_invoke();
            base_args(&mut invocation, &run_id, request);
            for w in request.order {
                invocation.arg(*w);
            }
            let value: redis::Value = invocation.invoke(con)?;
            let received = wall_ms();
            let (word, now, rest) = reply_parts(value)?;
            let sample = ClockSample {
                sent_unix_ms: sent,
                received_unix_ms: received,
                registry_unix_ms: now,
            };
            let int = |i| int_at(&rest, i);
            let reply = match word.as_str() {
                "own" => ClaimReply::Granted {
                    worker_id: int(0)?.unwrap_or(-1) as u8,
                    granted: Granted::Own,
                },
                "free" => ClaimReply::Granted {
                    worker_id: int(0)?.unwrap_or(-1) as u8,
                    granted: Granted::Free {
                        high_water_unix_ms: int(1)?,
                    },
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
                other => return Err(RegistryError(format!("unexpected reply \"{other}\""))),
            };
            Ok((reply, sample))
        })
    }

    fn renew(
        &mut self,
        request: &ClaimRequest<'_>,
        worker_id: u8,
        may_reassert: bool,
    ) -> Result<(RenewReply, ClockSample)> {
        let script = self.renew.clone();
        self.with(|con| {
            let run_id = redis_run_id(con)?;
            let sent = wall_ms();
            let mut invocation = script.prepare_invoke();
            base_args(&mut invocation, &run_id, request);
            invocation
                .arg(worker_id)
                .arg(if may_reassert { "1" } else { "0" });
            let value: redis::Value = invocation.invoke(con)?;
            let received = wall_ms();
            let (word, now, rest) = reply_parts(value)?;
            let sample = ClockSample {
                sent_unix_ms: sent,
                received_unix_ms: received,
                registry_unix_ms: now,
            };
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
                other => return Err(RegistryError(format!("unexpected reply \"{other}\""))),
            };
            Ok((reply, sample))
        })
    }

    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        token: &str,
        high_water_unix_ms: i64,
    ) -> Result<()> {
        let script = self.release.clone();
        self.with(|con| {
            let _: i64 = script
                .key(format!("snowflake:claim:{datacenter_id}:{worker_id}"))
                .key(format!("snowflake:high_water:{datacenter_id}:{worker_id}"))
                .arg(token)
                .arg(high_water_unix_ms)
                .invoke(con)?;
            Ok(())
        })
    }
}

// ---------------------------------------------------------------------------------------
// PostgreSQL coordinator

/// The coordinator's tables, created on first use (also in the README).
pub const COORDINATOR_DDL: &str = "\
CREATE TABLE IF NOT EXISTS snowflake_registry (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    incarnation   text    NOT NULL,
    born_unix_ms  bigint  NOT NULL,
    epoch_unix_ms bigint  NOT NULL
);
CREATE TABLE IF NOT EXISTS snowflake_claims (
    datacenter_id      integer NOT NULL,
    worker_id          integer NOT NULL,
    holder             text,
    expires_unix_ms    bigint,
    high_water_unix_ms bigint,
    PRIMARY KEY (datacenter_id, worker_id)
);";

/// Whether both tables exist (on the connection's search_path).
const COORDINATOR_TABLES_PRESENT: &str = "SELECT to_regclass('snowflake_registry') IS NOT NULL \
                                          AND to_regclass('snowflake_claims') IS NOT NULL";

/// The coordinator's clock (ms) and incarnation: its postmaster's start time, which changes
/// whenever it restarts, is replaced by a standby, or is restored from a backup.
const PG_NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint, \
                      pg_postmaster_start_time()::text";

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
        config
            .connect_timeout(timeout)
            .tcp_user_timeout(timeout)
            .keepalives_idle(Duration::from_secs(5))
            .application_name("snowflake registry")
            .options(&format!(
                "-c statement_timeout={ms} -c lock_timeout={ms} -c idle_in_transaction_session_timeout={}",
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
        if !self.created {
            // Only when a table is missing: CREATE ... IF NOT EXISTS still needs CREATE on
            // the schema, which a least-privilege registry role does not have.
            let present: bool = client.query_one(COORDINATOR_TABLES_PRESENT, &[])?.get(0);
            if !present {
                client.batch_execute(COORDINATOR_DDL)?;
            }
            self.created = true;
        }
        let result = (|| {
            let mut tx = client.transaction()?;
            let value = f(&mut tx)?;
            tx.commit()?;
            Ok(value)
        })();
        if result.is_err() {
            self.client = None;
        }
        result
    }
}

/// Locks the registry row, renews the incarnation if the coordinator changed, and returns
/// (now, born, recorded epoch).
fn pg_registry_row(
    tx: &mut postgres::Transaction<'_>,
    epoch_unix_ms: i64,
) -> Result<(i64, i64, i64)> {
    let row = tx.query_one(PG_NOW, &[])?;
    let now: i64 = row.get(0);
    let incarnation: String = row.get(1);
    tx.execute(
        "INSERT INTO snowflake_registry (incarnation, born_unix_ms, epoch_unix_ms) \
         VALUES ($1, $2, $3) ON CONFLICT (singleton) DO NOTHING",
        &[&incarnation, &now, &epoch_unix_ms],
    )?;
    let row = tx.query_one(
        "SELECT incarnation, born_unix_ms, epoch_unix_ms FROM snowflake_registry FOR UPDATE",
        &[],
    )?;
    let recorded: String = row.get(0);
    let mut born: i64 = row.get(1);
    let epoch: i64 = row.get(2);
    if recorded != incarnation && epoch == epoch_unix_ms {
        tx.execute(
            "UPDATE snowflake_registry SET incarnation = $1, born_unix_ms = $2",
            &[&incarnation, &now],
        )?;
        born = now;
    }
    Ok((now, born, epoch))
}

fn pg_hold(
    tx: &mut postgres::Transaction<'_>,
    request: &ClaimRequest<'_>,
    worker_id: u8,
    now: i64,
) -> Result<Option<i64>> {
    let dc = i32::from(request.datacenter_id);
    let w = i32::from(worker_id);
    let previous = tx
        .query_opt(
            "SELECT high_water_unix_ms FROM snowflake_claims \
             WHERE datacenter_id = $1 AND worker_id = $2",
            &[&dc, &w],
        )?
        .and_then(|r| r.get::<_, Option<i64>>(0));
    tx.execute(
        "INSERT INTO snowflake_claims AS c \
           (datacenter_id, worker_id, holder, expires_unix_ms, high_water_unix_ms) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (datacenter_id, worker_id) DO UPDATE \
           SET holder = excluded.holder, expires_unix_ms = excluded.expires_unix_ms, \
               high_water_unix_ms = greatest(c.high_water_unix_ms, excluded.high_water_unix_ms)",
        &[
            &dc,
            &w,
            &request.token,
            &(now + request.ttl_ms as i64),
            &request.cap_unix_ms,
        ],
    )?;
    Ok(previous)
}

impl Registry for PgRegistry {
    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<(ClaimReply, ClockSample)> {
        let sent = wall_ms();
        let (reply, now) = self.transaction(|tx| {
            let (now, born, epoch) = pg_registry_row(tx, request.epoch_unix_ms)?;
            if epoch != request.epoch_unix_ms {
                let reply = ClaimReply::EpochMismatch {
                    registry_epoch_unix_ms: epoch,
                };
                return Ok((reply, now));
            }
            let rows = tx.query(
                "SELECT worker_id, holder FROM snowflake_claims \
                 WHERE datacenter_id = $1 AND holder IS NOT NULL AND expires_unix_ms > $2",
                &[&i32::from(request.datacenter_id), &now],
            )?;
            let live: Vec<(u8, String)> = rows
                .iter()
                .map(|r| (r.get::<_, i32>(0) as u8, r.get::<_, String>(1)))
                .collect();
            let live: Vec<(u8, &str)> = live.iter().map(|(w, t)| (*w, t.as_str())).collect();
            let settle = claim::ClaimTiming::new(request.ttl_ms).settle_wait_ms(born, now);
            let reply = match claim::choose_worker(request.order, &live, request.token, settle) {
                ClaimChoice::Own(w) => {
                    pg_hold(tx, request, w, now)?;
                    ClaimReply::Granted {
                        worker_id: w,
                        granted: Granted::Own,
                    }
                }
                ClaimChoice::Free(w) => ClaimReply::Granted {
                    worker_id: w,
                    granted: Granted::Free {
                        high_water_unix_ms: pg_hold(tx, request, w, now)?,
                    },
                },
                ClaimChoice::Settling(wait_ms) => ClaimReply::Settling { wait_ms },
                ClaimChoice::Exhausted(taken) => ClaimReply::Exhausted { taken },
            };
            Ok((reply, now))
        })?;
        let sample = ClockSample {
            sent_unix_ms: sent,
            received_unix_ms: wall_ms(),
            registry_unix_ms: now,
        };
        Ok((reply, sample))
    }

    fn renew(
        &mut self,
        request: &ClaimRequest<'_>,
        worker_id: u8,
        may_reassert: bool,
    ) -> Result<(RenewReply, ClockSample)> {
        let sent = wall_ms();
        let (reply, now) = self.transaction(|tx| {
            let (now, _, epoch) = pg_registry_row(tx, request.epoch_unix_ms)?;
            if epoch != request.epoch_unix_ms {
                return Err(RegistryError(
                    "the registry now records another epoch for the fleet".into(),
                ));
            }
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
            let reply = match holder {
                Some(h) if h == request.token => {
                    pg_hold(tx, request, worker_id, now)?;
                    RenewReply::Renewed
                }
                None if may_reassert => {
                    pg_hold(tx, request, worker_id, now)?;
                    RenewReply::Renewed
                }
                other => RenewReply::Lost { holder: other },
            };
            Ok((reply, now))
        })?;
        let sample = ClockSample {
            sent_unix_ms: sent,
            received_unix_ms: wall_ms(),
            registry_unix_ms: now,
        };
        Ok((reply, sample))
    }

    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        token: &str,
        high_water_unix_ms: i64,
    ) -> Result<()> {
        self.transaction(|tx| {
            tx.execute(
                "UPDATE snowflake_claims SET holder = NULL, expires_unix_ms = NULL, \
                   high_water_unix_ms = $4 \
                 WHERE datacenter_id = $1 AND worker_id = $2 AND holder = $3",
                &[
                    &i32::from(datacenter_id),
                    &i32::from(worker_id),
                    &token,
                    &high_water_unix_ms,
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
