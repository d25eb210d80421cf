//! Text in the database's encoding.
//!
//! pgrx hands `text` arguments over as `&str` only in UTF-8 databases: in a LATIN1 or
//! SQL_ASCII database a non-ASCII byte ends in a Rust panic (XX000), and a returned `String`
//! is stored as UTF-8 bytes whatever the encoding. [`DbText`] converts both ways with
//! PostgreSQL's own functions, so their errors are PostgreSQL's: 22021 for bytes that are
//! not valid in the database encoding (possible in SQL_ASCII), 22P05 for a character the
//! database encoding cannot represent.
//!
//! Messages are built in Rust (UTF-8) and PostgreSQL treats them as being in the database
//! encoding: [`for_message`] escapes what they quote of non-ASCII user input there.

use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::prelude::*;

use crate::server::errors::{self, OrRaise};

/// A `text` argument or result, as UTF-8 in Rust and in the database encoding in SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbText(pub String);

impl DbText {
    /// The text as UTF-8.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromDatum for DbText {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _typoid: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null || datum.is_null() {
            return None;
        }
        // SAFETY: a non-null text datum; detoasting copies into the current memory context,
        // and the conversion returns either its input or a palloc'd, NUL-terminated copy.
        unsafe {
            let varlena = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
            let bytes = pgrx::varlena::varlena_to_byte_slice(varlena);
            // A datum conversion is a door out (nothing below it can be given the error).
            Some(DbText(server_to_utf8(bytes).or_raise("snowflake")))
        }
    }
}

/// `bytes` (database encoding) as UTF-8; PostgreSQL raises 22021 or 22P05 where it cannot.
///
/// # Safety
/// In a backend, inside a transaction or function call.
unsafe fn server_to_utf8(bytes: &[u8]) -> errors::Result<String> {
    if bytes.is_empty() {
        return Ok(String::new());
    }
    // SAFETY: pg_server_to_any validates and converts; it raises an ERROR on failure.
    let converted = unsafe {
        let out = pg_sys::pg_server_to_any(
            bytes.as_ptr().cast(),
            bytes.len() as i32,
            pg_sys::pg_enc::PG_UTF8 as i32,
        );
        if out.cast_const().cast::<u8>() == bytes.as_ptr() {
            copy_or_out_of_memory(bytes)?
        } else {
            copy_or_out_of_memory(std::ffi::CStr::from_ptr(out).to_bytes())?
        }
    };
    match String::from_utf8(converted) {
        Ok(text) => Ok(text),
        // Only a UTF-8 database hands bytes over unchecked, and it has validated them.
        Err(e) => invalid_utf8(e.as_bytes()),
    }
}

/// `bytes` copied into Rust memory, or PostgreSQL's 53200 when the allocation fails.
///
/// The size is the caller's (a `text` argument can hold up to 1 GB), and a failed Rust
/// allocation aborts the process, which makes the postmaster restart the whole server: a
/// fallible reservation turns it into the error PostgreSQL's own palloc would raise.
pub fn copy_or_out_of_memory(bytes: &[u8]) -> errors::Result<Vec<u8>> {
    let mut copy = Vec::new();
    if copy.try_reserve_exact(bytes.len()).is_err() {
        return Err(errors::out_of_memory(bytes.len()));
    }
    copy.extend_from_slice(bytes);
    Ok(copy)
}

/// Raises PostgreSQL's own 22021 for bytes that are not UTF-8.
fn invalid_utf8(bytes: &[u8]) -> ! {
    // SAFETY: pg_verify_mbstr with noError = false raises the error and does not return
    // for invalid input, which `bytes` is.
    unsafe {
        pg_sys::pg_verify_mbstr(
            pg_sys::pg_enc::PG_UTF8 as i32,
            bytes.as_ptr().cast(),
            bytes.len() as i32,
            false,
        );
    }
    unreachable!("pg_verify_mbstr accepted bytes that are not UTF-8")
}

impl IntoDatum for DbText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let bytes = self.0.as_bytes();
        // SAFETY: pg_any_to_server converts (raising 22P05 for what the database encoding
        // cannot hold) and returns its input or a palloc'd NUL-terminated copy;
        // cstring_to_text_with_len copies into a new text value.
        unsafe {
            let (ptr, len) = if bytes.is_empty() {
                (bytes.as_ptr().cast::<std::ffi::c_char>(), 0)
            } else {
                let out = pg_sys::pg_any_to_server(
                    bytes.as_ptr().cast(),
                    bytes.len() as i32,
                    pg_sys::pg_enc::PG_UTF8 as i32,
                );
                if out.cast_const().cast::<u8>() == bytes.as_ptr() {
                    (out.cast_const(), bytes.len())
                } else {
                    (
                        out.cast_const(),
                        std::ffi::CStr::from_ptr(out).to_bytes().len(),
                    )
                }
            };
            let text = pg_sys::cstring_to_text_with_len(ptr, len as i32);
            Some(pg_sys::Datum::from(text))
        }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }
}

// SAFETY: the SQL type is `text`, which FromDatum and IntoDatum above read and write.
unsafe impl SqlTranslatable for DbText {
    const TYPE_IDENT: &'static str = "snowflake::dbtext::DbText";
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("TEXT"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
        Ok(ReturnsRef::One(SqlMappingRef::literal("TEXT")));
}

// SAFETY: a text argument, read through FromDatum; every function taking it is STRICT.
unsafe impl<'fcx> ArgAbi<'fcx> for DbText {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        // SAFETY: the caller passes a text argument (the SQL signature says so).
        match unsafe { arg.unbox_arg_using_from_datum() } {
            Some(text) => text,
            // STRICT functions are not called with NULL; an empty text keeps this total.
            None => DbText(String::new()),
        }
    }
}

// SAFETY: the datum is a text value made by IntoDatum in the current memory context.
unsafe impl BoxRet for DbText {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        match self.into_datum() {
            // SAFETY: a valid text datum.
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}

/// `text` as it may appear in a message: unchanged in a UTF-8 database or when ASCII;
/// otherwise each non-ASCII character as `\uXXXX`, since the database treats the bytes of
/// a message as its own encoding and Rust's are UTF-8.
pub fn for_message(text: String) -> String {
    // SAFETY: reads the encoding fixed at connection (SQL_ASCII in the postmaster).
    if text.is_ascii() || unsafe { pg_sys::GetDatabaseEncoding() } == pg_sys::pg_enc::PG_UTF8 as i32
    {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{:04X}", u32::from(c)));
        }
    }
    out
}
