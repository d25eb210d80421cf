//! The commit-order watermark's durable part: the smallest ID each prepared transaction
//! holds. A prepared transaction stays in flight across restarts and promotions until
//! COMMIT PREPARED or ROLLBACK PREPARED, so what it holds is kept in a file in the data
//! directory (and carried to standbys by a WAL record), not only in shared memory.
//!
//! The file is appended to, one line per hold, and fsync'd: a PREPARE (and its replay on a
//! standby) costs one small write, whatever the number of holds. Holds of ended
//! transactions are dropped by rewriting the file once it has more lines than
//! [`needs_compaction`] allows: the cost of a rewrite is spread over as many appends as the
//! file holds lines. Format 2:
//!
//! ```text
//! {"format":2}
//! {"full_xid":1234,"min_id":5678}
//! ```
//!
//! A last line without its newline is an append a crash cut short: its PREPARE never
//! completed (and a standby replays its record again), so it is ignored. Format 1 (0.5.0
//! and before, one JSON document) is still read.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::durable::write_atomically;

/// File name, relative to the data directory.
pub const PREPARED_FILE: &str = "snowflake.prepared";
/// Format version of the file.
pub const FORMAT_VERSION: u32 = 2;
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

    /// Its line in the file (with the newline).
    fn line(&self) -> String {
        format!(
            "{{\"full_xid\":{},\"min_id\":{}}}\n",
            self.full_xid, self.min_id
        )
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

/// What the file holds, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreparedFile {
    /// The holds, one per transaction.
    pub holds: PreparedHolds,
    /// Lines of holds in the file (a transaction's hold may appear more than once).
    pub lines: usize,
    /// The file is in the current format and ends with a whole line: it may be appended to.
    pub appendable: bool,
}

/// Whether a file of `lines` hold lines, `live` of which were in flight when it was last
/// rewritten, should be rewritten without the ended ones: when it has grown to twice that
/// and 64 more, so that rewrites cost at most one line's worth per append.
pub fn needs_compaction(lines: usize, live: usize) -> bool {
    lines >= 2 * live + 64
}

fn invalid(data_dir: &Path, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("\"{}\" {why}", data_dir.join(PREPARED_FILE).display()),
    )
}

/// Reads the file; an absent file holds nothing.
pub fn read(data_dir: &Path) -> io::Result<PreparedFile> {
    let bytes = match std::fs::read(data_dir.join(PREPARED_FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(PreparedFile::default()),
        Err(e) => return Err(e),
    };
    let text = String::from_utf8(bytes)
        .map_err(|_| invalid(data_dir, "is not a valid prepared-transaction file".into()))?;
    let mut lines = text.split_inclusive('\n');
    let header = lines.next().unwrap_or("");
    #[derive(Deserialize)]
    struct Header {
        format: u32,
    }
    let format = serde_json::from_str::<Header>(header.trim())
        .map(|h| h.format)
        .unwrap_or(0);
    if format != FORMAT_VERSION {
        return read_version_1(data_dir, &text);
    }
    let mut file = PreparedFile {
        appendable: header.ends_with('\n'),
        ..PreparedFile::default()
    };
    for line in lines {
        if !line.ends_with('\n') {
            // An append cut short by a crash: its PREPARE never completed.
            file.appendable = false;
            break;
        }
        let hold: PreparedHold = serde_json::from_str(line.trim()).map_err(|e| {
            invalid(
                data_dir,
                format!("is not a valid prepared-transaction file: {e}"),
            )
        })?;
        file.holds.add(hold);
        file.lines += 1;
    }
    file.holds.format = FORMAT_VERSION;
    Ok(file)
}

/// Reads a file of format 1 (one JSON document), which is never appended to.
fn read_version_1(data_dir: &Path, text: &str) -> io::Result<PreparedFile> {
    let holds: PreparedHolds = serde_json::from_str(text).map_err(|e| {
        invalid(
            data_dir,
            format!("is not a valid prepared-transaction file: {e}"),
        )
    })?;
    if holds.format != 1 && !holds.holds.is_empty() {
        return Err(invalid(
            data_dir,
            format!(
                "has format version {}, this build reads versions 1 and {FORMAT_VERSION}",
                holds.format
            ),
        ));
    }
    Ok(PreparedFile {
        lines: holds.holds.len(),
        holds,
        appendable: false,
    })
}

/// Rewrites the file with exactly `holds`, atomically and durably (temporary file, fsync,
/// rename, fsync of the directory).
pub fn write(data_dir: &Path, holds: &PreparedHolds) -> io::Result<()> {
    let mut body = format!("{{\"format\":{FORMAT_VERSION}}}\n");
    for hold in &holds.holds {
        body.push_str(&hold.line());
    }
    write_atomically(data_dir, PREPARED_FILE, body.as_bytes())
}

/// Appends `hold` to a file that [`read`] found appendable, and makes it durable
/// (`fdatasync`).
pub fn append(data_dir: &Path, hold: &PreparedHold) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .append(true)
        .open(data_dir.join(PREPARED_FILE))?;
    f.write_all(hold.line().as_bytes())?;
    f.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fs::OpenOptions;

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

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("snowflake-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn hold(full_xid: u64, min_id: i64) -> PreparedHold {
        PreparedHold { full_xid, min_id }
    }

    #[test]
    fn file_round_trip_append_and_absent_file() {
        let dir = temp_dir("prepared");
        assert_eq!(read(&dir).unwrap(), PreparedFile::default());
        let mut h = PreparedHolds::default();
        h.add(hold(u64::MAX, i64::MAX));
        write(&dir, &h).unwrap();
        let back = read(&dir).unwrap();
        assert_eq!(back.holds.holds, h.holds);
        assert_eq!(back.holds.format, FORMAT_VERSION);
        assert_eq!((back.lines, back.appendable), (1, true));
        append(&dir, &hold(7, 50)).unwrap();
        append(&dir, &hold(7, 30)).unwrap();
        let back = read(&dir).unwrap();
        assert_eq!(
            back.holds.holds,
            vec![hold(u64::MAX, i64::MAX), hold(7, 30)]
        );
        assert_eq!((back.lines, back.appendable), (3, true));
        // A crash in the middle of an append: the torn line is ignored, and the file must
        // be rewritten before the next append.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join(PREPARED_FILE))
            .unwrap();
        f.write_all(b"{\"full_xid\":9,\"min").unwrap();
        let back = read(&dir).unwrap();
        assert_eq!(back.holds.holds.len(), 2);
        assert!(!back.appendable);
        // A damaged line in the middle is an error, as is an unknown format.
        std::fs::write(
            dir.join(PREPARED_FILE),
            b"{\"format\":2}\nnonsense\n{\"full_xid\":1,\"min_id\":1}\n",
        )
        .unwrap();
        assert_eq!(read(&dir).unwrap_err().kind(), io::ErrorKind::InvalidData);
        std::fs::write(
            dir.join(PREPARED_FILE),
            b"{\"format\": 99, \"holds\": [{\"full_xid\": 1, \"min_id\": 1}]}",
        )
        .unwrap();
        assert_eq!(read(&dir).unwrap_err().kind(), io::ErrorKind::InvalidData);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_of_format_1_are_read_and_rewritten_before_an_append() {
        let dir = temp_dir("prepared-v1");
        std::fs::write(
            dir.join(PREPARED_FILE),
            b"{\n  \"format\": 1,\n  \"holds\": [\n    {\"full_xid\": 5, \"min_id\": 9}\n  ]\n}\n",
        )
        .unwrap();
        let back = read(&dir).unwrap();
        assert_eq!(back.holds.holds, vec![hold(5, 9)]);
        assert!(!back.appendable);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn compaction_is_due_once_the_file_doubled() {
        assert!(!needs_compaction(0, 0));
        assert!(!needs_compaction(63, 0));
        assert!(needs_compaction(64, 0));
        assert!(!needs_compaction(263, 100));
        assert!(needs_compaction(264, 100));
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
