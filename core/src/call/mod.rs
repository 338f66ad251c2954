//! One state machine per call: a decoded request goes in, requests come out, each
//! request's outcome comes back as an input, and the call ends with one reply.
//!
//! This module is the engine every endpoint shares (ids, deadlines, reads and their
//! confirmation, the reply); each endpoint's decision is a module of its own.
//!
//! Files: this one holds the call's state, its inputs and the requests and reply
//! it issues; `answers.rs` what it does with each JetStream answer (read,
//! confirmation, write, conflict); `learn.rs` what it learns of its key for the
//! known map; `kv.rs` its metric facts; `fence.rs` the checks renew and release
//! share; and one file per endpoint: `acquire.rs`, `renew.rs`, `release.rs`,
//! `owner.rs`, `forward.rs`.

mod acquire;
mod answers;
mod fence;
mod forward;
mod kv;
mod learn;
mod owner;
mod release;
mod renew;

pub use acquire::MAX_ACQUIRE_WRITES;
pub use fence::{MAX_EXPIRY_GUARD, MAX_FENCED_WRITES, expiry_guard};
pub use forward::MAX_FORWARD_ATTEMPTS;
pub use kv::{KvFact, KvOp};
pub use renew::read_back_window;

use forward::ForwardJob;
use renew::Renewal;

use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::io::{Mode, RequestOutcome, Transmit, TransmitId};
use crate::js::{JsFailure, KeyState};
use crate::known::{Known, KnownLeases, KnownState};
use crate::outbox::Ids;
use crate::record::{LeaseRecord, format_time};
use crate::tenant::{self, Caller};
use crate::wire::{
    AcquireRequest, Endpoint, ErrorKind, ErrorReply, Lease, RenewRequest, Request, Response,
};

/// How many times a call confirms a read before it gives up with `unavailable`.
pub const MAX_READ_CONFIRMS: u32 = 3;
/// The default bound on one JetStream request.
pub const DEFAULT_KV_TIMEOUT: Duration = Duration::from_secs(5);

/// What every call needs to know about the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallConfig {
    /// Whether leases can be served.
    pub mode: Mode,
    /// The server's `max_payload`, which bounds a forward's reply.
    pub max_payload: usize,
    /// Bound on each JetStream request.
    pub kv_timeout: Duration,
    /// Confirm every read a call answers from with a conditional write, so that a
    /// deposed stream leader's stale state never reaches a caller. On when the
    /// bucket has more than one replica; with one there is no other leader.
    pub confirm_reads: bool,
    /// How keys are spread over streams: a call's reads, writes and confirmations
    /// go to the stream of its key's shard.
    pub shards: ShardMap,
}

impl CallConfig {
    /// A ready service with the server's `max_payload`, on a single-replica bucket.
    pub fn ready(max_payload: usize) -> Self {
        Self {
            mode: Mode::Ready,
            max_payload,
            kv_timeout: DEFAULT_KV_TIMEOUT,
            confirm_reads: false,
            shards: ShardMap::SINGLE,
        }
    }

    /// The same, with read confirmation as a bucket of `replicas` needs it.
    pub fn for_replicas(self, replicas: usize) -> Self {
        Self {
            confirm_reads: replicas > 1,
            ..self
        }
    }
}

pub use crate::call_request::{CallRequest, ConfirmRead, InboxRequest, KvRead, KvWrite, Operation};
use crate::shard::ShardMap;

/// What a call reports: facts about its JetStream requests as it reads their
/// outcomes, and at its end its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallEvent {
    /// A fact about one of the call's JetStream requests, for the metrics: a read
    /// confirmation sent or retried, or a request failed (and how), as the call
    /// read the outcome it acts on.
    Kv(KvFact),
    /// The call's reply: its last event, after which it is done.
    Replied(Response),
}

#[derive(Debug)]
enum Waiting {
    Nothing,
    Read,
    /// A confirmation of this read is in flight.
    Confirm(KeyState),
    Write,
    Inbox,
}

#[derive(Debug)]
enum Job {
    Acquire(AcquireRequest),
    /// The request, and once it writes: the record its write carries and the lease
    /// it renews.
    Renew(RenewRequest, Option<Renewal>),
    Release {
        key: String,
        holder: String,
        revision: u64,
    },
    Owner {
        key: String,
    },
    Forward(ForwardJob),
    Done,
}

/// One call, from decoded request to reply.
///
/// Drive it by draining [`Call::poll_transmit`] after every input until it returns
/// `None`, sending each request and feeding its outcome to [`Call::handle_outcome`];
/// call [`Call::handle_timeout`] when [`Call::poll_timeout`] passes, and
/// [`Call::handle_stop`] when the service will not wait for it any longer. Its
/// events ([`Call::poll_event`]) end with its reply ([`CallEvent::Replied`]); then
/// it [`is_done`](Call::is_done).
#[derive(Debug)]
pub struct Call {
    job: Job,
    config: CallConfig,
    started_wall: OffsetDateTime,
    started_at: Instant,
    waiting: Waiting,
    /// The id its owner gave the request waited for, once it went out.
    out: Option<TransmitId>,
    /// When the effect waited for times out (the call keeps its own deadlines).
    waiting_until: Option<Instant>,
    /// The time of the input being handled.
    now: Instant,
    writes: u32,
    confirms: u32,
    effects: std::collections::VecDeque<CallRequest>,
    /// What the call reports, until polled.
    events: std::collections::VecDeque<CallEvent>,
    /// Tenancy: who asked, as the server vouched (`None`: one shared namespace).
    scope: Option<Caller>,
    /// What the service knew of the key's last revision when the call started.
    known: Option<Known>,
    /// The newest fact the call learnt about its key, until polled.
    learnt: Option<(String, Known)>,
    /// The write in flight: the instant it was asked for and the record it stores
    /// (`None`: a tombstone).
    sent: Option<(Instant, Option<LeaseRecord>)>,
    /// The highest sequence its own writes and confirmations were stored at.
    stored_max: u64,
    /// The highest revision it saw: read, or stored by its writes.
    seen_max: u64,
}

impl Call {
    /// Starts a call from a raw request body.
    ///
    /// `wall` is the wall-clock time now (for `acquired_at` and `expires_at`); `now`
    /// is the monotonic time that bounds forward's `timeout_ms`.
    pub fn new(
        config: CallConfig,
        endpoint: Endpoint,
        body: &[u8],
        wall: OffsetDateTime,
        now: Instant,
    ) -> Self {
        Self::new_scoped(config, None, None, endpoint, body, wall, now)
    }

    /// Starts a call that may act on what the service knows of its key
    /// ([`KnownLeases`]): a renew or release of the revision known goes straight to
    /// its conditional write, an owner on a replicated bucket straight to the read
    /// confirmation; anything not known is read first, as [`Call::new`] does. Feed
    /// what the call learns ([`Call::poll_learnt`]) back into the map.
    pub fn with_known(
        config: CallConfig,
        known: &KnownLeases,
        endpoint: Endpoint,
        body: &[u8],
        wall: OffsetDateTime,
        now: Instant,
    ) -> Self {
        Self::new_scoped(config, None, Some(known), endpoint, body, wall, now)
    }

    /// [`Call::new`] for a tenant's `caller` ([`crate::tenant`]): its keys live
    /// under its account, its holders' inboxes are reached through the account's
    /// import, and a lease is bound to the user that acquired it. With `known`,
    /// as [`Call::with_known`].
    pub fn new_scoped(
        config: CallConfig,
        scope: Option<Caller>,
        known: Option<&KnownLeases>,
        endpoint: Endpoint,
        body: &[u8],
        wall: OffsetDateTime,
        now: Instant,
    ) -> Self {
        let mut call = Self {
            scope,
            job: Job::Done,
            config,
            started_wall: wall,
            started_at: now,
            out: None,
            waiting: Waiting::Nothing,
            waiting_until: None,
            now,
            writes: 0,
            confirms: 0,
            effects: Default::default(),
            events: Default::default(),
            known: None,
            learnt: None,
            sent: None,
            stored_max: 0,
            seen_max: 0,
        };
        match config.mode {
            Mode::Unsupported => {
                call.fail(ErrorReply::new(
                    ErrorKind::Unsupported,
                    "leases need nats-server 2.11 or newer (per-message TTL); this server \
                     cannot expire keys, so there is no leases bucket",
                ));
                return call;
            }
            Mode::Starting => {
                call.fail(ErrorReply::new(
                    ErrorKind::Unavailable,
                    "the lease service is still starting: retry shortly",
                ));
                return call;
            }
            Mode::Ready => {}
        }
        match Request::decode(endpoint, body) {
            Err(e) => call.fail(e),
            Ok(request) => {
                // Known by where the key is stored: a tenant's under its account.
                let stored = tenant::storage_key(call.scope.as_ref(), request.key());
                call.known = known.and_then(|k| k.get(&stored)).cloned();
                call.start(now, request)
            }
        }
        call
    }

    fn start(&mut self, now: Instant, request: Request) {
        match request {
            Request::Acquire(r) => {
                let key = r.key.clone();
                self.job = Job::Acquire(r);
                self.write_create(key, 0);
            }
            Request::Renew(r) => {
                self.job = Job::Renew(r, None);
                self.start_renew(now);
            }
            Request::Release(r) => {
                self.job = Job::Release {
                    key: r.key,
                    holder: r.holder,
                    revision: r.revision,
                };
                self.start_release(now);
            }
            Request::Owner(r) => {
                let key = r.key.clone();
                self.job = Job::Owner { key: r.key };
                // The reply's times are the stored message's: a revision known only
                // from the service's own write (no server store time) is read.
                let exact = self.known.as_ref().is_some_and(|k| match &k.state {
                    KnownState::Held { stamp, .. } => stamp.server.is_some(),
                    _ => true,
                });
                match self.known_state(now) {
                    // Only a read a call answers from is confirmed: on one replica
                    // the call reads, as it always did.
                    Some(state) if self.config.confirm_reads && exact => self.confirm(now, state),
                    _ => self.read(key),
                }
            }
            Request::Forward(r) => {
                let key = r.key.clone();
                let deadline = now + Duration::from_millis(r.timeout_ms);
                self.job = Job::Forward(ForwardJob {
                    request: r,
                    deadline,
                    attempts: 0,
                    last_tried: None,
                    retry: None,
                });
                self.read_before(key, now, deadline);
            }
        }
    }

    /// The next request to send, if any, under an id from its owner's `ids`:
    /// its outcome comes back with that id.
    pub fn poll_transmit(&mut self, ids: &mut Ids<TransmitId>) -> Option<Transmit> {
        let effect = self.poll_request(ids)?;
        let account = self.scope.as_ref().map(|c| c.account.as_str());
        Some(effect.into_transmit_for_account(account, &self.config.shards))
    }

    /// The next thing the call reports: its reply last.
    pub fn poll_event(&mut self) -> Option<CallEvent> {
        self.events.pop_front()
    }

    /// The highest sequence the call's own writes and read confirmations were
    /// stored at (0: none yet). Sent after the call started, each must be above
    /// every revision the service saw before then: one that is not says the
    /// stream's sequence went back ([`crate::service`]).
    pub fn highest_stored(&self) -> u64 {
        self.stored_max
    }

    /// The highest revision the call saw: read, or stored by its writes.
    pub fn highest_seen(&self) -> u64 {
        self.seen_max
    }

    /// The key as stored (a tenant's under its account): which shard it is on.
    pub fn storage_key(&self) -> String {
        tenant::storage_key(self.scope.as_ref(), self.key())
    }

    /// The newest fact the call learnt about its key (from a leader read, or from a
    /// write of its own that was stored), for the service's [`KnownLeases`]: the
    /// key and what its revision holds. Drain it with the other outputs.
    pub fn poll_learnt(&mut self) -> Option<(String, Known)> {
        self.learnt.take()
    }

    /// The next request as the call decided it, under an id from its owner's
    /// `ids` (table tests read its fields).
    pub fn poll_request(&mut self, ids: &mut Ids<TransmitId>) -> Option<CallRequest> {
        let mut effect = self.effects.pop_front()?;
        let id = ids.allocate();
        effect.set_id(id);
        self.out = Some(id);
        Some(effect)
    }

    /// When [`Call::handle_timeout`] must be called, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let forward = match &self.job {
            Job::Forward(f) => Some(f.deadline),
            _ => None,
        };
        let effect = match self.waiting {
            Waiting::Nothing => None,
            _ => self.waiting_until,
        };
        forward.into_iter().chain(effect).min()
    }

    /// Whether the call has replied and its events were polled: nothing more to do.
    pub fn is_done(&self) -> bool {
        self.replied() && self.effects.is_empty() && self.events.is_empty()
    }

    fn replied(&self) -> bool {
        matches!(self.job, Job::Done)
    }

    /// The time has come: a forward past its deadline ends with `owner_timeout`;
    /// an effect unanswered within its timeout has timed out
    /// ([`RequestOutcome::TimedOut`]).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        if self.forward_past_deadline(now) {
            // What it waited on is given up unanswered.
            if let Some(op) = self.waiting_op() {
                self.report(KvFact::timed_out(op));
            }
            return self.fail_deadline();
        }
        if matches!(self.waiting, Waiting::Nothing) {
            return;
        }
        if self.waiting_until.is_some_and(|at| now >= at) {
            self.waited_outcome(now, RequestOutcome::TimedOut);
        }
    }

    /// The service is stopping and will not wait for this call any longer: a call
    /// that has not replied yet ends `internal` ("the service is stopping"), naming
    /// the owner a forward last tried, or `owner_timeout` if a forward's deadline has
    /// passed by `now` anyway. The outcome of the effect in flight is never learnt:
    /// a write may still land (as after any `internal` or `unavailable` reply, the
    /// caller's retry finds out). A no-op on a call that has replied.
    pub fn handle_stop(&mut self, now: Instant) {
        self.now = now;
        if self.replied() {
            return;
        }
        if self.forward_past_deadline(now) {
            return self.fail_deadline();
        }
        self.fail_naming_owner(ErrorReply::new(
            ErrorKind::Internal,
            "the service is stopping: the call was cut off before it finished; \
             its outcome is unknown, retry",
        ));
    }

    /// Whether this is a forward whose `timeout_ms` has run out at `now`.
    fn forward_past_deadline(&self, now: Instant) -> bool {
        matches!(&self.job, Job::Forward(f) if now >= f.deadline)
    }

    /// Ends a forward whose deadline passed with `owner_timeout`, naming the owner
    /// last tried.
    fn fail_deadline(&mut self) {
        self.fail_naming_owner(ErrorReply::new(
            ErrorKind::OwnerTimeout,
            "the forward ran out of timeout_ms before the owner replied",
        ));
    }

    /// Feeds back what came of effect `id`. Outcomes for effects the call no longer
    /// waits for (after a timeout, say) are ignored.
    ///
    /// A forward decides its deadline from `now`, not from when the adapter's timer
    /// fires: a (re-)read or its confirmation that comes back at or after the
    /// deadline ends the call `owner_timeout`, whatever it found, as does an owner's
    /// "no responders" or reject then (there is no time left to try again). Only an
    /// owner's own reply is taken as it is.
    pub fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        self.now = now;
        if self.out != Some(id) {
            return;
        }
        self.waited_outcome(now, outcome);
    }

    /// Reads the key again, within a forward's deadline.
    fn reread(&mut self, now: Instant) {
        let key = self.key().to_string();
        match &self.job {
            Job::Forward(f) => {
                let deadline = f.deadline;
                self.read_before(key, now, deadline);
            }
            _ => self.read(key),
        }
    }

    /// The time left for one JetStream request: a forward's deadline bounds it too.
    fn kv_timeout(&self, now: Instant) -> Duration {
        match &self.job {
            Job::Forward(f) => self
                .config
                .kv_timeout
                .min(f.deadline.saturating_duration_since(now)),
            _ => self.config.kv_timeout,
        }
    }

    /// Asks for `effect` and waits for its outcome until its timeout has passed.
    fn issue(&mut self, waiting: Waiting, effect: CallRequest) {
        self.waiting = waiting;
        self.out = None;
        self.waiting_until = Some(self.now + effect.timeout());
        self.effects.push_back(effect);
    }

    fn read(&mut self, key: String) {
        let id = TransmitId::UNSENT;
        let timeout = self.config.kv_timeout;
        self.issue(
            Waiting::Read,
            CallRequest::KvRead(KvRead { id, key, timeout }),
        );
    }

    /// A read bounded by a forward's deadline.
    fn read_before(&mut self, key: String, now: Instant, deadline: Instant) {
        let id = TransmitId::UNSENT;
        let timeout = self
            .config
            .kv_timeout
            .min(deadline.saturating_duration_since(now));
        self.issue(
            Waiting::Read,
            CallRequest::KvRead(KvRead { id, key, timeout }),
        );
    }

    fn write(&mut self, mut write: KvWrite) {
        write.id = TransmitId::UNSENT;
        self.writes += 1;
        let record = match write.operation {
            Operation::Put => LeaseRecord::parse(&write.value).ok(),
            Operation::Delete => None,
        };
        self.sent = Some((self.now, record));
        self.issue(Waiting::Write, CallRequest::KvWrite(write));
    }

    fn reply(&mut self, response: Response) {
        self.job = Job::Done;
        self.waiting = Waiting::Nothing;
        self.out = None;
        self.waiting_until = None;
        self.effects.clear();
        self.events.push_back(CallEvent::Replied(response));
    }

    fn fail(&mut self, error: ErrorReply) {
        self.reply(Response::Error(error));
    }

    /// Fails with `error`, naming the owner a forward tried last (if any).
    fn fail_naming_owner(&mut self, error: ErrorReply) {
        let last = match &self.job {
            Job::Forward(f) => f.last_tried.clone(),
            _ => None,
        };
        self.fail(with_owner(error, last));
    }

    fn fail_js(&mut self, mut failure: JsFailure) {
        if let Job::Renew(
            r,
            Some(Renewal {
                written: Some(revision),
                ..
            }),
        ) = &self.job
        {
            // The write landed; when, by the server's clock, is unknown.
            failure.detail = format!(
                "the renewal of `{}` was written at revision {revision}, but reading it back \
                 to check it landed before the lease's end failed ({}): its outcome is \
                 unknown, retry",
                r.key, failure.detail
            );
        }
        self.fail_naming_owner(ErrorReply::new(failure.kind, failure.detail));
    }

    fn lease_from_record(
        &self,
        key: &str,
        revision: u64,
        record: &LeaseRecord,
        since: OffsetDateTime,
    ) -> Lease {
        Lease {
            held: true,
            key: key.to_string(),
            holder: record.holder.clone(),
            revision,
            acquired_at: record.acquired_at.clone(),
            expires_at: format_time(since + Duration::from_millis(record.ttl_ms)),
            ttl_ms: record.ttl_ms,
        }
    }

    fn key(&self) -> &str {
        match &self.job {
            Job::Acquire(r) => &r.key,
            Job::Renew(r, _) => &r.key,
            Job::Release { key, .. } | Job::Owner { key } => key,
            Job::Forward(f) => &f.request.key,
            Job::Done => "",
        }
    }
}

fn with_owner(mut e: ErrorReply, owner: Option<(String, u64)>) -> ErrorReply {
    if let Some((holder, revision)) = owner {
        e.holder = Some(holder);
        e.revision = Some(revision);
    }
    e
}
