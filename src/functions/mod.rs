//! What SQL calls: the functions themselves (`api`, thin), the column converter, decoding
//! and the stats row.

mod api;
mod convert;
pub(crate) mod decode;
pub(crate) mod stats;
