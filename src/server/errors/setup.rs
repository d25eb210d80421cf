//! Preload, settings, the epoch and the recorded layout: what `_PG_init` and the first call
//! of a backend check.

use super::*;

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

/// `snowflake.registry` is set, but `snowflake.worker_id` is a number (a WARNING at start).
pub fn registry_unused(worker_id: u8) -> LogLine {
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
    .into_warning()
}

/// `snowflake.registry` holds a password (a WARNING at start): members of
/// `pg_read_all_settings` (`pg_monitor` among them) read every setting, this one too.
pub fn registry_password_in_setting() -> LogLine {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("{} holds a password", settings::REGISTRY),
        "Superusers and members of pg_read_all_settings (pg_monitor among them) can read it.",
        "Put the password in the file that snowflake.registry_password_file names (its first line for Redis and etcd, .pgpass lines for a coordinator), readable only by the server's OS user, and remove it from the URI.",
    ).into_warning()
}
