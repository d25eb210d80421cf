//! Worker-id claims from a registry, in plain Rust (no pgrx, no network): the timing that
//! follows from `snowflake.claim_ttl`, the fence a holder keeps, the check of the local clock
//! against the registry's, and where a new holder's IDs must start.
//!
//! Why the numbers are safe (see docs/fleets.md):
//! - A holder renews every `ttl / 5`. Each renewal that the registry confirms lets it issue
//!   IDs with timestamps below `cap = wall clock at the renewal's start + ttl / 2`, and only
//!   until `ttl / 2` after that start on its monotonic clock (the fence). The registry keeps
//!   the claim until `ttl` after it received the renewal, which is later: a holder that stops
//!   hearing from the registry has stopped issuing before anyone else can get its id.
//! - The registry also keeps, per id, the highest cap any holder was granted (the high-water
//!   mark). A new holder's IDs start above it, so even a holder that keeps issuing past its
//!   claim (a process frozen by SIGSTOP and woken later) cannot collide: its IDs are below its
//!   last cap.
//! - A registry that lost its data (restarted, replaced, restored) lost those marks. It grants
//!   no free id until `ttl + ttl / 5` after it noticed (it "settles"): live holders re-assert
//!   their claims in that time, and every other holder has passed its fence. Holders' clocks
//!   are kept within `ttl / 5` of the registry's, so a cap granted before the loss is behind
//!   every clock by then, with `ttl + ttl / 5 - ttl / 2 - 2 * ttl / 5 = 3 * ttl / 10` to spare
//!   for the registry's own clock: a registry that comes back on another host (a restart
//!   elsewhere, a failover) may have a clock that far behind the old one
//!   ([`ClaimTiming::max_registry_clock_jump_ms`]; issue 37's third path had 1.2 s against the
//!   `ttl / 10` the settle of one `ttl` left).

use crate::mono::MonoMs;
use serde::{Deserialize, Serialize};

/// Default of `snowflake.claim_ttl` (ms).
pub const DEFAULT_CLAIM_TTL_MS: u64 = 10_000;
/// Smallest `snowflake.claim_ttl` (ms): below it a heartbeat is shorter than a slow registry
/// round trip.
pub const MIN_CLAIM_TTL_MS: u64 = 2_000;
/// Largest `snowflake.claim_ttl` (ms).
pub const MAX_CLAIM_TTL_MS: u64 = 600_000;

/// The intervals that follow from the claim TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimTiming {
    ttl_ms: u64,
}

impl ClaimTiming {
    /// Timing for a claim TTL of `ttl_ms`, clamped to the allowed range.
    pub fn new(ttl_ms: u64) -> ClaimTiming {
        ClaimTiming {
            ttl_ms: ttl_ms.clamp(MIN_CLAIM_TTL_MS, MAX_CLAIM_TTL_MS),
        }
    }

    /// How long the registry keeps a claim after its last renewal.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// How often the holder renews; also the time limit of one registry request.
    pub fn heartbeat_ms(&self) -> u64 {
        self.ttl_ms / 5
    }

    /// How far past a renewal's start the holder may issue: in ID time (the cap, on its wall
    /// clock) and in elapsed time (the deadline, on its monotonic clock).
    pub fn fence_reach_ms(&self) -> u64 {
        self.ttl_ms / 2
    }

    /// Largest difference between a holder's clock and the registry's that it accepts.
    pub fn max_skew_ms(&self) -> u64 {
        self.ttl_ms / 5
    }

    /// The fence granted by a renewal that started at `started_unix_ms` (wall clock) and
    /// `started_mono_ms` (monotonic clock).
    pub fn fence(&self, started_unix_ms: i64, started_mono: MonoMs) -> Fence {
        let reach = self.fence_reach_ms();
        Fence {
            cap_unix_ms: started_unix_ms.saturating_add(reach as i64),
            deadline_mono: started_mono.plus(reach),
        }
    }

    /// How long a registry that noticed a loss of data settles (ms): the claim's ttl, and
    /// an allowed skew more for a registry whose clock differs from its predecessor's (see
    /// the module's text).
    pub fn settle_ms(&self) -> u64 {
        self.ttl_ms + self.max_skew_ms()
    }

    /// The timing of the longer of this `claim_ttl` and `ttl_ms`: what a claim settles (and
    /// an etcd grant is quarantined) by when this server was refused beside a holder with a
    /// longer one ([`ttl_mismatch`]).
    pub fn at_least(self, ttl_ms: u64) -> ClaimTiming {
        ClaimTiming::new(self.ttl_ms.max(ttl_ms))
    }

    /// The `claim_ttl` values (ms) the other holders of a datacenter may have for this
    /// server to be given an id there: within a fifth either way, 4/5 to 5/4 of its own
    /// (see [`ttl_mismatch`]).
    pub fn fleet_ttl_range_ms(&self) -> (u64, u64) {
        (
            (self.ttl_ms * 4).div_ceil(5),
            self.ttl_ms.saturating_mul(5) / 4,
        )
    }

    /// How far a registry's clock may go back between incarnations (a restart or failover
    /// onto another host) and the settle still cover every cap granted before: the settle's
    /// spare over the fence's reach and twice the allowed skew.
    pub fn max_registry_clock_jump_ms(&self) -> u64 {
        self.settle_ms() - self.fence_reach_ms() - 2 * self.max_skew_ms()
    }

    /// How long a registry that noticed a loss of data at `born_unix_ms` (its clock) still
    /// refuses free ids at `now_unix_ms` (0: it grants them).
    pub fn settle_wait_ms(&self, born_unix_ms: i64, now_unix_ms: i64) -> u64 {
        born_unix_ms
            .saturating_add(self.settle_ms() as i64)
            .saturating_sub(now_unix_ms)
            .max(0) as u64
    }
}

/// When a quarantined grant may first be used, from when its reply was handled: nothing
/// is issued before `until_mono` (monotonic), and its IDs start at or above
/// `first_id_unix_ms` (wall clock), whatever the clock does meanwhile (see
/// [`ClaimTiming::grant_quarantine_ms`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quarantine {
    /// The earliest timestamp of its IDs (Unix ms).
    pub first_id_unix_ms: i64,
    /// Monotonic time before which nothing is issued under it.
    pub until_mono: MonoMs,
}

impl Quarantine {
    /// The quarantine of `quarantine_ms` for a grant whose reply was handled at
    /// `now_unix_ms` and `now_mono` (after the reply: a step may read the store well after
    /// it began, and its clock sample is taken before its reads). None for no quarantine.
    pub fn after_reply(
        quarantine_ms: u64,
        now_unix_ms: i64,
        now_mono: MonoMs,
    ) -> Option<Quarantine> {
        (quarantine_ms > 0).then(|| Quarantine {
            first_id_unix_ms: now_unix_ms.saturating_add(quarantine_ms as i64),
            until_mono: now_mono.plus(quarantine_ms),
        })
    }
}

/// What a holder may issue under its claim: IDs with timestamps below `cap_unix_ms`, until
/// its monotonic clock reaches `deadline_mono`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// Exclusive bound of the IDs' timestamps, Unix ms (this server's clock).
    pub cap_unix_ms: i64,
    /// Monotonic time after which nothing may be issued without a renewal.
    pub deadline_mono: MonoMs,
}

impl Fence {
    /// No claim: nothing may be issued.
    pub const NONE: Fence = Fence {
        cap_unix_ms: i64::MIN,
        deadline_mono: MonoMs::ZERO,
    };

    /// No registry (a configured worker id): no limit.
    pub const UNLIMITED: Fence = Fence {
        cap_unix_ms: i64::MAX,
        deadline_mono: MonoMs::MAX,
    };

    /// Whether an ID with timestamp `timestamp_unix_ms` may be issued at `now_mono`.
    pub fn allows(&self, timestamp_unix_ms: i64, now_mono: MonoMs) -> bool {
        timestamp_unix_ms < self.cap_unix_ms && now_mono < self.deadline_mono
    }

    /// Whether the deadline has passed at `now_mono`.
    pub fn expired(&self, now_mono: MonoMs) -> bool {
        now_mono >= self.deadline_mono
    }
}

impl Default for Fence {
    fn default() -> Self {
        Fence::NONE
    }
}

/// One reading of the registry's clock, between two readings of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// Our wall clock when the request was sent (Unix ms).
    pub sent_unix_ms: i64,
    /// Our wall clock when the answer arrived (Unix ms).
    pub received_unix_ms: i64,
    /// The registry's clock in its answer (Unix ms): for a clock read in whole seconds, the
    /// middle of that second.
    pub registry_unix_ms: i64,
    /// How coarse the registry's clock reading is (ms): 0 for a millisecond clock (Redis,
    /// PostgreSQL), 1,000 for an HTTP `Date` header (etcd). Half of it is uncertain.
    pub registry_resolution_ms: i64,
}

impl ClockSample {
    /// The registry's clock minus ours, estimated at the round trip's midpoint.
    pub fn offset_ms(&self) -> i64 {
        let midpoint = self.sent_unix_ms + (self.received_unix_ms - self.sent_unix_ms) / 2;
        self.registry_unix_ms - midpoint
    }

    /// How far the offset may be off (ms): the round trip leaves half of itself uncertain,
    /// plus a millisecond of rounding, plus half of the registry clock's resolution.
    pub fn uncertainty_ms(&self) -> i64 {
        (self.received_unix_ms - self.sent_unix_ms).max(0) / 2
            + 1
            + self.registry_resolution_ms.max(0) / 2
    }

    /// The smallest difference between the two clocks that the sample proves.
    pub fn proven_skew_ms(&self) -> u64 {
        (self.offset_ms().unsigned_abs()).saturating_sub(self.uncertainty_ms() as u64)
    }

    /// How far the registry's clock went back (ms) between an `earlier` sample and this
    /// one, as both prove it (each one's uncertainty deducted; 0 or less: not proven), taking
    /// this server's clock as the reference: for two incarnations of a registry on hosts
    /// whose clocks differ.
    pub fn proven_registry_clock_back_ms(&self, earlier: &ClockSample) -> i64 {
        earlier.offset_ms() - self.offset_ms() - earlier.uncertainty_ms() - self.uncertainty_ms()
    }

    /// The registry's clock translated to ours.
    pub fn to_local_ms(&self, registry_unix_ms: i64) -> i64 {
        registry_unix_ms - self.offset_ms()
    }
}

/// Our clock is further from the registry's than the claim timing allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkewTooLarge {
    /// The registry's clock minus ours (ms).
    pub offset_ms: i64,
    /// The allowed difference (ms).
    pub max_ms: u64,
}

/// Checks a clock sample against the allowed difference.
pub fn check_skew(sample: &ClockSample, timing: ClaimTiming) -> Result<(), SkewTooLarge> {
    if sample.proven_skew_ms() > timing.max_skew_ms() {
        return Err(SkewTooLarge {
            offset_ms: sample.offset_ms(),
            max_ms: timing.max_skew_ms(),
        });
    }
    Ok(())
}

/// How a registry granted a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granted {
    /// The id was held under this server's own token (a renewal after a crash restart of
    /// this server, which keeps its postmaster and so its token).
    Own,
    /// The id was free.
    Free,
}

/// Where this server's IDs must start under a claim (Unix ms): above every ID an earlier
/// holder of the id could have issued. It is the highest of
/// - the registry's floor for the grant (`registry_floor_unix_ms`: one above the id's
///   high-water mark when it was granted free; for an own claim, the floor recorded then);
/// - this server's clock when the grant arrived (`clock_unix_ms`): after the registry lost
///   its data and settled, every cap granted before the loss is behind a clock within the
///   allowed skew (see the module's notes), so a clock that steps back later cannot take
///   IDs below it;
/// - the floor this server recorded durably for the same pair before (`recorded_unix_ms`),
///   which survives every kind of restart of this server.
///
/// It never goes down while the claim is held.
pub fn claim_floor_unix_ms(
    registry_floor_unix_ms: Option<i64>,
    clock_unix_ms: i64,
    recorded_unix_ms: Option<i64>,
) -> i64 {
    registry_floor_unix_ms
        .unwrap_or(i64::MIN)
        .max(clock_unix_ms)
        .max(recorded_unix_ms.unwrap_or(i64::MIN))
}

/// The registry's floor for a free grant: one above the id's mark. The mark is the
/// highest cap ever granted for the id (`high_water_unix_ms`), or, when its last holder
/// released it cleanly, what that holder recorded then (`released_unix_ms`: the highest
/// timestamp it could have issued, from its generator, never from a clock).
pub fn free_grant_floor_unix_ms(
    high_water_unix_ms: Option<i64>,
    released_unix_ms: Option<i64>,
) -> Option<i64> {
    released_unix_ms
        .or(high_water_unix_ms)
        .map(|mark| mark.saturating_add(1))
}

/// The value a holder leaves when it releases its claim cleanly: the highest timestamp it
/// could have issued (its generator's position, its durable lease end) and its starting
/// floor, instead of its last cap, so that the next holder (often itself, after a restart)
/// does not wait for a cap it never used. The registry keeps the id's high-water mark as it
/// was (marks only rise) and hands this value to the next holder as its floor instead.
pub fn release_high_water(
    position_unix_ms: i64,
    lease_end_unix_ms: i64,
    floor_unix_ms: i64,
) -> i64 {
    position_unix_ms.max(lease_end_unix_ms).max(floor_unix_ms)
}

/// How a registry judges a request by the time its holder sent it (`sent_unix_ms`, the
/// holder's clock) and the time it is acted on (`registry_unix_ms`, the registry's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestAge {
    /// Act on it.
    Fresh,
    /// The holder's clock is ahead of the registry's by more than the allowed skew: the
    /// cap it asks to record could poison the id's mark. Nothing is written.
    Ahead,
    /// It arrives so late that the fence it would renew may have expired (a request held up
    /// in the network, or a holder's clock behind by more than the allowed skew). Nothing is
    /// written: a lapsed claim may have been granted to another server since.
    Stale,
}

impl ClaimTiming {
    /// Largest lead of a request's send time over the registry's clock that is acted on.
    pub fn max_request_lead_ms(&self) -> i64 {
        self.max_skew_ms() as i64
    }

    /// Largest age of a request (registry clock minus the holder's send time) that is acted
    /// on: the fence a request grants lasts `fence_reach_ms` from its send, and the two clocks
    /// may differ by `max_skew_ms`, so a request older than their difference might arrive
    /// after its fence expired.
    pub fn max_request_age_ms(&self) -> i64 {
        self.fence_reach_ms() as i64 - self.max_skew_ms() as i64
    }

    /// Judges a request (see [`RequestAge`]).
    pub fn request_age(&self, sent_unix_ms: i64, registry_unix_ms: i64) -> RequestAge {
        if sent_unix_ms - registry_unix_ms > self.max_request_lead_ms() {
            RequestAge::Ahead
        } else if registry_unix_ms - sent_unix_ms > self.max_request_age_ms() {
            RequestAge::Stale
        } else {
            RequestAge::Fresh
        }
    }

    /// Whether a renewal may take back a claim the registry no longer has: only when the
    /// registry lost its data since the holder last heard from it (its `born` moved from
    /// `known_born_unix_ms`), and only while it still settles, when it has granted that id
    /// to nobody. A claim that merely lapsed (the holder was cut off, or its renewal was held
    /// up) may belong to another server by now: never taken back.
    pub fn may_reassert(
        &self,
        known_born_unix_ms: i64,
        registry_born_unix_ms: i64,
        registry_unix_ms: i64,
    ) -> bool {
        registry_born_unix_ms != known_born_unix_ms
            && self.settle_wait_ms(registry_born_unix_ms, registry_unix_ms) > 0
    }

    /// How long after its reply a claim from a store that can lose writes without a sign
    /// (etcd restored from a snapshot) may first be used: nothing is issued under it before,
    /// and its IDs start at or above the reply's arrival plus this (its wall clock). A restore
    /// can lose a grant of the same id made just before it, whose holder, cut off from the
    /// store, goes on issuing under its fence; no wait before the grant can see such a
    /// holder (the waiter may never have seen its claim), so the wait comes after. That
    /// holder's last renewal began before this grant's read of the store, so before its reply
    /// arrived (not before its request was sent: a request held up, or retried on another
    /// member, reads the store later; an adversarial review got duplicates from the send);
    /// its cap is below that plus the fence's reach, on a clock that may lead this server's
    /// by twice the allowed skew, plus the registry clock jump the settle allows (the two
    /// clocks were checked against different members, or a member and its restored
    /// successor), plus the registry clock's resolution (`registry_resolution_ms`). Issue
    /// 37's simulator found the waits before a grant insufficient whatever their length.
    pub fn grant_quarantine_ms(&self, registry_resolution_ms: u64) -> u64 {
        self.fence_reach_ms()
            + 2 * self.max_skew_ms()
            + self.max_registry_clock_jump_ms()
            + registry_resolution_ms
    }

    /// How far ahead of this server's clock a claim's floor may be and still be used: a
    /// caller waits for it like for a restart's resume point, and that wait may not exceed
    /// `max_clock_wait_ms` (the ID clock may lead the wall clock by `max_drift_ms`).
    pub fn usable_floor_lead_ms(max_drift_ms: u64, max_clock_wait_ms: u64) -> i64 {
        max_drift_ms.saturating_add(max_clock_wait_ms) as i64
    }
}

/// Why a holder has no usable claim, as shown to callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum ClaimStatus {
    /// The background worker has not finished its first attempt.
    #[default]
    Starting,
    /// A claim is held and renewed.
    Held,
    /// The registry cannot be reached (or answered with an error).
    Unreachable,
    /// The registry lost its data recently and grants no free id yet.
    Settling,
    /// Every worker id of the datacenter is claimed.
    Exhausted,
    /// The claim was not renewed in time, or another node holds it now.
    Fenced,
    /// The registry refuses this server for good (another epoch, a clock too far off).
    Refused,
    /// The only ids this server could claim have a high-water mark further ahead of its
    /// clock than a caller may wait (`snowflake.max_clock_drift` + `snowflake.max_clock_wait`).
    MarkAhead,
}

impl ClaimStatus {
    /// A word for monitoring.
    pub fn name(self) -> &'static str {
        match self {
            ClaimStatus::Starting => "starting",
            ClaimStatus::Held => "held",
            ClaimStatus::Unreachable => "unreachable",
            ClaimStatus::Settling => "settling",
            ClaimStatus::Exhausted => "exhausted",
            ClaimStatus::Fenced => "fenced",
            ClaimStatus::Refused => "refused",
            ClaimStatus::MarkAhead => "mark_ahead",
        }
    }
}

/// What the heartbeat does after a renewal attempt that failed (the registry did not answer,
/// or answered with an error), given the fence it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// The fence still holds: keep issuing, try again at the next heartbeat.
    Retry,
    /// The fence has expired: stop issuing now, and claim again once the registry answers.
    Fence,
}

/// Decides what a failed renewal means at `now_mono`.
pub fn after_failed_renewal(fence: Fence, now_mono: MonoMs) -> AfterFailure {
    if fence.expired(now_mono) {
        AfterFailure::Fence
    } else {
        AfterFailure::Retry
    }
}

/// Whether a holder asks to re-assert its claim in a renewal, should the registry have lost
/// it: only while its fence holds, since after that the id may have been granted to another
/// node. The registry decides too ([`ClaimTiming::may_reassert`]).
pub fn may_reassert(fence: Fence, now_mono: MonoMs) -> bool {
    !fence.expired(now_mono)
}

/// The order in which free worker ids are tried: the one this server held last (stable ids
/// across restarts), then the rest from 0 up.
pub fn claim_order(preferred: Option<u8>, max_worker_id: u8) -> Vec<u8> {
    let mut order: Vec<u8> = Vec::with_capacity(usize::from(max_worker_id) + 1);
    if let Some(p) = preferred.filter(|p| *p <= max_worker_id) {
        order.push(p);
    }
    order.extend((0..=max_worker_id).filter(|w| Some(*w) != preferred));
    order
}

/// How many of the tokens it drew last a server still counts as its own
/// ([`ClaimTokens::recent`]): more than a `claim_ttl` of renewals (one per `claim_ttl / 5`,
/// retries at half that) and of claims.
pub const RECENT_TOKENS: usize = 12;

/// A holder's claim tokens (issue 37: a running server copied with its memory). The
/// registry stores one token per claim; every grant and every renewal replaces it with a new
/// one, drawn at random by the holder, and acts only for a request that names the stored
/// token as its own. Two copies of one running server (a VM cloned or reverted with its
/// memory, a process snapshot restored) start with the same tokens, but each draws its own
/// from then on: the first write of either replaces the stored token with one the other
/// never knew, and the other is refused from then on. Their IDs coincide only until then
/// (docs/fleets.md gives the bound).
///
/// A request names the tokens the registry may hold for this server: the last one a reply
/// confirmed, and every one drawn recently (a request whose reply was lost may have written
/// its token; a registry that lost its last writes, restored or failed over, may hold an
/// older one, which its holder must still recognise to re-assert its claim: issue 37's
/// review of this change). A renewal retried after a failure writes the same token again. A
/// claim always writes a token drawn for it alone: a token drawn before a copy was made must
/// never be *written* by both copies. The registry worker keeps the tokens in a file
/// (`durable::TOKEN_FILE`), so that its restarts keep its claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimTokens {
    /// The postmaster's own random token, made at its start: a file written under another
    /// postmaster (a restart, a copy of the data directory) is not this server's.
    pub postmaster: String,
    /// The token the registry holds for this server's claim, as far as it knows.
    pub current: String,
    /// The token the last request wrote or may have written (`current` when confirmed).
    pub next: String,
    /// The tokens drawn last, oldest first, at most [`RECENT_TOKENS`].
    #[serde(default)]
    pub recent: Vec<String>,
}

/// The tokens one request names: those it may find stored as its server's, and the one it
/// writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestTokens {
    /// What the registry may hold for this server: `current` first.
    pub held: Vec<String>,
    /// What the request writes.
    pub write: String,
}

impl RequestTokens {
    /// Whether a token the registry stores is this server's.
    pub fn holds(&self, stored: &str) -> bool {
        stored == self.write || self.held.iter().any(|t| t == stored)
    }
}

impl ClaimTokens {
    /// The tokens of a server that has written none yet: its postmaster's.
    pub fn first(postmaster: &str) -> ClaimTokens {
        ClaimTokens {
            postmaster: postmaster.to_string(),
            current: postmaster.to_string(),
            next: postmaster.to_string(),
            recent: Vec::new(),
        }
    }

    /// Whether a request may have written `next` without a reply saying so.
    pub fn pending(&self) -> bool {
        self.next != self.current
    }

    /// The tokens of a renewal: `fresh` (new random) is written, unless a renewal's token
    /// may have been written already (it is written again).
    pub fn for_renewal(&mut self, fresh: String) -> RequestTokens {
        if !self.pending() {
            self.drawn(fresh);
        }
        self.request()
    }

    /// The tokens of a claim: `fresh` (new random) is written, always.
    pub fn for_claim(&mut self, fresh: String) -> RequestTokens {
        self.drawn(fresh);
        self.request()
    }

    /// The tokens of a release: nothing is written.
    pub fn for_release(&self) -> RequestTokens {
        self.request()
    }

    /// A reply confirmed that the registry stores `next`.
    pub fn confirmed(&mut self) {
        self.current = self.next.clone();
    }

    fn drawn(&mut self, fresh: String) {
        self.next = fresh.clone();
        self.recent.push(fresh);
        let over = self.recent.len().saturating_sub(RECENT_TOKENS);
        self.recent.drain(..over);
    }

    fn request(&self) -> RequestTokens {
        let mut held = vec![self.current.clone()];
        for t in self.recent.iter().rev() {
            if !held.contains(t) {
                held.push(t.clone());
            }
        }
        RequestTokens {
            held,
            write: self.next.clone(),
        }
    }
}

/// The registry a server last claimed from (issue 37: one registry per fleet): its address
/// as configured (without password) and the random id it recorded when its records were
/// first written. Two registries serving one fleet (a move by rolling restart, another
/// Redis database, etcd prefix or coordinator schema) each grant every id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrySeen {
    /// `snowflake.registry`, without its password.
    pub uri: String,
    /// The registry's id.
    pub id: u64,
}

/// Whether a registry that answered at `uri` with id `id` is another registry than the one
/// this server last claimed from (`last`): both the address and the id differ. The same
/// registry at a new address keeps its id; the same address whose registry lost its records
/// (a new id) is a loss, which the registry's settle covers. Another address *and* another
/// id is a second registry, or a move to one: its grants would not see the first one's
/// holders. Unknown (no record yet, or a registry of an earlier version without an id): not
/// another.
pub fn another_registry(last: Option<&RegistrySeen>, uri: &str, id: Option<u64>) -> bool {
    match (last, id) {
        (Some(last), Some(id)) => last.uri != uri && last.id != id,
        _ => false,
    }
}

/// Which worker id a claim gets, decided from the registry's view of one datacenter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimChoice {
    /// This server's token already holds this id: renew it.
    Own(u8),
    /// This id is free: take it.
    Free(u8),
    /// No own claim, and the registry is still settling for this long (ms).
    Settling(u64),
    /// Every id in `order` is held by someone else; the count of them.
    Exhausted(u32),
}

/// Decides a claim, once the registry has settled: an id this server holds first (whatever
/// the order), then the first free id in `order`. `live` lists the ids that are held
/// (unexpired) and by which token; `mine` tells this server's tokens
/// ([`RequestTokens::holds`]).
///
/// While the registry settles it grants nothing, not even an id under this token: its
/// records may be a restored copy, where this token's claim is one that it released, or let
/// lapse, before another server took the id (an adversarial test got 7,372 duplicates from a
/// Redis restored from a dump). A holder whose fence still holds keeps its claim by renewing
/// it, not by claiming.
pub fn choose_worker(
    order: &[u8],
    live: &[(u8, &str)],
    mine: impl Fn(&str) -> bool,
    settle_wait_ms: u64,
) -> ClaimChoice {
    if settle_wait_ms > 0 {
        return ClaimChoice::Settling(settle_wait_ms);
    }
    let holder = |w: u8| live.iter().find(|(id, _)| *id == w).map(|(_, t)| *t);
    if let Some(w) = order
        .iter()
        .copied()
        .find(|w| holder(*w).is_some_and(&mine))
    {
        return ClaimChoice::Own(w);
    }
    match order.iter().copied().find(|w| holder(*w).is_none()) {
        Some(w) => ClaimChoice::Free(w),
        None => ClaimChoice::Exhausted(order.len() as u32),
    }
}

/// The `claim_ttl` values of one datacenter's holders that a server is refused an id beside
/// (issue 37, path 1). After a loss of registry data the settle lasts the *asking* server's
/// `claim_ttl + claim_ttl / 5`; a holder whose record was lost fences for up to half of its
/// own `claim_ttl`, with its clock up to a fifth of it off. So a server whose `claim_ttl` is
/// far below another holder's can be given that holder's id while it still issues (88,550
/// duplicates at 5 s against 10 s with real processes), and a server far above the others
/// is such a holder. Within a ratio of 5/4 either way the settle covers both (the simulator
/// finds nothing; docs/fleets.md's procedure changes `claim_ttl` in such steps).
///
/// Returns the smallest and largest `claim_ttl` (ms) of the other holders `others_ms` when
/// one of them is out of [`ClaimTiming::fleet_ttl_range_ms`], so that the refusal can name
/// them; None when every one is within it. Only the registry's live records are seen: a
/// holder whose record a loss erased is not (the open part of path 1, see docs/fleets.md).
pub fn ttl_mismatch(timing: ClaimTiming, others_ms: &[u64]) -> Option<(u64, u64)> {
    let (low, high) = timing.fleet_ttl_range_ms();
    if !others_ms.iter().any(|&t| t < low || t > high) {
        return None;
    }
    let min = others_ms.iter().copied().min()?;
    let max = others_ms.iter().copied().max()?;
    Some((min, max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: ClaimTiming = ClaimTiming { ttl_ms: 10_000 };

    #[test]
    fn ttl_mismatch_allows_a_fifth_either_way() {
        let t = ClaimTiming::new;
        assert_eq!(t(10_000).fleet_ttl_range_ms(), (8_000, 12_500));
        assert_eq!(t(5_000).at_least(10_000), t(10_000));
        assert_eq!(t(5_000).at_least(0), t(5_000));
        assert_eq!(ttl_mismatch(t(10_000), &[]), None);
        assert_eq!(ttl_mismatch(t(8_000), &[10_000, 9_000]), None);
        assert_eq!(ttl_mismatch(t(10_000), &[8_000, 12_500]), None);
        assert_eq!(
            ttl_mismatch(t(5_000), &[10_000, 6_000]),
            Some((6_000, 10_000))
        );
        assert_eq!(ttl_mismatch(t(30_000), &[10_000]), Some((10_000, 10_000)));
        assert_eq!(ttl_mismatch(t(10_000), &[7_999]), Some((7_999, 7_999)));
        assert_eq!(ttl_mismatch(t(10_000), &[12_501]), Some((12_501, 12_501)));
    }

    proptest! {
        #[test]
        fn ttl_mismatch_is_the_ratio_rule(
            asking in MIN_CLAIM_TTL_MS..=MAX_CLAIM_TTL_MS,
            others in proptest::collection::vec(MIN_CLAIM_TTL_MS..=MAX_CLAIM_TTL_MS, 0..8),
        ) {
            let found = ttl_mismatch(ClaimTiming::new(asking), &others);
            let bad = others.iter().any(|&t| 4 * t > 5 * asking || 5 * t < 4 * asking);
            prop_assert_eq!(found.is_some(), bad);
            if let Some((min, max)) = found {
                prop_assert!(others.contains(&min) && others.contains(&max) && min <= max);
            }
        }
    }

    #[test]
    fn default_timing() {
        assert_eq!(T.heartbeat_ms(), 2_000);
        assert_eq!(T.fence_reach_ms(), 5_000);
        assert_eq!(T.max_skew_ms(), 2_000);
        assert_eq!(ClaimTiming::new(1).ttl_ms(), MIN_CLAIM_TTL_MS);
    }

    #[test]
    fn fence_stops_at_cap_and_deadline() {
        let f = T.fence(1_000_000, MonoMs(50));
        assert_eq!(f.cap_unix_ms, 1_005_000);
        assert!(f.allows(1_004_999, MonoMs(5_049)));
        assert!(!f.allows(1_005_000, MonoMs(100)));
        assert!(!f.allows(1_000_000, MonoMs(5_050)));
        assert!(!Fence::NONE.allows(0, MonoMs(0)));
        assert_eq!(after_failed_renewal(f, MonoMs(5_049)), AfterFailure::Retry);
        assert_eq!(after_failed_renewal(f, MonoMs(5_050)), AfterFailure::Fence);
        assert!(may_reassert(f, MonoMs(100)) && !may_reassert(f, MonoMs(6_000)));
    }

    #[test]
    fn skew_within_round_trip_is_not_proven() {
        let s = ClockSample {
            sent_unix_ms: 1_000,
            received_unix_ms: 1_400,
            registry_unix_ms: 1_350,
            registry_resolution_ms: 0,
        };
        assert_eq!(s.offset_ms(), 150);
        assert_eq!(s.proven_skew_ms(), 0);
        let far = ClockSample {
            registry_unix_ms: 10_000,
            ..s
        };
        assert_eq!(
            check_skew(&far, T),
            Err(SkewTooLarge {
                offset_ms: 8_800,
                max_ms: 2_000
            })
        );
        assert_eq!(far.to_local_ms(10_000), 1_200);
    }

    #[test]
    fn floors() {
        assert_eq!(claim_floor_unix_ms(None, 100, None), 100);
        assert_eq!(claim_floor_unix_ms(Some(200), 100, None), 200);
        assert_eq!(claim_floor_unix_ms(Some(200), 100, Some(300)), 300);
        assert_eq!(claim_floor_unix_ms(None, 500, Some(300)), 500);
        assert_eq!(free_grant_floor_unix_ms(None, None), None);
        assert_eq!(free_grant_floor_unix_ms(Some(41), None), Some(42));
        // A clean release hands its own (lower) value to the next holder.
        assert_eq!(free_grant_floor_unix_ms(Some(41), Some(30)), Some(31));
        assert_eq!(release_high_water(5, 9, 7), 9);
    }

    #[test]
    fn requests_are_judged_by_their_age() {
        // ttl 10 s: skew 2 s, reach 5 s, so at most 3 s old.
        assert_eq!(T.request_age(1_000, 1_000), RequestAge::Fresh);
        assert_eq!(T.request_age(3_000, 1_000), RequestAge::Fresh);
        assert_eq!(T.request_age(3_001, 1_000), RequestAge::Ahead);
        assert_eq!(T.request_age(1_000, 4_000), RequestAge::Fresh);
        assert_eq!(T.request_age(1_000, 4_001), RequestAge::Stale);
        // A day ahead is never acted on: its cap would poison the id's mark.
        assert_eq!(T.request_age(86_400_000, 0), RequestAge::Ahead);
    }

    #[test]
    fn reassertion_needs_a_loss_and_a_settling_registry() {
        // Same incarnation: the claim lapsed; never taken back.
        assert!(!T.may_reassert(500, 500, 600));
        // Reborn at 1_000, still settling at 5_000.
        assert!(T.may_reassert(500, 1_000, 5_000));
        // Settled (ttl + ttl / 5): the id may have been granted to another server.
        assert!(T.may_reassert(500, 1_000, 12_999));
        assert!(!T.may_reassert(500, 1_000, 13_000));
        assert_eq!(ClaimTiming::usable_floor_lead_ms(1_000, 10_000), 11_000);
    }

    #[test]
    fn registry_clock_back_is_what_both_samples_prove() {
        let sample = |offset: i64, rtt: i64| ClockSample {
            sent_unix_ms: 1_000,
            received_unix_ms: 1_000 + rtt,
            registry_unix_ms: 1_000 + rtt / 2 + offset,
            registry_resolution_ms: 0,
        };
        // 3 s back, each sample uncertain by 10 ms + 1 ms.
        assert_eq!(
            sample(-2_000, 20).proven_registry_clock_back_ms(&sample(1_000, 20)),
            2_978
        );
        // Forward, or within the uncertainty: nothing proven.
        assert!(sample(1_000, 20).proven_registry_clock_back_ms(&sample(-2_000, 20)) < 0);
        assert!(sample(0, 200).proven_registry_clock_back_ms(&sample(50, 200)) <= 0);
        assert_eq!(Quarantine::after_reply(0, 5, MonoMs(6)), None);
        assert_eq!(
            Quarantine::after_reply(13_000, 1_000, MonoMs(50)),
            Some(Quarantine {
                first_id_unix_ms: 14_000,
                until_mono: MonoMs(13_050)
            })
        );
    }

    #[test]
    fn claim_order_prefers_the_last_id() {
        assert_eq!(claim_order(Some(3), 4), vec![3, 0, 1, 2, 4]);
        assert_eq!(claim_order(None, 2), vec![0, 1, 2]);
        assert_eq!(claim_order(Some(9), 2), vec![0, 1, 2]);
    }

    #[test]
    fn choose_worker_waits_for_settling_then_prefers_own() {
        let order = claim_order(Some(2), 3);
        let live = [(2u8, "other"), (1u8, "me")];
        // Not even an own claim while settling (it may be a restored copy's).
        assert_eq!(
            choose_worker(&order, &live, |t| t == "me", 500),
            ClaimChoice::Settling(500)
        );
        assert_eq!(
            choose_worker(&order, &live, |t| t == "me", 0),
            ClaimChoice::Own(1)
        );
        assert_eq!(
            choose_worker(&order, &live, |t| t == "new", 500),
            ClaimChoice::Settling(500)
        );
        assert_eq!(
            choose_worker(&order, &live, |t| t == "new", 0),
            ClaimChoice::Free(0)
        );
        let full = [(0u8, "a"), (1, "b"), (2, "c"), (3, "d")];
        assert_eq!(
            choose_worker(&order, &full, |t| t == "new", 0),
            ClaimChoice::Exhausted(4)
        );
    }

    #[test]
    fn claim_tokens_rotate_and_tell_a_copy_apart() {
        let mut tokens = ClaimTokens::first("pm");
        assert!(!tokens.pending());
        let renewal = tokens.for_renewal("t1".into());
        // Until a reply, the token the registry had and the one being written both count;
        // a retry writes the same one.
        assert_eq!(renewal.write, "t1");
        assert!(renewal.holds("pm") && renewal.holds("t1") && !renewal.holds("t2"));
        assert_eq!(tokens.for_renewal("t2".into()).write, "t1");
        tokens.confirmed();
        assert!(!tokens.pending());
        // A copy with the same memory draws its own next token: once one copy's write is
        // stored, the other holds neither the stored token nor the one it writes.
        let mut copy = tokens.clone();
        let mine = tokens.for_renewal("t2".into());
        let theirs = copy.for_renewal("c2".into());
        let live = [(4u8, "t2")];
        assert!(!theirs.holds("t2"));
        assert_eq!(
            choose_worker(&[4, 5], &live, |t| theirs.holds(t), 0),
            ClaimChoice::Free(5)
        );
        assert_eq!(
            choose_worker(&[4, 5], &live, |t| mine.holds(t), 0),
            ClaimChoice::Own(4)
        );
        // A claim writes a token of its own even while one is pending (the pending one may
        // be the other copy's too), and still recognises the pending ones: two claims in a
        // row whose replies were lost forget neither.
        let first = copy.for_claim("c3".into());
        let second = copy.for_claim("c4".into());
        assert_eq!((first.write.as_str(), second.write.as_str()), ("c3", "c4"));
        assert!(second.holds("c2") && second.holds("c3") && second.holds("t1"));
    }

    #[test]
    fn claim_tokens_recognise_the_recent_ones_and_forget_older() {
        // A registry restored from a copy a few renewals old stores an older token of the
        // holder's: still its own.
        let mut tokens = ClaimTokens::first("pm");
        for i in 0..(RECENT_TOKENS + 3) {
            tokens.for_renewal(format!("t{i}"));
            tokens.confirmed();
        }
        let request = tokens.for_release();
        assert_eq!(request.held[0], tokens.current);
        assert!(request.holds(&format!("t{}", RECENT_TOKENS + 2)));
        assert!(request.holds("t3"));
        assert!(!request.holds("t2") && !request.holds("pm"));
        assert_eq!(request.held.len(), RECENT_TOKENS);
    }

    #[test]
    fn another_registry_needs_a_new_address_and_a_new_id() {
        let last = RegistrySeen {
            uri: "redis://a:6379/0".into(),
            id: 1,
        };
        // The same registry at another address; the same address after a loss.
        assert!(!another_registry(Some(&last), "redis://b:6379/0", Some(1)));
        assert!(!another_registry(Some(&last), "redis://a:6379/0", Some(2)));
        // Another database of the same server, another etcd prefix: another registry.
        assert!(another_registry(Some(&last), "redis://a:6379/1", Some(2)));
        // Nothing recorded, or a registry without an id: cannot tell.
        assert!(!another_registry(None, "redis://a:6379/1", Some(2)));
        assert!(!another_registry(Some(&last), "redis://a:6379/1", None));
    }

    proptest! {
        /// The registry keeps a claim `ttl` after it received a renewal; the holder stops
        /// issuing `ttl / 2` after it sent it. Whatever the delays, the holder's deadline
        /// comes first (both measured from the send, on clocks that run at the same rate).
        #[test]
        fn holder_fences_before_the_registry_expires(ttl in MIN_CLAIM_TTL_MS..MAX_CLAIM_TTL_MS,
                                                     sent in 0u64..1u64 << 40,
                                                     delay in 0u64..60_000) {
            let t = ClaimTiming::new(ttl);
            let fence = t.fence(0, MonoMs(sent));
            let registry_expiry = sent + delay + t.ttl_ms();
            prop_assert!(fence.deadline_mono < MonoMs(registry_expiry));
        }

        /// After a loss of registry data noticed at `born` (the new registry's time), a free
        /// id is granted only after settling. Any holder whose last renewal started before
        /// the loss, with a clock within the allowed skew of the old registry's, has a cap
        /// below the new holder's clock by then (within the allowed skew of the new
        /// registry's, which may be behind the old one's by up to the allowed jump): the new
        /// holder's IDs (at or after its clock) never meet the old holder's.
        #[test]
        fn settled_registry_outlives_every_lost_cap(ttl in MIN_CLAIM_TTL_MS..MAX_CLAIM_TTL_MS,
                                                    born in 1_000_000i64..1i64 << 41,
                                                    before in 0i64..100_000,
                                                    old_skew in -1.0f64..1.0,
                                                    new_skew in -1.0f64..1.0,
                                                    jump in 0.0f64..1.0,
                                                    late in 0i64..10_000) {
            let t = ClaimTiming::new(ttl);
            let max = t.max_skew_ms() as f64;
            // The old registry's clock was `jump` ahead of the new one's.
            let ahead = (jump * t.max_registry_clock_jump_ms() as f64) as i64;
            // The old holder's renewal started before the loss; its clock read `born - before`
            // (on the old registry's clock) + skew.
            let old_cap = t.fence(born + ahead - before + (old_skew * max) as i64, MonoMs::ZERO).cap_unix_ms;
            // The new holder is granted the id once the registry settled (maybe later).
            let registry_now = born + t.settle_ms() as i64 + late;
            prop_assert_eq!(t.settle_wait_ms(born, registry_now), 0);
            let new_clock = registry_now + (new_skew * max) as i64;
            prop_assert!(new_clock >= old_cap, "new clock {new_clock} below old cap {old_cap}");
        }

        /// The high-water mark: a new holder's floor is above every timestamp the previous
        /// holders could issue (below their caps), whatever the order of their renewals and
        /// whatever its own clock says.
        #[test]
        fn floor_is_above_every_earlier_cap(caps in proptest::collection::vec(0i64..1i64 << 41, 1..20),
                                            clock in 0i64..1i64 << 41) {
            let high_water = caps.iter().copied().max();
            let floor = claim_floor_unix_ms(free_grant_floor_unix_ms(high_water, None), clock, None);
            for cap in caps {
                // Issued timestamps are below the cap.
                prop_assert!(floor > cap - 1);
            }
            prop_assert!(floor >= clock);
        }

        /// A renewal held up in the network past its fence is never acted on, whatever the
        /// two clocks read within the allowed skew: the registry's verdict "fresh" implies
        /// that less real time than the fence's reach has passed since the send.
        #[test]
        fn a_fresh_request_is_inside_its_fence(ttl in MIN_CLAIM_TTL_MS..MAX_CLAIM_TTL_MS,
                                                sent_real in 0i64..1i64 << 40,
                                                delay in 0i64..120_000,
                                                holder_skew in -1.0f64..1.0,
                                                registry_skew in -1.0f64..1.0) {
            let t = ClaimTiming::new(ttl);
            // Each clock within half the allowed skew of real time: within the skew of each other.
            let half = t.max_skew_ms() as f64 / 2.0;
            let sent = sent_real + (holder_skew * half) as i64;
            let registry_now = sent_real + delay + (registry_skew * half) as i64;
            if t.request_age(sent, registry_now) == RequestAge::Fresh {
                prop_assert!(delay < t.fence_reach_ms() as i64);
            }
        }

        /// A grant from a store that loses writes without a sign is used only after its
        /// quarantine: whatever another holder of the id could issue under a renewal begun
        /// before this grant's reply arrived (each clock within the allowed skew of the
        /// registry member it talked to, read to half its resolution, the members' clocks
        /// apart by up to the allowed jump) is below this server's first ID.
        #[test]
        fn quarantine_outlasts_every_earlier_cap(ttl in MIN_CLAIM_TTL_MS..MAX_CLAIM_TTL_MS,
                                                 reply_real in 0i64..1i64 << 40,
                                                 before in 0i64..100_000,
                                                 old_skew in -1.0f64..1.0,
                                                 new_skew in -1.0f64..1.0,
                                                 jump in 0.0f64..1.0) {
            let t = ClaimTiming::new(ttl);
            let resolution = crate::kvclaims::HTTP_DATE_RESOLUTION_MS;
            let max = t.max_skew_ms() as f64 + resolution as f64 / 2.0;
            // The other holder's member's clock was `jump` ahead of this server's member's.
            let ahead = (jump * t.max_registry_clock_jump_ms() as f64) as i64;
            // The other holder's renewal began `before` ms before this grant's reply arrived.
            let old_cap = t.fence(reply_real - before + ahead + (old_skew * max) as i64, MonoMs::ZERO).cap_unix_ms;
            let received_wall = reply_real + (new_skew * max) as i64;
            let first_id = received_wall + t.grant_quarantine_ms(resolution as u64) as i64;
            prop_assert!(first_id >= old_cap, "first ID {first_id} below an earlier cap {old_cap}");
        }

        /// A clean release never lowers the mark below what the holder issued or started at.
        #[test]
        fn release_covers_everything_issued(pos in 0i64..1i64 << 41, lease in 0i64..1i64 << 41, floor in 0i64..1i64 << 41) {
            let h = release_high_water(pos, lease, floor);
            prop_assert!(h >= pos && h >= lease && h >= floor);
        }

        /// Every worker id is tried exactly once, the preferred one first.
        #[test]
        fn claim_order_is_a_permutation(preferred in proptest::option::of(0u8..40), max in 0u8..32) {
            let order = claim_order(preferred, max);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..=max).collect::<Vec<_>>());
            if let Some(p) = preferred.filter(|p| *p <= max) {
                prop_assert_eq!(order[0], p);
            }
        }
    }
}
