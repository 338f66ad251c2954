//! `dagnats-leases-bench campaign-cost`: what one input costs the holder library's
//! [`Campaign`] machine when a member holds many keys, against the same with a few
//! keys, in one run. A member of `--scale` holds 1,000 shards: every renewal's
//! outcome and every renew timer is one input, so a cost that grows with the keys
//! held grows the library's CPU with the square of them.
//!
//! The machine runs on virtual time against a **stand-in** lease service (an
//! in-memory table that grants every acquire and renews every lease at once): no
//! NATS, no runtime, only the core's own work is timed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dagnats_leases_core::holder::HolderConfig;
use dagnats_leases_core::holder::campaign::Campaign;
use dagnats_leases_core::io::RequestOutcome;
use dagnats_leases_core::record::format_time;
use dagnats_leases_core::wire::{AcquireReply, Endpoint, Lease, ReleaseReply, Request, Response};
use serde::Serialize;

/// The leases' TTL, as in `--scale`.
const TTL: Duration = Duration::from_secs(20);
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

/// The stand-in lease table: every key free or held, revisions counting up.
struct StandIn {
    leases: BTreeMap<String, (String, u64)>,
    revision: u64,
    epoch: time::OffsetDateTime,
    start: Instant,
}

impl StandIn {
    fn answer(&mut self, now: Instant, endpoint: Endpoint, body: &[u8]) -> Vec<u8> {
        let wall = self.epoch + (now - self.start);
        self.revision += 1;
        let revision = self.revision;
        let lease = |key: &str, holder: &str| Lease {
            held: true,
            key: key.to_string(),
            holder: holder.to_string(),
            revision,
            acquired_at: format_time(wall),
            expires_at: format_time(wall + TTL),
            ttl_ms: TTL.as_millis() as u64,
        };
        let response = match Request::decode(endpoint, body).expect("the library's own request") {
            Request::Acquire(r) => {
                self.leases
                    .insert(r.key.clone(), (r.holder.clone(), revision));
                Response::Acquired(AcquireReply {
                    granted: true,
                    lease: lease(&r.key, &r.holder),
                })
            }
            Request::Renew(r) => {
                self.leases
                    .insert(r.key.clone(), (r.holder.clone(), revision));
                Response::Lease(lease(&r.key, &r.holder))
            }
            Request::Release(r) => {
                self.leases.remove(&r.key);
                Response::Released(ReleaseReply {
                    released: true,
                    held: false,
                    key: r.key,
                    holder: r.holder,
                    revision,
                })
            }
            other => panic!("the stand-in answers acquire, renew and release, not {other:?}"),
        };
        response.to_json()
    }
}

/// Runs one member holding `keys` shards for [`WINDOW`] of virtual time.
fn measure(keys: usize) -> (u64, u64, Duration) {
    let start = Instant::now();
    let mut stand_in = StandIn {
        leases: BTreeMap::new(),
        revision: 0,
        epoch: time::OffsetDateTime::now_utc(),
        start,
    };
    let mut campaign = Campaign::new("cost", start).expect("holder id");
    let configs = (0..keys)
        .map(|i| HolderConfig::new(format!("shard-{i}"), "cost", TTL))
        .collect();
    let mut now = start;
    campaign.add_group(now, configs, keys).expect("group");
    let (mut inputs, mut renewals, mut busy) = (0u64, 0u64, Duration::ZERO);
    let mut measuring_from = None;
    let end_of_ramp = start + TTL;
    while now < end_of_ramp + WINDOW {
        // Every request is answered at once, in order: the outcomes are inputs.
        let mut answered = 0;
        while let Some(t) = timed(&mut busy, || campaign.poll_transmit()) {
            let endpoint = t.endpoint;
            let reply = stand_in.answer(now, endpoint, &t.transmit.request.payload);
            if endpoint == Endpoint::Renew && measuring_from.is_some() {
                renewals += 1;
            }
            timed(&mut busy, || {
                campaign.handle_outcome(now, t.transmit.id, RequestOutcome::reply(reply))
            });
            answered += 1;
        }
        while timed(&mut busy, || campaign.poll_event()).is_some() {}
        if measuring_from.is_some() {
            inputs += answered;
        }
        if measuring_from.is_none() && now >= end_of_ramp {
            measuring_from = Some(now);
            (inputs, busy) = (0, Duration::ZERO);
        }
        let Some(at) = timed(&mut busy, || campaign.poll_timeout()) else {
            break;
        };
        now = now.max(at);
        timed(&mut busy, || campaign.handle_timeout(now));
        if measuring_from.is_some() {
            inputs += 1;
        }
    }
    let held = stand_in.leases.len();
    assert_eq!(held, keys, "every shard held at the end");
    (inputs, renewals, busy)
}

fn timed<T>(busy: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    *busy += t.elapsed();
    r
}

/// Measures each group size in `keys` and prints the table.
pub fn run(keys: &[usize]) -> Vec<Cost> {
    let mut costs: Vec<Cost> = Vec::new();
    for &n in keys {
        let (inputs, renewals, busy) = measure(n);
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
