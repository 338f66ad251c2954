//! What comes in: every message a subscription delivers ([`Service::handle_request`]:
//! lease requests, `$SRV` verbs, change events), the reply rule and the caller's
//! scope applied to each, a malformed header block answered `invalid`, and
//! admission's verdict (a call started, a request refused), and a failed
//! subscription ([`Service::handle_subscribe_failed`]).

use super::*;

impl Service {
    /// A message a subscription delivered at `now` (`wall`: the wall-clock time,
    /// for the times replies carry): a lease request, a `$SRV` verb, or a change
    /// event. Any other subject is ignored.
    pub fn handle_request(&mut self, now: Instant, wall: OffsetDateTime, message: Received) {
        if message.subject.starts_with(CHANGED_PREFIX) {
            return self.handle_change(&message);
        }
        if message.subject.starts_with("$SRV.") {
            if self.gate(now, RequestSource::Srv, &message).is_none()
                || message.header_error.is_some()
            {
                return;
            }
            if let Some(verb) = self.micro.verb_of(&message.subject) {
                let body = self.micro.reply(verb);
                self.reply(now, message.reply.unwrap_or_default(), body);
            }
            return;
        }
        let name = match self.config.bucket.tenancy {
            Tenancy::Single => message
                .subject
                .strip_prefix(API_PREFIX)
                .and_then(|s| s.strip_prefix('.'))
                .filter(|name| !name.contains('.')),
            Tenancy::Accounts => tenant::tenant_endpoint_of(&message.subject).map(|(_, e)| e),
        };
        let Some(endpoint) = name.and_then(Endpoint::from_subject) else {
            if name == Some(crate::wire::RENEW_MANY) {
                self.handle_renew_many(now, wall, message);
            }
            return;
        };
        let Some(scope) = self.gate(now, RequestSource::Api, &message) else {
            return;
        };
        if let Some(why) = &message.header_error {
            // Nothing of a malformed block is read (its Nats-Request-Info
            // included): the caller is told, and no call runs.
            let response = Response::Error(ErrorReply::new(
                ErrorKind::Invalid,
                format!("the request is malformed: {why}"),
            ));
            let reply = message.reply.unwrap_or_default();
            return self.answered(now, endpoint, reply, response, Duration::ZERO);
        }
        let Received { reply, payload, .. } = message;
        let reply = reply.unwrap_or_default();
        if let (Some(why), None) = (&self.bucket_refused, &self.stop) {
            let response = Response::Error(ErrorReply::new(
                crate::wire::ErrorKind::Unavailable,
                format!("the lease service refuses its bucket: {why}"),
            ));
            return self.answered(now, endpoint, reply, response, Duration::ZERO);
        }
        match (&self.phase, self.stop.as_ref().map(Shutdown::phase)) {
            // No effects while starting: the reply is at hand.
            (Phase::Starting(_), None) => {
                return self.answer_at_once(now, wall, endpoint, reply, &payload);
            }
            (_, None) => {}
            (_, Some(StopPhase::Drain)) => self.late += 1,
            // Past the cut-off: its call is cut off at once.
            (_, Some(_)) => return self.answer_at_once(now, wall, endpoint, reply, &payload),
        }
        let mut pending = Pending {
            reply,
            payload,
            scope,
            acquiring: None,
            at: now,
            wall,
            item: None,
        };
        if let Ok(Some(caller)) = &pending.scope {
            match self
                .tenants
                .admit_request(caller, endpoint, &pending.payload)
            {
                Ok(key) => pending.acquiring = key,
                Err(err) => pending.scope = Err(err),
            }
        }
        let tenant = pending.tenant();
        self.admission
            .handle_tenant_request(now, tenant, endpoint, pending);
        self.pump(now);
    }

    /// The reply rule: the caller's scope when the reply may go out, else `None`
    /// (counted, and logged at most once per interval).
    pub(super) fn gate(
        &mut self,
        now: Instant,
        source: RequestSource,
        message: &Received,
    ) -> Option<Result<Option<Caller>, ErrorReply>> {
        match self.config.reply_scope.check(message.reply.as_deref()) {
            Ok(()) => {
                let reply = message.reply.as_deref().unwrap_or_default();
                Some(tenant::scope_of(
                    self.config.bucket.tenancy,
                    &self.config.tenant_accounts,
                    &message.subject,
                    reply,
                    &message.headers,
                ))
            }
            Err(reason) => {
                let log = self.drops.handle_dropped(now).map(|dropped| DroppedLog {
                    dropped,
                    subject: message.subject.clone(),
                    reply: message
                        .reply
                        .as_deref()
                        .map(|r| r.escape_debug().to_string()),
                    prefixes: self.config.reply_scope.prefixes().join(", "),
                });
                self.events.push_back(ServiceEvent::Dropped {
                    source,
                    reason,
                    log,
                });
                None
            }
        }
    }

    fn handle_change(&mut self, message: &Received) {
        let header = |name: &str| message.header(name);
        if let Some(known) = &mut self.known {
            known.handle_change(&message.subject, header, &message.payload);
        }
        if self.config.bucket.tenancy == Tenancy::Accounts
            && let Some((account, key)) = TenantLeases::key_of(&message.subject)
        {
            let event = ChangeEvent::from_parts(header, &message.payload);
            self.tenants.handle_change(account, key, event.kind);
        }
    }

    /// Answers a request without a call that waits on anything: while starting
    /// (the call answers `unavailable`), or past a stop's cut-off (the call is cut
    /// off at once and answers `internal`, or `invalid` for a bad request).
    fn answer_at_once(
        &mut self,
        now: Instant,
        wall: OffsetDateTime,
        endpoint: Endpoint,
        reply: String,
        payload: &[u8],
    ) {
        let mut call = Call::new(self.call_config, endpoint, payload, wall, now);
        call.handle_stop(now);
        while let Some(event) = call.poll_event() {
            match event {
                CallEvent::Kv(fact) => self.events.push_back(ServiceEvent::Kv(fact)),
                CallEvent::Replied(response) => {
                    self.answered(now, endpoint, reply.clone(), response, Duration::ZERO)
                }
            }
        }
    }

    /// A subscription the service asked for ([`ServiceEvent::Subscribe`]) failed
    /// with `error`. The lease endpoints and the `$SRV` verbs are how the service is
    /// reached: without one it stops ([`ServiceEvent::Fatal`]). Change events only
    /// feed the known map and the tenants' counts: the service serves on and logs
    /// what this configuration loses. The known map stays: it still learns this
    /// instance's own writes, and a revision it holds that another instance has
    /// since moved is refused by the conditional write, then read.
    pub fn handle_subscribe_failed(
        &mut self,
        now: Instant,
        kind: SubscriptionKind,
        subject: &str,
        error: &str,
    ) {
        match kind {
            SubscriptionKind::Api | SubscriptionKind::Srv => {
                if !self.failed {
                    self.failed = true;
                    self.events.push_back(ServiceEvent::Fatal(format!(
                        "could not subscribe to {subject}: {error}"
                    )));
                }
            }
            SubscriptionKind::Presence => self.presence_failed(subject, error),
            SubscriptionKind::Changes => {
                let warning = self
                    .changes_unwatched_warning()
                    .unwrap_or_else(|| "change events not watched".to_string());
                self.events.push_back(ServiceEvent::Log {
                    level: LogLevel::Warn,
                    line: format!("{warning} (could not subscribe to {subject}: {error})"),
                });
            }
        }
        self.pump(now);
    }

    /// Starts what admission starts and answers what it refuses.
    /// Starts or refuses what admission says; whether it said anything (a call
    /// started may have handed the coalescer a write to move along).
    pub(super) fn admit(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Some(event) = self.admission.poll_event() {
            any = true;
            match event {
                AdmissionEvent::Start(endpoint, pending) => self.start(now, endpoint, pending),
                AdmissionEvent::Overloaded(endpoint, pending, response) => {
                    self.acquire_ended(pending.scope.as_ref().ok(), pending.acquiring.as_deref());
                    self.events.push_back(ServiceEvent::Overloaded { endpoint });
                    if let Some(item) = pending.item {
                        self.item_answered(now, item, response, Duration::ZERO);
                        continue;
                    }
                    self.micro
                        .handle_answered(endpoint, &response, Duration::ZERO);
                    self.reply(now, pending.reply, response.to_json());
                }
            }
        }
        any
    }

    fn start(&mut self, now: Instant, endpoint: Endpoint, pending: Pending) {
        let wall = pending.wall + now.saturating_duration_since(pending.at);
        let scope = match pending.scope {
            Err(err) => {
                self.answered_or_gathered(
                    now,
                    pending.item,
                    endpoint,
                    pending.reply,
                    Response::Error(err),
                    Duration::ZERO,
                );
                self.admission.handle_tenant_finished(now, None);
                return;
            }
            Ok(scope) => scope,
        };
        let acquiring = pending.acquiring;
        let item = pending.item;
        let call = Call::new_scoped(
            self.call_config,
            scope.clone(),
            self.known.as_ref(),
            endpoint,
            &pending.payload,
            wall,
            now,
        );
        let token = self.call_ids.allocate();
        let shard = self.config.bucket.shards.shard_of(&call.storage_key()) as usize;
        let floor = self.floors.get(shard).copied().unwrap_or(0);
        self.calls.insert(
            token,
            Running {
                call,
                endpoint,
                reply: pending.reply,
                scope,
                acquiring,
                started: now,
                sent: Vec::new(),
                shard,
                floor,
                item,
            },
        );
        self.drive(now, token);
    }

    /// An acquire that took a place under its tenant's cap ended: the place is
    /// given back (a grant is counted as a lease by then).
    pub(super) fn acquire_ended(&mut self, scope: Option<&Option<Caller>>, key: Option<&str>) {
        if let (Some(Some(caller)), Some(key)) = (scope, key) {
            self.tenants.handle_acquire_ended(&caller.account, key);
        }
    }
}
