//! The sharded bucket (`serve --shards N`) on a real nats-server: every call works
//! with three shards, each key lives in its own shard's stream only, change events
//! come on the same client subjects from every shard, fences grow per key, each
//! shard has its own expiry markers and read-confirmation subject, and a service
//! started with another count than the bucket's refuses to start.

mod common;

use std::collections::BTreeSet;

use common::*;
use dagnats_leases_core::shard::ShardMap;
use dagnats_leases_tests::{Binary, NatsServer};
use dagnats_leases_tokio::service::{self, BucketOptions, ServiceConfig, ServiceOptions};
use serde_json::{Value, json};

fn three() -> ShardMap {
    ShardMap::new(3).unwrap()
}

fn with_shards(shards: ShardMap) -> ServiceOptions {
    ServiceOptions::from(ServiceConfig {
        bucket: BucketOptions {
            shards,
            ..BucketOptions::default()
        },
        ..ServiceConfig::default()
    })
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
        let mut subjects = vec![format!("$KV.leases_{i}.>")];
        if i == 0 {
            subjects.push("$KV.leases.~sharded".to_string());
        }
        assert_eq!(config["subjects"], json!(subjects));
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
        let refused = service::start((server.url(), connect(&server).await), options)
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
    let one = service::start(
        (single.url(), connect(&single).await),
        ServiceOptions::default(),
    )
    .await
    .expect("one shard starts");
    one.shutdown().await;
    let refused = service::start((single.url(), connect(&single).await), with_shards(three()))
        .await
        .expect_err("--shards 3 over a one-stream bucket started");
    assert!(refused.to_string().contains("--shards 3"), "{refused}");
}

/// Two layouts never both serve: shard 0 of a sharded bucket also stores
/// `$KV.leases.~sharded`, inside the one-stream layout's `$KV.leases.>`, so the
/// server refuses whichever is created second (JetStream 10065), in either order,
/// on the newest and the oldest supported server. Two services started at once
/// with `--shards 1` and `--shards 3` on an empty server: at most one starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layouts_created_at_once_never_both_serve() {
    use dagnats_leases_core::service::startup::shard_stream_config;
    let single = shard_stream_config(&ShardMap::SINGLE, 0, 1);
    let sharded = shard_stream_config(&three(), 0, 1);
    for binary in [Binary::Supported, Binary::Oldest] {
        for (first, second) in [(&single, &sharded), (&sharded, &single)] {
            let server = NatsServer::builder().binary(binary.clone()).start();
            let client = connect(&server).await;
            let create = |config: &Value| {
                format!("$JS.API.STREAM.CREATE.{}", config["name"].as_str().unwrap())
            };
            let made = js_api(&client, &create(first), first.clone()).await;
            assert!(made.get("error").is_none(), "{made}");
            let refused = js_api(&client, &create(second), second.clone()).await;
            assert_eq!(
                refused["error"]["err_code"], 10065,
                "{binary:?}, {} after {}: {refused}",
                second["name"], first["name"]
            );
        }
    }

    let server = NatsServer::start();
    let (one, sharded) = tokio::join!(
        service::start(
            (server.url(), connect(&server).await),
            ServiceOptions::default()
        ),
        service::start((server.url(), connect(&server).await), with_shards(three())),
    );
    // Two creates at the same moment can both pass a single server's overlap
    // check: then each asks for the other layout after its shard 0 is there,
    // and the later to ask refuses (maybe both). Never do both serve.
    let started = [one.is_ok(), sharded.is_ok()];
    assert!(started.iter().filter(|s| **s).count() <= 1, "{started:?}");
    let why = one
        .as_ref()
        .err()
        .or(sharded.as_ref().err())
        .unwrap()
        .to_string();
    assert!(why.contains("--shards"), "{why}");
    for s in [one, sharded].into_iter().flatten() {
        s.shutdown().await;
    }
}

/// A sharded bucket made before the guard subject: started, the service adds
/// `$KV.leases.~sharded` to shard 0, and from then on the server refuses
/// `KV_leases` beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_0_made_before_the_guard_subject_gets_it() {
    use dagnats_leases_core::service::startup::shard_stream_config;
    let server = NatsServer::start();
    let client = connect(&server).await;
    let mut old = shard_stream_config(&three(), 0, 1);
    old["subjects"] = json!(["$KV.leases_0.>"]);
    let made = js_api(&client, "$JS.API.STREAM.CREATE.KV_leases_0", old).await;
    assert!(made.get("error").is_none(), "{made}");
    let svc = service::start((server.url(), connect(&server).await), with_shards(three()))
        .await
        .expect("the sharded bucket serves");
    let info = js_api(&client, "$JS.API.STREAM.INFO.KV_leases_0", json!({})).await;
    assert_eq!(
        info["config"]["subjects"],
        json!(["$KV.leases_0.>", "$KV.leases.~sharded"]),
        "{info}"
    );
    let single = shard_stream_config(&ShardMap::SINGLE, 0, 1);
    let refused = js_api(&client, "$JS.API.STREAM.CREATE.KV_leases", single).await;
    assert_eq!(refused["error"]["err_code"], 10065, "{refused}");
    svc.shutdown().await;
}
