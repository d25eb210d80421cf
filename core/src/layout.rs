//! The 64-bit Snowflake layout, in plain Rust (no pgrx).
//!
//! ```text
//!  63 62                                   22 21      17 16      12 11          0
//! +--+---------------------------------------+----------+----------+-------------+
//! | 0| milliseconds since the epoch (41 bits)| dc (5)   | worker(5)| sequence(12)|
//! +--+---------------------------------------+----------+----------+-------------+
//! ```
//!
//! This is Twitter's original layout: `id = ms << 22 | datacenter << 17 | worker << 12 | seq`.
//! Discord uses the same bit positions with another epoch.

/// Bits of milliseconds since the epoch.
pub const TIMESTAMP_BITS: u32 = 41;
/// Bits of datacenter id.
pub const DATACENTER_BITS: u32 = 5;
/// Bits of worker id.
pub const WORKER_BITS: u32 = 5;
/// Bits of sequence within one millisecond.
pub const SEQUENCE_BITS: u32 = 12;

/// Position of the lowest worker-id bit.
pub const WORKER_SHIFT: u32 = SEQUENCE_BITS;
/// Position of the lowest datacenter-id bit.
pub const DATACENTER_SHIFT: u32 = WORKER_SHIFT + WORKER_BITS;
/// Position of the lowest timestamp bit.
pub const TIMESTAMP_SHIFT: u32 = DATACENTER_SHIFT + DATACENTER_BITS;

/// Largest datacenter id (31).
pub const MAX_DATACENTER_ID: u8 = (1 << DATACENTER_BITS) - 1;
/// Largest worker id (31).
pub const MAX_WORKER_ID: u8 = (1 << WORKER_BITS) - 1;
/// Largest sequence number within one millisecond (4095).
pub const MAX_SEQUENCE: u16 = (1 << SEQUENCE_BITS) - 1;
/// Largest timestamp, in milliseconds since the epoch (2^41 - 1, about 69.7 years).
pub const MAX_TIMESTAMP: u64 = (1 << TIMESTAMP_BITS) - 1;

/// Twitter's epoch, 2010-11-04T01:42:54.657Z, in Unix milliseconds. Our default.
pub const TWITTER_EPOCH_MS: i64 = 1_288_834_974_657;
/// Discord's epoch, 2015-01-01T00:00:00Z, in Unix milliseconds.
pub const DISCORD_EPOCH_MS: i64 = 1_420_070_400_000;

/// Milliseconds since the configured epoch: an ID's time field, and every time the
/// generator works in. Only [`Epoch`] converts it to or from [`UnixMs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EpochMs(pub u64);

impl EpochMs {
    /// `ms` milliseconds later (saturating).
    pub const fn plus(self, ms: u64) -> EpochMs {
        EpochMs(self.0.saturating_add(ms))
    }
}

/// Milliseconds since 1970-01-01T00:00:00Z: the wall clock, and every time the state file,
/// the WAL record and the registry store. Only [`Epoch`] converts it to or from [`EpochMs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct UnixMs(pub i64);

/// The fields of one ID, with the timestamp still relative to the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Parts {
    /// Milliseconds since the epoch (0 ..= [`MAX_TIMESTAMP`]).
    pub timestamp: EpochMs,
    /// Datacenter id (0 ..= 31).
    pub datacenter_id: u8,
    /// Worker id (0 ..= 31).
    pub worker_id: u8,
    /// Sequence within the millisecond (0 ..= 4095).
    pub sequence: u16,
}

/// Why a value does not fit the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutError {
    /// IDs are non-negative: bit 63 is always 0.
    NegativeId(i64),
    /// A time before the epoch.
    BeforeEpoch {
        /// The time, in Unix milliseconds.
        unix_ms: i64,
        /// The epoch, in Unix milliseconds.
        epoch_ms: i64,
    },
    /// A time after the last millisecond that 41 bits can hold.
    AfterRange {
        /// The time, in Unix milliseconds.
        unix_ms: i64,
        /// The last representable time, in Unix milliseconds.
        last_ms: i64,
    },
}

/// Packs fields into an ID. Every field must be in range (the generator and the converters
/// only produce such fields); debug builds check it.
#[inline]
pub const fn pack(parts: Parts) -> i64 {
    debug_assert!(parts.timestamp.0 <= MAX_TIMESTAMP);
    debug_assert!(parts.datacenter_id <= MAX_DATACENTER_ID);
    debug_assert!(parts.worker_id <= MAX_WORKER_ID);
    debug_assert!(parts.sequence <= MAX_SEQUENCE);
    ((parts.timestamp.0 << TIMESTAMP_SHIFT)
        | ((parts.datacenter_id as u64) << DATACENTER_SHIFT)
        | ((parts.worker_id as u64) << WORKER_SHIFT)
        | parts.sequence as u64) as i64
}

/// Splits an ID into its fields. Every non-negative `i64` is a valid ID.
pub fn unpack(id: i64) -> Result<Parts, LayoutError> {
    if id < 0 {
        return Err(LayoutError::NegativeId(id));
    }
    let bits = id as u64;
    Ok(Parts {
        timestamp: EpochMs(bits >> TIMESTAMP_SHIFT),
        datacenter_id: ((bits >> DATACENTER_SHIFT) & u64::from(MAX_DATACENTER_ID)) as u8,
        worker_id: ((bits >> WORKER_SHIFT) & u64::from(MAX_WORKER_ID)) as u8,
        sequence: (bits & u64::from(MAX_SEQUENCE)) as u16,
    })
}

/// An epoch: the Unix millisecond that timestamp 0 stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch {
    unix_ms: i64,
}

impl Epoch {
    /// Twitter's epoch, the default.
    pub const TWITTER: Epoch = Epoch {
        unix_ms: TWITTER_EPOCH_MS,
    };

    /// Latest epoch accepted: 9999-12-31T23:59:59.999Z, so that every decoded time fits a
    /// PostgreSQL timestamp.
    pub const MAX_UNIX_MS: i64 = 253_402_300_799_999;

    /// An epoch at `unix_ms` (1970-01-01 ..= [`Epoch::MAX_UNIX_MS`]).
    pub const fn from_unix_ms(unix_ms: i64) -> Option<Epoch> {
        if unix_ms < 0 || unix_ms > Self::MAX_UNIX_MS {
            None
        } else {
            Some(Epoch { unix_ms })
        }
    }

    /// The epoch in Unix milliseconds.
    pub const fn unix_ms(self) -> i64 {
        self.unix_ms
    }

    /// The last Unix millisecond an ID can stand for.
    pub const fn last_unix_ms(self) -> i64 {
        self.unix_ms + MAX_TIMESTAMP as i64
    }

    /// The Unix time of a time relative to this epoch.
    pub const fn to_unix(self, timestamp: EpochMs) -> UnixMs {
        UnixMs(self.unix_ms + timestamp.0 as i64)
    }

    /// The time since this epoch of a Unix time, if 41 bits can hold it.
    pub fn timestamp_of(self, time: UnixMs) -> Result<EpochMs, LayoutError> {
        let unix_ms = time.0;
        if unix_ms < self.unix_ms {
            Err(LayoutError::BeforeEpoch {
                unix_ms,
                epoch_ms: self.unix_ms,
            })
        } else if unix_ms > self.last_unix_ms() {
            Err(LayoutError::AfterRange {
                unix_ms,
                last_ms: self.last_unix_ms(),
            })
        } else {
            Ok(EpochMs((unix_ms - self.unix_ms) as u64))
        }
    }

    /// The time since this epoch of a Unix time at or after the epoch; 0 for one before it.
    /// For bounds (lease ends, floors), which only ever move a generator forward.
    pub const fn timestamp_or_zero(self, time: UnixMs) -> EpochMs {
        let since = time.0.saturating_sub(self.unix_ms);
        EpochMs(if since > 0 { since as u64 } else { 0 })
    }

    /// The smallest ID of the millisecond `unix_ms`: datacenter, worker and sequence all 0.
    pub fn first_id_at(self, time: UnixMs) -> Result<i64, LayoutError> {
        let timestamp = self.timestamp_of(time)?;
        Ok(pack(Parts {
            timestamp,
            datacenter_id: 0,
            worker_id: 0,
            sequence: 0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Wikipedia's "Snowflake ID" article, section "Example": the @Wikipedia tweet
    /// 1541815603606036480 has timestamp bits 367597485448, Twitter epoch 1288834974657,
    /// so Unix time 1656432460.105 (2022-06-28 16:07:40.105 UTC); machine id bits
    /// 01 0111 1010 (378 = datacenter 11, worker 26); sequence 0.
    /// <https://en.wikipedia.org/wiki/Snowflake_ID#Example>
    #[test]
    fn decodes_wikipedia_twitter_example() {
        let parts = unpack(1_541_815_603_606_036_480).unwrap();
        assert_eq!(parts.timestamp, EpochMs(367_597_485_448));
        assert_eq!(Epoch::TWITTER.to_unix(parts.timestamp).0, 1_656_432_460_105);
        assert_eq!(
            (u16::from(parts.datacenter_id) << WORKER_BITS) | u16::from(parts.worker_id),
            378
        );
        assert_eq!((parts.datacenter_id, parts.worker_id), (11, 26));
        assert_eq!(parts.sequence, 0);
        assert_eq!(pack(parts), 1_541_815_603_606_036_480);
    }

    /// Discord developer documentation, Reference, "Snowflakes" (the ID format table):
    /// 175928847299117063 is 41944705796 ms after the Discord epoch
    /// (1462015105796 = 2016-04-30T11:18:25.796Z), internal worker id 1 (bits 21-17, our
    /// datacenter field), internal process id 0 (bits 16-12, our worker field), increment 7.
    /// <https://discord.com/developers/docs/reference#snowflakes>
    #[test]
    fn decodes_discord_documentation_example() {
        let parts = unpack(175_928_847_299_117_063).unwrap();
        assert_eq!(parts.timestamp, EpochMs(41_944_705_796));
        let discord = Epoch::from_unix_ms(DISCORD_EPOCH_MS).unwrap();
        assert_eq!(discord.to_unix(parts.timestamp).0, 1_462_015_105_796);
        assert_eq!(parts.datacenter_id, 1);
        assert_eq!(parts.worker_id, 0);
        assert_eq!(parts.sequence, 7);
        assert_eq!(pack(parts), 175_928_847_299_117_063);
    }

    #[test]
    fn extremes() {
        let max = Parts {
            timestamp: EpochMs(MAX_TIMESTAMP),
            datacenter_id: MAX_DATACENTER_ID,
            worker_id: MAX_WORKER_ID,
            sequence: MAX_SEQUENCE,
        };
        assert_eq!(pack(max), i64::MAX);
        assert_eq!(unpack(i64::MAX), Ok(max));
        assert_eq!(unpack(0).unwrap().timestamp, EpochMs(0));
        assert_eq!(unpack(-1), Err(LayoutError::NegativeId(-1)));
        assert_eq!(unpack(i64::MIN), Err(LayoutError::NegativeId(i64::MIN)));
    }

    #[test]
    fn epoch_bounds() {
        let e = Epoch::TWITTER;
        assert_eq!(e.timestamp_of(UnixMs(TWITTER_EPOCH_MS)), Ok(EpochMs(0)));
        assert_eq!(
            e.timestamp_of(UnixMs(TWITTER_EPOCH_MS - 1)),
            Err(LayoutError::BeforeEpoch {
                unix_ms: TWITTER_EPOCH_MS - 1,
                epoch_ms: TWITTER_EPOCH_MS
            })
        );
        // The default epoch lasts until 2080-07-10T17:30:30.208Z.
        assert_eq!(e.last_unix_ms(), 3_487_858_230_208);
        assert_eq!(
            e.timestamp_of(UnixMs(e.last_unix_ms())),
            Ok(EpochMs(MAX_TIMESTAMP))
        );
        assert!(matches!(
            e.timestamp_of(UnixMs(e.last_unix_ms() + 1)),
            Err(LayoutError::AfterRange { .. })
        ));
        assert_eq!(e.first_id_at(UnixMs(TWITTER_EPOCH_MS + 1)), Ok(1 << 22));
        // Bounds before the epoch clamp to 0; others convert exactly.
        assert_eq!(e.timestamp_or_zero(UnixMs(0)), EpochMs(0));
        assert_eq!(
            e.timestamp_or_zero(UnixMs(TWITTER_EPOCH_MS + 5)),
            EpochMs(5)
        );
        assert_eq!(Epoch::from_unix_ms(-1), None);
        assert_eq!(Epoch::from_unix_ms(i64::MAX), None);
        assert!(Epoch::from_unix_ms(Epoch::MAX_UNIX_MS).is_some());
        assert_eq!(Epoch::from_unix_ms(Epoch::MAX_UNIX_MS + 1), None);
    }

    fn any_parts() -> impl Strategy<Value = Parts> {
        (
            0..=MAX_TIMESTAMP,
            0..=MAX_DATACENTER_ID,
            0..=MAX_WORKER_ID,
            0..=MAX_SEQUENCE,
        )
            .prop_map(|(timestamp, datacenter_id, worker_id, sequence)| Parts {
                timestamp: EpochMs(timestamp),
                datacenter_id,
                worker_id,
                sequence,
            })
    }

    proptest! {
        #[test]
        fn pack_unpack_round_trip(parts in any_parts()) {
            let id = pack(parts);
            prop_assert!(id >= 0);
            prop_assert_eq!(unpack(id).unwrap(), parts);
        }

        #[test]
        fn unpack_pack_round_trip(id in 0..=i64::MAX) {
            prop_assert_eq!(pack(unpack(id).unwrap()), id);
        }

        #[test]
        fn order_follows_fields(a in any_parts(), b in any_parts()) {
            let key = |p: Parts| (p.timestamp, p.datacenter_id, p.worker_id, p.sequence);
            prop_assert_eq!(pack(a).cmp(&pack(b)), key(a).cmp(&key(b)));
        }

        #[test]
        fn first_id_is_the_smallest_of_its_millisecond(parts in any_parts()) {
            let e = Epoch::TWITTER;
            let first = e.first_id_at(e.to_unix(parts.timestamp)).unwrap();
            let id = pack(parts);
            prop_assert!(first <= id);
            prop_assert!(id < first + (1 << TIMESTAMP_SHIFT));
        }

        #[test]
        fn timestamp_of_inverts_to_unix(ts in 0..=MAX_TIMESTAMP, epoch in 0i64..4_000_000_000_000) {
            let e = Epoch::from_unix_ms(epoch).unwrap();
            let ts = EpochMs(ts);
            prop_assert_eq!(e.timestamp_of(e.to_unix(ts)), Ok(ts));
            prop_assert_eq!(e.timestamp_or_zero(e.to_unix(ts)), ts);
        }
    }
}
