//! Worker ids from a registry (`snowflake.worker_id = 'auto'`): the claim a caller waits
//! for, and the registry worker's WARNING and LOG lines.

use super::*;

/// The registry worker could not set itself up (logged as a WARNING).
pub fn claim_setup(what: &str) -> LogLine {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("snowflake: {what}"),
        "snowflake.worker_id = 'auto' cannot claim a worker id.",
        "Check the server log for the cause.",
    )
    .into_warning()
}

/// The WARNING written once when the registry worker cannot use `snowflake.registry` at all
/// (a URI it refuses, a password file or CA file it cannot use): the worker then reports
/// `refused` until the server restarts, and without this line the cause was only in the
/// DETAIL of a session's error (issue 38's second walkthrough). `why` has no secret (the
/// clients' errors are filtered: `snowflake_registry::open`).
pub fn registry_unusable(registry: &str, why: &str) -> LogLine {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("snowflake: cannot use registry {registry}"),
        why.to_string(),
        "Correct snowflake.registry, snowflake.registry_password_file or snowflake.registry_ca_file (or the files they name), then restart the server; until then no worker id is claimed.",
    ).into_warning()
}

/// The LOG line written when the registry grants a claim.
pub fn claimed(
    datacenter_id: u8,
    worker_id: u8,
    registry: &str,
    own: bool,
    floor_unix_ms: i64,
) -> LogLine {
    let how = if own {
        format!(
            "The claim was already this server's (it crash-restarted, or its registry worker claimed again); IDs start at {} or later, as before.",
            ms(floor_unix_ms)
        )
    } else {
        format!(
            "The worker id was free; IDs start above its earlier holders' IDs, at {} or later.",
            ms(floor_unix_ms)
        )
    };
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!(
            "snowflake: claimed worker id {worker_id} in datacenter {datacenter_id} from {registry}"
        ),
        how,
        "",
    )
    .into_log()
}

/// The WARNING written when a granted worker id is given back because its floor is further
/// ahead of this server's clock than a caller may wait.
pub fn mark_ahead(
    datacenter_id: u8,
    worker_id: u8,
    registry: &str,
    floor_unix_ms: i64,
    ahead_ms: i64,
    usable_ms: i64,
) -> LogLine {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "snowflake: worker id {worker_id} in datacenter {datacenter_id} of registry {registry} has a high-water mark ahead of this server's clock"
        ),
        snowflake_core::holder::mark_ahead_detail(worker_id, floor_unix_ms, ahead_ms, usable_ms),
        "A server whose clock ran ahead, or a registry clock that stepped back, left the mark. This server claims another worker id meanwhile; check the fleet's clock synchronization.",
    ).into_warning()
}

/// The WARNING written when a registry comes back from a loss of data with a clock further
/// behind its previous one than the settle after a loss covers.
pub fn registry_clock_jumped(
    registry: &str,
    offset_before_ms: i64,
    offset_after_ms: i64,
    allowed_ms: u64,
) -> LogLine {
    let back = offset_before_ms - offset_after_ms;
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("snowflake: registry {registry} came back with a clock {back} ms behind its previous one"),
        format!(
            "The registry began anew (restarted, restored or failed over) and its clock now reads {offset_after_ms} ms from this server's, against {offset_before_ms} ms before: more than the {allowed_ms} ms (3/10 of snowflake.claim_ttl) that its settling covers. A server cut off from the registry through the settling could have its worker id given to another server while it still issues, and duplicate IDs follow."
        ),
        "Keep the clocks of every host the registry can run on (its replicas, failover targets, the hosts it is restarted on) synchronized with the servers' clocks.",
    ).into_warning()
}

/// The LOG line written when a claim is fenced.
pub fn claim_fenced(datacenter_id: u8, worker_id: u8, registry: &str, why: &str) -> LogLine {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "snowflake: stopped issuing IDs with worker id {worker_id} in datacenter {datacenter_id}: the claim from {registry} is no longer this server's"
        ),
        why.to_string(),
        "The server claims a worker id again as soon as the registry answers.",
    ).into_log()
}

/// The WARNING written when giving a claim back at shutdown fails: the worker id stays
/// taken until its claim lapses.
pub fn release_failed(
    datacenter_id: u8,
    worker_id: u8,
    registry: &str,
    why: &str,
    ttl_ms: u64,
) -> LogLine {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
        format!(
            "snowflake: could not release worker id {worker_id} in datacenter {datacenter_id} to {registry}"
        ),
        format!("{why}; the claim stays taken until it lapses, {ttl_ms} ms (snowflake.claim_ttl) after its last renewal."),
        "If this server starts again before then, it claims another worker id; nothing else is needed.",
    ).into_warning()
}

/// `snowflake.worker_id = 'auto'` and no usable claim: the caller's error (55000).
pub fn claim_unavailable(
    status: snowflake_core::claim::ClaimStatus,
    detail: &str,
    registry: &str,
    datacenter_id: u8,
) -> SnowflakeError {
    use snowflake_core::claim::ClaimStatus;
    let code = PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    let detail = if detail.is_empty() {
        "The registry worker has not claimed a worker id yet.".to_string()
    } else {
        detail.to_string()
    };
    match status {
        ClaimStatus::Exhausted => SnowflakeError::new(
            code,
            format!("no free worker id in datacenter {datacenter_id} of registry {registry}"),
            detail,
            "Stop a server that no longer needs its worker id (its claim lapses after snowflake.claim_ttl), or give some servers another snowflake.datacenter_id.",
        ),
        ClaimStatus::Settling => SnowflakeError::new(
            code,
            format!("registry {registry} is not granting worker ids yet"),
            detail,
            "Retry shortly; the server claims its worker id by itself.",
        ),
        ClaimStatus::Refused => SnowflakeError::new(
            code,
            format!("registry {registry} refused this server a worker id"),
            detail,
            "Fix the cause named above (clock synchronization, snowflake.epoch, snowflake.claim_ttl, snowflake.registry) and restart the server if it is a setting. Change snowflake.claim_ttl across a fleet in steps of at most a fifth.",
        ),
        ClaimStatus::MarkAhead => SnowflakeError::new(
            code,
            format!("registry {registry} records a high-water mark ahead of this server's clock"),
            detail,
            "The mark was left by a server whose clock ran ahead. IDs resume by themselves once another worker id is free or this server's clock nears the mark; check the fleet's clock synchronization.",
        ),
        ClaimStatus::Fenced => SnowflakeError::new(
            code,
            format!("this server's worker id claim from registry {registry} has lapsed"),
            detail,
            "Check that the registry is reachable from this server; IDs resume by themselves once it claims a worker id again.",
        ),
        ClaimStatus::Starting | ClaimStatus::Held | ClaimStatus::Unreachable => SnowflakeError::new(
            code,
            format!("no worker id claimed from registry {registry}"),
            detail,
            "Check that the registry is reachable from this server; IDs are issued by themselves once it claims a worker id.",
        ),
    }
}

/// A registry request failed, with a cause other than the last one logged: logged once per
/// change of cause, so that a refused coordinator (its tables owned by another role) or an
/// unreachable registry shows in the server log, not only in callers' DETAIL. `why` has no
/// secret (the clients' errors are filtered; see `snowflake_registry::open`).
pub fn registry_request_failed(registry: &str, why: &str) -> LogLine {
    SnowflakeError::new(
        PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
        format!("snowflake: a request to registry {registry} failed"),
        why.to_string(),
        "Fix the cause named in DETAIL (the registry's address, TLS, the password, or the owners of the coordinator's schema and tables); the registry worker retries by itself.",
    ).into_log()
}
