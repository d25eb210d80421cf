//! Parsing and validation of the configuration, in plain Rust (no pgrx).
//!
//! The GUCs are declared as strings (see `gucs.rs`) so that a bad value in `postgresql.conf`
//! reaches this code instead of being replaced by PostgreSQL's built-in default with only a
//! WARNING in the log. Every value is checked here, and a bad one makes generation refuse.

use std::ffi::CStr;

use crate::civil::parse_iso8601_ms;
// The formats messages use, where the extension has always found them.
pub use crate::civil::{format_rfc3339, format_unix_ms};
use crate::layout::{Epoch, MAX_DATACENTER_ID, MAX_TIMESTAMP, MAX_WORKER_ID};
use crate::secrets::redacted;

/// Name of the worker id setting.
pub const WORKER_ID: &str = "snowflake.worker_id";
/// Name of the datacenter id setting.
pub const DATACENTER_ID: &str = "snowflake.datacenter_id";
/// Name of the epoch setting.
pub const EPOCH: &str = "snowflake.epoch";
/// Name of the registry setting.
pub const REGISTRY: &str = "snowflake.registry";
/// The value of `snowflake.worker_id` that claims a worker id from the registry.
pub const AUTO: &str = "auto";
/// The default epoch as it is written in `postgresql.conf` (Twitter's; a test checks that
/// it parses to [`crate::layout::TWITTER_EPOCH_MS`]). A C string: it is also the GUC's boot value.
pub const DEFAULT_EPOCH: &CStr = c"2010-11-04 01:42:54.657+00";
/// [`DEFAULT_EPOCH`] as text.
pub const DEFAULT_EPOCH_TEXT: &str = match DEFAULT_EPOCH.to_str() {
    Ok(text) => text,
    Err(_) => panic!("the default epoch is ASCII"),
};
/// Default of `snowflake.datacenter_id`.
pub const DEFAULT_DATACENTER_ID: &CStr = c"0";
/// Default of `snowflake.max_clock_drift` (ms): steps back up to this are absorbed.
pub const DEFAULT_MAX_CLOCK_DRIFT_MS: u32 = 1_000;
/// Default of `snowflake.max_clock_wait` (ms), with `clock_behind_action = 'wait'`.
pub const DEFAULT_MAX_CLOCK_WAIT_MS: u32 = 10_000;
/// Default of `snowflake.lease_window` (ms): how far ahead each durable lease reaches.
pub const DEFAULT_LEASE_WINDOW_MS: u32 = 1_000;
/// Default of `snowflake.warning_interval` (ms) between repeated server-wide WARNINGs.
pub const DEFAULT_WARNING_INTERVAL_MS: u32 = 10_000;

/// A configuration that passed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `snowflake.worker_id`: a number, or `auto` (claimed from `snowflake.registry`).
    pub worker_id: WorkerId,
    /// `snowflake.datacenter_id`.
    pub datacenter_id: u8,
    /// `snowflake.epoch`.
    pub epoch: Epoch,
}

/// Where the worker id comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerId {
    /// Set in the configuration.
    Fixed(u8),
    /// `auto`: claimed from the registry by the background worker.
    Auto,
}

/// Why a setting is unusable. Each variant names the setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingError {
    /// A required setting has no value.
    Unset {
        /// Setting name.
        name: &'static str,
    },
    /// The value is not an integer.
    NotAnInteger {
        /// Setting name.
        name: &'static str,
        /// The raw value.
        value: String,
    },
    /// The value is an integer outside the allowed range.
    OutOfRange {
        /// Setting name.
        name: &'static str,
        /// The raw value.
        value: String,
        /// Smallest allowed.
        min: i64,
        /// Largest allowed.
        max: i64,
    },
    /// `snowflake.worker_id = 'auto'` without a registry.
    RegistryMissing,
    /// `snowflake.registry` is not a URI this build can use.
    BadRegistry {
        /// The value, without its password.
        value: String,
    },
    /// PostgreSQL rejected the value in `postgresql.conf` at server start and kept the
    /// built-in default (integer and enum settings, which PostgreSQL itself parses).
    RejectedAtStart {
        /// Setting name.
        name: &'static str,
        /// The rejected value.
        value: String,
    },
    /// The epoch is neither Unix milliseconds nor an ISO-8601 timestamp with time zone.
    BadEpoch {
        /// The raw value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Config {
    /// Validates the raw setting values. `None` means the setting is absent. `registry_kind`
    /// tells whether `snowflake.registry` is set (`Some`) and usable (`Some(true)`).
    pub fn parse(
        worker_id: Option<&str>,
        datacenter_id: Option<&str>,
        epoch: Option<&str>,
        registry: Option<&str>,
    ) -> Result<Config, SettingError> {
        let worker_id = parse_worker_id(worker_id, registry)?;
        let datacenter_id =
            parse_node_id(DATACENTER_ID, datacenter_id, Some(0), MAX_DATACENTER_ID)?;
        let epoch = parse_epoch_setting(epoch)?;
        Ok(Config {
            worker_id,
            datacenter_id,
            epoch,
        })
    }
}

/// Parses `snowflake.worker_id`: a number, or `auto` (case-insensitive) with a usable
/// `snowflake.registry`.
pub fn parse_worker_id(
    raw: Option<&str>,
    registry: Option<&str>,
) -> Result<WorkerId, SettingError> {
    if raw.is_some_and(|r| r.trim().eq_ignore_ascii_case(AUTO)) {
        let registry = registry.map(str::trim).unwrap_or("");
        if registry.is_empty() {
            return Err(SettingError::RegistryMissing);
        }
        if !registry_uri_is_supported(registry) {
            return Err(SettingError::BadRegistry {
                value: redacted(registry),
            });
        }
        return Ok(WorkerId::Auto);
    }
    parse_node_id(WORKER_ID, raw, None, MAX_WORKER_ID).map(WorkerId::Fixed)
}

/// The registry URI schemes this build can talk to.
pub const REGISTRY_SCHEMES: [&str; 8] = [
    "redis://",
    "rediss://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "postgresql://",
    "postgres://",
    "etcd://",
    "etcds://",
];

/// Whether `uri` names a registry this build can talk to (see [`REGISTRY_SCHEMES`]).
pub fn registry_uri_is_supported(uri: &str) -> bool {
    let lower = uri.to_ascii_lowercase();
    REGISTRY_SCHEMES
        .iter()
        .any(|scheme| lower.starts_with(scheme) && lower.len() > scheme.len())
}

/// Parses an id setting (0 ..= max). Empty or absent gives `default`, or `Unset` without one.
pub fn parse_node_id(
    name: &'static str,
    raw: Option<&str>,
    default: Option<u8>,
    max: u8,
) -> Result<u8, SettingError> {
    let text = raw.map(str::trim).unwrap_or("");
    if text.is_empty() {
        return default.ok_or(SettingError::Unset { name });
    }
    let value: i64 = text.parse().map_err(|_| {
        if is_integer_shaped(text) {
            // Too many digits for i64: still an integer, just out of range.
            SettingError::OutOfRange {
                name,
                value: text.to_string(),
                min: 0,
                max: max.into(),
            }
        } else {
            SettingError::NotAnInteger {
                name,
                value: text.to_string(),
            }
        }
    })?;
    u8::try_from(value)
        .ok()
        .filter(|v| *v <= max)
        .ok_or(SettingError::OutOfRange {
            name,
            value: text.to_string(),
            min: 0,
            max: max.into(),
        })
}

fn is_integer_shaped(text: &str) -> bool {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Parses the raw `snowflake.epoch` value; absent or empty means Twitter's epoch.
pub fn parse_epoch_setting(raw: Option<&str>) -> Result<Epoch, SettingError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(Epoch::TWITTER),
        Some(text) => parse_epoch(text),
    }
}

/// Parses `snowflake.epoch`: integer Unix milliseconds, or an ISO-8601 timestamp with a time
/// zone such as `2010-11-04 01:42:54.657+00` or `2015-01-01T00:00:00Z`.
pub fn parse_epoch(text: &str) -> Result<Epoch, SettingError> {
    let bad = |reason| SettingError::BadEpoch {
        value: text.to_string(),
        reason,
    };
    let unix_ms = if is_integer_shaped(text) {
        text.parse::<i64>()
            .map_err(|_| bad("the number does not fit in 64 bits"))?
    } else {
        parse_iso8601_ms(text).map_err(bad)?
    };
    if unix_ms < 0 {
        return Err(bad("it is before 1970-01-01"));
    }
    Epoch::from_unix_ms(unix_ms).ok_or_else(|| bad("it is after the year 9999"))
}

/// Why an epoch cannot be used at the current time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochProblem {
    /// The epoch is later than now.
    InFuture {
        /// Epoch, Unix ms.
        epoch_ms: i64,
        /// Now, Unix ms.
        now_ms: i64,
    },
    /// Now is beyond the 41-bit range counted from the epoch.
    Exhausted {
        /// Epoch, Unix ms.
        epoch_ms: i64,
        /// Now, Unix ms.
        now_ms: i64,
        /// Last representable ms.
        last_ms: i64,
    },
}

/// Checks that `now_ms` falls inside the 41-bit range of `epoch`.
pub fn check_epoch_at(epoch: Epoch, now_ms: i64) -> Result<(), EpochProblem> {
    let epoch_ms = epoch.unix_ms();
    if now_ms < epoch_ms {
        Err(EpochProblem::InFuture { epoch_ms, now_ms })
    } else if (now_ms - epoch_ms) as u64 > MAX_TIMESTAMP {
        Err(EpochProblem::Exhausted {
            epoch_ms,
            now_ms,
            last_ms: epoch.last_unix_ms(),
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{DISCORD_EPOCH_MS, TWITTER_EPOCH_MS};
    use proptest::prelude::*;

    #[test]
    fn worker_id_is_required() {
        assert_eq!(
            Config::parse(None, None, None, None),
            Err(SettingError::Unset { name: WORKER_ID })
        );
        assert_eq!(
            Config::parse(Some("  "), None, None, None),
            Err(SettingError::Unset { name: WORKER_ID })
        );
    }

    #[test]
    fn defaults() {
        let c = Config::parse(Some("7"), None, None, None).unwrap();
        assert_eq!(c.worker_id, WorkerId::Fixed(7));
        assert_eq!(c.datacenter_id, 0);
        assert_eq!(c.epoch.unix_ms(), TWITTER_EPOCH_MS);
        assert_eq!(
            parse_epoch(DEFAULT_EPOCH_TEXT).unwrap().unix_ms(),
            TWITTER_EPOCH_MS
        );
    }

    #[test]
    fn auto_needs_a_usable_registry() {
        assert_eq!(
            parse_worker_id(Some(" AUTO "), Some("redis://127.0.0.1:6379/0")),
            Ok(WorkerId::Auto)
        );
        assert_eq!(
            parse_worker_id(Some("auto"), Some("postgresql://u@h/db")),
            Ok(WorkerId::Auto)
        );
        assert_eq!(
            parse_worker_id(Some("auto"), None),
            Err(SettingError::RegistryMissing)
        );
        assert_eq!(
            parse_worker_id(Some("auto"), Some(" ")),
            Err(SettingError::RegistryMissing)
        );
        assert_eq!(
            parse_worker_id(Some("auto"), Some("http://u:pw@h/")),
            Err(SettingError::BadRegistry {
                value: "http://u@h".into()
            })
        );
        assert_eq!(
            parse_worker_id(Some("auto"), Some("redis://")),
            Err(SettingError::BadRegistry {
                value: "redis://".into()
            })
        );
        // A number ignores the registry.
        assert_eq!(
            parse_worker_id(Some("3"), Some("redis://h")),
            Ok(WorkerId::Fixed(3))
        );
        assert!(matches!(
            parse_worker_id(Some("automatic"), None),
            Err(SettingError::NotAnInteger { .. })
        ));
    }

    #[test]
    fn ids_out_of_range() {
        for bad in ["32", "-1", "1000", "99999999999999999999999"] {
            assert!(
                matches!(
                    parse_node_id(WORKER_ID, Some(bad), None, 31),
                    Err(SettingError::OutOfRange {
                        min: 0,
                        max: 31,
                        ..
                    })
                ),
                "{bad}"
            );
        }
        for bad in ["abc", "1.5", "0x1", "seven", "3 4"] {
            assert!(
                matches!(
                    parse_node_id(DATACENTER_ID, Some(bad), Some(0), 31),
                    Err(SettingError::NotAnInteger { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(parse_node_id(WORKER_ID, Some(" 31 "), None, 31), Ok(31));
        assert_eq!(parse_node_id(WORKER_ID, Some("+0"), None, 31), Ok(0));
    }

    #[test]
    fn epoch_forms() {
        let ms = |s| parse_epoch(s).map(Epoch::unix_ms);
        assert_eq!(ms("1288834974657"), Ok(TWITTER_EPOCH_MS));
        assert_eq!(ms("2010-11-04T01:42:54.657Z"), Ok(TWITTER_EPOCH_MS));
        assert_eq!(ms("2010-11-04 01:42:54.657 UTC"), Ok(TWITTER_EPOCH_MS));
        assert_eq!(ms("2010-11-03 20:42:54.657-05"), Ok(TWITTER_EPOCH_MS));
        assert_eq!(ms("2010-11-04 07:12:54.657+05:30"), Ok(TWITTER_EPOCH_MS));
        assert_eq!(ms("2010-11-04 07:12:54.657+0530"), Ok(TWITTER_EPOCH_MS));
        assert_eq!(ms("2010-11-04 01:42:54.657000+00"), Ok(TWITTER_EPOCH_MS));
        assert_eq!(ms("2015-01-01T00:00:00Z"), Ok(DISCORD_EPOCH_MS));
        assert_eq!(ms("2015-01-01 00:00+00"), Ok(DISCORD_EPOCH_MS));
        assert_eq!(ms("1970-01-01 00:00:00Z"), Ok(0));
        assert_eq!(ms("2000-02-29 00:00:00Z"), Ok(951_782_400_000));
    }

    #[test]
    fn epoch_rejects() {
        for bad in [
            "2010-11-04 01:42:54.657",
            "2010-11-04",
            "2010-13-04 00:00:00Z",
            "2011-02-29 00:00:00Z",
            "2010-11-04 24:00:00Z",
            "2010-11-04 01:42:54.6571Z",
            "yesterday",
            "-5",
            "1969-12-31 23:59:59Z",
            "99999999999999999999",
            "2010-11-04 01:42:54.657+00 junk",
        ] {
            assert!(
                matches!(parse_epoch(bad), Err(SettingError::BadEpoch { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn epoch_against_clock() {
        let e = Epoch::TWITTER;
        assert_eq!(check_epoch_at(e, TWITTER_EPOCH_MS), Ok(()));
        assert!(matches!(
            check_epoch_at(e, TWITTER_EPOCH_MS - 1),
            Err(EpochProblem::InFuture { .. })
        ));
        assert!(matches!(
            check_epoch_at(e, e.last_unix_ms() + 1),
            Err(EpochProblem::Exhausted { .. })
        ));
    }

    proptest! {
        /// The parser agrees with a reference conversion for every UTC millisecond
        /// between 1970 and 2200 written in RFC 3339 form.
        #[test]
        fn iso_round_trip(ms in 0i64..7_258_118_400_000) {
            let days = ms.div_euclid(86_400_000);
            let rem = ms.rem_euclid(86_400_000);
            let (y, m, d) = crate::civil::civil_from_days(days);
            let text = format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
                rem / 3_600_000, rem / 60_000 % 60, rem / 1000 % 60, rem % 1000
            );
            prop_assert_eq!(parse_epoch(&text).map(Epoch::unix_ms), Ok(ms));
        }

        #[test]
        fn node_ids_accept_exactly_their_range(v in -100i64..100) {
            let parsed = parse_node_id(WORKER_ID, Some(&v.to_string()), None, 31);
            prop_assert_eq!(parsed.is_ok(), (0..=31).contains(&v));
        }
    }
}
