//! The timeline history a promoted node keeps (`pg_wal/<timeline>.history`): which
//! timelines came before its own, and where each ended. A node promoted with leases of a
//! timeline several promotions back skipped primaries whose leases it never saw; each adds
//! to its resume point (`durable::plan_resume`).
//!
//! Why not more: a clean shutdown ends its timeline with a shutdown checkpoint, but so does
//! the end of a crash recovery, after which the restarted primary writes on. The last
//! record a standby received cannot tell the two apart, so a promoted node never trusts it.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
