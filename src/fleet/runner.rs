//! Registry requests on a thread of their own, so that the worker answers SIGTERM and
//! postmaster death within [`POLL`] whatever the registry does (issue 35: a coordinator that
//! accepted and never answered held `pg_ctl stop -m fast` past 60 s, and a killed postmaster
//! left the worker holding the shared memory).
//!
//! The worker's own thread never touches a socket: it hands each request to the request
//! thread and waits for the reply with signals open, looking at the SIGTERM flag and at the
//! postmaster every [`POLL`]. Each client ends its own requests by deadlines of the registry
//! timeout (`claim_ttl / 5` for the connection, then for each request; see `registry`), so a
//! reply always comes. As a backstop, should a client's deadline fail, a request without a
//! reply after ten times the timeout (`2 × claim_ttl`) is abandoned with its thread, client
//! and socket, and the next request gets a new thread and a new client (which loses what the
//! old one kept, such as etcd's lease: hence not sooner). Abandoned threads end when their
//! call does; at most [`MAX_STUCK`] live at once, so a registry cannot make the worker start
//! threads without end. Nothing on the request thread calls PostgreSQL: the clients are plain
//! Rust (see `registry`).
//!
//! The request thread blocks every signal, so that the kernel delivers them all to the
//! worker's thread, where PostgreSQL's handlers expect to run; a registry call is then never
//! interrupted by EINTR either (the reason signals used to be held back during requests).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys;

use snowflake_core::claim::RequestTokens;
use snowflake_registry::{
    self as registry, ClaimReply, ClaimRequest, Observed, Options, Registry, RegistryError,
    RenewReply,
};

/// How often the worker's thread looks at the SIGTERM flag and the postmaster while it
/// waits for a reply: the bound on how late it answers them.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// How long the release at shutdown may take, at most (also bounded by the request bound):
/// fast shutdown waits for the worker, and an unreachable registry must not hold it.
pub(crate) const SHUTDOWN_RELEASE: Duration = Duration::from_millis(1000);

/// The backstop bound on a request, in registry timeouts (see the module's text).
const BACKSTOP_TIMEOUTS: u32 = 10;

/// Request threads still running after being abandoned, at most: past that, requests fail
/// until some end (their client's own timeouts end them).
const MAX_STUCK: usize = 4;

type Job = Box<dyn FnOnce(&mut dyn Registry) + Send>;

/// SIGTERM seen: pgrx's flag is cleared by every look (`sigterm_received` swaps it, and
/// `wait_latch` looks), so it is kept here once seen.
static STOP: AtomicBool = AtomicBool::new(false);

/// Whether SIGTERM has been received (by this look or an earlier one).
pub(crate) fn stop_requested() -> bool {
    if BackgroundWorker::sigterm_received() {
        STOP.store(true, Ordering::Relaxed);
    }
    STOP.load(Ordering::Relaxed)
}

/// Waits on the latch for `timeout` at most; false once the worker is to stop (SIGTERM, kept
/// for [`stop_requested`], or the postmaster's death).
pub(crate) fn wait(timeout: Duration) -> bool {
    if stop_requested() || !postmaster_alive() {
        return false;
    }
    if BackgroundWorker::wait_latch(Some(timeout)) {
        return true;
    }
    if postmaster_alive() {
        // wait_latch said no and the postmaster lives: it saw (and cleared) SIGTERM.
        STOP.store(true, Ordering::Relaxed);
    }
    false
}

/// Runs registry requests on the request thread (see the module's text).
pub(crate) struct Runner {
    uri: String,
    options: Options,
    /// The current request thread's queue, and its client (given to the thread at its start).
    jobs: Option<mpsc::Sender<Job>>,
    client: Option<Box<dyn Registry>>,
    /// Request threads alive, the current one included.
    alive: Arc<AtomicUsize>,
    /// Each request's backstop bound (the clients' own deadlines come first).
    bound: Duration,
    /// Set at shutdown: the release waits for its reply (at most [`SHUTDOWN_RELEASE`]) although
    /// SIGTERM was received.
    shutting_down: bool,
}

impl Runner {
    /// Opens the client (no I/O but the password file) for the first request thread.
    pub(crate) fn open(uri: &str, options: &Options) -> registry::Result<Self> {
        let client = registry::open(uri, options)?;
        Ok(Runner {
            uri: uri.to_string(),
            options: options.clone(),
            jobs: None,
            client: Some(client),
            alive: Arc::new(AtomicUsize::new(0)),
            bound: options.timeout.saturating_mul(BACKSTOP_TIMEOUTS),
            shutting_down: false,
        })
    }

    /// From now on, requests are the release at shutdown: bounded by [`SHUTDOWN_RELEASE`].
    pub(crate) fn begin_shutdown(&mut self) {
        self.shutting_down = true;
    }

    pub(crate) fn claim(
        &mut self,
        request: &ClaimRequest,
    ) -> registry::Result<(ClaimReply, Observed)> {
        let request = request.clone();
        self.run(move |client| client.claim(&request))
    }

    pub(crate) fn renew(
        &mut self,
        request: &ClaimRequest,
        worker_id: u8,
        reassert_known_born: Option<i64>,
    ) -> registry::Result<(RenewReply, Observed)> {
        let request = request.clone();
        self.run(move |client| client.renew(&request, worker_id, reassert_known_born))
    }

    pub(crate) fn release(
        &mut self,
        datacenter_id: u8,
        worker_id: u8,
        tokens: &RequestTokens,
        released_unix_ms: Option<i64>,
    ) -> registry::Result<()> {
        let tokens = tokens.clone();
        self.run(move |client| client.release(datacenter_id, worker_id, &tokens, released_unix_ms))
    }

    /// Runs `job` on the request thread and waits for its reply, at most the bound, and
    /// only while the server is not shutting down (see the module's text).
    fn run<T: Send + 'static>(
        &mut self,
        job: impl FnOnce(&mut dyn Registry) -> registry::Result<T> + Send + 'static,
    ) -> registry::Result<T> {
        let jobs = self.thread()?;
        let (reply_to, reply) = mpsc::sync_channel(1);
        let sent = jobs.send(Box::new(move |client: &mut dyn Registry| {
            let _ = reply_to.send(job(client));
        }));
        if sent.is_err() {
            self.jobs = None;
            return Err(RegistryError(
                "the registry request thread ended unexpectedly".into(),
            ));
        }
        let bound = if self.shutting_down {
            self.bound.min(SHUTDOWN_RELEASE)
        } else {
            self.bound
        };
        let started = Instant::now();
        loop {
            let left = bound.saturating_sub(started.elapsed());
            match reply.recv_timeout(left.min(POLL)) {
                Ok(result) => return result,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // The job panicked (caught on the thread, which goes on): no reply.
                    return Err(RegistryError(
                        "the registry client failed unexpectedly".into(),
                    ));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if !postmaster_alive() {
                return Err(RegistryError("the postmaster died".into()));
            }
            if !self.shutting_down && stop_requested() {
                // The reply, if it comes, is dropped; the release queued next waits for it
                // (the thread runs requests in order), within its own bound.
                return Err(RegistryError("the server is shutting down".into()));
            }
            if started.elapsed() >= bound {
                // Abandon the thread, its client and its socket: the next request starts
                // afresh. The thread ends when its call does (its queue is closed).
                self.jobs = None;
                return Err(RegistryError(format!(
                    "the registry did not answer within {} ms (twice snowflake.claim_ttl), although each request has a deadline of a fifth of it; the request was abandoned",
                    bound.as_millis()
                )));
            }
        }
    }

    /// The current request thread's queue, starting a thread (with a new client after an
    /// abandoned one) when there is none.
    fn thread(&mut self) -> registry::Result<mpsc::Sender<Job>> {
        if let Some(jobs) = &self.jobs {
            return Ok(jobs.clone());
        }
        let stuck = self.alive.load(Ordering::Acquire);
        if stuck >= MAX_STUCK {
            return Err(RegistryError(format!(
                "{stuck} earlier requests to the registry are still waiting for an answer; no new one until they end"
            )));
        }
        let client = match self.client.take() {
            Some(client) => client,
            None => registry::open(&self.uri, &self.options)?,
        };
        let (jobs, queue) = mpsc::channel::<Job>();
        let alive = Arc::clone(&self.alive);
        alive.fetch_add(1, Ordering::AcqRel);
        let spawned = {
            let _blocked = AllSignalsBlocked::new();
            std::thread::Builder::new()
                .name("snowflake registry request".into())
                .spawn(move || {
                    let mut client = client;
                    while let Ok(job) = queue.recv() {
                        // A panic must not end the thread silently nor reach the log with
                        // the client's state: the reply channel's closing tells the waiter.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            job(client.as_mut())
                        }));
                    }
                    alive.fetch_sub(1, Ordering::AcqRel);
                })
        };
        if let Err(e) = spawned {
            self.alive.fetch_sub(1, Ordering::AcqRel);
            return Err(RegistryError(format!(
                "could not start the registry request thread: {e}"
            )));
        }
        self.jobs = Some(jobs.clone());
        Ok(jobs)
    }
}

/// Whether the postmaster is alive: it is this process's parent until it dies (the kernel
/// then gives the process another parent).
pub(crate) fn postmaster_alive() -> bool {
    // SAFETY: getppid has no preconditions; PostmasterPid is set before any fork.
    unsafe { libc::getppid() == pg_sys::PostmasterPid }
}

/// Blocks every signal on the calling thread while it lives: a thread started meanwhile
/// inherits the mask, so that no signal is ever delivered to it.
struct AllSignalsBlocked {
    previous: libc::sigset_t,
}

impl AllSignalsBlocked {
    fn new() -> Self {
        // SAFETY: sigset_t is plain data; the sig* calls only write the sets passed.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
            AllSignalsBlocked { previous }
        }
    }
}

impl Drop for AllSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.previous, std::ptr::null_mut()) };
    }
}
