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
//! The checker is a plain function of the recorded history: the unit tests below feed
//! it histories that must fail and histories that must pass.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

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

/// The in-process downstream store that fences writes: it rejects a revision lower
/// than the highest it has seen for the key, and records every decision.
#[derive(Clone, Debug)]
pub struct FencedStore {
    highest: Arc<Mutex<HashMap<String, u64>>>,
    history: History,
}

impl FencedStore {
    /// A store recording into `history`.
    pub fn new(history: History) -> Self {
        Self {
            highest: Arc::default(),
            history,
        }
    }

    /// Writes under `key` with fence `revision`; whether it was accepted.
    pub fn write(&self, key: &str, holder: &str, revision: u64) -> bool {
        let mut highest = self.highest.lock().unwrap();
        let top = highest.entry(key.to_owned()).or_insert(0);
        let accepted = revision >= *top;
        if accepted {
            *top = revision;
        }
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

/// Which rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// (a1) Two holders' beliefs overlap.
    OverlappingBeliefs,
    /// (a2) Another holder granted or reported, or the key reported free, while a
    /// lease certainly stood.
    GrantWhileHeld,
    /// (b1) One revision handed out twice.
    ReusedRevision,
    /// (b2) A revision not higher than one seen before (a tenure's, or a stale read).
    RevisionNotHigher,
    /// (c1) The store accepted a fence never handed to its writer.
    ForgedFence,
    /// (c2) The store accepted a write from a holder that was no longer owner.
    StaleWriteAccepted,
}

/// One broken rule, with what shows it.
#[derive(Clone, Debug)]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// The key.
    pub key: String,
    /// The records that show it.
    pub detail: String,
    /// The call whose answer breaks the rule, when that answer is a *report* (an
    /// `owner` reply, or an acquire's `granted: false` naming a holder), for
    /// [`Violation::is_stale_report`]. `None` for every
    /// violation a write, a belief, an expiry or the store shows.
    pub read: Option<Call>,
}

impl Violation {
    /// Whether this is a *stale report*: an answer that shows an older state than
    /// the history already had, from a read alone. That is a reported owner whose
    /// revision is below one answered before the call was sent
    /// ([`Rule::RevisionNotHigher`]), a read saying "free" while a lease certainly
    /// stood ([`Rule::GrantWhileHeld`]), or a *repeat* grant (an idempotent acquire
    /// answered from its read, no write) of an old revision the caller held before.
    /// What a cut-off stream leader answering from its old state would produce.
    pub fn is_stale_report(&self) -> bool {
        let Some(c) = &self.read else {
            return false;
        };
        match (self.rule, &c.outcome) {
            (Rule::RevisionNotHigher, Outcome::Held { .. }) => true,
            (Rule::RevisionNotHigher, Outcome::Granted { write_lb, .. }) => *write_lb < c.sent,
            (Rule::GrantWhileHeld, Outcome::Free) => c.op == Op::Read,
            _ => false,
        }
    }
}

/// The checker's verdict on a history.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Fresh grants (acquires granted with a revision new to the holder).
    pub grants: usize,
    /// Successful renewals.
    pub renewals: usize,
    /// Successful releases.
    pub releases: usize,
    /// Expiry markers seen.
    pub expiries: usize,
    /// Reads answered.
    pub reads: usize,
    /// Calls with no definite answer.
    pub unknown: usize,
    /// Store writes, accepted or not.
    pub store_writes: usize,
    /// Store writes rejected by the fence.
    pub store_rejected: usize,
    /// Accepted store writes whose lease had certainly ended (before any newer
    /// owner wrote: allowed by fencing, counted for the record).
    pub late_accepted: usize,
    /// The broken rules.
    pub violations: Vec<Violation>,
}

impl Verdict {
    /// The one line a scenario prints, e.g.
    /// `412 grants, 1830 renewals, ... violations: 0`.
    pub fn summary(&self) -> String {
        format!(
            "{} grants, {} renewals, {} releases, {} expiries, {} reads, {} unknown, \
             {} fenced writes ({} rejected, {} late accepted), stale reports: {}, \
             violations: {}",
            self.grants,
            self.renewals,
            self.releases,
            self.expiries,
            self.reads,
            self.unknown,
            self.store_writes,
            self.store_rejected,
            self.late_accepted,
            self.stale_reports(),
            self.violations.len()
        )
    }

    /// How many distinct calls were answered with a stale report (each is also a
    /// violation): the count a partition scenario prints.
    pub fn stale_reports(&self) -> usize {
        let mut calls: Vec<(&str, &str, Nanos)> = self
            .violations
            .iter()
            .filter(|v| v.is_stale_report())
            .filter_map(|v| v.read.as_ref())
            .map(|c| (c.key.as_str(), c.caller.as_str(), c.sent))
            .collect();
        calls.sort_unstable();
        calls.dedup();
        calls.len()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())?;
        for v in self.violations.iter().take(20) {
            write!(f, "\n  {:?} on {}: {}", v.rule, v.key, v.detail)?;
        }
        Ok(())
    }
}

/// The revision a call's answer shows, if any.
fn revision_of(outcome: &Outcome) -> Option<u64> {
    match outcome {
        Outcome::Granted { revision, .. }
        | Outcome::Renewed { revision, .. }
        | Outcome::Released { revision }
        | Outcome::Held { revision, .. } => Some(*revision),
        _ => None,
    }
}

/// The holder a call's answer shows as owner, if any.
fn owner_of(call: &Call) -> Option<&str> {
    match &call.outcome {
        Outcome::Granted { .. } | Outcome::Renewed { .. } => Some(&call.caller),
        Outcome::Held { holder, .. } => Some(holder),
        _ => None,
    }
}

#[derive(Default)]
struct KeyRecords<'a> {
    calls: Vec<&'a Call>,
    beliefs: Vec<&'a Belief>,
    expiries: Vec<&'a Expiry>,
    writes: Vec<&'a StoreWrite>,
}

/// Checks a history against rules (a), (b), (c) (see the module docs).
pub fn check(records: &[Record]) -> Verdict {
    let mut keys: BTreeMap<&str, KeyRecords> = BTreeMap::new();
    for r in records {
        match r {
            Record::Call(c) => keys.entry(&c.key).or_default().calls.push(c),
            Record::Belief(b) => keys.entry(&b.key).or_default().beliefs.push(b),
            Record::Expiry(e) => keys.entry(&e.key).or_default().expiries.push(e),
            Record::Store(w) => keys.entry(&w.key).or_default().writes.push(w),
        }
    }
    let mut verdict = Verdict::default();
    check_global_reuse(records, &mut verdict.violations);
    for (key, recs) in &keys {
        count(key, recs, &mut verdict);
        check_beliefs(key, recs, &mut verdict.violations);
        check_standing(key, recs, &mut verdict.violations);
        check_reuse(key, recs, &mut verdict.violations);
        check_monotonic(key, recs, &mut verdict.violations);
        check_store(key, recs, &mut verdict);
    }
    verdict
}

fn count(_key: &str, recs: &KeyRecords, v: &mut Verdict) {
    let mut seen: HashMap<&str, Vec<u64>> = HashMap::new();
    for c in &recs.calls {
        match &c.outcome {
            Outcome::Granted { revision, .. } => {
                let revs = seen.entry(&c.caller).or_default();
                if !revs.contains(revision) {
                    revs.push(*revision);
                    v.grants += 1;
                }
            }
            Outcome::Renewed { revision, .. } => {
                seen.entry(&c.caller).or_default().push(*revision);
                v.renewals += 1;
            }
            Outcome::Released { .. } => v.releases += 1,
            Outcome::Held { .. } | Outcome::Free if c.op == Op::Read => v.reads += 1,
            Outcome::Unknown { .. } => v.unknown += 1,
            _ => {}
        }
    }
    v.expiries += recs.expiries.len();
    v.store_writes += recs.writes.len();
    v.store_rejected += recs.writes.iter().filter(|w| !w.accepted).count();
}

fn push(out: &mut Vec<Violation>, rule: Rule, key: &str, detail: String) {
    out.push(Violation {
        rule,
        key: key.to_owned(),
        detail,
        read: None,
    });
}

/// Whether a call's answer is a report (an `owner` reply, a holder named by an
/// acquire's `granted: false`, or a repeat grant: `granted: true` of a lease the call
/// did not write, which the service answers from its read alone) rather than the
/// result of a write.
fn is_report(c: &Call) -> bool {
    match c.outcome {
        Outcome::Held { .. } | Outcome::Free => true,
        Outcome::Granted { write_lb, .. } => write_lb < c.sent,
        _ => false,
    }
}

/// [`push`] for a violation shown by the answer to `c`: a report is kept with it
/// ([`Violation::read`]) so that [`Violation::is_stale_report`] can tell it.
fn push_shown_by(out: &mut Vec<Violation>, rule: Rule, key: &str, c: &Call, detail: String) {
    push(out, rule, key, detail);
    if is_report(c) {
        out.last_mut().unwrap().read = Some(c.clone());
    }
}

/// (a1): beliefs of different holders never overlap.
fn check_beliefs(key: &str, recs: &KeyRecords, out: &mut Vec<Violation>) {
    let mut beliefs: Vec<&Belief> = recs
        .beliefs
        .iter()
        .copied()
        .filter(|b| b.from < b.until)
        .collect();
    beliefs.sort_by_key(|b| b.from);
    // Sweep: the belief reaching furthest so far, against each next one.
    let mut reach: Option<&Belief> = None;
    for b in beliefs {
        if let Some(r) = reach
            && r.holder != b.holder
            && b.from < r.until
        {
            push(
                out,
                Rule::OverlappingBeliefs,
                key,
                format!("{r:?} overlaps {b:?}"),
            );
        }
        if reach.is_none_or(|r| b.until > r.until) {
            reach = Some(b);
        }
    }
}

/// When the lease shown by `w` (a grant or renewal of `w.caller`) certainly stood
/// until, given the holder's own later calls.
fn certain_end(w: &Call, own_later: &[&Call]) -> Nanos {
    let mut end = match &w.outcome {
        Outcome::Granted {
            ttl_ms, write_lb, ..
        } => write_lb + ms(*ttl_ms),
        Outcome::Renewed { ttl_ms, .. } => w.sent + ms(*ttl_ms),
        _ => return 0,
    };
    for c in own_later {
        if c.sent < w.sent || std::ptr::eq(*c, w) || matches!(c.outcome, Outcome::Refused { .. }) {
            continue;
        }
        match c.op {
            Op::Release => end = end.min(c.sent),
            // A renew with another TTL may shorten the lease; an unanswered one has
            // the same TTL as the holder's others, so it can only extend it.
            Op::Renew => {
                if let Outcome::Renewed { ttl_ms, .. } = c.outcome {
                    end = end.min(c.sent + ms(ttl_ms));
                }
            }
            _ => {}
        }
    }
    end
}

/// (a2): nobody else is granted or reported, and no read says free, while a lease
/// certainly stands.
fn check_standing(key: &str, recs: &KeyRecords, out: &mut Vec<Violation>) {
    let mut by_holder: HashMap<&str, Vec<&Call>> = HashMap::new();
    for c in &recs.calls {
        if c.op != Op::Read {
            by_holder.entry(&c.caller).or_default().push(c);
        }
    }
    for w in &recs.calls {
        if !matches!(w.outcome, Outcome::Granted { .. } | Outcome::Renewed { .. }) {
            continue;
        }
        let w_rev = revision_of(&w.outcome).unwrap_or(0);
        let end = certain_end(w, &by_holder[w.caller.as_str()]);
        for o in &recs.calls {
            // Only answers that arrived while the lease certainly stood.
            if o.sent < w.replied || o.replied >= end {
                continue;
            }
            let bad = match (&o.outcome, owner_of(o)) {
                (Outcome::Free, _) => true,
                (_, Some(owner)) => owner != w.caller && revision_of(&o.outcome) > Some(w_rev),
                _ => false,
            };
            if bad {
                push_shown_by(
                    out,
                    Rule::GrantWhileHeld,
                    key,
                    o,
                    format!(
                        "{o:?} answered while the lease of {w:?} certainly stood (until {end})"
                    ),
                );
            }
        }
    }
}

/// (b1): one revision, one holder (and never both a write and an expiry marker).
fn check_reuse(key: &str, recs: &KeyRecords, out: &mut Vec<Violation>) {
    let mut owner: HashMap<u64, &str> = HashMap::new();
    for c in &recs.calls {
        let (Some(rev), true) = (
            revision_of(&c.outcome),
            matches!(
                c.outcome,
                Outcome::Granted { .. } | Outcome::Renewed { .. } | Outcome::Released { .. }
            ),
        ) else {
            continue;
        };
        match owner.get(&rev) {
            Some(prev) if *prev != c.caller => push(
                out,
                Rule::ReusedRevision,
                key,
                format!("revision {rev} went to {prev} and to {c:?}"),
            ),
            _ => {
                owner.insert(rev, &c.caller);
            }
        }
    }
    for e in &recs.expiries {
        if let Some(holder) = owner.get(&e.seq) {
            push(
                out,
                Rule::ReusedRevision,
                key,
                format!(
                    "revision {} is an expiry marker and a write of {holder}",
                    e.seq
                ),
            );
        }
    }
}

/// (b1) across keys: a revision is a stream sequence, so one write of one key owns it.
fn check_global_reuse(records: &[Record], out: &mut Vec<Violation>) {
    let mut owner: HashMap<u64, (&str, &str)> = HashMap::new();
    let writes = records.iter().filter_map(|r| match r {
        Record::Call(c) => match c.outcome {
            Outcome::Granted { revision, .. }
            | Outcome::Renewed { revision, .. }
            | Outcome::Released { revision } => Some((revision, c.key.as_str(), c.caller.as_str())),
            _ => None,
        },
        Record::Expiry(e) => Some((e.seq, e.key.as_str(), "(expiry marker)")),
        _ => None,
    });
    for (rev, key, who) in writes {
        match owner.get(&rev) {
            Some(&(k, _)) if k != key => push(
                out,
                Rule::ReusedRevision,
                key,
                format!("revision {rev} of {key} (by {who}) was already a revision of {k}"),
            ),
            Some(_) => {} // the same key: the per-key check tells holders apart
            None => {
                owner.insert(rev, (key, who));
            }
        }
    }
}

/// (b2): an answer never shows a lower revision than one answered before its request.
fn check_monotonic(key: &str, recs: &KeyRecords, out: &mut Vec<Violation>) {
    // (replied, revision, owner, description) of everything that showed a revision.
    let mut shown: Vec<(Nanos, u64, Option<&str>, String)> = recs
        .calls
        .iter()
        .filter_map(|c| {
            revision_of(&c.outcome).map(|rev| {
                let owner = match c.outcome {
                    Outcome::Released { .. } => None,
                    _ => owner_of(c),
                };
                (c.replied, rev, owner, format!("{c:?}"))
            })
        })
        .chain(
            recs.expiries
                .iter()
                .map(|e| (e.observed, e.seq, None, format!("{e:?}"))),
        )
        .collect();
    shown.sort_by_key(|s| s.0);
    // Prefix maximum of the revisions by answer time.
    let mut best: Vec<usize> = Vec::with_capacity(shown.len());
    for (i, s) in shown.iter().enumerate() {
        let keep = match best.last() {
            Some(&b) if shown[b].1 >= s.1 => b,
            _ => i,
        };
        best.push(keep);
    }
    for c in &recs.calls {
        let Some(rev) = revision_of(&c.outcome) else {
            continue;
        };
        // Everything answered before this call was sent.
        let n = shown.partition_point(|s| s.0 < c.sent);
        if n == 0 {
            continue;
        }
        let (_, top, top_owner, ref what) = shown[best[n - 1]];
        let strict = match &c.outcome {
            Outcome::Renewed { .. } | Outcome::Released { .. } => true,
            Outcome::Granted { .. } => top_owner != Some(c.caller.as_str()),
            _ => false,
        };
        if rev < top || (strict && rev == top) {
            push_shown_by(
                out,
                Rule::RevisionNotHigher,
                key,
                c,
                format!("{c:?} shows revision {rev}, but {what} was answered before it was sent"),
            );
        }
    }
}

/// (c1), (c2): the store accepted only fences handed to their writers, and never a
/// write from a holder after another holder's write with a fence as high.
fn check_store(key: &str, recs: &KeyRecords, verdict: &mut Verdict) {
    let mut handed: HashMap<u64, Vec<&str>> = HashMap::new();
    let mut by_holder: HashMap<&str, Vec<&Call>> = HashMap::new();
    for c in &recs.calls {
        if let Outcome::Granted { revision, .. } | Outcome::Renewed { revision, .. } = c.outcome {
            handed.entry(revision).or_default().push(&c.caller);
        }
        if c.op != Op::Read {
            by_holder.entry(&c.caller).or_default().push(c);
        }
    }
    // The latest accepted write of another holder: (holder, revision).
    let mut newest: Option<&StoreWrite> = None;
    for w in recs.writes.iter().filter(|w| w.accepted) {
        if !handed
            .get(&w.revision)
            .is_some_and(|hs| hs.contains(&w.holder.as_str()))
        {
            push(
                &mut verdict.violations,
                Rule::ForgedFence,
                key,
                format!(
                    "{w:?}: revision {} was never handed to {}",
                    w.revision, w.holder
                ),
            );
        }
        if let Some(n) = newest
            && n.holder != w.holder
            && n.revision >= w.revision
        {
            push(
                &mut verdict.violations,
                Rule::StaleWriteAccepted,
                key,
                format!("{w:?} accepted after {n:?}"),
            );
        }
        if newest.is_none_or(|n| w.revision >= n.revision) {
            newest = Some(w);
        }
        // Late: the write's lease had certainly ended (latest possible expiry passed).
        let own = by_holder.get(w.holder.as_str()).map_or(&[][..], |v| &v[..]);
        let last = own
            .iter()
            .filter(|c| revision_of(&c.outcome) == Some(w.revision))
            .map(|c| c.replied)
            .max();
        let ttl = own
            .iter()
            .find_map(|c| match c.outcome {
                Outcome::Granted { ttl_ms, .. } | Outcome::Renewed { ttl_ms, .. } => Some(ttl_ms),
                _ => None,
            })
            .unwrap_or(0);
        let renewed_later = own.iter().any(|c| {
            revision_of(&c.outcome).is_some_and(|r| r > w.revision)
                || (c.op == Op::Renew && matches!(c.outcome, Outcome::Unknown { .. }))
        });
        if let Some(last) = last
            && !renewed_later
            && w.at > last + ms(ttl + EXPIRY_LATENESS_MS)
        {
            verdict.late_accepted += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const TTL: u64 = 2_000;

    fn call(key: &str, caller: &str, op: Op, sent: Nanos, replied: Nanos, o: Outcome) -> Record {
        Record::Call(Call {
            key: key.into(),
            caller: caller.into(),
            op,
            sent,
            replied,
            outcome: o,
        })
    }
    fn grant(caller: &str, sent: Nanos, rev: u64) -> Record {
        call(
            "k",
            caller,
            Op::Acquire,
            sent,
            sent + ms(1),
            Outcome::Granted {
                revision: rev,
                ttl_ms: TTL,
                write_lb: sent,
            },
        )
    }
    fn renew(caller: &str, sent: Nanos, rev: u64) -> Record {
        call(
            "k",
            caller,
            Op::Renew,
            sent,
            sent + ms(1),
            Outcome::Renewed {
                revision: rev,
                ttl_ms: TTL,
            },
        )
    }
    fn release(caller: &str, sent: Nanos, rev: u64) -> Record {
        call(
            "k",
            caller,
            Op::Release,
            sent,
            sent + ms(1),
            Outcome::Released { revision: rev },
        )
    }
    fn read(sent: Nanos, o: Outcome) -> Record {
        call("k", "reader", Op::Read, sent, sent + ms(1), o)
    }
    fn belief(holder: &str, rev: u64, from: Nanos, until: Nanos) -> Record {
        Record::Belief(Belief {
            key: "k".into(),
            holder: holder.into(),
            revision: rev,
            from,
            until,
        })
    }
    fn expiry(seq: u64, observed: Nanos) -> Record {
        Record::Expiry(Expiry {
            key: "k".into(),
            seq,
            observed,
        })
    }
    fn write(holder: &str, rev: u64, at: Nanos, accepted: bool) -> Record {
        Record::Store(StoreWrite {
            key: "k".into(),
            holder: holder.into(),
            revision: rev,
            at,
            accepted,
        })
    }
    fn rules(records: &[Record]) -> Vec<Rule> {
        check(records).violations.iter().map(|v| v.rule).collect()
    }

    /// A clean history: a grants, renews, expires; b takes over and releases; a again.
    fn clean() -> Vec<Record> {
        vec![
            grant("a", 10 * S, 1),
            belief("a", 1, 10 * S + ms(1), 12 * S + ms(600)),
            renew("a", 10 * S + ms(600), 2),
            write("a", 1, 10 * S + ms(5), true),
            write("a", 2, 11 * S, true),
            read(
                11 * S,
                Outcome::Held {
                    holder: "a".into(),
                    revision: 2,
                },
            ),
            expiry(3, 12 * S + ms(800)),
            grant("b", 13 * S, 4),
            belief("b", 4, 13 * S + ms(1), 14 * S),
            write("b", 4, 13 * S + ms(10), true),
            write("a", 2, 13 * S + ms(20), false),
            release("b", 14 * S, 5),
            read(14 * S + ms(10), Outcome::Free),
            grant("a", 15 * S, 6),
            grant("a", 15 * S + ms(100), 6), // an idempotent retry: the same tenure
            belief("a", 6, 15 * S + ms(1), 17 * S),
        ]
    }

    #[test]
    fn a_clean_history_passes() {
        let v = check(&clean());
        assert!(v.violations.is_empty(), "{v}");
        assert_eq!((v.grants, v.renewals, v.releases, v.expiries), (3, 1, 1, 1));
        assert_eq!((v.reads, v.store_writes, v.store_rejected), (2, 4, 1));
    }

    #[test]
    fn concurrent_calls_may_see_either_order() {
        // b's read overlaps a's renew: seeing the old revision is linearizable.
        let h = vec![
            grant("a", 10 * S, 1),
            call(
                "k",
                "a",
                Op::Renew,
                11 * S,
                11 * S + ms(50),
                Outcome::Renewed {
                    revision: 2,
                    ttl_ms: TTL,
                },
            ),
            read(
                11 * S + ms(10),
                Outcome::Held {
                    holder: "a".into(),
                    revision: 1,
                },
            ),
        ];
        assert_eq!(rules(&h), vec![]);
    }

    #[test]
    fn overlapping_beliefs_fail() {
        let h = vec![
            belief("a", 1, 10 * S, 12 * S),
            belief("b", 4, 11 * S, 13 * S),
        ];
        assert_eq!(rules(&h), vec![Rule::OverlappingBeliefs]);
        // The same holder's two beliefs may touch; disjoint ones of two holders pass.
        let h = vec![
            belief("a", 1, 10 * S, 12 * S),
            belief("a", 3, 11 * S, 13 * S),
            belief("b", 4, 13 * S, 14 * S),
        ];
        assert_eq!(rules(&h), vec![]);
    }

    #[test]
    fn a_grant_while_a_lease_stands_fails() {
        // a renewed at 10.6 s with a 2 s TTL: the lease stands until 12.6 s at least.
        let h = vec![
            grant("a", 10 * S, 1),
            renew("a", 10 * S + ms(600), 2),
            grant("b", 12 * S, 3),
        ];
        assert_eq!(rules(&h), vec![Rule::GrantWhileHeld]);
        // After a release by a, b may be granted at once.
        let h = vec![
            grant("a", 10 * S, 1),
            release("a", 10 * S + ms(500), 2),
            grant("b", 10 * S + ms(600), 3),
        ];
        assert_eq!(rules(&h), vec![]);
        // An unanswered release may have freed it: not a violation.
        let h = vec![
            grant("a", 10 * S, 1),
            call(
                "k",
                "a",
                Op::Release,
                10 * S + ms(500),
                11 * S,
                Outcome::Unknown {
                    why: "timeout".into(),
                },
            ),
            grant("b", 11 * S, 3),
        ];
        assert_eq!(rules(&h), vec![]);
    }

    #[test]
    fn an_idempotent_grant_is_bounded_by_its_earliest_write() {
        // a's first acquire went unanswered at 10 s; the retry at 11 s is granted
        // idempotently, so the lease may end at 12 s: b at 12.1 s is fine.
        let h = vec![
            call(
                "k",
                "a",
                Op::Acquire,
                10 * S,
                11 * S,
                Outcome::Unknown {
                    why: "timeout".into(),
                },
            ),
            call(
                "k",
                "a",
                Op::Acquire,
                11 * S,
                11 * S + ms(1),
                Outcome::Granted {
                    revision: 1,
                    ttl_ms: TTL,
                    write_lb: 10 * S,
                },
            ),
            grant("b", 12 * S + ms(100), 3),
        ];
        assert_eq!(rules(&h), vec![]);
    }

    #[test]
    fn a_read_of_another_owner_or_free_while_a_lease_stands_fails() {
        let h = vec![
            grant("a", 10 * S, 1),
            read(
                11 * S,
                Outcome::Held {
                    holder: "b".into(),
                    revision: 3,
                },
            ),
        ];
        assert_eq!(rules(&h), vec![Rule::GrantWhileHeld]);
        let h = vec![grant("a", 10 * S, 1), read(11 * S, Outcome::Free)];
        assert_eq!(rules(&h), vec![Rule::GrantWhileHeld]);
    }

    #[test]
    fn a_revision_handed_out_twice_fails() {
        let h = vec![grant("a", 10 * S, 5), grant("b", 20 * S, 5)];
        let r = rules(&h);
        assert!(r.contains(&Rule::ReusedRevision), "{r:?}");
        assert!(r.contains(&Rule::RevisionNotHigher), "{r:?}");
        let h = vec![grant("a", 10 * S, 5), expiry(5, 13 * S)];
        assert!(rules(&h).contains(&Rule::ReusedRevision));
    }

    #[test]
    fn a_revision_of_two_keys_fails() {
        let mut other = grant("b", 20 * S, 5);
        if let Record::Call(c) = &mut other {
            c.key = "j".into();
        }
        let h = vec![grant("a", 10 * S, 5), other];
        assert_eq!(rules(&h), vec![Rule::ReusedRevision]);
    }

    #[test]
    fn a_tenure_not_higher_than_an_earlier_one_fails() {
        // After a restart b gets revision 3, lower than a's 4 seen before.
        let h = vec![
            grant("a", 10 * S, 2),
            renew("a", 10 * S + ms(600), 4),
            grant("b", 20 * S, 3),
        ];
        assert_eq!(rules(&h), vec![Rule::RevisionNotHigher]);
        // Lower than an expiry marker seen before the request.
        let h = vec![
            grant("a", 10 * S, 2),
            expiry(6, 13 * S),
            grant("b", 14 * S, 5),
        ];
        assert_eq!(rules(&h), vec![Rule::RevisionNotHigher]);
    }

    #[test]
    fn a_stale_read_fails() {
        let h = vec![
            grant("a", 10 * S, 1),
            renew("a", 10 * S + ms(600), 2),
            read(
                11 * S,
                Outcome::Held {
                    holder: "a".into(),
                    revision: 1,
                },
            ),
        ];
        assert_eq!(rules(&h), vec![Rule::RevisionNotHigher]);
    }

    fn read_by(caller: &str, sent: Nanos, o: Outcome) -> Record {
        call("k", caller, Op::Read, sent, sent + ms(1), o)
    }

    #[test]
    fn stale_reports_are_violations_and_counted_as_such() {
        // a is granted 1 and renews to 2; then reports of a at 1, "free" while a's
        // lease stands, and b's acquire told a holds it at 1: three stale reports.
        let h = vec![
            grant("a", 10 * S, 1),
            renew("a", 10 * S + ms(600), 2),
            read_by(
                "reader",
                11 * S,
                Outcome::Held {
                    holder: "a".into(),
                    revision: 1,
                },
            ),
            read_by("reader", 11 * S + ms(100), Outcome::Free),
            call(
                "k",
                "b",
                Op::Acquire,
                11 * S + ms(200),
                11 * S + ms(201),
                Outcome::Held {
                    holder: "a".into(),
                    revision: 1,
                },
            ),
        ];
        let v = check(&h);
        // The "free" read breaks both the grant's and the renewal's standing lease.
        assert_eq!(v.violations.len(), 4, "{v}");
        assert_eq!(v.stale_reports(), 3, "three calls, each counted once: {v}");
        assert!(v.summary().contains("stale reports: 3"), "{}", v.summary());
        // A repeat grant answered from the old state is a stale report; the same
        // answer claimed as a fresh write is a violation but no report.
        let stale = |write_lb: Nanos| {
            vec![
                grant("b", 5 * S, 1),
                renew("b", 5 * S + ms(300), 2),
                grant("a", 10 * S, 5),
                call(
                    "k",
                    "b",
                    Op::Acquire,
                    11 * S,
                    11 * S + ms(1),
                    Outcome::Granted {
                        revision: 1,
                        ttl_ms: 2000,
                        write_lb,
                    },
                ),
            ]
        };
        let v = check(&stale(5 * S));
        assert_eq!(v.stale_reports(), 1, "{v}");
        let v = check(&stale(11 * S));
        assert!(
            !v.violations.is_empty(),
            "a fresh grant below a revision passed"
        );
        assert_eq!(v.stale_reports(), 0, "{v}");
        // What a write, a belief or the store shows is never a report.
        let h = vec![
            belief("a", 1, 11 * S, 11 * S + ms(500)),
            belief("b", 4, 11 * S + ms(100), 11 * S + ms(600)),
        ];
        let v = check(&h);
        assert_eq!((v.violations.len(), v.stale_reports()), (1, 0), "{v}");
        let h = vec![grant("a", 10 * S, 1), grant("b", 11 * S, 3)];
        assert_eq!(check(&h).stale_reports(), 0);
    }

    #[test]
    fn a_renew_that_does_not_raise_the_fence_fails() {
        let h = vec![grant("a", 10 * S, 3), renew("a", 10 * S + ms(600), 3)];
        assert_eq!(rules(&h), vec![Rule::RevisionNotHigher]);
    }

    #[test]
    fn an_old_owners_write_accepted_after_the_new_owners_fails() {
        // A store that let a through with fence 2 after b wrote with 2 (a reused fence).
        let h = vec![
            grant("a", 10 * S, 2),
            write("b", 2, 13 * S, true),
            write("a", 2, 13 * S + ms(1), true),
        ];
        let r = rules(&h);
        assert!(r.contains(&Rule::StaleWriteAccepted), "{r:?}");
        assert!(r.contains(&Rule::ForgedFence), "b never got 2: {r:?}");
        // A broken store that accepts a lower fence after a higher one.
        let h = vec![
            grant("a", 10 * S, 2),
            expiry(3, 12 * S + ms(500)),
            grant("b", 13 * S, 4),
            write("b", 4, 13 * S + ms(5), true),
            write("a", 2, 13 * S + ms(6), true),
        ];
        assert_eq!(rules(&h), vec![Rule::StaleWriteAccepted]);
    }

    #[test]
    fn a_late_write_before_the_new_owner_writes_is_counted_not_a_violation() {
        let h = vec![
            grant("a", 10 * S, 2),
            write("a", 2, 13 * S, true), // after 10 + 2 + 0.325 s: late
            grant("b", 13 * S + ms(10), 4),
            write("b", 4, 13 * S + ms(20), true),
            write("a", 2, 13 * S + ms(30), false),
        ];
        let v = check(&h);
        assert!(v.violations.is_empty(), "{v}");
        assert_eq!((v.late_accepted, v.store_rejected), (1, 1));
    }

    #[test]
    fn the_fenced_store_rejects_lower_fences_and_records_all() {
        let history = History::new();
        let store = FencedStore::new(history.clone());
        assert!(store.write("k", "a", 3));
        assert!(store.write("k", "a", 3));
        assert!(store.write("k", "b", 5));
        assert!(!store.write("k", "a", 3));
        assert!(store.write("j", "a", 1), "keys are fenced apart");
        let accepted: Vec<bool> = history
            .records()
            .iter()
            .map(|r| match r {
                Record::Store(w) => w.accepted,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(accepted, vec![true, true, true, false, true]);
    }

    #[test]
    fn records_round_trip_as_json_lines() {
        for r in clean() {
            let line = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), r);
        }
    }
}
