//! The call world: many concurrent calls from many holders, each a request to the
//! [`Service`] as its subscription would deliver it, against one simulated stream
//! (and, during a partition, its deposed leader). The service runs as deployed
//! (admission, its calls, the write coalescer, the known map it feeds itself, the
//! replicas check, the sweep); what it sends waits in the world's network and is
//! carried out one transmit at a time, in the order the steps choose, its outcome
//! fed back; its replies are read from its events; the stream's change events
//! reach it one step late. Which call a transmit belongs to the service tells
//! ([`Service::callers_of`]), so every write and reply is judged against the call
//! that made it (`judge`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use super::server::{StreamAdmin, republished, started};
use super::{Op, OwnerBehaviour, SimJetStream};
use crate::io::{NatsRequest, RequestOutcome, Transmit, TransmitKind};
use crate::js::{self, KeyState};
use crate::record::LeaseEvent;
use crate::service::peers::ChangesSetting;
use crate::service::{Received, Service, ServiceConfig, ServiceEvent, SubscriptionKind};
use crate::subjects::{
    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_FENCE, HDR_LEASE_EVENT, HDR_REJECT, INBOX_PREFIX,
    REJECT_STALE, kv_subject,
};
use crate::test_support::invalid_bodies;
use crate::wire::{Endpoint, ErrorKind, Response};

/// What a call in flight is, for checking its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallKind {
    /// acquire
    Acquire {
        /// caller
        holder: String,
        /// key
        key: String,
    },
    /// renew
    Renew {
        /// caller
        holder: String,
        /// key
        key: String,
        /// fence sent
        revision: u64,
    },
    /// release
    Release {
        /// caller
        holder: String,
        /// key
        key: String,
        /// fence sent
        revision: u64,
    },
    /// owner
    Owner {
        /// key
        key: String,
    },
    /// forward
    Forward {
        /// key
        key: String,
    },
    /// a request that must be rejected
    Invalid {
        /// Whether the body is known to be invalid (raw bytes might not be).
        known: bool,
    },
}

/// A broken service, for the tests that show the judge catches one: each reply
/// of the service goes to its caller changed by this.
pub type Mutant = fn(Endpoint, Response) -> Response;

/// How the fenced calls reached the stream, for the tests' counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reads {
    /// Renewals and releases that succeeded.
    pub fenced: u64,
    /// Of those, the ones that read nothing first: the service knew the revision.
    pub unread: u64,
}

/// A stream write as the judge reads it off the wire.
#[derive(Debug)]
pub(super) struct SeenWrite {
    pub(super) key: String,
    pub(super) event: Option<LeaseEvent>,
    pub(super) expected_revision: u64,
}

/// What one message of a transmit is, read off the wire.
enum Message {
    Read,
    Write(SeenWrite),
    Confirm,
    Other,
}

impl Message {
    fn of(m: &NatsRequest) -> Self {
        let header = |name: &str| {
            m.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        if m.subject.starts_with("$JS.API.STREAM.MSG.GET.") && !m.payload.is_empty() {
            let body: serde_json::Value = serde_json::from_slice(&m.payload).unwrap_or_default();
            if body["last_by_subj"].is_string() {
                return Self::Read;
            }
        }
        let Some(key) = m.subject.strip_prefix(kv_subject("").as_str()) else {
            return Self::Other;
        };
        if key.contains('.') {
            return Self::Confirm;
        }
        Self::Write(SeenWrite {
            key: key.to_string(),
            event: header(HDR_LEASE_EVENT).and_then(LeaseEvent::parse),
            expected_revision: header(HDR_EXPECTED_LAST_SUBJECT_SEQUENCE)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        })
    }
}

/// An owner's inbox request read off the wire: the owner tried and its fence.
fn inbox_of(m: &NatsRequest) -> Option<(String, String, u64)> {
    let rest = m.subject.strip_prefix(INBOX_PREFIX)?.strip_prefix('.')?;
    let (holder, key) = rest.split_once('.')?;
    let fence = m
        .headers
        .iter()
        .find(|(n, _)| *n == HDR_FENCE)
        .and_then(|(_, v)| v.parse().ok())?;
    Some((holder.to_string(), key.to_string(), fence))
}

/// One call: a request sent to the service, until it is answered.
#[derive(Debug)]
pub(super) struct Active {
    pub(super) kind: CallKind,
    endpoint: Endpoint,
    /// Its reply subject: the service's name for it.
    to: String,
    pub(super) last_read: Option<KeyState>,
    pub(super) written: Vec<u64>,
    pub(super) inbox_attempts: u32,
    pub(super) kv_effects: u32,
    /// Leader reads the call issued.
    reads: u32,
    /// KV writes and read confirmations the call issued.
    pub(super) writes: u32,
    pub(super) confirms: u32,
    /// Whether JetStream failed one of its effects (a lost reply, a deposed
    /// leader that cannot commit, time run past its deadline): what
    /// `unavailable` needs.
    pub(super) js_failed: bool,
    /// A forward's deadline.
    pub(super) deadline: Option<Instant>,
    /// The owner a forward last tried and how it answered (`None` while the
    /// request is in flight).
    pub(super) last_inbox: Option<(String, u64, Option<OwnerBehaviour>)>,
    reply: Option<Response>,
}

/// A transmit of the service on the network, with the calls its messages are for.
#[derive(Debug)]
struct InFlight {
    transmit: Transmit,
    owners: Vec<Option<String>>,
}

/// Many concurrent calls from many holders through one [`Service`] against one
/// simulated stream, with the lease invariants checked after every step.
#[derive(Debug)]
pub struct World {
    /// The stream.
    pub sim: SimJetStream,
    /// While partitioned: the deposed leader some requests still reach.
    cut_leader: Option<SimJetStream>,
    /// Whether the bucket has replicas, so a partition can depose its leader.
    replicated: bool,
    base: Instant,
    config: ServiceConfig,
    admin: StreamAdmin,
    /// The machine under test.
    service: Service,
    mutant: Option<Mutant>,
    holders: usize,
    keys: usize,
    pub(super) calls: Vec<Active>,
    /// The service's transmits not yet carried out, in the order sent.
    network: Vec<InFlight>,
    pub(super) fences: BTreeMap<(String, String), Vec<u64>>,
    pub(super) max_granted: BTreeMap<String, u64>,
    /// Replies seen, by kind of call, for reporting coverage.
    pub replies: Vec<(CallKind, Response)>,
    /// How the renewals and releases that succeeded reached the stream.
    pub reads: Reads,
    /// Whether the service subscribed to change events; those the stream
    /// republished in the last step (delivered at the end of the next), and how
    /// far into its log they were taken.
    hears_changes: bool,
    changes: Vec<Received>,
    changes_read: usize,
    next_request: u64,
    /// Set while the service's timer fires: a call that answers or sends then,
    /// or whose request it gives up, waited on JetStream past a deadline.
    timing_out: bool,
}

/// A broken invariant.
pub type Violation = String;

/// The service of a call world: the simulated server's version, `max_payload`,
/// the change events taken from the start.
fn service_config(max_payload: usize) -> ServiceConfig {
    let mut config = ServiceConfig::new("2.14.0", max_payload);
    config.known_capacity = 0;
    config.changes = ChangesSetting::Always;
    config
}

impl World {
    /// A world with `holders` holders and `keys` keys, its service serving a
    /// one-replica bucket without a known map.
    pub fn new(holders: usize, keys: usize, max_payload: usize) -> Self {
        let mut sim = SimJetStream::new();
        let base = Instant::now();
        let config = service_config(max_payload);
        let admin = StreamAdmin::new(1);
        let (service, events) = started(config.clone(), &mut sim, &admin, base);
        let mut world = Self {
            sim,
            cut_leader: None,
            replicated: false,
            base,
            config,
            admin,
            service,
            mutant: None,
            holders: holders.max(1),
            keys: keys.max(1),
            calls: Vec::new(),
            network: Vec::new(),
            fences: BTreeMap::new(),
            max_granted: BTreeMap::new(),
            replies: Vec::new(),
            reads: Reads::default(),
            hears_changes: false,
            changes: Vec::new(),
            changes_read: 0,
            next_request: 0,
            timing_out: false,
        };
        for event in events {
            world.note(&event);
        }
        world
    }

    /// Starts the service afresh with the world's config, before any step.
    fn restart(&mut self) {
        let now = self.now();
        let (service, events) = started(self.config.clone(), &mut self.sim, &self.admin, now);
        self.service = service;
        self.hears_changes = false;
        for event in events {
            self.note(&event);
        }
    }

    /// The same world with the service's [`KnownLeases`](crate::known::KnownLeases)
    /// map on: renew and release go straight to their conditional write, owner on
    /// a replicated bucket straight to its confirmation, for what the service
    /// knows. The service feeds the map itself, from its calls and from the
    /// stream's change events, which reach it one step after they were stored (so
    /// what it knows is sometimes out of date).
    pub fn with_known(mut self) -> Self {
        self.config.known_capacity = 64;
        self.restart();
        self
    }

    /// The same world on a replicated bucket, where partitions depose the leader,
    /// with the service confirming its reads as it does there (`confirm_reads`),
    /// or, to show the checks catch stale reads, not.
    pub fn replicated(mut self, confirm_reads: bool) -> Self {
        self.replicated = true;
        self.admin.replicas = 3;
        self.config.unconfirmed_reads_for_tests = !confirm_reads;
        self.restart();
        self
    }

    /// The same world with the stream's late expiries drawn from `seed`.
    pub fn with_expiry_seed(mut self, seed: u64) -> Self {
        self.sim = self.sim.with_seed(seed);
        self
    }

    /// The same world with every reply of the service changed by `mutant`.
    pub fn with_mutant(mut self, mutant: Mutant) -> Self {
        self.mutant = Some(mutant);
        self
    }

    pub(super) fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.sim.now_ms)
    }

    fn holder(&self, i: u8) -> String {
        format!("h{}", i as usize % self.holders)
    }

    fn key(&self, i: u8) -> String {
        format!("k{}", i as usize % self.keys)
    }

    fn fence(&self, holder: &str, key: &str, stale: bool) -> u64 {
        let known = self.fences.get(&(holder.to_string(), key.to_string()));
        match known {
            None => 1,
            Some(v) if stale => v.iter().rev().nth(1).copied().unwrap_or(1),
            Some(v) => *v.last().expect("non-empty"),
        }
    }

    /// Calls still waiting for their reply.
    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Applies one step and checks every invariant; then the change events of
    /// the last step reach the service.
    pub fn apply(&mut self, op: Op) -> Result<(), Violation> {
        self.apply_op(op)?;
        self.deliver_changes()
    }

    /// Delivers the last step's change events and takes this step's.
    fn deliver_changes(&mut self) -> Result<(), Violation> {
        let (now, wall) = (self.now(), self.sim.wall());
        for message in std::mem::take(&mut self.changes) {
            self.service.handle_request(now, wall, message);
        }
        self.drain()?;
        self.reap();
        if self.hears_changes {
            let epoch = self.sim.epoch;
            // The republish takes the keys' subjects only, not confirmations'.
            let new = self.sim.log[self.changes_read..]
                .iter()
                .filter(|m| !m.key.contains('.'))
                .map(|m| republished(epoch, m));
            self.changes.extend(new);
        }
        self.changes_read = self.sim.log.len();
        Ok(())
    }

    fn apply_op(&mut self, op: Op) -> Result<(), Violation> {
        match op {
            Op::Acquire { holder, key, ttl_s } => {
                let (holder, key) = (self.holder(holder), self.key(key));
                let ttl_ms = (u64::from(ttl_s) % 3 + 1) * 1000;
                let body = json!({"key": key, "holder": holder, "ttl_ms": ttl_ms});
                self.start(
                    CallKind::Acquire { holder, key },
                    Endpoint::Acquire,
                    body.to_string(),
                )
            }
            Op::Renew {
                holder,
                key,
                stale,
                ttl_s,
            } => {
                let (holder, key) = (self.holder(holder), self.key(key));
                let revision = self.fence(&holder, &key, stale);
                let mut body = json!({"key": key, "holder": holder, "revision": revision});
                if let Some(t) = ttl_s {
                    body["ttl_ms"] = json!((u64::from(t) % 3 + 1) * 1000);
                }
                let kind = CallKind::Renew {
                    holder,
                    key,
                    revision,
                };
                self.start(kind, Endpoint::Renew, body.to_string())
            }
            Op::Release { holder, key, stale } => {
                let (holder, key) = (self.holder(holder), self.key(key));
                let revision = self.fence(&holder, &key, stale);
                let body = json!({"key": key, "holder": holder, "revision": revision});
                let kind = CallKind::Release {
                    holder,
                    key,
                    revision,
                };
                self.start(kind, Endpoint::Release, body.to_string())
            }
            Op::Owner { key } => {
                let key = self.key(key);
                let body = json!({"key": key});
                self.start(CallKind::Owner { key }, Endpoint::Owner, body.to_string())
            }
            Op::Forward { key, timeout_ms } => {
                let key = self.key(key);
                let timeout_ms = 100 + u64::from(timeout_ms) % 29_900;
                let body = json!({"key": key, "payload": "cGluZw==", "timeout_ms": timeout_ms});
                self.start(
                    CallKind::Forward { key },
                    Endpoint::Forward,
                    body.to_string(),
                )
            }
            Op::Invalid {
                endpoint,
                which,
                raw,
            } => {
                let endpoint = Endpoint::ALL[endpoint as usize % Endpoint::ALL.len()];
                let bodies = invalid_bodies(endpoint);
                let body = bodies[which as usize % bodies.len()].clone();
                self.start(CallKind::Invalid { known: true }, endpoint, body)?;
                let raw = String::from_utf8_lossy(&raw).into_owned();
                self.start(CallKind::Invalid { known: false }, endpoint, raw)
            }
            Op::Step {
                call,
                lose_reply,
                owner,
                via_cut,
            } => {
                if self.network.is_empty() {
                    return Ok(());
                }
                let i = call as usize % self.network.len();
                self.step(i, lose_reply % 8 == 0, owner, via_cut)
            }
            Op::Partition { cut } => {
                if !cut {
                    self.cut_leader = None;
                } else if self.replicated && self.cut_leader.is_none() {
                    self.cut_leader = Some(self.sim.deposed());
                }
                Ok(())
            }
            Op::Advance { ms } => {
                // Mostly short steps, so leases live across several calls.
                let until = self.now() + Duration::from_millis(u64::from(ms) % 1200);
                // The service's timer fires on time: at each deadline on the way.
                for _ in 0..1000 {
                    let Some(at) = self.service.poll_timeout().filter(|at| *at <= until) else {
                        break;
                    };
                    let ms = at.saturating_duration_since(self.now()).as_millis() as u64;
                    self.sim.advance(ms);
                    self.timing_out = true;
                    self.service.handle_timeout(at.max(self.now()));
                    let drained = self.drain();
                    self.timing_out = false;
                    drained?;
                }
                let left = until.saturating_duration_since(self.now()).as_millis() as u64;
                self.sim.advance(left);
                self.reap();
                self.check_no_overlap()
            }
        }
    }

    /// Carries every call to its reply (owners echo, nothing is lost), checking each.
    pub fn finish(&mut self) -> Result<(), Violation> {
        let mut guard = 0;
        while !self.calls.is_empty() {
            guard += 1;
            if guard > 10_000 {
                return Err("calls never finished".to_string());
            }
            if self.network.is_empty() {
                let kinds: Vec<&CallKind> = self.calls.iter().map(|a| &a.kind).collect();
                return Err(format!(
                    "calls {kinds:?} wait with nothing in flight: stuck"
                ));
            }
            self.step(0, false, OwnerBehaviour::Echo, false)?;
        }
        Ok(())
    }

    fn start(&mut self, kind: CallKind, endpoint: Endpoint, body: String) -> Result<(), Violation> {
        let deadline = match (
            &kind,
            crate::wire::Request::decode(endpoint, body.as_bytes()),
        ) {
            (CallKind::Forward { .. }, Ok(crate::wire::Request::Forward(f))) => {
                Some(self.now() + Duration::from_millis(f.timeout_ms))
            }
            _ => None,
        };
        self.next_request += 1;
        let to = format!("_INBOX.w.{}", self.next_request);
        self.calls.push(Active {
            kind,
            endpoint,
            to: to.clone(),
            last_read: None,
            written: Vec::new(),
            inbox_attempts: 0,
            kv_effects: 0,
            reads: 0,
            writes: 0,
            confirms: 0,
            js_failed: false,
            deadline,
            last_inbox: None,
            reply: None,
        });
        let message = Received {
            subject: endpoint.subject(),
            reply: Some(to),
            headers: Vec::new(),
            payload: body.into_bytes(),
            header_error: None,
        };
        self.service
            .handle_request(self.now(), self.sim.wall(), message);
        self.drain()?;
        self.reap();
        Ok(())
    }

    /// The waiting call a reply subject names.
    fn call(&self, to: Option<&String>) -> Option<usize> {
        let to = to?;
        self.calls.iter().position(|a| &a.to == to)
    }

    /// Carries out transmit `i` of the network: on the stream (or the deposed
    /// leader), its reply lost if asked; an inbox request as the owner answers.
    /// Its outcome goes back to the service, whose outputs are then checked.
    fn step(
        &mut self,
        i: usize,
        lose_reply: bool,
        owner: OwnerBehaviour,
        via_cut: bool,
    ) -> Result<(), Violation> {
        let InFlight { transmit, owners } = self.network.remove(i);
        let (outcome, timed_out) = if transmit.kind == TransmitKind::Inbox {
            let outcome =
                self.owner_answers(&transmit, owners.first().cloned().flatten(), owner)?;
            let timed_out = outcome == RequestOutcome::TimedOut;
            (outcome, timed_out.then(|| owners[0].clone()).flatten())
        } else {
            (
                self.carry_out(&transmit, &owners, lose_reply, via_cut)?,
                None,
            )
        };
        self.service
            .handle_outcome(self.now(), transmit.id, outcome);
        self.drain()?;
        if let Some(c) = self.call(timed_out.as_ref()) {
            match &self.calls[c].reply {
                Some(Response::Error(e)) if e.kind == ErrorKind::OwnerTimeout => {}
                other => return Err(format!("an owner timeout was followed by {other:?}")),
            }
        }
        self.reap();
        self.check_no_overlap()
    }

    /// A stream request: each write judged before it reaches the stream, the
    /// outcome read for the calls it is for.
    fn carry_out(
        &mut self,
        transmit: &Transmit,
        owners: &[Option<String>],
        lose_reply: bool,
        via_cut: bool,
    ) -> Result<RequestOutcome, Violation> {
        let messages: Vec<(Message, Option<usize>)> = transmit
            .publish
            .iter()
            .chain([&transmit.request])
            .zip(owners)
            .map(|(m, owner)| (Message::of(m), self.call(owner.as_ref())))
            .collect();
        if !(via_cut && self.cut_leader.is_some()) {
            // A deposed leader commits nothing.
            for (message, owner) in &messages {
                if let (Message::Write(w), Some(c)) = (message, owner) {
                    self.check_write(*c, w)?;
                }
            }
        }
        let logged = self.sim.log.len();
        let cut = self.cut_leader.as_mut().filter(|_| via_cut);
        let outcome = match cut {
            Some(stale) => self.admin.answer(stale, transmit),
            None => self.admin.answer(&mut self.sim, transmit),
        };
        // What it stored: each message of a batch writes a key of its own.
        for stored in &self.sim.log[logged..] {
            let owner = messages.iter().find_map(|(m, owner)| match m {
                Message::Write(w) if w.key == stored.key => *owner,
                _ => None,
            });
            if let Some(c) = owner {
                self.calls[c].written.push(stored.seq);
            }
        }
        let delivered = match lose_reply {
            true => RequestOutcome::TimedOut,
            false => outcome.clone(),
        };
        let unavailable = |f: js::JsFailure| f.kind == ErrorKind::Unavailable;
        for (message, owner) in &messages {
            let Some(a) = owner.map(|c| &mut self.calls[c]) else {
                continue;
            };
            match message {
                Message::Read => {
                    a.last_read = js::parse_read(&outcome).ok();
                    a.js_failed |= js::parse_read(&delivered).is_err_and(unavailable);
                }
                Message::Write(_) | Message::Confirm => {
                    if matches!(message, Message::Write(_)) {
                        a.writes += 1;
                    } else {
                        a.confirms += 1;
                    }
                    a.js_failed |= js::parse_pub_ack(&delivered).is_err_and(unavailable);
                }
                Message::Other => {}
            }
        }
        Ok(delivered)
    }

    /// How the owner of a forward's inbox request answers it.
    fn owner_answers(
        &mut self,
        transmit: &Transmit,
        owner: Option<String>,
        behaviour: OwnerBehaviour,
    ) -> Result<RequestOutcome, Violation> {
        let r = &transmit.request;
        let Some((holder, _, fence)) = inbox_of(r) else {
            return Err(format!("an inbox request to {} names no owner", r.subject));
        };
        if let Some(c) = self.call(owner.as_ref()) {
            let a = &mut self.calls[c];
            a.inbox_attempts += 1;
            if a.inbox_attempts > crate::call::MAX_FORWARD_ATTEMPTS {
                return Err(format!("forward made {} attempts", a.inbox_attempts));
            }
            match &a.last_read {
                Some(KeyState::Held {
                    revision, record, ..
                }) if record.holder == holder && *revision == fence => {}
                other => {
                    return Err(format!(
                        "forward to {holder}@{fence} without having just read it: {other:?}"
                    ));
                }
            }
            a.last_inbox = Some((holder, fence, Some(behaviour)));
        }
        Ok(match behaviour {
            OwnerBehaviour::Echo => RequestOutcome::reply(r.payload.clone()),
            OwnerBehaviour::Reject => RequestOutcome::Reply {
                headers: vec![(HDR_REJECT.to_string(), REJECT_STALE.to_string())],
                payload: Vec::new(),
            },
            OwnerBehaviour::NoResponders => RequestOutcome::NoResponders,
            OwnerBehaviour::Silent => RequestOutcome::TimedOut,
            OwnerBehaviour::Huge => RequestOutcome::reply(vec![7u8; self.config.max_payload]),
        })
    }

    /// Takes the service's outputs until it has none: its transmits onto the
    /// network (each checked as it is sent), its replies judged.
    fn drain(&mut self) -> Result<(), Violation> {
        loop {
            let mut moved = false;
            while let Some(transmit) = self.service.poll_transmit() {
                moved = true;
                let owners = self.service.callers_of(&transmit);
                self.sent(&transmit, &owners)?;
                self.network.push(InFlight { transmit, owners });
            }
            while let Some(event) = self.service.poll_event() {
                moved = true;
                self.event(event)?;
            }
            if !moved {
                return Ok(());
            }
        }
    }

    /// A transmit the service sent, for the calls it is for.
    fn sent(&mut self, transmit: &Transmit, owners: &[Option<String>]) -> Result<(), Violation> {
        let messages = transmit.publish.iter().chain([&transmit.request]);
        for (m, owner) in messages.zip(owners) {
            let Some(c) = self.call(owner.as_ref()) else {
                continue;
            };
            self.calls[c].js_failed |= self.timing_out;
            if transmit.kind != TransmitKind::Inbox {
                self.calls[c].kv_effects += 1;
                self.calls[c].reads += u32::from(matches!(Message::of(m), Message::Read));
                continue;
            }
            let Some((holder, key, fence)) = inbox_of(m) else {
                continue;
            };
            self.calls[c].last_inbox = Some((holder.clone(), fence, None));
            // Sent right after the read (and its confirmation) that chose this
            // owner: it must be the owner now.
            let live = self.sim.live(&key).map(|(rec, rev)| (rec.holder, rev));
            if live != Some((holder.clone(), fence)) {
                return Err(format!(
                    "forward to {holder}@{fence} while the stream holds {live:?}: a stale read"
                ));
            }
        }
        Ok(())
    }

    /// An event of the service: a reply judged, a send given up, a subscription.
    fn event(&mut self, event: ServiceEvent) -> Result<(), Violation> {
        match event {
            ServiceEvent::Reply { id, to, body, .. } => {
                self.service.handle_reply_sent(self.now(), id);
                let Some(c) = self.call(Some(&to)) else {
                    return Err(format!("a reply to {to}, which no call waits for"));
                };
                if let Some(earlier) = &self.calls[c].reply {
                    return Err(format!("{to} answered twice: {earlier:?}, then {body:?}"));
                }
                let endpoint = self.calls[c].endpoint;
                let mut reply = Response::decode(endpoint, &body)
                    .map_err(|e| format!("the reply to {to} does not decode: {e}"))?;
                if let Some(mutant) = self.mutant {
                    reply = mutant(endpoint, reply);
                }
                self.calls[c].js_failed |= self.timing_out;
                self.check_reply(c, &reply)?;
                self.calls[c].reply = Some(reply);
            }
            ServiceEvent::Cancel { id } => {
                if let Some(i) = self.network.iter().position(|f| f.transmit.id == id) {
                    let gone = self.network.remove(i);
                    for owner in &gone.owners {
                        if let Some(c) = self.call(owner.as_ref()) {
                            self.calls[c].js_failed |= self.timing_out;
                        }
                    }
                }
            }
            event => self.note(&event),
        }
        Ok(())
    }

    /// A subscription the service asked for, or dropped.
    fn note(&mut self, event: &ServiceEvent) {
        match event {
            ServiceEvent::Subscribe {
                kind: SubscriptionKind::Changes,
                ..
            } => self.hears_changes = true,
            ServiceEvent::UnsubscribeChanges => self.hears_changes = false,
            _ => {}
        }
    }

    fn reap(&mut self) {
        let done: Vec<Active> = {
            let (done, live) = std::mem::take(&mut self.calls)
                .into_iter()
                .partition(|a| a.reply.is_some());
            self.calls = live;
            done
        };
        for a in done {
            let reply = a.reply.expect("partitioned on reply");
            if matches!(reply, Response::Lease(_) | Response::Released(_))
                && matches!(a.kind, CallKind::Renew { .. } | CallKind::Release { .. })
            {
                self.reads.fenced += 1;
                self.reads.unread += u64::from(a.reads == 0);
            }
            self.replies.push((a.kind, reply));
        }
    }
}
