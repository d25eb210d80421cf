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

mod postgres;
mod redis;

use postgres::PgRegistry;
use redis::RedisRegistry;

use snowflake_core::claim::{ClaimTiming, ClockSample, Granted, RequestAge};
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

/// This host's wall clock, Unix ms (the registry clients' clock samples).
fn wall_ms() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
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
