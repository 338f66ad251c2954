//! Change events as a subscriber to `dagnats.lease.changed.<key>` receives them: what
//! happened to a key, read from the republished message's headers and body. One
//! reading for every consumer (the holder library's wake-ups, the CLI's `watch`).

use crate::record::LeaseEvent;

use crate::subjects::{HDR_KV_OPERATION, HDR_LEASE_EVENT, HDR_MARKER_REASON, HDR_SEQUENCE};

/// What a change event says happened to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChangeKind {
    /// A tenure began.
    Acquired,
    /// The holder extended its lease.
    Renewed,
    /// The holder freed the key.
    Released,
    /// The server's expiry marker: the TTL ran out.
    Expired,
    /// A KV delete or purge written by something other than the service.
    Deleted,
    /// A write without the service's event header (not written by the service).
    Written,
}

impl ChangeKind {
    /// The name `watch` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Renewed => "renewed",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::Deleted => "deleted",
            Self::Written => "written",
        }
    }

    /// Whether the key may be free after it: anything but an acquire or a renewal.
    /// A campaign asks again at once on such an event, rather than at its next tick.
    pub fn may_free_key(self) -> bool {
        !matches!(self, Self::Acquired | Self::Renewed)
    }
}

/// One change event, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeEvent {
    /// What happened.
    pub kind: ChangeKind,
    /// The key's revision the event is about (the `Nats-Sequence` header; 0 if absent).
    pub revision: u64,
    /// The holder the record names, when the message carries a lease record.
    pub holder: Option<String>,
}

impl ChangeEvent {
    /// Reads an event from its headers (looked up by name through `header`) and body.
    pub fn from_parts<'a>(header: impl Fn(&str) -> Option<&'a str>, payload: &[u8]) -> Self {
        let kind = if header(HDR_MARKER_REASON).is_some() {
            ChangeKind::Expired
        } else {
            match header(HDR_LEASE_EVENT).and_then(LeaseEvent::parse) {
                Some(LeaseEvent::Acquired) => ChangeKind::Acquired,
                Some(LeaseEvent::Renewed) => ChangeKind::Renewed,
                Some(LeaseEvent::Released) => ChangeKind::Released,
                None if header(HDR_KV_OPERATION).is_some() => ChangeKind::Deleted,
                None => ChangeKind::Written,
            }
        };
        let revision = header(HDR_SEQUENCE)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_default();
        let holder = serde_json::from_slice::<serde_json::Value>(payload)
            .ok()
            .and_then(|v| v.get("holder")?.as_str().map(str::to_string));
        Self {
            kind,
            revision,
            holder,
        }
    }

    /// The key a change-event subject names (`dagnats.lease.changed.<key>`).
    pub fn key_of(subject: &str) -> Option<&str> {
        subject
            .strip_prefix(crate::subjects::changed_subject("").as_str())
            .filter(|k| !k.is_empty() && !k.contains('.'))
    }
}
