//! One state machine per call: a decoded request goes in, effects come out, each
//! effect's outcome comes back as an input, and the call ends with one reply.

use std::time::{Duration, Instant};

use base64::Engine as _;
use time::OffsetDateTime;

use crate::io::RequestOutcome;
use crate::io::{EffectId, Mode, Transmit};
use crate::js::{self, JsFailure, KeyState, PublishResult};
use crate::record::{HDR_REJECT, LeaseEvent, LeaseRecord, REJECT_STALE, format_time};
use crate::wire::{
    AcquireReply, AcquireRequest, Endpoint, ErrorKind, ErrorReply, ForwardReply, ForwardRequest,
    FreeReply, Lease, ReleaseReply, RenewRequest, Request, Response,
};

/// How many creates an acquire tries when the key keeps changing under it.
pub const MAX_ACQUIRE_WRITES: u32 = 4;
/// How many times renew and release re-read after a write lost a race.
pub const MAX_FENCED_WRITES: u32 = 2;
/// How many times a call confirms a read before it gives up with `unavailable`.
pub const MAX_READ_CONFIRMS: u32 = 3;
/// The most a lease may have left for renew and release to refuse it as `lost`.
///
/// An expiry is not atomic on nats-server: the expiring revision is checked on a
/// timer, then a `MaxAge` marker with `Nats-Rollup: sub` is proposed, which removes
/// whatever the key holds when it applies. A renew that lands after the old
/// revision's end, before the marker, is acknowledged and then wiped (seen in the
/// partition scenario: renewed at revision 1877, marker 1878 a moment later). So a
/// lease this close to its end is treated as gone (see [`expiry_guard`]): before
/// the write by the service's clock, after it by the renewal's own store time.
pub const MAX_EXPIRY_GUARD: Duration = Duration::from_secs(1);

/// The guard for a lease of `ttl_ms`: a quarter of it, at most [`MAX_EXPIRY_GUARD`],
/// so that a holder renewing every third of its TTL clears it even after one
/// failed renewal.
pub fn expiry_guard(ttl_ms: u64) -> Duration {
    MAX_EXPIRY_GUARD.min(Duration::from_millis(ttl_ms / 4))
}

/// How close to the end of the lease it renews (a lease of `ttl_ms`) a renew's ack
/// may come, by the service's clock, before the call reads the renewal back to
/// decide on the server's clock whether it landed in time: half the TTL, the
/// second half of the old lease.
///
/// The end is the server's (the old revision's store time + TTL), the ack time the
/// service's, so a service clock lagging the server's makes a late ack look early.
/// Half a TTL still reads back every renewal that can have landed within the
/// [`expiry_guard`] of the end while the lag is under `ttl/2 - guard` (250 ms at
/// the 1 s minimum, 1 s at 4 s, 6.5 s at 15 s), far beyond what NTP leaves. A
/// holder renewing every ttl/3 is acknowledged about a third into the old lease,
/// so it normally costs no read; a service clock running ahead costs reads, never
/// a wrong answer.
pub fn read_back_window(ttl_ms: u64) -> Duration {
    Duration::from_millis(ttl_ms / 2)
}

/// How many owners a forward tries at most.
pub const MAX_FORWARD_ATTEMPTS: u32 = 3;
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
}

impl CallConfig {
    /// A ready service with the server's `max_payload`, on a single-replica bucket.
    pub fn ready(max_payload: usize) -> Self {
        Self {
            mode: Mode::Ready,
            max_payload,
            kv_timeout: DEFAULT_KV_TIMEOUT,
            confirm_reads: false,
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

pub use crate::effect::{ConfirmRead, Effect, InboxRequest, KvRead, KvWrite, Operation};

#[derive(Debug)]
enum Waiting {
    Nothing,
    Read(EffectId),
    /// A confirmation of this read is in flight.
    Confirm(EffectId, KeyState),
    Write(EffectId),
    Inbox(EffectId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    NoResponders,
    Rejected,
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

/// A renew's write: the record it carries, the end (by the server's store time) and
/// TTL of the lease it renews, and once stored, its revision (the call then reads
/// the key back: see [`read_back_window`]).
#[derive(Debug)]
struct Renewal {
    record: LeaseRecord,
    ends: OffsetDateTime,
    old_ttl_ms: u64,
    written: Option<u64>,
}

#[derive(Debug)]
struct ForwardJob {
    request: ForwardRequest,
    deadline: Instant,
    attempts: u32,
    last_tried: Option<(String, u64)>,
    retry: Option<Retry>,
}

/// One call, from decoded request to reply.
///
/// Drive it by draining [`Call::poll_transmit`] after every input until it returns
/// `None`, sending each request and feeding its outcome to [`Call::handle_outcome`];
/// call [`Call::handle_timeout`] when [`Call::poll_timeout`] passes. The call's one
/// event is its reply ([`Call::poll_event`]); then it [`is_done`](Call::is_done).
#[derive(Debug)]
pub struct Call {
    job: Job,
    config: CallConfig,
    started_wall: OffsetDateTime,
    started_at: Instant,
    next_id: u64,
    waiting: Waiting,
    /// When the effect waited for times out (the call keeps its own deadlines).
    waiting_until: Option<Instant>,
    /// The time of the input being handled.
    now: Instant,
    writes: u32,
    confirms: u32,
    effects: std::collections::VecDeque<Effect>,
    /// The reply, until polled.
    reply: Option<Response>,
}

impl Call {
    /// Starts a call from a raw request body.
    ///
    /// `wall` is the wall-clock time now (for `acquired_at` and `expires_at`); `now`
    /// is the monotonic time that bounds forward's `timeout_ms`.
    pub fn new(
        config: CallConfig,
        now: Instant,
        wall: OffsetDateTime,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Self {
        let mut call = Self {
            job: Job::Done,
            config,
            started_wall: wall,
            started_at: now,
            next_id: 0,
            waiting: Waiting::Nothing,
            waiting_until: None,
            now,
            writes: 0,
            confirms: 0,
            effects: Default::default(),
            reply: None,
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
            Ok(request) => call.start(now, request),
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
                let key = r.key.clone();
                self.job = Job::Renew(r, None);
                self.read(key);
            }
            Request::Release(r) => {
                let key = r.key.clone();
                self.job = Job::Release {
                    key: r.key,
                    holder: r.holder,
                    revision: r.revision,
                };
                self.read(key);
            }
            Request::Owner(r) => {
                let key = r.key.clone();
                self.job = Job::Owner { key: r.key };
                self.read(key);
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

    /// The next request to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.effects.pop_front().map(Effect::into_transmit)
    }

    /// The reply, once the call has one: its one event.
    pub fn poll_event(&mut self) -> Option<Response> {
        self.reply.take()
    }

    /// The next request as the call decided it, for table tests that read its fields.
    #[cfg(any(test, feature = "__test"))]
    #[doc(hidden)]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
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

    /// Whether the call has replied and its reply was polled: nothing more to do.
    pub fn is_done(&self) -> bool {
        self.replied() && self.effects.is_empty() && self.reply.is_none()
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
            return self.fail_deadline();
        }
        let id = match self.waiting {
            Waiting::Read(id) | Waiting::Write(id) | Waiting::Inbox(id) => id,
            Waiting::Confirm(id, _) => id,
            Waiting::Nothing => return,
        };
        if self.waiting_until.is_some_and(|at| now >= at) {
            self.handle_outcome(now, id, RequestOutcome::TimedOut);
        }
    }

    /// The service is stopping and will not wait for this call any longer: a call
    /// that has not replied yet ends `internal` ("the service is stopping"), naming
    /// the owner a forward last tried, or `owner_timeout` if a forward's deadline has
    /// passed by `now` anyway. The outcome of the effect in flight is never learnt:
    /// a write may still land (as after any `internal` or `unavailable` reply, the
    /// caller's retry finds out). A no-op on a call that has replied.
    pub fn abort(&mut self, now: Instant) {
        self.now = now;
        if self.replied() {
            return;
        }
        if self.forward_past_deadline(now) {
            return self.fail_deadline();
        }
        let last = match &self.job {
            Job::Forward(f) => f.last_tried.clone(),
            _ => None,
        };
        self.fail(with_owner(
            ErrorReply::new(
                ErrorKind::Internal,
                "the service is stopping: the call was cut off before it finished; \
                 its outcome is unknown, retry",
            ),
            last,
        ));
    }

    /// Whether this is a forward whose `timeout_ms` has run out at `now`.
    fn forward_past_deadline(&self, now: Instant) -> bool {
        matches!(&self.job, Job::Forward(f) if now >= f.deadline)
    }

    /// Ends a forward whose deadline passed with `owner_timeout`, naming the owner
    /// last tried.
    fn fail_deadline(&mut self) {
        let last = match &self.job {
            Job::Forward(f) => f.last_tried.clone(),
            _ => None,
        };
        self.fail(with_owner(
            ErrorReply::new(
                ErrorKind::OwnerTimeout,
                "the forward ran out of timeout_ms before the owner replied",
            ),
            last,
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
    pub fn handle_outcome(&mut self, now: Instant, id: EffectId, outcome: RequestOutcome) {
        self.now = now;
        let late = self.forward_past_deadline(now)
            && match &self.waiting {
                Waiting::Read(w) | Waiting::Confirm(w, _) => *w == id,
                Waiting::Inbox(w) => *w == id && !is_owner_reply(&outcome),
                Waiting::Nothing | Waiting::Write(_) => false,
            };
        if late {
            return self.fail_deadline();
        }
        let waiting = std::mem::replace(&mut self.waiting, Waiting::Nothing);
        match waiting {
            Waiting::Read(w) if w == id => match js::parse_read(&outcome) {
                Ok(state) => self.on_read(now, state),
                Err(f) => self.fail_js(f),
            },
            Waiting::Confirm(w, state) if w == id => match js::parse_pub_ack(&outcome) {
                Ok(PublishResult::Stored(_)) => self.decide(now, state),
                // The key moved on since the read (or a write to it is in flight).
                Ok(PublishResult::WrongLastSequence) => self.reread(now),
                Err(f) => self.fail_js(f),
            },
            Waiting::Write(w) if w == id => match js::parse_pub_ack(&outcome) {
                Ok(PublishResult::Stored(rev)) => self.on_written(now, rev),
                Ok(PublishResult::WrongLastSequence) => self.on_conflict(),
                Err(f) => self.fail_js(f),
            },
            Waiting::Inbox(w) if w == id => self.on_inbox(now, outcome),
            other => self.waiting = other,
        }
    }

    fn id(&mut self) -> EffectId {
        self.next_id += 1;
        EffectId(self.next_id)
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
    fn issue(&mut self, waiting: Waiting, effect: Effect) {
        self.waiting = waiting;
        self.waiting_until = Some(self.now + effect.timeout());
        self.effects.push_back(effect);
    }

    fn read(&mut self, key: String) {
        let id = self.id();
        let timeout = self.config.kv_timeout;
        self.issue(
            Waiting::Read(id),
            Effect::KvRead(KvRead { id, key, timeout }),
        );
    }

    /// A read bounded by a forward's deadline.
    fn read_before(&mut self, key: String, now: Instant, deadline: Instant) {
        let id = self.id();
        let timeout = self
            .config
            .kv_timeout
            .min(deadline.saturating_duration_since(now));
        self.issue(
            Waiting::Read(id),
            Effect::KvRead(KvRead { id, key, timeout }),
        );
    }

    fn write(&mut self, mut write: KvWrite) {
        let id = self.id();
        write.id = id;
        self.writes += 1;
        self.issue(Waiting::Write(id), Effect::KvWrite(write));
    }

    fn write_create(&mut self, key: String, expected_revision: u64) {
        let Job::Acquire(r) = &self.job else { return };
        if self.writes >= MAX_ACQUIRE_WRITES {
            return self.fail(ErrorReply::new(
                ErrorKind::Unavailable,
                format!(
                    "key `{key}` kept changing during acquire ({MAX_ACQUIRE_WRITES} attempts): retry"
                ),
            ));
        }
        let record = LeaseRecord {
            holder: r.holder.clone(),
            acquired_at: format_time(self.started_wall),
            ttl_ms: r.ttl_ms,
        };
        let ttl = r.ttl_ms;
        self.write(KvWrite {
            id: EffectId(0),
            key,
            operation: Operation::Put,
            expected_revision,
            ttl_ms: Some(ttl),
            event: LeaseEvent::Acquired,
            value: record.to_json(),
            timeout: self.config.kv_timeout,
        });
    }

    fn reply(&mut self, response: Response) {
        self.job = Job::Done;
        self.waiting = Waiting::Nothing;
        self.waiting_until = None;
        self.effects.clear();
        self.reply = Some(response);
    }

    fn fail(&mut self, error: ErrorReply) {
        self.reply(Response::Error(error));
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
        let last = match &self.job {
            Job::Forward(f) => f.last_tried.clone(),
            _ => None,
        };
        self.fail(with_owner(
            ErrorReply::new(failure.kind, failure.detail),
            last,
        ));
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

    /// A read came back. Where the call would answer from it (rather than go on to
    /// a conditional write, which confirms itself), a bucket with replicas first
    /// confirms it.
    fn on_read(&mut self, now: Instant, state: KeyState) {
        if self.config.confirm_reads && !self.writes_after(now, &state) {
            return self.confirm(now, state);
        }
        self.decide(now, state);
    }

    /// Whether the call's next step after this read is a conditional write.
    fn writes_after(&self, now: Instant, state: &KeyState) -> bool {
        match &self.job {
            Job::Acquire(_) => matches!(state, KeyState::Absent | KeyState::Free { .. }),
            // A renewal's read-back decides from the read: confirm it.
            Job::Renew(
                _,
                Some(Renewal {
                    written: Some(_), ..
                }),
            ) => false,
            Job::Renew(r, _) => self
                .check_fence(now, &r.key, &r.holder, r.revision, state)
                .is_ok(),
            Job::Release {
                key,
                holder,
                revision,
            } => self.check_fence(now, key, holder, *revision, state).is_ok(),
            Job::Owner { .. } | Job::Forward(_) | Job::Done => false,
        }
    }

    fn confirm(&mut self, now: Instant, state: KeyState) {
        let key = self.key().to_string();
        if self.confirms >= MAX_READ_CONFIRMS {
            let last = match &self.job {
                Job::Forward(f) => f.last_tried.clone(),
                _ => None,
            };
            return self.fail(with_owner(
                ErrorReply::new(
                    ErrorKind::Unavailable,
                    format!(
                        "the read of `{key}` could not be confirmed by the stream leader \
                         ({MAX_READ_CONFIRMS} attempts; the key kept changing): retry"
                    ),
                ),
                last,
            ));
        }
        self.confirms += 1;
        let id = self.id();
        let confirm = ConfirmRead {
            id,
            key,
            revision: state.revision(),
            timeout: self.kv_timeout(now),
        };
        self.issue(Waiting::Confirm(id, state), Effect::ConfirmRead(confirm));
    }

    /// Acts on a read that is current: confirmed, or about to be by a write.
    fn decide(&mut self, now: Instant, state: KeyState) {
        if let KeyState::Corrupt { revision, reason } = &state {
            let key = self.key().to_string();
            let last = match &self.job {
                Job::Forward(f) => f.last_tried.clone(),
                _ => None,
            };
            return self.fail(with_owner(
                ErrorReply::new(
                    ErrorKind::Internal,
                    format!(
                        "the lease record of `{key}` at revision {revision} is corrupt: {reason}"
                    ),
                ),
                last,
            ));
        }
        if let Job::Renew(
            _,
            Some(Renewal {
                written: Some(revision),
                ..
            }),
        ) = self.job
        {
            return self.on_read_back(revision, state);
        }
        match std::mem::replace(&mut self.job, Job::Done) {
            Job::Acquire(r) => {
                let key = r.key.clone();
                match state {
                    KeyState::Absent | KeyState::Free { .. } => {
                        let expected = state.revision();
                        self.job = Job::Acquire(r);
                        self.write_create(key, expected);
                    }
                    KeyState::Held {
                        revision,
                        record,
                        written_at,
                    } => {
                        let granted = record.holder == r.holder;
                        let lease = self.lease_from_record(&key, revision, &record, written_at);
                        self.reply(Response::Acquired(AcquireReply { granted, lease }));
                    }
                    KeyState::Corrupt { .. } => unreachable!("handled above"),
                }
            }
            Job::Renew(r, _) => {
                match self.check_fence(now, &r.key, &r.holder, r.revision, &state) {
                    Err(e) => self.fail(e),
                    Ok(record) => {
                        let ttl_ms = r.ttl_ms.unwrap_or(record.ttl_ms);
                        let renewed = LeaseRecord {
                            holder: record.holder.clone(),
                            acquired_at: record.acquired_at.clone(),
                            ttl_ms,
                        };
                        let key = r.key.clone();
                        let expected = state.revision();
                        let value = renewed.to_json();
                        let ends = match &state {
                            KeyState::Held { written_at, .. } => {
                                *written_at + Duration::from_millis(record.ttl_ms)
                            }
                            _ => unreachable!("check_fence passed: the key is held"),
                        };
                        self.job = Job::Renew(
                            r,
                            Some(Renewal {
                                record: renewed,
                                ends,
                                old_ttl_ms: record.ttl_ms,
                                written: None,
                            }),
                        );
                        self.fenced_write(KvWrite {
                            id: EffectId(0),
                            key,
                            operation: Operation::Put,
                            expected_revision: expected,
                            ttl_ms: Some(ttl_ms),
                            event: LeaseEvent::Renewed,
                            value,
                            timeout: self.config.kv_timeout,
                        });
                    }
                }
            }
            Job::Release {
                key,
                holder,
                revision,
            } => match self.check_fence(now, &key, &holder, revision, &state) {
                Err(e) => self.fail(e),
                Ok(_) => {
                    let expected = state.revision();
                    self.job = Job::Release {
                        key: key.clone(),
                        holder,
                        revision,
                    };
                    self.fenced_write(KvWrite {
                        id: EffectId(0),
                        key,
                        operation: Operation::Delete,
                        expected_revision: expected,
                        ttl_ms: None,
                        event: LeaseEvent::Released,
                        value: Vec::new(),
                        timeout: self.config.kv_timeout,
                    });
                }
            },
            Job::Owner { key } => match state {
                KeyState::Held {
                    revision,
                    record,
                    written_at,
                } => {
                    let lease = self.lease_from_record(&key, revision, &record, written_at);
                    self.reply(Response::Lease(lease));
                }
                _ => self.reply(Response::Free(FreeReply { held: false, key })),
            },
            Job::Forward(f) => self.forward_after_read(now, f, state),
            Job::Done => {}
        }
    }

    fn fenced_write(&mut self, write: KvWrite) {
        if self.writes >= MAX_FENCED_WRITES {
            let key = write.key.clone();
            return self.fail(ErrorReply::new(
                ErrorKind::Unavailable,
                format!("key `{key}` kept changing during the call: retry"),
            ));
        }
        self.write(write);
    }

    /// The holder and fence checks of renew and release, and the expiry guard.
    ///
    /// The guard compares the service's clock with the server's end (the read's
    /// store time + TTL): no reply carries the server's time now, and the store
    /// time read is only a lower bound on it, a TTL or more before the end. So it is
    /// a first check, not the last word: a service clock running ahead refuses
    /// early (a `lost` that costs a re-acquire, never a wrong renewal); one lagging
    /// lets through a write that may land late, which renew then catches on the
    /// server's clock by reading the renewal back ([`read_back_window`]). A release
    /// needs no check after: a tombstone frees the key, wiped or not.
    fn check_fence(
        &self,
        now: Instant,
        key: &str,
        holder: &str,
        revision: u64,
        state: &KeyState,
    ) -> Result<LeaseRecord, ErrorReply> {
        match state {
            KeyState::Absent | KeyState::Free { .. } => Err(ErrorReply::new(
                ErrorKind::Lost,
                format!(
                    "`{holder}` does not hold `{key}`: nobody does (it expired or was released)"
                ),
            )),
            KeyState::Held { record, .. } if record.holder != holder => Err(ErrorReply::new(
                ErrorKind::Lost,
                format!("`{holder}` does not hold `{key}`: `{}` does", record.holder),
            )),
            KeyState::Held {
                revision: current,
                record,
                written_at,
            } => {
                let wall = self.started_wall + now.saturating_duration_since(self.started_at);
                let ends = *written_at + Duration::from_millis(record.ttl_ms);
                let guard = expiry_guard(record.ttl_ms);
                if *current == revision && wall + guard >= ends {
                    let left = (ends - wall).max(time::Duration::ZERO);
                    Err(ErrorReply::new(
                        ErrorKind::Lost,
                        format!(
                            "the lease of `{key}` is at its end ({} ms left of {} ms, under \
                             the {} ms a write needs to land before the server expires it): \
                             acquire again",
                            left.whole_milliseconds(),
                            record.ttl_ms,
                            guard.as_millis()
                        ),
                    ))
                } else if *current == revision {
                    Ok(record.clone())
                } else {
                    Err(ErrorReply::new(
                        ErrorKind::FenceMismatch,
                        format!(
                            "field `revision` is {revision}, but the current fence of `{key}` is \
                             {current}: acquire again to learn it"
                        ),
                    ))
                }
            }
            KeyState::Corrupt { .. } => Err(ErrorReply::new(ErrorKind::Internal, "corrupt record")),
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

    /// A write was stored at `revision`. A renew acknowledged in the second half of
    /// the lease it renews (by the service's clock, [`read_back_window`]) may have
    /// landed after that lease's end, where the server's expiry marker still wipes
    /// it: it reads the key back through the stream leader (confirmed, on a
    /// replicated bucket, like any read) and decides on the renewal's own store
    /// time, the server's clock ([`Call::on_read_back`]).
    fn on_written(&mut self, now: Instant, revision: u64) {
        let wall = self.started_wall;
        if let Job::Renew(r, Some(renewal)) = &mut self.job {
            let acked = wall + now.saturating_duration_since(self.started_at);
            if acked + read_back_window(renewal.old_ttl_ms) >= renewal.ends {
                renewal.written = Some(revision);
                let key = r.key.clone();
                return self.read(key);
            }
        }
        self.on_written_in_time(revision);
    }

    /// Replies to a write stored at `revision` (a renewal: before its lease's end).
    fn on_written_in_time(&mut self, revision: u64) {
        let wall = self.started_wall;
        match std::mem::replace(&mut self.job, Job::Done) {
            Job::Acquire(r) => {
                let lease = Lease {
                    held: true,
                    key: r.key,
                    holder: r.holder,
                    revision,
                    acquired_at: format_time(wall),
                    expires_at: format_time(wall + Duration::from_millis(r.ttl_ms)),
                    ttl_ms: r.ttl_ms,
                };
                self.reply(Response::Acquired(AcquireReply {
                    granted: true,
                    lease,
                }));
            }
            Job::Renew(r, Some(Renewal { record, .. })) => {
                self.reply(Response::Lease(Lease {
                    held: true,
                    key: r.key,
                    holder: r.holder,
                    revision,
                    acquired_at: record.acquired_at,
                    expires_at: format_time(wall + Duration::from_millis(record.ttl_ms)),
                    ttl_ms: record.ttl_ms,
                }));
            }
            Job::Release { key, holder, .. } => {
                self.reply(Response::Released(ReleaseReply {
                    released: true,
                    held: false,
                    key,
                    holder,
                    revision,
                }));
            }
            other => self.job = other,
        }
    }

    /// The key read back after a renewal stored at `revision`. The renewal stored,
    /// by the server's clock, within the [`expiry_guard`] of the end of the lease
    /// it renews, or no longer the key's last message (wiped by that lease's expiry
    /// marker), is `lost`, not a renewal anyone can rely on; stored before, it is a
    /// renewal. (Read by key, not by sequence: a deposed stream leader answers "no
    /// such message" for a sequence it never stored, which no confirmation can
    /// refute, while a read of the key is confirmed like any other.)
    fn on_read_back(&mut self, revision: u64, state: KeyState) {
        let Job::Renew(r, Some(renewal)) = &self.job else {
            return;
        };
        let key = r.key.clone();
        let guard = expiry_guard(renewal.old_ttl_ms);
        let why = match state {
            KeyState::Held {
                revision: at,
                written_at,
                ..
            } if at == revision => {
                if written_at + guard < renewal.ends {
                    return self.on_written_in_time(revision);
                }
                let before = (renewal.ends - written_at).whole_milliseconds();
                if before > 0 {
                    format!(
                        "landed {before} ms before its lease's end by the server's clock, \
                         under the {} ms guard",
                        guard.as_millis()
                    )
                } else {
                    format!(
                        "landed {} ms after its lease's end by the server's clock",
                        -before
                    )
                }
            }
            _ => format!(
                "is gone already (the key is at revision {}: the lease's expiry removed it)",
                state.revision()
            ),
        };
        self.fail(ErrorReply::new(
            ErrorKind::Lost,
            format!(
                "the renewal of `{key}` written at revision {revision} {why}: the server's \
                 expiry may remove it; acquire again"
            ),
        ));
    }

    fn on_conflict(&mut self) {
        let key = self.key().to_string();
        self.read(key);
    }

    fn forward_after_read(&mut self, now: Instant, mut f: ForwardJob, state: KeyState) {
        let (holder, revision) = match state {
            KeyState::Held {
                revision, record, ..
            } => (record.holder, revision),
            _ => {
                let key = f.request.key.clone();
                return self.fail(with_owner(
                    ErrorReply::new(ErrorKind::NotHeld, format!("nobody holds `{key}`")),
                    f.last_tried,
                ));
            }
        };
        if let Some(retry) = f.retry {
            let same = f.last_tried.as_ref() == Some(&(holder.clone(), revision));
            if same || f.attempts >= MAX_FORWARD_ATTEMPTS {
                let key = f.request.key.clone();
                let (kind, why) = match retry {
                    Retry::NoResponders => {
                        (ErrorKind::OwnerUnavailable, "has no responder on its inbox")
                    }
                    Retry::Rejected => (ErrorKind::OwnerRejected, "rejected the request as stale"),
                };
                let attempts = f.attempts;
                return self.fail(with_owner(
                    ErrorReply::new(
                        kind,
                        format!(
                            "the owner of `{key}` {why} (after {attempts} attempt{})",
                            if attempts == 1 { "" } else { "s" }
                        ),
                    ),
                    f.last_tried,
                ));
            }
        }
        if now >= f.deadline {
            return self.fail(with_owner(
                ErrorReply::new(
                    ErrorKind::OwnerTimeout,
                    "the forward ran out of timeout_ms before the owner replied",
                ),
                f.last_tried,
            ));
        }
        f.attempts += 1;
        f.retry = None;
        f.last_tried = Some((holder.clone(), revision));
        let id = self.id();
        let request = InboxRequest {
            id,
            holder,
            key: f.request.key.clone(),
            fence: revision,
            payload: f.request.payload.clone(),
            timeout: f.deadline.saturating_duration_since(now),
        };
        self.job = Job::Forward(f);
        self.issue(Waiting::Inbox(id), Effect::InboxRequest(request));
    }

    fn on_inbox(&mut self, now: Instant, outcome: RequestOutcome) {
        let Job::Forward(mut f) = std::mem::replace(&mut self.job, Job::Done) else {
            return;
        };
        let retry = match outcome {
            RequestOutcome::Reply { headers, payload } => {
                if !is_reject(&headers) {
                    return self.forward_reply(f, payload);
                }
                Retry::Rejected
            }
            RequestOutcome::NoResponders => Retry::NoResponders,
            RequestOutcome::TimedOut => {
                return self.fail(with_owner(
                    ErrorReply::new(
                        ErrorKind::OwnerTimeout,
                        "the owner did not reply within timeout_ms; not retried, it may have acted",
                    ),
                    f.last_tried,
                ));
            }
            RequestOutcome::Failed(e) => {
                return self.fail(with_owner(
                    ErrorReply::new(
                        ErrorKind::Unavailable,
                        format!("the request to the owner failed: {e}"),
                    ),
                    f.last_tried,
                ));
            }
        };
        f.retry = Some(retry);
        let key = f.request.key.clone();
        let deadline = f.deadline;
        self.job = Job::Forward(f);
        self.read_before(key, now, deadline);
    }

    fn forward_reply(&mut self, f: ForwardJob, payload: Vec<u8>) {
        let (holder, revision) = f.last_tried.clone().unwrap_or_default();
        let reply = Response::Forwarded(ForwardReply {
            payload: base64::engine::general_purpose::STANDARD.encode(&payload),
            key: f.request.key.clone(),
            holder,
            revision,
        });
        let size = reply.to_json().len();
        if size > self.config.max_payload {
            let max = self.config.max_payload;
            return self.fail(with_owner(
                ErrorReply::new(
                    ErrorKind::ReplyTooLarge,
                    format!(
                        "the owner's reply of {} bytes is {size} bytes as base64 JSON, over the \
                         server's max_payload of {max}: reply with a reference instead",
                        payload.len()
                    ),
                ),
                f.last_tried,
            ));
        }
        self.reply(reply);
    }
}

/// Whether an inbox outcome is the owner's own answer (not a reject, not silence).
fn is_owner_reply(outcome: &RequestOutcome) -> bool {
    match outcome {
        RequestOutcome::Reply { headers, .. } => !is_reject(headers),
        _ => false,
    }
}

fn is_reject(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(name, value)| name.eq_ignore_ascii_case(HDR_REJECT) && value.trim() == REJECT_STALE)
}

fn with_owner(mut e: ErrorReply, owner: Option<(String, u64)>) -> ErrorReply {
    if let Some((holder, revision)) = owner {
        e.holder = Some(holder);
        e.revision = Some(revision);
    }
    e
}
