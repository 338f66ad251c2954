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
//! # Known stale reads ([`check_with`])
//!
//! A scenario that reproduces a known, documented read anomaly (a cut-off stream
//! leader answering reads from its old state) checks with an [`Allowance`]: reports
//! that show an older state (a lower revision than one already answered, or "free"
//! while a lease stood), answered to named callers within a time window, are counted
//! ([`Verdict::known_stale_reads`]) and kept ([`Verdict::known`]) instead of failing.
//! Only reports can be allowed, never what a write, a belief or the store shows.
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
    /// `owner` reply, or an acquire's `granted: false` naming a holder): what
    /// [`check_with`] may attribute to a known stale reader. `None` for every
    /// violation a write, a belief, an expiry or the store shows.
    pub read: Option<Call>,
}

/// Reads that [`check_with`] counts as known instead of failing: answers to
/// `stale_reads_from` callers, sent at or after `window.0` and answered by
/// `window.1`, that show an *older* state than the history already had. That is a
/// reported owner whose revision is below one answered before the call was sent
/// ([`Rule::RevisionNotHigher`]), or a read saying "free" while a lease certainly
/// stood ([`Rule::GrantWhileHeld`]), or a *repeat* grant (an idempotent acquire,
/// answered from the read alone, no write) of an old revision the caller held
/// before. Nothing else is ever allowed: not overlapping beliefs, reused revisions,
/// forged fences, stale store writes, any fresh grant, renewal or release, nor a
/// report of a *newer* owner than the history shows. (A holder that believed a stale
/// repeat grant would act on an old fence; the store would reject it, and the holder
/// library refuses grants below a revision it has seen.)
///
/// Name the callers by a fact of the setup, not a guess from the answers: for
/// example the clients connected to the cut-off node only (every call they make is
/// answered there), or, for the short time after a heal while the deposed leader
/// still answers every node's reads, all of them. [`check_with`] takes several.
#[derive(Clone, Debug, Default)]
pub struct Allowance {
    /// The callers whose stale reports are known.
    pub stale_reads_from: Vec<String>,
    /// `(from, until)` on `CLOCK_MONOTONIC`: the call was sent at or after `from`
    /// and answered at or before `until`.
    pub window: (Nanos, Nanos),
}

impl Allowance {
    /// Whether `v` is a known stale read under this allowance.
    pub fn covers(&self, v: &Violation) -> bool {
        let Some(c) = &v.read else {
            return false;
        };
        let stale_shape = match (v.rule, &c.outcome) {
            (Rule::RevisionNotHigher, Outcome::Held { .. }) => true,
            // A repeat grant of an old lease of the caller's, read from the old state:
            // no write happened, so it is a report too. A fresh grant never is.
            (Rule::RevisionNotHigher, Outcome::Granted { write_lb, .. }) => *write_lb < c.sent,
            (Rule::GrantWhileHeld, Outcome::Free) => c.op == Op::Read,
            _ => false,
        };
        stale_shape
            && self.stale_reads_from.contains(&c.caller)
            && c.sent >= self.window.0
            && c.replied <= self.window.1
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
    /// The broken rules (with [`check_with`]: those its [`Allowance`] does not cover).
    pub violations: Vec<Violation>,
    /// With [`check_with`]: how many calls (distinct answers) showed a stale read the
    /// allowance covers. Always 0 from [`check`].
    pub known_stale_reads: usize,
    /// With [`check_with`]: the violations those calls showed, kept for the record.
    pub known: Vec<Violation>,
}

impl Verdict {
    /// The one line a scenario prints, e.g.
    /// `412 grants, 1830 renewals, ... violations: 0`.
    pub fn summary(&self) -> String {
        format!(
            "{} grants, {} renewals, {} releases, {} expiries, {} reads, {} unknown, \
             {} fenced writes ({} rejected, {} late accepted), violations: {}",
            self.grants,
            self.renewals,
            self.releases,
            self.expiries,
            self.reads,
            self.unknown,
            self.store_writes,
            self.store_rejected,
            self.late_accepted,
            self.violations.len()
        )
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

/// Checks a history against rules (a), (b), (c), like [`check`], but moves the
/// violations any of `allowances` covers (stale reports by its callers within its
/// window)
/// out of [`Verdict::violations`] into [`Verdict::known`], counting the calls that
/// showed them in [`Verdict::known_stale_reads`]. Every other violation stays.
pub fn check_with(records: &[Record], allowances: &[Allowance]) -> Verdict {
    let mut verdict = check(records);
    let (known, rest): (Vec<Violation>, Vec<Violation>) = std::mem::take(&mut verdict.violations)
        .into_iter()
        .partition(|v| allowances.iter().any(|a| a.covers(v)));
    let mut calls: Vec<(&str, &str, Nanos, Nanos)> = known
        .iter()
        .filter_map(|v| v.read.as_ref())
        .map(|c| (c.key.as_str(), c.caller.as_str(), c.sent, c.replied))
        .collect();
    calls.sort_unstable();
    calls.dedup();
    verdict.known_stale_reads = calls.len();
    verdict.violations = rest;
    verdict.known = known;
    verdict
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
/// ([`Violation::read`]) so that [`check_with`] can attribute it.
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

    /// A reader on the cut-off node, and the window of the cut (10.5 s to 12 s).
    fn cut_allowance() -> Allowance {
        Allowance {
            stale_reads_from: vec!["reader-cut".into(), "b".into()],
            window: (10 * S + ms(500), 12 * S),
        }
    }
    fn read_by(caller: &str, sent: Nanos, o: Outcome) -> Record {
        call("k", caller, Op::Read, sent, sent + ms(1), o)
    }
    /// a is granted 1 and renews to 2; then a report of a at 1 (stale) by `caller`.
    fn stale_read_by(caller: &str, sent: Nanos) -> Vec<Record> {
        vec![
            grant("a", 10 * S, 1),
            renew("a", 10 * S + ms(600), 2),
            read_by(
                caller,
                sent,
                Outcome::Held {
                    holder: "a".into(),
                    revision: 1,
                },
            ),
        ]
    }

    #[test]
    fn a_stale_read_inside_the_allowance_is_counted_as_known() {
        let h = stale_read_by("reader-cut", 11 * S);
        assert_eq!(
            rules(&h),
            vec![Rule::RevisionNotHigher],
            "check alone fails it"
        );
        let v = check_with(&h, &[cut_allowance()]);
        assert!(v.violations.is_empty(), "{v}");
        assert_eq!(v.known_stale_reads, 1);
        assert_eq!(v.known.len(), 1);
        assert_eq!(v.known[0].rule, Rule::RevisionNotHigher);
        // A read saying "free" while a's lease stands, and a holder's acquire answered
        // `granted: false` naming the replaced owner: reports, known too.
        let mut h = stale_read_by("reader-cut", 11 * S);
        h.push(read_by("reader-cut", 11 * S + ms(100), Outcome::Free));
        h.push(call(
            "k",
            "b",
            Op::Acquire,
            11 * S + ms(200),
            11 * S + ms(201),
            Outcome::Held {
                holder: "a".into(),
                revision: 1,
            },
        ));
        let v = check_with(&h, &[cut_allowance()]);
        assert!(v.violations.is_empty(), "{v}");
        assert_eq!(v.known_stale_reads, 3, "{:?}", v.known);
    }

    #[test]
    fn a_stale_repeat_grant_is_known_but_a_fresh_grant_below_is_not() {
        // b was granted 1 and renewed to 2 long ago; a holds it at 5 now. The cut
        // node answers b's acquire from its old state: "yours, at 1".
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
        let repeat = stale(5 * S);
        let v = check_with(&repeat, &[cut_allowance()]);
        assert!(v.violations.is_empty(), "{v}");
        assert_eq!(v.known_stale_reads, 1);
        // The same answer claimed as a fresh write (write after the send): fails.
        let fresh = stale(11 * S);
        let v = check_with(&fresh, &[cut_allowance()]);
        assert!(
            !v.violations.is_empty(),
            "a fresh grant below a revision passed: {v}"
        );
    }

    #[test]
    fn a_stale_read_outside_the_window_or_from_another_caller_fails() {
        // Answered after the window closed.
        let h = stale_read_by("reader-cut", 12 * S);
        let v = check_with(&h, &[cut_allowance()]);
        assert_eq!(v.violations.len(), 1, "{v}");
        assert_eq!(v.violations[0].rule, Rule::RevisionNotHigher);
        assert_eq!(v.known_stale_reads, 0);
        // Sent before the window opened.
        let mut h = stale_read_by("reader-cut", 10 * S + ms(700));
        h.push(renew("a", 10 * S + ms(650), 3));
        let early = check_with(
            &h,
            &[Allowance {
                window: (10 * S + ms(701), 12 * S),
                ..cut_allowance()
            }],
        );
        assert_eq!(early.violations.len(), 1, "{early}");
        // From a reader on another node.
        let v = check_with(&stale_read_by("reader-n2", 11 * S), &[cut_allowance()]);
        assert_eq!(v.violations.len(), 1, "{v}");
        assert_eq!(v.known_stale_reads, 0);
        // Unless a second allowance names it for a window that holds the read.
        let after_heal = Allowance {
            stale_reads_from: vec!["reader-n2".into()],
            window: (11 * S, 11 * S + ms(500)),
        };
        let v = check_with(
            &stale_read_by("reader-n2", 11 * S),
            &[cut_allowance(), after_heal.clone()],
        );
        assert!(v.violations.is_empty(), "{v}");
        assert_eq!(v.known_stale_reads, 1);
        let v = check_with(
            &stale_read_by("reader-n2", 11 * S + ms(600)),
            &[cut_allowance(), after_heal],
        );
        assert_eq!(v.violations.len(), 1, "{v}");
    }

    #[test]
    fn only_stale_reports_are_allowed_inside_the_window() {
        let allow = cut_allowance();
        let kinds = |h: &[Record]| -> Vec<Rule> {
            let v = check_with(h, std::slice::from_ref(&allow));
            assert_eq!(v.known_stale_reads, 0, "{:?}", v.known);
            v.violations.iter().map(|v| v.rule).collect()
        };
        // Overlapping beliefs of allowed callers.
        let h = vec![
            belief("reader-cut", 1, 11 * S, 11 * S + ms(500)),
            belief("b", 4, 11 * S + ms(100), 11 * S + ms(600)),
        ];
        assert_eq!(kinds(&h), vec![Rule::OverlappingBeliefs]);
        // A stale store write accepted from an allowed caller.
        let h = vec![
            grant("b", 8 * S, 2),
            expiry(3, 10 * S + ms(400)),
            grant("a", 10 * S + ms(600), 4),
            write("a", 4, 11 * S, true),
            write("b", 2, 11 * S + ms(1), true),
        ];
        assert_eq!(kinds(&h), vec![Rule::StaleWriteAccepted]);
        // A grant to an allowed caller while a's lease stands (a write, not a read).
        let h = vec![grant("a", 10 * S, 1), grant("b", 11 * S, 3)];
        assert_eq!(kinds(&h), vec![Rule::GrantWhileHeld]);
        // A reused revision, and a renewal that does not raise the fence.
        let h = vec![grant("a", 10 * S, 5), grant("b", 11 * S + ms(900), 5)];
        assert!(kinds(&h).contains(&Rule::ReusedRevision));
        let h = vec![grant("b", 11 * S, 3), renew("b", 11 * S + ms(600), 3)];
        assert_eq!(kinds(&h), vec![Rule::RevisionNotHigher]);
        // A report of a *newer* owner than the standing lease's: not a stale shape.
        let h = vec![
            grant("a", 10 * S, 1),
            read_by(
                "reader-cut",
                11 * S,
                Outcome::Held {
                    holder: "c".into(),
                    revision: 3,
                },
            ),
        ];
        assert_eq!(kinds(&h), vec![Rule::GrantWhileHeld]);
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
