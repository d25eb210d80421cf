//! Durable generator state: the files the server keeps in its data directory and the WAL
//! record that carries a lease to standbys (std + serde, no pgrx). One file per concern:
//!
//! - `state`: the state file (`snowflake.state`): the recorded ID layout and the lease.
//! - `atomic`: atomic, durable file writes and JSON reads for all of these files.
//! - `reach`: lease-reach arithmetic (how far past the clock a lease may reach).
//! - `resume`: where IDs resume after a restart or a failover ([`plan_resume`]).
//! - `wal_record`: the WAL record's codec ([`LeaseRecord`]).
//! - `origins`: the origins file (`snowflake.origins`), clusters whose IDs this one took over.
//! - `claim_files`: the registry worker's files (last claim, fleet `claim_ttl`, claim tokens).
//!
//! Every public item is re-exported here: callers use `durable::X`.

mod atomic;
mod claim_files;
mod origins;
mod reach;
mod resume;
mod state;
mod wal_record;

pub(crate) use atomic::write_atomically;
pub use claim_files::{
    read_claim_tokens, read_fleet_ttl, read_last_claim, write_claim_tokens, write_fleet_ttl,
    write_last_claim, FleetTtl, LastClaim, CLAIM_FILE, FLEET_TTL_FILE, TOKEN_FILE,
};
pub use origins::{
    adoption_floor_ms, read_origins, write_origins, AdoptedOrigin, Origins, ORIGINS_FILE,
};
pub use reach::{lease_reach_ms, max_widening_ms, reach_cap_ms};
pub use resume::{failover_margin_ms, plan_resume, Ancestry, ResumeKind, ResumePlan};
pub use state::{
    check_layout, read, state_path, write, LayoutCheck, LayoutRecord, PeerClock, StateFile,
    FORMAT_VERSION, STATE_FILE,
};
pub use wal_record::{LeaseRecord, RECORD_VERSION};
