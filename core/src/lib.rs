//! The pure logic of the snowflake extension, with no pgrx and no PostgreSQL: the compiler
//! keeps it that way, and `cargo test -p snowflake-core` runs its unit and property tests
//! without a server.
//!
//! - [`layout`]: the 64-bit layout, packing and unpacking, the two kinds of milliseconds.
//! - [`settings`]: parsing and checking the server settings into a [`settings::Config`].
//! - [`civil`]: calendar dates: day numbers, the epoch's ISO-8601 form, message formats.
//! - [`generator`]: the generator's state machine (clock, sequence, lease).
//! - [`durable`]: the records that make IDs survive crashes (state file, WAL lease, layout).
//! - [`foreign`]: decoding other generators' layouts (Discord, Instagram, Sonyflake, ...).
//! - [`claim`]: worker-id claims from a registry: timing, fences, clock checks.
//! - [`protocol`]: the requests a holder sends a registry, and the replies.
//! - [`holder`]: the registry worker's decisions, as a state machine (no I/O, no clock).
//! - [`kvclaims`]: the claim records of a key-value registry (etcd), and its clock.
//! - [`registry_rules`]: the registry's decisions (claim, renewal, release), for every store.
//! - [`registry_uri`]: the registry URI forms the client libraries do not parse, `.pgpass`.
//! - [`ratelimit`]: the limiter for server-wide WARNINGs.
//! - [`text`]: business serials and sortable base32 text.
//! - [`watermark`]: the IDs prepared transactions hold, kept for the commit-order watermark.
//! - [`history`]: a promoted node's timeline history (the timelines before its own).

// Safe Rust only: the core is pure logic, and the compiler refuses any `unsafe` here.
#![forbid(unsafe_code)]

pub mod civil;
pub mod claim;
pub mod durable;
pub mod foreign;
pub mod generator;
pub mod history;
pub mod holder;
pub mod kvclaims;
pub mod layout;
pub mod mono;
pub mod protocol;
pub mod ratelimit;
pub mod registry_rules;
pub mod registry_uri;
pub mod secrets;
pub mod settings;
#[cfg(test)]
mod sim;
pub mod text;
pub mod watermark;
