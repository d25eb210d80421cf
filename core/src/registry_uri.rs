//! The parts of `snowflake.registry` URIs that the client libraries do not parse themselves:
//! the etcd and Redis Sentinel forms (several hosts, a prefix or a master name), the libpq
//! parameters the `postgres` crate does not know (`sslmode=verify-full`, `sslrootcert`,
//! `passfile`), and `.pgpass` lookups. Pure, so that every form is tested without a server.

/// Percent-decodes `s` (`%XX`): the project's one decoder, for URIs and for finding their
/// secrets alike. A malformed escape is kept as it is; bytes that are not UTF-8 become
/// U+FFFD. It works on bytes, so `%` before a multi-byte character cannot panic (it did,
/// with the password in the panic text: issue 35).
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// A URI with several hosts: `scheme://[user[:password]@]host:port[,host:port...][/path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiHostUri {
    /// The scheme, lower case, without `://`.
    pub scheme: String,
    /// The user name, percent-decoded (empty: none).
    pub user: String,
    /// The password, percent-decoded.
    pub password: Option<String>,
    /// `host:port` of each host, in order (a host without a port gets `default_port`).
    pub hosts: Vec<String>,
    /// The path's segments, percent-decoded, without empty ones.
    pub path: Vec<String>,
}

/// Parses a multi-host URI (no query part is allowed). Errors are texts for the log; they
/// never quote the URI (it may hold a password).
pub fn parse_multi_host(uri: &str, default_port: u16) -> Result<MultiHostUri, String> {
    let (scheme, rest) = uri
        .trim()
        .split_once("://")
        .ok_or_else(|| "the registry URI has no scheme".to_string())?;
    if rest.contains('?') {
        return Err("this registry URI takes no query parameters".into());
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => (String::new(), None),
        Some(info) => match info.split_once(':') {
            Some((u, p)) => (percent_decode(u), Some(percent_decode(p))),
            None => (percent_decode(info), None),
        },
    };
    let mut hosts = Vec::new();
    for host in hostlist.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err("the registry URI names an empty host".into());
        }
        let port_error = || "the registry URI has a port that is not a number".to_string();
        let port_of = |p: &str| p.parse::<u16>().map_err(|_| port_error());
        let with_port = if let Some(inside) = host.strip_prefix('[') {
            // An IPv6 address: [addr] or [addr]:port.
            match inside.split_once(']') {
                Some((_, "")) => format!("{host}:{default_port}"),
                Some((_, tail)) => {
                    port_of(tail.strip_prefix(':').ok_or_else(port_error)?)?;
                    host.to_string()
                }
                None => return Err("the registry URI has an unclosed [".into()),
            }
        } else {
            match host.split_once(':') {
                Some((_, p)) => {
                    port_of(p)?;
                    host.to_string()
                }
                None => format!("{host}:{default_port}"),
            }
        };
        hosts.push(with_port);
    }
    Ok(MultiHostUri {
        scheme: scheme.to_ascii_lowercase(),
        user,
        password,
        hosts,
        path: path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(percent_decode)
            .collect(),
    })
}

/// The libpq parameters of a coordinator URI that the `postgres` crate does not parse, taken
/// out of it: the URI to give the crate, and what to do with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibpqExtras {
    /// The URI without the parameters below.
    pub uri: String,
    /// `sslmode`: disable, allow, prefer, require, verify-ca or verify-full (lower case;
    /// `prefer` when absent, as in libpq).
    pub sslmode: String,
    /// Whether the URI names `sslmode` (without it, a coordinator client that has a password
    /// to send requires TLS: see `fleet::registry::postgres`).
    pub sslmode_given: bool,
    /// `sslrootcert`: the CA file for verify-ca and verify-full.
    pub sslrootcert: Option<String>,
    /// `passfile`: a `.pgpass`-style file.
    pub passfile: Option<String>,
    /// `snowflake_schema`: the schema holding the coordinator's tables (default
    /// [`DEFAULT_COORDINATOR_SCHEMA`]); the tables are never looked for on a search_path.
    pub schema: String,
    /// `snowflake_owner`: the role that must own that schema and the tables (default: the
    /// connecting role; a superuser is accepted too).
    pub owner: Option<String>,
}

/// The schema of the coordinator's tables when the URI names none: where earlier versions
/// created them (the connecting role's default schema, `public` in a default setup).
pub const DEFAULT_COORDINATOR_SCHEMA: &str = "public";

impl LibpqExtras {
    /// Whether the server's certificate is checked against a CA (verify-ca, verify-full).
    pub fn verifies_certificate(&self) -> bool {
        self.sslmode == "verify-ca" || self.sslmode == "verify-full"
    }

    /// Whether the certificate must name the host (verify-full).
    pub fn verifies_host(&self) -> bool {
        self.sslmode == "verify-full"
    }

    /// Whether TLS is required (require and stronger).
    pub fn requires_tls(&self) -> bool {
        self.sslmode == "require" || self.verifies_certificate()
    }
}

/// Takes `sslmode`, `sslrootcert`, `passfile`, `snowflake_schema` and `snowflake_owner` out
/// of a `postgresql://` URI.
pub fn split_libpq_extras(uri: &str) -> Result<LibpqExtras, String> {
    let (base, query) = match uri.split_once('?') {
        Some((b, q)) => (b, q),
        None => (uri, ""),
    };
    let mut kept = Vec::new();
    let mut sslmode = "prefer".to_string();
    let mut sslmode_given = false;
    let mut sslrootcert = None;
    let mut passfile = None;
    let mut schema = DEFAULT_COORDINATOR_SCHEMA.to_string();
    let mut owner = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => {
                let v = percent_decode(value).to_ascii_lowercase();
                if ![
                    "disable",
                    "allow",
                    "prefer",
                    "require",
                    "verify-ca",
                    "verify-full",
                ]
                .contains(&v.as_str())
                {
                    return Err(format!("invalid sslmode \"{v}\""));
                }
                sslmode = v;
                sslmode_given = true;
            }
            "sslrootcert" => sslrootcert = Some(percent_decode(value)),
            "passfile" => passfile = Some(percent_decode(value)),
            "snowflake_schema" | "snowflake_owner" => {
                let v = percent_decode(value);
                // PostgreSQL's identifiers: 1 to 63 bytes, no NUL (quoted when used).
                if v.is_empty() || v.len() > 63 || v.contains('\0') {
                    return Err(format!("{key} must name a role or schema of 1 to 63 bytes"));
                }
                if key == "snowflake_schema" {
                    schema = v;
                } else {
                    owner = Some(v);
                }
            }
            _ => kept.push(pair),
        }
    }
    let uri = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(LibpqExtras {
        uri,
        sslmode,
        sslmode_given,
        sslrootcert,
        passfile,
        schema,
        owner,
    })
}

/// The password a `.pgpass`-style file gives for a connection, as libpq reads it: the first
/// line `hostname:port:database:username:password` whose first four fields match (`*`
/// matches anything; `\:` and `\\` escape). `host` is the host name or address as written
/// in the URI; `localhost` also matches a Unix-socket connection's entry in libpq, which
/// does not arise here.
pub fn pgpass_lookup(
    text: &str,
    host: &str,
    port: u16,
    database: &str,
    user: &str,
) -> Option<String> {
    let port = port.to_string();
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_pgpass_line(line);
        if fields.len() < 5 {
            continue;
        }
        let matches = |field: &str, value: &str| field == "*" || field == value;
        if matches(&fields[0], host)
            && matches(&fields[1], &port)
            && matches(&fields[2], database)
            && matches(&fields[3], user)
        {
            return Some(fields[4..].join(":"));
        }
    }
    None
}

/// Splits a `.pgpass` line on unescaped colons, removing the escapes.
fn split_pgpass_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    fields.last_mut().expect("never empty").push(n);
                }
            }
            ':' => fields.push(String::new()),
            _ => fields.last_mut().expect("never empty").push(c),
        }
    }
    fields
}

/// The first line of a password file (Redis, etcd): the password, without its line end.
pub fn password_from_file(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or("")
        .trim_end_matches('\r')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_host() {
        let u = parse_multi_host("etcd://a:1,b:2,c/snow/flake", 2379).unwrap();
        assert_eq!(u.scheme, "etcd");
        assert_eq!(u.hosts, vec!["a:1", "b:2", "c:2379"]);
        assert_eq!(u.path, vec!["snow", "flake"]);
        assert_eq!(u.user, "");
        assert_eq!(u.password, None);
        let u = parse_multi_host("redis+sentinel://u:p%40ss@h1:26379,h2/master/3", 26379).unwrap();
        assert_eq!(u.user, "u");
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(u.hosts, vec!["h1:26379", "h2:26379"]);
        assert_eq!(u.path, vec!["master", "3"]);
        let u = parse_multi_host("etcds://[::1]:2379,[::1]", 2379).unwrap();
        assert_eq!(u.hosts, vec!["[::1]:2379", "[::1]:2379"]);
        assert!(parse_multi_host("etcd://a:x", 1).is_err());
        assert!(parse_multi_host("etcd://a,,b", 1).is_err());
        assert!(parse_multi_host("etcd://a?x=1", 1).is_err());
        // Errors never quote the URI.
        let e = parse_multi_host("etcd://u:secret@a:x", 1).unwrap_err();
        assert!(!e.contains("secret"));
    }

    #[test]
    fn libpq_extras() {
        let x = split_libpq_extras(
            "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write&sslmode=verify-full&sslrootcert=/etc/ca%20x.pem&passfile=/p",
        )
        .unwrap();
        assert_eq!(
            x.uri,
            "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write"
        );
        assert!(x.verifies_host() && x.verifies_certificate() && x.requires_tls());
        assert_eq!(x.sslrootcert.as_deref(), Some("/etc/ca x.pem"));
        assert_eq!(x.passfile.as_deref(), Some("/p"));
        let y = split_libpq_extras("postgresql://u@h/db").unwrap();
        assert_eq!(y.uri, "postgresql://u@h/db");
        assert_eq!(y.sslmode, "prefer");
        assert!(x.sslmode_given && !y.sslmode_given);
        assert!(!y.requires_tls());
        assert!(split_libpq_extras("postgresql://h/db?sslmode=bogus").is_err());
        assert_eq!(y.schema, DEFAULT_COORDINATOR_SCHEMA);
        assert_eq!(y.owner, None);
        let z = split_libpq_extras(
            "postgresql://u@h/db?snowflake_schema=Fleet%20Reg&application_name=x&snowflake_owner=dba",
        )
        .unwrap();
        assert_eq!(z.uri, "postgresql://u@h/db?application_name=x");
        assert_eq!(z.schema, "Fleet Reg");
        assert_eq!(z.owner.as_deref(), Some("dba"));
        assert!(split_libpq_extras("postgresql://h/db?snowflake_schema=").is_err());
    }

    #[test]
    fn pgpass() {
        let text = "# comment\n\nother:5432:db:u:nope\nh1:*:db:u:pa\\:ss:word\n*:*:*:*:fallback\n";
        assert_eq!(
            pgpass_lookup(text, "h1", 5433, "db", "u").as_deref(),
            Some("pa:ss:word")
        );
        assert_eq!(
            pgpass_lookup(text, "h2", 5432, "db", "u").as_deref(),
            Some("fallback")
        );
        assert_eq!(pgpass_lookup("h:1:d:u\n", "h", 1, "d", "u"), None);
        assert_eq!(password_from_file("s3cret\r\nignored"), "s3cret");
        assert_eq!(password_from_file(""), "");
    }

    #[test]
    fn percent() {
        assert_eq!(percent_decode("a%20b%2"), "a b%2");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%41"), "A");
        // A `%` before a multi-byte character panicked (a slice inside the character).
        assert_eq!(percent_decode("p%\u{e9}x"), "p%\u{e9}x");
        assert_eq!(percent_decode("p%\u{20ac}x"), "p%\u{20ac}x");
        assert_eq!(percent_decode("%\u{e9}"), "%\u{e9}");
        assert_eq!(percent_decode("%a\u{e9}"), "%a\u{e9}");
        assert_eq!(percent_decode("%ff"), "\u{fffd}");
        assert_eq!(percent_decode("a%2Fb"), "a/b");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        // Only hex digits make an escape (from_str_radix took "+1" as one).
        assert_eq!(percent_decode("%+1x"), "%+1x");
    }

    proptest::proptest! {
        /// No string panics the parsers, and no error quotes the password (issue 35: `%`
        /// followed by a non-ASCII character panicked the registry worker every second,
        /// with the password in the panic text).
        #[test]
        fn no_uri_panics_or_shows_its_password(
            scheme in proptest::prop_oneof![
                proptest::strategy::Just("etcd"),
                proptest::strategy::Just("etcds"),
                proptest::strategy::Just("redis+sentinel"),
                proptest::strategy::Just("postgresql"),
            ],
            password in "[A-Za-z0-9%\u{e9}\u{20ac}\u{1f600}]{6,12}",
            rest in "\\PC{0,40}",
            any_text in "\\PC{0,60}",
        ) {
            // Arbitrary text, whole: never a panic.
            let _ = parse_multi_host(&any_text, 2379);
            let _ = split_libpq_extras(&any_text);
            let _ = percent_decode(&any_text);
            // A URI with a password, then arbitrary text.
            let uri = format!("{scheme}://user:S3cr{password}@{rest}");
            let secret = format!("S3cr{password}");
            if let Err(e) = parse_multi_host(&uri, 2379) {
                proptest::prop_assert!(!e.contains(&secret), "{} in {}", secret, e);
                proptest::prop_assert!(!e.contains(&percent_decode(&secret)), "{} in {}", secret, e);
            }
            let passfile = format!("postgresql://h/db?passfile=%{password}{rest}");
            if let Err(e) = split_libpq_extras(&passfile) {
                proptest::prop_assert!(!e.contains(&password), "{} in {}", password, e);
            }
        }
    }
}
