//! What a promoted node knows of the timelines it descends from: the history file of its
//! timeline and the last WAL pages of each earlier one, read as plain files from `pg_wal`
//! (nothing here can raise an error: whatever cannot be read counts as an unclean end).
//! The rules are `snowflake_core::walend`; `lease` uses the answer to decide where a
//! promoted node resumes (`durable::plan_resume`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use pgrx::prelude::*;

use crate::server;
use snowflake_core::durable::Ancestry;
use snowflake_core::walend::{self, HistoryEntry, WalFormat};

/// This major's WAL format, as the reader needs it.
fn wal_format() -> WalFormat {
    WalFormat {
        page_magic: pg_sys::XLOG_PAGE_MAGIC as u16,
        page_size: u64::from(pg_sys::XLOG_BLCKSZ),
        // SAFETY: a plain read of a setting fixed at server start.
        segment_size: unsafe { pg_sys::wal_segment_size } as u64,
        checkpoint_size: size_of::<pg_sys::CheckPoint>(),
    }
}

/// The earlier timelines of `timeline`, oldest first (empty on timeline 1, or when its
/// history file cannot be read).
fn history(dir: &Path, timeline: u32) -> Vec<HistoryEntry> {
    if timeline <= 1 {
        return Vec::new();
    }
    std::fs::read_to_string(dir.join(format!("pg_wal/{timeline:08X}.history")))
        .ok()
        .and_then(|text| walend::parse_history(&text))
        .unwrap_or_default()
}

/// The timelines between the newest lease's (`lease_timeline`; None without a state file)
/// and `timeline`, and whether each ended with a shutdown checkpoint that this node has.
pub(crate) fn ancestry(lease_timeline: Option<u32>, timeline: u32) -> Ancestry {
    let dir = server::data_dir();
    let entries = history(&dir, timeline);
    let first = match lease_timeline {
        Some(t) => entries.iter().position(|e| e.timeline == t),
        None => Some(0),
    };
    let Some(first) = first.filter(|i| *i < entries.len()) else {
        // The lease's timeline is not an ancestor (restored from another branch), or there
        // is no history: nothing is known of how it ended.
        return Ancestry {
            skipped: entries.len() as u32,
            clean: false,
        };
    };
    let format = wal_format();
    let ended = &entries[first..];
    let clean = ended.iter().enumerate().all(|(i, entry)| {
        // The timeline that followed this one holds a copy of its last segment.
        let next = ended.get(i + 1).map_or(timeline, |e| e.timeline);
        walend::ends_with_shutdown_checkpoint(entry.end_lsn, entry.timeline, &format, |page| {
            read_page(&dir, &format, page, &[next, entry.timeline])
        })
    });
    Ancestry {
        skipped: (ended.len() - 1) as u32,
        clean,
    }
}

/// The WAL page at `page_lsn`, from the first of `timelines`' segment files (or the
/// `.partial` one a promotion leaves) that has it.
fn read_page(dir: &Path, format: &WalFormat, page_lsn: u64, timelines: &[u32]) -> Option<Vec<u8>> {
    let offset = page_lsn % format.segment_size;
    timelines.iter().find_map(|&t| {
        let name = walend::segment_file_name(t, page_lsn, format.segment_size);
        [name.clone(), format!("{name}.partial")]
            .iter()
            .find_map(|name| {
                let file = File::open(dir.join("pg_wal").join(name)).ok()?;
                let mut page = vec![0u8; format.page_size as usize];
                file.read_exact_at(&mut page, offset).ok()?;
                // A page of a recycled segment, or not yet written, has another address.
                (u64::from_le_bytes(page[8..16].try_into().ok()?) == page_lsn).then_some(page)
            })
    })
}
