//! Release: a fenced tombstone; the key is free once it is stored.

use std::time::Instant;

use super::{Call, Job};
use crate::effect::{KvWrite, Operation};
use crate::io::EffectId;
use crate::js::KeyState;
use crate::record::LeaseEvent;
use crate::wire::{ReleaseReply, Response};

impl Call {
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
                self.fenced_write(KvWrite {
                    id: EffectId(0),
                    key,
                    operation: Operation::Delete,
                    expected_revision: expected,
                    ttl_ms: None,
                    event: LeaseEvent::Released,
                    value: Vec::new(),
                    timeout: self.config.kv_timeout,
                });
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
