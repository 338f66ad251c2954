//! Wire types of the five lease subjects: strict request decoding, input bounds,
//! replies exactly as the contract shapes them, and the error kinds.
//!
//! Files: this one holds the subjects, the input bounds, the error kinds and the
//! requests with their strict decoding; `reply.rs` the replies; `renew_many.rs`
//! the batched renewal's request and reply.

mod renew_many;
mod reply;

pub use renew_many::{
    MAX_RENEW_MANY, RENEW_MANY, RenewManyReply, RenewManyRequest, RenewManyResult,
    decode_renew_many, renew_many_subject,
};
pub use reply::{AcquireReply, ForwardReply, FreeReply, Lease, ReleaseReply, Response};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

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

/// The five request/reply subjects of the lease API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `api.leases.acquire`
    Acquire,
    /// `api.leases.renew`
    Renew,
    /// `api.leases.release`
    Release,
    /// `api.leases.owner`
    Owner,
    /// `api.leases.forward`
    Forward,
}

impl Endpoint {
    /// Every endpoint, in the order the docs list them.
    pub const ALL: [Self; 5] = [
        Self::Acquire,
        Self::Renew,
        Self::Release,
        Self::Owner,
        Self::Forward,
    ];

    /// The last subject token, which is also the micro-service endpoint name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Renew => "renew",
            Self::Release => "release",
            Self::Owner => "owner",
            Self::Forward => "forward",
        }
    }

    /// The full request subject, e.g. `api.leases.acquire`.
    pub fn subject(self) -> String {
        format!("{}.{}", crate::subjects::API_PREFIX, self.name())
    }

    /// The endpoint for a full subject or a bare name.
    pub fn from_subject(subject: &str) -> Option<Self> {
        let name = subject
            .strip_prefix(crate::subjects::API_PREFIX)
            .and_then(|s| s.strip_prefix('.'))
            .unwrap_or(subject);
        Self::ALL.into_iter().find(|e| e.name() == name)
    }
}

/// Why a call failed, as the `kind` field of an error reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is malformed or outside a bound: fix the request.
    Invalid,
    /// The server cannot do per-message TTL, so there is no leases bucket.
    Unsupported,
    /// The caller does not hold the key (expired, released, or another holder's).
    Lost,
    /// The caller holds the key but its revision is not the current fence.
    FenceMismatch,
    /// JetStream did not answer in time or has no stream leader: retry with backoff.
    Unavailable,
    /// A corrupt record, an unexpected JetStream error, or the service stopping.
    Internal,
    /// Forward: nobody holds the key.
    NotHeld,
    /// Forward: no responder on the owner's inbox, and the owner did not change.
    OwnerUnavailable,
    /// Forward: the owner rejected the request as stale, and the owner did not change.
    OwnerRejected,
    /// Forward: no reply within `timeout_ms`; never retried.
    OwnerTimeout,
    /// Forward: the owner's reply, wrapped, does not fit the server's `max_payload`.
    ReplyTooLarge,
    /// Tenancy (an extension): the request did not come through a tenant's import,
    /// the lease is bound to another user of the account, or the tenant is at its
    /// cap of live leases. Names no other holder and no fence.
    Forbidden,
}

impl ErrorKind {
    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Invalid => "invalid",
            Self::Unsupported => "unsupported",
            Self::Lost => "lost",
            Self::FenceMismatch => "fence_mismatch",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
            Self::NotHeld => "not_held",
            Self::OwnerUnavailable => "owner_unavailable",
            Self::OwnerRejected => "owner_rejected",
            Self::OwnerTimeout => "owner_timeout",
            Self::ReplyTooLarge => "reply_too_large",
            Self::Forbidden => "forbidden",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed call: `{"error": "...", "kind": "..."}`, plus the owner last tried on forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// A human sentence saying what went wrong.
    pub error: String,
    /// The machine-readable reason.
    pub kind: ErrorKind,
    /// Forward only: the holder dagnats last tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Forward only: the revision of the lease dagnats last tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

impl ErrorReply {
    /// An error reply without an owner.
    pub fn new(kind: ErrorKind, error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            kind,
            holder: None,
            revision: None,
        }
    }
}

/// `api.leases.acquire`: grant `key` to `holder` for `ttl_ms` if nobody holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireRequest {
    /// The lease key, one subject token.
    pub key: String,
    /// The caller's holder ID, unique per process.
    pub holder: String,
    /// Lease time to live, whole seconds in milliseconds.
    pub ttl_ms: u64,
}

/// `api.leases.renew`: extend the lease to `ttl_ms` from now under the fence check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewRequest {
    /// The lease key.
    pub key: String,
    /// The caller's holder ID.
    pub holder: String,
    /// The fence from the caller's last reply.
    pub revision: u64,
    /// New time to live; the lease's own when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// `api.leases.release`: free the key under the fence check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// The lease key.
    pub key: String,
    /// The caller's holder ID.
    pub holder: String,
    /// The fence from the caller's last reply.
    pub revision: u64,
}

/// `api.leases.owner`: who holds `key`, with no side effects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRequest {
    /// The lease key.
    pub key: String,
}

/// `api.leases.forward` as it travels: the payload still base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardRequestWire {
    /// The lease key whose owner should receive the payload.
    pub key: String,
    /// The request body for the owner, base64 (standard alphabet, padded).
    pub payload: String,
    /// Bound on the whole call, 100 to 30000.
    pub timeout_ms: u64,
}

/// `api.leases.forward`, decoded: the payload as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardRequest {
    /// The lease key whose owner should receive the payload.
    pub key: String,
    /// The decoded request body for the owner.
    pub payload: Vec<u8>,
    /// Bound on the whole call, 100 to 30000.
    pub timeout_ms: u64,
}

/// A decoded and validated request to one of the five subjects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// See [`AcquireRequest`].
    Acquire(AcquireRequest),
    /// See [`RenewRequest`].
    Renew(RenewRequest),
    /// See [`ReleaseRequest`].
    Release(ReleaseRequest),
    /// See [`OwnerRequest`].
    Owner(OwnerRequest),
    /// See [`ForwardRequest`].
    Forward(ForwardRequest),
}

impl Request {
    /// The endpoint this request belongs to.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Self::Acquire(_) => Endpoint::Acquire,
            Self::Renew(_) => Endpoint::Renew,
            Self::Release(_) => Endpoint::Release,
            Self::Owner(_) => Endpoint::Owner,
            Self::Forward(_) => Endpoint::Forward,
        }
    }

    /// The lease key the request is about.
    pub fn key(&self) -> &str {
        match self {
            Self::Acquire(r) => &r.key,
            Self::Renew(r) => &r.key,
            Self::Release(r) => &r.key,
            Self::Owner(r) => &r.key,
            Self::Forward(r) => &r.key,
        }
    }

    /// Decodes and validates a request body for `endpoint`.
    ///
    /// The four lease calls share one set of request fields (`key`, `holder`,
    /// `revision`, `ttl_ms`): each checks the ones it uses and ignores the others,
    /// because clients reuse one request struct for every call. Any other field is
    /// `invalid`. Every failure is an `invalid` [`ErrorReply`] whose sentence names
    /// the field.
    pub fn decode(endpoint: Endpoint, body: &[u8]) -> Result<Self, ErrorReply> {
        if endpoint == Endpoint::Forward {
            return decode_forward(body);
        }
        let fields: SharedFields = decode_json(endpoint, body)?;
        let name = endpoint.name();
        let missing =
            |field: &str| invalid(format!("invalid {name} request: missing field `{field}`"));
        let key = fields.key.ok_or_else(|| missing("key"))?;
        check_name("key", &key)?;
        if endpoint == Endpoint::Owner {
            return Ok(Self::Owner(OwnerRequest { key }));
        }
        let holder = fields.holder.ok_or_else(|| missing("holder"))?;
        check_name("holder", &holder)?;
        match endpoint {
            Endpoint::Acquire => {
                let ttl_ms = fields.ttl_ms.ok_or_else(|| missing("ttl_ms"))?;
                check_ttl(ttl_ms)?;
                Ok(Self::Acquire(AcquireRequest {
                    key,
                    holder,
                    ttl_ms,
                }))
            }
            Endpoint::Renew => {
                let revision = fields.revision.ok_or_else(|| missing("revision"))?;
                if let Some(ttl) = fields.ttl_ms {
                    check_ttl(ttl)?;
                }
                Ok(Self::Renew(RenewRequest {
                    key,
                    holder,
                    revision,
                    ttl_ms: fields.ttl_ms,
                }))
            }
            Endpoint::Release => {
                let revision = fields.revision.ok_or_else(|| missing("revision"))?;
                Ok(Self::Release(ReleaseRequest {
                    key,
                    holder,
                    revision,
                }))
            }
            Endpoint::Owner | Endpoint::Forward => unreachable!("decoded above"),
        }
    }
}

/// The request fields the four lease calls share. Each field is typed, so a wrong
/// type is `invalid` even where the call ignores the field; unknown fields are not.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SharedFields {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    holder: Option<String>,
    #[serde(default)]
    revision: Option<u64>,
    #[serde(default)]
    ttl_ms: Option<u64>,
}

fn decode_forward(body: &[u8]) -> Result<Request, ErrorReply> {
    let r: ForwardRequestWire = decode_json(Endpoint::Forward, body)?;
    check_name("key", &r.key)?;
    if !(MIN_FORWARD_TIMEOUT_MS..=MAX_FORWARD_TIMEOUT_MS).contains(&r.timeout_ms) {
        return Err(invalid(format!(
            "field `timeout_ms` must be from {MIN_FORWARD_TIMEOUT_MS} to \
             {MAX_FORWARD_TIMEOUT_MS}, got {}",
            r.timeout_ms
        )));
    }
    let payload = base64::engine::general_purpose::STANDARD
        .decode(r.payload.as_bytes())
        .map_err(|e| invalid(format!("field `payload` is not base64: {e}")))?;
    Ok(Request::Forward(ForwardRequest {
        key: r.key,
        payload,
        timeout_ms: r.timeout_ms,
    }))
}

fn invalid(error: String) -> ErrorReply {
    ErrorReply::new(ErrorKind::Invalid, error)
}

fn decode_json<T: serde::de::DeserializeOwned>(
    endpoint: Endpoint,
    body: &[u8],
) -> Result<T, ErrorReply> {
    decode_json_named(endpoint.name(), body)
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

impl Request {
    /// The JSON body a client sends for this request (a forward's payload as base64).
    pub fn to_json(&self) -> Vec<u8> {
        let encoded = match self {
            Self::Acquire(r) => serde_json::to_vec(r),
            Self::Renew(r) => serde_json::to_vec(r),
            Self::Release(r) => serde_json::to_vec(r),
            Self::Owner(r) => serde_json::to_vec(r),
            Self::Forward(r) => serde_json::to_vec(&ForwardRequestWire {
                key: r.key.clone(),
                payload: base64::engine::general_purpose::STANDARD.encode(&r.payload),
                timeout_ms: r.timeout_ms,
            }),
        };
        encoded.expect("request types always serialise")
    }
}

/// Reads a JSON object body of request `name`; every failure is `invalid`, naming
/// the field.
fn decode_json_named<T: serde::de::DeserializeOwned>(
    name: &str,
    body: &[u8],
) -> Result<T, ErrorReply> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    match parsed {
        Ok(value) => {
            de.end()
                .map_err(|e| invalid(format!("invalid {name} request: body is not JSON: {e}")))?;
            // serde reads a struct from a JSON array too (`["k","h"]` would be key
            // and holder): only an object names its fields.
            if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
                return Err(invalid(format!(
                    "invalid {name} request: the body must be a JSON object"
                )));
            }
            Ok(value)
        }
        Err(err) => {
            let path = err.path().to_string();
            let inner = err.into_inner();
            let what = if inner.is_syntax() || inner.is_eof() {
                format!("body is not JSON: {inner}")
            } else if path == "." {
                format!("{inner}")
            } else {
                format!("field `{path}`: {inner}")
            };
            Err(invalid(format!("invalid {name} request: {what}")))
        }
    }
}
