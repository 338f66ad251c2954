//! The calls running: each call's outputs driven after every input (its requests
//! out under ids of the service's own, its stream writes through the coalescer, its
//! facts to the known map, the bucket's sequence checked against what was seen),
//! its end, the outcomes fed back ([`Service::handle_outcome`]) to a call or a
//! part, and the give-up of what nobody waits for any more: a call past its
//! deadline, a part's request past its timeout.

use super::*;

impl Service {
    /// Drains one call's outputs after an input: its requests go out (its stream
    /// writes through the coalescer when there is one), what it learnt goes to the
    /// known map, its reply ends it.
    pub(super) fn drive(&mut self, now: Instant, token: CallId) {
        let Some(running) = self.calls.get_mut(&token) else {
            return;
        };
        if let Some(known) = &mut self.known
            && let Some((key, fact)) = running.call.poll_learnt()
        {
            known.learn(&key, fact);
        }
        // Fences never repeat: a write sent after the service saw revision F is
        // stored above F, unless the stream went back under it.
        let stored = running.call.highest_stored();
        let rewound = (stored > 0 && stored <= running.floor).then(|| {
            format!(
                "a write was stored at sequence {stored} of stream {}, at or below {} seen \
                 before it was sent: the stream's sequence went back (restored from a \
                 backup, or made anew), and that fence was handed out already",
                self.config.bucket.shards.stream(running.shard as u32),
                running.floor
            )
        });
        if let Some(floor) = self.floors.get_mut(running.shard) {
            *floor = (*floor).max(running.call.highest_seen());
        }
        if let Some(why) = rewound {
            self.refuse_bucket(why);
        }
        let Some(running) = self.calls.get_mut(&token) else {
            return;
        };
        // One id names each request from the call to the adapter (or to the
        // coalescer) and back: the service's own.
        while let Some(transmit) = running.call.poll_transmit(&mut self.transmit_ids) {
            let id = transmit.id;
            running.sent.push(id);
            if let Some(coalescer) = self
                .coalescer
                .as_mut()
                .filter(|_| transmit.kind.is_stream_write())
            {
                self.routes.insert(id, Route::Write(token), None);
                coalescer.handle_write(now, id, transmit.request);
                continue;
            }
            self.routes.insert(id, Route::Call(token), None);
            self.transmits.push_back(transmit);
        }
        while let Some(event) = running.call.poll_event() {
            match event {
                CallEvent::Kv(fact) => self.events.push_back(ServiceEvent::Kv(fact)),
                CallEvent::Replied(response) => return self.finish(now, token, response),
            }
        }
        self.deadlines.set(token, running.call.poll_timeout());
    }

    /// A call replied: it ends, its queued writes are dropped, its reply goes out,
    /// and what it did reaches the sweep, the tenants' counts and admission.
    pub(super) fn finish(&mut self, now: Instant, token: CallId, response: Response) {
        let Some(running) = self.calls.remove(&token) else {
            return;
        };
        self.deadlines.remove(&token);
        // A request still out (a call cut off) is waited for no more.
        self.give_up_waits(now, &running.sent);
        match (&response, &running.scope) {
            (Response::Released(r), scope) if self.stop.is_none() => {
                let key = tenant::storage_key(scope.as_ref(), &r.key);
                self.sweep.handle_released(now, key, r.revision);
                if let Some(caller) = scope {
                    self.tenants.handle_released(&caller.account, &r.key);
                }
            }
            (Response::Released(r), Some(caller)) => {
                self.tenants.handle_released(&caller.account, &r.key);
            }
            (Response::Acquired(r), Some(caller)) if r.granted => {
                self.tenants.handle_granted(&caller.account, &r.lease.key);
            }
            _ => {}
        }
        // Refused meanwhile: what the call did went to a stream whose sequence
        // went back, and its fence may be one handed out already.
        let response = match (&self.bucket_refused, response) {
            (Some(why), r) if r.error_kind().is_none() => Response::Error(ErrorReply::new(
                crate::wire::ErrorKind::Unavailable,
                format!("the lease service refuses its bucket: {why}"),
            )),
            (_, r) => r,
        };
        self.acquire_ended(Some(&running.scope), running.acquiring.as_deref());
        let took = now.saturating_duration_since(running.started);
        self.answered_or_gathered(
            now,
            running.item,
            running.endpoint,
            running.reply,
            response,
            took,
        );
        let tenant = running.scope.map(|c| c.account);
        self.admission.handle_tenant_finished(now, tenant);
    }

    /// Feeds back the outcome of the transmit sent with `id`. An outcome nobody
    /// waits for any more (its call ended, it timed out) is ignored.
    pub fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        // A write in the coalescer was never handed to the adapter.
        if matches!(self.routes.get(&id), None | Some(Route::Write(_))) {
            return;
        }
        match self.routes.take(&id) {
            Some(Route::Call(call)) => self.call_outcome(now, call, id, outcome),
            Some(Route::Part(part)) => self.part_outcome(now, part, id, outcome),
            Some(Route::Write(_)) | None => {}
        }
        self.pump(now);
    }

    /// Hands a call's request's outcome to the call (a write's, from the
    /// coalescer, too).
    pub(super) fn call_outcome(
        &mut self,
        now: Instant,
        token: CallId,
        id: TransmitId,
        outcome: RequestOutcome,
    ) {
        let Some(running) = self.calls.get_mut(&token) else {
            return;
        };
        running.sent.retain(|s| *s != id);
        running.call.handle_outcome(now, id, outcome);
        self.drive(now, token);
    }

    /// Hands a part's request's outcome to the part.
    fn part_outcome(&mut self, now: Instant, part: Part, id: TransmitId, outcome: RequestOutcome) {
        match part {
            Part::Coalescer => {
                if let Some(c) = &mut self.coalescer {
                    c.handle_outcome(now, id, outcome);
                }
            }
            Part::Startup => {
                if let Phase::Starting(startup) = &mut self.phase {
                    startup.handle_outcome(now, id, outcome);
                }
            }
            Part::Replicas => {
                if let Some(c) = &mut self.check {
                    c.handle_outcome(now, id, outcome);
                }
            }
            Part::Sweep => self.sweep.handle_outcome(now, id, outcome),
        }
    }

    /// Sends a part's request (named by the service's id the part polled it
    /// with), timed out at its own timeout from `now`.
    pub(super) fn send_routed(&mut self, now: Instant, part: Part, transmit: Transmit) {
        let due = now + transmit.request.timeout;
        self.routes
            .insert(transmit.id, Route::Part(part), Some(due));
        self.transmits.push_back(transmit);
    }

    /// Gives up a request out: nothing waits for it any more. A write still in
    /// the coalescer is never sent late; one sent is dropped by the adapter.
    pub(super) fn cancel(&mut self, now: Instant, id: TransmitId) {
        match self.routes.take(&id) {
            Some(Route::Write(_)) => {
                if let Some(coalescer) = &mut self.coalescer {
                    coalescer.handle_cancel(now, id);
                }
            }
            Some(_) => self.events.push_back(ServiceEvent::Cancel { id }),
            None => {}
        }
    }

    /// Refuses the bucket from now on (once): its sequence went back.
    pub(super) fn refuse_bucket(&mut self, why: String) {
        if let Some(known) = &mut self.known {
            known.clear();
        }
        if self.bucket_refused.is_none() {
            self.events
                .push_back(ServiceEvent::BucketRefused(why.clone()));
            self.bucket_refused = Some(why);
        }
    }

    /// The calls past their deadline act on it; what each waits on is given up
    /// first (the call counts it as it times out): its send is dropped, and a
    /// queued write of it is never sent.
    pub(super) fn expire_calls(&mut self, now: Instant) {
        while let Some(token) = self.deadlines.pop_due(now) {
            let Some(running) = self.calls.get_mut(&token) else {
                continue;
            };
            let sent = std::mem::take(&mut running.sent);
            self.give_up_waits(now, &sent);
            if let Some(running) = self.calls.get_mut(&token) {
                running.call.handle_timeout(now);
            }
            self.drive(now, token);
        }
    }

    /// A call's requests out are waited for no more (each send dropped), and its
    /// writes still queued in the coalescer are never sent late.
    fn give_up_waits(&mut self, now: Instant, sent: &[TransmitId]) {
        for id in sent {
            self.cancel(now, *id);
        }
    }

    /// The give-up of the parts' requests past their timeout: each send is
    /// dropped, and its part learns it timed out.
    pub(super) fn time_out_sends(&mut self, now: Instant) {
        while let Some((id, route)) = self.routes.pop_timed_out(now) {
            self.events.push_back(ServiceEvent::Cancel { id });
            if let Route::Part(part) = route {
                self.part_outcome(now, part, id, RequestOutcome::TimedOut);
            }
        }
    }
}
