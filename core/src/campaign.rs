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
//!   is kept, not renewed, until the application calls [`Campaign::handle_done`] for the
//!   key or that deadline passes; only then is it released. An application that
//!   read a tenure a moment before keeps writing at most until that tenure's
//!   deadline, and the server's lease outlives every deadline handed out, so the
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
//!     [`Campaign::handle_done`] or at the last deadline handed out); a key granted later
//!     while still unhealthy (an acquire sent before) is never elected: it is
//!     released once its confirming renew is answered (no deadline was handed out).
//!   - A key already revoked (for balance, or for health) stays revoked whatever
//!     the health says: released on `done` or at its deadline, never sooner
//!     (the application may still write under it), never kept longer.
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
//! - **What the metrics count comes out as events**: each request's outcome class
//!   and time ([`CampaignEvent::Answered`], a renew sent after a renew without a
//!   clear answer marked a retry), ownership changes ([`CampaignEvent::Leading`]),
//!   the time a campaign took ([`CampaignEvent::ElectedAfter`], restarted by every
//!   step-down but a stop) and the keys campaigned for ([`CampaignEvent::Candidate`]).
//!   An adapter records them and reads no reply itself.
//! - **The inbox** ([`Campaign::check_inbox`]) follows every holder's tenure: a
//!   forwarded request is accepted only for a key owned now, with a fence of this
//!   tenure, and delivered only while the application reads the inbox (else
//!   dropped unanswered: [`InboxVerdict::Ignore`]).
//!
//! Drive it like every machine of this crate: after each input, drain
//! [`Campaign::poll_transmit`] and [`Campaign::poll_event`]; sleep until
//! [`Campaign::poll_timeout`].
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use dagnats_leases_core::campaign::{Campaign, CampaignEvent};
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
use crate::guard::{Accepted, InboxGuard, RejectReason};
use crate::holder::StepDownReason;
use crate::holder::{Holder, HolderConfig, HolderEvent, HolderStatus, OutcomeClass, Tenure};
use crate::io::{EffectId, RequestOutcome, Transmit, TransmitKind};
use crate::wire::{self, Endpoint, ErrorKind, ErrorReply};

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
    /// members of a balanced set by it). They wake a campaign when the key may be free.
    Watch {
        /// The key.
        key: String,
    },
    /// Unsubscribe from `key`'s change events: no group campaigns for it any more.
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
        id: EffectId,
    },
    /// A group campaigns for `key` (a presence key of a balanced set is not one):
    /// its leader gauge shows from now on, at 0 until elected.
    Candidate {
        /// The key.
        key: String,
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

/// What to do with a request forwarded to this holder's inbox
/// ([`Campaign::check_inbox`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxVerdict {
    /// Pass it to the application: it is for a key owned now, with a fence of this
    /// tenure.
    Deliver(Accepted),
    /// Answer it `Dagnats-Lease-Reject: stale` for this reason, and drop it.
    Reject(RejectReason),
    /// Drop it unanswered: it is for a key owned now, but nobody reads the inbox.
    /// The forwarding service times it out; a reject would call a good fence stale.
    Ignore,
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

/// A group's health as the application reported it.
#[derive(Debug, Clone, Copy)]
struct Health {
    /// How long unhealthy before the held keys step down.
    unhealthy_for: Duration,
    /// Unhealthy since then; `None` while healthy.
    since: Option<Instant>,
}

impl Health {
    /// When the held keys step down, while unhealthy.
    fn step_down_at(&self) -> Option<Instant> {
        self.since.map(|t| t + self.unhealthy_for)
    }
}

#[derive(Debug, Clone, Copy)]
struct Balance {
    presence: GroupId,
    shed_at: Instant,
}

/// Who holds a key, as the last change event said, and until when that is believed
/// without a newer event (a renewal refreshes it every ttl/3).
#[derive(Debug, Clone)]
struct Seen {
    holder: String,
    until: Instant,
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
    /// The deadline this candidacy is filed under in `Campaign::timers`.
    timer: Option<Instant>,
}

#[derive(Debug)]
struct Route {
    key: String,
    serial: u64,
    inner: EffectId,
    group: GroupId,
    gated: bool,
    deadline: Instant,
    endpoint: Endpoint,
    sent: Instant,
    renew_retry: bool,
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
    timers: BTreeSet<(Instant, String)>,
    /// Mixed into the jitter of every holder made ([`Campaign::seed_jitter`]).
    jitter_seed: u64,
    /// Keys whose last renew had no clear answer: a renew sent now is a retry.
    renew_unclear: BTreeSet<String>,
    /// Keys this holder ID owns, as their holders' events said.
    owned: BTreeSet<String>,
}

/// Requests sent and waiting for their outcome, and those ready to send.
#[derive(Debug, Default)]
struct Outbox {
    routes: BTreeMap<EffectId, Route>,
    /// The routes' deadlines, in order.
    deadlines: BTreeSet<(Instant, EffectId)>,
    requests: VecDeque<Transmit>,
    next_request: u64,
}

impl Outbox {
    /// Takes the route of request `id` (answered, timed out or recalled).
    fn take(&mut self, id: EffectId) -> Option<Route> {
        let route = self.routes.remove(&id)?;
        self.deadlines.remove(&(route.deadline, id));
        Some(route)
    }

    /// Takes request `id` back if it is still waiting to be polled: then it was
    /// never sent.
    fn unqueue(&mut self, id: EffectId) -> bool {
        let before = self.requests.len();
        self.requests.retain(|r| r.id != id);
        self.requests.len() != before
    }

    /// Sends a holder's request under an id of the campaign's own.
    fn send(
        &mut self,
        now: Instant,
        key: &str,
        candidacy: &Candidacy,
        gated: bool,
        renew_unclear: &BTreeSet<String>,
        request: Transmit,
    ) {
        let id = EffectId(self.next_request);
        self.next_request += 1;
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
                deadline: now + request.request.timeout,
                endpoint,
                sent: now,
                renew_retry: endpoint == Endpoint::Renew && renew_unclear.contains(key),
            },
        );
        self.deadlines.insert((now + request.request.timeout, id));
        self.requests.push_back(Transmit { id, ..request });
    }
}

impl Campaign {
    /// The campaigns of holder ID `holder` (`[A-Za-z0-9_-]{1,128}`), none yet, at
    /// `now` (taken like every machine's constructor; a campaign starts with no
    /// deadline).
    pub fn new(holder: &str, _now: Instant) -> Result<Self, ErrorReply> {
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
            timers: BTreeSet::new(),
            jitter_seed: 0,
            renew_unclear: BTreeSet::new(),
            owned: BTreeSet::new(),
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

    /// Starts campaigning for `keys` (each config's `holder` must be this campaign's),
    /// holding at most `max_held` of them (at least 1). Refused when a config is
    /// outside the bounds, or a key is campaigned for already.
    pub fn add_group(
        &mut self,
        now: Instant,
        keys: Vec<HolderConfig>,
        max_held: usize,
    ) -> Result<GroupId, ErrorReply> {
        self.check_group(&keys)?;
        let id = self.insert_group(now, keys, max_held, None, false);
        self.settle(now);
        Ok(id)
    }

    /// Starts a balanced shard group named `set` over `keys`: the members campaigning
    /// for the same set share it, each holding `floor` or `ceil(keys / members)` once
    /// settled (see the [module docs](self)). Its presence keys are
    /// `<set>-member-<i>`, one per shard, configured like the first key.
    pub fn add_balanced_group(
        &mut self,
        now: Instant,
        set: &str,
        keys: Vec<HolderConfig>,
    ) -> Result<GroupId, ErrorReply> {
        let Some(first) = keys.first() else {
            return Err(ErrorReply::new(
                ErrorKind::Invalid,
                "a campaign needs at least one key".to_string(),
            ));
        };
        let presence: Vec<HolderConfig> = (0..keys.len())
            .map(|i| HolderConfig {
                key: presence_key(set, i),
                ..first.clone()
            })
            .collect();
        let mut all = presence.clone();
        all.extend(keys.iter().cloned());
        self.check_group(&all)?;
        let presence = self.insert_group(now, presence, 1, None, true);
        let balance = Balance {
            presence,
            shed_at: now,
        };
        let id = self.insert_group(now, keys, usize::MAX, Some(balance), false);
        self.settle(now);
        Ok(id)
    }

    /// Starts a semaphore: holds one of `permits` slots, the leases
    /// `<config.key>-<i>` for `i` below `permits` (see [`semaphore_slot`]), each with
    /// its own fence. It is a group of the slots that holds at most one, so its
    /// acquires go out one at a time and the slots take turns until one is granted;
    /// `permits` holders of the name hold a slot each, any more wait for a release or
    /// an expiry. Refused for `permits` outside 1 to [`MAX_PERMITS`], or a slot key
    /// outside the key bounds.
    pub fn add_semaphore(
        &mut self,
        now: Instant,
        config: HolderConfig,
        permits: usize,
    ) -> Result<GroupId, ErrorReply> {
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(ErrorReply::new(
                ErrorKind::Invalid,
                format!("permits must be 1 to {MAX_PERMITS}, got {permits}"),
            ));
        }
        let candidacies = (0..permits)
            .map(|i| HolderConfig {
                key: semaphore_slot(&config.key, i),
                ..config.clone()
            })
            .collect();
        self.add_group(now, candidacies, 1)
    }

    fn check_group(&self, keys: &[HolderConfig]) -> Result<(), ErrorReply> {
        let invalid = |why: String| Err(ErrorReply::new(ErrorKind::Invalid, why));
        if keys.is_empty() {
            return invalid("a campaign needs at least one key".to_string());
        }
        let mut seen = BTreeSet::new();
        for config in keys {
            config.validate()?;
            if config.holder != self.holder {
                return invalid(format!(
                    "holder {:?} of key {:?} is not this campaign's holder {:?}",
                    config.holder, config.key, self.holder
                ));
            }
            if self.claimed.contains_key(&config.key) || !seen.insert(config.key.as_str()) {
                return invalid(format!(
                    "key {:?} already has a campaign of holder {:?}: one holder ID \
                     campaigns for a key once",
                    config.key, self.holder
                ));
            }
        }
        Ok(())
    }

    fn insert_group(
        &mut self,
        now: Instant,
        mut keys: Vec<HolderConfig>,
        max_held: usize,
        balance: Option<Balance>,
        presence: bool,
    ) -> GroupId {
        let id = GroupId(self.next_group);
        self.next_group += 1;
        spread_renewals(&mut keys);
        let health = Health {
            unhealthy_for: keys.first().map_or(Duration::ZERO, |c| c.ttl),
            since: None,
        };
        for config in &keys {
            self.claimed.insert(config.key.clone(), id);
            let key = config.key.clone();
            self.events.push_back(CampaignEvent::Watch { key });
            if !presence {
                let key = config.key.clone();
                self.events.push_back(CampaignEvent::Candidate { key });
            }
        }
        self.vacancies = true;
        self.groups.insert(
            id,
            Group {
                keys,
                max_held: max_held.max(1),
                balance,
                stopping: false,
                failed: BTreeSet::new(),
                deferred: VecDeque::new(),
                gated_in_flight: 0,
                health,
                presence,
                campaigning_since: now,
            },
        );
        id
    }

    /// Stops one group: its holders step down and release what they hold; then
    /// [`CampaignEvent::Finished`].
    pub fn handle_stop_group(&mut self, now: Instant, group: GroupId) {
        let Some(g) = self.groups.get_mut(&group) else {
            return;
        };
        g.stopping = true;
        let presence = g.balance.map(|b| b.presence);
        for (key, candidacy) in self
            .candidacies
            .iter_mut()
            .filter(|(_, s)| s.group == group)
        {
            candidacy.holder.handle_stop(now);
            self.touched.insert(key.clone());
        }
        // A balanced group leaves its set: its presence goes with it.
        if let Some(presence) = presence {
            self.handle_stop_group(now, presence);
        }
        self.settle(now);
    }

    /// Hands every key `group` holds over: each steps down
    /// ([`StepDownReason::HandedOver`]) and is released now, and the group asks for
    /// it again only a campaign interval after the release, so a member waiting for
    /// the key (woken by the release's change event) is elected first. The group
    /// goes on campaigning.
    pub fn handle_hand_over(&mut self, now: Instant, group: GroupId) {
        for (_, key) in self.holding(group, now) {
            if let Some(candidacy) = self.candidacies.get_mut(&key) {
                candidacy.holder.handle_hand_over(now);
                candidacy.shed = true;
                self.touched.insert(key);
            }
        }
        self.settle(now);
    }

    /// Stops every group.
    pub fn handle_stop(&mut self, now: Instant) {
        let groups: Vec<GroupId> = self.groups.keys().copied().collect();
        for group in groups {
            self.handle_stop_group(now, group);
        }
    }

    /// The application's health check for `group` passed (`healthy`) or failed at
    /// `now` (see the [module docs](self)): while it fails, no campaign acquire of
    /// the group goes out; failing since T, at T + `unhealthy_for` its keys step
    /// down with [`StepDownReason::Unhealthy`]; passing again, its campaigns ask at
    /// once. A balanced group's presence follows it. An unknown group is ignored.
    pub fn handle_health(&mut self, now: Instant, group: GroupId, healthy: bool) {
        for id in self.with_presence(group) {
            let Some(g) = self.groups.get_mut(&id) else {
                continue;
            };
            if healthy {
                if g.health.since.take().is_some() {
                    for (key, candidacy) in
                        self.candidacies.iter_mut().filter(|(_, s)| s.group == id)
                    {
                        candidacy.holder.ask_now(now);
                        self.touched.insert(key.clone());
                    }
                }
            } else {
                g.health.since.get_or_insert(now);
                self.recall(now, id);
            }
        }
        self.settle(now);
    }

    /// How long `group` may stay unhealthy before its keys step down (its keys'
    /// TTL unless set). A balanced group's presence follows it.
    pub fn set_unhealthy_for(&mut self, now: Instant, group: GroupId, unhealthy_for: Duration) {
        for id in self.with_presence(group) {
            if let Some(g) = self.groups.get_mut(&id) {
                g.health.unhealthy_for = unhealthy_for;
            }
        }
        self.settle(now);
    }

    /// Whether `group` is healthy, as last reported (true for an unknown group).
    pub fn is_healthy(&self, group: GroupId) -> bool {
        self.groups
            .get(&group)
            .is_none_or(|g| g.health.since.is_none())
    }

    /// `group`, and its presence group if it is a balanced set.
    fn with_presence(&self, group: GroupId) -> Vec<GroupId> {
        let presence = self.groups.get(&group).and_then(|g| g.balance);
        std::iter::once(group)
            .chain(presence.map(|b| b.presence))
            .collect()
    }

    /// Takes back `group`'s campaign acquires made ready but not yet polled: never
    /// sent, they are cancelled.
    fn recall(&mut self, now: Instant, group: GroupId) {
        let routes = &self.out.routes;
        let (recalled, kept): (VecDeque<Transmit>, VecDeque<Transmit>) =
            std::mem::take(&mut self.out.requests)
                .into_iter()
                .partition(|r| {
                    routes
                        .get(&r.id)
                        .is_some_and(|route| route.gated && route.group == group)
                });
        self.out.requests = kept;
        for request in recalled {
            self.withdraw(now, request.id);
        }
    }

    /// Request `id`, taken back before it was polled, was never sent: its holder
    /// hears so ([`Holder::handle_cancel`]), not that it timed out.
    fn withdraw(&mut self, now: Instant, id: EffectId) {
        let Some(route) = self.out.take(id) else {
            return;
        };
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

    /// The application is done with revoked `key` (see [`StepDownReason::Revoked`]):
    /// it writes no more under that tenure, so the lease is released now rather than
    /// at its deadline. A key not being revoked is left alone.
    pub fn handle_done(&mut self, now: Instant, key: &str) {
        if let Some(candidacy) = self.candidacies.get_mut(key)
            && candidacy.holder.revoked_until().is_some()
        {
            candidacy.holder.handle_stop(now);
            self.touched.insert(key.to_string());
            self.settle(now);
        }
    }

    /// Feeds back what came of request `id`. Outcomes nobody waits for are ignored.
    pub fn handle_outcome(&mut self, now: Instant, id: EffectId, outcome: RequestOutcome) {
        self.deliver(now, id, outcome);
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
        let expired: Vec<EffectId> = self
            .out
            .deadlines
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, id)| *id)
            .collect();
        for id in expired {
            if self.out.unqueue(id) {
                // Due before it was polled: never sent.
                self.withdraw(now, id);
            } else {
                self.deliver(now, id, RequestOutcome::TimedOut);
                self.events.push_back(CampaignEvent::Cancel { id });
            }
        }
        // Queued requests at their holder's timeout are cancelled first: never sent,
        // they are not an unknown outcome.
        self.pump(now);
        // A health step-down due now comes before a renewal due now: none goes out.
        self.gate_health(now);
        // The holders due, and those fed just now (their deadline may have moved
        // before it was indexed again); a holder not due does nothing.
        let due: BTreeSet<String> = self
            .timers
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, key)| key.clone())
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
        // Every queued request has its route: one taken is unqueued with it.
        let route = &self.out.routes[&transmit.id];
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

    /// When to call [`Campaign::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let holders = self.timers.first().map(|(at, _)| *at);
        let requests = self.out.deadlines.first().map(|(at, _)| *at);
        let cooldowns = self.cooldown.values().copied();
        // An unhealthy group holding keys steps down at its deadline.
        let health = self.groups.iter().filter_map(|(id, g)| {
            let at = g.health.step_down_at()?;
            self.candidacies
                .values()
                .any(|s| {
                    s.group == *id
                        && matches!(
                            s.holder.status(),
                            HolderStatus::Owner | HolderStatus::Confirming
                        )
                })
                .then_some(at)
        });
        holders
            .into_iter()
            .chain(requests)
            .chain(cooldowns)
            .chain(health)
            .min()
    }

    /// Whether no group is left.
    pub fn is_done(&self) -> bool {
        self.groups.is_empty() && self.out.requests.is_empty()
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

    /// What to do with a request forwarded to this holder's inbox on `subject`, with
    /// `Dagnats-Lease-Fence` header value `fence`, while the application reads the
    /// inbox (`read`) or not: delivered only for a key owned at `now`, with a fence
    /// of the current tenure, and only to a reader; rejected otherwise.
    pub fn check_inbox(
        &self,
        now: Instant,
        subject: &str,
        fence: Option<&str>,
        read: bool,
    ) -> InboxVerdict {
        let accepted = match self.guard.check(now, subject, fence) {
            Ok(accepted) => accepted,
            Err(reason) => return InboxVerdict::Reject(reason),
        };
        // The guard follows the events; the holder's own deadline is the last word.
        if self.tenure(&accepted.key, now).is_none() {
            return InboxVerdict::Reject(RejectReason::NotOwner);
        }
        if !read {
            return InboxVerdict::Ignore;
        }
        InboxVerdict::Deliver(accepted)
    }

    fn deliver(&mut self, now: Instant, id: EffectId, outcome: RequestOutcome) {
        let Some(route) = self.out.take(id) else {
            return;
        };
        let class = OutcomeClass::of(route.endpoint, &outcome);
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

    /// Runs the group policy until it has nothing more to do.
    fn settle(&mut self, now: Instant) {
        loop {
            self.drain(now);
            self.remove_finished(now);
            let mut changed = self.gate_health(now);
            changed |= self.rebalance(now);
            self.drain(now);
            changed |= self.pump(now);
            if !changed {
                break;
            }
        }
        self.finish_groups(now);
        self.index_timers();
    }

    /// Indexes the deadlines of the holders drained in this settle again.
    fn index_timers(&mut self) {
        for key in std::mem::take(&mut self.drained) {
            // A candidacy gone took its entry with it (`remove_finished`).
            let Some(candidacy) = self.candidacies.get_mut(&key) else {
                continue;
            };
            let next = candidacy.holder.poll_timeout();
            if next == candidacy.timer {
                continue;
            }
            if let Some(at) = candidacy.timer {
                self.timers.remove(&(at, key.clone()));
            }
            if let Some(at) = next {
                self.timers.insert((at, key));
            }
            candidacy.timer = next;
        }
        #[cfg(debug_assertions)]
        for (key, candidacy) in &self.candidacies {
            debug_assert!(
                !candidacy.holder.has_output(),
                "{key}: a holder fed without being marked touched"
            );
            debug_assert_eq!(
                candidacy.timer,
                candidacy.holder.poll_timeout(),
                "{key}: a deadline not indexed"
            );
            debug_assert!(
                candidacy
                    .timer
                    .is_none_or(|at| self.timers.contains(&(at, key.clone()))),
                "{key}: its deadline is not in the index"
            );
        }
        #[cfg(debug_assertions)]
        debug_assert_eq!(
            self.timers.len(),
            self.candidacies
                .values()
                .filter(|s| s.timer.is_some())
                .count(),
            "an index entry of a candidacy gone"
        );
    }

    /// Drops the candidacies whose holder is done; a key shed for balance waits a
    /// campaign interval from its release before it is asked for again.
    fn remove_finished(&mut self, now: Instant) {
        let finished: Vec<String> = self
            .drained
            .iter()
            .filter(|k| self.candidacies.get(*k).is_some_and(|s| s.holder.is_done()))
            .cloned()
            .collect();
        for key in finished {
            let Some(candidacy) = self.candidacies.remove(&key) else {
                continue;
            };
            if let Some(at) = candidacy.timer {
                self.timers.remove(&(at, key.clone()));
            }
            // A holder done owns nothing (its step-down said so already, if it did).
            if self.owned.contains(&key) {
                lead(&mut self.owned, &mut self.events, &key, false);
            }
            self.vacancies = true;
            if candidacy.shed {
                let wait = candidacy.holder.config().campaign_every;
                self.cooldown.insert(key, now + wait);
            }
        }
    }

    /// Steps down the keys of groups unhealthy for their `unhealthy_for`: owned keys
    /// are revoked ([`StepDownReason::Unhealthy`]), keys being confirmed released
    /// (after the confirming renew, if it is out) and never elected; presence keys,
    /// which guard no writes, are released at once.
    /// Returns whether it changed anything.
    fn gate_health(&mut self, now: Instant) -> bool {
        let due: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| !g.stopping && g.health.step_down_at().is_some_and(|at| now >= at))
            .map(|(id, _)| *id)
            .collect();
        let mut changed = false;
        for id in due {
            let presence = self
                .groups
                .values()
                .any(|g| g.balance.is_some_and(|b| b.presence == id));
            for (_, key) in self.holding(id, now) {
                if let Some(candidacy) = self.candidacies.get_mut(&key) {
                    if presence {
                        candidacy.holder.handle_stop(now);
                    } else {
                        candidacy.holder.handle_revoke_unhealthy(now);
                    }
                    self.touched.insert(key);
                    changed = true;
                }
            }
        }
        changed
    }

    /// How many keys of `group` are held now or being confirmed: [`Self::holding`]'s
    /// length, without building it.
    fn held_count(&self, group: GroupId, now: Instant) -> usize {
        self.candidacies
            .values()
            .filter(|s| {
                s.group == group
                    && (s.holder.status() == HolderStatus::Confirming
                        || s.holder.tenure(now).is_some())
            })
            .count()
    }

    /// Keys of `group` held now or being confirmed, oldest tenure first.
    fn holding(&self, group: GroupId, now: Instant) -> Vec<(u64, String)> {
        let mut holding: Vec<(u64, String)> = self
            .candidacies
            .iter()
            .filter(|(_, s)| s.group == group)
            .filter_map(|(k, s)| match s.holder.tenure(now) {
                Some(own) => Some((own.tenure, k.clone())),
                None if s.holder.status() == HolderStatus::Confirming => {
                    Some((u64::MAX, k.clone()))
                }
                None => None,
            })
            .collect();
        holding.sort();
        holding
    }

    /// Makes a holder for every key of a running group that has none (and was not
    /// refused for good), and revokes the newest tenures of a group above its cap.
    /// Returns whether it changed anything.
    fn rebalance(&mut self, now: Instant) -> bool {
        let mut changed = false;
        let cooling = self.cooldown.len();
        self.cooldown.retain(|_, until| now < *until);
        self.vacancies |= self.cooldown.len() != cooling;
        let running: Vec<GroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| !g.stopping)
            .map(|(id, _)| *id)
            .collect();
        let vacancies = std::mem::take(&mut self.vacancies);
        for id in running {
            let shed = self.to_shed(id, now);
            // The newest tenures go first: the oldest have served longest unmoved.
            let surplus: Vec<String> = match shed {
                0 => Vec::new(),
                _ => self
                    .holding(id, now)
                    .into_iter()
                    .rev()
                    .take(shed)
                    .map(|(_, key)| key)
                    .collect(),
            };
            let mut balanced = false;
            if let (Some(g), false) = (self.groups.get_mut(&id), surplus.is_empty())
                && let Some(b) = g.balance.as_mut()
            {
                b.shed_at = now + g.keys[0].renew_every;
                balanced = true;
            }
            for key in surplus {
                if let Some(candidacy) = self.candidacies.get_mut(&key) {
                    candidacy.holder.handle_revoke(now);
                    candidacy.shed = balanced;
                    self.touched.insert(key);
                    changed = true;
                }
            }
            if !vacancies {
                continue;
            }
            let group = &self.groups[&id];
            for config in &group.keys {
                if self.candidacies.contains_key(&config.key)
                    || group.failed.contains(&config.key)
                    || self.cooldown.contains_key(&config.key)
                {
                    continue;
                }
                let Ok(mut holder) = Holder::new(config.clone(), now) else {
                    continue;
                };
                holder.seed_jitter(self.jitter_seed);
                self.candidacies.insert(
                    config.key.clone(),
                    Candidacy {
                        group: id,
                        serial: self.next_serial,
                        holder,
                        shed: false,
                        timer: None,
                    },
                );
                self.next_serial += 1;
                self.touched.insert(config.key.clone());
                changed = true;
            }
        }
        changed
    }

    /// How many of `group`'s keys it may hold: its `max_held`, or for a balanced
    /// group `ceil(keys / members)`.
    fn cap(&self, group: GroupId, now: Instant) -> usize {
        let g = &self.groups[&group];
        match g.balance {
            None => g.max_held,
            Some(b) => g.keys.len().div_ceil(self.members(b.presence, now).len()),
        }
    }

    /// The members of a balanced set: the holders of its presence keys as change
    /// events show them, and this one.
    fn members(&self, presence: GroupId, now: Instant) -> BTreeSet<&str> {
        // The presence group may have finished first, while the set is stopping.
        let presence_keys = self.groups.get(&presence).map(|g| g.keys.as_slice());
        let mut members: BTreeSet<&str> = presence_keys
            .unwrap_or_default()
            .iter()
            .filter_map(|c| self.seen.get(&c.key))
            .filter(|s| now < s.until)
            .map(|s| s.holder.as_str())
            .collect();
        members.insert(&self.holder);
        members
    }

    /// How many tenures `group`, holding `held`, should revoke now: what is above
    /// its cap; for a balanced group also one when it is above the floor while a
    /// member holds less than the floor; at most half the surplus (at least one)
    /// per renew interval. Keys being revoked count as given up already.
    fn to_shed(&self, group: GroupId, now: Instant) -> usize {
        let g = &self.groups[&group];
        let Some(b) = g.balance else {
            // A group that may hold all its keys holds none too many.
            if g.keys.len() <= g.max_held {
                return 0;
            }
            return self.held_count(group, now).saturating_sub(g.max_held);
        };
        if now < b.shed_at {
            return 0;
        }
        let held = self.held_count(group, now);
        let cap = self.cap(group, now);
        let members = self.members(b.presence, now);
        let floor = g.keys.len() / members.len();
        let share = |m: &str| {
            g.keys
                .iter()
                .filter_map(|c| self.seen.get(&c.key))
                .filter(|s| now < s.until && s.holder == m)
                .count()
        };
        let starved = members
            .iter()
            .any(|m| *m != self.holder && share(m) < floor);
        let surplus = held.saturating_sub(cap);
        if surplus > 0 {
            surplus.div_ceil(2)
        } else if held > floor && starved {
            1
        } else {
            0
        }
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

    /// Sends queued campaign acquires while there is room under each group's cap;
    /// cancels those whose holder stopped campaigning. Returns whether it cancelled
    /// any (that holder may act on it).
    fn pump(&mut self, now: Instant) -> bool {
        let mut cancelled = false;
        let ids: Vec<GroupId> = self.groups.keys().copied().collect();
        for id in ids {
            // An unhealthy group campaigns for nothing.
            let g = &self.groups[&id];
            if g.deferred.is_empty() {
                continue;
            }
            let room = match g.health.since {
                Some(_) => 0,
                None => self
                    .cap(id, now)
                    .saturating_sub(self.held_count(id, now))
                    .min(MAX_CAMPAIGNS_IN_FLIGHT),
            };
            let Some(group) = self.groups.get_mut(&id) else {
                continue;
            };
            let mut kept = VecDeque::new();
            while let Some((key, request, expires)) = group.deferred.pop_front() {
                let Some(candidacy) = self.candidacies.get_mut(&key) else {
                    continue;
                };
                if !candidacy.holder.waits_for(request.id) {
                    continue;
                } else if candidacy.holder.status() != HolderStatus::Campaigning || now >= expires {
                    // Stopped, or waited here as long as the holder would wait for an
                    // answer: it was never sent, and the holder hears so.
                    candidacy.holder.handle_cancel(now, request.id);
                    self.touched.insert(key);
                    cancelled = true;
                } else if group.gated_in_flight < room {
                    group.gated_in_flight += 1;
                    self.out
                        .send(now, &key, candidacy, true, &self.renew_unclear, request);
                } else {
                    kept.push_back((key, request, expires));
                }
            }
            group.deferred = kept;
        }
        cancelled
    }

    /// Ends the groups with nothing left to do (a balanced set after its presence).
    fn finish_groups(&mut self, now: Instant) {
        loop {
            // A balanced set whose every key was refused for good leaves the set.
            let abandoned: Vec<GroupId> = self
                .groups
                .values()
                .filter(|g| g.failed.len() == g.keys.len())
                .filter_map(|g| g.balance.map(|b| b.presence))
                .filter(|p| self.groups.get(p).is_some_and(|g| !g.stopping))
                .collect();
            for presence in abandoned {
                self.handle_stop_group(now, presence);
            }
            let finished: Vec<GroupId> = self
                .groups
                .iter()
                .filter(|(id, g)| {
                    let all_failed = g.failed.len() == g.keys.len();
                    let presence_gone = g
                        .balance
                        .is_none_or(|b| !self.groups.contains_key(&b.presence));
                    (g.stopping || all_failed)
                        && presence_gone
                        && g.deferred.is_empty()
                        && !self.candidacies.values().any(|s| s.group == **id)
                })
                .map(|(id, _)| *id)
                .collect();
            if finished.is_empty() {
                return;
            }
            for id in finished {
                if let Some(group) = self.groups.remove(&id) {
                    for config in group.keys {
                        self.claimed.remove(&config.key);
                        self.renew_unclear.remove(&config.key);
                        let key = config.key;
                        self.events.push_back(CampaignEvent::Unwatch { key });
                    }
                }
                self.events.push_back(CampaignEvent::Finished { group: id });
            }
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

/// The `i`th presence key of balanced set `set`.
pub fn presence_key(set: &str, i: usize) -> String {
    format!("{set}-member-{i}")
}

/// Keys of one group are often won in one burst (every shard at startup), and each
/// renews `renew_every` after its last write's send, so they would renew in one
/// burst too, for ever: every request of the group queued at the service at once.
/// Key `i` of `n` renews `renew_every / 4 × i / n` sooner instead, spreading the
/// group's renewals over a quarter of the interval. Renewing sooner is always safe;
/// a group of one key is unchanged.
fn spread_renewals(keys: &mut [HolderConfig]) {
    let n = keys.len() as u32;
    for (i, config) in keys.iter_mut().enumerate() {
        config.renew_every -= config.renew_every / 4 * i as u32 / n;
    }
}

/// The most slots a semaphore may have.
pub const MAX_PERMITS: usize = 1024;

/// Campaign acquires of one group out at once, at most. 100 members of 1,000
/// shards each sent 100,000 acquires at once to one service (`scripts/bench
/// --scale 100000`): the renewals of the leases already won queued behind them,
/// timed out, and every lease was lost.
pub const MAX_CAMPAIGNS_IN_FLIGHT: usize = 32;

/// The key of slot `i` of semaphore `name`: `<name>-<i>`.
pub fn semaphore_slot(name: &str, i: usize) -> String {
    format!("{name}-{i}")
}
