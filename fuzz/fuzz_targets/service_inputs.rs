//! The service machine (`sim::service_world`) fed arbitrary input sequences: its
//! first bytes choose the options (bounds, the coalescer, the drain's length, the
//! stream's replicas), the rest are the world's steps (requests good and bad, to
//! good and bad reply subjects, `$SRV` verbs, outcomes delivered out of order or
//! lost, timers, the replicas flipping, the stream made anew, a stop). After every
//! step the world checks: no panic, replies only to subjects the reply rule lets
//! through and at most one per request, grants, renewals and releases backed by the
//! stream, no tombstone over a lease its holder did not release, no write sent for a
//! call already answered (one sent before its call gave up may still land); and at
//! the end that the stop is done within its bound and a bounded number of
//! steps, every request let through answered.
#![no_main]

use std::time::Duration;

use dagnats_leases_core::service::ServiceConfig;
use dagnats_leases_core::sim::service_world::ServiceWorld;
use libfuzzer_sys::fuzz_target;

/// Bytes read as the options; the rest is the script.
const SHAPE: usize = 6;

fuzz_target!(|data: &[u8]| {
    let Some((shape, script)) = data.split_first_chunk::<SHAPE>() else {
        return;
    };
    let mut config = ServiceConfig::new("2.14.0", 1 << 20);
    config.max_calls_in_flight = usize::from(shape[0] % 6) + 1;
    config.max_calls_waiting = usize::from(shape[1] % 6);
    config.coalesce_writes = match shape[2] % 3 {
        0 => dagnats_leases_core::service::coalesce::CoalesceWrites::Off,
        1 => dagnats_leases_core::service::coalesce::CoalesceWrites::On,
        _ => dagnats_leases_core::service::coalesce::CoalesceWrites::Auto,
    };
    config.batch_after = Some(usize::from(shape[2] / 2 % 4) + 1);
    config.min_batch = usize::from(shape[3] % 4) + 1;
    config.shutdown_timeout = Duration::from_millis(u64::from(shape[4]) * 40);
    config.known_capacity = if shape[5] % 3 == 0 { 0 } else { 64 };
    let replicas = usize::from(shape[5] % 2) * 2 + 1;
    let shown = format!("{config:?} replicas {replicas}");
    let mut world = ServiceWorld::new(config, replicas);
    if let Err(v) = world.run(script) {
        panic!("{shown}: {v}");
    }
});
