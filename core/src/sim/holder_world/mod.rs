//! The holder world: the holder rules end to end, for the core's property tests
//! (`tests/holder_world.rs`) and the fuzzer (`holder_worlds`). Holder machines talk
//! to the lease [`Service`] (one instance, or several in its queue group; see
//! `lease_side`), which talks to the simulated JetStream, over a network with
//! random latency and lost replies; holders are paused for random spans and their
//! clocks drift within the configured bound. The world's shape is in `params`, its
//! nodes in `nodes`, and what it checks in `checks`. After every step it checks:
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
//!    request, the service runs each item as its own renew call and answers once
//!    all are in; invariants 1 to 3 hold as with single renewals.

mod checks;
mod lease_side;
mod nodes;
mod params;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::{Duration, Instant};

use crate::change::ChangeEvent;
use crate::holder::campaign::Campaign;
use crate::io::HANDOFF_BOUND;
use crate::io::{RequestOutcome, Transmit, TransmitId};
use crate::service::{Received, Service};

use crate::sim::SimJetStream;
use crate::sim::server::StreamAdmin;
use crate::test_support::HolderRequest;

use nodes::{HolderSim, Machine, configs_for};
use params::{APP_WRITE_EVERY_MS, Rng};
pub use params::{App, Grouping, Nodes, Stats, WorldParams};

#[derive(Debug)]
enum Ev {
    /// A holder's timer (or the end of its pause).
    Wake(usize),
    /// A holder freezes (GC, a VM stall, SIGSTOP): it handles nothing until it wakes.
    Pause(usize),
    /// A holder's request reaches the service (from the machine of a generation).
    Arrive(usize, u64, HolderRequest),
    /// A request a service instance sent (the instance of a generation) reaches
    /// the stream, and its answer comes back.
    Step(u64, Transmit),
    /// A service instance's timer (the instance of a generation).
    ServiceWake(u64),
    /// A change event the stream republished reaches a service instance (of a
    /// generation).
    ServiceChange(u64, Received),
    /// Another instance's presence heartbeat reaches a service instance (of a
    /// generation) that subscribed to them.
    ServicePresence(u64, Vec<u8>),
    /// A reply (or a timeout) reaches a holder, for the machine of this generation.
    Outcome(usize, u64, TransmitId, RequestOutcome),
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

/// Nodes, the lease service and the simulated stream, run event by event, with the
/// invariants of the module docs checked after every step.
pub struct HolderWorld {
    p: WorldParams,
    rng: Rng,
    t: u64,
    seq: u64,
    base: Instant,
    js: SimJetStream,
    holders: Vec<HolderSim>,
    /// The lease service the nodes call, as deployed: one instance or several in
    /// its queue group, each fed the requests it is handed and the stream's change
    /// events, its requests answered by the stream.
    instances: Vec<Instance>,
    /// What the stream API says of the stream.
    admin: StreamAdmin,
    /// The last generation an instance was given: one is replaced when it stops
    /// mid-call, and what the network still holds for the old one reaches the
    /// stream, its answer dropped.
    service_gen: u64,
    /// The requests let in, by their reply subject: the node, its machine's
    /// generation, the request's id and endpoint.
    inboxes: BTreeMap<String, (usize, u64, TransmitId, crate::wire::Endpoint)>,
    next_inbox: u64,
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
    /// With [`HolderWorld::with_known`]: the service keeps its known map (fed by
    /// itself: its calls, and the change events it subscribed to).
    known: bool,
    /// With [`HolderWorld::with_change_events_denied`]: the services' change
    /// subscriptions fail.
    changes_denied: bool,
    /// With [`HolderWorld::with_presence`]: the services take change events as
    /// `changes: auto` decides, from the heartbeats they hear; without, always.
    presence: bool,
    /// With [`HolderWorld::with_slow_subscribes`]: the share of subscribes that
    /// hang past the hand-off bound, percent, and the draws of their delays (apart
    /// from the world's, so its other draws replay as without).
    slow_subscribes: Option<(u64, Rng)>,
    /// With [`HolderWorld::with_batching`]: members batch their renewals.
    batching: bool,
}

/// One instance of the lease service in the world.
struct Instance {
    service: Service,
    /// Names it in the events meant for it.
    generation: u64,
    /// Instants its timer is scheduled for.
    wakes: std::collections::BTreeSet<u64>,
    /// Whether it subscribed to change events, and how far into the log they
    /// were sent to it.
    hears_changes: bool,
    changes_read: usize,
    /// Whether it subscribed to the other instances' heartbeats.
    hears_presence: bool,
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
        let js = SimJetStream::new()
            .with_seed(expiry_seed)
            // As nats-server does: the late marker wipes a write that landed
            // after the TTL (SIM_NO_ROLLUP_WIPE=1 turns it off, to compare).
            .with_rollup_wipe(std::env::var_os("SIM_NO_ROLLUP_WIPE").is_none());
        let mut world = Self {
            p,
            rng,
            t: 0,
            seq: 0,
            base,
            js,
            holders,
            instances: Vec::new(),
            admin: StreamAdmin::new(1),
            service_gen: 0,
            inboxes: BTreeMap::new(),
            next_inbox: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            last_owner: None,
            runs: Default::default(),
            runs_read: 0,
            changes_read: 0,
            store: BTreeMap::new(),
            violation: None,
            stats: Stats::default(),
            known: false,
            changes_denied: false,
            presence: false,
            slow_subscribes: None,
            batching: false,
        };
        world.start_instances(1);
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

    /// The same world with the service keeping its known map (as deployed: fed
    /// by its own calls and the change events it subscribes to), so that renew
    /// and release of a revision it knows go straight to their conditional write.
    /// Without, its capacity is 0: every call reads first.
    pub fn with_known(mut self) -> Self {
        self.known = true;
        self.start_instances(self.instances.len());
        self
    }

    /// The same world with every instance's subscription to change events
    /// failing (a user not allowed them): its known map learns from its own calls
    /// alone.
    pub fn with_change_events_denied(mut self) -> Self {
        self.changes_denied = true;
        self.start_instances(self.instances.len());
        self
    }

    /// The same world with the services deciding on their change subscription
    /// from the heartbeats they hear (`changes: auto`, [`crate::service::peers`]):
    /// alone an instance takes no change events; with others it subscribes once
    /// it hears one, and the facts it missed before cost reads, never a lease.
    pub fn with_presence(mut self) -> Self {
        self.presence = true;
        self.start_instances(self.instances.len());
        self
    }

    /// The same world with `n` instances of the service in its queue group: each
    /// request goes to one drawn at random, and each instance knows of the
    /// others' writes only from the change events.
    pub fn with_instances(mut self, n: usize) -> Self {
        self.start_instances(n.max(1));
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

    fn paused(&self, h: usize) -> bool {
        self.t < self.holders[h].paused_until
    }

    fn apply(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive(..)
            | Ev::Step(..)
            | Ev::ServiceWake(..)
            | Ev::ServiceChange(..)
            | Ev::ServicePresence(..) => self.apply_service(ev),
            ev => self.apply_node(ev),
        }
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
            self.publish_service_changes();
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
        Ev::Step(g, t) => format!(
            "service/{g} #{}: {} {:?} {}",
            t.id.0,
            t.request.subject,
            t.request.headers,
            text(&t.request.payload)
        ),
        Ev::ServiceWake(g) => format!("service/{g} timer"),
        Ev::ServiceChange(g, m) => format!("service/{g} change {} {:?}", m.subject, m.headers),
        Ev::ServicePresence(g, body) => format!("service/{g} presence {}", text(body)),
        Ev::Outcome(h, g, id, RequestOutcome::Reply { payload, .. }) => {
            format!("reply h{h}/{g} #{} {}", id.0, text(payload))
        }
        Ev::Outcome(h, g, id, o) => format!("outcome h{h}/{g} #{} {o:?}", id.0),
    }
}
