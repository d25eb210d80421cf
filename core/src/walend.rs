//! How a timeline ended, read from the WAL a promoted node keeps: whether the old primary
//! shut down cleanly and this node replayed all of its WAL.
//!
//! A clean shutdown ends with a shutdown checkpoint, written after every backend has
//! exited, and PostgreSQL's WAL senders wait for their standbys to confirm it before they
//! exit. A standby promoted after it replayed that checkpoint as the last record of the old
//! timeline has every lease record the old primary wrote: it can resume at the newest lease
//! end, at once (a planned switchover). Anything else (the checkpoint missing, the WAL
//! unreadable, a record of another kind at the end) is read as an unclean end.
//!
//! The timeline history file (`pg_wal/<timeline>.history`) gives where each earlier
//! timeline ended (the switch point: the end of its last record). The last record is found
//! backwards from there: a shutdown checkpoint has a fixed length, so it starts either
//! that many bytes before the switch point on the same page, or on the previous page when
//! the switch point's page starts with the rest of a record. It is accepted only if its
//! header, its resource manager, its kind, its length and its own redo pointer (a shutdown
//! checkpoint's redo pointer is its own position) all agree, on pages whose headers carry
//! the expected magic number and address.

/// Where an earlier timeline of this node's history ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryEntry {
    /// The earlier timeline.
    pub timeline: u32,
    /// Its switch point: the end of its last record (an LSN).
    pub end_lsn: u64,
}

/// Reads a timeline history file: one line per earlier timeline, oldest first, `timeline`,
/// a tab, `X/Y` (the switch point), a tab and a free-form reason; `#` comments and blank
/// lines are skipped. `None` if a line does not read so.
pub fn parse_history(text: &str) -> Option<Vec<HistoryEntry>> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let timeline = fields.next()?.parse().ok()?;
        let (high, low) = fields.next()?.split_once('/')?;
        let high = u64::from_str_radix(high, 16).ok()?;
        let low = u64::from_str_radix(low, 16).ok()?;
        if high > u64::from(u32::MAX) || low > u64::from(u32::MAX) {
            return None;
        }
        entries.push(HistoryEntry {
            timeline,
            end_lsn: high << 32 | low,
        });
    }
    Some(entries)
}

/// What the reader needs to know about this major's WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalFormat {
    /// `XLOG_PAGE_MAGIC` of the major.
    pub page_magic: u16,
    /// `XLOG_BLCKSZ`.
    pub page_size: u64,
    /// `wal_segment_size`.
    pub segment_size: u64,
    /// `sizeof(CheckPoint)`.
    pub checkpoint_size: usize,
}

/// The file name of the WAL segment holding `lsn` on `timeline`.
pub fn segment_file_name(timeline: u32, lsn: u64, segment_size: u64) -> String {
    let segment = lsn / segment_size;
    let per_id = 0x1_0000_0000 / segment_size;
    format!(
        "{timeline:08X}{:08X}{:08X}",
        segment / per_id,
        segment % per_id
    )
}

/// Bytes of a record header (`XLogRecord`).
const RECORD_HEADER: usize = 24;
/// `XLR_BLOCK_ID_DATA_SHORT`: main data of fewer than 256 bytes follows.
const BLOCK_ID_DATA_SHORT: u8 = 255;
/// `RM_XLOG_ID`.
const RM_XLOG: u8 = 0;
/// `XLOG_CHECKPOINT_SHUTDOWN`.
const CHECKPOINT_SHUTDOWN: u8 = 0x00;
/// The resource manager's bits of `xl_info`.
const INFO_RMGR_MASK: u8 = 0xF0;
/// `XLP_LONG_HEADER`: the page starts a segment and has the long header.
const LONG_HEADER_FLAG: u16 = 0x0002;
/// `SizeOfXLogShortPHD` and `SizeOfXLogLongPHD`.
const SHORT_PAGE_HEADER: u64 = 24;
const LONG_PAGE_HEADER: u64 = 40;

fn max_align(n: u64) -> u64 {
    (n + 7) & !7
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
}

/// A page read for `page_lsn`, checked: `(header size, xlp_rem_len)`, or `None` if it is not
/// that page of a WAL written by this major.
fn page_header(page: &[u8], page_lsn: u64, format: &WalFormat) -> Option<(u64, u64)> {
    if page.len() as u64 != format.page_size
        || u16_at(page, 0)? != format.page_magic
        || u64_at(page, 8)? != page_lsn
    {
        return None;
    }
    let info = u16_at(page, 2)?;
    let size = if info & LONG_HEADER_FLAG != 0 {
        LONG_PAGE_HEADER
    } else {
        SHORT_PAGE_HEADER
    };
    Some((size, u64::from(u32_at(page, 16)?)))
}

/// Whether the last record of `timeline`, which ends at `end_lsn`, is that timeline's
/// shutdown checkpoint. `read_page` returns the page starting at an LSN (None: unreadable,
/// which makes the answer false).
pub fn ends_with_shutdown_checkpoint(
    end_lsn: u64,
    timeline: u32,
    format: &WalFormat,
    mut read_page: impl FnMut(u64) -> Option<Vec<u8>>,
) -> bool {
    let page_size = format.page_size;
    if end_lsn < page_size || format.checkpoint_size >= 256 {
        return false;
    }
    let record_len = RECORD_HEADER as u64 + 2 + format.checkpoint_size as u64;
    // The page holding the record's last byte (the previous one if the end is a boundary).
    let last_page = (end_lsn - 1) / page_size * page_size;
    let Some(page) = read_page(last_page) else {
        return false;
    };
    let Some((header, rem_len)) = page_header(&page, last_page, format) else {
        return false;
    };
    let (start, bytes) = if rem_len > 0 && last_page + header + max_align(rem_len) == end_lsn {
        // The end page starts with the record's remainder; the rest ends the page before.
        if rem_len >= record_len {
            return false;
        }
        let head = record_len - rem_len;
        let start = last_page - head;
        let previous_page = last_page - page_size;
        let Some(previous) = read_page(previous_page) else {
            return false;
        };
        let Some((previous_header, _)) = page_header(&previous, previous_page, format) else {
            return false;
        };
        if start < previous_page + previous_header {
            return false;
        }
        let mut bytes = previous[(start - previous_page) as usize..].to_vec();
        bytes.extend_from_slice(&page[header as usize..(header + rem_len) as usize]);
        (start, bytes)
    } else {
        let start = end_lsn - max_align(record_len);
        if start < last_page + header {
            return false;
        }
        let from = (start - last_page) as usize;
        (start, page[from..from + record_len as usize].to_vec())
    };
    is_shutdown_checkpoint(&bytes, start, timeline, record_len, format.checkpoint_size)
}

/// Whether `bytes` (a whole record, read at `start`) is a shutdown checkpoint of `timeline`.
fn is_shutdown_checkpoint(
    bytes: &[u8],
    start: u64,
    timeline: u32,
    record_len: u64,
    checkpoint_size: usize,
) -> bool {
    let check = || -> Option<bool> {
        let data = RECORD_HEADER + 2;
        Some(
            u64::from(u32_at(bytes, 0)?) == record_len
                && *bytes.get(17)? == RM_XLOG
                && bytes.get(16)? & INFO_RMGR_MASK == CHECKPOINT_SHUTDOWN
                && *bytes.get(RECORD_HEADER)? == BLOCK_ID_DATA_SHORT
                && usize::from(*bytes.get(RECORD_HEADER + 1)?) == checkpoint_size
                // CheckPoint.redo, then CheckPoint.ThisTimeLineID.
                && u64_at(bytes, data)? == start
                && u32_at(bytes, data + 8)? == timeline,
        )
    };
    check().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const FORMAT: WalFormat = WalFormat {
        page_magic: 0xD110,
        page_size: 8192,
        segment_size: 16 << 20,
        checkpoint_size: 88,
    };

    #[test]
    fn history_files_read_as_written_by_postgres() {
        let text =
            "1\t0/3000158\tno recovery target specified\n\n2\t1/A0000000\tat restore point \"x\"\n";
        assert_eq!(
            parse_history(text),
            Some(vec![
                HistoryEntry {
                    timeline: 1,
                    end_lsn: 0x3000158
                },
                HistoryEntry {
                    timeline: 2,
                    end_lsn: 0x1_A000_0000
                },
            ])
        );
        assert_eq!(parse_history("# comment\n"), Some(vec![]));
        assert_eq!(parse_history("1 nonsense"), None);
        assert_eq!(parse_history("x\t0/1\t"), None);
    }

    #[test]
    fn segment_names_follow_postgres() {
        assert_eq!(
            segment_file_name(1, 0x3000158, 16 << 20),
            "000000010000000000000003"
        );
        assert_eq!(
            segment_file_name(0x1A, 0x1_A000_0000, 16 << 20),
            "0000001A00000001000000A0"
        );
        assert_eq!(
            segment_file_name(2, 0x1_4000_0000, 1 << 30),
            "000000020000000100000001"
        );
    }

    /// A WAL written like PostgreSQL's: records laid out from `start`, page headers at
    /// every page boundary (long ones at segment boundaries) with the remaining length of
    /// a record that continues there.
    struct Wal {
        pages: HashMap<u64, Vec<u8>>,
        position: u64,
    }

    impl Wal {
        fn new(start: u64) -> Wal {
            let page_lsn = start / FORMAT.page_size * FORMAT.page_size;
            let mut wal = Wal {
                pages: HashMap::new(),
                position: max_align(start.max(page_lsn + Self::header_size(page_lsn))),
            };
            wal.page_at(page_lsn, 0);
            wal
        }

        fn page_at(&mut self, page_lsn: u64, rem_len: u32) {
            let mut page = vec![0u8; FORMAT.page_size as usize];
            page[0..2].copy_from_slice(&FORMAT.page_magic.to_le_bytes());
            let long = page_lsn.is_multiple_of(FORMAT.segment_size);
            page[2..4].copy_from_slice(&(if long { LONG_HEADER_FLAG } else { 0 }).to_le_bytes());
            page[8..16].copy_from_slice(&page_lsn.to_le_bytes());
            page[16..20].copy_from_slice(&rem_len.to_le_bytes());
            self.pages.insert(page_lsn, page);
        }

        fn header_size(page_lsn: u64) -> u64 {
            if page_lsn.is_multiple_of(FORMAT.segment_size) {
                LONG_PAGE_HEADER
            } else {
                SHORT_PAGE_HEADER
            }
        }

        /// Appends `record`; returns its start. The end is `self.position` afterwards.
        fn append(&mut self, record: &[u8]) -> u64 {
            let page_size = FORMAT.page_size;
            if self.position.is_multiple_of(page_size) {
                self.page_at(self.position, 0);
                self.position += Self::header_size(self.position);
            }
            let start = self.position;
            let mut left = record;
            loop {
                let page_lsn = self.position / page_size * page_size;
                let room = (page_lsn + page_size - self.position) as usize;
                let n = room.min(left.len());
                let at = (self.position - page_lsn) as usize;
                self.pages.get_mut(&page_lsn).unwrap()[at..at + n].copy_from_slice(&left[..n]);
                left = &left[n..];
                self.position += n as u64;
                if left.is_empty() {
                    break;
                }
                self.page_at(self.position, left.len() as u32);
                self.position += Self::header_size(self.position);
            }
            self.position = max_align(self.position);
            start
        }

        fn read(&self, page_lsn: u64) -> Option<Vec<u8>> {
            self.pages.get(&page_lsn).cloned()
        }
    }

    fn record(rmid: u8, info: u8, data: &[u8]) -> Vec<u8> {
        let mut r = vec![0u8; RECORD_HEADER];
        r[0..4].copy_from_slice(&((RECORD_HEADER + 2 + data.len()) as u32).to_le_bytes());
        r[16] = info;
        r[17] = rmid;
        r.push(BLOCK_ID_DATA_SHORT);
        r.push(data.len() as u8);
        r.extend_from_slice(data);
        r
    }

    /// A checkpoint record's main data: redo pointer, then timeline.
    fn checkpoint(redo: u64, timeline: u32) -> Vec<u8> {
        let mut data = vec![0u8; FORMAT.checkpoint_size];
        data[0..8].copy_from_slice(&redo.to_le_bytes());
        data[8..12].copy_from_slice(&timeline.to_le_bytes());
        data
    }

    /// Writes filler records of `filler` bytes from `start`, then a shutdown checkpoint of
    /// `timeline` (pointing at itself unless `redo` says otherwise); the WAL and its end.
    fn ending_with_checkpoint(
        start: u64,
        filler: usize,
        timeline: u32,
        redo: Option<u64>,
    ) -> (Wal, u64) {
        let mut wal = Wal::new(start);
        wal.append(&record(10, 0, &vec![7u8; filler.min(200)]));
        let at = max_align(wal.position);
        let own = if at.is_multiple_of(FORMAT.page_size) {
            at + Wal::header_size(at)
        } else {
            at
        };
        wal.append(&record(
            RM_XLOG,
            CHECKPOINT_SHUTDOWN,
            &checkpoint(redo.unwrap_or(own), timeline),
        ));
        let end = wal.position;
        (wal, end)
    }

    #[test]
    fn a_shutdown_checkpoint_at_the_end_is_found() {
        let (wal, end) = ending_with_checkpoint(0x300_0028, 100, 1, None);
        assert!(ends_with_shutdown_checkpoint(end, 1, &FORMAT, |p| wal.read(p)));
        // Another timeline's checkpoint, or an end elsewhere, is not this one.
        assert!(!ends_with_shutdown_checkpoint(end, 2, &FORMAT, |p| wal.read(p)));
        assert!(!ends_with_shutdown_checkpoint(end + 8, 1, &FORMAT, |p| wal.read(p)));
        assert!(!ends_with_shutdown_checkpoint(end - 8, 1, &FORMAT, |p| wal.read(p)));
        // Pages that cannot be read, or were written for another address, are no evidence.
        assert!(!ends_with_shutdown_checkpoint(end, 1, &FORMAT, |_| None));
        let shifted = |p: u64| {
            wal.read(p).map(|mut page| {
                page[8..16].copy_from_slice(&(p + 8192).to_le_bytes());
                page
            })
        };
        assert!(!ends_with_shutdown_checkpoint(end, 1, &FORMAT, shifted));
    }

    #[test]
    fn an_online_checkpoint_or_another_record_at_the_end_is_not_clean() {
        let mut wal = Wal::new(0x300_0028);
        let at = wal.position;
        wal.append(&record(RM_XLOG, 0x10, &checkpoint(at, 1))); // XLOG_CHECKPOINT_ONLINE
        assert!(!ends_with_shutdown_checkpoint(
            wal.position,
            1,
            &FORMAT,
            |p| wal.read(p)
        ));
        // A shutdown checkpoint whose redo pointer is elsewhere is not one written at the end.
        let (wal, end) = ending_with_checkpoint(0x300_0028, 100, 1, Some(0x300_0028));
        assert!(!ends_with_shutdown_checkpoint(end, 1, &FORMAT, |p| wal.read(p)));
        // A heap record after the checkpoint: the old primary wrote on after it.
        let (mut wal, _) = ending_with_checkpoint(0x300_0028, 100, 1, None);
        wal.append(&record(10, 0, &[1u8; 130 - 26]));
        assert!(!ends_with_shutdown_checkpoint(
            wal.position,
            1,
            &FORMAT,
            |p| wal.read(p)
        ));
    }

    proptest! {
        /// Wherever the checkpoint falls (within a page, across a page or segment boundary,
        /// ending exactly at one), it is found; shifted by a record, it is not.
        #[test]
        fn found_wherever_it_falls(
            offset in 0u64..(3 * 8192),
            filler in 30usize..200,
            segment_start in proptest::bool::ANY,
        ) {
            let base = if segment_start { 5 * FORMAT.segment_size - 8192 } else { 0x300_0000 };
            let start = max_align(base + 40 + offset);
            let (wal, end) = ending_with_checkpoint(start, filler, 3, None);
            prop_assert!(ends_with_shutdown_checkpoint(end, 3, &FORMAT, |p| wal.read(p)));
            let mut more = Wal { pages: wal.pages.clone(), position: wal.position };
            more.append(&record(10, 0, &vec![1u8; filler]));
            prop_assert!(!ends_with_shutdown_checkpoint(more.position, 3, &FORMAT, |p| more.read(p)));
        }
    }
}
