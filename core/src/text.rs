//! IDs as text for people and programs: business serials and sortable Crockford base32.
//!
//! Both forms are fixed width and zero-padded, so that text order (C collation) is numeric
//! order, and both parse back to exactly the ID they came from.

use crate::civil::{civil_from_days, days_from_civil, days_in_month};
use crate::layout::{
    pack, unpack, Epoch, LayoutError, Parts, UnixMs, MAX_DATACENTER_ID, MAX_SEQUENCE, MAX_WORKER_ID,
};

/// Digits at the end of a serial: time (17), datacenter (2), worker (2), sequence (4).
pub const SERIAL_DIGITS: usize = 25;
/// The most bytes a PostgreSQL `text` value holds: 1 GB less one, less its 4-byte header.
pub const MAX_TEXT_BYTES: usize = 0x3fff_ffff - 4;
/// Characters of a base32 ID.
pub const BASE32_LEN: usize = 13;
/// Crockford's alphabet: digits and upper-case letters without I, L, O and U.
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Why a text is not a serial or a base32 ID. Every variant is the caller's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextError {
    /// The ID itself cannot be represented (negative).
    Layout(LayoutError),
    /// The ID's time is after 9999-12-31, which a 4-digit year cannot show.
    YearOutOfRange {
        /// The ID's time, Unix ms.
        unix_ms: i64,
    },
    /// The result could not be allocated (its size is the caller's).
    OutOfMemory {
        /// The size asked for, in bytes.
        bytes: usize,
    },
    /// A serial shorter than its digits.
    SerialTooShort {
        /// Characters in the text.
        len: usize,
    },
    /// A character among the last 25 that is not an ASCII digit.
    SerialNotDigit {
        /// Position (1-based) within the text.
        position: usize,
        /// The character found.
        found: char,
    },
    /// The date and time digits are not a real UTC time.
    SerialBadTime {
        /// The 17 time digits.
        digits: String,
    },
    /// A field beyond its bit width.
    SerialFieldOutOfRange {
        /// `datacenter`, `worker` or `sequence`.
        field: &'static str,
        /// The value read.
        value: u32,
        /// Its largest value.
        max: u32,
    },
    /// The time is outside what this epoch's 41 bits can hold.
    SerialTimeOutOfRange(LayoutError),
    /// The prefix would make the serial longer than a PostgreSQL `text` can be.
    SerialTooLong {
        /// Bytes in the prefix (UTF-8).
        prefix_bytes: usize,
    },
    /// Base32 text of the wrong length.
    Base32Length {
        /// Characters in the text.
        len: usize,
    },
    /// A character outside Crockford's alphabet and its aliases.
    Base32BadChar {
        /// Position (1-based).
        position: usize,
        /// The character found.
        found: char,
    },
    /// A value above the largest ID (the first character is above 7).
    Base32TooLarge,
}

/// Formats `id` as a business serial: `prefix`, then the ID's UTC time as
/// `YYYYMMDDHHMISSmmm`, the datacenter (2 digits), the worker (2) and the sequence (4).
pub fn to_serial(prefix: &str, id: i64, epoch: Epoch) -> Result<String, TextError> {
    if prefix.len() > MAX_TEXT_BYTES - SERIAL_DIGITS {
        return Err(TextError::SerialTooLong {
            prefix_bytes: prefix.len(),
        });
    }
    let parts = unpack(id).map_err(TextError::Layout)?;
    let unix_ms = epoch.to_unix(parts.timestamp).0;
    let days = unix_ms.div_euclid(86_400_000);
    let ms_of_day = unix_ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    if year > 9999 {
        return Err(TextError::YearOutOfRange { unix_ms });
    }
    // The prefix is the caller's (up to 1 GB): a failed allocation is an error, not the
    // process abort that `format!` would make of it.
    let mut serial = String::new();
    serial
        .try_reserve_exact(prefix.len() + SERIAL_DIGITS)
        .map_err(|_| TextError::OutOfMemory {
            bytes: prefix.len() + SERIAL_DIGITS,
        })?;
    serial.push_str(prefix);
    let digits = format!(
        "{year:04}{month:02}{day:02}{:02}{:02}{:02}{:03}{:02}{:02}{:04}",
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1_000 % 60,
        ms_of_day % 1_000,
        parts.datacenter_id,
        parts.worker_id,
        parts.sequence,
    );
    debug_assert_eq!(digits.len(), SERIAL_DIGITS);
    serial.push_str(&digits);
    Ok(serial)
}

/// Parses a serial made by [`to_serial`] with any prefix: its last 25 characters.
pub fn from_serial(serial: &str, epoch: Epoch) -> Result<i64, TextError> {
    // Only the last 25 characters matter: the prefix may be long (up to 1 GB).
    let mut tail: Vec<char> = serial.chars().rev().take(SERIAL_DIGITS).collect();
    tail.reverse();
    if tail.len() < SERIAL_DIGITS {
        return Err(TextError::SerialTooShort { len: tail.len() });
    }
    let start = serial.chars().count() - SERIAL_DIGITS;
    let mut digits = [0u32; SERIAL_DIGITS];
    for (i, c) in tail.iter().enumerate() {
        // `to_digit` knows only ASCII digits: Arabic-Indic and other digits are refused.
        digits[i] = c.to_digit(10).ok_or(TextError::SerialNotDigit {
            position: start + i + 1,
            found: *c,
        })?;
    }
    let number = |from: usize, len: usize| {
        digits[from..from + len]
            .iter()
            .fold(0u32, |n, d| n * 10 + d)
    };
    let (year, month, day) = (number(0, 4), number(4, 2), number(6, 2));
    let (hour, minute, second, milli) = (number(8, 2), number(10, 2), number(12, 2), number(14, 3));
    let valid_date = (1..=12).contains(&month)
        && day >= 1
        && i64::from(day) <= days_in_month(i64::from(year), i64::from(month));
    if !valid_date || hour > 23 || minute > 59 || second > 59 {
        return Err(TextError::SerialBadTime {
            digits: tail[..17].iter().collect(),
        });
    }
    let field = |name: &'static str, value: u32, max: u32| {
        if value > max {
            Err(TextError::SerialFieldOutOfRange {
                field: name,
                value,
                max,
            })
        } else {
            Ok(value)
        }
    };
    let datacenter_id = field("datacenter", number(17, 2), u32::from(MAX_DATACENTER_ID))?;
    let worker_id = field("worker", number(19, 2), u32::from(MAX_WORKER_ID))?;
    let sequence = field("sequence", number(21, 4), u32::from(MAX_SEQUENCE))?;
    let days = days_from_civil(i64::from(year), i64::from(month), i64::from(day));
    let unix_ms = days * 86_400_000
        + i64::from(hour) * 3_600_000
        + i64::from(minute) * 60_000
        + i64::from(second) * 1_000
        + i64::from(milli);
    let timestamp = epoch
        .timestamp_of(UnixMs(unix_ms))
        .map_err(TextError::SerialTimeOutOfRange)?;
    Ok(pack(Parts {
        timestamp,
        datacenter_id: datacenter_id as u8,
        worker_id: worker_id as u8,
        sequence: sequence as u16,
    }))
}

/// `id` as 13 characters of Crockford base32, upper case, zero-padded.
pub fn to_base32(id: i64) -> Result<String, TextError> {
    if id < 0 {
        return Err(TextError::Layout(LayoutError::NegativeId(id)));
    }
    let bits = id as u64;
    Ok((0..BASE32_LEN)
        .rev()
        .map(|i| char::from(CROCKFORD[((bits >> (5 * i)) & 31) as usize]))
        .collect())
}

/// Parses 13 characters of Crockford base32 in either case; I and L read as 1, O as 0.
pub fn from_base32(text: &str) -> Result<i64, TextError> {
    let len = text.chars().count();
    if len != BASE32_LEN {
        return Err(TextError::Base32Length { len });
    }
    let mut value: u64 = 0;
    for (i, c) in text.chars().enumerate() {
        let digit = base32_digit(c).ok_or(TextError::Base32BadChar {
            position: i + 1,
            found: c,
        })?;
        if i == 0 && digit > 7 {
            return Err(TextError::Base32TooLarge);
        }
        value = (value << 5) | u64::from(digit);
    }
    Ok(value as i64)
}

/// The value of one base32 character, with Crockford's aliases.
fn base32_digit(c: char) -> Option<u8> {
    let upper = match c.to_ascii_uppercase() {
        'I' | 'L' => '1',
        'O' => '0',
        other => other,
    };
    CROCKFORD
        .iter()
        .position(|&b| char::from(b) == upper)
        .map(|p| p as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::EpochMs;
    use proptest::prelude::*;

    /// The Wikipedia tweet (1541815603606036480: 2022-06-28 16:07:40.105 UTC, datacenter 11,
    /// worker 26, sequence 0) as a serial.
    #[test]
    fn serial_of_a_known_tweet() {
        let id = 1_541_815_603_606_036_480;
        let serial = to_serial("PAY-", id, Epoch::TWITTER).unwrap();
        assert_eq!(serial, "PAY-2022062816074010511260000");
        assert_eq!(from_serial(&serial, Epoch::TWITTER), Ok(id));
        assert_eq!(
            from_serial("2022062816074010511260000", Epoch::TWITTER),
            Ok(id)
        );
        // Any prefix, including one with digits or multibyte characters.
        assert_eq!(
            from_serial("Zahlung-€9-2022062816074010511260000", Epoch::TWITTER),
            Ok(id)
        );
    }

    #[test]
    fn serial_errors_name_the_problem() {
        let e = Epoch::TWITTER;
        assert_eq!(
            from_serial("PAY-123", e),
            Err(TextError::SerialTooShort { len: 7 })
        );
        assert_eq!(
            from_serial("2022062816074010511260x00", e),
            Err(TextError::SerialNotDigit {
                position: 23,
                found: 'x'
            })
        );
        // Non-ASCII digits are not digits.
        assert!(matches!(
            from_serial("202206281607401051126000٣", e),
            Err(TextError::SerialNotDigit { position: 25, .. })
        ));
        assert_eq!(
            from_serial("2022023016074010511260000", e),
            Err(TextError::SerialBadTime {
                digits: "20220230160740105".into()
            })
        );
        assert!(matches!(
            from_serial("2022062824074010511260000", e),
            Err(TextError::SerialBadTime { .. })
        ));
        assert_eq!(
            from_serial("2022062816074010532260000", e),
            Err(TextError::SerialFieldOutOfRange {
                field: "datacenter",
                value: 32,
                max: 31
            })
        );
        assert_eq!(
            from_serial("2022062816074010511264096", e),
            Err(TextError::SerialFieldOutOfRange {
                field: "sequence",
                value: 4096,
                max: 4095
            })
        );
        assert!(matches!(
            from_serial("2009010100000000000000000", e),
            Err(TextError::SerialTimeOutOfRange(
                LayoutError::BeforeEpoch { .. }
            ))
        ));
        assert_eq!(
            to_serial("", -1, e),
            Err(TextError::Layout(LayoutError::NegativeId(-1)))
        );
        let late = Epoch::from_unix_ms(Epoch::MAX_UNIX_MS).unwrap();
        assert!(matches!(
            to_serial("", i64::MAX, late),
            Err(TextError::YearOutOfRange { .. })
        ));
    }

    #[test]
    fn base32_known_values() {
        assert_eq!(to_base32(0).unwrap(), "0000000000000");
        assert_eq!(to_base32(i64::MAX).unwrap(), "7ZZZZZZZZZZZZ");
        assert_eq!(to_base32(32).unwrap(), "0000000000010");
        // Python: base32 of 1541815603606036480 with Crockford's alphabet.
        assert_eq!(
            to_base32(1_541_815_603_606_036_480).unwrap(),
            "1ASD13XH1F800"
        );
        assert_eq!(from_base32("1asd13xh1f800"), Ok(1_541_815_603_606_036_480));
        assert_eq!(from_base32("0000000000OIL"), from_base32("0000000000011"));
        assert_eq!(from_base32("ABC"), Err(TextError::Base32Length { len: 3 }));
        assert_eq!(
            from_base32("000000000000U"),
            Err(TextError::Base32BadChar {
                position: 13,
                found: 'U'
            })
        );
        assert_eq!(
            from_base32("00000000000-0"),
            Err(TextError::Base32BadChar {
                position: 12,
                found: '-'
            })
        );
        assert_eq!(from_base32("8000000000000"), Err(TextError::Base32TooLarge));
        assert!(to_base32(-5).is_err());
    }

    fn any_id() -> impl Strategy<Value = i64> {
        0..=i64::MAX
    }

    proptest! {
        #[test]
        fn base32_round_trips(id in any_id()) {
            let text = to_base32(id).unwrap();
            prop_assert_eq!(text.len(), BASE32_LEN);
            prop_assert_eq!(from_base32(&text), Ok(id));
            prop_assert_eq!(from_base32(&text.to_ascii_lowercase()), Ok(id));
        }

        /// Text order (byte order, as in C collation) is numeric order.
        #[test]
        fn base32_sorts_like_ids(a in any_id(), b in any_id()) {
            prop_assert_eq!(to_base32(a).unwrap().cmp(&to_base32(b).unwrap()), a.cmp(&b));
        }

        #[test]
        fn serial_round_trips(id in any_id(), prefix in "[A-Z-]{0,6}") {
            let serial = to_serial(&prefix, id, Epoch::TWITTER).unwrap();
            prop_assert_eq!(serial.len(), prefix.len() + SERIAL_DIGITS);
            prop_assert!(serial.starts_with(&prefix));
            prop_assert_eq!(from_serial(&serial, Epoch::TWITTER), Ok(id));
        }

        /// Serials of one prefix sort like their IDs, whatever the epoch.
        #[test]
        fn serials_sort_like_ids(a in any_id(), b in any_id(), epoch_ms in 0i64..4_000_000_000_000) {
            let epoch = Epoch::from_unix_ms(epoch_ms).unwrap();
            let (sa, sb) = (to_serial("P", a, epoch).unwrap(), to_serial("P", b, epoch).unwrap());
            prop_assert_eq!(sa.cmp(&sb), a.cmp(&b));
            prop_assert_eq!(from_serial(&sa, epoch), Ok(a));
        }

        /// The time digits are the ID's time.
        #[test]
        fn serial_time_digits_match(ts in 0u64..=crate::layout::MAX_TIMESTAMP) {
            let id = pack(Parts { timestamp: EpochMs(ts), datacenter_id: 3, worker_id: 4, sequence: 5 });
            let serial = to_serial("", id, Epoch::TWITTER).unwrap();
            let text = crate::civil::format_unix_ms(Epoch::TWITTER.to_unix(EpochMs(ts)).0);
            let expected: String = text[..23].chars().filter(char::is_ascii_digit).collect();
            prop_assert_eq!(&serial[..17], expected.as_str());
            prop_assert_eq!(&serial[17..], "03040005");
        }
    }
}
