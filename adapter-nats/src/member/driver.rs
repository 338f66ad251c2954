//! The one driver task of a member: sends what the campaign wants, subscribes,
//! rejects and cancels as its events say, feeds back outcomes, change events, inbox
//! messages and the hand-offs done, records the metrics the events carry, and
//! sleeps until the machine's next deadline: the one timer it arms. Every command
//! runs in the background, its bound the machine's. What each listener hears of
//! a holder event, and when the driver ends, is the core's
//! ([`dagnats_leases_core::holder::relay`]). Every branch here is IO.

use super::*;
use crate::cancellable::Cancellable;
use dagnats_leases_core::holder::campaign::renewals_of_batch;

/// A command the client took, for the machine: a subscribe (made, or failed) or a
/// reject.
enum Handoff {
    Watched(String, Option<Subscriber>),
    Rejected(RejectId),
    /// What came of the campaign's `$SRV.INFO` request.
    ServiceInfo(RequestOutcome),
}

/// What came of a request, for the machine.
struct Answer {
    id: TransmitId,
    outcome: RequestOutcome,
}

type Pending = FuturesUnordered<BoxFuture<'static, Answer>>;
/// A subscribe or a reject handed to the client, until done (`None`: dropped, as
/// the machine said).
type Handoffs = FuturesUnordered<BoxFuture<'static, Option<Handoff>>>;
type Feed<T> = SelectAll<Pin<Box<dyn futures::Stream<Item = T> + Send>>>;

/// The one driver loop of a member: sends what the machine wants, feeds back what
/// comes of it, change events and inbox messages, and wakes at its next deadline.
pub(super) async fn drive(shared: Arc<Shared>) {
    let mut pending = Pending::new();
    let mut changes: Feed<(String, Message)> = SelectAll::new();
    // Dropping a key's sender ends its change-event stream (and unsubscribes).
    let mut subscribed: BTreeMap<String, oneshot::Sender<()>> = BTreeMap::new();
    let mut inbox_msgs: Feed<(usize, Message)> = SelectAll::new();
    let mut inboxes: Vec<(mpsc::UnboundedSender<ForwardedRequest>, Arc<AtomicU64>)> = Vec::new();
    // A request in flight ends when its sender is dropped: the campaign cancelled it.
    let mut in_flight: BTreeMap<TransmitId, oneshot::Sender<()>> = BTreeMap::new();
    let mut handoffs = Handoffs::new();
    // How to drop each subscribe and reject under way, as the machine says.
    let mut subscribing: Cancellable<String> = Cancellable::new();
    let mut rejecting: Cancellable<RejectId> = Cancellable::new();
    loop {
        let (requests, events, wake, new_inboxes, member_alive) = {
            let mut state = shared.lock();
            let campaign = &mut state.campaign;
            // Whether the service takes renewals in one request is the campaign's to
            // ask and read; sent timed on the member's runtime, not async-nats'
            // tokio timer: on smol there is no tokio reactor to arm it.
            if let Some(info) = campaign.poll_service_info() {
                let (nats, runtime) = (
                    shared.settings.nats.clone(),
                    shared.settings.runtime.clone(),
                );
                handoffs.push(Box::pin(async move {
                    let outcome = crate::nats_request::send(&*runtime, &nats, info).await;
                    Some(Handoff::ServiceInfo(outcome))
                }));
            }
            let requests: Vec<CampaignTransmit> =
                std::iter::from_fn(|| campaign.poll_transmit()).collect();
            let events: Vec<CampaignEvent> =
                std::iter::from_fn(|| state.campaign.poll_event()).collect();
            (
                requests,
                events,
                state.campaign.poll_timeout(),
                std::mem::take(&mut state.inboxes),
                state.member_alive,
            )
        };
        for request in requests {
            let (give_up, given_up) = oneshot::channel();
            in_flight.insert(request.transmit.id, give_up);
            pending.push(send(&shared, request, given_up));
        }
        let mut others = Vec::new();
        for event in events {
            match event {
                CampaignEvent::Watch { key } => {
                    // Untimed: the machine gives it up (CancelWatch).
                    let nats = shared.settings.nats.clone();
                    let subject = changed_subject(&key);
                    let watched = key.clone();
                    handoffs.push(subscribing.start(key, async move {
                        Handoff::Watched(watched, nats.subscribe(subject).await.ok())
                    }));
                }
                CampaignEvent::CancelWatch { key } => subscribing.cancel(&key),
                CampaignEvent::Unwatch { key } => {
                    subscribing.cancel(&key);
                    subscribed.remove(&key);
                }
                CampaignEvent::Reject { id, to } => {
                    let nats = shared.settings.nats.clone();
                    let (name, value) = RejectReason::reply_header();
                    let mut headers = HeaderMap::new();
                    headers.insert(name, value);
                    handoffs.push(rejecting.start(id, async move {
                        let empty = bytes::Bytes::new();
                        if let Err(e) = nats.publish_with_headers(to, headers, empty).await {
                            tracing::debug!("reject not sent: {e}");
                        }
                        Handoff::Rejected(id)
                    }));
                }
                CampaignEvent::CancelReject { id } => rejecting.cancel(&id),
                CampaignEvent::Cancel { id } => {
                    in_flight.remove(&id);
                }
                other => others.push(other),
            }
        }
        dispatch(&shared, others);
        for feed in new_inboxes {
            let n = inboxes.len();
            inboxes.push((feed.accepted, feed.rejected));
            inbox_msgs.push(Box::pin(feed.subscriber.map(move |m| (n, m))));
        }
        let inbox_open = inboxes.iter().any(|(tx, _)| !tx.is_closed());
        let end =
            shared
                .lock()
                .campaign
                .driver_may_end(member_alive, !pending.is_empty(), inbox_open);
        if end {
            break;
        }
        let sleep = async {
            match wake {
                Some(at) => shared.settings.runtime.sleep_until(at).await,
                None => futures::future::pending().await,
            }
        };
        tokio::select! {
            Some(answer) = pending.next(), if !pending.is_empty() => {
                in_flight.remove(&answer.id);
                shared.lock().campaign.handle_outcome(shared.settings.runtime.now(), answer.id, answer.outcome);
            }
            Some((key, message)) = changes.next(), if !changes.is_empty() => {
                let event = change_event(&message);
                shared.lock().campaign.handle_change(shared.settings.runtime.now(), &key, &event);
            }
            Some((n, message)) = inbox_msgs.next(), if !inbox_msgs.is_empty() => {
                let (accepted, rejected) = &inboxes[n];
                receive(&shared, accepted, rejected, message);
            }
            Some(done) = handoffs.next(), if !handoffs.is_empty() => {
                let now = shared.settings.runtime.now();
                match done {
                    // Dropped: the machine gave it up, or no longer wants it.
                    None => {}
                    Some(Handoff::Watched(key, subscriber)) => {
                        subscribing.finished(&key);
                        // A failed subscribe only loses the early wake-up.
                        if let Some(sub) = subscriber {
                            let (stop, stopped) = oneshot::channel();
                            subscribed.insert(key.clone(), stop);
                            let watched = key.clone();
                            changes.push(Box::pin(
                                sub.map(move |m| (watched.clone(), m)).take_until(stopped),
                            ));
                        }
                        shared.lock().campaign.handle_watched(now, &key);
                    }
                    Some(Handoff::Rejected(id)) => {
                        rejecting.finished(&id);
                        shared.lock().campaign.handle_reject_sent(now, id);
                    }
                    Some(Handoff::ServiceInfo(outcome)) => {
                        shared.lock().campaign.handle_service_info_outcome(&outcome);
                    }
                }
            }
            _ = sleep => {
                shared.lock().campaign.handle_timeout(shared.settings.runtime.now());
            }
            _ = shared.wake.notified() => {}
        }
    }
}

/// Passes the machine's holder events and group ends on, and records what it
/// measured ([`telemetry`]).
fn dispatch(shared: &Shared, events: Vec<CampaignEvent>) {
    if events.is_empty() {
        return;
    }
    let now = shared.settings.runtime.now();
    if let Some(o) = &shared.settings.observer {
        for event in &events {
            if let CampaignEvent::Holder { key, event, .. } = event {
                o.event(key, event, now);
            }
        }
    }
    let mut state = shared.lock();
    // The application hears of a change after this batch's metrics are recorded,
    // so the leader gauge never lags what the application was told.
    let mut told = Vec::new();
    for event in events {
        match event {
            CampaignEvent::Holder { group, key, event } => {
                let heard = Heard::of(event);
                match &heard {
                    Heard::SteppedDown { reason } => telemetry::stepped_down(reason),
                    Heard::Failed { kind, message } => {
                        tracing::error!(key, %kind, message, "the lease service refused this holder");
                    }
                    _ => {}
                }
                if let Some(outlet) = state.outlets.get(&group)
                    && let Some(heard) = heard.for_listener(shared.settings.listener)
                {
                    told.push(Told::Change(outlet.changes.clone(), key, heard));
                }
            }
            CampaignEvent::Finished { group } => {
                if let Some(outlet) = state.outlets.remove(&group) {
                    told.push(Told::Finished(outlet.finished));
                }
            }
            CampaignEvent::Leading { key, owns } => telemetry::leading(&key, owns),
            CampaignEvent::ElectedAfter { after, .. } => telemetry::elected(after),
            CampaignEvent::Answered(answered) => telemetry::holder_answered(&answered),
            // The driver subscribes, unsubscribes, rejects and cancels itself.
            CampaignEvent::Watch { .. }
            | CampaignEvent::CancelWatch { .. }
            | CampaignEvent::Unwatch { .. }
            | CampaignEvent::Reject { .. }
            | CampaignEvent::CancelReject { .. }
            | CampaignEvent::Cancel { .. } => {}
        }
    }
    drop(state);
    for t in told {
        match t {
            Told::Change(to, key, heard) => {
                let _ = to.send((key, heard));
            }
            Told::Finished(waiting) => {
                for f in waiting {
                    let _ = f.send(());
                }
            }
        }
    }
}

/// What the application is told of one batch, in order, once its metrics are
/// recorded.
enum Told {
    /// What its group's listener hears of a key's holder, to the group's stream.
    Change(mpsc::UnboundedSender<(String, Heard)>, String, Heard),
    /// The group's campaign is over: whoever waits for it.
    Finished(Vec<oneshot::Sender<()>>),
}

/// Sends one of the campaign's requests. Its only deadline is the machine's: when
/// the campaign times it out, the driver drops `given_up`'s sender and the request
/// ends `TimedOut` (for the observer; the machine has moved on).
fn send(
    shared: &Arc<Shared>,
    request: CampaignTransmit,
    given_up: oneshot::Receiver<()>,
) -> BoxFuture<'static, Answer> {
    let nats = shared.settings.nats.clone();
    let observer = shared.settings.observer.clone();
    let runtime = shared.settings.runtime.clone();
    async move {
        let CampaignTransmit {
            key,
            endpoint,
            transmit,
        } = request;
        let (id, request) = (transmit.id, transmit.request);
        let body = observer.as_ref().map(|_| request.payload.clone());
        let is_batch = request.subject == dagnats_leases_core::wire::renew_many_subject();
        let sent = runtime.now();
        let sending = nats_request::send_untimed(&nats, request);
        let outcome = match futures::future::select(std::pin::pin!(sending), given_up).await {
            futures::future::Either::Left((outcome, _)) => outcome,
            futures::future::Either::Right(_) => RequestOutcome::TimedOut,
        };
        let answered = runtime.now();
        if let (Some(o), Some(body)) = (&observer, &body) {
            if is_batch {
                // Each renewal as its holder heard it, as if it had gone alone.
                for (key, body, outcome) in renewals_of_batch(body, &outcome) {
                    o.request(&ObservedRequest {
                        key: &key,
                        endpoint,
                        body: &body,
                        sent,
                        outcome: &outcome,
                        answered,
                    });
                }
            } else {
                o.request(&ObservedRequest {
                    key: &key,
                    endpoint,
                    body,
                    sent,
                    outcome: &outcome,
                    answered,
                });
            }
        }
        Answer { id, outcome }
    }
    .boxed()
}

/// One message on the inbox: passed on when the machine accepts it; a rejected one
/// is answered `Dagnats-Lease-Reject: stale` by the machine's
/// [`CampaignEvent::Reject`], and counted here.
fn receive(
    shared: &Shared,
    accepted: &mpsc::UnboundedSender<ForwardedRequest>,
    rejected: &AtomicU64,
    message: Message,
) {
    let fence = message
        .headers
        .as_ref()
        .and_then(|h| h.get(HDR_FENCE))
        .map(|v| v.as_str().to_string());
    let verdict = shared.lock().campaign.handle_inbox(
        shared.settings.runtime.now(),
        message.subject.as_str(),
        message.reply.as_ref().map(|r| r.as_str()),
        fence.as_deref(),
        !accepted.is_closed(),
    );
    match verdict {
        InboxVerdict::Deliver(ok) => {
            let _ = accepted.send(ForwardedRequest {
                key: ok.key,
                fence: ok.fence,
                payload: message.payload.to_vec(),
                reply: message.reply,
                nats: shared.settings.nats.clone(),
            });
        }
        InboxVerdict::Ignore => {}
        InboxVerdict::Reject(reason) => {
            rejected.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(subject = %message.subject, %reason, "forward rejected");
        }
    }
}
