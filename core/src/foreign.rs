//! Decoding IDs made by other Snowflake-style generators (pure Rust, no pgrx).
//!
//! Each layout maps onto `snowflake_parts` as documented in docs/functions.md:
//!
//! | layout | time | datacenter_id | worker_id | sequence |
//! |---|---|---|---|---|
//! | `twitter` | 41 bits ms since 2010-11-04T01:42:54.657Z | bits 21-17 | bits 16-12 | bits 11-0 |
//! | `discord` | 41 bits ms since 2015-01-01T00:00:00Z | bits 21-17 (internal worker) | bits 16-12 (internal process) | bits 11-0 (increment) |
//! | `instagram` | 41 bits ms since 2011-08-24T21:07:01.721Z | NULL | bits 22-10 (shard id) | bits 9-0 |
//! | `sonyflake` | 39 bits of 10 ms since 2014-09-01T00:00:00Z | NULL | bits 15-0 (machine id) | bits 23-16 |
//! | `pgedge` | 41 bits ms since 2023-01-01T00:00:00Z | NULL | bits 21-12 (node) | bits 11-0 (counter) |
//! | `mastodon` | 48 bits of Unix ms | NULL | NULL | bits 15-0 |

use crate::layout::{LayoutError, DISCORD_EPOCH_MS, TWITTER_EPOCH_MS};

/// A known foreign layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignLayout {
    /// Twitter's original layout and epoch.
    Twitter,
    /// Discord: Twitter's bit positions, epoch 2015-01-01.
    Discord,
    /// Instagram's PL/pgSQL scheme: 41-bit ms, 13-bit shard, 10-bit sequence.
    Instagram,
    /// Sony's Sonyflake: 39 bits of 10 ms units, 8-bit sequence, 16-bit machine id.
    Sonyflake,
    /// pgEdge's snowflake extension (1.2 and later): 41-bit ms, 10-bit node, 12-bit counter.
    Pgedge,
    /// Mastodon's `timestamp_id`: 48 bits of Unix ms, 16 bits of hashed sequence.
    Mastodon,
}

/// Names accepted by `snowflake_decode(id, layout)`, in documentation order.
pub const LAYOUT_NAMES: [&str; 6] = [
    "twitter",
    "discord",
    "instagram",
    "sonyflake",
    "pgedge",
    "mastodon",
];

/// Instagram's epoch, from their "Sharding & IDs at Instagram" function: 1314220021721.
pub const INSTAGRAM_EPOCH_MS: i64 = 1_314_220_021_721;
/// Sonyflake's default start time, 2014-09-01T00:00:00Z.
pub const SONYFLAKE_EPOCH_MS: i64 = 1_409_529_600_000;
/// pgEdge snowflake's epoch, 2023-01-01T00:00:00Z.
pub const PGEDGE_EPOCH_MS: i64 = 1_672_531_200_000;

/// A decoded ID, ours or another generator's. Fields a layout does not have are `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignParts {
    /// Generation time, Unix ms.
    pub unix_ms: i64,
    /// Datacenter id, if the layout has one.
    pub datacenter_id: Option<i32>,
    /// Worker, shard, machine or node id.
    pub worker_id: Option<i32>,
    /// Sequence within the time unit.
    pub sequence: i32,
}

impl ForeignLayout {
    /// Looks a layout up by name: exactly one of [`LAYOUT_NAMES`], in any letter case.
    /// Surrounding spaces or control characters are not a layout name.
    ///
    /// Compares in place: the name is a caller's text (up to 1 GB), and a lower-cased copy of
    /// it is an allocation that, failing, would abort the process.
    pub fn from_name(name: &str) -> Option<ForeignLayout> {
        const NAMED: [(&str, ForeignLayout); 6] = [
            ("twitter", ForeignLayout::Twitter),
            ("discord", ForeignLayout::Discord),
            ("instagram", ForeignLayout::Instagram),
            ("sonyflake", ForeignLayout::Sonyflake),
            ("pgedge", ForeignLayout::Pgedge),
            ("mastodon", ForeignLayout::Mastodon),
        ];
        NAMED
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|&(_, layout)| layout)
    }

    /// Decodes `id`. Negative IDs are errors in every layout (bit 63 is always 0).
    pub fn decode(self, id: i64) -> Result<ForeignParts, LayoutError> {
        if id < 0 {
            return Err(LayoutError::NegativeId(id));
        }
        let bits = id as u64;
        let field = |shift: u32, width: u32| ((bits >> shift) & ((1u64 << width) - 1)) as i32;
        let ms_since = |epoch: i64, shift: u32| epoch + (bits >> shift) as i64;
        Ok(match self {
            ForeignLayout::Twitter | ForeignLayout::Discord => ForeignParts {
                unix_ms: ms_since(
                    if self == ForeignLayout::Twitter {
                        TWITTER_EPOCH_MS
                    } else {
                        DISCORD_EPOCH_MS
                    },
                    22,
                ),
                datacenter_id: Some(field(17, 5)),
                worker_id: Some(field(12, 5)),
                sequence: field(0, 12),
            },
            ForeignLayout::Instagram => ForeignParts {
                unix_ms: ms_since(INSTAGRAM_EPOCH_MS, 23),
                datacenter_id: None,
                worker_id: Some(field(10, 13)),
                sequence: field(0, 10),
            },
            ForeignLayout::Sonyflake => ForeignParts {
                unix_ms: SONYFLAKE_EPOCH_MS + (bits >> 24) as i64 * 10,
                datacenter_id: None,
                worker_id: Some(field(0, 16)),
                sequence: field(16, 8),
            },
            ForeignLayout::Pgedge => ForeignParts {
                unix_ms: ms_since(PGEDGE_EPOCH_MS, 22),
                datacenter_id: None,
                worker_id: Some(field(12, 10)),
                sequence: field(0, 12),
            },
            ForeignLayout::Mastodon => ForeignParts {
                unix_ms: ms_since(0, 16),
                datacenter_id: None,
                worker_id: None,
                sequence: field(0, 16),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{pack, Epoch, Parts};
    use proptest::prelude::*;

    fn decode(layout: &str, id: i64) -> ForeignParts {
        ForeignLayout::from_name(layout)
            .unwrap()
            .decode(id)
            .unwrap()
    }

    /// Wikipedia, "Snowflake ID", section "Example": tweet 1541815603606036480 was posted at
    /// 2022-06-28 16:07:40.105 UTC by machine 378 (= datacenter 11, worker 26), sequence 0.
    #[test]
    fn twitter_wikipedia_example() {
        let p = decode("twitter", 1_541_815_603_606_036_480);
        assert_eq!(p.unix_ms, 1_656_432_460_105);
        assert_eq!(
            (p.datacenter_id, p.worker_id, p.sequence),
            (Some(11), Some(26), 0)
        );
    }

    /// Discord developer documentation, Reference, "Snowflakes": 175928847299117063 is
    /// 2016-04-30T11:18:25.796Z, internal worker 1, internal process 0, increment 7.
    #[test]
    fn discord_documentation_example() {
        let p = decode("Discord", 175_928_847_299_117_063);
        assert_eq!(p.unix_ms, 1_462_015_105_796);
        assert_eq!(
            (p.datacenter_id, p.worker_id, p.sequence),
            (Some(1), Some(0), 7)
        );
    }

    /// disnake (a discord.py fork), `utils.time_snowflake(dt, high=True)`: `(discord_millis
    /// << 22) + (2**22 - 1)` with `DISCORD_EPOCH = 1420070400000`, the largest snowflake of a
    /// millisecond; for 2020-01-01T00:00:00Z it sets every bit below the time.
    #[test]
    fn discord_client_library_code() {
        let millis = 1_577_836_800_000i64 - DISCORD_EPOCH_MS;
        let p = decode("discord", (millis << 22) + ((1 << 22) - 1));
        assert_eq!(p.unix_ms, 1_577_836_800_000);
        assert_eq!(
            (p.datacenter_id, p.worker_id, p.sequence),
            (Some(31), Some(31), 4095)
        );
    }

    /// Instagram Engineering, "Sharding & IDs at Instagram" (2012), the generator's own
    /// PL/pgSQL (`result := (now_millis - our_epoch) << 23; result := result | (shard_id <<
    /// 10); result := result | (seq_id)`, `our_epoch := 1314220021721`): the worked example has
    /// 1387263000 ms since the epoch in the top 41 bits, shard id 1341 in the next 13, and
    /// sequence 5001 % 1024 = 313 in the last 10; their function's epoch is 1314220021721.
    #[test]
    fn instagram_blog_example() {
        let id = (1_387_263_000i64 << 23) | (1341 << 10) | 313;
        let p = decode("instagram", id);
        assert_eq!(p.unix_ms, INSTAGRAM_EPOCH_MS + 1_387_263_000);
        assert_eq!(
            (p.datacenter_id, p.worker_id, p.sequence),
            (None, Some(1341), 313)
        );
    }

    /// sony/sonyflake, sonyflake.go: `toID` is `elapsedTime << (8 + 16) | sequence << 16 |
    /// machineID`, elapsed time in 10 ms units since 2014-09-01 00:00:00 UTC (the default
    /// StartTime). An ID made 1 s after the start with sequence 3 on machine 0x0102:
    #[test]
    fn sonyflake_source_definition() {
        let id = (100i64 << 24) | (3 << 16) | 0x0102;
        let p = decode("sonyflake", id);
        assert_eq!(p.unix_ms, SONYFLAKE_EPOCH_MS + 1_000);
        assert_eq!(
            (p.datacenter_id, p.worker_id, p.sequence),
            (None, Some(258), 3)
        );
    }

    /// pgEdge/snowflake, snowflake.c (the current source; the order changed at 1.2):
    /// `int64FromSnowflake` puts the count at SNOWFLAKE_COUNT_SHIFT 0 (mask 0xFFF), the node
    /// at SNOWFLAKE_NODE_SHIFT 12 (mask 0x3FF) and the milliseconds since
    /// SNOWFLAKE_EPOCH_OFFSET 1672531200 s at SNOWFLAKE_MSEC_SHIFT 22. Real output: a
    /// Spock/Supabase deployment's README shows `snowflake.nextval()` returning
    /// 413334082185859072 and `snowflake.get_node()` of it returning 1.
    #[test]
    fn pgedge_current_source() {
        let p = decode("pgedge", 413_334_082_185_859_072);
        assert_eq!(p.unix_ms, 1_771_077_724_569); // 2026-02-14 14:02:04.569 UTC
        assert_eq!(
            (p.datacenter_id, p.worker_id, p.sequence),
            (None, Some(1), 0)
        );
        // int64FromSnowflake of node 1023, count 4095, msec 1: every field at its mask.
        let id = (1i64 << 22) | (1023 << 12) | 4095;
        let p = decode("pgedge", id);
        assert_eq!(p.unix_ms, PGEDGE_EPOCH_MS + 1);
        assert_eq!((p.worker_id, p.sequence), (Some(1023), 4095));
        // pgEdge's older documentation decodes 136169504773242881 as node 1, count 0: that
        // was the pre-1.2 order (node in bits 9-0). Today's order reads node 0, count 1.
        let p = decode("pgedge", 136_169_504_773_242_881);
        assert_eq!(p.unix_ms, 1_704_996_539_845); // 2024-01-11 18:08:59.845 UTC
        assert_eq!((p.worker_id, p.sequence), (Some(0), 1));
    }

    /// Mastodon's API documentation (entities/Status, Example) shows status
    /// 103270115826048975 of mastodon.social, created_at 2019-12-08T03:48:33.901Z; its top
    /// 48 bits are 03:48:33.849 (the ID comes from the database's transaction time, the
    /// created_at from the application a moment later). lib/mastodon/snowflake.rb's
    /// `id_at(t, with_random: false)` is `t.to_i * 1000 << 16`.
    #[test]
    fn mastodon_documentation_and_source() {
        let p = decode("mastodon", 103_270_115_826_048_975);
        assert_eq!(p.unix_ms, 1_575_776_913_849);
        assert_eq!(
            (p.datacenter_id, p.worker_id, p.sequence),
            (None, None, 40_911)
        );
        let p = decode("mastodon", 1_500_000_000_000 << 16);
        assert_eq!((p.unix_ms, p.sequence), (1_500_000_000_000, 0));
    }

    #[test]
    fn names_and_errors() {
        for name in LAYOUT_NAMES {
            assert!(ForeignLayout::from_name(name).is_some(), "{name}");
        }
        assert_eq!(ForeignLayout::from_name("ulid"), None);
        assert_eq!(
            ForeignLayout::from_name("TwItTeR"),
            Some(ForeignLayout::Twitter)
        );
        for padded in [" twitter ", "twitter\n", "\ttwitter", "twitter\0", ""] {
            assert_eq!(ForeignLayout::from_name(padded), None, "{padded:?}");
        }
        assert_eq!(
            ForeignLayout::Sonyflake.decode(-1),
            Err(LayoutError::NegativeId(-1))
        );
    }

    proptest! {
        /// The twitter layout agrees with our own decoder for every ID.
        #[test]
        fn twitter_matches_our_layout(id in 0..=i64::MAX) {
            let ours = crate::layout::unpack(id).unwrap();
            let theirs = decode("twitter", id);
            prop_assert_eq!(theirs.unix_ms, Epoch::TWITTER.to_unix(ours.timestamp).0);
            prop_assert_eq!(theirs.worker_id, Some(i32::from(ours.worker_id)));
            prop_assert_eq!(theirs.datacenter_id, Some(i32::from(ours.datacenter_id)));
            prop_assert_eq!(theirs.sequence, i32::from(ours.sequence));
            prop_assert_eq!(pack(Parts { ..ours }), id);
        }

        /// Every layout decodes every non-negative ID without overflow.
        #[test]
        fn all_layouts_total(id in 0..=i64::MAX, layout in 0..LAYOUT_NAMES.len()) {
            let l = ForeignLayout::from_name(LAYOUT_NAMES[layout]).unwrap();
            let p = l.decode(id).unwrap();
            prop_assert!(p.unix_ms >= 0);
            prop_assert!(p.sequence >= 0);
        }
    }
}
