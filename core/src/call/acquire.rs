//! Acquire: create the key if nobody holds it, at most [`MAX_ACQUIRE_WRITES`]
//! times while it keeps changing; a key held answers with its holder.

use std::time::Duration;

use super::{Call, Job};
use crate::call_request::{KvWrite, Operation};
use crate::js::KeyState;
use crate::record::{LeaseEvent, LeaseRecord, format_time};
use crate::wire::{AcquireReply, AcquireRequest, ErrorKind, ErrorReply, Lease, Response};

/// How many creates an acquire tries when the key keeps changing under it.
pub const MAX_ACQUIRE_WRITES: u32 = 4;

impl Call {
    pub(super) fn write_create(&mut self, key: String, expected_revision: u64) {
        let Job::Acquire(r) = &self.job else { return };
        if self.writes >= MAX_ACQUIRE_WRITES {
            return self.fail(ErrorReply::new(
                ErrorKind::Unavailable,
                format!(
                    "key `{key}` kept changing during acquire ({MAX_ACQUIRE_WRITES} attempts): retry"
                ),
            ));
        }
        let record = LeaseRecord {
            holder: r.holder.clone(),
            acquired_at: format_time(self.started_wall),
            ttl_ms: r.ttl_ms,
            bound_to: self.scope.as_ref().and_then(|c| c.user.clone()),
            unknown: Default::default(),
        };
        let ttl = r.ttl_ms;
        self.write(KvWrite {
            id: crate::io::TransmitId::UNSENT,
            key,
            operation: Operation::Put,
            expected_revision,
            ttl_ms: Some(ttl),
            event: LeaseEvent::Acquired,
            value: record.to_json(),
            timeout: self.config.kv_timeout,
        });
    }

    /// A current read of the key: create it where free, else answer who holds it.
    pub(super) fn decide_acquire(&mut self, r: AcquireRequest, state: KeyState) {
        let key = r.key.clone();
        match state {
            KeyState::Absent | KeyState::Free { .. } => {
                let expected = state.revision();
                self.job = Job::Acquire(r);
                self.write_create(key, expected);
            }
            KeyState::Held {
                revision,
                record,
                written_at,
            } => {
                let granted = record.holder == r.holder;
                if granted && let Err(e) = self.check_binding(&key, &record) {
                    return self.fail(e);
                }
                let lease = self.lease_from_record(&key, revision, &record, written_at);
                self.reply(Response::Acquired(AcquireReply { granted, lease }));
            }
            KeyState::Corrupt { .. } => unreachable!("decide answers a corrupt record"),
        }
    }

    /// The create stored at `revision`: granted.
    pub(super) fn acquired(&mut self, r: AcquireRequest, revision: u64) {
        let wall = self.started_wall;
        let lease = Lease {
            held: true,
            key: r.key,
            holder: r.holder,
            revision,
            acquired_at: format_time(wall),
            expires_at: format_time(wall + Duration::from_millis(r.ttl_ms)),
            ttl_ms: r.ttl_ms,
        };
        self.reply(Response::Acquired(AcquireReply {
            granted: true,
            lease,
        }));
    }
}
