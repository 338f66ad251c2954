//! The input bounds of the lease subjects (name length, TTL, forward timeout) and
//! the checks of a key, holder and TTL against them.

use super::error::{ErrorReply, invalid};

/// Largest `key` or `holder`, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Smallest accepted `ttl_ms`.
pub const MIN_TTL_MS: u64 = 1_000;
/// Largest accepted `ttl_ms`.
pub const MAX_TTL_MS: u64 = 600_000;
/// Smallest accepted forward `timeout_ms`.
pub const MIN_FORWARD_TIMEOUT_MS: u64 = 100;
/// Largest accepted forward `timeout_ms`.
pub const MAX_FORWARD_TIMEOUT_MS: u64 = 30_000;
/// What a client waits past a forward's `timeout_ms` for its reply: room for the
/// two hops (client to service, service back), so that the service's own answer
/// (the owner's reply, or its `timeout` error) reaches the client before the
/// client gives up on the call.
pub const FORWARD_HOP_ROOM: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a client waits for the reply to a forward bounded by `timeout`:
/// `timeout` and [`FORWARD_HOP_ROOM`].
pub fn forward_client_wait(timeout: std::time::Duration) -> std::time::Duration {
    timeout + FORWARD_HOP_ROOM
}

/// Checks a key or holder against `[A-Za-z0-9_-]{1,128}`.
pub fn check_name(field: &str, value: &str) -> Result<(), ErrorReply> {
    if value.is_empty() || value.len() > MAX_NAME_LEN {
        return Err(invalid(format!(
            "field `{field}` must be 1 to {MAX_NAME_LEN} bytes, got {}",
            value.len()
        )));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(invalid(format!(
            "field `{field}` may hold only A-Z, a-z, 0-9, `_` and `-`, found {bad:?}"
        )));
    }
    Ok(())
}

/// Checks a `ttl_ms` against the bounds: 1000 to 600000, whole seconds.
pub fn check_ttl(ttl_ms: u64) -> Result<(), ErrorReply> {
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(invalid(format!(
            "field `ttl_ms` must be from {MIN_TTL_MS} to {MAX_TTL_MS}, got {ttl_ms}"
        )));
    }
    if !ttl_ms.is_multiple_of(1000) {
        return Err(invalid(format!(
            "field `ttl_ms` must be whole seconds (a multiple of 1000), got {ttl_ms}: \
             the server truncates message TTLs to whole seconds"
        )));
    }
    Ok(())
}
