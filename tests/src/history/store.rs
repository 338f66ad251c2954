//! The in-process fenced store the scenarios write to, on the core's
//! [`FenceGuard`]: one guard per key, and every decision recorded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dagnats_leases_core::FenceGuard;

use super::{History, Record, StoreWrite, now};

/// The in-process downstream store that fences writes: it rejects a revision lower
/// than the highest it has seen for the key, and records every decision.
#[derive(Clone, Debug)]
pub struct FencedStore {
    guards: Arc<Mutex<HashMap<String, FenceGuard>>>,
    history: History,
}

impl FencedStore {
    /// A store recording into `history`.
    pub fn new(history: History) -> Self {
        Self {
            guards: Arc::default(),
            history,
        }
    }

    /// Writes under `key` with fence `revision`; whether it was accepted.
    pub fn write(&self, key: &str, holder: &str, revision: u64) -> bool {
        let mut guards = self.guards.lock().unwrap();
        let guard = guards.entry(key.to_owned()).or_default();
        let accepted = guard.admit(revision).is_ok();
        // Recorded under the lock, so the history's order is the store's order.
        self.history.push(Record::Store(StoreWrite {
            key: key.to_owned(),
            holder: holder.to_owned(),
            revision,
            at: now(),
            accepted,
        }));
        accepted
    }
}
