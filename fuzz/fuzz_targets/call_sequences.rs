//! Arbitrary sequences of calls, outcomes, lost replies and expiries through the
//! lease service and the simulated JetStream; every lease invariant is checked
//! after each step.
#![no_main]

use dagnats_leases_core::sim::{World, ops_from_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [holders, keys, rest @ ..] = data else { return };
    let mut world = World::new(1 + *holders as usize % 4, 1 + *keys as usize % 3, 4096);
    for (n, op) in ops_from_bytes(rest).into_iter().enumerate() {
        let shown = format!("{op:?}");
        if let Err(v) = world.apply(op) {
            panic!("step {n} ({shown}): {v}");
        }
    }
    if let Err(v) = world.finish() {
        panic!("finishing: {v}");
    }
});
