//! Holder worlds (`sim::holder_world`) shaped and steered by the input: its first
//! bytes choose the nodes (bare holders, or members of a capped, balanced or
//! semaphore group), the lease service (its known map on or off, one instance or
//! two), whether members batch their renewals, and the faults within the bounds the
//! core's property tests use; the rest are the world's draws (latencies, losses,
//! pauses, restarts, health flips). After every step the world checks that nobody
//! believes past the server's lease, never two at once, within the caps, and the
//! applications' fenced writes.
#![no_main]

use dagnats_leases_core::sim::holder_world::{App, Grouping, HolderWorld, Nodes, WorldParams};
use libfuzzer_sys::fuzz_target;

/// Bytes read as the world's shape; the rest is its script of draws.
const SHAPE: usize = 28;

fuzz_target!(|data: &[u8]| {
    let Some((shape, script)) = data.split_first_chunk::<SHAPE>() else {
        return;
    };
    let p = params(shape);
    let shown = format!("{p:?}");
    let mut world = HolderWorld::scripted(p, script.to_vec());
    // Shape byte 3's bits: 1 (bit 0) members take new ids on restart (in `params`),
    // 2 (bit 1) the service keeps its known map, 4 (bit 2) it serves as two
    // instances, 8 (bit 3) members batch their renewals into renew_many.
    if shape[3] & 2 == 2 {
        world = world.with_known();
    }
    if shape[3] & 4 == 4 {
        world = world.with_instances(2);
    }
    if shape[3] & 8 == 8 {
        world = world.with_batching();
    }
    let shown = format!(
        "{shown}, known map {}, instances {}, batching {}",
        shape[3] & 2 == 2,
        1 + (shape[3] >> 2 & 1),
        shape[3] & 8 == 8
    );
    if let Err(v) = world.run() {
        panic!("{shown}: {v}");
    }
});

/// A world's shape from `b`: each field within the ranges of the core's tests.
fn params(b: &[u8; SHAPE]) -> WorldParams {
    let pick = |i: usize, n: u64| u64::from(b[i]) % n;
    // Within [low, low + span).
    let within = |i: usize, low: u64, span: u64| low + u64::from(b[i]) * span / 256;
    // 0 (off) one time in four, else within [low, low + span).
    let some = |i: usize, low: u64, span: u64| match b[i] % 4 {
        0 => 0,
        _ => low + u64::from(b[i] >> 2) * span / 64,
    };
    let members = |grouping, shards: usize, max_held: usize| Nodes::Members {
        shards,
        max_held,
        new_id_on_restart: b[3] & 1 == 1,
        leave_every_ms: some(4, 4_000, 12_000),
        grouping,
        join_spread_ms: some(5, 1_000, 4_000),
    };
    let shards = 1 + pick(2, 6) as usize;
    let (nodes, holders) = match b[0] % 4 {
        0 => (Nodes::Holders, 2 + pick(1, 3) as usize),
        kind => {
            let n = 2 + pick(1, 3) as usize;
            let nodes = match kind {
                1 => members(Grouping::Capped, shards, shards.div_ceil(n)),
                2 => members(Grouping::Balanced, shards, shards),
                _ => members(Grouping::Semaphore, 1 + shards % 3, 1),
            };
            (nodes, n)
        }
    };
    let is_members = matches!(nodes, Nodes::Members { .. });
    let ttl_s = 1 + pick(6, 3);
    let seed = u64::from_le_bytes(b[20..28].try_into().expect("eight bytes"));
    WorldParams {
        seed,
        holders,
        ttl_s,
        max_latency_ms: within(7, 1, 1_200),
        loss_percent: pick(8, 40),
        ack_loss_percent: pick(9, 30),
        request_loss_percent: pick(10, 20),
        pause_every_ms: some(11, 1_000, 19_000),
        max_pause_ms: ttl_s * 1500,
        configured_drift_ppm: 10_000,
        actual_drift_ppm: within(12, 0, 10_001) as u32,
        timeout_per_ttl_s: within(13, 100, 500),
        recreate_every_ms: some(14, 1_000, 19_000),
        abort_percent: some(15, 1, 14),
        // Short runs, so the fuzzer tries many worlds.
        run_ms: 3_000 + pick(16, 8) * 1_000,
        nodes,
        app: match (is_members, b[17] % 4) {
            (false, _) | (true, 0) => App::None,
            (true, 1 | 2) => App::IgnoresRevocation,
            (true, _) => App::HeedsRevocation,
        },
        health_flip_every_ms: if is_members { some(18, 500, 7_500) } else { 0 },
        unhealthy_for_ms: within(19, 0, 4_000),
    }
}
