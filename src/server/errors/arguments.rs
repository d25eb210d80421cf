//! What SQL callers pass and get back: counts, layouts, timestamps, text forms, result
//! types, retired functions, allocations a caller sizes.

use super::*;

/// Decode-side: an ID or a timestamp outside the layout.
pub fn layout(err: LayoutError) -> SnowflakeError {
    match err {
        LayoutError::NegativeId(id) => SnowflakeError::new(
            PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("snowflake ID {id} is out of range"),
            "Snowflake IDs are between 0 and 9223372036854775807: bit 63 is always 0.",
            "Pass an ID made by snowflake_next() or by another Snowflake generator.",
        ),
        LayoutError::BeforeEpoch { unix_ms, epoch_ms } => SnowflakeError::new(
            PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
            "timestamp out of range for a snowflake ID",
            format!("{} is before the epoch {}.", ms(unix_ms), ms(epoch_ms)),
            format!(
                "Use a timestamp at or after {} (set by {}).",
                format_unix_ms(epoch_ms),
                settings::EPOCH
            ),
        ),
        LayoutError::AfterRange { unix_ms, last_ms } => SnowflakeError::new(
            PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
            "timestamp out of range for a snowflake ID",
            format!(
                "{} is after {}, the last millisecond that 41 bits can hold.",
                ms(unix_ms),
                ms(last_ms)
            ),
            format!("Use a timestamp at or before {}.", format_unix_ms(last_ms)),
        ),
    }
}

/// A function of an earlier version that this library no longer provides was called.
pub fn retired_function(name: &str, removed_in: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!("{name}() was removed in snowflake {removed_in}"),
        "This database still has the extension's objects of an earlier version; the installed library no longer provides this function.",
        "Run ALTER EXTENSION snowflake UPDATE in this database.",
    )
}

/// A Rust allocation of a size a caller chose failed: PostgreSQL's own error for that.
pub fn out_of_memory(bytes: usize) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
        "out of memory",
        format!("Failed on request of size {bytes} bytes."),
        "",
    )
}

/// A batch or block size out of range.
pub fn bad_count(what: &str, n: i32, max: i32) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("{what} {n} is out of range"),
        format!("The {what} must be between 1 and {max}."),
        format!("Ask for at most {max} IDs per call, and call again for more."),
    )
}

/// `snowflake_decode(id, layout)` with an unknown layout name.
pub fn unknown_layout(name: &str, known: &[&str]) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("unknown snowflake layout \"{}\"", abbreviated(name)),
        format!("Known layouts: {}.", known.join(", ")),
        "Pass one of the known layout names.",
    )
}

/// The longest user input a message quotes whole (characters).
const QUOTED_INPUT_CHARS: usize = 64;

/// `input` as a message quotes it: whole when short, else its first characters and an
/// ellipsis (a message must not carry, or take long to build from, a 1 GB argument).
fn abbreviated(input: &str) -> String {
    match input.char_indices().nth(QUOTED_INPUT_CHARS) {
        None => input.to_string(),
        Some((end, _)) => format!("{}...", &input[..end]),
    }
}

/// Decode-side: an infinite timestamp.
pub fn infinite_timestamp() -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
        "timestamp out of range for a snowflake ID",
        "Infinite timestamps have no snowflake ID.",
        "Use a finite timestamp.",
    )
}

/// A composite result type of the extension was altered (its attributes no longer match
/// the row the function builds). Forming the row anyway would crash the server.
pub fn altered_row_type(type_name: &str, detail: String) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
        format!("type {type_name} does not match the snowflake extension"),
        detail,
        format!("Undo the ALTER TYPE on {type_name}, or recreate the extension (DROP EXTENSION snowflake; CREATE EXTENSION snowflake)."),
    )
}

/// A function of this library was declared (by hand, as a C function) with another result
/// type than the one it produces.
pub fn wrong_result_type(function: &str, declared: &str, produced: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
        format!("function {function} is declared to return {declared}"),
        format!("The library's {function}() returns {produced}."),
        "Recreate the extension (DROP EXTENSION snowflake; CREATE EXTENSION snowflake) instead of declaring its functions by hand.",
    )
}

/// A serial or base32 text that is not one, or an ID that has no such text.
pub fn text(err: TextError) -> SnowflakeError {
    use PgSqlErrorCode::*;
    let serial_hint = "A serial ends in 25 digits: the UTC time as YYYYMMDDHHMISSmmm, the datacenter (2 digits), the worker (2) and the sequence (4), as snowflake_serial() writes them.";
    let base32_hint = "Pass 13 characters of Crockford base32 (0-9 and A-Z without I, L, O, U; I and L read as 1, O as 0), as snowflake_to_base32() writes them.";
    match err {
        TextError::Layout(e) => layout(e),
        TextError::YearOutOfRange { unix_ms } => SnowflakeError::new(
            ERRCODE_DATETIME_FIELD_OVERFLOW,
            "snowflake ID is out of range for a serial",
            format!("The ID's time {} is after year 9999; a serial has a 4-digit year.", ms(unix_ms)),
            "Use snowflake_to_base32() or the ID itself for IDs this far in the future.",
        ),
        TextError::OutOfMemory { bytes } => out_of_memory(bytes),
        TextError::SerialTooLong { prefix_bytes } => SnowflakeError::new(
            ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            "snowflake serial would be too long",
            format!(
                "The prefix has {prefix_bytes} bytes; with the {SERIAL_DIGITS} digits, a serial must fit in {} bytes, the most a text value holds.",
                snowflake_core::text::MAX_TEXT_BYTES
            ),
            "Use a shorter prefix.",
        ),
        TextError::SerialTooShort { len } => SnowflakeError::new(
            ERRCODE_INVALID_TEXT_REPRESENTATION,
            "invalid snowflake serial: too short",
            format!("The text has {len} characters; a serial has at least {SERIAL_DIGITS}."),
            serial_hint,
        ),
        TextError::SerialNotDigit { position, found } => SnowflakeError::new(
            ERRCODE_INVALID_TEXT_REPRESENTATION,
            format!("invalid snowflake serial: \"{}\" is not a digit", found.escape_debug()),
            format!("Character {position} is one of the last {SERIAL_DIGITS}, which must all be digits 0-9."),
            serial_hint,
        ),
        TextError::SerialBadTime { digits } => SnowflakeError::new(
            ERRCODE_DATETIME_FIELD_OVERFLOW,
            "invalid snowflake serial: not a valid date and time",
            format!("The time digits {digits} are not a UTC time YYYYMMDDHHMISSmmm."),
            serial_hint,
        ),
        TextError::SerialFieldOutOfRange { field, value, max } => SnowflakeError::new(
            ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("invalid snowflake serial: {field} {value} is out of range"),
            format!("The {field} is between 0 and {max}."),
            serial_hint,
        ),
        TextError::SerialTimeOutOfRange(e) => {
            let mut report = layout(e);
            report.message = "invalid snowflake serial: its time is outside the IDs' range".into();
            report.hint = "The serial's time must be between snowflake.epoch and the last millisecond 41 bits can hold; check that it was made with this database's epoch.".into();
            report
        }
        TextError::Base32Length { len } => SnowflakeError::new(
            ERRCODE_INVALID_TEXT_REPRESENTATION,
            "invalid snowflake base32 text: wrong length",
            format!("The text has {len} characters; it must have {BASE32_LEN}."),
            base32_hint,
        ),
        TextError::Base32BadChar { position, found } => SnowflakeError::new(
            ERRCODE_INVALID_TEXT_REPRESENTATION,
            format!("invalid snowflake base32 text: \"{}\" is not a base32 digit", found.escape_debug()),
            format!("Character {position} is outside Crockford's alphabet."),
            base32_hint,
        ),
        TextError::Base32TooLarge => SnowflakeError::new(
            ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            "invalid snowflake base32 text: value out of range",
            "The first character must be 0-7: larger values do not fit in a bigint (bit 63 of an ID is 0).",
            base32_hint,
        ),
    }
}

// -- The registry worker's failed requests (issue 35; added by the fleet's session) ------
