//! Symbols of functions this version no longer has. Released update scripts are never
//! edited, and `CREATE FUNCTION ... LANGUAGE c` in one of them checks that its symbol is in
//! the library: without these, updating from an early version would fail at that step.

use pgrx::prelude::*;

use crate::server::errors;

/// `snowflake_widen_foreign_key_column(oid, text, oid)`, created by the 0.3.0 → 0.4.0 script
/// and dropped by 0.6.0 → 0.7.0. It widened another role's table as that role but in the
/// caller's session, where the owner's code could act on the caller's (issue 35). Called
/// from a database not yet updated (its converter calls it), it refuses.
#[pg_extern(sql = false)]
fn snowflake_widen_foreign_key_column() {
    errors::retired_function("snowflake_widen_foreign_key_column", "0.7.0")
        .raise("snowflake_widen_foreign_key_column");
}
