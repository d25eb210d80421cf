//! The registry worker: with `snowflake.worker_id = 'auto'`, a background worker claims a
//! worker id from `snowflake.registry`, renews it every fifth of `snowflake.claim_ttl`, and
//! fences the generator when it cannot. All network I/O happens here: never in the
//! postmaster, never in a backend, never under a lock. What it learns goes to shared memory:
//! the pair and its fence to the generator (checked only when a lease is extended), the
//! status and its reason to [`shmem::CLAIM`] (for callers' errors and `snowflake_stats()`).
//!
//! The worker starts when recovery has finished: a standby does not claim; it claims when it
//! is promoted.

mod runner;

use std::sync::OnceLock;
use std::time::Duration;

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use snowflake_registry as registry;

use crate::generation::lease;
use crate::generation::shmem::{self, Node};
use crate::server::errors;
use crate::server::gucs;
use crate::server::{data_dir, mono_now, now_unix_ms};
use runner::Runner;
use snowflake_core::claim::{ClaimStatus, Fence};
use snowflake_core::durable;
use snowflake_core::holder::{
    AfterReply, Begin, Effect, Holder, HolderRules, HolderSettings, Now, Reply,
};
use snowflake_core::layout::UnixMs;
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
        errors::claim_setup("could not read random bytes for the claim token").write();
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
    let settings = HolderSettings {
        datacenter_id: config.datacenter_id,
        timing: gucs::claim_timing(),
        epoch_unix_ms: config.epoch.unix_ms(),
        uri: redacted(&uri),
        node: node_description(),
    };
    let postmaster = format!("{random}@{}", settings.node);
    // The token file of this postmaster (a restart of this worker, a crash restart): the
    // claim it holds is still its own. Any other file is ignored.
    let token_file = durable::read_claim_tokens(&data_dir()).ok().flatten();
    let recorded = durable::read_last_claim(&data_dir()).ok().flatten();
    let fleet_ttl_ms = durable::read_fleet_ttl(&data_dir())
        .ok()
        .flatten()
        .map_or(0, |f| f.longest_claim_ttl_ms);
    let options = registry::Options {
        timeout: Duration::from_millis(settings.timing.heartbeat_ms()),
        ca_file: gucs::registry_ca_file(),
        password_file: gucs::registry_password_file(),
        // SAFETY: geteuid has no preconditions and cannot fail.
        effective_uid: unsafe { libc::geteuid() },
    };
    let mut worker = Worker {
        holder: Holder::start(
            settings,
            HolderRules::PRODUCT,
            &postmaster,
            token_file,
            recorded,
            fleet_ttl_ms,
        ),
        config,
        token_file_failed: false,
    };
    // Requests run on a thread of their own, bounded in time; this thread waits for their
    // replies with signals open (see runner.rs): SIGTERM and postmaster death are answered
    // within runner::POLL whatever the registry does.
    let mut client = match Runner::open(&uri, &options) {
        Ok(client) => client,
        Err(e) => {
            report(&config, ClaimStatus::Refused, 0, &e.0, 0);
            errors::registry_unusable(&worker.holder.settings().uri, &e.0).write();
            while BackgroundWorker::wait_latch(None) {}
            exit_for_restart();
            return;
        }
    };
    loop {
        let wait_ms = worker.heartbeat(&mut client);
        if !runner::wait(Duration::from_millis(wait_ms)) {
            break;
        }
    }
    if runner::postmaster_alive() {
        // Give the claim back, within runner::SHUTDOWN_RELEASE. After the postmaster's death
        // there is no release: the worker leaves at once, so that a new postmaster can start.
        client.begin_shutdown();
        worker.release(&mut client);
    } else {
        let effects = worker.holder.stop(
            ClaimStatus::Starting,
            "The postmaster died; the registry worker is leaving.",
        );
        worker.apply(effects, &mut client);
    }
    report(
        &config,
        ClaimStatus::Starting,
        0,
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
    getrandom::fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
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

/// The worker: the core's decisions ([`Holder`]) and what it takes to carry them out.
struct Worker {
    holder: Holder,
    config: Config,
    /// The token file could not be written (reported once): a restart of the worker may not
    /// recognise its claim.
    token_file_failed: bool,
}

impl Worker {
    /// One claim or renewal. Returns how long to wait before the next (ms).
    fn heartbeat(&mut self, client: &mut Runner) -> u64 {
        let decision = self
            .holder
            .begin(now(), random_hex(), gucs::usable_floor_lead_ms());
        self.apply(decision.effects, client);
        let reply = match decision.next {
            Begin::Claim(request) => client
                .claim(&request)
                .map(|(reply, observed)| (Reply::Claim(reply), observed)),
            Begin::Renew {
                request,
                worker_id,
                reassert_known_born,
            } => client
                .renew(&request, worker_id, reassert_known_born)
                .map(|(reply, observed)| (Reply::Renew(reply), observed)),
            Begin::Wait(ms) => return ms,
        };
        let decision = self.holder.on_reply(reply.map_err(|e| e.0), now());
        self.apply(decision.effects, client);
        let last = match decision.next {
            AfterReply::Wait(ms) => return ms,
            AfterReply::Record(last) => last,
        };
        // The floor is durable before the claim is used: no restart loses it.
        let written = durable::write_last_claim(&data_dir(), &last).map_err(|e| e.to_string());
        let decision = self.holder.on_recorded(written, now());
        self.apply(decision.effects, client);
        decision.next
    }

    /// At shutdown: stops the generator, then gives the claim back with the highest
    /// timestamp this server could have issued (from its generator and durable lease, never
    /// from its clock).
    fn release(&mut self, client: &mut Runner) {
        if self.holder.held().is_none() {
            return;
        }
        let epoch = self.config.epoch;
        let lease_end_unix_ms = lease::durable_end_unix_ms(Some(epoch)).unwrap_or(0);
        let position_unix_ms = epoch.to_unix(stop_generator()).0;
        let effects = self.holder.release(position_unix_ms, lease_end_unix_ms);
        self.apply(effects, client);
    }

    /// Carries out the holder's effects, in order.
    fn apply(&mut self, effects: Vec<Effect>, client: &mut Runner) {
        let datacenter_id = self.config.datacenter_id;
        let uri = self.holder.settings().uri.clone();
        for effect in effects {
            match effect {
                Effect::KeepTokens => self.keep_tokens(),
                Effect::StopGenerator => {
                    stop_generator();
                }
                Effect::Fenced { worker_id, why } => {
                    errors::claim_fenced(datacenter_id, worker_id, &uri, &why).write()
                }
                Effect::RaiseFloor(floor_unix_ms) => self.raise_floor(floor_unix_ms),
                Effect::Install { worker_id, fence } => self.install(worker_id, fence),
                Effect::GiveBack {
                    worker_id,
                    tokens,
                    released_unix_ms,
                } => {
                    if let Err(e) =
                        client.release(datacenter_id, worker_id, &tokens, released_unix_ms)
                    {
                        let ttl_ms = self.holder.settings().timing.ttl_ms();
                        errors::release_failed(datacenter_id, worker_id, &uri, &e.0, ttl_ms)
                            .write();
                    }
                }
                Effect::Report {
                    status,
                    worker_id,
                    why,
                    expires_unix_ms,
                } => report(&self.config, status, worker_id, &why, expires_unix_ms),
                Effect::NoteFailure(why) => shmem::CLAIM.exclusive().set_detail(&why),
                Effect::RequestFailed(why) => {
                    // Not at shutdown, when requests are cut short on purpose.
                    if !runner::stop_requested() {
                        errors::registry_request_failed(&uri, &why).write();
                    }
                }
                Effect::Claimed {
                    worker_id,
                    own,
                    floor_unix_ms,
                } => errors::claimed(datacenter_id, worker_id, &uri, own, floor_unix_ms).write(),
                Effect::MarkAhead {
                    worker_id,
                    floor_unix_ms,
                    ahead_ms,
                    usable_ms,
                } => errors::mark_ahead(
                    datacenter_id,
                    worker_id,
                    &uri,
                    floor_unix_ms,
                    ahead_ms,
                    usable_ms,
                )
                .write(),
                Effect::RegistryClockJumped {
                    before_ms,
                    after_ms,
                    allowed_ms,
                } => errors::registry_clock_jumped(&uri, before_ms, after_ms, allowed_ms).write(),
                Effect::ClaimFileFailed(why) => errors::claim_setup(&why).write(),
                Effect::RememberFleetTtl(longest_claim_ttl_ms) => {
                    let value = durable::FleetTtl {
                        longest_claim_ttl_ms,
                    };
                    // Its loss costs only the memory: a WARNING, and the claims go on.
                    if let Err(e) = durable::write_fleet_ttl(&data_dir(), &value) {
                        let why = format!("could not write {}: {e}", durable::FLEET_TTL_FILE);
                        errors::claim_setup(&why).write();
                    }
                }
            }
        }
    }

    /// Keeps the tokens in the token file (before the request that writes the next one). A
    /// failure is reported once: it costs only a restarted worker its claim (it is given an
    /// id again), never a duplicate.
    fn keep_tokens(&mut self) {
        match durable::write_claim_tokens(&data_dir(), self.holder.tokens()) {
            Ok(()) => self.token_file_failed = false,
            Err(e) if !self.token_file_failed => {
                self.token_file_failed = true;
                errors::claim_setup(&format!("could not write {}: {e}", durable::TOKEN_FILE))
                    .write();
            }
            Err(_) => {}
        }
    }

    /// Raises the generator's floor to `floor_unix_ms` (kept in shared memory too, so that
    /// the generator keeps it when it loads its durable state later).
    fn raise_floor(&self, floor_unix_ms: i64) {
        let floor_ts = self.config.epoch.timestamp_or_zero(UnixMs(floor_unix_ms));
        let mut shared = shmem::GENERATOR.exclusive();
        shared.claim_floor = shared.claim_floor.max(floor_ts);
        shared.generator.raise_floor(floor_ts);
    }

    /// Hands a claim to the generator: pair and fence.
    fn install(&self, worker_id: u8, fence: Fence) {
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
        drop(shared);
        shmem::CLAIM_SIGNAL.get().broadcast();
    }
}

/// Stops the generator at once (no fence, its lease revoked); returns its position, read
/// under the same lock: nothing is issued after it.
fn stop_generator() -> snowflake_core::layout::EpochMs {
    let position = {
        let mut shared = shmem::GENERATOR.exclusive();
        shared.fence = Fence::NONE;
        shared.generator.revoke_lease();
        shared.generator.position()
    };
    shmem::CLAIM_SIGNAL.get().broadcast();
    position
}

/// This server's clocks now.
fn now() -> Now {
    Now {
        unix_ms: now_unix_ms(),
        mono: mono_now(),
    }
}

/// Publishes the status for callers and monitoring.
fn report(config: &Config, status: ClaimStatus, worker_id: u8, why: &str, expires_unix_ms: i64) {
    let mut claim = shmem::CLAIM.exclusive();
    claim.status = status;
    claim.node = Node {
        datacenter_id: config.datacenter_id,
        worker_id,
    };
    claim.expires_unix_ms = expires_unix_ms;
    claim.set_detail(why);
    drop(claim);
    shmem::CLAIM_SIGNAL.get().broadcast();
}
