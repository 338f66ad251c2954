//! A recorded history of lease calls, and a checker for the safety rules.
//!
//! # What is recorded
//!
//! Every call a holder or reader makes is one [`Call`]: the key, the caller, what was
//! asked ([`Op`]), when the request was sent and when the answer came (on
//! `CLOCK_MONOTONIC`, [`now`], one clock for every process on the machine), and the
//! [`Outcome`]. Beside calls: each holder's [`Belief`] (the span it acted as owner),
//! every expiry marker seen on the change events ([`Expiry`]), and every write that
//! reached the fenced store ([`StoreWrite`]).
//!
//! # Which spans are honest
//!
//! - A holder *believes* it owns a key from the moment a grant reply arrives until
//!   its local deadline (the send time of its last successful acquire or renew, plus
//!   the TTL), or until it steps down or releases, whichever is first. This is its
//!   own account of itself ([`Belief`]), taken from the same monotonic clock.
//! - The *server's* lease starts at the write, somewhere between a request's send
//!   and its reply, and ends at the expiry, which the server runs 0 to about 325 ms
//!   after (last write + TTL), never before; or at a release. So after an
//!   acknowledged write sent at `s` with TTL `t`, the lease certainly stands until
//!   `s + t` unless the same holder sent a release (or a renew with a shorter TTL)
//!   in between. An acquire that is granted idempotently did not write: its lease was
//!   written at the earliest of the holder's unanswered writes (the `write_lb` the
//!   holder records), and stands until `write_lb + t`.
//!
//! # The rules ([`check`])
//!
//! - **(a) one owner at a time.** (a1) The beliefs of two holders of one key never
//!   overlap. (a2) No other holder is granted the key, or reported as its owner, and
//!   no read reports it free, before a lease that certainly stands has ended.
//! - **(b) fences only go up.** (b1) No revision is handed to two holders or two keys (a
//!   revision is a stream sequence), nor to a
//!   write and an expiry marker. (b2) A call sent after another call on the key was
//!   answered never sees a lower revision (a tenure's revision is higher than every
//!   earlier one; reads are never stale); a renew, release, or a grant to another
//!   holder sees a strictly higher one.
//! - **(c) the fenced store accepts only owners.** (c1) Every accepted write carries
//!   a revision that was handed to its writer. (c2) Once the store accepted a write
//!   from one holder, it never accepts one from another holder with a revision as low
//!   or lower: that holder was no longer owner (the case a reused fence would
//!   produce). A fence cannot reject a late write that reaches the store *before*
//!   the next owner's first write; such writes are counted in the verdict
//!   ([`Verdict::late_accepted`]) but are not a violation of fencing.
//!
//! # Stale reports
//!
//! A report (an `owner` reply, an acquire's `granted: false`, a repeat grant that
//! wrote nothing) that shows an older state than the history already had is a
//! violation like any other, and also counted apart ([`Verdict::stale_reports`]):
//! the partition scenario prints that count, which must be 0.
//!
//! The checker is a plain function of the recorded history: the unit tests
//! (`history/tests.rs`) feed it histories that must fail and histories that must pass.
//!
//! The recorder is here, the fenced store in `store`, the checker in `check`.

use std::fmt;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

mod check;
mod store;
#[cfg(test)]
mod tests;

pub use check::*;
pub use store::FencedStore;

/// Nanoseconds on `CLOCK_MONOTONIC`: one clock for every process on this machine.
pub type Nanos = u64;

/// The upper bound of how late the server runs an expiry (measured: 0 to ~325 ms).
pub const EXPIRY_LATENESS_MS: u64 = 325;

/// Now on `CLOCK_MONOTONIC`, in nanoseconds.
pub fn now() -> Nanos {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Milliseconds as [`Nanos`].
pub const fn ms(ms: u64) -> Nanos {
    ms * 1_000_000
}

/// What a call asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// `api.leases.acquire`.
    Acquire,
    /// `api.leases.renew`.
    Renew,
    /// `api.leases.release`.
    Release,
    /// `api.leases.owner`.
    Read,
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Acquire: granted to the caller at this revision. `write_lb` is the earliest
    /// the write that set the lease's TTL can have happened (this request's send
    /// time, or earlier for an idempotent grant after unanswered writes).
    Granted {
        /// The fence.
        revision: u64,
        /// The lease's TTL.
        ttl_ms: u64,
        /// Lower bound of the write's time.
        write_lb: Nanos,
    },
    /// Renew: the new fence.
    Renewed {
        /// The new fence.
        revision: u64,
        /// The TTL from this renewal on.
        ttl_ms: u64,
    },
    /// Release: the revision of the delete.
    Released {
        /// The delete's revision.
        revision: u64,
    },
    /// Acquire not granted, or a read: this holder owns the key at this revision.
    Held {
        /// The owner named.
        holder: String,
        /// Its fence.
        revision: u64,
    },
    /// A read: nobody holds the key.
    Free,
    /// `lost` or `fence_mismatch`: the call had no effect.
    Refused {
        /// The error kind.
        kind: String,
    },
    /// No answer, or `unavailable`/`internal`: the call may or may not have acted.
    Unknown {
        /// What happened (a timeout, an error kind).
        why: String,
    },
}

/// One call and its answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// The lease key.
    pub key: String,
    /// The caller (a holder id; a reader's name for reads).
    pub caller: String,
    /// What was asked.
    pub op: Op,
    /// When the request was sent.
    pub sent: Nanos,
    /// When the answer came (or the caller gave up).
    pub replied: Nanos,
    /// The answer.
    pub outcome: Outcome,
}

/// The span a holder acted as owner of a key, from its own account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Belief {
    /// The lease key.
    pub key: String,
    /// The holder.
    pub holder: String,
    /// The revision the tenure began with.
    pub revision: u64,
    /// When the grant reply arrived.
    pub from: Nanos,
    /// When it stopped acting as owner (its deadline, a step-down, or a release).
    pub until: Nanos,
}

/// An expiry marker seen on the change events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expiry {
    /// The lease key.
    pub key: String,
    /// The marker's stream sequence.
    pub seq: u64,
    /// When it was seen.
    pub observed: Nanos,
}

/// A write that reached the fenced store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreWrite {
    /// The key written under.
    pub key: String,
    /// The writer.
    pub holder: String,
    /// The fence it carried.
    pub revision: u64,
    /// When the store decided.
    pub at: Nanos,
    /// Whether the store accepted it.
    pub accepted: bool,
}

/// One entry of a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A call.
    Call(Call),
    /// A holder's span as owner.
    Belief(Belief),
    /// An expiry marker.
    Expiry(Expiry),
    /// A store write.
    Store(StoreWrite),
}

/// Called with every record as it is appended (a holder process prints it).
pub type Tap = Arc<dyn Fn(&Record) + Send + Sync>;

/// A history shared by every task (and, through JSON lines, by holder processes).
#[derive(Clone, Default)]
pub struct History {
    records: Arc<Mutex<Vec<Record>>>,
    tap: Option<Tap>,
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.records.lock().unwrap().len();
        f.debug_struct("History").field("records", &n).finish()
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty history that also hands every record to `tap`.
    pub fn with_tap(tap: Tap) -> Self {
        Self {
            records: Arc::default(),
            tap: Some(tap),
        }
    }

    /// Appends a record.
    pub fn push(&self, record: Record) {
        let mut records = self.records.lock().unwrap();
        if let Some(tap) = &self.tap {
            tap(&record);
        }
        records.push(record);
    }

    /// Appends records from elsewhere (a holder process's output).
    pub fn extend(&self, more: impl IntoIterator<Item = Record>) {
        self.records.lock().unwrap().extend(more);
    }

    /// Appends a call.
    pub fn call(&self, call: Call) {
        self.push(Record::Call(call));
    }

    /// Everything recorded so far.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().unwrap().clone()
    }
}
