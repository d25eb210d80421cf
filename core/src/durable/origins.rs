//! The origins file (`snowflake.origins`): the clusters whose IDs this server took over
//! (pg_upgrade, dump and restore), and where IDs resume after such a takeover.

use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;

use super::atomic::{read_json, write_json};
use super::state::FORMAT_VERSION;

/// File name, relative to the data directory, of the clusters whose IDs this one took over.
pub const ORIGINS_FILE: &str = "snowflake.origins";

/// The clusters whose IDs this server has taken over: a database that another cluster's
/// generator served arrived here through pg_upgrade or a dump and restore, and this server
/// placed its IDs past every lease that cluster could have written ([`adoption_floor_ms`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origins {
    /// File format version.
    pub format: u32,
    /// One entry per cluster taken over.
    pub adopted: Vec<AdoptedOrigin>,
}

/// One cluster whose IDs this server took over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdoptedOrigin {
    /// Its `pg_control_system().system_identifier`.
    pub system_identifier: u64,
    /// This server's clock when it took over (Unix ms).
    pub adopted_unix_ms: i64,
    /// The resume point it placed (Unix ms).
    pub floor_unix_ms: i64,
}

impl Origins {
    /// Whether IDs of the cluster `system_identifier` are already covered here.
    pub fn covers(&self, system_identifier: u64) -> bool {
        self.adopted
            .iter()
            .any(|o| o.system_identifier == system_identifier)
    }

    /// The distinct identifiers of `system_identifiers` not covered yet, in ascending order.
    /// Linear in both lists: a table of many rows must not hold a lock for long.
    pub fn not_covered(&self, system_identifiers: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let covered: std::collections::HashSet<u64> =
            self.adopted.iter().map(|o| o.system_identifier).collect();
        let mut out: Vec<u64> = system_identifiers
            .into_iter()
            .filter(|s| !covered.contains(s))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// These origins and `adopted`.
    pub fn with(&self, adopted: AdoptedOrigin) -> Origins {
        self.with_all([adopted])
    }

    /// These origins and every one of `adopted`.
    pub fn with_all(&self, adopted: impl IntoIterator<Item = AdoptedOrigin>) -> Origins {
        let mut next = self.clone();
        next.format = FORMAT_VERSION;
        next.adopted.extend(adopted);
        next
    }
}

/// Reads the origins file; empty when it does not exist.
pub fn read_origins(data_dir: &Path) -> io::Result<Origins> {
    Ok(read_json(data_dir, ORIGINS_FILE, "origins file")?.unwrap_or_default())
}

/// Writes the origins file atomically and durably.
pub fn write_origins(data_dir: &Path, origins: &Origins) -> io::Result<()> {
    write_json(data_dir, ORIGINS_FILE, origins)
}

/// Where IDs resume when this server takes over a database whose IDs another cluster
/// issued, and whose lease (in that cluster's data directory) it cannot see: past
/// `reach_cap_ms` (this server's, covering IDs borrowed ahead of the clock) from now. The
/// other cluster's clock read at most `now` when it stopped: pg_upgrade runs on the same
/// machine after the old server stopped; a restore elsewhere relies on synchronised clocks.
pub fn adoption_floor_ms(now_unix_ms: i64, reach_cap_ms: i64) -> i64 {
    now_unix_ms.saturating_add(reach_cap_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::atomic::temp_dir;
    use crate::durable::reach::reach_cap_ms;
    use std::fs;

    #[test]
    fn origins_start_empty_and_accumulate() {
        let dir = temp_dir("origins");
        let none = read_origins(&dir).unwrap();
        assert!(!none.covers(7));
        let first = AdoptedOrigin {
            system_identifier: u64::MAX - 1,
            adopted_unix_ms: 1_700_000_000_000,
            floor_unix_ms: 1_700_000_003_000,
        };
        let one = none.with(first);
        write_origins(&dir, &one).unwrap();
        let read_back = read_origins(&dir).unwrap();
        assert_eq!(read_back, one);
        // System identifiers use all 64 bits; JSON keeps them exact.
        assert!(read_back.covers(u64::MAX - 1));
        assert!(!read_back.covers(7));
        let two = read_back.with(AdoptedOrigin {
            system_identifier: 7,
            ..first
        });
        write_origins(&dir, &two).unwrap();
        assert!(read_origins(&dir).unwrap().covers(7));
        assert!(read_origins(&dir).unwrap().covers(u64::MAX - 1));
        fs::write(dir.join(ORIGINS_FILE), b"[").unwrap();
        assert_eq!(
            read_origins(&dir).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn uncovered_origins_are_distinct_and_sorted() {
        let origins = Origins::default().with(AdoptedOrigin {
            system_identifier: 5,
            adopted_unix_ms: 1,
            floor_unix_ms: 2,
        });
        assert_eq!(origins.not_covered([9, 5, 7, 9, 5]), vec![7, 9]);
        let many = origins.not_covered((0..200_000u64).rev());
        assert_eq!(many.len(), 199_999);
        let all = origins.with_all(many.iter().map(|&system_identifier| AdoptedOrigin {
            system_identifier,
            adopted_unix_ms: 1,
            floor_unix_ms: 2,
        }));
        assert!(all.not_covered(0..200_000u64).is_empty());
    }

    #[test]
    fn adoption_floor_covers_ids_borrowed_by_the_old_cluster() {
        // The old cluster stopped at or before `now` on the same clock; its leases reached
        // at most its reach cap past its clock, borrowing included.
        let now = 1_700_000_000_000;
        let cap = reach_cap_ms(1_000, 20_000);
        for stopped_at in [now - 60_000, now - 1, now] {
            let furthest_old_lease = stopped_at + cap;
            assert!(adoption_floor_ms(now, cap) >= furthest_old_lease);
        }
        assert_eq!(adoption_floor_ms(i64::MAX, cap), i64::MAX);
    }
}
