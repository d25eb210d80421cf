//! The registry clients, one file each behind [`Registry`]: Redis, alone or behind Sentinel
//! (`redis.rs`, through the `redis` crate: a Lua script reads, another writes only if nothing
//! changed since), a PostgreSQL coordinator (`postgres.rs`, through the `postgres` crate, one
//! transaction per step, committed synchronously) and etcd (`etcd/`, through
//! `etcd-client`: leases for claims, compare-and-swap transactions for every step). All three
//! decide by the same rules, [`snowflake_core::registry_rules`]. This crate
//! has no pgrx among its dependencies and no `unsafe`, by the compiler: only the extension's
//! registry worker, on its request thread, calls it (`src/fleet/runner.rs`), never a backend
//! and never the postmaster. Each client bounds a request in time and in bytes
//! (docs/registries.md, "Bounds"): the coordinator through a counting socket (`postgres.rs`),
//! Redis and Sentinel through their own connection (`resp.rs`), etcd through tokio's
//! timeouts and tonic's 4 MiB message limit.
//!
//! All keep the same records (see docs/fleets.md):
//! - the registry's id, random, made with its first record and kept by every later one (a
//!   coordinator's is its system identifier, database and table): a server never claims from
//!   another registry of its fleet without a deliberate move (`claim::another_registry`);
//! - the registry's incarnation and when it began ("born"), and the fleet's epoch. The
//!   incarnation changes whenever the registry may have lost writes it acknowledged: any
//!   restart of Redis (its `run_id`) or a promotion of a replica (its `master_replid`); any
//!   restart, crash restart, restore or promotion of the coordinator (its postmaster's start
//!   time and a token in an unlogged table, which crash recovery, a base backup and a
//!   standby all start empty). A new incarnation settles: no free id for one `ttl`;
//! - per (datacenter, worker): the holder's token, expiring `ttl` after its last renewal.
//!   Every grant and renewal writes a new token the holder drew, and is acted on only if the
//!   stored token is one the request names as its own ([`RequestTokens`]): of two copies of
//!   a running server, the second to renew is refused;
//! - per (datacenter, worker): the high-water mark, the highest cap ever granted (Unix ms),
//!   which only rises; the floor handed to the current holder; and what the last holder
//!   recorded at a clean release (the next holder's floor instead of the mark).
//!
//! Every request carries the holder's clock at its send; the registry writes nothing for a
//! request whose clock is ahead of its own by more than the allowed skew, or that arrives
//! too late to be inside the fence it would renew ([`ClaimTiming::request_age`]).

#![forbid(unsafe_code)]

use std::time::Duration;

mod etcd;
mod postgres;
mod redis;
mod resp;

use etcd::EtcdRegistry;
use postgres::PgRegistry;
use redis::RedisRegistry;

use snowflake_core::claim::RequestTokens;
use snowflake_core::secrets::{redacted, without_secrets};

/// A failed request, as text for the log and for callers' DETAIL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryError(pub String);

impl<E: std::error::Error> From<E> for RegistryError {
    /// The error with its chain of causes: some client libraries (the `postgres` crate)
    /// keep the cause, such as `certificate verify failed` or `Connection refused`, out of
    /// their own text.
    fn from(e: E) -> Self {
        let mut text = e.to_string();
        let mut source = e.source();
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !cause_text.is_empty() && !text.contains(&cause_text) {
                text = format!("{text}: {cause_text}");
            }
            source = cause.source();
        }
        RegistryError(text)
    }
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, RegistryError>;

pub use snowflake_core::protocol::{ClaimReply, ClaimRequest, Observed, RenewReply};

/// A new registry's id: the first 16 hex digits of the random token the request writes.
fn new_registry_id(tokens: &RequestTokens) -> u64 {
    parse_registry_id(&tokens.write).unwrap_or(0)
}

/// A registry id from its first 16 hex digits (None: not hex).
fn parse_registry_id(text: &str) -> Option<u64> {
    u64::from_str_radix(text.get(..16)?, 16).ok()
}

/// One registry. Every call is one request (or one transaction) bounded by the timeout.
pub trait Registry: Send {
    /// Claims an id.
    fn claim(&mut self, request: &ClaimRequest) -> Result<(ClaimReply, Observed)>;
    /// Renews `worker_id`, recording `cap_unix_ms`. With `reassert_known_born` (the
    /// incarnation's birth this holder last saw), takes the claim back if the registry lost
    /// it since, while it still settles ([`ClaimTiming::may_reassert`]).
    fn renew(
        &mut self,
        request: &ClaimRequest,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> Result<(RenewReply, Observed)>;
    /// Releases `worker_id` if one of `tokens` holds it. `released_unix_ms`: the highest
    /// timestamp this holder could have issued, the next holder's floor (None: leave the
    /// id's mark as it is, for a claim given back unused).
    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        tokens: &RequestTokens,
        released_unix_ms: Option<i64>,
    ) -> Result<()>;
    /// The password this client sends (from the URI or a password file), which no error
    /// may show.
    fn password(&self) -> Option<&str>;
}

/// Which kind of registry a `snowflake.registry` URI names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `redis://` or `rediss://` (TLS).
    Redis,
    /// `redis+sentinel://` or `rediss+sentinel://` (TLS to the sentinels and the master).
    Sentinel,
    /// `postgresql://` or `postgres://`.
    Postgres,
    /// `etcd://` or `etcds://` (TLS).
    Etcd,
}

/// The kind of registry `uri` names, or None.
pub fn kind_of(uri: &str) -> Option<Kind> {
    let lower = uri.trim().to_ascii_lowercase();
    let scheme = lower.split_once("://")?.0;
    match scheme {
        "redis" | "rediss" => Some(Kind::Redis),
        "redis+sentinel" | "rediss+sentinel" => Some(Kind::Sentinel),
        "postgresql" | "postgres" => Some(Kind::Postgres),
        "etcd" | "etcds" => Some(Kind::Etcd),
        _ => None,
    }
}

/// How a client connects, besides its URI.
#[derive(Debug, Clone)]
pub struct Options {
    /// Every request's bound.
    pub timeout: Duration,
    /// `snowflake.registry_ca_file`: the CA certificates (PEM) that TLS connections trust
    /// (`rediss://`, `etcds://`, and the coordinator's `sslrootcert` when it names none).
    pub ca_file: Option<String>,
    /// `snowflake.registry_password_file`: the password, so that it need not be in the URI
    /// (the first line for Redis and etcd; `.pgpass` lines for the coordinator).
    pub password_file: Option<String>,
    /// The effective uid of the calling process (`geteuid()`), which a password file's owner
    /// must be (or root): given by the caller, so that this crate needs no `unsafe`.
    pub effective_uid: u32,
}

/// Opens a client for `uri` (connecting lazily). Every error it returns, now and from its
/// requests, has the URI's secrets and the password the client sends removed: client
/// libraries may quote what they parsed. (Opening reads the password file but sends
/// nothing, so its own errors can only quote the URI.)
pub fn open(uri: &str, options: &Options) -> Result<Box<dyn Registry>> {
    let opened: Result<Box<dyn Registry>> = match kind_of(uri) {
        Some(Kind::Redis | Kind::Sentinel) => {
            RedisRegistry::new(uri, options).map(|r| Box::new(r) as _)
        }
        Some(Kind::Postgres) => PgRegistry::new(uri, options).map(|r| Box::new(r) as _),
        Some(Kind::Etcd) => EtcdRegistry::new(uri, options).map(|r| Box::new(r) as _),
        None => Err(RegistryError(format!(
            "unsupported registry URI \"{}\"",
            redacted(uri)
        ))),
    };
    match opened {
        Ok(inner) => Ok(Box::new(WithoutSecrets {
            secrets: inner.password().map(str::to_string).into_iter().collect(),
            inner,
            uri: uri.to_string(),
        })),
        Err(e) => Err(e.without_secrets_of(uri, &[])),
    }
}

/// Reads `snowflake.registry_password_file` (see [`read_private_file`]: PostgreSQL's rule for
/// `ssl_key_file`). Returns the first line.
pub(crate) fn read_password_file(path: &str, effective_uid: u32) -> Result<String> {
    Ok(snowflake_core::registry_uri::password_from_file(
        &read_private_file(path, true, effective_uid)?,
    ))
}

/// Reads a file holding secrets, after checking that it is a regular file and private
/// ([`snowflake_core::secrets::private_file_allowed`], `root_may_share_with_group` as there).
/// The checks are made on the file opened (fstat), so the file read is the file checked; the
/// open does not block (a FIFO is refused, not waited on).
pub(crate) fn read_private_file(
    path: &str,
    root_may_share_with_group: bool,
    effective_uid: u32,
) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let unreadable =
        |e: std::io::Error| RegistryError(format!("could not read password file \"{path}\": {e}"));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(RegistryError(format!(
            "password file \"{path}\" is not a regular file"
        )));
    }
    snowflake_core::secrets::private_file_allowed(
        meta.uid(),
        effective_uid,
        meta.mode(),
        root_may_share_with_group,
    )
    .map_err(|why| RegistryError(format!("password file \"{path}\" is not private: {why}")))?;
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(unreadable)?;
    Ok(text)
}

/// A TLS connector that verifies the server's certificate and host name against the CA
/// file (or the system's trusted certificates without one), and the CA file's PEM.
pub(crate) fn tls_connector(
    ca_file: Option<&str>,
) -> Result<(openssl::ssl::SslConnector, Option<Vec<u8>>)> {
    let (builder, pem) = tls_connector_builder(ca_file)?;
    Ok((builder.build(), pem))
}

/// [`tls_connector`]'s builder: with a CA file, every certificate of the file and nothing
/// else is trusted (the store it verifies with replaces the system's, which
/// `SslConnector::builder` loads), as libpq, redis-cli and etcdctl do with their CA file.
pub(crate) fn tls_connector_builder(
    ca_file: Option<&str>,
) -> Result<(openssl::ssl::SslConnectorBuilder, Option<Vec<u8>>)> {
    let mut builder = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())?;
    let pem = match ca_file {
        Some(file) => {
            let pem = std::fs::read(file)
                .map_err(|e| RegistryError(format!("could not read CA file \"{file}\": {e}")))?;
            builder.set_verify_cert_store(ca_store(file, &pem)?)?;
            Some(pem)
        }
        None => None,
    };
    builder.set_verify(openssl::ssl::SslVerifyMode::PEER);
    Ok((builder, pem))
}

/// A certificate store holding every certificate of the PEM text `pem` (of CA file `file`).
pub(crate) fn ca_store(file: &str, pem: &[u8]) -> Result<openssl::x509::store::X509Store> {
    let mut store = openssl::x509::store::X509StoreBuilder::new()?;
    let certs = openssl::x509::X509::stack_from_pem(pem)
        .map_err(|e| RegistryError(format!("CA file \"{file}\" holds no PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(RegistryError(format!(
            "CA file \"{file}\" holds no PEM certificate"
        )));
    }
    for cert in certs {
        store.add_cert(cert)?;
    }
    Ok(store.build())
}

impl RegistryError {
    fn without_secrets_of(self, uri: &str, secrets: &[String]) -> RegistryError {
        let mut text = without_secrets(&self.0, uri);
        let mut secrets: Vec<&String> = secrets.iter().filter(|s| s.len() >= 4).collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        for secret in secrets {
            text = text.replace(secret.as_str(), snowflake_core::secrets::MASK);
        }
        RegistryError(text)
    }
}

/// A registry whose errors never carry the URI's secrets or the password file's.
struct WithoutSecrets {
    inner: Box<dyn Registry>,
    uri: String,
    secrets: Vec<String>,
}

impl Registry for WithoutSecrets {
    fn claim(&mut self, request: &ClaimRequest) -> Result<(ClaimReply, Observed)> {
        self.inner
            .claim(request)
            .map_err(|e| e.without_secrets_of(&self.uri, &self.secrets))
    }

    fn renew(
        &mut self,
        request: &ClaimRequest,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> Result<(RenewReply, Observed)> {
        self.inner
            .renew(request, worker_id, reassert_known_born)
            .map_err(|e| e.without_secrets_of(&self.uri, &self.secrets))
    }

    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        tokens: &RequestTokens,
        released_unix_ms: Option<i64>,
    ) -> Result<()> {
        self.inner
            .release(datacenter_id, worker_id, tokens, released_unix_ms)
            .map_err(|e| e.without_secrets_of(&self.uri, &self.secrets))
    }

    fn password(&self) -> Option<&str> {
        self.inner.password()
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
    fn errors_keep_their_causes() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error performing TLS handshake")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e: RegistryError = Outer(std::io::Error::other("certificate verify failed")).into();
        assert_eq!(
            e.0,
            "error performing TLS handshake: certificate verify failed"
        );
    }

    #[test]
    fn kinds() {
        assert_eq!(kind_of("redis://127.0.0.1:6379/0"), Some(Kind::Redis));
        assert_eq!(kind_of("postgresql://u@h:5432/db"), Some(Kind::Postgres));
        assert_eq!(kind_of("postgres://u@h/db"), Some(Kind::Postgres));
        assert_eq!(kind_of("rediss://h"), Some(Kind::Redis));
        assert_eq!(kind_of("redis+sentinel://h/m"), Some(Kind::Sentinel));
        assert_eq!(kind_of("etcds://h"), Some(Kind::Etcd));
        assert_eq!(kind_of("http://x"), None);
    }
}
