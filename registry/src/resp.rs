//! A Redis connection bounded in time and in bytes, for the Redis and Sentinel clients: the
//! `redis` crate's own synchronous connection bounds each read by a timeout, not a request
//! (a server answering a byte at a time held a request for ever), and has no limit on a
//! reply's size (a server streaming a bulk string without end made it allocate until the
//! process aborted: issue 35). This one speaks RESP through the crate's parser and command
//! encoding, and implements [`redis::ConnectionLike`], so scripts and commands run as before.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{RegistryError, Result};

/// The most a request may read: the largest reply is `INFO` (a few kB) or a script's
/// (a few hundred bytes).
pub(crate) const MAX_REPLY_BYTES: usize = 1 << 20;

/// A TCP stream whose reads and writes all end by a deadline: each waits at most the time
/// left (a per-read timeout alone lets a server that sends a byte at a time hold a request
/// for ever). Used under TLS too, so that a handshake is bounded the same way.
#[derive(Debug)]
pub(crate) struct Timed {
    tcp: TcpStream,
    deadline: Instant,
}

impl Timed {
    pub(crate) fn new(tcp: TcpStream, deadline: Instant) -> Self {
        Timed { tcp, deadline }
    }

    pub(crate) fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the registry did not answer in time",
            ));
        }
        Ok(left)
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.tcp.set_read_timeout(Some(self.left()?))?;
        self.tcp.read(buf)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tcp.set_write_timeout(Some(self.left()?))?;
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

enum Stream {
    Plain(Timed),
    Tls(Box<native_tls::TlsStream<Timed>>),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl Stream {
    /// Every read and write from now on ends by `deadline` (a Unix socket: each waits at
    /// most until then).
    fn set_deadline(&mut self, deadline: Instant) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.set_deadline(deadline),
            Stream::Tls(s) => s.get_mut().set_deadline(deadline),
            #[cfg(unix)]
            Stream::Unix(s) => {
                let left = deadline.saturating_duration_since(Instant::now());
                let left = left.max(Duration::from_millis(1));
                s.set_read_timeout(Some(left))?;
                s.set_write_timeout(Some(left))?;
            }
        }
        Ok(())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
            #[cfg(unix)]
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// Reads for one reply: each read waits at most until the request's deadline, and all of
/// them together return at most [`MAX_REPLY_BYTES`].
struct Limited<'a> {
    stream: &'a mut Stream,
    left: &'a mut usize,
    deadline: Instant,
}

impl Read for Limited<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if *self.left == 0 {
            return Err(std::io::Error::other(format!(
                "the registry sent more than {MAX_REPLY_BYTES} bytes for one request"
            )));
        }
        if Instant::now() >= self.deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the registry did not answer in time",
            ));
        }
        let n = (*self.left).min(buf.len());
        let got = self.stream.read(&mut buf[..n])?;
        *self.left -= got;
        Ok(got)
    }
}

/// One connection to a Redis server or sentinel.
pub(crate) struct Bounded {
    stream: Stream,
    parser: redis::Parser,
    db: i64,
    timeout: Duration,
    open: bool,
}

impl Bounded {
    /// Connects to `info`'s server within `timeout` (each address), then authenticates and
    /// selects its database, each a request bounded as any other. TLS trusts `ca_pem` only
    /// when given (as the `redis` crate does), the system's CAs otherwise.
    pub(crate) fn connect(
        info: &redis::ConnectionInfo,
        ca_pem: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Self> {
        let stream = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Stream::Plain(Timed::new(
                tcp(host, *port, timeout)?,
                Instant::now() + timeout,
            )),
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                if *insecure {
                    return Err(RegistryError(
                        "rediss://...#insecure turns certificate checks off".into(),
                    ));
                }
                let mut builder = native_tls::TlsConnector::builder();
                if let Some(pem) = ca_pem {
                    builder.disable_built_in_roots(true);
                    for cert in openssl::x509::X509::stack_from_pem(pem)? {
                        builder.add_root_certificate(native_tls::Certificate::from_der(
                            &cert.to_der()?,
                        )?);
                    }
                }
                let connector = builder.build()?;
                // The handshake ends by the deadline, whatever the server sends.
                let tcp = Timed::new(tcp(host, *port, timeout)?, Instant::now() + timeout);
                let tls = connector.connect(host, tcp).map_err(|e| {
                    RegistryError(format!("{host}:{port}: TLS handshake failed: {e}"))
                })?;
                Stream::Tls(Box::new(tls))
            }
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => {
                Stream::Unix(std::os::unix::net::UnixStream::connect(path)?)
            }
            #[allow(unreachable_patterns)]
            _ => return Err(RegistryError("unsupported Redis address".into())),
        };
        let settings = info.redis_settings();
        let mut con = Bounded {
            stream,
            parser: redis::Parser::new(),
            db: settings.db(),
            timeout,
            open: true,
        };
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            auth.query::<()>(&mut con)?;
        }
        if settings.db() != 0 {
            redis::cmd("SELECT")
                .arg(settings.db())
                .query::<()>(&mut con)?;
        }
        Ok(con)
    }

    fn request(&mut self, cmd: &[u8], replies: usize) -> redis::RedisResult<Vec<redis::Value>> {
        if !self.open {
            return Err(std::io::Error::from(std::io::ErrorKind::NotConnected).into());
        }
        let deadline = Instant::now() + self.timeout;
        let result = (|| {
            self.stream.set_deadline(deadline)?;
            self.stream.write_all(cmd)?;
            let mut left = MAX_REPLY_BYTES;
            let mut values = Vec::with_capacity(replies);
            while values.len() < replies {
                let value = self.parser.parse_value(Limited {
                    stream: &mut self.stream,
                    left: &mut left,
                    deadline,
                })?;
                if !matches!(value, redis::Value::Push { .. }) {
                    values.push(value);
                }
            }
            Ok(values)
        })();
        if result.is_err() {
            // The parser may hold part of a reply: the connection is not used again.
            self.open = false;
        }
        result
    }
}

/// A TCP connection to the first address of `host:port` that accepts within `timeout`.
fn tcp(host: &str, port: u16, timeout: Duration) -> Result<TcpStream> {
    let mut last = None;
    for address in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => RegistryError(format!("{host}:{port}: {e}")),
        None => RegistryError(format!("{host}:{port}: no address")),
    })
}

impl redis::ConnectionLike for Bounded {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        Ok(self.request(cmd, 1)?.pop().unwrap_or(redis::Value::Nil))
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        let mut values = self.request(cmd, offset + count)?;
        Ok(values.split_off(offset.min(values.len())))
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").query::<String>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.open
    }
}
