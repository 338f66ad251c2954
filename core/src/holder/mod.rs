//! The holder side of a lease, as a pure machine: campaign for a key, renew it about
//! every ttl/3, and step down the moment ownership can no longer be proven.
//!
//! The rest of the holder side lives beside it, in this folder: every campaign of
//! one process ([`campaign`]), the client's waiting acquire ([`acquire_wait`]), the
//! owner-side and downstream checks ([`guard`]), `elect`'s decisions ([`elect`]) and
//! `lock`'s supervision ([`supervise`]).
//!
//! The [`Holder`] itself is this file (its state and its inputs) and four files
//! beside it, one job each: its config and bounds (`config.rs`), its events
//! (`events.rs`), how it reads each outcome (`replies.rs`: grant, renew, error,
//! step-down, the quiet waits for an expiry marker), what it sends when
//! (`drive.rs`), and an owner's retry backoff and jitter (`retry.rs`).
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
mod config;
mod drive;
pub mod elect;
mod events;
pub mod guard;
pub mod relay;
mod replies;
mod retry;
pub mod supervise;

pub use crate::outcome::OutcomeClass;
pub use config::{
    ConfigError, DEFAULT_MAX_CLOCK_DRIFT_PPM, HolderConfig, MAX_HOLD_BACK, MAX_PRIORITY,
    MAX_STOP_REQUESTS, PRIORITY_STEP,
};
pub use events::{HolderEvent, HolderStatus, StepDownReason, Tenure};
pub use retry::{jitter_seed, owner_retry_delay};

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::change::ChangeEvent;
use crate::io::{RequestOutcome, Transmit, TransmitId};
use crate::wire::{Endpoint, Response};

/// How long after a lease's end nats-server may still write its expiry marker: it
/// checks expiries on a timer (0 to 325 ms late, measured on 2.14) and then proposes
/// the marker; 1 s leaves room for the proposal in a cluster.
pub const MAX_EXPIRY_MARKER_LAG: Duration = Duration::from_secs(1);

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

/// Renews whose outcome is unknown: the earliest send, and the highest fence one
/// carried. Such a renew can still write only while the key's revision is that fence,
/// so seeing any higher revision retires them.
#[derive(Debug, Clone, Copy)]
struct UnknownRenews {
    since: Instant,
    fence: u64,
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
        // Read for the report of a campaign's acquire only: a renewal's reply is
        // not read here.
        let not_granted = campaign.then(|| {
            let answer = OutcomeClass::of(Endpoint::Acquire, &outcome);
            let holder = match &outcome {
                RequestOutcome::Reply { payload, .. } => {
                    match Response::decode(Endpoint::Acquire, payload) {
                        Ok(Response::Acquired(r)) if !r.granted => Some(r.lease.holder),
                        _ => None,
                    }
                }
                _ => None,
            };
            (holder, answer)
        });
        self.on_outcome(now, flight, outcome);
        if let Some((holder, answer)) = not_granted
            && matches!(self.phase, Phase::Campaigning { .. })
        {
            self.events
                .push_back(HolderEvent::NotGranted { holder, answer });
        }
    }
}
