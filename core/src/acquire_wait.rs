//! A waiting acquire: ask for a key, and while another holder has it, ask again
//! when a change event may have freed it, until a wait runs out.
//!
//! Change events are at-most-once, so it also asks again one lease TTL after the
//! last write it saw (the refusal, or an acquire or renewal event): a lease that
//! was released or expired unseen is free by then. A wait of zero asks once.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::change::ChangeEvent;
use crate::io::{EffectId, RequestOutcome, Transmit, lease_call};
use crate::wire::{AcquireReply, AcquireRequest, Endpoint, Request, Response};

/// What a [`WaitingAcquire`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitingAcquireEvent {
    /// Another holder has the key: waiting for it.
    Refused(AcquireReply),
    /// Over: granted, or the last refusal once the wait ran out.
    Done(AcquireReply),
    /// Over: the acquire got no usable answer (no reply in time, no service, an
    /// error reply); the outcome, for the adapter to report.
    Failed(RequestOutcome),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The acquire `id` is out until `due`.
    Asking {
        id: EffectId,
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
    deadline: Instant,
    phase: Phase,
    last: Option<AcquireReply>,
    next_id: u64,
    transmits: VecDeque<Transmit>,
    events: VecDeque<WaitingAcquireEvent>,
}

impl WaitingAcquire {
    /// Asks for the key at `now`, each acquire bounded by `timeout`, waiting at most
    /// `wait` while another holder has it.
    pub fn new(request: AcquireRequest, timeout: Duration, wait: Duration, now: Instant) -> Self {
        let mut w = Self {
            request,
            timeout,
            deadline: now + wait,
            phase: Phase::Done,
            last: None,
            next_id: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        };
        w.ask(now);
        w
    }

    fn ask(&mut self, now: Instant) {
        self.next_id += 1;
        let id = EffectId(self.next_id);
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
    pub fn handle_outcome(&mut self, now: Instant, id: EffectId, outcome: RequestOutcome) {
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
        self.events.push_back(WaitingAcquireEvent::Refused(reply));
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

    /// The acquire out past its timeout fails; the wait past its end ends with the
    /// last refusal; the TTL fallback asks again.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
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

    /// A refusal waited on, or the end.
    pub fn poll_event(&mut self) -> Option<WaitingAcquireEvent> {
        self.events.pop_front()
    }

    /// The acquire's deadline, or the next of the wait's end and the TTL fallback.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
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
