//! The part of `snowflake_convert_column()` (sql/finalize.sql) that PL/pgSQL cannot do
//! safely: widening a column of another role's table to bigint as that role.
//!
//! `ALTER TABLE ... TYPE bigint` rewrites the table and evaluates its CHECK constraints and
//! index expressions, which are its owner's code, with the rights of whoever runs the ALTER.
//! Run by a superuser converting its own key, a referencing table's CHECK would run as the
//! superuser: the escalation the security review reproduced. PostgreSQL's own maintenance
//! commands (VACUUM, ANALYZE, REINDEX, CLUSTER) avoid it by switching to the table's owner in
//! a security-restricted operation, which also forbids `SET ROLE` and `RESET ROLE`, so the
//! owner's code cannot take the caller's identity back. This does the same.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::server::dbtext::DbText;
use crate::server::errors;

/// Widens `column` of `referencing` to bigint, as the table's owner, in a security-restricted
/// operation with `search_path` pinned. Allowed only where `column` is in a foreign key of
/// `referencing` to `referenced`, has type smallint or integer, every partition and
/// inheritor of `referencing` has its owner, and the current role has the privileges of
/// `referenced`'s owner: what `snowflake_convert_column(..., include_others_tables => true)`
/// needs, and nothing more.
///
/// VOLATILE (DDL), PARALLEL UNSAFE (DDL cannot run in a parallel worker).
#[pg_extern(volatile, strict, parallel_unsafe)]
fn snowflake_widen_foreign_key_column(
    referencing: pg_sys::Oid,
    column: DbText,
    referenced: pg_sys::Oid,
) {
    const NAME: &str = "snowflake_widen_foreign_key_column";
    let column = column.as_str();
    let found = Spi::get_three_with_args::<bool, pg_sys::Oid, String>(
        "SELECT pg_catalog.pg_has_role(p.relowner, 'USAGE'), c.relowner,
                pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.'
                    OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname)
           FROM pg_catalog.pg_class c
           JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
           JOIN pg_catalog.pg_class p ON p.oid OPERATOR(pg_catalog.=) $2
           JOIN pg_catalog.pg_constraint k ON k.conrelid OPERATOR(pg_catalog.=) c.oid
                AND k.confrelid OPERATOR(pg_catalog.=) p.oid AND k.contype OPERATOR(pg_catalog.=) 'f'
           JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.oid
                AND a.attnum OPERATOR(pg_catalog.=) ANY (k.conkey)
          WHERE c.oid OPERATOR(pg_catalog.=) $1 AND a.attname OPERATOR(pg_catalog.=) $3::pg_catalog.name
            AND a.atttypid IN ('pg_catalog.int2'::pg_catalog.regtype, 'pg_catalog.int4'::pg_catalog.regtype)
            -- Every partition and inheritor has the table's owner: the ALTER recurses into
            -- them, and would run another owner's code as this one (a superuser owner
            -- bypasses PostgreSQL's own ownership check there).
            AND NOT EXISTS (
                WITH RECURSIVE tree(rel) AS (
                    SELECT c.oid
                    UNION
                    SELECT i.inhrelid FROM pg_catalog.pg_inherits i
                      JOIN tree t ON i.inhparent OPERATOR(pg_catalog.=) t.rel)
                SELECT FROM tree t JOIN pg_catalog.pg_class d ON d.oid OPERATOR(pg_catalog.=) t.rel
                 WHERE d.relowner OPERATOR(pg_catalog.<>) c.relowner)
          LIMIT 1",
        &[referencing.into(), referenced.into(), column.into()],
    );
    let (may, owner, qualified) = match found {
        Ok((Some(may), Some(owner), Some(qualified))) => (may, owner, qualified),
        Ok(_) | Err(pgrx::spi::Error::InvalidPosition) => {
            errors::not_a_referencing_column(column).raise(NAME)
        }
        Err(e) => errors::SnowflakeError::internal(format!("{NAME}: {e}")).raise(NAME),
    };
    if !may {
        errors::not_owner_of_referenced(&qualified).raise(NAME);
    }
    let statement = format!(
        "ALTER TABLE {qualified} ALTER COLUMN {} TYPE bigint",
        quote_identifier(column)
    );
    // SAFETY: the same sequence as PostgreSQL's index builds: save the identity, switch in
    // a restricted context, open a GUC nesting level, and undo both afterwards. An error in
    // between unwinds to the (sub)transaction abort, which restores both itself.
    unsafe {
        let (mut saved_user, mut saved_context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        pg_sys::SetUserIdAndSecContext(
            owner,
            saved_context | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
        );
        let nest_level = pg_sys::NewGUCNestLevel();
        let result = Spi::run("SET LOCAL search_path = pg_catalog, pg_temp")
            .and_then(|()| Spi::run(&statement));
        pg_sys::AtEOXact_GUC(false, nest_level);
        pg_sys::SetUserIdAndSecContext(saved_user, saved_context);
        if let Err(e) = result {
            errors::SnowflakeError::internal(format!("{NAME}: {e}")).raise(NAME);
        }
    }
}

/// `name` quoted as an SQL identifier (quoting is always correct, also for reserved words).
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
