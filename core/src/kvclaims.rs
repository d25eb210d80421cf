//! The claim records of a registry kept as keys of a consistent key-value store (etcd), where
//! every step reads a snapshot, decides here, and writes back in one transaction that
//! compares the revisions it read: if anything changed in between, nothing is written and
//! the step starts again. The decisions themselves are those of [`crate::claim`]; this module
//! holds the records' shapes and how they change, so that the client only moves bytes.
//!
//! etcd has no clock in its API. Its members' HTTP `Date` header (whole seconds) is the
//! registry's clock here, with its resolution carried in the sample
//! ([`crate::claim::ClockSample::registry_resolution_ms`]); every bound that uses it takes
//! the side of the second that is safe.

use serde::{Deserialize, Serialize};

/// The fleet's record: one key per registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetRecord {
    /// The fleet's epoch (Unix ms).
    pub epoch_unix_ms: i64,
    /// When the registry's current incarnation began (Unix ms, the late end of the second it
    /// was read in, so that settling never ends early).
    pub born_unix_ms: i64,
    /// The registry's random id, made with the first record and kept by every later one
    /// (absent in records of 0.7.0 and earlier): see [`crate::claim::RegistrySeen`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_id: Option<u64>,
}

/// What the registry keeps per (datacenter, worker) besides the claim itself (the claim is a
/// key bound to an etcd lease, which the store deletes when the lease expires).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Marks {
    /// The highest cap ever granted for the id (Unix ms); it only rises.
    pub high_water_unix_ms: Option<i64>,
    /// The floor handed to the current (or last) holder.
    pub floor_unix_ms: Option<i64>,
    /// What the last holder recorded at a clean release: the next holder's floor.
    pub released_unix_ms: Option<i64>,
    /// The `claim_ttl` (ms) of the holder that wrote these marks last: what a server asking
    /// for an id beside it is compared with ([`crate::claim::ttl_mismatch`]). Absent in
    /// marks written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_ttl_ms: Option<u64>,
}

impl Marks {
    /// The marks once a holder holds the id under `cap_unix_ms`. `floor`: `Some(f)` sets the
    /// holder's floor (a free grant), `None` keeps it (a renewal or an own claim).
    pub fn held(self, cap_unix_ms: i64, floor: Option<Option<i64>>) -> Marks {
        Marks {
            high_water_unix_ms: Some(
                self.high_water_unix_ms
                    .map_or(cap_unix_ms, |hw| hw.max(cap_unix_ms)),
            ),
            floor_unix_ms: floor.unwrap_or(self.floor_unix_ms),
            released_unix_ms: None,
            holder_ttl_ms: self.holder_ttl_ms,
        }
    }

    /// The marks with the holder's `claim_ttl` (ms) recorded.
    pub fn with_holder_ttl(self, ttl_ms: u64) -> Marks {
        Marks {
            holder_ttl_ms: Some(ttl_ms),
            ..self
        }
    }

    /// The floor a free grant of the id gets (see [`crate::claim::free_grant_floor_unix_ms`]).
    pub fn free_grant_floor(self) -> Option<i64> {
        crate::claim::free_grant_floor_unix_ms(self.high_water_unix_ms, self.released_unix_ms)
    }

    /// The marks after a clean release recording `released_unix_ms` (None: a claim given
    /// back unused, which leaves the marks as they were). The released value is never below
    /// the holder's floor, and the mark only rises.
    pub fn released(self, released_unix_ms: Option<i64>) -> Marks {
        let Some(v) = released_unix_ms else {
            return self;
        };
        let v = self.floor_unix_ms.map_or(v, |f| f.max(v));
        Marks {
            high_water_unix_ms: Some(self.high_water_unix_ms.map_or(v, |hw| hw.max(v))),
            floor_unix_ms: self.floor_unix_ms,
            released_unix_ms: Some(v),
            holder_ttl_ms: self.holder_ttl_ms,
        }
    }
}

/// The lease for a claim of `ttl_ms`, in etcd's whole seconds: never shorter than the claim,
/// so that the store keeps the key at least as long as the holder's fence lasts.
pub fn lease_seconds(ttl_ms: u64) -> i64 {
    ttl_ms.div_ceil(1000).max(1) as i64
}

/// A registry clock read from an HTTP `Date` header: the middle of its second (Unix ms), as
/// the sample's reading; its resolution is 1,000 ms.
pub const HTTP_DATE_RESOLUTION_MS: i64 = 1000;

/// Parses an HTTP `Date` value in the IMF-fixdate form (`Sun, 06 Nov 1994 08:49:37 GMT`,
/// RFC 9110), the only form a server may send, into Unix ms at the start of that second.
/// None for anything else, a date that does not exist or a wrong weekday included.
pub fn parse_http_date(value: &str) -> Option<i64> {
    let value = value.trim();
    // IMF-fixdate only (29 bytes; RFC 850 has 30 or more, asctime 24): the obsolete forms
    // httpdate also takes are never sent, and RFC 850's two-digit year would read 2070 as 1970.
    if value.len() != 29 {
        return None;
    }
    let since_epoch = httpdate::parse_http_date(value)
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    i64::try_from(since_epoch.as_millis()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn http_dates() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777_000)
        );
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        for bad in [
            "",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "Sun, 06 Nov 1994 24:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            // Days that do not exist, and a weekday that is not the date's.
            "Thu, 31 Feb 1994 08:49:37 GMT",
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Sun,  6 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse_http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn lease_never_shorter_than_the_claim() {
        assert_eq!(lease_seconds(10_000), 10);
        assert_eq!(lease_seconds(10_001), 11);
        assert_eq!(lease_seconds(1), 1);
    }

    #[test]
    fn release_and_grant() {
        let m = Marks::default().held(5_000, Some(Some(100)));
        assert_eq!(m.high_water_unix_ms, Some(5_000));
        assert_eq!(m.floor_unix_ms, Some(100));
        // A renewal keeps the floor; a lower cap never lowers the mark.
        let m = m.held(4_000, None);
        assert_eq!(m.high_water_unix_ms, Some(5_000));
        assert_eq!(m.floor_unix_ms, Some(100));
        // A clean release below the floor records the floor.
        let r = m.released(Some(50));
        assert_eq!(r.released_unix_ms, Some(100));
        assert_eq!(r.free_grant_floor(), Some(101));
        // Given back unused: nothing changes.
        assert_eq!(m.released(None), m);
        // The next grant clears the released value.
        assert_eq!(r.held(6_000, Some(Some(101))).released_unix_ms, None);
    }

    #[test]
    fn holder_ttl_is_kept_and_optional_in_json() {
        let m = Marks::default()
            .held(5_000, Some(None))
            .with_holder_ttl(10_000);
        assert_eq!(m.held(6_000, None).holder_ttl_ms, Some(10_000));
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains("\"holder_ttl_ms\":10000"), "{json}");
        // Marks written before the field existed read as "not recorded".
        let old: Marks = serde_json::from_str(
            r#"{"high_water_unix_ms":5000,"floor_unix_ms":null,"released_unix_ms":null}"#,
        )
        .unwrap();
        assert_eq!(old.holder_ttl_ms, None);
        assert!(!serde_json::to_string(&Marks::default())
            .unwrap()
            .contains("holder_ttl"));
    }

    proptest! {
        /// The mark never goes down, whatever is held and released in whatever order.
        #[test]
        fn mark_only_rises(steps in proptest::collection::vec((0i64..1_000_000, any::<bool>(), any::<bool>()), 1..40)) {
            let mut m = Marks::default();
            let mut highest = i64::MIN;
            for (v, release, with_value) in steps {
                m = if release { m.released(with_value.then_some(v)) } else { m.held(v, with_value.then_some(Some(v))) };
                let hw = m.high_water_unix_ms.unwrap_or(i64::MIN);
                prop_assert!(hw >= highest);
                highest = hw;
                if let Some(f) = m.free_grant_floor() {
                    prop_assert!(f > m.released_unix_ms.unwrap_or(i64::MIN));
                }
            }
        }

        /// Every second of 1970..9999 parses back to itself.
        #[test]
        fn http_date_round_trip(secs in 0i64..253_402_300_799) {
            let days = secs.div_euclid(86_400);
            let (y, mo, d) = crate::civil::civil_from_days(days);
            let rem = secs.rem_euclid(86_400);
            const M: [&str; 12] = ["Jan","Feb","Mar","Apr","May","Jun","Jul","Aug","Sep","Oct","Nov","Dec"];
            // 1970-01-01 was a Thursday.
            const W: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
            let text = format!("{}, {d:02} {} {y} {:02}:{:02}:{:02} GMT", W[days.rem_euclid(7) as usize], M[(mo - 1) as usize], rem / 3600, rem / 60 % 60, rem % 60);
            prop_assert_eq!(parse_http_date(&text), Some(secs * 1000));
        }

        /// No text panics the parser: a header's value is whatever a member sends.
        #[test]
        fn http_date_never_panics(text in ".{0,40}", fixed in "[ -~]{29}") {
            let _ = parse_http_date(&text);
            let _ = parse_http_date(&fixed);
        }
    }
}
