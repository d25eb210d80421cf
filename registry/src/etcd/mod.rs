//! The etcd registry client (v3 API, through the `etcd-client` crate). A claim is a key bound
//! to an etcd lease of `claim_ttl` (rounded up to whole seconds), so the store itself drops a
//! claim whose holder stopped renewing, and a renewal is a keep-alive of that lease. Every
//! step reads one snapshot of the datacenter's keys, decides with the core's rules, and
//! writes in one transaction that compares the revisions it read (or that a key is still
//! absent): a grant is a linearizable write, and a step that raced another writes nothing
//! and starts again.
//!
//! Keys, under the URI's prefix (default `/snowflake`):
//! - `PREFIX/fleet`: the fleet's epoch and when this incarnation began
//!   ([`FleetRecord`]). Missing (a new or wiped cluster) or older than a revision this
//!   client saw (a restore from a snapshot): the registry begins again and settles;
//! - `PREFIX/claim/DC/W`: the holder's token, bound to its lease;
//! - `PREFIX/marks/DC/W`: the id's high-water mark, its holder's floor and the last clean
//!   release ([`Marks`]).
//!
//! etcd's API has no clock: the registry's clock is the `Date` header of the member's HTTP
//! endpoint (`/version`, on the client port), read in whole seconds (see
//! [`snowflake_core::kvclaims`]).
//!
//! A restore from a snapshot is a loss etcd does not signal, and revisions soon climb past
//! where they were once other servers write. A holder whose write the restore lost notices
//! at its next renewal ([`EtcdRegistry::own_write_lost`]) and the registry begins a new
//! incarnation; a holder cut off from the store may go on issuing under its fence, and no
//! client can see its lost claim, so every grant (but a renewal) comes with a quarantine
//! before it is used ([`claim::ClaimTiming::grant_quarantine_ms`]).
//!
//! One member is used at a time; any failed or timed-out request moves to the next, so a
//! dead or frozen member costs one request. Requests need a leader (`require_leader`): a
//! member cut off from the majority refuses at once instead of serving old data.
//!
//! By concern: `members.rs` (one member at a time, failover, the private runtime),
//! `clock.rs` (the `Date` header), `snapshot.rs` (one read of a datacenter's keys),
//! `lease.rs` (etcd leases); here, the steps and what they decide and write.

mod clock;
mod lease;
mod members;
mod snapshot;

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::{
    new_registry_id, ClaimReply, ClaimRequest, Observed, Options, Registry, RegistryError,
    RenewReply, Result,
};
use snapshot::Snapshot;
use snowflake_core::claim::{RequestAge, RequestTokens};
use snowflake_core::kvclaims::{FleetRecord, Marks, HTTP_DATE_RESOLUTION_MS};
use snowflake_core::registry_rules::{self, ClaimDecision, LiveClaim};
use snowflake_core::registry_uri::parse_multi_host;

/// How often a step starts again after a transaction found the snapshot changed.
const ATTEMPTS: usize = 5;

/// An etcd registry.
pub struct EtcdRegistry {
    endpoints: Vec<String>,
    tls: Option<openssl::ssl::SslConnector>,
    ca_pem: Option<Vec<u8>>,
    credentials: Option<(String, String)>,
    prefix: String,
    timeout: Duration,
    runtime: tokio::runtime::Runtime,
    client: Option<Client>,
    current: usize,
    /// The highest store revision this client has seen: a lower one means the store went
    /// back (restored from a snapshot), and lost what it acknowledged since.
    highest_revision: i64,
    /// This client's last write of an id's marks: (datacenter, worker, revision). See
    /// [`EtcdRegistry::own_write_lost`].
    last_write: Option<(u8, u8, i64)>,
}

/// What a step found before it acts.
enum Begun {
    Epoch(i64),
    Rejected(RequestAge),
    Ready(Ready),
}

/// A snapshot a step may act on: the fleet record matches the request's epoch and the
/// request is fresh.
struct Ready {
    snapshot: Snapshot,
    record: FleetRecord,
    /// The fleet record's mod revision: keys written before it are from before the loss.
    fleet_seen: i64,
}

/// The replies of the steps that begin with a snapshot (`claim` and `renew`): how each
/// answers a fleet of another epoch and a request of the wrong age.
trait StepReply: Sized {
    fn other_epoch(registry_epoch_unix_ms: i64) -> Result<Self>;
    fn rejected(age: RequestAge) -> Self;
}

impl StepReply for ClaimReply {
    fn other_epoch(registry_epoch_unix_ms: i64) -> Result<Self> {
        Ok(ClaimReply::EpochMismatch {
            registry_epoch_unix_ms,
        })
    }
    fn rejected(age: RequestAge) -> Self {
        ClaimReply::Rejected(age)
    }
}

impl StepReply for RenewReply {
    fn other_epoch(_: i64) -> Result<Self> {
        Err(RegistryError(
            "the registry now records another epoch for the fleet".into(),
        ))
    }
    fn rejected(age: RequestAge) -> Self {
        RenewReply::Rejected(age)
    }
}

impl EtcdRegistry {
    pub(super) fn new(uri: &str, options: &Options) -> Result<Self> {
        let parsed = parse_multi_host(uri, 2379).map_err(RegistryError)?;
        let secure = parsed.scheme == "etcds";
        let prefix = if parsed.path.is_empty() {
            "/snowflake".to_string()
        } else {
            format!("/{}", parsed.path.join("/"))
        };
        let password = match (&parsed.password, &options.password_file) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(file)) => Some(super::read_password_file(file, options.effective_uid)?),
            (None, None) => None,
        };
        let credentials = match (parsed.user.is_empty(), password) {
            (true, None) => None,
            (false, p) => Some((parsed.user.clone(), p.unwrap_or_default())),
            (true, Some(_)) => {
                return Err(RegistryError(
                    "an etcd password needs a user name in the URI (etcd://USER@HOST:PORT)".into(),
                ))
            }
        };
        let (tls, ca_pem) = if secure {
            let (connector, pem) = super::tls_connector(options.ca_file.as_deref())?;
            (Some(connector), pem)
        } else {
            (None, None)
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(EtcdRegistry {
            endpoints: parsed.hosts,
            tls,
            ca_pem,
            credentials,
            prefix,
            timeout: options.timeout,
            runtime,
            client: None,
            current: 0,
            highest_revision: 0,
            last_write: None,
        })
    }

    /// Whether the store lost this client's last write of an id's marks: the key's mod
    /// revision is below the revision of that write (revisions only rise in a store that
    /// keeps its history), so the store went back to an older copy, whatever revisions other
    /// servers have written since.
    fn own_write_lost(&self, datacenter_id: u8, snapshot: &Snapshot) -> bool {
        match self.last_write {
            Some((dc, w, revision)) if dc == datacenter_id => snapshot.marks(w).1 < revision,
            _ => false,
        }
    }

    /// Writes the fleet record anew (this incarnation begins at `born`), if it is still
    /// as read (`seen`: its mod revision, 0 for absent), with the registry's id (`registry_id`:
    /// the old record's, or a new one).
    fn begin_incarnation(
        &mut self,
        epoch_unix_ms: i64,
        born: i64,
        seen: i64,
        registry_id: u64,
    ) -> Result<()> {
        let record = FleetRecord {
            epoch_unix_ms,
            born_unix_ms: born,
            registry_id: Some(registry_id),
        };
        let key = self.fleet_key();
        let value = serde_json::to_vec(&record)?;
        let txn = Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, seen)])
            .and_then([TxnOp::put(key, value, None)]);
        let response = self.call(|c| Box::pin(c.txn(txn)))?;
        // Revisions count from here on, whether this write began the new incarnation or
        // another server's did (the compare failed): what came before is gone.
        self.highest_revision = response.header().map_or(0, |h| h.revision());
        Ok(())
    }

    /// Reads the clock and a snapshot, beginning a new incarnation first when the fleet
    /// record is missing or the store went back, and checks the epoch and the request's age.
    fn begin(&mut self, request: &ClaimRequest) -> Result<(Begun, Observed, std::time::Instant)> {
        let clock = self.clock()?;
        for _ in 0..ATTEMPTS {
            let (snapshot, revision) = self.snapshot(request.datacenter_id)?;
            let went_back = revision < self.highest_revision
                || self.own_write_lost(request.datacenter_id, &snapshot);
            match snapshot.fleet {
                None => {
                    let id = new_registry_id(&request.tokens);
                    self.begin_incarnation(request.epoch_unix_ms, clock.latest(), 0, id)?;
                    self.last_write = None;
                    continue;
                }
                Some((record, seen))
                    if went_back && record.epoch_unix_ms == request.epoch_unix_ms =>
                {
                    let id = record
                        .registry_id
                        .unwrap_or_else(|| new_registry_id(&request.tokens));
                    self.begin_incarnation(request.epoch_unix_ms, clock.latest(), seen, id)?;
                    self.last_write = None;
                    continue;
                }
                Some((record, seen)) => {
                    self.highest_revision = self.highest_revision.max(revision);
                    let observed = Observed {
                        sample: clock.sample,
                        born_unix_ms: record.born_unix_ms,
                        registry_id: record.registry_id,
                        sample_age_ms: 0,
                    };
                    let begun = if record.epoch_unix_ms != request.epoch_unix_ms {
                        Begun::Epoch(record.epoch_unix_ms)
                    } else {
                        match clock.request_age(request) {
                            RequestAge::Fresh => Begun::Ready(Ready {
                                snapshot,
                                record,
                                fleet_seen: seen,
                            }),
                            age => Begun::Rejected(age),
                        }
                    };
                    return Ok((begun, observed, clock.received_at));
                }
            }
        }
        Err(self.contended())
    }

    /// Runs one step (a claim or a renewal): `decide` acts on a fresh snapshot, the fleet
    /// record and the record's mod revision. It returns None when its write raced another
    /// server's: the step starts over on a new snapshot, up to `ATTEMPTS` times.
    ///
    /// A request that failed or did not answer within the time limit left its member for
    /// the next (see `call`): the step starts over there at once, once, while it has time
    /// for a request more, rather than fail and be retried half a heartbeat later (see
    /// `clock`: a member frozen in the middle of a step would use up the fence). Starting
    /// over is safe: every write compares what a fresh snapshot read, and one that timed
    /// out but still took effect only makes a compare fail.
    fn step<R: StepReply>(
        &mut self,
        request: &ClaimRequest,
        mut decide: impl FnMut(&mut Self, Snapshot, FleetRecord, i64, &Observed) -> Result<Option<R>>,
    ) -> Result<(R, Observed)> {
        let began = std::time::Instant::now();
        let mut moved_on = false;
        let mut attempts = 0;
        while attempts < ATTEMPTS {
            match self.attempt(request, &mut decide) {
                Ok(Some(done)) => return Ok(done),
                Ok(None) => attempts += 1,
                Err(_)
                    if !moved_on
                        && self.client.is_none()
                        && began.elapsed() < self.move_on_budget() =>
                {
                    moved_on = true;
                }
                Err(e) => return Err(e),
            }
        }
        Err(self.contended())
    }

    /// One attempt of a step: None if its write raced another server's.
    fn attempt<R: StepReply>(
        &mut self,
        request: &ClaimRequest,
        decide: &mut impl FnMut(&mut Self, Snapshot, FleetRecord, i64, &Observed) -> Result<Option<R>>,
    ) -> Result<Option<(R, Observed)>> {
        let (begun, mut observed, read_at) = self.begin(request)?;
        let reply = match begun {
            Begun::Epoch(e) => R::other_epoch(e)?,
            Begun::Rejected(age) => R::rejected(age),
            Begun::Ready(r) => match decide(self, r.snapshot, r.record, r.fleet_seen, &observed)? {
                Some(reply) => reply,
                None => return Ok(None),
            },
        };
        // The `Date` header was read first; the step's reads and writes came after it.
        observed.sample_age_ms = read_at.elapsed().as_millis() as u64;
        Ok(Some((reply, observed)))
    }

    fn contended(&self) -> RegistryError {
        RegistryError(format!(
            "the etcd registry's keys changed under each of {ATTEMPTS} attempts"
        ))
    }

    /// Puts the claim and the marks if nothing changed since the snapshot. `claim`: the
    /// claim key's mod revision as read (it must still be that), or a new lease to bind a
    /// new claim to (the key must still be absent).
    #[allow(clippy::too_many_arguments)]
    fn hold(
        &mut self,
        request: &ClaimRequest,
        w: u8,
        claim: HoldClaim,
        fleet_seen: i64,
        marks: (Marks, i64),
        floor: Option<Option<i64>>,
    ) -> Result<bool> {
        let dc = request.datacenter_id;
        let claim_key = self.key("claim", dc, Some(w));
        let marks_key = self.key("marks", dc, Some(w));
        let new_marks = serde_json::to_vec(
            &marks
                .0
                .held(request.cap_unix_ms, floor)
                .with_holder_ttl(request.ttl_ms),
        )?;
        let mut compares = vec![
            Compare::mod_revision(self.fleet_key(), CompareOp::Equal, fleet_seen),
            Compare::mod_revision(marks_key.clone(), CompareOp::Equal, marks.1),
        ];
        let mut ops = vec![TxnOp::put(marks_key, new_marks, None)];
        match claim {
            HoldClaim::Existing {
                mod_revision,
                lease,
            } => {
                compares.push(Compare::mod_revision(
                    claim_key.clone(),
                    CompareOp::Equal,
                    mod_revision,
                ));
                compares.push(Compare::lease(claim_key.clone(), CompareOp::Equal, lease));
                // Every grant and renewal writes the holder's new token (see
                // `RequestTokens`), which also makes a re-asserted claim this incarnation's.
                ops.push(TxnOp::put(
                    claim_key,
                    request.tokens.write.as_bytes().to_vec(),
                    Some(PutOptions::new().with_lease(lease)),
                ));
            }
            HoldClaim::New { lease } => {
                compares.push(Compare::create_revision(
                    claim_key.clone(),
                    CompareOp::Equal,
                    0,
                ));
                ops.push(TxnOp::put(
                    claim_key,
                    request.tokens.write.as_bytes().to_vec(),
                    Some(PutOptions::new().with_lease(lease)),
                ));
            }
        }
        let txn = Txn::new().when(compares).and_then(ops);
        let response = self.call(|c| Box::pin(c.txn(txn)))?;
        if response.succeeded() {
            if let Some(h) = response.header() {
                self.last_write = Some((dc, w, h.revision()));
            }
        }
        Ok(response.succeeded())
    }

    /// Binds a new claim of `w` to a new lease; false if the snapshot changed.
    fn hold_new(
        &mut self,
        request: &ClaimRequest,
        w: u8,
        fleet_seen: i64,
        marks: (Marks, i64),
        floor: Option<i64>,
    ) -> Result<bool> {
        let lease = self.grant_lease(request.ttl_ms)?;
        let held = self.hold(
            request,
            w,
            HoldClaim::New { lease },
            fleet_seen,
            marks,
            Some(floor),
        );
        if !matches!(held, Ok(true)) {
            self.revoke_lease(lease);
        }
        held
    }

    /// Renews an existing claim of `w` (its lease, then its marks and its token); false if
    /// the claim changed or its lease is gone.
    fn hold_existing(
        &mut self,
        request: &ClaimRequest,
        w: u8,
        claim: (i64, i64),
        fleet_seen: i64,
        marks: (Marks, i64),
    ) -> Result<bool> {
        let (lease, mod_revision) = claim;
        if !self.keep_alive(lease)? {
            return Ok(false);
        }
        self.hold(
            request,
            w,
            HoldClaim::Existing {
                mod_revision,
                lease,
            },
            fleet_seen,
            marks,
            None,
        )
    }
}

/// Where the registry's settling is measured from: one clock resolution after its birth.
/// The clock checks let a server's clock be off by up to half the `Date` header's
/// resolution more than with a millisecond clock, on each side of a handover (the holder
/// whose cap was lost, the server that takes the id after the loss), so settling starts one
/// resolution later. `may_reassert` uses the same start, so a holder may re-assert for as
/// long as nobody can get its id.
fn settle_start(record: &FleetRecord) -> i64 {
    record.born_unix_ms + HTTP_DATE_RESOLUTION_MS
}

/// The claim key a hold writes.
enum HoldClaim {
    Existing { mod_revision: i64, lease: i64 },
    New { lease: i64 },
}

impl Registry for EtcdRegistry {
    fn claim(&mut self, request: &ClaimRequest) -> Result<(ClaimReply, Observed)> {
        self.step(request, |this, snapshot, record, fleet_seen, observed| {
            // A claim key older than the current incarnation may be one a restore brought
            // back after it had lapsed and gone to another server: it is not this server's
            // to take back by its token alone (only its holder, re-asserting within its
            // fence, may: see `renew`). For a claim it counts as another server's.
            let live: Vec<LiveClaim<'_>> = snapshot
                .claims
                .iter()
                .map(|(w, t, _, m)| {
                    let marks = snapshot.marks(*w).0;
                    LiveClaim {
                        worker_id: *w,
                        holder: t,
                        from_before_loss: *m < fleet_seen,
                        // A renewal records it in the marks.
                        holder_ttl_ms: marks.holder_ttl_ms,
                        floor_unix_ms: marks.floor_unix_ms,
                        high_water_unix_ms: marks.high_water_unix_ms,
                    }
                })
                .collect();
            let earliest = observed.sample.registry_unix_ms - HTTP_DATE_RESOLUTION_MS / 2;
            let settle = request
                .claim_timing()
                .settle_wait_ms(settle_start(&record), earliest);
            let decision = registry_rules::decide_claim(request, settle, &live);
            // Every grant is used only after its quarantine (see the module's text).
            // For the longer claim_ttl a refused server remembers, like its settle: the
            // holder a restore can lose without a sign fences for its own.
            let quarantine_ms = request
                .claim_timing()
                .grant_quarantine_ms(HTTP_DATE_RESOLUTION_MS as u64);
            let (held, free_floor) = match decision {
                ClaimDecision::Own { worker_id: w, .. } => {
                    // Chosen because this server's token holds it, so the key is in the
                    // snapshot.
                    let Some(&(_, _, lease, mod_revision)) = snapshot.claim(w) else {
                        return Ok(None);
                    };
                    let marks = snapshot.marks(w);
                    let held =
                        this.hold_existing(request, w, (lease, mod_revision), fleet_seen, marks)?;
                    (held, None)
                }
                ClaimDecision::Free { worker_id: w } => {
                    let marks = snapshot.marks(w);
                    let floor = marks.0.free_grant_floor();
                    (this.hold_new(request, w, fleet_seen, marks, floor)?, floor)
                }
                _ => (true, None),
            };
            Ok(held.then_some(decision.reply(quarantine_ms, free_floor)))
        })
    }

    fn renew(
        &mut self,
        request: &ClaimRequest,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> Result<(RenewReply, Observed)> {
        self.step(request, |this, snapshot, record, fleet_seen, observed| {
            let earliest = observed.sample.registry_unix_ms - HTTP_DATE_RESOLUTION_MS / 2;
            let reassert = reassert_known_born.is_some_and(|known| {
                request
                    .timing()
                    .may_reassert(known, settle_start(&record), earliest)
            });
            let marks = snapshot.marks(worker_id);
            let claim = snapshot.claim(worker_id);
            let live = claim.map(|(w, token, _, mod_revision)| LiveClaim {
                worker_id: *w,
                holder: token,
                // From before the registry's loss (a restore may have brought it back after
                // it lapsed and went to another server): kept only as a re-assertion, by a
                // holder whose fence still holds, while the registry settles.
                from_before_loss: *mod_revision <= fleet_seen,
                holder_ttl_ms: marks.0.holder_ttl_ms,
                floor_unix_ms: marks.0.floor_unix_ms,
                high_water_unix_ms: marks.0.high_water_unix_ms,
            });
            let reply = registry_rules::decide_renew(
                request,
                live.as_ref(),
                marks.0.high_water_unix_ms,
                reassert,
            );
            if !matches!(reply, RenewReply::Renewed { .. }) {
                return Ok(Some(reply));
            }
            let held = match claim {
                Some((_, _, lease, mod_revision)) => this.hold_existing(
                    request,
                    worker_id,
                    (*lease, *mod_revision),
                    fleet_seen,
                    marks,
                )?,
                None => this.hold_new(request, worker_id, fleet_seen, marks, None)?,
            };
            Ok(held.then_some(reply))
        })
    }

    fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        tokens: &RequestTokens,
        released_unix_ms: Option<i64>,
    ) -> Result<()> {
        for _ in 0..ATTEMPTS {
            let (snapshot, _) = self.snapshot(datacenter_id)?;
            let Some((_, holder, lease, mod_revision)) = snapshot.claim(worker_id).cloned() else {
                return Ok(());
            };
            if !registry_rules::release_counts(tokens, Some(&holder)) {
                return Ok(());
            }
            let (marks, marks_seen) = snapshot.marks(worker_id);
            let claim_key = self.key("claim", datacenter_id, Some(worker_id));
            let marks_key = self.key("marks", datacenter_id, Some(worker_id));
            let value = serde_json::to_vec(&marks.released(released_unix_ms))?;
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(claim_key.clone(), CompareOp::Equal, mod_revision),
                    Compare::mod_revision(marks_key.clone(), CompareOp::Equal, marks_seen),
                ])
                .and_then([
                    TxnOp::delete(claim_key, None),
                    TxnOp::put(marks_key, value, None),
                ]);
            let response = self.call(|c| Box::pin(c.txn(txn)))?;
            if response.succeeded() {
                if let Some(h) = response.header() {
                    self.last_write = Some((datacenter_id, worker_id, h.revision()));
                }
                self.revoke_lease(lease);
                return Ok(());
            }
        }
        Err(self.contended())
    }

    fn password(&self) -> Option<&str> {
        self.credentials
            .as_ref()
            .map(|(_, password)| password.as_str())
    }
}
