//! The holder world: the holder rules end to end, for the core's property tests
//! (`tests/holder_world.rs`) and the fuzzer (`holder_worlds`). Holder machines talk
//! to the service's call machines, which talk to the simulated JetStream, over a network with random
//! latency and lost replies; holders are paused for random spans and their clocks
//! drift within the configured bound. After every step the world checks:
//!
//! 1. a holder that believes it owns a key (`Holder::ownership`) holds it on the
//!    server: the live record is its, and no other holder wrote the key since the
//!    revision its tenure began with (so it never believes past the server's expiry);
//! 2. no two holders believe they own one key at the same instant;
//! 3. in member worlds with an application ([`WorldParams::app`]): each member's
//!    application writes a key through a fenced store until the last deadline
//!    handed out for it (it ignores revocation and every other step-down, the worst
//!    case, and stops only when it stopped the group itself), and the store never
//!    sees a write under a fence lower than one it took already: every write of a
//!    tenure comes before the next owner's first, by the world's clock;
//! 4. in member worlds whose health flips ([`WorldParams::health_flip_every_ms`]):
//!    an unhealthy member sends no campaign acquire, and a member unhealthy since
//!    T holds no lease on the server past T + `unhealthy_for` + two TTLs (the
//!    revoked lease kept to its last deadline, a late grant of an acquire sent
//!    before, and the network's delays);
//! 5. in member worlds with slow subscribes ([`HolderWorld::with_slow_subscribes`]):
//!    a member hears change events only for keys whose subscribe was made, and the
//!    campaign gives up a subscribe only while it is under way and not before
//!    [`HANDOFF_BOUND`] after it asked for it (by its own clock); invariants 1 to 3
//!    hold with the wake-ups lost;
//! 6. in member worlds with batching ([`HolderWorld::with_batching`]): the service
//!    advertises `renew_many`, members send the renewals due together in one
//!    request, the world's service runs each item as its own renew call and
//!    answers once all are in; invariants 1 to 3 hold as with single renewals.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::{Duration, Instant};

use crate::call::{Call, CallConfig, CallEvent};

use crate::change::ChangeEvent;
use crate::holder::campaign::{Campaign, CampaignEvent, GroupId, semaphore_slot};
use crate::holder::{Holder, HolderConfig, HolderEvent, HolderStatus, StepDownReason, Tenure};
use crate::io::EffectId;
use crate::io::HANDOFF_BOUND;
use crate::io::{NatsRequest, RequestOutcome};
use crate::sim::{MsgKind, SimJetStream};
use crate::test_support::HolderRequest;
use crate::wire::{Endpoint, ErrorKind, Response};

/// A small deterministic generator (xorshift64*), so a seed replays a world exactly.
/// Its draws come first from a script of bytes (two a draw), if any: the fuzzer's.
struct Rng(u64, Vec<u8>, usize);

impl Rng {
    fn new(seed: u64, script: Vec<u8>) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1, script, 0)
    }

    fn next(&mut self) -> u64 {
        if let Some(&[a, b]) = self.1.get(self.2..self.2 + 2) {
            self.2 += 2;
            return u64::from(u16::from_le_bytes([a, b]));
        }
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The shape of one simulated world.
#[derive(Debug, Clone)]
pub struct WorldParams {
    /// Seeds the world's draws and the stream's late expiries.
    pub seed: u64,
    /// How many nodes (holders or members).
    pub holders: usize,
    /// Every lease's TTL, seconds.
    pub ttl_s: u64,
    /// Upper bound on one network hop, ms (one hop in ten draws up to it, the others up
    /// to a twentieth of it).
    pub max_latency_ms: u64,
    /// Share of replies lost on the way back, percent.
    pub loss_percent: u64,
    /// Share of JetStream writes whose ack is lost: the write lands, the service's
    /// call sees a timeout and replies `unavailable`. Percent.
    pub ack_loss_percent: u64,
    /// Share of holder requests lost on the way to the service, percent.
    pub request_loss_percent: u64,
    /// Mean time between pauses of one holder, ms (0: never paused), and the longest
    /// pause, ms.
    pub pause_every_ms: u64,
    /// The longest pause, ms.
    pub max_pause_ms: u64,
    /// The drift bound the holders are configured with, and the drift they really have
    /// (each holder's clock rate is drawn within ±`actual_drift_ppm`).
    pub configured_drift_ppm: u32,
    /// The drift the holders really have.
    pub actual_drift_ppm: u32,
    /// Each holder's request timeout, ms per second of TTL (the default is 250: ttl/4).
    pub timeout_per_ttl_s: u64,
    /// Mean time between re-creations of one holder, ms (0: never): its machine is
    /// dropped without a release and a fresh one with the same holder ID takes its
    /// place, as `Shards` does when it rebalances, `Elector::stop` then `elect` does,
    /// or a process restarted under the same ID.
    pub recreate_every_ms: u64,
    /// Share of the service's JetStream steps after which the service stops mid-call,
    /// percent (0: never): the step has reached JetStream (a write may have landed),
    /// then the call is cut off ([`Call::handle_stop`]) and replies `internal`, as leases.md
    /// says of a service stopping mid-call.
    pub abort_percent: u64,
    /// How long the world runs, simulated ms.
    pub run_ms: u64,
    /// How the holders run: bare [`Holder`] machines for one key, or members (a
    /// [`Campaign`] each) holding some of a set of shards.
    pub nodes: Nodes,
    /// Members only: an application per member writing through a fenced store.
    pub app: App,
    /// Members only: mean time between flips of one member's health check, ms (0:
    /// always healthy), and how long unhealthy before its keys step down.
    pub health_flip_every_ms: u64,
    /// How long unhealthy before a member's keys step down, ms.
    pub unhealthy_for_ms: u64,
}

/// What each member's application does (see the module docs, invariant 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum App {
    /// None: no writes are checked.
    None,
    /// Writes every key until its last deadline handed out, ignoring revocation.
    IgnoresRevocation,
    /// Stops writing a revoked key at once and calls [`Campaign::handle_done`].
    CallsDone,
}

/// How often each application writes the keys it believes it may, ms.
const APP_WRITE_EVERY_MS: u64 = 25;

/// What each node of a world is.
#[derive(Debug, Clone, Copy)]
pub enum Nodes {
    /// One [`Holder`] for the one key.
    Holders,
    /// One [`Campaign`] per node with a group of `shards` keys, at most `max_held` held.
    /// A re-creation restarts the member: under the same holder ID, or under a new one
    /// when `new_id_on_restart`. Every `leave_every_ms` (0: never) on average, a member
    /// stops its group (releasing what it holds) and starts it again a while later.
    Members {
        /// Keys in each member's group (permits of a semaphore).
        shards: usize,
        /// The cap of a capped group.
        max_held: usize,
        /// Whether a restarted member takes a new holder ID.
        new_id_on_restart: bool,
        /// Mean time between a member's leaving, ms (0: never).
        leave_every_ms: u64,
        /// How the members' groups are made.
        grouping: Grouping,
        /// Member `i` first joins at `i × join_spread_ms` (0: all at once).
        join_spread_ms: u64,
    },
}

/// What kind of group each member starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// A shard group holding at most `max_held` of its keys.
    Capped,
    /// A balanced set (`max_held` unused): members share the shards evenly.
    Balanced,
    /// A semaphore of `shards` permits (`max_held` is 1): its keys are the slots.
    Semaphore,
}

/// One node's machine.
enum Machine {
    Holder(Holder),
    Member {
        campaign: Campaign,
        group: Option<GroupId>,
        /// The subscribes asked for, given up and dropped, as polled: the world's
        /// client runs them.
        watches: Vec<CampaignEvent>,
    },
}

#[derive(Debug)]
enum Ev {
    /// A holder's timer (or the end of its pause).
    Wake(usize),
    /// A holder freezes (GC, a VM stall, SIGSTOP): it handles nothing until it wakes.
    Pause(usize),
    /// A holder's request reaches the service (from the machine of a generation).
    Arrive(usize, u64, HolderRequest),
    /// A call's JetStream request is answered.
    Step(usize, EffectId, NatsRequest),
    /// A reply (or a timeout) reaches a holder, for the machine of this generation.
    Outcome(usize, u64, EffectId, RequestOutcome),
    /// A holder's machine is dropped and made afresh.
    Recreate(usize),
    /// A member stops its group.
    Leave(usize),
    /// A member starts its group again.
    Join(usize),
    /// A change event reaches a member, for the machine of a generation.
    Change(usize, u64, String, ChangeEvent),
    /// Every member's application writes what it may.
    AppWrite,
    /// A member's health check flips.
    Health(usize),
    /// A member's subscribe to a key's change events is over (for the machine of
    /// a generation).
    Subscribed(usize, u64, String),
}

struct HolderSim {
    machine: Machine,
    /// The configs of its keys (one for a bare holder); their `holder` is `name`.
    configs: Vec<HolderConfig>,
    name: String,
    /// Bumped on every re-creation: outcomes for an older machine are dropped.
    generation: u64,
    /// Clock rate: holder time = rate × server time.
    rate: f64,
    paused_until: u64,
    /// Outcomes that arrived during a pause, delivered at its end.
    backlog: Vec<(EffectId, RequestOutcome)>,
    /// Requests answered already (a later timeout for them is dropped).
    answered: Vec<EffectId>,
    /// Instants a wake is scheduled for.
    wakes: std::collections::BTreeSet<u64>,
    /// Its application's keys: the tenure it fences with and the last deadline
    /// handed out (on the holder's clock).
    app: BTreeMap<String, (u64, Instant)>,
    /// Its health check's verdict, and since when (server ms) its running group has
    /// known it unhealthy.
    healthy: bool,
    unhealthy_since: Option<u64>,
    /// Unhealthy once, healthy again since.
    recovered: bool,
    /// Subscribes to change events under way, since when (its clock), and the keys
    /// subscribed to ([`HolderWorld::with_slow_subscribes`]).
    subscribing: BTreeMap<String, Instant>,
    subscribed: std::collections::BTreeSet<String>,
    /// When its group was last started (its clock): the instant its campaign asked
    /// for the subscribes (they are polled later when it is paused meanwhile).
    joined_at: Instant,
}

struct ServiceCall {
    call: Call,
    holder: usize,
    generation: u64,
    request: EffectId,
    /// An item of a `renew_many` request: its gather and its place there.
    item: Option<(usize, usize)>,
}

/// A `renew_many` request whose items run in the world's service.
struct WorldGather {
    holder: usize,
    generation: u64,
    request: EffectId,
    keys: Vec<String>,
    results: Vec<Option<crate::wire::RenewManyResult>>,
}

/// What a world run saw, for coverage checks.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Keys elected (presence keys included).
    pub elections: u64,
    /// Renewals of a tenure.
    pub renewals: u64,
    /// Step-downs for `lost`.
    pub lost: u64,
    /// Step-downs at the local deadline.
    pub deadline_missed: u64,
    /// Elections by another node than the last one elected.
    pub failovers: u64,
    /// Pauses of a node.
    pub pauses: u64,
    /// Nodes dropped and made afresh.
    pub recreations: u64,
    /// Members that stopped their group.
    pub leaves: u64,
    /// Elections of shard keys alone (not presence keys): how often shards moved.
    pub shard_elections: u64,
    /// The most keys believed owned at one check, over all nodes.
    pub most_believers: usize,
    /// `internal` replies sent to nodes (calls cut off by a stopping service).
    pub internal_replies: u64,
    /// Shards revoked (stepped down for balance or a cap).
    pub revoked: u64,
    /// Writes the applications made through the fenced store.
    pub app_writes: u64,
    /// For each join of a balanced world: its instant, and the simulated ms until the
    /// set was balanced again (`None` if the next join or the end came first).
    pub rebalances: Vec<(u64, Option<u64>)>,
    /// Health checks that flipped, and keys stepped down for health.
    pub health_flips: u64,
    /// Keys stepped down for health.
    pub unhealthy_step_downs: u64,
    /// Elections of members that were unhealthy before and healthy again.
    pub elections_after_recovery: u64,
    /// Elections of unhealthy members (the grant of an acquire sent while healthy).
    pub elections_while_unhealthy: u64,
    /// Subscribes the campaigns gave up ([`HolderWorld::with_slow_subscribes`]).
    pub subscribes_given_up: u64,
    /// `renew_many` requests that reached the service ([`HolderWorld::with_batching`]),
    /// and the renewals they carried.
    pub batches: u64,
    /// The renewals the `renew_many` requests carried.
    pub batched_renewals: u64,
}

/// Nodes, the service's calls and the simulated stream, run event by event, with the
/// invariants of the module docs checked after every step.
pub struct HolderWorld {
    p: WorldParams,
    rng: Rng,
    t: u64,
    seq: u64,
    base: Instant,
    js: SimJetStream,
    holders: Vec<HolderSim>,
    calls: Vec<Option<ServiceCall>>,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Ev>>,
    last_owner: Option<usize>,
    /// Per key, the log as runs of messages by one writer: (first seq, last seq,
    /// holder of a value, `None` for anything else), read from `js.log` as it grows.
    runs: std::collections::BTreeMap<String, Vec<(u64, u64, Option<String>)>>,
    runs_read: usize,
    changes_read: usize,
    /// The fenced store of the applications: per key, the highest fence written,
    /// by whom and when first.
    store: BTreeMap<String, (u64, String, u64)>,
    /// An application's write the store refused: invariant 3 broken.
    violation: Option<String>,
    /// What the run saw so far.
    pub stats: Stats,
    /// With [`HolderWorld::with_known`]: what the service knows of each key, fed by
    /// its calls and by every message the stream stores (its change events, as
    /// they are stored), and how far into the log it has read.
    known: Option<(crate::known::KnownLeases, usize)>,
    /// With [`HolderWorld::with_slow_subscribes`]: the share of subscribes that
    /// hang past the hand-off bound, percent, and the draws of their delays (apart
    /// from the world's, so its other draws replay as without).
    slow_subscribes: Option<(u64, Rng)>,
    /// With [`HolderWorld::with_batching`]: members batch their renewals, and the
    /// `renew_many` requests whose items run.
    batching: bool,
    gathers: Vec<Option<WorldGather>>,
}

const KEY: &str = "leader";
const SEMAPHORE: &str = "sem";

impl Machine {
    fn new(nodes: Nodes, name: &str, configs: &[HolderConfig], now: Instant) -> Self {
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
    fn join(&mut self, nodes: Nodes, configs: &[HolderConfig], now: Instant) -> bool {
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

    fn handle_outcome(&mut self, now: Instant, id: EffectId, outcome: RequestOutcome) {
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
    fn believed(&self, configs: &[HolderConfig], now: Instant) -> Vec<(String, Tenure)> {
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

fn configs_for(p: &WorldParams, name: &str) -> Vec<HolderConfig> {
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
    /// A world of shape `p`, every draw from its seed.
    pub fn new(p: WorldParams) -> Self {
        Self::scripted(p, Vec::new())
    }

    /// A world of shape `p` whose draws (latencies, losses, pauses, restarts, ...)
    /// are read from `script`, two bytes each, while it lasts, then from the seed:
    /// how the fuzzer steers a world.
    pub fn scripted(p: WorldParams, script: Vec<u8>) -> Self {
        let mut rng = Rng::new(p.seed, script);
        let expiry_seed = p.seed;
        let base = Instant::now();
        let holders = (0..p.holders)
            .map(|i| {
                let name = format!("h{i}");
                let configs = configs_for(&p, &name);
                let span = 2 * u64::from(p.actual_drift_ppm) + 1;
                let drift_ppm = rng.below(span) as f64 - f64::from(p.actual_drift_ppm);
                let machine = match p.nodes {
                    Nodes::Members { join_spread_ms, .. } if join_spread_ms > 0 && i > 0 => {
                        Machine::Member {
                            campaign: Campaign::new(&name, base).expect("a valid holder ID"),
                            group: None,
                            watches: Vec::new(),
                        }
                    }
                    _ => Machine::new(p.nodes, &name, &configs, base),
                };
                HolderSim {
                    machine,
                    configs,
                    name,
                    generation: 0,
                    rate: 1.0 + drift_ppm / 1e6,
                    paused_until: 0,
                    backlog: Vec::new(),
                    answered: Vec::new(),
                    wakes: Default::default(),
                    app: BTreeMap::new(),
                    healthy: true,
                    unhealthy_since: None,
                    recovered: false,
                    subscribing: BTreeMap::new(),
                    subscribed: Default::default(),
                    joined_at: base,
                }
            })
            .collect();
        let mut world = Self {
            p,
            rng,
            t: 0,
            seq: 0,
            base,
            js: SimJetStream::new()
                .with_seed(expiry_seed)
                // As nats-server does: the late marker wipes a write that landed
                // after the TTL (SIM_NO_ROLLUP_WIPE=1 turns it off, to compare).
                .with_rollup_wipe(std::env::var_os("SIM_NO_ROLLUP_WIPE").is_none()),
            holders,
            calls: Vec::new(),
            queue: BinaryHeap::new(),
            events: Vec::new(),
            last_owner: None,
            runs: Default::default(),
            runs_read: 0,
            changes_read: 0,
            store: BTreeMap::new(),
            violation: None,
            stats: Stats::default(),
            known: None,
            slow_subscribes: None,
            batching: false,
            gathers: Vec::new(),
        };
        if world.p.app != App::None {
            world.schedule(0, Ev::AppWrite);
        }
        for h in 0..world.holders.len() {
            world.drain_holder(h);
            world.schedule_pause(h);
            world.schedule_recreate(h);
            world.schedule_health(h);
            match world.p.nodes {
                Nodes::Members { join_spread_ms, .. } if join_spread_ms > 0 && h > 0 => {
                    world.schedule(h as u64 * join_spread_ms, Ev::Join(h));
                }
                _ => world.schedule_leave(h),
            }
        }
        world
    }

    /// The same world with the service acting on what it knows of each key
    /// ([`Call::with_known`]): renew and release of a revision it knows go straight
    /// to their conditional write.
    pub fn with_known(mut self) -> Self {
        self.known = Some((crate::known::KnownLeases::new(1024), 0));
        self
    }

    /// The same world with members' subscribes to change events taking a network
    /// hop, `percent` of them hanging past [`HANDOFF_BOUND`] (a client reconnecting
    /// to a server that is gone): the campaign gives those up, and a member hears
    /// change events only for keys whose subscribe was made (invariant 5).
    pub fn with_slow_subscribes(mut self, percent: u64) -> Self {
        let draws = Rng::new(self.p.seed ^ 0x5AB5_C41B, Vec::new());
        self.slow_subscribes = Some((percent, draws));
        self
    }

    /// The same world with the service advertising `renew_many` to every member
    /// (invariant 6): renewals due together go out in one request.
    pub fn with_batching(mut self) -> Self {
        self.batching = true;
        for h in 0..self.holders.len() {
            self.tell_batching(h);
        }
        self
    }

    /// Member `h` reads the service's INFO: `renew_many` listed, with batching.
    fn tell_batching(&mut self, h: usize) {
        if let (true, Machine::Member { campaign, .. }) =
            (self.batching, &mut self.holders[h].machine)
        {
            campaign.handle_service_info(
                br#"{"name":"dagnats-api","endpoints":[{"name":"renew_many"}]}"#,
            );
        }
    }

    /// A `renew_many` request from `h`: each item its own renew call, gathered; an
    /// invalid one answered at once.
    fn arrive_many(&mut self, h: usize, generation: u64, request: HolderRequest) {
        let items = match crate::wire::decode_renew_many(&request.body) {
            Ok(items) => items,
            Err(e) => {
                let at = self.t + self.latency();
                let outcome = RequestOutcome::reply(Response::Error(e).to_json());
                self.schedule(at, Ev::Outcome(h, generation, request.id, outcome));
                return;
            }
        };
        self.stats.batches += 1;
        self.stats.batched_renewals += items.len() as u64;
        let g = self.gathers.len();
        self.gathers.push(Some(WorldGather {
            holder: h,
            generation,
            request: request.id,
            keys: items.iter().map(|r| r.key.clone()).collect(),
            results: vec![None; items.len()],
        }));
        let config = CallConfig::ready(1024 * 1024);
        for (i, item) in items.iter().enumerate() {
            let (now, wall) = (self.service_now(), self.js.wall());
            let body = serde_json::to_vec(item).expect("a renew request serialises");
            let call = match &self.known {
                Some((known, _)) => {
                    Call::with_known(config, known, Endpoint::Renew, &body, wall, now)
                }
                None => Call::new(config, Endpoint::Renew, &body, wall, now),
            };
            self.calls.push(Some(ServiceCall {
                call,
                holder: h,
                generation,
                request: request.id,
                item: Some((g, i)),
            }));
            self.drain_call(self.calls.len() - 1);
        }
    }

    /// An item's renew replied: kept, and its request answered once all are in.
    fn item_replied(&mut self, (g, i): (usize, usize), response: &Response) {
        let Some(gather) = self.gathers[g].as_mut() else {
            return;
        };
        gather.results[i] = Some(crate::wire::RenewManyResult::of(&gather.keys[i], response));
        if gather.results.iter().any(Option::is_none) {
            return;
        }
        let gather = self.gathers[g].take().expect("found above");
        let reply = crate::wire::RenewManyReply {
            results: gather.results.into_iter().flatten().collect(),
        };
        if !self.rng.chance(self.p.loss_percent) {
            let at = self.t + self.latency();
            let outcome = RequestOutcome::reply(reply.to_json());
            self.schedule(
                at,
                Ev::Outcome(gather.holder, gather.generation, gather.request, outcome),
            );
        }
    }

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

    /// The service learns every message the stream stored since it last looked.
    fn learn_stored(&mut self) {
        let Some((known, read)) = &mut self.known else {
            return;
        };
        for m in &self.js.log[*read..] {
            known.learn(&m.key, m.known_fact(self.js.epoch));
        }
        *read = self.js.log.len();
    }

    /// Change events for what the stream stored since the last call, to every
    /// member, each after its own latency (as the server's RePublish does).
    fn publish_changes(&mut self) {
        if !matches!(self.p.nodes, Nodes::Members { .. }) {
            return;
        }
        let new: Vec<(String, ChangeEvent)> = self.js.log[self.changes_read..]
            .iter()
            .map(|m| {
                let header = |name: &str| {
                    m.headers
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.as_str())
                };
                let mut event = ChangeEvent::from_parts(header, &m.data);
                event.revision = m.seq;
                (m.key.clone(), event)
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

    fn schedule_leave(&mut self, h: usize) {
        if let Nodes::Members { leave_every_ms, .. } = self.p.nodes
            && leave_every_ms > 0
        {
            let at = self.t + 1 + self.rng.below(2 * leave_every_ms);
            self.schedule(at, Ev::Leave(h));
        }
    }

    fn holder_now(&self, h: usize, t: u64) -> Instant {
        let nanos = (t as f64 * 1e6 * self.holders[h].rate) as u64;
        self.base + Duration::from_nanos(nanos)
    }

    /// The first server ms at which holder `h`'s clock reads at least `at`.
    fn server_ms(&self, h: usize, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.base).as_nanos() as f64;
        let mut t = (nanos / 1e6 / self.holders[h].rate).ceil() as u64;
        while self.holder_now(h, t) < at {
            t += 1;
        }
        t.max(self.t + 1)
    }

    fn service_now(&self) -> Instant {
        self.base + Duration::from_millis(self.t)
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Some(ev));
        self.queue
            .push(Reverse((at.max(self.t), self.seq, self.events.len() - 1)));
    }

    fn schedule_pause(&mut self, h: usize) {
        if self.p.pause_every_ms > 0 {
            let at = self.t.max(self.holders[h].paused_until)
                + self.rng.below(2 * self.p.pause_every_ms);
            self.schedule(at, Ev::Pause(h));
        }
    }

    fn schedule_health(&mut self, h: usize) {
        // Drawn only when health flips, so other worlds replay as before.
        if self.p.health_flip_every_ms > 0 {
            let at = self.t + 1 + self.rng.below(2 * self.p.health_flip_every_ms);
            self.schedule(at, Ev::Health(h));
        }
    }

    /// Member `h`'s running group hears its health check (after a flip, a join or
    /// a restart: a group made afresh learns it at once).
    fn tell_health(&mut self, h: usize) {
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

    fn schedule_recreate(&mut self, h: usize) {
        if self.p.recreate_every_ms > 0 {
            let at = self.t + 1 + self.rng.below(2 * self.p.recreate_every_ms);
            self.schedule(at, Ev::Recreate(h));
        }
    }

    /// One hop: usually fast, one in ten up to the maximum.
    fn latency(&mut self) -> u64 {
        let max = self.p.max_latency_ms;
        if self.rng.chance(10) {
            self.rng.below(max + 1)
        } else {
            self.rng.below(max / 20 + 1)
        }
    }

    /// Sends what the holder wants, records its events, and re-arms its timer.
    fn drain_holder(&mut self, h: usize) {
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
                HolderEvent::Refused { .. } => {}
            }
        }
        if !done.is_empty() {
            let now = self.holder_now(h, self.t);
            if let Machine::Member { campaign, .. } = &mut self.holders[h].machine {
                for key in &done {
                    campaign.handle_done(now, key);
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
            } if self.p.app == App::CallsDone => {
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

    /// Whether every member in the set holds the floor or the ceiling of the
    /// shards, and every shard is held.
    fn balanced(&self) -> bool {
        let Nodes::Members { shards, .. } = self.p.nodes else {
            return false;
        };
        let joined: Vec<usize> = (0..self.holders.len())
            .filter(|h| {
                matches!(
                    self.holders[*h].machine,
                    Machine::Member { group: Some(_), .. }
                )
            })
            .collect();
        let shares = self.shares();
        let (floor, ceil) = (
            shards / joined.len().max(1),
            shards.div_ceil(joined.len().max(1)),
        );
        joined.iter().all(|h| (floor..=ceil).contains(&shares[*h]))
            && shares.iter().sum::<usize>() == shards
    }

    fn drain_call(&mut self, c: usize) {
        loop {
            let Some(sc) = self.calls[c].as_mut() else {
                return;
            };
            if let Some((known, _)) = &mut self.known {
                while let Some((key, fact)) = sc.call.poll_learnt() {
                    known.learn(&key, fact);
                }
            }
            if let Some(t) = sc.call.poll_transmit() {
                let at = self.t + self.latency();
                self.schedule(at, Ev::Step(c, t.id, t.request));
                continue;
            }
            match sc.call.poll_event() {
                None => return,
                Some(CallEvent::Kv(_)) => continue,
                Some(CallEvent::Replied(response)) => {
                    let (h, generation, id) = (sc.holder, sc.generation, sc.request);
                    let item = sc.item;
                    self.calls[c] = None;
                    if matches!(&response, Response::Error(e) if e.kind == ErrorKind::Internal) {
                        self.stats.internal_replies += 1;
                    }
                    if let Some(item) = item {
                        self.item_replied(item, &response);
                        return;
                    }
                    if !self.rng.chance(self.p.loss_percent) {
                        let at = self.t + self.latency();
                        let outcome = RequestOutcome::reply(response.to_json());
                        self.schedule(at, Ev::Outcome(h, generation, id, outcome));
                    }
                    return;
                }
            }
        }
    }

    fn paused(&self, h: usize) -> bool {
        self.t < self.holders[h].paused_until
    }

    fn apply(&mut self, ev: Ev) {
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
            Ev::Arrive(h, generation, request) if request.body.starts_with(b"{\"leases\":") => {
                self.learn_stored();
                self.arrive_many(h, generation, request);
            }
            Ev::Arrive(h, generation, request) => {
                self.learn_stored();
                let config = CallConfig::ready(1024 * 1024);
                let (now, wall) = (self.service_now(), self.js.wall());
                let call = match &self.known {
                    Some((known, _)) => {
                        Call::with_known(config, known, request.endpoint, &request.body, wall, now)
                    }
                    None => Call::new(config, request.endpoint, &request.body, wall, now),
                };
                self.calls.push(Some(ServiceCall {
                    call,
                    holder: h,
                    generation,
                    request: request.id,
                    item: None,
                }));
                self.drain_call(self.calls.len() - 1);
            }
            Ev::Step(c, id, request) => {
                let mut outcome = self.js.handle(&request);
                if request.subject.starts_with("$KV.") && self.rng.chance(self.p.ack_loss_percent) {
                    outcome = RequestOutcome::TimedOut;
                }
                let now = self.service_now();
                // Drawn only when aborts are on, so worlds without them (and the
                // regression seeds) replay as before.
                let abort = self.p.abort_percent > 0 && self.rng.chance(self.p.abort_percent);
                if let Some(sc) = self.calls[c].as_mut() {
                    if abort {
                        sc.call.handle_stop(now);
                    } else {
                        sc.call.handle_outcome(now, id, outcome);
                    }
                }
                self.drain_call(c);
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
        }
    }

    /// Checks the invariants at the current instant: every key a node believes it
    /// owns is its on the server, uninterrupted since the tenure began; no two nodes
    /// believe they own one key; no member believes more than its cap.
    fn check(&mut self) -> Result<(), String> {
        for m in &self.js.log[self.runs_read..] {
            let writer = (m.kind == MsgKind::Value)
                .then(|| m.record().map(|r| r.holder))
                .flatten();
            let runs = self.runs.entry(m.key.clone()).or_default();
            match runs.last_mut() {
                Some(last) if writer.is_some() && last.2 == writer => last.1 = m.seq,
                _ => runs.push((m.seq, m.seq, writer)),
            }
        }
        self.runs_read = self.js.log.len();
        let mut believers: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        for h in 0..self.holders.len() {
            let now = self.holder_now(h, self.t);
            let sim = &self.holders[h];
            let believed = sim.machine.believed(&sim.configs, now);
            if let Nodes::Members {
                max_held, grouping, ..
            } = self.p.nodes
                && grouping != Grouping::Balanced
                && believed.len() > max_held
            {
                return Err(format!(
                    "t={}ms: {} believes it owns {} keys, more than its cap {max_held}",
                    self.t,
                    sim.name,
                    believed.len()
                ));
            }
            for (key, own) in believed {
                believers.entry(key.clone()).or_default().push(h);
                self.check_owner(&sim.name, &key, own)?;
            }
        }
        self.stats.most_believers = self.stats.most_believers.max(believers.len());
        self.check_unhealthy_leases()?;
        if let Some(v) = self.violation.take() {
            return Err(v);
        }
        if let Some(&(joined, None)) = self.stats.rebalances.last()
            && self.t > joined
            && self.balanced()
        {
            let last = self.stats.rebalances.len() - 1;
            self.stats.rebalances[last].1 = Some(self.t - joined);
        }
        if let Some((key, hs)) = believers.iter().find(|(_, hs)| hs.len() > 1) {
            return Err(format!(
                "t={}ms: holders {hs:?} all believe they own {key}",
                self.t
            ));
        }
        Ok(())
    }

    /// A member unhealthy since T holds no lease on the server past T +
    /// `unhealthy_for` + two TTLs, and the slack of drift, timeouts and latency.
    fn check_unhealthy_leases(&self) -> Result<(), String> {
        let p = &self.p;
        let ttl_ms = p.ttl_s * 1000;
        let span = (p.unhealthy_for_ms + 2 * ttl_ms) as f64
            * (1.0 + 2.0 * p.actual_drift_ppm as f64 / 1e6);
        let bound = span as u64 + 2 * p.ttl_s * p.timeout_per_ttl_s + 4 * p.max_latency_ms + 1000;
        for sim in &self.holders {
            let Some(since) = sim.unhealthy_since else {
                continue;
            };
            if self.t <= since + bound {
                continue;
            }
            for config in &sim.configs {
                if let Some((record, revision)) = self.js.leased(&config.key)
                    && record.holder == sim.name
                {
                    return Err(format!(
                        "t={}ms: {} is unhealthy since t={since}ms and still holds {} \
                         (revision {revision}) on the server",
                        self.t, sim.name, config.key
                    ));
                }
            }
        }
        Ok(())
    }

    /// `name` believes it owns `key` in tenure `own`: the server must agree.
    fn check_owner(&self, name: &str, key: &str, own: Tenure) -> Result<(), String> {
        // The lease by its TTL: expired but not yet marked does not count.
        let Some((record, revision)) = self.js.leased(key) else {
            return Err(format!(
                "t={}ms: {name} believes it owns {key} (tenure {}, fence {}) but the \
                 server holds no lease",
                self.t, own.tenure, own.fence
            ));
        };
        if record.holder != name || revision < own.fence {
            return Err(format!(
                "t={}ms: {name} believes it owns {key} at fence {} but the server has \
                 {} at {revision}",
                self.t, own.fence, record.holder
            ));
        }
        let runs = self.runs.get(key).map(Vec::as_slice).unwrap_or_default();
        let from = runs.partition_point(|r| r.1 <= own.tenure);
        let interrupted = runs[from..]
            .iter()
            .take_while(|r| r.0 <= revision)
            .any(|r| r.2.as_deref() != Some(name));
        if interrupted {
            return Err(format!(
                "t={}ms: {name}'s tenure {} of {key} was interrupted on the server before \
                 revision {revision}",
                self.t, own.tenure
            ));
        }
        Ok(())
    }

    /// How many keys each node believes it owns now.
    pub fn shares(&self) -> Vec<usize> {
        (0..self.holders.len())
            .map(|h| {
                let now = self.holder_now(h, self.t);
                let sim = &self.holders[h];
                sim.machine.believed(&sim.configs, now).len()
            })
            .collect()
    }

    /// Runs to the end, checking after every step.
    pub fn run(&mut self) -> Result<(), String> {
        while let Some(Reverse((at, _, idx))) = self.queue.pop() {
            if at > self.p.run_ms {
                break;
            }
            // Expiries due before this step happen first.
            self.js.advance(at.saturating_sub(self.t));
            self.t = at;
            self.check()?;
            let ev = self.events[idx].take().expect("each event runs once");
            if std::env::var_os("HOLDER_WORLD_TRACE").is_some() {
                eprintln!("t={} {}", self.t, describe(&ev));
            }
            self.apply(ev);
            self.publish_changes();
            self.check()?;
        }
        Ok(())
    }
}

/// One line for a trace.
fn describe(ev: &Ev) -> String {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match ev {
        Ev::Wake(h) => format!("wake h{h}"),
        Ev::Pause(h) => format!("pause h{h}"),
        Ev::Recreate(h) => format!("recreate h{h}"),
        Ev::Leave(h) => format!("leave h{h}"),
        Ev::Join(h) => format!("join h{h}"),
        Ev::AppWrite => "application writes".to_string(),
        Ev::Health(h) => format!("health of h{h} flips"),
        Ev::Change(h, g, key, e) => format!("change h{h}/{g} {key} {e:?}"),
        Ev::Subscribed(h, g, key) => format!("subscribed h{h}/{g} {key}"),
        Ev::Arrive(h, g, r) => format!(
            "arrive h{h}/{g} #{} {:?} {}",
            r.id.0,
            r.endpoint,
            text(&r.body)
        ),
        Ev::Step(c, _, r) => format!(
            "call {c}: {} {:?} {}",
            r.subject,
            r.headers,
            text(&r.payload)
        ),
        Ev::Outcome(h, g, id, RequestOutcome::Reply { payload, .. }) => {
            format!("reply h{h}/{g} #{} {}", id.0, text(payload))
        }
        Ev::Outcome(h, g, id, o) => format!("outcome h{h}/{g} #{} {o:?}", id.0),
    }
}
