//! The world: many concurrent calls from many holders against one simulated stream
//! (and, during a partition, its deposed leader), each step carried out as an
//! adapter would. The checks of every step are in `judge`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use time::OffsetDateTime;

use super::{Op, OwnerBehaviour, SimJetStream};
use crate::call::{Call, CallConfig, CallEvent, CallRequest};
use crate::io::RequestOutcome;
use crate::io::TransmitId;
use crate::js::{self, KeyState};
use crate::known::{Known, KnownLeases};
use crate::outbox::Ids;
use crate::subjects::{HDR_REJECT, REJECT_STALE};
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

/// The call machine a [`World`] drives: [`Call`] itself, or a test's wrapper of it
/// (a mutant the checks must catch).
pub trait CallMachine: std::fmt::Debug {
    /// See [`Call::poll_request`].
    fn poll_request(&mut self, ids: &mut Ids<TransmitId>) -> Option<CallRequest>;
    /// See [`Call::poll_event`].
    fn poll_event(&mut self) -> Option<CallEvent>;
    /// See [`Call::handle_outcome`].
    fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome);
    /// See [`Call::poll_timeout`].
    fn poll_timeout(&self) -> Option<Instant>;
    /// See [`Call::handle_timeout`].
    fn handle_timeout(&mut self, now: Instant);
    /// See [`Call::poll_learnt`]; nothing by default.
    fn poll_learnt(&mut self) -> Option<(String, Known)> {
        None
    }
}

impl CallMachine for Call {
    fn poll_request(&mut self, ids: &mut Ids<TransmitId>) -> Option<CallRequest> {
        Self::poll_request(self, ids)
    }
    fn poll_event(&mut self) -> Option<CallEvent> {
        Self::poll_event(self)
    }
    fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        Self::handle_outcome(self, now, id, outcome)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Self::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Self::handle_timeout(self, now)
    }
    fn poll_learnt(&mut self) -> Option<(String, Known)> {
        Self::poll_learnt(self)
    }
}

/// Makes the machine for one call, as [`Call::new`] does.
pub type MakeCall =
    fn(CallConfig, Endpoint, &[u8], OffsetDateTime, Instant) -> Box<dyn CallMachine>;

fn make_call(
    config: CallConfig,
    endpoint: Endpoint,
    body: &[u8],
    wall: OffsetDateTime,
    now: Instant,
) -> Box<dyn CallMachine> {
    Box::new(Call::new(config, endpoint, body, wall, now))
}

#[derive(Debug)]
pub(super) struct Active {
    pub(super) kind: CallKind,
    call: Box<dyn CallMachine>,
    pending: Option<CallRequest>,
    pub(super) last_read: Option<KeyState>,
    pub(super) written: Vec<u64>,
    pub(super) inbox_attempts: u32,
    pub(super) kv_effects: u32,
    /// KV writes and read confirmations the call issued.
    pub(super) writes: u32,
    pub(super) confirms: u32,
    /// Whether JetStream failed one of its effects (a lost reply, a deposed
    /// leader that cannot commit): what `unavailable` needs.
    pub(super) js_failed: bool,
    /// A forward's deadline.
    pub(super) deadline: Option<Instant>,
    /// The owner a forward last tried and how it answered (`None` while the
    /// request is in flight).
    pub(super) last_inbox: Option<(String, u64, Option<OwnerBehaviour>)>,
    reply: Option<Response>,
}

/// Many concurrent calls from many holders against one simulated stream, with the
/// lease invariants checked after every step.
#[derive(Debug)]
pub struct World {
    /// The stream.
    pub sim: SimJetStream,
    /// While partitioned: the deposed leader some calls still reach.
    cut_leader: Option<SimJetStream>,
    /// Whether the bucket has replicas, so a partition can depose its leader.
    replicated: bool,
    base: Instant,
    config: CallConfig,
    make: MakeCall,
    holders: usize,
    keys: usize,
    pub(super) calls: Vec<Active>,
    pub(super) fences: BTreeMap<(String, String), Vec<u64>>,
    pub(super) max_granted: BTreeMap<String, u64>,
    /// Replies seen, by kind of call, for reporting coverage.
    pub replies: Vec<(CallKind, Response)>,
    /// With [`World::with_known`]: a known map as the calls of one service share
    /// it, taught what the calls learn and the stream's change events one step late.
    known: Option<KnownLeases>,
    /// The change events of the last step (as the server's RePublish sends
    /// them), delivered at the end of the next.
    events: Vec<crate::service::Received>,
    /// The ids of the calls' requests: the world is their owner.
    ids: Ids<TransmitId>,
}

/// A broken invariant.
pub type Violation = String;

impl World {
    /// A world with `holders` holders and `keys` keys.
    pub fn new(holders: usize, keys: usize, max_payload: usize) -> Self {
        Self {
            sim: SimJetStream::new(),
            cut_leader: None,
            replicated: false,
            base: Instant::now(),
            config: CallConfig::ready(max_payload),
            make: make_call,
            holders: holders.max(1),
            keys: keys.max(1),
            calls: Vec::new(),
            fences: BTreeMap::new(),
            max_granted: BTreeMap::new(),
            replies: Vec::new(),
            known: None,
            events: Vec::new(),
            ids: Ids::starting_at(1),
        }
    }

    /// The same world with a [`KnownLeases`] map: calls start from what it knows
    /// of their key ([`Call::with_known`]) and teach it what they learn, and the
    /// stream's last message of every key reaches it as a change event one step
    /// after it was current (so what it knows is sometimes out of date). This
    /// world drives calls, not a service: it judges how calls act on what is
    /// known. How the [`Service`](crate::service::Service) itself feeds its map is
    /// tested where it runs whole: the holder world and the service world.
    pub fn with_known(mut self) -> Self {
        self.known = Some(KnownLeases::new(64));
        self
    }

    /// Delivers the last step's change events and gathers this step's.
    fn deliver_events(&mut self) {
        let Some(known) = &mut self.known else {
            return;
        };
        for message in self.events.drain(..) {
            let header = |name: &str| message.header(name);
            known.handle_change(&message.subject, header, &message.payload);
        }
        for k in 0..self.keys {
            let key = format!("k{k}");
            if let Some(m) = self.sim.current(&key) {
                self.events
                    .push(super::server::republished(self.sim.epoch, m));
            }
        }
    }

    /// The same world on a replicated bucket, where partitions depose the leader,
    /// with the service confirming its reads as it does there (`confirm_reads`), or,
    /// to show the checks catch stale reads, not.
    pub fn replicated(mut self, confirm_reads: bool) -> Self {
        self.replicated = true;
        self.config.confirm_reads = confirm_reads;
        self
    }

    /// The same world with the stream's late expiries drawn from `seed`.
    pub fn with_expiry_seed(mut self, seed: u64) -> Self {
        self.sim = self.sim.with_seed(seed);
        self
    }

    /// The same world with every call made by `make` instead of [`Call::new`].
    pub fn with_calls(mut self, make: MakeCall) -> Self {
        self.make = make;
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

    /// Calls still in flight.
    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Applies one step and checks every invariant.
    pub fn apply(&mut self, op: Op) -> Result<(), Violation> {
        let result = self.apply_op(op);
        self.deliver_events();
        result
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
                if self.calls.is_empty() {
                    return Ok(());
                }
                let i = call as usize % self.calls.len();
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
                self.sim.advance(u64::from(ms) % 1200);
                let now = self.now();
                for i in 0..self.calls.len() {
                    if self.calls[i].call.poll_timeout().is_some_and(|t| t <= now) {
                        // Time ran past the effect's deadline: JetStream did not
                        // answer in time, so `unavailable` is a fair reply.
                        self.calls[i].js_failed = true;
                        self.calls[i].call.handle_timeout(now);
                        self.drain(i)?;
                    }
                }
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
        let call = match &self.known {
            Some(known) => Box::new(Call::with_known(
                self.config,
                known,
                endpoint,
                body.as_bytes(),
                self.sim.wall(),
                self.now(),
            )),
            None => (self.make)(
                self.config,
                endpoint,
                body.as_bytes(),
                self.sim.wall(),
                self.now(),
            ),
        };
        self.calls.push(Active {
            kind,
            call,
            pending: None,
            last_read: None,
            written: Vec::new(),
            inbox_attempts: 0,
            kv_effects: 0,
            writes: 0,
            confirms: 0,
            js_failed: false,
            deadline,
            last_inbox: None,
            reply: None,
        });
        let i = self.calls.len() - 1;
        self.drain(i)?;
        self.reap();
        Ok(())
    }

    fn step(
        &mut self,
        i: usize,
        lose_reply: bool,
        owner: OwnerBehaviour,
        via_cut: bool,
    ) -> Result<(), Violation> {
        let Some(effect) = self.calls[i].pending.take() else {
            return Err(format!(
                "call {:?} has no effect and no reply",
                self.calls[i].kind
            ));
        };
        let now = self.now();
        let cut = self.cut_leader.as_mut().filter(|_| via_cut);
        let (id, outcome): (TransmitId, RequestOutcome) = match &effect {
            CallRequest::KvRead(_) => {
                let (id, req) = effect.nats_request();
                let outcome = match cut {
                    Some(stale) => stale.handle(&req),
                    None => self.sim.handle(&req),
                };
                self.calls[i].last_read = js::parse_read(&outcome).ok();
                (
                    id,
                    if lose_reply {
                        RequestOutcome::TimedOut
                    } else {
                        outcome
                    },
                )
            }
            CallRequest::KvWrite(_) | CallRequest::ConfirmRead(_) if cut.is_some() => {
                let (id, req) = effect.nats_request();
                let stale = cut.expect("checked");
                (id, stale.handle(&req))
            }
            CallRequest::ConfirmRead(_) => {
                let (id, req) = effect.nats_request();
                let outcome = self.sim.handle(&req);
                (
                    id,
                    if lose_reply {
                        RequestOutcome::TimedOut
                    } else {
                        outcome
                    },
                )
            }
            CallRequest::KvWrite(w) => {
                self.check_write(i, w)?;
                let (id, req) = effect.nats_request();
                let outcome = self.sim.handle(&req);
                if let Ok(js::PublishResult::Stored(rev)) = js::parse_pub_ack(&outcome) {
                    self.calls[i].written.push(rev);
                }
                (
                    id,
                    if lose_reply {
                        RequestOutcome::TimedOut
                    } else {
                        outcome
                    },
                )
            }
            CallRequest::InboxRequest(r) => {
                let a = &mut self.calls[i];
                a.inbox_attempts += 1;
                if a.inbox_attempts > crate::call::MAX_FORWARD_ATTEMPTS {
                    return Err(format!("forward made {} attempts", a.inbox_attempts));
                }
                match &a.last_read {
                    Some(KeyState::Held {
                        revision, record, ..
                    }) if record.holder == r.holder && *revision == r.fence => {}
                    other => {
                        return Err(format!(
                            "forward to {}@{} without having just read it: {other:?}",
                            r.holder, r.fence
                        ));
                    }
                }
                let outcome = match owner {
                    OwnerBehaviour::Echo => RequestOutcome::reply(r.payload.clone()),
                    OwnerBehaviour::Reject => RequestOutcome::Reply {
                        headers: vec![(HDR_REJECT.to_string(), REJECT_STALE.to_string())],
                        payload: Vec::new(),
                    },
                    OwnerBehaviour::NoResponders => RequestOutcome::NoResponders,
                    OwnerBehaviour::Silent => RequestOutcome::TimedOut,
                    OwnerBehaviour::Huge => {
                        RequestOutcome::reply(vec![7u8; self.config.max_payload])
                    }
                };
                (r.id, outcome)
            }
        };
        let timed_out =
            matches!(effect, CallRequest::InboxRequest(_)) && outcome == RequestOutcome::TimedOut;
        let unavailable = |f: js::JsFailure| f.kind == ErrorKind::Unavailable;
        let a = &mut self.calls[i];
        match &effect {
            CallRequest::KvRead(_) => {
                a.js_failed |= js::parse_read(&outcome).is_err_and(unavailable);
            }
            CallRequest::KvWrite(_) | CallRequest::ConfirmRead(_) => {
                if matches!(effect, CallRequest::KvWrite(_)) {
                    a.writes += 1;
                } else {
                    a.confirms += 1;
                }
                a.js_failed |= js::parse_pub_ack(&outcome).is_err_and(unavailable);
            }
            CallRequest::InboxRequest(r) => {
                a.last_inbox = Some((r.holder.clone(), r.fence, Some(owner)));
            }
        }
        self.calls[i].call.handle_outcome(now, id, outcome);
        self.drain(i)?;
        if timed_out {
            match &self.calls[i].reply {
                Some(Response::Error(e)) if e.kind == ErrorKind::OwnerTimeout => {}
                other => return Err(format!("an owner timeout was followed by {other:?}")),
            }
        }
        self.reap();
        self.check_no_overlap()
    }

    /// Takes effects until the call waits on one or has replied.
    fn drain(&mut self, i: usize) -> Result<(), Violation> {
        if let Some(known) = &mut self.known {
            while let Some((key, fact)) = self.calls[i].call.poll_learnt() {
                known.learn(&key, fact);
            }
        }
        while let Some(effect) = self.calls[i].call.poll_request(&mut self.ids) {
            if self.calls[i].reply.is_some() {
                return Err(format!("effect after the reply: {effect:?}"));
            }
            if matches!(
                effect,
                CallRequest::KvRead(_) | CallRequest::KvWrite(_) | CallRequest::ConfirmRead(_)
            ) {
                self.calls[i].kv_effects += 1;
            }
            if let CallRequest::InboxRequest(r) = &effect {
                self.calls[i].last_inbox = Some((r.holder.clone(), r.fence, None));
                // Sent right after the read (and its confirmation) that chose
                // this owner: it must be the owner now.
                let live = self.sim.live(&r.key).map(|(rec, rev)| (rec.holder, rev));
                if live != Some((r.holder.clone(), r.fence)) {
                    return Err(format!(
                        "forward to {}@{} while the stream holds {live:?}: a stale read",
                        r.holder, r.fence
                    ));
                }
            }
            if self.calls[i].pending.replace(effect).is_some() {
                return Err("two effects in flight for one call".to_string());
            }
        }
        while let Some(event) = self.calls[i].call.poll_event() {
            match event {
                CallEvent::Replied(r) => {
                    self.calls[i].pending = None;
                    self.check_reply(i, &r)?;
                    self.calls[i].reply = Some(r);
                }
                CallEvent::Kv(_) => {}
            }
        }
        if self.calls[i].pending.is_none() && self.calls[i].reply.is_none() {
            return Err(format!("call {:?} is stuck", self.calls[i].kind));
        }
        Ok(())
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
            self.replies.push((a.kind, reply));
        }
    }
}
