//! The scenario suite: every rule of leases.md and contract.md against the service
//! on a real nats-server: the pinned 2.15.1, and (in `scripts/test`'s second run,
//! `DAGNATS_NATS_SERVER` naming the binary) the oldest supported release, 2.11.x.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use base64::Engine as _;
use common::*;
use dagnats_leases_tests::{ENV_SERVER, NatsServer, SUPPORTED_VERSION};
use dagnats_leases_tokio::service::{ServiceConfig, ServiceOptions};
use futures::StreamExt;
use serde_json::{Value, json};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Names the server this run of the suite is on (shown with `--show-output`), and
/// checks it is the one the run asked for: `DAGNATS_EXPECT_NATS_VERSION` when set (so
/// a run meant for another release cannot silently fall back to the pinned one), else
/// the pinned version when `DAGNATS_NATS_SERVER` names no other binary.
#[test]
fn the_suite_runs_on_the_server_it_names() {
    let server = NatsServer::start();
    println!(
        "scenarios: nats-server v{} ({})",
        server.version(),
        server.binary().display()
    );
    let named = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
    if let Some(expected) = named("DAGNATS_EXPECT_NATS_VERSION") {
        assert_eq!(server.version(), expected, "the run asked for v{expected}");
    } else if named(ENV_SERVER).is_none() {
        assert_eq!(server.version(), SUPPORTED_VERSION);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_input_bound_is_enforced_and_an_invalid_call_changes_no_lease() {
    let fx = Fx::start().await;
    let held = fx.acquire("bounds", "h1", 10_000).await;
    assert_eq!(held["granted"], true);
    let before = fx.owner("bounds").await;
    for endpoint in ["acquire", "renew", "release", "owner", "forward"] {
        let ep = dagnats_leases_core::Endpoint::from_subject(endpoint).unwrap();
        for body in dagnats_leases_core::test_support::invalid_bodies(ep) {
            let reply = fx.call_raw(endpoint, body.clone().into_bytes()).await;
            assert_eq!(kind(&reply), "invalid", "{endpoint} {body}: {reply}");
            assert!(reply["error"].as_str().unwrap().len() > 10);
        }
    }
    // The same bodies aimed at the held key, with every field but one valid. A
    // release does not use `ttl_ms` and so ignores it (a valid release): that body
    // goes to renew alone.
    let bad_ttl =
        json!({"key": "bounds", "holder": "h1", "revision": held["revision"], "ttl_ms": 1500});
    assert_eq!(kind(&fx.call("renew", bad_ttl).await), "invalid");
    for body in [
        json!({"key": "bounds", "holder": "h1"}),
        json!({"key": "bounds", "holder": "h1", "revision": held["revision"], "extra": true}),
    ] {
        assert_eq!(
            kind(&fx.call("renew", body.clone()).await),
            "invalid",
            "{body}"
        );
        assert_eq!(
            kind(&fx.call("release", body.clone()).await),
            "invalid",
            "{body}"
        );
    }
    assert_eq!(
        fx.owner("bounds").await,
        before,
        "invalid calls changed the lease"
    );
    // Each boundary value is accepted.
    let max = "k".repeat(128);
    assert_eq!(fx.acquire(&max, &max, 600_000).await["granted"], true);
    assert_eq!(fx.acquire("b-1_A", "x", 1000).await["granted"], true);
    let fwd = fx
        .call(
            "forward",
            json!({"key": "nobody", "payload": "", "timeout_ms": 100}),
        )
        .await;
    assert_eq!(kind(&fwd), "not_held");
    let fwd = fx
        .call(
            "forward",
            json!({"key": "nobody", "payload": "", "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(kind(&fwd), "not_held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_grants_contends_and_is_idempotent() {
    let fx = Fx::start().await;
    let a = fx.acquire("leader", "h1", 15_000).await;
    assert_eq!(
        (a["granted"].as_bool(), a["held"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(a["holder"], "h1");
    assert_eq!(a["ttl_ms"], 15000);
    let rev = a["revision"].as_u64().unwrap();
    assert!(rev > 0);
    let b = fx.acquire("leader", "h2", 15_000).await;
    assert_eq!(b["granted"], false, "{b}");
    assert_eq!(
        (b["holder"].as_str(), b["revision"].as_u64()),
        (Some("h1"), Some(rev))
    );
    // The message the server stores, and when its TTL runs out: by the server's
    // store time and the `Nats-TTL` actually written, not by the service's word.
    let written = stored(&fx.client, "leader").await;
    assert_eq!(written.seq, rev);
    assert_eq!(written.ttl.as_deref(), Some("15s"), "the TTL asked for");
    // A second later (whole seconds: a rewrite would show), the repeat acquire.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = fx.acquire("leader", "h1", 15_000).await;
    assert_eq!(again["granted"], true);
    assert_eq!(again["revision"].as_u64(), Some(rev), "same revision");
    let after = stored(&fx.client, "leader").await;
    assert_eq!(
        after, written,
        "the repeat acquire wrote nothing: TTL not extended"
    );
    let ends = written.time + Duration::from_millis(15_000);
    let shown = dagnats_leases_core::record::parse_time(again["expires_at"].as_str().unwrap())
        .expect("expires_at is RFC 3339");
    assert!(
        (shown - ends).abs() < time::Duration::milliseconds(1),
        "the repeat grant's expires_at {shown} is the stored lease's end {ends}"
    );
    let first = dagnats_leases_core::record::parse_time(a["expires_at"].as_str().unwrap()).unwrap();
    assert!(
        (first - ends).abs() < time::Duration::milliseconds(500),
        "the first grant's expires_at {first} is about the stored lease's end {ends}"
    );
    let owner = fx.owner("leader").await;
    assert_eq!(owner["revision"].as_u64(), Some(rev));
}

/// A key's last message as the stream leader stores it.
#[derive(Debug, PartialEq)]
struct Stored {
    seq: u64,
    /// The server's store time.
    time: time::OffsetDateTime,
    /// The `Nats-TTL` header written.
    ttl: Option<String>,
}

async fn stored(client: &async_nats::Client, key: &str) -> Stored {
    let body = json!({"last_by_subj": test_shards().kv_subject(key)});
    let reply = client
        .request(
            test_shards().api_subject("STREAM.MSG.GET", key),
            body.to_string().into(),
        )
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&reply.payload).unwrap();
    let m = &v["message"];
    let hdrs = base64::engine::general_purpose::STANDARD
        .decode(m["hdrs"].as_str().unwrap_or_default())
        .unwrap();
    let ttl = String::from_utf8(hdrs)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Nats-TTL:").map(|v| v.trim().to_string()));
    Stored {
        seq: m["seq"].as_u64().unwrap_or_else(|| panic!("{v}")),
        time: time::OffsetDateTime::parse(
            m["time"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap(),
        ttl,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_acquirers_of_one_key_exactly_one_wins() {
    let fx = Fx::start().await;
    let calls = (0..16).map(|i| {
        let client = fx.client.clone();
        tokio::spawn(async move {
            let body = json!({"key": "race", "holder": format!("h{i}"), "ttl_ms": 10000});
            call_raw(&client, "acquire", body.to_string().into_bytes()).await
        })
    });
    let replies: Vec<Value> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let winners: Vec<&Value> = replies.iter().filter(|r| r["granted"] == true).collect();
    assert_eq!(winners.len(), 1, "{replies:?}");
    let winner = winners[0]["holder"].as_str().unwrap();
    for r in &replies {
        assert_eq!(r["holder"], winner, "every reply names the one holder: {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_extends_with_a_new_fence_and_checks_holder_and_fence() {
    let fx = Fx::start().await;
    let a = fx.acquire("r", "h1", 10_000).await;
    let rev = a["revision"].as_u64().unwrap();
    let r = fx
        .call(
            "renew",
            json!({"key": "r", "holder": "h1", "revision": rev, "ttl_ms": 20000}),
        )
        .await;
    assert_eq!(r["held"], true, "{r}");
    let new_rev = r["revision"].as_u64().unwrap();
    assert!(new_rev > rev);
    assert_eq!(r["acquired_at"], a["acquired_at"], "acquired_at kept");
    assert_eq!(r["ttl_ms"], 20000);
    assert!(r["expires_at"].as_str().unwrap() > a["expires_at"].as_str().unwrap());
    // The old fence: fence_mismatch; another holder: lost.
    let stale = fx
        .call(
            "renew",
            json!({"key": "r", "holder": "h1", "revision": rev}),
        )
        .await;
    assert_eq!(kind(&stale), "fence_mismatch", "{stale}");
    let other = fx
        .call(
            "renew",
            json!({"key": "r", "holder": "h2", "revision": new_rev}),
        )
        .await;
    assert_eq!(kind(&other), "lost");
    // A renew whose reply was lost: acquire recovers the current fence.
    let recovered = fx.acquire("r", "h1", 10_000).await;
    assert_eq!(recovered["granted"], true);
    assert_eq!(recovered["revision"].as_u64(), Some(new_rev));
    let r2 = fx
        .call(
            "renew",
            json!({"key": "r", "holder": "h1", "revision": new_rev}),
        )
        .await;
    assert_eq!(
        r2["ttl_ms"], 20000,
        "left out, ttl_ms keeps the lease's own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_the_key_under_the_fence_check() {
    let fx = Fx::start().await;
    let a = fx.acquire("rel", "h1", 10_000).await;
    let rev = a["revision"].as_u64().unwrap();
    let other = fx
        .call(
            "release",
            json!({"key": "rel", "holder": "h2", "revision": rev}),
        )
        .await;
    assert_eq!(kind(&other), "lost");
    let r = fx
        .call(
            "release",
            json!({"key": "rel", "holder": "h1", "revision": rev}),
        )
        .await;
    assert_eq!(r["released"], true, "{r}");
    assert_eq!(r["held"], false);
    assert!(r["revision"].as_u64().unwrap() > rev);
    assert_eq!(fx.owner("rel").await, json!({"held": false, "key": "rel"}));
    let again = fx
        .call(
            "release",
            json!({"key": "rel", "holder": "h1", "revision": rev}),
        )
        .await;
    assert_eq!(kind(&again), "lost");
    // A new tenure over the tombstone gets a higher fence.
    let b = fx.acquire("rel", "h2", 10_000).await;
    assert_eq!(b["granted"], true);
    assert!(b["revision"].as_u64().unwrap() > r["revision"].as_u64().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_expires_a_lease_and_the_next_tenure_has_a_higher_fence() {
    let fx = Fx::start().await;
    let mut events = fx
        .client
        .subscribe("dagnats.lease.changed.exp")
        .await
        .unwrap();
    let a = fx.acquire("exp", "h1", 1000).await;
    let rev = a["revision"].as_u64().unwrap();
    let acquired = next_within(&mut events, 5).await;
    assert_eq!(
        acquired
            .headers
            .as_ref()
            .unwrap()
            .get("Dagnats-Lease-Event")
            .unwrap()
            .as_str(),
        "acquired"
    );
    // The server's own expiry marker is the event that frees the key.
    let marker = next_within(&mut events, 5).await;
    let headers = marker.headers.unwrap();
    assert_eq!(
        headers.get("Nats-Marker-Reason").unwrap().as_str(),
        "MaxAge"
    );
    assert_eq!(fx.owner("exp").await["held"], false);
    let renew = fx
        .call(
            "renew",
            json!({"key": "exp", "holder": "h1", "revision": rev}),
        )
        .await;
    assert_eq!(kind(&renew), "lost");
    let release = fx
        .call(
            "release",
            json!({"key": "exp", "holder": "h1", "revision": rev}),
        )
        .await;
    assert_eq!(kind(&release), "lost", "releasing an expired lease is lost");
    let b = fx.acquire("exp", "h2", 5000).await;
    assert_eq!(b["granted"], true, "{b}");
    assert!(b["revision"].as_u64().unwrap() > rev);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_is_one_change_event_carrying_its_revision_and_event() {
    let fx = Fx::start().await;
    let mut events = fx
        .client
        .subscribe("dagnats.lease.changed.ev")
        .await
        .unwrap();
    let a = fx.acquire("ev", "h1", 10_000).await;
    let r = fx
        .call(
            "renew",
            json!({"key": "ev", "holder": "h1", "revision": a["revision"]}),
        )
        .await;
    let d = fx
        .call(
            "release",
            json!({"key": "ev", "holder": "h1", "revision": r["revision"]}),
        )
        .await;
    for (reply, event) in [(&a, "acquired"), (&r, "renewed"), (&d, "released")] {
        let msg = next_within(&mut events, 5).await;
        let h = msg.headers.unwrap();
        assert_eq!(
            h.get("Nats-Sequence").unwrap().as_str(),
            reply["revision"].to_string()
        );
        assert_eq!(h.get("Dagnats-Lease-Event").unwrap().as_str(), event);
        assert_eq!(
            h.get("Nats-Subject").unwrap().as_str(),
            test_shards().kv_subject("ev")
        );
    }
    // A failed write (a stale renew) gives no event.
    let stale = fx
        .call(
            "renew",
            json!({"key": "ev", "holder": "h1", "revision": a["revision"]}),
        )
        .await;
    assert_eq!(kind(&stale), "lost");
    fx.client.flush().await.unwrap();
    let more = tokio::time::timeout(Duration::from_millis(300), events.next()).await;
    assert!(more.is_err(), "an extra event: {more:?}");
}

/// An owner on `dagnats.lease.inbox.<holder>.>` that answers as `behaviour` says.
async fn owner_task(
    client: async_nats::Client,
    holder: &str,
    behaviour: &'static str,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<(String, Option<String>, Vec<u8>)>,
) {
    let mut sub = client
        .subscribe(format!("dagnats.lease.inbox.{holder}.>"))
        .await
        .unwrap();
    client.flush().await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let fence = msg
                .headers
                .as_ref()
                .and_then(|h| h.get("Dagnats-Lease-Fence"))
                .map(|v| v.as_str().to_string());
            let _ = tx.send((msg.subject.to_string(), fence, msg.payload.to_vec()));
            let Some(reply) = msg.reply else { continue };
            match behaviour {
                "echo" => client.publish(reply, msg.payload).await.unwrap(),
                "reject" => {
                    let mut h = async_nats::HeaderMap::new();
                    h.insert("Dagnats-Lease-Reject", "stale");
                    client
                        .publish_with_headers(reply, h, "".into())
                        .await
                        .unwrap()
                }
                "silent" => {}
                big => {
                    let n: usize = big.parse().unwrap();
                    client.publish(reply, vec![b'x'; n].into()).await.unwrap()
                }
            }
        }
    });
    (task, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_reaches_the_owner_with_the_fence_and_relays_its_reply() {
    let fx = Fx::start().await;
    let a = fx.acquire("fw", "own1", 10_000).await;
    let (_task, mut seen) = owner_task(fx.client.clone(), "own1", "echo").await;
    let payload: Vec<u8> = (0..=255u8).collect();
    let reply = fx
        .call(
            "forward",
            json!({"key": "fw", "payload": b64(&payload), "timeout_ms": 2000}),
        )
        .await;
    assert_eq!(reply["payload"], b64(&payload), "{reply}");
    assert_eq!(
        (reply["holder"].as_str(), &reply["revision"]),
        (Some("own1"), &a["revision"])
    );
    let (subject, fence, body) = seen.recv().await.unwrap();
    assert_eq!(subject, "dagnats.lease.inbox.own1.fw");
    assert_eq!(fence.unwrap(), a["revision"].to_string());
    assert_eq!(body, payload);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_without_an_owner_or_a_responder() {
    let fx = Fx::start().await;
    let r = fx
        .call(
            "forward",
            json!({"key": "none", "payload": "", "timeout_ms": 1000}),
        )
        .await;
    assert_eq!(kind(&r), "not_held");
    let a = fx.acquire("dead", "gone", 10_000).await;
    let r = fx
        .call(
            "forward",
            json!({"key": "dead", "payload": "", "timeout_ms": 1000}),
        )
        .await;
    assert_eq!(kind(&r), "owner_unavailable", "{r}");
    assert_eq!(
        (r["holder"].as_str(), &r["revision"]),
        (Some("gone"), &a["revision"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_to_a_silent_owner_times_out_after_exactly_one_request() {
    let fx = Fx::start().await;
    fx.acquire("slow", "mute", 10_000).await;
    let (_task, mut seen) = owner_task(fx.client.clone(), "mute", "silent").await;
    let r = fx
        .call(
            "forward",
            json!({"key": "slow", "payload": "", "timeout_ms": 300}),
        )
        .await;
    assert_eq!(kind(&r), "owner_timeout", "{r}");
    assert_eq!(r["holder"], "mute");
    assert!(seen.recv().await.is_some());
    assert!(seen.try_recv().is_err(), "a timeout is never retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_rejected_by_an_owner_that_stays_is_owner_rejected_after_one_attempt() {
    let fx = Fx::start().await;
    fx.acquire("rj", "stubborn", 10_000).await;
    let (_task, mut seen) = owner_task(fx.client.clone(), "stubborn", "reject").await;
    let r = fx
        .call(
            "forward",
            json!({"key": "rj", "payload": "", "timeout_ms": 2000}),
        )
        .await;
    assert_eq!(kind(&r), "owner_rejected", "{r}");
    let mut attempts = 0;
    while seen.try_recv().is_ok() {
        attempts += 1;
    }
    assert!((1..=3).contains(&attempts), "{attempts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_rejected_by_an_old_owner_succeeds_at_the_new_one() {
    let fx = Fx::start().await;
    let a = fx.acquire("ho", "old", 10_000).await;
    // The old owner rejects, and hands the lease over before it replies.
    let mut sub = fx
        .client
        .subscribe("dagnats.lease.inbox.old.>")
        .await
        .unwrap();
    let client = fx.client.clone();
    let rev = a["revision"].clone();
    let handover = tokio::spawn(async move {
        let msg = sub.next().await.unwrap();
        let body = json!({"key": "ho", "holder": "old", "revision": rev});
        call_raw(&client, "release", body.to_string().into_bytes()).await;
        let body = json!({"key": "ho", "holder": "new", "ttl_ms": 10000});
        let b = call_raw(&client, "acquire", body.to_string().into_bytes()).await;
        let mut h = async_nats::HeaderMap::new();
        h.insert("Dagnats-Lease-Reject", "stale");
        client
            .publish_with_headers(msg.reply.unwrap(), h, "".into())
            .await
            .unwrap();
        b
    });
    let (_task, _seen) = owner_task(fx.client.clone(), "new", "echo").await;
    fx.client.flush().await.unwrap();
    let r = fx
        .call(
            "forward",
            json!({"key": "ho", "payload": b64(b"hi"), "timeout_ms": 5000}),
        )
        .await;
    let b = handover.await.unwrap();
    assert_eq!(r["holder"], "new", "{r}");
    assert_eq!(r["revision"], b["revision"]);
    assert_eq!(r["payload"], b64(b"hi"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_reply_too_large_at_the_servers_max_payload() {
    let server = NatsServer::builder().max_payload(64 * 1024).start();
    let max = server.info().max_payload as usize;
    let fx = Fx::on(server).await;
    let a = fx.acquire("big", "own", 10_000).await;
    let wrapper = json!({"payload": "", "key": "big", "holder": "own", "revision": a["revision"]})
        .to_string()
        .len();
    let fits = (max - wrapper) / 4 * 3;
    let fits_s: &'static str = Box::leak(fits.to_string().into_boxed_str());
    let (_t, _s) = owner_task(fx.client.clone(), "own", fits_s).await;
    let r = fx
        .call(
            "forward",
            json!({"key": "big", "payload": "", "timeout_ms": 5000}),
        )
        .await;
    assert_eq!(
        r["holder"],
        "own",
        "a reply just under max_payload succeeds: {}",
        kind(&r)
    );
    let over: &'static str = Box::leak((fits + 3).to_string().into_boxed_str());
    let fx2_owner = "own2";
    fx.acquire("big2", fx2_owner, 10_000).await;
    let (_t2, _s2) = owner_task(fx.client.clone(), fx2_owner, over).await;
    let r = fx
        .call(
            "forward",
            json!({"key": "big2", "payload": "", "timeout_ms": 5000}),
        )
        .await;
    assert_eq!(kind(&r), "reply_too_large", "{r}");
}

/// A client connected with `retry_on_initial_connect` to no server has had no
/// INFO: judged from its empty version the server would look too old. The
/// service refuses to start with a Config error naming the cause, instead of
/// serving `unsupported`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_servers_info_cannot_start_a_service() {
    // A port nothing listens on: the client keeps trying in the background.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(format!("nats://127.0.0.1:{port}"))
        .await
        .expect("a client that retries");
    assert!(client.server_info().version.is_empty());
    let url = format!("nats://127.0.0.1:{port}");
    let e = dagnats_leases_tokio::service::start((url, client), ServiceOptions::default())
        .await
        .expect_err("no INFO, no start");
    assert_eq!(e.kind(), dagnats_leases_tokio::ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("INFO"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subject_replies_unsupported_on_a_2_9_server() {
    let server = NatsServer::start_legacy();
    assert!(server.version().starts_with("2.9"), "{}", server.version());
    let fx = Fx::on(server).await;
    assert_eq!(
        fx.service.as_ref().unwrap().mode(),
        dagnats_leases_core::Mode::Unsupported
    );
    for (endpoint, body) in [
        (
            "acquire",
            json!({"key": "k", "holder": "h", "ttl_ms": 1000}),
        ),
        ("renew", json!({"key": "k", "holder": "h", "revision": 1})),
        ("release", json!({"key": "k", "holder": "h", "revision": 1})),
        ("owner", json!({"key": "k"})),
        (
            "forward",
            json!({"key": "k", "payload": "", "timeout_ms": 100}),
        ),
    ] {
        let r = fx.call(endpoint, body).await;
        assert_eq!(kind(&r), "unsupported", "{endpoint}: {r}");
    }
    // Nothing was created.
    let info = fx
        .client
        .request(
            format!("$JS.API.STREAM.INFO.{}", test_shards().stream(0)),
            "".into(),
        )
        .await
        .unwrap();
    let info: Value = serde_json::from_slice(&info.payload).unwrap();
    assert_eq!(info["error"]["err_code"], 10059, "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_queue_group_and_answer_each_request_once() {
    let fx = Fx::start().await;
    let _second = start_service(&fx.server).await;
    let inbox = fx.client.new_inbox();
    let mut replies = fx.client.subscribe(format!("{inbox}.*")).await.unwrap();
    let n = 40;
    for i in 0..n {
        let body = json!({"key": format!("q{}", i % 5), "holder": format!("h{i}"), "ttl_ms": 5000});
        fx.client
            .publish_with_reply(
                "api.leases.acquire",
                format!("{inbox}.{i}"),
                body.to_string().into(),
            )
            .await
            .unwrap();
    }
    let mut seen = HashSet::new();
    for _ in 0..n {
        let msg = next_within(&mut replies, 10).await;
        assert!(
            seen.insert(msg.subject.to_string()),
            "answered twice: {}",
            msg.subject
        );
    }
    fx.client.flush().await.unwrap();
    let extra = tokio::time::timeout(Duration::from_millis(300), replies.next()).await;
    assert!(extra.is_err(), "an extra reply");
    // Both instances took a share, as $SRV.STATS tells.
    let ping_inbox = fx.client.new_inbox();
    let mut sub = fx.client.subscribe(ping_inbox.clone()).await.unwrap();
    fx.client
        .publish_with_reply("$SRV.STATS.dagnats-api", ping_inbox, "".into())
        .await
        .unwrap();
    let mut total = 0;
    for _ in 0..2 {
        let msg = next_within(&mut sub, 5).await;
        let v: Value = serde_json::from_slice(&msg.payload).unwrap();
        let acquire = v["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "acquire")
            .unwrap();
        total += acquire["num_requests"].as_u64().unwrap();
    }
    assert_eq!(total, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_registers_as_the_dagnats_api_micro_service() {
    let fx = Fx::start().await;
    let info = fx
        .client
        .request("$SRV.INFO.dagnats-api", "".into())
        .await
        .unwrap();
    let info: Value = serde_json::from_slice(&info.payload).unwrap();
    assert_eq!(info["name"], "dagnats-api");
    let endpoints = info["endpoints"].as_array().unwrap();
    let mut subjects: Vec<&str> = endpoints
        .iter()
        .map(|e| e["subject"].as_str().unwrap())
        .collect();
    subjects.sort();
    assert_eq!(
        subjects,
        [
            "api.leases.acquire",
            "api.leases.forward",
            "api.leases.owner",
            "api.leases.release",
            "api.leases.renew",
            "api.leases.renew_many"
        ]
    );
    for e in endpoints {
        assert_eq!(e["queue_group"], "dagnats-leases", "{e}");
    }
    let ping = fx
        .client
        .request("$SRV.PING.dagnats-api", "".into())
        .await
        .unwrap();
    let ping: Value = serde_json::from_slice(&ping.payload).unwrap();
    assert_eq!(ping["name"], "dagnats-api");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_survives_a_nats_server_restart_and_the_service_serves_again() {
    let mut fx = Fx::start().await;
    let a = fx.acquire("durable", "h1", 60_000).await;
    fx.server.restart();
    // The service and client reconnect by themselves; wait for the service to answer.
    // Poll with a short backoff until both have reconnected (bounded: 30 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut owner = Value::Null;
    while tokio::time::Instant::now() < deadline {
        let body = json!({"key": "durable"}).to_string().into();
        if let Ok(msg) = fx.client.request("api.leases.owner", body).await {
            owner = serde_json::from_slice(&msg.payload).unwrap();
            if owner["held"] == true {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        (owner["holder"].as_str(), &owner["revision"]),
        (Some("h1"), &a["revision"]),
        "{owner}"
    );
    let renewed = fx
        .call(
            "renew",
            json!({"key": "durable", "holder": "h1", "revision": a["revision"]}),
        )
        .await;
    assert!(
        renewed["revision"].as_u64().unwrap() > a["revision"].as_u64().unwrap(),
        "{renewed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_forward_does_not_hold_up_other_calls() {
    let fx = Fx::start().await;
    fx.acquire("slowkey", "mute", 10_000).await;
    let (_task, mut seen) = owner_task(fx.client.clone(), "mute", "silent").await;
    let client = fx.client.clone();
    let forward = tokio::spawn(async move {
        let body = json!({"key": "slowkey", "payload": "", "timeout_ms": 30000});
        call_raw(&client, "forward", body.to_string().into_bytes()).await
    });
    // Once the owner holds the forwarded request, the forward is in flight.
    seen.recv().await.unwrap();
    let a = fx.acquire("other", "h1", 5000).await;
    assert_eq!(a["granted"], true);
    assert!(
        !forward.is_finished(),
        "the forward is still waiting on its owner"
    );
    forward.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_after_startup_is_unavailable_never_unsupported() {
    let fx = Fx::start().await;
    // What a leader election looks like from outside: no stream answers.
    let deleted = fx
        .client
        .request(test_shards().api_subject("STREAM.DELETE", "k"), "".into())
        .await
        .unwrap();
    let deleted: Value = serde_json::from_slice(&deleted.payload).unwrap();
    assert_eq!(deleted["success"], true, "{deleted}");
    let acquire = fx.acquire("k", "h", 5000).await;
    assert_eq!(
        kind(&acquire),
        "unavailable",
        "a write with no stream: {acquire}"
    );
    let owner = fx.owner("k").await;
    assert_eq!(
        kind(&owner),
        "unavailable",
        "a read with no stream: {owner}"
    );
    let renew = fx
        .call("renew", json!({"key": "k", "holder": "h", "revision": 1}))
        .await;
    assert_eq!(kind(&renew), "unavailable");
}

/// A request with its own timeout: `Err` says how it failed instead of panicking.
async fn request_within(
    client: &async_nats::Client,
    endpoint: &str,
    body: Value,
    timeout: Duration,
) -> Result<Value, async_nats::RequestErrorKind> {
    let request = async_nats::Request::new()
        .payload(body.to_string().into())
        .timeout(Some(timeout));
    let reply = client
        .send_request(
            format!("{}.{endpoint}", dagnats_leases_core::subjects::API_PREFIX),
            request,
        )
        .await
        .map_err(|e| e.kind())?;
    Ok(serde_json::from_slice(&reply.payload).expect("a JSON reply"))
}

/// leases.md: "dagnats stopping mid-call is internal". A forward waiting on an
/// owner that never answers is cut off at the shutdown bound and answered
/// `internal`, instead of being dropped for the caller to time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_service_mid_call_answers_internal() {
    let server = NatsServer::start();
    let options = ServiceOptions::from(ServiceConfig {
        shutdown_timeout: Duration::from_millis(300),
        ..ServiceConfig::default()
    });
    let service = start_service_with(&server, options).await;
    let client = connect(&server).await;
    let a = call_raw(
        &client,
        "acquire",
        json!({"key": "stopkey", "holder": "mute", "ttl_ms": 10_000})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(a["granted"], true, "{a}");
    let (_task, mut seen) = owner_task(client.clone(), "mute", "silent").await;
    let caller = client.clone();
    let forward = tokio::spawn(async move {
        let body = json!({"key": "stopkey", "payload": "", "timeout_ms": 30000});
        request_within(&caller, "forward", body, Duration::from_secs(8)).await
    });
    // Once the owner holds the forwarded request, the forward is in flight.
    seen.recv().await.unwrap();
    let stopping = std::time::Instant::now();
    service.stop().await;
    let reply = forward
        .await
        .unwrap()
        .expect("the caller gets a reply, not a timeout");
    assert_eq!(kind(&reply), "internal", "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .starts_with("the service is stopping"),
        "{reply}"
    );
    assert_eq!(
        (reply["holder"].as_str(), &reply["revision"]),
        (Some("mute"), &a["revision"]),
        "names the owner it tried"
    );
    assert!(
        stopping.elapsed() < Duration::from_secs(3),
        "answered at the shutdown bound, took {:?}",
        stopping.elapsed()
    );
}

/// Requests delivered to the service but not read yet when it stops are answered
/// too. Made deterministic with the serving future itself: the requests reach the
/// endpoints' buffers before the future is first polled, and the stop is thrown
/// before it is, so the loop sees the stop with every request still unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_service_answers_the_requests_delivered_but_unread() {
    let server = NatsServer::start();
    let prepared = dagnats_leases_tokio::service::prepare(
        dagnats_leases_tokio::runtime::TokioRuntime::shared(),
        (server.url(), connect(&server).await),
        Default::default(),
    )
    .await
    .expect("service prepares");
    let client = connect(&server).await;
    let mut calls = futures::stream::FuturesUnordered::new();
    for n in 0..50 {
        let client = client.clone();
        calls.push(async move {
            let body = json!({"key": format!("unread{n}")});
            request_within(&client, "owner", body, Duration::from_secs(5)).await
        });
    }
    // Send them all: polling the set once publishes each request.
    assert!(futures::poll!(calls.next()).is_pending());
    client.flush().await.unwrap();
    // The server has routed them to the service's connection; let them arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    prepared.stop.send(true).unwrap();
    let serve = tokio::spawn(prepared.serve);
    let mut answered = 0;
    while let Some(r) = calls.next().await {
        let reply = r.expect("every request delivered to the service is answered");
        assert_eq!(reply["held"], false, "{reply}");
        answered += 1;
    }
    assert_eq!(answered, 50);
    serve.await.unwrap();
}

/// While the bucket is being ensured, callers get `unavailable` (retry), not no
/// responders; once it is, the real mode. Made deterministic with a server whose
/// JetStream is off: startup cannot finish until it is turned on (a restart with
/// it on, on the same port: the service's client reconnects and startup's retry
/// finds the stream missing and creates it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_during_startup_are_unavailable_then_served() {
    let mut server = NatsServer::builder().jetstream(false).start();
    let service_client = connect(&server).await;
    let starting = tokio::spawn(dagnats_leases_tokio::service::start(
        (server.url(), service_client),
        Default::default(),
    ));
    let client = connect(&server).await;
    let body = json!({"key": "early", "holder": "h1", "ttl_ms": 5000});
    // The endpoints are registered first thing; until then there are no responders.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let reply = loop {
        match request_within(&client, "acquire", body.clone(), Duration::from_secs(2)).await {
            Ok(reply) => break reply,
            Err(async_nats::RequestErrorKind::NoResponders)
                if std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("a call during startup: {e:?}"),
        }
    };
    assert_eq!(kind(&reply), "unavailable", "{reply}");
    for endpoint in ["renew", "release", "owner", "forward"] {
        let reply = request_within(&client, endpoint, json!({}), Duration::from_secs(2))
            .await
            .unwrap_or_else(|e| panic!("{endpoint} during startup: {e:?}"));
        assert_eq!(kind(&reply), "unavailable", "{endpoint}: {reply}");
    }
    assert!(!starting.is_finished(), "startup waits for JetStream");
    // Turn JetStream on: startup settles and the same endpoints serve leases.
    let conf = std::fs::read_to_string(server.config_path()).unwrap();
    let store = serde_json::to_string(&server.store_dir().to_string_lossy()).unwrap();
    std::fs::write(
        server.config_path(),
        format!("{conf}jetstream {{\n  store_dir: {store}\n}}\n"),
    )
    .unwrap();
    server.restart();
    let handle = tokio::time::timeout(Duration::from_secs(15), starting)
        .await
        .expect("startup settles once JetStream is there")
        .unwrap()
        .expect("the service starts");
    assert_eq!(handle.mode(), dagnats_leases_core::Mode::Ready);
    let reply = request_within(&client, "acquire", body, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(reply["granted"], true, "{reply}");
    handle.shutdown().await;
}

/// Acquires `n` fresh keys `<prefix>-<i>` at once; all granted, each its own
/// revision ([`acquire_all_at_once`]).
async fn acquire_at_once(fx: &Fx, prefix: &str, n: usize) -> (Vec<String>, Vec<Value>) {
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    let acquired = acquire_all_at_once(&fx.client, &keys, 10_000).await;
    (keys, acquired)
}

/// Past the coalescer's single window, writes go as ADR-50 atomic batches on a
/// 2.12+ server (`allow_atomic` set at startup): acquires, renews and releases of
/// many keys at once each get their own answer and revision, and the stored
/// messages show the batches they came in. The windows are narrowed (one single
/// out, batches from two) so that batches form however fast singles come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_go_as_atomic_batches_and_each_gets_its_own_answer() {
    let options = ServiceOptions::from(ServiceConfig {
        coalesce_writes: dagnats_leases_core::service::coalesce::CoalesceWrites::On,
        batch_after: Some(1),
        min_batch: 2,
        ..ServiceConfig::default()
    });
    let fx = Fx::on_with(NatsServer::start(), options).await;
    let atomic = has_atomic_batches(&fx.client);
    let n = 48;
    let (keys, acquired) = acquire_at_once(&fx, "batch", n).await;
    let batched = stored_by_a_batch(&fx.client, &keys).await;
    if atomic {
        assert!(batched > 0, "no write of {n} went in a batch");
    } else {
        // Before 2.12 there are no atomic batches: every write goes single.
        assert_eq!(batched, 0, "a batch on a server without atomic batches");
    }
    let renewed = futures::future::join_all(keys.iter().zip(&acquired).map(|(k, a)| {
        fx.call(
            "renew",
            json!({"key": k, "holder": "h", "revision": a["revision"]}),
        )
    }))
    .await;
    for r in &renewed {
        assert_eq!(r["held"], true, "{r}");
    }
    // A stale fence among them: its own answer, the others unaffected.
    let mut bodies: Vec<Value> = keys
        .iter()
        .zip(&renewed)
        .map(|(k, r)| json!({"key": k, "holder": "h", "revision": r["revision"]}))
        .collect();
    bodies[3]["revision"] = acquired[3]["revision"].clone();
    let released =
        futures::future::join_all(bodies.iter().map(|b| fx.call("release", b.clone()))).await;
    for (i, r) in released.iter().enumerate() {
        if i == 3 {
            assert_ne!(r["released"], true, "a stale fence: {r}");
        } else {
            assert_eq!(r["released"], true, "{i}: {r}");
        }
    }
    eprintln!("{batched} of {n} acquires stored by a batch");
}

/// With the coalescer off (`--coalesce-writes false`, for a server on the lazy
/// default sync): many writes at once each go alone, even with windows that
/// would batch them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_false_every_write_goes_alone() {
    let options = ServiceOptions::from(ServiceConfig {
        coalesce_writes: dagnats_leases_core::service::coalesce::CoalesceWrites::Off,
        batch_after: Some(1),
        min_batch: 2,
        ..ServiceConfig::default()
    });
    let fx = Fx::on_with(NatsServer::start(), options).await;
    let (keys, _) = acquire_at_once(&fx, "off", 48).await;
    assert_eq!(stored_by_a_batch(&fx.client, &keys).await, 0);
}

/// With `auto` (the default) the coalescer is on (for a server with
/// `sync_interval: always`, where it was measured to win): with narrowed windows
/// many writes at once go partly in batches on a 2.12+ server. (A replicated
/// bucket's: `read_confirm`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auto_a_single_replica_bucket_batches_under_load() {
    let options = ServiceOptions::from(ServiceConfig {
        coalesce_writes: dagnats_leases_core::service::coalesce::CoalesceWrites::Auto,
        batch_after: Some(1),
        min_batch: 2,
        ..ServiceConfig::default()
    });
    let fx = Fx::on_with(NatsServer::start(), options).await;
    let (keys, _) = acquire_at_once(&fx, "auto", 48).await;
    let batched = stored_by_a_batch(&fx.client, &keys).await;
    if has_atomic_batches(&fx.client) {
        assert!(batched > 0, "no write of 48 went in a batch");
    } else {
        assert_eq!(batched, 0, "a batch on a server without atomic batches");
    }
}

/// With the coalescer on and its default windows, as many writes at once as the
/// single window holds all go alone: a call at low load never waits behind a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_within_the_single_window_never_go_in_a_batch() {
    let options = ServiceOptions::from(ServiceConfig {
        coalesce_writes: dagnats_leases_core::service::coalesce::CoalesceWrites::On,
        ..ServiceConfig::default()
    });
    let fx = Fx::on_with(NatsServer::start(), options).await;
    let n = dagnats_leases_core::service::coalesce::DEFAULT_SINGLE_WINDOW;
    let (keys, _) = acquire_at_once(&fx, "alone", n).await;
    assert_eq!(stored_by_a_batch(&fx.client, &keys).await, 0);
}

/// The answers the simulated JetStream gives atomic batches are the real server's:
/// the commit's ack names the last sequence and the count; one wrong expected
/// sequence fails the whole batch with 10071 and stores nothing; a subject checked
/// twice in one batch is 10164; a gap is 10176.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_atomic_batch_answers_are_the_simulators() {
    use dagnats_leases_core::service::coalesce::{
        HDR_BATCH_COMMIT, HDR_BATCH_ID, HDR_BATCH_SEQUENCE,
    };
    let fx = Fx::start().await;
    if !test_shards().is_single() {
        // The server's answers, the same on any stream: probed on the one-stream
        // layout, whose keys all share one stream (a batch is one stream's).
        eprintln!("scenarios: the batch probe runs with one shard only");
        return;
    }
    if !has_atomic_batches(&fx.client) {
        eprintln!(
            "scenarios: nats-server {} has no atomic batches (2.12+): nothing to compare",
            fx.client.server_info().version
        );
        return;
    }
    let c = &fx.client;
    let msg = |id: &str, seq: u64, commit: bool, key: &str, expected: u64| {
        let mut h = async_nats::HeaderMap::new();
        h.insert(HDR_BATCH_ID, id);
        h.insert(HDR_BATCH_SEQUENCE, seq.to_string().as_str());
        h.insert(
            "Nats-Expected-Last-Subject-Sequence",
            expected.to_string().as_str(),
        );
        if commit {
            h.insert(HDR_BATCH_COMMIT, "1");
        }
        (format!("$KV.leases.{key}"), h)
    };
    let commit = |subject: String, h: async_nats::HeaderMap| async move {
        let r = c
            .request_with_headers(subject, h, "{}".into())
            .await
            .unwrap();
        serde_json::from_slice::<Value>(&r.payload).unwrap()
    };
    let publish = |subject: String, h: async_nats::HeaderMap| async move {
        c.publish_with_headers(subject, h, "{}".into())
            .await
            .unwrap();
    };
    let (s, h) = msg("ok", 1, false, "wa", 0);
    publish(s, h).await;
    let (s, h) = msg("ok", 2, true, "wb", 0);
    let ack = commit(s, h).await;
    assert_eq!(ack["count"], 2, "{ack}");
    assert_eq!(ack["batch"], "ok", "{ack}");
    let last = ack["seq"].as_u64().unwrap();

    let (s, h) = msg("bad", 1, false, "wc", 0);
    publish(s, h).await;
    let (s, h) = msg("bad", 2, true, "wa", 0);
    let answer = commit(s, h).await;
    assert_eq!(answer["error"]["err_code"], 10071, "{answer}");

    let (s, h) = msg("twice", 1, false, "wd", 0);
    publish(s, h).await;
    let (s, h) = msg("twice", 2, true, "wd", 0);
    let answer = commit(s, h).await;
    assert_eq!(answer["error"]["err_code"], 10164, "{answer}");

    let (s, h) = msg("gap", 2, true, "we", 0);
    let answer = commit(s, h).await;
    assert_eq!(answer["error"]["err_code"], 10176, "{answer}");

    // Nothing of the failed batches is stored: `wc` and `wd` were never written.
    for key in ["wc", "wd"] {
        let reply = c
            .request(
                "$JS.API.STREAM.MSG.GET.KV_leases",
                json!({"last_by_subj": format!("$KV.leases.{key}")})
                    .to_string()
                    .into(),
            )
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(v["error"]["err_code"], 10037, "{key}: {v}");
    }
    let (s, h) = msg("after", 1, true, "wf", 0);
    let ack = commit(s, h).await;
    assert_eq!(
        ack["seq"].as_u64(),
        Some(last + 1),
        "no sequence was used: {ack}"
    );
}

/// The bucket's message count (over every shard's stream), and the last sequence
/// of the stream that holds `key`.
async fn stream_state(client: &async_nats::Client, key: &str) -> (u64, u64) {
    let shards = test_shards();
    let (mut messages, mut last) = (0, 0);
    for i in shards.indexes() {
        let info = client
            .request(
                format!("$JS.API.STREAM.INFO.{}", shards.stream(i)),
                "{}".into(),
            )
            .await
            .unwrap();
        let info: Value = serde_json::from_slice(&info.payload).unwrap();
        messages += info["state"]["messages"].as_u64().unwrap();
        if i == shards.shard_of(key) {
            last = info["state"]["last_seq"].as_u64().unwrap();
        }
    }
    (messages, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churning_key_names_leaves_no_tombstones_and_fences_stay_monotonic_across_a_restart() {
    let mut fx = Fx::start().await;
    let mut changes = fx
        .client
        .subscribe("dagnats.lease.changed.>")
        .await
        .unwrap();
    fx.client.flush().await.unwrap();
    let n = 50;
    let mut last = 0;
    let last_key = format!("churn{}", n - 1);
    for i in 0..n {
        let key = format!("churn{i}");
        let a = fx.acquire(&key, "h1", 60_000).await;
        let r = fx
            .call(
                "release",
                json!({"key": key, "holder": "h1", "revision": a["revision"]}),
            )
            .await;
        assert_eq!(r["released"], true, "{r}");
        last = r["revision"].as_u64().unwrap();
    }
    // Every release's tombstone is purged after its reply: the stream empties,
    // its last sequence stays. Waited on as the server reports it (bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (messages, last_seq) = stream_state(&fx.client, &last_key).await;
        assert_eq!(last_seq, last, "the stream's last sequence moved");
        if messages == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{messages} messages left after {n} acquire+release pairs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One change event per change: an acquire and a release per key, no more.
    for _ in 0..2 * n {
        next_within(&mut changes, 5).await;
    }
    fx.client.flush().await.unwrap();
    let extra = tokio::time::timeout(Duration::from_millis(300), changes.next()).await;
    assert!(
        extra.is_err(),
        "an extra change event: a purge was republished"
    );
    // A key released and purged, acquired again: a higher fence than anything its
    // stream stored (with one shard: than the last release), also after the
    // server restarted with an empty stream.
    let (_, floor) = stream_state(&fx.client, "churn0").await;
    if test_shards().is_single() {
        assert_eq!(floor, last);
    }
    let again = fx.acquire("churn0", "h2", 60_000).await;
    assert!(again["revision"].as_u64().unwrap() > floor, "{again}");
    let after_restart_floor = again["revision"].as_u64().unwrap();
    let r = fx
        .call(
            "release",
            json!({"key": "churn0", "holder": "h2", "revision": again["revision"]}),
        )
        .await;
    let released_at = r["revision"].as_u64().unwrap();
    assert!(released_at > after_restart_floor, "{r}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stream_state(&fx.client, "churn0").await.0 != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tombstone stayed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fx.server.restart();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let fresh = loop {
        let body = json!({"key": "churn0", "holder": "h3", "ttl_ms": 60000});
        if let Ok(Ok(msg)) = tokio::time::timeout(
            Duration::from_secs(2),
            fx.client
                .request("api.leases.acquire", body.to_string().into()),
        )
        .await
        {
            let v: Value = serde_json::from_slice(&msg.payload).unwrap();
            if v["granted"] == true {
                break v;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no grant after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        fresh["revision"].as_u64().unwrap() > released_at,
        "a fence reused after the restart: {fresh}"
    );
}

/// A rolling upgrade, with a stand-in for the next release: it writes a lease
/// record carrying a field this release does not know (as a binding was added in
/// this one). Two instances of this release in one queue group serve it, never as
/// `internal`, and a renew through them keeps the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_written_by_a_stand_in_newer_release_is_served_by_both_instances_and_keeps_its_fields()
 {
    let fx = Fx::start().await;
    let _second = start_service(&fx.server).await;
    let a = fx.acquire("upgrade", "h1", 60_000).await;
    // The newer release's write: this release's fields, and one more.
    let record = json!({
        "holder": "h1",
        "acquired_at": a["acquired_at"],
        "ttl_ms": 60000,
        "next_release_field": {"v": 2},
    });
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-TTL", "60s");
    headers.insert(
        "Nats-Expected-Last-Subject-Sequence",
        a["revision"].to_string().as_str(),
    );
    headers.insert("Dagnats-Lease-Event", "renewed");
    let ack = fx
        .client
        .request_with_headers(
            test_shards().kv_subject("upgrade"),
            headers,
            record.to_string().into(),
        )
        .await
        .unwrap();
    let ack: Value = serde_json::from_slice(&ack.payload).unwrap();
    let revision = ack["seq"].as_u64().expect("stored");
    // Both instances answer (the queue group spreads 20 calls), none `internal`.
    for _ in 0..20 {
        let owner = fx.owner("upgrade").await;
        assert_eq!(
            (&owner["holder"], owner["revision"].as_u64()),
            (&json!("h1"), Some(revision)),
            "{owner}"
        );
    }
    let renewed = fx
        .call(
            "renew",
            json!({"key": "upgrade", "holder": "h1", "revision": revision}),
        )
        .await;
    assert_eq!(renewed["held"], true, "{renewed}");
    let stored = fx
        .client
        .request(
            test_shards().api_subject("STREAM.MSG.GET", "upgrade"),
            json!({"last_by_subj": test_shards().kv_subject("upgrade")})
                .to_string()
                .into(),
        )
        .await
        .unwrap();
    let stored: Value = serde_json::from_slice(&stored.payload).unwrap();
    let data = base64::engine::general_purpose::STANDARD
        .decode(stored["message"]["data"].as_str().unwrap())
        .unwrap();
    let data: Value = serde_json::from_slice(&data).unwrap();
    assert_eq!(data["next_release_field"], json!({"v": 2}), "{data}");
}
