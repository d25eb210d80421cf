//! The decoding side: which epoch this backend decodes with, checked once, and an ID split
//! into its fields with its Unix time.

use std::cell::Cell;

use crate::generation::lease;
use crate::generation::origin;
use crate::server::errors;
use crate::server::gucs;
use snowflake_core::layout::{self, Epoch, Parts};

thread_local! {
    /// Epoch that passed the decode-side check against the layout record.
    static DECODE_EPOCH: Cell<Option<Epoch>> = const { Cell::new(None) };
}

/// The epoch for decoding, found once per backend.
/// - Preloaded: the configured one (fixed since server start), checked against the layout
///   record and this database's `snowflake_origin`, so that a changed `snowflake.epoch`
///   never silently decodes old IDs wrong.
/// - Not preloaded: the settings are reloadable then, and an IMMUTABLE function must not
///   depend on them. The epoch is the one `snowflake_origin` records for this database's
///   IDs, or Twitter's (the default) where it records none.
pub(crate) fn epoch() -> errors::Result<Epoch> {
    if let Some(epoch) = DECODE_EPOCH.get() {
        return Ok(epoch);
    }
    let epoch = match gucs::epoch() {
        Some(configured) => {
            let epoch = configured.map_err(|e| errors::setting(&e))?;
            lease::recorded_state(epoch)?;
            origin::check_epoch(epoch)?;
            epoch
        }
        None => origin::recorded_epoch()?.unwrap_or(Epoch::TWITTER),
    };
    DECODE_EPOCH.set(Some(epoch));
    Ok(epoch)
}

/// The ID's fields and its Unix time (ms), by this backend's epoch.
pub(crate) fn decoded(id: i64) -> errors::Result<(Parts, i64)> {
    let epoch = epoch()?;
    let parts = layout::unpack(id).map_err(errors::layout)?;
    Ok((parts, epoch.to_unix(parts.timestamp).0))
}
