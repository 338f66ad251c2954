//! A member's campaigns as one pure machine: every key one process campaigns for,
//! in groups (an elector is a group of one key; a shard set is a group of many with
//! a cap on how many it holds), and the owner-side inbox checks for all of them.
//!
//! [`Campaign`] owns the policy the holder library needs beyond one [`Holder`]:
//!
//! - **One campaign per key.** A holder ID campaigns for a key once; a second group
//!   naming a key still campaigned for is refused, or two machines of one holder ID
//!   would both believe they own it.
//! - **At most `max_held` per group.** Campaign acquires wait in a queue and go out
//!   only while the keys held (or being confirmed) plus those in flight stay below
//!   the cap, so a group never wins more than it may keep, and the keys take turns.
//!   Should a group hold more than its cap, it revokes the newest tenures.
//!   Whatever the cap, at most [`MAX_CAMPAIGNS_IN_FLIGHT`] campaign acquires of a
//!   group are out at once: a member starting with thousands of keys asks at the
//!   pace the service answers, and its renewals (never queued) are not drowned.
//! - **Balanced shards** ([`Campaign::add_balanced_group`]): members of a shard set
//!   learn of each other from presence leases, one per member (`<set>-member-<i>`,
//!   a group of their own that holds one), and hold at most `ceil(shards / members)`
//!   each. A member above that, or above `floor(shards / members)` while another
//!   member holds fewer, revokes its newest tenures, a few per renew interval, and
//!   waits a campaign interval after each release before asking for it again: N
//!   members converge to the floor or the ceiling each, with no preemption (only the
//!   holder releases).
//! - **Revocation before release.** A release the campaign decides by itself (a
//!   shard shed, a semaphore slot above the cap) goes through [`Holder::handle_revoke`]:
//!   the key steps down at once (`ownership` is `None`, the event is
//!   [`StepDownReason::Revoked`] with the last deadline handed out), and the lease
//!   is kept, not renewed, until the application calls
//!   [`Campaign::handle_stopped_writing`] for the key or that deadline passes; only
//!   then is it released. An application that read a tenure a moment before keeps
//!   writing at most until that tenure's deadline, and the server's lease outlives every deadline handed out, so the
//!   next owner is granted the key only after the last such write, whether or not
//!   the application heard of the revocation. Releases the application asks for
//!   ([`Campaign::handle_stop_group`]) stay immediate: it has stopped writing.
//! - **Never-sent requests are cancelled**, not answered: a queued acquire whose
//!   holder stopped meanwhile goes back to it as [`Holder::handle_cancel`].
//! - **Health-gated leadership** ([`Campaign::handle_health`]): the application
//!   reports a group's health; a group is healthy until it says otherwise.
//!   - While unhealthy, the group sends no campaign acquire: those queued wait (and
//!     are cancelled at their holder's timeout, never sent), those made ready but
//!     not yet taken by [`Campaign::poll_transmit`] are taken back and cancelled.
//!     Keys it holds stay held and renewed: a blip shorter than `unhealthy_for`
//!     changes nothing else.
//!   - Unhealthy since T, at T + `unhealthy_for` (the group's TTL by default,
//!     [`Campaign::set_unhealthy_for`]) every key it holds steps down with
//!     [`StepDownReason::Unhealthy`] and is released the way a revocation is (on
//!     [`Campaign::handle_stopped_writing`] or at the last deadline handed out); a
//!     key granted later while still unhealthy (an acquire sent before) is never
//!     elected: it is released once its confirming renew is answered (no deadline
//!     was handed out).
//!   - A key already revoked (for balance, or for health) stays revoked whatever
//!     the health says: released on `handle_stopped_writing` or at its deadline,
//!     never sooner (the application may still write under it), never kept longer.
//!   - Healthy again: every campaign of the group asks at once (not at its next
//!     tick), the queued acquires go out, and a key released meanwhile is asked
//!     for again.
//!   - A balanced set's health is its presence's too: an unhealthy member leaves
//!     the set at T + `unhealthy_for`, its presence key released at once (nothing
//!     is written under it), so the others' shares grow to cover its shards.
//! - **Semaphores** ([`Campaign::add_semaphore`]): one of `permits` slot leases
//!   (`<name>-<i>`), a group of the slots that holds at most one.
//! - **Change events wake campaigns.** A release or an expiry of a key asks for it at
//!   once rather than at the next campaign tick.
//! - **Request deadlines are kept here.** A request not answered within its timeout
//!   becomes [`RequestOutcome::TimedOut`] in [`Campaign::handle_timeout`], and
//!   [`CampaignEvent::Cancel`] tells the adapter to drop it, so an adapter arms one
//!   timer, from [`Campaign::poll_timeout`]. One due before it was polled was never
//!   sent: its holder hears [`Holder::handle_cancel`].
//! - **Hand-offs are bounded here.** A subscribe of change events
//!   ([`CampaignEvent::Watch`]) or a reject reply ([`CampaignEvent::Reject`]) the
//!   adapter has not reported done within [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND) is given up
//!   ([`CampaignEvent::CancelWatch`], [`CampaignEvent::CancelReject`]): the adapter
//!   runs them in the background, never holding its loop, and arms no timer for them.
//! - **What the metrics count comes out as events**: each request's outcome class
//!   and time ([`CampaignEvent::Answered`], a renew sent after a renew without a
//!   clear answer marked a retry), ownership changes ([`CampaignEvent::Leading`]),
//!   the time a campaign took ([`CampaignEvent::ElectedAfter`], restarted by every
//!   step-down but a stop); the keys campaigned for are [`Campaign::candidates`].
//!   An adapter records them and reads no reply itself.
//! - **The inbox** ([`Campaign::check_inbox`]) follows every holder's tenure: a
//!   forwarded request is accepted only for a key owned now, with a fence of this
//!   tenure, and delivered only while the application reads the inbox (else
//!   dropped unanswered: [`InboxVerdict::Ignore`]).
//!
//! Each job has its file: groups and their caps (`groups.rs`), balanced sets
//! (`rebalance.rs`), semaphores (`semaphore.rs`), health gating (`health.rs`), the
//! inbox check (`inbox.rs`), the timer index (`timers.rs`) and the requests out
//! (`outbox.rs`); this file holds the types, the inputs every job shares and the
//! settle loop that runs them.
//!
//! Drive it like every machine of this crate: after each input, drain
//! [`Campaign::poll_transmit`] and [`Campaign::poll_event`]; sleep until
//! [`Campaign::poll_timeout`].
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use dagnats_leases_core::holder::campaign::{Campaign, CampaignEvent};
//! use dagnats_leases_core::holder::HolderConfig;
//! use dagnats_leases_core::io::RequestOutcome;
//!
//! # fn send(_: &dagnats_leases_core::io::NatsRequest) -> RequestOutcome { unimplemented!() }
//! # fn sleep_until(_: Instant) {}
//! let mut campaign = Campaign::new("notify-7f3a", Instant::now()).expect("a valid holder ID");
//! let ttl = Duration::from_secs(15);
//! let config = HolderConfig::new("notify-leader", "notify-7f3a", ttl);
//! let leader = campaign.add_group(Instant::now(), vec![config], 1).expect("valid");
//! loop {
//!     while let Some(out) = campaign.poll_transmit() {
//!         let outcome = send(&out.transmit.request);
//!         campaign.handle_outcome(Instant::now(), out.transmit.id, outcome);
//!     }
//!     while let Some(event) = campaign.poll_event() {
//!         if let CampaignEvent::Holder { key, event, .. } = event {
//!             println!("{key}: {event:?}");
//!         }
//!     }
//!     if let Some(at) = campaign.poll_timeout() {
//!         sleep_until(at);
//!     }
//!     campaign.handle_timeout(Instant::now());
//! }
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crate::change::ChangeEvent;
use crate::holder::StepDownReason;
use crate::holder::guard::{Accepted, InboxGuard, RejectReason};
use crate::holder::{
    ConfigError, Holder, HolderConfig, HolderEvent, HolderStatus, OutcomeClass, Tenure,
};
use crate::io::{NatsRequest, RequestOutcome, Transmit, TransmitId, TransmitKind};
use crate::outbox::{Due, Handoff, Ids, Requests};
use crate::wire::{self, Endpoint, ErrorKind, ErrorReply};

mod batch;
mod groups;
mod handoff;
mod health;
mod inbox;
mod outbox;
mod rebalance;
mod semaphore;
mod timers;

pub use batch::{EARLY_WINDOW_DIVISOR, GROUP_BOUND, SERVICE_INFO_TIMEOUT, renewals_of_batch};
use handoff::Handoffs;
pub use handoff::RejectId;
use health::Health;
pub use inbox::InboxVerdict;
use outbox::Outbox;
pub use rebalance::presence_key;
use rebalance::{Balance, Seen};
pub use semaphore::{MAX_PERMITS, semaphore_slot};

/// One group of keys campaigned for together: an elector, or a shard set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u64);

/// What a [`Campaign`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CampaignEvent {
    /// An event of the holder of `key`.
    Holder {
        /// The group the key belongs to.
        group: GroupId,
        /// The key.
        key: String,
        /// What happened.
        event: HolderEvent,
    },
    /// Subscribe to `key`'s change events: a group campaigns for it (or counts the
    /// members of a balanced set by it) and this holder does not own it. They wake a
    /// campaign when the key may be free. An owned key is not watched: its events
    /// would be this holder's own renewals.
    /// Say when the subscribe is over with [`Campaign::handle_watched`]; the campaign
    /// gives it up at [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND) ([`CampaignEvent::CancelWatch`]).
    Watch {
        /// The key.
        key: String,
    },
    /// Drop the subscribe of `key`'s change events: the client took no command for
    /// [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND) (it reconnects to a server that is gone). The key goes
    /// unwatched: its campaign asks at its ticks, without the early wake-up.
    CancelWatch {
        /// The key.
        key: String,
    },
    /// Publish an empty reply with `Dagnats-Lease-Reject: stale`
    /// ([`RejectReason::reply_header`]) to `to`: a forwarded request
    /// [`Campaign::handle_inbox`] rejected. Say when the client took it with
    /// [`Campaign::handle_reject_sent`]; the campaign gives it up at [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND)
    /// ([`CampaignEvent::CancelReject`]).
    Reject {
        /// Names this reply in [`Campaign::handle_reject_sent`] and
        /// [`CampaignEvent::CancelReject`].
        id: RejectId,
        /// The forwarded request's reply subject.
        to: String,
    },
    /// Drop the publish of reject `id`: the client took no command for
    /// [`HANDOFF_BOUND`](crate::io::HANDOFF_BOUND). The forwarding service times the request out instead.
    CancelReject {
        /// The reject given up.
        id: RejectId,
    },
    /// Unsubscribe from `key`'s change events (or drop the subscribe still under
    /// way): no group campaigns for it any more, or this holder owns it now (it is
    /// watched again when it steps down).
    Unwatch {
        /// The key.
        key: String,
    },
    /// The group is finished: stopped and released, or every key refused for good.
    /// Its keys may be campaigned for again.
    Finished {
        /// The group.
        group: GroupId,
    },
    /// Stop request `id`: the campaign timed it out and waits for it no more (an
    /// outcome fed back for it now is ignored). The machine's deadline is the only
    /// timer a request has.
    Cancel {
        /// The request.
        id: TransmitId,
    },
    /// This holder ID began (`owns`) or stopped owning `key`: `Elected`, or a
    /// step-down (or the end of a holder that owned it).
    Leading {
        /// The key.
        key: String,
        /// Whether it owns the key now.
        owns: bool,
    },
    /// `key` of `group` was elected `after` the group began campaigning for it: since
    /// the group started, or since the last step-down of one of its keys that was
    /// not a stop.
    ElectedAfter {
        /// The group.
        group: GroupId,
        /// The key elected.
        key: String,
        /// How long the campaign took.
        after: Duration,
    },
    /// A request of the campaign came back (or was timed out by it).
    Answered(AnsweredRequest),
}

/// A request the campaign wants sent: a call to the lease service by the holder of
/// `key`. Feed its outcome back with `transmit.id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CampaignTransmit {
    /// The key whose holder sends it.
    pub key: String,
    /// The endpoint it calls.
    pub endpoint: Endpoint,
    /// The request.
    pub transmit: Transmit,
}

/// What came of one request, as the campaign read it ([`CampaignEvent::Answered`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnsweredRequest {
    /// The key whose holder sent it.
    pub key: String,
    /// The endpoint it called.
    pub endpoint: Endpoint,
    /// From its send to its outcome (or to the campaign's timeout).
    pub took: Duration,
    /// How the outcome reads: a yes or a no, or the slow path.
    pub class: OutcomeClass,
    /// A renew sent while the key's previous renew had no clear answer
    /// ([`OutcomeClass::is_clear`]): a retry.
    pub renew_retry: bool,
}

#[derive(Debug)]
struct Group {
    keys: Vec<HolderConfig>,
    max_held: usize,
    /// For a balanced shard group: its presence group, and when it may shed next.
    balance: Option<Balance>,
    stopping: bool,
    /// Keys the service refused for good (`invalid`, `unsupported`): not retried.
    failed: BTreeSet<String>,
    /// Campaign acquires waiting for room under `max_held`.
    /// Each with the instant its holder gave it up for lost: a request still queued
    /// then is cancelled (it was never sent) and asked for again.
    deferred: VecDeque<(String, Transmit, Instant)>,
    /// Campaign acquires sent and not yet answered.
    gated_in_flight: usize,
    health: Health,
    /// The presence keys of a balanced set: not candidates of the application's.
    presence: bool,
    /// When the group began campaigning: its start, or the last step-down of one of
    /// its keys that was not a stop ([`CampaignEvent::ElectedAfter`]).
    campaigning_since: Instant,
}

/// One key's candidacy: the holder campaigning for it in its group (a semaphore's
/// lease of one permit is a "slot"; this is not one).
#[derive(Debug)]
struct Candidacy {
    group: GroupId,
    /// Unique per holder made: outcomes for an earlier holder of the key are dropped.
    serial: u64,
    holder: Holder,
    /// Revoked for balance, or handed over: not campaigned for again until a
    /// campaign interval after its release.
    shed: bool,
}

/// Every campaign of one holder ID. See the [module docs](self).
#[derive(Debug)]
pub struct Campaign {
    holder: String,
    groups: BTreeMap<GroupId, Group>,
    candidacies: BTreeMap<String, Candidacy>,
    /// Keys some group campaigns for, and which.
    claimed: BTreeMap<String, GroupId>,
    out: Outbox,
    guard: InboxGuard,
    next_group: u64,
    next_serial: u64,
    events: VecDeque<CampaignEvent>,
    /// Holders of keys as change events showed them: how balanced groups count
    /// members and their shares.
    seen: BTreeMap<String, Seen>,
    /// Keys shed to rebalance and released, not campaigned for again until then.
    cooldown: BTreeMap<String, Instant>,
    /// Whether a key of a running group may lack a holder: set when a group is
    /// added, a candidacy is dropped or a cooldown ends, so that a settle with none of
    /// these does not look at every key (a member may hold thousands).
    vacancies: bool,
    /// Keys whose holder was fed since it was last drained: only they can have
    /// requests or events to pass on.
    touched: BTreeSet<String>,
    /// Keys drained in the settle under way: their deadlines are indexed again at
    /// its end, and only they can have finished.
    drained: BTreeSet<String>,
    /// Every holder's next deadline, in order: a timeout feeds only the holders due,
    /// and `poll_timeout` reads the first (a member may hold thousands of keys).
    timers: Due<String>,
    /// Mixed into the jitter of every holder made ([`Campaign::seed_jitter`]).
    jitter_seed: u64,
    /// Keys whose last renew had no clear answer: a renew sent now is a retry.
    renew_unclear: BTreeSet<String>,
    /// Keys this holder ID owns, as their holders' events said.
    owned: BTreeSet<String>,
    /// Subscribes and rejects handed to the client, until done or given up (boxed:
    /// seldom touched, kept out of the machine's inline size).
    handoffs: Box<Handoffs>,
    /// Renewals sent together in one request, where the service takes them so.
    batching: Box<batch::Batching>,
}

impl Campaign {
    /// The campaigns of holder ID `holder` (`[A-Za-z0-9_-]{1,128}`), none yet, at
    /// `now` (taken like every machine's constructor; a campaign starts with no
    /// deadline). `Err` when the holder ID is outside the bounds, as
    /// [`Holder::new`] for a config.
    pub fn new(holder: &str, _now: Instant) -> Result<Self, ConfigError> {
        wire::check_name("holder", holder)?;
        Ok(Self {
            holder: holder.to_string(),
            groups: BTreeMap::new(),
            candidacies: BTreeMap::new(),
            claimed: BTreeMap::new(),
            out: Outbox::default(),
            guard: InboxGuard::new(holder),
            next_group: 0,
            next_serial: 0,
            events: VecDeque::new(),
            seen: BTreeMap::new(),
            cooldown: BTreeMap::new(),
            vacancies: false,
            touched: BTreeSet::new(),
            drained: BTreeSet::new(),
            timers: Due::new(),
            jitter_seed: 0,
            renew_unclear: BTreeSet::new(),
            owned: BTreeSet::new(),
            handoffs: Box::default(),
            batching: Box::default(),
        })
    }

    /// Mixes `seed` (randomness the driver draws) into the jitter of every holder
    /// this campaign makes from now on ([`Holder::seed_jitter`]): their retries
    /// after failures are spread apart by it, on top of the spread their keys and
    /// holder ID give.
    pub fn seed_jitter(&mut self, seed: u64) {
        self.jitter_seed = seed;
    }

    /// The holder ID.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Feeds back what came of request `id`. Outcomes nobody waits for are ignored.
    pub fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        // A request not yet polled was never sent: no outcome of it can be real, and
        // taking its route would leave it queued without one.
        if self.out.requests.iter().any(|r| r.id == id) {
            return;
        }
        if self.is_batch(id) {
            self.deliver_batch(now, id, outcome);
        } else {
            self.deliver(now, id, outcome);
        }
        self.settle(now);
    }

    /// A change event for `key` arrived: a campaign for it asks again at once when
    /// the event may have freed the key.
    pub fn handle_change(&mut self, now: Instant, key: &str, event: &ChangeEvent) {
        match (&event.holder, event.kind.may_free_key()) {
            (Some(holder), false) => {
                let ttl = self
                    .candidacies
                    .get(key)
                    .map_or(Duration::ZERO, |s| s.holder.config().ttl);
                self.seen.insert(
                    key.to_string(),
                    Seen {
                        holder: holder.clone(),
                        until: now + ttl,
                    },
                );
            }
            (_, true) => {
                self.seen.remove(key);
            }
            _ => {}
        }
        if !event.kind.may_free_key() {
            return;
        }
        if let Some(candidacy) = self.candidacies.get_mut(key) {
            candidacy.holder.handle_change(now, event);
            self.touched.insert(key.to_string());
            self.settle(now);
        }
    }

    /// Acts on the time: requests past their deadline time out; holders renew,
    /// campaign or step down as due.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((id, route)) = self.out.routes.pop_timed_out(now) {
            if self.out.unqueue(id) {
                // Due before it was polled: never sent.
                self.withdraw_route(now, route);
            } else {
                self.deliver_route(now, route, RequestOutcome::TimedOut);
                self.events.push_back(CampaignEvent::Cancel { id });
            }
        }
        self.cancel_spent_batches();
        self.handoffs.give_up(now, &mut self.events);
        // Queued requests at their holder's timeout are cancelled first: never sent,
        // they are not an unknown outcome.
        self.pump(now);
        // A health step-down due now comes before a renewal due now: none goes out.
        self.gate_health(now);
        // The holders due, and those fed just now (their deadline may have moved
        // before it was indexed again); a holder not due does nothing.
        let due: BTreeSet<String> = self
            .timers
            .due(now)
            .cloned()
            .chain(self.touched.iter().cloned())
            .collect();
        for key in due {
            if let Some(candidacy) = self.candidacies.get_mut(&key) {
                candidacy.holder.handle_timeout(now);
                self.touched.insert(key);
            }
        }
        self.settle(now);
    }

    /// The next request to send, if any: a call to the lease service for the
    /// holder of one key. Every request polled is waited for until its outcome is
    /// fed back or [`CampaignEvent::Cancel`] names it.
    pub fn poll_transmit(&mut self) -> Option<CampaignTransmit> {
        let transmit = self.out.requests.pop_front()?;
        let transmit = self.batch_with(transmit);
        if let Some(key) = self.batch_key(transmit.id) {
            return Some(CampaignTransmit {
                key,
                endpoint: Endpoint::Renew,
                transmit,
            });
        }
        // Every queued request has its route: one taken is unqueued with it.
        let route = self.out.routes.get(&transmit.id)?;
        Some(CampaignTransmit {
            key: route.key.clone(),
            endpoint: route.endpoint,
            transmit,
        })
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<CampaignEvent> {
        self.events.pop_front()
    }

    /// Whether no group is left, and no reject is being handed to the client.
    pub fn is_done(&self) -> bool {
        self.groups.is_empty() && self.out.requests.is_empty() && !self.handoffs.rejecting()
    }

    /// The tenure this holder ID is in for `key` at `now`, if any.
    pub fn tenure(&self, key: &str, now: Instant) -> Option<Tenure> {
        self.candidacies.get(key)?.holder.tenure(now)
    }

    /// Where the holder of `key` is in its life, if some group campaigns for it.
    pub fn status(&self, key: &str) -> Option<HolderStatus> {
        Some(self.candidacies.get(key)?.holder.status())
    }

    /// The keys of `group` owned at `now`, with their tenures.
    pub fn held(&self, group: GroupId, now: Instant) -> BTreeMap<String, Tenure> {
        self.candidacies
            .iter()
            .filter(|(_, s)| s.group == group)
            .filter_map(|(k, s)| Some((k.clone(), s.holder.tenure(now)?)))
            .collect()
    }

    /// Runs the group policy until it has nothing more to do.
    fn settle(&mut self, now: Instant) {
        loop {
            self.drain(now);
            self.remove_finished(now);
            let mut changed = self.gate_health(now);
            changed |= self.rebalance(now);
            self.drain(now);
            changed |= self.pump(now);
            changed |= self.renew_due_early(now);
            if !changed {
                break;
            }
        }
        self.finish_groups(now);
        self.index_timers();
    }

    /// Sends what the holders want (campaign acquires into their group's queue) and
    /// passes their events on.
    fn drain(&mut self, now: Instant) {
        for key in std::mem::take(&mut self.touched) {
            let Some(candidacy) = self.candidacies.get_mut(&key) else {
                continue;
            };
            let key = &key;
            let group = self.groups.get_mut(&candidacy.group);
            let mut group = group;
            while let Some(request) = candidacy.holder.poll_transmit() {
                let campaign = request.kind == TransmitKind::Lease(Endpoint::Acquire)
                    && candidacy.holder.status() == HolderStatus::Campaigning;
                match group.as_deref_mut() {
                    Some(g) if campaign => {
                        let expires = now + request.request.timeout;
                        g.deferred.push_back((key.clone(), request, expires));
                    }
                    _ => self
                        .out
                        .send(now, key, candidacy, false, &self.renew_unclear, request),
                }
            }
            while let Some(event) = candidacy.holder.poll_event() {
                self.guard.observe(key, &event);
                if let (HolderEvent::Failed { .. }, Some(g)) = (&event, group.as_deref_mut()) {
                    g.failed.insert(key.clone());
                }
                let owns = match &event {
                    HolderEvent::Elected { .. } => Some(true),
                    HolderEvent::SteppedDown { .. } => Some(false),
                    _ => None,
                };
                let campaigned = match (&event, group.as_deref_mut()) {
                    (HolderEvent::Elected { .. }, Some(g)) if !g.presence => {
                        Some(now.saturating_duration_since(g.campaigning_since))
                    }
                    // A stop ends the campaign; any other step-down begins it anew.
                    (HolderEvent::SteppedDown { reason }, Some(g))
                        if *reason != StepDownReason::Stopped =>
                    {
                        g.campaigning_since = now;
                        None
                    }
                    _ => None,
                };
                self.events.push_back(CampaignEvent::Holder {
                    group: candidacy.group,
                    key: key.clone(),
                    event,
                });
                if let Some(owns) = owns {
                    lead(&mut self.owned, &mut self.events, key, owns);
                    let stopping = group.as_deref().is_none_or(|g| g.stopping);
                    watch_unless_owned(
                        &mut self.handoffs,
                        &mut self.seen,
                        &mut self.events,
                        now,
                        key,
                        owns,
                        stopping,
                    );
                }
                if let Some(after) = campaigned {
                    self.events.push_back(CampaignEvent::ElectedAfter {
                        group: candidacy.group,
                        key: key.clone(),
                        after,
                    });
                }
            }
            self.drained.insert(key.clone());
        }
    }
}

/// Notes that this holder ID began (`owns`) or stopped owning `key`, reporting
/// [`CampaignEvent::Leading`] when that changes.
fn lead(owned: &mut BTreeSet<String>, events: &mut VecDeque<CampaignEvent>, key: &str, owns: bool) {
    let changed = if owns {
        owned.insert(key.to_string())
    } else {
        owned.remove(key)
    };
    if changed {
        let key = key.to_string();
        events.push_back(CampaignEvent::Leading { key, owns });
    }
}

/// A key's change events only wake a campaign for it and show who holds it to a
/// balanced set; while this holder owns the key they are its own renewals, one a
/// renewal, read for nothing. So the key is unwatched when elected (what was seen
/// of it goes: this holder holds it) and watched again when it steps down, unless
/// its group is stopping (it is unwatched for good when the group finishes).
fn watch_unless_owned(
    handoffs: &mut Handoffs,
    seen: &mut BTreeMap<String, Seen>,
    events: &mut VecDeque<CampaignEvent>,
    now: Instant,
    key: &str,
    owns: bool,
    stopping: bool,
) {
    if owns {
        seen.remove(key);
        handoffs.unwatch(key, events);
    } else if !stopping {
        handoffs.watch(now, key.to_string(), events);
    }
}

/// Campaign acquires of one group out at once, at most. 100 members of 1,000
/// shards each sent 100,000 acquires at once to one service (`scripts/bench
/// --scale 100000`): the renewals of the leases already won queued behind them,
/// timed out, and every lease was lost.
pub const MAX_CAMPAIGNS_IN_FLIGHT: usize = 32;
