//! Durable generator state: a small JSON file in the data directory (std + serde, no pgrx).
//!
//! The file records the ID layout (epoch and bit widths) the first time an ID is generated.
//! The decode functions are IMMUTABLE, so the layout is fixed for the cluster's lifetime:
//! generation and decoding both refuse to run if the configured layout later differs.
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
    fn layout_comparison() {
        let twitter = LayoutRecord::current(Epoch::TWITTER);
        let discord = LayoutRecord::current(Epoch::from_unix_ms(1_420_070_400_000).unwrap());
        let state = StateFile {
            format: FORMAT_VERSION,
            layout: twitter,
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
