//! Issuing: the generator refused, the clock, lease renewals, and the clock WARNING.

use super::*;

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
    /// Emits the WARNING (to the client and the server log) as coming from the SQL function
    /// `function` (its source function, which clients see). Not an error: the call goes on.
    pub fn report(self, function: &'static str) {
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
        ErrorReport::new(PgSqlErrorCode::ERRCODE_WARNING, message, function)
            .set_detail(detail)
            .set_hint(hint)
            .report(PgLogLevel::WARNING);
    }
}
