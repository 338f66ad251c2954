//! The holder world's lease side: the nodes' requests reach the [`Service`] as its
//! subscription would deliver them, its requests reach the simulated stream over
//! the world's network (late, their acks sometimes lost), the stream's change
//! events reach it when it subscribed to them, and its replies go back to the
//! nodes. The service feeds its known map itself: the world only delivers.
//!
//! [`Service`]: crate::service::Service

use std::time::Duration;

use super::{Ev, HolderWorld};
use crate::io::RequestOutcome;
use crate::service::{Received, ServiceConfig, ServiceEvent, SubscriptionKind};
use crate::sim::server::{republished, started};
use crate::wire::{ErrorKind, Response};

/// The service of a holder world: the simulated server's version and payload
/// bound, a stop that cuts its calls off at once, and its known map on or off.
pub(super) fn service_config(known: bool) -> ServiceConfig {
    let mut config = ServiceConfig::new("2.14.0", 1 << 20);
    config.shutdown_timeout = Duration::ZERO;
    config.known_capacity = if known { 1024 } else { 0 };
    config
}

impl HolderWorld {
    /// Carries out an event of the lease side, then sends what the service wants.
    pub(super) fn apply_service(&mut self, ev: Ev) {
        let (now, wall) = (self.service_now(), self.js.wall());
        match ev {
            Ev::Arrive(h, generation, request) => {
                self.next_inbox += 1;
                let inbox = format!("_INBOX.h{h}.{}", self.next_inbox);
                let asked = (h, generation, request.id, request.endpoint);
                self.inboxes.insert(inbox.clone(), asked);
                let message = Received {
                    subject: request.endpoint.subject(),
                    reply: Some(inbox),
                    headers: Vec::new(),
                    payload: request.body,
                    header_error: None,
                };
                self.service.handle_request(now, wall, message);
            }
            Ev::Step(generation, transmit) => {
                let mut outcome = self.admin.answer(&mut self.js, &transmit);
                if transmit.request.subject.starts_with("$KV.")
                    && self.rng.chance(self.p.ack_loss_percent)
                {
                    outcome = RequestOutcome::TimedOut;
                }
                // Drawn only when aborts are on, so worlds without them replay as
                // before.
                let abort = self.p.abort_percent > 0 && self.rng.chance(self.p.abort_percent);
                if generation != self.service_gen {
                    // The service that sent it is gone: its write may have landed.
                } else if abort {
                    self.stop_service();
                } else {
                    self.service.handle_outcome(now, transmit.id, outcome);
                }
            }
            Ev::ServiceWake => {
                self.service_wakes.remove(&self.t);
                if self.service.poll_timeout().is_some_and(|at| at <= now) {
                    self.service.handle_timeout(now);
                }
            }
            Ev::ServiceChange(generation, message) => {
                if generation == self.service_gen {
                    self.service.handle_request(now, wall, message);
                }
            }
            _ => unreachable!("a node's event"),
        }
        self.drain_service();
    }

    /// Sends what the service wants: its requests onto the network, its replies
    /// back to the nodes (handed to the client at once), a stop's waits carried
    /// out; then re-arms its timer.
    pub(super) fn drain_service(&mut self) {
        self.drain_service_outputs();
        if let Some(at) = self.service.poll_timeout() {
            let ms = at
                .saturating_duration_since(self.base)
                .as_nanos()
                .div_ceil(1_000_000);
            let t = (ms as u64).max(self.t + 1);
            if self.service_wakes.insert(t) {
                self.schedule(t, Ev::ServiceWake);
            }
        }
    }

    fn drain_service_outputs(&mut self) {
        loop {
            let mut moved = false;
            while let Some(t) = self.service.poll_transmit() {
                moved = true;
                let subject = t.request.subject.as_str();
                if subject.starts_with("$JS.API.STREAM.MSG.GET.") {
                    self.stats.service_reads += 1;
                } else if subject.starts_with("$KV.") {
                    self.stats.service_writes += 1;
                }
                let at = self.t + self.latency();
                self.schedule(at, Ev::Step(self.service_gen, t));
            }
            while let Some(event) = self.service.poll_event() {
                moved = true;
                self.service_event(event);
            }
            if !moved {
                break;
            }
        }
    }

    pub(super) fn service_event(&mut self, event: ServiceEvent) {
        let now = self.service_now();
        match event {
            ServiceEvent::Reply { id, to, body } => {
                self.service.handle_reply_sent(now, id);
                self.reply(&to, body);
            }
            ServiceEvent::Subscribe {
                kind: SubscriptionKind::Changes,
                ..
            } => self.service_hears_changes = true,
            ServiceEvent::Unsubscribe => self.service.handle_intake_closed(now),
            ServiceEvent::Flush { phase } => self.service.handle_flushed(now, phase),
            _ => {}
        }
    }

    /// The service's reply to `to` goes back to the node that asked (unless lost).
    fn reply(&mut self, to: &str, body: Vec<u8>) {
        let Some((h, generation, id, endpoint)) = self.inboxes.remove(to) else {
            return;
        };
        if matches!(
            Response::decode(endpoint, &body),
            Ok(Response::Error(e)) if e.kind == ErrorKind::Internal
        ) {
            self.stats.internal_replies += 1;
        }
        if !self.rng.chance(self.p.loss_percent) {
            let at = self.t + self.latency();
            let outcome = RequestOutcome::reply(body);
            self.schedule(at, Ev::Outcome(h, generation, id, outcome));
        }
    }

    /// The service stops mid-call: every call it runs is cut off at once and
    /// answers `internal` (a write it sent may have landed), and a fresh instance
    /// (its known map empty) serves from now on, as the queue group's other
    /// member would.
    fn stop_service(&mut self) {
        let now = self.service_now();
        self.service.handle_stop(now);
        for _ in 0..64 {
            if self.service.poll_timeout().is_some_and(|at| at <= now) {
                self.service.handle_timeout(now);
            }
            self.drain_service_outputs();
            if self.service.is_done() {
                break;
            }
        }
        assert!(self.service.is_done(), "the stop did not end at once");
        self.replace_service();
    }

    /// A fresh service takes over, serving at once; it hears the change events
    /// stored from now on.
    pub(super) fn replace_service(&mut self) {
        let config = service_config(self.known);
        let now = self.service_now();
        let (service, events) = started(config, &mut self.js, &self.admin, now);
        self.service = service;
        self.service_gen += 1;
        self.service_hears_changes = false;
        self.service_changes_read = self.js.log.len();
        for event in events {
            self.service_event(event);
        }
        self.drain_service();
    }

    /// Change events for what the stream stored since the last call, to the
    /// service if it subscribed to them, each after its own latency.
    pub(super) fn publish_service_changes(&mut self) {
        if !self.service_hears_changes {
            self.service_changes_read = self.js.log.len();
            return;
        }
        let new: Vec<Received> = self.js.log[self.service_changes_read..]
            .iter()
            .map(|m| republished(self.js.epoch, m))
            .collect();
        self.service_changes_read = self.js.log.len();
        for message in new {
            let at = self.t + self.latency();
            self.schedule(at, Ev::ServiceChange(self.service_gen, message));
        }
    }
}
