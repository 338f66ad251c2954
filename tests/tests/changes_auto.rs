//! `serve --changes auto` (the default) on a real server: an instance alone takes no
//! change events, its renewals one write each from its own acks; a second instance
//! started, both hear each other's presence heartbeat and subscribe, and a renew
//! landing on either is one write after the other's. Who subscribes to what is read
//! from the server itself (`CONNZ` with subscriptions, asked by a system user); the
//! writes and reads from a tap on every JetStream API subject and every subject of
//! the bucket, as in `one_request.rs`.

use std::time::Duration;

use async_nats::Client;
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tests::tap::Tap;
use dagnats_leases_tokio::service::{self, ServiceOptions};
use futures::{FutureExt as _, StreamExt as _};
use serde_json::{Value, json};

/// A system account (for `CONNZ`) beside the application's, whose user a
/// client without credentials is.
const ACCOUNTS: &str = r#"
accounts {
  APP { jetstream: enabled, users: [{user: app, password: app}] }
  SYS { users: [{user: sys, password: sys}] }
}
system_account: SYS
no_auth_user: app
"#;

const CHANGES: &str = "dagnats.lease.changed.*";
const PRESENCE: &str = "dagnats.lease.presence";

async fn client(url: String) -> Client {
    async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(10)))
        .connect(url)
        .await
        .expect("connect")
}

async fn call(client: &Client, endpoint: &str, body: Value) -> Value {
    let reply = client
        .request(format!("api.leases.{endpoint}"), body.to_string().into())
        .await
        .expect("a reply");
    serde_json::from_slice(&reply.payload).expect("JSON")
}

/// How many subscriptions on the server are to exactly `subject`.
async fn subscriptions(sys: &Client, subject: &str) -> usize {
    let reply = sys
        .request(
            "$SYS.REQ.SERVER.PING.CONNZ",
            json!({"subscriptions": true}).to_string().into(),
        )
        .await
        .expect("CONNZ answers");
    let connz: Value = serde_json::from_slice(&reply.payload).expect("JSON");
    connz["data"]["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .flat_map(|c| {
            c["subscriptions_list"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|s| s == subject)
        .count()
}

/// Asks the server until `n` subscriptions to `subject` are there, within a bound.
async fn wait_for(sys: &Client, subject: &str, n: usize) {
    let got = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if subscriptions(sys, subject).await == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        got.is_ok(),
        "{n} subscriptions to {subject} within 30 s: {} there",
        subscriptions(sys, subject).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alone_no_change_events_and_with_a_second_instance_both_take_them() {
    let server = tokio::task::spawn_blocking(|| NatsServer::builder().config(ACCOUNTS).start())
        .await
        .unwrap();
    let sys = async_nats::ConnectOptions::with_user_and_password("sys".into(), "sys".into())
        .connect(server.url())
        .await
        .expect("the system user connects");
    let c = client(server.url()).await;
    let mut heartbeats = c.subscribe(PRESENCE).await.unwrap();
    let mut events = c.subscribe("dagnats.lease.changed.k").await.unwrap();
    let mut tap = Tap::new(server.url()).await;

    let a = service::start(
        (server.url(), client(server.url()).await),
        ServiceOptions::default(),
    )
    .await
    .expect("A starts");
    wait_for(&sys, PRESENCE, 2).await; // A's and the test's own

    let got = call(
        &c,
        "acquire",
        json!({"key": "k", "holder": "h", "ttl_ms": 60_000}),
    )
    .await;
    assert_eq!(got["granted"], true, "{got}");
    let mut revision = got["revision"].as_u64().unwrap();
    tap.drain(&c).await;
    let got = call(
        &c,
        "renew",
        json!({"key": "k", "holder": "h", "revision": revision}),
    )
    .await;
    assert_eq!(got["held"], true, "{got}");
    revision = got["revision"].as_u64().unwrap();
    let sent = tap.drain(&c).await;
    assert_eq!((sent.writes, sent.reads), (1, 0), "alone, renew: {sent:?}");

    // Two of A's heartbeats heard: a whole interval alone, and no change events.
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(30), heartbeats.next())
            .await
            .expect("A's heartbeat comes")
            .expect("a message");
    }
    assert_eq!(
        subscriptions(&sys, CHANGES).await,
        0,
        "alone: no change events"
    );

    let b = service::start(
        (server.url(), client(server.url()).await),
        ServiceOptions::default(),
    )
    .await
    .expect("B starts");
    wait_for(&sys, CHANGES, 2).await;

    // B missed A's writes before it subscribed: a renew landing on it now may read
    // first (a stale or unknown fact costs a read, never a lease).
    while let Some(Some(_)) = events.next().now_or_never() {}
    let got = call(
        &c,
        "renew",
        json!({"key": "k", "holder": "h", "revision": revision}),
    )
    .await;
    assert_eq!(got["held"], true, "{got}");
    revision = got["revision"].as_u64().unwrap();
    let sent = tap.drain(&c).await;
    println!("the first renew with two instances: {sent:?}");

    // From now on every write's event reaches both: each renew, on whichever
    // instance, is one write. The test waits for its own copy of the last write's
    // event first: the server queued it to both instances before.
    for n in 0..12 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("the change event comes")
            .expect("a message");
        let sequence = event
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Sequence"))
            .map(|v| v.as_str().to_string());
        assert_eq!(
            sequence,
            Some(revision.to_string()),
            "the last write's event"
        );
        let got = call(
            &c,
            "renew",
            json!({"key": "k", "holder": "h", "revision": revision}),
        )
        .await;
        assert_eq!(got["held"], true, "renew {n}: {got}");
        revision = got["revision"].as_u64().unwrap();
        let sent = tap.drain(&c).await;
        assert_eq!((sent.writes, sent.reads), (1, 0), "renew {n}: {sent:?}");
    }
    b.shutdown().await;
    a.shutdown().await;
}
