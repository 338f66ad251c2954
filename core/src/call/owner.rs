//! Owner: who holds the key, from a current read.

use super::Call;
use crate::js::KeyState;
use crate::wire::{FreeReply, Response};

impl Call {
    /// A current read of the key: its lease, or free.
    pub(super) fn decide_owner(&mut self, key: String, state: KeyState) {
        match state {
            KeyState::Held {
                revision,
                record,
                written_at,
            } => {
                let lease = self.lease_from_record(&key, revision, &record, written_at);
                self.reply(Response::Lease(lease));
            }
            _ => self.reply(Response::Free(FreeReply { held: false, key })),
        }
    }
}
