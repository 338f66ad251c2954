//! The checker: the rules in the [`history`](super) docs, as [`check`], over a recorded history.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::*;

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

/// (b1) across keys: a revision is a stream sequence, so one write of one key owns
/// it in its stream. With several shards (`DAGNATS_TEST_SHARDS`) each stream
/// numbers its own, and keys of different shards may share a revision.
fn check_global_reuse(records: &[Record], out: &mut Vec<Violation>) {
    let shards = crate::test_shards();
    let mut owner: HashMap<(u32, u64), (&str, &str)> = HashMap::new();
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
        let at = (shards.shard_of(key), rev);
        match owner.get(&at) {
            Some(&(k, _)) if k != key => push(
                out,
                Rule::ReusedRevision,
                key,
                format!("revision {rev} of {key} (by {who}) was already a revision of {k}"),
            ),
            Some(_) => {} // the same key: the per-key check tells holders apart
            None => {
                owner.insert(at, (key, who));
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
