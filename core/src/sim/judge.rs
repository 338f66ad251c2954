//! The judge: the lease invariants a [`World`] checks at every step. A write is
//! judged before it reaches the stream, a reply against the stream as it is when the
//! reply is sent, and the stream's log for two holders' leases overlapping.

use std::collections::BTreeMap;
use std::time::Duration;

use super::world::{Active, CallKind, SeenWrite, Violation, World};
use super::{OwnerBehaviour, SimMsg};
use crate::record::LeaseEvent;
use crate::wire::{ErrorKind, Response};

impl Active {
    /// The key of a renew or release.
    fn kind_key(&self) -> String {
        match &self.kind {
            CallKind::Acquire { key, .. }
            | CallKind::Renew { key, .. }
            | CallKind::Release { key, .. }
            | CallKind::Owner { key }
            | CallKind::Forward { key } => key.clone(),
            CallKind::Invalid { .. } => String::new(),
        }
    }
}

impl World {
    /// A write about to reach the stream: would it break a lease rule if accepted?
    pub(super) fn check_write(&self, i: usize, w: &SeenWrite) -> Result<(), Violation> {
        let a = &self.calls[i];
        let current = self.sim.current(&w.key);
        let accepted = current.map_or(0, |m| m.seq) == w.expected_revision;
        if !accepted {
            return Ok(());
        }
        let live = self.sim.live(&w.key);
        match (&a.kind, w.event) {
            (CallKind::Acquire { .. }, Some(LeaseEvent::Acquired)) => {
                if let Some((record, seq)) = live {
                    return Err(format!(
                        "acquire would overwrite the live lease of {} at {seq}",
                        record.holder
                    ));
                }
            }
            (
                CallKind::Renew {
                    holder, revision, ..
                }
                | CallKind::Release {
                    holder, revision, ..
                },
                Some(LeaseEvent::Renewed | LeaseEvent::Released),
            ) => match live {
                Some((record, seq)) if &record.holder == holder && seq == *revision => {}
                other => {
                    return Err(format!(
                        "{:?} by {holder} with fence {revision} would write over {other:?}",
                        w.event
                    ));
                }
            },
            (kind, event) => return Err(format!("{kind:?} issued a {event:?} write")),
        }
        Ok(())
    }

    pub(super) fn check_reply(&mut self, i: usize, reply: &Response) -> Result<(), Violation> {
        if let Some((holder, key, revision)) = self.judge_reply(i, reply)? {
            self.grant(&holder, &key, revision);
        }
        Ok(())
    }

    /// Checks a reply; returns the grant it makes, if any.
    fn judge_reply(
        &self,
        i: usize,
        reply: &Response,
    ) -> Result<Option<(String, String, u64)>, Violation> {
        let a = &self.calls[i];
        if let CallKind::Invalid { known } = a.kind {
            let invalid = reply.error_kind() == Some(ErrorKind::Invalid);
            if known && !invalid {
                return Err(format!("an invalid request got {reply:?}"));
            }
            if invalid && a.kv_effects > 0 {
                return Err("an invalid request reached the KV".to_string());
            }
            return Ok(None);
        }
        if reply.error_kind() == Some(ErrorKind::Invalid) {
            return Err(format!("a valid request {:?} got {reply:?}", a.kind));
        }
        match (&a.kind, reply) {
            (CallKind::Acquire { holder, key }, Response::Acquired(r)) if r.granted => {
                let backing = self.sim.at(r.lease.revision).and_then(SimMsg::record);
                if backing.as_ref().map(|b| &b.holder) != Some(holder) || &r.lease.holder != holder
                {
                    return Err(format!(
                        "grant of {key} to {holder} not backed by its record: {r:?}"
                    ));
                }
                let new_tenure = a.written.contains(&r.lease.revision);
                let max = self.max_granted.get(key).copied().unwrap_or(0);
                if new_tenure && r.lease.revision <= max {
                    return Err(format!(
                        "new tenure of {key} at {} is not above earlier fence {max}",
                        r.lease.revision
                    ));
                }
                if !new_tenure && !a.written.is_empty() {
                    return Err("acquire wrote but replied with another revision".to_string());
                }
                // A repeat grant wrote nothing: it stands only if the lease is the
                // caller's now, or it was answered from a stale read.
                if !new_tenure {
                    self.check_current(key, Some((holder, r.lease.revision)), "repeat grant")?;
                }
                return Ok(Some((holder.clone(), key.clone(), r.lease.revision)));
            }
            (CallKind::Acquire { holder, key }, Response::Acquired(r)) => {
                if &r.lease.holder == holder {
                    return Err("granted:false naming the caller".to_string());
                }
                self.check_current(
                    key,
                    Some((&r.lease.holder, r.lease.revision)),
                    "granted:false",
                )?;
            }
            (CallKind::Renew { holder, key, .. }, Response::Lease(l)) => {
                if !a.written.contains(&l.revision) || &l.holder != holder {
                    return Err(format!("renew success not backed by its own write: {l:?}"));
                }
                return Ok(Some((holder.clone(), key.clone(), l.revision)));
            }
            (CallKind::Release { .. }, Response::Released(r)) => {
                if !a.written.contains(&r.revision) {
                    return Err(format!(
                        "release success not backed by its own delete: {r:?}"
                    ));
                }
            }
            (
                CallKind::Renew {
                    holder, revision, ..
                }
                | CallKind::Release {
                    holder, revision, ..
                },
                Response::Error(e),
            ) if matches!(e.kind, ErrorKind::Lost | ErrorKind::FenceMismatch) => {
                // Judged against the stream as it is when the reply is sent, not
                // against what the call read: the read may have been stale.
                let held_by_caller = match self.sim.live(&a.kind_key()) {
                    Some((record, r)) if &record.holder == holder => Some(r),
                    _ => None,
                };
                // A lease this close to its end is lost to renew and release.
                let at_end = self.sim.current(&a.kind_key()).is_some_and(|m| {
                    m.expires_ms().is_some_and(|end| {
                        let guard = crate::call::expiry_guard(m.ttl_ms.unwrap_or(0));
                        self.sim.now_ms + guard.as_millis() as u64 >= end
                    })
                });
                // A renewal stored (by the server's clock) within the expiry guard of
                // the end of the lease it renewed is lost: that lease's expiry marker
                // may still wipe it.
                let renewed_too_late = |r: u64| {
                    let old = self.sim.at(*revision);
                    let ends = old.and_then(SimMsg::expires_ms);
                    let guard = old.map_or(0, |m| {
                        crate::call::expiry_guard(m.ttl_ms.unwrap_or(0)).as_millis() as u64
                    });
                    let stored = self.sim.at(r).map(|m| m.time_ms);
                    matches!((ends, stored), (Some(end), Some(at)) if at + guard >= end)
                };
                let right = match (e.kind, held_by_caller) {
                    (ErrorKind::Lost, None) => true,
                    (ErrorKind::Lost, Some(r)) => (r == *revision && at_end) || renewed_too_late(r),
                    (ErrorKind::FenceMismatch, Some(r)) => r != *revision,
                    _ => false,
                };
                if !right {
                    return Err(format!(
                        "{} while the stream holds {:?}: a stale read (the call read {:?})",
                        e.kind,
                        self.sim.live(&a.kind_key()),
                        a.last_read
                    ));
                }
            }
            (CallKind::Forward { key }, Response::Error(e)) if e.kind == ErrorKind::NotHeld => {
                self.check_current(key, None, "not_held")?;
            }
            (CallKind::Forward { .. }, Response::Forwarded(f)) => {
                if f.payload != "cGluZw==" {
                    return Err(format!("forward payload changed: {f:?}"));
                }
                match &a.last_inbox {
                    Some((holder, fence, Some(OwnerBehaviour::Echo)))
                        if *holder == f.holder && *fence == f.revision => {}
                    other => {
                        return Err(format!(
                            "forwarded {f:?}, but the owner last tried was {other:?}"
                        ));
                    }
                }
            }
            (_, Response::Error(e)) if e.kind == ErrorKind::Unavailable => {
                let limit = match &a.kind {
                    CallKind::Acquire { .. } => crate::call::MAX_ACQUIRE_WRITES,
                    CallKind::Renew { .. } | CallKind::Release { .. } => {
                        crate::call::MAX_FENCED_WRITES
                    }
                    _ => u32::MAX,
                };
                let kept_changing =
                    a.writes >= limit || a.confirms >= crate::call::MAX_READ_CONFIRMS;
                if !a.js_failed && !kept_changing {
                    return Err(format!(
                        "{:?} replied unavailable with JetStream answering every effect \
                         ({} writes, {} confirmations): {e:?}",
                        a.kind, a.writes, a.confirms
                    ));
                }
            }
            (CallKind::Forward { key }, Response::Error(e))
                if matches!(
                    e.kind,
                    ErrorKind::OwnerUnavailable
                        | ErrorKind::OwnerRejected
                        | ErrorKind::OwnerTimeout
                        | ErrorKind::ReplyTooLarge
                ) =>
            {
                let named = e.holder.clone().zip(e.revision);
                let tried = a.last_inbox.as_ref().map(|(h, r, _)| (h.clone(), *r));
                if named != tried {
                    return Err(format!(
                        "{} names {named:?}, but the owner last tried was {tried:?}",
                        e.kind
                    ));
                }
                let answered = a.last_inbox.as_ref().and_then(|(_, _, b)| *b);
                let past_deadline = a.deadline.is_some_and(|d| self.now() >= d);
                let right = match e.kind {
                    ErrorKind::OwnerTimeout => {
                        past_deadline || answered == Some(OwnerBehaviour::Silent)
                    }
                    ErrorKind::ReplyTooLarge => answered == Some(OwnerBehaviour::Huge),
                    kind => {
                        let want = match kind {
                            ErrorKind::OwnerUnavailable => OwnerBehaviour::NoResponders,
                            _ => OwnerBehaviour::Reject,
                        };
                        // Given up on: the re-read shows the same owner, or the
                        // attempts ran out.
                        let right = answered == Some(want) && !past_deadline;
                        if right && a.inbox_attempts < crate::call::MAX_FORWARD_ATTEMPTS {
                            let shown = tried.as_ref().map(|(h, r)| (h, *r));
                            self.check_current(key, shown, "the owner given up on")?;
                        }
                        right
                    }
                };
                if !right {
                    return Err(format!(
                        "{} after the owner answered {answered:?} (attempt {}, past the \
                         deadline: {past_deadline}; the stream holds {:?})",
                        e.kind,
                        a.inbox_attempts,
                        self.sim.live(key).map(|(r, rev)| (r.holder, rev))
                    ));
                }
            }
            (CallKind::Owner { key }, Response::Lease(l)) => {
                self.check_current(key, Some((&l.holder, l.revision)), "owner")?;
                // The times are the stored message's: its store time plus its TTL.
                let m = self.sim.current(key).expect("checked: held");
                let record = m.record().expect("checked: held");
                let ends = self.sim.epoch + Duration::from_millis(m.time_ms + record.ttl_ms);
                let expires = crate::record::format_time(ends);
                if l.ttl_ms != record.ttl_ms || l.expires_at != expires {
                    return Err(format!(
                        "owner of {key} showed {l:?}, the stream's lease ends {expires} \
                         ({} ms)",
                        record.ttl_ms
                    ));
                }
            }
            (CallKind::Owner { key }, Response::Free(_)) => {
                self.check_current(key, None, "owner")?;
            }
            (kind, reply) => return Err(format!("{kind:?} replied {reply:?}")),
        }
        Ok(None)
    }

    /// A reply answered from a read must show the stream as it is now: the read it
    /// came from (and its confirmation) happened in this same step.
    fn check_current(
        &self,
        key: &str,
        shown: Option<(&String, u64)>,
        what: &str,
    ) -> Result<(), Violation> {
        let live = self.sim.live(key);
        let now = live.as_ref().map(|(record, rev)| (&record.holder, *rev));
        if now != shown {
            return Err(format!(
                "{what} of {key} showed {shown:?} while the stream holds {now:?}: a stale read"
            ));
        }
        Ok(())
    }

    fn grant(&mut self, holder: &str, key: &str, revision: u64) {
        self.fences
            .entry((holder.to_string(), key.to_string()))
            .or_default()
            .push(revision);
        let max = self.max_granted.entry(key.to_string()).or_default();
        *max = (*max).max(revision);
    }

    /// No two holders' leases on one key cover the same instant of server time.
    pub(super) fn check_no_overlap(&self) -> Result<(), Violation> {
        let mut last: BTreeMap<&str, &SimMsg> = BTreeMap::new();
        for m in &self.sim.log {
            if let (Some(prev), Some(now_rec)) = (last.get(m.key.as_str()), m.record())
                && let Some(prev_rec) = prev.record()
                && prev_rec.holder != now_rec.holder
                && prev.expires_ms().is_some_and(|end| m.time_ms < end)
            {
                return Err(format!(
                    "{} granted {} at {} ms while {}'s lease (rev {}) ran to {:?}",
                    m.key,
                    now_rec.holder,
                    m.time_ms,
                    prev_rec.holder,
                    prev.seq,
                    prev.expires_ms()
                ));
            }
            last.insert(&m.key, m);
        }
        Ok(())
    }
}
