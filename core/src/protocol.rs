//! What a holder and a registry say to each other: the requests the registry worker's
//! decisions ([`crate::holder`]) make, and the replies every registry client gives (Redis,
//! the coordinator, etcd: the `snowflake-registry` crate). Plain data, no I/O.

use crate::claim::{ClaimTiming, ClockSample, Granted, RequestAge, RequestTokens};

/// What a claim or a renewal asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// `snowflake.datacenter_id`.
    pub datacenter_id: u8,
    /// The ids to try, in order (see [`crate::claim::claim_order`]).
    pub order: Vec<u8>,
    /// The tokens the registry may hold for this server, and the one this request writes
    /// (see [`crate::claim::ClaimTokens`]).
    pub tokens: RequestTokens,
    /// `snowflake.claim_ttl` in ms.
    pub ttl_ms: u64,
    /// This server's clock when it sent the request (Unix ms).
    pub sent_unix_ms: i64,
    /// The cap this claim grants if it succeeds (Unix ms): recorded as high-water mark.
    pub cap_unix_ms: i64,
    /// The fleet's epoch (Unix ms).
    pub epoch_unix_ms: i64,
    /// The longest `claim_ttl` (ms) this server has seen another holder of its datacenter
    /// have (0: none): a claim, not a renewal, settles for it when it is longer than this
    /// server's own (see [`ClaimRequest::claim_timing`]).
    pub fleet_ttl_ms: u64,
}

impl ClaimRequest {
    /// The timing of this server's own `claim_ttl`.
    pub fn timing(&self) -> ClaimTiming {
        ClaimTiming::new(self.ttl_ms)
    }

    /// The timing a claim settles by: the longer of this server's `claim_ttl` and the
    /// longest it has seen another holder have. A server refused for a `claim_ttl` far
    /// below a holder's must not, once the registry lost its records, be given that
    /// holder's id after its own short settle while the holder still issues (issue 37,
    /// path 1).
    pub fn claim_timing(&self) -> ClaimTiming {
        self.timing().at_least(self.fleet_ttl_ms)
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
        /// How long after its reply the claim may first be used (ms): 0 for a store
        /// that signals every loss of data (Redis, a coordinator), the quarantine of
        /// [`ClaimTiming::grant_quarantine_ms`] for etcd, whose restores give no sign.
        quarantine_ms: u64,
        /// For an id this server's token held: the id's high-water mark before the grant
        /// (Unix ms), up to which a holder of the same token may have issued (this server
        /// before a restart of its worker, or a copy of it made with its memory that is
        /// still issuing under its fence). A clean release gives the next holder at least
        /// the mark before the holder's latest accepted write (this, or a renewal's), so
        /// that a copy's release cannot hand the id to a third server below the other
        /// copy's IDs (issue 37's review of the token rotation: 637,350 duplicates).
        inherited_unix_ms: Option<i64>,
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
    /// Another holder of the datacenter has a `claim_ttl` out of the ratio this server's
    /// may differ by ([`crate::claim::ttl_mismatch`]): no id.
    TtlMismatch {
        /// The other holders' smallest `claim_ttl` (ms).
        others_min_ms: u64,
        /// Their largest (ms).
        others_max_ms: u64,
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
    /// Renewed; the cap is recorded. `inherited_unix_ms`: the id's high-water mark before
    /// this renewal (see `ClaimReply::Granted`): it is at least every cap granted before,
    /// those of a copy of this server made with its memory that was refused since included,
    /// so a clean release no lower than it cannot hand the id to a third server below that
    /// copy's last IDs.
    Renewed {
        /// Unix ms; None when the id has no mark.
        inherited_unix_ms: Option<i64>,
    },
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
    /// The registry's id ([`crate::claim::RegistrySeen`]; None: a registry of an
    /// earlier version, or a coordinator that does not let its role read its system
    /// identifier).
    pub registry_id: Option<u64>,
    /// How long before the reply came back the sample's registry reading arrived (ms, on a
    /// monotonic clock): 0 when the sample is the reply's own (Redis's read, the
    /// coordinator), the rest of the step for etcd (the `Date` header is read first). With
    /// it, `sample.received_unix_ms` (the reading the skew check binds) gives this server's
    /// clock at the reply as checked, whatever its wall clock did since.
    pub sample_age_ms: u64,
}
