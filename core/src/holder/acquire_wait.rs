//! A waiting acquire: ask for a key, and while another holder has it, ask again
//! when a change event may have freed it, until a wait runs out.
//!
//! Change events are at-most-once, so it also asks again one lease TTL after the
//! last write it saw (the refusal, or an acquire or renewal event): a lease that
//! was released or expired unseen is free by then. A wait of zero asks once.
//!
//! Before the first try it subscribes to the key's change events and flushes, so
//! that no event between a refusal and the wait is missed. Each is bounded here: a
//! subscribe not reported within [`HANDOFF_BOUND`], or a flush within
//! [`FLUSH_BOUND`], is given up (a client reconnecting to a server that is gone
//! would hold it for ever, and the wait's own bound would never begin), and the
//! acquire goes ahead without it: only the early wake-up is lost, the TTL fallback
//! still wakes it. The wait's bound begins once they are over.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::change::ChangeEvent;
use crate::io::{FLUSH_BOUND, HANDOFF_BOUND, RequestOutcome, Transmit, TransmitId, lease_call};
use crate::wire::{AcquireReply, AcquireRequest, Endpoint, Request, Response};

/// What a [`WaitingAcquire`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitingAcquireEvent {
    /// Subscribe to the key's change events, and say when that is over with
    /// [`WaitingAcquire::handle_subscribed`]. Given up at [`HANDOFF_BOUND`]
    /// ([`WaitingAcquireEvent::CancelSubscribe`]).
    Subscribe,
    /// Flush the connection, so that the subscription is on the server before the
    /// first acquire, and say when that is over with
    /// [`WaitingAcquire::handle_flushed`]. Given up at [`FLUSH_BOUND`]
    /// ([`WaitingAcquireEvent::CancelFlush`]).
    Flush,
    /// Drop the subscribe under way: not over within [`HANDOFF_BOUND`]. The
    /// acquire goes ahead without change events (the TTL fallback alone wakes it).
    CancelSubscribe,
    /// Drop the flush under way: not over within [`FLUSH_BOUND`]. The acquire goes
    /// ahead; the subscription is kept.
    CancelFlush,
    /// Another holder has the key: waiting for it.
    NotGranted(AcquireReply),
    /// Over: granted, or the last refusal once the wait ran out.
    Done(AcquireReply),
    /// Over: the acquire got no usable answer (no reply in time, no service, an
    /// error reply); the outcome, for the adapter to report.
    Failed(RequestOutcome),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The subscribe to change events is under way until `due`.
    Subscribing {
        due: Instant,
    },
    /// The flush after it is under way until `due`.
    Flushing {
        due: Instant,
    },
    /// The acquire `id` is out until `due`.
    Asking {
        id: TransmitId,
        due: Instant,
    },
    /// Refused: ask again at `until` (a TTL after the last write seen), or at once
    /// on an event that may free the key.
    Waiting {
        until: Instant,
        ttl: Duration,
    },
    Done,
}

/// One waiting acquire. See the [module docs](self).
#[derive(Debug)]
pub struct WaitingAcquire {
    request: AcquireRequest,
    timeout: Duration,
    wait: Duration,
    /// The wait's end: set at the first acquire.
    deadline: Instant,
    phase: Phase,
    last: Option<AcquireReply>,
    next_id: u64,
    transmits: VecDeque<Transmit>,
    events: VecDeque<WaitingAcquireEvent>,
}

impl WaitingAcquire {
    /// Subscribes to the key's change events at `now`, then asks for the key, each
    /// acquire bounded by `timeout`, waiting at most `wait` from the first while
    /// another holder has it.
    pub fn new(request: AcquireRequest, timeout: Duration, wait: Duration, now: Instant) -> Self {
        Self {
            request,
            timeout,
            wait,
            deadline: now + wait,
            phase: Phase::Subscribing {
                due: now + HANDOFF_BOUND,
            },
            last: None,
            next_id: 0,
            transmits: VecDeque::new(),
            events: VecDeque::from([WaitingAcquireEvent::Subscribe]),
        }
    }

    /// The subscribe ([`WaitingAcquireEvent::Subscribe`]) is over: `made`, then a
    /// flush follows; failed (no permission, say), then the acquire goes ahead
    /// without change events. Ignored once given up.
    pub fn handle_subscribed(&mut self, now: Instant, made: bool) {
        if !matches!(self.phase, Phase::Subscribing { .. }) {
            return;
        }
        if made {
            self.phase = Phase::Flushing {
                due: now + FLUSH_BOUND,
            };
            self.events.push_back(WaitingAcquireEvent::Flush);
        } else {
            self.start(now);
        }
    }

    /// The flush ([`WaitingAcquireEvent::Flush`]) is over, done or failed: the
    /// first acquire goes out. Ignored once given up.
    pub fn handle_flushed(&mut self, now: Instant) {
        if matches!(self.phase, Phase::Flushing { .. }) {
            self.start(now);
        }
    }

    /// The first acquire: the wait's bound begins.
    fn start(&mut self, now: Instant) {
        self.deadline = now + self.wait;
        self.ask(now);
    }

    fn ask(&mut self, now: Instant) {
        self.next_id += 1;
        let id = TransmitId(self.next_id);
        self.phase = Phase::Asking {
            id,
            due: now + self.timeout,
        };
        let body = Request::Acquire(self.request.clone()).to_json();
        self.transmits
            .push_back(lease_call(id, Endpoint::Acquire, body, self.timeout));
    }

    fn finish(&mut self, event: WaitingAcquireEvent) {
        self.phase = Phase::Done;
        self.events.push_back(event);
    }

    /// What came of acquire `id`.
    pub fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        if !matches!(self.phase, Phase::Asking { id: w, .. } if w == id) {
            return;
        }
        let reply = match &outcome {
            RequestOutcome::Reply { payload, .. } => Response::decode(Endpoint::Acquire, payload),
            _ => return self.finish(WaitingAcquireEvent::Failed(outcome)),
        };
        let Ok(Response::Acquired(reply)) = reply else {
            return self.finish(WaitingAcquireEvent::Failed(outcome));
        };
        if reply.granted || now >= self.deadline {
            return self.finish(WaitingAcquireEvent::Done(reply));
        }
        let ttl = Duration::from_millis(reply.lease.ttl_ms);
        self.phase = Phase::Waiting {
            until: now + ttl,
            ttl,
        };
        self.last = Some(reply.clone());
        self.events
            .push_back(WaitingAcquireEvent::NotGranted(reply));
    }

    /// A change event of the key: one that may free it asks again now; any other
    /// shows the lease alive, so the TTL fallback starts again from now.
    pub fn handle_change(&mut self, now: Instant, event: &ChangeEvent) {
        if let Phase::Waiting { until, ttl } = &mut self.phase {
            if event.kind.may_free_key() {
                self.ask(now);
            } else {
                *until = now + *ttl;
            }
        }
    }

    /// A subscribe or flush past its bound is given up and the first acquire goes
    /// out; the acquire out past its timeout fails; the wait past its end ends with
    /// the last refusal; the TTL fallback asks again.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Subscribing { due } if now >= due => {
                self.events.push_back(WaitingAcquireEvent::CancelSubscribe);
                self.start(now);
            }
            Phase::Flushing { due } if now >= due => {
                self.events.push_back(WaitingAcquireEvent::CancelFlush);
                self.start(now);
            }
            Phase::Asking { id, due } if now >= due => {
                self.handle_outcome(now, id, RequestOutcome::TimedOut);
            }
            Phase::Waiting { .. } if now >= self.deadline => {
                let last = self.last.take().expect("waiting after a refusal");
                self.finish(WaitingAcquireEvent::Done(last));
            }
            Phase::Waiting { until, .. } if now >= until => self.ask(now),
            _ => {}
        }
    }

    /// The acquire to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// A subscribe or flush to start or drop, a refusal waited on, or the end.
    pub fn poll_event(&mut self) -> Option<WaitingAcquireEvent> {
        self.events.pop_front()
    }

    /// The subscribe's or the flush's bound, the acquire's deadline, or the next
    /// of the wait's end and the TTL fallback.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Subscribing { due } | Phase::Flushing { due } => Some(due),
            Phase::Asking { due, .. } => Some(due),
            Phase::Waiting { until, .. } => Some(until.min(self.deadline)),
            Phase::Done => None,
        }
    }

    /// Whether it is over and its end was polled.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done && self.events.is_empty()
    }
}
