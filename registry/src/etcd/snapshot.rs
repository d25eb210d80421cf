//! One consistent read of a datacenter's keys (the fleet record, the claims, the marks) and
//! the key names.

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

use super::EtcdRegistry;
use crate::{RegistryError, Result};
use snowflake_core::kvclaims::{FleetRecord, Marks};

/// One consistent read of the datacenter's keys.
pub(super) struct Snapshot {
    pub(super) fleet: Option<(FleetRecord, i64)>,
    /// (worker, token, lease, mod revision).
    pub(super) claims: Vec<(u8, String, i64, i64)>,
    /// (worker, marks, mod revision).
    pub(super) marks: Vec<(u8, Marks, i64)>,
}

impl Snapshot {
    pub(super) fn claim(&self, w: u8) -> Option<&(u8, String, i64, i64)> {
        self.claims.iter().find(|c| c.0 == w)
    }

    pub(super) fn marks(&self, w: u8) -> (Marks, i64) {
        self.marks
            .iter()
            .find(|m| m.0 == w)
            .map_or((Marks::default(), 0), |m| (m.1, m.2))
    }
}

impl EtcdRegistry {
    pub(super) fn key(&self, kind: &str, dc: u8, w: Option<u8>) -> String {
        match w {
            Some(w) => format!("{}/{kind}/{dc}/{w}", self.prefix),
            None => format!("{}/{kind}/{dc}/", self.prefix),
        }
    }

    pub(super) fn fleet_key(&self) -> String {
        format!("{}/fleet", self.prefix)
    }

    /// Reads the fleet record and the datacenter's claims and marks in one transaction.
    pub(super) fn snapshot(&mut self, dc: u8) -> Result<(Snapshot, i64)> {
        let fleet_key = self.fleet_key();
        let claims = self.key("claim", dc, None);
        let marks = self.key("marks", dc, None);
        let txn = Txn::new().and_then([
            TxnOp::get(fleet_key, None),
            TxnOp::get(claims.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(marks.clone(), Some(GetOptions::new().with_prefix())),
        ]);
        let response = self.call(|c| Box::pin(c.txn(txn)))?;
        let revision = response.header().map_or(0, |h| h.revision());
        let mut gets = response.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().to_vec(),
            _ => Vec::new(),
        });
        let fleet_kvs = gets.next().unwrap_or_default();
        let claim_kvs = gets.next().unwrap_or_default();
        let mark_kvs = gets.next().unwrap_or_default();
        let fleet = match fleet_kvs.first() {
            None => None,
            Some(kv) => Some((
                serde_json::from_slice::<FleetRecord>(kv.value()).map_err(|e| {
                    RegistryError(format!("the fleet record in etcd is not readable: {e}"))
                })?,
                kv.mod_revision(),
            )),
        };
        let worker_of = |key: &[u8], prefix: &str| -> Option<u8> {
            std::str::from_utf8(key)
                .ok()?
                .strip_prefix(prefix)?
                .parse()
                .ok()
        };
        let claims = claim_kvs
            .iter()
            .filter_map(|kv| {
                Some((
                    worker_of(kv.key(), &claims)?,
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.lease(),
                    kv.mod_revision(),
                ))
            })
            .collect();
        let marks = mark_kvs
            .iter()
            .filter_map(|kv| {
                Some((
                    worker_of(kv.key(), &marks)?,
                    serde_json::from_slice::<Marks>(kv.value()).ok()?,
                    kv.mod_revision(),
                ))
            })
            .collect();
        Ok((
            Snapshot {
                fleet,
                claims,
                marks,
            },
            revision,
        ))
    }
}
