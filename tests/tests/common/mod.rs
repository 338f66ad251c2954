//! The fixture of the scenario suite: a real nats-server and the lease service on it.
#![allow(dead_code)]

use std::time::Duration;

use async_nats::Client;
use dagnats_leases_core::Mode;
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::service::{self, ServiceOptions};
use futures::StreamExt;
use serde_json::{Value, json};

/// A server, a client and one service instance.
pub struct Fx {
    pub server: NatsServer,
    pub client: Client,
    pub service: Option<Service>,
}

/// The service under test, on the runtime `DAGNATS_TEST_RUNTIME` names
/// (`tokio`, the default, or `smol`): one suite, run once per runtime.
pub enum Service {
    /// On the test's own tokio runtime.
    Tokio(service::ServiceHandle),
    /// On smol's executor, in a thread of its own; dropping the sender stops it.
    Smol {
        mode: Mode,
        stop: smol::channel::Sender<()>,
        thread: std::thread::JoinHandle<()>,
    },
}

impl Service {
    pub fn mode(&self) -> Mode {
        match self {
            Service::Tokio(h) => h.mode(),
            Service::Smol { mode, .. } => *mode,
        }
    }

    /// Stops the service and waits until it has stopped.
    pub async fn stop(self) {
        match self {
            Service::Tokio(h) => h.shutdown().await,
            Service::Smol { stop, thread, .. } => {
                drop(stop);
                tokio::task::spawn_blocking(move || thread.join().unwrap())
                    .await
                    .unwrap();
            }
        }
    }
}

static RUNTIME: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Which runtime the suite runs the service on.
pub fn runtime() -> String {
    if let Some(r) = RUNTIME.lock().unwrap().clone() {
        return r;
    }
    std::env::var("DAGNATS_TEST_RUNTIME").unwrap_or_else(|_| "tokio".into())
}

/// Overrides `DAGNATS_TEST_RUNTIME` for this process (the runtime benchmark).
pub fn set_runtime(runtime: &str) {
    *RUNTIME.lock().unwrap() = Some(runtime.to_string());
}

impl Fx {
    /// nats-server (the pinned 2.15.1, or `$DAGNATS_NATS_SERVER`) with the service on it.
    pub async fn start() -> Fx {
        Fx::on(NatsServer::start()).await
    }

    /// The service on a given server.
    pub async fn on(server: NatsServer) -> Fx {
        Fx::on_with(server, ServiceOptions::default()).await
    }

    /// The service with these options on a given server.
    pub async fn on_with(server: NatsServer, options: ServiceOptions) -> Fx {
        let service = start_service_with(&server, options).await;
        let client = connect(&server).await;
        Fx {
            server,
            client,
            service: Some(service),
        }
    }

    /// Calls `api.leases.<endpoint>` with a JSON body and returns the reply.
    pub async fn call(&self, endpoint: &str, body: Value) -> Value {
        self.call_raw(endpoint, body.to_string().into_bytes()).await
    }

    /// Calls with raw bytes.
    pub async fn call_raw(&self, endpoint: &str, body: Vec<u8>) -> Value {
        call_raw(&self.client, endpoint, body).await
    }

    pub async fn acquire(&self, key: &str, holder: &str, ttl_ms: u64) -> Value {
        self.call(
            "acquire",
            json!({"key": key, "holder": holder, "ttl_ms": ttl_ms}),
        )
        .await
    }

    pub async fn owner(&self, key: &str) -> Value {
        self.call("owner", json!({"key": key})).await
    }
}

pub async fn call_raw(client: &Client, endpoint: &str, body: Vec<u8>) -> Value {
    let subject = format!("{}.{endpoint}", dagnats_leases_core::subjects::API_PREFIX);
    let reply = client
        .request(subject.clone(), body.into())
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    serde_json::from_slice(&reply.payload)
        .unwrap_or_else(|e| panic!("reply is not JSON ({e}): {:?}", reply.payload))
}

pub async fn connect(server: &NatsServer) -> Client {
    async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(10)))
        .connect(server.url())
        .await
        .expect("connect")
}

pub async fn start_service(server: &NatsServer) -> Service {
    start_service_with(server, ServiceOptions::default()).await
}

pub use dagnats_leases_tests::test_shards;

/// The service with these options, on the runtime the suite runs; with the
/// one-stream layout asked for, on `DAGNATS_TEST_SHARDS` shards instead.
pub async fn start_service_with(server: &NatsServer, mut options: ServiceOptions) -> Service {
    if options.bucket.shards.is_single() {
        options.bucket.shards = test_shards();
    }
    match runtime().as_str() {
        "tokio" => {
            let client = connect(server).await;
            let handle = service::start((server.url(), client), options)
                .await
                .expect("service starts");
            Service::Tokio(handle)
        }
        "smol" => {
            let url = server.url();
            let (stop, stopped) = smol::channel::bounded::<()>(1);
            let (mode_tx, mode_rx) = std::sync::mpsc::channel();
            let thread = std::thread::spawn(move || {
                smol::block_on(async move {
                    let client = dagnats_leases_smol::connect(&url).await.expect("connect");
                    let handle = dagnats_leases_smol::start((url.as_str(), client), options)
                        .await
                        .expect("service starts on smol");
                    mode_tx.send(handle.mode()).unwrap();
                    let _ = stopped.recv().await;
                    handle.shutdown().await;
                })
            });
            let mode =
                tokio::task::spawn_blocking(move || mode_rx.recv().expect("smol service started"))
                    .await
                    .unwrap();
            Service::Smol { mode, stop, thread }
        }
        other => panic!("DAGNATS_TEST_RUNTIME is tokio or smol, not {other:?}"),
    }
}

/// The kind of an error reply, or "" for a success.
pub fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

/// Waits for the next message on a subscription, failing after `secs`.
pub async fn next_within(sub: &mut async_nats::Subscriber, secs: u64) -> async_nats::Message {
    tokio::time::timeout(Duration::from_secs(secs), sub.next())
        .await
        .expect("a message in time")
        .expect("subscription open")
}

/// How many of `keys`' last messages were stored by an atomic batch (every one
/// carries its TTL).
pub async fn stored_by_a_batch(client: &async_nats::Client, keys: &[String]) -> usize {
    use base64::Engine as _;
    let b64d = base64::engine::general_purpose::STANDARD;
    let mut batched = 0;
    for k in keys {
        let reply = client
            .request(
                test_shards().api_subject("STREAM.MSG.GET", k),
                json!({"last_by_subj": test_shards().kv_subject(k)})
                    .to_string()
                    .into(),
            )
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&reply.payload).unwrap();
        let hdrs = b64d.decode(v["message"]["hdrs"].as_str().unwrap()).unwrap();
        let text = String::from_utf8_lossy(&hdrs);
        assert!(text.contains("Nats-TTL"), "{text}");
        if text.contains("Nats-Batch-Id") {
            batched += 1;
        }
    }
    batched
}

/// Whether the server this client is on has ADR-50 atomic batches (2.12 and later).
pub fn has_atomic_batches(client: &async_nats::Client) -> bool {
    let version = client.server_info().version;
    let mut parts = version.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 12)
}

/// Acquires `keys` at once for holder `h`; each is granted with a revision of its
/// own (of its stream: with several shards each stream numbers its own). Returns
/// the replies in order.
pub async fn acquire_all_at_once(client: &Client, keys: &[String], ttl_ms: u64) -> Vec<Value> {
    let acquired = futures::future::join_all(keys.iter().map(|k| {
        let body = json!({"key": k, "holder": "h", "ttl_ms": ttl_ms});
        call_raw(client, "acquire", body.to_string().into_bytes())
    }))
    .await;
    let mut revisions = std::collections::HashSet::new();
    for (k, a) in keys.iter().zip(&acquired) {
        assert_eq!(a["granted"], true, "{k}: {a}");
        let revision = a["revision"].as_u64().expect("a revision");
        assert!(
            revisions.insert((test_shards().stream_of(k), revision)),
            "{k}: {a}"
        );
    }
    acquired
}
