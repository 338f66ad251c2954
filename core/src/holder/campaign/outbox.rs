//! Requests out: each holder's request under an id of the campaign's own, its
//! deadline, and what comes back (answered, timed out, or withdrawn unsent).

use super::*;

#[derive(Debug)]
pub(super) struct Route {
    pub(super) key: String,
    pub(super) serial: u64,
    pub(super) inner: TransmitId,
    pub(super) group: GroupId,
    pub(super) gated: bool,
    pub(super) endpoint: Endpoint,
    pub(super) sent: Instant,
    pub(super) renew_retry: bool,
}

/// Requests sent and waiting for their outcome, and those ready to send.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    /// Each request's route and deadline, sent or ready to send.
    pub(super) routes: Requests<TransmitId, Route>,
    pub(super) requests: VecDeque<Transmit>,
    pub(super) ids: Ids<TransmitId>,
}

impl Outbox {
    /// Takes the route of request `id` (answered, timed out or recalled).
    pub(super) fn take(&mut self, id: TransmitId) -> Option<Route> {
        self.routes.take(&id)
    }

    /// Takes request `id` back if it is still waiting to be polled: then it was
    /// never sent.
    pub(super) fn unqueue(&mut self, id: TransmitId) -> bool {
        let before = self.requests.len();
        self.requests.retain(|r| r.id != id);
        self.requests.len() != before
    }

    /// Sends a holder's request under an id of the campaign's own.
    pub(super) fn send(
        &mut self,
        now: Instant,
        key: &str,
        candidacy: &Candidacy,
        gated: bool,
        renew_unclear: &BTreeSet<String>,
        request: Transmit,
    ) {
        let id = self.ids.allocate();
        let endpoint = match request.kind {
            TransmitKind::Lease(endpoint) => endpoint,
            // A holder sends only lease calls.
            _ => Endpoint::Acquire,
        };
        self.routes.insert(
            id,
            Route {
                key: key.to_string(),
                serial: candidacy.serial,
                inner: request.id,
                group: candidacy.group,
                gated,
                endpoint,
                sent: now,
                renew_retry: endpoint == Endpoint::Renew && renew_unclear.contains(key),
            },
            Some(now + request.request.timeout),
        );
        self.requests.push_back(Transmit { id, ..request });
    }
}

impl Campaign {
    /// Request `id`, taken back before it was polled, was never sent: its holder
    /// hears so ([`Holder::handle_cancel`]), not that it timed out.
    pub(super) fn withdraw(&mut self, now: Instant, id: TransmitId) {
        if let Some(route) = self.out.take(id) {
            self.withdraw_route(now, route);
        }
    }

    /// A request never sent, its route taken: its holder hears it cancelled.
    pub(super) fn withdraw_route(&mut self, now: Instant, route: Route) {
        if route.gated
            && let Some(g) = self.groups.get_mut(&route.group)
        {
            g.gated_in_flight = g.gated_in_flight.saturating_sub(1);
        }
        if let Some(candidacy) = self.candidacies.get_mut(&route.key)
            && candidacy.serial == route.serial
        {
            candidacy.holder.handle_cancel(now, route.inner);
            self.touched.insert(route.key);
        }
    }

    pub(super) fn deliver(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        if let Some(route) = self.out.take(id) {
            let class = OutcomeClass::of(route.endpoint, &outcome);
            self.deliver_route_as(now, route, outcome, class);
        }
    }

    /// [`Campaign::deliver`] of an outcome whose class the caller read already
    /// (a `renew_many` item's, read with its reply): not read a second time.
    pub(super) fn deliver_as(
        &mut self,
        now: Instant,
        id: TransmitId,
        outcome: RequestOutcome,
        class: OutcomeClass,
    ) {
        if let Some(route) = self.out.take(id) {
            self.deliver_route_as(now, route, outcome, class);
        }
    }

    /// What came of a request whose route was taken goes to its holder, and is
    /// counted.
    pub(super) fn deliver_route(&mut self, now: Instant, route: Route, outcome: RequestOutcome) {
        let class = OutcomeClass::of(route.endpoint, &outcome);
        self.deliver_route_as(now, route, outcome, class);
    }

    /// [`Campaign::deliver_route`] with the outcome's class known.
    fn deliver_route_as(
        &mut self,
        now: Instant,
        route: Route,
        outcome: RequestOutcome,
        class: OutcomeClass,
    ) {
        debug_assert_eq!(
            class,
            OutcomeClass::of(route.endpoint, &outcome),
            "the class given is the outcome's"
        );
        if route.endpoint == Endpoint::Renew {
            if class.is_clear() {
                self.renew_unclear.remove(&route.key);
            } else {
                self.renew_unclear.insert(route.key.clone());
            }
        }
        self.events
            .push_back(CampaignEvent::Answered(AnsweredRequest {
                key: route.key.clone(),
                endpoint: route.endpoint,
                took: now.saturating_duration_since(route.sent),
                class,
                renew_retry: route.renew_retry,
            }));
        if route.gated
            && let Some(g) = self.groups.get_mut(&route.group)
        {
            g.gated_in_flight = g.gated_in_flight.saturating_sub(1);
        }
        if let Some(candidacy) = self.candidacies.get_mut(&route.key)
            && candidacy.serial == route.serial
        {
            candidacy.holder.handle_outcome(now, route.inner, outcome);
            self.touched.insert(route.key);
        }
    }
}
