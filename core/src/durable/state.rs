//! The state file (`snowflake.state`): the ID layout recorded the first time an ID is
//! generated, and the lease, the end (exclusive, Unix ms) of the time range IDs may have
//! been issued in.
//!
//! The decode functions are IMMUTABLE, so the layout is fixed for the cluster's lifetime:
//! generation and decoding both refuse to run if the configured layout later differs. Before
//! an ID past the lease is issued, the lease is extended and written here (fsync'd) and then
//! WAL-logged (see `wal.rs` in the extension). After any restart the generator starts at the
//! lease end, so it never reissues an ID even if the clock went back.

use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

use super::atomic::{read_json, write_json};
use super::wal_record::LeaseRecord;
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
    /// The writer's clock when the lease was written (Unix ms; 0: unknown, files of 0.2).
    #[serde(default)]
    pub written_unix_ms: i64,
    /// The timeline the lease was written on (0: unknown).
    #[serde(default)]
    pub timeline: u32,
    /// The furthest ahead of its clock that the writer may place a lease (ms).
    #[serde(default)]
    pub reach_cap_ms: i64,
    /// Written by WAL replay on a standby: what it saw of the primary's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerClock>,
}

/// Largest clock lead of a primary a standby may have recorded (±100 years).
const MAX_RECORDED_LEAD_MS: i64 = 100 * 365 * 86_400_000;
/// Largest lease reach a server can record: any setting allows 3 h (drift, window and
/// widening of 1 h each), with room to spare, plus the lead of a resume point after a
/// promotion (the old primary's clock lead and reach). Beyond that is damage.
const MAX_RECORDED_REACH_MS: i64 = 2 * (24 * 3_600_000) + MAX_RECORDED_LEAD_MS;

impl StateFile {
    /// Every field within what a server can have written: a layout that fits 63 bits with an
    /// epoch `snowflake.epoch` accepts, a lease inside that layout's time range, and clock
    /// readings that are dates. A file that fails this was damaged or edited, and nothing in
    /// it may be trusted (a lease near `i64::MAX` would otherwise read as 1969).
    pub fn check(&self) -> Result<(), String> {
        let layout = &self.layout;
        let bits = [
            ("timestamp_bits", layout.timestamp_bits),
            ("datacenter_bits", layout.datacenter_bits),
            ("worker_bits", layout.worker_bits),
            ("sequence_bits", layout.sequence_bits),
        ];
        let total: u64 = bits.iter().map(|(_, b)| u64::from(*b)).sum();
        if total > 63 || layout.timestamp_bits == 0 {
            let listed: Vec<String> = bits.iter().map(|(n, b)| format!("{n} = {b}")).collect();
            return Err(format!("{} is not a layout of 63 bits", listed.join(", ")));
        }
        const DATES: &str = "a time between 1970 and 9999";
        let dates = 0..=Epoch::MAX_UNIX_MS;
        within("layout.epoch_ms", layout.epoch_ms, &dates, DATES)?;
        // 2^timestamp_bits ms past the epoch; saturating, as 63 bits of timestamp fit no i64.
        let span = 1i64
            .checked_shl(layout.timestamp_bits)
            .filter(|s| *s > 0)
            .unwrap_or(i64::MAX);
        let range_end = layout.epoch_ms.saturating_add(span);
        let lease = self.lease_end_unix_ms;
        let lease_range = layout.epoch_ms..=range_end.saturating_add(MAX_RECORDED_REACH_MS);
        if lease != 0 && !lease_range.contains(&lease) {
            return Err(format!(
                "lease_end_unix_ms = {lease} is outside the layout's time range ({} to {range_end})",
                layout.epoch_ms
            ));
        }
        within("written_unix_ms", self.written_unix_ms, &dates, DATES)?;
        let reaches = 0..=MAX_RECORDED_REACH_MS;
        let reach = format!("a lease reach (0 to {MAX_RECORDED_REACH_MS} ms)");
        within("reach_cap_ms", self.reach_cap_ms, &reaches, &reach)?;
        if let Some(peer) = self.peer {
            within("peer.reach_cap_ms", peer.reach_cap_ms, &reaches, &reach)?;
            within(
                "peer.observed_unix_ms",
                peer.observed_unix_ms,
                &dates,
                DATES,
            )?;
            let leads = -MAX_RECORDED_LEAD_MS..=MAX_RECORDED_LEAD_MS;
            within("peer.lead_ms", peer.lead_ms, &leads, "a clock difference")?;
        }
        Ok(())
    }
}

/// `Ok` if `value` of the field `name` lies in `range`, else why not (`what` it should be).
fn within(
    name: &str,
    value: i64,
    range: &std::ops::RangeInclusive<i64>,
    what: &str,
) -> Result<(), String> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(format!("{name} = {value} is not {what}"))
    }
}

/// What a standby saw of its primary's clock, as of the last lease it replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerClock {
    /// How far the primary's clock ran ahead of this server's (ms; negative: behind). A lower
    /// bound: it is the send time of a message minus its receipt time, short by the transit.
    pub lead_ms: i64,
    /// This server's clock at that observation (Unix ms).
    pub observed_unix_ms: i64,
    /// The primary's `reach_cap_ms` as of its last lease record.
    pub reach_cap_ms: i64,
}

impl PeerClock {
    /// The lead estimate to keep after a new `sample`: the larger of the sample and the old
    /// estimate decayed by 1% of the time since it was made. A single sample is short by the
    /// time its message waited before it was read; the decaying maximum keeps the best
    /// recent sample instead of the latest, yet forgets a clock the primary has since corrected.
    pub fn merged(old: Option<PeerClock>, sample: PeerClock) -> PeerClock {
        match old {
            Some(old) => {
                let elapsed = (sample.observed_unix_ms - old.observed_unix_ms).max(0);
                let decayed = old.lead_ms.saturating_sub(elapsed / 100);
                PeerClock {
                    lead_ms: decayed.max(sample.lead_ms),
                    ..sample
                }
            }
            None => sample,
        }
    }
}

impl StateFile {
    /// The state a server writes for its own new lease.
    pub fn own(record: &LeaseRecord) -> StateFile {
        StateFile {
            format: FORMAT_VERSION,
            layout: record.layout,
            lease_end_unix_ms: record.lease_end_unix_ms,
            written_unix_ms: record.written_unix_ms,
            timeline: record.timeline,
            reach_cap_ms: record.reach_cap_ms,
            peer: None,
        }
    }

    /// The state to write after replaying `record` over `existing`, or `None` if the file
    /// already covers it. The lease never moves backwards for the same layout. `peer` is the
    /// standby's observation of the primary's clock (None in crash recovery, where the
    /// records are this server's own).
    pub fn merged(
        existing: Option<&StateFile>,
        record: &LeaseRecord,
        peer: Option<PeerClock>,
    ) -> Option<StateFile> {
        if let Some(s) = existing {
            if s.layout == record.layout && s.lease_end_unix_ms >= record.lease_end_unix_ms {
                return None;
            }
        }
        let old_peer = existing.and_then(|s| s.peer);
        Some(StateFile {
            peer: peer.map(|p| PeerClock::merged(old_peer, p)).or(old_peer),
            ..StateFile::own(record)
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
    let Some(state) = read_json::<StateFile>(data_dir, STATE_FILE, "state file")? else {
        return Ok(None);
    };
    if let Err(problem) = state.check() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "\"{}\" holds an impossible value: {problem}",
                path.display()
            ),
        ));
    }
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
    write_json(data_dir, STATE_FILE, state)
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

/// For tests: a standby's observation of a primary's clock, with the reach cap of
/// `wal_record::record`.
#[cfg(test)]
pub(crate) fn peer(lead_ms: i64, observed_unix_ms: i64) -> PeerClock {
    PeerClock {
        lead_ms,
        observed_unix_ms,
        reach_cap_ms: 2_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::atomic::temp_dir;
    use crate::durable::wal_record::record;
    use std::fs;

    #[test]
    fn write_then_read() {
        let dir = temp_dir("rw");
        assert_eq!(read(&dir).unwrap(), None);
        let state = StateFile::own(&record(1_700_000_000_000));
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
    fn impossible_state_files_are_refused_on_read() {
        let good = StateFile::own(&record(1_795_324_179_240));
        assert_eq!(good.check(), Ok(()));
        let fresh = StateFile {
            lease_end_unix_ms: 0,
            written_unix_ms: 0,
            reach_cap_ms: 0,
            ..good.clone()
        };
        assert_eq!(fresh.check(), Ok(()));
        let twitter = LayoutRecord::current(Epoch::TWITTER);
        let damaged = [
            StateFile {
                lease_end_unix_ms: i64::MAX - 5,
                ..good.clone()
            },
            StateFile {
                lease_end_unix_ms: -1,
                ..good.clone()
            },
            StateFile {
                lease_end_unix_ms: twitter.epoch_ms - 1,
                ..good.clone()
            },
            StateFile {
                written_unix_ms: i64::MIN,
                ..good.clone()
            },
            StateFile {
                reach_cap_ms: -1,
                ..good.clone()
            },
            StateFile {
                layout: LayoutRecord {
                    sequence_bits: 13,
                    ..twitter
                },
                ..good.clone()
            },
            StateFile {
                layout: LayoutRecord {
                    timestamp_bits: u32::MAX,
                    ..twitter
                },
                ..good.clone()
            },
            StateFile {
                layout: LayoutRecord {
                    epoch_ms: -1,
                    ..twitter
                },
                ..good.clone()
            },
            StateFile {
                peer: Some(PeerClock {
                    lead_ms: i64::MIN,
                    observed_unix_ms: 1_795_324_179_240,
                    reach_cap_ms: 2_000,
                }),
                ..good.clone()
            },
        ];
        let dir = temp_dir("impossible");
        for state in damaged {
            assert!(state.check().is_err(), "{state:?}");
            fs::write(dir.join(STATE_FILE), serde_json::to_vec(&state).unwrap()).unwrap();
            let err = read(&dir).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            assert!(
                err.to_string().contains("holds an impossible value"),
                "{err}"
            );
            assert!(err.to_string().contains(STATE_FILE), "{err}");
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn replay_never_moves_the_lease_back() {
        let layout = LayoutRecord::current(Epoch::TWITTER);
        let rec = record;
        let fresh = StateFile::merged(None, &rec(5_000), None).unwrap();
        assert_eq!(fresh.lease_end_unix_ms, 5_000);
        assert_eq!(StateFile::merged(Some(&fresh), &rec(4_000), None), None);
        assert_eq!(StateFile::merged(Some(&fresh), &rec(5_000), None), None);
        let newer = StateFile::merged(Some(&fresh), &rec(6_000), None).unwrap();
        assert_eq!(newer.lease_end_unix_ms, 6_000);
        assert_eq!(newer.written_unix_ms, 5_000);
        assert_eq!(newer.timeline, 1);
        // A record of another layout (the primary's) replaces the file's layout.
        let other = LeaseRecord {
            lease_end_unix_ms: 1,
            layout: LayoutRecord {
                epoch_ms: 0,
                ..layout
            },
            ..rec(1)
        };
        assert_eq!(
            StateFile::merged(Some(&fresh), &other, None)
                .unwrap()
                .layout
                .epoch_ms,
            0
        );
    }

    #[test]
    fn replay_keeps_the_peer_clock_and_a_decaying_maximum_of_its_lead() {
        let first = StateFile::merged(None, &record(5_000), Some(peer(4_000, 10_000))).unwrap();
        assert_eq!(first.peer, Some(peer(4_000, 10_000)));
        // A later, lower sample (a message that waited to be read) does not lower it at once.
        let second =
            StateFile::merged(Some(&first), &record(6_000), Some(peer(3_000, 20_000))).unwrap();
        assert_eq!(second.peer.unwrap().lead_ms, 3_900);
        assert_eq!(second.peer.unwrap().observed_unix_ms, 20_000);
        // Long after, a corrected clock wins.
        let later =
            StateFile::merged(Some(&second), &record(7_000), Some(peer(10, 1_000_000))).unwrap();
        assert_eq!(later.peer.unwrap().lead_ms, 10);
        // Crash recovery (no observation) keeps what the standby saw.
        let crash = StateFile::merged(Some(&later), &record(8_000), None).unwrap();
        assert_eq!(crash.peer, later.peer);
        // The primary's own write drops it.
        assert_eq!(StateFile::own(&record(9_000)).peer, None);
    }

    #[test]
    fn layout_comparison() {
        let twitter = LayoutRecord::current(Epoch::TWITTER);
        let discord = LayoutRecord::current(Epoch::from_unix_ms(1_420_070_400_000).unwrap());
        let state = StateFile::own(&record(0));
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
