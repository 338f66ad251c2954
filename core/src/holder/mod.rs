//! The holder side of a lease, as a pure machine: campaign for a key, renew it about
//! every ttl/3, and step down the moment ownership can no longer be proven.
//!
//! The rest of the holder side lives beside it, in this folder: every campaign of
//! one process ([`campaign`]), the client's waiting acquire ([`acquire_wait`]), the
//! owner-side and downstream checks ([`guard`]), `elect`'s decisions ([`elect`]) and
//! `lock`'s supervision ([`supervise`]).
//!
//! [`Holder`] follows the holder rules of the lease contract:
//!
//! - It believes it owns the key only until its *local deadline*: the moment the
//!   last successful acquire or renew was **sent**, plus the TTL, less a margin for
//!   clock drift. The server wrote the lease after the request was sent, so the
//!   server's expiry is never earlier than that deadline: a slow reply can only
//!   shorten what the holder believes, never lengthen it.
//! - A request whose outcome is unknown (timed out, or the connection failed) may
//!   still have written. Until a reply settles the state, the earliest such send
//!   bounds any lease the holder later learns about.
//! - `lost` steps down at once. `fence_mismatch` (a renew whose first reply was lost)
//!   is recovered with an idempotent acquire, which returns the current fence; if
//!   another holder has the key by then, the holder steps down.
//! - Acquire is idempotent and does not extend a lease, so an acquire that returns
//!   the fence the holder already knew keeps the deadline it had.
//! - A grant elects nobody by itself: `granted: true` cannot show whether the lease
//!   was written by this request or is an older write under the same holder ID (a
//!   holder made afresh for a key its process held, a restart), which the server
//!   expires up to a TTL sooner. A renew confirms it; the tenure starts at the
//!   renew's revision and the deadline counts from the renew's send. Not at the
//!   acquire's revision: an older write is the last fence an earlier tenure of this
//!   holder ID handed out, and a store that refuses only lower fences would still
//!   take that tenure's late writes.
//! - A reply that arrives after the local deadline never extends the tenure: a
//!   renewal that lands after the server's expiry check is wiped by the expiry
//!   marker that follows. The renew confirming a grant is held to the deadline it
//!   would give too: answered at or after it, it elects nobody.
//! - After a renew whose outcome is unknown (or answered after the deadline, or
//!   `lost`), the holder does not campaign until the expiry marker of the lease it
//!   renewed must have come ([`MAX_EXPIRY_MARKER_LAG`] past the latest end the
//!   server can have): a renewal that landed after the end is wiped by that
//!   marker, and so would be any write confirming it before the marker.
//! - [`Holder::handle_stop`] releases at once; [`Holder::handle_revoke`] (for releases the
//!   library decides by itself) steps down at once but keeps the lease, unrenewed,
//!   until the last deadline handed out or a `stop`, so whoever read that deadline
//!   is done before the key can move.
//!
//! Like every machine in this crate it does no IO and reads no clock: feed it
//! [`Holder::handle_outcome`] and [`Holder::handle_timeout`], then drain
//! [`Holder::poll_transmit`] and [`Holder::poll_event`].
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use dagnats_leases_core::holder::{Holder, HolderConfig, HolderEvent};
//! use dagnats_leases_core::io::RequestOutcome;
//!
//! # fn send(_: &dagnats_leases_core::io::NatsRequest) -> RequestOutcome { unimplemented!() }
//! # fn sleep_until(_: Instant) {}
//! let config = HolderConfig::new("notify-leader", "notify-7f3a", Duration::from_secs(15));
//! let mut holder = Holder::new(config, Instant::now()).expect("valid config");
//! loop {
//!     while let Some(transmit) = holder.poll_transmit() {
//!         let outcome = send(&transmit.request);
//!         holder.handle_outcome(Instant::now(), transmit.id, outcome);
//!     }
//!     while let Some(event) = holder.poll_event() {
//!         match event {
//!             HolderEvent::Elected { fence, .. } => println!("leader, fence {fence}"),
//!             HolderEvent::SteppedDown { reason } => println!("not leader: {reason}"),
//!             _ => {}
//!         }
//!     }
//!     if holder.is_done() {
//!         break;
//!     }
//!     if let Some(at) = holder.poll_timeout() {
//!         sleep_until(at);
//!     }
//!     holder.handle_timeout(Instant::now());
//! }
//! ```

pub mod acquire_wait;
pub mod campaign;
pub mod elect;
pub mod guard;
pub mod relay;
pub mod supervise;

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use crate::change::ChangeEvent;
use crate::io::{RequestOutcome, Transmit, TransmitId, lease_call};
use crate::wire::{
    self, AcquireRequest, Endpoint, ErrorKind, ErrorReply, OwnerRequest, ReleaseRequest,
    RenewRequest, Request, Response,
};

/// The default bound on clock drift between a holder and the server: 1%, far more
/// than any NTP-disciplined clock drifts over one TTL.
pub const DEFAULT_MAX_CLOCK_DRIFT_PPM: u32 = 10_000;

/// How long after a lease's end nats-server may still write its expiry marker: it
/// checks expiries on a timer (0 to 325 ms late, measured on 2.14) and then proposes
/// the marker; 1 s leaves room for the proposal in a cluster.
pub const MAX_EXPIRY_MARKER_LAG: Duration = Duration::from_secs(1);

/// A [`HolderConfig`] outside the contract's bounds: what [`Holder::new`] and
/// [`HolderConfig::validate`] refuse. A misuse of the API, not a wire reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// What is wrong with the config, as a sentence.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid holder config: {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The wire checks of key, holder and TTL report an `invalid` reply; as a config
/// error only their sentence is kept.
impl From<ErrorReply> for ConfigError {
    fn from(reply: ErrorReply) -> Self {
        Self::new(reply.error)
    }
}

/// Where a config error becomes a reply (the campaign's API): `invalid`.
impl From<ConfigError> for ErrorReply {
    fn from(e: ConfigError) -> Self {
        Self::new(ErrorKind::Invalid, e.message)
    }
}

/// How a [`Holder`] campaigns and renews.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderConfig {
    /// The lease key.
    pub key: String,
    /// This process's holder ID (unique per process).
    pub holder: String,
    /// The lease TTL: whole seconds, 1 s to 10 min.
    pub ttl: Duration,
    /// How often to renew: ttl/3 by default.
    pub renew_every: Duration,
    /// How long to wait before asking again when another holder has the key (ttl/3 by
    /// default; a change event for the key asks at once, see [`Holder::handle_change`]).
    pub campaign_every: Duration,
    /// How long to wait after a failed request before trying again.
    pub retry_every: Duration,
    /// Bound on one request to the service.
    pub request_timeout: Duration,
    /// Bound on how much faster the server's clock may run than the holder's, in parts
    /// per million; the local deadline is shortened by this share of the TTL.
    pub max_clock_drift_ppm: u32,
    /// How long to hold back after a change event that may have freed the key before
    /// asking for it (zero by default): a candidate that holds back less, a preferred
    /// one, wins a free key while it is alive; see [`HolderConfig::with_priority`].
    pub hold_back: Duration,
}

/// The highest candidate priority: it holds back nothing ([`HolderConfig::with_priority`]).
pub const MAX_PRIORITY: u8 = 10;

/// How much longer a candidate holds back per step of priority below [`MAX_PRIORITY`].
/// Far more than a loopback or LAN round trip, so that the preferred candidate's
/// acquire, sent on the change event, is in before the next one's.
pub const PRIORITY_STEP: Duration = Duration::from_millis(100);

/// The most a candidate holds back: [`MAX_PRIORITY`] steps.
pub const MAX_HOLD_BACK: Duration = Duration::from_secs(1);

impl HolderConfig {
    /// The defaults for `ttl`: renew and campaign every ttl/3, retry after ttl/10 (0.1
    /// to 1 s), requests bounded by ttl/4 (at most 5 s), 1% clock drift.
    pub fn new(key: impl Into<String>, holder: impl Into<String>, ttl: Duration) -> Self {
        Self {
            key: key.into(),
            holder: holder.into(),
            ttl,
            renew_every: ttl / 3,
            campaign_every: ttl / 3,
            retry_every: (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            request_timeout: (ttl / 4).min(Duration::from_secs(5)),
            max_clock_drift_ppm: DEFAULT_MAX_CLOCK_DRIFT_PPM,
            hold_back: Duration::ZERO,
        }
    }

    /// This config for a candidate of `priority` (0 to [`MAX_PRIORITY`], higher
    /// preferred): after a release or an expiry it holds back
    /// ([`HolderConfig::hold_back`]) [`PRIORITY_STEP`] for each step below
    /// [`MAX_PRIORITY`], so the highest candidate alive wins a free key, and the
    /// others take it over within [`MAX_HOLD_BACK`] when it is not alive. No key is
    /// taken from a holder: the priority only decides who asks first. Give every
    /// candidate of a key a priority (one without holds back nothing).
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.hold_back = PRIORITY_STEP * u32::from(MAX_PRIORITY - priority.min(MAX_PRIORITY));
        self
    }

    /// The longest [`Holder::handle_stop`] (or [`Holder::handle_hand_over`]) takes to be done
    /// when no request is ever answered (NATS killed, frozen, unreachable): the
    /// request in flight at the stop, then at most [`MAX_STOP_REQUESTS`] more, each
    /// given up at `request_timeout`, none waited between. Elector, shards and
    /// semaphore stops, and `lock`'s release, end within it.
    pub fn stop_bound(&self) -> Duration {
        self.request_timeout.saturating_mul(MAX_STOP_REQUESTS + 1)
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Checks the key, holder and TTL against the contract's bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        wire::check_name("key", &self.key)?;
        wire::check_name("holder", &self.holder)?;
        wire::check_ttl(self.ttl_ms())?;
        let invalid = |why: &str| Err(ConfigError::new(why));
        if self.max_clock_drift_ppm >= 500_000 {
            return invalid("max_clock_drift_ppm must be below 500000");
        }
        let span = self.believed_span(self.ttl);
        if self.renew_every.is_zero() || self.renew_every >= span {
            return invalid(
                "renew_every must be above zero and below the ttl less the drift margin",
            );
        }
        if self.request_timeout.is_zero() || self.request_timeout + self.renew_every >= span {
            return invalid(
                "request_timeout must be above zero, and renew_every + request_timeout below the ttl",
            );
        }
        if self.retry_every.is_zero() || self.retry_every >= self.ttl {
            return invalid("retry_every must be above zero and below the ttl");
        }
        if self.campaign_every.is_zero()
            || self.campaign_every > Duration::from_millis(wire::MAX_TTL_MS)
        {
            return invalid("campaign_every must be above zero and at most 600 s");
        }
        if self.hold_back > MAX_HOLD_BACK {
            return invalid("hold_back must be at most 1 s");
        }
        Ok(())
    }

    /// How long after a send the holder may still believe the lease is its: the TTL
    /// less the drift margin.
    pub fn believed_span(&self, ttl: Duration) -> Duration {
        let margin = ttl.as_micros() * u128::from(self.max_clock_drift_ppm) / 1_000_000;
        ttl.saturating_sub(Duration::from_micros(
            u64::try_from(margin).unwrap_or(u64::MAX),
        ))
    }
}

/// Why a holder stopped acting as owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StepDownReason {
    /// The service said the lease is no longer this holder's (`lost`, or a
    /// `fence_mismatch` whose recovery found another holder).
    Lost,
    /// The local deadline passed without a successful renewal.
    DeadlineMissed,
    /// The application asked to stop (the lease is released).
    Stopped,
    /// The application handed the key over (the lease is released now, and this
    /// member asks for the key again only after a campaign interval, so a waiting
    /// member is elected first).
    HandedOver,
    /// The service refused the request for good (`invalid` or `unsupported`).
    Failed,
    /// The library gives the key up by itself (a shard shed for balance, a semaphore
    /// slot given up): stop writes now. The lease is kept, not renewed, until
    /// `deadline` (the last one handed out) or until the application says it is
    /// done with the key, and only then released.
    Revoked {
        /// The last deadline handed out for the key; no later one will be.
        deadline: Instant,
    },
    /// The member's health check failed for longer than its group allows (the
    /// health gate of [`campaign`]): stop writes now. Like
    /// [`StepDownReason::Revoked`], the lease is kept, not renewed, until
    /// `deadline` or until the application says it is done with the key, and only
    /// then released.
    Unhealthy {
        /// The last deadline handed out for the key; no later one will be.
        deadline: Instant,
    },
}

impl fmt::Display for StepDownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Lost => "lost",
            Self::DeadlineMissed => "deadline_missed",
            Self::Stopped => "stopped",
            Self::HandedOver => "handed_over",
            Self::Failed => "failed",
            Self::Revoked { .. } => "revoked",
            Self::Unhealthy { .. } => "unhealthy",
        })
    }
}

/// What changed about this holder's ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderEvent {
    /// A tenure began: act as owner until `deadline`, fencing writes with `fence`.
    Elected {
        /// The start of the tenure: the revision of the renew that confirmed the
        /// grant, above every fence an earlier tenure of this holder ID handed out.
        fence: u64,
        /// The local deadline, on the holder's clock.
        deadline: Instant,
    },
    /// A renewal succeeded: the same tenure, a higher fence, a later deadline.
    Renewed {
        /// The tenure's start fence (the `fence` of its `Elected`).
        tenure: u64,
        /// The new fence.
        fence: u64,
        /// The new local deadline.
        deadline: Instant,
    },
    /// Stop acting as owner now.
    SteppedDown {
        /// Why.
        reason: StepDownReason,
    },
    /// An acquire while campaigning did not win the key: `holder` has it, or
    /// (`None`) no usable answer came. The holder asks again later; `lock --wait`
    /// gives up on it once its wait has passed.
    NotGranted {
        /// The holder the service named, if it answered.
        holder: Option<String>,
        /// What came back: [`OutcomeClass::Clear`] when the service answered,
        /// [`OutcomeClass::NoResponders`] when no lease service is there at all.
        answer: OutcomeClass,
    },
    /// The service refused for good; the holder is done.
    Failed {
        /// The error kind the service replied with.
        kind: ErrorKind,
        /// Its sentence.
        message: String,
    },
}

pub use crate::outcome::OutcomeClass;

/// Where a [`Holder`] is in its life ([`Holder::status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HolderStatus {
    /// Not owner; asking for the key.
    Campaigning,
    /// Granted, proving the lease fresh with a renew before acting as owner.
    Confirming,
    /// Owner until the local deadline (check [`Holder::tenure`] for the instant).
    Owner,
    /// Stepped down for good; releasing (once a revocation's hold is over).
    Stopping,
    /// Finished.
    Done,
}

/// The tenure a holder is in, while its deadline has not passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenure {
    /// The fence that began the tenure (the confirming renew's revision).
    pub tenure: u64,
    /// The latest fence (the revision of the last acquire or renew).
    pub fence: u64,
    /// The local deadline.
    pub deadline: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Acquire,
    Renew,
    Release,
    /// A candidate that holds back reads the owner at a campaign tick instead of
    /// asking for the key: an acquire sent blind might meet the key freed an instant
    /// earlier and beat the preferred candidate's.
    Probe,
}

impl Purpose {
    fn endpoint(self) -> Endpoint {
        match self {
            Self::Acquire => Endpoint::Acquire,
            Self::Renew => Endpoint::Renew,
            Self::Release => Endpoint::Release,
            Self::Probe => Endpoint::Owner,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    id: TransmitId,
    purpose: Purpose,
    sent_at: Instant,
    /// The fence a renew or release carried.
    fence: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not owner: ask at `next_at`.
    Campaigning { next_at: Instant },
    /// Granted `revision`, but an acquire whose outcome is unknown may have written it
    /// long ago: a renew proves a fresh lease before the holder acts as owner.
    Confirming { revision: u64 },
    /// Owner until `ownership.deadline`; renew (or recover with an acquire) at `next_at`.
    Owner {
        ownership: Tenure,
        next_at: Instant,
        recovering: bool,
    },
    /// Releasing before finishing; `fence` is what to release (if anything), not
    /// before `hold_until` (a revocation keeps the lease until its deadline).
    Stopping {
        fence: Option<u64>,
        attempts: u32,
        hold_until: Option<Instant>,
    },
    /// Finished: no more requests or events.
    Done,
}

/// How many requests a stop may send (release, recovery acquire, release again).
pub const MAX_STOP_REQUESTS: u32 = 3;

/// Renews whose outcome is unknown: the earliest send, and the highest fence one
/// carried. Such a renew can still write only while the key's revision is that fence,
/// so seeing any higher revision retires them.
#[derive(Debug, Clone, Copy)]
struct UnknownRenews {
    since: Instant,
    fence: u64,
}

/// How long an owner waits before it sends its renew again after the
/// `failures`-th transient failure in a row (`unavailable`, `internal`, no answer),
/// `room` being the time left until the last send whose reply, bounded by the
/// request timeout, still comes before its local deadline.
///
/// The first failure is retried after `retry_every`, as a blip always was. From the
/// second on, the wait doubles (`retry_every` × 2^(failures-1)) and a share of up to
/// half of it is added from `jitter` (a random draw the caller makes), so owners
/// that failed together do not come back together: a service refusing work under
/// load is not asked again by all of them each `retry_every`. The wait never
/// reaches past `room`, so the owner still tries to renew before its deadline; once
/// less than `retry_every` is left of it, the owner tries every `retry_every`, as
/// before, until it renews or steps down at its deadline.
pub fn owner_retry_delay(
    retry_every: Duration,
    failures: u32,
    jitter: u64,
    room: Duration,
) -> Duration {
    if failures <= 1 {
        return retry_every;
    }
    let base = retry_every.saturating_mul(1 << (failures - 1).min(16));
    // jitter / 2^64 of half the base, in nanoseconds, without floating point.
    let half = base.as_nanos() / 2;
    let spread = (half * u128::from(jitter)) >> 64;
    let wait = base.saturating_add(Duration::from_nanos(
        u64::try_from(spread).unwrap_or(u64::MAX),
    ));
    if room >= retry_every {
        wait.min(room)
    } else {
        retry_every
    }
}

/// The jitter a holder starts from: a hash (FNV-1a) of its key and holder ID, so
/// that holders differ without any randomness drawn in the core.
pub fn jitter_seed(key: &str, holder: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain([0]).chain(holder.bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// One holder campaigning for one key. See the [module docs](self).
#[derive(Debug)]
pub struct Holder {
    config: HolderConfig,
    phase: Phase,
    in_flight: Option<InFlight>,
    /// The earliest send of an acquire whose outcome is unknown. Such an acquire may
    /// still reach the service and write whenever the key is free, so this never
    /// clears: grants that it might explain are confirmed with a renew.
    unknown_acquire: Option<Instant>,
    unknown_renews: Option<UnknownRenews>,
    /// The last fence a reply confirmed and the deadline it gave, kept across
    /// step-downs: an idempotent acquire returning it does not extend it.
    confirmed: Option<(u64, Instant)>,
    /// The highest revision of the key any reply has shown. A grant below it is a
    /// stale read (a deposed stream leader answering from old state): not believed.
    highest_seen: u64,
    /// Transient failures in a row: campaign retries back off, and an owner's renew
    /// retries too ([`owner_retry_delay`]).
    failures: u32,
    /// The state of the jitter an owner's retries are spread by: seeded from the
    /// key and holder ID ([`jitter_seed`]), or by the driver
    /// ([`Holder::seed_jitter`]); the core draws no randomness of its own.
    jitter: u64,
    /// No campaign before this: a renew of the last tenure may have landed after
    /// the lease's end, and the expiry marker still to come would wipe whatever the
    /// key holds then (see [`MAX_EXPIRY_MARKER_LAG`]).
    quiet_until: Option<Instant>,
    /// The revision of a granted renewal record whose possible expiry marker this
    /// holder has waited out (see [`may_be_a_late_renewal`]).
    marker_waited: Option<u64>,
    /// When this holder learned the fence it renews (the reply that showed it).
    fence_learned_at: Instant,
    /// No acquire before this: a change event may have freed the key, and a
    /// preferred candidate (one that holds back less) asks first.
    held_back_until: Option<Instant>,
    next_id: u64,
    requests: VecDeque<Transmit>,
    events: VecDeque<HolderEvent>,
}

impl Holder {
    /// A holder that campaigns at once. `Err` when the config is outside the bounds.
    pub fn new(config: HolderConfig, now: Instant) -> Result<Self, ConfigError> {
        config.validate()?;
        let jitter = jitter_seed(&config.key, &config.holder);
        let mut holder = Self {
            config,
            phase: Phase::Campaigning { next_at: now },
            in_flight: None,
            unknown_acquire: None,
            failures: 0,
            jitter,
            quiet_until: None,
            marker_waited: None,
            held_back_until: None,
            fence_learned_at: now,
            unknown_renews: None,
            confirmed: None,
            highest_seen: 0,
            next_id: 0,
            requests: VecDeque::new(),
            events: VecDeque::new(),
        };
        holder.drive(now);
        Ok(holder)
    }

    /// Mixes `seed` (randomness the driver draws) into the jitter of this holder's
    /// retries. Without it the jitter is still different per key and holder ID.
    pub fn seed_jitter(&mut self, seed: u64) {
        self.jitter ^= seed;
    }

    /// The next draw of the jitter (splitmix64).
    fn next_jitter(&mut self) -> u64 {
        self.jitter = self.jitter.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.jitter;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The config this holder runs with.
    pub fn config(&self) -> &HolderConfig {
        &self.config
    }

    /// The tenure this holder is in at `now`, or `None`: also `None` once the local
    /// deadline has passed, even before [`Holder::handle_timeout`] is called.
    pub fn tenure(&self, now: Instant) -> Option<Tenure> {
        match self.phase {
            Phase::Owner { ownership, .. } if now < ownership.deadline => Some(ownership),
            _ => None,
        }
    }

    /// Where the holder is in its life.
    pub fn status(&self) -> HolderStatus {
        match self.phase {
            Phase::Campaigning { .. } => HolderStatus::Campaigning,
            Phase::Confirming { .. } => HolderStatus::Confirming,
            Phase::Owner { .. } => HolderStatus::Owner,
            Phase::Stopping { .. } => HolderStatus::Stopping,
            Phase::Done => HolderStatus::Done,
        }
    }

    /// Whether the holder has finished (stopped, or refused for good).
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done && self.requests.is_empty()
    }

    /// Whether a request or an event waits to be polled.
    #[cfg(debug_assertions)]
    pub(crate) fn has_output(&self) -> bool {
        !self.requests.is_empty() || !self.events.is_empty()
    }

    /// The next request to send, if any: a call to the lease service.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.requests.pop_front()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<HolderEvent> {
        self.events.pop_front()
    }

    /// When to call [`Holder::handle_timeout`] next: a due renewal, campaign or
    /// deadline, or the end of the wait for the request in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let request = self
            .in_flight
            .map(|f| f.sent_at + self.config.request_timeout);
        let phase = self.phase_timeout();
        request.into_iter().chain(phase).min()
    }

    fn phase_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Campaigning { next_at } if self.in_flight.is_none() => Some(next_at),
            Phase::Owner {
                ownership, next_at, ..
            } => Some(if self.in_flight.is_none() {
                next_at.min(ownership.deadline)
            } else {
                ownership.deadline
            }),
            Phase::Stopping {
                hold_until: Some(at),
                ..
            } if self.in_flight.is_none() => Some(at),
            _ => None,
        }
    }

    /// Acts on the time: a request unanswered within its timeout has timed out
    /// ([`RequestOutcome::TimedOut`]); steps down at the deadline, renews or
    /// campaigns when due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(flight) = self.in_flight
            && now >= flight.sent_at + self.config.request_timeout
        {
            return self.handle_outcome(now, flight.id, RequestOutcome::TimedOut);
        }
        self.drive(now);
    }

    /// Whether the holder waits for the outcome of request `id`.
    pub fn waits_for(&self, id: TransmitId) -> bool {
        self.in_flight.is_some_and(|f| f.id == id)
    }

    /// A change event for the key arrived: when it may have freed the key and this
    /// holder is not owner, ask again now rather than at the next campaign tick (a
    /// released or expired key is free at once). A candidate that holds back
    /// ([`HolderConfig::hold_back`]) asks only once that has passed, at its campaign
    /// ticks too.
    pub fn handle_change(&mut self, now: Instant, event: &ChangeEvent) {
        if event.kind.may_free_key() {
            self.ask_now(now);
        }
    }

    /// An owner whose next renewal is due by `by` renews now instead, earlier than
    /// its schedule (never later): so that renewals due close together go out in
    /// one batch. Not while a request is in flight, recovering with an acquire, or
    /// retrying after a failure (its backoff stands). Whether it renews now.
    pub(crate) fn renew_early(&mut self, now: Instant, by: Instant) -> bool {
        match self.phase {
            Phase::Owner {
                ownership,
                next_at,
                recovering: false,
            } if self.in_flight.is_none()
                && self.failures == 0
                && next_at <= by
                && now < ownership.deadline =>
            {
                self.phase = Phase::Owner {
                    ownership,
                    next_at: next_at.min(now),
                    recovering: false,
                };
                self.drive(now);
                self.in_flight.is_some()
            }
            _ => false,
        }
    }

    /// Asks again now, as after a change event that may have freed the key.
    pub(crate) fn ask_now(&mut self, now: Instant) {
        let quiet = self.quiet_until;
        let ask_at = now + self.config.hold_back;
        if !self.config.hold_back.is_zero() {
            self.held_back_until = Some(ask_at);
        }
        if let Phase::Campaigning { next_at } = &mut self.phase {
            *next_at = (*next_at).min(ask_at).max(quiet.unwrap_or(now));
        }
        self.drive(now);
    }

    /// Stops: steps down now, releases the lease if this holder has one, then is done.
    /// A revoked holder releases now rather than at its deadline.
    pub fn handle_stop(&mut self, now: Instant) {
        self.stop_for(now, StepDownReason::Stopped);
    }

    /// Stops as [`Holder::handle_stop`] does, stepping down with
    /// [`StepDownReason::HandedOver`]: the campaign (see
    /// [`campaign::Campaign::handle_hand_over`]) asks for the key again only later.
    pub fn handle_hand_over(&mut self, now: Instant) {
        self.stop_for(now, StepDownReason::HandedOver);
    }

    fn stop_for(&mut self, now: Instant, reason: StepDownReason) {
        let fence = match self.phase {
            Phase::Owner { ownership, .. } => {
                self.events.push_back(HolderEvent::SteppedDown { reason });
                Some(ownership.fence)
            }
            Phase::Confirming { revision } => Some(revision),
            Phase::Campaigning { .. } => None,
            Phase::Stopping {
                ref mut hold_until, ..
            } => {
                if hold_until.take().is_some() {
                    self.drive(now);
                }
                return;
            }
            Phase::Done => return,
        };
        self.phase = Phase::Stopping {
            fence,
            attempts: 0,
            hold_until: None,
        };
        self.drive(now);
    }

    /// Stops for a release the library decided by itself (a shard shed, a semaphore
    /// slot given up): steps down now with [`StepDownReason::Revoked`], naming the
    /// last deadline handed out, and keeps the lease until then (no renew) before it
    /// releases; [`Holder::handle_stop`] releases at once. Not owner (no deadline handed
    /// out, or it has passed): the same as [`Holder::handle_stop`].
    ///
    /// Why it is safe to move the key then: every deadline handed out is the send of
    /// a write of this tenure plus the TTL, less the drift margin, so the server's
    /// lease outlives it, and nobody else is granted the key before that lease ends
    /// or is released. An application that writes only before its last deadline (as
    /// the holder rules ask) is done before the next owner is granted, even if it
    /// never hears of the revocation. A renew in flight still lands, but only
    /// updates the fence to release with: no later deadline is handed out, so none
    /// has to be waited for.
    pub fn handle_revoke(&mut self, now: Instant) {
        self.revoke_for(now, |deadline| StepDownReason::Revoked { deadline });
    }

    /// [`Holder::handle_revoke`] for a member whose health check failed too long: the
    /// event is [`StepDownReason::Unhealthy`], the rest is the same.
    pub fn handle_revoke_unhealthy(&mut self, now: Instant) {
        self.revoke_for(now, |deadline| StepDownReason::Unhealthy { deadline });
    }

    fn revoke_for(&mut self, now: Instant, reason: fn(Instant) -> StepDownReason) {
        match self.phase {
            Phase::Owner { ownership, .. } if now < ownership.deadline => {
                self.events.push_back(HolderEvent::SteppedDown {
                    reason: reason(ownership.deadline),
                });
                self.phase = Phase::Stopping {
                    fence: Some(ownership.fence),
                    attempts: 0,
                    hold_until: Some(ownership.deadline),
                };
                self.drive(now);
            }
            _ => self.handle_stop(now),
        }
    }

    /// While revoked ([`Holder::handle_revoke`], [`Holder::handle_revoke_unhealthy`]): the
    /// deadline the lease is kept until.
    pub fn revoked_until(&self) -> Option<Instant> {
        match self.phase {
            Phase::Stopping { hold_until, .. } => hold_until,
            _ => None,
        }
    }

    /// Request `id` was never sent (its driver dropped it, as a [`campaign`]
    /// queue does for a holder that stopped meanwhile): it wrote nothing, so nothing
    /// about it is unknown. A campaign asks again at its next tick.
    pub fn handle_cancel(&mut self, now: Instant, id: TransmitId) {
        if self.in_flight.is_none_or(|f| f.id != id) {
            return;
        }
        self.in_flight = None;
        if let Phase::Campaigning { .. } = self.phase {
            self.campaign_after(now, self.config.campaign_every);
        }
        self.drive(now);
    }

    /// Feeds back what came of request `id`. Outcomes of requests the holder no longer
    /// waits for are ignored. A campaign's acquire that leaves the holder campaigning
    /// is reported [`HolderEvent::NotGranted`].
    pub fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        let Some(flight) = self.in_flight.filter(|f| f.id == id) else {
            return;
        };
        let campaign =
            flight.purpose == Purpose::Acquire && matches!(self.phase, Phase::Campaigning { .. });
        let answer = OutcomeClass::of(Endpoint::Acquire, &outcome);
        let holder = match &outcome {
            RequestOutcome::Reply { payload, .. } if campaign => {
                match Response::decode(Endpoint::Acquire, payload) {
                    Ok(Response::Acquired(r)) if !r.granted => Some(r.lease.holder),
                    _ => None,
                }
            }
            _ => None,
        };
        self.on_outcome(now, flight, outcome);
        if campaign && matches!(self.phase, Phase::Campaigning { .. }) {
            self.events
                .push_back(HolderEvent::NotGranted { holder, answer });
        }
    }

    fn on_outcome(&mut self, now: Instant, flight: InFlight, outcome: RequestOutcome) {
        self.in_flight = None;
        if matches!(self.phase, Phase::Owner { ownership, .. } if now >= ownership.deadline) {
            // The tenure ended at the deadline, whatever this says: a renewal that
            // lands after the server's expiry check is wiped by its marker. Whether
            // it wrote is unknown to the campaign that follows.
            self.mark_unknown(flight);
            self.drive(now);
            return;
        }
        if flight.purpose == Purpose::Probe {
            self.on_probe(now, &outcome);
            self.drive(now);
            return;
        }
        if let Phase::Confirming { .. } = self.phase
            && flight.purpose == Purpose::Renew
            && now >= flight.sent_at + self.config.believed_span(self.config.ttl)
        {
            // The confirming renew, answered at or after the deadline it would give:
            // the same as a renew answered after the deadline, it elects nobody.
            self.mark_unknown(flight);
            self.campaign_after(now, Duration::ZERO);
            self.drive(now);
            return;
        }
        let reply = match &outcome {
            RequestOutcome::Reply { payload, .. } => {
                Response::decode(flight.purpose.endpoint(), payload).ok()
            }
            _ => None,
        };
        match (&outcome, reply) {
            (RequestOutcome::Reply { .. }, Some(reply)) => self.on_reply(now, flight, reply),
            // Nobody received it: nothing was written.
            (RequestOutcome::NoResponders, _) => self.on_transient(now, flight),
            // It may have been processed, or may still be.
            _ => {
                self.mark_unknown(flight);
                self.on_transient(now, flight);
            }
        }
        self.drive(now);
    }

    fn mark_unknown(&mut self, flight: InFlight) {
        match flight.purpose {
            Purpose::Acquire => {
                let since = self
                    .unknown_acquire
                    .map_or(flight.sent_at, |t| t.min(flight.sent_at));
                self.unknown_acquire = Some(since);
            }
            Purpose::Renew => {
                self.stay_quiet();
                let merged = match self.unknown_renews {
                    Some(u) => UnknownRenews {
                        since: u.since.min(flight.sent_at),
                        fence: u.fence.max(flight.fence),
                    },
                    None => UnknownRenews {
                        since: flight.sent_at,
                        fence: flight.fence,
                    },
                };
                self.unknown_renews = Some(merged);
            }
            // Only a stop releases, and a stopped holder believes nothing; a probe
            // reads.
            Purpose::Release | Purpose::Probe => {}
        }
    }

    /// A reply showed the key at `revision`: renews carrying a lower fence can no
    /// longer write.
    fn saw_revision(&mut self, revision: u64) {
        self.highest_seen = self.highest_seen.max(revision);
        if self.unknown_renews.is_some_and(|u| revision > u.fence) {
            self.unknown_renews = None;
        }
    }

    fn on_reply(&mut self, now: Instant, flight: InFlight, reply: Response) {
        let failed = matches!(&reply, Response::Error(e)
            if matches!(e.kind, ErrorKind::Unavailable | ErrorKind::Internal));
        if !failed {
            self.failures = 0;
        }
        match (flight.purpose, reply) {
            (Purpose::Acquire, Response::Acquired(r))
                if r.granted && r.lease.revision < self.highest_seen =>
            {
                // Older than what this holder already saw: a stale read, not a grant.
                self.on_transient(now, flight);
            }
            (Purpose::Acquire, Response::Acquired(r))
                if r.granted
                    && matches!(self.phase, Phase::Campaigning { .. })
                    && self.marker_waited != Some(r.lease.revision)
                    && may_be_a_late_renewal(&r.lease) =>
            {
                // A renewal of a tenure of this holder ID that this machine did not
                // write (an earlier incarnation's, a restart): it may have landed as
                // its lease ran out, and that lease's expiry marker, still to come
                // within MAX_EXPIRY_MARKER_LAG, would wipe it and any renew confirming
                // it. Ask again once the marker must have come (found by a holder
                // world: a restart granted the late renew of its predecessor).
                self.saw_revision(r.lease.revision);
                self.marker_waited = Some(r.lease.revision);
                self.quiet_for_a_marker(now);
                self.campaign_after(now, Duration::ZERO);
            }
            (Purpose::Acquire, Response::Acquired(r)) if r.granted => {
                // Unknown renews may have written this very revision: bound it first.
                self.fence_learned_at = now;
                self.on_granted(now, flight, r.lease.revision, r.lease.ttl_ms);
                self.saw_revision(r.lease.revision);
            }
            (Purpose::Acquire, Response::Acquired(r)) => {
                // Another holder has it.
                self.saw_revision(r.lease.revision);
                match self.phase {
                    Phase::Owner { .. } => self.step_down(now, StepDownReason::Lost),
                    Phase::Stopping { .. } => self.phase = Phase::Done,
                    _ => self.campaign_after(now, self.config.campaign_every),
                }
            }
            (Purpose::Renew, Response::Lease(lease)) => {
                self.saw_revision(lease.revision);
                self.fence_learned_at = now;
                self.on_renewed(flight, lease.revision, lease.ttl_ms);
            }
            (Purpose::Release, Response::Released(_)) => {
                self.confirmed = None;
                self.phase = Phase::Done;
            }
            (_, Response::Error(e)) => self.on_error(now, flight, e),
            // A reply of the wrong shape: treat like an unknown outcome.
            _ => {
                self.mark_unknown(flight);
                self.on_transient(now, flight);
            }
        }
    }

    /// A probe's answer: the key held by another, ask again at the next tick; free,
    /// or no answer, ask after the hold-back, as after a change event; held under
    /// this holder ID (a restart), ask now.
    fn on_probe(&mut self, now: Instant, outcome: &RequestOutcome) {
        if !matches!(self.phase, Phase::Campaigning { .. }) {
            return;
        }
        let reply = match outcome {
            RequestOutcome::Reply { payload, .. } => {
                Response::decode(Endpoint::Owner, payload).ok()
            }
            _ => None,
        };
        let ask_at = match reply {
            Some(Response::Lease(lease)) if lease.holder != self.config.holder => {
                self.highest_seen = self.highest_seen.max(lease.revision);
                return self.campaign_after(now, self.config.campaign_every);
            }
            Some(Response::Lease(_)) => now,
            _ => now + self.config.hold_back,
        };
        self.held_back_until = Some(ask_at);
        self.campaign_after(now, ask_at - now);
    }

    fn lease_ttl(&self, reply_ttl_ms: u64) -> Duration {
        self.config.ttl.min(Duration::from_millis(reply_ttl_ms))
    }

    /// A renew wrote `revision` after `flight` was sent: the soundest proof there is.
    fn on_renewed(&mut self, flight: InFlight, revision: u64, ttl_ms: u64) {
        let deadline = flight.sent_at + self.config.believed_span(self.lease_ttl(ttl_ms));
        self.confirmed = Some((revision, deadline));
        let next_at = flight.sent_at + self.config.renew_every;
        match self.phase {
            Phase::Owner { ownership, .. } => {
                let ownership = Tenure {
                    fence: revision,
                    deadline,
                    ..ownership
                };
                self.phase = Phase::Owner {
                    ownership,
                    next_at,
                    recovering: false,
                };
                self.events.push_back(HolderEvent::Renewed {
                    tenure: ownership.tenure,
                    fence: revision,
                    deadline,
                });
            }
            Phase::Confirming { .. } => {
                // The tenure starts at this renew's revision, not the grant's: a
                // grant may return an earlier tenure's last write under this holder
                // ID, whose fence that tenure already handed out.
                self.phase = Phase::Owner {
                    ownership: Tenure {
                        tenure: revision,
                        fence: revision,
                        deadline,
                    },
                    next_at,
                    recovering: false,
                };
                self.events.push_back(HolderEvent::Elected {
                    fence: revision,
                    deadline,
                });
            }
            Phase::Stopping { ref mut fence, .. } => *fence = Some(revision),
            Phase::Campaigning { .. } | Phase::Done => {}
        }
    }

    fn on_granted(&mut self, now: Instant, flight: InFlight, revision: u64, ttl_ms: u64) {
        // When the lease at `revision` was written at the earliest: by this request, or
        // by an earlier one whose outcome is unknown.
        let written_after = [
            Some(flight.sent_at),
            self.unknown_acquire,
            self.unknown_renews.map(|u| u.since),
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("the send time is always there");
        let deadline = match self.confirmed {
            // Acquire does not extend: the lease is the one already confirmed.
            Some((fence, deadline)) if fence == revision => deadline,
            _ => written_after + self.config.believed_span(self.lease_ttl(ttl_ms)),
        };
        match self.phase {
            Phase::Stopping { ref mut fence, .. } => *fence = Some(revision),
            Phase::Owner { ownership, .. } => {
                // A recovery after fence_mismatch. The lease at `revision` was written
                // after the one the current deadline stands on, so it lasts at least as
                // long: keep the later of the two.
                let deadline = deadline.max(ownership.deadline);
                let ownership = Tenure {
                    fence: revision.max(ownership.fence),
                    deadline,
                    ..ownership
                };
                self.confirmed = Some((ownership.fence, deadline));
                self.phase = Phase::Owner {
                    ownership,
                    next_at: flight.sent_at + self.config.renew_every,
                    recovering: false,
                };
                self.events.push_back(HolderEvent::Renewed {
                    tenure: ownership.tenure,
                    fence: ownership.fence,
                    deadline,
                });
            }
            // Ours on the server, but a grant cannot show who wrote it, nor when: an
            // idempotent grant of an older write under this holder ID (a holder made
            // afresh for a key this process held before, or a restart) looks just like
            // a fresh create, while the server expires that older write up to a TTL
            // sooner. A renew proves it: its write came after its send. Remember the
            // bound, so a later grant of the same revision is not taken as fresh.
            Phase::Campaigning { .. } => {
                self.confirmed = Some((revision, deadline.min(now)));
                self.phase = Phase::Confirming { revision };
            }
            Phase::Confirming { .. } | Phase::Done => {}
        }
    }

    fn on_error(&mut self, now: Instant, flight: InFlight, e: ErrorReply) {
        match e.kind {
            ErrorKind::Invalid | ErrorKind::Unsupported => {
                if let Phase::Owner { .. } = self.phase {
                    self.events.push_back(HolderEvent::SteppedDown {
                        reason: StepDownReason::Failed,
                    });
                }
                self.events.push_back(HolderEvent::Failed {
                    kind: e.kind,
                    message: e.error,
                });
                self.phase = Phase::Done;
            }
            ErrorKind::Lost => match self.phase {
                Phase::Owner { .. } => {
                    // A renew the service wrote as the lease ran out is `lost` too:
                    // the old lease's expiry marker may still wipe the key.
                    if flight.purpose == Purpose::Renew {
                        self.quiet_for_a_marker(now);
                    }
                    self.step_down(now, StepDownReason::Lost)
                }
                Phase::Stopping { .. } => self.phase = Phase::Done,
                // The renew confirming a grant, written as that lease ran out: an
                // acquire now could be granted that very write, which the marker
                // still to come wipes (found by a holder world).
                Phase::Confirming { .. } if flight.purpose == Purpose::Renew => {
                    self.quiet_for_a_marker(now);
                    self.campaign_after(now, Duration::ZERO)
                }
                _ => self.campaign_after(now, Duration::ZERO),
            },
            ErrorKind::FenceMismatch => match &mut self.phase {
                Phase::Owner {
                    next_at,
                    recovering,
                    ..
                } => {
                    *recovering = true;
                    *next_at = now;
                }
                // Ask again: the acquire returns the current fence.
                Phase::Confirming { .. } => self.campaign_after(now, Duration::ZERO),
                Phase::Stopping { .. } => self.send(now, Purpose::Acquire, 0),
                _ => {}
            },
            // `unavailable` or `internal`: the service may have written before it
            // failed (a JetStream ack that timed out), so the outcome is unknown.
            _ => {
                self.mark_unknown(flight);
                self.on_transient(now, flight);
            }
        }
    }

    fn on_transient(&mut self, now: Instant, flight: InFlight) {
        // An owner backs off with jitter (owner_retry_delay), never past the last
        // send that can still renew before its deadline; a campaign backs off
        // (doubling, at most one TTL) while the service keeps failing (a corrupt
        // record answers `internal` until someone repairs it); a change event still
        // wakes it at once.
        self.failures = self.failures.saturating_add(1);
        let backoff = self
            .config
            .retry_every
            .saturating_mul(1 << (self.failures - 1).min(16))
            .min(self.config.ttl);
        let (failures, jitter) = (self.failures, self.next_jitter());
        let (retry_every, request_timeout) = (self.config.retry_every, self.config.request_timeout);
        match &mut self.phase {
            Phase::Owner {
                next_at, ownership, ..
            } => {
                let room = ownership
                    .deadline
                    .saturating_duration_since(now + request_timeout);
                *next_at = now + owner_retry_delay(retry_every, failures, jitter, room);
            }
            Phase::Campaigning { next_at } => *next_at = now + backoff,
            Phase::Confirming { .. } => self.campaign_after(now, backoff),
            // One release attempt is enough: the TTL frees the key anyway. A renew or
            // acquire that was in flight when the stop came still leads to a release.
            Phase::Stopping { .. } if flight.purpose == Purpose::Release => {
                self.phase = Phase::Done
            }
            Phase::Stopping { .. } | Phase::Done => {}
        }
    }

    fn step_down(&mut self, now: Instant, reason: StepDownReason) {
        self.events.push_back(HolderEvent::SteppedDown { reason });
        let wait = match reason {
            StepDownReason::Lost => Duration::ZERO,
            _ => self.config.retry_every,
        };
        self.campaign_after(now, wait);
    }

    fn campaign_after(&mut self, now: Instant, wait: Duration) {
        let next_at = (now + wait).max(self.quiet_until.unwrap_or(now));
        self.phase = Phase::Campaigning { next_at };
    }

    /// A renew answered `lost` may have been written as its lease ran out: the old
    /// lease's expiry marker, within [`MAX_EXPIRY_MARKER_LAG`], may wipe the key, and
    /// whatever a campaign wins before it.
    fn quiet_for_a_marker(&mut self, now: Instant) {
        let until = now + MAX_EXPIRY_MARKER_LAG;
        self.quiet_until = Some(self.quiet_until.map_or(until, |q| q.max(until)));
    }

    /// A renew whose outcome is unknown may land after the end of the lease it
    /// renews, and the expiry marker still to come would then wipe the key. That
    /// lease was stored before this holder learned its fence, so it ends at most a
    /// TTL (and the drift margin) after that; its marker comes within
    /// [`MAX_EXPIRY_MARKER_LAG`].
    fn stay_quiet(&mut self) {
        let margin = self.config.ttl - self.config.believed_span(self.config.ttl);
        let until = self.fence_learned_at + self.config.ttl + margin + MAX_EXPIRY_MARKER_LAG;
        self.quiet_until = Some(self.quiet_until.map_or(until, |q| q.max(until)));
    }

    /// Steps down at the deadline, and sends what is due.
    fn drive(&mut self, now: Instant) {
        if let Phase::Owner { ownership, .. } = self.phase
            && now >= ownership.deadline
        {
            // An unanswered request may still write; its outcome is unknown.
            if let Some(flight) = self.in_flight.take() {
                self.mark_unknown(flight);
            }
            self.step_down(now, StepDownReason::DeadlineMissed);
        }
        if self.in_flight.is_some() {
            return;
        }
        match self.phase {
            Phase::Campaigning { next_at } if now >= next_at => match self.held_back_until {
                // A tick inside the hold-back after a change: the preferred candidate
                // asks first.
                Some(until) if now < until => self.phase = Phase::Campaigning { next_at: until },
                // The hold-back has passed: ask.
                Some(_) => {
                    self.held_back_until = None;
                    self.send(now, Purpose::Acquire, 0);
                }
                // A plain tick of a candidate that holds back: read first.
                None if !self.config.hold_back.is_zero() => self.send(now, Purpose::Probe, 0),
                None => self.send(now, Purpose::Acquire, 0),
            },
            Phase::Confirming { revision } => self.send(now, Purpose::Renew, revision),
            Phase::Owner {
                ownership,
                next_at,
                recovering,
            } if now >= next_at => {
                let purpose = if recovering {
                    Purpose::Acquire
                } else {
                    Purpose::Renew
                };
                self.send(now, purpose, ownership.fence);
            }
            // A revocation keeps the lease until its deadline.
            Phase::Stopping {
                hold_until: Some(at),
                ..
            } if now < at => {}
            Phase::Stopping {
                fence, attempts, ..
            } => match fence {
                Some(fence) if attempts < MAX_STOP_REQUESTS => {
                    self.send(now, Purpose::Release, fence)
                }
                _ => self.phase = Phase::Done,
            },
            _ => {}
        }
    }

    fn send(&mut self, now: Instant, purpose: Purpose, fence: u64) {
        let (key, holder) = (self.config.key.clone(), self.config.holder.clone());
        let request = match purpose {
            Purpose::Acquire => Request::Acquire(AcquireRequest {
                key,
                holder,
                ttl_ms: self.config.ttl_ms(),
            }),
            Purpose::Renew => Request::Renew(RenewRequest {
                key,
                holder,
                revision: fence,
                ttl_ms: Some(self.config.ttl_ms()),
            }),
            Purpose::Release => Request::Release(ReleaseRequest {
                key,
                holder,
                revision: fence,
            }),
            Purpose::Probe => Request::Owner(OwnerRequest { key }),
        };
        if let Phase::Stopping { attempts, .. } = &mut self.phase {
            *attempts += 1;
        }
        let id = TransmitId(self.next_id);
        self.next_id += 1;
        self.in_flight = Some(InFlight {
            id,
            purpose,
            sent_at: now,
            fence,
        });
        self.requests.push_back(lease_call(
            id,
            request.endpoint(),
            request.to_json(),
            self.config.request_timeout,
        ));
    }
}

/// Whether a granted lease is a renewal stored at least half a TTL after its tenure
/// began: only such a write can have landed after the end of the lease it renewed
/// (that lease ran at least a TTL from the tenure's first write). Its times are the
/// service's (`acquired_at`) and the server's store time (`expires_at` less the
/// TTL); half a TTL of slack covers their skew.
fn may_be_a_late_renewal(lease: &crate::wire::Lease) -> bool {
    let (Some(acquired), Some(expires)) = (
        crate::record::parse_time(&lease.acquired_at),
        crate::record::parse_time(&lease.expires_at),
    ) else {
        // Unreadable times: assume the worst.
        return true;
    };
    let ttl = time::Duration::milliseconds(lease.ttl_ms as i64);
    expires - ttl - acquired >= ttl / 2
}
