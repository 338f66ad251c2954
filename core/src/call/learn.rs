//! What a [`Call`] learns about its key for the service's known map: the facts
//! of its reads and its own writes, and the known state it started from.

use std::time::Instant;

use super::Call;
use crate::js::KeyState;
use crate::known::{Known, KnownState, Stamp};
use crate::tenant;

impl Call {
    /// Keeps `fact` about the call's key for [`Call::poll_learnt`], unless the call
    /// learnt of a newer revision already.
    pub(super) fn learn(&mut self, fact: Known) {
        if fact.revision == 0
            || self
                .learnt
                .as_ref()
                .is_some_and(|(_, k)| k.revision > fact.revision)
        {
            return;
        }
        let stored = tenant::storage_key(self.scope.as_ref(), self.key());
        self.learnt = Some((stored, fact));
    }

    /// A leader read states what the key's last revision held then, and when (by
    /// the server's clock) it was stored.
    pub(super) fn learn_read(&mut self, state: &KeyState) {
        let fact = match state {
            KeyState::Absent => return,
            KeyState::Free { revision } => Known {
                revision: *revision,
                state: KnownState::Free,
            },
            KeyState::Held {
                revision,
                record,
                written_at,
            } => Known {
                revision: *revision,
                state: KnownState::Held {
                    record: record.clone(),
                    stamp: Stamp {
                        server: Some(*written_at),
                        sent_before: None,
                    },
                },
            },
            KeyState::Corrupt { revision, .. } => Known {
                revision: *revision,
                state: KnownState::Other,
            },
        };
        self.learn(fact);
    }

    /// The call's own write stored at `revision`: the service knows what it wrote,
    /// and that it was stored after the write was asked for.
    pub(super) fn learn_write(&mut self, revision: u64) {
        let Some((sent_before, record)) = self.sent.take() else {
            return;
        };
        let state = match record {
            Some(record) => KnownState::Held {
                record,
                stamp: Stamp {
                    server: None,
                    sent_before: Some(sent_before),
                },
            },
            None => KnownState::Free,
        };
        self.learn(Known { revision, state });
    }

    /// What the service knew of the key's last revision when the call started, as
    /// a read would show it, if it knows enough: the record's store time by the
    /// server's clock, or else estimated on the service's clock from the instant
    /// before its own write (only an owner reply's advisory `expires_at` is made
    /// from it).
    pub(super) fn known_state(&self, now: Instant) -> Option<KeyState> {
        let known = self.known.as_ref()?;
        match &known.state {
            KnownState::Free => Some(KeyState::Free {
                revision: known.revision,
            }),
            KnownState::Held { record, stamp } => {
                let written_at = stamp.server.or_else(|| {
                    let ago = now.saturating_duration_since(stamp.sent_before?);
                    let wall = self.started_wall + now.saturating_duration_since(self.started_at);
                    Some(wall - ago)
                })?;
                Some(KeyState::Held {
                    revision: known.revision,
                    record: record.clone(),
                    written_at,
                })
            }
            KnownState::Other => None,
        }
    }
}
