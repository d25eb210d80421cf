//! The PostgreSQL coordinator client (through the `postgres` crate): one transaction per
//! step, committed synchronously. The records and their rules are described in the parent
//! module.

use std::time::Duration;

use super::{
    wall_ms, ClaimReply, ClaimRequest, Observed, Options, Registry, RegistryError, RenewReply,
    Result,
};
use snowflake_core::claim::{self, ClaimChoice, ClockSample, Granted, RequestAge};
use snowflake_core::registry_uri::{pgpass_lookup, split_libpq_extras, LibpqExtras};

/// The coordinator's tables, created on first use (also in docs/registries.md). The unlogged table
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
    tls: postgres_openssl::MakeTlsConnector,
    client: Option<postgres::Client>,
    created: bool,
}

impl PgRegistry {
    pub(super) fn new(uri: &str, options: &Options) -> Result<Self> {
        let extras = split_libpq_extras(uri.trim()).map_err(RegistryError)?;
        let mut config: postgres::Config = extras.uri.parse()?;
        let timeout = options.timeout;
        let ms = timeout.as_millis();
        // synchronous_commit = on: a claim is acknowledged only once it survives a crash of
        // the coordinator (and reached its synchronous standbys), whatever the server's
        // default says.
        config
            .connect_timeout(timeout)
            .tcp_user_timeout(timeout)
            .keepalives_idle(Duration::from_secs(5))
            .application_name("snowflake registry")
            .ssl_mode(match extras.sslmode.as_str() {
                "disable" => postgres::config::SslMode::Disable,
                "allow" | "prefer" => postgres::config::SslMode::Prefer,
                _ => postgres::config::SslMode::Require,
            })
            .options(&format!(
                "-c synchronous_commit=on -c statement_timeout={ms} -c lock_timeout={ms} -c idle_in_transaction_session_timeout={}",
                ms * 2
            ));
        if config.get_password().is_none() {
            if let Some(password) = pgpass_password(&config, &extras, options)? {
                config.password(password);
            }
        }
        let tls = pg_tls(&extras, options)?;
        Ok(PgRegistry {
            config,
            tls,
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
            self.client = Some(self.config.connect(self.tls.clone())?);
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

/// The password from a `.pgpass`-style file, as libpq finds it: the URI's `passfile`, else
/// `snowflake.registry_password_file`, else `PGPASSFILE`, else `~/.pgpass` of the server's
/// OS user (only when it exists). The first host of the URI that has an entry gives it.
fn pgpass_password(
    config: &postgres::Config,
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
    let text = super::read_private_file(&file, from_setting)?;
    let user = config.get_user().unwrap_or("");
    let database = config.get_dbname().unwrap_or(user);
    let ports = config.get_ports();
    for (i, host) in config.get_hosts().iter().enumerate() {
        let postgres::config::Host::Tcp(host) = host else {
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
/// certificate against `sslrootcert` (or `snowflake.registry_ca_file`, or the system's CAs),
/// and verify-full its host name too; require and prefer encrypt without checking, as libpq.
fn pg_tls(extras: &LibpqExtras, options: &Options) -> Result<postgres_openssl::MakeTlsConnector> {
    let builder = if extras.verifies_certificate() {
        let ca = extras
            .sslrootcert
            .clone()
            .or_else(|| options.ca_file.clone());
        let mut builder =
            openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())?;
        match ca {
            Some(file) => builder
                .set_ca_file(&file)
                .map_err(|e| RegistryError(format!("could not load CA file \"{file}\": {e}")))?,
            None => builder.set_default_verify_paths()?,
        }
        builder.set_verify(openssl::ssl::SslVerifyMode::PEER);
        builder
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
                registry_resolution_ms: 0,
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

    fn password(&self) -> Option<&str> {
        self.config
            .get_password()
            .and_then(|p| std::str::from_utf8(p).ok())
    }
}
