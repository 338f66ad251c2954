//! Read confirmation on real servers: on a three-replica bucket every read a call
//! answers from is confirmed by a conditional write to `$KV.leases.<key>.read`;
//! those writes (and their expiry markers) never become change events and leave
//! nothing behind; a single replica confirms nothing; an older bucket's RePublish
//! source is migrated; and the service follows the stream's replicas. With
//! `DAGNATS_TEST_SHARDS` the same runs on a sharded bucket: each key's
//! confirmations go to its own shard's stream.

mod common;

use std::time::Duration;

use async_nats::Client;
use common::{
    acquire_all_at_once, call_raw, has_atomic_batches, kind, next_within, stored_by_a_batch,
    test_shards,
};
use dagnats_leases_tests::{NatsCluster, NatsServer};
use dagnats_leases_tokio::service::{
    self, BucketOptions, ServiceConfig, ServiceHandle, ServiceOptions,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

async fn client(url: String) -> Client {
    async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(10)))
        .connect(url)
        .await
        .expect("connect")
}

async fn call(client: &Client, endpoint: &str, body: Value) -> Value {
    call_raw(client, endpoint, body.to_string().into_bytes()).await
}

/// The info of the stream that holds `key`.
async fn stream_info(client: &Client, key: &str, subjects_filter: &str) -> Value {
    stream_info_of(client, &test_shards().stream_of(key), subjects_filter).await
}

async fn stream_info_of(client: &Client, stream: &str, subjects_filter: &str) -> Value {
    let reply = client
        .request(
            format!("$JS.API.STREAM.INFO.{stream}"),
            json!({ "subjects_filter": subjects_filter })
                .to_string()
                .into(),
        )
        .await
        .expect("stream info");
    serde_json::from_slice(&reply.payload).expect("JSON")
}

/// The bucket's last sequences, summed over every shard's stream: it grows by one
/// per message stored anywhere in the bucket.
async fn last_seq(client: &Client) -> u64 {
    let shards = test_shards();
    let mut sum = 0;
    for i in shards.indexes() {
        sum += stream_info_of(client, &shards.stream(i), "")
            .await
            .pointer("/state/last_seq")
            .and_then(Value::as_u64)
            .expect("last_seq");
    }
    sum
}

/// The subjects the bucket's streams hold messages on now.
async fn subjects(client: &Client) -> Vec<String> {
    let shards = test_shards();
    let mut all: Vec<String> = Vec::new();
    for i in shards.indexes() {
        let info = stream_info_of(client, &shards.stream(i), &shards.stream_subjects(i)).await;
        all.extend(
            info.pointer("/state/subjects")
                .and_then(Value::as_object)
                .map(|m| m.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default(),
        );
    }
    all.sort();
    all
}

/// Polls `cond` every 50 ms until it holds, failing after [`WAIT`].
async fn until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The service with `options`, on `DAGNATS_TEST_SHARDS` shards.
async fn start_service(url: String, options: ServiceOptions) -> ServiceHandle {
    let mut options = options;
    options.bucket.shards = test_shards();
    service::start((url.clone(), client(url).await), options)
        .await
        .expect("service starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_bucket_confirms_reads_and_they_never_become_events() {
    let cluster = tokio::task::spawn_blocking(NatsCluster::start)
        .await
        .unwrap();
    let options = ServiceOptions::from(ServiceConfig {
        bucket: BucketOptions {
            replicas: Some(3),
            ..BucketOptions::default()
        },
        ..ServiceConfig::default()
    });
    let svc = start_service(cluster.url(0), options).await;
    let c = client(cluster.url(0)).await;
    let mut events = c.subscribe("dagnats.lease.changed.>").await.unwrap();
    c.flush().await.unwrap();

    let got = call(
        &c,
        "acquire",
        json!({"key": "k", "holder": "a", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(got["granted"], true, "{got}");
    let rev = got["revision"].as_u64().unwrap();
    let first = next_within(&mut events, 10).await;
    assert_eq!(first.subject.as_str(), "dagnats.lease.changed.k");

    // Each of these answers from a read, so each writes one confirmation.
    let before = last_seq(&c).await;
    let owner = call(&c, "owner", json!({"key": "k"})).await;
    assert_eq!(
        (owner["holder"].as_str(), owner["revision"].as_u64()),
        (Some("a"), Some(rev))
    );
    let other = call(
        &c,
        "acquire",
        json!({"key": "k", "holder": "b", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(
        (other["granted"].as_bool(), other["holder"].as_str()),
        (Some(false), Some("a"))
    );
    let repeat = call(
        &c,
        "acquire",
        json!({"key": "k", "holder": "a", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(
        (repeat["granted"].as_bool(), repeat["revision"].as_u64()),
        (Some(true), Some(rev))
    );
    let stale = call(
        &c,
        "renew",
        json!({"key": "k", "holder": "a", "revision": rev + 100}),
    )
    .await;
    assert_eq!(kind(&stale), "fence_mismatch", "{stale}");
    let lost = call(
        &c,
        "release",
        json!({"key": "k", "holder": "b", "revision": rev}),
    )
    .await;
    assert_eq!(kind(&lost), "lost", "{lost}");
    // A key never written: confirmed against sequence 0.
    let free = call(&c, "owner", json!({"key": "never"})).await;
    assert_eq!(free, json!({"held": false, "key": "never"}));
    let not_held = call(
        &c,
        "forward",
        json!({"key": "never", "payload": "aGk=", "timeout_ms": 1000}),
    )
    .await;
    assert_eq!(kind(&not_held), "not_held", "{not_held}");
    let confirmations = last_seq(&c).await - before;
    assert_eq!(
        confirmations, 7,
        "one confirmation per call answered from a read"
    );
    let held = subjects(&c).await;
    let shards = test_shards();
    assert!(held.contains(&shards.confirm_subject("k")), "{held:?}");
    assert!(held.contains(&shards.confirm_subject("never")), "{held:?}");
    println!(
        "read confirm: 7 calls answered from reads wrote {confirmations} confirmations; subjects {held:?}"
    );

    // They do not pile up: each expires (1 s) and its marker expires in turn.
    until("the confirmations and their markers are gone", || async {
        subjects(&c).await == [test_shards().kv_subject("k")]
    })
    .await;
    // A write after that: its event is the next one, so no confirmation or marker
    // was republished in between.
    let got = call(
        &c,
        "acquire",
        json!({"key": "k2", "holder": "a", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(got["granted"], true, "{got}");
    let next = next_within(&mut events, 10).await;
    assert_eq!(next.subject.as_str(), "dagnats.lease.changed.k2");
    svc.shutdown().await;
}

/// `auto` gathers a replicated bucket's writes into atomic batches too, but only
/// past its wider window: 64 writes at once all go alone with the defaults, and
/// with the window narrowed to one single (batches from two) writes at once go
/// partly in batches, each with its own answer; so do the read confirmations of
/// owner calls at once, each answered with its key's holder and revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_bucket_batches_writes_only_past_its_window() {
    let cluster = tokio::task::spawn_blocking(NatsCluster::start)
        .await
        .unwrap();
    let replicated = |batch_after, min_batch| {
        ServiceOptions::from(ServiceConfig {
            bucket: BucketOptions {
                replicas: Some(3),
                ..BucketOptions::default()
            },
            batch_after,
            min_batch,
            ..ServiceConfig::default()
        })
    };
    let c = client(cluster.url(0)).await;
    let window = dagnats_leases_core::service::coalesce::DEFAULT_REPLICATED_SINGLE_WINDOW;
    let svc = start_service(cluster.url(0), replicated(None, 2)).await;
    let alone: Vec<String> = (0..window).map(|i| format!("alone-{i}")).collect();
    acquire_all_at_once(&c, &alone, 30_000).await;
    assert_eq!(stored_by_a_batch(&c, &alone).await, 0);
    svc.shutdown().await;

    let svc = start_service(cluster.url(0), replicated(Some(1), 2)).await;
    let gathered: Vec<String> = (0..48).map(|i| format!("gathered-{i}")).collect();
    let acquired = acquire_all_at_once(&c, &gathered, 30_000).await;
    let batched = stored_by_a_batch(&c, &gathered).await;
    if has_atomic_batches(&c) {
        assert!(batched > 0, "no write of 48 went in a batch");
    } else {
        assert_eq!(batched, 0, "a batch on a server without atomic batches");
    }
    let before = last_seq(&c).await;
    let owners = futures::future::join_all(
        gathered
            .iter()
            .map(|k| call(&c, "owner", json!({ "key": k }))),
    )
    .await;
    for ((k, owner), acquired) in gathered.iter().zip(&owners).zip(&acquired) {
        assert_eq!(
            (owner["holder"].as_str(), owner["revision"].as_u64()),
            (Some("h"), acquired["revision"].as_u64()),
            "{k}: {owner}"
        );
    }
    // Each was confirmed (their expiry markers may follow within the second).
    let written = last_seq(&c).await - before;
    assert!(written >= 48, "{written} writes for 48 owner calls");
    println!("read confirm: {batched} of 48 acquires on three nodes stored by a batch");
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_replica_bucket_answers_reads_without_writing() {
    let server = NatsServer::start();
    let svc = start_service(server.url(), ServiceOptions::default()).await;
    let c = client(server.url()).await;
    let got = call(
        &c,
        "acquire",
        json!({"key": "k", "holder": "a", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(got["granted"], true, "{got}");
    let before = last_seq(&c).await;
    call(&c, "owner", json!({"key": "k"})).await;
    call(&c, "owner", json!({"key": "never"})).await;
    call(
        &c,
        "acquire",
        json!({"key": "k", "holder": "b", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(
        last_seq(&c).await,
        before,
        "R1 has no other leader: nothing to confirm"
    );
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_buckets_republish_source_is_migrated() {
    let server = NatsServer::start();
    let c = client(server.url()).await;
    // The bucket as the service made it before read confirmation (with shards,
    // shard 0's stream so, and a key of that shard).
    let shards = test_shards();
    let key = (0..)
        .map(|n| {
            if n == 0 {
                "x".to_string()
            } else {
                format!("x{n}")
            }
        })
        .find(|k| shards.shard_of(k) == 0)
        .unwrap();
    let mut old = dagnats_leases_core::service::bucket::shard_stream_config(&shards, 0, 1);
    old["republish"] = json!({"src": shards.stream_subjects(0), "dest": "dagnats.lease.changed.>"});
    let made = c
        .request(
            format!("$JS.API.STREAM.CREATE.{}", shards.stream(0)),
            old.to_string().into(),
        )
        .await
        .unwrap();
    let made: Value = serde_json::from_slice(&made.payload).unwrap();
    assert_eq!(
        made["config"]["republish"]["src"],
        shards.stream_subjects(0),
        "{made}"
    );

    let svc = start_service(server.url(), ServiceOptions::default()).await;
    let info = stream_info(&c, &key, "").await;
    assert_eq!(
        info["config"]["republish"],
        json!({"src": shards.lease_subjects(0), "dest": "dagnats.lease.changed.{{wildcard(1)}}"})
    );
    // A message on a confirmation subject is not republished; a lease write is.
    let mut events = c.subscribe("dagnats.lease.changed.>").await.unwrap();
    c.flush().await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-TTL", "1s");
    c.request_with_headers(shards.confirm_subject(&key), headers, "".into())
        .await
        .unwrap();
    let got = call(
        &c,
        "acquire",
        json!({"key": key, "holder": "a", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(got["granted"], true, "{got}");
    let next = next_within(&mut events, 10).await;
    assert_eq!(
        next.subject.as_str(),
        format!("dagnats.lease.changed.{key}")
    );
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmation_follows_the_streams_replicas() {
    let cluster = tokio::task::spawn_blocking(NatsCluster::start)
        .await
        .unwrap();
    let options = ServiceOptions::from(ServiceConfig {
        replicas_recheck: Duration::from_millis(200),
        ..ServiceConfig::default()
    });
    let svc = start_service(cluster.url(0), options).await;
    let c = client(cluster.url(0)).await;
    call(
        &c,
        "acquire",
        json!({"key": "k", "holder": "a", "ttl_ms": 30_000}),
    )
    .await;
    let before = last_seq(&c).await;
    call(&c, "owner", json!({"key": "k"})).await;
    assert_eq!(last_seq(&c).await, before, "an R1 bucket confirms nothing");

    // The operator scales the stream (with shards: the key's) to three replicas.
    let mut config = stream_info(&c, "k", "").await["config"].clone();
    config["num_replicas"] = json!(3);
    let updated = c
        .request(
            format!("$JS.API.STREAM.UPDATE.{}", test_shards().stream_of("k")),
            config.to_string().into(),
        )
        .await
        .unwrap();
    let updated: Value = serde_json::from_slice(&updated.payload).unwrap();
    assert_eq!(updated["config"]["num_replicas"], 3, "{updated}");
    until("owner reads are confirmed on the R3 stream", || async {
        let before = last_seq(&c).await;
        let owner = call(&c, "owner", json!({"key": "k"})).await;
        owner["holder"] == "a" && last_seq(&c).await > before
    })
    .await;
    svc.shutdown().await;
}
