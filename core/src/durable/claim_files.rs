//! The registry worker's files in the data directory: the last claim and its floor
//! (`snowflake.claim`), the longest fleet `claim_ttl` a refusal named
//! (`snowflake.fleet_ttl`), and the claim tokens (`snowflake.claim_token`).

use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::path::Path;

use super::atomic::{read_json, write_json};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::atomic::temp_dir;

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
}
