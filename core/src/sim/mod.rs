//! A deterministic simulator of a fleet under the claim rules (issue 37): several servers,
//! each with its own clock, monotonic clock, `claim_ttl` and token, claiming worker ids from
//! one registry, in virtual time, driven by a seeded random schedule of faults. Every server
//! issues IDs without pause whenever its fence allows (the worst case for overlaps), and the
//! simulator records which millisecond timestamps each running copy of a server used under
//! each worker id. The invariant: no two copies ever use the same (worker id, millisecond),
//! and each copy's timestamps only rise.
//!
//! The rules are the product's: each server runs the registry worker's own decisions,
//! [`crate::holder::Holder`], with the simulator in the worker's place (it passes the time
//! and fresh tokens, delivers requests and replies, and carries out the effects on the
//! copy's generator, token file and claim file); the registry's steps follow the Redis
//! scripts (registry/src/redis.rs), whose records every store keeps (docs/fleets.md),
//! through the core's [`crate::claim`] functions.
//! Each fix of an earlier duplicate path is a switch in [`Fixes`]: with the switch off, the
//! simulator must find that path again (see the tests), which shows it can see that kind of
//! fault at all. The holder's switches are the product's [`crate::holder::HolderRules`].
//!
//! Faults: registry restarts (empty, or from an older copy of its data, on the same host or
//! on one whose clock differs), servers' crash restarts (token kept) and restarts (new token,
//! released cleanly or not), SIGSTOP freezes, clock steps, requests and replies delayed past
//! their deadline or lost, partitions, and copies of a running server with its memory.

mod model;
mod rng;

pub use model::{run, Fault, Fixes, Space, Store, Violation};

#[cfg(test)]
mod tests;
