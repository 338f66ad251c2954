//! The requests a call asks for, typed ([`CallRequest`]), and their NATS
//! encoding: a leader read, a KV write, a read confirmation, a request to an
//! owner's inbox. Each maps to one [`Transmit`] ([`CallRequest::into_transmit`]).

use std::time::Duration;

use crate::js::{self};

use crate::io::{NatsRequest, Transmit, TransmitId, TransmitKind};
use crate::record::{LeaseEvent, ttl_header};
use crate::shard::ShardMap;
use crate::subjects::{
    CONFIRM_TTL_MS, HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
    HDR_FENCE, HDR_KV_OPERATION, HDR_LEASE_EVENT, HDR_TTL, INBOX_PREFIX, inbox_subject,
};

/// A leader read of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvRead {
    /// Feed the outcome back with this id.
    pub id: TransmitId,
    /// The lease key.
    pub key: String,
    /// Bound on the request.
    pub timeout: Duration,
}

/// NATS' names for what a KV write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Store a value.
    Put,
    /// Leave a tombstone.
    Delete,
}

/// A conditional write of a key: create, update or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvWrite {
    /// Feed the outcome back with this id.
    pub id: TransmitId,
    /// The lease key.
    pub key: String,
    /// Put or delete.
    pub operation: Operation,
    /// The write succeeds only if the key's last revision is this (0: never written).
    pub expected_revision: u64,
    /// Per-message TTL in milliseconds (whole seconds); `None` for a tombstone.
    pub ttl_ms: Option<u64>,
    /// The `Dagnats-Lease-Event` header.
    pub event: LeaseEvent,
    /// The stored value (empty for a delete).
    pub value: Vec<u8>,
    /// Bound on the request.
    pub timeout: Duration,
}

/// A read confirmation: a message to `$KV.leases.<key>.read` that the stream
/// commits only if `$KV.leases.<key>`'s last revision is still `revision`. Only a
/// leader with a quorum can commit it, so its ack proves the read was current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmRead {
    /// Feed the outcome back with this id.
    pub id: TransmitId,
    /// The lease key that was read.
    pub key: String,
    /// The key's last revision as read (0: never written).
    pub revision: u64,
    /// Bound on the request.
    pub timeout: Duration,
}

impl ConfirmRead {
    /// The JetStream publish that confirms the read: empty, with a 1 s TTL.
    pub fn nats_request(&self) -> NatsRequest {
        self.nats_request_to_shard(&ShardMap::SINGLE)
    }

    /// The same, in the key's shard of `shards` (a confirmation checks a subject
    /// of its own stream: it goes to the stream that holds the key).
    pub fn nats_request_to_shard(&self, shards: &ShardMap) -> NatsRequest {
        NatsRequest {
            subject: shards.confirm_subject(&self.key),
            headers: vec![
                (
                    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE,
                    self.revision.to_string(),
                ),
                (
                    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
                    shards.kv_subject(&self.key),
                ),
                (HDR_TTL, ttl_header(CONFIRM_TTL_MS)),
            ],
            payload: Vec::new(),
            timeout: self.timeout,
        }
    }
}

/// A request to a holder's inbox on behalf of a forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRequest {
    /// Feed the outcome back with this id.
    pub id: TransmitId,
    /// The owner being tried.
    pub holder: String,
    /// The lease key.
    pub key: String,
    /// The lease revision, sent as `Dagnats-Lease-Fence`.
    pub fence: u64,
    /// The decoded payload.
    pub payload: Vec<u8>,
    /// What is left of the call's `timeout_ms`.
    pub timeout: Duration,
}

/// A request a call wants sent, as the call decided it (its [`Transmit`] is what an
/// adapter sends; this typed form is what the call's table tests read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallRequest {
    /// Read a key through the stream leader.
    KvRead(KvRead),
    /// Write a key conditionally.
    KvWrite(KvWrite),
    /// Confirm that a read was current.
    ConfirmRead(ConfirmRead),
    /// Request an owner's inbox.
    InboxRequest(InboxRequest),
}

impl CallRequest {
    /// Names the request `id`, the id its outcome comes back with.
    pub fn set_id(&mut self, id: TransmitId) {
        match self {
            Self::KvRead(r) => r.id = id,
            Self::KvWrite(w) => w.id = id,
            Self::ConfirmRead(c) => c.id = id,
            Self::InboxRequest(i) => i.id = id,
        }
    }

    /// How long the call waits for this effect's outcome.
    pub fn timeout(&self) -> Duration {
        match self {
            Self::KvRead(r) => r.timeout,
            Self::KvWrite(w) => w.timeout,
            Self::ConfirmRead(c) => c.timeout,
            Self::InboxRequest(i) => i.timeout,
        }
    }

    /// The NATS request that carries out this effect, with its id.
    pub fn nats_request(&self) -> (TransmitId, NatsRequest) {
        let t = self.clone().into_transmit();
        (t.id, t.request)
    }

    /// The effect as an adapter sends it for a tenant `account` (`None`: the one
    /// shared namespace): the key's subjects become `$KV.leases.<account>.<key>`
    /// (and its `.read`), an owner's inbox `dagnats.lease.inbox.<account>.<holder>.<key>`
    /// (the service account's import of the tenant's inboxes); a read, write or
    /// confirmation goes to the stream of the key's shard, chosen from the storage
    /// key (the account's prefix included).
    pub fn into_transmit_for_account(self, account: Option<&str>, shards: &ShardMap) -> Transmit {
        let Some(account) = account else {
            return self.into_transmit_to_shard(shards);
        };
        let scoped = |key: String| format!("{account}.{key}");
        match self {
            Self::KvRead(r) => Self::KvRead(KvRead {
                key: scoped(r.key),
                ..r
            })
            .into_transmit_to_shard(shards),
            Self::KvWrite(w) => Self::KvWrite(KvWrite {
                key: scoped(w.key),
                ..w
            })
            .into_transmit_to_shard(shards),
            Self::ConfirmRead(c) => Self::ConfirmRead(ConfirmRead {
                key: scoped(c.key),
                ..c
            })
            .into_transmit_to_shard(shards),
            Self::InboxRequest(i) => {
                let mut t = Self::InboxRequest(i).into_transmit();
                t.request.subject = format!(
                    "{INBOX_PREFIX}.{account}.{}",
                    &t.request.subject[INBOX_PREFIX.len() + 1..]
                );
                t
            }
        }
    }

    /// The effect as an adapter sends it; the payload moves, not copied.
    pub fn into_transmit(self) -> Transmit {
        self.into_transmit_to_shard(&ShardMap::SINGLE)
    }

    /// The effect as an adapter sends it to the stream of the key's shard.
    pub fn into_transmit_to_shard(self, shards: &ShardMap) -> Transmit {
        match self {
            Self::KvRead(r) => Transmit::new(
                r.id,
                TransmitKind::Read,
                js::read_request(&r.key, r.timeout, shards),
            ),
            Self::KvWrite(w) => Transmit::new(
                w.id,
                TransmitKind::Write,
                w.into_nats_request_to_shard(shards),
            ),
            Self::ConfirmRead(c) => {
                Transmit::new(c.id, TransmitKind::Confirm, c.nats_request_to_shard(shards))
            }
            Self::InboxRequest(i) => {
                Transmit::new(i.id, TransmitKind::Inbox, i.into_nats_request())
            }
        }
    }
}

impl KvWrite {
    /// The JetStream publish that makes this write.
    pub fn nats_request(&self) -> NatsRequest {
        self.clone().into_nats_request()
    }

    /// The JetStream publish that makes this write, taking the write.
    pub fn into_nats_request(self) -> NatsRequest {
        self.into_nats_request_to_shard(&ShardMap::SINGLE)
    }

    /// The same, to the key's shard of `shards`.
    pub fn into_nats_request_to_shard(self, shards: &ShardMap) -> NatsRequest {
        let mut headers = vec![
            (
                HDR_EXPECTED_LAST_SUBJECT_SEQUENCE,
                self.expected_revision.to_string(),
            ),
            (HDR_LEASE_EVENT, self.event.as_str().to_string()),
        ];
        if let Some(ttl) = self.ttl_ms {
            headers.push((HDR_TTL, ttl_header(ttl)));
        }
        if self.operation == Operation::Delete {
            headers.push((HDR_KV_OPERATION, "DEL".to_string()));
        }
        NatsRequest {
            subject: shards.kv_subject(&self.key),
            headers,
            payload: self.value,
            timeout: self.timeout,
        }
    }
}

impl InboxRequest {
    /// The request to `dagnats.lease.inbox.<holder>.<key>` with the fence header.
    pub fn nats_request(&self) -> NatsRequest {
        self.clone().into_nats_request()
    }

    /// The request to the owner's inbox, taking the effect.
    pub fn into_nats_request(self) -> NatsRequest {
        NatsRequest {
            subject: inbox_subject(&self.holder, &self.key),
            headers: vec![(HDR_FENCE, self.fence.to_string())],
            payload: self.payload,
            timeout: self.timeout,
        }
    }
}
