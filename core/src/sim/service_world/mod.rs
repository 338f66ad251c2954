//! The service world: the [`Service`] machine end to end against the simulated
//! stream, over a network whose answers come late, out of order, or never, for the
//! core's tests (`tests/service.rs`) and the fuzzer (`service_inputs`). Requests
//! (good and bad, to good and bad reply subjects), `$SRV` verbs, forged change
//! events, the stream's replicas going up and down (the confirm switch), timers and
//! a stop arrive in any order; the change events the stream republishes reach the
//! service (once it subscribed to them) when time next moves on. What it checks as
//! it drains the service is in `checks`. After every step the world checks:
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
//!    [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND) after it was sent and never once taken (the world's client
//!    takes replies when it carries out a stop's waits, and when a test settles).

mod checks;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::json;

use super::SimJetStream;
use super::server::{StreamAdmin, republished};
use crate::io::{NatsRequest, RequestOutcome, Transmit, TransmitId};
use crate::service::shutdown::Shutdown;
use crate::service::{Received, ReplyId, Service, ServiceConfig, ServiceEvent};
use crate::wire::{Endpoint, Response};

const HOLDERS: [&str; 3] = ["h0", "h1", "h2"];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];

/// One request in flight on the simulated network.
#[derive(Debug)]
struct InFlight {
    id: TransmitId,
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
    /// What the stream API says of the stream.
    admin: StreamAdmin,
    network: Vec<InFlight>,
    /// Requests the network lost, by when the service must have cancelled them.
    lost: BTreeMap<TransmitId, Instant>,
    /// Every request the service cancelled.
    pub cancelled: BTreeSet<TransmitId>,
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
    stop_began_ms: Option<u64>,
    /// When the stop ended, in virtual ms.
    stop_ended_ms: Option<u64>,
    subscribed: BTreeSet<String>,
    steps_since_stop: usize,
    /// How much of the stream's log the tombstone check has read.
    log_checked: usize,
    /// Whether the service subscribed to change events, the ones the stream
    /// republished not yet delivered (they are, when time next moves on), and how
    /// far into its log they were taken.
    hears_changes: bool,
    changes: Vec<Received>,
    changes_read: usize,
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
            admin: StreamAdmin {
                replicas,
                created: 1,
                first_seq: None,
            },
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
            stop_began_ms: None,
            stop_ended_ms: None,
            subscribed: BTreeSet::new(),
            steps_since_stop: 0,
            log_checked: 0,
            hears_changes: false,
            changes: Vec::new(),
            changes_read: 0,
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
        self.admin.replicas = replicas.max(1);
    }

    /// Makes the stream anew as the restore procedure does, its `first_seq` above
    /// every sequence used (the next stream info reports another created time).
    pub fn replace_stream(&mut self) {
        self.admin.created += 1;
        self.admin.first_seq = Some(self.sim.last_seq() + 1);
    }

    /// Makes the stream anew from sequence 1, empty: its fences start again.
    pub fn rewind_stream(&mut self) {
        self.admin.created += 1;
        self.admin.first_seq = None;
        self.sim = SimJetStream::new().with_atomic(true);
        self.changes_read = 0;
    }

    /// Takes the messages the stream stored since the last look as the change
    /// events its RePublish sends, if the service subscribed to them.
    fn republish(&mut self) {
        if self.hears_changes {
            let epoch = self.sim.epoch;
            let new = self.sim.log[self.changes_read.min(self.sim.log.len())..]
                .iter()
                .map(|m| republished(epoch, m));
            self.changes.extend(new);
        }
        self.changes_read = self.sim.log.len();
    }

    /// Delivers the change events taken so far to the service, as its
    /// subscription would.
    pub fn deliver_changes(&mut self) -> Result<(), String> {
        for message in std::mem::take(&mut self.changes) {
            self.service
                .handle_request(self.now(), self.sim.wall(), message);
        }
        self.drain()
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
        self.send(endpoint.subject(), &reply, body.to_string().into_bytes());
        reply
    }

    /// Sends a `renew_many` request with `body`, as [`ServiceWorld::request`] does;
    /// each item is asked as a renew of its own (`<reply>#<i>`), so that its writes
    /// are checked as a renew's, and answered by the request's one reply.
    pub fn request_many(&mut self, body: serde_json::Value, good_reply: bool) -> String {
        self.request_many_bytes(body.to_string().as_bytes(), good_reply)
    }

    /// [`ServiceWorld::request_many`] of a body given as its bytes, such as one no
    /// JSON value writes (a field given twice); its items are read for the checks
    /// as a JSON value reads them.
    pub fn request_many_bytes(&mut self, payload: &[u8], good_reply: bool) -> String {
        let body: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
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
        self.send(crate::wire::renew_many_subject(), &reply, payload.to_vec());
        reply
    }

    /// Hands the service `body` on `subject` with `reply`, as its subscription would.
    fn send(&mut self, subject: String, reply: &str, payload: Vec<u8>) {
        let message = Received {
            subject,
            reply: Some(reply.to_string()),
            headers: Vec::new(),
            payload,
            header_error: None,
        };
        self.service
            .handle_request(self.now(), self.sim.wall(), message);
    }

    /// Answers the request in flight at `index` (mod their count).
    pub fn deliver(&mut self, index: usize) {
        if self.network.is_empty() {
            return;
        }
        let InFlight { id, transmit, .. } = self.network.remove(index % self.network.len());
        let outcome = self.admin.answer(&mut self.sim, &transmit);
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
        self.deliver_changes()?;
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
        if self.stop_ended_ms.is_none()
            && self.service.stop_phase() == Some(crate::service::shutdown::StopPhase::Stopped)
        {
            self.stop_ended_ms = Some(self.now_ms);
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
        if self.stop_began_ms.is_none() {
            self.stop_began_ms = Some(self.now_ms);
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
        if self.stop_began_ms.is_some() {
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
        let stop_began_ms = self.stop_began_ms.unwrap_or(0);
        let took = Duration::from_millis(self.stop_ended_ms.unwrap_or(self.now_ms) - stop_began_ms);
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
