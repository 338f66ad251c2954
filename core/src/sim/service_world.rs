//! The service world: the [`Service`] machine end to end against the simulated
//! stream, over a network whose answers come late, out of order, or never, for the
//! core's tests (`tests/service.rs`) and the fuzzer (`service_inputs`). Requests
//! (good and bad, to good and bad reply subjects), `$SRV` verbs, forged change
//! events, the stream's replicas going up and down (the confirm switch), timers and
//! a stop arrive in any order. After every step the world checks:
//!
//! 1. a reply goes only to a reply subject the reply rule lets through, and only to
//!    a request (or verb) that asked; no request is answered twice;
//! 2. a grant is backed by the stream: the record at its revision is the caller's
//!    and the key's, and a new tenure's fence is above every earlier one;
//! 3. a renew's success names the caller and a revision the stream holds for it;
//! 4. a release's success names the caller, and its revision is a tombstone of the
//!    key above the fence asked, stored over the caller's own record at that
//!    fence; and no tombstone ever lands in the stream (answered or not, late or
//!    not) over a record whose holder did not ask to release it at that revision:
//!    a release never removes another holder's lease;
//! 5. a call that was answered (gave up: timed out, `unavailable`, cut off, or
//!    replied at all) sends no write after its answer. Every stream write the
//!    service hands out (a single, each message of a batch, a read confirmation)
//!    must belong to a call still waiting for its reply: a record of holder `h` on
//!    key `k` to an acquire or renew of `h` on `k`, a tombstone of `k` expecting
//!    revision `r` to a release of `k` at `r`, a confirmation of `k` to any call on
//!    `k`. Replies are read before the writes of the same input, so a write sent
//!    alongside its call's answer breaks the rule too. What this allows, and only
//!    this: a write already handed out before its call gave up may still land
//!    later (NATS cannot unsend it; the world delivers it when it likes). A write
//!    still queued in the coalescer, or one a failed batch would send again alone,
//!    must never go out once its call is answered;
//! 6. once stopped, every request let through was answered, and the service is
//!    done within [`Shutdown::bound`] of the stop (virtual time) and a bounded
//!    number of steps;
//! 7. a request the network lost is cancelled ([`ServiceEvent::Cancel`]) by its
//!    timeout: the machine's deadlines are the only timers a request has, so a send
//!    it forgot would be held for ever. (A cancelled request still in flight may
//!    yet be answered: the outcome must be ignored.)
//! 8. a stop's flush is asked only once every reply sent was handed to the
//!    client, or given up ([`ServiceEvent::CancelReply`]) no sooner than
//!    [`HANDOFF_BOUND`] after it was sent and never once taken (the world's client
//!    takes replies when it carries out a stop's waits, and when a test settles).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{MsgKind, SimJetStream};
use crate::io::HANDOFF_BOUND;
use crate::io::{EffectId, NatsRequest, RequestOutcome, Transmit};
use crate::reply_scope::ReplyScope;
use crate::service::shutdown::Shutdown;
use crate::service::startup::stream_config_for;
use crate::service::{Received, ReplyId, Service, ServiceConfig, ServiceEvent, SubscriptionKind};
use crate::subjects::{HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_KV_OPERATION, STREAM};
use crate::wire::{Endpoint, Response};

const HOLDERS: [&str; 3] = ["h0", "h1", "h2"];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];

/// One request in flight on the simulated network.
#[derive(Debug)]
struct InFlight {
    id: EffectId,
    transmit: Transmit,
    /// When its own timeout has passed.
    due: Instant,
}

/// What the world knows of a request it sent, for its checks.
#[derive(Debug, Clone)]
struct Asked {
    endpoint: Option<Endpoint>,
    holder: String,
    key: String,
    /// The fence a renew or release named.
    revision: Option<u64>,
    /// Answered, or never let through (nothing may be sent for it).
    answered: bool,
}

impl Asked {
    /// Whether its call may still send: let through, asked of `endpoint`, not
    /// answered yet.
    fn waits(&self, endpoint: Endpoint) -> bool {
        !self.answered && self.endpoint == Some(endpoint)
    }
}

/// The world. See the [module docs](self).
#[derive(Debug)]
pub struct ServiceWorld {
    /// The machine under test.
    pub service: Service,
    sim: SimJetStream,
    t0: Instant,
    now_ms: u64,
    replicas: usize,
    created: u64,
    /// The `first_seq` the stream was made anew with, if it was.
    first_seq: Option<u64>,
    network: Vec<InFlight>,
    /// Requests the network lost, by when the service must have cancelled them.
    lost: BTreeMap<EffectId, Instant>,
    /// Every request the service cancelled.
    pub cancelled: BTreeSet<EffectId>,
    /// Replies sent and not yet handed to the client, by when each was sent.
    handing: BTreeMap<ReplyId, Instant>,
    asked: BTreeMap<String, Asked>,
    next_request: u64,
    /// The highest fence granted per key.
    fences: BTreeMap<String, u64>,
    /// Replies by endpoint kind, for the tests' counts.
    pub replies: Vec<(String, Response)>,
    /// The `renew_many` requests let through: their reply subject and how many items.
    many: BTreeMap<String, usize>,
    /// The bodies of the replies to `renew_many` requests, by reply subject.
    pub many_replies: Vec<(String, Vec<u8>)>,
    /// Every event the service reported, in order.
    pub events: Vec<ServiceEvent>,
    /// When the stop came, in virtual ms.
    stopped_at: Option<u64>,
    /// When the stop ended, in virtual ms.
    done_at: Option<u64>,
    subscribed: BTreeSet<String>,
    steps_since_stop: usize,
    /// How much of the stream's log the tombstone check has read.
    log_checked: usize,
}

/// The most steps a stopped world may take to be done: every reply out, then the
/// two flushes and their timers.
pub const STOP_STEPS: usize = 64;

impl ServiceWorld {
    /// A world serving on a stream of `replicas`, with the service `config` (its
    /// version and payload bound are the simulated server's).
    pub fn new(mut config: ServiceConfig, replicas: usize) -> Self {
        config.server_version = "2.14.0".to_string();
        config.max_payload = 1 << 20;
        let t0 = Instant::now();
        let sim = SimJetStream::new().with_atomic(true);
        let service = Service::new(config, sim.wall(), t0);
        let mut world = Self {
            service,
            sim,
            t0,
            now_ms: 0,
            replicas,
            created: 1,
            first_seq: None,
            network: Vec::new(),
            lost: BTreeMap::new(),
            cancelled: BTreeSet::new(),
            handing: BTreeMap::new(),
            asked: BTreeMap::new(),
            next_request: 0,
            fences: BTreeMap::new(),
            replies: Vec::new(),
            many: BTreeMap::new(),
            many_replies: Vec::new(),
            events: Vec::new(),
            stopped_at: None,
            done_at: None,
            subscribed: BTreeSet::new(),
            steps_since_stop: 0,
            log_checked: 0,
        };
        world.drain().expect("a new service breaks no rule");
        world
    }

    pub fn now(&self) -> Instant {
        self.t0 + Duration::from_millis(self.now_ms)
    }

    /// The subjects the service subscribed to.
    pub fn subscribed(&self) -> &BTreeSet<String> {
        &self.subscribed
    }

    /// Sends `request` straight to the simulated server, as another process would
    /// (one killed before its purges left a tombstone).
    pub fn write_directly(&mut self, request: &NatsRequest) -> RequestOutcome {
        self.sim.handle(request)
    }

    /// The requests in flight on the network, in order: subject and body.
    pub fn in_flight_bodies(&self) -> Vec<(String, String)> {
        self.network
            .iter()
            .map(|f| {
                let r = &f.transmit.request;
                (
                    r.subject.clone(),
                    String::from_utf8_lossy(&r.payload).into_owned(),
                )
            })
            .collect()
    }

    /// The subjects of the requests in flight on the network, in order.
    pub fn in_flight(&self) -> Vec<String> {
        self.network
            .iter()
            .map(|f| f.transmit.request.subject.clone())
            .collect()
    }

    /// The replies sent so far to `reply`'s request.
    pub fn reply_to(&self, reply: &str) -> Option<&Response> {
        self.replies
            .iter()
            .find(|(to, _)| to == reply)
            .map(|(_, r)| r)
    }

    /// Whether `reply`'s request was answered (a `$SRV` verb's too).
    pub fn answered(&self, reply: &str) -> bool {
        self.asked.get(reply).is_some_and(|a| a.answered)
    }

    /// Does what a stop asked so far (the intake closes, the flushes end).
    pub fn obey_stop(&mut self) -> Result<(), String> {
        self.obey();
        self.drain()
    }

    /// Drains the service's outputs, checking the replies, and hands the replies
    /// to the client.
    pub fn settle(&mut self) -> Result<(), String> {
        self.drain()?;
        self.hand_off();
        self.drain()
    }

    /// Sends the replies the service sent so far: each is handed to the client.
    pub fn hand_off(&mut self) {
        while let Some((id, _)) = self.handing.pop_first() {
            self.service.handle_reply_sent(self.now(), id);
        }
    }

    /// Replies sent and not yet handed to the client.
    pub fn replies_handing(&self) -> usize {
        self.handing.len()
    }

    /// Sets the stream's replicas (the next stream info reports them).
    pub fn set_replicas(&mut self, replicas: usize) {
        self.replicas = replicas.max(1);
    }

    /// Makes the stream anew as the restore procedure does, its `first_seq` above
    /// every sequence used (the next stream info reports another created time).
    pub fn replace_stream(&mut self) {
        self.created += 1;
        self.first_seq = Some(self.sim.last_seq() + 1);
    }

    /// Makes the stream anew from sequence 1, empty: its fences start again.
    pub fn rewind_stream(&mut self) {
        self.created += 1;
        self.first_seq = None;
        self.sim = SimJetStream::new().with_atomic(true);
    }

    /// Drains the service's outputs and checks each reply, what the stream
    /// stored since, then each write: the replies first, so that a write handed
    /// out with its call's answer counts as sent after it.
    fn drain(&mut self) -> Result<(), String> {
        if self.done_at.is_none()
            && self.service.stop_phase() == Some(crate::service::shutdown::StopPhase::Done)
        {
            self.done_at = Some(self.now_ms);
        }
        self.drain_events()?;
        self.check_tombstones()?;
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
                ServiceEvent::Subscribe { subject, kind, .. }
                    if *kind != SubscriptionKind::Changes
                        && !self.subscribed.insert(subject.clone()) =>
                {
                    return Err(format!("subscribed twice to {subject}"));
                }
                ServiceEvent::Reply { id, to, body } => {
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
    pub fn in_flight_ids(&self) -> Vec<EffectId> {
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
                let record = self
                    .sim
                    .at(r.lease.revision)
                    .and_then(super::SimMsg::record);
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
                let record = self.sim.at(l.revision).and_then(super::SimMsg::record);
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
        let over_holder = over.and_then(super::SimMsg::record).map(|r| r.holder);
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

    /// Sends a request to `endpoint` with `body`, its reply to a fresh inbox
    /// (`good_reply`) or to a subject the rule refuses; returns the reply subject.
    pub fn request(
        &mut self,
        endpoint: Endpoint,
        body: serde_json::Value,
        good_reply: bool,
    ) -> String {
        self.next_request += 1;
        let reply = if good_reply {
            format!("_INBOX.w.{}", self.next_request)
        } else {
            format!("$KV.leases.k{}", self.next_request % 3)
        };
        let holder = body["holder"].as_str().unwrap_or_default().to_string();
        let key = body["key"].as_str().unwrap_or_default().to_string();
        self.asked.insert(
            reply.clone(),
            Asked {
                endpoint: Some(endpoint),
                holder,
                key,
                revision: body["revision"].as_u64(),
                answered: !good_reply,
            },
        );
        let message = Received {
            subject: endpoint.subject(),
            reply: Some(reply.clone()),
            headers: Vec::new(),
            payload: body.to_string().into_bytes(),
            header_error: None,
        };
        self.service
            .handle_request(self.now(), self.sim.wall(), message);
        reply
    }

    /// Sends a `renew_many` request with `body`, as [`ServiceWorld::request`] does;
    /// each item is asked as a renew of its own (`<reply>#<i>`), so that its writes
    /// are checked as a renew's, and answered by the request's one reply.
    pub fn request_many(&mut self, body: serde_json::Value, good_reply: bool) -> String {
        self.next_request += 1;
        let reply = if good_reply {
            format!("_INBOX.many.{}", self.next_request)
        } else {
            format!("$KV.leases.k{}", self.next_request % 3)
        };
        let items = body["leases"].as_array().cloned().unwrap_or_default();
        for (i, item) in items.iter().enumerate() {
            self.asked.insert(
                format!("{reply}#{i}"),
                Asked {
                    endpoint: Some(Endpoint::Renew),
                    holder: item["holder"].as_str().unwrap_or_default().to_string(),
                    key: item["key"].as_str().unwrap_or_default().to_string(),
                    revision: item["revision"].as_u64(),
                    answered: !good_reply,
                },
            );
        }
        self.asked.insert(
            reply.clone(),
            Asked {
                endpoint: None,
                holder: String::new(),
                key: String::new(),
                revision: None,
                answered: !good_reply,
            },
        );
        if good_reply {
            self.many.insert(reply.clone(), items.len());
        }
        let message = Received {
            subject: crate::wire::renew_many_subject(),
            reply: Some(reply.clone()),
            headers: Vec::new(),
            payload: body.to_string().into_bytes(),
            header_error: None,
        };
        self.service
            .handle_request(self.now(), self.sim.wall(), message);
        reply
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
                let record = self.sim.at(l.revision).and_then(super::SimMsg::record);
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

    /// Answers the request in flight at `index` (mod their count).
    pub fn deliver(&mut self, index: usize) {
        if self.network.is_empty() {
            return;
        }
        let InFlight { id, transmit, .. } = self.network.remove(index % self.network.len());
        for m in &transmit.publish {
            self.sim.handle_publish(m);
        }
        let subject = transmit.request.subject.as_str();
        let outcome = if ["INFO", "CREATE", "UPDATE"]
            .iter()
            .any(|verb| subject == format!("$JS.API.STREAM.{verb}.{STREAM}"))
        {
            let mut info = json!({
                "config": stream_config_for(self.replicas, true),
                "state": {"last_seq": self.sim.last_seq()},
                "created": format!("2026-01-01T00:00:{:02}Z", self.created % 60),
            });
            info["config"]["republish"] =
                crate::service::startup::republish_for(crate::tenant::Tenancy::Single);
            if let Some(first) = self.first_seq {
                info["config"]["first_seq"] = json!(first);
            }
            RequestOutcome::reply(info.to_string())
        } else if subject.starts_with("$JS.API.STREAM.INFO.") {
            // Startup's other-layout question: no stream but the world's exists.
            crate::sim::api_error(404, crate::js::ERR_STREAM_NOT_FOUND, "stream not found")
        } else if transmit
            .request
            .subject
            .starts_with("$JS.API.STREAM.PURGE.")
        {
            RequestOutcome::reply(json!({"success": true, "purged": 1}).to_string())
        } else {
            self.sim.handle(&transmit.request)
        };
        self.service.handle_outcome(self.now(), id, outcome);
    }

    /// Loses the request in flight at `index`: no answer ever comes.
    pub fn lose(&mut self, index: usize) {
        if !self.network.is_empty() {
            let lost = self.network.remove(index % self.network.len());
            if !self.cancelled.contains(&lost.id) {
                self.lost.insert(lost.id, lost.due);
            }
        }
    }

    /// Moves the clocks on by `ms` and fires the service's timer if due, draining
    /// and checking its outputs after each firing (a write handed out at one
    /// timer is sent before a call gives up at the next).
    pub fn advance(&mut self, ms: u64) -> Result<(), String> {
        let until = self.now() + Duration::from_millis(ms);
        // The timer fires on time: at each deadline on the way.
        for _ in 0..1000 {
            let Some(at) = self.service.poll_timeout().filter(|at| *at <= until) else {
                break;
            };
            self.fire_timer_at(at);
            self.drain()?;
        }
        let left = until.saturating_duration_since(self.now()).as_millis() as u64;
        self.now_ms += left;
        self.sim.advance(left);
        Ok(())
    }

    fn fire_timer_at(&mut self, at: Instant) {
        let ms = at.saturating_duration_since(self.now()).as_millis() as u64;
        self.now_ms += ms;
        self.sim.advance(ms);
        self.service.handle_timeout(at.max(self.now()));
        if self.done_at.is_none()
            && self.service.stop_phase() == Some(crate::service::shutdown::StopPhase::Done)
        {
            self.done_at = Some(self.now_ms);
        }
    }

    /// Moves the clocks to the service's timer and fires it.
    pub fn fire_timer(&mut self) {
        if let Some(at) = self.service.poll_timeout() {
            self.fire_timer_at(at);
        }
    }

    /// Stops the service.
    pub fn stop(&mut self) {
        if self.stopped_at.is_none() {
            self.stopped_at = Some(self.now_ms);
        }
        self.service.handle_stop(self.now());
    }

    /// Does what the service asked of the adapter for a stop (the intake closes,
    /// the flushes end).
    fn obey(&mut self) {
        loop {
            self.hand_off();
            // A failed drain: the next one reports it.
            if self.drain().is_err()
                || !self
                    .events
                    .iter()
                    .any(|e| matches!(e, ServiceEvent::Unsubscribe | ServiceEvent::Flush { .. }))
            {
                return;
            }
            self.obey_once();
            if self.drain().is_err() {
                return;
            }
        }
    }

    fn obey_once(&mut self) {
        let asked: Vec<ServiceEvent> = self
            .events
            .iter()
            .filter(|e| matches!(e, ServiceEvent::Unsubscribe | ServiceEvent::Flush { .. }))
            .cloned()
            .collect();
        self.events
            .retain(|e| !matches!(e, ServiceEvent::Unsubscribe | ServiceEvent::Flush { .. }));
        for event in asked {
            match event {
                ServiceEvent::Unsubscribe => self.service.handle_intake_closed(self.now()),
                ServiceEvent::Flush { phase } => self.service.handle_flushed(self.now(), phase),
                _ => {}
            }
        }
    }

    /// Applies one step read from `byte` and `arg`, then checks the rules.
    pub fn step(&mut self, byte: u8, arg: u8) -> Result<(), String> {
        let holder = HOLDERS[usize::from(arg) % HOLDERS.len()];
        let key = KEYS[usize::from(arg / 3) % KEYS.len()];
        let good = !arg.is_multiple_of(7);
        match byte % 16 {
            0 | 1 => {
                self.request(
                    Endpoint::Acquire,
                    json!({"key": key, "holder": holder, "ttl_ms": 2000}),
                    good,
                );
            }
            2 | 3 => {
                // Mostly the key's holder at its fence (a renewal or release that
                // may succeed), else any holder: another's lease, a stale fence.
                let current = self.sim.current(key);
                let revision = current.map_or(u64::from(arg), |m| m.seq);
                let holder = match current.and_then(super::SimMsg::record) {
                    Some(record) if !arg.is_multiple_of(4) => record.holder,
                    _ => holder.to_string(),
                };
                if byte % 16 == 2 && arg.is_multiple_of(5) {
                    // The key's renewal beside another key's, in one request.
                    let other = KEYS[(usize::from(arg / 3) + 1) % KEYS.len()];
                    let other_rev = self.sim.current(other).map_or(1, |m| m.seq);
                    let other_holder = self
                        .sim
                        .current(other)
                        .and_then(super::SimMsg::record)
                        .map_or(holder.clone(), |r| r.holder);
                    self.request_many(
                        json!({"leases": [
                            {"key": key, "holder": holder, "revision": revision},
                            {"key": other, "holder": other_holder, "revision": other_rev},
                        ]}),
                        good,
                    );
                    return self.after_step();
                }
                let endpoint = if byte % 16 == 2 {
                    Endpoint::Renew
                } else {
                    Endpoint::Release
                };
                self.request(
                    endpoint,
                    json!({"key": key, "holder": holder, "revision": revision}),
                    good,
                );
            }
            4 => {
                self.request(Endpoint::Owner, json!({"key": key}), good);
            }
            5 => {
                self.request(
                    Endpoint::Acquire,
                    json!({"key": "bad key!", "holder": holder}),
                    good,
                );
            }
            6..=8 => self.deliver(usize::from(arg)),
            9 => self.lose(usize::from(arg)),
            10 => self.advance(u64::from(arg) * 20)?,
            11 => self.fire_timer(),
            12 => self.set_replicas(usize::from(arg % 3) + 1),
            13 => {
                let reply = format!("_INBOX.srv.{arg}");
                self.asked.entry(reply.clone()).or_insert(Asked {
                    endpoint: None,
                    holder: String::new(),
                    key: String::new(),
                    revision: None,
                    answered: false,
                });
                // A verb asked twice on one inbox is answered twice: a fresh inbox each time.
                if self.asked[&reply].answered {
                    return self.drain();
                }
                self.service.handle_request(
                    self.now(),
                    self.sim.wall(),
                    Received {
                        subject: "$SRV.PING".to_string(),
                        reply: Some(reply),
                        ..Received::default()
                    },
                );
            }
            14 => self.stop(),
            _ => self.replace_stream(),
        }
        self.after_step()
    }

    /// What every step ends with: the outputs drained and checked, a stop obeyed.
    fn after_step(&mut self) -> Result<(), String> {
        self.drain()?;
        if self.stopped_at.is_some() {
            self.obey();
            self.drain()?;
        }
        Ok(())
    }

    /// Runs `script` (pairs of bytes), then stops and finishes the stop, checking
    /// the rules throughout and that the stop ends within its bounds.
    pub fn run(&mut self, script: &[u8]) -> Result<(), String> {
        for pair in script.chunks(2) {
            self.step(pair[0], pair.get(1).copied().unwrap_or(0))?;
            if self.service.is_done() {
                break;
            }
        }
        self.finish()
    }

    /// Stops (if not yet), lets every request in flight be answered or time out,
    /// and checks the stop's bounds and that every request let through was answered.
    pub fn finish(&mut self) -> Result<(), String> {
        self.stop();
        self.drain()?;
        self.steps_since_stop = 0;
        while !self.service.is_done() {
            self.steps_since_stop += 1;
            if self.steps_since_stop > STOP_STEPS {
                return Err(format!(
                    "not done {STOP_STEPS} steps after the stop (phase {:?})",
                    self.service.stop_phase()
                ));
            }
            self.obey();
            self.drain()?;
            if self.service.is_done() {
                break;
            }
            // The network keeps answering what it still holds; the timer does the rest.
            while !self.network.is_empty() {
                self.deliver(0);
                self.drain()?;
                self.obey();
                self.drain()?;
            }
            if !self.service.is_done() {
                self.fire_timer();
                self.drain()?;
            }
        }
        let stopped_at = self.stopped_at.unwrap_or(0);
        let took = Duration::from_millis(self.done_at.unwrap_or(self.now_ms) - stopped_at);
        let bound = Shutdown::bound(self.service_shutdown_timeout());
        if took > bound {
            return Err(format!("the stop took {took:?}, past its bound {bound:?}"));
        }
        if let Some((to, _)) = self.asked.iter().find(|(_, a)| !a.answered) {
            return Err(format!("{to} was let through but never answered"));
        }
        Ok(())
    }

    fn service_shutdown_timeout(&self) -> Duration {
        self.service.shutdown_timeout()
    }
}

/// The key of a stream subject `$KV.leases.<key>` (`<key>.read` for a read
/// confirmation), or `None` for any other subject.
fn kv_key(subject: &str) -> Option<&str> {
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
