//! Release: a fenced tombstone; the key is free once it is stored.

use std::time::Instant;

use super::fence::KnownFence;
use super::{Call, Job};
use crate::call_request::{KvWrite, Operation};
use crate::js::KeyState;
use crate::record::LeaseEvent;
use crate::wire::{ReleaseReply, Response};

impl Call {
    /// The release's first request: the fenced tombstone at once when the service
    /// knows the revision named ([`Call::known_fence`]), else the read.
    pub(super) fn start_release(&mut self, now: Instant) {
        let Job::Release {
            key,
            holder,
            revision,
        } = &self.job
        else {
            return;
        };
        let key = key.clone();
        match self.known_fence(now, holder, *revision) {
            KnownFence::Unknown => self.read(key),
            KnownFence::OtherHolder => self.decide_superseded(now),
            KnownFence::Mine(..) => {
                let expected = *revision;
                self.fenced_write(tombstone(key, expected, self.config.kv_timeout));
            }
        }
    }

    /// A current read of the key: the fenced tombstone.
    pub(super) fn decide_release(
        &mut self,
        now: Instant,
        key: String,
        holder: String,
        revision: u64,
        state: KeyState,
    ) {
        match self.check_fence(now, &key, &holder, revision, &state) {
            Err(e) => self.fail(e),
            Ok(_) => {
                let expected = state.revision();
                self.job = Job::Release {
                    key: key.clone(),
                    holder,
                    revision,
                };
                self.fenced_write(tombstone(key, expected, self.config.kv_timeout));
            }
        }
    }

    /// The tombstone stored at `revision`: released.
    pub(super) fn released(&mut self, key: String, holder: String, revision: u64) {
        self.reply(Response::Released(ReleaseReply {
            released: true,
            held: false,
            key,
            holder,
            revision,
        }));
    }
}

/// The release's write: a tombstone without a TTL, conditional on `expected`.
fn tombstone(key: String, expected: u64, timeout: std::time::Duration) -> KvWrite {
    KvWrite {
        id: crate::io::TransmitId::UNSENT,
        key,
        operation: Operation::Delete,
        expected_revision: expected,
        ttl_ms: None,
        event: LeaseEvent::Released,
        value: Vec::new(),
        timeout,
    }
}
