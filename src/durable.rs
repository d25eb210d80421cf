//! Durable generator state: a small JSON file in the data directory, and the payload of the
//! WAL record that carries the same facts to standbys (std + serde, no pgrx).
//!
//! The file records the ID layout (epoch and bit widths) the first time an ID is generated.
//! The decode functions are IMMUTABLE, so the layout is fixed for the cluster's lifetime:
//! generation and decoding both refuse to run if the configured layout later differs.
//!
//! It also records the lease: the end (exclusive, Unix ms) of the time range IDs may have
//! been issued in. Before an ID past the lease is issued, the lease is extended and written
//! here (fsync'd) and then WAL-logged (see `wal.rs`). After any restart the generator starts
//! at the lease end, so it never reissues an ID even if the clock went back.
//!
//! Writes are atomic (write a temporary file, fsync it, rename it over the old one, fsync the
//! directory), so a crash leaves either the old or the new file, never a torn one.

use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::layout::Epoch;
use crate::layout::{DATACENTER_BITS, SEQUENCE_BITS, TIMESTAMP_BITS, WORKER_BITS};

/// File name, relative to the data directory.
pub const STATE_FILE: &str = "snowflake.state";
/// Version of the file format we write.
pub const FORMAT_VERSION: u32 = 1;

/// The layout that IDs of this cluster were generated with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutRecord {
    /// The epoch, Unix milliseconds.
    pub epoch_ms: i64,
    /// Bits of timestamp.
    pub timestamp_bits: u32,
    /// Bits of datacenter id.
    pub datacenter_bits: u32,
    /// Bits of worker id.
    pub worker_bits: u32,
    /// Bits of sequence.
    pub sequence_bits: u32,
}

impl LayoutRecord {
    /// The record for this build's bit widths and the given epoch.
    pub fn current(epoch: Epoch) -> LayoutRecord {
        LayoutRecord {
            epoch_ms: epoch.unix_ms(),
            timestamp_bits: TIMESTAMP_BITS,
            datacenter_bits: DATACENTER_BITS,
            worker_bits: WORKER_BITS,
            sequence_bits: SEQUENCE_BITS,
        }
    }
}

/// The whole state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFile {
    /// File format version.
    pub format: u32,
    /// The layout in force.
    pub layout: LayoutRecord,
    /// No ID of this cluster has a time at or after this (Unix ms); 0 when none was issued.
    #[serde(default)]
    pub lease_end_unix_ms: i64,
}

impl StateFile {
    /// The state to write after replaying `record` over `existing`, or `None` if the file
    /// already covers it. The lease never moves backwards for the same layout.
    pub fn merged(existing: Option<&StateFile>, record: &LeaseRecord) -> Option<StateFile> {
        let lease = match existing {
            Some(s) if s.layout == record.layout => {
                if s.lease_end_unix_ms >= record.lease_end_unix_ms {
                    return None;
                }
                record.lease_end_unix_ms
            }
            _ => record.lease_end_unix_ms,
        };
        Some(StateFile {
            format: FORMAT_VERSION,
            layout: record.layout,
            lease_end_unix_ms: lease,
        })
    }
}

/// The payload of the WAL record that extends the lease: fixed-size, little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The new lease end, Unix ms.
    pub lease_end_unix_ms: i64,
    /// The layout the lease is for.
    pub layout: LayoutRecord,
}

const RECORD_MAGIC: u32 = 0x534e_464c; // "SNFL"

impl LeaseRecord {
    /// Encoded size in bytes.
    pub const SIZE: usize = 32;

    /// Encodes the record.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
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
        out
    }

    /// Decodes a record; `None` if it is not one of ours or of an unknown version.
    pub fn decode(bytes: &[u8]) -> Option<LeaseRecord> {
        if bytes.len() != Self::SIZE {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let i64_at = |i: usize| i64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let u16_at = |i: usize| u32::from(u16::from_le_bytes(bytes[i..i + 2].try_into().unwrap()));
        if u32_at(0) != RECORD_MAGIC || u32_at(4) != FORMAT_VERSION {
            return None;
        }
        Some(LeaseRecord {
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

/// Path of the state file under `data_dir`.
pub fn state_path(data_dir: &Path) -> PathBuf {
    data_dir.join(STATE_FILE)
}

/// Reads the state file. `Ok(None)` when it does not exist.
pub fn read(data_dir: &Path) -> io::Result<Option<StateFile>> {
    let path = state_path(data_dir);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let state: StateFile = serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("\"{}\" is not a valid state file: {e}", path.display()),
        )
    })?;
    if state.format != FORMAT_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "\"{}\" has format version {}, this build reads version {FORMAT_VERSION}",
                path.display(),
                state.format
            ),
        ));
    }
    Ok(Some(state))
}

/// Writes the state file atomically and durably.
pub fn write(data_dir: &Path, state: &StateFile) -> io::Result<()> {
    let path = state_path(data_dir);
    let tmp = data_dir.join(format!("{STATE_FILE}.tmp"));
    let mut body = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
    body.push(b'\n');
    {
        let mut f = File::create(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, &path)?;
    File::open(data_dir)?.sync_all()
}

/// What the recorded layout says about the configured one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutCheck {
    /// Nothing recorded yet.
    NotRecorded,
    /// Recorded and equal.
    Matches,
    /// Recorded and different.
    Differs {
        /// What the file says.
        recorded: LayoutRecord,
    },
}

/// Compares the recorded layout (if any) with `configured`.
pub fn check_layout(state: Option<&StateFile>, configured: &LayoutRecord) -> LayoutCheck {
    match state {
        None => LayoutCheck::NotRecorded,
        Some(s) if s.layout == *configured => LayoutCheck::Matches,
        Some(s) => LayoutCheck::Differs { recorded: s.layout },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("snowflake-durable-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn write_then_read() {
        let dir = temp_dir("rw");
        assert_eq!(read(&dir).unwrap(), None);
        let state = StateFile {
            format: FORMAT_VERSION,
            layout: LayoutRecord::current(Epoch::TWITTER),
            lease_end_unix_ms: 1_700_000_000_000,
        };
        write(&dir, &state).unwrap();
        assert_eq!(read(&dir).unwrap(), Some(state.clone()));
        assert!(!dir.join("snowflake.state.tmp").exists());
        // Overwrite in place.
        write(&dir, &state).unwrap();
        assert_eq!(read(&dir).unwrap(), Some(state));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_or_future_files_are_errors() {
        let dir = temp_dir("bad");
        fs::write(state_path(&dir), b"{not json").unwrap();
        assert_eq!(read(&dir).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let future = format!(
            "{{\"format\":99,\"layout\":{}}}",
            serde_json::to_string(&LayoutRecord::current(Epoch::TWITTER)).unwrap()
        );
        fs::write(state_path(&dir), future).unwrap();
        assert_eq!(read(&dir).unwrap_err().kind(), io::ErrorKind::InvalidData);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_without_a_lease_read_as_zero() {
        let dir = temp_dir("nolease");
        let body = format!(
            "{{\"format\":1,\"layout\":{}}}",
            serde_json::to_string(&LayoutRecord::current(Epoch::TWITTER)).unwrap()
        );
        fs::write(state_path(&dir), body).unwrap();
        assert_eq!(read(&dir).unwrap().unwrap().lease_end_unix_ms, 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lease_records_round_trip_and_reject_garbage() {
        let rec = LeaseRecord {
            lease_end_unix_ms: 1_795_324_179_240,
            layout: LayoutRecord::current(Epoch::TWITTER),
        };
        assert_eq!(LeaseRecord::decode(&rec.encode()), Some(rec));
        assert_eq!(LeaseRecord::decode(&rec.encode()[..31]), None);
        let mut bad = rec.encode();
        bad[0] ^= 1;
        assert_eq!(LeaseRecord::decode(&bad), None);
        let mut future = rec.encode();
        future[4] = 9;
        assert_eq!(LeaseRecord::decode(&future), None);
    }

    #[test]
    fn replay_never_moves_the_lease_back() {
        let layout = LayoutRecord::current(Epoch::TWITTER);
        let rec = |ms| LeaseRecord {
            lease_end_unix_ms: ms,
            layout,
        };
        let fresh = StateFile::merged(None, &rec(5_000)).unwrap();
        assert_eq!(fresh.lease_end_unix_ms, 5_000);
        assert_eq!(StateFile::merged(Some(&fresh), &rec(4_000)), None);
        assert_eq!(StateFile::merged(Some(&fresh), &rec(5_000)), None);
        assert_eq!(
            StateFile::merged(Some(&fresh), &rec(6_000))
                .unwrap()
                .lease_end_unix_ms,
            6_000
        );
        // A record of another layout (the primary's) replaces the file's layout.
        let other = LeaseRecord {
            lease_end_unix_ms: 1,
            layout: LayoutRecord {
                epoch_ms: 0,
                ..layout
            },
        };
        assert_eq!(
            StateFile::merged(Some(&fresh), &other)
                .unwrap()
                .layout
                .epoch_ms,
            0
        );
    }

    #[test]
    fn layout_comparison() {
        let twitter = LayoutRecord::current(Epoch::TWITTER);
        let discord = LayoutRecord::current(Epoch::from_unix_ms(1_420_070_400_000).unwrap());
        let state = StateFile {
            format: FORMAT_VERSION,
            layout: twitter,
            lease_end_unix_ms: 0,
        };
        assert_eq!(check_layout(None, &twitter), LayoutCheck::NotRecorded);
        assert_eq!(check_layout(Some(&state), &twitter), LayoutCheck::Matches);
        assert_eq!(
            check_layout(Some(&state), &discord),
            LayoutCheck::Differs { recorded: twitter }
        );
        let wider = LayoutRecord {
            sequence_bits: 13,
            ..twitter
        };
        assert!(matches!(
            check_layout(Some(&state), &wider),
            LayoutCheck::Differs { .. }
        ));
    }
}
