//! The payload of the WAL record that carries a new lease to standbys (and to crash
//! recovery): fixed-size, little-endian, versioned.

use super::state::LayoutRecord;

/// The payload of the WAL record that extends the lease: fixed-size, little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The new lease end, Unix ms.
    pub lease_end_unix_ms: i64,
    /// The layout the lease is for.
    pub layout: LayoutRecord,
    /// The writer's clock (Unix ms) when it computed the lease (0 in version-1 records).
    pub written_unix_ms: i64,
    /// The writer's timeline (0 in version-1 records).
    pub timeline: u32,
    /// The furthest ahead of its clock the writer may place any lease (ms).
    pub reach_cap_ms: i64,
}

const RECORD_MAGIC: u32 = 0x534e_464c; // "SNFL"
/// Version of the WAL record written by this build. Version 1 (0.2) is still read.
pub const RECORD_VERSION: u32 = 2;

impl LeaseRecord {
    /// Encoded size in bytes (version 2).
    pub const SIZE: usize = 52;
    /// Encoded size of a version-1 record.
    const SIZE_V1: usize = 32;

    /// Encodes the record.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&self.lease_end_unix_ms.to_le_bytes());
        out[16..24].copy_from_slice(&self.layout.epoch_ms.to_le_bytes());
        let bits = [
            self.layout.timestamp_bits,
            self.layout.datacenter_bits,
            self.layout.worker_bits,
            self.layout.sequence_bits,
        ];
        for (i, b) in bits.iter().enumerate() {
            out[24 + i * 2..26 + i * 2].copy_from_slice(&(*b as u16).to_le_bytes());
        }
        out[32..40].copy_from_slice(&self.written_unix_ms.to_le_bytes());
        out[40..44].copy_from_slice(&self.timeline.to_le_bytes());
        out[44..52].copy_from_slice(&self.reach_cap_ms.to_le_bytes());
        out
    }

    /// Decodes a record; `None` if it is not one of ours or of an unknown version.
    pub fn decode(bytes: &[u8]) -> Option<LeaseRecord> {
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let i64_at = |i: usize| i64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let u16_at = |i: usize| u32::from(u16::from_le_bytes(bytes[i..i + 2].try_into().unwrap()));
        if bytes.len() < Self::SIZE_V1 || u32_at(0) != RECORD_MAGIC {
            return None;
        }
        let (written_unix_ms, timeline, reach_cap_ms) = match (u32_at(4), bytes.len()) {
            (1, Self::SIZE_V1) => (0, 0, 0),
            (RECORD_VERSION, Self::SIZE) => (i64_at(32), u32_at(40), i64_at(44)),
            _ => return None,
        };
        Some(LeaseRecord {
            written_unix_ms,
            timeline,
            reach_cap_ms,
            lease_end_unix_ms: i64_at(8),
            layout: LayoutRecord {
                epoch_ms: i64_at(16),
                timestamp_bits: u16_at(24),
                datacenter_bits: u16_at(26),
                worker_bits: u16_at(28),
                sequence_bits: u16_at(30),
            },
        })
    }
}

/// A version-2 record as the primary writes it (for tests).
#[cfg(test)]
pub(crate) fn record(lease_end_unix_ms: i64) -> LeaseRecord {
    LeaseRecord {
        lease_end_unix_ms,
        layout: LayoutRecord::current(crate::layout::Epoch::TWITTER),
        written_unix_ms: lease_end_unix_ms - 1_000,
        timeline: 1,
        reach_cap_ms: 2_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_records_round_trip_and_reject_garbage() {
        let rec = record(1_795_324_179_240);
        assert_eq!(LeaseRecord::decode(&rec.encode()), Some(rec));
        assert_eq!(LeaseRecord::decode(&rec.encode()[..31]), None);
        assert_eq!(LeaseRecord::decode(&rec.encode()[..51]), None);
        let mut bad = rec.encode();
        bad[0] ^= 1;
        assert_eq!(LeaseRecord::decode(&bad), None);
        let mut future = rec.encode();
        future[4] = 9;
        assert_eq!(LeaseRecord::decode(&future), None);
    }

    #[test]
    fn version_1_records_of_0_2_still_replay() {
        // The 32 bytes 0.2 wrote: magic, version 1, lease end, epoch, four bit widths.
        let rec = record(1_795_324_179_240);
        let mut v1 = rec.encode()[..32].to_vec();
        v1[4..8].copy_from_slice(&1u32.to_le_bytes());
        let decoded = LeaseRecord::decode(&v1).unwrap();
        assert_eq!(decoded.lease_end_unix_ms, rec.lease_end_unix_ms);
        assert_eq!(decoded.layout, rec.layout);
        assert_eq!(
            (
                decoded.written_unix_ms,
                decoded.timeline,
                decoded.reach_cap_ms
            ),
            (0, 0, 0)
        );
        // A version-1 header on a version-2 body (or the reverse) is garbage.
        let mut mixed = rec.encode();
        mixed[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(LeaseRecord::decode(&mixed), None);
    }
}
