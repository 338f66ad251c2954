//! The record kept in the `leases` bucket, the names of subjects and headers, and
//! the RFC 3339 timestamps the replies carry.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The KV bucket.
pub const BUCKET: &str = "leases";
/// The bucket's stream.
pub const STREAM: &str = "KV_leases";
/// Subjects the bucket's stream stores: the lease keys and their read confirmations.
pub const STREAM_SUBJECTS: &str = "$KV.leases.>";
/// The lease keys alone: one token after the bucket, so never a read confirmation.
pub const LEASE_SUBJECTS: &str = "$KV.leases.*";
/// What a subscriber to every change event subscribes to.
pub const CHANGED_SUBJECTS: &str = "dagnats.lease.changed.>";
/// The RePublish destination for [`LEASE_SUBJECTS`]. The server refuses a bare `*`
/// here (10052, "transform not valid"), so the key token is named as a wildcard.
pub const REPUBLISH_DEST: &str = "dagnats.lease.changed.{{wildcard(1)}}";
/// The last token of a key's read-confirmation subject.
pub const CONFIRM_TOKEN: &str = "read";
/// Per-message TTL of a read confirmation: it only has to commit, not to stay.
pub const CONFIRM_TTL_MS: u64 = 1_000;
/// The queue group every lease endpoint joins.
pub const QUEUE_GROUP: &str = "dagnats-leases";
/// The micro-service name.
pub const SERVICE_NAME: &str = "dagnats-api";

/// Header: per-message TTL, whole seconds such as `15s`.
pub const HDR_TTL: &str = "Nats-TTL";
/// Header: the write succeeds only if the key's last revision is this one (0: none).
pub const HDR_EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
/// Header: the subject whose last sequence [`HDR_EXPECTED_LAST_SUBJECT_SEQUENCE`]
/// checks, when it is not the subject published to (nats-server 2.11+).
pub const HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: &str =
    "Nats-Expected-Last-Subject-Sequence-Subject";
/// Header: what a write did, see [`LeaseEvent`].
pub const HDR_LEASE_EVENT: &str = "Dagnats-Lease-Event";
/// Header: KV operation of a delete or purge.
pub const HDR_KV_OPERATION: &str = "KV-Operation";
/// Header: present on the server's own markers, e.g. `MaxAge` for an expiry.
pub const HDR_MARKER_REASON: &str = "Nats-Marker-Reason";
/// Header on forwarded requests: the lease revision.
pub const HDR_FENCE: &str = "Dagnats-Lease-Fence";
/// Header on an owner's reply that refuses a forwarded request.
pub const HDR_REJECT: &str = "Dagnats-Lease-Reject";
/// The one value of [`HDR_REJECT`].
pub const REJECT_STALE: &str = "stale";
/// Header the server adds to republished messages: the revision.
pub const HDR_SEQUENCE: &str = "Nats-Sequence";

/// The KV subject of a key: `$KV.leases.<key>`.
pub fn kv_subject(key: &str) -> String {
    format!("$KV.{BUCKET}.{key}")
}

/// Where a read of `key` is confirmed: `$KV.leases.<key>.read`, two tokens after the
/// bucket, so it can never be a lease key.
pub fn confirm_subject(key: &str) -> String {
    format!("$KV.{BUCKET}.{key}.{CONFIRM_TOKEN}")
}

/// The change-event subject of a key: `dagnats.lease.changed.<key>`.
pub fn changed_subject(key: &str) -> String {
    format!("dagnats.lease.changed.{key}")
}

/// The inbox of one holder for one key: `dagnats.lease.inbox.<holder>.<key>`.
pub fn inbox_subject(holder: &str, key: &str) -> String {
    format!("dagnats.lease.inbox.{holder}.{key}")
}

/// What a holder subscribes to for its forwarded requests: `dagnats.lease.inbox.<holder>.>`.
pub fn inbox_wildcard(holder: &str) -> String {
    format!("dagnats.lease.inbox.{holder}.>")
}

/// What a write to the bucket did, as the `Dagnats-Lease-Event` header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseEvent {
    /// A new tenure began.
    Acquired,
    /// The holder extended its lease.
    Renewed,
    /// The holder freed the key.
    Released,
}

impl LeaseEvent {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseEvent::Acquired => "acquired",
            LeaseEvent::Renewed => "renewed",
            LeaseEvent::Released => "released",
        }
    }

    /// Parses a header value.
    pub fn parse(value: &str) -> Option<LeaseEvent> {
        match value {
            "acquired" => Some(LeaseEvent::Acquired),
            "renewed" => Some(LeaseEvent::Renewed),
            "released" => Some(LeaseEvent::Released),
            _ => None,
        }
    }
}

/// The value stored at `$KV.leases.<key>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRecord {
    /// Who holds the lease.
    pub holder: String,
    /// When the tenure began, RFC 3339 UTC; kept across renewals.
    pub acquired_at: String,
    /// The TTL of the write that stored this record.
    pub ttl_ms: u64,
}

impl LeaseRecord {
    /// The bytes stored in the bucket.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a lease record always serialises")
    }

    /// Parses a stored value, or says why it is corrupt.
    pub fn parse(data: &[u8]) -> Result<LeaseRecord, String> {
        let record: LeaseRecord =
            serde_json::from_slice(data).map_err(|e| format!("the record is not valid: {e}"))?;
        crate::wire::check_name("holder", &record.holder).map_err(|e| e.error)?;
        parse_time(&record.acquired_at)
            .ok_or_else(|| format!("acquired_at {:?} is not RFC 3339", record.acquired_at))?;
        if record.ttl_ms == 0 {
            return Err("ttl_ms is 0".to_string());
        }
        Ok(record)
    }
}

/// Formats a time as RFC 3339 in UTC with millisecond precision.
pub fn format_time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let millis = t.millisecond();
    let t = t.replace_millisecond(millis).unwrap_or(t);
    t.format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

/// Parses an RFC 3339 time.
pub fn parse_time(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

/// The TTL header value for a whole number of seconds in milliseconds, e.g. `15s`.
pub fn ttl_header(ttl_ms: u64) -> String {
    format!("{}s", ttl_ms / 1000)
}
