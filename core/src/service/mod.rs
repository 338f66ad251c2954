//! The lease service as one machine, in the manner of quinn-proto's `Endpoint`: it
//! composes every machine a serving process runs (bucket [`Startup`], the reply
//! rule of [`ReplyScope`](crate::reply_scope::ReplyScope), tenancy's scope and cap ([`crate::tenant`]),
//! [`Admission`], one [`Call`] per request keyed by its [`CallId`], the write
//! [`Coalescer`], the [`KnownLeases`] map, the [`ReplicasCheck`] and its confirm
//! switch, the [`TombstoneSweep`], the micro protocol's verbs ([`MicroService`])
//! and the [`Shutdown`] phases), so that every decision of the service is here,
//! simulated and fuzzed, and an adapter only subscribes, receives, sends, flushes
//! and arms one timer.
//!
//! The parts only the service runs live beside it, in this folder ([`startup`],
//! [`replicas`], [`coalesce`], [`admit`], [`sweep`], [`micro`], [`shutdown`]); the
//! calls are [`crate::call`]'s, and the vocabulary both sides speak is flat in the
//! crate root. The machine itself has a file per job: this one holds its state, its
//! start, the timer and the outputs; `intake.rs` what comes in (requests, verbs,
//! change events, the reply rule, admission's verdicts); `calls.rs` the calls
//! running, the outcomes fed back and the give-up of what nobody waits for;
//! `parts.rs` startup, the coalescer, the sweep and the replicas check moved
//! along; `replies.rs` the reply hand-off; `stop.rs` the stop's phases. Ids,
//! deadlines and routes are kept through [`crate::outbox`].
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
//! Every input ends with the one pump (`parts.rs`): each part's outputs move
//! along in one fixed order until nothing is left, so whatever the adapter polls
//! first, and every `&self` accessor ([`Service::poll_timeout`],
//! [`Service::mode`], [`Service::health`]), sees the machine settled. Pumping at
//! poll time instead would leave the next input reading an unsettled machine (a
//! request after startup's last outcome answered `unavailable`, a reconnect
//! finding no replicas check yet): each input would pump first all the same.
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
pub mod bucket;
mod calls;
pub mod coalesce;
mod config;
mod intake;
mod intake_order;
pub mod micro;
mod parts;
pub mod peers;
#[cfg(any(test, feature = "__test"))]
mod probe;
mod renew_many;
pub mod replicas;
mod replies;
pub mod shutdown;
pub mod startup;
mod stop;
pub mod sweep;
mod types;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use self::admit::{Admission, AdmissionEvent};
use self::coalesce::{Coalescer, CoalescerConfig, CoalescerEvent, coalesce_on, single_window};
use self::micro::MicroService;
use self::peers::Peers;
use self::replicas::{ReplicasCheck, ReplicasCheckEvent};
use self::shutdown::{Shutdown, ShutdownEvent, StopPhase};
use self::startup::{Startup, StartupEvent};
use self::sweep::{TombstoneSweep, TombstoneSweepEvent};
use crate::call::{Call, CallConfig, CallEvent};
use crate::change::ChangeEvent;
use crate::health::{self, Health, LogLevel, NotReady};
use crate::io::{HANDOFF_BOUND, Mode, RequestOutcome, Transmit, TransmitId};
use crate::known::KnownLeases;
use crate::outbox::{CallId, Due, Handoff, Ids, Requests};
use crate::reply_scope::{DROP_LOG_EVERY, DropLog};
use crate::subjects::{
    API_PREFIX, CHANGED_PREFIX, QUEUE_GROUP, TENANT_API_SUBJECTS, TENANT_CHANGED_SUBJECTS,
    changed_subject,
};
use crate::tenant::{self, Caller, Tenancy, TenantLeases};
use crate::wire::{Endpoint, ErrorKind, ErrorReply, Response};

pub use self::config::{DEFAULT_MAX_CALLS_IN_FLIGHT, DEFAULT_SHUTDOWN_TIMEOUT, ServiceConfig};
pub use self::intake_order::Arrivals;
pub use self::types::{
    Answered, DroppedLog, Received, ReplyId, RequestSource, ServiceEvent, Serving, SubscriptionKind,
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

/// Who asked for a request: what its outcome goes to. Every request of the
/// service, a call's or a part's, is named by one id of the service's own.
#[derive(Debug, Clone, Copy)]
enum Route {
    /// A call's request, sent to the adapter: the call keeps its deadline.
    Call(CallId),
    /// A call's stream write, handed to the coalescer (never to the adapter):
    /// its result comes back from the coalescer under the same id.
    Write(CallId),
    /// Another part's request, timed out by the service at its own timeout.
    Part(Part),
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
    /// Its requests out, to the adapter or in the coalescer.
    sent: Vec<TransmitId>,
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
    drops: DropLog,
    admission: Admission<Pending>,
    tenants: TenantLeases,
    known: Option<KnownLeases>,
    /// Who else serves, where that decides the change subscription.
    peers: Option<Peers>,
    coalescer: Option<Coalescer>,
    check: Option<ReplicasCheck>,
    sweep: TombstoneSweep,
    stop: Option<Shutdown>,
    intake_open: bool,
    late: usize,
    /// Replies sent ([`ServiceEvent::Reply`]) and not yet handed to the client.
    replies: Handoff<ReplyId>,
    reply_ids: Ids<ReplyId>,
    /// The stop phase a flush was asked for last.
    flush_asked: Option<StopPhase>,
    /// A subscription the service cannot serve without failed.
    failed: bool,
    calls: HashMap<CallId, Running>,
    call_ids: Ids<CallId>,
    /// Each call's deadline.
    deadlines: Due<CallId>,
    /// Requests out, by whom each belongs to; the parts' timed out here.
    routes: Requests<TransmitId, Route>,
    /// The ids of every request of the service, its calls' and its parts'.
    transmit_ids: Ids<TransmitId>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<ServiceEvent>,
    /// Whether every connection is up, as the adapter last said.
    connected: bool,
    /// Whether the bucket answered the last look, or why not.
    bucket: Result<(), String>,
    /// Why the bucket is refused, once its sequence went back.
    bucket_refused: Option<String>,
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
            drops: DropLog::new(DROP_LOG_EVERY),
            admission,
            tenants: TenantLeases::new(config.max_leases_per_tenant),
            known: (config.known_capacity > 0).then(|| KnownLeases::new(config.known_capacity)),
            peers: Self::peers_of(&config, now),
            coalescer: None,
            check: None,
            sweep: TombstoneSweep::new(config.kv_timeout, now).with_shards(config.bucket.shards),
            stop: None,
            intake_open: true,
            late: 0,
            replies: Handoff::new(),
            reply_ids: Ids::starting_from(0),
            flush_asked: None,
            failed: false,
            calls: HashMap::new(),
            call_ids: Ids::starting_from(1),
            deadlines: Due::new(),
            routes: Requests::new(),
            transmit_ids: Ids::starting_from(1),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            connected: true,
            bucket: Ok(()),
            bucket_refused: None,
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
        service.events.push_back(ServiceEvent::Starting);
        service.pump(now);
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
        // tenancy's cap (the tenants' counts decide nothing without one); with
        // `changes: auto`, only once another instance is heard ([`peers`]).
        if self.changes_at_start() {
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
        self.subscribe_presence();
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
                self.bucket_refused.as_deref(),
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
        }
        self.pump(now);
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

    /// The time has come: requests past their deadline time out, calls past
    /// theirs act, startup retries, the replicas are asked again, and a stop's
    /// phase at its bound gives up.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Phase::Starting(startup) = &mut self.phase
            && self.stop.is_none()
            && startup.poll_timeout().is_some_and(|at| at <= now)
        {
            startup.handle_timeout(now);
        }
        // The calls, then a stop's cut-off, before the sends time out: the
        // coalescer picks its next send as one ends, so a write whose call gives
        // up at this instant must leave its queue first.
        self.expire_calls(now);
        if let Some(stop) = &mut self.stop
            && stop.poll_timeout().is_some_and(|at| at <= now)
        {
            stop.handle_timeout(now);
            self.stop_events(now);
        }
        self.time_out_sends(now);
        self.give_up_replies(now);
        if self.stop.is_none()
            && let Some(check) = &mut self.check
            && check.poll_timeout().is_some_and(|at| at <= now)
        {
            check.handle_timeout(now);
        }
        if self.stop.is_none() {
            self.sweep.handle_timeout(now);
        }
        self.peers_handle_timeout(now);
        self.pump(now);
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
            self.deadlines.next(),
            self.routes.next_due(),
            self.replies.next_due(),
            self.stop.as_ref().and_then(Shutdown::poll_timeout),
            self.peers_timeout(),
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
            self.stop.as_ref().is_some_and(Shutdown::is_stopped) && self.transmits.is_empty();
        (stopped || self.failed) && self.events.is_empty()
    }
}
