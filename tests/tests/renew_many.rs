//! `api.leases.renew_many` against a real nats-server: each item renewed by its own
//! conditional write with its own new fence, a lost item beside renewed ones, the
//! endpoint advertised in `$SRV.INFO`; and a service with it off is one of the five
//! endpoints alone (no responders there, not advertised).

mod common;

use std::time::Duration;

use common::{Fx, kind};
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::service::{ServiceConfig, ServiceOptions};
use futures::FutureExt as _;
use serde_json::{Value, json};

async fn info(fx: &Fx) -> Vec<u8> {
    fx.client
        .request("$SRV.INFO.dagnats-api", "".into())
        .await
        .expect("$SRV.INFO answered")
        .payload
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_renew_renews_each_key_with_its_own_fence_and_a_lost_one_beside_them() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let fx = Fx::on(server).await;
    assert!(dagnats_leases_core::service::micro::advertises_renew_many(
        &info(&fx).await
    ));
    let mut fences = Vec::new();
    for (key, holder) in [("a", "h"), ("b", "h"), ("c", "other")] {
        let got = fx.acquire(key, holder, 30_000).await;
        assert_eq!(got["granted"], true, "{got}");
        fences.push(got["revision"].as_u64().unwrap());
    }
    let reply = fx
        .call(
            "renew_many",
            json!({"leases": [
                {"key": "a", "holder": "h", "revision": fences[0], "ttl_ms": 30_000},
                {"key": "c", "holder": "h", "revision": fences[2]},
                {"key": "b", "holder": "h", "revision": fences[1]},
            ]}),
        )
        .await;
    let results = reply["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"));
    assert_eq!(results.len(), 3, "{reply}");
    let keys: Vec<&str> = results.iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["a", "c", "b"], "in request order");
    assert_eq!(kind(&results[1]), "lost", "{reply}");
    let (a, b) = (&results[0], &results[2]);
    for (r, before) in [(a, fences[0]), (b, fences[1])] {
        assert_eq!(r["held"], true, "{r}");
        assert_eq!(r["holder"], "h", "{r}");
        assert!(r["revision"].as_u64().unwrap() > before, "{r}");
    }
    assert_ne!(a["revision"], b["revision"], "each its own write");
    // Each new fence is the key's current one: a renew at it succeeds alone.
    for (key, r) in [("a", a), ("b", b)] {
        let owner = fx.owner(key).await;
        assert_eq!(owner["revision"], r["revision"], "{owner}");
    }
    let other = fx.owner("c").await;
    assert_eq!(
        (other["holder"].clone(), other["revision"].clone()),
        (json!("other"), json!(fences[2]))
    );
    let invalid = fx
        .call(
            "renew_many",
            json!({"leases": [{"key": "a", "holder": "h"}]}),
        )
        .await;
    assert_eq!(kind(&invalid), "invalid", "{invalid}");
    assert!(
        invalid["error"].as_str().unwrap().contains("leases[0]"),
        "{invalid}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_with_it_off_has_no_responder_there_and_does_not_advertise_it() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let options = ServiceOptions::from(ServiceConfig {
        renew_many: false,
        ..ServiceConfig::default()
    });
    let fx = Fx::on_with(server, options).await;
    assert!(!dagnats_leases_core::service::micro::advertises_renew_many(
        &info(&fx).await
    ));
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        fx.client.request(
            "api.leases.renew_many",
            json!({"leases": [{"key": "a", "holder": "h", "revision": 1}]})
                .to_string()
                .into(),
        ),
    )
    .await
    .expect("answered by the server at once");
    let err = got.expect_err("no responders");
    assert_eq!(
        err.kind(),
        async_nats::RequestErrorKind::NoResponders,
        "{err}"
    );
    // The five still serve.
    let got: Value = fx.acquire("a", "h", 30_000).await;
    assert_eq!(got["granted"], true, "{got}");
}

/// `num_requests` of `endpoint` in the service's `$SRV.STATS`, `None` when it does
/// not list the endpoint.
async fn requests_at(fx: &Fx, endpoint: &str) -> Option<u64> {
    let stats = fx
        .client
        .request("$SRV.STATS.dagnats-api", "".into())
        .await
        .expect("$SRV.STATS answered");
    let stats: Value = serde_json::from_slice(&stats.payload).unwrap();
    stats["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == endpoint)
        .and_then(|e| e["num_requests"].as_u64())
}

/// A member holding shards renews them in `renew_many` requests where the service
/// advertises it, and one by one where it does not (a service with it off: the
/// mixed deployment of a new library and an older service); either way every key
/// stays held, renewed again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_batches_renewals_where_the_service_has_it_and_renews_one_by_one_where_not() {
    use dagnats_leases_tokio::member::Member;
    const TTL: Duration = Duration::from_secs(3);
    let keys = ["s0", "s1", "s2", "s3"];
    for on in [true, false] {
        let server = tokio::task::spawn_blocking(NatsServer::start)
            .await
            .unwrap();
        let options = ServiceOptions::from(ServiceConfig {
            renew_many: on,
            ..ServiceConfig::default()
        });
        let fx = Fx::on_with(server, options).await;
        let mut events = fx
            .client
            .subscribe("dagnats.lease.changed.>")
            .await
            .unwrap();
        let member = Member::new(common::connect(&fx.server).await, "m1").unwrap();
        let mut shards = member.shards(&keys, keys.len(), TTL).unwrap();
        // Every key renewed three times over (its confirming renew, then two at
        // its schedule), by the change events the renewals write.
        let mut renewed: std::collections::BTreeMap<String, u32> = Default::default();
        while renewed.len() < keys.len() || renewed.values().any(|n| *n < 3) {
            let event = common::next_within(&mut events, 20).await;
            let renewal = event
                .headers
                .as_ref()
                .and_then(|h| h.get("Dagnats-Lease-Event"))
                .is_some_and(|v| v.as_str() == "renewed");
            if renewal {
                let key = event.subject.rsplit('.').next().unwrap().to_string();
                *renewed.entry(key).or_default() += 1;
            }
        }
        assert_eq!(shards.held().len(), keys.len(), "on: {on}");
        let batched = requests_at(&fx, "renew_many").await;
        let single = requests_at(&fx, "renew").await.unwrap();
        if on {
            let batched = batched.expect("advertised");
            println!("on: {batched} batches, {single} single renewals");
            assert!(
                batched >= 1,
                "renewals went in batches: {batched} batches, {single} single"
            );
        } else {
            assert_eq!(batched, None, "not served");
            println!("off: {single} single renewals");
            assert!(single >= 12, "one by one: {single}");
        }
        let _ = shards.next().now_or_never();
        shards.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_larger_than_the_room_left_is_answered_item_by_item_not_refused_whole() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    // One call runs and two wait: the room for three of the six renewals.
    let options = ServiceOptions::from(ServiceConfig {
        max_calls_in_flight: 1,
        max_calls_waiting: 2,
        ..ServiceConfig::default()
    });
    let fx = Fx::on_with(server, options).await;
    let mut leases = Vec::new();
    for i in 0..6 {
        let key = format!("k{i}");
        let got = fx.acquire(&key, "h", 30_000).await;
        assert_eq!(got["granted"], true, "{got}");
        leases.push(json!({"key": key, "holder": "h", "revision": got["revision"]}));
    }
    let reply = fx.call("renew_many", json!({ "leases": leases })).await;
    let results = reply["results"]
        .as_array()
        .unwrap_or_else(|| panic!("answered item by item, not refused whole: {reply}"));
    let held: Vec<bool> = results.iter().map(|r| r["held"] == true).collect();
    assert_eq!(held, [true, true, true, false, false, false], "{reply}");
    for r in &results[3..] {
        assert_eq!(kind(r), "unavailable", "{r}");
    }
    // The three renewed hold their new fences; the three refused keep theirs.
    for (i, r) in results.iter().enumerate() {
        let owner = fx.owner(&format!("k{i}")).await;
        let want = if i < 3 {
            &r["revision"]
        } else {
            &leases[i]["revision"]
        };
        assert_eq!(&owner["revision"], want, "{owner}");
    }
}
