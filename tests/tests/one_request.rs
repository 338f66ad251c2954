//! One request per renew and per release (issue 29): a renew or a release of a lease
//! the service just granted makes one JetStream write and no read, counted on the
//! wire by a tap that subscribes to every JetStream API subject and every subject
//! of the bucket; a renew naming a revision the service does not know reads first,
//! as before, and the same tap sees that read.

mod common;

use std::time::Duration;

use async_nats::Client;
use common::call_raw;
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tests::tap::Tap;
use dagnats_leases_tokio::service::{self, ServiceOptions};
use serde_json::{Value, json};

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

use futures::StreamExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_or_release_of_a_lease_just_granted_is_one_write_and_no_read() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let svc = service::start(
        (server.url(), client(server.url()).await),
        ServiceOptions::default(),
    )
    .await
    .expect("service starts");
    let c = client(server.url()).await;
    let mut tap = Tap::new(server.url()).await;

    let got = call(
        &c,
        "acquire",
        json!({"key": "k", "holder": "a", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(got["granted"], true, "{got}");
    let granted = got["revision"].as_u64().unwrap();
    let sent = tap.drain(&c).await;
    assert_eq!((sent.writes, sent.reads), (1, 0), "acquire: {sent:?}");

    let renewed = call(
        &c,
        "renew",
        json!({"key": "k", "holder": "a", "revision": granted}),
    )
    .await;
    assert_eq!(renewed["held"], true, "{renewed}");
    let revision = renewed["revision"].as_u64().unwrap();
    assert!(revision > granted);
    let sent = tap.drain(&c).await;
    assert_eq!((sent.writes, sent.reads), (1, 0), "renew: {sent:?}");

    // A revision the service does not know (the one before the grant): read
    // first, as before the known map; the read answers, so nothing is written.
    let stale = call(
        &c,
        "renew",
        json!({"key": "k", "holder": "a", "revision": granted - 1}),
    )
    .await;
    assert_eq!(stale["kind"], "fence_mismatch", "{stale}");
    let sent = tap.drain(&c).await;
    assert_eq!((sent.writes, sent.reads), (0, 1), "unknown: {sent:?}");

    let released = call(
        &c,
        "release",
        json!({"key": "k", "holder": "a", "revision": revision}),
    )
    .await;
    assert_eq!(released["released"], true, "{released}");
    let sent = tap.drain(&c).await;
    assert_eq!((sent.writes, sent.reads), (1, 0), "release: {sent:?}");
    // Besides the release's one write: the replicas re-check, and the purge of
    // the release's tombstone, sent after the reply (the tombstone sweep).
    for subject in &sent.other {
        assert!(
            subject.starts_with("$JS.API.STREAM.INFO.")
                || subject == "$JS.API.STREAM.PURGE.KV_leases",
            "{subject}"
        );
    }

    // The same release again names a revision the key has moved past (the
    // service knows the tombstone): read first, to answer `lost`.
    let again = call(
        &c,
        "release",
        json!({"key": "k", "holder": "a", "revision": revision}),
    )
    .await;
    assert_eq!(again["kind"], "lost", "{again}");
    let sent = tap.drain(&c).await;
    assert_eq!((sent.writes, sent.reads), (0, 1), "lost release: {sent:?}");
    svc.shutdown().await;
}

/// A lease the service never wrote (put straight into the bucket, as the bench's
/// setup does) is known from its change event alone: its record, sequence and
/// `Nats-Time-Stamp` as the real server republishes them. The test waits for the
/// event on its own subscription before it renews: the server queued the event to
/// the service's connection before it read the renew, and the service learns
/// events before it starts the calls read after them. The service takes change
/// events from the start (`changes: always`): alone, `auto` would leave them to
/// its own acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_of_a_lease_known_from_its_change_event_is_one_write_and_no_read() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let options = ServiceOptions::from(dagnats_leases_core::service::ServiceConfig {
        changes: dagnats_leases_core::service::peers::ChangesSetting::Always,
        ..Default::default()
    });
    let svc = service::start((server.url(), client(server.url()).await), options)
        .await
        .expect("service starts");
    let c = client(server.url()).await;
    let mut events = c.subscribe("dagnats.lease.changed.k").await.unwrap();
    let mut tap = Tap::new(server.url()).await;

    let js = async_nats::jetstream::new(c.clone());
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Expected-Last-Subject-Sequence", "0");
    headers.insert("Dagnats-Lease-Event", "acquired");
    headers.insert("Nats-TTL", "30s");
    let record = json!({"holder": "a", "acquired_at": "2026-12-05T00:00:00Z", "ttl_ms": 30_000});
    let revision = js
        .publish_with_headers("$KV.leases.k", headers, record.to_string().into())
        .await
        .expect("publish")
        .await
        .expect("stored")
        .sequence;
    let event = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("the change event comes")
        .expect("a message");
    let stamp = event
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Time-Stamp"));
    assert!(stamp.is_some(), "the server stamps its republished events");
    // The tap's copy of this publish is handed over by this connection's reader
    // on the server: the drain's sentinel, sent on the same connection, comes
    // after it.
    let setup = tap.drain(&c).await;
    assert_eq!((setup.writes, setup.reads), (1, 0), "setup: {setup:?}");

    let renewed = call(
        &c,
        "renew",
        json!({"key": "k", "holder": "a", "revision": revision}),
    )
    .await;
    assert_eq!(renewed["held"], true, "{renewed}");
    assert_eq!(renewed["acquired_at"], "2026-12-05T00:00:00Z", "{renewed}");
    let sent = tap.drain(&c).await;
    assert_eq!((sent.writes, sent.reads), (1, 0), "renew: {sent:?}");
    svc.shutdown().await;
}
