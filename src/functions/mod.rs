//! What SQL calls: the functions themselves (`api`, thin), decoding and the stats row. The
//! column converter is PL/pgSQL (`sql/finalize.sql`).

mod api;
pub(crate) mod decode;
mod retired;
pub(crate) mod stats;
