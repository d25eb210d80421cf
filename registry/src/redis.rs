//! The Redis registry client (through the `redis` crate). Every step reads, decides and
//! writes: a script reads what the registry keeps of the datacenter (checking the registry
//! record and the request's age first), the core decides
//! ([`snowflake_core::registry_rules`], the same rules as every other store), and a second
//! script writes the result only if nothing it depends on changed in between: the registry's
//! incarnation, the datacenter's version (raised by every write) and the id's claim. If
//! anything did, the step starts over on a new read, up to [`ATTEMPTS`] times. The records
//! are described in the parent module.

use std::time::{Duration, Instant};

use super::resp::Bounded;
use super::{
    parse_registry_id, wall_ms, ClaimReply, ClaimRequest, Observed, Options, Registry,
    RegistryError, RenewReply, Result,
};
use snowflake_core::claim::{ClockSample, RequestAge, RequestTokens};
use snowflake_core::kvclaims::Marks;
use snowflake_core::layout::MAX_WORKER_ID;
use snowflake_core::registry_rules::{self, ClaimDecision, LiveClaim};
use snowflake_core::registry_uri::parse_multi_host;

/// How often a step starts again after its write found the datacenter changed.
const ATTEMPTS: usize = 5;

/// Reads a datacenter for a decision. First the registry record (incarnation, epoch) and
/// the request's age: a new incarnation means Redis restarted, was replaced, or a replica
/// took over: its data may be older than what holders were told, so it begins again ("born"
/// now) and settles. Every reply starts with a word, `now` (Redis time, ms), `born` and
/// `rid` (the registry's id, made from the first request's token); a view goes on with the
/// datacenter's version and, for every id from 0, its holder, the holder's `claim_ttl`, its
/// floor, high-water mark and released value ('' for none).
///
/// ARGV: 1 incarnation, 2 epoch, 3 dc, 4 the token the request writes, 5 sent, 6 largest
/// lead of `sent` over `now`, 7 largest age (from the core's `ClaimTiming`).
const REDIS_READ: &str = r#"
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
local sent = tonumber(ARGV[5])
if sent - now > tonumber(ARGV[6]) then return {'ahead', now, born, rid} end
if now - sent > tonumber(ARGV[7]) then return {'stale', now, born, rid} end
local dc = ARGV[3]
local out = {'view', now, born, rid, redis.call('GET', 'snowflake:version:' .. dc) or '0'}
for w = 0, MAX_WORKER_ID do
  for _, kind in ipairs({'claim', 'ttl', 'floor', 'high_water', 'released'}) do
    table.insert(out, redis.call('GET', 'snowflake:' .. kind .. ':' .. dc .. ':' .. w) or '')
  end
end
return out
"#;

/// Holds an id for a token, if nothing changed since the read: the registry's incarnation
/// and birth, the id's claim, and for a claim (not a renewal) the datacenter's version; and
/// if the request is still young enough (it may have waited between the read and this
/// write). The claim and the holder's `claim_ttl` expire after `ttl`; the mark only rises;
/// a released value is cleared; the floor is kept, set or deleted. The version rises when
/// an id that was free is held (a claim decided among the datacenter's ids depends on
/// which are held, and by what `claim_ttl`; a renewal changes neither). Replies 'held',
/// 'retry', 'ahead' or 'stale'.
///
/// ARGV: 1 incarnation, 2 born, 3 dc, 4 version ('' for a renewal: not compared), 5 worker,
/// 6 the claim read ('' none), 7 the token to write, 8 ttl, 9 cap, 10 'keep', 'set' or 'del'
/// the floor, 11 the floor, 12 sent, 13 largest lead, 14 largest age.
const REDIS_HOLD: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local m = redis.call('HMGET', 'snowflake:registry', 'born_ms', 'run_id')
if m[2] ~= ARGV[1] or tonumber(m[1]) ~= tonumber(ARGV[2]) then return 'retry' end
local dc, w = ARGV[3], ARGV[5]
local function key(kind) return 'snowflake:' .. kind .. ':' .. dc .. ':' .. w end
local version = 'snowflake:version:' .. dc
if ARGV[4] ~= '' and (redis.call('GET', version) or '0') ~= ARGV[4] then return 'retry' end
if (redis.call('GET', key('claim')) or '') ~= ARGV[6] then return 'retry' end
local sent = tonumber(ARGV[12])
if sent - now > tonumber(ARGV[13]) then return 'ahead' end
if now - sent > tonumber(ARGV[14]) then return 'stale' end
local ttl, cap = tonumber(ARGV[8]), tonumber(ARGV[9])
redis.call('SET', key('claim'), ARGV[7], 'PX', ttl)
redis.call('SET', key('ttl'), ttl, 'PX', ttl)
local prev = tonumber(redis.call('GET', key('high_water')))
if (not prev) or prev < cap then redis.call('SET', key('high_water'), cap) end
redis.call('DEL', key('released'))
if ARGV[10] == 'set' then redis.call('SET', key('floor'), ARGV[11]) end
if ARGV[10] == 'del' then redis.call('DEL', key('floor')) end
if ARGV[6] == '' then redis.call('INCR', version) end
return 'held'
"#;

/// Ends a claim at a release, if the claim is as read (and the id's marks: only a write of
/// that claim changes them): the claim and the holder's `claim_ttl` deleted, the mark and
/// the released value set as the core computed them (`Marks::released`; '' leaves them),
/// and the datacenter's version raised (an id became free). Replies 'released' or 'retry'.
///
/// The mark only rises here too: a renewal retried with the same token (a memory copy of
/// the holder) may have raised it since the read.
///
/// KEYS: claim, high water, released, the holder's claim_ttl, the datacenter's version.
/// ARGV: 1 the claim read, 2 the mark, 3 the released value.
const REDIS_RELEASE: &str = r#"
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 'retry' end
redis.call('DEL', KEYS[1], KEYS[4])
if ARGV[2] ~= '' then
  local hw = tonumber(redis.call('GET', KEYS[2]))
  if (not hw) or hw < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
end
if ARGV[3] ~= '' then redis.call('SET', KEYS[3], ARGV[3]) end
redis.call('INCR', KEYS[5])
return 'released'
"#;

/// One id as [`REDIS_READ`] read it: the holder's token, and the marks (with the holder's
/// `claim_ttl`, from `snowflake:ttl:DC:W`).
#[derive(Debug, Clone, Default)]
struct IdKeys {
    holder: Option<String>,
    marks: Marks,
}

/// A datacenter as [`REDIS_READ`] read it.
struct View {
    now: i64,
    born: i64,
    version: String,
    ids: Vec<IdKeys>,
}

impl View {
    /// The live claims, for the core's rules.
    fn live(&self) -> Vec<LiveClaim<'_>> {
        self.ids
            .iter()
            .enumerate()
            .filter_map(|(w, id)| {
                Some(LiveClaim {
                    worker_id: w as u8,
                    holder: id.holder.as_deref()?,
                    from_before_loss: false,
                    holder_ttl_ms: id.marks.holder_ttl_ms,
                    floor_unix_ms: id.marks.floor_unix_ms,
                    high_water_unix_ms: id.marks.high_water_unix_ms,
                })
            })
            .collect()
    }

    fn id(&self, worker_id: u8) -> IdKeys {
        self.ids
            .get(usize::from(worker_id))
            .cloned()
            .unwrap_or_default()
    }
}

/// What a read gave: a view, or a verdict on the request.
enum Read {
    View(View),
    Epoch(i64),
    Rejected(RequestAge),
}

/// A release's read: the claim, its floor, mark and released value.
type ReleaseRead = (Option<String>, Option<i64>, Option<i64>, Option<i64>);

/// What [`REDIS_HOLD`] does with the floor.
enum FloorWrite {
    Keep,
    Set(Option<i64>),
}

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
    read: redis::Script,
    hold: redis::Script,
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
            Some(file) => Some(super::read_password_file(file, options.effective_uid)?),
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
            read: redis::Script::new(
                &REDIS_READ.replace("MAX_WORKER_ID", &MAX_WORKER_ID.to_string()),
            ),
            hold: redis::Script::new(REDIS_HOLD),
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

    /// The incarnation as the records name it: the server's, and the sentinels' epoch.
    fn incarnation(con: &mut Bounded, sentinel_epoch: Option<i64>) -> Result<String> {
        let incarnation = redis_incarnation(con)?;
        Ok(match sentinel_epoch {
            Some(epoch) => format!("{incarnation}/epoch {epoch}"),
            None => incarnation,
        })
    }

    /// Reads the request's datacenter ([`REDIS_READ`]), with what was observed.
    fn read(
        con: &mut Bounded,
        sentinel_epoch: Option<i64>,
        script: &redis::Script,
        request: &ClaimRequest,
    ) -> Result<(Read, Observed)> {
        let timing = request.timing();
        let value: redis::Value = script
            .prepare_invoke()
            .arg(Self::incarnation(con, sentinel_epoch)?)
            .arg(request.epoch_unix_ms)
            .arg(request.datacenter_id)
            .arg(&request.tokens.write)
            .arg(request.sent_unix_ms)
            .arg(timing.max_request_lead_ms())
            .arg(timing.max_request_age_ms())
            .invoke(con)?;
        let received = wall_ms();
        let redis::Value::Array(items) = value else {
            return Err(RegistryError(format!("unexpected reply {value:?}")));
        };
        let mut items = items.into_iter();
        let mut next = || items.next().unwrap_or(redis::Value::Nil);
        let word: String = redis::from_redis_value(next())?;
        let now: i64 = redis::from_redis_value(next())?;
        let born: i64 = redis::from_redis_value(next())?;
        let registry_id: Option<String> = redis::from_redis_value(next())?;
        let observed = Observed {
            sample: ClockSample {
                sent_unix_ms: request.sent_unix_ms,
                received_unix_ms: received,
                registry_unix_ms: now,
                registry_resolution_ms: 0,
            },
            born_unix_ms: born,
            registry_id: registry_id.as_deref().and_then(parse_registry_id),
            sample_age_ms: 0,
        };
        let read = match word.as_str() {
            "view" => {
                let version = text_of(next())?;
                let mut ids = Vec::with_capacity(usize::from(MAX_WORKER_ID) + 1);
                for _ in 0..=MAX_WORKER_ID {
                    let holder = Some(text_of(next())?).filter(|h| !h.is_empty());
                    let holder_ttl_ms = int_of(next())?.map(|t| t.max(0) as u64);
                    let marks = Marks {
                        floor_unix_ms: int_of(next())?,
                        high_water_unix_ms: int_of(next())?,
                        released_unix_ms: int_of(next())?,
                        holder_ttl_ms,
                    };
                    ids.push(IdKeys { holder, marks });
                }
                Read::View(View {
                    now,
                    born,
                    version,
                    ids,
                })
            }
            "epoch" => Read::Epoch(int_of(next())?.unwrap_or(0)),
            "ahead" => Read::Rejected(RequestAge::Ahead),
            "stale" => Read::Rejected(RequestAge::Stale),
            other => return Err(RegistryError(format!("unexpected reply \"{other}\""))),
        };
        Ok((read, observed))
    }

    /// Holds `worker_id` for the request's token if nothing changed since `view`
    /// ([`REDIS_HOLD`]): 'held', 'retry', 'ahead' or 'stale'. `claim`: how a claim writes
    /// the floor, and that it depends on the datacenter's version; None for a renewal, which
    /// keeps the floor and depends on its own id's claim only (comparing the version made
    /// every renewal of another id a conflict: helper-15 saw a node among 31 holders at a
    /// 20 ms round trip lose its claim three times in 90 s).
    #[allow(clippy::too_many_arguments)]
    fn hold(
        con: &mut Bounded,
        sentinel_epoch: Option<i64>,
        script: &redis::Script,
        request: &ClaimRequest,
        view: &View,
        worker_id: u8,
        claim: Option<FloorWrite>,
    ) -> Result<String> {
        let timing = request.timing();
        let read_holder = view.id(worker_id).holder.unwrap_or_default();
        let (floor_op, floor_value) = match claim {
            None | Some(FloorWrite::Keep) => ("keep", String::new()),
            Some(FloorWrite::Set(Some(f))) => ("set", f.to_string()),
            Some(FloorWrite::Set(None)) => ("del", String::new()),
        };
        let version = match claim {
            Some(_) => view.version.as_str(),
            None => "",
        };
        let word: String = script
            .prepare_invoke()
            .arg(Self::incarnation(con, sentinel_epoch)?)
            .arg(view.born)
            .arg(request.datacenter_id)
            .arg(version)
            .arg(worker_id)
            .arg(read_holder)
            .arg(&request.tokens.write)
            .arg(request.ttl_ms)
            .arg(request.cap_unix_ms)
            .arg(floor_op)
            .arg(floor_value)
            .arg(request.sent_unix_ms)
            .arg(timing.max_request_lead_ms())
            .arg(timing.max_request_age_ms())
            .invoke(con)?;
        Ok(word)
    }

    fn contended() -> RegistryError {
        RegistryError(format!(
            "the Redis registry's keys changed under each of {ATTEMPTS} attempts"
        ))
    }
}

/// A reply's text ('' for nil).
fn text_of(value: redis::Value) -> Result<String> {
    match value {
        redis::Value::Nil => Ok(String::new()),
        v => Ok(redis::from_redis_value(v)?),
    }
}

/// A reply's integer: None for nil or ''.
fn int_of(value: redis::Value) -> Result<Option<i64>> {
    match value {
        redis::Value::Nil => Ok(None),
        redis::Value::BulkString(b) if b.is_empty() => Ok(None),
        v => Ok(Some(redis::from_redis_value(v)?)),
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

impl Registry for RedisRegistry {
    fn claim(&mut self, request: &ClaimRequest) -> Result<(ClaimReply, Observed)> {
        let (read, hold) = (self.read.clone(), self.hold.clone());
        self.with(|con, epoch| {
            for _ in 0..ATTEMPTS {
                let (view, mut observed) = match Self::read(con, epoch, &read, request)? {
                    (Read::View(view), observed) => (view, observed),
                    (Read::Epoch(e), observed) => {
                        let reply = ClaimReply::EpochMismatch {
                            registry_epoch_unix_ms: e,
                        };
                        return Ok((reply, observed));
                    }
                    (Read::Rejected(age), observed) => {
                        return Ok((ClaimReply::Rejected(age), observed))
                    }
                };
                let read_at = Instant::now();
                let settle = request.claim_timing().settle_wait_ms(view.born, view.now);
                let decision = registry_rules::decide_claim(request, settle, &view.live());
                let (worker_id, floor, free_floor) = match decision {
                    ClaimDecision::Own { worker_id, .. } => (worker_id, FloorWrite::Keep, None),
                    ClaimDecision::Free { worker_id } => {
                        let floor = view.id(worker_id).marks.free_grant_floor();
                        (worker_id, FloorWrite::Set(floor), floor)
                    }
                    _ => return Ok((decision.reply(0, None), observed)),
                };
                let written =
                    Self::hold(con, epoch, &hold, request, &view, worker_id, Some(floor))?;
                observed.sample_age_ms = read_at.elapsed().as_millis() as u64;
                match written.as_str() {
                    "held" => return Ok((decision.reply(0, free_floor), observed)),
                    "retry" => continue,
                    "ahead" => return Ok((ClaimReply::Rejected(RequestAge::Ahead), observed)),
                    "stale" => return Ok((ClaimReply::Rejected(RequestAge::Stale), observed)),
                    other => return Err(RegistryError(format!("unexpected reply \"{other}\""))),
                }
            }
            Err(Self::contended())
        })
    }

    fn renew(
        &mut self,
        request: &ClaimRequest,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> Result<(RenewReply, Observed)> {
        let (read, hold) = (self.read.clone(), self.hold.clone());
        self.with(|con, epoch| {
            for _ in 0..ATTEMPTS {
                let (view, mut observed) = match Self::read(con, epoch, &read, request)? {
                    (Read::View(view), observed) => (view, observed),
                    (Read::Epoch(_), _) => {
                        return Err(RegistryError(
                            "the registry now records another epoch for the fleet".into(),
                        ))
                    }
                    (Read::Rejected(age), observed) => {
                        return Ok((RenewReply::Rejected(age), observed))
                    }
                };
                let read_at = Instant::now();
                let reassert = reassert_known_born
                    .is_some_and(|known| request.timing().may_reassert(known, view.born, view.now));
                let live = view.live();
                let own = live.iter().find(|c| c.worker_id == worker_id);
                let high_water = view.id(worker_id).marks.high_water_unix_ms;
                let reply = registry_rules::decide_renew(request, own, high_water, reassert);
                if !matches!(reply, RenewReply::Renewed { .. }) {
                    return Ok((reply, observed));
                }
                // A renewal depends on its own id's claim only: no version compared.
                let written = Self::hold(con, epoch, &hold, request, &view, worker_id, None)?;
                observed.sample_age_ms = read_at.elapsed().as_millis() as u64;
                match written.as_str() {
                    "held" => return Ok((reply, observed)),
                    "retry" => continue,
                    "ahead" => return Ok((RenewReply::Rejected(RequestAge::Ahead), observed)),
                    "stale" => return Ok((RenewReply::Rejected(RequestAge::Stale), observed)),
                    other => return Err(RegistryError(format!("unexpected reply \"{other}\""))),
                }
            }
            Err(Self::contended())
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
            let version = format!("snowflake:version:{datacenter_id}");
            for _ in 0..ATTEMPTS {
                // One MGET: a consistent read of the claim and its marks.
                let (holder, floor, high_water, released): ReleaseRead = redis::cmd("MGET")
                    .arg(key("claim"))
                    .arg(key("floor"))
                    .arg(key("high_water"))
                    .arg(key("released"))
                    .query(con)?;
                if !registry_rules::release_counts(tokens, holder.as_deref()) {
                    return Ok(());
                }
                let marks = Marks {
                    high_water_unix_ms: high_water,
                    floor_unix_ms: floor,
                    released_unix_ms: released,
                    holder_ttl_ms: None,
                }
                .released(released_unix_ms);
                let (mark, value) = match released_unix_ms {
                    Some(_) => (marks.high_water_unix_ms, marks.released_unix_ms),
                    None => (None, None),
                };
                let text = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
                let word: String = script
                    .key(key("claim"))
                    .key(key("high_water"))
                    .key(key("released"))
                    .key(key("ttl"))
                    .key(&version)
                    .arg(holder.unwrap_or_default())
                    .arg(text(mark))
                    .arg(text(value))
                    .invoke(con)?;
                if word != "retry" {
                    return Ok(());
                }
            }
            Err(Self::contended())
        })
    }

    fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
}
