//! Every error and server-log line of the extension: SQLSTATE, a message in core
//! PostgreSQL's style, a DETAIL with the numbers and a HINT with the fix. The pure modules
//! return plain enums; the constructors here turn them into reports, one file per domain,
//! each message next to its siblings (re-exported here: `errors::not_preloaded`).
//!
//! Two kinds of report, named as such: a [`SnowflakeError`] is raised (`ereport(ERROR)`), and
//! only at a door ([`OrRaise`]); a [`LogLine`] is a WARNING or a LOG line, written where it
//! happens, and the caller goes on.

use std::io;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

use crate::server::dbtext::for_message;

use snowflake_core::durable::{self, LayoutRecord, ResumePlan};
use snowflake_core::generator::{Events, GenerateError};
use snowflake_core::layout::{Epoch, LayoutError};
use snowflake_core::settings::{self, format_unix_ms, EpochProblem, SettingError};
use snowflake_core::text::{TextError, BASE32_LEN, SERIAL_DIGITS};

mod arguments;
mod durable_files;
mod fleet;
mod generation;
mod origin;
mod setup;

pub use arguments::*;
pub use durable_files::*;
pub use fleet::*;
pub use generation::*;
pub use origin::*;
pub use setup::*;

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

    /// The report as a WARNING instead of an error (a setting refused at server start).
    pub fn into_warning(self) -> LogLine {
        LogLine {
            level: PgLogLevel::WARNING,
            report: self,
        }
    }

    /// The report as a LOG line (the server log only).
    fn into_log(self) -> LogLine {
        LogLine {
            level: PgLogLevel::LOG,
            report: self,
        }
    }

    /// Raises the error (`ereport(ERROR)`); never returns.
    pub fn raise(self, function: &'static str) -> ! {
        self.report(function).report(PgLogLevel::ERROR);
        unreachable!("ereport(ERROR) returned")
    }
}

/// A WARNING (to the client, if any, and the server log) or a LOG line (the server log
/// only): a report that is not an error, so that the caller goes on.
#[derive(Debug, Clone)]
#[must_use = "a LogLine says nothing until it is written"]
pub struct LogLine {
    level: PgLogLevel,
    report: SnowflakeError,
}

impl LogLine {
    /// Writes the line.
    pub fn write(self) {
        self.report.report("snowflake").report(self.level);
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
