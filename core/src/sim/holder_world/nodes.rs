//! The holder world's nodes: each a bare [`Holder`] or a member's [`Campaign`],
//! on its own drifting clock, paused, restarted, leaving and joining, its health
//! flipping, and the application that writes through a fenced store.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{APP_WRITE_EVERY_MS, HANDOFF_BOUND};
use super::{App, Ev, Grouping, HolderWorld, Nodes, WorldParams};
use crate::change::ChangeEvent;
use crate::holder::campaign::{Campaign, CampaignEvent, GroupId, semaphore_slot};
use crate::holder::{Holder, HolderConfig, HolderEvent, HolderStatus, StepDownReason, Tenure};
use crate::io::{RequestOutcome, TransmitId};
use crate::sim::server::republished;
use crate::test_support::HolderRequest;
use crate::wire::Endpoint;

/// The key of a world of bare holders.
const KEY: &str = "leader";
/// The semaphore of a semaphore world.
const SEMAPHORE: &str = "sem";

/// One node's machine.
pub(super) enum Machine {
    Holder(Holder),
    Member {
        campaign: Campaign,
        group: Option<GroupId>,
        /// The subscribes asked for, given up and dropped, as polled: the world's
        /// client runs them.
        watches: Vec<CampaignEvent>,
    },
}

pub(super) struct HolderSim {
    pub(super) machine: Machine,
    /// The configs of its keys (one for a bare holder); their `holder` is `name`.
    pub(super) configs: Vec<HolderConfig>,
    pub(super) name: String,
    /// Bumped on every re-creation: outcomes for an older machine are dropped.
    pub(super) generation: u64,
    /// Clock rate: holder time = rate × server time.
    pub(super) rate: f64,
    pub(super) paused_until: u64,
    /// Outcomes that arrived during a pause, delivered at its end.
    pub(super) backlog: Vec<(TransmitId, RequestOutcome)>,
    /// Requests answered already (a later timeout for them is dropped).
    pub(super) answered: Vec<TransmitId>,
    /// Instants a wake is scheduled for.
    pub(super) wakes: std::collections::BTreeSet<u64>,
    /// Its application's keys: the tenure it fences with and the last deadline
    /// handed out (on the holder's clock).
    pub(super) app: BTreeMap<String, (u64, Instant)>,
    /// Its health check's verdict, and since when (server ms) its running group has
    /// known it unhealthy.
    pub(super) healthy: bool,
    pub(super) unhealthy_since: Option<u64>,
    /// Unhealthy once, healthy again since.
    pub(super) recovered: bool,
    /// Subscribes to change events under way, since when (its clock), and the keys
    /// subscribed to ([`HolderWorld::with_slow_subscribes`]).
    pub(super) subscribing: BTreeMap<String, Instant>,
    pub(super) subscribed: std::collections::BTreeSet<String>,
    /// When its group was last started (its clock): the instant its campaign asked
    /// for the subscribes (they are polled later when it is paused meanwhile).
    pub(super) joined_at: Instant,
}

impl Machine {
    pub(super) fn new(nodes: Nodes, name: &str, configs: &[HolderConfig], now: Instant) -> Self {
        match nodes {
            Nodes::Holders => {
                Self::Holder(Holder::new(configs[0].clone(), now).expect("valid config"))
            }
            Nodes::Members { .. } => {
                let mut machine = Self::Member {
                    campaign: Campaign::new(name, now).expect("a valid holder ID"),
                    group: None,
                    watches: Vec::new(),
                };
                machine.join(nodes, configs, now);
                machine
            }
        }
    }

    /// A member starts its group; false when the last one has not finished yet.
    pub(super) fn join(&mut self, nodes: Nodes, configs: &[HolderConfig], now: Instant) -> bool {
        let (
            Self::Member {
                campaign, group, ..
            },
            Nodes::Members {
                max_held,
                grouping,
                shards,
                ..
            },
        ) = (self, nodes)
        else {
            return true;
        };
        if group.is_some() {
            return false;
        }
        let added = match grouping {
            Grouping::Capped => campaign.add_group(now, configs.to_vec(), max_held),
            Grouping::Balanced => campaign.add_balanced_group(now, "set", configs.to_vec()),
            Grouping::Semaphore => {
                let config = HolderConfig {
                    key: SEMAPHORE.to_string(),
                    ..configs[0].clone()
                };
                campaign.add_semaphore(now, config, shards)
            }
        };
        *group = Some(added.expect("a valid group whose keys are free"));
        true
    }

    fn handle_change(&mut self, now: Instant, key: &str, event: &ChangeEvent) {
        if let Self::Member { campaign, .. } = self {
            campaign.handle_change(now, key, event);
        }
    }

    /// The subscribes asked for, given up or dropped since the last call.
    fn take_watches(&mut self) -> Vec<CampaignEvent> {
        match self {
            Self::Holder(_) => Vec::new(),
            Self::Member { watches, .. } => std::mem::take(watches),
        }
    }

    fn handle_watched(&mut self, now: Instant, key: &str) {
        if let Self::Member { campaign, .. } = self {
            campaign.handle_watched(now, key);
        }
    }

    /// The next request and its key.
    fn poll_request(&mut self) -> Option<(String, HolderRequest)> {
        match self {
            Self::Holder(h) => h.poll_transmit().map(|t| (KEY.to_string(), t.into())),
            Self::Member { campaign, .. } => {
                let t = campaign.poll_transmit()?;
                Some((t.key, t.transmit.into()))
            }
        }
    }

    /// Whether `key`'s holder is campaigning (an acquire of it is a campaign's).
    fn campaigning(&self, key: &str) -> bool {
        match self {
            Self::Holder(h) => h.status() == HolderStatus::Campaigning,
            Self::Member { campaign, .. } => {
                campaign.status(key) == Some(HolderStatus::Campaigning)
            }
        }
    }

    /// A member's group hears its health check.
    fn handle_health(&mut self, now: Instant, healthy: bool, unhealthy_for: Duration) {
        if let Self::Member {
            campaign,
            group: Some(group),
            ..
        } = self
        {
            campaign.set_unhealthy_for(now, *group, unhealthy_for);
            campaign.handle_health(now, *group, healthy);
        }
    }

    /// The next holder event and its key; a member's finished group is noted here.
    fn poll_event(&mut self) -> Option<(String, HolderEvent)> {
        match self {
            Self::Holder(h) => h.poll_event().map(|e| (KEY.to_string(), e)),
            Self::Member {
                campaign,
                group,
                watches,
            } => loop {
                match campaign.poll_event()? {
                    CampaignEvent::Holder { key, event, .. } => return Some((key, event)),
                    e @ (CampaignEvent::Watch { .. }
                    | CampaignEvent::Unwatch { .. }
                    | CampaignEvent::CancelWatch { .. }) => watches.push(e),
                    // What an adapter records or cancels: a world's network answers
                    // every request, and records its own history; it has no inbox.
                    CampaignEvent::Reject { .. }
                    | CampaignEvent::CancelReject { .. }
                    | CampaignEvent::Cancel { .. }
                    | CampaignEvent::Leading { .. }
                    | CampaignEvent::ElectedAfter { .. }
                    | CampaignEvent::Answered(_) => {}
                    CampaignEvent::Finished { group: g } => {
                        if *group == Some(g) {
                            *group = None;
                        }
                    }
                }
            },
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Self::Holder(h) => h.poll_timeout(),
            Self::Member { campaign, .. } => campaign.poll_timeout(),
        }
    }

    fn handle_outcome(&mut self, now: Instant, id: TransmitId, outcome: RequestOutcome) {
        match self {
            Self::Holder(h) => h.handle_outcome(now, id, outcome),
            Self::Member { campaign, .. } => campaign.handle_outcome(now, id, outcome),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        match self {
            Self::Holder(h) => h.handle_timeout(now),
            Self::Member { campaign, .. } => campaign.handle_timeout(now),
        }
    }

    /// Every key this node believes it owns at `now`.
    pub(super) fn believed(&self, configs: &[HolderConfig], now: Instant) -> Vec<(String, Tenure)> {
        match self {
            Self::Holder(h) => h
                .tenure(now)
                .map(|o| (configs[0].key.clone(), o))
                .into_iter()
                .collect(),
            Self::Member { campaign, .. } => configs
                .iter()
                .filter_map(|c| Some((c.key.clone(), campaign.tenure(&c.key, now)?)))
                .collect(),
        }
    }
}

pub(super) fn configs_for(p: &WorldParams, name: &str) -> Vec<HolderConfig> {
    let keys: Vec<String> = match p.nodes {
        Nodes::Holders => vec![KEY.to_string()],
        Nodes::Members {
            shards,
            grouping: Grouping::Semaphore,
            ..
        } => (0..shards).map(|i| semaphore_slot(SEMAPHORE, i)).collect(),
        Nodes::Members { shards, .. } => (0..shards).map(|s| format!("s{s}")).collect(),
    };
    keys.into_iter()
        .map(|key| {
            let mut config = HolderConfig::new(key, name, Duration::from_secs(p.ttl_s));
            config.max_clock_drift_ppm = p.configured_drift_ppm;
            config.request_timeout = Duration::from_millis(p.ttl_s * p.timeout_per_ttl_s);
            config
        })
        .collect()
}

impl HolderWorld {
    /// Runs the subscribes member `h` asked for, gave up or dropped.
    fn hand_off(&mut self, h: usize) {
        for e in self.holders[h].machine.take_watches() {
            let now = self.holder_now(h, self.t);
            let generation = self.holders[h].generation;
            let sim = &mut self.holders[h];
            match e {
                CampaignEvent::Watch { key } => {
                    let Some((percent, draws)) = &mut self.slow_subscribes else {
                        // Made at once: every key's events reach the member.
                        sim.machine.handle_watched(now, &key);
                        continue;
                    };
                    let bound = HANDOFF_BOUND.as_millis() as u64;
                    let took = if draws.chance(*percent) {
                        bound + 1 + draws.below(bound)
                    } else {
                        draws.below(self.p.max_latency_ms + 1)
                    };
                    sim.subscribing.insert(key.clone(), sim.joined_at);
                    self.schedule(self.t + took, Ev::Subscribed(h, generation, key));
                }
                // Made at once, but polled only after a pause longer than the bound.
                CampaignEvent::CancelWatch { .. } if self.slow_subscribes.is_none() => {}
                CampaignEvent::CancelWatch { key } => {
                    self.stats.subscribes_given_up += 1;
                    let violation = match sim.subscribing.remove(&key) {
                        None => Some(format!("a subscribe of {key} not under way")),
                        Some(since) if now < since + HANDOFF_BOUND => Some(format!(
                            "the subscribe of {key} {:?} after it was asked for",
                            now - since
                        )),
                        Some(_) => None,
                    };
                    if let Some(v) = violation {
                        let name = &self.holders[h].name;
                        let v = format!("t={}ms: {name} gave up {v}", self.t);
                        self.violation.get_or_insert(v);
                    }
                }
                CampaignEvent::Unwatch { key } => {
                    sim.subscribing.remove(&key);
                    sim.subscribed.remove(&key);
                }
                _ => {}
            }
        }
    }

    /// Change events for what the stream stored since the last call, to every
    /// member, each after its own latency (as the server's RePublish does).
    pub(super) fn publish_changes(&mut self) {
        if !matches!(self.p.nodes, Nodes::Members { .. }) {
            return;
        }
        let new: Vec<(String, ChangeEvent)> = self.js.log[self.changes_read..]
            .iter()
            .map(|m| {
                let message = republished(self.js.epoch, m);
                let header = |name: &str| message.header(name);
                (
                    m.key.clone(),
                    ChangeEvent::from_parts(header, &message.payload),
                )
            })
            .collect();
        self.changes_read = self.js.log.len();
        for (key, event) in new {
            for h in 0..self.holders.len() {
                let at = self.t + self.latency();
                let generation = self.holders[h].generation;
                self.schedule(at, Ev::Change(h, generation, key.clone(), event.clone()));
            }
        }
    }

    /// Member `h` reads the service's INFO: `renew_many` listed, with batching.
    pub(super) fn tell_batching(&mut self, h: usize) {
        if let (true, Machine::Member { campaign, .. }) =
            (self.batching, &mut self.holders[h].machine)
        {
            campaign.handle_service_info(
                br#"{"name":"dagnats-api","endpoints":[{"name":"renew_many"}]}"#,
            );
        }
    }

    /// Member `h`'s running group hears its health check (after a flip, a join or
    /// a restart: a group made afresh learns it at once).
    pub(super) fn tell_health(&mut self, h: usize) {
        if self.p.health_flip_every_ms == 0 {
            return;
        }
        let now = self.holder_now(h, self.t);
        let unhealthy_for = Duration::from_millis(self.p.unhealthy_for_ms);
        let sim = &mut self.holders[h];
        sim.machine.handle_health(now, sim.healthy, unhealthy_for);
        sim.unhealthy_since = match (sim.healthy, sim.unhealthy_since) {
            (true, _) => None,
            (false, Some(t)) if !matches!(sim.machine, Machine::Member { group: None, .. }) => {
                Some(t)
            }
            (false, _) => Some(self.t),
        };
    }

    /// Sends what the holder wants, records its events, and re-arms its timer.
    pub(super) fn drain_holder(&mut self, h: usize) {
        while let Some((key, request)) = self.holders[h].machine.poll_request() {
            if !self.holders[h].healthy
                && request.endpoint == Endpoint::Acquire
                && self.holders[h].machine.campaigning(&key)
            {
                self.violation.get_or_insert(format!(
                    "t={}ms: {} campaigns for {key} while unhealthy",
                    self.t, self.holders[h].name
                ));
            }
            let timeout_at = {
                let sent = self.holder_now(h, self.t);
                self.server_ms(h, sent + request.timeout)
            };
            let id = request.id;
            let generation = self.holders[h].generation;
            let arrive = self.t + self.latency();
            if !self.rng.chance(self.p.request_loss_percent) {
                self.schedule(arrive, Ev::Arrive(h, generation, request));
            }
            self.schedule(
                timeout_at,
                Ev::Outcome(h, generation, id, RequestOutcome::TimedOut),
            );
        }
        let mut done = Vec::new();
        while let Some((key, event)) = self.holders[h].machine.poll_event() {
            if std::env::var_os("HOLDER_WORLD_TRACE").is_some() {
                eprintln!("t={}   h{h} {key}: {event:?}", self.t);
            }
            self.app_hears(h, &key, &event, &mut done);
            match event {
                HolderEvent::Elected { .. } => {
                    self.stats.elections += 1;
                    match (self.holders[h].healthy, self.holders[h].recovered) {
                        (true, true) => self.stats.elections_after_recovery += 1,
                        (false, _) => self.stats.elections_while_unhealthy += 1,
                        _ => {}
                    }
                    if !key.contains("-member-") {
                        self.stats.shard_elections += 1;
                    }
                    if self.last_owner.is_some_and(|o| o != h) {
                        self.stats.failovers += 1;
                    }
                    self.last_owner = Some(h);
                }
                HolderEvent::Renewed { .. } => self.stats.renewals += 1,
                HolderEvent::SteppedDown { reason } => match reason {
                    StepDownReason::Lost => self.stats.lost += 1,
                    StepDownReason::DeadlineMissed => self.stats.deadline_missed += 1,
                    StepDownReason::Revoked { .. } => self.stats.revoked += 1,
                    StepDownReason::Unhealthy { .. } => self.stats.unhealthy_step_downs += 1,
                    _ => {}
                },
                HolderEvent::Failed { kind, message } => {
                    panic!("holder h{h} failed: {kind}: {message}")
                }
                HolderEvent::NotGranted { .. } => {}
            }
        }
        if !done.is_empty() {
            let now = self.holder_now(h, self.t);
            if let Machine::Member { campaign, .. } = &mut self.holders[h].machine {
                for key in &done {
                    campaign.handle_stopped_writing(now, key);
                }
            }
            return self.drain_holder(h);
        }
        self.hand_off(h);
        if let Some(at) = self.holders[h].machine.poll_timeout() {
            let t = self.server_ms(h, at);
            // One wake per instant: a node drained many times wants the same one.
            if self.holders[h].wakes.insert(t) {
                self.schedule(t, Ev::Wake(h));
            }
        }
    }

    /// Member `h`'s application hears `event` for `key`: it learns deadlines, and
    /// writes at once when elected. A revoked key it is done with goes to `done`.
    fn app_hears(&mut self, h: usize, key: &str, event: &HolderEvent, done: &mut Vec<String>) {
        if self.p.app == App::None || key.contains("-member-") {
            return;
        }
        let app = &mut self.holders[h].app;
        match event {
            HolderEvent::Elected { fence, deadline } => {
                app.insert(key.to_string(), (*fence, *deadline));
                self.app_write(h, key);
            }
            HolderEvent::Renewed {
                tenure, deadline, ..
            } => {
                if let Some(known) = app.get_mut(key).filter(|k| k.0 == *tenure) {
                    known.1 = *deadline;
                }
            }
            HolderEvent::SteppedDown {
                reason: StepDownReason::Stopped,
            } => {
                app.remove(key);
            }
            HolderEvent::SteppedDown {
                reason: StepDownReason::Revoked { .. } | StepDownReason::Unhealthy { .. },
            } if self.p.app == App::HeedsRevocation => {
                app.remove(key);
                done.push(key.to_string());
            }
            // Ignored: the worst case writes on until its deadline.
            _ => {}
        }
    }

    /// Member `h`'s application writes `key` if its last deadline has not passed.
    fn app_write(&mut self, h: usize, key: &str) {
        if self.paused(h) {
            return;
        }
        let now = self.holder_now(h, self.t);
        let sim = &mut self.holders[h];
        let Some(&(fence, deadline)) = sim.app.get(key) else {
            return;
        };
        if now >= deadline {
            sim.app.remove(key);
            return;
        }
        self.stats.app_writes += 1;
        let name = sim.name.clone();
        match self.store.get(key) {
            Some((highest, by, since)) if fence < *highest => {
                self.violation.get_or_insert(format!(
                    "t={}ms: {name} wrote {key} under fence {fence} before its deadline, \
                     but {by} had written it under fence {highest} since t={since}ms",
                    self.t
                ));
            }
            Some((highest, ..)) if fence == *highest => {}
            _ => {
                self.store.insert(key.to_string(), (fence, name, self.t));
            }
        }
    }

    /// Carries out an event of the nodes.
    pub(super) fn apply_node(&mut self, ev: Ev) {
        match ev {
            Ev::Pause(h) => {
                let until = self.t + 1 + self.rng.below(self.p.max_pause_ms);
                self.holders[h].paused_until = until;
                self.stats.pauses += 1;
                self.schedule(until, Ev::Wake(h));
                self.schedule_pause(h);
            }
            Ev::Wake(h) if self.paused(h) => {
                self.holders[h].wakes.remove(&self.t);
            }
            Ev::Wake(h) => {
                self.holders[h].wakes.remove(&self.t);
                for (id, outcome) in std::mem::take(&mut self.holders[h].backlog) {
                    let now = self.holder_now(h, self.t);
                    self.holders[h].machine.handle_outcome(now, id, outcome);
                }
                let now = self.holder_now(h, self.t);
                self.holders[h].machine.handle_timeout(now);
                self.drain_holder(h);
            }
            Ev::Recreate(h) => {
                let now = self.holder_now(h, self.t);
                if let Nodes::Members {
                    new_id_on_restart: true,
                    ..
                } = self.p.nodes
                {
                    let name = format!("h{h}r{}", self.holders[h].generation + 1);
                    self.holders[h].configs = configs_for(&self.p, &name);
                    self.holders[h].name = name;
                }
                let nodes = self.p.nodes;
                let sim = &mut self.holders[h];
                sim.machine = Machine::new(nodes, &sim.name, &sim.configs, now);
                sim.joined_at = now;
                // The process restarted: its application is gone with it.
                sim.app.clear();
                sim.generation += 1;
                sim.backlog.clear();
                sim.answered.clear();
                sim.unhealthy_since = None;
                // Its subscriptions went with the process.
                sim.subscribing.clear();
                sim.subscribed.clear();
                self.stats.recreations += 1;
                self.tell_batching(h);
                self.tell_health(h);
                if !self.paused(h) {
                    self.drain_holder(h);
                }
                self.schedule_recreate(h);
            }
            Ev::Leave(h) => {
                let now = self.holder_now(h, self.t);
                if let Machine::Member {
                    campaign,
                    group: Some(group),
                    ..
                } = &mut self.holders[h].machine
                {
                    campaign.handle_stop_group(now, *group);
                    self.stats.leaves += 1;
                }
                // The application stopped the group: it writes no more.
                self.holders[h].app.clear();
                if !self.paused(h) {
                    self.drain_holder(h);
                }
                let back = self.t + 1 + self.rng.below(4 * self.p.ttl_s * 1000);
                self.schedule(back, Ev::Join(h));
            }
            Ev::Join(h) => {
                let now = self.holder_now(h, self.t);
                let nodes = self.p.nodes;
                let sim = &mut self.holders[h];
                if !sim.machine.join(nodes, &sim.configs, now) {
                    // Still releasing what it held: try again a little later.
                    self.schedule(self.t + 100, Ev::Join(h));
                    return;
                }
                sim.joined_at = now;
                sim.unhealthy_since = None;
                self.tell_health(h);
                if !self.paused(h) {
                    self.drain_holder(h);
                }
                if matches!(
                    self.p.nodes,
                    Nodes::Members {
                        grouping: Grouping::Balanced,
                        ..
                    }
                ) {
                    self.stats.rebalances.push((self.t, None));
                }
                self.schedule_leave(h);
            }
            Ev::Health(h) if self.paused(h) => {
                // A frozen process checks nothing: the flip comes when it wakes.
                let at = self.holders[h].paused_until;
                self.schedule(at, Ev::Health(h));
            }
            Ev::Health(h) => {
                self.holders[h].healthy = !self.holders[h].healthy;
                self.holders[h].recovered = self.holders[h].healthy;
                self.stats.health_flips += 1;
                self.tell_health(h);
                self.drain_holder(h);
                self.schedule_health(h);
            }
            Ev::AppWrite => {
                for h in 0..self.holders.len() {
                    let keys: Vec<String> = self.holders[h].app.keys().cloned().collect();
                    for key in keys {
                        self.app_write(h, &key);
                    }
                }
                self.schedule(self.t + APP_WRITE_EVERY_MS, Ev::AppWrite);
            }
            Ev::Change(h, generation, key, event) => {
                if generation != self.holders[h].generation || self.paused(h) {
                    // A paused member misses it, as a slow consumer would.
                    return;
                }
                if self.slow_subscribes.is_some() && !self.holders[h].subscribed.contains(&key) {
                    // Not subscribed (yet, or given up): the event never arrives.
                    return;
                }
                let now = self.holder_now(h, self.t);
                self.holders[h].machine.handle_change(now, &key, &event);
                self.drain_holder(h);
            }
            Ev::Subscribed(h, generation, _) if generation != self.holders[h].generation => {}
            Ev::Subscribed(h, generation, key) if self.paused(h) => {
                // A frozen driver reports nothing: it does when it wakes.
                let at = self.holders[h].paused_until;
                self.schedule(at, Ev::Subscribed(h, generation, key));
            }
            Ev::Subscribed(h, _, key) => {
                // Given up or dropped already: the driver dropped it, nothing arrives.
                if self.holders[h].subscribing.remove(&key).is_some() {
                    self.holders[h].subscribed.insert(key.clone());
                    let now = self.holder_now(h, self.t);
                    self.holders[h].machine.handle_watched(now, &key);
                    self.drain_holder(h);
                }
            }
            Ev::Outcome(h, generation, id, outcome) => {
                if generation != self.holders[h].generation
                    || self.holders[h].answered.contains(&id)
                {
                    return;
                }
                self.holders[h].answered.push(id);
                if self.paused(h) {
                    self.holders[h].backlog.push((id, outcome));
                    return;
                }
                let now = self.holder_now(h, self.t);
                self.holders[h].machine.handle_outcome(now, id, outcome);
                self.drain_holder(h);
            }
            Ev::Arrive(..)
            | Ev::Step(..)
            | Ev::ServiceWake(..)
            | Ev::ServiceChange(..)
            | Ev::ServicePresence(..) => unreachable!("an event of the lease side"),
        }
    }
}
