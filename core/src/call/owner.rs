//! Owner: who holds the key, from a current read.

use super::Call;
use crate::js::KeyState;
use crate::wire::{FreeReply, Response};

impl Call {
    /// A current read of the key: its lease, or free.
    pub(super) fn decide_owner(&mut self, key: String, state: KeyState) {
        // The same lease `list` reads from a stored message ([`KeyState::lease`]).
        match state.lease(&key) {
            Some(lease) => self.reply(Response::Lease(lease)),
            None => self.reply(Response::Free(FreeReply { held: false, key })),
        }
    }
}
