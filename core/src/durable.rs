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
//!
//! Failover: every lease carries the writer's clock, timeline and the furthest a lease of
//! that server may reach. A standby records, with each lease it replays, how far the
//! primary's clock runs ahead of its own ([`PeerClock`]). When a node generates for the first
//! time on a timeline other than the one its newest lease was written on (it was promoted),
//! [`plan_resume`] places the resume point past every lease the old primary could have
//! written and the standby never received.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::generator::Resumed;
use crate::layout::{Epoch, UnixMs};
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

/// How far past the clock a new lease reaches (ms): the window, widened by twice the
/// duration of the previous renewal (at most [`max_widening_ms`]). A renewal slower than the
/// window would otherwise be stale on arrival, again and again; widened, the next one still
/// leaves room for IDs when it completes.
pub fn lease_reach_ms(window_ms: i64, last_renewal_ms: i64) -> i64 {
    window_ms
        + last_renewal_ms
            .saturating_mul(2)
            .clamp(0, max_widening_ms(window_ms))
}

/// The largest widening: the window itself, and at least 100 ms so that tiny windows still
/// outlast a write to storage and a synchronous standby's round trip.
pub fn max_widening_ms(window_ms: i64) -> i64 {
    window_ms.max(100)
}

/// The furthest a lease written with this window can reach past the writer's clock: IDs
/// borrowed up to `max_drift_ms` ahead of it, then the window and its largest widening.
pub fn reach_cap_ms(window_ms: i64, max_drift_ms: i64) -> i64 {
    max_drift_ms + window_ms + max_widening_ms(window_ms)
}

/// Why IDs resume where [`plan_resume`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeKind {
    /// Nothing recorded: a new cluster.
    Fresh,
    /// A restart on the timeline of the newest lease, with the clock at or after the time
    /// that lease was written and at most one lease reach behind its end: waiting for it is
    /// expected.
    Restart,
    /// A restart with the clock further behind the resume point than one lease reaches: the
    /// clock was set back while the server was down (`step_back_ms` > 0: it is earlier than
    /// when the newest lease was written), or IDs were borrowed ahead of the clock.
    ClockBehind {
        /// How far the clock is behind the time the newest lease was written (ms; 0: not).
        step_back_ms: u64,
        /// When the newest lease was written, on its writer's clock (Unix ms; 0: unknown).
        written_unix_ms: i64,
        /// How far past `written_unix_ms` that lease may lawfully reach (ms).
        reach_ms: i64,
    },
    /// Promoted (or restored to a new timeline) without knowing the old primary's last
    /// WAL: it may have written leases this node never received. The resume point covers
    /// them.
    Failover {
        /// The old primary's clock lead used (ms), 0 when unknown.
        lead_ms: i64,
        /// The safety margin added (ms).
        margin_ms: i64,
        /// Timelines between the newest lease's and this node's: primaries that may have
        /// issued IDs this node has no lease of (each adds one more reach, lead and margin).
        skipped: u32,
    },
}

/// Where a server resumes issuing IDs, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumePlan {
    /// Every new ID has a time at or after this (Unix ms).
    pub floor_unix_ms: i64,
    /// Why.
    pub kind: ResumeKind,
}

/// What a node just promoted knows of the timelines it descends from, read from its
/// timeline history (see [`crate::history`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ancestry {
    /// Timelines strictly between the newest lease's and this node's: primaries whose
    /// leases this node may never have seen.
    pub skipped: u32,
}

/// Margin for a failover floor (ms): 100 ms for the transit of the last message the standby
/// saw (its estimate of the lead is short by it), plus 500 ppm (the largest frequency
/// correction the kernel applies to a disciplined clock) of the time since that
/// observation, for the clocks' drift apart since then.
pub fn failover_margin_ms(since_observation_ms: i64) -> i64 {
    100 + since_observation_ms.max(0) / 2_000
}

impl ResumePlan {
    /// What the generator meets before its first ID after resuming so (`epoch` converts the
    /// lease writer's time to the generator's milliseconds; `now_unix_ms` is the clock the
    /// plan was made with).
    pub fn resumed(&self, epoch: Epoch, now_unix_ms: i64) -> Resumed {
        match self.kind {
            ResumeKind::Fresh | ResumeKind::Restart => Resumed::Restart,
            ResumeKind::ClockBehind {
                step_back_ms,
                written_unix_ms,
                reach_ms,
            } => Resumed::ClockBehind {
                step_back_ms,
                written: epoch.timestamp_or_zero(UnixMs(written_unix_ms)).0,
                reach_ms: reach_ms.max(0) as u64,
            },
            ResumeKind::Failover { .. } => Resumed::Promoted {
                lead_allowance_ms: self.lead_ms(now_unix_ms),
            },
        }
    }

    /// How far the resume point is ahead of the clock `now_unix_ms` (ms, 0 if not).
    pub fn lead_ms(&self, now_unix_ms: i64) -> u64 {
        (self.floor_unix_ms - now_unix_ms).max(0) as u64
    }
}

/// Where to resume, from the recorded state, the timeline the server now writes on, what it
/// knows of the timelines in between ([`Ancestry`]), its clock, the freshest observation of
/// the old primary's clock that shared memory still holds (the WAL receiver's last message;
/// lost at a restart), and the reach cap of the current settings
/// (`reach_cap_ms(lease_window, max_clock_drift)`).
///
/// A restart is lawful when the clock is not earlier than when the newest lease was
/// written and the resume point is within the larger of that reach and the one the lease's
/// writer recorded: the lease may reach that far past a sane clock (IDs borrowed up to
/// `max_clock_drift` ahead, the window, its widening after slow renewals), so waiting for
/// it is expected, never an error.
///
/// A node on another timeline than its newest lease's was promoted (or restored): the old
/// primary may have written leases this node never received (its last WAL cannot tell a
/// clean shutdown from a crash restart's end-of-recovery checkpoint). The floor is `now + max(lead, 0) + reach_cap + margin`: the old primary,
/// which died before this promotion, read at most `now + lead` on its clock, and never wrote
/// a lease further than `reach_cap` ahead of its clock (a lease written while it ran ahead
/// after its own promotion records that lead in its reach); this node itself (if it was a
/// primary before, rewound since) read at most `now` on its own. Each skipped timeline adds
/// one more `lead + reach_cap + margin`: its primary resumed at most that far past the one
/// before. With no state file, a node on a timeline after the first one may descend from a
/// primary that issued IDs it never received a lease of: the same floor, with the current
/// settings' reach.
pub fn plan_resume(
    state: Option<&StateFile>,
    timeline: u32,
    ancestry: Ancestry,
    now_unix_ms: i64,
    live_peer: Option<PeerClock>,
    restart_reach_ms: i64,
) -> ResumePlan {
    let promoted = match state {
        Some(s) => s.timeline != 0 && timeline != 0 && s.timeline != timeline,
        None => timeline > 1,
    };
    let lease = state.map_or(0, |s| s.lease_end_unix_ms);
    if promoted {
        let old_peer = state.and_then(|s| s.peer);
        let peer = match (old_peer, live_peer) {
            (Some(old), Some(new)) => Some(PeerClock::merged(Some(old), new)),
            (old, new) => new.or(old),
        };
        // Never less than this server's own clock: a node rewound (pg_rewind) from a former
        // primary may itself have written leases on the timeline it left.
        let lead_ms = peer.map_or(0, |p| p.lead_ms).max(0);
        let recorded_reach = state.map_or(restart_reach_ms, |s| s.reach_cap_ms);
        let reach = peer.map_or(recorded_reach, |p| p.reach_cap_ms.max(recorded_reach));
        let since = peer.map_or(0, |p| now_unix_ms - p.observed_unix_ms);
        let margin_ms = failover_margin_ms(since);
        let skipped = ancestry.skipped;
        let per_skipped = lead_ms
            .saturating_add(reach.max(restart_reach_ms))
            .saturating_add(margin_ms);
        let floor = now_unix_ms
            .saturating_add(lead_ms)
            .saturating_add(reach)
            .saturating_add(margin_ms)
            .saturating_add(per_skipped.saturating_mul(i64::from(skipped)));
        return ResumePlan {
            floor_unix_ms: floor.max(lease),
            kind: ResumeKind::Failover {
                lead_ms,
                margin_ms,
                skipped,
            },
        };
    }
    let Some(state) = state else {
        return ResumePlan {
            floor_unix_ms: 0,
            kind: ResumeKind::Fresh,
        };
    };
    // A restart with a sane clock resumes at most one reach past it, as the writer's
    // settings or the current ones allow; further is a clock fault for the policy to judge.
    let reach_ms = restart_reach_ms.max(state.reach_cap_ms);
    let kind = if now_unix_ms < state.written_unix_ms || lease - now_unix_ms > reach_ms {
        ResumeKind::ClockBehind {
            step_back_ms: (state.written_unix_ms - now_unix_ms).max(0) as u64,
            written_unix_ms: state.written_unix_ms,
            reach_ms,
        }
    } else {
        ResumeKind::Restart
    };
    ResumePlan {
        floor_unix_ms: lease,
        kind,
    }
}

/// The payload of the WAL record that extends the lease: fixed-size, little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The new lease end, Unix ms.
    pub lease_end_unix_ms: i64,
    /// The layout the lease is for.
    pub layout: LayoutRecord,
    /// The writer's clock (Unix ms) when it computed the lease (0 in version-1 records).
    pub written_unix_ms: i64,
    /// The writer's timeline (0 in version-1 records).
    pub timeline: u32,
    /// The furthest ahead of its clock the writer may place any lease (ms).
    pub reach_cap_ms: i64,
}

const RECORD_MAGIC: u32 = 0x534e_464c; // "SNFL"
/// Version of the WAL record written by this build. Version 1 (0.2) is still read.
pub const RECORD_VERSION: u32 = 2;

impl LeaseRecord {
    /// Encoded size in bytes (version 2).
    pub const SIZE: usize = 52;
    /// Encoded size of a version-1 record.
    const SIZE_V1: usize = 32;

    /// Encodes the record.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&RECORD_VERSION.to_le_bytes());
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
        out[32..40].copy_from_slice(&self.written_unix_ms.to_le_bytes());
        out[40..44].copy_from_slice(&self.timeline.to_le_bytes());
        out[44..52].copy_from_slice(&self.reach_cap_ms.to_le_bytes());
        out
    }

    /// Decodes a record; `None` if it is not one of ours or of an unknown version.
    pub fn decode(bytes: &[u8]) -> Option<LeaseRecord> {
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let i64_at = |i: usize| i64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let u16_at = |i: usize| u32::from(u16::from_le_bytes(bytes[i..i + 2].try_into().unwrap()));
        if bytes.len() < Self::SIZE_V1 || u32_at(0) != RECORD_MAGIC {
            return None;
        }
        let (written_unix_ms, timeline, reach_cap_ms) = match (u32_at(4), bytes.len()) {
            (1, Self::SIZE_V1) => (0, 0, 0),
            (RECORD_VERSION, Self::SIZE) => (i64_at(32), u32_at(40), i64_at(44)),
            _ => return None,
        };
        Some(LeaseRecord {
            written_unix_ms,
            timeline,
            reach_cap_ms,
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

/// Reads `data_dir/name` as JSON (`what` names it in errors). `Ok(None)` when it does not
/// exist; any other read error, or contents that do not parse, is an error.
pub(crate) fn read_json<T: DeserializeOwned>(
    data_dir: &Path,
    name: &str,
    what: &str,
) -> io::Result<Option<T>> {
    let path = data_dir.join(name);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("\"{}\" is not a valid {what}: {e}", path.display()),
        )
    })
}

/// Writes the state file atomically and durably.
pub fn write(data_dir: &Path, state: &StateFile) -> io::Result<()> {
    write_json(data_dir, STATE_FILE, state)
}

/// Writes `value` as JSON to `data_dir/name`: a temporary file, fsync, rename, fsync of the
/// directory. A crash leaves the old file or the new one, never a torn one.
pub(crate) fn write_json<T: Serialize>(data_dir: &Path, name: &str, value: &T) -> io::Result<()> {
    let mut body = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    body.push(b'\n');
    write_atomically(data_dir, name, &body)
}

/// Replaces `data_dir/name` with `body`: a temporary file, fsync, rename, fsync of the
/// directory. A crash leaves the old file or the new one, never a torn one.
pub(crate) fn write_atomically(data_dir: &Path, name: &str, body: &[u8]) -> io::Result<()> {
    let tmp = data_dir.join(format!("{name}.tmp"));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, data_dir.join(name))?;
    File::open(data_dir)?.sync_all()
}

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

/// File with the worker id this server claimed last from the registry and the floor of that
/// claim. The id is a preference: the server asks for the same one after a restart, so that
/// decoded IDs stay easy to read. The floor is a guarantee: it is written (fsync) before the
/// claim is used, so a restart of any kind, crash restarts included, which lose shared memory
/// and the registry worker, never loses where IDs under that claim must start.
pub const CLAIM_FILE: &str = "snowflake.claim";

/// The last claim, as kept in [`CLAIM_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastClaim {
    /// Datacenter id of the claim.
    pub datacenter_id: u8,
    /// The claimed worker id.
    pub worker_id: u8,
    /// Where IDs under this claim start (Unix ms); absent in files of 0.4.0 and earlier.
    #[serde(default)]
    pub floor_unix_ms: Option<i64>,
    /// The registry the claim came from (absent in files of 0.7.0 and earlier): a server
    /// never claims from another registry of its fleet without a deliberate move
    /// ([`crate::claim::another_registry`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<crate::claim::RegistrySeen>,
}

impl LastClaim {
    /// The recorded floor of a claim of (`datacenter_id`, `worker_id`), if this file is about
    /// that pair.
    pub fn floor_for(&self, datacenter_id: u8, worker_id: u8) -> Option<i64> {
        (self.datacenter_id == datacenter_id && self.worker_id == worker_id)
            .then_some(self.floor_unix_ms)
            .flatten()
    }
}

/// Reads the claim file (None: absent).
pub fn read_last_claim(data_dir: &Path) -> io::Result<Option<LastClaim>> {
    read_json(data_dir, CLAIM_FILE, "claim file")
}

/// Writes the claim file atomically and durably.
pub fn write_last_claim(data_dir: &Path, claim: &LastClaim) -> io::Result<()> {
    write_json(data_dir, CLAIM_FILE, claim)
}

/// File with the longest `claim_ttl` of another holder of this server's datacenter that a
/// registry named when it refused this server an id (issue 37, path 1): this server's claims
/// settle for it after a loss of the registry's records, also after this server restarts
/// (the records that would show that holder are what a loss erases). Kept until a grant,
/// which a registry makes only once it has settled for that `claim_ttl` and sees no holder
/// out of ratio.
pub const FLEET_TTL_FILE: &str = "snowflake.fleet_ttl";

/// What [`FLEET_TTL_FILE`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetTtl {
    /// The longest `claim_ttl` (ms) a refusal named; 0 for none.
    pub longest_claim_ttl_ms: u64,
}

/// Reads the fleet ttl file (None: absent).
pub fn read_fleet_ttl(data_dir: &Path) -> io::Result<Option<FleetTtl>> {
    read_json(data_dir, FLEET_TTL_FILE, "fleet claim_ttl file")
}

/// Writes the fleet ttl file atomically and durably.
pub fn write_fleet_ttl(data_dir: &Path, value: &FleetTtl) -> io::Result<()> {
    write_json(data_dir, FLEET_TTL_FILE, value)
}

/// File with the registry worker's claim tokens ([`crate::claim::ClaimTokens`]), replaced
/// before every grant and renewal. Only the worker's own restarts and the server's crash
/// restarts read it (the postmaster lives on, and the page cache with it), so it is written
/// without fsync: a renewal must not wait for a busy disk. A file written under another
/// postmaster, or lost, costs only the claim's id (the server is given another): the
/// registry recognises no token it does not store.
pub const TOKEN_FILE: &str = "snowflake.claim_token";

/// Reads the token file (None: absent).
pub fn read_claim_tokens(data_dir: &Path) -> io::Result<Option<crate::claim::ClaimTokens>> {
    read_json(data_dir, TOKEN_FILE, "claim token file")
}

/// Replaces the token file (a temporary file renamed over it, no fsync: see [`TOKEN_FILE`]).
pub fn write_claim_tokens(data_dir: &Path, tokens: &crate::claim::ClaimTokens) -> io::Result<()> {
    let body = serde_json::to_vec(tokens).map_err(io::Error::other)?;
    let tmp = data_dir.join(format!("{TOKEN_FILE}.tmp"));
    fs::write(&tmp, body)?;
    fs::rename(&tmp, data_dir.join(TOKEN_FILE))
}

/// Where IDs resume when this server takes over a database whose IDs another cluster
/// issued, and whose lease (in that cluster's data directory) it cannot see: past
/// `reach_cap_ms` (this server's, covering IDs borrowed ahead of the clock) from now. The
/// other cluster's clock read at most `now` when it stopped: pg_upgrade runs on the same
/// machine after the old server stopped; a restore elsewhere relies on synchronised clocks.
pub fn adoption_floor_ms(now_unix_ms: i64, reach_cap_ms: i64) -> i64 {
    now_unix_ms.saturating_add(reach_cap_ms)
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
    fn the_claim_file_keeps_its_floor_and_reads_older_files() {
        let dir = temp_dir("claim-file");
        assert_eq!(read_last_claim(&dir).unwrap(), None);
        // 0.4.0 wrote no floor.
        fs::write(
            dir.join(CLAIM_FILE),
            br#"{"datacenter_id":1,"worker_id":3}"#,
        )
        .unwrap();
        let old = read_last_claim(&dir).unwrap().unwrap();
        assert_eq!(old.floor_for(1, 3), None);
        let claim = LastClaim {
            datacenter_id: 1,
            worker_id: 3,
            floor_unix_ms: Some(1_700_000_000_000),
            registry: Some(crate::claim::RegistrySeen {
                uri: "redis://r:6379".into(),
                id: 7,
            }),
        };
        write_last_claim(&dir, &claim).unwrap();
        let read = read_last_claim(&dir).unwrap().unwrap();
        assert_eq!(read, claim);
        assert_eq!(read.floor_for(1, 3), Some(1_700_000_000_000));
        // The floor is about that pair only.
        assert_eq!(read.floor_for(1, 4), None);
        assert_eq!(read.floor_for(2, 3), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_token_file_round_trips() {
        let dir = temp_dir("token-file");
        assert_eq!(read_claim_tokens(&dir).unwrap(), None);
        let mut tokens = crate::claim::ClaimTokens::first("pm");
        tokens.for_claim("a@h:1".into());
        write_claim_tokens(&dir, &tokens).unwrap();
        assert_eq!(read_claim_tokens(&dir).unwrap(), Some(tokens.clone()));
        tokens.confirmed();
        write_claim_tokens(&dir, &tokens).unwrap();
        assert_eq!(read_claim_tokens(&dir).unwrap(), Some(tokens));
        assert!(!dir.join(format!("{TOKEN_FILE}.tmp")).exists());
        fs::remove_dir_all(&dir).unwrap();
    }

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

    /// A version-2 record as the primary writes it.
    fn record(lease_end_unix_ms: i64) -> LeaseRecord {
        LeaseRecord {
            lease_end_unix_ms,
            layout: LayoutRecord::current(Epoch::TWITTER),
            written_unix_ms: lease_end_unix_ms - 1_000,
            timeline: 1,
            reach_cap_ms: 2_000,
        }
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
    fn lease_records_round_trip_and_reject_garbage() {
        let rec = record(1_795_324_179_240);
        assert_eq!(LeaseRecord::decode(&rec.encode()), Some(rec));
        assert_eq!(LeaseRecord::decode(&rec.encode()[..31]), None);
        assert_eq!(LeaseRecord::decode(&rec.encode()[..51]), None);
        let mut bad = rec.encode();
        bad[0] ^= 1;
        assert_eq!(LeaseRecord::decode(&bad), None);
        let mut future = rec.encode();
        future[4] = 9;
        assert_eq!(LeaseRecord::decode(&future), None);
    }

    #[test]
    fn version_1_records_of_0_2_still_replay() {
        // The 32 bytes 0.2 wrote: magic, version 1, lease end, epoch, four bit widths.
        let rec = record(1_795_324_179_240);
        let mut v1 = rec.encode()[..32].to_vec();
        v1[4..8].copy_from_slice(&1u32.to_le_bytes());
        let decoded = LeaseRecord::decode(&v1).unwrap();
        assert_eq!(decoded.lease_end_unix_ms, rec.lease_end_unix_ms);
        assert_eq!(decoded.layout, rec.layout);
        assert_eq!(
            (
                decoded.written_unix_ms,
                decoded.timeline,
                decoded.reach_cap_ms
            ),
            (0, 0, 0)
        );
        // A version-1 header on a version-2 body (or the reverse) is garbage.
        let mut mixed = rec.encode();
        mixed[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(LeaseRecord::decode(&mixed), None);
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
    fn lease_reach_widens_after_slow_renewals_up_to_the_cap() {
        assert_eq!(lease_reach_ms(1_000, 0), 1_000);
        assert_eq!(lease_reach_ms(1_000, 2), 1_004);
        assert_eq!(lease_reach_ms(1_000, 5_000), 2_000);
        assert_eq!(lease_reach_ms(1, 4), 9);
        assert_eq!(lease_reach_ms(1, 1_000), 101);
        assert_eq!(reach_cap_ms(1, 0), 101);
        assert_eq!(reach_cap_ms(1_000, 0), 2_000);
        assert_eq!(reach_cap_ms(1_000, 1_000), 3_000);
        for (w, r) in [(1, 0), (1, 50), (10, 7), (1_000, 999), (3_600_000, 1)] {
            assert!(lease_reach_ms(w, r) <= reach_cap_ms(w, 0));
            // A lease past IDs borrowed up to the drift bound stays within the cap.
            for drift in [0, 1_000, 27_000] {
                assert!(drift + lease_reach_ms(w, r) <= reach_cap_ms(w, drift));
            }
            assert!(lease_reach_ms(w, r) >= w);
        }
    }

    fn peer(lead_ms: i64, observed_unix_ms: i64) -> PeerClock {
        PeerClock {
            lead_ms,
            observed_unix_ms,
            reach_cap_ms: 2_000,
        }
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
    fn resume_after_a_restart_or_with_the_clock_set_back() {
        assert_eq!(
            plan_resume(None, 1, Ancestry::default(), 123, None, 2_000).kind,
            ResumeKind::Fresh
        );
        let state = StateFile::own(&record(50_000)); // written at 49_000, timeline 1
        let plan = plan_resume(Some(&state), 1, Ancestry::default(), 49_500, None, 2_000);
        assert_eq!(
            plan,
            ResumePlan {
                floor_unix_ms: 50_000,
                kind: ResumeKind::Restart
            }
        );
        let plan = plan_resume(Some(&state), 1, Ancestry::default(), 19_000, None, 2_000);
        assert_eq!(plan.floor_unix_ms, 50_000);
        let set_back = ResumeKind::ClockBehind {
            step_back_ms: 30_000,
            written_unix_ms: 49_000,
            reach_ms: 2_000,
        };
        assert_eq!(plan.kind, set_back);
        // Written while the clock was behind (IDs borrowed ahead of it): more than one reach
        // behind the lease end is not a plain restart, though the clock did not step.
        let borrowed = StateFile {
            written_unix_ms: 10_000,
            ..state.clone()
        };
        let no_step = ResumeKind::ClockBehind {
            step_back_ms: 0,
            written_unix_ms: 10_000,
            reach_ms: 2_000,
        };
        assert_eq!(
            plan_resume(Some(&borrowed), 1, Ancestry::default(), 20_000, None, 2_000).kind,
            no_step
        );
        // The writer's recorded reach counts too (it may have allowed more borrowing).
        let wide = StateFile {
            reach_cap_ms: 61_000,
            ..borrowed.clone()
        };
        assert_eq!(
            plan_resume(Some(&wide), 1, Ancestry::default(), 20_000, None, 2_000).kind,
            ResumeKind::Restart
        );
        // Files of 0.2 know neither time nor timeline nor reach: the configured reach decides.
        let old = StateFile {
            written_unix_ms: 0,
            timeline: 0,
            reach_cap_ms: 0,
            ..state.clone()
        };
        let restart = plan_resume(Some(&old), 2, Ancestry::default(), 49_000, None, 2_000);
        assert_eq!(restart.kind, ResumeKind::Restart);
        assert_eq!(
            plan_resume(Some(&old), 2, Ancestry::default(), 40_000, None, 2_000).kind,
            ResumeKind::ClockBehind {
                step_back_ms: 0,
                written_unix_ms: 0,
                reach_ms: 2_000,
            }
        );
    }

    #[test]
    fn failover_covers_the_old_primarys_clock_and_reach() {
        // A standby whose clock is 5 s behind replayed a lease; it is promoted (timeline 2)
        // 3 s after its last observation of the primary.
        let state = StateFile::merged(None, &record(50_000), Some(peer(5_000, 44_000))).unwrap();
        let now = 47_000;
        let plan = plan_resume(Some(&state), 2, Ancestry::default(), now, None, 2_000);
        let margin = failover_margin_ms(3_000);
        assert_eq!(margin, 101);
        assert_eq!(plan.floor_unix_ms, now + 5_000 + 2_000 + margin);
        assert_eq!(
            plan.kind,
            ResumeKind::Failover {
                lead_ms: 5_000,
                margin_ms: margin,
                skipped: 0
            }
        );
        // A fresher observation still in shared memory counts too.
        let live = peer(6_000, 46_900);
        let plan = plan_resume(Some(&state), 2, Ancestry::default(), now, Some(live), 2_000);
        assert_eq!(
            plan.floor_unix_ms,
            now + 6_000 + 2_000 + failover_margin_ms(100)
        );
        // A primary whose clock was behind: this node's own clock still counts.
        let behind = StateFile::merged(None, &record(45_000), Some(peer(-9_000, 44_000))).unwrap();
        assert_eq!(
            plan_resume(Some(&behind), 2, Ancestry::default(), now, None, 2_000).floor_unix_ms,
            now + 2_000 + margin
        );
        // Never below a lease the standby did receive.
        let far = StateFile::merged(None, &record(90_000), Some(peer(0, 44_000))).unwrap();
        assert_eq!(
            plan_resume(Some(&far), 2, Ancestry::default(), now, None, 2_000).floor_unix_ms,
            90_000
        );
        // Nothing observed (a restore to a new timeline): the clocks are assumed equal.
        let own = StateFile::own(&record(50_000));
        assert_eq!(
            plan_resume(Some(&own), 2, Ancestry::default(), 60_000, None, 2_000).floor_unix_ms,
            60_000 + 2_000 + 100
        );
    }

    #[test]
    fn a_promotion_before_the_first_lease_record_covers_the_old_primary() {
        let unknown = Ancestry::default();
        // Timeline 1 is where every cluster starts: nothing came before it.
        assert_eq!(
            plan_resume(None, 1, unknown, 47_000, None, 2_000).kind,
            ResumeKind::Fresh
        );
        let plan = plan_resume(None, 2, unknown, 47_000, None, 2_000);
        assert_eq!(plan.floor_unix_ms, 47_000 + 2_000 + 100);
        // The WAL receiver's last view of the old primary's clock counts.
        let live = peer(3_000, 46_900);
        let plan = plan_resume(None, 2, unknown, 47_000, Some(live), 2_000);
        assert_eq!(
            plan.floor_unix_ms,
            47_000 + 3_000 + 2_000 + failover_margin_ms(100)
        );
        assert_eq!(
            plan.resumed(Epoch::TWITTER, 47_000),
            Resumed::Promoted {
                lead_allowance_ms: 5_100
            }
        );
    }

    #[test]
    fn each_skipped_timeline_adds_a_lead_a_reach_and_a_margin() {
        let state = StateFile::own(&record(50_000));
        let skipped = Ancestry { skipped: 2 };
        let plan = plan_resume(Some(&state), 4, skipped, 60_000, None, 3_000);
        // This node's settings reach further than the recorded ones: the skipped primaries
        // may have run with them.
        assert_eq!(plan.floor_unix_ms, 60_000 + 2_100 + 2 * 3_100);
        assert_eq!(
            plan.kind,
            ResumeKind::Failover {
                lead_ms: 0,
                margin_ms: 100,
                skipped: 2
            }
        );
    }

    proptest::proptest! {
        /// Two failovers in a row, A to B to C, with any clock offsets, transit, reach and
        /// timing. B resumes from its floor at once and issues up to its lead allowance ahead
        /// of its clock; its leases record that lead in their reach. Whether or not C
        /// received one of B's lease records, C's floor is above every ID B issued.
        #[test]
        fn repeated_failovers_stay_above_every_issued_id(
            clock_a in -5_000i64..5_000,
            clock_b in -5_000i64..5_000,
            clock_c in -5_000i64..5_000,
            transit in 0i64..100,
            base in 1i64..10_000,
            b_lived in 0i64..20_000,
            c_waited in 0i64..20_000,
            record_at in 0.0f64..=1.0,
            got_b_record in proptest::bool::ANY,
        ) {
            let t_b = 2_000_000_000_000i64; // true time of B's promotion
            let t_d = t_b + b_lived; // B dies
            let t_c = t_d + c_waited; // C promoted
            // What B and C recorded of A, replaying A's last lease.
            let a_lease = LeaseRecord { reach_cap_ms: base, written_unix_ms: t_b + clock_a, lease_end_unix_ms: t_b + clock_a + base, ..record(0) };
            let seen_a = |offset: i64| PeerClock { lead_ms: clock_a - offset - transit, observed_unix_ms: t_b - 1 + offset, reach_cap_ms: base };
            let at_b = StateFile::merged(None, &a_lease, Some(seen_a(clock_b))).unwrap();
            let plan_b = plan_resume(Some(&at_b), 2, Ancestry::default(), t_b + clock_b, None, base);
            let allowance = plan_b.lead_ms(t_b + clock_b) as i64;
            // B's highest ID, at its death: at most its lead allowance (or the drift, below
            // the base reach) ahead of its clock.
            let b_highest = (t_d + clock_b + allowance.max(base)).max(plan_b.floor_unix_ms);
            let seen_b = PeerClock { lead_ms: clock_b - clock_c - transit, observed_unix_ms: t_d + clock_c, reach_cap_ms: base + allowance };
            let plan_c = if got_b_record {
                let t_rec = t_b + ((t_d - t_b) as f64 * record_at) as i64;
                let b_lease = LeaseRecord {
                    reach_cap_ms: base + allowance,
                    written_unix_ms: t_rec + clock_b,
                    lease_end_unix_ms: t_rec + clock_b + allowance + base,
                    timeline: 2,
                    ..a_lease
                };
                let at_c = StateFile::merged(Some(&StateFile::merged(None, &a_lease, Some(seen_a(clock_c))).unwrap()), &b_lease, Some(seen_b)).unwrap();
                plan_resume(Some(&at_c), 3, Ancestry::default(), t_c + clock_c, None, base)
            } else {
                let at_c = StateFile::merged(None, &a_lease, Some(seen_a(clock_c))).unwrap();
                let skipped = Ancestry { skipped: 1 };
                plan_resume(Some(&at_c), 3, skipped, t_c + clock_c, Some(seen_b), base)
            };
            proptest::prop_assert!(plan_c.floor_unix_ms > b_highest, "{:?} vs {}", plan_c, b_highest);
        }
    }

    proptest::proptest! {
        /// Whatever the old primary's clock lead, reach and timing: if it wrote a lease at a
        /// time no later than the promotion, the failover floor is past that lease, provided
        /// the standby saw its lead within the transit the margin allows.
        #[test]
        fn failover_floor_is_past_every_unreceived_lease(
            lead in -60_000i64..60_000,
            transit in 0i64..100,
            observed_ago in 0i64..3_600_000,
            written_before_promotion in 0i64..7_200_000,
            reach_cap in 1i64..7_200_000,
            reach_frac in 0.0f64..=1.0,
        ) {
            let now = 2_000_000_000_000i64;
            let observed = now - observed_ago;
            // What the standby recorded: the lead, short by the message's transit.
            let seen = StateFile::merged(
                None,
                &LeaseRecord { reach_cap_ms: reach_cap, ..record(1) },
                Some(PeerClock { lead_ms: lead - transit, observed_unix_ms: observed, reach_cap_ms: reach_cap }),
            ).unwrap();
            // A lease the primary wrote (on its own clock) before the promotion.
            let written = now - written_before_promotion + lead;
            let lease_end = written + (reach_cap as f64 * reach_frac) as i64;
            let plan = plan_resume(Some(&seen), 2, Ancestry::default(), now, None, 2_000);
            proptest::prop_assert!(plan.floor_unix_ms >= lease_end);
        }
    }

    proptest::proptest! {
        /// A restart with a sane clock never raises an error, for every combination of
        /// settings the configuration accepts, before and after the restart: the lease may
        /// reach up to `reach_cap` past its writer's clock (IDs borrowed up to
        /// `max_clock_drift` ahead, the window, the widening after slow renewals), and a
        /// clock at or after that writer's (or behind it by no more than the drift now
        /// allowed) waits for the resume point instead of refusing. The wait never goes past
        /// the resume point, and a clock set back further than the drift is still refused.
        #[test]
        fn a_restart_with_a_sane_clock_never_refuses(
            window in 1i64..=3_600_000,
            drift in 0i64..=3_600_000,
            last_renewal in 0i64..=10_000_000,
            borrowed_frac in 0.0f64..=1.0,
            new_window in 1i64..=3_600_000,
            new_drift in 0i64..=3_600_000,
            clock_offset in -3_600_000i64..=100_000,
            wait_policy in proptest::bool::ANY,
            max_wait in 1u64..=3_600_000,
        ) {
            use crate::generator::{ClockPolicy, Generator, Next};
            let epoch = Epoch::TWITTER;
            let written = 1_800_000_000_000i64;
            let borrowed = (drift as f64 * borrowed_frac) as i64;
            let lease = written + borrowed + lease_reach_ms(window, last_renewal);
            let state = StateFile::own(&LeaseRecord {
                lease_end_unix_ms: lease,
                layout: LayoutRecord::current(epoch),
                written_unix_ms: written,
                timeline: 1,
                reach_cap_ms: reach_cap_ms(window, drift),
            });
            let now = written + clock_offset;
            let plan = plan_resume(Some(&state), 1, Ancestry::default(), now, None, reach_cap_ms(new_window, new_drift));
            proptest::prop_assert_eq!(plan.floor_unix_ms, lease);
            let floor = epoch.timestamp_or_zero(UnixMs(lease));
            let mut g = Generator::resume(floor, floor, plan.resumed(epoch, now));
            let policy = ClockPolicy {
                max_drift_ms: new_drift as u64,
                max_wait_ms: if wait_policy { max_wait } else { 1 },
                first_sequence: 0,
            };
            let wall = epoch.timestamp_or_zero(UnixMs(now));
            let sane = clock_offset >= -new_drift;
            match g.next(wall, policy) {
                Ok(Next::WaitUntil { wall_ms }) => proptest::prop_assert!(wall_ms <= floor),
                Ok(_) => {}
                Err(e) => {
                    proptest::prop_assert!(!sane, "refused a sane clock: {:?}", e);
                }
            }
            if !sane && !wait_policy {
                proptest::prop_assert!(g.next(wall, policy).is_err(), "a clock set back beyond the drift was not refused");
            }
        }
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
