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

/// The live leases of each tenant, as the change events and the service's own
/// grants show them, and the cap on them (`serve --max-leases-per-tenant`).
///
/// The count is each instance's own view: it follows every tenant's change events
/// (`dagnats.lease.changed.<account>.<key>`), so after a start it learns the leases
/// held before within a third of their TTL (their next renewal), and acquires of
/// new keys racing on several instances can pass the cap by those in flight. An
/// acquire of a key the tenant already holds (a retry, a renew's sibling) is never
/// refused.
#[derive(Debug, Clone, Default)]
pub struct TenantLeases {
    cap: Option<usize>,
    held: std::collections::HashMap<String, std::collections::HashSet<String>>,
}

impl TenantLeases {
    /// At most `cap` live leases a tenant (`None`: no cap).
    pub fn new(cap: Option<usize>) -> Self {
        Self {
            cap,
            held: Default::default(),
        }
    }

    /// A change event on `dagnats.lease.changed.<account>.<key>`: held after an
    /// acquire or renewal, free after anything else.
    pub fn handle_change(&mut self, account: &str, key: &str, kind: crate::change::ChangeKind) {
        if kind.may_free_key() {
            if let Some(keys) = self.held.get_mut(account) {
                keys.remove(key);
                if keys.is_empty() {
                    self.held.remove(account);
                }
            }
        } else {
            self.held
                .entry(account.to_string())
                .or_default()
                .insert(key.to_string());
        }
    }

    /// The service granted `key` to a tenant's holder.
    pub fn handle_granted(&mut self, account: &str, key: &str) {
        self.handle_change(account, key, crate::change::ChangeKind::Acquired);
    }

    /// The service released `key` for a tenant's holder.
    pub fn handle_released(&mut self, account: &str, key: &str) {
        self.handle_change(account, key, crate::change::ChangeKind::Released);
    }

    /// Live leases of `account` as known.
    pub fn count(&self, account: &str) -> usize {
        self.held.get(account).map_or(0, |k| k.len())
    }

    /// Whether an acquire of `key` by `account` may run, or the refusal.
    pub fn check_acquire(&self, account: &str, key: &str) -> Result<(), ErrorReply> {
        let Some(cap) = self.cap else { return Ok(()) };
        let keys = self.held.get(account);
        if keys.is_some_and(|k| k.contains(key)) || keys.map_or(0, |k| k.len()) < cap {
            return Ok(());
        }
        Err(forbidden(format!(
            "account `{account}` holds its cap of {cap} live leases: release one, or ask the \
             operator for a higher --max-leases-per-tenant"
        )))
    }

    /// The tenant and key of a change event's subject, `dagnats.lease.changed.<account>.<key>`.
    pub fn key_of(subject: &str) -> Option<(&str, &str)> {
        let rest = subject
            .strip_prefix(crate::subjects::CHANGED_PREFIX)?
            .strip_prefix('.')?;
        let (account, key) = rest.split_once('.')?;
        (is_token(account) && !key.is_empty() && !key.contains('.')).then_some((account, key))
    }
}

impl TenantLeases {
    /// Whether a request of `caller` to `endpoint` with `body` may run: only an
    /// acquire can be refused (a body that does not decode runs, to be answered
    /// `invalid` by its call).
    pub fn check_request(
        &self,
        caller: &Caller,
        endpoint: crate::wire::Endpoint,
        body: &[u8],
    ) -> Result<(), ErrorReply> {
        if endpoint != crate::wire::Endpoint::Acquire || self.cap.is_none() {
            return Ok(());
        }
        match crate::wire::Request::decode(endpoint, body) {
            Ok(request) => self.check_acquire(&caller.account, request.key()),
            Err(_) => Ok(()),
        }
    }
}

/// Why tenancy cannot trust this server's `Nats-Request-Info`, if it cannot: before
/// 2.11.15, 2.12.6 and 2.14.0 a request through a leafnode keeps a header the
/// client forged (and before those, a client's duplicate header stays beside the
/// server's, which [`caller_of`] refuses). `None` for a server that rebuilds it.
pub fn request_info_warning(version: &str) -> Option<String> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split(['.', '-']).map(|p| p.parse::<u64>().ok());
    let (major, minor, patch) = (parts.next()??, parts.next()??, parts.next().flatten()?);
    let fixed = match (major, minor) {
        (2, 11) => patch >= 15,
        (2, 12) => patch >= 6,
        (2, 13) => false,
        (2, m) => m >= 14,
        (m, _) => m > 2,
    };
    (!fixed).then(|| {
        format!(
            "nats-server {v} keeps a Nats-Request-Info header a client forged over a leafnode \
             (fixed in 2.11.15, 2.12.6 and 2.14.0): with leafnodes into tenant accounts, a \
             tenant can pose as another; upgrade the server"
        )
    })
}
