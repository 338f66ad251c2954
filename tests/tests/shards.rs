//! The sharded bucket (`serve --shards N`) on a real nats-server: every call works
//! with three shards, each key lives in its own shard's stream only, change events
//! come on the same client subjects from every shard, fences grow per key, each
//! shard has its own expiry markers and read-confirmation subject, and a service
//! started with another count than the bucket's refuses to start.

mod common;

use std::collections::BTreeSet;

use common::*;
use dagnats_leases_core::shard::ShardMap;
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::service::{self, ServiceOptions};
use serde_json::{Value, json};

fn three() -> ShardMap {
    ShardMap::new(3).unwrap()
}

fn with_shards(shards: ShardMap) -> ServiceOptions {
    ServiceOptions {
        shards,
        ..ServiceOptions::default()
    }
}

/// Keys enough to land in every one of `shards`, at least two per shard.
fn keys_over(shards: ShardMap) -> Vec<String> {
    let mut keys = Vec::new();
    let mut per = vec![0; shards.count() as usize];
    for n in 0.. {
        let key = format!("sk-{n}");
        let i = shards.shard_of(&key) as usize;
        if per[i] < 2 {
            per[i] += 1;
            keys.push(key);
        }
        if per.iter().all(|&c| c == 2) {
            break;
        }
    }
    keys
}

async fn js_api(client: &async_nats::Client, subject: &str, body: Value) -> Value {
    let reply = client
        .request(subject.to_string(), body.to_string().into())
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    serde_json::from_slice(&reply.payload).unwrap()
}

/// The last message of `subject` in `stream`, or `None` when the stream has none.
async fn last_in(client: &async_nats::Client, stream: &str, subject: &str) -> Option<Value> {
    let v = js_api(
        client,
        &format!("$JS.API.STREAM.MSG.GET.{stream}"),
        json!({"last_by_subj": subject}),
    )
    .await;
    v.get("message").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_shards_serve_every_call_each_key_in_its_own_stream() {
    let shards = three();
    let fx = Fx::on_with(NatsServer::start(), with_shards(shards)).await;
    let keys = keys_over(shards);
    let mut events = fx
        .client
        .subscribe("dagnats.lease.changed.>")
        .await
        .unwrap();
    fx.client.flush().await.unwrap();
    for i in shards.indexes() {
        let info = js_api(
            &fx.client,
            &format!("$JS.API.STREAM.INFO.{}", shards.stream(i)),
            json!({}),
        )
        .await;
        let config = &info["config"];
        assert_eq!(config["subjects"], json!([format!("$KV.leases_{i}.>")]));
        assert_eq!(config["metadata"]["dagnats_shards"], "3", "{info}");
        assert_eq!(config["metadata"]["dagnats_shard"], i.to_string());
        assert_eq!(config["allow_msg_ttl"], true);
        assert!(config["subject_delete_marker_ttl"].as_u64().unwrap() > 0);
        assert_eq!(
            config["republish"]["dest"], "dagnats.lease.changed.{{wildcard(1)}}",
            "every shard republishes to the one client subject"
        );
    }
    assert!(
        js_api(&fx.client, "$JS.API.STREAM.INFO.KV_leases", json!({}))
            .await
            .get("error")
            .is_some(),
        "no one-stream bucket beside the shards"
    );
    for key in &keys {
        let a = fx.acquire(key, "h1", 10_000).await;
        assert_eq!(a["granted"], true, "{key}: {a}");
        let rev = a["revision"].as_u64().unwrap();
        // The key is stored in its shard's stream, and in no other.
        let mine = shards.shard_of(key);
        for i in shards.indexes() {
            let found = last_in(
                &fx.client,
                &shards.stream(i),
                &format!("$KV.leases_{i}.{key}"),
            )
            .await;
            assert_eq!(found.is_some(), i == mine, "{key} in shard {i}");
        }
        // Its change event comes on the client subject as before.
        let ev = next_within(&mut events, 5).await;
        assert_eq!(ev.subject.as_str(), format!("dagnats.lease.changed.{key}"));
        let h = ev.headers.unwrap();
        assert_eq!(h.get("Nats-Sequence").unwrap().as_str(), rev.to_string());
        assert_eq!(
            h.get("Nats-Stream").unwrap().as_str(),
            shards.stream(mine),
            "republished by the key's own stream"
        );
        // Owner, renew, forward and release, each on the key's shard.
        let o = fx.owner(key).await;
        assert_eq!(
            (o["holder"].as_str(), o["revision"].as_u64()),
            (Some("h1"), Some(rev))
        );
        let r = fx
            .call(
                "renew",
                json!({"key": key, "holder": "h1", "revision": rev, "ttl_ms": 10_000}),
            )
            .await;
        assert_eq!(kind(&r), "", "{r}");
        let renewed = r["revision"].as_u64().unwrap();
        assert!(renewed > rev);
        let _ = next_within(&mut events, 5).await;
        let f = fx
            .call(
                "forward",
                json!({"key": key, "payload": "", "timeout_ms": 500}),
            )
            .await;
        assert_eq!(
            kind(&f),
            "owner_unavailable",
            "the holder has no inbox: {f}"
        );
        assert_eq!(f["revision"].as_u64(), Some(renewed));
        let released = fx
            .call(
                "release",
                json!({"key": key, "holder": "h1", "revision": renewed}),
            )
            .await;
        assert_eq!(kind(&released), "", "{released}");
        let _ = next_within(&mut events, 5).await;
        // The fence of the next acquire is above every earlier one of the key.
        let again = fx.acquire(key, "h2", 10_000).await;
        assert_eq!(again["granted"], true, "{again}");
        assert!(
            again["revision"].as_u64().unwrap() > renewed,
            "{key}: {again}"
        );
        let _ = next_within(&mut events, 5).await;
    }
}

/// Each shard's stream takes a read confirmation of its own keys on
/// `$KV.leases_<i>.<key>.read`, checked against the key's revision, and never
/// republishes it; each shard's stream writes its own expiry markers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shard_has_its_own_confirm_subject_and_expiry_markers() {
    let shards = three();
    let fx = Fx::on_with(NatsServer::start(), with_shards(shards)).await;
    let mut events = fx
        .client
        .subscribe("dagnats.lease.changed.>")
        .await
        .unwrap();
    fx.client.flush().await.unwrap();
    let mut seen = BTreeSet::new();
    for key in keys_over(shards).iter().step_by(2) {
        let a = fx.acquire(key, "h1", 1_000).await;
        assert_eq!(a["granted"], true, "{a}");
        let rev = a["revision"].as_u64().unwrap();
        let _granted = next_within(&mut events, 5).await;
        let confirm = |expected: u64| {
            let mut h = async_nats::HeaderMap::new();
            h.insert(
                "Nats-Expected-Last-Subject-Sequence",
                expected.to_string().as_str(),
            );
            h.insert(
                "Nats-Expected-Last-Subject-Sequence-Subject",
                shards.kv_subject(key).as_str(),
            );
            h.insert("Nats-TTL", "1s");
            h
        };
        let ok = fx
            .client
            .request_with_headers(shards.confirm_subject(key), confirm(rev), "".into())
            .await
            .unwrap();
        let ack: Value = serde_json::from_slice(&ok.payload).unwrap();
        assert_eq!(ack["stream"], shards.stream_of(key), "{ack}");
        let stale = fx
            .client
            .request_with_headers(shards.confirm_subject(key), confirm(rev - 1), "".into())
            .await
            .unwrap();
        let nack: Value = serde_json::from_slice(&stale.payload).unwrap();
        assert!(
            nack.get("error").is_some(),
            "a stale confirmation is refused: {nack}"
        );
        // The lease runs out: the next event on its subject is the expiry marker
        // of its own stream (a confirmation is never republished).
        let marker = next_within(&mut events, 10).await;
        assert_eq!(
            marker.subject.as_str(),
            format!("dagnats.lease.changed.{key}")
        );
        let h = marker.headers.unwrap();
        assert!(h.get("Nats-Marker-Reason").is_some(), "{h:?}");
        assert_eq!(
            h.get("Nats-Stream").unwrap().as_str(),
            shards.stream_of(key)
        );
        seen.insert(shards.shard_of(key));
    }
    assert_eq!(seen.len(), 3, "every shard confirmed and expired a key");
}

/// The bucket keeps the count it was made with: started again with another
/// `--shards` (fewer, more, or one), the service refuses with a sentence naming
/// `--shards`; started with its own count it serves on, fences above the old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_shard_count_is_refused_and_fences_carry_on() {
    let server = NatsServer::start();
    let fx = Fx::on_with(server, with_shards(three())).await;
    let first = fx.acquire("carry", "h1", 60_000).await;
    let rev = first["revision"].as_u64().unwrap();
    let Fx {
        server,
        client,
        service,
    } = fx;
    service.unwrap().stop().await;
    for count in [1, 2, 4] {
        let options = with_shards(ShardMap::new(count).unwrap());
        let refused = service::start(connect(&server).await, options)
            .await
            .err()
            .unwrap_or_else(|| panic!("--shards {count} over a bucket of 3 started"));
        let why = refused.to_string();
        assert!(why.contains(&format!("--shards {count}")), "{why}");
    }
    let back = start_service_with(&server, with_shards(three())).await;
    let o = call_raw(
        &client,
        "owner",
        json!({"key": "carry"}).to_string().into_bytes(),
    )
    .await;
    assert_eq!(
        o["revision"].as_u64(),
        Some(rev),
        "the lease is where it was: {o}"
    );
    let r = call_raw(
        &client,
        "release",
        json!({"key": "carry", "holder": "h1", "revision": rev})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(kind(&r), "", "{r}");
    let a = call_raw(
        &client,
        "acquire",
        json!({"key": "carry", "holder": "h2", "ttl_ms": 1000})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert!(a["revision"].as_u64().unwrap() > rev, "{a}");
    back.stop().await;

    // And the other way: a one-stream bucket refuses any count but one.
    let single = NatsServer::start();
    let one = service::start(connect(&single).await, ServiceOptions::default())
        .await
        .expect("one shard starts");
    one.shutdown().await;
    let refused = service::start(connect(&single).await, with_shards(three()))
        .await
        .expect_err("--shards 3 over a one-stream bucket started");
    assert!(refused.to_string().contains("--shards 3"), "{refused}");
}
