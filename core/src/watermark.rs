//! The commit-order watermark's durable part: the smallest ID each prepared transaction
//! holds. A prepared transaction stays in flight across restarts and promotions until
//! COMMIT PREPARED or ROLLBACK PREPARED, so what it holds is kept in a file in the data
//! directory (and carried to standbys by a WAL record), not only in shared memory.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::durable::{read_json, write_json};

/// File name, relative to the data directory.
pub const PREPARED_FILE: &str = "snowflake.prepared";
/// Format version of the file.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of a hold in its WAL record.
pub const RECORD_LEN: usize = 16;

/// The smallest ID a prepared transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedHold {
    /// Its full (64-bit, epoch-qualified) transaction id.
    pub full_xid: u64,
    /// The smallest ID it may hold (a lower bound).
    pub min_id: i64,
}

impl PreparedHold {
    /// The WAL record's payload.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[..8].copy_from_slice(&self.full_xid.to_le_bytes());
        out[8..].copy_from_slice(&self.min_id.to_le_bytes());
        out
    }

    /// Reads a WAL record's payload.
    pub fn decode(bytes: &[u8]) -> Option<PreparedHold> {
        if bytes.len() != RECORD_LEN {
            return None;
        }
        Some(PreparedHold {
            full_xid: u64::from_le_bytes(bytes[..8].try_into().ok()?),
            min_id: i64::from_le_bytes(bytes[8..].try_into().ok()?),
        })
    }
}

/// Every prepared transaction known to hold IDs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedHolds {
    /// File format version.
    pub format: u32,
    /// One entry per transaction.
    pub holds: Vec<PreparedHold>,
}

impl PreparedHolds {
    /// Records `hold`; a transaction recorded twice keeps the smaller ID.
    pub fn add(&mut self, hold: PreparedHold) {
        match self.holds.iter_mut().find(|h| h.full_xid == hold.full_xid) {
            Some(h) => h.min_id = h.min_id.min(hold.min_id),
            None => self.holds.push(hold),
        }
    }

    /// Drops the transactions that `in_flight` says have ended; whether any was dropped.
    pub fn retain_in_flight(&mut self, mut in_flight: impl FnMut(u64) -> bool) -> bool {
        let before = self.holds.len();
        self.holds.retain(|h| in_flight(h.full_xid));
        self.holds.len() != before
    }

    /// The smallest ID held, if any.
    pub fn min_id(&self) -> Option<i64> {
        self.holds.iter().map(|h| h.min_id).min()
    }
}

/// Reads the file; an absent file holds nothing.
pub fn read(data_dir: &Path) -> io::Result<PreparedHolds> {
    let holds: PreparedHolds =
        read_json(data_dir, PREPARED_FILE, "prepared-transaction file")?.unwrap_or_default();
    if holds.format != FORMAT_VERSION && !holds.holds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "\"{}\" has format version {}, this build reads version {FORMAT_VERSION}",
                data_dir.join(PREPARED_FILE).display(),
                holds.format
            ),
        ));
    }
    Ok(holds)
}

/// Writes the file atomically and durably (temporary file, fsync, rename, fsync).
pub fn write(data_dir: &Path, holds: &PreparedHolds) -> io::Result<()> {
    let holds = PreparedHolds {
        format: FORMAT_VERSION,
        holds: holds.holds.clone(),
    };
    write_json(data_dir, PREPARED_FILE, &holds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn add_keeps_the_smallest_and_retain_drops_ended() {
        let mut h = PreparedHolds::default();
        assert_eq!(h.min_id(), None);
        h.add(PreparedHold {
            full_xid: 7,
            min_id: 50,
        });
        h.add(PreparedHold {
            full_xid: 9,
            min_id: 40,
        });
        h.add(PreparedHold {
            full_xid: 7,
            min_id: 30,
        });
        h.add(PreparedHold {
            full_xid: 7,
            min_id: 60,
        });
        assert_eq!(h.holds.len(), 2);
        assert_eq!(h.min_id(), Some(30));
        assert!(h.retain_in_flight(|x| x == 9));
        assert_eq!(h.min_id(), Some(40));
        assert!(!h.retain_in_flight(|_| true));
    }

    #[test]
    fn file_round_trip_and_absent_file() {
        let dir = std::env::temp_dir().join(format!("snowflake-prepared-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read(&dir).unwrap(), PreparedHolds::default());
        let mut h = PreparedHolds::default();
        h.add(PreparedHold {
            full_xid: u64::MAX,
            min_id: i64::MAX,
        });
        write(&dir, &h).unwrap();
        let back = read(&dir).unwrap();
        assert_eq!(back.holds, h.holds);
        assert_eq!(back.format, FORMAT_VERSION);
        std::fs::write(
            dir.join(PREPARED_FILE),
            b"{\"format\": 99, \"holds\": [{\"full_xid\": 1, \"min_id\": 1}]}",
        )
        .unwrap();
        assert_eq!(read(&dir).unwrap_err().kind(), io::ErrorKind::InvalidData);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest! {
        #[test]
        fn record_round_trips(full_xid in any::<u64>(), min_id in any::<i64>()) {
            let hold = PreparedHold { full_xid, min_id };
            prop_assert_eq!(PreparedHold::decode(&hold.encode()), Some(hold));
            prop_assert_eq!(PreparedHold::decode(&hold.encode()[1..]), None);
        }
    }
}
