//! The Redis registry client (through the `redis` crate): every step is one Lua script, so it
//! is atomic on the server. The records and their rules are described in the parent module.

use std::time::Duration;

use super::{
    wall_ms, ClaimReply, ClaimRequest, Observed, Registry, RegistryError, RenewReply, Result,
};
use snowflake_core::claim::{ClockSample, Granted, RequestAge};

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
    pub(super) fn new(uri: &str, timeout: Duration) -> Result<Self> {
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
