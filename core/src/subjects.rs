//! The names the service uses on NATS: the bucket, its stream and subjects, the
//! endpoints', change events' and inboxes' subjects, and the headers.

/// The KV bucket.
pub const BUCKET: &str = "leases";
/// The prefix of every lease endpoint's subject: `api.leases.<endpoint>`.
pub const API_PREFIX: &str = "api.leases";
/// The prefix of change-event subjects: `dagnats.lease.changed.<key>`.
pub const CHANGED_PREFIX: &str = "dagnats.lease.changed";
/// The prefix of holders' inboxes: `dagnats.lease.inbox.<holder>.<key>`.
pub const INBOX_PREFIX: &str = "dagnats.lease.inbox";
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
/// Tenancy: every tenant's endpoints, `api.leases.<account>.<endpoint>`: the
/// service account exports them with `account_token_position: 3`, so the server
/// puts the importing account in that token.
pub const TENANT_API_SUBJECTS: &str = "api.leases.*.*";
/// Tenancy: the lease keys of every tenant, `$KV.leases.<account>.<key>`.
pub const TENANT_LEASE_SUBJECTS: &str = "$KV.leases.*.*";
/// Tenancy: every tenant key's change events, as the service subscribes to them.
pub const TENANT_CHANGED_SUBJECTS: &str = "dagnats.lease.changed.*.*";
/// Tenancy: where a tenant key's changes go, `dagnats.lease.changed.<account>.<key>`.
pub const TENANT_REPUBLISH_DEST: &str = "dagnats.lease.changed.{{wildcard(1)}}.{{wildcard(2)}}";
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
/// Header: what a write did, see [`LeaseEvent`](crate::record::LeaseEvent).
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
/// Header: the server's store time of a republished message (RFC 3339).
pub const HDR_TIME_STAMP: &str = "Nats-Time-Stamp";

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
    format!("{CHANGED_PREFIX}.{key}")
}

/// The inbox of one holder for one key: `dagnats.lease.inbox.<holder>.<key>`.
pub fn inbox_subject(holder: &str, key: &str) -> String {
    format!("{INBOX_PREFIX}.{holder}.{key}")
}

/// What a holder subscribes to for its forwarded requests: `dagnats.lease.inbox.<holder>.>`.
pub fn inbox_wildcard(holder: &str) -> String {
    format!("{INBOX_PREFIX}.{holder}.>")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The literal constants agree with the prefixes the functions build from.
    #[test]
    fn literal_subjects_agree_with_the_prefixes() {
        assert_eq!(STREAM_SUBJECTS, format!("$KV.{BUCKET}.>"));
        assert_eq!(LEASE_SUBJECTS, format!("$KV.{BUCKET}.*"));
        assert_eq!(STREAM, format!("KV_{BUCKET}"));
        assert_eq!(CHANGED_SUBJECTS, format!("{CHANGED_PREFIX}.>"));
        assert_eq!(
            REPUBLISH_DEST,
            format!("{CHANGED_PREFIX}.{{{{wildcard(1)}}}}")
        );
        assert_eq!(kv_subject("k"), "$KV.leases.k");
        assert_eq!(changed_subject("k"), "dagnats.lease.changed.k");
        assert_eq!(inbox_subject("h", "k"), "dagnats.lease.inbox.h.k");
    }
}
