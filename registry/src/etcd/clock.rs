//! The registry's clock: etcd's API has none, so it is the `Date` header of the member's
//! HTTP endpoint (`/version`, on the client port), read in whole seconds.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};

use super::EtcdRegistry;
use crate::{wall_ms, ClaimRequest, RegistryError, Result};
use snowflake_core::claim::{ClockSample, RequestAge};
use snowflake_core::kvclaims::{parse_http_date, HTTP_DATE_RESOLUTION_MS};

/// The registry's clock for one step.
#[derive(Clone, Copy)]
pub(super) struct Clock {
    pub(super) sample: ClockSample,
    /// When the sample's reading arrived (for `Observed::sample_age_ms`).
    pub(super) received_at: std::time::Instant,
    /// The start of the second the `Date` header named (Unix ms).
    pub(super) date_unix_ms: i64,
}

impl Clock {
    /// The registry's clock at its earliest (settling is measured from it: never too short).
    pub(super) fn earliest(&self) -> i64 {
        self.date_unix_ms
    }

    /// The registry's clock at its latest (a new incarnation is born then).
    pub(super) fn latest(&self) -> i64 {
        self.date_unix_ms + HTTP_DATE_RESOLUTION_MS
    }

    /// Judges a request's age on the safe side of the second: it is "ahead" only if ahead of
    /// the latest reading, "stale" only if stale at the earliest.
    pub(super) fn request_age(&self, request: &ClaimRequest) -> RequestAge {
        let timing = request.timing();
        match (
            timing.request_age(request.sent_unix_ms, self.latest()),
            timing.request_age(request.sent_unix_ms, self.earliest()),
        ) {
            (RequestAge::Ahead, _) => RequestAge::Ahead,
            (_, RequestAge::Stale) => RequestAge::Stale,
            _ => RequestAge::Fresh,
        }
    }
}

impl EtcdRegistry {
    /// Reads the registry's clock: the member's HTTP `Date` header. A member that refuses,
    /// fails or does not answer within the time limit is left for the next at once (its
    /// gRPC connection with it), as long as the step has time left for one more: the first
    /// request of a step finds a dead or frozen member, not a renewal. So a frozen member
    /// costs a renewal one request's time limit (`claim_ttl / 5`): a failed step instead,
    /// and its retry half a heartbeat later, used up the whole fence (heartbeat, time limit
    /// and half a heartbeat are `claim_ttl / 2`).
    pub(super) fn clock(&mut self) -> Result<Clock> {
        let began = std::time::Instant::now();
        let mut attempts = 0;
        let (sent, date_unix_ms) = loop {
            let sent = wall_ms();
            match self.read_date() {
                Ok(date) => break (sent, date),
                Err(e) => {
                    self.client = None;
                    self.current = (self.current + 1) % self.endpoints.len();
                    attempts += 1;
                    if attempts >= self.endpoints.len() || began.elapsed() >= self.move_on_budget()
                    {
                        return Err(e);
                    }
                }
            }
        };
        let received = wall_ms();
        Ok(Clock {
            received_at: std::time::Instant::now(),
            sample: ClockSample {
                sent_unix_ms: sent,
                received_unix_ms: received,
                registry_unix_ms: date_unix_ms + HTTP_DATE_RESOLUTION_MS / 2,
                registry_resolution_ms: HTTP_DATE_RESOLUTION_MS,
            },
            date_unix_ms,
        })
    }

    /// The member's `Date` header, from one `GET /version`. Written by hand, not with
    /// hyper's client (linked through etcd-client): one deadline bounds the connection, the
    /// TLS handshake and every read, and the head is cut at 16 KiB, in fewer lines than
    /// hyper's client needs to do the same.
    pub(super) fn read_date(&self) -> Result<i64> {
        let endpoint = self.endpoint().to_string();
        let host = endpoint
            .rsplit_once(':')
            .map_or(endpoint.as_str(), |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let address = endpoint
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| RegistryError(format!("etcd member {endpoint}: no address")))?;
        // Every read and write, the TLS handshake's too, ends by one deadline (a per-read
        // timeout let a server sending a byte at a time hold the request for ever).
        let stream = crate::resp::Timed::new(
            TcpStream::connect_timeout(&address, self.timeout)?,
            std::time::Instant::now() + self.timeout,
        );
        let request = format!("GET /version HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let mut head = Vec::new();
        let read_head = |s: &mut dyn ReadWrite, head: &mut Vec<u8>| -> Result<()> {
            s.write_all(request.as_bytes())?;
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                head.extend_from_slice(&buf[..n]);
            }
            Ok(())
        };
        match &self.tls {
            Some(connector) => {
                let mut s = connector.connect(&host, stream).map_err(|e| {
                    RegistryError(format!("etcd member {endpoint}: TLS handshake failed: {e}"))
                })?;
                read_head(&mut s, &mut head)?;
            }
            None => {
                let mut s = stream;
                read_head(&mut s, &mut head)?;
            }
        }
        let text = String::from_utf8_lossy(&head);
        text.lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("date")
                    .then(|| parse_http_date(value.trim()))
                    .flatten()
            })
            .ok_or_else(|| {
                RegistryError(format!(
                    "etcd member {endpoint}: its HTTP answer carries no Date header"
                ))
            })
    }
}

/// Reads and writes a byte stream (plain or TLS).
trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use snowflake_core::claim::{ClaimTiming, RequestTokens};

    const TTL_MS: u64 = 10_000;

    fn clock(date_unix_ms: i64) -> Clock {
        Clock {
            sample: ClockSample {
                sent_unix_ms: date_unix_ms,
                received_unix_ms: date_unix_ms,
                registry_unix_ms: date_unix_ms + HTTP_DATE_RESOLUTION_MS / 2,
                registry_resolution_ms: HTTP_DATE_RESOLUTION_MS,
            },
            received_at: std::time::Instant::now(),
            date_unix_ms,
        }
    }

    fn sent_at(sent_unix_ms: i64) -> ClaimRequest {
        ClaimRequest {
            datacenter_id: 0,
            order: vec![0],
            tokens: RequestTokens {
                held: Vec::new(),
                write: String::new(),
            },
            ttl_ms: TTL_MS,
            sent_unix_ms,
            cap_unix_ms: sent_unix_ms,
            epoch_unix_ms: 0,
            fleet_ttl_ms: 0,
        }
    }

    /// The `Date` header names a whole second: a request is refused as ahead only if it is
    /// ahead of the second's end, and as stale only if it is stale at the second's start.
    #[test]
    fn request_age_is_judged_on_the_safe_side_of_the_second() {
        let timing = ClaimTiming::new(TTL_MS);
        let (lead, age) = (timing.max_request_lead_ms(), timing.max_request_age_ms());
        let c = clock(1_000_000);
        assert_eq!(c.latest() - c.earliest(), HTTP_DATE_RESOLUTION_MS);
        let age_of = |sent: i64| c.request_age(&sent_at(sent));
        assert_eq!(age_of(c.latest() + lead), RequestAge::Fresh);
        assert_eq!(age_of(c.latest() + lead + 1), RequestAge::Ahead);
        // Ahead of the second's start, not of its end: fresh.
        assert_eq!(age_of(c.earliest() + lead + 1), RequestAge::Fresh);
        assert_eq!(age_of(c.earliest() - age), RequestAge::Fresh);
        assert_eq!(age_of(c.earliest() - age - 1), RequestAge::Stale);
        // Stale at the second's end, not at its start: fresh.
        assert_eq!(age_of(c.latest() - age - 1), RequestAge::Fresh);
    }
}
