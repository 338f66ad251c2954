//! The shape of a holder world, its draws, and what a run saw.

#[cfg(doc)]
use super::HolderWorld;
#[cfg(doc)]
use crate::holder::Holder;
#[cfg(doc)]
use crate::holder::campaign::Campaign;

/// A small deterministic generator (xorshift64*), so a seed replays a world exactly.
/// Its draws come first from a script of bytes (two a draw), if any: the fuzzer's.
pub(super) struct Rng(u64, Vec<u8>, usize);

impl Rng {
    pub(super) fn new(seed: u64, script: Vec<u8>) -> Self {
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

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
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
    /// then the service stops, its calls cut off at once replying `internal`, as
    /// leases.md says of a service stopping mid-call, and a fresh instance serves.
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
    /// Stops writing a revoked key at once and calls [`Campaign::handle_stopped_writing`].
    HeedsRevocation,
}

/// How often each application writes the keys it believes it may, ms.
pub(super) const APP_WRITE_EVERY_MS: u64 = 25;

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
    /// Reads of a key the service sent to the stream (`MSG.GET`).
    pub service_reads: u64,
    /// Writes of a key the service sent to the stream (a batch's commit counts one).
    pub service_writes: u64,
    /// Change events delivered to a service instance.
    pub service_changes: u64,
    /// Subscribes the campaigns gave up ([`HolderWorld::with_slow_subscribes`]).
    pub subscribes_given_up: u64,
    /// `renew_many` requests that reached the service ([`HolderWorld::with_batching`]).
    pub batches: u64,
    /// The renewals the `renew_many` requests carried.
    pub batched_renewals: u64,
}
