//! Every error the extension raises: SQLSTATE, a message in core PostgreSQL's style, a DETAIL
//! with the numbers and a HINT with the fix. The pure modules return plain enums; this module
//! turns them into `ereport(ERROR)`.

use std::io;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

use crate::server::dbtext::for_message;

use snowflake_core::durable::{self, LayoutRecord, ResumePlan};
use snowflake_core::generator::{Events, GenerateError};
use snowflake_core::layout::{Epoch, LayoutError};
use snowflake_core::settings::{self, format_unix_ms, EpochProblem, SettingError};
use snowflake_core::text::{TextError, BASE32_LEN, SERIAL_DIGITS};

/// An error ready to be raised.
#[derive(Debug, Clone)]
pub struct SnowflakeError {
    code: PgSqlErrorCode,
    message: String,
    detail: String,
    hint: String,
}

impl SnowflakeError {
    fn new(
        code: PgSqlErrorCode,
        message: impl Into<String>,
        detail: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        SnowflakeError {
            code,
            message: message.into(),
            detail: detail.into(),
            hint: hint.into(),
        }
    }

    /// An internal error (XX000) for states that should be impossible.
    pub fn internal(message: String) -> Self {
        SnowflakeError::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            message,
            "This is a bug in the snowflake extension.",
            "Report it with the statement that caused it.",
        )
    }

    /// The report, its texts made safe for the database encoding (`dbtext::for_message`).
    fn report(self, function: &'static str) -> ErrorReport {
        let mut report = ErrorReport::new(self.code, for_message(self.message), function);
        if !self.detail.is_empty() {
            report = report.set_detail(for_message(self.detail));
        }
        if !self.hint.is_empty() {
            report = report.set_hint(for_message(self.hint));
        }
        report
    }

    /// Logs the error as a WARNING (used at server start).
    pub fn warn(self) {
        self.report("_PG_init").report(PgLogLevel::WARNING);
    }

    /// Writes the report to the server log only (LOG level), for events a DBA should find
    /// there but that are not an error for the caller.
    pub fn log(self) {
        self.report("snowflake").report(PgLogLevel::LOG);
    }

    /// Raises the error (`ereport(ERROR)`); never returns.
    pub fn raise(self, function: &'static str) -> ! {
        self.report(function).report(PgLogLevel::ERROR);
        unreachable!("ereport(ERROR) returned")
    }
}

/// Shorthand for fallible steps inside the SQL functions.
pub type Result<T> = std::result::Result<T, SnowflakeError>;

/// Raising a result's error: the one door out. Only the SQL-facing functions
/// (`src/functions/`) and the entry points PostgreSQL calls (`_PG_init`, the registry
/// worker, WAL redo, the transaction callback, datum conversions) raise; everything below
/// them returns a [`Result`]. `scripts/check-errors.py` (run by the test command) refuses a
/// raise anywhere else.
pub trait OrRaise<T> {
    /// The value, or the error raised as the function `function` (`ereport(ERROR)`).
    fn or_raise(self, function: &'static str) -> T;
}

impl<T> OrRaise<T> for Result<T> {
    #[inline]
    fn or_raise(self, function: &'static str) -> T {
        match self {
            Ok(value) => value,
            Err(e) => e.raise(function),
        }
    }
}

fn ms(unix_ms: i64) -> String {
    format!("{} ({unix_ms} ms)", format_unix_ms(unix_ms))
}

/// The library was not loaded through `shared_preload_libraries`.
pub fn not_preloaded(function: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "snowflake must be loaded via \"shared_preload_libraries\"",
        format!("{function}() keeps its state in shared memory, which exists only when the library is preloaded."),
        "Add 'snowflake' to shared_preload_libraries in postgresql.conf, set snowflake.worker_id, and restart the server.",
    )
}

/// A setting is unusable.
pub fn setting(err: &SettingError) -> SnowflakeError {
    let code = PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    match err {
        SettingError::Unset { name } => SnowflakeError::new(
            code,
            format!("{name} is not set"),
            "Every server that generates IDs needs its own worker id between 0 and 31. There is no default, so that two servers cannot share one by accident.",
            format!("Set {name} in postgresql.conf (or with ALTER SYSTEM) and restart the server."),
        ),
        SettingError::NotAnInteger { name, value } => SnowflakeError::new(
            code,
            format!("invalid value for parameter \"{name}\": \"{value}\""),
            format!("{name} must be an integer."),
            format!("Correct {name} in postgresql.conf and restart the server."),
        ),
        SettingError::OutOfRange { name, value, min, max } => SnowflakeError::new(
            code,
            format!("invalid value for parameter \"{name}\": \"{value}\""),
            format!("{value} is outside the valid range for parameter \"{name}\" ({min} .. {max})."),
            format!("Correct {name} in postgresql.conf and restart the server."),
        ),
        SettingError::RejectedAtStart { name, value } => SnowflakeError::new(
            code,
            format!("invalid value for parameter \"{name}\": \"{value}\""),
            format!("PostgreSQL rejected this value of {name} in the configuration at server start and kept the built-in default. snowflake refuses to generate IDs with a setting you did not choose; decoding is not affected."),
            if matches!(*name, "snowflake.claim_ttl" | "snowflake.rmgr_id") {
                format!("Correct {name} in postgresql.conf and restart the server.")
            } else {
                format!("Correct {name} in postgresql.conf and reload (SELECT pg_reload_conf()). If you remove the line instead, restart the server.")
            },
        ),
        SettingError::RegistryMissing => SnowflakeError::new(
            code,
            format!("{} is auto, but {} is not set", settings::WORKER_ID, settings::REGISTRY),
            "With worker_id = 'auto' the worker id is claimed from a registry.",
            format!(
                "Set {} to a redis://, redis+sentinel://, postgresql:// or etcd:// URI in postgresql.conf (see the manual's Registries page), or set {} to a number, and restart the server.",
                settings::REGISTRY,
                settings::WORKER_ID
            ),
        ),
        SettingError::BadRegistry { value } => SnowflakeError::new(
            code,
            format!("invalid value for parameter \"{}\": \"{value}\"", settings::REGISTRY),
            "The registry must be a redis[s]://, redis[s]+sentinel://, postgresql:// (or postgres://) or etcd[s]:// URI.",
            format!("Correct {} in postgresql.conf and restart the server.", settings::REGISTRY),
        ),
        SettingError::BadEpoch { value, reason } => SnowflakeError::new(
            code,
            format!("invalid value for parameter \"{}\": \"{value}\"", settings::EPOCH),
            format!("The value is unusable because {reason}."),
            format!(
                "Set {} to Unix milliseconds or to an ISO-8601 timestamp with time zone, such as '{}', and restart the server.",
                settings::EPOCH,
                settings::DEFAULT_EPOCH_TEXT
            ),
        ),
    }
}

/// The epoch cannot be used at the current time.
pub fn epoch_problem(problem: EpochProblem) -> SnowflakeError {
    let code = PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    match problem {
        EpochProblem::InFuture { epoch_ms, now_ms } => SnowflakeError::new(
            code,
            format!("{} is in the future", settings::EPOCH),
            format!(
                "The epoch is {}; the clock reads {}.",
                ms(epoch_ms),
                ms(now_ms)
            ),
            format!(
                "Set {} to a time in the past and restart the server.",
                settings::EPOCH
            ),
        ),
        EpochProblem::Exhausted {
            epoch_ms,
            now_ms,
            last_ms,
        } => SnowflakeError::new(
            code,
            "the current time is beyond the range of snowflake IDs",
            format!(
                "With epoch {}, 41 bits of milliseconds end at {}; the clock reads {}.",
                ms(epoch_ms),
                ms(last_ms),
                ms(now_ms)
            ),
            format!(
                "Check the system clock; if it is right, a new cluster with a later {} is needed.",
                settings::EPOCH
            ),
        ),
    }
}

/// `snowflake_next()` on a hot standby.
pub fn in_recovery(function: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        format!("cannot execute {function}() during recovery"),
        "A standby usually runs with its primary's configuration, and so with its worker id; IDs generated there could collide with the primary's.",
        "Generate IDs on the primary server.",
    )
}

/// The generator refused.
pub fn generate(err: GenerateError, epoch: Epoch) -> SnowflakeError {
    match err {
        GenerateError::ClockBehind {
            step_back_ms,
            ahead_ms,
            max_drift_ms,
        } => SnowflakeError::new(
            PgSqlErrorCode::ERRCODE_SYSTEM_ERROR,
            if step_back_ms > 0 {
                format!("system clock moved backwards by {step_back_ms} ms")
            } else {
                format!("system clock is {ahead_ms} ms behind the IDs already issued")
            },
            format!(
                "The next ID would be {ahead_ms} ms ahead of the clock; at most {max_drift_ms} ms is allowed. No ID was issued."
            ),
            "Wait until the clock catches up with the last issued ID, or correct the server's time source.",
        ),
        GenerateError::TimestampExhausted { timestamp } => SnowflakeError::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "the current time is beyond the range of snowflake IDs",
            format!(
                "Timestamp {timestamp} does not fit in 41 bits; with epoch {}, IDs end at {}.",
                ms(epoch.unix_ms()),
                ms(epoch.last_unix_ms())
            ),
            format!("Check the system clock; if it is right, a new cluster with a later {} is needed.", settings::EPOCH),
        ),
    }
}

/// The wall clock did not advance while waiting for it.
pub fn clock_stalled(waited_ms: u64) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_SYSTEM_ERROR,
        "system clock is not advancing",
        format!(
            "Waited {waited_ms} ms for the clock to reach the last issued ID. No ID was issued."
        ),
        "Check the server's time source.",
    )
}

/// The configured layout differs from the one recorded in the data directory.
pub fn layout_mismatch(recorded: &LayoutRecord, configured: &LayoutRecord) -> SnowflakeError {
    let code = PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    if recorded.epoch_ms != configured.epoch_ms {
        SnowflakeError::new(
            code,
            format!("{} does not match the epoch recorded for this cluster", settings::EPOCH),
            format!(
                "IDs of this cluster were generated with epoch {}, but {} is now {}. Decoding them with another epoch would give wrong times.",
                ms(recorded.epoch_ms),
                settings::EPOCH,
                ms(configured.epoch_ms)
            ),
            format!(
                "Set {} = '{}' in postgresql.conf and restart the server.",
                settings::EPOCH,
                format_unix_ms(recorded.epoch_ms)
            ),
        )
    } else {
        SnowflakeError::new(
            code,
            "the snowflake ID layout does not match the layout recorded for this cluster",
            format!(
                "Recorded bits (timestamp/datacenter/worker/sequence): {}/{}/{}/{}; this build: {}/{}/{}/{}.",
                recorded.timestamp_bits,
                recorded.datacenter_bits,
                recorded.worker_bits,
                recorded.sequence_bits,
                configured.timestamp_bits,
                configured.datacenter_bits,
                configured.worker_bits,
                configured.sequence_bits
            ),
            "Install the version of the extension that generated this cluster's IDs.",
        )
    }
}

/// Reading or writing the state file failed.
pub fn state_file(err: &io::Error, writing: bool) -> SnowflakeError {
    data_file(
        durable::STATE_FILE,
        err,
        writing,
        "The file in the data directory records the ID layout of this cluster. No ID was issued.",
        "Restore the file from a backup of this data directory (or a standby's copy). Removing it is safe only if the clock is past every ID already issued and no stored ID was generated with a different snowflake.epoch.",
    )
}

/// Reading or writing one of the extension's files in the data directory failed; `if_invalid`
/// is the HINT when the contents are damaged (otherwise: permissions and free space).
fn data_file(
    name: &str,
    err: &io::Error,
    writing: bool,
    detail: &str,
    if_invalid: &str,
) -> SnowflakeError {
    let damaged = err.kind() == io::ErrorKind::InvalidData;
    SnowflakeError::new(
        if damaged {
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED
        } else {
            PgSqlErrorCode::ERRCODE_IO_ERROR
        },
        format!(
            "could not {} file \"{name}\": {err}",
            if writing { "write" } else { "read" }
        ),
        detail,
        if damaged {
            if_invalid
        } else {
            "Check the permissions and free space of the data directory."
        },
    )
}

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

/// WAL replay found a state file it cannot read: replacing it could move the lease back.
pub fn state_file_in_replay(err: &io::Error) -> SnowflakeError {
    SnowflakeError::new(
        if err.kind() == io::ErrorKind::InvalidData {
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED
        } else {
            PgSqlErrorCode::ERRCODE_IO_ERROR
        },
        format!("could not read file \"{}\" during WAL replay: {err}", durable::STATE_FILE),
        "The file may hold a lease beyond the one being replayed; replacing it could let a promoted server reissue IDs. Recovery stops.",
        "Restore the file from the primary (it is safe to copy the primary's file over it), or fix its permissions, and start the server again.",
    )
}

/// One call renewed the lease again and again without issuing: renewals take longer than
/// even a widened lease reaches.
pub fn renewals_too_slow(renewals: u32, last_renewal_ms: u64, window_ms: u64) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_SYSTEM_ERROR,
        "could not extend the snowflake ID lease in time",
        format!(
            "{renewals} lease renewals in a row were used up before they completed; the last took {last_renewal_ms} ms, snowflake.lease_window is {window_ms} ms. No ID was issued."
        ),
        "Raise snowflake.lease_window above the time a lease write takes (a small-file fsync, plus the synchronous standbys' round trip), or check the storage and the standbys.",
    )
}

/// LOG at the first ID after a promotion (with a worker id set in the configuration).
pub fn promoted_resume(
    plan: &ResumePlan,
    now_unix_ms: i64,
    lead_ms: i64,
    margin_ms: i64,
    skipped: u32,
) -> SnowflakeError {
    let skipped = if skipped > 0 {
        format!(" {skipped} timeline(s) since the newest lease each add as much again.")
    } else {
        String::new()
    };
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!(
            "snowflake: promoted; IDs resume at {}, {} ms ahead of this server's clock",
            ms(plan.floor_unix_ms),
            plan.lead_ms(now_unix_ms)
        ),
        format!(
            "The old primary may have written leases this server never received. Its clock was seen {lead_ms} ms ahead of this server's; the resume point adds its largest lease reach and a margin of {margin_ms} ms.{skipped}"
        ),
        "No action is needed: IDs are issued from the resume point at once, ahead of the clock by at most that much, until the clock catches up.",
    )
}

/// Without preload, decoding takes the epoch from `snowflake_origin`, whose rows disagree.
pub fn origin_epochs_disagree(first_ms: i64, other_ms: i64) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        "table snowflake_origin records more than one epoch",
        format!(
            "Rows record epochs {} and {}; no single epoch decodes every ID in this database.",
            ms(first_ms),
            ms(other_ms)
        ),
        "Delete the rows that are wrong, or add snowflake to shared_preload_libraries and set snowflake.epoch, then restart the server.",
    )
}

/// This database's IDs were generated with another epoch than the configured one (its
/// `snowflake_origin` table says so; the state file may be gone, after pg_upgrade).
pub fn origin_epoch_mismatch(recorded_ms: i64, configured_ms: i64) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{} does not match the epoch recorded in this database", settings::EPOCH),
        format!(
            "Table snowflake_origin records that IDs in this database were generated with epoch {}, but {} is now {}. Decoding them with another epoch would give wrong times, and new IDs could repeat old ones.",
            ms(recorded_ms),
            settings::EPOCH,
            ms(configured_ms)
        ),
        format!(
            "Set {} = '{}' in postgresql.conf and restart the server.",
            settings::EPOCH,
            format_unix_ms(recorded_ms)
        ),
    )
}

/// Table `snowflake_origin` exists but cannot be read as the extension created it.
pub fn origin_table_unreadable(reason: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
        "could not read table snowflake_origin",
        format!("{reason}. The table records which cluster issued this database's IDs and with which epoch; no ID was issued."),
        "The table was altered: restore its definition (see docs/guarantees.md, \"Upgrades and restores\"), or recreate the extension.",
    )
}

/// A row of `snowflake_origin` records an epoch no server can have been configured with.
pub fn origin_row_invalid(epoch_unix_ms: i64) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        "table snowflake_origin holds an invalid epoch",
        format!("epoch_unix_ms = {epoch_unix_ms} is outside the range snowflake.epoch allows (Unix time 0 to 9999-12-31). The table records which cluster issued this database's IDs and with which epoch; no ID was issued."),
        "The table was edited: restore the row from a backup, or set epoch_unix_ms to the epoch the IDs were made with (see docs/guarantees.md, \"Upgrades and restores\").",
    )
}

/// The origins file could not be read or written.
pub fn origins_file(err: &io::Error, writing: bool) -> SnowflakeError {
    data_file(
        durable::ORIGINS_FILE,
        err,
        writing,
        "The file in the data directory lists the clusters whose IDs this server took over. No ID was issued.",
        "Remove the file: the server then takes those clusters' IDs over again, which only makes it wait once.",
    )
}

/// The prepared-transaction file (the watermark's holds) could not be read or written.
pub fn prepared_file(err: &io::Error, writing: bool) -> SnowflakeError {
    data_file(
        snowflake_core::watermark::PREPARED_FILE,
        err,
        writing,
        "The file in the data directory lists the smallest snowflake ID each prepared transaction holds, for snowflake_safe_upto().",
        "Commit or roll back the prepared transactions (pg_prepared_xacts), then remove the file.",
    )
}

/// The LOG line written when this server takes over IDs other clusters issued: `count`
/// clusters, the first of them (smallest identifier) named.
pub fn adopted_origins(
    first_system_identifier: u64,
    count: usize,
    floor_unix_ms: i64,
    reach_ms: i64,
) -> SnowflakeError {
    let clusters = if count == 1 {
        format!("the cluster with system identifier {first_system_identifier}")
    } else {
        format!("{count} other clusters (system identifiers {first_system_identifier} and more)")
    };
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!(
            "snowflake: this database's IDs were issued by {clusters}; IDs resume at {}",
            ms(floor_unix_ms)
        ),
        format!(
            "Table snowflake_origin names another cluster (pg_upgrade, or a dump restored here), whose lease this server cannot see. The resume point is {reach_ms} ms past this server's clock: the furthest that cluster could have issued IDs ahead of its clock with this server's snowflake.max_clock_drift and snowflake.lease_window."
        ),
        "snowflake_next() waits for it, once; the file snowflake.origins in the data directory records that it was done.",
    )
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

/// A rate-limited WARNING about clock events since the last one.
#[derive(Debug, Clone, Copy)]
pub struct ClockWarning {
    /// Counters at the previous warning.
    pub since: Events,
    /// Counters now.
    pub now: Events,
    /// Lead of the ID clock over the wall clock, ms (negative: behind).
    pub ahead_ms: i64,
    /// `snowflake.max_clock_drift`.
    pub max_drift_ms: u64,
}

impl ClockWarning {
    /// Emits the WARNING (to the client and the server log). Not an error: the call goes on.
    pub fn report(self) {
        let steps = self.now.steps_back - self.since.steps_back;
        let exhaustions = self.now.exhaustions - self.since.exhaustions;
        let message = if steps > 0 {
            format!(
                "snowflake: system clock moved backwards ({steps} time{} since the last report)",
                if steps == 1 { "" } else { "s" }
            )
        } else {
            format!(
                "snowflake: more than 4096 IDs were requested within one millisecond ({exhaustions} time{} since the last report)",
                if exhaustions == 1 { "" } else { "s" }
            )
        };
        let detail = format!(
            "Steps back: {steps} (largest ever {} ms). Exhausted milliseconds: {exhaustions}. The ID clock is {} ms ahead of the wall clock; snowflake.max_clock_drift allows {} ms.",
            self.now.largest_step_back_ms,
            self.ahead_ms.max(0),
            self.max_drift_ms
        );
        let hint = if steps > 0 {
            "No ID was or will be duplicated: IDs continue from the last issued one. Check the server's time source."
        } else {
            "No ID was or will be duplicated: IDs continue in the following milliseconds. One server issues at most 4,096 IDs per millisecond."
        };
        ErrorReport::new(PgSqlErrorCode::ERRCODE_WARNING, message, "snowflake")
            .set_detail(detail)
            .set_hint(hint)
            .report(PgLogLevel::WARNING);
    }
}

/// The registry worker could not set itself up (logged as a WARNING).
pub fn claim_setup(what: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("snowflake: {what}"),
        "snowflake.worker_id = 'auto' cannot claim a worker id.",
        "Check the server log for the cause.",
    )
}

/// The WARNING written once when the registry worker cannot use `snowflake.registry` at all
/// (a URI it refuses, a password file or CA file it cannot use): the worker then reports
/// `refused` until the server restarts, and without this line the cause was only in the
/// DETAIL of a session's error (issue 38's second walkthrough). `why` has no secret (the
/// clients' errors are filtered: `snowflake_registry::open`).
pub fn registry_unusable(registry: &str, why: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("snowflake: cannot use registry {registry}"),
        why.to_string(),
        "Correct snowflake.registry, snowflake.registry_password_file or snowflake.registry_ca_file (or the files they name), then restart the server; until then no worker id is claimed.",
    )
}

/// The LOG line written when the registry grants a claim.
pub fn claimed(
    datacenter_id: u8,
    worker_id: u8,
    registry: &str,
    own: bool,
    floor_unix_ms: i64,
) -> SnowflakeError {
    let how = if own {
        format!(
            "The claim was already this server's (it crash-restarted, or its registry worker claimed again); IDs start at {} or later, as before.",
            ms(floor_unix_ms)
        )
    } else {
        format!(
            "The worker id was free; IDs start above its earlier holders' IDs, at {} or later.",
            ms(floor_unix_ms)
        )
    };
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!(
            "snowflake: claimed worker id {worker_id} in datacenter {datacenter_id} from {registry}"
        ),
        how,
        "",
    )
}

/// The WARNING written when a granted worker id is given back because its floor is further
/// ahead of this server's clock than a caller may wait.
pub fn mark_ahead(
    datacenter_id: u8,
    worker_id: u8,
    registry: &str,
    floor_unix_ms: i64,
    ahead_ms: i64,
    usable_ms: i64,
) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "snowflake: worker id {worker_id} in datacenter {datacenter_id} of registry {registry} has a high-water mark ahead of this server's clock"
        ),
        snowflake_core::holder::mark_ahead_detail(worker_id, floor_unix_ms, ahead_ms, usable_ms),
        "A server whose clock ran ahead, or a registry clock that stepped back, left the mark. This server claims another worker id meanwhile; check the fleet's clock synchronization.",
    )
}

/// The WARNING written when a registry comes back from a loss of data with a clock further
/// behind its previous one than the settle after a loss covers.
pub fn registry_clock_jumped(
    registry: &str,
    offset_before_ms: i64,
    offset_after_ms: i64,
    allowed_ms: u64,
) -> SnowflakeError {
    let back = offset_before_ms - offset_after_ms;
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("snowflake: registry {registry} came back with a clock {back} ms behind its previous one"),
        format!(
            "The registry began anew (restarted, restored or failed over) and its clock now reads {offset_after_ms} ms from this server's, against {offset_before_ms} ms before: more than the {allowed_ms} ms (3/10 of snowflake.claim_ttl) that its settling covers. A server cut off from the registry through the settling could have its worker id given to another server while it still issues, and duplicate IDs follow."
        ),
        "Keep the clocks of every host the registry can run on (its replicas, failover targets, the hosts it is restarted on) synchronized with the servers' clocks.",
    )
}

/// The LOG line written when a claim is fenced.
pub fn claim_fenced(datacenter_id: u8, worker_id: u8, registry: &str, why: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "snowflake: stopped issuing IDs with worker id {worker_id} in datacenter {datacenter_id}: the claim from {registry} is no longer this server's"
        ),
        why.to_string(),
        "The server claims a worker id again as soon as the registry answers.",
    )
}

/// The WARNING written when giving a claim back at shutdown fails: the worker id stays
/// taken until its claim lapses.
pub fn release_failed(
    datacenter_id: u8,
    worker_id: u8,
    registry: &str,
    why: &str,
    ttl_ms: u64,
) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
        format!(
            "snowflake: could not release worker id {worker_id} in datacenter {datacenter_id} to {registry}"
        ),
        format!("{why}; the claim stays taken until it lapses, {ttl_ms} ms (snowflake.claim_ttl) after its last renewal."),
        "If this server starts again before then, it claims another worker id; nothing else is needed.",
    )
}

/// `snowflake.worker_id = 'auto'` and no usable claim: the caller's error (55000).
pub fn claim_unavailable(
    status: snowflake_core::claim::ClaimStatus,
    detail: &str,
    registry: &str,
    datacenter_id: u8,
) -> SnowflakeError {
    use snowflake_core::claim::ClaimStatus;
    let code = PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    let detail = if detail.is_empty() {
        "The registry worker has not claimed a worker id yet.".to_string()
    } else {
        detail.to_string()
    };
    match status {
        ClaimStatus::Exhausted => SnowflakeError::new(
            code,
            format!("no free worker id in datacenter {datacenter_id} of registry {registry}"),
            detail,
            "Stop a server that no longer needs its worker id (its claim lapses after snowflake.claim_ttl), or give some servers another snowflake.datacenter_id.",
        ),
        ClaimStatus::Settling => SnowflakeError::new(
            code,
            format!("registry {registry} is not granting worker ids yet"),
            detail,
            "Retry shortly; the server claims its worker id by itself.",
        ),
        ClaimStatus::Refused => SnowflakeError::new(
            code,
            format!("registry {registry} refused this server a worker id"),
            detail,
            "Fix the cause named above (clock synchronization, snowflake.epoch, snowflake.claim_ttl, snowflake.registry) and restart the server if it is a setting. Change snowflake.claim_ttl across a fleet in steps of at most a fifth.",
        ),
        ClaimStatus::MarkAhead => SnowflakeError::new(
            code,
            format!("registry {registry} records a high-water mark ahead of this server's clock"),
            detail,
            "The mark was left by a server whose clock ran ahead. IDs resume by themselves once another worker id is free or this server's clock nears the mark; check the fleet's clock synchronization.",
        ),
        ClaimStatus::Fenced => SnowflakeError::new(
            code,
            format!("this server's worker id claim from registry {registry} has lapsed"),
            detail,
            "Check that the registry is reachable from this server; IDs resume by themselves once it claims a worker id again.",
        ),
        ClaimStatus::Starting | ClaimStatus::Held | ClaimStatus::Unreachable => SnowflakeError::new(
            code,
            format!("no worker id claimed from registry {registry}"),
            detail,
            "Check that the registry is reachable from this server; IDs are issued by themselves once it claims a worker id.",
        ),
    }
}

/// `snowflake.registry` is set, but `snowflake.worker_id` is a number (a WARNING at start).
pub fn registry_unused(worker_id: u8) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!(
            "{} is set, but {} is {worker_id}: the registry is not used",
            settings::REGISTRY,
            settings::WORKER_ID
        ),
        "Only snowflake.worker_id = 'auto' claims a worker id from the registry.",
        "Set snowflake.worker_id = 'auto' to use the registry, or remove snowflake.registry.",
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

/// A registry request failed, with a cause other than the last one logged: logged once per
/// change of cause, so that a refused coordinator (its tables owned by another role) or an
/// unreachable registry shows in the server log, not only in callers' DETAIL. `why` has no
/// secret (the clients' errors are filtered; see `snowflake_registry::open`).
pub fn registry_request_failed(registry: &str, why: &str) -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
        format!("snowflake: a request to registry {registry} failed"),
        why.to_string(),
        "Fix the cause named in DETAIL (the registry's address, TLS, the password, or the owners of the coordinator's schema and tables); the registry worker retries by itself.",
    )
}

// -- Transport trust (issue 35, attack 5; added by the transport session) -----------------

/// `snowflake.registry` holds a password (a WARNING at start): members of
/// `pg_read_all_settings` (`pg_monitor` among them) read every setting, this one too.
pub fn registry_password_in_setting() -> SnowflakeError {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("{} holds a password", settings::REGISTRY),
        "Superusers and members of pg_read_all_settings (pg_monitor among them) can read it.",
        "Put the password in the file that snowflake.registry_password_file names (its first line for Redis and etcd, .pgpass lines for a coordinator), readable only by the server's OS user, and remove it from the URI.",
    )
}
