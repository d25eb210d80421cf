//! What a promoted node knows of the timelines it descends from: the history file of its
//! timeline, read as a plain file from `pg_wal` (nothing here can raise an error: a file
//! that cannot be read counts every earlier timeline as skipped). The rules are in
//! `snowflake_core::history` and `durable::plan_resume`.

use crate::server;
use snowflake_core::durable::Ancestry;
use snowflake_core::history::{self, HistoryEntry};

/// The earlier timelines of `timeline`, oldest first (empty on timeline 1, or when its
/// history file cannot be read).
fn earlier_timelines(timeline: u32) -> Vec<HistoryEntry> {
    if timeline <= 1 {
        return Vec::new();
    }
    let path = server::data_dir().join(format!("pg_wal/{timeline:08X}.history"));
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| history::parse_history(&text))
        .unwrap_or_default()
}

/// The timelines strictly between the newest lease's (`lease_timeline`; None without a
/// state file) and `timeline`: primaries that may have issued IDs under leases this node
/// never received. When the lease's timeline is not an ancestor (or the history cannot be
/// read), every timeline below this one counts.
pub(crate) fn ancestry(lease_timeline: Option<u32>, timeline: u32) -> Ancestry {
    let entries = earlier_timelines(timeline);
    let after_lease = lease_timeline
        .and_then(|t| entries.iter().position(|e| e.timeline == t))
        .map(|i| entries.len() - i - 1);
    let skipped = match (lease_timeline, after_lease) {
        (Some(_), Some(n)) => n,
        // No lease: the old primary's own timeline is the one the floor covers.
        (None, _) if !entries.is_empty() => entries.len() - 1,
        _ => timeline
            .saturating_sub(lease_timeline.unwrap_or(1))
            .saturating_sub(1) as usize,
    };
    Ancestry {
        skipped: skipped as u32,
    }
}
