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
    // Names are read as DbText (converted from the database encoding), and the ALTER is
    // built by format() in SQL and handed back as its bytes in the database encoding: a
    // non-ASCII table name in a LATIN1 database is neither a Rust panic nor mis-encoded.
    let found = Spi::connect(|client| {
        let table = client
            .select(
                WIDENING_QUERY,
                Some(1),
                &[referencing.into(), referenced.into(), column.clone().into()],
            )?
            .first();
        if table.is_empty() {
            return Ok(None);
        }
        Ok::<_, pgrx::spi::Error>(Some((
            table.get::<bool>(1)?,
            table.get::<pg_sys::Oid>(2)?,
            table.get::<DbText>(3)?,
            table.get::<bool>(4)?,
            table.get::<DbText>(5)?,
            table.get::<Vec<u8>>(6)?,
        )))
    });
    let (owns_referenced, owner, qualified, has_owners_rights, owner_name, statement) = match found
    {
        Ok(Some((
            Some(referenced),
            Some(owner),
            Some(qualified),
            Some(rights),
            Some(owner_name),
            Some(statement),
        ))) => (
            referenced,
            owner,
            qualified.0,
            rights,
            owner_name.0,
            statement,
        ),
        Ok(_) => errors::not_a_referencing_column(column.as_str()).raise(NAME),
        Err(e) => errors::SnowflakeError::internal(format!("{NAME}: {e}")).raise(NAME),
    };
    if !owns_referenced {
        errors::not_owner_of_referenced(&qualified).raise(NAME);
    }
    if !has_owners_rights {
        errors::not_member_of_referencing_owner(&qualified, column.as_str(), &owner_name)
            .raise(NAME);
    }
    let Ok(statement) = std::ffi::CString::new(statement) else {
        errors::SnowflakeError::internal(format!("{NAME}: a NUL byte in the ALTER statement"))
            .raise(NAME)
    };
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
        let result = Spi::run("SET LOCAL search_path = pg_catalog, pg_temp").map(|()| {
            // SAFETY: inside an SPI connection; the statement is a NUL-terminated string
            // in the database encoding. A PostgreSQL ERROR in it propagates as usual.
            Spi::connect_mut(|_client| pg_sys::SPI_execute(statement.as_ptr(), false, 0))
        });
        pg_sys::AtEOXact_GUC(false, nest_level);
        pg_sys::SetUserIdAndSecContext(saved_user, saved_context);
        match result {
            Ok(rc) if rc >= 0 => {}
            Ok(rc) => {
                errors::SnowflakeError::internal(format!("{NAME}: SPI_execute returned {rc}"))
                    .raise(NAME)
            }
            Err(e) => errors::SnowflakeError::internal(format!("{NAME}: {e}")).raise(NAME),
        }
    }
}

/// The facts the widening depends on, read in one statement: whether the caller has the
/// privileges of the referenced table's owner; the referencing table's owner; the
/// referencing table's qualified name; whether the caller has that owner's privileges;
/// that owner's name; and the ALTER statement as bytes in the database encoding. No row
/// unless `$3` is a smallint or integer column of a foreign key of `$1` to `$2`, in a table
/// whose partitions and inheritors all share its owner.
const WIDENING_QUERY: &str = "
    SELECT pg_catalog.pg_has_role(p.relowner, 'USAGE'::pg_catalog.text), c.relowner,
           pg_catalog.format('%I.%I'::pg_catalog.text, n.nspname, c.relname),
           pg_catalog.pg_has_role(c.relowner, 'USAGE'::pg_catalog.text),
           pg_catalog.format('%I'::pg_catalog.text, r.rolname),
           -- convert_to the database encoding: textsend would use the client's.
           pg_catalog.convert_to(pg_catalog.format(
               'ALTER TABLE %I.%I ALTER COLUMN %I TYPE pg_catalog.int8'::pg_catalog.text,
               n.nspname, c.relname, a.attname), pg_catalog.getdatabaseencoding()::pg_catalog.name)
      FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
      JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.relowner
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
     LIMIT 1";
