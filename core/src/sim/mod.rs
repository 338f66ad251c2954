//! A deterministic simulated JetStream KV and a world of concurrent calls, for the
//! core's property tests and the fuzzer. Not public API (`__test` feature).
//!
//! The simulator answers the same NATS requests a real server would, with the same
//! JSON: revisions are one sequence across the bucket, writes check the expected
//! last subject sequence, messages carry a per-message TTL, and an expiry leaves a
//! `MaxAge` marker that expires in turn. Time is a virtual millisecond clock.
//!
//! A stream can also be a *deposed leader* ([`SimJetStream::deposed`]): a frozen
//! copy of an older state that still answers reads from it, refuses from that
//! state a write it expects to fail, and cannot commit any other (the caller times
//! out), as a cut-off nats-server stream leader does until it steps down.
//!
//! The simulated stream is in `jetstream`; this module is the world of calls, owners
//! and fixtures run over it.

mod jetstream;

pub use jetstream::*;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use time::OffsetDateTime;

use crate::call::{Call, CallConfig, Effect};

use crate::io::EffectId;
use crate::io::RequestOutcome;
use crate::js::{self, KeyState};
use crate::record::LeaseEvent;
use crate::subjects::{HDR_REJECT, REJECT_STALE};
use crate::wire::{Endpoint, ErrorKind, Response};

/// How a simulated owner answers a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, arbitrary::Arbitrary)]
pub enum OwnerBehaviour {
    /// Echoes the payload.
    Echo,
    /// Replies `Dagnats-Lease-Reject: stale`.
    Reject,
    /// Nobody subscribes.
    NoResponders,
    /// Never replies.
    Silent,
    /// Replies with more than `max_payload` allows.
    Huge,
}

/// One step of a world.
#[derive(Debug, Clone, arbitrary::Arbitrary)]
pub enum Op {
    /// A holder asks for a key.
    Acquire {
        /// Which holder (mod the holder count).
        holder: u8,
        /// Which key (mod the key count).
        key: u8,
        /// TTL in seconds, 1 to 3.
        ttl_s: u8,
    },
    /// A holder renews with its last known fence, or a stale one.
    Renew {
        /// Which holder.
        holder: u8,
        /// Which key.
        key: u8,
        /// Use an older fence than the holder knows.
        stale: bool,
        /// A new TTL in seconds, if any.
        ttl_s: Option<u8>,
    },
    /// A holder releases with its last known fence, or a stale one.
    Release {
        /// Which holder.
        holder: u8,
        /// Which key.
        key: u8,
        /// Use an older fence than the holder knows.
        stale: bool,
    },
    /// Who holds a key.
    Owner {
        /// Which key.
        key: u8,
    },
    /// Forward to a key's owner.
    Forward {
        /// Which key.
        key: u8,
        /// `timeout_ms`, clamped into bounds.
        timeout_ms: u16,
    },
    /// A request from the list of invalid ones, or raw bytes.
    Invalid {
        /// Which endpoint.
        endpoint: u8,
        /// Which invalid body.
        which: u8,
        /// Raw bytes tried as a body as well.
        raw: Vec<u8>,
    },
    /// Carry out the pending effect of one call.
    Step {
        /// Which call (mod the number in flight).
        call: u8,
        /// For a KV effect: apply it but lose the reply (the caller sees a timeout)
        /// when this is a multiple of 8.
        lose_reply: u8,
        /// For an inbox request: how the owner answers.
        owner: OwnerBehaviour,
        /// During a partition: the call's service reaches the deposed leader.
        via_cut: bool,
    },
    /// A replicated bucket's stream leader is cut off (its state frozen, still
    /// answering as leader to the calls that reach it), or the cut heals.
    Partition {
        /// Cut (a no-op while cut) or heal.
        cut: bool,
    },
    /// Let server time pass, expiring leases.
    Advance {
        /// How long, ms (mod 1200).
        ms: u16,
    },
}

/// Reads a sequence of steps from raw bytes (for proptest and the fuzzer). Three in
/// four steps carry out a pending effect, so calls interleave instead of piling up.
pub fn ops_from_bytes(bytes: &[u8]) -> Vec<Op> {
    use arbitrary::{Arbitrary, Unstructured};
    let mut u = Unstructured::new(bytes);
    let mut ops = Vec::new();
    while !u.is_empty() {
        let Ok(pick) = u8::arbitrary(&mut u) else {
            break;
        };
        let op = if pick < 192 {
            match (
                u8::arbitrary(&mut u),
                u8::arbitrary(&mut u),
                OwnerBehaviour::arbitrary(&mut u),
                bool::arbitrary(&mut u),
            ) {
                (Ok(call), Ok(lose_reply), Ok(owner), Ok(via_cut)) => Op::Step {
                    call,
                    lose_reply,
                    owner,
                    via_cut,
                },
                _ => break,
            }
        } else {
            match Op::arbitrary(&mut u) {
                Ok(op) => op,
                Err(_) => break,
            }
        };
        ops.push(op);
    }
    ops
}

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

/// The call machine a [`World`] drives: [`Call`] itself, or a test's wrapper of it
/// (a mutant the checks must catch).
pub trait CallMachine: std::fmt::Debug {
    /// See [`Call::poll_effect`].
    fn poll_effect(&mut self) -> Option<Effect>;
    /// See [`Call::poll_event`].
    fn poll_event(&mut self) -> Option<Response>;
    /// See [`Call::handle_outcome`].
    fn handle_outcome(&mut self, now: Instant, id: EffectId, outcome: RequestOutcome);
    /// See [`Call::poll_timeout`].
    fn poll_timeout(&self) -> Option<Instant>;
    /// See [`Call::handle_timeout`].
    fn handle_timeout(&mut self, now: Instant);
}

impl CallMachine for Call {
    fn poll_effect(&mut self) -> Option<Effect> {
        Self::poll_effect(self)
    }
    fn poll_event(&mut self) -> Option<Response> {
        Self::poll_event(self)
    }
    fn handle_outcome(&mut self, now: Instant, id: EffectId, outcome: RequestOutcome) {
        Self::handle_outcome(self, now, id, outcome)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Self::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Self::handle_timeout(self, now)
    }
}

/// Makes the machine for one call, as [`Call::new`] does.
pub type MakeCall =
    fn(CallConfig, Instant, OffsetDateTime, Endpoint, &[u8]) -> Box<dyn CallMachine>;

fn make_call(
    config: CallConfig,
    now: Instant,
    wall: OffsetDateTime,
    endpoint: Endpoint,
    body: &[u8],
) -> Box<dyn CallMachine> {
    Box::new(Call::new(config, now, wall, endpoint, body))
}

#[derive(Debug)]
struct Active {
    kind: CallKind,
    call: Box<dyn CallMachine>,
    pending: Option<Effect>,
    last_read: Option<KeyState>,
    written: Vec<u64>,
    inbox_attempts: u32,
    kv_effects: u32,
    /// KV writes and read confirmations the call issued.
    writes: u32,
    confirms: u32,
    /// Whether JetStream failed one of its effects (a lost reply, a deposed
    /// leader that cannot commit): what `unavailable` needs.
    js_failed: bool,
    /// A forward's deadline.
    deadline: Option<Instant>,
    /// The owner a forward last tried and how it answered (`None` while the
    /// request is in flight).
    last_inbox: Option<(String, u64, Option<OwnerBehaviour>)>,
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
    calls: Vec<Active>,
    fences: BTreeMap<(String, String), Vec<u64>>,
    max_granted: BTreeMap<String, u64>,
    /// Replies seen, by kind of call, for reporting coverage.
    pub replies: Vec<(CallKind, Response)>,
}

/// A broken invariant.
pub type Violation = String;

/// The invalid bodies every endpoint must reject.
pub fn invalid_bodies(endpoint: Endpoint) -> Vec<String> {
    let long = "k".repeat(129);
    let mut v = vec![
        "".to_string(),
        "not json".to_string(),
        "[]".to_string(),
        "{}".to_string(),
        r#"{"key":"a.b","holder":"h","ttl_ms":1000,"revision":1,"payload":"","timeout_ms":100}"#
            .to_string(),
        format!(
            r#"{{"key":"{long}","holder":"h","ttl_ms":1000,"revision":1,"payload":"","timeout_ms":100}}"#
        ),
        r#"{"key":"","holder":"h","ttl_ms":1000,"revision":1,"payload":"","timeout_ms":100}"#
            .to_string(),
        r#"{"key":"k*","holder":"h","ttl_ms":1000,"revision":1,"payload":"","timeout_ms":100}"#
            .to_string(),
    ];
    let extra: &[&str] = match endpoint {
        Endpoint::Acquire => &[
            r#"{"key":"k","holder":"h","ttl_ms":1500}"#,
            r#"{"key":"k","holder":"h","ttl_ms":999}"#,
            r#"{"key":"k","holder":"h","ttl_ms":601000}"#,
            r#"{"key":"k","holder":"h","ttl_ms":"1000"}"#,
            r#"{"key":"k","holder":"h","ttl_ms":1000.0}"#,
            r#"{"key":"k","holder":"h","ttl_ms":-1000}"#,
            r#"{"key":"k","holder":"h"}"#,
            r#"{"key":"k","holder":"h>","ttl_ms":1000}"#,
            r#"{"key":"k","holder":"h","ttl_ms":1000,"extra":1}"#,
            r#"{"key":"k","holder":"h","ttl_ms":1000} trailing"#,
            r#"{"key":"k","key":"k","holder":"h","ttl_ms":1000}"#,
        ],
        Endpoint::Renew => &[
            r#"{"key":"k","holder":"h","ttl_ms":1000}"#,
            r#"{"key":"k","holder":"h","revision":1,"ttl_ms":2500}"#,
            r#"{"key":"k","holder":"h","revision":"1"}"#,
            r#"{"key":"k","holder":"h","revision":-1}"#,
            r#"{"key":"k","holder":"","revision":1}"#,
            r#"{"key":"k","holder":"h","revision":1,"fence":1}"#,
        ],
        Endpoint::Release => &[
            r#"{"key":"k","holder":"h"}"#,
            r#"{"key":"k","holder":"h","revision":1,"ttl":1000}"#,
            r#"{"key":"k","holder":"h","revison":1}"#,
            r#"{"key":"k","holder":"h h","revision":1}"#,
            r#"{"key":"k","revision":1}"#,
        ],
        Endpoint::Owner => &[
            r#"{"key":"k","holdr":"h"}"#,
            r#"{"key":"k","revision":"1"}"#,
            r#"{"key":7}"#,
            r#"{"key":null}"#,
        ],
        Endpoint::Forward => &[
            r#"{"key":"k","payload":"aGk=","timeout_ms":99}"#,
            r#"{"key":"k","payload":"aGk=","timeout_ms":30001}"#,
            r#"{"key":"k","payload":"not base64!","timeout_ms":1000}"#,
            r#"{"key":"k","payload":"aGk=","timeout_ms":1000,"holder":"h"}"#,
            r#"{"key":"k","timeout_ms":1000}"#,
            r#"{"key":"k","payload":"aGk="}"#,
        ],
    };
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

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

    fn now(&self) -> Instant {
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
        let call = (self.make)(
            self.config,
            self.now(),
            self.sim.wall(),
            endpoint,
            body.as_bytes(),
        );
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
        let (id, outcome): (EffectId, RequestOutcome) = match &effect {
            Effect::KvRead(_) => {
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
            Effect::KvWrite(_) | Effect::ConfirmRead(_) if cut.is_some() => {
                let (id, req) = effect.nats_request();
                let stale = cut.expect("checked");
                (id, stale.handle(&req))
            }
            Effect::ConfirmRead(_) => {
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
            Effect::KvWrite(w) => {
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
            Effect::InboxRequest(r) => {
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
            matches!(effect, Effect::InboxRequest(_)) && outcome == RequestOutcome::TimedOut;
        let unavailable = |f: js::JsFailure| f.kind == ErrorKind::Unavailable;
        let a = &mut self.calls[i];
        match &effect {
            Effect::KvRead(_) => {
                a.js_failed |= js::parse_read(&outcome).is_err_and(unavailable);
            }
            Effect::KvWrite(_) | Effect::ConfirmRead(_) => {
                if matches!(effect, Effect::KvWrite(_)) {
                    a.writes += 1;
                } else {
                    a.confirms += 1;
                }
                a.js_failed |= js::parse_pub_ack(&outcome).is_err_and(unavailable);
            }
            Effect::InboxRequest(r) => {
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
        while let Some(effect) = self.calls[i].call.poll_effect() {
            if self.calls[i].reply.is_some() {
                return Err(format!("effect after the reply: {effect:?}"));
            }
            if matches!(
                effect,
                Effect::KvRead(_) | Effect::KvWrite(_) | Effect::ConfirmRead(_)
            ) {
                self.calls[i].kv_effects += 1;
            }
            if let Effect::InboxRequest(r) = &effect {
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
        if let Some(r) = self.calls[i].call.poll_event() {
            self.calls[i].pending = None;
            self.check_reply(i, &r)?;
            self.calls[i].reply = Some(r);
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

    /// A write about to reach the stream: would it break a lease rule if accepted?
    fn check_write(&self, i: usize, w: &crate::call::KvWrite) -> Result<(), Violation> {
        let a = &self.calls[i];
        let current = self.sim.current(&w.key);
        let accepted = current.map_or(0, |m| m.seq) == w.expected_revision;
        if !accepted {
            return Ok(());
        }
        let live = self.sim.live(&w.key);
        match (&a.kind, w.event) {
            (CallKind::Acquire { .. }, LeaseEvent::Acquired) => {
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
                LeaseEvent::Renewed | LeaseEvent::Released,
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

    fn check_reply(&mut self, i: usize, reply: &Response) -> Result<(), Violation> {
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
    fn check_no_overlap(&self) -> Result<(), Violation> {
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
