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
use dagnats_leases_tokio::service::{self, ServiceOptions};
use futures::FutureExt as _;
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

/// What the tap saw the service send about key `k`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Sent {
    /// Publishes to `$KV.leases.k` (lease writes) and `$KV.leases.k.read`
    /// (read confirmations).
    writes: usize,
    /// Leader reads (`MSG.GET`) and direct gets.
    reads: usize,
    /// Any other JetStream API request, by subject (the service's replicas
    /// re-check asks `STREAM.INFO` now and then: listed, not counted).
    other: Vec<String>,
}

use futures::StreamExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_or_release_of_a_lease_just_granted_is_one_write_and_no_read() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let svc = service::start(client(server.url()).await, ServiceOptions::default())
        .await
        .expect("service starts");
    let c = client(server.url()).await;
    let tap_client = client(server.url()).await;
    let mut tap = tap_client.subscribe("$JS.API.>").await.unwrap();
    let kv = tap_client.subscribe("$KV.leases.>").await.unwrap();
    let mut tap = futures::stream::select(&mut tap, kv);
    tap_client.flush().await.unwrap();
    let mut tap = TapStream(&mut tap);

    let got = call(
        &c,
        "acquire",
        json!({"key": "k", "holder": "a", "ttl_ms": 30_000}),
    )
    .await;
    assert_eq!(got["granted"], true, "{got}");
    let granted = got["revision"].as_u64().unwrap();
    let sent = tap.drain(&tap_client).await;
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
    let sent = tap.drain(&tap_client).await;
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
    let sent = tap.drain(&tap_client).await;
    assert_eq!((sent.writes, sent.reads), (0, 1), "unknown: {sent:?}");

    let released = call(
        &c,
        "release",
        json!({"key": "k", "holder": "a", "revision": revision}),
    )
    .await;
    assert_eq!(released["released"], true, "{released}");
    let sent = tap.drain(&tap_client).await;
    assert_eq!((sent.writes, sent.reads), (1, 0), "release: {sent:?}");
    for subject in &sent.other {
        assert!(subject.starts_with("$JS.API.STREAM.INFO."), "{subject}");
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
    let sent = tap.drain(&tap_client).await;
    assert_eq!((sent.writes, sent.reads), (0, 1), "lost release: {sent:?}");
    svc.shutdown().await;
}

/// The tap: both subscriptions as one stream. Its flush is a PING the server
/// answers after every message it queued for the tap before: every message the
/// service sent before the reply the test already has.
struct TapStream<'a, S>(&'a mut S);

impl<S> TapStream<'_, S>
where
    S: futures::Stream<Item = async_nats::Message> + Unpin,
{
    async fn drain(&mut self, tap_client: &Client) -> Sent {
        tap_client.flush().await.expect("flush the tap");
        let mut sent = Sent::default();
        while let Some(Some(m)) = self.0.next().now_or_never() {
            let subject = m.subject.as_str();
            if subject == "$KV.leases.k" || subject == "$KV.leases.k.read" {
                sent.writes += 1;
            } else if subject.starts_with("$JS.API.STREAM.MSG.GET.")
                || subject.starts_with("$JS.API.DIRECT.GET.")
            {
                sent.reads += 1;
            } else {
                sent.other.push(subject.to_string());
            }
        }
        sent
    }
}
