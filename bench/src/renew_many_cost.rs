//! `dagnats-leases-bench renew-many-cost`: what a grouped renewal costs in JSON on
//! each side, for one member holding many keys whose renewals go out grouped as
//! `renew_many` requests (the service advertising it, as ours does).
//!
//! - **Holder:** the holder library's [`Campaign`] machine, all of its work per
//!   renewal: grouping the renewals, reading the `renew_many` reply and handing
//!   each holder its item (the JSON, and the machines' own work around it).
//! - **Service:** the service's JSON per renewal of a `renew_many` request:
//!   [`decode_renew_many`] of the request and [`RenewManyReply::to_json`] of its
//!   reply. Each item's renew call, and how it starts, is not in it.
//!
//! Virtual time against a stand-in service that renews every lease at once and
//! answers `renew_many` with the core's own reply types: no NATS, no runtime.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dagnats_leases_core::holder::HolderConfig;
use dagnats_leases_core::holder::campaign::Campaign;
use dagnats_leases_core::io::RequestOutcome;
use dagnats_leases_core::record::format_time;
use dagnats_leases_core::wire::{
    AcquireReply, Endpoint, Lease, RenewManyReply, RenewManyResult, Request, Response,
    decode_renew_many, renew_many_subject,
};
use serde::Serialize;

/// The leases' TTL, as in `--scale`.
const TTL: Duration = Duration::from_secs(20);
/// Virtual time measured once every key is held.
const WINDOW: Duration = Duration::from_secs(60);
/// The service's `$SRV.INFO`, listing `renew_many`.
const INFO: &[u8] =
    br#"{"name":"dagnats-api","endpoints":[{"name":"renew"},{"name":"renew_many"}]}"#;

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

/// The stand-in lease table.
struct StandIn {
    leases: BTreeMap<String, u64>,
    revision: u64,
    epoch: time::OffsetDateTime,
    start: Instant,
    /// Time spent in the service's JSON of `renew_many`.
    json: Duration,
}

impl StandIn {
    fn lease(&mut self, now: Instant, key: &str, holder: &str) -> Lease {
        let wall = self.epoch + (now - self.start);
        self.revision += 1;
        self.leases.insert(key.to_string(), self.revision);
        Lease {
            held: true,
            key: key.to_string(),
            holder: holder.to_string(),
            revision: self.revision,
            acquired_at: format_time(wall),
            expires_at: format_time(wall + TTL),
            ttl_ms: TTL.as_millis() as u64,
        }
    }

    fn answer(&mut self, now: Instant, endpoint: Endpoint, body: &[u8]) -> Vec<u8> {
        let response = match Request::decode(endpoint, body).expect("the library's own request") {
            Request::Acquire(r) => Response::Acquired(AcquireReply {
                granted: true,
                lease: self.lease(now, &r.key, &r.holder),
            }),
            Request::Renew(r) => Response::Lease(self.lease(now, &r.key, &r.holder)),
            other => panic!("the stand-in answers acquire and renew, not {other:?}"),
        };
        response.to_json()
    }

    /// A `renew_many` request answered as the service does, its JSON timed.
    fn answer_many(&mut self, now: Instant, body: &[u8]) -> (usize, Vec<u8>) {
        let t = Instant::now();
        let items = decode_renew_many(body).expect("the library's own request");
        self.json += t.elapsed();
        let results = items
            .iter()
            .map(|r| {
                let lease = self.lease(now, &r.key, &r.holder);
                RenewManyResult::of(&r.key, &Response::Lease(lease))
            })
            .collect();
        let reply = RenewManyReply { results };
        let t = Instant::now();
        let json = reply.to_json();
        self.json += t.elapsed();
        (items.len(), json)
    }
}

/// Runs one member holding `keys` keys for [`WINDOW`] of virtual time after they
/// are all held.
fn measure(keys: usize) -> RenewManyCost {
    let start = Instant::now();
    let mut stand_in = StandIn {
        leases: BTreeMap::new(),
        revision: 0,
        epoch: time::OffsetDateTime::now_utc(),
        start,
        json: Duration::ZERO,
    };
    let mut campaign = Campaign::new("cost", start).expect("holder id");
    campaign.handle_service_info(INFO);
    assert!(
        campaign.batches_renewals(),
        "the stand-in advertises renew_many"
    );
    let configs = (0..keys)
        .map(|i| HolderConfig::new(format!("shard-{i}"), "cost", TTL))
        .collect();
    let mut now = start;
    campaign.add_group(now, configs, keys).expect("group");
    let (mut renewals, mut requests, mut busy) = (0u64, 0u64, Duration::ZERO);
    let mut measuring = false;
    let end_of_ramp = start + TTL;
    while now < end_of_ramp + WINDOW {
        while let Some(t) = timed(&mut busy, || campaign.poll_transmit()) {
            let request = &t.transmit.request;
            let reply = if request.subject == renew_many_subject() {
                let (n, reply) = stand_in.answer_many(now, &request.payload);
                if measuring {
                    renewals += n as u64;
                    requests += 1;
                }
                reply
            } else {
                stand_in.answer(now, t.endpoint, &request.payload)
            };
            timed(&mut busy, || {
                campaign.handle_outcome(now, t.transmit.id, RequestOutcome::reply(reply))
            });
        }
        while timed(&mut busy, || campaign.poll_event()).is_some() {}
        if !measuring && now >= end_of_ramp {
            measuring = true;
            (busy, stand_in.json) = (Duration::ZERO, Duration::ZERO);
        }
        let Some(at) = timed(&mut busy, || campaign.poll_timeout()) else {
            break;
        };
        now = now.max(at);
        timed(&mut busy, || campaign.handle_timeout(now));
    }
    assert_eq!(stand_in.leases.len(), keys, "every key held at the end");
    let per = |d: Duration| d.as_secs_f64() * 1e6 / renewals.max(1) as f64;
    RenewManyCost {
        keys,
        renewals,
        requests,
        holder_us_per_renewal: per(busy),
        service_json_us_per_renewal: per(stand_in.json),
    }
}

fn timed<T>(busy: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    *busy += t.elapsed();
    r
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
