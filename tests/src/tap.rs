//! A tap on the wire: a connection subscribed to every JetStream API subject and
//! every subject of the bucket, counting what the services sent about key `k`, so
//! a test can show a renew or release is one write and no read.

use std::time::Duration;

use async_nats::Client;
use futures::{FutureExt as _, StreamExt as _};

/// What the tap saw the service send about key `k`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Publishes to `$KV.leases.k` (lease writes) and `$KV.leases.k.read`
    /// (read confirmations).
    pub writes: usize,
    /// Leader reads (`MSG.GET`) and direct gets.
    pub reads: usize,
    /// Any other JetStream API request, by subject (the service's replicas
    /// re-check asks `STREAM.INFO` now and then: listed, not counted).
    pub other: Vec<String>,
}

/// The tap: a connection subscribed to every JetStream API subject and every
/// subject of the bucket, and to a sentinel subject of its own.
pub struct Tap {
    /// Kept open while the tap runs.
    _client: Client,
    tapped: futures::stream::SelectAll<async_nats::Subscriber>,
    sentinel: async_nats::Subscriber,
}

impl Tap {
    /// Connects to `url` and subscribes; returns once the server has the
    /// subscriptions.
    pub async fn new(url: String) -> Self {
        let client = async_nats::ConnectOptions::new()
            .request_timeout(Some(Duration::from_secs(10)))
            .connect(url)
            .await
            .expect("connect");
        let mut tapped = futures::stream::SelectAll::new();
        tapped.push(client.subscribe("$JS.API.>").await.unwrap());
        tapped.push(client.subscribe("$KV.leases.>").await.unwrap());
        let sentinel = client.subscribe("tap-sentinel").await.unwrap();
        let mut tap = Self {
            _client: client.clone(),
            tapped,
            sentinel,
        };
        // Subscribed on the server once a sentinel sent after the subscriptions
        // comes back.
        tap.drain(&client).await;
        tap
    }

    /// Everything tapped up to now. `sender` publishes a sentinel the tap itself
    /// receives: the server reads one connection's messages in order and hands each
    /// to the tap before it reads the next, so the sentinel comes after the tap's
    /// copy of every message `sender`'s connection sent before it, and after every
    /// message the service sent before a reply `sender` already has (the service
    /// replies after its requests, on its one connection). The client hands
    /// messages to subscriptions in the order they arrive: once the sentinel is in,
    /// so is everything before it.
    pub async fn drain(&mut self, sender: &Client) -> Sent {
        sender.publish("tap-sentinel", "".into()).await.unwrap();
        sender.flush().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.sentinel.next())
            .await
            .expect("the sentinel comes back")
            .expect("the tap is subscribed");
        let mut sent = Sent::default();
        while let Some(Some(m)) = self.tapped.next().now_or_never() {
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
