//! The serve loop's IO around the core's [`Service`] machine: it subscribes,
//! receives, sends the machine's requests and drops the ones it cancels, hands its
//! replies to the client, flushes, arms its one timer and records its metric and
//! log events. Every decision is the machine's.

use std::sync::Arc;
use std::time::Instant;

use async_nats::{Client, Message, Subscriber};
use dagnats_leases_core::RequestOutcome;
use dagnats_leases_core::call::KvFact;
use dagnats_leases_core::health::LogLevel;
use dagnats_leases_core::io::TransmitKind;
use dagnats_leases_core::io::{Mode, TransmitId};
use dagnats_leases_core::proto::Delivered;
use dagnats_leases_core::service::shutdown::StopPhase;
use dagnats_leases_core::service::{
    Arrivals, Received, ReplyId, Service, ServiceEvent, SubscriptionKind,
};
use dagnats_leases_core::subjects::QUEUE_GROUP;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, SelectAll};
use futures::{FutureExt as _, StreamExt};
use metrics::counter;
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::cancellable::Cancellable;
use crate::intake;
use crate::nats_request;
use crate::runtime::{self, Runtime};
use crate::strict::{StrictClient, Subscription};
use crate::telemetry;
use crate::{Error, ErrorKind as ServiceErrorKind};

/// The serve loop's IO around the [`Service`] machine: the subscriptions, the
/// requests out, the replies being handed to the client, the stop's waits, and the
/// one timer.
pub(super) struct Io {
    runtime: Arc<dyn Runtime>,
    pub(super) serving: StrictClient,
    backend: Client,
    max_payload: usize,
    server: String,
    requests: SelectAll<Subscription>,
    changes: Option<Subscriber>,
    /// The other instances' presence heartbeats, where the machine listens.
    presence: Option<Subscriber>,
    /// The requests out, each until its outcome or the machine's cancel.
    outcomes: FuturesUnordered<BoxFuture<'static, Option<(TransmitId, RequestOutcome)>>>,
    /// How to drop each request out, by id ([`ServiceEvent::Cancel`]).
    cancels: Cancellable<TransmitId>,
    /// The replies being handed to the client, each until it is or the machine
    /// gives it up.
    sending: FuturesUnordered<BoxFuture<'static, Option<ReplyId>>>,
    /// How to drop each reply being handed over ([`ServiceEvent::CancelReply`]).
    reply_cancels: Cancellable<ReplyId>,
    timer: Option<(Instant, runtime::Sleep)>,
    /// Stopping: the subscriptions are being drained; the intake is open.
    intake_open: bool,
    unsubscribe: bool,
    /// Stopping: the flush asked for next, and the one under way (each with the
    /// stop phase it was asked in).
    flush_wanted: Option<StopPhase>,
    flushing: Option<BoxFuture<'static, StopPhase>>,
    stopping: bool,
    /// How many connections are down, changes notified (readiness).
    pub(super) links_down: Option<watch::Receiver<u32>>,
}

impl Io {
    pub(super) fn new(
        runtime: Arc<dyn Runtime>,
        serving: StrictClient,
        backend: Client,
        max_payload: usize,
        server: String,
    ) -> Self {
        Self {
            runtime,
            serving,
            backend,
            max_payload,
            server,
            requests: SelectAll::new(),
            changes: None,
            presence: None,
            outcomes: FuturesUnordered::new(),
            cancels: Cancellable::new(),
            sending: FuturesUnordered::new(),
            reply_cancels: Cancellable::new(),
            timer: None,
            intake_open: true,
            unsubscribe: false,
            flush_wanted: None,
            flushing: None,
            stopping: false,
            links_down: None,
        }
    }

    /// Waits for one input, feeds it to `service`, and carries out what it says.
    pub(super) async fn step(
        &mut self,
        service: &mut Service,
        stopped: Option<&mut watch::Receiver<bool>>,
    ) -> Result<(), Error> {
        let now = || self.runtime.now();
        if self.unsubscribe {
            // The unsubscribes are queued to the connection, within the stop's
            // bound: a server that is gone must not hold the stop.
            self.unsubscribe = false;
            self.changes = None;
            self.presence = None;
            // The drain phase's bound, not the next deadline of anything (a
            // call's may be a millisecond away and cut the unsubscribes short).
            let deadline = service.stop_phase_ends().unwrap_or_else(now);
            let _ =
                runtime::until(&*self.runtime, deadline, intake::drain(&mut self.requests)).await;
        }
        if self.flushing.is_none()
            && let Some(phase) = self.flush_wanted.take()
        {
            let serving = self.serving.clone();
            self.flushing = Some(Box::pin(async move {
                // A flush waits until the client's writes are on the socket: for
                // ever while the client reconnects to a server that is gone, as long
                // as the socket is full. The machine's timer bounds it.
                let _ = serving.flush().await;
                phase
            }));
        }
        let at = service.poll_timeout();
        if self.timer.as_ref().map(|(t, _)| *t) != at {
            self.timer = at.map(|at| (at, self.runtime.sleep_until(at)));
        }
        let timer = async {
            match &mut self.timer {
                Some((at, sleep)) => {
                    sleep.await;
                    *at
                }
                None => std::future::pending().await,
            }
        };
        let stop_signal = async {
            match stopped {
                Some(s) if !self.stopping => {
                    let _ = s.changed().await;
                }
                _ => std::future::pending().await,
            }
        };
        let flushing = async {
            match &mut self.flushing {
                Some(f) => f.await,
                None => std::future::pending().await,
            }
        };
        let links = async {
            let Some(links) = &mut self.links_down else {
                return std::future::pending().await;
            };
            // The counter gone (its connections dropped): nothing more to hear.
            if links.changed().await.is_err() {
                return std::future::pending().await;
            }
            *links.borrow_and_update() == 0
        };
        tokio::select! {
            connected = links => service.handle_connection(self.runtime.now(), connected),
            Some(m) = async { self.changes.as_mut().expect("guarded").next().await }, if self.changes.is_some() => {
                let mut changes = vec![received(m)];
                changes.extend(self.changes_ready());
                service.handle_arrivals(self.runtime.now(), OffsetDateTime::now_utc(), Arrivals::changes(changes));
            }
            Some(m) = async { self.presence.as_mut().expect("guarded").next().await }, if self.presence.is_some() => {
                service.handle_presence(self.runtime.now(), &m.payload);
            }
            next = self.requests.next(), if self.intake_open => match next {
                // With the change events already delivered: the machine orders them.
                Some(m) => {
                    let arrivals = Arrivals::request(delivered(m), self.changes_ready());
                    service.handle_arrivals(self.runtime.now(), OffsetDateTime::now_utc(), arrivals);
                }
                None => {
                    self.intake_open = false;
                    service.handle_intake_closed(self.runtime.now());
                }
            },
            Some(answered) = self.outcomes.next(), if !self.outcomes.is_empty() => {
                // `None`: cancelled, nothing to feed.
                if let Some((id, outcome)) = answered {
                    self.cancels.finished(&id);
                    service.handle_outcome(self.runtime.now(), id, outcome);
                }
            }
            Some(sent) = self.sending.next(), if !self.sending.is_empty() => {
                // `None`: given up, the machine knows.
                if let Some(id) = sent {
                    self.reply_cancels.finished(&id);
                    service.handle_reply_sent(self.runtime.now(), id);
                }
            }
            phase = flushing => {
                self.flushing = None;
                service.handle_flushed(self.runtime.now(), phase);
            }
            at = timer => {
                self.timer = None;
                // The timer fired: at its instant, even if the clock reads a hair before.
                service.handle_timeout(self.runtime.now().max(at));
            }
            () = stop_signal => {
                self.stopping = true;
                service.handle_stop(self.runtime.now());
            }
        }
        self.drain(service).await
    }

    /// The change events delivered and not yet taken, without waiting.
    fn changes_ready(&mut self) -> Vec<Received> {
        let mut ready = Vec::new();
        while let Some(Some(m)) = self.changes.as_mut().and_then(|c| c.next().now_or_never()) {
            ready.push(received(m));
        }
        ready
    }

    /// Carries out every output of `service`.
    pub(super) async fn drain(&mut self, service: &mut Service) -> Result<(), Error> {
        while let Some(t) = service.poll_transmit() {
            let id = t.id;
            if t.kind == TransmitKind::Inbox {
                // A forward: what an owner writes back comes on the strict
                // connection, so a malformed reply fails only this request.
                let serving = self.serving.clone();
                let request = t.request;
                let send = self.cancels.start(id, async move {
                    let headers = request
                        .headers
                        .iter()
                        .map(|(n, v)| (n.to_string(), v.clone()))
                        .collect();
                    let outcome = serving
                        .request(request.subject, headers, request.payload)
                        .await;
                    (id, outcome)
                });
                self.outcomes.push(send);
                continue;
            }
            let client = self.backend.clone();
            let send = self.cancels.start(id, async move {
                for m in t.publish {
                    // A message lost here leaves a gap: the commit is answered
                    // `incomplete` and the writes go single.
                    let headers = nats_request::header_map(&m.headers);
                    let _ = client
                        .publish_with_headers(m.subject, headers, m.payload.into())
                        .await;
                }
                // Untimed: the machine keeps every deadline and cancels what it
                // gives up on (a silent owner, a deposed stream leader).
                (t.id, nats_request::send_untimed(&client, t.request).await)
            });
            self.outcomes.push(send);
        }
        while let Some(event) = service.poll_event() {
            self.record(service, event).await?;
        }
        Ok(())
    }

    /// Does or records one event; what came of a subscription goes back to
    /// `service`.
    pub(super) async fn record(
        &mut self,
        service: &mut Service,
        event: ServiceEvent,
    ) -> Result<(), Error> {
        match event {
            ServiceEvent::Subscribe {
                subject,
                queue,
                kind,
            } => {
                let subscribed = match (kind, queue) {
                    (SubscriptionKind::Changes | SubscriptionKind::Presence, _) => {
                        self.backend.subscribe(subject.clone()).await
                    }
                    (_, queue) => {
                        match self
                            .serving
                            .subscribe(subject.clone(), queue.map(str::to_string))
                            .await
                        {
                            Ok(s) => {
                                self.requests.push(s);
                                return Ok(());
                            }
                            Err(e) => {
                                service.handle_subscribe_failed(
                                    self.runtime.now(),
                                    kind,
                                    &subject,
                                    &e.to_string(),
                                );
                                return Ok(());
                            }
                        }
                    }
                };
                match (subscribed, kind) {
                    (Ok(s), SubscriptionKind::Presence) => self.presence = Some(s),
                    (Ok(s), _) => self.changes = Some(s),
                    (Err(e), kind) => service.handle_subscribe_failed(
                        self.runtime.now(),
                        kind,
                        &subject,
                        &e.to_string(),
                    ),
                }
            }
            ServiceEvent::Fatal(why) => return Err(Error::new(ServiceErrorKind::Nats, why)),
            ServiceEvent::Reply {
                id,
                to,
                body,
                calls,
            } => {
                for a in calls {
                    telemetry::call_answered(a.endpoint, &a.response, a.took);
                }
                let serving = self.serving.clone();
                let send = self.reply_cancels.start(id, async move {
                    intake::reply(&serving, to, body).await;
                    id
                });
                self.sending.push(send);
            }
            ServiceEvent::CancelReply { id } => self.reply_cancels.cancel(&id),
            ServiceEvent::StartRefused(why) => {
                return Err(Error::new(ServiceErrorKind::Config, why));
            }
            ServiceEvent::Starting => telemetry::set_mode(Mode::Starting),
            ServiceEvent::Serving(s) => {
                telemetry::set_mode(s.mode);
                tracing::info!(
                    mode = ?s.mode,
                    replicas = s.replicas,
                    confirm_reads = s.confirm_reads,
                    atomic_batches = s.atomic_batches,
                    max_payload = self.max_payload,
                    server = %self.server,
                    "serving api.leases.* (a tenant's as api.leases.<account>.*) in queue group {QUEUE_GROUP}"
                )
            }
            ServiceEvent::Overloaded { endpoint } => telemetry::overloaded(endpoint),
            ServiceEvent::Dropped {
                source,
                reason,
                log,
            } => {
                telemetry::dropped(source.label(), reason);
                if let Some(log) = log {
                    tracing::warn!(
                        subject = %log.subject,
                        reply = ?log.reply,
                        reason = reason.as_str(),
                        "dropped {} request(s) unanswered: a reply goes only to a reply inbox ({})",
                        log.dropped,
                        log.prefixes
                    );
                }
            }
            ServiceEvent::Kv(fact) => kv_metric(fact),
            ServiceEvent::Cancel { id } => self.cancels.cancel(&id),
            ServiceEvent::ConfirmReads { replicas, on } => tracing::info!(
                replicas,
                confirm_reads = on,
                "the leases stream's replicas changed"
            ),
            ServiceEvent::BucketRefused(why) => tracing::error!(
                "refusing the leases bucket, every call is answered unavailable until the \
                 service is restarted after the restore procedure (docs/operations.md, \
                 \"Backup and restore\"): {why}"
            ),
            ServiceEvent::StreamSequence { stream, last_seq } => {
                metrics::gauge!(telemetry::STREAM_LAST_SEQ, "stream" => stream).set(last_seq as f64)
            }
            ServiceEvent::Health(health) => {
                telemetry::set_health(&health);
                match &health.ready {
                    Ok(()) => tracing::info!("ready"),
                    Err(why) => tracing::info!("not ready: {why}"),
                }
            }
            ServiceEvent::StreamReplaced => tracing::warn!(
                "the leases stream is gone or was made anew: forgetting the revisions known"
            ),
            ServiceEvent::TombstoneLeft {
                reason,
                key,
                detail,
            } => {
                telemetry::tombstone_left(reason);
                tracing::debug!(key, "{detail}");
            }
            ServiceEvent::Log { level, line } => match level {
                LogLevel::Info => tracing::info!("{line}"),
                LogLevel::Warn => tracing::warn!("{line}"),
                LogLevel::Debug => tracing::debug!("{line}"),
                LogLevel::Error => tracing::error!("{line}"),
            },
            ServiceEvent::Unsubscribe => self.unsubscribe = true,
            // Dropped, the subscription is unsubscribed.
            ServiceEvent::UnsubscribeChanges => self.changes = None,
            ServiceEvent::Announce { subject, body } => {
                // A heartbeat lost is one a peer misses: the next one comes.
                let _ = self.backend.publish(subject, body.into()).await;
            }
            // Asked once every reply is handed to the client: the flush carries them.
            ServiceEvent::Flush { phase } => self.flush_wanted = Some(phase),
        }
        Ok(())
    }
}

/// A message as the core reads it.
fn received(m: Message) -> Received {
    Received {
        subject: m.subject.to_string(),
        reply: m.reply.map(|r| r.to_string()),
        headers: crate::nats_request::header_pairs(m.headers.as_ref()),
        payload: m.payload.to_vec(),
        header_error: None,
    }
}

/// A message of the strict connection as the core reads it: a malformed header
/// block is passed on as its error, none of its headers read.
fn delivered(m: Delivered) -> Received {
    let (headers, header_error) = match m.headers {
        Ok(h) => (h.pairs, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Received {
        subject: m.subject,
        reply: m.reply,
        headers,
        payload: m.payload,
        header_error,
    }
}

/// Counts a fact about a call's JetStream request.
fn kv_metric(fact: KvFact) {
    match fact {
        KvFact::ConfirmSent => counter!(telemetry::READ_CONFIRMATIONS).increment(1),
        KvFact::ConfirmRetry => counter!(telemetry::READ_CONFIRMATION_RETRIES).increment(1),
        KvFact::Error { op, kind } => {
            counter!(telemetry::JETSTREAM_ERRORS, "op" => op.name(), "kind" => kind).increment(1)
        }
    }
}

#[cfg(all(test, feature = "cli"))]
mod tests {
    use super::*;
    use dagnats_leases_core::call::KvOp;
    use metrics_exporter_prometheus::PrometheusBuilder;

    #[test]
    fn each_kv_fact_moves_its_counter() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            kv_metric(KvFact::ConfirmSent);
            kv_metric(KvFact::ConfirmRetry);
            kv_metric(KvFact::Error {
                op: KvOp::Read,
                kind: "timed_out",
            });
        });
        let text = handle.render();
        for line in [
            format!("{} 1", telemetry::READ_CONFIRMATIONS),
            format!("{} 1", telemetry::READ_CONFIRMATION_RETRIES),
            format!(
                r#"{}{{op="read",kind="timed_out"}} 1"#,
                telemetry::JETSTREAM_ERRORS
            ),
        ] {
            assert!(text.contains(&line), "{line}: {text}");
        }
    }
}
