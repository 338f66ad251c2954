//! `dagnats-leases-bench renew-many-cost`: what a grouped renewal costs in JSON on
//! each side, for one member holding many keys whose renewals go out grouped as
//! `renew_many` requests (the service advertising it, as ours does).
//!
//! - **Holder:** the holder library's
//!   [`Campaign`](dagnats_leases_core::holder::campaign::Campaign) machine, all of
//!   its work per renewal: grouping the renewals, reading the `renew_many` reply
//!   and handing each holder its item (the JSON, and the machines' own work around
//!   it).
//! - **Service:** the service's JSON per renewal of a `renew_many` request:
//!   [`decode_renew_many`](dagnats_leases_core::wire::decode_renew_many) of the
//!   request and
//!   [`RenewManyReply::to_json`](dagnats_leases_core::wire::RenewManyReply::to_json)
//!   of its reply. Each item's renew call, and how it starts, is not in it.
//!
//! Virtual time against the **stand-in** lease service of [`crate::stand_in`],
//! which answers `renew_many` with the core's own reply types: no NATS, no runtime.

use std::time::Duration;

use serde::Serialize;

use crate::stand_in::{Counted, run_member};

/// Virtual time measured once every key is held.
const WINDOW: Duration = Duration::from_secs(60);

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct RenewManyCost {
    /// Keys the member holds.
    pub keys: usize,
    /// Renewals answered in the window, all in `renew_many` requests.
    pub renewals: u64,
    /// `renew_many` requests in the window.
    pub requests: u64,
    /// The Campaign machine's wall time per renewal, microseconds.
    pub holder_us_per_renewal: f64,
    /// The service's JSON per renewal (request decoded, reply encoded), microseconds.
    pub service_json_us_per_renewal: f64,
}

/// One member holding `keys` keys, its renewals grouped, for [`WINDOW`] of virtual
/// time after they are all held.
fn measure(keys: usize) -> RenewManyCost {
    let Counted {
        renewals,
        requests,
        busy,
        json,
        ..
    } = run_member(keys, WINDOW, true);
    let per = |d: Duration| d.as_secs_f64() * 1e6 / renewals.max(1) as f64;
    RenewManyCost {
        keys,
        renewals,
        requests,
        holder_us_per_renewal: per(busy),
        service_json_us_per_renewal: per(json),
    }
}

/// Measures each member size in `keys`, `rounds` times each, and prints the table
/// (each row the median round by the holder's cost).
pub fn run(keys: &[usize], rounds: usize) -> Vec<RenewManyCost> {
    let mut costs = Vec::new();
    for &n in keys {
        let mut runs: Vec<RenewManyCost> = (0..rounds.max(1)).map(|_| measure(n)).collect();
        runs.sort_by(|a, b| a.holder_us_per_renewal.total_cmp(&b.holder_us_per_renewal));
        costs.push(runs.swap_remove(runs.len() / 2));
    }
    println!(
        "renew_many: one member's renewals grouped (stand-in service, virtual time), \
         median of {rounds} rounds"
    );
    println!(
        "{:>8} {:>10} {:>10} {:>12} {:>18} {:>22}",
        "keys",
        "renewals",
        "requests",
        "per request",
        "holder us/renewal",
        "service JSON us/renewal"
    );
    for c in &costs {
        println!(
            "{:>8} {:>10} {:>10} {:>12.1} {:>18.2} {:>22.2}",
            c.keys,
            c.renewals,
            c.requests,
            c.renewals as f64 / c.requests.max(1) as f64,
            c.holder_us_per_renewal,
            c.service_json_us_per_renewal
        );
    }
    costs
}
