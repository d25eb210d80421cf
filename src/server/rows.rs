//! Result values whose shape comes from the catalog: composite rows (`snowflake_parts`,
//! `snowflake_stats_row`) and the `bigint[]` of `snowflake_next_batch()`.
//!
//! The owner of a type can alter it (`ALTER TYPE ... ALTER ATTRIBUTE ... TYPE text`), and a
//! row formed with datums of the old types would make PostgreSQL read an integer as a
//! pointer. So every row is checked against the type's current descriptor, attribute by
//! attribute, before it is formed; a mismatch is a 42804 error, never a crash.

use pgrx::callconv::{BoxRet, FcInfo};
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::prelude::*;
use pgrx::{AllocatedByRust, PgTupleDesc};

use crate::server::errors::{self, SnowflakeError};
use snowflake_core::foreign::ForeignParts;
use snowflake_core::layout::UnixMs;

/// Unix milliseconds of PostgreSQL's timestamp origin, 2000-01-01T00:00:00Z.
const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;

/// A Unix millisecond as `timestamptz`.
pub(crate) fn timestamptz(unix_ms: i64) -> errors::Result<TimestampWithTimeZone> {
    let micros = (unix_ms - PG_EPOCH_UNIX_MS) * 1_000;
    // Every epoch is at most year 9999 and 41 bits add ~70 years: always in range.
    TimestampWithTimeZone::try_from(micros).map_err(|_| {
        errors::layout(snowflake_core::layout::LayoutError::AfterRange {
            unix_ms,
            last_ms: unix_ms,
        })
    })
}

/// The Unix millisecond containing a finite `timestamptz` (rounded down).
pub(crate) fn unix_ms_of(ts: TimestampWithTimeZone) -> UnixMs {
    let micros: i64 = ts.into_inner();
    UnixMs(micros.div_euclid(1_000) + PG_EPOCH_UNIX_MS)
}

/// One attribute of a result row: its name, the type of the value the extension puts
/// there, and the value.
pub(crate) struct Cell {
    name: &'static str,
    type_oid: pg_sys::Oid,
    datum: Option<pg_sys::Datum>,
}

/// The attribute `name` holding `value`; its SQL type is the Rust type's, so the check
/// below compares what is really stored, not a column list kept by hand.
pub(crate) fn cell<T: IntoDatum>(name: &'static str, value: T) -> Cell {
    Cell {
        name,
        type_oid: T::type_oid(),
        datum: value.into_datum(),
    }
}

/// One attribute of a row type as the catalog describes it now (borrowed from the tuple
/// descriptor: the check allocates nothing unless it fails).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attribute<'a> {
    pub name: &'a str,
    pub type_oid: u32,
    pub dropped: bool,
}

/// How a row type differs from the row the extension builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// The type has `found` live attributes; the extension builds `expected`.
    Count { found: usize, expected: usize },
    /// The live attribute at `position` (1-based, dropped ones not counted) differs.
    Attribute {
        position: usize,
        found: (String, u32),
        expected: (&'static str, u32),
    },
}

/// Where each of `expected` goes among `attributes` (dropped attributes stay NULL), or how
/// the two differ. Attributes must match in order, by name and exact type.
pub(crate) fn placement<const N: usize>(
    attributes: &[Attribute<'_>],
    expected: &[(&'static str, u32); N],
) -> Result<[usize; N], Mismatch> {
    let found = attributes.iter().filter(|a| !a.dropped).count();
    if found != N {
        return Err(Mismatch::Count { found, expected: N });
    }
    let mut live = attributes
        .iter()
        .enumerate()
        .filter(|(_, a)| !a.dropped)
        .map(|(index, _)| index);
    let mut placed = [0; N];
    for (position, &(name, type_oid)) in expected.iter().enumerate() {
        // Exactly N live attributes were counted above.
        let index = live.next().unwrap_or_default();
        let attribute = attributes[index];
        if attribute.name != name || attribute.type_oid != type_oid {
            return Err(Mismatch::Attribute {
                position: position + 1,
                found: (attribute.name.to_string(), attribute.type_oid),
                expected: (name, type_oid),
            });
        }
        placed[position] = index;
    }
    Ok(placed)
}

/// What a call site (its `fn_extra`) remembers of the last check: the version of the type's
/// descriptor (the type cache's `tupDesc_identifier`, new after every change of the type)
/// and where each cell goes.
struct CheckedShape<const N: usize> {
    identifier: u64,
    live: [usize; N],
}

/// A row of the calling function's declared result type holding `cells`, after checking
/// that the type still has exactly these attributes with these types. The check runs once
/// per call site and version of the type, not once per row.
pub(crate) fn result_row<const N: usize>(
    fcinfo: pg_sys::FunctionCallInfo,
    function: &'static str,
    cells: [Cell; N],
) -> errors::Result<PgHeapTuple<'static, AllocatedByRust>> {
    let (tupdesc, identifier) = result_tupdesc(fcinfo, function)?;
    // SAFETY: these functions are not set-returning, so nothing else uses their fn_extra;
    // it lives in the call site's memory context.
    let mut checked = unsafe {
        pgrx::pg_func_extra(fcinfo, || CheckedShape::<N> {
            identifier: 0,
            live: [0; N],
        })
    };
    if identifier == 0 || checked.identifier != identifier {
        checked.live = shape_of(&tupdesc, function, &cells)?;
        checked.identifier = identifier;
    }
    let mut datums: Vec<Option<pg_sys::Datum>> = vec![None; tupdesc.len()];
    for (&index, cell) in checked.live.iter().zip(cells) {
        datums[index] = cell.datum;
    }
    // SAFETY: every live attribute of this version of the type has been checked to have the
    // exact type of the datum placed in it; dropped attributes are NULL.
    unsafe { PgHeapTuple::from_datums(tupdesc, datums) }
        .map_err(|e| SnowflakeError::internal(format!("{e}")))
}

/// Where each cell goes in the type's current descriptor; 42804 if the type no longer has
/// exactly these attributes.
fn shape_of<const N: usize>(
    tupdesc: &PgTupleDesc<'_>,
    function: &'static str,
    cells: &[Cell; N],
) -> errors::Result<[usize; N]> {
    let attributes: Vec<Attribute> = tupdesc
        .iter()
        .map(|a| Attribute {
            name: a.name(),
            type_oid: a.atttypid.to_u32(),
            dropped: a.is_dropped(),
        })
        .collect();
    let expected = cells.each_ref().map(|c| (c.name, c.type_oid.to_u32()));
    placement(&attributes, &expected).map_err(|m| altered(tupdesc.oid(), function, &m))
}

/// The tuple descriptor of the function's declared result type, looked up from the call
/// itself rather than by name, so that `search_path` cannot substitute another type; and
/// the version of the descriptor (the type cache's `tupDesc_identifier`), read *before* the
/// descriptor: should the type change in between, the version remembered is older than the
/// descriptor checked, and the next call checks again.
fn result_tupdesc(
    fcinfo: pg_sys::FunctionCallInfo,
    function: &'static str,
) -> errors::Result<(PgTupleDesc<'static>, u64)> {
    let mut type_oid = pg_sys::InvalidOid;
    // SAFETY: fcinfo is the live call's; a NULL tupdesc output is allowed.
    let class =
        unsafe { pg_sys::get_call_result_type(fcinfo, &mut type_oid, std::ptr::null_mut()) };
    let not_composite =
        || errors::wrong_result_type(function, &type_name(type_oid), "a composite type");
    if class != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE {
        return Err(not_composite());
    }
    // SAFETY: type_oid is a composite type (checked above); the entry is never freed.
    let identifier = unsafe {
        (*pg_sys::lookup_type_cache(type_oid, pg_sys::TYPECACHE_TUPDESC as i32)).tupDesc_identifier
    };
    let tupdesc = PgTupleDesc::for_composite_type_by_oid(type_oid).ok_or_else(not_composite)?;
    Ok((tupdesc, identifier))
}

/// Refuses a call whose function is declared with another result type than `expected`
/// (a C function created by hand over this library's symbol). Checked once per call site:
/// a function's result type cannot change without a new function, hence a new call site.
fn check_result_type(
    fcinfo: pg_sys::FunctionCallInfo,
    function: &'static str,
    expected: pg_sys::Oid,
) -> errors::Result<()> {
    // SAFETY: fcinfo belongs to the live call.
    if unsafe { (*fcinfo).flinfo.is_null() } {
        return Ok(()); // a direct call from C, with no declaration to check
    }
    // SAFETY: not a set-returning function, so nothing else uses its fn_extra.
    let mut checked = unsafe { pgrx::pg_func_extra(fcinfo, || false) };
    if *checked {
        return Ok(());
    }
    // SAFETY: fcinfo and its flinfo belong to the live call.
    let declared = unsafe { pg_sys::get_func_rettype((*(*fcinfo).flinfo).fn_oid) };
    if declared != expected {
        return Err(errors::wrong_result_type(
            function,
            &type_name(declared),
            &type_name(expected),
        ));
    }
    *checked = true;
    Ok(())
}

/// The type's name as PostgreSQL prints it (schema-qualified when not visible).
fn type_name(type_oid: pg_sys::Oid) -> String {
    if type_oid == pg_sys::InvalidOid {
        return "an unknown type".to_string();
    }
    // SAFETY: format_type_be returns a palloc'd C string for any OID (or "???").
    unsafe {
        std::ffi::CStr::from_ptr(pg_sys::format_type_be(type_oid))
            .to_string_lossy()
            .into_owned()
    }
}

fn altered(row_type: pg_sys::Oid, function: &str, mismatch: &Mismatch) -> SnowflakeError {
    let type_of = |oid: u32| type_name(pg_sys::Oid::from(oid));
    let detail = match mismatch {
        Mismatch::Count { found, expected } => format!(
            "The type has {found} attribute(s), but {function}() returns {expected}."
        ),
        Mismatch::Attribute {
            position,
            found,
            expected,
        } => format!(
            "Attribute {position} is \"{}\" of type {}, but {function}() returns \"{}\" of type {} there.",
            found.0,
            type_of(found.1),
            expected.0,
            type_of(expected.1)
        ),
    };
    errors::altered_row_type(&type_name(row_type), detail)
}

/// A one-dimensional `bigint[]` without NULLs, allocated (palloc) before generation so
/// that IDs are written in place. pgrx's generic `Vec<i64>` return appends element by
/// element, which costs more than generating the IDs.
pub(crate) struct Int8Array {
    array: *mut pg_sys::ArrayType,
    len: usize,
    filled: usize,
}

impl Int8Array {
    /// Header: ArrayType (16 bytes), one dimension and one lower bound (4 + 4), MAXALIGNed.
    const HEADER: usize = 24;

    /// An array of `len` elements still to be filled, for a call of `function` whose
    /// declared result type is checked to be `bigint[]` first.
    pub(crate) fn for_call(
        fcinfo: pg_sys::FunctionCallInfo,
        function: &'static str,
        len: usize,
    ) -> errors::Result<Int8Array> {
        check_result_type(fcinfo, function, pg_sys::INT8ARRAYOID)?;
        let bytes = Self::HEADER + len * 8;
        // SAFETY: a fresh palloc of the exact size, header written field by field as
        // PostgreSQL's construct_md_array does for a 1-D array without NULLs.
        unsafe {
            // Not palloc0: the data area is written while generating, so its page faults
            // fall into the generator's idle time instead of before it.
            let array = pg_sys::palloc(bytes).cast::<pg_sys::ArrayType>();
            array.cast::<u8>().write_bytes(0, Self::HEADER);
            pgrx::set_varsize_4b(array.cast(), bytes as i32);
            (*array).ndim = 1;
            (*array).dataoffset = 0;
            (*array).elemtype = pg_sys::INT8OID;
            let dims = array.cast::<u8>().add(16).cast::<i32>();
            dims.write(len as i32);
            dims.add(1).write(1);
            Ok(Int8Array {
                array,
                len,
                filled: 0,
            })
        }
    }

    /// Elements still to be written.
    pub(crate) fn remaining(&self) -> usize {
        self.len - self.filled
    }

    /// Writes the next element.
    #[inline]
    pub(crate) fn push(&mut self, value: i64) {
        assert!(self.filled < self.len, "array overflow");
        // SAFETY: in bounds (checked above); the data area starts at HEADER, 8-aligned.
        unsafe {
            let data = self.array.cast::<u8>().add(Self::HEADER).cast::<i64>();
            data.add(self.filled).write(value);
        }
        self.filled += 1;
    }
}

// SAFETY: the same SQL type as Vec<i64> (bigint[]), which box_into produces.
unsafe impl SqlTranslatable for Int8Array {
    const TYPE_IDENT: &'static str = <Vec<i64> as SqlTranslatable>::TYPE_IDENT;
    const TYPE_ORIGIN: TypeOrigin = <Vec<i64> as SqlTranslatable>::TYPE_ORIGIN;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> =
        <Vec<i64> as SqlTranslatable>::ARGUMENT_SQL;
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = <Vec<i64> as SqlTranslatable>::RETURN_SQL;
}

// SAFETY: returns the completed int8[] datum, allocated in the caller's memory context.
unsafe impl BoxRet for Int8Array {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        assert_eq!(self.filled, self.len, "batch not filled");
        // SAFETY: `array` is a complete int8[] in the caller's memory context (filled: checked).
        unsafe { fcinfo.return_raw_datum(pg_sys::Datum::from(self.array)) }
    }
}

/// A `snowflake_parts` row.
pub(crate) fn parts_row(
    fcinfo: pg_sys::FunctionCallInfo,
    function: &'static str,
    parts: &ForeignParts,
) -> errors::Result<PgHeapTuple<'static, AllocatedByRust>> {
    result_row(
        fcinfo,
        function,
        [
            cell("ts", timestamptz(parts.unix_ms)?),
            cell("unix_ms", parts.unix_ms),
            cell("datacenter_id", parts.datacenter_id),
            cell("worker_id", parts.worker_id),
            cell("sequence", parts.sequence),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(name: &str, type_oid: u32, dropped: bool) -> Attribute<'_> {
        Attribute {
            name,
            type_oid,
            dropped,
        }
    }

    const EXPECTED: [(&str, u32); 3] = [("a", 20), ("b", 23), ("c", 25)];

    #[test]
    fn exact_shape_places_in_order() {
        let attrs = [
            attr("a", 20, false),
            attr("b", 23, false),
            attr("c", 25, false),
        ];
        assert_eq!(placement(&attrs, &EXPECTED), Ok([0, 1, 2]));
    }

    #[test]
    fn dropped_attributes_are_skipped() {
        let attrs = [
            attr("a", 20, false),
            attr("........pg.dropped.2........", 0, true),
            attr("b", 23, false),
            attr("c", 25, false),
        ];
        assert_eq!(placement(&attrs, &EXPECTED), Ok([0, 2, 3]));
    }

    #[test]
    fn changed_type_name_or_count_is_refused() {
        let retyped = [
            attr("a", 20, false),
            attr("b", 25, false),
            attr("c", 25, false),
        ];
        assert_eq!(
            placement(&retyped, &EXPECTED),
            Err(Mismatch::Attribute {
                position: 2,
                found: ("b".to_string(), 25),
                expected: ("b", 23)
            })
        );
        let renamed = [
            attr("a", 20, false),
            attr("x", 23, false),
            attr("c", 25, false),
        ];
        assert!(matches!(
            placement(&renamed, &EXPECTED),
            Err(Mismatch::Attribute { position: 2, .. })
        ));
        let added = [
            attr("a", 20, false),
            attr("b", 23, false),
            attr("c", 25, false),
            attr("d", 25, false),
        ];
        assert_eq!(
            placement(&added, &EXPECTED),
            Err(Mismatch::Count {
                found: 4,
                expected: 3
            })
        );
        let dropped = [
            attr("a", 20, false),
            attr("b", 23, true),
            attr("c", 25, false),
        ];
        assert_eq!(
            placement(&dropped, &EXPECTED),
            Err(Mismatch::Count {
                found: 2,
                expected: 3
            })
        );
    }
}
