//! The **stand-in** lease service of the holder library's cost benchmarks
//! (`campaign-cost`, `renew-many-cost`): an in-memory table that grants every
//! acquire, renews every lease and answers `renew_many` as the service does, with
//! the core's own reply types, on virtual time. No NATS, no runtime: only the core's
//! own work is timed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dagnats_leases_core::holder::HolderConfig;
use dagnats_leases_core::holder::campaign::Campaign;
use dagnats_leases_core::io::RequestOutcome;
use dagnats_leases_core::record::format_time;
use dagnats_leases_core::wire::{
    AcquireReply, Endpoint, Lease, ReleaseReply, RenewManyReply, RenewManyResult, Request,
    Response, decode_renew_many, renew_many_subject,
};

/// The leases' TTL, as in `--scale`; the ramp lasts one TTL.
pub const TTL: Duration = Duration::from_secs(20);

/// The stand-in lease table: every key free or held, revisions counting up.
struct StandIn {
    leases: BTreeMap<String, (String, u64)>,
    revision: u64,
    epoch: time::OffsetDateTime,
    start: Instant,
    /// Time spent in the service's JSON of `renew_many` (request and reply).
    json: Duration,
}

impl StandIn {
    fn lease(&mut self, now: Instant, key: &str, holder: &str) -> Lease {
        let wall = self.epoch + (now - self.start);
        self.revision += 1;
        self.leases
            .insert(key.to_string(), (holder.to_string(), self.revision));
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
            Request::Release(r) => {
                self.revision += 1;
                self.leases.remove(&r.key);
                Response::Released(ReleaseReply {
                    released: true,
                    held: false,
                    key: r.key,
                    holder: r.holder,
                    revision: self.revision,
                })
            }
            other => panic!("the stand-in answers acquire, renew and release, not {other:?}"),
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

/// What one member's run counted in its window, once all its keys were held.
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    /// Inputs fed to the Campaign machine (outcomes and timeouts).
    pub inputs: u64,
    /// Renewals answered, alone or in `renew_many` requests.
    pub renewals: u64,
    /// `renew_many` requests answered.
    pub requests: u64,
    /// Wall time of the Campaign machine's calls.
    pub busy: Duration,
    /// Wall time of the service's JSON of `renew_many`.
    pub json: Duration,
}

/// One member holding every key of a shard group of `keys`, against the stand-in
/// (which lists `renew_many` in its `$SRV.INFO` if `renew_many`): a ramp of one TTL,
/// then `window` of virtual time counted, every request answered at once, in order.
pub fn run_member(keys: usize, window: Duration, renew_many: bool) -> Counted {
    let start = Instant::now();
    let mut stand_in = StandIn {
        leases: BTreeMap::new(),
        revision: 0,
        epoch: time::OffsetDateTime::now_utc(),
        start,
        json: Duration::ZERO,
    };
    let mut campaign = Campaign::new("cost", start).expect("holder id");
    if renew_many {
        campaign.handle_service_info(
            br#"{"name":"dagnats-api","endpoints":[{"name":"renew"},{"name":"renew_many"}]}"#,
        );
        assert!(
            campaign.batches_renewals(),
            "the stand-in advertises renew_many"
        );
    }
    let configs = (0..keys)
        .map(|i| HolderConfig::new(format!("shard-{i}"), "cost", TTL))
        .collect();
    let mut now = start;
    campaign.add_group(now, configs, keys).expect("group");
    let mut counted = Counted {
        inputs: 0,
        renewals: 0,
        requests: 0,
        busy: Duration::ZERO,
        json: Duration::ZERO,
    };
    let mut measuring = false;
    let end_of_ramp = start + TTL;
    while now < end_of_ramp + window {
        while let Some(t) = timed(&mut counted.busy, || campaign.poll_transmit()) {
            let request = &t.transmit.request;
            let reply = if request.subject == renew_many_subject() {
                let (n, reply) = stand_in.answer_many(now, &request.payload);
                if measuring {
                    counted.renewals += n as u64;
                    counted.requests += 1;
                }
                reply
            } else {
                if measuring && t.endpoint == Endpoint::Renew {
                    counted.renewals += 1;
                }
                stand_in.answer(now, t.endpoint, &request.payload)
            };
            timed(&mut counted.busy, || {
                campaign.handle_outcome(now, t.transmit.id, RequestOutcome::reply(reply))
            });
            if measuring {
                counted.inputs += 1;
            }
        }
        while timed(&mut counted.busy, || campaign.poll_event()).is_some() {}
        if !measuring && now >= end_of_ramp {
            measuring = true;
            (counted.busy, stand_in.json) = (Duration::ZERO, Duration::ZERO);
        }
        let Some(at) = timed(&mut counted.busy, || campaign.poll_timeout()) else {
            break;
        };
        now = now.max(at);
        timed(&mut counted.busy, || campaign.handle_timeout(now));
        if measuring {
            counted.inputs += 1;
        }
    }
    assert_eq!(stand_in.leases.len(), keys, "every key held at the end");
    counted.json = stand_in.json;
    counted
}

fn timed<T>(busy: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    *busy += t.elapsed();
    r
}
