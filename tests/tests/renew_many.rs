//! `api.leases.renew_many` against a real nats-server: each item renewed by its own
//! conditional write with its own new fence, a lost item beside renewed ones, the
//! endpoint advertised in `$SRV.INFO`; and a service with it off is one of the five
//! endpoints alone (no responders there, not advertised).

mod common;

use std::time::Duration;

use common::{Fx, kind};
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::service::ServiceOptions;
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
    let options = ServiceOptions {
        renew_many: false,
        ..ServiceOptions::default()
    };
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
