//! Replies only to reply inboxes, on real servers: a caller who may only publish
//! requests steers the service's replies at the bucket (`$KV.leases.<key>`), at
//! JetStream's API (`$JS.API.STREAM.PURGE.KV_leases`, read as a purge on 2.11) and
//! at `$SRV`, and nothing changes: the stream keeps every message and its last
//! sequence, every lease keeps its holder and fence, no steered call runs, and the
//! refusal counter counts each one.
//!
//! Run twice over: with the service as one user allowed the bucket (the check
//! alone must hold), on 2.15.1 and on 2.11.11; and in the documented deployment
//! of two users (docs/security.md), where the serving user may publish only to
//! reply inboxes and is refused the bucket by the server itself.

use std::time::Duration;

use async_nats::{Client, Event};
use dagnats_leases_tests::secure::{Permissions, Users};
use dagnats_leases_tests::{Binary, NatsServer};
use serde_json::{Value, json};
use tokio::sync::mpsc;

#[path = "support/scrape.rs"]
mod scrape;

use scrape::{Served, count, scrape};

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");
const WAIT: Duration = Duration::from_secs(10);
const REPLIES_DROPPED: &str = "dagnats_leases_replies_refused_total";

/// The one-user service list of earlier releases: the bucket and JetStream
/// allowed, so only the service's own check stands between a steered reply and
/// the bucket.
fn one_user_service() -> Permissions {
    Permissions::new()
        .subscribe(["api.leases.>", "$SRV.>", "_INBOX.>"])
        .publish([
            "$JS.API.>",
            "$KV.leases.>",
            "dagnats.lease.inbox.>",
            "_INBOX.>",
        ])
}

/// The documented serving user: reads requests, publishes replies to reply inboxes
/// and forwards to owners' inboxes (their replies come to its own `_INBOX.`).
fn serving_user() -> Permissions {
    Permissions::new()
        .subscribe(["api.leases.>", "$SRV.>", "_INBOX.>"])
        .publish(["_INBOX.>", "_R_.>", "dagnats.lease.inbox.>"])
}

/// The documented backend user: JetStream and the bucket, the change events and
/// the instances' presence heartbeats.
fn backend_user() -> Permissions {
    Permissions::new()
        .subscribe([
            "_dagnats_backend.>",
            "dagnats.lease.changed.>",
            "dagnats.lease.presence",
        ])
        .publish(["$JS.API.>", "$KV.leases.>", "dagnats.lease.presence"])
}

/// A caller who may publish requests and read its own replies, nothing more.
fn caller() -> Permissions {
    Permissions::new()
        .publish(["api.leases.*", "$SRV.>"])
        .subscribe(["_INBOX.>"])
}

fn users(split: bool) -> Users {
    let users =
        Users::new()
            .password("caller", "pw", caller())
            .password("admin", "pw", Permissions::all());
    if split {
        users
            .password("svc", "pw", serving_user())
            .password("backend", "pw", backend_user())
    } else {
        users.password("svc", "pw", one_user_service())
    }
}

/// Connects as `user`; the server's errors (permission violations) arrive on the
/// receiver.
async fn connect_as(server: &NatsServer, user: &str) -> (Client, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), "pw".into())
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let Event::ServerError(e) = event {
                    let _ = tx.send(e.to_string());
                }
            }
        })
        .connect(server.url())
        .await
        .unwrap();
    (client, rx)
}

async fn call(client: &Client, endpoint: &str, body: Value) -> Value {
    let reply = tokio::time::timeout(
        WAIT,
        client.request(format!("api.leases.{endpoint}"), body.to_string().into()),
    )
    .await
    .expect("a reply in time")
    .unwrap();
    serde_json::from_slice(&reply.payload).unwrap()
}

/// The stream's message count and last sequence, and every key's last record.
async fn bucket(admin: &Client) -> (u64, u64, Vec<(String, Value)>) {
    let info = admin
        .request("$JS.API.STREAM.INFO.KV_leases", "{}".into())
        .await
        .unwrap();
    let info: Value = serde_json::from_slice(&info.payload).unwrap();
    let state = &info["state"];
    let mut keys = Vec::new();
    for key in ["victim", "other", "fresh"] {
        keys.push((
            key.to_string(),
            call(admin, "owner", json!({"key": key})).await,
        ));
    }
    (
        state["messages"].as_u64().unwrap(),
        state["last_seq"].as_u64().unwrap(),
        keys,
    )
}

/// Waits until the refusal counter has counted `n`; returns the scrape.
async fn refusals_reach(served: &Served, n: f64) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = scrape(served.addr).await.unwrap();
        let total: f64 = [
            ("api", "not_an_inbox"),
            ("api", "missing"),
            ("srv", "not_an_inbox"),
        ]
        .iter()
        .map(|(s, r)| count(&text, REPLIES_DROPPED, &[("subject", s), ("reason", r)]))
        .sum();
        if total >= n {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{total} of {n} refusals counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn steered_replies_change_nothing(binary: Binary, split: bool) {
    let server = NatsServer::builder()
        .binary(binary)
        .config(users(split).config())
        .start();
    let mut args = vec!["--user", "svc", "--password", "pw"];
    if split {
        args.extend(["--backend-user", "backend", "--backend-password", "pw"]);
    }
    let served = Served::start(BIN, &server.url(), &args).await;
    let (admin, _) = connect_as(&server, "admin").await;
    let (attacker, _) = connect_as(&server, "caller").await;
    let (holder, _) = connect_as(&server, "caller").await;

    let held = call(
        &holder,
        "acquire",
        json!({"key": "victim", "holder": "h1", "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(held["granted"], true, "{held}");
    let other = call(
        &holder,
        "acquire",
        json!({"key": "other", "holder": "h2", "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(other["granted"], true, "{other}");
    let before = bucket(&admin).await;

    // Every endpoint and verb, each steered at the bucket, the JetStream API and
    // the service's own subjects; one with no reply at all.
    let steered_at = [
        "$KV.leases.victim",
        "$KV.leases.victim.read",
        "$JS.API.STREAM.PURGE.KV_leases",
        "$JS.API.STREAM.DELETE.KV_leases",
        "$SRV.PING",
        "api.leases.release",
    ];
    let bodies = [
        ("owner", json!({"key": "other"})),
        (
            "acquire",
            json!({"key": "fresh", "holder": "h3", "ttl_ms": 60000}),
        ),
        (
            "release",
            json!({"key": "victim", "holder": "h1", "revision": held["revision"]}),
        ),
        (
            "renew",
            json!({"key": "victim", "holder": "h1", "revision": held["revision"]}),
        ),
        (
            "forward",
            json!({"key": "victim", "payload": "", "timeout_ms": 100}),
        ),
    ];
    let mut sent_api = 0.0;
    for to in steered_at {
        for (endpoint, body) in &bodies {
            attacker
                .publish_with_reply(
                    format!("api.leases.{endpoint}"),
                    to,
                    body.to_string().into(),
                )
                .await
                .unwrap();
            sent_api += 1.0;
        }
    }
    let mut sent_srv = 0.0;
    for verb in ["$SRV.PING", "$SRV.INFO.dagnats-api", "$SRV.STATS"] {
        for to in steered_at {
            attacker
                .publish_with_reply(verb, to, "".into())
                .await
                .unwrap();
            sent_srv += 1.0;
        }
    }
    attacker
        .publish(
            "api.leases.acquire",
            json!({"key": "fresh", "holder": "h3", "ttl_ms": 60000})
                .to_string()
                .into(),
        )
        .await
        .unwrap();
    attacker.flush().await.unwrap();

    let text = refusals_reach(&served, sent_api + sent_srv + 1.0).await;
    assert_eq!(
        count(
            &text,
            REPLIES_DROPPED,
            &[("subject", "api"), ("reason", "not_an_inbox")]
        ),
        sent_api,
        "{text}"
    );
    assert_eq!(
        count(
            &text,
            REPLIES_DROPPED,
            &[("subject", "srv"), ("reason", "not_an_inbox")]
        ),
        sent_srv
    );
    assert_eq!(
        count(
            &text,
            REPLIES_DROPPED,
            &[("subject", "api"), ("reason", "missing")]
        ),
        1.0
    );
    // No steered call ran: the calls counter saw only the two acquires and the
    // owners read above.
    assert_eq!(
        count(
            &text,
            "dagnats_leases_calls_total",
            &[("endpoint", "release"), ("reply", "ok")]
        ),
        0.0
    );

    let after = bucket(&admin).await;
    assert_eq!(after, before, "the bucket changed");
    assert_eq!(after.2[2].1["held"], false, "a steered acquire ran");
    // The holder still holds at its fence, and a real request is answered.
    let renewed = call(
        &holder,
        "renew",
        json!({"key": "victim", "holder": "h1", "revision": held["revision"]}),
    )
    .await;
    assert_eq!(renewed["held"], true, "{renewed}");
    assert_eq!(served.stop().await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steered_replies_change_nothing_with_one_service_user_on_the_supported_server() {
    steered_replies_change_nothing(Binary::Supported, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steered_replies_change_nothing_with_one_service_user_on_the_oldest_server() {
    steered_replies_change_nothing(Binary::Oldest, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steered_replies_change_nothing_with_the_documented_two_users() {
    steered_replies_change_nothing(Binary::Supported, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_serving_user_is_refused_the_bucket_and_jetstream_by_the_server() {
    let server = NatsServer::builder().config(users(true).config()).start();
    let (svc, mut violations) = connect_as(&server, "svc").await;
    svc.publish("$KV.leases.victim", r#"{"holder":"x"}"#.into())
        .await
        .unwrap();
    svc.publish("$JS.API.STREAM.PURGE.KV_leases", "{}".into())
        .await
        .unwrap();
    svc.flush().await.unwrap();
    for subject in ["$KV.leases.victim", "$JS.API.STREAM.PURGE.KV_leases"] {
        let expected = format!("permissions violation for publish to \"{subject}\"");
        let seen = tokio::time::timeout(WAIT, async {
            while let Some(error) = violations.recv().await {
                if error.to_lowercase().contains(&expected.to_lowercase()) {
                    return;
                }
            }
            panic!("connection closed before {expected}");
        })
        .await;
        assert!(seen.is_ok(), "no violation: {expected}");
    }
}
