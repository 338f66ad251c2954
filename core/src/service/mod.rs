//! The lease service as one machine, in the manner of quinn-proto's `Endpoint`: it
//! composes every machine a serving process runs (bucket [`Startup`], the reply
//! rule of [`ReplyScope`](crate::reply_scope::ReplyScope), tenancy's scope and cap ([`crate::tenant`]),
//! [`Admission`], one [`Call`] per request keyed by a token, the write
//! [`Coalescer`], the [`KnownLeases`] map, the [`ReplicasCheck`] and its confirm
//! switch, the [`TombstoneSweep`], the micro protocol's verbs ([`MicroService`])
//! and the [`Shutdown`] phases), so that every decision of the service is here,
//! simulated and fuzzed, and an adapter only subscribes, receives, sends, flushes
//! and arms one timer.
//!
//! The parts only the service runs live beside it, in this folder ([`startup`],
//! [`replicas`], [`coalesce`], [`admit`], [`sweep`], [`micro`], [`shutdown`]); the
//! calls are [`crate::call`]'s, and the vocabulary both sides speak is flat in the
//! crate root.
//!
//! Inputs: [`Service::handle_request`] (every message a subscription delivers:
//! requests, `$SRV` verbs, change events), [`Service::handle_outcome`] (the outcome
//! of a [`Transmit`]), [`Service::handle_timeout`], [`Service::handle_stop`], the
//! adapter's IO coming to its end ([`Service::handle_reply_sent`] for each reply
//! handed to the client, [`Service::handle_subscribe_failed`]), and the two waits
//! of a stop coming to their end ([`Service::handle_intake_closed`],
//! [`Service::handle_flushed`]). Outputs: [`Service::poll_transmit`] (a NATS
//! request, its outcome wanted), [`Service::poll_event`] (replies to publish,
//! subscriptions wanted, metrics and log facts, the end), [`Service::poll_timeout`]
//! and [`Service::is_done`].
//!
//! The rules it holds (each with a table test in `tests/service.rs`):
//!
//! - a reply goes only to a reply subject [`ReplyScope::check`](crate::reply_scope::ReplyScope::check) lets through; any
//!   other request is dropped unanswered, no call runs for it, and it is counted;
//! - a request whose header block the connection read as malformed
//!   ([`Received::header_error`]) is answered `invalid`, naming the headers, and
//!   runs no call (a `$SRV` verb with one is dropped);
//! - while the bucket is ensured every call is answered `unavailable` at once;
//! - read confirmation starts from the stream's replicas and follows the
//!   [`ReplicasCheckEvent::ConfirmReads`] switch as it says (`on`), the `replicas > 1`
//!   rule living in [`ReplicasCheck`] only; the check runs only when serving;
//! - writes gather into atomic batches only when the stream takes them and the
//!   setting says so (`coalesce_writes`: `auto` by default, on a one-replica
//!   bucket only);
//! - a write still queued in the coalescer whose call gave up (timed out, cut off)
//!   is never sent;
//! - a stop drains: unsubscribe, answer every request already delivered, wait for
//!   the calls up to `shutdown_timeout`, cut off what still runs (`internal`),
//!   flush once every reply is handed to the client, within [`Shutdown::bound`];
//! - a request nobody waits for any more is cancelled ([`ServiceEvent::Cancel`]):
//!   the machine's deadlines are a request's only timer;
//! - a failed subscription of the endpoints or the verbs stops the service
//!   ([`ServiceEvent::Fatal`]); of the change events, it serves on and the
//!   known map learns only from its own calls;
//! - a reply the client has not taken within [`HANDOFF_BOUND`] is given up
//!   ([`ServiceEvent::CancelReply`]);
//! - with no server version (the client has had no INFO) it refuses to start
//!   ([`ServiceEvent::StartRefused`]) and asks for nothing.

pub mod admit;
pub mod coalesce;
mod config;
pub mod micro;
mod renew_many;
pub mod replicas;
pub mod shutdown;
pub mod startup;
pub mod sweep;
mod types;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use self::admit::{Admission, AdmissionEvent};
use self::coalesce::{Coalescer, CoalescerConfig, CoalescerEvent, WriteId, coalesce_on};
use self::micro::MicroService;
use self::replicas::{ReplicasCheck, ReplicasCheckEvent};
use self::shutdown::{Shutdown, ShutdownEvent, StopPhase};
use self::startup::{Startup, StartupEvent};
use self::sweep::{TombstoneSweep, TombstoneSweepEvent};
use crate::call::{Call, CallConfig, CallEvent};
use crate::change::ChangeEvent;
use crate::health::{self, Health, LogLevel, NotReady};
use crate::io::{EffectId, HANDOFF_BOUND, Mode, RequestOutcome, Transmit};
use crate::known::KnownLeases;
use crate::reply_scope::{REFUSAL_LOG_EVERY, RefusalLog};
use crate::subjects::{
    API_PREFIX, CHANGED_PREFIX, QUEUE_GROUP, TENANT_API_SUBJECTS, TENANT_CHANGED_SUBJECTS,
    changed_subject,
};
use crate::tenant::{self, Caller, Tenancy, TenantLeases};
use crate::wire::{Endpoint, ErrorKind, ErrorReply, Response};

pub use self::config::{DEFAULT_MAX_CALLS_IN_FLIGHT, ServiceConfig};
pub use self::types::{
    DroppedLog, Received, ReplyId, RequestSource, ServiceEvent, Serving, SubscriptionKind,
};

/// What a service loses when its change subscription cannot be made, by what the
/// change events are for in its configuration: the known-revisions map
/// (`known`), the tenants' cap (`cap`, tenancy only). `None` when nothing reads
/// them: then the service does not subscribe to them.
fn changes_unwatched_warning(known: bool, cap: Option<usize>) -> Option<String> {
    let mut lost = Vec::new();
    if known {
        lost.push(
            "renew and release go straight to their conditional write only for revisions \
             this instance wrote itself; one another instance wrote is read first"
                .to_string(),
        );
    }
    if let Some(cap) = cap {
        lost.push(format!(
            "the per-tenant cap of {cap} live leases counts only what this instance granted \
             and released: expiries and other instances' grants go unseen, so a tenant may be \
             refused below its cap or pass it"
        ));
    }
    (!lost.is_empty()).then(|| format!("change events not watched: {}", lost.join("; and ")))
}

/// Who asked for a request: what its outcome goes to.
#[derive(Debug, Clone, Copy)]
enum Route {
    /// A call's own request (`inner` is the call's id for it): the call keeps its
    /// deadline.
    Call { token: u64, inner: EffectId },
    /// Another part's request (`inner` is the part's id for it), timed out by the
    /// service at `due`.
    Part {
        part: Part,
        inner: EffectId,
        due: Instant,
    },
}

/// The parts other than the calls that send requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The write coalescer's sends.
    Coalescer,
    /// Startup's stream questions.
    Startup,
    /// The replicas check's stream info.
    Replicas,
    /// The tombstone sweep's purges.
    Sweep,
}

/// A request waiting for admission.
#[derive(Debug)]
struct Pending {
    reply: String,
    payload: Vec<u8>,
    scope: Result<Option<Caller>, ErrorReply>,
    /// The key of an acquire that took a place under its tenant's cap.
    acquiring: Option<String>,
    /// When it arrived, by both clocks: a call started later reads the wall clock
    /// as moved on by the monotonic time since.
    at: Instant,
    wall: OffsetDateTime,
    /// An item of a `renew_many` request: its outcome goes to the gather.
    item: Option<renew_many::Item>,
}

impl Pending {
    fn tenant(&self) -> Option<String> {
        match &self.scope {
            Ok(Some(c)) => Some(c.account.clone()),
            _ => None,
        }
    }
}

/// One call running.
#[derive(Debug)]
struct Running {
    call: Call,
    endpoint: Endpoint,
    reply: String,
    scope: Option<Caller>,
    /// The key of an acquire that took a place under its tenant's cap.
    acquiring: Option<String>,
    started: Instant,
    /// The call's deadline as indexed.
    deadline: Option<Instant>,
    /// Its requests out (service ids) and its writes in the coalescer.
    sent: Vec<EffectId>,
    writes: Vec<WriteId>,
    /// The shard of its key, and the highest revision the service had seen on
    /// it when the call started: every write of the call must be stored above.
    shard: usize,
    floor: u64,
    /// An item of a `renew_many` request: its outcome goes to the gather.
    item: Option<renew_many::Item>,
}

/// Where the service is.
#[derive(Debug)]
enum Phase {
    Starting(Box<Startup>),
    Serving,
}

/// The service machine. See the [module docs](self).
#[derive(Debug)]
pub struct Service {
    config: ServiceConfig,
    phase: Phase,
    mode: Mode,
    call_config: CallConfig,
    micro: MicroService,
    refusals: RefusalLog,
    admission: Admission<Pending>,
    tenants: TenantLeases,
    known: Option<KnownLeases>,
    coalescer: Option<Coalescer>,
    check: Option<ReplicasCheck>,
    sweep: TombstoneSweep,
    stop: Option<Shutdown>,
    intake_open: bool,
    late: usize,
    /// Replies sent ([`ServiceEvent::Reply`]) and not yet handed to the client,
    /// each with the instant it is given up.
    replies_out: HashMap<ReplyId, Instant>,
    /// The same replies by the instant each is given up.
    replies_due: BTreeSet<(Instant, ReplyId)>,
    next_reply: u64,
    /// The stop phase a flush was asked for last.
    flush_asked: Option<StopPhase>,
    /// A subscription the service cannot serve without failed.
    failed: bool,
    calls: HashMap<u64, Running>,
    next_token: u64,
    deadlines: BTreeSet<(Instant, u64)>,
    routes: HashMap<EffectId, Route>,
    /// Coalescer and sweep sends, by when they time out.
    sends_due: BTreeSet<(Instant, EffectId)>,
    /// The calls' writes in the coalescer: the call's token and its id for the write.
    writes: HashMap<WriteId, (u64, EffectId)>,
    next_id: u64,
    next_write: u64,
    transmits: VecDeque<Transmit>,
    events: VecDeque<ServiceEvent>,
    /// Whether every connection is up, as the adapter last said.
    connected: bool,
    /// Whether the bucket answered the last look, or why not.
    bucket: Result<(), String>,
    /// Why the bucket is refused, once its sequence went back.
    refused: Option<String>,
    /// The health last reported.
    health: Option<Health>,
    /// Each shard's highest revision seen (its calls' reads and writes, the
    /// replicas check's last sequences): a write stored at or below it went to a
    /// stream whose sequence went back.
    floors: Vec<u64>,
    /// The `renew_many` requests whose items run.
    gathers: renew_many::Gathers,
}

impl Service {
    /// A service starting at `now` (`wall` for the micro protocol's start time):
    /// it asks for its subscriptions and begins ensuring the bucket. With no server
    /// version (the client has not had the server's INFO) it refuses to start
    /// ([`ServiceEvent::StartRefused`]) and asks for nothing.
    pub fn new(config: ServiceConfig, wall: OffsetDateTime, now: Instant) -> Self {
        let mut micro = MicroService::new(config.instance_id.clone(), config.version.clone(), wall);
        if config.renew_many {
            micro = micro.with_renew_many();
        }
        let startup = Startup::new(
            config.bucket,
            &config.server_version,
            config.kv_timeout,
            now,
        );
        let call_config = CallConfig {
            mode: Mode::Starting,
            max_payload: config.max_payload,
            kv_timeout: config.kv_timeout,
            confirm_reads: false,
            shards: config.bucket.shards,
        };
        let mut admission =
            Admission::new(config.max_calls_in_flight, config.max_calls_waiting, now);
        if config.bucket.tenancy == Tenancy::Accounts {
            // No tenant's slow calls (forwards to a silent owner) hold every slot.
            admission = admission.with_tenant_share(config.max_calls_in_flight / 2);
        }
        let mut service = Self {
            micro,
            refusals: RefusalLog::new(REFUSAL_LOG_EVERY),
            admission,
            tenants: TenantLeases::new(config.max_leases_per_tenant),
            known: (config.known_capacity > 0).then(|| KnownLeases::new(config.known_capacity)),
            coalescer: None,
            check: None,
            sweep: TombstoneSweep::new(config.kv_timeout, now).with_shards(config.bucket.shards),
            stop: None,
            intake_open: true,
            late: 0,
            replies_out: HashMap::new(),
            replies_due: BTreeSet::new(),
            next_reply: 0,
            flush_asked: None,
            failed: false,
            calls: HashMap::new(),
            next_token: 0,
            deadlines: BTreeSet::new(),
            routes: HashMap::new(),
            sends_due: BTreeSet::new(),
            writes: HashMap::new(),
            next_id: 0,
            next_write: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            connected: true,
            bucket: Ok(()),
            refused: None,
            health: None,
            floors: vec![0; config.bucket.shards.count() as usize],
            gathers: renew_many::Gathers::default(),
            phase: Phase::Starting(Box::new(startup)),
            mode: Mode::Starting,
            call_config,
            config,
        };
        if service.config.bucket.tenancy == Tenancy::Accounts
            && service.config.tenant_accounts.is_empty()
        {
            service.failed = true;
            service.events.push_back(ServiceEvent::StartRefused(
                "tenancy accounts serves only the tenant accounts the deployment names: \
                 name each (serve --tenant-account TA --tenant-account TB)"
                    .to_string(),
            ));
            return service;
        }
        if service.config.server_version.trim().is_empty() {
            // Judging the server from an empty INFO would settle on `unsupported`.
            service.failed = true;
            service.events.push_back(ServiceEvent::StartRefused(
                "the client has not received the server's INFO yet: connect without \
                 retry_on_initial_connect, or wait for the connection first"
                    .to_string(),
            ));
            return service;
        }
        service.subscribe();
        service.events.push_back(ServiceEvent::Mode(Mode::Starting));
        service.pump_startup(now);
        service
    }

    fn subscribe(&mut self) {
        match self.config.bucket.tenancy {
            Tenancy::Single => {
                for endpoint in Endpoint::ALL {
                    self.events.push_back(ServiceEvent::Subscribe {
                        subject: endpoint.subject(),
                        queue: Some(QUEUE_GROUP),
                        kind: SubscriptionKind::Api,
                    });
                }
                self.subscribe_renew_many();
            }
            // Every tenant's endpoints, `api.leases.<account>.<endpoint>`.
            Tenancy::Accounts => self.events.push_back(ServiceEvent::Subscribe {
                subject: TENANT_API_SUBJECTS.to_string(),
                queue: Some(QUEUE_GROUP),
                kind: SubscriptionKind::Api,
            }),
        }
        for subject in self.micro.subjects() {
            self.events.push_back(ServiceEvent::Subscribe {
                subject,
                queue: None,
                kind: SubscriptionKind::Srv,
            });
        }
        // Change events only where something reads them: the known map, or
        // tenancy's cap (the tenants' counts decide nothing without one).
        if self.changes_unwatched_warning().is_some() {
            let subject = match self.config.bucket.tenancy {
                Tenancy::Single => changed_subject("*"),
                Tenancy::Accounts => TENANT_CHANGED_SUBJECTS.to_string(),
            };
            self.events.push_back(ServiceEvent::Subscribe {
                subject,
                queue: None,
                kind: SubscriptionKind::Changes,
            });
        }
    }

    /// What this service would lose without its change events
    /// ([`changes_unwatched_warning`]); `None` when nothing reads them.
    fn changes_unwatched_warning(&self) -> Option<String> {
        let cap = self
            .config
            .max_leases_per_tenant
            .filter(|_| self.config.bucket.tenancy == Tenancy::Accounts);
        changes_unwatched_warning(self.known.is_some(), cap)
    }

    /// The mode calls are answered in now.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// What a readiness probe answers now, and whether the connections are up:
    /// ready only while serving, connected, the bucket reachable at its last
    /// look, not refused and not stopping ([`health::readiness`]).
    pub fn health(&self) -> Health {
        let not_serving = match self.mode {
            Mode::Ready => None,
            Mode::Starting => Some(NotReady::Starting),
            Mode::Unsupported => Some(NotReady::Unsupported),
        };
        Health {
            ready: health::readiness(
                not_serving,
                self.connected,
                self.bucket.clone(),
                self.refused.as_deref(),
                self.stop.is_some() || self.failed,
            ),
            connected: self.connected,
        }
    }

    /// A connection of the service was lost (`false`) or is back (`true`), as
    /// the client's events said. Back, the bucket is asked at once: readiness
    /// waits on its answer.
    pub fn handle_connection(&mut self, now: Instant, connected: bool) {
        if connected == self.connected {
            return;
        }
        self.connected = connected;
        if connected
            && self.stop.is_none()
            && let Some(check) = &mut self.check
        {
            check.check_soon(now);
            check.handle_timeout(now);
            self.pump(now);
        }
    }

    /// Whether reads are confirmed now.
    pub fn confirm_reads(&self) -> bool {
        self.call_config.confirm_reads
    }

    /// Where a stop is, if stopping.
    pub fn stop_phase(&self) -> Option<StopPhase> {
        self.stop.as_ref().map(Shutdown::phase)
    }

    /// When the stop's current phase ends (the drain's bound while draining):
    /// how long the adapter may spend on that phase's wait, such as unsubscribing.
    pub fn stop_phase_ends(&self) -> Option<Instant> {
        self.stop.as_ref().and_then(Shutdown::poll_timeout)
    }

    /// How long a stop waits for the calls in flight.
    pub fn shutdown_timeout(&self) -> Duration {
        self.config.shutdown_timeout
    }

    /// Calls running now.
    pub fn calls_running(&self) -> usize {
        self.calls.len()
    }

    /// Admission's counts: calls running, requests waiting, refused so far.
    pub fn admission_counts(&self) -> crate::service::admit::AdmissionCounts {
        self.admission.counts()
    }

    /// The coalescer's counts, when writes go through one.
    pub fn coalescer(&self) -> Option<&Coalescer> {
        self.coalescer.as_ref()
    }

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
        if let (Some(why), None) = (&self.refused, &self.stop) {
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
                Err(refused) => pending.scope = Err(refused),
            }
        }
        let tenant = pending.tenant();
        self.admission
            .handle_request_of(now, tenant, endpoint, pending);
        self.pump(now);
    }

    /// The reply rule: the caller's scope when the reply may go out, else `None`
    /// (counted, and logged at most once per interval).
    fn gate(
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
                let log = self.refusals.handle_refused(now).map(|dropped| DroppedLog {
                    dropped,
                    subject: message.subject.clone(),
                    reply: message
                        .reply
                        .as_deref()
                        .map(|r| r.escape_debug().to_string()),
                    prefixes: self.config.reply_scope.prefixes().join(", "),
                });
                self.events.push_back(ServiceEvent::ReplyRefused {
                    source,
                    reason,
                    log,
                });
                None
            }
        }
    }

    fn handle_change(&mut self, message: &Received) {
        let header = |name: &str| {
            message
                .headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
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

    /// Publishes a reply to a subject the reply rule let through, given up if the
    /// client has not taken it within [`HANDOFF_BOUND`].
    fn reply(&mut self, now: Instant, to: String, body: Vec<u8>) {
        let id = ReplyId(self.next_reply);
        self.next_reply += 1;
        let due = now + HANDOFF_BOUND;
        self.replies_out.insert(id, due);
        self.replies_due.insert((due, id));
        self.events.push_back(ServiceEvent::Reply { id, to, body });
    }

    /// Reply `id` ([`ServiceEvent::Reply`]) was handed to the client, or its
    /// publish failed: a stop's flush waits for every one.
    pub fn handle_reply_sent(&mut self, now: Instant, id: ReplyId) {
        if let Some(due) = self.replies_out.remove(&id) {
            self.replies_due.remove(&(due, id));
        }
        self.pump(now);
    }

    /// Gives up the replies the client has not taken by `now`.
    fn give_up_replies(&mut self, now: Instant) {
        let mut given_up = 0;
        while let Some(&(due, id)) = self.replies_due.first() {
            if due > now {
                break;
            }
            self.replies_due.remove(&(due, id));
            self.replies_out.remove(&id);
            self.events.push_back(ServiceEvent::CancelReply { id });
            given_up += 1;
        }
        if given_up > 0 {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Warn,
                line: format!(
                    "{given_up} repl{} not sent: the NATS client took no command for \
                     {HANDOFF_BOUND:?}",
                    if given_up == 1 { "y" } else { "ies" }
                ),
            });
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

    /// Stopping, in a phase that ends with a flush: asks for it once every reply
    /// is handed to the client.
    fn ask_flush(&mut self) {
        let Some(phase) = self.stop.as_ref().map(Shutdown::phase) else {
            return;
        };
        if matches!(phase, StopPhase::Replies | StopPhase::Flush)
            && self.flush_asked != Some(phase)
            && self.replies_out.is_empty()
        {
            self.flush_asked = Some(phase);
            self.events.push_back(ServiceEvent::Flush { phase });
        }
    }

    /// A call's reply: counted, and sent.
    fn answered(
        &mut self,
        now: Instant,
        endpoint: Endpoint,
        reply: String,
        response: Response,
        took: Duration,
    ) {
        self.micro.handle_answered(endpoint, &response, took);
        let body = response.to_json();
        self.events.push_back(ServiceEvent::Answered {
            endpoint,
            response,
            took,
        });
        self.reply(now, reply, body);
    }

    /// Starts what admission starts and answers what it refuses.
    /// Starts or refuses what admission says; whether it said anything (a call
    /// started may have handed the coalescer a write to move along).
    fn admit(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Some(event) = self.admission.poll_event() {
            any = true;
            match event {
                AdmissionEvent::Start(endpoint, pending) => self.start(now, endpoint, pending),
                AdmissionEvent::Refuse(endpoint, pending, response) => {
                    self.acquire_ended(pending.scope.as_ref().ok(), pending.acquiring.as_deref());
                    self.events.push_back(ServiceEvent::Refused { endpoint });
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
            Err(refused) => {
                self.answered_or_gathered(
                    now,
                    pending.item,
                    endpoint,
                    pending.reply,
                    Response::Error(refused),
                    Duration::ZERO,
                );
                self.admission.handle_finished_of(now, None);
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
        self.next_token += 1;
        let token = self.next_token;
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
                deadline: None,
                sent: Vec::new(),
                writes: Vec::new(),
                shard,
                floor,
                item,
            },
        );
        self.drive(now, token);
    }

    fn effect_id(&mut self) -> EffectId {
        self.next_id += 1;
        EffectId(self.next_id)
    }

    /// Drains one call's outputs after an input: its requests go out (its stream
    /// writes through the coalescer when there is one), what it learnt goes to the
    /// known map, its reply ends it.
    fn drive(&mut self, now: Instant, token: u64) {
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
        while let Some(transmit) = running.call.poll_transmit() {
            if let Some(coalescer) = self
                .coalescer
                .as_mut()
                .filter(|_| transmit.kind.is_stream_write())
            {
                self.next_write += 1;
                let write = WriteId(self.next_write);
                running.writes.push(write);
                self.writes.insert(write, (token, transmit.id));
                coalescer.handle_write(now, write, transmit.request);
                continue;
            }
            self.next_id += 1;
            let id = EffectId(self.next_id);
            running.sent.push(id);
            self.routes.insert(
                id,
                Route::Call {
                    token,
                    inner: transmit.id,
                },
            );
            self.transmits.push_back(Transmit { id, ..transmit });
        }
        while let Some(event) = running.call.poll_event() {
            match event {
                CallEvent::Kv(fact) => self.events.push_back(ServiceEvent::Kv(fact)),
                CallEvent::Replied(response) => return self.finish(now, token, response),
            }
        }
        let deadline = running.call.poll_timeout();
        if deadline != running.deadline {
            if let Some(at) = running.deadline {
                self.deadlines.remove(&(at, token));
            }
            if let Some(at) = deadline {
                self.deadlines.insert((at, token));
            }
            running.deadline = deadline;
        }
    }

    /// A call replied: it ends, its queued writes are dropped, its reply goes out,
    /// and what it did reaches the sweep, the tenants' counts and admission.
    fn finish(&mut self, now: Instant, token: u64, response: Response) {
        let Some(running) = self.calls.remove(&token) else {
            return;
        };
        if let Some(at) = running.deadline {
            self.deadlines.remove(&(at, token));
        }
        // A request still out (a call cut off) is waited for no more.
        for id in &running.sent {
            self.cancel(*id);
        }
        for write in &running.writes {
            // A write still queued is never sent late: the call gave up on it.
            if self.writes.remove(write).is_some()
                && let Some(coalescer) = &mut self.coalescer
            {
                coalescer.handle_cancel(now, *write);
            }
        }
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
        let response = match (&self.refused, response) {
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
        self.admission.handle_finished_of(now, tenant);
    }

    /// An acquire that took a place under its tenant's cap ended: the place is
    /// given back (a grant is counted as a lease by then).
    fn acquire_ended(&mut self, scope: Option<&Option<Caller>>, key: Option<&str>) {
        if let (Some(Some(caller)), Some(key)) = (scope, key) {
            self.tenants.handle_acquire_ended(&caller.account, key);
        }
    }

    /// Feeds back the outcome of the transmit sent with `id`. An outcome nobody
    /// waits for any more (its call ended, it timed out) is ignored.
    pub fn handle_outcome(&mut self, now: Instant, id: EffectId, outcome: RequestOutcome) {
        let Some(route) = self.routes.remove(&id) else {
            return;
        };
        match route {
            Route::Call { token, inner } => self.call_outcome(now, token, id, inner, outcome),
            Route::Part { part, inner, due } => {
                self.sends_due.remove(&(due, id));
                self.part_outcome(now, part, inner, outcome);
            }
        }
        self.pump_startup(now);
        self.pump(now);
    }

    /// Hands a part's request's outcome to the part.
    fn part_outcome(&mut self, now: Instant, part: Part, inner: EffectId, outcome: RequestOutcome) {
        match part {
            Part::Coalescer => {
                if let Some(c) = &mut self.coalescer {
                    c.handle_outcome(now, inner, outcome);
                }
            }
            Part::Startup => {
                if let Phase::Starting(startup) = &mut self.phase {
                    startup.handle_outcome(now, inner, outcome);
                }
            }
            Part::Replicas => {
                if let Some(c) = &mut self.check {
                    c.handle_outcome(now, inner, outcome);
                }
            }
            Part::Sweep => self.sweep.handle_outcome(now, inner, outcome),
        }
    }

    /// Sends a part's request, timed out at its own timeout from `now`.
    fn send_for(&mut self, now: Instant, part: Part, transmit: Transmit) {
        let id = self.effect_id();
        let due = now + transmit.request.timeout;
        self.sends_due.insert((due, id));
        self.routes.insert(
            id,
            Route::Part {
                part,
                inner: transmit.id,
                due,
            },
        );
        self.transmits.push_back(Transmit { id, ..transmit });
    }

    /// Gives up a request out: nothing waits for it any more.
    fn cancel(&mut self, id: EffectId) {
        if let Some(route) = self.routes.remove(&id) {
            if let Route::Part { due, .. } = route {
                self.sends_due.remove(&(due, id));
            }
            self.events.push_back(ServiceEvent::Cancel { id });
        }
    }

    fn call_outcome(
        &mut self,
        now: Instant,
        token: u64,
        sent: EffectId,
        inner: EffectId,
        outcome: RequestOutcome,
    ) {
        let Some(running) = self.calls.get_mut(&token) else {
            return;
        };
        running.sent.retain(|s| *s != sent);
        running.call.handle_outcome(now, inner, outcome);
        self.drive(now, token);
    }

    /// Moves the coalescer's, the sweep's and the replicas check's outputs along,
    /// the calls they answer with them, and the stop's drain, until nothing is left.
    fn pump(&mut self, now: Instant) {
        loop {
            let mut moved = false;
            while let Some(CoalescerEvent::Done { write, outcome }) =
                self.coalescer.as_mut().and_then(Coalescer::poll_event)
            {
                moved = true;
                // The call may have given up: nobody to tell then.
                if let Some((token, inner)) = self.writes.remove(&write) {
                    if let Some(running) = self.calls.get_mut(&token) {
                        running.writes.retain(|w| *w != write);
                    }
                    if let Some(running) = self.calls.get_mut(&token) {
                        running.call.handle_outcome(now, inner, outcome);
                        self.drive(now, token);
                    }
                }
            }
            while let Some(t) = self.coalescer.as_mut().and_then(Coalescer::poll_transmit) {
                moved = true;
                self.send_for(now, Part::Coalescer, t);
            }
            // A call admitted now may hand the coalescer a write: go round again.
            moved |= self.admit(now);
            if !moved {
                break;
            }
        }
        if self.stop.is_none() {
            self.pump_serving(now);
        }
        self.pump_stop(now);
    }

    /// The sweep's and the replicas check's outputs, while serving.
    fn pump_serving(&mut self, now: Instant) {
        while let Some(t) = self.sweep.poll_transmit() {
            self.send_for(now, Part::Sweep, t);
        }
        while let Some(event) = self.sweep.poll_event() {
            self.sweep_event(event);
        }
        while let Some(t) = self.check.as_mut().and_then(ReplicasCheck::poll_transmit) {
            self.send_for(now, Part::Replicas, t);
        }
        while let Some(event) = self.check.as_mut().and_then(ReplicasCheck::poll_event) {
            match event {
                ReplicasCheckEvent::ConfirmReads { replicas, on } => {
                    #[cfg(any(test, feature = "__test"))]
                    let on = on && !self.config.unconfirmed_reads_for_tests;
                    self.call_config.confirm_reads = on;
                    self.events
                        .push_back(ServiceEvent::ConfirmReads { replicas, on });
                }
                ReplicasCheckEvent::StreamReplaced => {
                    if let Some(known) = &mut self.known {
                        known.clear();
                    }
                    self.events.push_back(ServiceEvent::StreamReplaced);
                }
                ReplicasCheckEvent::Reachable(reachable) => self.bucket = reachable,
                ReplicasCheckEvent::Sequence { stream, last_seq } => {
                    let shards = self.config.bucket.shards;
                    if let Some(i) = shards.indexes().find(|i| shards.stream(*i) == stream)
                        && let Some(floor) = self.floors.get_mut(i as usize)
                    {
                        *floor = (*floor).max(last_seq);
                    }
                    self.events
                        .push_back(ServiceEvent::StreamSequence { stream, last_seq })
                }
                ReplicasCheckEvent::Rewound(why) => self.refuse_bucket(why),
            }
        }
    }

    /// What the sweep reports, as metric facts and log lines.
    fn sweep_event(&mut self, event: TombstoneSweepEvent) {
        let (level, line) = match event {
            TombstoneSweepEvent::Purged { .. } => return,
            TombstoneSweepEvent::Failed { key, reason } => {
                return self.events.push_back(ServiceEvent::TombstoneLeft {
                    reason: "failed",
                    key,
                    detail: format!(
                        "the released key's purge failed ({reason}): a scan of the stream \
                         finds its tombstone"
                    ),
                });
            }
            TombstoneSweepEvent::Deferred { key } => {
                return self.events.push_back(ServiceEvent::TombstoneLeft {
                    reason: "deferred",
                    key,
                    detail: "too many tombstones queued: a scan of the stream finds this one"
                        .to_string(),
                });
            }
            TombstoneSweepEvent::ScanStarted { stream, reason } => (
                LogLevel::Debug,
                format!("scanning {stream} for tombstones left behind ({reason:?})"),
            ),
            TombstoneSweepEvent::Scanned {
                stream,
                read,
                found,
            } => (
                if found > 0 {
                    LogLevel::Info
                } else {
                    LogLevel::Debug
                },
                format!(
                    "scanned {stream}: {read} messages read, {found} tombstones left behind \
                     queued for their purge"
                ),
            ),
            TombstoneSweepEvent::ScanFailed { stream, reason } => (
                LogLevel::Warn,
                format!(
                    "the scan of {stream} for tombstones failed ({reason}); it resumes in \
                     {:?}",
                    crate::service::sweep::RETRY_AFTER
                ),
            ),
        };
        self.events.push_back(ServiceEvent::Log { level, line });
    }

    /// Refuses the bucket from now on (once): its sequence went back.
    fn refuse_bucket(&mut self, why: String) {
        if let Some(known) = &mut self.known {
            known.clear();
        }
        if self.refused.is_none() {
            self.events
                .push_back(ServiceEvent::BucketRefused(why.clone()));
            self.refused = Some(why);
        }
    }

    /// Startup's outputs; at its end, serving begins.
    fn pump_startup(&mut self, now: Instant) {
        let Phase::Starting(startup) = &mut self.phase else {
            return;
        };
        let sends: Vec<Transmit> = std::iter::from_fn(|| startup.poll_transmit()).collect();
        for t in sends {
            self.send_for(now, Part::Startup, t);
        }
        let Phase::Starting(startup) = &mut self.phase else {
            return;
        };
        let mut done = None;
        while let Some(event) = startup.poll_event() {
            match event {
                StartupEvent::Log(line) => self.events.push_back(ServiceEvent::Log {
                    level: LogLevel::Warn,
                    line,
                }),
                StartupEvent::Done(mode) => {
                    done = Some((
                        mode,
                        startup.replicas(),
                        startup.atomic(),
                        startup.seen().to_vec(),
                    ));
                }
                StartupEvent::Refused(why) => {
                    self.events.push_back(ServiceEvent::StartRefused(why));
                }
            }
        }
        if let Some((mode, replicas, atomic, seen)) = done {
            self.serve(now, mode, replicas, atomic, &seen);
        }
    }

    /// The bucket is ensured: the mode, the confirm switch's start, the coalescer
    /// and the replicas check follow from what startup found.
    fn serve(
        &mut self,
        now: Instant,
        mode: Mode,
        replicas: usize,
        atomic: bool,
        seen: &[(Option<String>, u64)],
    ) {
        self.phase = Phase::Serving;
        self.mode = mode;
        self.events.push_back(ServiceEvent::Mode(mode));
        if self.config.bucket.tenancy == Tenancy::Accounts
            && let Some(warning) = tenant::request_info_warning(&self.config.server_version)
        {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Warn,
                line: warning,
            });
        }
        // Writes gather into batches where the setting and the bucket say so
        // (`coalesce_on`: `Auto` on one replica only, where it was measured to win).
        let atomic = coalesce_on(self.config.coalesce_writes, replicas, atomic);
        if atomic {
            let config = CoalescerConfig {
                single_window: self.config.batch_after,
                min_batch: self.config.min_batch,
                // Unique per process: the server keys open batches by id.
                ..CoalescerConfig::atomic(format!("{}-", self.config.instance_id))
            };
            self.coalescer = Some(Coalescer::new(config, now));
        }
        // The replicas are asked again now and then: read confirmation follows them.
        let check = (mode == Mode::Ready).then(|| {
            ReplicasCheck::new(
                self.config.replicas_recheck,
                self.config.kv_timeout,
                replicas,
                now,
            )
            .with_shards(self.config.bucket.shards)
            .with_seen(seen)
        });
        let confirm = check.as_ref().is_some_and(ReplicasCheck::confirm_reads);
        #[cfg(any(test, feature = "__test"))]
        let confirm = confirm && !self.config.unconfirmed_reads_for_tests;
        self.check = check;
        if mode == Mode::Ready {
            self.sweep.handle_serving(now);
        }
        self.call_config = CallConfig {
            mode,
            confirm_reads: confirm,
            ..self.call_config
        };
        self.events.push_back(ServiceEvent::Serving(Serving {
            mode,
            replicas,
            confirm_reads: confirm,
            atomic_batches: atomic,
        }));
    }

    /// The time has come: requests past their deadline time out, calls past
    /// theirs act, startup retries, the replicas are asked again, and a stop's
    /// phase at its bound gives up.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Phase::Starting(startup) = &mut self.phase
            && self.stop.is_none()
            && startup.poll_timeout().is_some_and(|at| at <= now)
        {
            startup.handle_timeout(now);
            self.pump_startup(now);
        }
        // Calls first: a queued write of a call that gives up now is cancelled
        // before a send timing out at the same instant makes room for it.
        while let Some(&(at, token)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.remove(&(at, token));
            let Some(running) = self.calls.get_mut(&token) else {
                continue;
            };
            running.deadline = None;
            // What the call waits on is given up (the call counts it as it times
            // out): its send is dropped, and a queued write of it is never sent.
            let sent = std::mem::take(&mut running.sent);
            let writes = std::mem::take(&mut running.writes);
            for id in sent {
                self.cancel(id);
            }
            for write in writes {
                if self.writes.remove(&write).is_some()
                    && let Some(c) = &mut self.coalescer
                {
                    c.handle_cancel(now, write);
                }
            }
            if let Some(running) = self.calls.get_mut(&token) {
                running.call.handle_timeout(now);
            }
            self.drive(now, token);
        }
        // A stop's phase at its bound next, for the same reason: the calls it cuts
        // off give up their queued writes before a send timing out makes room.
        if let Some(stop) = &mut self.stop
            && stop.poll_timeout().is_some_and(|at| at <= now)
        {
            stop.handle_timeout(now);
            self.stop_events(now);
        }
        while let Some(&(due, id)) = self.sends_due.first() {
            if due > now {
                break;
            }
            self.sends_due.remove(&(due, id));
            // Timed out: the part learns it (unless it timed it out itself), and
            // the send is dropped.
            if let Some(Route::Part { part, inner, .. }) = self.routes.get(&id).copied() {
                self.cancel(id);
                self.part_outcome(now, part, inner, RequestOutcome::TimedOut);
            }
        }
        self.give_up_replies(now);
        self.pump_startup(now);
        if self.stop.is_none()
            && let Some(check) = &mut self.check
            && check.poll_timeout().is_some_and(|at| at <= now)
        {
            check.handle_timeout(now);
        }
        if self.stop.is_none() {
            self.sweep.handle_timeout(now);
        }
        self.pump(now);
    }

    /// Stop: take no more requests (the subscriptions go), answer every request
    /// already delivered, wait for the calls up to the drain's bound, then cut off
    /// what still runs, flush, and end. A second stop changes nothing.
    pub fn handle_stop(&mut self, now: Instant) {
        if self.stop.is_some() {
            return;
        }
        self.stop = Some(Shutdown::new(self.config.shutdown_timeout, now));
        self.events.push_back(ServiceEvent::Unsubscribe);
        self.admission.handle_stop(now);
        self.admit(now);
        let running = self.calls.len();
        if running > 0 {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Info,
                line: format!(
                    "stopping: waiting up to {:?} for {running} calls",
                    self.config.shutdown_timeout
                ),
            });
        }
        self.pump(now);
    }

    /// Every subscription of requests ended and the messages delivered before that
    /// are all fed: after the stop's unsubscribes, or earlier (the connection
    /// closed for good), in which case a stop later finds the intake closed.
    pub fn handle_intake_closed(&mut self, now: Instant) {
        self.intake_open = false;
        self.pump(now);
    }

    /// Stopping: the flush [`ServiceEvent::Flush`] asked for in `phase` is over:
    /// the client's writes of then are on the socket. It ends that phase only if
    /// the stop is still in it.
    pub fn handle_flushed(&mut self, now: Instant, phase: StopPhase) {
        if let Some(stop) = &mut self.stop
            && matches!(stop.phase(), StopPhase::Replies | StopPhase::Flush)
            && stop.phase() == phase
        {
            stop.handle_phase_done(now);
            self.stop_events(now);
        }
        self.pump(now);
    }

    /// The drain ends once the intake is closed and every call answered; a flush
    /// waits for the replies.
    fn pump_stop(&mut self, now: Instant) {
        self.ask_flush();
        let Some(stop) = &mut self.stop else {
            return;
        };
        if stop.phase() == StopPhase::Drain && !self.intake_open && self.calls.is_empty() {
            stop.handle_phase_done(now);
            self.stop_events(now);
        }
    }

    /// Acts on the stop machine's events and phase.
    fn stop_events(&mut self, now: Instant) {
        let Some(stop) = &mut self.stop else {
            return;
        };
        let mut cut = false;
        let mut lines = Vec::new();
        while let Some(event) = stop.poll_event() {
            match event {
                ShutdownEvent::GaveUp(StopPhase::Drain)
                    if self.intake_open && self.calls.is_empty() =>
                {
                    lines.push(
                        "stopping: the endpoints did not close in time (NATS unreachable?)"
                            .to_string(),
                    )
                }
                ShutdownEvent::GaveUp(phase) => {
                    lines.push(format!("stopping: gave up waiting in phase {phase:?}"))
                }
                ShutdownEvent::CutOff => cut = true,
            }
        }
        let phase = stop.phase();
        let left_drain = phase != StopPhase::Drain;
        if left_drain && self.late > 0 {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Info,
                line: format!(
                    "stopping: took {} requests delivered before the unsubscribe",
                    self.late
                ),
            });
            self.late = 0;
        }
        for line in lines {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Warn,
                line,
            });
        }
        if cut {
            self.cut_off(now);
        }
        match phase {
            StopPhase::Drain => {}
            StopPhase::Replies | StopPhase::Flush => self.ask_flush(),
            StopPhase::Done => self.events.push_back(ServiceEvent::Stopped),
        }
    }

    /// Every call still running is cut off and answers `internal`.
    fn cut_off(&mut self, now: Instant) {
        if !self.calls.is_empty() {
            self.events.push_back(ServiceEvent::Log {
                level: LogLevel::Warn,
                line: format!(
                    "stopping: {} calls did not finish in time; they are answered `internal`",
                    self.calls.len()
                ),
            });
        }
        let mut tokens: Vec<u64> = self.calls.keys().copied().collect();
        tokens.sort_unstable();
        for token in tokens {
            if let Some(running) = self.calls.get_mut(&token) {
                running.call.handle_stop(now);
                self.drive(now, token);
            }
        }
    }

    /// The next request to send; feed its outcome to [`Service::handle_outcome`].
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next thing to do or to count.
    ///
    /// Once the queue is empty, a change of [`Service::health`] since it was
    /// last reported comes as [`ServiceEvent::Health`].
    pub fn poll_event(&mut self) -> Option<ServiceEvent> {
        if self.events.is_empty() {
            let health = self.health();
            if self.health.as_ref() != Some(&health) {
                self.health = Some(health.clone());
                return Some(ServiceEvent::Health(health));
            }
        }
        self.events.pop_front()
    }

    /// When to call [`Service::handle_timeout`]: the earliest deadline of any part.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let startup = match (&self.phase, &self.stop) {
            (Phase::Starting(s), None) => s.poll_timeout(),
            _ => None,
        };
        let (check, sweep) = match &self.stop {
            None => (
                self.check.as_ref().and_then(ReplicasCheck::poll_timeout),
                self.sweep.poll_timeout(),
            ),
            Some(_) => (None, None),
        };
        [
            startup,
            check,
            sweep,
            self.deadlines.first().map(|(at, _)| *at),
            self.sends_due.first().map(|(at, _)| *at),
            self.replies_due.first().map(|(at, _)| *at),
            self.stop.as_ref().and_then(Shutdown::poll_timeout),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether the stop is over and every output was drained, or the service
    /// failed ([`ServiceEvent::Fatal`], or [`ServiceEvent::StartRefused`] for a
    /// client without the server's INFO) and said so.
    pub fn is_done(&self) -> bool {
        let stopped =
            self.stop.as_ref().is_some_and(Shutdown::is_done) && self.transmits.is_empty();
        (stopped || self.failed) && self.events.is_empty()
    }
}
