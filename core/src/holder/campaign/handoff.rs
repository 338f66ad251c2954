//! The commands a member hands to its NATS client besides requests: the subscribe
//! of a key's change events ([`CampaignEvent::Watch`]) and the reply rejecting a
//! forwarded request ([`CampaignEvent::Reject`]). Each is given up at
//! [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND) if the adapter has not reported it done: a client reconnecting
//! to a server that is gone takes no command, and a lost subscribe or reject costs
//! only an early wake-up or a forwarding service's timeout, never correctness. The
//! adapter runs them in the background and arms no timer of its own for them.

use super::*;

/// A reject reply the campaign asked for ([`CampaignEvent::Reject`]), until the
/// adapter reports it handed to the client or the campaign gives it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RejectId(pub u64);

impl crate::outbox::Id for RejectId {
    fn from_raw(n: u64) -> Self {
        Self(n)
    }
}

/// The subscribes and rejects handed to the client and not yet reported done, each
/// with the instant it is given up.
#[derive(Debug, Default)]
pub(super) struct Handoffs {
    /// The keys watched now (subscribed, or the subscribe under way or given up).
    watched: BTreeSet<String>,
    watches: Handoff<String>,
    rejects: Handoff<RejectId>,
    reject_ids: Ids<RejectId>,
}

impl Handoffs {
    /// Subscribes to `key`'s change events, given up at `now` + [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND);
    /// nothing if it is watched already.
    pub(super) fn watch(
        &mut self,
        now: Instant,
        key: String,
        events: &mut VecDeque<CampaignEvent>,
    ) {
        if self.watched.insert(key.clone()) {
            self.watches.hand(now, key.clone());
            events.push_back(CampaignEvent::Watch { key });
        }
    }

    /// Unsubscribes from `key`'s change events (a subscribe under way is dropped with
    /// it); nothing if it is not watched.
    pub(super) fn unwatch(&mut self, key: &str, events: &mut VecDeque<CampaignEvent>) {
        if self.watched.remove(key) {
            self.subscribed(key);
            events.push_back(CampaignEvent::Unwatch {
                key: key.to_string(),
            });
        }
    }

    /// The subscribe of `key` is over (done, failed, or no longer wanted).
    pub(super) fn subscribed(&mut self, key: &str) {
        self.watches.forget(&key.to_string());
    }

    /// Rejects a forwarded request by a reply to `to`, given up at `now` +
    /// [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND).
    pub(super) fn reject(
        &mut self,
        now: Instant,
        to: String,
        events: &mut VecDeque<CampaignEvent>,
    ) {
        let id = self.reject_ids.allocate();
        self.rejects.hand(now, id);
        events.push_back(CampaignEvent::Reject { id, to });
    }

    /// Gives up what the client has not taken by `now`.
    pub(super) fn give_up(&mut self, now: Instant, events: &mut VecDeque<CampaignEvent>) {
        while let Some(key) = self.watches.pop_given_up(now) {
            events.push_back(CampaignEvent::CancelWatch { key });
        }
        while let Some(id) = self.rejects.pop_given_up(now) {
            events.push_back(CampaignEvent::CancelReject { id });
        }
    }

    /// When the first of them is given up.
    pub(super) fn next_due(&self) -> Option<Instant> {
        let watch = self.watches.next_due();
        watch.into_iter().chain(self.rejects.next_due()).min()
    }

    /// Whether a reject is still being handed over: a member finishing waits for it.
    pub(super) fn rejecting(&self) -> bool {
        !self.rejects.is_empty()
    }
}

impl Campaign {
    /// The subscribe of `key`'s change events ([`CampaignEvent::Watch`]) is over:
    /// made, or failed (a failed one only loses the early wake-up; the campaign
    /// ticks still ask). Not reported by [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND), the campaign gives it
    /// up ([`CampaignEvent::CancelWatch`]); a report after that is ignored.
    pub fn handle_watched(&mut self, _now: Instant, key: &str) {
        self.handoffs.subscribed(key);
    }

    /// The reject reply `id` ([`CampaignEvent::Reject`]) was handed to the client,
    /// or its publish failed. Not reported by [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND), the campaign gives
    /// it up ([`CampaignEvent::CancelReject`]).
    pub fn handle_reject_sent(&mut self, _now: Instant, id: RejectId) {
        self.handoffs.rejects.forget(&id);
    }

    /// A request forwarded to this holder's inbox arrived on `subject`, with reply
    /// subject `reply` and `Dagnats-Lease-Fence` header value `fence`, while the
    /// application reads the inbox (`read`) or not: [`Campaign::check_inbox`]'s
    /// verdict, and a rejected one with a reply subject is answered
    /// ([`CampaignEvent::Reject`]).
    pub fn handle_inbox(
        &mut self,
        now: Instant,
        subject: &str,
        reply: Option<&str>,
        fence: Option<&str>,
        read: bool,
    ) -> InboxVerdict {
        let verdict = self.check_inbox(now, subject, fence, read);
        if let (InboxVerdict::Reject(_), Some(to)) = (&verdict, reply) {
            self.handoffs.reject(now, to.to_string(), &mut self.events);
        }
        verdict
    }
}
