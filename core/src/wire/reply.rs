//! Replies of the five lease subjects, exactly as the contract shapes them: the
//! lease, each endpoint's success shape, and [`Response`], with how a client
//! reads one back.

use serde::{Deserialize, Serialize};

use super::endpoint::Endpoint;
use super::error::{ErrorKind, ErrorReply};

/// A held lease as replies show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Always `true` for a lease.
    pub held: bool,
    /// The lease key.
    pub key: String,
    /// Who holds it.
    pub holder: String,
    /// The fence: the key's KV revision.
    pub revision: u64,
    /// When this tenure began, RFC 3339 UTC.
    pub acquired_at: String,
    /// When the lease runs out unless renewed, RFC 3339 UTC; advisory only.
    pub expires_at: String,
    /// The lease's time to live.
    pub ttl_ms: u64,
}

/// The reply to acquire: the lease, with `granted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireReply {
    /// `true` when the caller holds the lease now, `false` when another holder does.
    pub granted: bool,
    /// The lease: the caller's when granted, the other holder's otherwise.
    #[serde(flatten)]
    pub lease: Lease,
}

/// The reply to release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReply {
    /// Always `true`.
    pub released: bool,
    /// Always `false`.
    pub held: bool,
    /// The lease key.
    pub key: String,
    /// The holder that released it.
    pub holder: String,
    /// The revision of the delete.
    pub revision: u64,
}

/// The reply to owner when nobody holds the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeReply {
    /// Always `false`.
    pub held: bool,
    /// The lease key.
    pub key: String,
}

/// The reply to forward: the owner's reply body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardReply {
    /// The owner's reply body, base64.
    pub payload: String,
    /// The lease key.
    pub key: String,
    /// The owner that answered.
    pub holder: String,
    /// The revision of the lease the owner answered under.
    pub revision: u64,
}

/// Every reply a call can end with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Response {
    /// acquire, granted or not.
    Acquired(AcquireReply),
    /// renew, or owner of a held key.
    Lease(Lease),
    /// release.
    Released(ReleaseReply),
    /// owner of a free key.
    Free(FreeReply),
    /// forward.
    Forwarded(ForwardReply),
    /// Any failed call.
    Error(ErrorReply),
}

impl Response {
    /// The JSON body to send back.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("reply types always serialise")
    }

    /// The error kind, when this is an error reply.
    pub fn error_kind(&self) -> Option<ErrorKind> {
        match self {
            Self::Error(e) => Some(e.kind),
            _ => None,
        }
    }
}

impl Response {
    /// Reads a reply body as a client of `endpoint` receives it: an error reply when it
    /// carries `kind`, else the success shape of that endpoint. `Err` names what does
    /// not parse.
    pub fn decode(endpoint: Endpoint, body: &[u8]) -> Result<Self, String> {
        // A renewal's reply, the one a holder reads most, read straight into its
        // lease where no key can be `kind` (no `"kind"` and no escape in the body);
        // anything else is read below, which decides.
        if endpoint == Endpoint::Renew
            && !body.contains(&b'\\')
            && !body.windows(6).any(|w| w == b"\"kind\"")
            && let Ok(lease) = serde_json::from_slice::<Lease>(body)
        {
            return Ok(Self::Lease(lease));
        }
        let value: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| format!("the {} reply is not JSON: {e}", endpoint.name()))?;
        let shape =
            |e: serde_json::Error| format!("the {} reply is malformed: {e}", endpoint.name());
        if value.get("kind").is_some() {
            return serde_json::from_value(value)
                .map(Response::Error)
                .map_err(shape);
        }
        match endpoint {
            Endpoint::Acquire => serde_json::from_value(value).map(Response::Acquired),
            Endpoint::Renew => serde_json::from_value(value).map(Response::Lease),
            Endpoint::Release => serde_json::from_value(value).map(Response::Released),
            Endpoint::Owner if value.get("held") == Some(&serde_json::Value::Bool(false)) => {
                serde_json::from_value(value).map(Response::Free)
            }
            Endpoint::Owner => serde_json::from_value(value).map(Response::Lease),
            Endpoint::Forward => serde_json::from_value(value).map(Response::Forwarded),
        }
        .map_err(shape)
    }
}

impl From<ErrorReply> for Response {
    fn from(e: ErrorReply) -> Self {
        Self::Error(e)
    }
}
