//! Renewals in one request: where the service advertises `renew_many`
//! ([`Campaign::handle_service_info`]), the renewals ready to send at once go out as
//! one `api.leases.renew_many` request, and its reply is split back into one
//! outcome per key, exactly the reply a renew of that key alone would have had: the
//! holders' rules do not change.
//!
//! - **Never later than a key's own schedule.** A renewal due now pulls in the
//!   owners whose next renewal is due within [`EARLY_WINDOW_DIVISOR`]th of their
//!   TTL: they renew now, earlier than their schedule
//!   (`Holder::renew_early`), never later; one that retries after a failure keeps
//!   its backoff. Renewed together, their schedules stay together.
//! - **A group stays one request of at most [`GROUP_BOUND`].** A request carries at
//!   most that many renewals, and owners are pulled in early, nearest first, only
//!   while the renewals waiting leave room in one: without the bound, groups pulled
//!   each other in until a process's renewals all fell due at one instant, a burst
//!   of several full requests that filled the service's room for calls at once,
//!   where single renewals arrive spread over their schedules.
//! - **One by one where the service cannot.** Batching is off until the service's
//!   `$SRV.INFO` lists `renew_many`: the campaign asks once
//!   ([`Campaign::poll_service_info`], the adapter only sends it and hands back what
//!   came, [`Campaign::handle_service_info_outcome`]); no responders, a timeout or a
//!   failure leave every renewal alone; a `renew_many` answered with no responders (an
//!   older service, or one with it off) or refused whole as `invalid` (no item ran)
//!   turns it off and sends its renewals again one by one at once.
//! - **A whole-request answer is every item's.** `unavailable`, `forbidden` or
//!   `internal` for the request, a timeout or a failure, is what each renewal in it
//!   hears; a reply that does not read as the request's results is a failure (the
//!   items may have been written: each holder treats it as an unknown outcome).
//! - **Deadlines stay each renewal's.** A renewal in a batch times out at its own
//!   deadline, as alone; once every renewal of a batch is answered or timed out, the
//!   batch request is cancelled ([`CampaignEvent::Cancel`]).

use super::*;
use crate::wire::{RenewManyReply, renew_many_subject};

/// A renewal due now pulls in the owners due within a TTL divided by this.
pub const EARLY_WINDOW_DIVISOR: u32 = 10;

/// The most renewals one `renew_many` request carries, and the most a group grows
/// to by pulling owners in early: one write batch of the service's coalescer
/// (its default `max_batch`), well below the endpoint's [`MAX_RENEW_MANY`](crate::wire::MAX_RENEW_MANY).
pub const GROUP_BOUND: usize = 64;

/// How long the campaign waits for the service's `$SRV.INFO`; until it is
/// answered, and if it is not, each renewal goes alone.
pub const SERVICE_INFO_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the campaign is in asking the service whether it takes `renew_many`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Asked {
    #[default]
    Not,
    Out,
    Answered,
}

/// The renewals sent together, and whether the service takes them so.
#[derive(Debug, Default)]
pub(super) struct Batching {
    /// Whether the service advertised `renew_many` and has not refused it since.
    on: bool,
    /// The one `$SRV.INFO` request: not yet asked, out, or answered.
    asked: Asked,
    /// Batch requests out: their renewals (the campaign's ids and requests).
    out: BTreeMap<TransmitId, Vec<(TransmitId, Transmit)>>,
    /// The widest early window of the keys campaigned for, and for how many keys it
    /// was worked out: the timers are scanned only that far ahead.
    widest: Option<(usize, Duration)>,
}

impl Campaign {
    /// What the lease service's `$SRV.INFO` answered: renewals go out in batches
    /// only when it lists `renew_many`
    /// ([`advertises_renew_many`](crate::service::micro::advertises_renew_many)).
    pub fn handle_service_info(&mut self, info: &[u8]) {
        self.batching.on = crate::service::micro::advertises_renew_many(info);
    }

    /// The service's `$SRV.INFO` request to send, once, at the campaign's start (the
    /// adapter sends it and feeds what came of it to
    /// [`Campaign::handle_service_info_outcome`]); `None` after.
    pub fn poll_service_info(&mut self) -> Option<NatsRequest> {
        if self.batching.asked != Asked::Not {
            return None;
        }
        self.batching.asked = Asked::Out;
        Some(NatsRequest {
            subject: crate::service::micro::info_subject(),
            headers: Vec::new(),
            payload: Vec::new(),
            timeout: SERVICE_INFO_TIMEOUT,
        })
    }

    /// What came of the `$SRV.INFO` request: renewals go out in batches only when a
    /// reply lists `renew_many` ([`Campaign::handle_service_info`]); no responders,
    /// a timeout or a failure leave each renewal alone. Read once: a second outcome
    /// changes nothing.
    pub fn handle_service_info_outcome(&mut self, outcome: &RequestOutcome) {
        if self.batching.asked != Asked::Out {
            return;
        }
        self.batching.asked = Asked::Answered;
        match outcome {
            RequestOutcome::Reply { payload, .. } => self.handle_service_info(payload),
            _ => self.batching.on = false,
        }
    }

    /// Whether renewals go out in batches now.
    pub fn batches_renewals(&self) -> bool {
        self.batching.on
    }

    /// With batching on and a renewal waiting to be sent, the owners due within
    /// their early window renew now too. Whether any did.
    pub(super) fn renew_due_early(&mut self, now: Instant) -> bool {
        let waiting = self
            .out
            .requests
            .iter()
            .filter(|t| {
                self.out
                    .routes
                    .get(&t.id)
                    .is_some_and(|r| r.endpoint == Endpoint::Renew)
            })
            .count();
        // Pulled in only while one request has room for them.
        let room = GROUP_BOUND.saturating_sub(waiting);
        if !self.batching.on || waiting == 0 || room == 0 {
            return false;
        }
        let widest = match self.batching.widest {
            Some((n, widest)) if n == self.candidacies.len() => widest,
            _ => {
                let widest = self
                    .candidacies
                    .values()
                    .map(|c| c.holder.config().ttl / EARLY_WINDOW_DIVISOR)
                    .max()
                    .unwrap_or_default();
                self.batching.widest = Some((self.candidacies.len(), widest));
                widest
            }
        };
        // Nearest due first.
        let due: Vec<String> = self.timers.due(now + widest).cloned().collect();
        let mut pulled = 0;
        for key in due {
            if pulled == room {
                break;
            }
            let Some(candidacy) = self.candidacies.get_mut(&key) else {
                continue;
            };
            let window = candidacy.holder.config().ttl / EARLY_WINDOW_DIVISOR;
            if candidacy.holder.renew_early(now, now + window) {
                self.touched.insert(key);
                pulled += 1;
            }
        }
        pulled > 0
    }

    /// `first`, just taken from the queue, with the other renewals waiting beside
    /// it as one `renew_many` request, when batching is on and there are others.
    pub(super) fn batch_with(&mut self, first: Transmit) -> Transmit {
        let is_renew = |out: &Outbox, t: &Transmit| {
            out.routes
                .get(&t.id)
                .is_some_and(|r| r.endpoint == Endpoint::Renew)
        };
        if !self.batching.on || !is_renew(&self.out, &first) {
            return first;
        }
        let mut members = vec![first];
        let mut rest = VecDeque::new();
        while let Some(t) = self.out.requests.pop_front() {
            if members.len() < GROUP_BOUND && is_renew(&self.out, &t) {
                members.push(t);
            } else {
                rest.push_back(t);
            }
        }
        self.out.requests = rest;
        if members.len() == 1 {
            return members.pop().expect("one");
        }
        let id = self.out.ids.allocate();
        let mut payload = b"{\"leases\":[".to_vec();
        for (i, t) in members.iter().enumerate() {
            if i > 0 {
                payload.push(b',');
            }
            payload.extend_from_slice(&t.request.payload);
        }
        payload.extend_from_slice(b"]}");
        let timeout = members
            .iter()
            .map(|t| t.request.timeout)
            .min()
            .expect("two or more");
        let request = NatsRequest {
            subject: renew_many_subject(),
            headers: Vec::new(),
            payload,
            timeout,
        };
        let batch = Transmit::new(id, TransmitKind::Lease(Endpoint::Renew), request);
        self.batching
            .out
            .insert(id, members.into_iter().map(|t| (t.id, t)).collect());
        batch
    }

    /// Whether `id` is a batch request out.
    pub(super) fn is_batch(&self, id: TransmitId) -> bool {
        self.batching.out.contains_key(&id)
    }

    /// The key of batch `id`'s first renewal, if `id` is a batch request out.
    pub(super) fn batch_key(&self, id: TransmitId) -> Option<String> {
        let (first, _) = self.batching.out.get(&id)?.first()?;
        self.out.routes.get(first).map(|r| r.key.clone())
    }

    /// What came of batch request `id`: each renewal in it hears its own outcome.
    pub(super) fn deliver_batch(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        let Some(members) = self.batching.out.remove(&id) else {
            return;
        };
        let body = match &outcome {
            RequestOutcome::NoResponders => None,
            RequestOutcome::Reply { payload, .. } => Some(payload),
            _ => {
                for (member, _) in members {
                    self.deliver(now, member, outcome.clone());
                }
                return;
            }
        };
        // Read once: a renewed item's own bytes are its holder's reply.
        let answer = body.map(|b| RenewManyReply::decode_bodies(b));
        match answer {
            // No responders, or refused whole before any item ran: one by one.
            None
            | Some(Ok(Err(ErrorReply {
                kind: ErrorKind::Invalid,
                ..
            }))) => {
                self.batching.on = false;
                for (_, t) in members.into_iter().rev() {
                    if self.out.routes.contains(&t.id) {
                        self.out.requests.push_front(t);
                    }
                }
            }
            Some(Ok(Err(error))) => {
                let class = OutcomeClass::of_error(error.kind);
                let body = wire::Response::Error(error).to_json();
                for (member, _) in members {
                    self.deliver_as(now, member, RequestOutcome::reply(body.clone()), class);
                }
            }
            Some(Ok(Ok(items)))
                if items.len() == members.len()
                    && items.iter().zip(&members).all(|(item, (m, _))| {
                        self.out
                            .routes
                            .get(m)
                            .is_none_or(|route| route.key == item.key)
                    }) =>
            {
                for (item, (member, _)) in items.into_iter().zip(members) {
                    // What a renew reply of this shape reads as, known already.
                    let class = item
                        .error
                        .map_or(OutcomeClass::Clear, OutcomeClass::of_error);
                    self.deliver_as(now, member, RequestOutcome::reply(item.body), class);
                }
            }
            Some(Ok(Ok(_))) | Some(Err(_)) => {
                let why = "the renew_many reply does not read as its request's results";
                for (member, _) in members {
                    self.deliver(now, member, RequestOutcome::Failed(why.to_string()));
                }
            }
        }
    }

    /// Batches whose renewals are all answered or timed out: cancelled.
    pub(super) fn cancel_spent_batches(&mut self) {
        let spent: Vec<TransmitId> = self
            .batching
            .out
            .iter()
            .filter(|(_, members)| members.iter().all(|(m, _)| !self.out.routes.contains(m)))
            .map(|(id, _)| *id)
            .collect();
        for id in spent {
            self.batching.out.remove(&id);
            self.events.push_back(CampaignEvent::Cancel { id });
        }
    }
}

/// One renewal of a `renew_many` request as each of its holders heard it: the key,
/// the renew request's body, and the outcome a renew of that key alone would have
/// had (what [`Campaign`] hands each holder), for an observer that records every
/// renewal (the holder library's `CampaignObserver`). An empty list for a body
/// that is no `renew_many` request, or a reply that is not its results (the
/// renewals then went out again one by one, each observed on its own).
pub fn renewals_of_batch(
    body: &[u8],
    outcome: &RequestOutcome,
) -> Vec<(String, Vec<u8>, RequestOutcome)> {
    let Ok(items) = wire::decode_renew_many(body) else {
        return Vec::new();
    };
    let each = |outcome: &dyn Fn(usize) -> RequestOutcome| -> Vec<_> {
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let body = serde_json::to_vec(item).expect("a renew request serialises");
                (item.key.clone(), body, outcome(i))
            })
            .collect()
    };
    let payload = match outcome {
        RequestOutcome::NoResponders => return Vec::new(),
        RequestOutcome::Reply { payload, .. } => payload,
        other => return each(&|_| other.clone()),
    };
    match RenewManyReply::decode_bodies(payload) {
        Ok(Err(ErrorReply {
            kind: ErrorKind::Invalid,
            ..
        })) => Vec::new(),
        Ok(Err(error)) => {
            let body = wire::Response::Error(error).to_json();
            each(&|_| RequestOutcome::reply(body.clone()))
        }
        Ok(Ok(replies))
            if replies.len() == items.len()
                && replies.iter().zip(&items).all(|(r, i)| r.key == i.key) =>
        {
            each(&|i| RequestOutcome::reply(replies[i].body.clone()))
        }
        _ => each(&|_| {
            RequestOutcome::Failed(
                "the renew_many reply does not read as its request's results".into(),
            )
        }),
    }
}
