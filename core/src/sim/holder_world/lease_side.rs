//! The holder world's lease side: the nodes' requests reach the [`Service`] (one
//! instance, or one drawn from its queue group) as its subscription would deliver
//! them, its requests reach the simulated stream over the world's network (late,
//! their acks sometimes lost), the stream's change events reach every instance
//! that subscribed to them, and its replies go back to the nodes. Each instance
//! feeds its known map itself: the world only delivers.
//!
//! [`Service`]: crate::service::Service

use std::time::Duration;

use super::{Ev, HolderWorld, Instance};
use crate::io::RequestOutcome;
use crate::service::peers::ChangesSetting;
use crate::service::{Received, ServiceConfig, ServiceEvent, SubscriptionKind};
use crate::sim::server::{republished, started};
use crate::wire::{ErrorKind, ErrorReply, RenewManyReply, RenewManyResult, Response};

/// The service of a holder world: the simulated server's version and payload
/// bound, a stop that cuts its calls off at once, its known map on or off, and
/// its change events taken always or as the heartbeats it hears decide.
fn service_config(known: bool, presence: bool) -> ServiceConfig {
    let mut config = ServiceConfig::new("2.14.0", 1 << 20);
    config.shutdown_timeout = Duration::ZERO;
    config.known_capacity = if known { 1024 } else { 0 };
    config.changes = match presence {
        true => ChangesSetting::Auto,
        false => ChangesSetting::Always,
    };
    config
}

impl HolderWorld {
    /// Carries out an event of the lease side, then sends what the instance it
    /// reached wants.
    pub(super) fn apply_service(&mut self, ev: Ev) {
        let (now, wall) = (self.service_now(), self.js.wall());
        let i = match ev {
            Ev::Arrive(h, generation, request) => {
                // Drawn only with several instances, so one-instance worlds
                // replay as before.
                let i = match self.instances.len() {
                    1 => 0,
                    n => self.rng.below(n as u64) as usize,
                };
                self.next_inbox += 1;
                let inbox = format!("_INBOX.h{h}.{}", self.next_inbox);
                let asked = (h, generation, request.id, request.endpoint);
                self.inboxes.insert(inbox.clone(), asked);
                // A member's batch of renewals goes to `renew_many`.
                let subject = match crate::wire::decode_renew_many(&request.body) {
                    Ok(items) if request.body.starts_with(b"{\"leases\":") => {
                        self.stats.batches += 1;
                        self.stats.batched_renewals += items.len() as u64;
                        crate::wire::renew_many_subject()
                    }
                    _ => request.endpoint.subject(),
                };
                let message = Received {
                    subject,
                    reply: Some(inbox),
                    headers: Vec::new(),
                    payload: request.body,
                    header_error: None,
                };
                self.instances[i].service.handle_request(now, wall, message);
                Some(i)
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
                // The instance that sent it may be gone: its write may have landed.
                let i = self.instance(generation);
                match i {
                    Some(i) if abort => self.stop_instance(i),
                    Some(i) => self.instances[i]
                        .service
                        .handle_outcome(now, transmit.id, outcome),
                    None => {}
                }
                i
            }
            Ev::ServiceWake(generation) => {
                let i = self.instance(generation);
                if let Some(i) = i {
                    let instance = &mut self.instances[i];
                    instance.wakes.remove(&self.t);
                    if instance.service.poll_timeout().is_some_and(|at| at <= now) {
                        instance.service.handle_timeout(now);
                    }
                }
                i
            }
            Ev::ServiceChange(generation, message) => {
                let i = self.instance(generation);
                if let Some(i) = i {
                    self.stats.service_changes += 1;
                    self.instances[i].service.handle_request(now, wall, message);
                }
                i
            }
            Ev::ServicePresence(generation, body) => {
                let i = self.instance(generation);
                if let Some(i) = i {
                    self.instances[i].service.handle_presence(now, &body);
                }
                i
            }
            _ => unreachable!("a node's event"),
        };
        if let Some(i) = i {
            self.drain_service(i);
        }
    }

    /// The instance of `generation`, if it still serves.
    fn instance(&self, generation: u64) -> Option<usize> {
        self.instances
            .iter()
            .position(|s| s.generation == generation)
    }

    /// Sends what instance `i` wants: its requests onto the network, its replies
    /// back to the nodes (handed to the client at once), a stop's waits carried
    /// out; then re-arms its timer.
    fn drain_service(&mut self, i: usize) {
        self.drain_service_outputs(i);
        let instance = &mut self.instances[i];
        if let Some(at) = instance.service.poll_timeout() {
            let ms = at
                .saturating_duration_since(self.base)
                .as_nanos()
                .div_ceil(1_000_000);
            let t = (ms as u64).max(self.t + 1);
            if instance.wakes.insert(t) {
                let generation = instance.generation;
                self.schedule(t, Ev::ServiceWake(generation));
            }
        }
    }

    fn drain_service_outputs(&mut self, i: usize) {
        loop {
            let mut moved = false;
            while let Some(t) = self.instances[i].service.poll_transmit() {
                moved = true;
                let subject = t.request.subject.as_str();
                if subject.starts_with("$JS.API.STREAM.MSG.GET.") {
                    self.stats.service_reads += 1;
                } else if subject.starts_with("$KV.") {
                    self.stats.service_writes += 1;
                }
                let at = self.t + self.latency();
                let generation = self.instances[i].generation;
                self.schedule(at, Ev::Step(generation, t));
            }
            while let Some(event) = self.instances[i].service.poll_event() {
                moved = true;
                self.service_event(i, event);
            }
            if !moved {
                break;
            }
        }
    }

    fn service_event(&mut self, i: usize, event: ServiceEvent) {
        let now = self.service_now();
        let service = &mut self.instances[i].service;
        match event {
            ServiceEvent::Reply { id, to, body, .. } => {
                service.handle_reply_sent(now, id);
                self.reply(&to, body);
            }
            ServiceEvent::Subscribe {
                kind: kind @ SubscriptionKind::Changes,
                subject,
                ..
            } => match self.changes_denied {
                true => {
                    service.handle_subscribe_failed(now, kind, &subject, "permissions violation")
                }
                false => self.instances[i].hears_changes = true,
            },
            ServiceEvent::Subscribe {
                kind: SubscriptionKind::Presence,
                ..
            } => self.instances[i].hears_presence = true,
            // Events stored from now on are not sent to it.
            ServiceEvent::UnsubscribeChanges => self.instances[i].hears_changes = false,
            // To every instance that listens (its own echoed back to it), each
            // after its own latency.
            ServiceEvent::Announce { body, .. } => {
                for j in 0..self.instances.len() {
                    if self.instances[j].hears_presence {
                        let at = self.t + self.latency();
                        let generation = self.instances[j].generation;
                        self.schedule(at, Ev::ServicePresence(generation, body.clone()));
                    }
                }
            }
            ServiceEvent::Unsubscribe => service.handle_intake_closed(now),
            ServiceEvent::Flush { phase } => service.handle_flushed(now, phase),
            _ => {}
        }
    }

    /// The service's reply to `to` goes back to the node that asked (unless lost).
    fn reply(&mut self, to: &str, body: Vec<u8>) {
        let Some((h, generation, id, endpoint)) = self.inboxes.remove(to) else {
            return;
        };
        let internal = |e: &ErrorReply| e.kind == ErrorKind::Internal;
        self.stats.internal_replies += match RenewManyReply::decode(&body) {
            // A batch's reply: each item's internal error counts as a renew's.
            Ok(Ok(many)) => many
                .results
                .iter()
                .filter(|r| matches!(r, RenewManyResult::Failed { error, .. } if internal(error)))
                .count() as u64,
            _ => u64::from(matches!(
                Response::decode(endpoint, &body),
                Ok(Response::Error(e)) if internal(&e)
            )),
        };
        if !self.rng.chance(self.p.loss_percent) {
            let at = self.t + self.latency();
            let outcome = RequestOutcome::reply(body);
            self.schedule(at, Ev::Outcome(h, generation, id, outcome));
        }
    }

    /// Instance `i` stops mid-call: every call it runs is cut off at once and
    /// answers `internal` (a write it sent may have landed), and a fresh instance
    /// (its known map empty) takes its place in the queue group.
    fn stop_instance(&mut self, i: usize) {
        let now = self.service_now();
        self.instances[i].service.handle_stop(now);
        for _ in 0..64 {
            let service = &mut self.instances[i].service;
            if service.poll_timeout().is_some_and(|at| at <= now) {
                service.handle_timeout(now);
            }
            self.drain_service_outputs(i);
            if self.instances[i].service.is_done() {
                break;
            }
        }
        assert!(
            self.instances[i].service.is_done(),
            "the stop did not end at once"
        );
        self.start_instance(i);
    }

    /// `n` fresh instances serve from now on.
    pub(super) fn start_instances(&mut self, n: usize) {
        self.instances.truncate(n);
        for i in 0..n {
            self.start_instance(i);
        }
    }

    /// A fresh instance `i` (one more, if `i` is the count) serves from now on;
    /// it hears the change events stored from now on.
    fn start_instance(&mut self, i: usize) {
        let mut config = service_config(self.known, self.presence);
        if self.presence {
            // Each its own id, as each process has: an instance ignores its own.
            config.instance_id = format!("service{}", self.service_gen + 1);
        }
        let now = self.service_now();
        let (service, events) = started(config, &mut self.js, &self.admin, now);
        self.service_gen += 1;
        let instance = Instance {
            service,
            generation: self.service_gen,
            wakes: Default::default(),
            hears_changes: false,
            changes_read: self.js.log.len(),
            hears_presence: false,
        };
        if i < self.instances.len() {
            self.instances[i] = instance;
        } else {
            self.instances.push(instance);
        }
        for event in events {
            self.service_event(i, event);
        }
        self.drain_service(i);
    }

    /// Change events for what the stream stored since the last call, to each
    /// instance that subscribed to them, each after its own latency.
    pub(super) fn publish_service_changes(&mut self) {
        for i in 0..self.instances.len() {
            let from = self.instances[i].changes_read;
            self.instances[i].changes_read = self.js.log.len();
            if !self.instances[i].hears_changes {
                continue;
            }
            let new: Vec<Received> = self.js.log[from..]
                .iter()
                .map(|m| republished(self.js.epoch, m))
                .collect();
            let generation = self.instances[i].generation;
            for message in new {
                let at = self.t + self.latency();
                self.schedule(at, Ev::ServiceChange(generation, message));
            }
        }
    }
}
