//! The simulated fleet: servers (each running copy of one), a registry, messages, faults, and
//! the record of every millisecond each copy issued under each worker id.

use crate::mono::MonoMs;
use std::collections::{BTreeMap, VecDeque};

use super::rng::Rng;
use crate::claim::{
    self, ClaimTiming, ClaimTokens, ClockSample, Fence, Granted, RequestAge, RequestTokens,
};
use crate::durable::LastClaim;
use crate::holder::{self, AfterReply, Begin, Effect, Holder, HolderRules, HolderSettings, Now};
use crate::protocol::{ClaimReply, ClaimRequest, Observed, RenewReply};
use crate::registry_rules::{self, ClaimDecision, LiveClaim};

/// The fixes of earlier duplicate paths, each of which can be taken out to show that the
/// simulator finds its path again. [`Fixes::ALL`] is the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixes {
    /// 0.5.0: every loss of the registry's data begins a new incarnation, which settles (a
    /// coordinator crash restart lost acknowledged claims and nothing changed).
    pub loss_begins_incarnation: bool,
    /// 0.5.0: the claim's floor is kept by the server in its data directory, and by the
    /// registry for an own claim (a crash restart lost it).
    pub durable_floor: bool,
    /// 0.5.0: a renewal takes back a claim the registry no longer has only after a loss, while
    /// the registry settles (a renewal held up in the network revived a lapsed claim).
    pub reassert_only_after_loss: bool,
    /// 0.5.0: a request older than its fence allows, or ahead of the registry's clock, is not
    /// acted on.
    pub request_age: bool,
    /// 0.5.0: an id's high-water mark only rises (a server whose clock stepped back lowered
    /// it).
    pub marks_only_rise: bool,
    /// 0.5.0: a claim's floor includes the server's clock when the grant arrived (a registry
    /// restarted empty, then a clock step back).
    pub floor_includes_clock: bool,
    /// 0.7.0: a settling registry grants not even an own claim (a restored copy's claim may
    /// be one its holder let lapse before another server took the id).
    pub no_own_claim_while_settling: bool,
    /// Issue 37: a holder whose fence has expired claims again instead of renewing (a
    /// restore may have revived its claim after the id went to another server).
    pub renew_only_within_fence: bool,
    /// Issue 37: an etcd grant other than a renewal is used only once the fence's reach and
    /// the clock terms have passed since its request was sent
    /// ([`claim::ClaimTiming::grant_quarantine_ms`]): a restore can lose a grant made just
    /// before it, whose holder goes on issuing under its fence, and no wait before the grant
    /// can see that. Taken out, the rule of 0.7.0 applies: a free id is taken once seen free,
    /// under the same fleet record, for the fence's reach and a request's time limit.
    pub etcd_grant_quarantine: bool,
    /// Issue 37: a new incarnation settles `ttl / 5` longer than `ttl`, for a registry whose
    /// clock is behind its predecessor's (a restart or failover onto another host). Taken
    /// out: one `ttl`, which covered a jump of `ttl / 10`.
    pub settle_clock_term: bool,
    /// Issue 37: a server whose `claim_ttl` is more than a fifth off another live holder's
    /// in its datacenter is refused an id ([`claim::ttl_mismatch`]). It closes the half of
    /// path 1 where the longer `claim_ttl` would hold; the half where a shorter one asks
    /// first after a loss (the records gone) stays open.
    pub refuse_ttl_out_of_ratio: bool,
    /// Issue 37: a server refused beside a longer `claim_ttl` remembers it (in memory) and
    /// its claims settle for it, so that after a loss of the records it is not given that
    /// holder's id after its own short settle.
    pub settle_for_refused_ttl: bool,
    /// Issue 37: every grant and renewal writes a new token the holder draws just before
    /// it, and the registry acts only for the stored token's holder
    /// ([`claim::ClaimTokens`]): of two copies of a running server (copied with its memory),
    /// the one that renews second is refused. Taken out, both copies renew one token for
    /// ever.
    pub rotate_tokens: bool,
    /// Issue 37: a clean release is no lower than the id's high-water mark before the
    /// holder's latest accepted write (`RenewReply::Renewed`, `ClaimReply::Granted`), which
    /// is at least every cap granted before it: of two copies of a server made with its
    /// memory, the one that wrote first and is then stopped cleanly must not hand the id to
    /// a third server below what the other issued before it was refused.
    pub release_above_inherited: bool,
    /// Issue 37: the token file counts only for the postmaster that wrote it
    /// (`Holder::start`), so a copy of a data directory started beside its server (a base
    /// backup, a cloned volume, a promoted standby) makes tokens of its own and is refused
    /// the server's id. Taken out, the copy takes the file's tokens as its own.
    pub tokens_of_own_postmaster: bool,
}

impl Fixes {
    /// The holder's share of the fixes ([`HolderRules`]).
    fn holder_rules(self) -> HolderRules {
        HolderRules {
            renew_only_within_fence: self.renew_only_within_fence,
            marks_only_rise: self.marks_only_rise,
            floor_includes_clock: self.floor_includes_clock,
            settle_for_refused_ttl: self.settle_for_refused_ttl,
            rotate_tokens: self.rotate_tokens,
            release_above_inherited: self.release_above_inherited,
        }
    }

    /// Every fix in: the rules as the product has them.
    pub const ALL: Fixes = Fixes {
        loss_begins_incarnation: true,
        durable_floor: true,
        reassert_only_after_loss: true,
        request_age: true,
        marks_only_rise: true,
        floor_includes_clock: true,
        no_own_claim_while_settling: true,
        renew_only_within_fence: true,
        etcd_grant_quarantine: true,
        settle_clock_term: true,
        refuse_ttl_out_of_ratio: true,
        settle_for_refused_ttl: true,
        rotate_tokens: true,
        release_above_inherited: true,
        tokens_of_own_postmaster: true,
    };
}

/// The kinds of fault a schedule draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The registry restarts without its data (Redis without persistence, etcd wiped).
    RegistryRestartEmpty,
    /// The registry restarts from an older copy of its data (a dump, a snapshot, a replica
    /// that missed the last writes).
    RegistryRestore,
    /// The registry is unreachable for a while.
    RegistryDown,
    /// A server's crash restart: the postmaster and its token stay, memory is lost.
    ServerCrashRestart,
    /// A server's restart: a new token; the claim is released first when `clean`.
    ServerRestart,
    /// A server is stopped (SIGSTOP) for a while.
    Freeze,
    /// A server's wall clock steps (forward or back).
    ClockStep,
    /// A server and the registry cannot reach each other for a while.
    Partition,
    /// A running server is copied with its memory (a VM clone, a snapshot restored), and
    /// both copies run on.
    MemoryClone,
    /// A server's data directory is copied and started beside it as another server, with its
    /// own postmaster and clock: a cloned volume or a base backup (`clean`: as of now), or a
    /// standby promoted while its primary runs (its generator's position as far as it
    /// replayed, up to `length_ms` behind the primary's).
    DiskCopy,
}

/// What a schedule may contain.
#[derive(Debug, Clone)]
pub struct Space {
    /// The registry's kind.
    pub store: Store,
    /// How many servers (each starts as one copy).
    pub servers: usize,
    /// How many worker ids the datacenter has (ids `0..worker_ids`).
    pub worker_ids: u8,
    /// The servers' `claim_ttl` (ms), in turn: server `i` has `ttls_ms[i % len]`.
    pub ttls_ms: Vec<u64>,
    /// Each server's clock is off the registry's by up to this share of its allowed skew
    /// (1.0: as far as the rules allow), plus `registry_host_clock_ms`.
    pub clock_spread: f64,
    /// A restarted registry may come back on a host whose clock is off the old one's by up to
    /// this (ms); 0 keeps one registry clock.
    pub registry_host_clock_ms: i64,
    /// A clock step is up to this (ms), forward or back.
    pub clock_step_ms: i64,
    /// The fault kinds drawn.
    pub faults: Vec<Fault>,
    /// How many faults a schedule has, at least and at most.
    pub fault_count: (usize, usize),
    /// How long a schedule runs (ms of virtual time).
    pub duration_ms: i64,
    /// Each message takes this long, at least and at most (ms).
    pub net_delay_ms: (i64, i64),
    /// The share of messages (percent) held up past their sender's deadline.
    pub late_percent: u64,
    /// The share of messages (percent) lost.
    pub lost_percent: u64,
    /// The share of requests (percent) that reach the registry twice, each copy with its own
    /// delay: a client that retried on another member or connection while the first was
    /// still in flight. The holder reads whichever answer comes first.
    pub duplicate_percent: u64,
}

impl Space {
    /// A fleet of `servers` on `worker_ids` ids with the default ttl, clocks within the rules,
    /// and the given faults.
    pub fn new(servers: usize, worker_ids: u8, faults: &[Fault]) -> Space {
        Space {
            store: Store::Redis,
            servers,
            worker_ids,
            ttls_ms: vec![claim::DEFAULT_CLAIM_TTL_MS],
            clock_spread: 1.0,
            registry_host_clock_ms: 0,
            clock_step_ms: 0,
            faults: faults.to_vec(),
            fault_count: (1, 6),
            duration_ms: 120_000,
            net_delay_ms: (1, 40),
            late_percent: 0,
            lost_percent: 0,
            duplicate_percent: 0,
        }
    }
}

/// Two copies used the same millisecond under one worker id, or a copy's IDs went back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What happened, with the numbers.
    pub what: String,
    /// Virtual time (ms) when it was seen.
    pub at_ms: i64,
    /// The schedule's events up to then (when traced).
    pub trace: Vec<String>,
}

/// What one schedule did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// Events handled.
    pub events: u64,
    /// Milliseconds issued, over every copy (a measure of how busy the fleet was).
    pub issued_ms: i64,
    /// Claims granted.
    pub grants: u64,
    /// Requests the registry acted on a second time ([`Space::duplicate_percent`]).
    pub duplicates_answered: u64,
    /// Milliseconds issued by copies started from another's data directory
    /// ([`Fault::DiskCopy`]).
    pub disk_copy_issued_ms: i64,
    /// Milliseconds that two copies of one server (a memory clone and its original) both
    /// issued under one worker id within [`clone_overlap_bound_ms`] of the clone: unavoidable
    /// (the copies have the same generator state) until one is refused, and allowed only in
    /// that window.
    pub clone_overlap_ms: i64,
    /// The latest such overlap, in ms after its clone.
    pub clone_overlap_after_ms: i64,
    /// The schedule's events (when traced).
    pub trace: Vec<String>,
}

/// The registry's records, as every store keeps them.
#[derive(Debug, Clone, Default)]
struct Data {
    /// When the incarnation began (registry clock), the server incarnation that wrote it,
    /// and the revision of that write (etcd).
    record: Option<(i64, u64, u64)>,
    /// Per id: holder token, expiry (registry clock), the claim's ttl, its revision.
    claims: BTreeMap<u8, Claim>,
    high_water: BTreeMap<u8, i64>,
    floor: BTreeMap<u8, i64>,
    released: BTreeMap<u8, i64>,
    /// The revision of each id's last write of its marks (etcd).
    marks_revision: BTreeMap<u8, u64>,
    /// The store's revision: every write raises it (etcd).
    revision: u64,
}

#[derive(Debug, Clone)]
struct Claim {
    token: String,
    expires: i64,
    ttl_ms: i64,
    revision: u64,
}

/// How the registry stores its records and sees a loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// Redis (and the coordinator): every restart is a new incarnation of the server, which
    /// the records name; claims expire at an absolute time of the registry's clock.
    Redis,
    /// etcd: a restore from a snapshot gives no sign but revisions that go back (and soon
    /// climb past where they were); claims are leases, whose time a restore gives back in
    /// full; each client keeps what it saw (see `registry/src/etcd/`).
    Etcd,
}

/// What an etcd client keeps between requests.
#[derive(Debug, Clone, Copy, Default)]
struct EtcdClient {
    highest_revision: u64,
    last_write: Option<(u8, u64)>,
    /// A free id seen, under which fleet record revision, since when (true time).
    seen_free: Option<(u8, u64, i64)>,
}

struct Registry {
    /// Registry clock minus true time.
    offset: i64,
    /// Changes at every restart (Redis's run id; the coordinator's token).
    run: u64,
    data: Data,
    /// Copies of the data for restores: (true time, data).
    snapshots: Vec<(i64, Data)>,
    down_until: i64,
}

/// A request in the network: the holder's claims and renewals, and releases.
#[derive(Debug, Clone)]
enum Request {
    Claim(ClaimRequest),
    Renew {
        request: ClaimRequest,
        worker: u8,
        reassert: Option<i64>,
    },
    Release {
        worker: u8,
        tokens: RequestTokens,
        released: Option<i64>,
    },
}

impl Request {
    fn tokens(&self) -> &RequestTokens {
        match self {
            Request::Claim(request) | Request::Renew { request, .. } => &request.tokens,
            Request::Release { tokens, .. } => tokens,
        }
    }
}

/// A request in the network.
#[derive(Debug, Clone)]
struct InFlight {
    request: Request,
    /// Deliveries still on their way ([`Space::duplicate_percent`]).
    deliveries: u8,
    /// The registry has acted on an earlier delivery.
    acted: bool,
}

/// The registry's answer, as the simulated stores give it (turned into the clients'
/// replies when the holder reads it).
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// `inherited`: for an own claim, the id's high-water mark before it.
    Granted {
        worker: u8,
        own: bool,
        floor: Option<i64>,
        inherited: Option<i64>,
        quarantine_ms: u64,
    },
    Settling {
        wait_ms: u64,
    },
    Exhausted,
    Refused {
        others_max_ms: u64,
    },
    /// `inherited`: the id's high-water mark before the renewal.
    Renewed {
        inherited: Option<i64>,
    },
    Lost,
    Rejected,
    Released,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    id: u64,
    /// The copy's clock when it sent the request (Unix ms).
    sent_unix_ms: i64,
    /// A renewal (else a claim).
    renewal: bool,
    /// The reply, with the registry's clock when it answered and its birth, if it came while
    /// the copy was frozen.
    reply: Option<(Reply, i64, i64)>,
}

#[derive(Debug, Clone)]
struct Copy {
    server: usize,
    /// The first copy of this server that this one descends from by memory clones (a copy
    /// of a data directory is a root of its own: [`Copy::is_disk_copy`]).
    root: usize,
    /// The registry worker's decisions: the product's [`Holder`].
    holder: Holder,
    /// The postmaster's own token (a restart draws another; a crash restart keeps it).
    postmaster: String,
    /// The token file, the claim file and the fleet ttl file: they survive restarts.
    token_file: Option<ClaimTokens>,
    claim_file: Option<LastClaim>,
    fleet_ttl_file: u64,
    timing: ClaimTiming,
    /// Wall clock minus true time.
    clock: i64,
    /// Monotonic clock minus true time.
    mono: i64,
    /// The generator's claim: pair and fence, as the holder installed it.
    generator: Option<(u8, Fence)>,
    /// The generator's floor (raised by the holder).
    floor: i64,
    /// The generator's position (last timestamp issued, Unix ms); durable.
    position: i64,
    /// The position at each registry snapshot (true time, position), the last minute's: what
    /// a standby of this copy had replayed.
    positions: VecDeque<(i64, i64)>,
    pending: Option<Pending>,
    frozen_until: i64,
    /// Not running until then (restarting).
    down_until: i64,
    /// True time up to which issuance is accounted.
    issued_upto: i64,
    partitioned_until: i64,
    alive: bool,
    /// Issues IDs only while busy (servers idle between bursts of inserts).
    busy: bool,
    /// The etcd client's memory (new at every restart of the registry worker).
    etcd: EtcdClient,
}

/// What a server starts from on disk: its token, claim and fleet ttl files and its
/// generator's durable position.
struct DataDir {
    token_file: Option<ClaimTokens>,
    claim_file: Option<LastClaim>,
    fleet_ttl_file: u64,
    position: i64,
}

impl DataDir {
    const NEW: DataDir = DataDir {
        token_file: None,
        claim_file: None,
        fleet_ttl_file: 0,
        position: i64::MIN,
    };
}

impl Copy {
    /// A copy of `server` starting with a registry worker of its own, from `disk` and
    /// nothing in memory, on a host with these clocks ([`host_clocks`]), accounted from true
    /// time `issued_upto`.
    #[allow(clippy::too_many_arguments)]
    fn start(
        fixes: Fixes,
        server: usize,
        root: usize,
        timing: ClaimTiming,
        postmaster: String,
        disk: DataDir,
        (clock, mono): (i64, i64),
        issued_upto: i64,
    ) -> Copy {
        Copy {
            server,
            root,
            holder: start_holder(
                fixes,
                server,
                timing,
                &postmaster,
                disk.token_file.clone(),
                disk.claim_file.clone(),
                disk.fleet_ttl_file,
            ),
            postmaster,
            token_file: disk.token_file,
            claim_file: disk.claim_file,
            fleet_ttl_file: disk.fleet_ttl_file,
            timing,
            clock,
            mono,
            generator: None,
            floor: i64::MIN,
            position: disk.position,
            positions: VecDeque::new(),
            pending: None,
            frozen_until: 0,
            down_until: 0,
            issued_upto,
            partitioned_until: 0,
            alive: true,
            busy: true,
            etcd: EtcdClient::default(),
        }
    }

    /// Started from another copy's data directory ([`Fault::DiskCopy`]): such a copy is
    /// its own root, and its server's other copies are not.
    fn is_disk_copy(&self) -> bool {
        self.root != self.server
    }

    fn wall(&self, t: i64) -> i64 {
        t + self.clock
    }
    fn mono(&self, t: i64) -> u64 {
        (t + self.mono) as u64
    }
    fn now(&self, t: i64) -> Now {
        Now {
            unix_ms: self.wall(t),
            mono: MonoMs(self.mono(t)),
        }
    }
}

/// A server's holder, as its registry worker starts.
fn start_holder(
    fixes: Fixes,
    server: usize,
    timing: ClaimTiming,
    postmaster: &str,
    token_file: Option<ClaimTokens>,
    claim_file: Option<LastClaim>,
    fleet_ttl_file: u64,
) -> Holder {
    let settings = HolderSettings {
        datacenter_id: 0,
        timing,
        epoch_unix_ms: 0,
        uri: "registry".into(),
        node: format!("s{server}"),
    };
    Holder::start(
        settings,
        fixes.holder_rules(),
        postmaster,
        token_file,
        claim_file,
        fleet_ttl_file,
    )
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Step(usize),
    Arrive {
        copy: usize,
        id: u64,
    },
    Answer {
        copy: usize,
        id: u64,
        reply: Reply,
        registry_now: i64,
        born: i64,
    },
    Deadline {
        copy: usize,
        id: u64,
    },
    Fault(usize),
    Snapshot,
    /// A copy turns busy or idle.
    Toggle(usize),
}

#[derive(Debug, Clone, Copy)]
struct PlannedFault {
    kind: Fault,
    server: usize,
    length_ms: i64,
    step_ms: i64,
    clean: bool,
}

/// The usable lead of a claim's floor over the clock (`max_clock_drift` + `max_clock_wait`
/// at their defaults).
const USABLE_FLOOR_LEAD_MS: i64 = 11_000;

/// How long after a memory clone the two copies may both issue under one worker id, with
/// [`Fixes::rotate_tokens`]: two fence reaches (one `claim_ttl`). Each copy's last renewal
/// that the registry accepts is sent within the fence it had at the clone (a renewal
/// outside it claims again instead), and only the first round of renewals after the clone
/// can be accepted for both (they may write the token drawn before the clone); from then on
/// the stored token is one that only the first copy to renew knows.
fn clone_overlap_bound_ms(timing: ClaimTiming) -> i64 {
    2 * timing.fence_reach_ms() as i64
}

/// How many positions a copy keeps for [`Fault::DiskCopy`]'s standbys (a minute's snapshots).
const POSITIONS_KEPT: usize = 240;

/// The registry's epoch (one for the whole fleet here).
const START_UNIX_MS: i64 = 1_800_000_000_000;

struct Sim {
    fixes: Fixes,
    rng: Rng,
    t: i64,
    seq: u64,
    events: BTreeMap<(i64, u64), Event>,
    copies: Vec<Copy>,
    registry: Registry,
    /// Every request in the network.
    requests: BTreeMap<u64, InFlight>,
    next_request: u64,
    /// The last token drawn (at restarts, and for each grant or renewal).
    tokens_drawn: u64,
    /// Memory clones: (the copies' root, true time of the clone).
    clones: Vec<(usize, i64)>,
    faults: Vec<PlannedFault>,
    issued: BTreeMap<u8, BTreeMap<i64, (i64, usize)>>,
    last_issued: Vec<i64>,
    /// When each grant was made (true time), for restores that go back past one.
    grant_times: Vec<i64>,
    space: Space,
    trace: Option<Vec<String>>,
    outcome: Outcome,
}

/// Runs one schedule: the seed draws the servers' settings and clocks, the faults and the
/// network's delays.
pub fn run(space: &Space, fixes: Fixes, seed: u64, traced: bool) -> Outcome {
    let mut sim = Sim::new(space.clone(), fixes, seed, traced);
    sim.run();
    sim.outcome
}

impl Sim {
    fn new(space: Space, fixes: Fixes, seed: u64, traced: bool) -> Sim {
        let mut rng = Rng::new(seed);
        let mut copies = Vec::new();
        for server in 0..space.servers {
            let timing = ClaimTiming::new(space.ttls_ms[server % space.ttls_ms.len()]);
            let clocks = host_clocks(&mut rng, &space, timing);
            let postmaster = format!("{}@s{server}", server + 1);
            let copy = Copy::start(
                fixes,
                server,
                server,
                timing,
                postmaster,
                DataDir::NEW,
                clocks,
                0,
            );
            copies.push(copy);
        }
        let max_ttl = copies
            .iter()
            .map(|c| c.timing.ttl_ms() as i64)
            .max()
            .unwrap_or(10_000);
        let count = rng.range(space.fault_count.0 as i64, space.fault_count.1 as i64);
        let mut faults = Vec::new();
        let mut events = BTreeMap::new();
        let mut seq = 0;
        if !space.faults.is_empty() {
            let mut previous = None;
            for _ in 0..count {
                let kind = rng.pick(&space.faults);
                // Half the faults come soon after the one before: most paths need two.
                let at = match previous {
                    Some(p) if rng.chance(50) => p + rng.range(0, max_ttl),
                    _ => rng.range(max_ttl / 2, space.duration_ms - 2 * max_ttl),
                };
                previous = Some(at);
                let fault = PlannedFault {
                    kind,
                    server: rng.range(0, space.servers as i64 - 1) as usize,
                    length_ms: rng.range(100, 3 * max_ttl),
                    step_ms: rng.spread(space.clock_step_ms),
                    clean: rng.chance(50),
                };
                faults.push(fault);
                seq += 1;
                events.insert((at, seq), Event::Fault(faults.len() - 1));
            }
        }
        for (i, copy) in copies.iter().enumerate() {
            seq += 1;
            events.insert(
                (rng.range(0, copy.timing.heartbeat_ms() as i64), seq),
                Event::Step(i),
            );
            seq += 1;
            events.insert((rng.range(0, 3_000), seq), Event::Toggle(i));
        }
        seq += 1;
        events.insert((250, seq), Event::Snapshot);
        let n = copies.len();
        Sim {
            fixes,
            rng,
            t: 0,
            seq,
            events,
            copies,
            registry: Registry {
                offset: START_UNIX_MS,
                run: 1,
                data: Data::default(),
                snapshots: Vec::new(),
                down_until: 0,
            },
            requests: BTreeMap::new(),
            next_request: 1,
            tokens_drawn: 1_000,
            clones: Vec::new(),
            faults,
            issued: BTreeMap::new(),
            last_issued: vec![i64::MIN; n],
            grant_times: Vec::new(),
            space,
            trace: traced.then(Vec::new),
            outcome: Outcome {
                violation: None,
                events: 0,
                issued_ms: 0,
                grants: 0,
                duplicates_answered: 0,
                disk_copy_issued_ms: 0,
                clone_overlap_ms: 0,
                clone_overlap_after_ms: 0,
                trace: Vec::new(),
            },
        }
    }

    fn at(&mut self, t: i64, event: Event) {
        self.seq += 1;
        self.events.insert((t, self.seq), event);
    }

    fn note(&mut self, text: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            let line = format!("{:>7} {}", self.t, text());
            trace.push(line);
        }
    }

    fn run(&mut self) {
        self.run_events();
        self.outcome.trace = self.trace.take().unwrap_or_default();
    }

    fn run_events(&mut self) {
        while let Some(((t, _), event)) = self.events.pop_first() {
            if t > self.space.duration_ms || self.outcome.violation.is_some() {
                break;
            }
            self.t = t;
            self.outcome.events += 1;
            for c in 0..self.copies.len() {
                self.advance(c);
            }
            if self.outcome.violation.is_some() {
                break;
            }
            self.handle(event);
        }
    }

    /// Issues, for copy `c`, every millisecond the fence allows up to now.
    fn advance(&mut self, c: usize) {
        let t = self.t;
        let copy = &self.copies[c];
        let from = copy
            .issued_upto
            .max(copy.frozen_until.min(t))
            .max(copy.down_until.min(t));
        if !copy.alive || !copy.busy || copy.frozen_until >= t || copy.down_until >= t || from >= t
        {
            self.copies[c].issued_upto = t;
            return;
        }
        let Some((worker, fence)) = copy.generator else {
            self.copies[c].issued_upto = t;
            return;
        };
        // The first true time at which the deadline has passed.
        let dead = fence.deadline_mono.0 as i64 - copy.mono;
        let last = t.min(dead - 1);
        let n = last - from;
        let first = copy
            .position
            .saturating_add(1)
            .max(copy.wall(from + 1))
            .max(copy.floor);
        self.copies[c].issued_upto = t;
        if n <= 0 {
            return;
        }
        let end = first.saturating_add(n - 1).min(fence.cap_unix_ms - 1);
        if end < first {
            return;
        }
        self.copies[c].position = end;
        self.record(c, worker, first, end);
    }

    fn record(&mut self, c: usize, worker: u8, lo: i64, hi: i64) {
        self.outcome.issued_ms += hi - lo + 1;
        if self.copies[c].is_disk_copy() {
            self.outcome.disk_copy_issued_ms += hi - lo + 1;
        }
        if lo <= self.last_issued[c] {
            let what = format!(
                "copy {c} (server {}) went back: issued {lo}..={hi} after {}",
                self.copies[c].server, self.last_issued[c]
            );
            self.violate(what);
            return;
        }
        self.last_issued[c] = hi;
        let map = self.issued.entry(worker).or_default();
        let mut clash = None;
        for (&olo, &(ohi, oc)) in map.range(..=hi).rev() {
            if ohi < lo {
                break;
            }
            if oc != c {
                clash = Some((olo, ohi, oc));
                break;
            }
        }
        if let Some((olo, ohi, oc)) = clash {
            let overlap = hi.min(ohi) - lo.max(olo) + 1;
            if let Some(after) = self.clone_overlap(c, oc) {
                self.outcome.clone_overlap_ms += overlap;
                self.outcome.clone_overlap_after_ms = after;
                self.note(|| {
                    format!("worker {worker}: copies {c} and {oc} of one server both issued {overlap} ms, {after} ms after their clone")
                });
                self.last_issued[c] = hi;
                return;
            }
            let what = format!(
                "worker {worker}: copy {c} (server {}) issued {lo}..={hi}, copy {oc} (server {}) had issued {olo}..={ohi}: {overlap} ms in both",
                self.copies[c].server, self.copies[oc].server
            );
            self.violate(what);
            return;
        }
        // Merge with this copy's interval just before, if adjacent.
        let previous = map.range(..lo).next_back().map(|(&l, &v)| (l, v));
        match previous {
            Some((plo, (phi, pc))) if pc == c && phi + 1 == lo => {
                map.insert(plo, (hi, c));
            }
            _ => {
                map.insert(lo, (hi, c));
            }
        }
    }

    /// Whether copies `a` and `b` are copies of one server by memory clones, one of them
    /// made less than [`clone_overlap_bound_ms`] ago: how long ago, if so.
    fn clone_overlap(&self, a: usize, b: usize) -> Option<i64> {
        if !self.fixes.rotate_tokens || self.copies[a].root != self.copies[b].root {
            return None;
        }
        let root = self.copies[a].root;
        let bound = clone_overlap_bound_ms(self.copies[a].timing);
        self.clones
            .iter()
            .filter(|(r, at)| *r == root && self.t - at <= bound)
            .map(|(_, at)| self.t - at)
            .min()
    }

    fn violate(&mut self, what: String) {
        self.note(|| format!("VIOLATION {what}"));
        self.outcome.violation = Some(Violation {
            what,
            at_ms: self.t,
            trace: self.trace.clone().unwrap_or_default(),
        });
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Step(c) => self.step(c),
            Event::Arrive { copy, id } => self.arrive(copy, id),
            Event::Answer {
                copy,
                id,
                reply,
                registry_now,
                born,
            } => self.answer(copy, id, reply, registry_now, born),
            Event::Deadline { copy, id } => self.deadline(copy, id),
            Event::Fault(i) => self.fault(i),
            Event::Toggle(c) => {
                self.copies[c].busy = !self.copies[c].busy;
                let t = self.t + self.rng.range(1, 3_000);
                self.at(t, Event::Toggle(c));
            }
            Event::Snapshot => {
                let data = self.registry.data.clone();
                self.registry.snapshots.push((self.t, data));
                let t = self.t;
                for copy in &mut self.copies {
                    if copy.positions.len() == POSITIONS_KEPT {
                        copy.positions.pop_front();
                    }
                    copy.positions.push_back((t, copy.position));
                }
                let t = self.t + 250;
                self.at(t, Event::Snapshot);
            }
        }
    }

    /// A copy that cannot act now (frozen, restarting) acts when it can: true if deferred.
    fn defer(&mut self, c: usize, event: Event) -> bool {
        let copy = &self.copies[c];
        if !copy.alive {
            return true;
        }
        let until = copy.frozen_until.max(copy.down_until);
        if until > self.t {
            self.at(until, event);
            return true;
        }
        false
    }

    /// The holder begins a step: a claim or a renewal (the product's `Holder::begin`).
    fn step(&mut self, c: usize) {
        if self.defer(c, Event::Step(c)) || self.copies[c].pending.is_some() {
            return;
        }
        self.tokens_drawn += 1;
        let fresh = self.tokens_drawn.to_string();
        let copy = &mut self.copies[c];
        let now = copy.now(self.t);
        let step = copy.holder.begin(now, Some(fresh), USABLE_FLOOR_LEAD_MS);
        self.carry_out(c, step.effects);
        let request = match step.next {
            Begin::Claim(request) => Request::Claim(request),
            Begin::Renew {
                request,
                worker_id,
                reassert_known_born,
            } => Request::Renew {
                request,
                worker: worker_id,
                reassert: reassert_known_born,
            },
            Begin::Wait(ms) => return self.next_step(c, ms as i64),
        };
        self.send(c, request);
    }

    fn send(&mut self, c: usize, request: Request) {
        let id = self.next_request;
        self.next_request += 1;
        let timing = self.copies[c].timing;
        let deadline = self.t + timing.heartbeat_ms() as i64;
        let sent = match &request {
            Request::Claim(claim) => Some((claim.sent_unix_ms, false)),
            Request::Renew { request, .. } => Some((request.sent_unix_ms, true)),
            Request::Release { .. } => None,
        };
        if let Some((sent_unix_ms, renewal)) = sent {
            self.copies[c].pending = Some(Pending {
                id,
                sent_unix_ms,
                renewal,
                reply: None,
            });
            self.at(deadline, Event::Deadline { copy: c, id });
        }
        self.note(|| format!("copy {c} sends {request:?}"));
        let first = self.delay(c);
        // Drawn only where duplicates are asked for, so that other spaces keep their
        // schedules.
        let again =
            if self.space.duplicate_percent > 0 && self.rng.chance(self.space.duplicate_percent) {
                self.delay(c)
            } else {
                None
            };
        let deliveries = [first, again].into_iter().flatten().collect::<Vec<_>>();
        if !deliveries.is_empty() {
            let in_flight = InFlight {
                request,
                deliveries: deliveries.len() as u8,
                acted: false,
            };
            self.requests.insert(id, in_flight);
            for delay in deliveries {
                let t = self.t + delay;
                self.at(t, Event::Arrive { copy: c, id });
            }
        }
    }

    /// A message's delay, or None when it is lost.
    fn delay(&mut self, c: usize) -> Option<i64> {
        if self.copies[c].partitioned_until > self.t || self.rng.chance(self.space.lost_percent) {
            return None;
        }
        let (lo, hi) = self.space.net_delay_ms;
        let mut delay = self.rng.range(lo, hi);
        if self.rng.chance(self.space.late_percent) {
            let heartbeat = self.copies[c].timing.heartbeat_ms() as i64;
            delay += self.rng.range(heartbeat, 4 * heartbeat);
        }
        Some(delay)
    }

    fn arrive(&mut self, c: usize, id: u64) {
        // Each delivery of a request arrives once, and is lost if the registry is down.
        let Some(in_flight) = self.requests.get_mut(&id) else {
            return;
        };
        in_flight.deliveries -= 1;
        let (request, again) = (in_flight.request.clone(), in_flight.acted);
        if self.registry.down_until > self.t {
            if in_flight.deliveries == 0 {
                self.requests.remove(&id);
            }
            return;
        }
        in_flight.acted = true;
        if in_flight.deliveries == 0 {
            self.requests.remove(&id);
        }
        if again {
            self.outcome.duplicates_answered += 1;
        }
        let now = self.t + self.registry.offset;
        let (reply, born) = self.registry_step(c, &request, now);
        self.note(|| format!("registry (clock {now}, born {born}) answers copy {c}: {reply:?}"));
        if let Reply::Granted { .. } = reply {
            self.outcome.grants += 1;
            self.grant_times.push(self.t);
        }
        if let Some(delay) = self.delay(c) {
            let t = self.t + delay;
            self.at(
                t,
                Event::Answer {
                    copy: c,
                    id,
                    reply,
                    registry_now: now,
                    born,
                },
            );
        }
    }

    /// One registry step: the Redis scripts' for [`Store::Redis`], the etcd client's for
    /// [`Store::Etcd`] (which reads a snapshot, decides and writes in one transaction: taken
    /// here as one atomic step, as its compare-and-swap makes it).
    fn registry_step(&mut self, c: usize, request: &Request, now: i64) -> (Reply, i64) {
        let fixes = self.fixes;
        let run = self.registry.run;
        let etcd = self.space.store == Store::Etcd;
        let mut client = self.copies[c].etcd;
        let data = &mut self.registry.data;
        // A new incarnation begins when the record is missing, when another incarnation of
        // the server wrote it (Redis), or when the store went back (etcd: revisions below
        // what this client saw, or its own last write lost).
        let went_back = etcd
            && (data.revision < client.highest_revision
                || client.last_write.is_some_and(|(w, revision)| {
                    data.marks_revision.get(&w).copied().unwrap_or(0) < revision
                }));
        let (born, fleet_revision) = match data.record {
            Some((born, r, revision)) if (etcd || r == run) && !went_back => (born, revision),
            _ => {
                data.revision += 1;
                data.record = Some((now, run, data.revision));
                client.last_write = None;
                (now, data.revision)
            }
        };
        client.highest_revision = client.highest_revision.max(data.revision);
        let (reply, client) = Self::decide(
            data,
            fixes,
            etcd,
            client,
            request,
            (now, self.t),
            born,
            fleet_revision,
            self.space.worker_ids,
        );
        self.copies[c].etcd = client;
        (reply, born)
    }

    #[allow(clippy::too_many_arguments)]
    fn decide(
        data: &mut Data,
        fixes: Fixes,
        etcd: bool,
        mut client: EtcdClient,
        request: &Request,
        (now, client_clock): (i64, i64),
        born: i64,
        fleet_revision: u64,
        worker_ids: u8,
    ) -> (Reply, EtcdClient) {
        // The ids' live claims as this step sees them (the product's `LiveClaim`): an etcd
        // claim written before the current incarnation began is from before the loss (a
        // restore may have brought it back after it went to another). The ids the fleet
        // does not use are held by servers outside the simulation.
        let outside = "outside";
        let live: Vec<LiveClaim<'_>> = (0..=crate::layout::MAX_WORKER_ID)
            .filter_map(|w| {
                if w >= worker_ids {
                    return Some(LiveClaim {
                        worker_id: w,
                        holder: outside,
                        from_before_loss: false,
                        holder_ttl_ms: None,
                        floor_unix_ms: None,
                        high_water_unix_ms: None,
                    });
                }
                let claim = data.claims.get(&w).filter(|claim| claim.expires > now)?;
                Some(LiveClaim {
                    worker_id: w,
                    holder: &claim.token,
                    from_before_loss: etcd && claim.revision < fleet_revision,
                    holder_ttl_ms: fixes.refuse_ttl_out_of_ratio.then_some(claim.ttl_ms as u64),
                    floor_unix_ms: if fixes.durable_floor {
                        data.floor.get(&w).copied()
                    } else {
                        None
                    },
                    high_water_unix_ms: data.high_water.get(&w).copied(),
                })
            })
            .collect();
        let tokens = request.tokens();
        if let &Request::Release {
            worker, released, ..
        } = request
        {
            let holder = live
                .iter()
                .find(|c| c.worker_id == worker)
                .map(|c| c.holder);
            if registry_rules::release_counts(tokens, holder) {
                data.claims.remove(&worker);
                data.revision += 1;
                if let Some(v) = released {
                    if fixes.marks_only_rise {
                        let v = data.floor.get(&worker).map_or(v, |f| v.max(*f));
                        let hw = data.high_water.entry(worker).or_insert(v);
                        *hw = (*hw).max(v);
                        data.released.insert(worker, v);
                    } else {
                        data.high_water.insert(worker, v);
                        data.released.insert(worker, v);
                    }
                    data.marks_revision.insert(worker, data.revision);
                    client.last_write = Some((worker, data.revision));
                }
            }
            return (Reply::Released, client);
        }
        let (Request::Claim(claim) | Request::Renew { request: claim, .. }) = request else {
            unreachable!("releases are handled above");
        };
        let timing = claim.timing();
        let sent = claim.sent_unix_ms;
        if fixes.request_age && timing.request_age(sent, now) != RequestAge::Fresh {
            return (Reply::Rejected, client);
        }
        let cap = claim.cap_unix_ms;
        let token = tokens.write.clone();
        let hold = |data: &mut Data, client: &mut EtcdClient, worker: u8| {
            data.revision += 1;
            data.claims.insert(
                worker,
                Claim {
                    token: token.clone(),
                    expires: now + timing.ttl_ms() as i64,
                    ttl_ms: timing.ttl_ms() as i64,
                    revision: data.revision,
                },
            );
            let hw = data.high_water.entry(worker).or_insert(cap);
            *hw = if fixes.marks_only_rise {
                (*hw).max(cap)
            } else {
                cap
            };
            data.released.remove(&worker);
            data.marks_revision.insert(worker, data.revision);
            client.last_write = Some((worker, data.revision));
        };
        match request {
            Request::Claim(claim) => {
                let fleet_ttl_ms = claim.fleet_ttl_ms;
                let settle =
                    settle_wait(fixes, claim_timing(fixes, timing, fleet_ttl_ms), born, now);
                // etcd: a sighting of a free id ends when the id is seen held.
                if let Some((w, _, _)) = client.seen_free {
                    if live.iter().any(|c| c.worker_id == w) {
                        client.seen_free = None;
                    }
                }
                let mut decision = registry_rules::decide_claim(claim, settle, &live);
                if !fixes.no_own_claim_while_settling {
                    // 0.7.0: an own claim was granted while settling.
                    let own = live
                        .iter()
                        .find(|c| !c.from_before_loss && claim.tokens.holds(c.holder));
                    if let (ClaimDecision::Settling { .. }, Some(own)) = (decision, own) {
                        decision = ClaimDecision::Own {
                            worker_id: own.worker_id,
                            floor_unix_ms: own.floor_unix_ms,
                            inherited_unix_ms: own.high_water_unix_ms,
                        };
                    }
                }
                // etcd: a free id is taken only once seen free, under the same fleet record,
                // for the fence's reach plus one request's time limit (the client's
                // `free_wait_ms`), counted on the client's monotonic clock.
                let free_wait = |w: u8, client: &mut EtcdClient| -> u64 {
                    let needed = timing.fence_reach_ms() + timing.heartbeat_ms();
                    match client.seen_free {
                        Some((sw, sf, since)) if sw == w && sf == fleet_revision => {
                            needed.saturating_sub((client_clock - since).max(0) as u64)
                        }
                        _ => {
                            client.seen_free = Some((w, fleet_revision, client_clock));
                            needed
                        }
                    }
                };
                if etcd && !fixes.etcd_grant_quarantine {
                    if let ClaimDecision::Settling { .. } = decision {
                        if let Some(&w) = claim
                            .order
                            .iter()
                            .find(|w| !live.iter().any(|c| c.worker_id == **w))
                        {
                            free_wait(w, &mut client);
                        }
                    }
                    if let ClaimDecision::Free { worker_id } = decision {
                        let wait_ms = free_wait(worker_id, &mut client);
                        if wait_ms > 0 {
                            return (Reply::Settling { wait_ms }, client);
                        }
                    }
                }
                // etcd: every grant comes with a quarantine (the client's, from the request).
                let quarantine_ms = if etcd && fixes.etcd_grant_quarantine {
                    claim_timing(fixes, timing, fleet_ttl_ms)
                        .grant_quarantine_ms(crate::kvclaims::HTTP_DATE_RESOLUTION_MS as u64)
                } else {
                    0
                };
                let reply = match decision {
                    ClaimDecision::Own {
                        worker_id: w,
                        floor_unix_ms,
                        inherited_unix_ms,
                    } => {
                        hold(data, &mut client, w);
                        Reply::Granted {
                            worker: w,
                            own: true,
                            floor: floor_unix_ms,
                            inherited: inherited_unix_ms,
                            quarantine_ms,
                        }
                    }
                    ClaimDecision::Free { worker_id: w } => {
                        let floor = claim::free_grant_floor_unix_ms(
                            data.high_water.get(&w).copied(),
                            data.released.get(&w).copied(),
                        );
                        hold(data, &mut client, w);
                        match floor {
                            Some(f) => data.floor.insert(w, f),
                            None => data.floor.remove(&w),
                        };
                        Reply::Granted {
                            worker: w,
                            own: false,
                            floor,
                            inherited: None,
                            quarantine_ms,
                        }
                    }
                    ClaimDecision::Settling { wait_ms } => Reply::Settling { wait_ms },
                    ClaimDecision::Exhausted { .. } => Reply::Exhausted,
                    ClaimDecision::TtlMismatch { others_max_ms, .. } => {
                        Reply::Refused { others_max_ms }
                    }
                };
                (reply, client)
            }
            &Request::Renew {
                worker, reassert, ..
            } => {
                let may_reassert = if fixes.reassert_only_after_loss {
                    reassert.is_some_and(|known| {
                        known != born && settle_wait(fixes, timing, born, now) > 0
                    })
                } else {
                    true
                };
                let own = live.iter().find(|c| c.worker_id == worker);
                let high_water = data.high_water.get(&worker).copied();
                match registry_rules::decide_renew(claim, own, high_water, may_reassert) {
                    RenewReply::Renewed { inherited_unix_ms } => {
                        hold(data, &mut client, worker);
                        (
                            Reply::Renewed {
                                inherited: inherited_unix_ms,
                            },
                            client,
                        )
                    }
                    _ => (Reply::Lost, client),
                }
            }
            Request::Release { .. } => unreachable!("handled above"),
        }
    }

    fn answer(&mut self, c: usize, id: u64, reply: Reply, registry_now: i64, born: i64) {
        let Some(pending) = self.copies[c].pending.filter(|p| p.id == id) else {
            return;
        };
        let copy = &self.copies[c];
        if !copy.alive {
            return;
        }
        if copy.frozen_until.max(copy.down_until) > self.t {
            // Read when the copy runs again, even if late by then (the socket holds it).
            if copy.down_until <= self.t {
                if let Some(p) = self.copies[c].pending.as_mut() {
                    p.reply = Some((reply, registry_now, born));
                }
            }
            return;
        }
        self.apply(c, pending, Some((reply, registry_now, born)));
    }

    fn deadline(&mut self, c: usize, id: u64) {
        if self.defer(c, Event::Deadline { copy: c, id }) {
            return;
        }
        let Some(pending) = self.copies[c].pending.filter(|p| p.id == id) else {
            return;
        };
        // A reply that came while the copy was frozen is read now; else the request failed.
        self.apply(c, pending, pending.reply);
    }

    /// The holder reads a reply (None: the request failed): the product's
    /// `Holder::on_reply`, then `Holder::on_recorded` for a grant (the claim file is written).
    fn apply(&mut self, c: usize, pending: Pending, answer: Option<(Reply, i64, i64)>) {
        self.copies[c].pending = None;
        let t = self.t;
        let now = self.copies[c].now(t);
        let reply = match answer {
            None => Err("no reply before the deadline".to_string()),
            Some((reply, at, born)) => {
                let observed = Observed {
                    sample: ClockSample {
                        sent_unix_ms: pending.sent_unix_ms,
                        received_unix_ms: now.unix_ms,
                        registry_unix_ms: at,
                        registry_resolution_ms: 0,
                    },
                    born_unix_ms: born,
                    registry_id: Some(1),
                    sample_age_ms: 0,
                };
                Ok((self.client_reply(reply, pending.renewal), observed))
            }
        };
        let step = self.copies[c].holder.on_reply(reply, now);
        self.carry_out(c, step.effects);
        let wait = match step.next {
            AfterReply::Wait(ms) => ms,
            AfterReply::Record(last) => {
                self.copies[c].claim_file = Some(last);
                let step = self.copies[c].holder.on_recorded(Ok(()), now);
                self.carry_out(c, step.effects);
                step.next
            }
        };
        self.next_step(c, wait as i64);
    }

    /// The simulated store's reply as the registry clients give it.
    fn client_reply(&self, reply: Reply, renewal: bool) -> holder::Reply {
        let age = RequestAge::Stale;
        match reply {
            Reply::Granted {
                worker,
                own,
                floor,
                inherited,
                quarantine_ms,
            } => holder::Reply::Claim(ClaimReply::Granted {
                worker_id: worker,
                granted: if own { Granted::Own } else { Granted::Free },
                floor_unix_ms: floor,
                quarantine_ms,
                inherited_unix_ms: inherited,
            }),
            Reply::Settling { wait_ms } => holder::Reply::Claim(ClaimReply::Settling { wait_ms }),
            Reply::Exhausted => holder::Reply::Claim(ClaimReply::Exhausted {
                taken: u32::from(self.space.worker_ids),
            }),
            Reply::Refused { others_max_ms } => holder::Reply::Claim(ClaimReply::TtlMismatch {
                others_min_ms: others_max_ms,
                others_max_ms,
            }),
            Reply::Renewed { inherited } => holder::Reply::Renew(RenewReply::Renewed {
                inherited_unix_ms: inherited,
            }),
            Reply::Lost => holder::Reply::Renew(RenewReply::Lost { holder: None }),
            Reply::Rejected if renewal => holder::Reply::Renew(RenewReply::Rejected(age)),
            Reply::Rejected | Reply::Released => holder::Reply::Claim(ClaimReply::Rejected(age)),
        }
    }

    /// Carries out the holder's effects on the copy (the worker's `apply`): the generator's
    /// claim and floor, the token file, releases; the rest is only traced.
    fn carry_out(&mut self, c: usize, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::KeepTokens => {
                    let copy = &mut self.copies[c];
                    copy.token_file = Some(copy.holder.tokens().clone());
                }
                Effect::StopGenerator => self.copies[c].generator = None,
                Effect::RaiseFloor(floor) => {
                    let copy = &mut self.copies[c];
                    copy.floor = copy.floor.max(floor);
                }
                Effect::Install { worker_id, fence } => {
                    self.copies[c].generator = Some((worker_id, fence));
                }
                Effect::GiveBack {
                    worker_id,
                    tokens,
                    released_unix_ms,
                } => {
                    let release = Request::Release {
                        worker: worker_id,
                        tokens,
                        released: released_unix_ms,
                    };
                    self.send(c, release);
                }
                Effect::Fenced { worker_id, why } => {
                    self.note(|| format!("copy {c} fenced from worker {worker_id}: {why}"));
                }
                Effect::Claimed {
                    worker_id,
                    floor_unix_ms,
                    ..
                } => {
                    self.note(|| format!("copy {c} holds worker {worker_id} from {floor_unix_ms}"))
                }
                Effect::RememberFleetTtl(ms) => self.copies[c].fleet_ttl_file = ms,
                Effect::Report { .. }
                | Effect::NoteFailure(_)
                | Effect::RequestFailed(_)
                | Effect::MarkAhead { .. }
                | Effect::RegistryClockJumped { .. }
                | Effect::ClaimFileFailed(_) => {}
            }
        }
    }

    fn next_step(&mut self, c: usize, after: i64) {
        let t = self.t + after.max(1);
        self.at(t, Event::Step(c));
    }

    fn fault(&mut self, i: usize) {
        let f = self.faults[i];
        let t = self.t;
        // The server's newest running copy.
        let c = (0..self.copies.len())
            .rev()
            .find(|&c| self.copies[c].server == f.server && self.copies[c].alive)
            .unwrap_or(f.server);
        self.note(|| {
            format!(
                "FAULT {:?} on server {} (copy {c}), {} ms, step {} ms",
                f.kind, f.server, f.length_ms, f.step_ms
            )
        });
        match f.kind {
            Fault::RegistryRestartEmpty | Fault::RegistryRestore => {
                let host = self.space.registry_host_clock_ms;
                if host > 0 {
                    self.registry.offset = START_UNIX_MS + self.rng.spread(host);
                }
                self.registry.data = if f.kind == Fault::RegistryRestore {
                    // Half the restores go back to between the last two grants: to before
                    // the id's latest holder, with its predecessor's claim.
                    let back = match self.grant_times.as_slice() {
                        [.., before, last] if f.clean => self.rng.range(*before, *last - 1),
                        _ => t - f.length_ms,
                    };
                    self.registry
                        .snapshots
                        .iter()
                        .rev()
                        .find(|(at, _)| *at <= back)
                        .map(|(_, d)| d.clone())
                        .unwrap_or_default()
                } else {
                    Data::default()
                };
                if self.space.store == Store::Etcd {
                    // A restored etcd gives each lease its time back in full.
                    let now = t + self.registry.offset;
                    for claim in self.registry.data.claims.values_mut() {
                        claim.expires = now + claim.ttl_ms;
                    }
                } else if self.fixes.loss_begins_incarnation
                    || f.kind == Fault::RegistryRestartEmpty
                {
                    self.registry.run += 1;
                }
                self.registry.down_until = t + self.rng.range(10, 500);
            }
            Fault::RegistryDown => self.registry.down_until = t + f.length_ms,
            Fault::ServerCrashRestart | Fault::ServerRestart => {
                if f.kind == Fault::ServerRestart && f.clean {
                    // A clean stop: the generator stops, then the claim is given back.
                    let copy = &mut self.copies[c];
                    copy.generator = None;
                    let position = copy.position;
                    let effects = copy.holder.release(position, position);
                    self.carry_out(c, effects);
                }
                let copy = &mut self.copies[c];
                copy.generator = None;
                copy.pending = None;
                copy.floor = i64::MIN;
                copy.etcd = EtcdClient::default();
                copy.down_until = t + f.length_ms.min(3_000);
                if !self.fixes.durable_floor {
                    copy.claim_file = None;
                }
                if f.kind == Fault::ServerRestart {
                    // A new postmaster: a new token of its own (its token file is not its).
                    self.tokens_drawn += 1;
                    let copy = &mut self.copies[c];
                    copy.postmaster = format!("{}@s{}", self.tokens_drawn, copy.server);
                }
                let copy = &mut self.copies[c];
                copy.holder = start_holder(
                    self.fixes,
                    copy.server,
                    copy.timing,
                    &copy.postmaster,
                    copy.token_file.clone(),
                    copy.claim_file.clone(),
                    copy.fleet_ttl_file,
                );
                let at = self.copies[c].down_until + 1;
                self.at(at, Event::Step(c));
            }
            Fault::Freeze => self.copies[c].frozen_until = t + f.length_ms,
            Fault::ClockStep => self.copies[c].clock += f.step_ms,
            Fault::Partition => self.copies[c].partitioned_until = t + f.length_ms,
            Fault::MemoryClone => {
                let mut clone = self.copies[c].clone();
                clone.pending = None;
                self.clones.push((clone.root, t));
                self.copies.push(clone);
                self.last_issued.push(self.last_issued[c]);
                let n = self.copies.len() - 1;
                self.at(t + 1, Event::Step(n));
            }
            Fault::DiskCopy => self.disk_copy(c, f),
        }
    }

    /// A copy of copy `c`'s data directory starts as another server beside it: the token,
    /// claim and fleet ttl files and the generator's position as of now (`clean`: a cloned
    /// volume, a base backup), or with the position a standby had replayed, up to
    /// `length_ms` behind (a promotion while the primary runs). It has its own postmaster,
    /// host clock and memory, and its IDs must rise above that position.
    fn disk_copy(&mut self, c: usize, f: PlannedFault) {
        let t = self.t;
        let original = &self.copies[c];
        let position = if f.clean {
            original.position
        } else {
            let replayed_at = t - f.length_ms;
            original
                .positions
                .iter()
                .rev()
                .find(|(at, _)| *at <= replayed_at)
                .map_or(i64::MIN, |(_, p)| *p)
        };
        self.tokens_drawn += 1;
        let postmaster = if self.fixes.tokens_of_own_postmaster {
            format!("{}@s{}", self.tokens_drawn, original.server)
        } else {
            original.postmaster.clone()
        };
        let disk = DataDir {
            token_file: original.token_file.clone(),
            claim_file: original.claim_file.clone(),
            fleet_ttl_file: original.fleet_ttl_file,
            position,
        };
        let (server, timing) = (original.server, original.timing);
        let clocks = host_clocks(&mut self.rng, &self.space, timing);
        let n = self.copies.len();
        // Its own root: its IDs may never meet its original's.
        let copy = Copy::start(self.fixes, server, n, timing, postmaster, disk, clocks, t);
        self.note(|| {
            format!("copy {n} starts from copy {c}'s data directory, position {position}")
        });
        self.copies.push(copy);
        self.last_issued.push(position);
        self.at(t + 1, Event::Step(n));
    }
}

/// A new host's clocks for a server with `timing`: the wall clock off the registry's first
/// host by up to the allowed skew (a share of it: the space's `clock_spread`) plus the spread
/// of the registry hosts' clocks (so a server may be within the skew of one registry host and
/// not of another), and a monotonic clock of its own.
fn host_clocks(rng: &mut Rng, space: &Space, timing: ClaimTiming) -> (i64, i64) {
    let spread =
        (timing.max_skew_ms() as f64 * space.clock_spread) as i64 + space.registry_host_clock_ms;
    let clock = START_UNIX_MS + rng.spread(spread);
    (clock, 1_000_000 + rng.range(0, 1_000_000))
}

/// The timing a claim settles and is quarantined by: `ClaimRequest::claim_timing` (the
/// longest `claim_ttl` a refusal named), or the server's own without that rule.
fn claim_timing(fixes: Fixes, timing: ClaimTiming, fleet_ttl_ms: u64) -> ClaimTiming {
    if fixes.settle_for_refused_ttl {
        timing.at_least(fleet_ttl_ms)
    } else {
        timing
    }
}

/// How long a registry born at `born` still settles at `now` (its clock).
fn settle_wait(fixes: Fixes, timing: ClaimTiming, born: i64, now: i64) -> u64 {
    if fixes.settle_clock_term {
        timing.settle_wait_ms(born, now)
    } else {
        (born + timing.ttl_ms() as i64 - now).max(0) as u64
    }
}
