//! The registry worker's decisions (issue 37), as a state machine: [`Holder`] takes the
//! events of one claim or renewal (the step begins, the registry answers or the request
//! fails, the claim file is written) and returns what to do: [`Effect`]s, and what comes
//! next, typed per event ([`Begin`], [`AfterReply`], a wait after [`Holder::on_recorded`]),
//! so that no caller handles a case its event cannot produce. It reads no clock, draws no
//! random bytes and does no I/O: the worker (`src/fleet/mod.rs`) passes the time and a
//! fresh token in, sends the requests, and applies the effects to shared memory, files and
//! the log; the simulator (`crate::sim`) drives the same code in virtual time, under faults.
//!
//! One step, as the worker runs it:
//! 1. [`Holder::begin`]: a fence that has run out ends the claim; the tokens for the request
//!    are drawn and kept ([`Effect::KeepTokens`]); the claim or renewal to send.
//! 2. [`Holder::on_reply`] with the reply (or the failure): the claim installed, renewed,
//!    fenced or given back; for a grant, the claim file to write first
//!    ([`AfterReply::Record`]).
//! 3. [`Holder::on_recorded`], after that write: the grant used (or given back if the
//!    write failed).
//!
//! At shutdown, [`Holder::release`] gives the claim back.

use crate::civil::format_unix_ms;
use crate::claim::{
    self, AfterFailure, ClaimStatus, ClaimTiming, ClaimTokens, ClockSample, Fence, Granted,
    Quarantine, RegistrySeen, RequestAge, RequestTokens, SkewTooLarge,
};
use crate::durable::LastClaim;
use crate::layout::MAX_WORKER_ID;
use crate::mono::MonoMs;
use crate::protocol::{ClaimReply, ClaimRequest, Observed, RenewReply};

/// This server's clocks when an event is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The wall clock (Unix ms).
    pub unix_ms: i64,
    /// The monotonic clock.
    pub mono: MonoMs,
}

/// What one worker's decisions depend on and never changes while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderSettings {
    /// `snowflake.datacenter_id`.
    pub datacenter_id: u8,
    /// From `snowflake.claim_ttl`.
    pub timing: ClaimTiming,
    /// The fleet's epoch (Unix ms).
    pub epoch_unix_ms: i64,
    /// The registry URI without its password.
    pub uri: String,
    /// This server's host name and port, the end of each of its tokens.
    pub node: String,
}

/// The rules of [`Holder`] that fixed earlier duplicate paths, each of which the simulator
/// takes out to show that it finds that path again (it can see that kind of fault at all).
/// The product always runs [`HolderRules::PRODUCT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HolderRules {
    /// Issue 37: a holder whose fence has run out claims again instead of renewing (a
    /// restore may have revived its claim after the id went to another server).
    pub renew_only_within_fence: bool,
    /// 0.5.0: a claim given back unused leaves the id's mark as it was (before, it was given
    /// back with the clock that had just failed the skew check, which lowered the mark).
    pub marks_only_rise: bool,
    /// 0.5.0: a claim's floor includes the server's clock when the grant arrived.
    pub floor_includes_clock: bool,
    /// Issue 37: a server refused beside a longer `claim_ttl` remembers it, and its claims
    /// settle for it ([`ClaimRequest::fleet_ttl_ms`]).
    pub settle_for_refused_ttl: bool,
    /// Issue 37: every grant and renewal writes a new token ([`ClaimTokens`]); without, a
    /// server writes its postmaster's token for ever.
    pub rotate_tokens: bool,
    /// Issue 37: a clean release is no lower than the id's mark before the holder's latest
    /// accepted write.
    pub release_above_inherited: bool,
}

impl HolderRules {
    /// Every rule in: the product.
    pub const PRODUCT: HolderRules = HolderRules {
        renew_only_within_fence: true,
        marks_only_rise: true,
        floor_includes_clock: true,
        settle_for_refused_ttl: true,
        rotate_tokens: true,
        release_above_inherited: true,
    };
}

/// What the worker does for the holder, in order. Nothing here blocks on the network but
/// [`Effect::GiveBack`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write [`Holder::tokens`] to the token file, before the request that may write their
    /// `next` is sent (a failure costs only a restarted worker its claim).
    KeepTokens,
    /// Stop the generator at once: no fence, its lease revoked.
    StopGenerator,
    /// The claim of `worker_id` ended (a LOG line).
    Fenced {
        /// The id that was held.
        worker_id: u8,
        /// Why.
        why: String,
    },
    /// Raise the generator's floor (Unix ms): IDs under the claim start there or later.
    RaiseFloor(i64),
    /// Hand the generator the pair and the fence.
    Install {
        /// The held id.
        worker_id: u8,
        /// What may be issued under it.
        fence: Fence,
    },
    /// Give `worker_id` back to the registry (`released_unix_ms`: the next holder's floor;
    /// None leaves the id's mark as it is, for a claim not used).
    GiveBack {
        /// The id.
        worker_id: u8,
        /// The tokens the registry may hold for this server.
        tokens: RequestTokens,
        /// The highest timestamp this server could have issued under the claim.
        released_unix_ms: Option<i64>,
    },
    /// Publish the status for callers and `snowflake_stats()`.
    Report {
        /// The status.
        status: ClaimStatus,
        /// The held id (0 for none).
        worker_id: u8,
        /// The reason, for callers' DETAIL (empty when held).
        why: String,
        /// When the registry lets the claim go unless renewed (this server's clock; 0: none).
        expires_unix_ms: i64,
    },
    /// A renewal failed while the fence holds: the reason only, the status stays.
    NoteFailure(String),
    /// A request failed with a cause other than the last one logged (a LOG line).
    RequestFailed(String),
    /// A grant is used (a LOG line).
    Claimed {
        /// The id.
        worker_id: u8,
        /// The claim was already this server's.
        own: bool,
        /// Where its IDs start (Unix ms).
        floor_unix_ms: i64,
    },
    /// A grant was given back because its floor is too far ahead of the clock (a WARNING).
    MarkAhead {
        /// The id.
        worker_id: u8,
        /// Its floor (Unix ms).
        floor_unix_ms: i64,
        /// How far ahead of this server's clock (ms).
        ahead_ms: i64,
        /// How far ahead a floor may be (ms).
        usable_ms: i64,
    },
    /// The registry began anew with a clock further behind than the settle covers (a
    /// WARNING).
    RegistryClockJumped {
        /// Its clock's offset from this server's before (ms).
        before_ms: i64,
        /// And after.
        after_ms: i64,
        /// The jump the settle covers (ms).
        allowed_ms: u64,
    },
    /// The claim file could not be written: the grant is given back (a WARNING).
    ClaimFileFailed(String),
    /// Keep the longest `claim_ttl` (ms) a refusal named (0: forget it) in
    /// `durable::FLEET_TTL_FILE`, so that a restart remembers it.
    RememberFleetTtl(u64),
}

/// What comes after [`Holder::begin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Begin the next step in this long (ms): nothing to send now.
    Wait(u64),
    /// Send this claim, and pass its reply to [`Holder::on_reply`].
    Claim(ClaimRequest),
    /// Send this renewal of `worker_id`, and pass its reply to [`Holder::on_reply`].
    Renew {
        /// The request.
        request: ClaimRequest,
        /// The held id.
        worker_id: u8,
        /// Take the claim back if the registry lost it since this birth
        /// ([`claim::may_reassert`]).
        reassert_known_born: Option<i64>,
    },
}

/// What comes after [`Holder::on_reply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterReply {
    /// Begin the next step in this long (ms).
    Wait(u64),
    /// Write the claim file (durably), and pass the result to [`Holder::on_recorded`].
    Record(LastClaim),
}

/// The result of one event: `N` is what may come after it ([`Begin`], [`AfterReply`], or
/// for [`Holder::on_recorded`] the wait in ms before the next step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<N> {
    /// To apply, in order.
    pub effects: Vec<Effect>,
    /// Then this.
    pub next: N,
}

/// The registry's answer to the request in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// To a claim.
    Claim(ClaimReply),
    /// To a renewal.
    Renew(RenewReply),
}

/// The request in flight.
#[derive(Debug, Clone)]
struct InFlight {
    /// The fence the request grants if it succeeds.
    fence: Fence,
    /// The held id and its fence, for a renewal.
    renewing: Option<(u8, Fence)>,
    /// The timing its claim settles by.
    claim_timing: ClaimTiming,
    /// How far ahead of the clock a claim's floor may be (ms).
    usable_lead_ms: i64,
}

/// A grant waiting for its claim file.
#[derive(Debug, Clone)]
struct Recording {
    /// This server's wall clock at the reply as the skew check bound it (the sample's
    /// reading moved on by the monotonic time since), and its clocks when the reply was
    /// handled.
    checked_reply_unix_ms: i64,
    replied: Now,
    worker_id: u8,
    own: bool,
    floor_unix_ms: i64,
    quarantine_ms: u64,
    inherited_unix_ms: Option<i64>,
    fence: Fence,
    expires_unix_ms: i64,
    last: LastClaim,
}

/// The registry worker's state.
#[derive(Debug, Clone)]
pub struct Holder {
    settings: HolderSettings,
    rules: HolderRules,
    /// The tokens the registry may hold for this server, and the next to write.
    tokens: ClaimTokens,
    /// The held worker id and its fence.
    held: Option<(u8, Fence)>,
    /// When the registry's incarnation began, as of its last answer to this server: a
    /// renewal may take a claim back only if the registry lost its data since.
    known_born_unix_ms: Option<i64>,
    /// Where this server's IDs started under the current claim (Unix ms).
    floor_unix_ms: i64,
    /// The id's high-water mark before this server's latest accepted write (an own grant
    /// or a renewal; Unix ms, `i64::MIN` for none), which a clean release gives the next
    /// holder at least (see `RenewReply::Renewed`).
    inherited_unix_ms: i64,
    /// The worker id to ask for first.
    preferred: Option<u8>,
    /// The claim file as last written (or read at start): its floor outlives every restart.
    recorded: Option<LastClaim>,
    /// Worker ids given back because their floor was too far ahead of this server's clock,
    /// with that floor: not asked for again until the clock nears it.
    avoided: Vec<(u8, i64)>,
    /// The cause of the last failed request logged (empty after a success): each new cause
    /// is logged once.
    last_failure: String,
    /// A held claim not to be used before this monotonic time (ms): a grant from a store
    /// whose restores give no sign ([`ClaimTiming::grant_quarantine_ms`]).
    quarantine_until_mono: Option<MonoMs>,
    /// The registry's incarnation (its birth) and its clock's offset from this server's, as
    /// last seen: a new incarnation whose clock went back further than the settle covers is
    /// reported ([`ClaimTiming::max_registry_clock_jump_ms`]).
    registry_clock: Option<(i64, ClockSample)>,
    /// The longest `claim_ttl` (ms) of another holder of the datacenter that a refusal
    /// named (0: none): this server's claims settle for it (`ClaimRequest::fleet_ttl_ms`).
    /// Kept in a file ([`Effect::RememberFleetTtl`]) until a grant.
    fleet_ttl_ms: u64,
    in_flight: Option<InFlight>,
    recording: Option<Recording>,
}

impl Holder {
    /// A worker starting. `postmaster` is this postmaster's own token; `token_file`,
    /// `recorded` and `fleet_ttl_ms` are the token file, the claim file and the fleet ttl
    /// file as read (0: none). A token file of another postmaster (a restart, a copy of the
    /// data directory) is not this server's.
    pub fn start(
        settings: HolderSettings,
        rules: HolderRules,
        postmaster: &str,
        token_file: Option<ClaimTokens>,
        recorded: Option<LastClaim>,
        fleet_ttl_ms: u64,
    ) -> Holder {
        let tokens = token_file
            .filter(|t| t.postmaster == postmaster)
            .unwrap_or_else(|| ClaimTokens::first(postmaster));
        let preferred = recorded
            .as_ref()
            .filter(|c| c.datacenter_id == settings.datacenter_id)
            .map(|c| c.worker_id);
        Holder {
            settings,
            rules,
            tokens,
            held: None,
            known_born_unix_ms: None,
            floor_unix_ms: i64::MIN,
            inherited_unix_ms: i64::MIN,
            preferred,
            recorded,
            avoided: Vec::new(),
            last_failure: String::new(),
            quarantine_until_mono: None,
            registry_clock: None,
            fleet_ttl_ms: if rules.settle_for_refused_ttl {
                fleet_ttl_ms
            } else {
                0
            },
            in_flight: None,
            recording: None,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &HolderSettings {
        &self.settings
    }

    /// The held id and its fence (held also while a grant's quarantine runs).
    pub fn held(&self) -> Option<(u8, Fence)> {
        self.held
    }

    /// The tokens.
    pub fn tokens(&self) -> &ClaimTokens {
        &self.tokens
    }

    /// Begins a step: a claim, or a renewal of the held id. `fresh` is a new random token
    /// (None: no random bytes could be read); `usable_lead_ms` how far ahead of the clock a
    /// claim's floor may be ([`ClaimTiming::usable_floor_lead_ms`]).
    pub fn begin(
        &mut self,
        now: Now,
        fresh: Option<String>,
        usable_lead_ms: i64,
    ) -> Decision<Begin> {
        let mut effects = Vec::new();
        self.in_flight = None;
        self.recording = None;
        let timing = self.settings.timing;
        let fence = timing.fence(now.unix_ms, now.mono);
        if let Some((worker_id, old)) = self.held {
            if self.rules.renew_only_within_fence && old.expired(now.mono) {
                // Not renewed within its fence (this server was stopped, or cut off, with no
                // failed renewal to notice): claim again instead. A renewal now could keep a
                // claim that a restore of the registry brought back after the id had lapsed
                // and gone to another server (issue 37's simulator).
                self.fence(
                    &mut effects,
                    ClaimStatus::Fenced,
                    &format!(
                        "This server's claim of worker id {worker_id} was not renewed within its fence ({} ms): the server was stopped or cut off. It claims an id again.",
                        timing.fence_reach_ms()
                    ),
                );
            }
        }
        self.avoided
            .retain(|(_, floor)| floor - now.unix_ms > usable_lead_ms);
        let order: Vec<u8> =
            claim::claim_order(self.held.map(|h| h.0).or(self.preferred), MAX_WORKER_ID)
                .into_iter()
                .filter(|w| !self.avoided.iter().any(|(a, _)| a == w))
                .collect();
        // A new token for this request (a renewal retried after a failure writes the same
        // one), kept on disk before it is sent, so that a restart of the worker knows it.
        let Some(fresh) = fresh else {
            self.report(
                &mut effects,
                ClaimStatus::Unreachable,
                "Could not read random bytes for a claim token.",
                0,
            );
            return Decision {
                effects,
                next: Begin::Wait(timing.heartbeat_ms()),
            };
        };
        let fresh = format!("{fresh}@{}", self.settings.node);
        let tokens = match (self.rules.rotate_tokens, self.held) {
            (false, _) => self.tokens.for_release(),
            (true, Some(_)) => self.tokens.for_renewal(fresh),
            (true, None) => self.tokens.for_claim(fresh),
        };
        effects.push(Effect::KeepTokens);
        let request = ClaimRequest {
            datacenter_id: self.settings.datacenter_id,
            order,
            tokens,
            ttl_ms: timing.ttl_ms(),
            sent_unix_ms: now.unix_ms,
            cap_unix_ms: fence.cap_unix_ms,
            epoch_unix_ms: self.settings.epoch_unix_ms,
            fleet_ttl_ms: self.fleet_ttl_ms,
        };
        self.in_flight = Some(InFlight {
            fence,
            renewing: self.held,
            claim_timing: request.claim_timing(),
            usable_lead_ms,
        });
        let next = match self.held {
            Some((worker_id, old)) => Begin::Renew {
                request,
                worker_id,
                // Ask to take the claim back, should the registry have lost it, only while
                // the fence holds; the registry also checks that it really lost its data.
                reassert_known_born: claim::may_reassert(old, now.mono)
                    .then_some(self.known_born_unix_ms)
                    .flatten(),
            },
            None => Begin::Claim(request),
        };
        Decision { effects, next }
    }

    /// The registry's reply to the request in flight, or why the request failed.
    pub fn on_reply(
        &mut self,
        reply: Result<(Reply, Observed), String>,
        now: Now,
    ) -> Decision<AfterReply> {
        let mut effects = Vec::new();
        let heartbeat = self.settings.timing.heartbeat_ms();
        let Some(in_flight) = self.in_flight.take() else {
            return Decision {
                effects,
                next: AfterReply::Wait(heartbeat),
            };
        };
        let wait = match in_flight.renewing {
            Some((worker_id, old)) => {
                self.on_renewal(&mut effects, worker_id, old, &in_flight, reply, now)
            }
            None => match self.on_claim(&mut effects, &in_flight, reply, now) {
                Ok(wait) => wait,
                Err(last) => {
                    return Decision {
                        effects,
                        next: AfterReply::Record(last),
                    }
                }
            },
        };
        Decision {
            effects,
            next: AfterReply::Wait(wait),
        }
    }

    fn retry_ms(&self) -> u64 {
        (self.settings.timing.heartbeat_ms() / 2).max(100)
    }

    fn on_renewal(
        &mut self,
        effects: &mut Vec<Effect>,
        worker_id: u8,
        old: Fence,
        in_flight: &InFlight,
        reply: Result<(Reply, Observed), String>,
        now: Now,
    ) -> u64 {
        let timing = self.settings.timing;
        let heartbeat = timing.heartbeat_ms();
        let retry = self.retry_ms();
        let (reply, observed) = match reply {
            Ok((Reply::Renew(reply), observed)) => (reply, observed),
            Ok((Reply::Claim(_), _)) => {
                self.failed_renewal(
                    effects,
                    old,
                    now,
                    "The registry answered a renewal as a claim.",
                );
                return retry;
            }
            Err(e) => {
                self.log_failure(effects, &e);
                self.failed_renewal(
                    effects,
                    old,
                    now,
                    &format!("Renewing the claim failed: {e}"),
                );
                return retry;
            }
        };
        match reply {
            RenewReply::Renewed { inherited_unix_ms } => {
                self.tokens.confirmed();
                if let Some(mark) = inherited_unix_ms {
                    self.inherited_unix_ms = self.inherited_unix_ms.max(mark);
                }
                if let Err(skew) = claim::check_skew(&observed.sample, timing) {
                    self.fence(effects, ClaimStatus::Refused, &skew_text(skew));
                    return heartbeat;
                }
                self.known_born_unix_ms = Some(observed.born_unix_ms);
                self.watch_registry_clock(effects, &observed);
                if in_flight.fence.expired(now.mono) {
                    // Read after the fence it grants had ended (this server was stopped, or the
                    // reply held up): nothing to install, and the claim ends like after a
                    // failed renewal, so that no status reads "held" under an ended fence.
                    let late =
                        now.mono.since(in_flight.fence.deadline_mono) + timing.fence_reach_ms();
                    let why = format!(
                        "The registry renewed this server's claim of worker id {worker_id}, but its reply was read {late} ms after the renewal was sent, after the fence it grants ({} ms) had ended: the server was stopped or the reply held up.",
                        timing.fence_reach_ms()
                    );
                    self.failed_renewal(effects, old, now, &why);
                    return 1;
                }
                self.install(effects, worker_id, in_flight.fence, now);
                self.report_installed(effects, worker_id, expiry(&observed, timing), now)
            }
            RenewReply::Lost { holder } => {
                let node = &self.settings.node;
                let why = match holder {
                    Some(h) if h.ends_with(&format!("@{node}")) => format!(
                        "The registry holds worker id {worker_id} for another server with this server's host name and port ({node}): a copy of this server made with its memory (a cloned or reverted VM, a restored process snapshot) renewed the claim first, or this server's claim lapsed and it was given to such a copy."
                    ),
                    Some(h) => format!(
                        "The registry gave worker id {worker_id} to {h} after this server's claim lapsed."
                    ),
                    None => format!(
                        "The registry no longer has this server's claim of worker id {worker_id}, and cannot prove that it lost its data while the claim's fence held."
                    ),
                };
                self.fence(effects, ClaimStatus::Fenced, &why);
                // Claim again at once (another id, or the same once it is free).
                1
            }
            RenewReply::Rejected(age) => {
                if let Err(skew) = claim::check_skew(&observed.sample, timing) {
                    self.fence(effects, ClaimStatus::Refused, &skew_text(skew));
                    return heartbeat;
                }
                self.failed_renewal(effects, old, now, &rejected_text(age, &observed));
                retry
            }
        }
    }

    /// A claim's reply: the wait before the next step, or (Err) the claim file to write
    /// before a grant is used.
    fn on_claim(
        &mut self,
        effects: &mut Vec<Effect>,
        in_flight: &InFlight,
        reply: Result<(Reply, Observed), String>,
        now: Now,
    ) -> Result<u64, LastClaim> {
        let timing = self.settings.timing;
        let heartbeat = timing.heartbeat_ms();
        let retry = self.retry_ms();
        let datacenter_id = self.settings.datacenter_id;
        let (reply, observed) = match reply {
            Ok((Reply::Claim(reply), observed)) => (reply, observed),
            Ok((Reply::Renew(_), _)) => {
                let why = "The registry answered a claim as a renewal.";
                self.report(effects, ClaimStatus::Unreachable, why, 0);
                return Ok(retry);
            }
            Err(e) => {
                self.log_failure(effects, &e);
                self.report(effects, ClaimStatus::Unreachable, &e, 0);
                return Ok(retry);
            }
        };
        match reply {
            ClaimReply::Granted {
                worker_id,
                granted,
                floor_unix_ms,
                quarantine_ms,
                inherited_unix_ms,
            } => {
                self.tokens.confirmed();
                self.known_born_unix_ms = Some(observed.born_unix_ms);
                self.watch_registry_clock(effects, &observed);
                if let Err(skew) = claim::check_skew(&observed.sample, timing) {
                    // Not used: give it back, leaving its mark as it was (before 0.5.0, with
                    // the clock that had just failed the check).
                    let value = (!self.rules.marks_only_rise).then_some(now.unix_ms);
                    self.give_back(effects, worker_id, value);
                    self.report(effects, ClaimStatus::Refused, &skew_text(skew), 0);
                    return Ok(heartbeat);
                }
                let last_registry = self.recorded.as_ref().and_then(|r| r.registry.clone());
                let uri = &self.settings.uri;
                if claim::another_registry(last_registry.as_ref(), uri, observed.registry_id) {
                    // Not used: give it back, leaving its mark as it was.
                    self.give_back(effects, worker_id, None);
                    let last = last_registry.map(|r| r.uri).unwrap_or_default();
                    let why = format!(
                        "This server last claimed worker ids from registry {last}; {uri} is another registry (another address and another id). Two registries serving one fleet each grant every worker id, so this server claims nothing from it until the whole fleet moves: see \"Moving a fleet to another registry\" in docs/fleets.md."
                    );
                    self.report(effects, ClaimStatus::Refused, &why, 0);
                    return Ok(heartbeat);
                }
                let recorded = self
                    .recorded
                    .as_ref()
                    .and_then(|r| r.floor_for(datacenter_id, worker_id));
                let clock = if self.rules.floor_includes_clock {
                    observed.sample.received_unix_ms
                } else {
                    i64::MIN
                };
                let floor = claim::claim_floor_unix_ms(floor_unix_ms, clock, recorded);
                // The floor the registry and the claim file set must be near the clock; the
                // quarantine's own term is not a mark (the clock reaches it as the quarantine
                // runs out), so it is added after this check (else every etcd claim with a
                // claim_ttl above about 11 s was given back for good: issue 37's review).
                let ahead = floor.saturating_sub(now.unix_ms);
                let usable = in_flight.usable_lead_ms;
                if ahead > usable {
                    self.give_back(effects, worker_id, None);
                    self.avoided.push((worker_id, floor));
                    effects.push(Effect::MarkAhead {
                        worker_id,
                        floor_unix_ms: floor,
                        ahead_ms: ahead,
                        usable_ms: usable,
                    });
                    let why = mark_ahead_detail(worker_id, floor, ahead, usable);
                    self.report(effects, ClaimStatus::MarkAhead, &why, 0);
                    // Try the other ids at once.
                    return Ok(1);
                }
                // The floor is durable before the claim is used: no restart loses it. (Without
                // a quarantine's term: a claim taken again after a crash restart in its
                // quarantine is quarantined anew, later, and a recorded term would read as a
                // mark ahead of the clock: issue 37's second review.)
                let last = LastClaim {
                    datacenter_id,
                    worker_id,
                    floor_unix_ms: Some(floor),
                    registry: observed
                        .registry_id
                        .map(|id| RegistrySeen {
                            uri: uri.clone(),
                            id,
                        })
                        .or(last_registry),
                };
                self.recording = Some(Recording {
                    checked_reply_unix_ms: observed
                        .sample
                        .received_unix_ms
                        .saturating_add(observed.sample_age_ms as i64),
                    replied: now,
                    worker_id,
                    own: matches!(granted, Granted::Own),
                    floor_unix_ms: floor,
                    quarantine_ms,
                    inherited_unix_ms,
                    fence: in_flight.fence,
                    expires_unix_ms: expiry(&observed, timing),
                    last: last.clone(),
                });
                Err(last)
            }
            ClaimReply::Settling { wait_ms } => {
                let settle_ms = in_flight.claim_timing.settle_ms();
                self.known_born_unix_ms = Some(observed.born_unix_ms);
                self.watch_registry_clock(effects, &observed);
                let why = format!(
                    "The registry grants free worker ids in {wait_ms} ms: it began less than {settle_ms} ms ago (new, restarted, crash-restarted, restored or failed over), and servers still holding claims renew them first."
                );
                self.report(effects, ClaimStatus::Settling, &why, 0);
                Ok(wait_ms.clamp(10, heartbeat))
            }
            ClaimReply::Exhausted { taken } => {
                // A waiter is who gets an id next: its view of the registry's clock must be
                // fresh when the registry begins anew (its own clock may have moved since).
                self.watch_registry_clock(effects, &observed);
                match self.avoided.iter().min_by_key(|(_, floor)| *floor) {
                    Some(&(worker_id, floor)) => {
                        let why = mark_ahead_detail(
                            worker_id,
                            floor,
                            floor.saturating_sub(now.unix_ms),
                            in_flight.usable_lead_ms,
                        );
                        self.report(effects, ClaimStatus::MarkAhead, &why, 0);
                    }
                    None => {
                        let why = format!(
                            "All {taken} worker ids of datacenter {datacenter_id} are claimed by other servers."
                        );
                        self.report(effects, ClaimStatus::Exhausted, &why, 0);
                    }
                }
                Ok(heartbeat)
            }
            ClaimReply::TtlMismatch {
                others_min_ms,
                others_max_ms,
            } => {
                // A refused server asks first once the registry lost its records: its view of
                // the registry's clock must be fresh, like a waiter's.
                self.watch_registry_clock(effects, &observed);
                // After a loss of the registry's records this server settles (and, on etcd,
                // waits out a grant's quarantine) for the longest claim_ttl it was refused
                // beside, not its own.
                if self.rules.settle_for_refused_ttl && others_max_ms > self.fleet_ttl_ms {
                    self.fleet_ttl_ms = others_max_ms;
                    effects.push(Effect::RememberFleetTtl(others_max_ms));
                }
                let why = format!(
                    "Servers holding worker ids of datacenter {datacenter_id} have snowflake.claim_ttl from {others_min_ms} ms to {others_max_ms} ms; this server's is {} ms. One datacenter's servers may differ by at most a fifth: after the registry loses its data, a server with a much shorter claim_ttl could be given an id that one with a longer claim_ttl still uses.",
                    timing.ttl_ms()
                );
                self.report(effects, ClaimStatus::Refused, &why, 0);
                Ok(heartbeat)
            }
            ClaimReply::EpochMismatch {
                registry_epoch_unix_ms,
            } => {
                let epoch = self.settings.epoch_unix_ms;
                let why = format!(
                    "The registry's fleet uses epoch {} ({registry_epoch_unix_ms} ms); this server's snowflake.epoch is {} ({epoch} ms). One fleet must share one epoch.",
                    format_unix_ms(registry_epoch_unix_ms),
                    format_unix_ms(epoch),
                );
                self.report(effects, ClaimStatus::Refused, &why, 0);
                Ok(heartbeat)
            }
            ClaimReply::Rejected(age) => {
                match claim::check_skew(&observed.sample, timing) {
                    Err(skew) => self.report(effects, ClaimStatus::Refused, &skew_text(skew), 0),
                    Ok(()) => self.report(
                        effects,
                        ClaimStatus::Unreachable,
                        &rejected_text(age, &observed),
                        0,
                    ),
                }
                Ok(retry)
            }
        }
    }

    /// The claim file of a grant was written (or not): the grant is used, or given back.
    /// Then the next step begins after `next` ms.
    pub fn on_recorded(&mut self, written: Result<(), String>, now: Now) -> Decision<u64> {
        let mut effects = Vec::new();
        let heartbeat = self.settings.timing.heartbeat_ms();
        let Some(grant) = self.recording.take() else {
            return Decision {
                effects,
                next: heartbeat,
            };
        };
        if let Err(e) = written {
            self.give_back(&mut effects, grant.worker_id, None);
            let why = format!("could not write {}: {e}", crate::durable::CLAIM_FILE);
            effects.push(Effect::ClaimFileFailed(why.clone()));
            self.report(&mut effects, ClaimStatus::Refused, &why, 0);
            return Decision {
                effects,
                next: heartbeat,
            };
        }
        // A quarantined grant is used from its quarantine's end, counted from now, after its
        // reply came (the step may have read the store well after it began: a request held
        // up, a retry on another member; and the clock sample is taken before the step's
        // reads, so it is not the reply's time: issue 37's second review), and its IDs start
        // at or above that time on this server's clock, whatever the clock does meanwhile.
        // Counted on the wall clock as the skew check bound it (the sample's reading, moved
        // on by the monotonic clock), if that is later than the wall clock now: a clock
        // stepped back around the reply (after the check) would otherwise start the IDs
        // below a cap the quarantine must clear (helper-14's review: 7,750 and 11,800
        // duplicates on etcd at claim_ttl 60 s with an 8 s step back at the reply). Not the
        // clock at the send: the skew check does not bind it, and the request-age check
        // lets it lag by more (helper-15: 4,850 and 2,450 duplicates with a step back at the
        // send too).
        let since_reply = now.mono.since(grant.replied.mono);
        let checked_now = grant
            .checked_reply_unix_ms
            .saturating_add(since_reply as i64);
        let quarantine =
            Quarantine::after_reply(grant.quarantine_ms, now.unix_ms.max(checked_now), now.mono);
        let floor = quarantine.map_or(grant.floor_unix_ms, |q| {
            grant.floor_unix_ms.max(q.first_id_unix_ms)
        });
        self.recorded = Some(grant.last);
        self.preferred = Some(grant.worker_id);
        if self.fleet_ttl_ms > 0 {
            // A registry grants only once it has settled for the longer claim_ttl this
            // server remembers, and only when no live holder's claim_ttl is out of ratio
            // with this server's: a holder with that claim_ttl would show (renewing, or
            // re-asserting a claim the registry lost), or its fence has ended.
            self.fleet_ttl_ms = 0;
            effects.push(Effect::RememberFleetTtl(0));
        }
        self.inherited_unix_ms = grant.inherited_unix_ms.unwrap_or(i64::MIN);
        effects.push(Effect::RaiseFloor(floor));
        self.floor_unix_ms = floor;
        self.quarantine_until_mono = quarantine.map(|q| q.until_mono);
        self.install(&mut effects, grant.worker_id, grant.fence, now);
        let wait = self.report_installed(&mut effects, grant.worker_id, grant.expires_unix_ms, now);
        effects.push(Effect::Claimed {
            worker_id: grant.worker_id,
            own: grant.own,
            floor_unix_ms: floor,
        });
        Decision {
            effects,
            next: wait,
        }
    }

    /// At shutdown, once the generator is stopped: gives the claim back with the highest
    /// timestamp this server could have issued (its generator's position and its durable
    /// lease's end, never its clock), which the next holder (itself, after a restart) starts
    /// above instead of the last cap.
    pub fn release(&mut self, position_unix_ms: i64, lease_end_unix_ms: i64) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.in_flight = None;
        self.recording = None;
        let Some((worker_id, _)) = self.held else {
            return effects;
        };
        let mut released =
            claim::release_high_water(position_unix_ms, lease_end_unix_ms, self.floor_unix_ms);
        if self.rules.release_above_inherited {
            released = released.max(self.inherited_unix_ms);
        }
        self.give_back(&mut effects, worker_id, Some(released));
        effects
    }

    /// Stops the generator and forgets the claim (the postmaster died: no release).
    pub fn stop(&mut self, status: ClaimStatus, why: &str) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.in_flight = None;
        self.recording = None;
        self.fence(&mut effects, status, why);
        effects
    }

    /// A renewal failed or was not acted on: keep issuing while the fence holds.
    fn failed_renewal(&mut self, effects: &mut Vec<Effect>, old: Fence, now: Now, why: &str) {
        match claim::after_failed_renewal(old, now.mono) {
            AfterFailure::Retry => effects.push(Effect::NoteFailure(why.to_string())),
            AfterFailure::Fence => self.fence(effects, ClaimStatus::Fenced, why),
        }
    }

    /// Reports a registry that began anew with a clock further behind its previous one than
    /// the settle covers (issue 37: a registry restarted on another host, or failed over to
    /// one, whose clock is behind, gave duplicates; each server passed its own clock check).
    /// Only a server that saw both incarnations can tell; the settle covers smaller jumps.
    fn watch_registry_clock(&mut self, effects: &mut Vec<Effect>, observed: &Observed) {
        let previous = self
            .registry_clock
            .replace((observed.born_unix_ms, observed.sample));
        let Some((born, before)) = previous else {
            return;
        };
        if born == observed.born_unix_ms {
            return;
        }
        let after = observed.sample;
        let allowed = self.settings.timing.max_registry_clock_jump_ms();
        if after.proven_registry_clock_back_ms(&before) > allowed as i64 {
            effects.push(Effect::RegistryClockJumped {
                before_ms: before.offset_ms(),
                after_ms: after.offset_ms(),
                allowed_ms: allowed,
            });
        }
    }

    /// The status after a claim or renewal succeeded; returns the wait before the next step
    /// (sooner while a quarantine runs out).
    fn report_installed(
        &mut self,
        effects: &mut Vec<Effect>,
        worker_id: u8,
        expires_unix_ms: i64,
        now: Now,
    ) -> u64 {
        let heartbeat = self.settings.timing.heartbeat_ms();
        match self.quarantine_until_mono {
            Some(until) => {
                let left = until.since(now.mono);
                let why = format!(
                    "This server holds worker id {worker_id} and uses it in {left} ms: the registry (etcd) can be restored from a snapshot without a sign, which may have lost a claim of the same id made just before this one, whose holder could go on issuing until its fence ends."
                );
                self.report(effects, ClaimStatus::Settling, &why, expires_unix_ms);
                left.clamp(1, heartbeat)
            }
            None => {
                self.report(effects, ClaimStatus::Held, "", expires_unix_ms);
                heartbeat
            }
        }
    }

    /// Holds `worker_id` under `fence`, and hands both to the generator unless a quarantine
    /// still runs (the claim is only kept, and renewed, until it ends).
    fn install(&mut self, effects: &mut Vec<Effect>, worker_id: u8, fence: Fence, now: Now) {
        self.held = Some((worker_id, fence));
        // A failure after this success is logged again, even with the same cause.
        self.last_failure.clear();
        if let Some(until) = self.quarantine_until_mono {
            if now.mono < until {
                return;
            }
            self.quarantine_until_mono = None;
        }
        effects.push(Effect::Install { worker_id, fence });
    }

    /// Stops the generator at once and forgets the claim.
    fn fence(&mut self, effects: &mut Vec<Effect>, status: ClaimStatus, why: &str) {
        self.quarantine_until_mono = None;
        effects.push(Effect::StopGenerator);
        if let Some((worker_id, _)) = self.held.take() {
            effects.push(Effect::Fenced {
                worker_id,
                why: why.to_string(),
            });
        }
        self.report(effects, status, why, 0);
    }

    /// A failed request's cause, logged once per change of cause.
    fn log_failure(&mut self, effects: &mut Vec<Effect>, why: &str) {
        if why != self.last_failure {
            effects.push(Effect::RequestFailed(why.to_string()));
            self.last_failure = why.to_string();
        }
    }

    fn report(&self, effects: &mut Vec<Effect>, status: ClaimStatus, why: &str, expires: i64) {
        effects.push(Effect::Report {
            status,
            worker_id: self.held.map_or(0, |h| h.0),
            why: why.to_string(),
            expires_unix_ms: expires,
        });
    }

    fn give_back(&self, effects: &mut Vec<Effect>, worker_id: u8, released: Option<i64>) {
        effects.push(Effect::GiveBack {
            worker_id,
            tokens: self.tokens.for_release(),
            released_unix_ms: released,
        });
    }
}

/// When the registry lets the claim go unless renewed, on this server's clock.
fn expiry(observed: &Observed, timing: ClaimTiming) -> i64 {
    observed
        .sample
        .to_local_ms(observed.sample.registry_unix_ms)
        + timing.ttl_ms() as i64
}

fn rejected_text(age: RequestAge, observed: &Observed) -> String {
    let s = observed.sample;
    match age {
        RequestAge::Ahead | RequestAge::Fresh => format!(
            "The registry did not act on the request: this server's clock read {} ms when it sent it, ahead of the registry's {} ms.",
            s.sent_unix_ms, s.registry_unix_ms
        ),
        RequestAge::Stale => format!(
            "The registry did not act on the request: it arrived {} ms after this server sent it, too late to be inside the claim's fence.",
            s.registry_unix_ms - s.sent_unix_ms
        ),
    }
}

fn skew_text(skew: SkewTooLarge) -> String {
    format!(
        "This server's clock differs from the registry's by {} ms; at most {} ms (a fifth of snowflake.claim_ttl) is allowed, because the registry's safety after it loses data depends on it.",
        skew.offset_ms, skew.max_ms
    )
}

/// Why a granted id was given back, or why no id is usable while every other is taken: its
/// floor is too far ahead of this server's clock.
pub fn mark_ahead_detail(
    worker_id: u8,
    floor_unix_ms: i64,
    ahead_ms: i64,
    usable_ms: i64,
) -> String {
    format!(
        "IDs of worker id {worker_id} must start at {} ({floor_unix_ms} ms), {ahead_ms} ms ahead of this server's clock; a caller would wait longer than snowflake.max_clock_drift + snowflake.max_clock_wait ({usable_ms} ms) for it.",
        format_unix_ms(floor_unix_ms)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TTL: u64 = 10_000;
    const LEAD: i64 = 11_000;
    const T0: i64 = 1_800_000_000_000;

    fn settings() -> HolderSettings {
        HolderSettings {
            datacenter_id: 1,
            timing: ClaimTiming::new(TTL),
            epoch_unix_ms: 0,
            uri: "redis://registry".into(),
            node: "host:5432".into(),
        }
    }

    fn holder(recorded: Option<LastClaim>) -> Holder {
        Holder::start(
            settings(),
            HolderRules::PRODUCT,
            "pm@host:5432",
            None,
            recorded,
            0,
        )
    }

    fn at(ms: i64) -> Now {
        Now {
            unix_ms: T0 + ms,
            mono: MonoMs(1_000_000 + ms as u64),
        }
    }

    /// A reply observed `offset_ms` off this server's clock, sent at `sent` and read at `now`.
    fn observed(sent: Now, now: Now, offset_ms: i64) -> Observed {
        Observed {
            sample: ClockSample {
                sent_unix_ms: sent.unix_ms,
                received_unix_ms: now.unix_ms,
                registry_unix_ms: now.unix_ms + offset_ms,
                registry_resolution_ms: 0,
            },
            born_unix_ms: T0 - 60_000,
            registry_id: Some(7),
            sample_age_ms: 0,
        }
    }

    fn granted(worker_id: u8, floor: Option<i64>, quarantine_ms: u64) -> Reply {
        Reply::Claim(ClaimReply::Granted {
            worker_id,
            granted: Granted::Free,
            floor_unix_ms: floor,
            quarantine_ms,
            inherited_unix_ms: None,
        })
    }

    /// Claims `worker_id` from a fresh holder at time 0; returns the holder.
    fn claimed(worker_id: u8) -> Holder {
        let mut h = holder(None);
        let step = h.begin(at(0), Some("a".into()), LEAD);
        assert!(matches!(step.next, Begin::Claim(_)));
        let step = h.on_reply(
            Ok((granted(worker_id, None, 0), observed(at(0), at(5), 0))),
            at(5),
        );
        assert!(matches!(step.next, AfterReply::Record(_)));
        h.on_recorded(Ok(()), at(6));
        assert_eq!(h.held().map(|h| h.0), Some(worker_id));
        h
    }

    fn installs(effects: &[Effect]) -> Vec<(u8, Fence)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Install { worker_id, fence } => Some((*worker_id, *fence)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_claim_keeps_its_tokens_before_it_is_sent_and_asks_for_the_recorded_id_first() {
        let recorded = LastClaim {
            datacenter_id: 1,
            worker_id: 9,
            floor_unix_ms: Some(T0),
            registry: None,
        };
        let mut h = holder(Some(recorded));
        let step = h.begin(at(0), Some("abc".into()), LEAD);
        assert_eq!(step.effects, vec![Effect::KeepTokens]);
        let Begin::Claim(request) = step.next else {
            panic!("expected a claim: {:?}", step.next);
        };
        assert_eq!(request.order[0], 9);
        assert_eq!(request.order.len(), usize::from(MAX_WORKER_ID) + 1);
        assert_eq!(request.tokens.write, "abc@host:5432");
        assert_eq!(h.tokens().next, "abc@host:5432");
        assert_eq!(request.cap_unix_ms, T0 + 5_000);
    }

    #[test]
    fn a_grant_is_recorded_before_it_is_installed_above_the_recorded_floor() {
        let recorded = LastClaim {
            datacenter_id: 1,
            worker_id: 3,
            floor_unix_ms: Some(T0 + 2_000),
            registry: None,
        };
        let mut h = holder(Some(recorded));
        h.begin(at(0), Some("a".into()), LEAD);
        let step = h.on_reply(
            Ok((granted(3, Some(T0 + 1_000), 0), observed(at(0), at(5), 0))),
            at(5),
        );
        assert!(
            installs(&step.effects).is_empty(),
            "nothing used before the claim file"
        );
        let AfterReply::Record(last) = step.next else {
            panic!("expected the claim file: {:?}", step.next);
        };
        assert_eq!(last.floor_unix_ms, Some(T0 + 2_000));
        assert_eq!(last.registry.as_ref().map(|r| r.id), Some(7));
        let step = h.on_recorded(Ok(()), at(6));
        let floor_at = step
            .effects
            .iter()
            .position(|e| *e == Effect::RaiseFloor(T0 + 2_000));
        let install_at = step
            .effects
            .iter()
            .position(|e| matches!(e, Effect::Install { .. }));
        assert!(
            floor_at.unwrap() < install_at.unwrap(),
            "{:?}",
            step.effects
        );
        assert_eq!(step.next, 2_000);
    }

    #[test]
    fn a_claim_file_that_cannot_be_written_gives_the_grant_back_unused() {
        let mut h = holder(None);
        h.begin(at(0), Some("a".into()), LEAD);
        h.on_reply(Ok((granted(2, None, 0), observed(at(0), at(5), 0))), at(5));
        let step = h.on_recorded(Err("disk full".into()), at(6));
        assert!(installs(&step.effects).is_empty());
        assert!(step.effects.iter().any(|e| matches!(
            e,
            Effect::GiveBack {
                worker_id: 2,
                released_unix_ms: None,
                ..
            }
        )));
        assert_eq!(h.held(), None);
    }

    #[test]
    fn a_fence_that_ran_out_ends_the_claim_and_claims_again() {
        let mut h = claimed(4);
        // The fence reaches 5 s from the claim's send; the server was stopped past it.
        let step = h.begin(at(6_000), Some("b".into()), LEAD);
        assert_eq!(step.effects[0], Effect::StopGenerator);
        assert!(matches!(
            step.effects[1],
            Effect::Fenced { worker_id: 4, .. }
        ));
        let Begin::Claim(request) = step.next else {
            panic!("expected a claim, not a renewal: {:?}", step.next);
        };
        assert_eq!(request.order[0], 4, "the same id is asked for first");
    }

    #[test]
    fn a_failed_renewal_keeps_issuing_only_while_the_fence_holds() {
        let mut h = claimed(4);
        let step = h.begin(at(2_000), Some("b".into()), LEAD);
        assert!(matches!(step.next, Begin::Renew { worker_id: 4, .. }));
        let step = h.on_reply(Err("timeout".into()), at(3_000));
        assert!(step
            .effects
            .contains(&Effect::RequestFailed("timeout".into())));
        assert_eq!(h.held().map(|h| h.0), Some(4));
        // The same cause again is not logged again; past the fence, the claim ends.
        h.begin(at(4_000), Some("c".into()), LEAD);
        let step = h.on_reply(Err("timeout".into()), at(5_100));
        assert!(!step
            .effects
            .contains(&Effect::RequestFailed("timeout".into())));
        assert!(step.effects.contains(&Effect::StopGenerator));
        assert_eq!(h.held(), None);
    }

    #[test]
    fn a_retried_renewal_writes_the_token_it_drew_before() {
        let mut h = claimed(4);
        let Begin::Renew { request, .. } = h.begin(at(2_000), Some("b".into()), LEAD).next else {
            panic!("expected a renewal");
        };
        h.on_reply(Err("timeout".into()), at(3_000));
        let Begin::Renew { request: again, .. } = h.begin(at(3_100), Some("c".into()), LEAD).next
        else {
            panic!("expected a renewal");
        };
        assert_eq!(again.tokens.write, request.tokens.write);
        assert!(again.tokens.held.contains(&"a@host:5432".to_string()));
    }

    #[test]
    fn a_renewal_read_after_its_fence_ended_ends_the_claim() {
        let mut h = claimed(4);
        h.begin(at(2_000), Some("b".into()), LEAD);
        let renewed = Reply::Renew(RenewReply::Renewed {
            inherited_unix_ms: None,
        });
        // Stopped for 9 s with the reply in its socket: read after the new fence's end.
        let step = h.on_reply(
            Ok((renewed, observed(at(2_000), at(11_000), 0))),
            at(11_000),
        );
        assert!(installs(&step.effects).is_empty());
        assert!(step.effects.contains(&Effect::StopGenerator));
        assert_eq!(h.held(), None);
        assert!(!step.effects.iter().any(|e| matches!(
            e,
            Effect::Report {
                status: ClaimStatus::Held,
                ..
            }
        )));
        // The token it wrote is confirmed: the next claim takes the id back as its own.
        assert_eq!(h.tokens().current, "b@host:5432");
        assert_eq!(step.next, AfterReply::Wait(1));
    }

    #[test]
    fn a_renewal_lost_to_a_memory_copy_says_so() {
        let mut h = claimed(4);
        h.begin(at(2_000), Some("b".into()), LEAD);
        let lost = Reply::Renew(RenewReply::Lost {
            holder: Some("zzz@host:5432".into()),
        });
        let step = h.on_reply(Ok((lost, observed(at(2_000), at(2_005), 0))), at(2_005));
        let why = step
            .effects
            .iter()
            .find_map(|e| match e {
                Effect::Fenced { why, .. } => Some(why.clone()),
                _ => None,
            })
            .unwrap();
        assert!(
            why.contains("a copy of this server made with its memory"),
            "{why}"
        );
        assert_eq!(step.next, AfterReply::Wait(1));
    }

    #[test]
    fn a_floor_far_ahead_is_given_back_and_avoided_until_the_clock_nears_it() {
        let mut h = holder(None);
        h.begin(at(0), Some("a".into()), LEAD);
        let floor = T0 + 60_000;
        let step = h.on_reply(
            Ok((granted(0, Some(floor), 0), observed(at(0), at(5), 0))),
            at(5),
        );
        assert_eq!(step.next, AfterReply::Wait(1));
        assert!(step
            .effects
            .iter()
            .any(|e| matches!(e, Effect::MarkAhead { worker_id: 0, .. })));
        let Begin::Claim(request) = h.begin(at(10), Some("b".into()), LEAD).next else {
            panic!("expected a claim");
        };
        assert!(!request.order.contains(&0));
        let Begin::Claim(request) = h.begin(at(50_000), Some("c".into()), LEAD).next else {
            panic!("expected a claim");
        };
        assert!(request.order.contains(&0));
    }

    #[test]
    fn a_quarantined_grant_is_held_and_renewed_but_used_only_after_it() {
        let mut h = holder(None);
        h.begin(at(0), Some("a".into()), LEAD);
        h.on_reply(
            Ok((granted(5, None, 7_000), observed(at(0), at(5), 0))),
            at(5),
        );
        let step = h.on_recorded(Ok(()), at(6));
        assert!(installs(&step.effects).is_empty());
        assert!(step.effects.contains(&Effect::RaiseFloor(T0 + 6 + 7_000)));
        assert_eq!(step.next, 2_000);
        let mut first_install = None;
        for k in 1..=5 {
            let t = 2_000 * k;
            h.begin(at(t), Some(format!("r{k}")), LEAD);
            let renewed = Reply::Renew(RenewReply::Renewed {
                inherited_unix_ms: None,
            });
            let step = h.on_reply(Ok((renewed, observed(at(t), at(t + 5), 0))), at(t + 5));
            if first_install.is_none() && !installs(&step.effects).is_empty() {
                first_install = Some(t + 5);
            }
        }
        assert_eq!(first_install, Some(8_005));
    }

    #[test]
    fn a_quarantine_counts_from_the_checked_clock_when_the_clock_stepped_back_at_the_reply() {
        let mut h = holder(None);
        h.begin(at(0), Some("a".into()), LEAD);
        // The sample (send and receipt) is checked; then the wall clock steps back 8 s
        // before the reply is handled, 500 ms after the send.
        h.on_reply(
            Ok((granted(5, None, 7_000), observed(at(0), at(5), 0))),
            at(5),
        );
        let stepped = Now {
            unix_ms: T0 + 500 - 8_000,
            mono: at(500).mono,
        };
        let step = h.on_recorded(Ok(()), stepped);
        assert!(
            step.effects.contains(&Effect::RaiseFloor(T0 + 500 + 7_000)),
            "{:?}",
            step.effects
        );
    }

    #[test]
    fn a_quarantine_counts_from_the_checked_reading_when_the_send_clock_was_back_too() {
        let mut h = holder(None);
        // The wall clock reads 5 s back at the send, right again when the registry's clock
        // is read (the reading the skew check binds, at 1_000), back 8 s at the reply 4 s
        // later (the step went on after that reading).
        let send = Now {
            unix_ms: T0 - 5_000,
            mono: at(0).mono,
        };
        h.begin(send, Some("a".into()), LEAD);
        let mut seen = observed(send, at(1_000), 0);
        seen.sample_age_ms = 4_000;
        let reply = Now {
            unix_ms: T0 + 5_000 - 8_000,
            mono: at(5_000).mono,
        };
        h.on_reply(Ok((granted(5, None, 7_000), seen)), reply);
        let written = Now {
            unix_ms: reply.unix_ms + 10,
            mono: reply.mono.plus(10),
        };
        let step = h.on_recorded(Ok(()), written);
        assert!(
            step.effects
                .contains(&Effect::RaiseFloor(T0 + 5_010 + 7_000)),
            "{:?}",
            step.effects
        );
    }

    #[test]
    fn another_registry_is_refused_and_the_grant_given_back() {
        let recorded = LastClaim {
            datacenter_id: 1,
            worker_id: 3,
            floor_unix_ms: Some(T0),
            registry: Some(RegistrySeen {
                uri: "redis://old".into(),
                id: 99,
            }),
        };
        let mut h = holder(Some(recorded));
        h.begin(at(0), Some("a".into()), LEAD);
        let step = h.on_reply(Ok((granted(3, None, 0), observed(at(0), at(5), 0))), at(5));
        assert!(matches!(step.next, AfterReply::Wait(_)));
        assert!(step.effects.iter().any(|e| matches!(
            e,
            Effect::Report {
                status: ClaimStatus::Refused,
                ..
            }
        )));
        assert!(step
            .effects
            .iter()
            .any(|e| matches!(e, Effect::GiveBack { .. })));
    }

    #[test]
    fn a_release_is_no_lower_than_the_mark_inherited_at_the_latest_write() {
        let mut h = claimed(4);
        h.begin(at(2_000), Some("b".into()), LEAD);
        let renewed = Reply::Renew(RenewReply::Renewed {
            inherited_unix_ms: Some(T0 + 9_000),
        });
        h.on_reply(Ok((renewed, observed(at(2_000), at(2_005), 0))), at(2_005));
        let effects = h.release(T0 + 2_500, T0 + 3_000);
        assert!(matches!(
            effects[..],
            [Effect::GiveBack {
                worker_id: 4,
                released_unix_ms: Some(r),
                ..
            }] if r == T0 + 9_000
        ));
    }

    #[test]
    fn a_refusal_for_claim_ttl_makes_later_claims_settle_for_the_longer_one() {
        let mut h = holder(None);
        h.begin(at(0), Some("a".into()), LEAD);
        let refused = Reply::Claim(ClaimReply::TtlMismatch {
            others_min_ms: 30_000,
            others_max_ms: 30_000,
        });
        h.on_reply(Ok((refused, observed(at(0), at(5), 0))), at(5));
        let Begin::Claim(request) = h.begin(at(2_000), Some("b".into()), LEAD).next else {
            panic!("expected a claim");
        };
        assert_eq!(request.fleet_ttl_ms, 30_000);
        assert_eq!(request.claim_timing().ttl_ms(), 30_000);
    }

    #[test]
    fn the_longer_claim_ttl_is_kept_in_a_file_until_a_grant() {
        let mut h = holder(None);
        h.begin(at(0), Some("a".into()), LEAD);
        let refused = Reply::Claim(ClaimReply::TtlMismatch {
            others_min_ms: 30_000,
            others_max_ms: 30_000,
        });
        let step = h.on_reply(Ok((refused.clone(), observed(at(0), at(5), 0))), at(5));
        assert!(step.effects.contains(&Effect::RememberFleetTtl(30_000)));
        // Named again: nothing new to keep.
        h.begin(at(2_000), Some("b".into()), LEAD);
        let step = h.on_reply(Ok((refused, observed(at(2_000), at(2_005), 0))), at(2_005));
        assert!(!step
            .effects
            .iter()
            .any(|e| matches!(e, Effect::RememberFleetTtl(_))));
        // A restart reads it back; a grant forgets it.
        let mut h = Holder::start(
            settings(),
            HolderRules::PRODUCT,
            "pm2@host:5432",
            None,
            None,
            30_000,
        );
        let Begin::Claim(request) = h.begin(at(0), Some("c".into()), LEAD).next else {
            panic!("expected a claim");
        };
        assert_eq!(request.fleet_ttl_ms, 30_000);
        h.on_reply(Ok((granted(1, None, 0), observed(at(0), at(5), 0))), at(5));
        let step = h.on_recorded(Ok(()), at(6));
        assert!(step.effects.contains(&Effect::RememberFleetTtl(0)));
    }

    /// One event of a holder's life, for the property below.
    #[derive(Debug, Clone)]
    enum Event {
        Begin,
        Fail,
        Granted {
            worker: u8,
            floor_ahead: i64,
            quarantine_ms: u64,
        },
        Renewed {
            mark_ahead: Option<i64>,
        },
        Lost,
        Settling,
        Skewed,
        RecordFails,
    }

    fn event() -> impl Strategy<Value = (Event, u64)> {
        let kind = prop_oneof![
            3 => Just(Event::Begin),
            1 => Just(Event::Fail),
            2 => (0u8..4, -3_000i64..20_000, prop_oneof![Just(0u64), 1_000u64..15_000])
                .prop_map(|(worker, floor_ahead, quarantine_ms)| Event::Granted {
                    worker,
                    floor_ahead,
                    quarantine_ms
                }),
            3 => proptest::option::of(-5_000i64..5_000).prop_map(|m| Event::Renewed { mark_ahead: m }),
            1 => Just(Event::Lost),
            1 => Just(Event::Settling),
            1 => Just(Event::Skewed),
            1 => Just(Event::RecordFails),
        ];
        (kind, 0u64..4_000)
    }

    proptest! {
        /// Whatever the registry answers and whenever: the generator is handed only the
        /// claim the holder holds, under a fence of a request sent no earlier than the last
        /// claim file's write for that id, only after a grant's floor was raised and its
        /// quarantine has run out; and a release is no lower than any floor raised.
        #[test]
        fn the_generator_gets_only_what_the_rules_allow(events in proptest::collection::vec(event(), 1..60)) {
            let mut h = holder(None);
            let mut t: i64 = 0;
            let mut sent: Option<Now> = None;
            let mut replied: Option<Now> = None;
            let mut recorded_worker: Option<u8> = None;
            let mut floor_raised = i64::MIN;
            let mut usable_from_mono = MonoMs::ZERO;
            for (event, dt) in events {
                t += dt as i64;
                let now = at(t);
                let grant_quarantine_ms = match event {
                    Event::Granted { quarantine_ms, .. } => quarantine_ms,
                    _ => 0,
                };
                let effects = match event {
                    Event::Begin => {
                        let step = h.begin(now, Some(format!("t{t}")), LEAD);
                        sent = matches!(step.next, Begin::Claim(_) | Begin::Renew { .. }).then_some(now);
                        step.effects
                    }
                    Event::RecordFails => h.on_recorded(Err("disk".into()), now).effects,
                    _ => {
                        let Some(sent_at) = sent.take() else { continue };
                        replied = Some(sent_at);
                        let reply = match event {
                            Event::Fail => Err("down".to_string()),
                            Event::Granted { worker, floor_ahead, quarantine_ms } => Ok(granted(
                                worker,
                                Some(now.unix_ms + floor_ahead),
                                quarantine_ms,
                            )),
                            Event::Renewed { mark_ahead } => Ok(Reply::Renew(RenewReply::Renewed {
                                inherited_unix_ms: mark_ahead.map(|m| now.unix_ms + m),
                            })),
                            Event::Lost => Ok(Reply::Renew(RenewReply::Lost { holder: None })),
                            Event::Settling => Ok(Reply::Claim(ClaimReply::Settling { wait_ms: 500 })),
                            _ => Ok(Reply::Claim(ClaimReply::Rejected(RequestAge::Stale))),
                        };
                        let offset = if matches!(event, Event::Skewed) { 3_000 } else { 0 };
                        let reply = reply.map(|r| (r, observed(sent_at, now, offset)));
                        let mut step = h.on_reply(reply, now);
                        if let AfterReply::Record(last) = &step.next {
                            recorded_worker = Some(last.worker_id);
                            let more = h.on_recorded(Ok(()), now);
                            step.effects.extend(more.effects);
                        }
                        step.effects
                    }
                };
                for effect in &effects {
                    match effect {
                        Effect::RaiseFloor(f) => {
                            // Each grant raises the floor once, with its own quarantine.
                            floor_raised = floor_raised.max(*f);
                            usable_from_mono = now.mono.plus(grant_quarantine_ms);
                        }
                        Effect::Install { worker_id, fence } => {
                            prop_assert_eq!(h.held(), Some((*worker_id, *fence)));
                            prop_assert_eq!(recorded_worker, Some(*worker_id));
                            prop_assert!(floor_raised > i64::MIN);
                            prop_assert!(now.mono >= usable_from_mono);
                            // The fence of the request whose reply this is.
                            let from = replied.expect("installed without a reply");
                            prop_assert_eq!(*fence, settings().timing.fence(from.unix_ms, from.mono));
                        }
                        Effect::GiveBack { released_unix_ms: Some(r), .. } => {
                            prop_assert!(*r >= floor_raised);
                        }
                        _ => {}
                    }
                }
                let installed = !installs(&effects).is_empty();
                prop_assert!(h.held().is_some() || !installed);
            }
            if h.held().is_some() {
                for effect in h.release(T0, T0) {
                    if let Effect::GiveBack { released_unix_ms: Some(r), .. } = effect {
                        prop_assert!(r >= h.floor_unix_ms);
                    }
                }
            }
        }
    }
}
