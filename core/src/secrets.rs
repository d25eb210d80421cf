//! Keeping the registry's credentials inside the server process.
//!
//! `snowflake.registry` may carry a password in any form its client accepts: in the user
//! information (`user:pa/ss@host`, which the PostgreSQL client splits at the first `@` of
//! the whole string, and Redis's URL parser at the last `@` before the path), percent-encoded
//! or not, or as a query parameter (`?password=`, `&sslpassword=`). Parsing it the way one
//! client does and masking the password misses the forms another parse sees, so:
//! - [`redacted`] builds the text shown to users from the parts that are never secret
//!   (scheme, user, hosts and ports, database) and hides any part that overlaps a secret
//!   under *any* of those parses; the query string is never shown;
//! - [`without_secrets`] removes every secret candidate from a text that may quote the URI
//!   (a client library's error message).

use crate::registry_uri::percent_decode;

/// What stands in for a hidden part.
pub const MASK: &str = "***";

/// The characters that end the user information or host part of a URI.
const AUTHORITY_END: [char; 3] = ['/', '?', '#'];

/// `uri` for logs, messages and `snowflake_stats()`: `scheme://[user@]hosts[/database]`,
/// with every part that overlaps a secret replaced by [`MASK`] and no query string.
pub fn redacted(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        // Not a URI: nothing in it can be shown safely.
        return MASK.to_string();
    };
    let secrets = secret_candidates(uri);
    let shown = |part: &str| -> String {
        if part.is_empty() {
            String::new()
        } else if overlaps_secret(part, &secrets) {
            MASK.to_string()
        } else {
            part.to_string()
        }
    };
    // Parts are taken from after the last `@`, which is past the user information under
    // every parse; what a query value's `@` leaves there is caught by the overlap check.
    let host_and_path = rest.rfind('@').map_or(rest, |at| &rest[at + 1..]);
    let user = rest
        .find('@')
        .map(|_| &rest[..rest.find([':', '@']).unwrap_or(0)]);
    let host_end = host_and_path
        .find(AUTHORITY_END)
        .unwrap_or(host_and_path.len());
    let hosts = &host_and_path[..host_end];
    let path = host_and_path[host_end..]
        .strip_prefix('/')
        .map(|p| &p[..p.find(['?', '#']).unwrap_or(p.len())]);
    let mut out = format!("{scheme}://");
    if let Some(user) = user.filter(|u| !u.is_empty() && !u.contains(AUTHORITY_END)) {
        out.push_str(&shown(user));
        out.push('@');
    }
    out.push_str(&shown(hosts));
    if let Some(path) = path.filter(|p| !p.is_empty()) {
        out.push('/');
        out.push_str(&shown(path));
    }
    out
}

/// `text` with every secret candidate of `uri` replaced by [`MASK`].
pub fn without_secrets(text: &str, uri: &str) -> String {
    let mut secrets = secret_candidates(uri);
    // Longest first, so that a secret containing another is removed whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_string();
    for secret in secrets {
        if !secret.is_empty() {
            out = out.replace(&secret, MASK);
        }
    }
    out
}

/// Every string of `uri` that a client could take as a password, raw and percent-decoded:
/// the password of the user information under each parse (first `@` of the string, last
/// `@` of the authority, last `@` of the string), and the value of every query parameter
/// whose name mentions a password.
fn secret_candidates(uri: &str) -> Vec<String> {
    let mut raw: Vec<&str> = Vec::new();
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let authority = &rest[..rest.find(AUTHORITY_END).unwrap_or(rest.len())];
    let credentials = [
        rest.find('@').map(|at| &rest[..at]),
        authority.rfind('@').map(|at| &authority[..at]),
        rest.rfind('@').map(|at| &rest[..at]),
    ];
    for userinfo in credentials.into_iter().flatten() {
        if let Some((_, password)) = userinfo.split_once(':') {
            raw.push(password);
        }
    }
    for (at, _) in uri.match_indices('?') {
        for pair in uri[at + 1..].split('&') {
            if let Some((key, value)) = pair.split_once('=') {
                if percent_decode(key).to_ascii_lowercase().contains("pass") {
                    // A value ends at a fragment mark for a URL parser, or not at all.
                    raw.push(value);
                    raw.push(&value[..value.find('#').unwrap_or(value.len())]);
                }
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    for r in raw {
        for candidate in [r.to_string(), percent_decode(r)] {
            if !candidate.is_empty() && !out.contains(&candidate) {
                out.push(candidate);
            }
        }
    }
    out
}

/// Whether `part` (a user, host or path shown to users) and a secret share text: either
/// contains the other.
fn overlaps_secret(part: &str, secrets: &[String]) -> bool {
    let decoded = percent_decode(part);
    secrets.iter().any(|s| {
        s.contains(part)
            || part.contains(s.as_str())
            || s.contains(&decoded)
            || decoded.contains(s.as_str())
    })
}

/// Whether a file holding secrets (a registry password file) is private enough to read: owned
/// by the server's OS user with no group or other access (0600 or stricter); or, with
/// `root_may_share_with_group` (PostgreSQL's own rule for the server's private key,
/// `ssl_key_file`, used for `snowflake.registry_password_file`), also owned by root with no
/// other access (0640 or stricter: the group may be the server's, as Kubernetes secret
/// volumes and Debian's ssl-cert group set it). `Err` says why not, for the message.
pub fn private_file_allowed(
    owner_uid: u32,
    server_uid: u32,
    mode: u32,
    root_may_share_with_group: bool,
) -> Result<(), String> {
    let mode = mode & 0o777;
    if owner_uid == server_uid {
        if mode & 0o077 != 0 {
            return Err(format!(
                "it has mode {mode:04o}: a file owned by the server's OS user must give no access to group or others (chmod 0600)"
            ));
        }
        Ok(())
    } else if owner_uid == 0 && root_may_share_with_group {
        if mode & 0o037 != 0 {
            return Err(format!(
                "it has mode {mode:04o}: a file owned by root must give no access to others and only read access to its group (chmod 0640)"
            ));
        }
        Ok(())
    } else {
        Err(format!(
            "it is owned by user id {owner_uid}: it must be owned by the server's OS user (uid {server_uid}){}",
            if root_may_share_with_group { " or by root" } else { "" }
        ))
    }
}

/// `uri` for a role that may not read `snowflake.registry`: its scheme only, as
/// `scheme://…` (no user, host, port or path: the setting is superuser-only, and other
/// servers' addresses are not every role's to see). A scheme is kept to the characters a URI
/// scheme may have, at most 32; without `://` the text is not shown at all.
pub fn scheme_only(uri: &str) -> String {
    let scheme: String = uri
        .split_once("://")
        .map_or("registry", |(scheme, _)| scheme)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        .take(32)
        .collect();
    format!("{scheme}://…")
}

/// Whether `uri` itself holds a password: in its user information, or as the value of a
/// query parameter naming one (`passfile` names a file: it does not count). Members of
/// `pg_read_all_settings` read `snowflake.registry`, so a password belongs in
/// `snowflake.registry_password_file` instead.
pub fn holds_password(uri: &str) -> bool {
    let mut uri = uri.to_string();
    // ASCII case folding keeps byte offsets, so the offset found applies to `uri`.
    while let Some(i) = uri.to_ascii_lowercase().find("passfile=") {
        uri.replace_range(i..i + "passfile".len(), "file");
    }
    !secret_candidates(&uri).is_empty()
}

#[cfg(test)]
mod tests {
    use super::{holds_password, scheme_only};

    #[test]
    fn scheme_only_shows_nothing_past_the_scheme() {
        assert_eq!(scheme_only("redis://:pw@10.0.0.1:6379/0"), "redis://…");
        assert_eq!(
            scheme_only("rediss+sentinel://a:1,b:2/m"),
            "rediss+sentinel://…"
        );
        assert_eq!(
            scheme_only("postgresql://u:p@h/db?sslmode=verify-full"),
            "postgresql://…"
        );
        assert_eq!(scheme_only("no scheme here: pw"), "registry://…");
        assert_eq!(scheme_only("re dis@x://h"), "redisx://…");
    }

    #[test]
    fn password_in_the_uri() {
        assert!(holds_password("redis://:pw@h:6379/0"));
        assert!(holds_password("postgresql://u:pw@h/db"));
        assert!(holds_password("postgresql://u@h/db?password=pw"));
        assert!(holds_password(
            "postgresql://u@h/db?passfile=/f&PASSWORD=pw"
        ));
        assert!(!holds_password("postgresql://u@h/db?passfile=/etc/f"));
        assert!(!holds_password("etcd://u@h1,h2/p"));
        assert!(!holds_password("redis+sentinel://h:26379/m"));
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shows_scheme_user_hosts_and_database() {
        assert_eq!(
            redacted("redis://:secret@127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(
            redacted("redis://default:secret@127.0.0.1:6379"),
            "redis://default@127.0.0.1:6379"
        );
        assert_eq!(
            redacted("postgresql://app:pw@db:5432/reg"),
            "postgresql://app@db:5432/reg"
        );
        assert_eq!(
            redacted("postgresql://app@db/reg"),
            "postgresql://app@db/reg"
        );
        assert_eq!(redacted("redis://h:1"), "redis://h:1");
        assert_eq!(
            redacted("postgresql://u@h1:5432,h2:5433/reg?target_session_attrs=read-write"),
            "postgresql://u@h1:5432,h2:5433/reg"
        );
        assert_eq!(redacted("not a uri"), MASK);
    }

    /// The forms the security review reproduced, and their neighbours.
    #[test]
    fn no_password_form_is_shown() {
        let cases = [
            ("postgresql://reguser:Pa/ssw0rd@host/db", "Pa/ssw0rd"),
            ("postgresql://reguser:Pa%2Fssw0rd@host/db", "Pa/ssw0rd"),
            ("postgresql://reguser:Pa?ssw0rd@host:5432/db", "Pa?ssw0rd"),
            ("postgresql://reguser:Pa#ssw0rd@host:5432/db", "Pa#ssw0rd"),
            ("postgresql://reguser@host/db?password=Sekr3tQ", "Sekr3tQ"),
            (
                "postgresql://host/db?user=u&sslmode=disable&password=Sekr3tQ",
                "Sekr3tQ",
            ),
            ("postgresql://host/db?pass%77ord=Sekr3tQ", "Sekr3tQ"),
            ("postgresql://host/db?sslpassword=Sekr3tQ", "Sekr3tQ"),
            ("postgresql://host:5432/db?user=u&password=a@bcd", "a@bcd"),
            ("postgres://u:p%40ss@host/db", "p@ss"),
            ("redis://:R3disPw@127.0.0.1:6379/0", "R3disPw"),
            ("redis://default:R3disPw@127.0.0.1:6379", "R3disPw"),
            ("redis://default:R3%2FdisPw@127.0.0.1:6379", "R3/disPw"),
            ("redis://default:R3/disPw@127.0.0.1:6379", "R3/disPw"),
        ];
        for (uri, password) in cases {
            let shown = redacted(uri);
            assert!(!shown.contains(password), "{uri} shown as {shown}");
            for fragment in password.split(['/', '?', '#', '@']) {
                if fragment.len() >= 3 {
                    assert!(!shown.contains(fragment), "{uri} shown as {shown}");
                }
            }
            let message = format!("could not connect to {uri}: refused ({password})");
            let clean = without_secrets(&message, uri);
            assert!(!clean.contains(password), "{message} cleaned to {clean}");
        }
    }

    #[test]
    fn private_files_follow_the_server_key_rule() {
        let server = 105;
        let key_rule = |owner, mode| private_file_allowed(owner, server, mode, true);
        assert!(key_rule(server, 0o100600).is_ok());
        assert!(key_rule(server, 0o400).is_ok());
        assert!(key_rule(server, 0o640).is_err());
        assert!(key_rule(server, 0o604).is_err());
        assert!(key_rule(0, 0o640).is_ok());
        assert!(key_rule(0, 0o600).is_ok());
        assert!(key_rule(0, 0o660).is_err());
        assert!(key_rule(0, 0o644).is_err());
        let other = key_rule(1000, 0o600).unwrap_err();
        assert!(other.contains("1000") && other.contains("105"), "{other}");
        // libpq's files (.pgpass): the server user's own, 0600 or stricter; not root's.
        assert!(private_file_allowed(server, server, 0o600, false).is_ok());
        assert!(private_file_allowed(0, server, 0o640, false).is_err());
        assert!(private_file_allowed(0, server, 0o600, false).is_err());
    }

    proptest! {
        /// Never readable by others; never writable by the group; a group may read only a
        /// root-owned file; a file of any other user is refused whatever its mode.
        #[test]
        fn private_file_rule(owner in prop_oneof![Just(0u32), Just(105u32), 1u32..70000], mode in 0u32..0o1000) {
            let allowed = private_file_allowed(owner, 105, mode, true).is_ok();
            prop_assert_eq!(
                private_file_allowed(owner, 105, mode, false).is_ok(),
                owner == 105 && mode & 0o077 == 0
            );
            prop_assert!(!allowed || mode & 0o007 == 0);
            prop_assert!(!allowed || mode & 0o020 == 0);
            prop_assert!(!allowed || owner == 0 || mode & 0o070 == 0);
            prop_assert!(!allowed || owner == 0 || owner == 105);
            prop_assert_eq!(allowed, match owner {
                105 => mode & 0o077 == 0,
                0 => mode & 0o037 == 0,
                _ => false,
            });
        }
    }

    proptest! {
        /// Whatever the password and however it is written, it never shows.
        /// (`&` and `=` separate query parameters, so a query value cannot hold them.)
        #[test]
        fn password_never_shown(
            password in "[A-Za-z0-9/?#@:%]{4,16}",
            extra in "[=&]{0,1}",
            in_query in any::<bool>(),
            redis in any::<bool>(),
        ) {
            let scheme = if redis { "redis" } else { "postgresql" };
            let password = if in_query { password } else { format!("{password}{extra}") };
            let uri = if in_query {
                format!("{scheme}://reg@10.1.2.3:5432/db?password={password}")
            } else {
                format!("{scheme}://reg:{password}@10.1.2.3:5432/db")
            };
            let shown = redacted(&uri);
            prop_assert!(!shown.contains(&password), "{} shown as {}", uri, shown);
            prop_assert!(!shown.contains(&percent_decode(&password)), "{} shown as {}", uri, shown);
            let message = format!("error for {uri}: {password}");
            prop_assert!(!without_secrets(&message, &uri).contains(&password));
        }
    }
}
