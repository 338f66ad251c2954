//! Soak: many keys held and renewed at ttl/3 for a set time on one node, counting
//! lost leases (expected: none) and renew latency percentiles: once by a client
//! written from leases.md (raw requests), once by the holder library as shipped
//! (`Member` with `Shards`).
//!
//! CI's short run: 10,000 keys, TTL 30 s (renewals every 10 s, about 1,000 a second),
//! 25 s, at most 64 requests in flight; the two soaks run one after the other.
//! Longer: `DAGNATS_SOAK_SECS` (duration), `DAGNATS_SOAK_KEYS`, `DAGNATS_SOAK_TTL_MS`,
//! `DAGNATS_SOAK_IN_FLIGHT`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dagnats_leases_core::{Endpoint, RequestOutcome};
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tests::load::{self, Reply};
use dagnats_leases_tokio::member::{CampaignObserver, Member, ObservedRequest, Ownership};
use dagnats_leases_tokio::service::{self, ServiceOptions};
use serde_json::json;

/// The soaks run one at a time: each measures what one server and service sustain
/// on the machine's two cores. Side by side each had about half, and in the library
/// soak's burst of 2,000 grants and their confirming renewals (latency near the
/// 3.75 s request timeout even alone) a shard missed its 15 s deadline before all
/// were held: 2 of 6 runs side by side, 0 of 8 one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Counts {
    renewals: AtomicU64,
    lost: AtomicU64,
    retried: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_many_keys_renewed_at_a_third_of_the_ttl() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let keys = env("DAGNATS_SOAK_KEYS", 10_000) as usize;
    let secs = env("DAGNATS_SOAK_SECS", 25);
    let ttl_ms = env("DAGNATS_SOAK_TTL_MS", 30_000);
    let in_flight = env("DAGNATS_SOAK_IN_FLIGHT", 64) as usize;
    let ttl = Duration::from_millis(ttl_ms);

    let server = NatsServer::builder().sync_always(true).start();
    let svc_client = async_nats::connect(server.url()).await.expect("connect");
    let svc = service::start((server.url(), svc_client), ServiceOptions::default())
        .await
        .expect("service starts");
    let client = load::connect(&[server.url()]).await;

    let started = Instant::now();
    let end = started + Duration::from_secs(secs);
    let counts = Arc::new(Counts::default());
    let latencies = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let acquired = Arc::new(AtomicU64::new(0));
    // `in_flight` workers, each owning every in_flight-th key: at most that many
    // requests in flight, each key renewed when a third of its TTL has passed.
    let mut workers = Vec::new();
    for w in 0..in_flight {
        let client = client.clone();
        let counts = Arc::clone(&counts);
        let latencies = Arc::clone(&latencies);
        let acquired = Arc::clone(&acquired);
        workers.push(tokio::spawn(async move {
            // (key, fence, send time of the last successful write)
            let mut mine: Vec<(String, u64, Instant)> = Vec::new();
            for k in (w..keys).step_by(in_flight) {
                let key = format!("soak-{k}");
                let body = json!({"key": key, "holder": "soaker", "ttl_ms": ttl_ms});
                let sent = Instant::now();
                match load::call(&client, "acquire", &body, load::REQUEST_TIMEOUT).await {
                    Reply::Ok(v) if v["granted"] == true => {
                        mine.push((key, v["revision"].as_u64().unwrap(), sent));
                        acquired.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("acquire {key}: {other:?}"),
                }
            }
            let mut i = 0;
            while !mine.is_empty() {
                let (key, fence, last) = &mut mine[i];
                let due = *last + ttl / 3;
                if due >= end {
                    break; // every later key is due later still
                }
                tokio::time::sleep_until(due.into()).await;
                loop {
                    let body = json!({"key": key, "holder": "soaker", "revision": fence});
                    let sent = Instant::now();
                    let reply = load::call(&client, "renew", &body, load::REQUEST_TIMEOUT).await;
                    let took = sent.elapsed();
                    match reply {
                        Reply::Ok(v) if sent < *last + ttl => {
                            *fence = v["revision"].as_u64().unwrap();
                            *last = sent;
                            counts.renewals.fetch_add(1, Ordering::Relaxed);
                            latencies.lock().unwrap().push(took.as_micros() as u32);
                            break;
                        }
                        Reply::Err(kind, _) if kind == "lost" || kind == "fence_mismatch" => {
                            counts.lost.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        _ if Instant::now() >= *last + ttl => {
                            // The local deadline passed before a renewal got through.
                            counts.lost.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        _ => {
                            counts.retried.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                i = (i + 1) % mine.len();
            }
        }));
    }
    for w in workers {
        w.await.expect("a soak worker panicked");
    }
    let elapsed = started.elapsed();
    let mut lat = std::mem::take(&mut *latencies.lock().unwrap());
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i] as f64 / 1000.0
    };
    let renewals = counts.renewals.load(Ordering::Relaxed);
    let lost = counts.lost.load(Ordering::Relaxed);
    println!(
        "soak: {} keys held, ttl {} s, {:.0} s: {renewals} renewals ({:.0}/s), lost {lost}, \
         retried {}, renew latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} in flight at most)",
        acquired.load(Ordering::Relaxed),
        ttl_ms / 1000,
        elapsed.as_secs_f64(),
        renewals as f64 / elapsed.as_secs_f64(),
        counts.retried.load(Ordering::Relaxed),
        pct(0.50),
        pct(0.99),
        pct(1.0),
        in_flight
    );
    assert_eq!(acquired.load(Ordering::Relaxed), keys as u64);
    assert_eq!(lost, 0, "leases lost during the soak");
    assert!(renewals > 0, "no renewal in {secs} s");
    svc.shutdown().await;
}

/// Counts what the library's campaigns send: renewals answered, their latency, and
/// every other renew outcome (retried by the library).
#[derive(Default)]
struct RenewCounter {
    renewals: AtomicU64,
    retried: AtomicU64,
    latencies: std::sync::Mutex<Vec<u32>>,
}

impl CampaignObserver for RenewCounter {
    fn request(&self, request: &ObservedRequest<'_>) {
        if request.endpoint != Endpoint::Renew {
            return;
        }
        let ok = match request.outcome {
            RequestOutcome::Reply { payload, .. } => {
                serde_json::from_slice::<serde_json::Value>(payload)
                    .is_ok_and(|v| v.get("kind").is_none())
            }
            _ => false,
        };
        if ok {
            self.renewals.fetch_add(1, Ordering::Relaxed);
            let took = request
                .answered
                .saturating_duration_since(request.sent)
                .as_micros() as u32;
            self.latencies.lock().unwrap().push(took);
        } else {
            self.retried.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The soak on the holder library as shipped: `DAGNATS_SOAK_MEMBERS` members (4),
/// each a `Member` with `Shards` over its own share of `DAGNATS_SOAK_LIBRARY_KEYS`
/// keys (2,000), TTL `DAGNATS_SOAK_LIBRARY_TTL_MS` (15 s; the library renews every
/// ttl/3), for `DAGNATS_SOAK_SECS`. Once every shard is held, any step-down is a
/// lost lease (expected: none), and every shard is still held at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_library_members_keep_every_shard() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let keys = env("DAGNATS_SOAK_LIBRARY_KEYS", 2_000) as usize;
    let members = env("DAGNATS_SOAK_MEMBERS", 4) as usize;
    let secs = env("DAGNATS_SOAK_SECS", 25);
    let ttl_ms = env("DAGNATS_SOAK_LIBRARY_TTL_MS", 15_000);
    let ttl = Duration::from_millis(ttl_ms);

    let server = NatsServer::builder().sync_always(true).start();
    let svc_client = async_nats::connect(server.url()).await.expect("connect");
    let svc = service::start((server.url(), svc_client), ServiceOptions::default())
        .await
        .expect("service starts");
    let counter = Arc::new(RenewCounter::default());
    let mut sets = Vec::new();
    for m in 0..members {
        let client = load::connect(&[server.url()]).await;
        let member = Member::new(client, format!("soak-member-{m}"))
            .expect("a valid holder id")
            .with_observer(counter.clone());
        let mine: Vec<String> = (m..keys)
            .step_by(members)
            .map(|k| format!("lib-{k}"))
            .collect();
        let refs: Vec<&str> = mine.iter().map(String::as_str).collect();
        let shards = member.shards(&refs, mine.len(), ttl).expect("a valid set");
        sets.push((member, shards, mine.len()));
    }
    // Every shard held: each member's changes until it holds its whole share.
    let acquire_by = Instant::now() + Duration::from_secs(60);
    for (_, shards, share) in sets.iter_mut() {
        while shards.held().len() < *share {
            let change = tokio::time::timeout_at(acquire_by.into(), shards.next())
                .await
                .expect("every shard held within 60 s")
                .expect("the set runs");
            assert!(
                matches!(change.ownership, Ownership::Elected { .. }),
                "a step-down before every shard was held: {change:?}"
            );
        }
    }
    let started = Instant::now();
    // Latency from here on: the steady state, not the burst of confirming renewals
    // that follows the grants of every shard at once.
    let renewals_before = counter.renewals.load(Ordering::Relaxed);
    let burst = std::mem::take(&mut *counter.latencies.lock().unwrap());
    // Then, for the soak's time, any change is a lost shard.
    let mut lost = Vec::new();
    let end = started + Duration::from_secs(secs);
    let changes = futures::future::join_all(sets.iter_mut().map(|(_, shards, _)| async {
        let mut seen = Vec::new();
        while let Ok(Some(change)) = tokio::time::timeout_at(end.into(), shards.next()).await {
            seen.push(change);
        }
        seen
    }))
    .await;
    for seen in changes {
        lost.extend(
            seen.into_iter()
                .filter(|c| !matches!(c.ownership, Ownership::Elected { .. })),
        );
    }
    let held: usize = sets.iter().map(|(_, s, _)| s.held().len()).sum();
    let elapsed = started.elapsed();
    let renewals = counter.renewals.load(Ordering::Relaxed) - renewals_before;
    let mut lat = std::mem::take(&mut *counter.latencies.lock().unwrap());
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i] as f64 / 1000.0
    };
    println!(
        "soak: library: {keys} shards over {members} members held, ttl {} s, {:.0} s: \
         {renewals} renewals ({:.0}/s), lost {}, retried {}, renew latency p50 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms; {held} held at the end ({} renewals while \
         acquiring, max {:.2} ms)",
        ttl_ms / 1000,
        elapsed.as_secs_f64(),
        renewals as f64 / elapsed.as_secs_f64(),
        lost.len(),
        counter.retried.load(Ordering::Relaxed),
        pct(0.50),
        pct(0.99),
        pct(1.0),
        burst.len(),
        burst.iter().max().copied().unwrap_or(0) as f64 / 1000.0,
    );
    assert!(lost.is_empty(), "shards lost during the soak: {lost:?}");
    assert_eq!(held, keys, "every shard still held");
    assert!(renewals > 0, "no renewal in {secs} s");
    for (_, shards, _) in sets {
        shards.stop().await;
    }
    svc.shutdown().await;
}
