//! `dagnats-leases-bench campaign-cost`: what one input costs the holder library's
//! [`Campaign`](dagnats_leases_core::holder::campaign::Campaign) machine when a
//! member holds many keys, against the same with a few keys, in one run. A member
//! of `--scale` holds 1,000 shards: every renewal's outcome and every renew timer
//! is one input, so a cost that grows with the keys held grows the library's CPU
//! with the square of them.
//!
//! The machine runs on virtual time against the **stand-in** lease service of
//! [`crate::stand_in`], every renewal alone: no NATS, no runtime, only the core's
//! own work is timed.

use std::time::Duration;

use serde::Serialize;

use crate::stand_in::{Counted, run_member};

/// Virtual time each measurement covers once every key is held: three renew
/// intervals.
const WINDOW: Duration = Duration::from_secs(20);

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    /// Keys in the member's shard group (all held).
    pub keys: usize,
    /// Inputs fed in the window (outcomes and timeouts).
    pub inputs: u64,
    /// Renewals answered in the window.
    pub renewals: u64,
    /// Wall time of the machine's calls in the window, microseconds per input.
    pub us_per_input: f64,
    /// `us_per_input` over the smallest group's.
    pub ratio_to_smallest: f64,
}

/// Measures each group size in `keys` and prints the table.
pub fn run(keys: &[usize]) -> Vec<Cost> {
    let mut costs: Vec<Cost> = Vec::new();
    for &n in keys {
        let Counted {
            inputs,
            renewals,
            busy,
            ..
        } = run_member(n, WINDOW, false);
        let us = busy.as_secs_f64() * 1e6 / inputs.max(1) as f64;
        let smallest = costs.first().map_or(us, |c| c.us_per_input);
        costs.push(Cost {
            keys: n,
            inputs,
            renewals,
            us_per_input: us,
            ratio_to_smallest: us / smallest,
        });
    }
    println!(
        "the Campaign machine, one member holding every key of a shard group (stand-in service, virtual time)"
    );
    println!(
        "{:>8} {:>10} {:>10} {:>12} {:>10}",
        "keys", "inputs", "renewals", "us/input", "ratio"
    );
    for c in &costs {
        println!(
            "{:>8} {:>10} {:>10} {:>12.2} {:>10.1}",
            c.keys, c.inputs, c.renewals, c.us_per_input, c.ratio_to_smallest
        );
    }
    costs
}
