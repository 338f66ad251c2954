//! Churn leaves nothing: fresh keys acquired and released many at a time leave an
//! empty stream (the tombstone sweep keeps up, and what it misses a scan finds),
//! and a service killed in the middle of churn leaves an empty stream after its
//! next start (the scan at start). One-stream and sharded buckets, against a real
//! nats-server. Each test prints a `churn:` line.

mod common;

use std::time::Duration;

use async_nats::Client;
use common::connect;
use dagnats_leases_core::shard::ShardMap;
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::service::{self, BucketOptions, ServiceConfig, ServiceOptions};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::watch;

/// How long the stream may take to empty once the churn is over.
const EMPTY_WITHIN: Duration = Duration::from_secs(30);

/// A lease call; `None` when no reply came (a killed service).
async fn call(client: &Client, endpoint: &str, body: Value) -> Option<Value> {
    let subject = format!("{}.{endpoint}", dagnats_leases_core::subjects::API_PREFIX);
    let reply = client
        .request(subject, body.to_string().into())
        .await
        .ok()?;
    serde_json::from_slice(&reply.payload).ok()
}

/// Acquires and releases `count` fresh keys named `prefix-<i>`, `in_flight` pairs
/// at a time, each lease for `ttl_ms`; `done` counts the pairs answered. With
/// `strict`, every call must be granted and released.
async fn churn(
    client: Client,
    prefix: &str,
    count: usize,
    in_flight: usize,
    ttl_ms: u64,
    strict: bool,
    done: watch::Sender<usize>,
) {
    let done = &done;
    futures::stream::iter(0..count)
        .map(|i| {
            let client = client.clone();
            let key = format!("{prefix}-{i}");
            async move {
                let a = call(
                    &client,
                    "acquire",
                    json!({"key": key, "holder": "churner", "ttl_ms": ttl_ms}),
                )
                .await;
                let granted = a.as_ref().is_some_and(|a| a["granted"] == true);
                assert!(!strict || granted, "{key}: {a:?}");
                if !granted {
                    return;
                }
                let a = a.unwrap();
                let r = call(
                    &client,
                    "release",
                    json!({"key": key, "holder": "churner", "revision": a["revision"]}),
                )
                .await;
                let released = r.as_ref().is_some_and(|r| r["released"] == true);
                assert!(!strict || released, "{key}: {r:?}");
                done.send_modify(|n| *n += 1);
            }
        })
        .buffer_unordered(in_flight)
        .collect::<Vec<()>>()
        .await;
}

/// Messages in the bucket's streams, as the server reports them.
async fn messages(client: &Client, shards: ShardMap) -> u64 {
    let mut total = 0;
    for i in shards.indexes() {
        let subject = format!("$JS.API.STREAM.INFO.{}", shards.stream(i));
        let info = client
            .request(subject, "{}".into())
            .await
            .expect("stream info");
        let info: Value = serde_json::from_slice(&info.payload).unwrap();
        total += info["state"]["messages"].as_u64().expect("messages");
    }
    total
}

/// Polls the streams' message count until it is 0, at most [`EMPTY_WITHIN`]; the
/// count left when it gives up.
async fn until_empty(client: &Client, shards: ShardMap) -> Result<Duration, u64> {
    let start = tokio::time::Instant::now();
    loop {
        let n = messages(client, shards).await;
        if n == 0 {
            return Ok(start.elapsed());
        }
        if start.elapsed() > EMPTY_WITHIN {
            return Err(n);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn options(shards: ShardMap) -> ServiceOptions {
    ServiceOptions::from(ServiceConfig {
        bucket: BucketOptions {
            shards,
            ..BucketOptions::default()
        },
        ..ServiceConfig::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nine_thousand_fresh_keys_churned_128_at_a_time_leave_an_empty_stream() {
    let server = NatsServer::start();
    let shards = ShardMap::SINGLE;
    let svc = service::start((server.url(), connect(&server).await), options(shards))
        .await
        .expect("service starts");
    let client = connect(&server).await;
    let (done, count) = watch::channel(0);
    let pairs = 9_000;
    let began = std::time::Instant::now();
    churn(client.clone(), "fresh", pairs, 128, 60_000, true, done).await;
    let took = began.elapsed();
    assert_eq!(*count.borrow(), pairs);
    let left = until_empty(&client, shards).await;
    println!(
        "churn: {pairs} acquire+release pairs of fresh keys at 128 in flight ({:.0} pairs/s) \
         leave {} messages in KV_leases ({})",
        pairs as f64 / took.as_secs_f64(),
        left.as_ref().map_or_else(|n| *n, |_| 0),
        match &left {
            Ok(t) => format!("empty {:.1} s after the last reply", t.as_secs_f64()),
            Err(_) => format!("after waiting {EMPTY_WITHIN:?}"),
        }
    );
    assert!(left.is_ok(), "tombstones left after the churn");
    svc.shutdown().await;
}

/// The service is killed (its task aborted: no stop, no purge after) after
/// `before` pairs of a churn at 128 in flight; the leases of the pairs cut in half
/// expire (1 s). A new service on the same bucket empties it.
async fn killed_mid_churn_then_started_again(shards: ShardMap, before: usize) {
    let server = NatsServer::start();
    let svc = service::start((server.url(), connect(&server).await), options(shards))
        .await
        .expect("service starts");
    let client = connect(&server).await;
    let (done, mut count) = watch::channel(0);
    let churner = tokio::spawn(churn(
        client.clone(),
        "killed",
        100_000,
        128,
        1_000,
        false,
        done,
    ));
    count
        .wait_for(|n| *n >= before)
        .await
        .expect("the churn runs");
    // Dropping the handle aborts the serving task: no graceful stop.
    drop(svc);
    churner.abort();
    let _ = churner.await;
    let at_kill = messages(&client, shards).await;
    let svc = service::start((server.url(), connect(&server).await), options(shards))
        .await
        .expect("service starts again");
    let left = until_empty(&client, shards).await;
    println!(
        "churn: a service killed after {before} pairs at 128 in flight ({} shards) left \
         {at_kill} messages; after its next start {} ({})",
        shards.count(),
        left.as_ref().map_or_else(|n| *n, |_| 0),
        match &left {
            Ok(t) => format!("empty within {:.1} s", t.as_secs_f64()),
            Err(_) => format!("after waiting {EMPTY_WITHIN:?}"),
        }
    );
    assert!(left.is_ok(), "tombstones left after the restart");
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_killed_mid_churn_leaves_an_empty_stream_after_its_next_start() {
    killed_mid_churn_then_started_again(ShardMap::SINGLE, 2_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_service_killed_mid_churn_leaves_empty_streams_after_its_next_start() {
    killed_mid_churn_then_started_again(ShardMap::new(3).unwrap(), 2_000).await;
}
