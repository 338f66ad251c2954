//! `renew_many`: many renewals in one request, each its own renew call.
//!
//! The request is decoded whole first ([`decode_renew_many`]): an invalid item, a
//! key twice or more items than [`MAX_RENEW_MANY`] refuse the whole request
//! `invalid`, and no item runs. So do the rules every request meets, once for the
//! request: the reply rule drops it unanswered, a malformed header block or a
//! tenancy refusal (checked before the body is read) is its one error, and while starting, stopping past the
//! cut-off or refusing the bucket it is answered at once, as a renew would be.
//!
//! Otherwise each item is one renew [`Call`] of its own (its own conditional
//! write, its own fence, its own outcome), admitted like a renew of that key
//! alone ([`Admission::handle_item_of`](super::admit::Admission::handle_item_of)):
//! each counts as a call in flight, an item that finds no room is answered
//! `unavailable` in its own result while the others run (the request is never
//! refused whole for its size), and items that wait take turns with single calls,
//! so a group does not hold back the acquires and renewals that came after it.
//! A [`Gather`] collects the items' replies, and the service sends one reply,
//! `{"results": [...]}` in request order, once the last is in. Each result is
//! what a renew of that key alone would have replied.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use super::{Answered, Pending, Received, RequestSource, Service, ServiceEvent, SubscriptionKind};
use crate::call::{Call, CallEvent};
use crate::subjects::QUEUE_GROUP;
use crate::wire::{
    Endpoint, ErrorKind, ErrorReply, MAX_RENEW_MANY, RenewManyReply, RenewManyResult, RenewRequest,
    Response, decode_renew_many, decode_renew_many_items, renew_many_subject,
};

/// The most a reply's item takes, in bytes (a lease with a 128-byte key and holder
/// is about 400; an error sentence less): a request whose reply could not fit the
/// server's `max_payload` at this size is refused before any item runs.
pub(super) const MAX_RESULT_BYTES: usize = 1024;

/// One item of a `renew_many` request: which gather, and where in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Item {
    batch: u64,
    index: usize,
}

/// One `renew_many` request whose items run.
#[derive(Debug)]
struct Gather {
    reply: String,
    started: Instant,
    keys: Vec<String>,
    results: Vec<Option<RenewManyResult>>,
    left: usize,
    /// Each item's renew call as answered, counted with the one reply.
    calls: Vec<Answered>,
}

/// The `renew_many` requests whose items run, by batch number.
#[derive(Debug, Default)]
pub(super) struct Gathers {
    next: u64,
    open: HashMap<u64, Gather>,
}

impl Service {
    /// `renew_many` requests answered so far, when the service serves it.
    pub fn renew_many_requests(&self) -> Option<u64> {
        self.micro.renew_many_requests()
    }

    /// Serving `renew_many` without tenancy: its own subscription beside the five (a
    /// tenant's comes in on `api.leases.*.*`).
    pub(super) fn subscribe_renew_many(&mut self) {
        if self.config.renew_many {
            self.events.push_back(ServiceEvent::Subscribe {
                subject: renew_many_subject(),
                queue: Some(QUEUE_GROUP),
                kind: SubscriptionKind::Api,
            });
        }
    }

    /// A `renew_many` request: see the [module docs](self). With the endpoint off
    /// it is ignored, as any subject the service does not serve.
    pub(super) fn handle_renew_many(
        &mut self,
        now: Instant,
        wall: OffsetDateTime,
        message: Received,
    ) {
        if !self.config.renew_many {
            return;
        }
        let Some(scope) = self.gate(now, RequestSource::Api, &message) else {
            return;
        };
        let Received {
            reply,
            payload,
            header_error,
            ..
        } = message;
        let reply = reply.unwrap_or_default();
        if let Some(why) = header_error {
            let err = ErrorReply::new(
                ErrorKind::Invalid,
                format!("the request is malformed: {why}"),
            );
            return self.many_answered(now, reply, Err(err), Duration::ZERO, Vec::new());
        }
        let scope = match scope {
            Ok(scope) => scope,
            Err(err) => {
                return self.many_answered(now, reply, Err(err), Duration::ZERO, Vec::new());
            }
        };
        let items = match decode_items(&payload).and_then(|items| {
            self.check_reply_fits(items.len())?;
            Ok(items)
        }) {
            Ok(items) => items,
            Err(err) => {
                return self.many_answered(now, reply, Err(err), Duration::ZERO, Vec::new());
            }
        };
        if let (Some(why), None) = (&self.bucket_refused, &self.stop) {
            let err = ErrorReply::new(
                ErrorKind::Unavailable,
                format!("the lease service refuses its bucket: {why}"),
            );
            return self.many_answered(now, reply, Err(err), Duration::ZERO, Vec::new());
        }
        let at_once = match (&self.phase, self.stop.as_ref().map(|s| s.phase())) {
            (super::Phase::Starting(_), None) => true,
            (_, None) => false,
            (_, Some(super::StopPhase::Drain)) => {
                self.late += 1;
                false
            }
            (_, Some(_)) => true,
        };
        if at_once {
            // No effects: the reply a renew of the first item gets now is the
            // request's (`unavailable` while starting, `internal` past the cut-off).
            let mut call = Call::new(self.call_config, Endpoint::Renew, &items[0].1, wall, now);
            call.handle_stop(now);
            let response = std::iter::from_fn(|| call.poll_event())
                .find_map(|e| match e {
                    CallEvent::Replied(Response::Error(e)) => Some(e),
                    _ => None,
                })
                .unwrap_or_else(|| {
                    ErrorReply::new(ErrorKind::Unavailable, "the lease service is not serving")
                });
            return self.many_answered(now, reply, Err(response), Duration::ZERO, Vec::new());
        }
        let batch = self.gathers.next;
        self.gathers.next += 1;
        self.gathers.open.insert(
            batch,
            Gather {
                reply,
                started: now,
                keys: items.iter().map(|(r, _)| r.key.clone()).collect(),
                results: vec![None; items.len()],
                left: items.len(),
                calls: Vec::with_capacity(items.len()),
            },
        );
        let tenant = scope.as_ref().map(|c| c.account.clone());
        for (index, (_, payload)) in items.into_iter().enumerate() {
            let pending = Pending {
                reply: String::new(),
                payload,
                scope: Ok(scope.clone()),
                acquiring: None,
                at: now,
                wall,
                item: Some(Item { batch, index }),
            };
            self.admission
                .handle_item_of(now, tenant.clone(), Endpoint::Renew, pending);
        }
        self.pump(now);
    }

    /// `invalid` when `n` results could outgrow the server's `max_payload`.
    fn check_reply_fits(&self, n: usize) -> Result<(), ErrorReply> {
        let most = (self.config.max_payload / MAX_RESULT_BYTES).clamp(1, MAX_RENEW_MANY);
        if n <= most {
            return Ok(());
        }
        Err(ErrorReply::new(
            ErrorKind::Invalid,
            format!(
                "invalid renew_many request: field `leases` holds {n} renewals, at most \
                 {most} fit one reply within this server's max_payload of {} bytes",
                self.config.max_payload
            ),
        ))
    }

    /// A call's reply: an item's goes to its gather, any other is sent.
    pub(super) fn answered_or_gathered(
        &mut self,
        now: Instant,
        item: Option<Item>,
        endpoint: Endpoint,
        reply: String,
        response: Response,
        took: Duration,
    ) {
        match item {
            Some(item) => self.item_answered(now, item, response, took),
            None => self.answered(now, endpoint, reply, response, took),
        }
    }

    /// An item's renew replied: counted as a renew call, kept in its gather, and
    /// the request answered once every item is in.
    pub(super) fn item_answered(
        &mut self,
        now: Instant,
        item: Item,
        response: Response,
        took: Duration,
    ) {
        let Some(gather) = self.gathers.open.get_mut(&item.batch) else {
            return;
        };
        let Some(slot) = gather.results.get_mut(item.index) else {
            return;
        };
        if slot.is_some() {
            return;
        }
        *slot = Some(RenewManyResult::of(&gather.keys[item.index], &response));
        gather.left -= 1;
        let done = gather.left == 0;
        gather.calls.push(Answered {
            endpoint: Endpoint::Renew,
            response,
            took,
        });
        if !done {
            return;
        }
        let gather = self.gathers.open.remove(&item.batch).expect("found above");
        let results = gather.results.into_iter().flatten().collect();
        let took = now.saturating_duration_since(gather.started);
        let answer = Ok(RenewManyReply { results });
        self.many_answered(now, gather.reply, answer, took, gather.calls);
    }

    /// The reply to a `renew_many` request: counted, and sent with its items'
    /// renew calls (none when it was answered whole).
    fn many_answered(
        &mut self,
        now: Instant,
        reply: String,
        answer: Result<RenewManyReply, ErrorReply>,
        took: Duration,
        calls: Vec<Answered>,
    ) {
        self.micro.handle_many_answered(answer.as_ref().err(), took);
        let body = match answer {
            Ok(results) => results.to_json(),
            Err(e) => Response::Error(e).to_json(),
        };
        self.reply_with(now, reply, body, calls);
    }
}

/// A `renew_many` body's items ([`decode_renew_many`]), each with the body its
/// renew call starts from: the item's own bytes where the one pass read them (they
/// decode as that very request), else the request written out.
fn decode_items(body: &[u8]) -> Result<Vec<(RenewRequest, Vec<u8>)>, ErrorReply> {
    if let Some(items) = decode_renew_many_items(body) {
        return Ok(items
            .into_iter()
            .map(|(renew, bytes)| (renew, bytes.to_vec()))
            .collect());
    }
    // What the one pass did not take is decided as decode_renew_many decides it:
    // its sentence, and no item valid only as a JSON value (a field given twice).
    Ok(decode_renew_many(body)?
        .into_iter()
        .map(|renew| {
            let body = serde_json::to_vec(&renew).expect("a renew request serialises");
            (renew, body)
        })
        .collect())
}
