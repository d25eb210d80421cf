//! etcd leases: a claim's key is bound to one of `claim_ttl` (whole seconds), so the store
//! drops a claim whose holder stopped renewing; a renewal is a keep-alive.

use super::EtcdRegistry;
use crate::Result;
use snowflake_core::kvclaims::lease_seconds;

impl EtcdRegistry {
    pub(super) fn grant_lease(&mut self, ttl_ms: u64) -> Result<i64> {
        let seconds = lease_seconds(ttl_ms);
        let response = self.call(|c| Box::pin(c.lease_grant(seconds, None)))?;
        Ok(response.id())
    }

    pub(super) fn revoke_lease(&mut self, lease: i64) {
        // A lease left behind expires by itself; revoking only frees the id sooner.
        let _ = self.call(|c| Box::pin(async move { c.lease_revoke(lease).await.map(|_| ()) }));
    }

    /// Keeps `lease` alive once: false if etcd no longer has it.
    pub(super) fn keep_alive(&mut self, lease: i64) -> Result<bool> {
        let alive = self.call(|c| {
            Box::pin(async move {
                match c.lease_keep_alive(lease).await {
                    Ok(_) => Ok(true),
                    Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                    Err(e) => Err(e),
                }
            })
        })?;
        Ok(alive)
    }
}
