//! The record kept in the `leases` bucket and the RFC 3339 timestamps the replies
//! carry. The names of subjects and headers are in [`crate::subjects`].

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

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
            Self::Acquired => "acquired",
            Self::Renewed => "renewed",
            Self::Released => "released",
        }
    }

    /// Parses a header value.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "acquired" => Some(Self::Acquired),
            "renewed" => Some(Self::Renewed),
            "released" => Some(Self::Released),
            _ => None,
        }
    }
}

/// The value stored at `$KV.leases.<key>`.
///
/// Fields this release does not know are kept, not refused, and written back on
/// renew: in a rolling upgrade an older instance must neither read a newer
/// instance's record as corrupt nor drop what it added (a binding, say).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Who holds the lease.
    pub holder: String,
    /// When the tenure began, RFC 3339 UTC; kept across renewals.
    pub acquired_at: String,
    /// The TTL of the write that stored this record.
    pub ttl_ms: u64,
    /// Tenancy: the user of the tenant account that acquired the lease, where the
    /// account's import shares identity. Renew, release and the repeated acquire
    /// of another user of the account are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_to: Option<String>,
    /// Fields a newer release wrote, kept as they are.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl LeaseRecord {
    /// The bytes stored in the bucket.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a lease record always serialises")
    }

    /// Parses a stored value, or says why it is corrupt.
    pub fn parse(data: &[u8]) -> Result<Self, String> {
        let record: Self =
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
