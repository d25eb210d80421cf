//! The Redis registry client (through the `redis` crate): every step is one Lua script, so it
//! is atomic on the server. The records and their rules are described in the parent module.

use std::time::Duration;

use super::resp::Bounded;
use super::{
    parse_registry_id, wall_ms, ClaimReply, ClaimRequest, Observed, Options, Registry,
    RegistryError, RenewReply, Result,
};
use snowflake_core::claim::{ClockSample, Granted, RequestAge, RequestTokens};
use snowflake_core::layout::MAX_WORKER_ID;
use snowflake_core::registry_uri::parse_multi_host;

/// Checks the registry record (incarnation, epoch) and the request's age, and leaves `now`
/// (Redis time, ms) and `born` set. A new incarnation means Redis restarted, was replaced,
/// or a replica took over: its data may be older than what holders were told, so it begins
/// again ("born" now) and settles. Every reply starts with a word, `now`, `born` and `rid`.
///
/// ARGV: 1 incarnation, 2 epoch, 3 dc, 4 the token to write, 5 ttl, 6 cap, 7 sent, 8
/// largest lead of `sent` over `now`, 9 largest age, 10 how long a new incarnation settles
/// (all from the core's `ClaimTiming`, so that the numbers live in one place), 11 and 12
/// the tokens the registry may hold for this server (`RequestTokens::held`: the first, then
/// the others between newlines); then the script's own, from 13.
const REDIS_PRELUDE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reg = 'snowflake:registry'
local m = redis.call('HMGET', reg, 'born_ms', 'run_id', 'epoch_ms', 'id')
local rid = m[4]
if m[3] and m[3] ~= ARGV[2] then return {'epoch', now, 0, rid or '', tonumber(m[3])} end
local born = tonumber(m[1])
if (not born) or m[2] ~= ARGV[1] then
  born = now
  redis.call('HSET', reg, 'born_ms', now, 'run_id', ARGV[1], 'epoch_ms', ARGV[2])
end
if not rid then
  rid = string.sub(ARGV[4], 1, 16)
  redis.call('HSET', reg, 'id', rid)
end
local sent = tonumber(ARGV[7])
if sent - now > tonumber(ARGV[8]) then return {'ahead', now, born, rid} end
if now - sent > tonumber(ARGV[9]) then return {'stale', now, born, rid} end
local dc = ARGV[3]
local function key(kind, w) return 'snowflake:' .. kind .. ':' .. dc .. ':' .. w end
local function mine(v)
  return v == ARGV[4] or v == ARGV[11] or string.find(ARGV[12], '\n' .. v .. '\n', 1, true) ~= nil
end
local function hold(w, token, ttl, cap)
  redis.call('SET', key('claim', w), token, 'PX', ttl)
  redis.call('SET', key('ttl', w), ttl, 'PX', ttl)
  local prev = tonumber(redis.call('GET', key('high_water', w)))
  if (not prev) or prev < cap then redis.call('SET', key('high_water', w), cap) end
  redis.call('DEL', key('released', w))
end
"#;

/// ARGV: the prelude's, then 13 how long a new incarnation settles for this claim (the
/// request's `claim_timing`, at least the prelude's), 14 and 15 the `claim_ttl` range other
/// holders may have (`ClaimTiming::fleet_ttl_range_ms`), then the ids in order (from 16).
const REDIS_CLAIM: &str = r#"
local token = ARGV[4]
local ttl = tonumber(ARGV[5])
local cap = tonumber(ARGV[6])
-- Nothing while settling, not even an own claim: it may come from a restored dump, released
-- or lapsed before another server took the id (see claim::choose_worker).
local wait = born + tonumber(ARGV[13]) - now
if wait > 0 then return {'settling', now, born, rid, wait} end
-- Nothing beside a holder whose claim_ttl is out of range (see claim::ttl_mismatch), among
-- every id of the datacenter (not only those this server asks for: it leaves out ids whose
-- mark is ahead of its clock).
local low, high, lo, hi, off = tonumber(ARGV[14]), tonumber(ARGV[15]), nil, nil, false
for w = 0, MAX_WORKER_ID do
  local holder = redis.call('GET', key('claim', w))
  local t = tonumber(redis.call('GET', key('ttl', w)))
  if holder and (not mine(holder)) and t then
    if (not lo) or t < lo then lo = t end
    if (not hi) or t > hi then hi = t end
    if t < low or t > high then off = true end
  end
end
if off then return {'ttl', now, born, rid, lo, hi} end
for i = 16, #ARGV do
  local w = ARGV[i]
  local holder = redis.call('GET', key('claim', w))
  if holder and mine(holder) then
    local hw = redis.call('GET', key('high_water', w)) or ''
    hold(w, token, ttl, cap)
    return {'own', now, born, rid, tonumber(w), redis.call('GET', key('floor', w)) or '', hw}
  end
end
for i = 16, #ARGV do
  local w = ARGV[i]
  if redis.call('EXISTS', key('claim', w)) == 0 then
    local mark = tonumber(redis.call('GET', key('released', w)) or redis.call('GET', key('high_water', w)))
    hold(w, token, ttl, cap)
    if mark then
      redis.call('SET', key('floor', w), mark + 1)
      return {'free', now, born, rid, tonumber(w), mark + 1}
    end
    redis.call('DEL', key('floor', w))
    return {'free', now, born, rid, tonumber(w)}
  end
end
return {'exhausted', now, born, rid, #ARGV - 15}
"#;

/// ARGV: the prelude's, then 13 worker, 14 the incarnation's birth the holder knows ('' to
/// never re-assert).
const REDIS_RENEW: &str = r#"
local token = ARGV[4]
local w = ARGV[13]
local v = redis.call('GET', key('claim', w))
local hw = redis.call('GET', key('high_water', w)) or ''
if v and mine(v) then
  hold(w, token, tonumber(ARGV[5]), tonumber(ARGV[6]))
  return {'renewed', now, born, rid, hw}
end
local known = tonumber(ARGV[14])
if (not v) and known and known ~= born and born + tonumber(ARGV[10]) > now then
  hold(w, token, tonumber(ARGV[5]), tonumber(ARGV[6]))
  return {'renewed', now, born, rid, hw}
end
if v then return {'lost', now, born, rid, v} end
return {'lost', now, born, rid}
"#;

/// KEYS: claim, high water, released, floor, the holder's claim_ttl. ARGV: released ('' for
/// none), then the holder's tokens (`RequestTokens`: the one it writes, the first held, the
/// others between newlines). The mark only rises; the released value (never below
/// the holder's floor) is the next floor.
const REDIS_RELEASE: &str = r#"
local v = redis.call('GET', KEYS[1])
if not (v and (v == ARGV[2] or v == ARGV[3] or string.find(ARGV[4], '\n' .. v .. '\n', 1, true))) then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[5])
v = tonumber(ARGV[1])
if v then
  local floor = tonumber(redis.call('GET', KEYS[4]))
  if floor and floor > v then v = floor end
  local hw = tonumber(redis.call('GET', KEYS[2]))
  if (not hw) or hw < v then redis.call('SET', KEYS[2], v) end
  redis.call('SET', KEYS[3], v)
end
return 1
"#;

/// A Redis registry: one server, or the master that the sentinels name.
pub struct RedisRegistry {
    target: Target,
    timeout: Duration,
    connection: Option<Bounded>,
    /// Where `connection` goes (host:port), to notice that the sentinels moved the master.
    connected_to: String,
    /// The sentinels' configuration epoch as of this request (see
    /// [`Sentinels::master_address`]); None for one server.
    sentinel_epoch: Option<i64>,
    claim: redis::Script,
    renew: redis::Script,
    release: redis::Script,
    /// The password sent to the Redis servers (not to the sentinels), for
    /// [`Registry::password`].
    password: Option<String>,
}

/// Where requests go.
enum Target {
    /// `redis://` or `rediss://`: this server.
    Direct(Endpoint),
    /// `redis+sentinel://`: the master that a majority of the sentinels name.
    Sentinel(Sentinels),
}

/// The sentinels of a `redis+sentinel://` URI and how to reach the master they name.
struct Sentinels {
    /// One client per sentinel.
    sentinels: Vec<Endpoint>,
    /// Cached connections to them, and whether each sentinel accepted the URI's credentials
    /// (false: it takes no password, so whoever reaches it may have reconfigured it).
    connections: Vec<Option<(Bounded, bool)>>,
    /// The master's name in the sentinels' configuration.
    master: String,
    /// How to reach a Redis server: the URI scheme, credentials, database and TLS.
    server: ServerParams,
}

/// How to reach a Redis server at an address.
#[derive(Clone)]
struct ServerParams {
    tls: Option<Vec<u8>>,
    secure: bool,
    user: String,
    password: Option<String>,
    db: i64,
}

impl ServerParams {
    fn client(&self, host_port: &str) -> Result<Endpoint> {
        let scheme = if self.secure { "rediss" } else { "redis" };
        let mut info = redis::IntoConnectionInfo::into_connection_info(format!(
            "{scheme}://{host_port}/{}",
            self.db
        ))?;
        let mut settings = info.redis_settings().clone();
        if !self.user.is_empty() {
            settings = settings.set_username(&self.user);
        }
        if let Some(p) = &self.password {
            settings = settings.set_password(p);
        }
        info = info.set_redis_settings(settings);
        client_for(info, self.secure, self.tls.as_ref())
    }
}

/// Where and how to connect: a server's address and settings, and the CA's PEM for TLS.
#[derive(Clone)]
struct Endpoint {
    info: redis::ConnectionInfo,
    ca_pem: Option<Vec<u8>>,
}

impl Endpoint {
    /// A connection bounded in time and bytes (see resp.rs).
    fn connect(&self, timeout: Duration) -> Result<Bounded> {
        Bounded::connect(&self.info, self.ca_pem.as_deref(), timeout)
    }
}

/// An endpoint for `info`, trusting the CA's PEM for TLS (the system's CAs without one).
fn client_for(
    info: redis::ConnectionInfo,
    secure: bool,
    ca_pem: Option<&Vec<u8>>,
) -> Result<Endpoint> {
    if secure {
        if let redis::ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
            return Err(RegistryError(
                "rediss://...#insecure turns certificate checks off; a registry reached without them can be impersonated, which breaks uniqueness".into(),
            ));
        }
        Ok(Endpoint {
            info,
            ca_pem: ca_pem.cloned(),
        })
    } else {
        Ok(Endpoint { info, ca_pem: None })
    }
}

impl RedisRegistry {
    pub(super) fn new(uri: &str, options: &Options) -> Result<Self> {
        let lower = uri.trim().to_ascii_lowercase();
        let ca_pem =
            match &options.ca_file {
                Some(file) => Some(std::fs::read(file).map_err(|e| {
                    RegistryError(format!("could not read CA file \"{file}\": {e}"))
                })?),
                None => None,
            };
        let file_password = match &options.password_file {
            Some(file) => Some(super::read_password_file(file)?),
            None => None,
        };
        let (target, password) = if lower.starts_with("redis+sentinel://")
            || lower.starts_with("rediss+sentinel://")
        {
            let parsed = parse_multi_host(uri, 26379).map_err(RegistryError)?;
            let secure = parsed.scheme == "rediss+sentinel";
            let (master, db) = match parsed.path.as_slice() {
                [m] => (m.clone(), 0),
                [m, db] => (
                    m.clone(),
                    db.parse::<i64>().map_err(|_| {
                        RegistryError("the database in a redis+sentinel:// URI must be a number".into())
                    })?,
                ),
                _ => {
                    return Err(RegistryError(
                        "a redis+sentinel:// URI names the master: redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]".into(),
                    ))
                }
            };
            let server = ServerParams {
                tls: ca_pem,
                secure,
                user: parsed.user.clone(),
                password: parsed.password.clone().or(file_password),
                db,
            };
            // The sentinels themselves: TLS like the master; the URI's credentials are sent
            // by master_address (AUTH), as redis-cli -a does, and a sentinel that takes no
            // password is used, but not trusted with the master's password (see there).
            let sentinel_params = ServerParams {
                user: String::new(),
                password: None,
                db: 0,
                ..server.clone()
            };
            let sentinels = parsed
                .hosts
                .iter()
                .map(|h| sentinel_params.client(h))
                .collect::<Result<Vec<_>>>()?;
            let password = server.password.clone();
            let sentinels = Target::Sentinel(Sentinels {
                connections: sentinels.iter().map(|_| None).collect(),
                sentinels,
                master,
                server,
            });
            (sentinels, password)
        } else {
            let mut info = redis::IntoConnectionInfo::into_connection_info(uri)?;
            if info.redis_settings().password().is_none() {
                if let Some(p) = &file_password {
                    let settings = info.redis_settings().clone().set_password(p);
                    info = info.set_redis_settings(settings);
                }
            }
            let secure = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
            let password = info.redis_settings().password().map(str::to_string);
            let client = client_for(info, secure, ca_pem.as_ref())?;
            (Target::Direct(client), password)
        };
        Ok(RedisRegistry {
            target,
            timeout: options.timeout,
            connection: None,
            connected_to: String::new(),
            sentinel_epoch: None,
            claim: redis::Script::new(&format!(
                "{REDIS_PRELUDE}{}",
                REDIS_CLAIM.replace("MAX_WORKER_ID", &MAX_WORKER_ID.to_string())
            )),
            renew: redis::Script::new(&format!("{REDIS_PRELUDE}{REDIS_RENEW}")),
            release: redis::Script::new(REDIS_RELEASE),
            password,
        })
    }

    fn connection(&mut self) -> Result<&mut Bounded> {
        let timeout = self.timeout;
        let (client, address) = match &mut self.target {
            Target::Direct(client) => (client.clone(), String::new()),
            Target::Sentinel(s) => {
                let (address, epoch) = s.master_address(timeout)?;
                self.sentinel_epoch = Some(epoch);
                (s.server.client(&address)?, address)
            }
        };
        if address != self.connected_to {
            // The sentinels moved the master: never write to the old one again.
            self.connection = None;
        }
        if self.connection.is_none() {
            let mut c = client.connect(timeout)?;
            if !address.is_empty() {
                check_is_master(&mut c, &address)?;
            }
            self.connection = Some(c);
            self.connected_to = address;
        }
        Ok(self.connection.as_mut().expect("connected above"))
    }

    /// Runs `f` on the connection, with the sentinels' epoch (see
    /// [`Sentinels::master_address`]); drops the connection after any error.
    fn with<T>(&mut self, f: impl FnOnce(&mut Bounded, Option<i64>) -> Result<T>) -> Result<T> {
        let result = match self.connection() {
            Err(e) => Err(e),
            Ok(_) => {
                let epoch = self.sentinel_epoch;
                match self.connection.as_mut() {
                    Some(con) => f(con, epoch),
                    None => Err(RegistryError("not connected".into())),
                }
            }
        };
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    /// Runs one of the prelude's scripts for `request` with `extra` arguments; returns the
    /// reply's word and the rest, and what was observed.
    fn invoke(
        con: &mut Bounded,
        sentinel_epoch: Option<i64>,
        script: &redis::Script,
        request: &ClaimRequest,
        extra: &[String],
    ) -> Result<(String, Vec<redis::Value>, Observed)> {
        let mut incarnation = redis_incarnation(con)?;
        if let Some(epoch) = sentinel_epoch {
            incarnation = format!("{incarnation}/epoch {epoch}");
        }
        let timing = request.timing();
        let mut invocation = script.prepare_invoke();
        invocation
            .arg(incarnation)
            .arg(request.epoch_unix_ms)
            .arg(request.datacenter_id)
            .arg(&request.tokens.write)
            .arg(request.ttl_ms)
            .arg(request.cap_unix_ms)
            .arg(request.sent_unix_ms)
            .arg(timing.max_request_lead_ms())
            .arg(timing.max_request_age_ms())
            .arg(timing.settle_ms())
            .arg(&request.tokens.held[0])
            .arg(newline_list(&request.tokens.held[1..]));
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
        let registry_id: Option<String> =
            redis::from_redis_value(items.next().unwrap_or(redis::Value::Nil))?;
        let observed = Observed {
            sample: ClockSample {
                sent_unix_ms: request.sent_unix_ms,
                received_unix_ms: received,
                registry_unix_ms: now,
                registry_resolution_ms: 0,
            },
            born_unix_ms: born,
            registry_id: registry_id.as_deref().and_then(parse_registry_id),
        };
        Ok((word, items.collect(), observed))
    }
}

/// What identifies this Redis server's data: its `run_id` (new at every start, so a restart,
/// a restore or a replacement shows) and its replication id (new whenever it is promoted, so
/// a failover shows, even back to a server whose `run_id` the registry recorded earlier:
/// it resynchronized from the other one in between and may have lost writes).
fn redis_incarnation(con: &mut Bounded) -> Result<String> {
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

impl Sentinels {
    /// The master's address (host:port) as more than half of the sentinels name it, and the
    /// highest configuration epoch any of them reports. A minority (a node cut off with an
    /// old master and a stale sentinel) is not followed: the old master may still accept
    /// writes that the new one never sees. The epoch goes up at every failover, and a
    /// majority of the sentinels knows the latest one, so the epoch seen with a majority's
    /// master is never older than that master's election: it is part of the incarnation,
    /// because a master the sentinels elect again without demoting it in between (frozen
    /// during a failover, woken up, then chosen again when the other dies) keeps its run id
    /// and replication id, and its data lacks everything written to the other meanwhile.
    fn master_address(&mut self, timeout: Duration) -> Result<(String, i64)> {
        // (address, sentinels naming it, of which authenticated).
        let mut votes: Vec<(String, usize, usize)> = Vec::new();
        let mut errors = Vec::new();
        let mut epoch = i64::MIN;
        for (client, cached) in self.sentinels.iter().zip(self.connections.iter_mut()) {
            let answer = (|| -> Result<(Vec<String>, bool)> {
                if cached.is_none() {
                    let mut c = client.connect(timeout)?;
                    let authenticated = authenticate_sentinel(&mut c, &self.server)?;
                    *cached = Some((c, authenticated));
                }
                let (con, authenticated) = cached.as_mut().expect("connected above");
                Ok((
                    redis::cmd("SENTINEL")
                        .arg("MASTER")
                        .arg(&self.master)
                        .query(con)?,
                    *authenticated,
                ))
            })();
            match answer {
                Ok((fields, authenticated)) => {
                    let field = |name: &str| {
                        fields
                            .chunks(2)
                            .find(|kv| kv.len() == 2 && kv[0] == name)
                            .map(|kv| kv[1].clone())
                    };
                    let (Some(host), Some(port)) = (field("ip"), field("port")) else {
                        errors.push("a sentinel's answer has no address".into());
                        continue;
                    };
                    if let Some(e) = field("config-epoch").and_then(|e| e.parse::<i64>().ok()) {
                        epoch = epoch.max(e);
                    }
                    let address = if host.contains(':') {
                        format!("[{host}]:{port}")
                    } else {
                        format!("{host}:{port}")
                    };
                    match votes.iter_mut().find(|(a, _, _)| *a == address) {
                        Some((_, n, trusted)) => {
                            *n += 1;
                            *trusted += usize::from(authenticated);
                        }
                        None => votes.push((address, 1, usize::from(authenticated))),
                    }
                }
                Err(e) => {
                    *cached = None;
                    errors.push(e.0);
                }
            }
        }
        let needed = self.sentinels.len() / 2 + 1;
        let (address, _, trusted) = votes
            .into_iter()
            .find(|(_, n, _)| *n >= needed)
            .ok_or_else(|| {
                RegistryError(format!(
                    "fewer than {needed} of the {} sentinels agree on master \"{}\"{}",
                    self.sentinels.len(),
                    self.master,
                    if errors.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", errors.join("; "))
                    }
                ))
            })?;
        // The master's password goes only where a client can tell the master from an
        // impostor: over TLS (rediss+sentinel: the certificate must be valid for the named
        // host under the CA), or to the address a majority of authenticated sentinels name
        // (reconfiguring one takes its password). Otherwise whoever reaches a majority of
        // the sentinels (SENTINEL SET / MONITOR, no password needed) picks who gets it.
        if self.server.password.is_some() && !self.server.secure && trusted < needed {
            return Err(RegistryError(format!(
                "not sending the Redis password to {address}: {trusted} of the sentinels that name it as master accepted the password, {needed} needed (a sentinel that takes no password can be reconfigured by anyone who reaches it), and the connection is not TLS; set requirepass on the sentinels to the master's password, or use rediss+sentinel://"
            )));
        }
        Ok((address, epoch))
    }
}

/// Sends the URI's credentials to a sentinel (as redis-cli -a does): true when it accepted
/// them, false when it takes no password (Redis's answer then: AUTH "called without any
/// password configured", or "no password is set" before Redis 6); a wrong password is an
/// error. Only a sentinel's acceptance counts: a client cannot tell a sentinel that takes
/// no password from one that would take any.
fn authenticate_sentinel(con: &mut Bounded, server: &ServerParams) -> Result<bool> {
    let Some(password) = &server.password else {
        return Ok(false);
    };
    let mut auth = redis::cmd("AUTH");
    if !server.user.is_empty() {
        auth.arg(&server.user);
    }
    auth.arg(password);
    match auth.query::<()>(con) {
        Ok(()) => Ok(true),
        Err(e)
            if e.to_string().contains("without any password configured")
                || e.to_string().contains("no password is set") =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Checks that the server the sentinels named is a master (it may still be starting, or
/// be demoted between the sentinels' answer and the connection).
fn check_is_master(con: &mut Bounded, address: &str) -> Result<()> {
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(con)?;
    let first: String =
        redis::from_redis_value(role.first().cloned().unwrap_or(redis::Value::Nil))?;
    if first != "master" {
        return Err(RegistryError(format!(
            "the server the sentinels name as master ({address}) reports role \"{first}\""
        )));
    }
    Ok(())
}

/// Tokens for a script's plain search of `\n TOKEN \n`: each between newlines (a token has
/// none: hex, `@`, the host name and the port).
fn newline_list(tokens: &[String]) -> String {
    let mut list = String::from("\n");
    for t in tokens {
        list.push_str(t);
        list.push('\n');
    }
    list
}

/// The integer at `i` of a reply's rest: None when absent, nil, or '' (a script's stand-in
/// for nil before a later value: a Lua table ends at its first nil).
fn int_at(rest: &[redis::Value], i: usize) -> Result<Option<i64>> {
    match rest.get(i) {
        None | Some(redis::Value::Nil) => Ok(None),
        Some(redis::Value::BulkString(b)) if b.is_empty() => Ok(None),
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
    fn claim(&mut self, request: &ClaimRequest) -> Result<(ClaimReply, Observed)> {
        let script = self.claim.clone();
        self.with(|con, epoch| {
            let (low, high) = request.timing().fleet_ttl_range_ms();
            let settle = request.claim_timing().settle_ms();
            let args: Vec<String> = [settle, low, high]
                .iter()
                .map(|v| v.to_string())
                .chain(request.order.iter().map(|w| w.to_string()))
                .collect();
            let (word, rest, observed) = Self::invoke(con, epoch, &script, request, &args)?;
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
                    quarantine_ms: 0,
                    inherited_unix_ms: int(2)?,
                },
                "free" => ClaimReply::Granted {
                    worker_id: worker(0)?,
                    granted: Granted::Free,
                    floor_unix_ms: int(1)?,
                    quarantine_ms: 0,
                    inherited_unix_ms: None,
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
                "ttl" => ClaimReply::TtlMismatch {
                    others_min_ms: int(0)?.unwrap_or(0).max(0) as u64,
                    others_max_ms: int(1)?.unwrap_or(0).max(0) as u64,
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
        request: &ClaimRequest,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> Result<(RenewReply, Observed)> {
        let script = self.renew.clone();
        self.with(|con, epoch| {
            let extra = [
                worker_id.to_string(),
                reassert_known_born
                    .map(|b| b.to_string())
                    .unwrap_or_default(),
            ];
            let (word, rest, observed) = Self::invoke(con, epoch, &script, request, &extra)?;
            let reply = match word.as_str() {
                "renewed" => RenewReply::Renewed {
                    inherited_unix_ms: int_at(&rest, 0)?,
                },
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
        tokens: &RequestTokens,
        released_unix_ms: Option<i64>,
    ) -> Result<()> {
        let script = self.release.clone();
        self.with(|con, _| {
            let key = |kind: &str| format!("snowflake:{kind}:{datacenter_id}:{worker_id}");
            let _: i64 = script
                .key(key("claim"))
                .key(key("high_water"))
                .key(key("released"))
                .key(key("floor"))
                .key(key("ttl"))
                .arg(released_unix_ms.map(|v| v.to_string()).unwrap_or_default())
                .arg(&tokens.write)
                .arg(&tokens.held[0])
                .arg(newline_list(&tokens.held[1..]))
                .invoke(con)?;
            Ok(())
        })
    }

    fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
}
