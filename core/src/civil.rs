//! Dates of the proleptic Gregorian calendar in UTC, as Unix milliseconds and day numbers:
//! the conversions (Howard Hinnant's algorithms), the ISO-8601 timestamps `snowflake.epoch`
//! accepts, and the two forms messages and JSON use.
//!
//! Kept by hand: no general date crate (chrono, time, jiff) is in Cargo.lock for these few.

/// A small ISO-8601 parser: `YYYY-MM-DD[T| ]HH:MM[:SS[.fff]]` followed by `Z`, `UTC`, or
/// `±HH[[:]MM]`. The zone is required, so a server's `TimeZone` can never shift the epoch.
pub(crate) fn parse_iso8601_ms(text: &str) -> Result<i64, &'static str> {
    const FORMAT: &str =
        "it is neither Unix milliseconds nor a timestamp like 2010-11-04 01:42:54.657+00";
    let mut p = Cursor {
        s: text.as_bytes(),
        i: 0,
    };
    let year = p.digits(4).ok_or(FORMAT)?;
    p.expect(b'-').ok_or(FORMAT)?;
    let month = p.digits(2).ok_or(FORMAT)?;
    p.expect(b'-').ok_or(FORMAT)?;
    let day = p.digits(2).ok_or(FORMAT)?;
    if !(p.eat(b'T') || p.eat(b't') || p.eat(b' ')) {
        return Err("it has no time of day and time zone, as in 2010-11-04 01:42:54.657+00");
    }
    let hour = p.digits(2).ok_or(FORMAT)?;
    p.expect(b':').ok_or(FORMAT)?;
    let minute = p.digits(2).ok_or(FORMAT)?;
    let mut second = 0;
    let mut millis = 0;
    if p.eat(b':') {
        second = p.digits(2).ok_or(FORMAT)?;
        if p.eat(b'.') || p.eat(b',') {
            let start = p.i;
            let mut scale = 100;
            while let Some(d) = p.digit() {
                if scale == 0 {
                    if d != 0 {
                        return Err("it has a fraction finer than one millisecond");
                    }
                } else {
                    millis += i64::from(d) * scale;
                    scale /= 10;
                }
            }
            if p.i == start {
                return Err(FORMAT);
            }
        }
    }
    while p.eat(b' ') {}
    let offset_minutes = if p.eat(b'Z') || p.eat(b'z') {
        0
    } else if p.rest().eq_ignore_ascii_case(b"UTC") {
        p.i += 3;
        0
    } else if let Some(sign) = p.sign() {
        let hours = p.digits(2).ok_or(FORMAT)?;
        p.eat(b':');
        let minutes = if p.at_end() {
            0
        } else {
            p.digits(2).ok_or(FORMAT)?
        };
        if hours > 15 || minutes > 59 {
            return Err("its time zone offset is out of range");
        }
        sign * (hours * 60 + minutes)
    } else if p.at_end() {
        return Err("it has no time zone; add one, as in 2010-11-04 01:42:54.657+00");
    } else {
        return Err(FORMAT);
    };
    if !p.at_end() {
        return Err(FORMAT);
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return Err("it is not a valid date and time");
    }
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    Ok(seconds * 1_000 + millis)
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn digit(&mut self) -> Option<u8> {
        let b = *self.s.get(self.i)?;
        if b.is_ascii_digit() {
            self.i += 1;
            Some(b - b'0')
        } else {
            None
        }
    }
    fn digits(&mut self, n: usize) -> Option<i64> {
        let mut v = 0i64;
        for _ in 0..n {
            v = v * 10 + i64::from(self.digit()?);
        }
        Some(v)
    }
    fn eat(&mut self, b: u8) -> bool {
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, b: u8) -> Option<()> {
        self.eat(b).then_some(())
    }
    fn sign(&mut self) -> Option<i64> {
        if self.eat(b'+') {
            Some(1)
        } else if self.eat(b'-') {
            Some(-1)
        } else {
            None
        }
    }
    fn rest(&self) -> &[u8] {
        &self.s[self.i..]
    }
    fn at_end(&self) -> bool {
        self.i == self.s.len()
    }
}

/// Whether `year` is a leap year of the proleptic Gregorian calendar.
fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// Days in a month of the proleptic Gregorian calendar.
pub fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Civil date (year, month, day) of a day number since 1970-01-01 (Howard Hinnant's algorithm).
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Formats Unix milliseconds as RFC 3339 UTC, `YYYY-MM-DDTHH:MM:SS.mmmZ` (for JSON).
pub fn format_rfc3339(ms: i64) -> String {
    let text = format_unix_ms(ms);
    format!("{}T{}Z", &text[..10], &text[11..23])
}

/// Formats Unix milliseconds as `YYYY-MM-DD HH:MM:SS.mmm+00`, the form messages use.
pub fn format_unix_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}+00",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::TWITTER_EPOCH_MS;
    use crate::settings::DEFAULT_EPOCH_TEXT;

    #[test]
    fn formats_milliseconds() {
        assert_eq!(format_unix_ms(TWITTER_EPOCH_MS), DEFAULT_EPOCH_TEXT);
        assert_eq!(format_unix_ms(0), "1970-01-01 00:00:00.000+00");
        assert_eq!(
            format_rfc3339(1_656_432_460_105),
            "2022-06-28T16:07:40.105Z"
        );
        assert_eq!(
            format_unix_ms(3_487_858_230_208),
            "2080-07-10 17:30:30.208+00"
        );
    }
}
