//! What the service world checks as it drains the service's outputs: the rules
//! of the [module docs](super), against what was asked and what the stream holds.

use super::{Asked, InFlight, ServiceWorld};
use crate::io::{HANDOFF_BOUND, NatsRequest, TransmitId};
use crate::reply_scope::ReplyScope;
use crate::service::{ServiceEvent, SubscriptionKind};
use crate::sim::{MsgKind, SimMsg};
use crate::subjects::{HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_KV_OPERATION};
use crate::wire::{Endpoint, Response};

impl ServiceWorld {
    /// Drains the service's outputs and checks each reply, what the stream
    /// stored since, then each write: the replies first, so that a write handed
    /// out with its call's answer counts as sent after it.
    pub(super) fn drain(&mut self) -> Result<(), String> {
        if self.stop_ended_ms.is_none()
            && self.service.stop_phase() == Some(crate::service::shutdown::StopPhase::Stopped)
        {
            self.stop_ended_ms = Some(self.now_ms);
        }
        self.drain_events()?;
        self.check_tombstones()?;
        self.republish();
        while let Some(t) = self.service.poll_transmit() {
            for m in t.publish.iter().chain(std::iter::once(&t.request)) {
                self.check_write_has_a_caller(m)?;
            }
            self.network.push(InFlight {
                id: t.id,
                due: self.now() + t.request.timeout,
                transmit: t,
            });
        }
        Ok(())
    }

    /// A stream write the service hands out must belong to a call still waiting
    /// for its reply (rule 5 of the [module docs](self)).
    fn check_write_has_a_caller(&self, m: &NatsRequest) -> Result<(), String> {
        let Some(key) = kv_key(&m.subject) else {
            return Ok(());
        };
        let header = |name: &str| {
            m.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        let waiting = |endpoints: &[Endpoint], holder: Option<&str>, revision: Option<u64>| {
            self.asked.values().any(|a| {
                endpoints.iter().any(|e| a.waits(*e))
                    && a.key == key.trim_end_matches(".read")
                    && holder.is_none_or(|h| a.holder == h)
                    && revision.is_none_or(|r| a.revision == Some(r))
            })
        };
        let (what, owned) = if key.ends_with(".read") {
            (
                "a read confirmation".to_string(),
                waiting(&Endpoint::ALL, None, None),
            )
        } else if header(HDR_KV_OPERATION).is_some() {
            let expected = header(HDR_EXPECTED_LAST_SUBJECT_SEQUENCE).and_then(|v| v.parse().ok());
            (
                format!("a tombstone expecting {expected:?}"),
                expected.is_some() && waiting(&[Endpoint::Release], None, expected),
            )
        } else {
            let holder = crate::record::LeaseRecord::parse(&m.payload)
                .map(|r| r.holder)
                .unwrap_or_default();
            (
                format!("a record of {holder}"),
                waiting(&[Endpoint::Acquire, Endpoint::Renew], Some(&holder), None),
            )
        };
        if owned {
            return Ok(());
        }
        let calls: Vec<String> = self
            .asked
            .iter()
            .filter(|(_, a)| a.endpoint.is_some() && a.key == key.trim_end_matches(".read"))
            .map(|(to, a)| {
                format!(
                    "{to}: {:?} by {} at {:?}{}",
                    a.endpoint,
                    a.holder,
                    a.revision,
                    if a.answered { ", answered" } else { "" }
                )
            })
            .collect();
        Err(format!(
            "{what} went out to {} after every call that could have sent it was answered \
             (a write not sent when its call gave up is never sent); the calls on the key: \
             {calls:?}",
            m.subject
        ))
    }

    /// No tombstone lands over a record whose holder did not ask to release it
    /// at that revision (rule 4 of the [module docs](self)): read over the
    /// stream's log since the last look.
    fn check_tombstones(&mut self) -> Result<(), String> {
        let from = self.log_checked;
        self.log_checked = self.sim.log.len();
        for (i, m) in self.sim.log.iter().enumerate().skip(from) {
            if m.kind != MsgKind::Tombstone {
                continue;
            }
            let Some(over) = self.sim.log[..i].iter().rev().find(|p| p.key == m.key) else {
                continue;
            };
            let Some(record) = over.record() else {
                continue;
            };
            let asked = self.asked.values().any(|a| {
                a.endpoint == Some(Endpoint::Release)
                    && a.key == m.key
                    && a.holder == record.holder
                    && a.revision == Some(over.seq)
            });
            if !asked {
                return Err(format!(
                    "the tombstone at {} removed {}'s lease of {} at {}, which {} never \
                     asked to release",
                    m.seq, record.holder, m.key, over.seq, record.holder
                ));
            }
        }
        Ok(())
    }

    /// Drains the service's events, checking each reply.
    fn drain_events(&mut self) -> Result<(), String> {
        while let Some(event) = self.service.poll_event() {
            match &event {
                ServiceEvent::Subscribe {
                    kind: SubscriptionKind::Changes,
                    ..
                } => self.hears_changes = true,
                ServiceEvent::Subscribe { subject, kind, .. }
                    if *kind != SubscriptionKind::Changes
                        && !self.subscribed.insert(subject.clone()) =>
                {
                    return Err(format!("subscribed twice to {subject}"));
                }
                ServiceEvent::Reply { id, to, body, .. } => {
                    if self.handing.insert(*id, self.now()).is_some() {
                        return Err(format!("reply {id:?} sent twice"));
                    }
                    self.check_reply(to, body)?
                }
                ServiceEvent::CancelReply { id } => {
                    // The world's client takes replies only when it settles: one
                    // it has not taken for the hand-off bound may be given up,
                    // never sooner and never one it took.
                    let Some(sent) = self.handing.remove(id) else {
                        return Err(format!("reply {id:?} given up, though not out"));
                    };
                    if self.now() < sent + HANDOFF_BOUND {
                        return Err(format!(
                            "reply {id:?} given up {:?} after it was sent, before the \
                             hand-off bound",
                            self.now() - sent
                        ));
                    }
                }
                ServiceEvent::Flush { .. } if !self.handing.is_empty() => {
                    return Err(format!(
                        "a flush was asked with {} replies not yet handed to the client",
                        self.handing.len()
                    ));
                }
                ServiceEvent::Cancel { id } => {
                    if !self.cancelled.insert(*id) {
                        return Err(format!("request {id:?} cancelled twice"));
                    }
                    self.lost.remove(id);
                }
                _ => {}
            }
            self.events.push(event);
        }
        if !self.service.is_done()
            && let Some((id, due)) = self.lost.iter().find(|(_, due)| **due < self.now())
        {
            return Err(format!(
                "request {id:?}, lost on the network, was not cancelled by its timeout \
                 ({:?} ago)",
                self.now() - *due
            ));
        }
        Ok(())
    }

    /// The ids of the requests in flight on the network, in order.
    pub fn in_flight_ids(&self) -> Vec<TransmitId> {
        self.network.iter().map(|f| f.id).collect()
    }

    fn check_reply(&mut self, to: &str, body: &[u8]) -> Result<(), String> {
        if ReplyScope::default().check(Some(to)).is_err() {
            return Err(format!("a reply went to {to:?}, which the rule refuses"));
        }
        let Some(asked) = self.asked.get_mut(to) else {
            return Err(format!("a reply went to {to}, which nobody asked from"));
        };
        if asked.answered {
            return Err(format!("{to} was answered twice"));
        }
        asked.answered = true;
        let Some(endpoint) = asked.endpoint else {
            if let Some(n) = self.many.remove(to) {
                return self.check_many_reply(to, n, body);
            }
            return Ok(());
        };
        let asked = asked.clone();
        let response = Response::decode(endpoint, body)
            .map_err(|e| format!("a reply that does not decode: {e}"))?;
        match (endpoint, &response) {
            (Endpoint::Acquire, Response::Acquired(r)) if r.granted => {
                let record = self.sim.at(r.lease.revision).and_then(SimMsg::record);
                if record.as_ref().map(|r| r.holder.as_str()) != Some(asked.holder.as_str())
                    || r.lease.holder != asked.holder
                    || r.lease.key != asked.key
                {
                    return Err(format!(
                        "grant to {} not backed by its record: {r:?}",
                        asked.holder
                    ));
                }
                let max = self.fences.entry(asked.key.clone()).or_default();
                if r.lease.revision < *max {
                    return Err(format!(
                        "grant of {} at {} below an earlier fence {max}",
                        asked.key, r.lease.revision
                    ));
                }
                *max = r.lease.revision;
            }
            (Endpoint::Release, Response::Released(r)) => self.check_release(&asked, r)?,
            (Endpoint::Renew, Response::Lease(l)) => {
                let record = self.sim.at(l.revision).and_then(SimMsg::record);
                if l.holder != asked.holder
                    || record.as_ref().map(|r| r.holder.as_str()) != Some(asked.holder.as_str())
                {
                    return Err(format!(
                        "renew of {} not backed by its record: {l:?}",
                        asked.holder
                    ));
                }
            }
            _ => {}
        }
        self.replies.push((to.to_string(), response));
        Ok(())
    }

    /// A `renew_many` reply: every item answered by it, each renewed item backed by
    /// its own record, the results in request order.
    fn check_many_reply(&mut self, to: &str, n: usize, body: &[u8]) -> Result<(), String> {
        self.many_replies.push((to.to_string(), body.to_vec()));
        let items: Vec<Asked> = (0..n)
            .filter_map(|i| {
                let asked = self.asked.get_mut(&format!("{to}#{i}"))?;
                asked.answered = true;
                Some(asked.clone())
            })
            .collect();
        let answer = crate::wire::RenewManyReply::decode(body)
            .map_err(|e| format!("a renew_many reply that does not decode: {e}"))?;
        let Ok(reply) = answer else {
            return Ok(());
        };
        if reply.results.len() != n {
            return Err(format!(
                "{to}: {} results for {n} items",
                reply.results.len()
            ));
        }
        for (asked, result) in items.iter().zip(&reply.results) {
            if result.key() != asked.key {
                return Err(format!(
                    "{to}: result for {} in {}'s place",
                    result.key(),
                    asked.key
                ));
            }
            if let crate::wire::RenewManyResult::Renewed(l) = result {
                let record = self.sim.at(l.revision).and_then(SimMsg::record);
                if l.holder != asked.holder
                    || record.as_ref().map(|r| r.holder.as_str()) != Some(asked.holder.as_str())
                {
                    return Err(format!(
                        "batched renew of {} not backed by its record: {l:?}",
                        asked.holder
                    ));
                }
            }
        }
        Ok(())
    }

    /// A release's success: the caller's, and the key tombstoned above the fence
    /// asked, over the caller's own record at that fence.
    fn check_release(&self, asked: &Asked, r: &crate::wire::ReleaseReply) -> Result<(), String> {
        let fence = asked.revision.unwrap_or_default();
        let tombstone = self
            .sim
            .at(r.revision)
            .filter(|m| m.kind == MsgKind::Tombstone && m.key == asked.key);
        let over = self.sim.log[..self.sim.log.partition_point(|m| m.seq < r.revision)]
            .iter()
            .rev()
            .find(|m| m.key == asked.key);
        let over_holder = over.and_then(SimMsg::record).map(|r| r.holder);
        if r.holder != asked.holder
            || r.key != asked.key
            || r.revision <= fence
            || tombstone.is_none()
            || over.map(|m| m.seq) != Some(fence)
            || over_holder.as_deref() != Some(asked.holder.as_str())
        {
            return Err(format!(
                "release by {} of {} at {fence} not backed by a tombstone over its own \
                 record: {r:?}; stored at {}: {:?}; the message it replaced: {:?}",
                asked.holder,
                asked.key,
                r.revision,
                self.sim.at(r.revision).map(|m| (m.kind, &m.key)),
                over.map(|m| (m.seq, m.kind, over_holder.clone())),
            ));
        }
        Ok(())
    }
}

/// The key of a stream subject `$KV.leases.<key>` (`<key>.read` for a read
/// confirmation), or `None` for any other subject.
pub(super) fn kv_key(subject: &str) -> Option<&str> {
    let rest = subject
        .strip_prefix("$KV.")?
        .strip_prefix(crate::subjects::BUCKET)?;
    // One stream (`$KV.leases.<key>`) or a shard's (`$KV.leases_<i>.<key>`).
    match rest.strip_prefix('.') {
        Some(key) => Some(key),
        None => {
            let (shard, key) = rest.strip_prefix('_')?.split_once('.')?;
            shard.bytes().all(|b| b.is_ascii_digit()).then_some(key)
        }
    }
}
