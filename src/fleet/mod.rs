//! The registry worker: with `snowflake.worker_id = 'auto'`, a background worker claims a
//! worker id from `snowflake.registry`, renews it every fifth of `snowflake.claim_ttl`, and
//! fences the generator when it cannot. All network I/O happens here: never in the
//! postmaster, never in a backend, never under a lock. What it learns goes to shared memory:
//! the pair and its fence to the generator (checked only when a lease is extended), the
//! status and its reason to [`shmem::CLAIM`] (for callers' errors and `snowflake_stats()`).
//!
//! The worker starts when recovery has finished: a standby does not claim; it claims when it
//! is promoted.

pub(crate) mod registry;
mod runner;

use std::sync::OnceLock;
use std::time::Duration;

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;

use crate::generation::lease;
use crate::generation::shmem::{self, Node};
use crate::server::errors;
use crate::server::gucs;
use crate::server::{data_dir, monotonic_ms, now_unix_ms};
use registry::{ClaimReply, ClaimRequest, Observed, RenewReply};
use runner::Runner;
use snowflake_core::claim::{
    self, AfterFailure, ClaimStatus, ClaimTiming, ClaimTokens, Fence, Granted, RegistrySeen,
    RequestAge,
};
use snowflake_core::durable::{self, LastClaim};
use snowflake_core::layout::{UnixMs, MAX_WORKER_ID};
use snowflake_core::secrets::redacted;
use snowflake_core::settings::{Config, WorkerId};

/// This postmaster's token: random, made once at preload, inherited by every process it
/// forks. A crash restart keeps it (the postmaster lives on), so the restarted worker
/// recognises its token file and its claim; a clone of the data directory, or a new start,
/// gets another. The registry stores the tokens the worker draws for every grant and
/// renewal ([`ClaimTokens`]), which a copy of the running server does not share.
static TOKEN: OnceLock<String> = OnceLock::new();

/// Registers the worker, when the settings ask for a claimed worker id. Called while
/// preloading, in the postmaster: no I/O beyond reading 16 random bytes.
pub fn register(config: &Config) {
    if config.worker_id != WorkerId::Auto {
        return;
    }
    let Some(hex) = random_hex() else {
        // Without randomness there is no token to tell this server from a clone: claim nothing.
        errors::claim_setup("could not read random bytes for the claim token").warn();
        return;
    };
    let _ = TOKEN.set(hex);
    BackgroundWorkerBuilder::new("snowflake registry")
        .set_type("snowflake registry")
        .set_library("snowflake")
        .set_function("snowflake_registry_main")
        .enable_shmem_access(None)
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

/// The worker's entry point.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn snowflake_registry_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let (Some(Ok(config)), Some(uri), Some(random)) =
        (gucs::config(), gucs::registry(), TOKEN.get())
    else {
        return;
    };
    let timing = gucs::claim_timing();
    let node = node_description();
    let postmaster = format!("{random}@{node}");
    // The token file of this postmaster (a restart of this worker, a crash restart): the
    // claim it holds is still its own. Any other file is ignored.
    let tokens = durable::read_claim_tokens(&data_dir())
        .ok()
        .flatten()
        .filter(|t| t.postmaster == postmaster)
        .unwrap_or_else(|| ClaimTokens::first(&postmaster));
    let recorded = durable::read_last_claim(&data_dir()).ok().flatten();
    let mut holder = Holder {
        config,
        timing,
        uri: redacted(&uri),
        node,
        tokens,
        token_file_failed: false,
        held: None,
        known_born_unix_ms: None,
        floor_unix_ms: i64::MIN,
        inherited_unix_ms: i64::MIN,
        preferred: recorded
            .as_ref()
            .filter(|c| c.datacenter_id == config.datacenter_id)
            .map(|c| c.worker_id),
        recorded,
        avoided: Vec::new(),
        last_failure: String::new(),
        quarantine_until_mono_ms: None,
        registry_clock: None,
        fleet_ttl_ms: 0,
    };
    let options = registry::Options {
        timeout: Duration::from_millis(timing.heartbeat_ms()),
        ca_file: gucs::registry_ca_file(),
        password_file: gucs::registry_password_file(),
    };
    // Requests run on a thread of their own, bounded in time; this thread waits for their
    // replies with signals open (see runner.rs): SIGTERM and postmaster death are answered
    // within runner::POLL whatever the registry does.
    let mut client = match Runner::open(&uri, &options) {
        Ok(client) => client,
        Err(e) => {
            holder.report(ClaimStatus::Refused, &e.0, 0);
            while BackgroundWorker::wait_latch(None) {}
            exit_for_restart();
            return;
        }
    };
    loop {
        let wait_ms = holder.step(&mut client);
        if !runner::wait(Duration::from_millis(wait_ms)) {
            break;
        }
    }
    if runner::postmaster_alive() {
        // Give the claim back, within runner::SHUTDOWN_RELEASE. After the postmaster's death
        // there is no release: the worker leaves at once, so that a new postmaster can start.
        client.begin_shutdown();
        holder.release(&mut client);
    } else {
        holder.fence(
            ClaimStatus::Starting,
            "The postmaster died; the registry worker is leaving.",
        );
    }
    holder.report(
        ClaimStatus::Starting,
        "The registry worker is restarting.",
        0,
    );
    exit_for_restart();
}

/// Ends the worker with exit code 1, so that the postmaster starts it again (after 1 s)
/// unless the server is shutting down. Exit code 0 would unregister it for good: a
/// `pg_terminate_backend()` of the worker must not leave the server without claims.
/// (PostgreSQL 18's bindings no longer declare `proc_exit` diverging, hence no `-> !`.)
fn exit_for_restart() {
    // SAFETY: the normal way for a background worker to end.
    unsafe { pg_sys::proc_exit(1) }
}

/// 16 random bytes from the kernel, in hex. A memory copy of a running server draws its own:
/// Linux reseeds its generator when a VM is cloned or restored (vmgenid, 5.18 and later), and
/// a process snapshot restored runs on a kernel that was not copied.
fn random_hex() -> Option<String> {
    let mut bytes = [0u8; 16];
    // SAFETY: a valid buffer of the given length.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    (got == bytes.len() as isize).then(|| bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Host name and port, to tell holders apart in the registry.
fn node_description() -> String {
    let mut name = [0u8; 256];
    // SAFETY: a valid buffer; gethostname NUL-terminates on success.
    let host = if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
        let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
        String::from_utf8_lossy(&name[..end]).into_owned()
    } else {
        "unknown".into()
    };
    // SAFETY: a plain global set by the postmaster at start.
    let port = unsafe { pg_sys::PostPortNumber };
    format!("{host}:{port}")
}

/// The worker's own state.
struct Holder {
    config: Config,
    timing: ClaimTiming,
    /// The registry URI without its password.
    uri: String,
    /// This server's host name and port, the end of each of its tokens.
    node: String,
    /// The tokens the registry may hold for this server, and the next to write.
    tokens: ClaimTokens,
    /// The token file could not be written (reported once): a restart of the worker may not
    /// recognise its claim.
    token_file_failed: bool,
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
    quarantine_until_mono_ms: Option<u64>,
    /// The registry's incarnation (its birth) and its clock's offset from this server's, as
    /// last seen: a new incarnation whose clock went back further than the settle covers is
    /// reported ([`ClaimTiming::max_registry_clock_jump_ms`]).
    registry_clock: Option<(i64, claim::ClockSample)>,
    /// The longest `claim_ttl` (ms) of another holder of the datacenter that a refusal
    /// named (0: none): this server's claims settle for it (`ClaimRequest::fleet_ttl_ms`).
    /// Kept in memory only: a restart forgets it.
    fleet_ttl_ms: u64,
}

impl Holder {
    /// One claim or renewal. Returns how long to wait before the next (ms).
    fn step(&mut self, client: &mut Runner) -> u64 {
        let started_unix_ms = now_unix_ms();
        let started_mono_ms = monotonic_ms();
        let fence = self.timing.fence(started_unix_ms, started_mono_ms);
        if let Some((worker_id, old)) = self.held {
            if old.expired(started_mono_ms) {
                // Not renewed within its fence (this server was stopped, or cut off, with no
                // failed renewal to notice): claim again instead. A renewal now could keep a
                // claim that a restore of the registry brought back after the id had lapsed
                // and gone to another server (issue 37's simulator).
                self.fence(
                    ClaimStatus::Fenced,
                    &format!(
                        "This server's claim of worker id {worker_id} was not renewed within its fence ({} ms): the server was stopped or cut off. It claims an id again.",
                        self.timing.fence_reach_ms()
                    ),
                );
            }
        }
        let usable_lead = gucs::usable_floor_lead_ms();
        self.avoided
            .retain(|(_, floor)| floor - started_unix_ms > usable_lead);
        let order: Vec<u8> =
            claim::claim_order(self.held.map(|h| h.0).or(self.preferred), MAX_WORKER_ID)
                .into_iter()
                .filter(|w| !self.avoided.iter().any(|(a, _)| a == w))
                .collect();
        // A new token for this request (a renewal retried after a failure writes the same
        // one), kept on disk before it is sent, so that a restart of the worker knows it.
        let Some(fresh) = random_hex() else {
            self.report(
                ClaimStatus::Unreachable,
                "Could not read random bytes for a claim token.",
                0,
            );
            return self.timing.heartbeat_ms();
        };
        let fresh = format!("{fresh}@{}", self.node);
        let tokens = match self.held {
            Some(_) => self.tokens.for_renewal(fresh),
            None => self.tokens.for_claim(fresh),
        };
        self.keep_tokens();
        let request = ClaimRequest {
            datacenter_id: self.config.datacenter_id,
            order: &order,
            tokens: &tokens,
            ttl_ms: self.timing.ttl_ms(),
            sent_unix_ms: started_unix_ms,
            cap_unix_ms: fence.cap_unix_ms,
            epoch_unix_ms: self.config.epoch.unix_ms(),
            fleet_ttl_ms: self.fleet_ttl_ms,
        };
        let heartbeat = self.timing.heartbeat_ms();
        let retry = (heartbeat / 2).max(100);
        if let Some((worker_id, old)) = self.held {
            // Ask to take the claim back, should the registry have lost it, only while the
            // fence holds; the registry also checks that it really lost its data.
            let reassert = claim::may_reassert(old, started_mono_ms)
                .then_some(self.known_born_unix_ms)
                .flatten();
            return match client.renew(&request, worker_id, reassert) {
                Ok((RenewReply::Renewed { inherited_unix_ms }, observed)) => {
                    self.tokens.confirmed();
                    if let Some(mark) = inherited_unix_ms {
                        self.inherited_unix_ms = self.inherited_unix_ms.max(mark);
                    }
                    if let Err(skew) = claim::check_skew(&observed.sample, self.timing) {
                        self.fence(ClaimStatus::Refused, &skew_text(skew));
                        return heartbeat;
                    }
                    self.known_born_unix_ms = Some(observed.born_unix_ms);
                    self.watch_registry_clock(&observed);
                    self.install(worker_id, fence);
                    self.report_installed(worker_id, expiry(&observed, self.timing))
                }
                Ok((RenewReply::Lost { holder }, _)) => {
                    let why = match holder {
                        Some(h) if h.ends_with(&format!("@{}", self.node)) => format!(
                            "The registry holds worker id {worker_id} for another server with this server's host name and port ({}): a copy of this server made with its memory (a cloned or reverted VM, a restored process snapshot) renewed the claim first, or this server's claim lapsed and it was given to such a copy.",
                            self.node
                        ),
                        Some(h) => format!(
                            "The registry gave worker id {worker_id} to {h} after this server's claim lapsed."
                        ),
                        None => format!(
                            "The registry no longer has this server's claim of worker id {worker_id}, and cannot prove that it lost its data while the claim's fence held."
                        ),
                    };
                    self.fence(ClaimStatus::Fenced, &why);
                    // Claim again at once (another id, or the same once it is free).
                    1
                }
                Ok((RenewReply::Rejected(age), observed)) => {
                    if let Err(skew) = claim::check_skew(&observed.sample, self.timing) {
                        self.fence(ClaimStatus::Refused, &skew_text(skew));
                        return heartbeat;
                    }
                    self.failed_renewal(old, &rejected_text(age, &observed));
                    retry
                }
                Err(e) => {
                    self.log_failure(&e.0);
                    self.failed_renewal(old, &format!("Renewing the claim failed: {}", e.0));
                    retry
                }
            };
        }
        match client.claim(&request) {
            Ok((
                ClaimReply::Granted {
                    worker_id,
                    granted,
                    floor_unix_ms,
                    quarantine_ms,
                    inherited_unix_ms,
                },
                observed,
            )) => {
                self.tokens.confirmed();
                self.known_born_unix_ms = Some(observed.born_unix_ms);
                self.watch_registry_clock(&observed);
                if let Err(skew) = claim::check_skew(&observed.sample, self.timing) {
                    // Not used: give it back, leaving its mark as it was.
                    self.give_back(client, worker_id, None);
                    self.report(ClaimStatus::Refused, &skew_text(skew), 0);
                    return heartbeat;
                }
                let last_registry = self.recorded.as_ref().and_then(|r| r.registry.clone());
                if claim::another_registry(last_registry.as_ref(), &self.uri, observed.registry_id)
                {
                    // Not used: give it back, leaving its mark as it was.
                    self.give_back(client, worker_id, None);
                    let last = last_registry.map(|r| r.uri).unwrap_or_default();
                    let why = format!(
                        "This server last claimed worker ids from registry {last}; {} is another registry (another address and another id). Two registries serving one fleet each grant every worker id, so this server claims nothing from it until the whole fleet moves: see \"Moving a fleet to another registry\" in docs/fleets.md.",
                        self.uri
                    );
                    self.report(ClaimStatus::Refused, &why, 0);
                    return heartbeat;
                }
                let recorded = self
                    .recorded
                    .as_ref()
                    .and_then(|r| r.floor_for(self.config.datacenter_id, worker_id));
                let floor = claim::claim_floor_unix_ms(
                    floor_unix_ms,
                    observed.sample.received_unix_ms,
                    recorded,
                );
                // The floor the registry and the claim file set must be near the clock; the
                // quarantine's own term is not a mark (the clock reaches it as the quarantine
                // runs out), so it is added after this check (else every etcd claim with a
                // claim_ttl above about 11 s was given back for good: issue 37's review).
                let ahead = floor - now_unix_ms();
                if ahead > usable_lead {
                    self.give_back(client, worker_id, None);
                    self.avoided.push((worker_id, floor));
                    let datacenter_id = self.config.datacenter_id;
                    errors::mark_ahead(
                        datacenter_id,
                        worker_id,
                        &self.uri,
                        floor,
                        ahead,
                        usable_lead,
                    )
                    .warn();
                    let why = errors::mark_ahead_detail(worker_id, floor, ahead, usable_lead);
                    self.report(ClaimStatus::MarkAhead, &why, 0);
                    // Try the other ids at once.
                    return 1;
                }
                // The floor is durable before the claim is used: no restart loses it. (Without
                // a quarantine's term: a claim taken again after a crash restart in its
                // quarantine is quarantined anew, later, and a recorded term would read as a
                // mark ahead of the clock: issue 37's second review.)
                let last = LastClaim {
                    datacenter_id: self.config.datacenter_id,
                    worker_id,
                    floor_unix_ms: Some(floor),
                    registry: observed
                        .registry_id
                        .map(|id| RegistrySeen {
                            uri: self.uri.clone(),
                            id,
                        })
                        .or(last_registry),
                };
                if let Err(e) = durable::write_last_claim(&data_dir(), &last) {
                    self.give_back(client, worker_id, None);
                    let why = format!("could not write {}: {e}", durable::CLAIM_FILE);
                    errors::claim_setup(&why).warn();
                    self.report(ClaimStatus::Refused, &why, 0);
                    return heartbeat;
                }
                // A quarantined grant is used from its quarantine's end, counted from now,
                // after its reply came (the step may have read the store well after it began:
                // a request held up, a retry on another member; and the clock sample is
                // taken before the step's reads, so it is not the reply's time: issue 37's
                // second review), and its IDs start at or above that time on this server's
                // clock, whatever the clock does meanwhile.
                let quarantine =
                    claim::Quarantine::after_reply(quarantine_ms, now_unix_ms(), monotonic_ms());
                let floor = quarantine.map_or(floor, |q| floor.max(q.first_id_unix_ms));
                self.recorded = Some(last);
                self.preferred = Some(worker_id);
                self.inherited_unix_ms = inherited_unix_ms.unwrap_or(i64::MIN);
                self.raise_floor(floor);
                self.quarantine_until_mono_ms = quarantine.map(|q| q.until_mono_ms);
                self.install(worker_id, fence);
                let wait = self.report_installed(worker_id, expiry(&observed, self.timing));
                errors::claimed(
                    self.config.datacenter_id,
                    worker_id,
                    &self.uri,
                    matches!(granted, Granted::Own),
                    floor,
                )
                .log();
                wait
            }
            Ok((ClaimReply::Settling { wait_ms }, observed)) => {
                let settle_ms = request.claim_timing().settle_ms();
                self.known_born_unix_ms = Some(observed.born_unix_ms);
                self.watch_registry_clock(&observed);
                let why = format!(
                    "The registry grants free worker ids in {wait_ms} ms: it began less than {settle_ms} ms ago (new, restarted, crash-restarted, restored or failed over), and servers still holding claims renew them first."
                );
                self.report(ClaimStatus::Settling, &why, 0);
                wait_ms.clamp(10, heartbeat)
            }
            Ok((ClaimReply::Exhausted { taken }, observed)) => {
                // A waiter is who gets an id next: its view of the registry's clock must be
                // fresh when the registry begins anew (its own clock may have moved since).
                self.watch_registry_clock(&observed);
                let now = now_unix_ms();
                match self.avoided.iter().min_by_key(|(_, floor)| *floor) {
                    Some(&(worker_id, floor)) => {
                        let why =
                            errors::mark_ahead_detail(worker_id, floor, floor - now, usable_lead);
                        self.report(ClaimStatus::MarkAhead, &why, 0);
                    }
                    None => {
                        let why = format!(
                            "All {taken} worker ids of datacenter {} are claimed by other servers.",
                            self.config.datacenter_id
                        );
                        self.report(ClaimStatus::Exhausted, &why, 0);
                    }
                }
                heartbeat
            }
            Ok((
                ClaimReply::TtlMismatch {
                    others_min_ms,
                    others_max_ms,
                },
                observed,
            )) => {
                // A refused server asks first once the registry lost its records: its view of
                // the registry's clock must be fresh, like a waiter's.
                self.watch_registry_clock(&observed);
                // After a loss of the registry's records this server settles (and, on etcd,
                // waits out a grant's quarantine) for the longest claim_ttl it was refused
                // beside, not its own.
                self.fleet_ttl_ms = self.fleet_ttl_ms.max(others_max_ms);
                let why = format!(
                    "Servers holding worker ids of datacenter {} have snowflake.claim_ttl from {others_min_ms} ms to {others_max_ms} ms; this server's is {} ms. One datacenter's servers may differ by at most a fifth: after the registry loses its data, a server with a much shorter claim_ttl could be given an id that one with a longer claim_ttl still uses.",
                    self.config.datacenter_id,
                    self.timing.ttl_ms()
                );
                self.report(ClaimStatus::Refused, &why, 0);
                heartbeat
            }
            Ok((
                ClaimReply::EpochMismatch {
                    registry_epoch_unix_ms,
                },
                _,
            )) => {
                let why = format!(
                    "The registry's fleet uses epoch {} ({registry_epoch_unix_ms} ms); this server's snowflake.epoch is {} ({} ms). One fleet must share one epoch.",
                    snowflake_core::settings::format_unix_ms(registry_epoch_unix_ms),
                    snowflake_core::settings::format_unix_ms(self.config.epoch.unix_ms()),
                    self.config.epoch.unix_ms()
                );
                self.report(ClaimStatus::Refused, &why, 0);
                heartbeat
            }
            Ok((ClaimReply::Rejected(age), observed)) => {
                match claim::check_skew(&observed.sample, self.timing) {
                    Err(skew) => self.report(ClaimStatus::Refused, &skew_text(skew), 0),
                    Ok(()) => {
                        self.report(ClaimStatus::Unreachable, &rejected_text(age, &observed), 0)
                    }
                }
                retry
            }
            Err(e) => {
                self.log_failure(&e.0);
                self.report(ClaimStatus::Unreachable, &e.0, 0);
                retry
            }
        }
    }

    /// Keeps the tokens in the token file (before the request that writes the next one). A
    /// failure is reported once: it costs only a restarted worker its claim (it is given an
    /// id again), never a duplicate.
    fn keep_tokens(&mut self) {
        match durable::write_claim_tokens(&data_dir(), &self.tokens) {
            Ok(()) => self.token_file_failed = false,
            Err(e) if !self.token_file_failed => {
                self.token_file_failed = true;
                errors::claim_setup(&format!("could not write {}: {e}", durable::TOKEN_FILE))
                    .warn();
            }
            Err(_) => {}
        }
    }

    /// A renewal failed or was not acted on: keep issuing while the fence holds.
    fn failed_renewal(&mut self, old: Fence, why: &str) {
        match claim::after_failed_renewal(old, monotonic_ms()) {
            AfterFailure::Retry => self.note_failure(why),
            AfterFailure::Fence => self.fence(ClaimStatus::Fenced, why),
        }
    }

    /// Raises the generator's floor to `floor_unix_ms` (kept in shared memory too, so that
    /// the generator keeps it when it loads its durable state later).
    fn raise_floor(&mut self, floor_unix_ms: i64) {
        let floor_ts = self.config.epoch.timestamp_or_zero(UnixMs(floor_unix_ms));
        let mut shared = shmem::GENERATOR.exclusive();
        shared.claim_floor = shared.claim_floor.max(floor_ts);
        shared.generator.raise_floor(floor_ts);
        drop(shared);
        self.floor_unix_ms = floor_unix_ms;
    }

    /// Reports a registry that began anew with a clock further behind its previous one than
    /// the settle covers (issue 37: a registry restarted on another host, or failed over to
    /// one, whose clock is behind, gave duplicates; each server passed its own clock check).
    /// Only a server that saw both incarnations can tell; the settle covers smaller jumps.
    fn watch_registry_clock(&mut self, observed: &Observed) {
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
        let allowed = self.timing.max_registry_clock_jump_ms();
        let back = after.proven_registry_clock_back_ms(&before);
        if back > allowed as i64 {
            errors::registry_clock_jumped(
                &self.uri,
                before.offset_ms(),
                after.offset_ms(),
                allowed,
            )
            .warn();
        }
    }

    /// Publishes the status after a claim or renewal succeeded; returns the wait before the
    /// next step (sooner while a quarantine runs out).
    fn report_installed(&mut self, worker_id: u8, expires_unix_ms: i64) -> u64 {
        let heartbeat = self.timing.heartbeat_ms();
        match self.quarantine_until_mono_ms {
            Some(until) => {
                let left = until.saturating_sub(monotonic_ms());
                let why = format!(
                    "This server holds worker id {worker_id} and uses it in {left} ms: the registry (etcd) can be restored from a snapshot without a sign, which may have lost a claim of the same id made just before this one, whose holder could go on issuing until its fence ends."
                );
                self.report(ClaimStatus::Settling, &why, expires_unix_ms);
                left.clamp(1, heartbeat)
            }
            None => {
                self.report(ClaimStatus::Held, "", expires_unix_ms);
                heartbeat
            }
        }
    }

    /// Hands a granted claim to the generator: pair and fence. A claim in quarantine is only
    /// kept (and renewed) until its quarantine ends.
    fn install(&mut self, worker_id: u8, fence: Fence) {
        self.held = Some((worker_id, fence));
        // A failure after this success is logged again, even with the same cause.
        self.last_failure.clear();
        if let Some(until) = self.quarantine_until_mono_ms {
            if monotonic_ms() < until {
                return;
            }
            self.quarantine_until_mono_ms = None;
        }
        let node = Node {
            datacenter_id: self.config.datacenter_id,
            worker_id,
        };
        let mut shared = shmem::GENERATOR.exclusive();
        if shared.node != node {
            // IDs under the new pair start in a later millisecond than any issued under the
            // old one: they stay above every earlier ID (and above any watermark a reader
            // has been given), whichever worker id is larger.
            let next_ms = shared.generator.position().plus(1);
            shared.generator.raise_floor(next_ms);
        }
        shared.node = node;
        shared.fence = fence;
    }

    /// Stops the generator at once and forgets the claim.
    fn fence(&mut self, status: ClaimStatus, why: &str) {
        self.quarantine_until_mono_ms = None;
        {
            let mut shared = shmem::GENERATOR.exclusive();
            shared.fence = Fence::NONE;
            shared.generator.revoke_lease();
        }
        if let Some((worker_id, _)) = self.held.take() {
            errors::claim_fenced(self.config.datacenter_id, worker_id, &self.uri, why).log();
        }
        self.report(status, why, 0);
    }

    /// Records a failed renewal while the fence still holds.
    fn note_failure(&self, why: &str) {
        let mut claim = shmem::CLAIM.exclusive();
        claim.set_detail(why);
    }

    /// Logs a failed request's cause once per change of cause (not at shutdown, when
    /// requests are cut short on purpose).
    fn log_failure(&mut self, why: &str) {
        if why != self.last_failure && !runner::stop_requested() {
            errors::registry_request_failed(&self.uri, why).log();
            self.last_failure = why.to_string();
        }
    }

    /// Publishes the status for callers and monitoring.
    fn report(&self, status: ClaimStatus, why: &str, expires_unix_ms: i64) {
        let mut claim = shmem::CLAIM.exclusive();
        claim.status = status;
        claim.node = Node {
            datacenter_id: self.config.datacenter_id,
            worker_id: self.held.map(|h| h.0).unwrap_or(0),
        };
        claim.expires_unix_ms = expires_unix_ms;
        claim.set_detail(why);
    }

    /// At shutdown: stops the generator, then gives the claim back with the highest
    /// timestamp this server could have issued (from its generator and durable lease, never
    /// from its clock), which the next holder (itself, after a restart) starts above instead
    /// of the last cap.
    fn release(&mut self, client: &mut Runner) {
        let Some((worker_id, _)) = self.held else {
            return;
        };
        let epoch = self.config.epoch;
        let lease_end_unix_ms = lease::durable_end_unix_ms(Some(epoch)).unwrap_or(0);
        let position_unix_ms = {
            let mut shared = shmem::GENERATOR.exclusive();
            shared.fence = Fence::NONE;
            shared.generator.revoke_lease();
            epoch.to_unix(shared.generator.position()).0
        };
        let released =
            claim::release_high_water(position_unix_ms, lease_end_unix_ms, self.floor_unix_ms)
                .max(self.inherited_unix_ms);
        self.give_back(client, worker_id, Some(released));
    }

    /// Gives `worker_id` back to the registry (`released`: see [`Registry::release`]). A
    /// failure is logged: the id then stays taken until its claim lapses.
    fn give_back(&self, client: &mut Runner, worker_id: u8, released: Option<i64>) {
        let datacenter_id = self.config.datacenter_id;
        let tokens = self.tokens.for_release();
        if let Err(e) = client.release(datacenter_id, worker_id, &tokens, released) {
            errors::release_failed(
                datacenter_id,
                worker_id,
                &self.uri,
                &e.0,
                self.timing.ttl_ms(),
            )
            .warn();
        }
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

fn skew_text(skew: claim::SkewTooLarge) -> String {
    format!(
        "This server's clock differs from the registry's by {} ms; at most {} ms (a fifth of snowflake.claim_ttl) is allowed, because the registry's safety after it loses data depends on it.",
        skew.offset_ms, skew.max_ms
    )
}
