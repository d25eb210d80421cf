//! One member at a time: the connection on the client's private runtime, each call bounded
//! by the timeout, and the move to the next member after any failure.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, OpenSslClientConfig};

use super::EtcdRegistry;
use crate::{RegistryError, Result};

impl EtcdRegistry {
    pub(super) fn endpoint(&self) -> &str {
        &self.endpoints[self.current % self.endpoints.len()]
    }

    /// Runs `f` with a connected client, bounded by the timeout. After any failure the
    /// connection is dropped and the next member is used.
    pub(super) fn call<T>(
        &mut self,
        f: impl for<'c> FnOnce(
            &'c mut Client,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = std::result::Result<T, etcd_client::Error>> + 'c>,
        >,
    ) -> Result<T> {
        let result = (|| {
            if self.client.is_none() {
                let scheme = if self.tls.is_some() { "https" } else { "http" };
                let url = format!("{scheme}://{}", self.endpoint());
                let mut options = ConnectOptions::new()
                    .with_timeout(self.timeout)
                    .with_connect_timeout(self.timeout)
                    .with_require_leader(true);
                if let Some(pem) = &self.ca_pem {
                    // The CA file is the whole trust set, every certificate of it, as for
                    // etcdctl --cacert: ca_cert_pem would add only its first certificate,
                    // and to the system's CAs, which SslConnector::builder loads.
                    let pem = pem.clone();
                    options = options.with_openssl_tls(OpenSslClientConfig::default().manually(
                        move |builder| {
                            let mut store = openssl::x509::store::X509StoreBuilder::new()?;
                            for cert in openssl::x509::X509::stack_from_pem(&pem)? {
                                store.add_cert(cert)?;
                            }
                            builder.set_verify_cert_store(store.build())
                        },
                    ));
                }
                if let Some((user, password)) = &self.credentials {
                    options = options.with_user(user.clone(), password.clone());
                }
                let connect = Client::connect([url], Some(options));
                let client = self
                    .runtime
                    .block_on(async { tokio::time::timeout(self.timeout, connect).await })
                    .map_err(|_| self.timed_out())?
                    .map_err(|e| self.failed(e))?;
                self.client = Some(client);
            }
            let timeout = self.timeout;
            let client = self.client.as_mut().expect("connected above");
            let outcome = self
                .runtime
                .block_on(async { tokio::time::timeout(timeout, f(client)).await });
            match outcome {
                Err(_) => Err(self.timed_out()),
                Ok(Err(e)) => Err(self.failed(e)),
                Ok(Ok(v)) => Ok(v),
            }
        })();
        if result.is_err() {
            self.client = None;
            self.current = (self.current + 1) % self.endpoints.len();
        }
        result
    }

    pub(super) fn timed_out(&self) -> RegistryError {
        RegistryError(format!(
            "etcd member {} did not answer within {} ms",
            self.endpoint(),
            self.timeout.as_millis()
        ))
    }

    pub(super) fn failed(&self, e: etcd_client::Error) -> RegistryError {
        RegistryError(format!("etcd member {}: {e}", self.endpoint()))
    }

    /// How long into a clock read or a step this client still moves on to the next member
    /// after a failed request, rather than fail: one request's time limit (what a frozen
    /// member holds a request for) and half of one more, so that the retried requests can
    /// still end within the fence.
    pub(super) fn move_on_budget(&self) -> Duration {
        self.timeout + self.timeout / 2
    }
}
