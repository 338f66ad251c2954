//! Tenancy through NATS accounts (`serve --tenancy accounts`): who a request comes
//! from, as the NATS server vouches for it, and where that tenant's keys live.
//!
//! The service runs in an account of its own; each tenant account imports its
//! endpoints. Across a service import the server rewrites the reply to `_R_.…`
//! (no client may publish with such a reply itself) and sets `Nats-Request-Info`
//! itself: `acc` always, and `user` when the import shares identity (`share:
//! true`). Nothing a client writes is trusted: a request that did not cross an
//! import (an `_INBOX.` reply: the service's own account) is refused whatever
//! header it carries, and the header must be there exactly once, spelled exactly
//! (nats-server before 2.11.15 kept a client's duplicate next to its own).
//!
//! A tenant's key `job` is stored at `$KV.leases.<account>.job` and republished on
//! `dagnats.lease.changed.<account>.job`, which the tenant imports as
//! `dagnats.lease.changed.job`; its holders' inboxes are reached through the
//! service account's import at `dagnats.lease.inbox.<account>.<holder>.<key>`.
//! Where the import shares identity, a lease is bound to the user that acquired it.

use serde::Deserialize;

use crate::wire::{ErrorKind, ErrorReply};

/// The header the server sets across a service import.
pub const HDR_REQUEST_INFO: &str = "Nats-Request-Info";
/// The reply prefix the server gives a request that crossed an import.
pub const IMPORT_REPLY_PREFIX: &str = "_R_.";
/// The longest account name accepted (an operator-mode account is a 56-character
/// public key).
pub const MAX_ACCOUNT_LEN: usize = 128;

/// Whether the service serves one account or tenant accounts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Tenancy {
    /// Every caller shares one key namespace (the default).
    #[default]
    Single,
    /// Each importing account has its own keys; see the [module docs](self).
    Accounts,
}

/// Who a request comes from, as the server said.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The requesting account: the tenant.
    pub account: String,
    /// The requesting user, where the import shares identity.
    pub user: Option<String>,
}

#[derive(Deserialize)]
struct RequestInfo {
    acc: Option<String>,
    user: Option<String>,
}

/// The caller of a request with reply subject `reply` and the values of its
/// `Nats-Request-Info` headers (every value, exact spelling, in order), or the
/// refusal to answer with (`forbidden`).
pub fn caller_of(reply: &str, request_info: &[&str]) -> Result<Caller, ErrorReply> {
    if !reply.starts_with(IMPORT_REPLY_PREFIX) {
        return Err(forbidden(
            "this service serves tenant accounts: a request must come through an account's \
             import of api.leases.* (its reply rewritten to _R_. by the server), not from \
             the service's own account",
        ));
    }
    let [info] = request_info else {
        return Err(forbidden(format!(
            "header {HDR_REQUEST_INFO} must be set once by the NATS server, found {} \
             (a server before 2.11.15 keeps a client's copy: upgrade it)",
            request_info.len()
        )));
    };
    let info: RequestInfo = serde_json::from_str(info).map_err(|e| {
        forbidden(format!(
            "header {HDR_REQUEST_INFO} is not the server's JSON: {e}"
        ))
    })?;
    let account = info.acc.filter(|a| is_token(a)).ok_or_else(|| {
        forbidden(format!(
            "header {HDR_REQUEST_INFO} names no account of [A-Za-z0-9_-]{{1,{MAX_ACCOUNT_LEN}}}"
        ))
    })?;
    let user = info.user.filter(|u| !u.is_empty());
    Ok(Caller { account, user })
}

/// One subject token an account name can be: `[A-Za-z0-9_-]`, 1 to
/// [`MAX_ACCOUNT_LEN`] bytes (so a name with a dot cannot reach another
/// tenant's keys or their read confirmations).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ACCOUNT_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn forbidden(error: impl Into<String>) -> ErrorReply {
    ErrorReply::new(ErrorKind::Forbidden, error)
}

/// The scope a request is served in: `None` in one shared namespace; in tenancy,
/// its [`caller_of`] or the refusal to answer with.
pub fn scope_of(
    tenancy: Tenancy,
    reply: &str,
    request_info: &[&str],
) -> Result<Option<Caller>, ErrorReply> {
    match tenancy {
        Tenancy::Single => Ok(None),
        Tenancy::Accounts => caller_of(reply, request_info).map(Some),
    }
}

/// Where `key` of the request's scope is stored: `<account>.<key>` for a tenant.
pub fn storage_key(scope: Option<&Caller>, key: &str) -> String {
    match scope {
        Some(c) => format!("{}.{key}", c.account),
        None => key.to_string(),
    }
}
