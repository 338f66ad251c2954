//! Tenancy through NATS accounts (`serve --tenancy accounts`): who a request comes
//! from, as the NATS server vouches for it, and where that tenant's keys live.
//!
//! The service runs in an account of its own and exports its endpoints as
//! `api.leases.*.*` with `account_token_position: 3`; each tenant account
//! imports its own token, `api.leases.<account>.*`, as `api.leases.*`, so the
//! server (not the client) writes the tenant into the subject the service
//! receives, and lets no account import another's token. Across the import the
//! server also rewrites the reply to `_R_.…` (no client may publish with such a
//! reply itself) and sets `Nats-Request-Info`: `acc` always, and `user` when the
//! import shares identity (`share: true`). A request is a tenant's only with an
//! `_R_.` reply and an account the deployment names ([`TenantAccounts`]); the
//! user comes from the server's header, read strictly: it must be the request's
//! only header, strict JSON of the server's shape naming the subject's account.
//! A client header beside it (a folded line, a bare line feed) is refused, never
//! guessed around.
//!
//! A tenant's key `job` is stored at `$KV.leases.<account>.job` and republished on
//! `dagnats.lease.changed.<account>.job`, which the tenant imports as
//! `dagnats.lease.changed.job`; its holders' inboxes are reached through the
//! service account's import at `dagnats.lease.inbox.<account>.<holder>.<key>`.
//! Where the import shares identity, a lease is bound to the user that acquired it.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde::de::IgnoredAny;

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

/// The tenant accounts a deployment names (`serve --tenant-account`): a request
/// whose subject names any other account (a made-up one, the service's own) is
/// refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantAccounts(std::collections::BTreeSet<String>);

impl TenantAccounts {
    /// These accounts; each must be one subject token of `[A-Za-z0-9_-]`.
    pub fn new<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Result<Self, String> {
        let mut set = std::collections::BTreeSet::new();
        for name in names {
            let name = name.as_ref();
            if !is_token(name) {
                return Err(format!(
                    "tenant account {name:?} must be one subject token of \
                     [A-Za-z0-9_-]{{1,{MAX_ACCOUNT_LEN}}}"
                ));
            }
            set.insert(name.to_string());
        }
        Ok(Self(set))
    }

    /// Whether `account` is one of them.
    pub fn contains(&self, account: &str) -> bool {
        self.0.contains(account)
    }

    /// Whether none is named.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

/// The server's `Nats-Request-Info` value, every field it may write and nothing
/// else: an unknown or repeated field, or a value of another shape, is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RequestInfo {
    acc: String,
    #[serde(default)]
    user: Option<String>,
    start: Option<IgnoredAny>,
    host: Option<IgnoredAny>,
    id: Option<IgnoredAny>,
    svc: Option<IgnoredAny>,
    name: Option<IgnoredAny>,
    lang: Option<IgnoredAny>,
    ver: Option<IgnoredAny>,
    rtt: Option<IgnoredAny>,
    server: Option<IgnoredAny>,
    cluster: Option<IgnoredAny>,
    alts: Option<IgnoredAny>,
    stop: Option<IgnoredAny>,
    jwt: Option<IgnoredAny>,
    issuer_key: Option<IgnoredAny>,
    name_tag: Option<IgnoredAny>,
    tags: Option<IgnoredAny>,
    kind: Option<IgnoredAny>,
    client_type: Option<IgnoredAny>,
    client_id: Option<IgnoredAny>,
    nonce: Option<IgnoredAny>,
}

/// Tenancy: the account token and endpoint name of a request's subject,
/// `api.leases.<account>.<endpoint>`: the service account's export
/// (`api.leases.*.*`, `account_token_position: 3`) makes the server put the
/// importing account there, and no account can import another's token.
pub fn tenant_endpoint_of(subject: &str) -> Option<(&str, &str)> {
    let rest = subject
        .strip_prefix(crate::subjects::API_PREFIX)?
        .strip_prefix('.')?;
    let (account, endpoint) = rest.split_once('.')?;
    (!endpoint.contains('.')).then_some((account, endpoint))
}

/// The caller of a request that came in on `api.leases.<account>.<endpoint>`
/// with reply subject `reply` and these headers (every pair, in order), or the
/// refusal to answer with (`forbidden`).
///
/// The account is the subject's token, which the server enforces, and must be
/// one the deployment names; the `_R_.` reply shows the request crossed an
/// import. The headers must be exactly the server's one `Nats-Request-Info`,
/// strict JSON of its shape naming the same account: its `user` (where the
/// import shares identity) binds leases, so nothing else may stand beside it.
pub fn caller_of(
    account: &str,
    reply: &str,
    headers: &[(String, String)],
    tenants: &TenantAccounts,
) -> Result<Caller, ErrorReply> {
    if !reply.starts_with(IMPORT_REPLY_PREFIX) {
        return Err(forbidden(
            "this service serves tenant accounts: a request must come through an account's \
             import of api.leases.*.* (its reply rewritten to _R_. by the server), not from \
             the service's own account",
        ));
    }
    if !is_token(account) || !tenants.contains(account) {
        return Err(forbidden(format!(
            "account `{}` is not a tenant this service serves (serve --tenant-account)",
            account.escape_debug()
        )));
    }
    let [(name, info)] = headers else {
        return Err(forbidden(format!(
            "a tenant's request must carry exactly one header, the NATS server's \
             {HDR_REQUEST_INFO}, found {} headers: send the request without headers",
            headers.len()
        )));
    };
    if name != HDR_REQUEST_INFO {
        return Err(forbidden(format!(
            "a tenant's request must carry exactly one header, the NATS server's \
             {HDR_REQUEST_INFO}, found another: send the request without headers"
        )));
    }
    let info: RequestInfo = serde_json::from_str(info).map_err(|e| {
        forbidden(format!(
            "header {HDR_REQUEST_INFO} is not the NATS server's JSON: {e}"
        ))
    })?;
    if info.acc != account {
        return Err(forbidden(format!(
            "header {HDR_REQUEST_INFO} names another account than the request's subject"
        )));
    }
    let user = info.user.filter(|u| !u.is_empty());
    Ok(Caller {
        account: account.to_string(),
        user,
    })
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

/// The scope a request on `subject` is served in: `None` in one shared
/// namespace; in tenancy, its [`caller_of`] or the refusal to answer with.
pub fn scope_of(
    tenancy: Tenancy,
    tenants: &TenantAccounts,
    subject: &str,
    reply: &str,
    headers: &[(String, String)],
) -> Result<Option<Caller>, ErrorReply> {
    match tenancy {
        Tenancy::Single => Ok(None),
        Tenancy::Accounts => {
            let account = tenant_endpoint_of(subject).map_or("", |(a, _)| a);
            caller_of(account, reply, headers, tenants).map(Some)
        }
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
/// grants show them, the acquires of new keys in flight, and the cap on both
/// (`serve --max-leases-per-tenant`).
///
/// An acquire of a key the tenant neither holds nor is acquiring takes a place
/// when it arrives ([`TenantLeases::admit_request`]) and gives it back when its
/// call ends ([`TenantLeases::handle_acquire_ended`]; a grant keeps it as a
/// lease): a burst of acquires at once cannot pass the cap while its calls
/// wait. The count is each instance's own view: it follows every tenant's change
/// events (`dagnats.lease.changed.<account>.<key>`), so after a start it learns
/// the leases held before within a third of their TTL (their next renewal), and
/// acquires of new keys racing on several instances can pass the cap by those
/// in flight on the others. An acquire of a key the tenant already holds or is
/// acquiring (a retry, a renew's sibling) is never refused.
#[derive(Debug, Clone, Default)]
pub struct TenantLeases {
    cap: Option<usize>,
    held: HashMap<String, HashSet<String>>,
    /// Acquires in flight, by account and key: how many of each.
    acquiring: HashMap<String, HashMap<String, usize>>,
}

impl TenantLeases {
    /// At most `cap` live leases a tenant (`None`: no cap).
    pub fn new(cap: Option<usize>) -> Self {
        Self {
            cap,
            held: HashMap::new(),
            acquiring: HashMap::new(),
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

    /// Keys of `account` that count against its cap: its live leases as known and
    /// its acquires in flight.
    pub fn count(&self, account: &str) -> usize {
        let held = self.held.get(account);
        let extra = self.acquiring.get(account).map_or(0, |keys| {
            keys.keys()
                .filter(|k| !held.is_some_and(|h| h.contains(*k)))
                .count()
        });
        held.map_or(0, HashSet::len) + extra
    }

    /// Whether an acquire of `key` by `account` may run, or the refusal.
    pub fn check_acquire(&self, account: &str, key: &str) -> Result<(), ErrorReply> {
        let Some(cap) = self.cap else { return Ok(()) };
        let known = self.held.get(account).is_some_and(|k| k.contains(key))
            || self
                .acquiring
                .get(account)
                .is_some_and(|k| k.contains_key(key));
        if known || self.count(account) < cap {
            return Ok(());
        }
        Err(forbidden(format!(
            "account `{account}` holds its cap of {cap} live leases (acquires in flight \
             count): release one, or ask the operator for a higher --max-leases-per-tenant"
        )))
    }

    /// An acquire of `key` by `account` arrives: it takes a place under the cap
    /// until [`TenantLeases::handle_acquire_ended`], or is refused.
    pub fn begin_acquire(&mut self, account: &str, key: &str) -> Result<(), ErrorReply> {
        if self.cap.is_none() {
            return Ok(());
        }
        self.check_acquire(account, key)?;
        *self
            .acquiring
            .entry(account.to_string())
            .or_default()
            .entry(key.to_string())
            .or_default() += 1;
        Ok(())
    }

    /// An acquire [`TenantLeases::begin_acquire`] let in ended (answered,
    /// refused while waiting, cut off): its place is given back. Call
    /// [`TenantLeases::handle_granted`] first for a grant.
    pub fn handle_acquire_ended(&mut self, account: &str, key: &str) {
        let Some(keys) = self.acquiring.get_mut(account) else {
            return;
        };
        if let Some(n) = keys.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                keys.remove(key);
            }
        }
        if keys.is_empty() {
            self.acquiring.remove(account);
        }
    }

    /// The tenant and key of a change event's subject, `dagnats.lease.changed.<account>.<key>`.
    pub fn key_of(subject: &str) -> Option<(&str, &str)> {
        let rest = subject
            .strip_prefix(crate::subjects::CHANGED_PREFIX)?
            .strip_prefix('.')?;
        let (account, key) = rest.split_once('.')?;
        (is_token(account) && !key.is_empty() && !key.contains('.')).then_some((account, key))
    }

    /// A request of `caller` to `endpoint` with `body` arrives: only an acquire
    /// can be refused (a body that does not decode runs, to be answered `invalid`
    /// by its call). `Some(key)`: an acquire that took a place under the cap, to
    /// give back with [`TenantLeases::handle_acquire_ended`] when it ends.
    pub fn admit_request(
        &mut self,
        caller: &Caller,
        endpoint: crate::wire::Endpoint,
        body: &[u8],
    ) -> Result<Option<String>, ErrorReply> {
        if endpoint != crate::wire::Endpoint::Acquire || self.cap.is_none() {
            return Ok(None);
        }
        match crate::wire::Request::decode(endpoint, body) {
            Ok(request) => {
                let key = request.key().to_string();
                self.begin_acquire(&caller.account, &key)?;
                Ok(Some(key))
            }
            Err(_) => Ok(None),
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
