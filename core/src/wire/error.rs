//! Why a call failed: the error kinds and the error reply that carries one.

use serde::{Deserialize, Serialize};

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

/// An `invalid` error reply with `error` as its sentence.
pub(super) fn invalid(error: String) -> ErrorReply {
    ErrorReply::new(ErrorKind::Invalid, error)
}
