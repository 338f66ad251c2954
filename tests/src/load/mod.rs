//! The load driver of the fault suite: holders campaigning for keys, readers, and a
//! watcher of change events, all recording into a [`History`].
//!
//! Holders come in two kinds, side by side in one load ([`HolderKind`]):
//! - the **holder library** as shipped ([`run_library_holder`]): a `Member` with an
//!   `Elector` per key, or with one `Shards` set over the keys
//!   ([`run_library_shards`]); its calls and belief spans are recorded from the
//!   library's own view ([`CampaignObserver`]);
//! - a **client written from leases.md alone** ([`run_leases_md_holder`]), like the
//!   spec's Go example: it tests the service's guarantees to clients that do not use
//!   the library.
//!
//! The leases.md client is one task per (holder, key). It follows the holder rules
//! of the contract with nothing but JSON requests to `api.leases.*`:
//! - acquire; on `granted: true` it owns the key until its local deadline, the send
//!   time of the write that set the lease's TTL plus the TTL (for an idempotent
//!   grant after unanswered writes: the earliest of those sends);
//! - renew every ttl/3 with the last fence; step down on `lost` or
//!   `fence_mismatch`, or when the deadline passes;
//! - retry `unavailable`, `internal` and timeouts with backoff;
//! - while owner, write to the [`FencedStore`] with its fence, checking the
//!   deadline before each write; now and then release the key, to exercise release.
//!
//! Files: this one holds what every holder shares (the calls, the store, the
//! config, the kinds), the readers, the watcher and the [`Load`] that runs them;
//! `library.rs` the holder library's holders; `leases_md.rs` the leases.md client.

mod leases_md;
mod library;

pub use leases_md::run_leases_md_holder;
pub use library::{run_library_holder, run_library_shards};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use std::sync::Mutex;
use std::time::Instant;

use async_nats::Client;
use dagnats_leases_core::{Endpoint, HolderEvent, RequestOutcome};
use dagnats_leases_tokio::member::{CampaignObserver, Member, ObservedRequest};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::history::{
    Belief, Call, Expiry, FencedStore, History, Nanos, Op, Outcome, Record, ms, now,
};

/// How long a holder waits for one reply.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A reply to a lease call, or why there is none.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A success body.
    Ok(Value),
    /// An error reply: its kind and sentence.
    Err(String, String),
    /// No reply in time, or no responders, or a broken body.
    NoReply(String),
}

/// Sends one lease call and waits up to `timeout`.
pub async fn call(client: &Client, endpoint: &str, body: &Value, timeout: Duration) -> Reply {
    let req = client.request(
        format!("{}.{endpoint}", dagnats_leases_core::subjects::API_PREFIX),
        body.to_string().into(),
    );
    match tokio::time::timeout(timeout, req).await {
        Err(_) => Reply::NoReply("timeout".into()),
        Ok(Err(e)) => Reply::NoReply(e.to_string()),
        Ok(Ok(msg)) => match serde_json::from_slice::<Value>(&msg.payload) {
            Err(e) => Reply::NoReply(format!("reply is not JSON: {e}")),
            Ok(v) => match v["kind"].as_str() {
                Some(kind) => Reply::Err(kind.to_owned(), v["error"].to_string()),
                None => Reply::Ok(v),
            },
        },
    }
}

/// Where an owner's writes go.
#[derive(Clone, Debug)]
pub enum StoreTarget {
    /// Straight into an in-process store.
    Local(FencedStore),
    /// Over NATS to [`serve_store`] on this subject (for holder processes).
    Remote(Client, String),
}

impl StoreTarget {
    /// Writes with `fence`; `None` when the store did not answer.
    pub async fn write(&self, key: &str, holder: &str, fence: u64) -> Option<bool> {
        match self {
            StoreTarget::Local(store) => Some(store.write(key, holder, fence)),
            StoreTarget::Remote(client, subject) => {
                let body = json!({"key": key, "holder": holder, "revision": fence});
                let req = client.request(subject.clone(), body.to_string().into());
                let reply = tokio::time::timeout(REQUEST_TIMEOUT, req)
                    .await
                    .ok()?
                    .ok()?;
                Some(&reply.payload[..] == b"accepted")
            }
        }
    }
}

/// Answers store writes sent by holder processes on `subject` until the
/// subscription ends: `accepted` or `rejected`.
pub async fn serve_store(client: Client, subject: String, store: FencedStore) {
    let mut sub = client
        .subscribe(subject)
        .await
        .expect("subscribe the store");
    while let Some(msg) = sub.next().await {
        let Ok(v) = serde_json::from_slice::<Value>(&msg.payload) else {
            continue;
        };
        let (Some(key), Some(holder), Some(rev)) = (
            v["key"].as_str(),
            v["holder"].as_str(),
            v["revision"].as_u64(),
        ) else {
            continue;
        };
        let answer = if store.write(key, holder, rev) {
            "accepted"
        } else {
            "rejected"
        };
        if let Some(reply) = msg.reply {
            let _ = client.publish(reply, answer.into()).await;
        }
    }
}

/// How one holder behaves.
#[derive(Clone, Debug)]
pub struct HolderConfig {
    /// The holder id (unique per process).
    pub holder: String,
    /// The key it campaigns for.
    pub key: String,
    /// The TTL it asks for.
    pub ttl_ms: u64,
    /// How often an owner writes to the store.
    pub write_every: Duration,
    /// How often a candidate tries again after `granted: false`.
    pub campaign_every: Duration,
    /// The chance, at each step of an owner (a write or a renewal, every
    /// `write_every` or so), of releasing the key (0.0 never).
    pub release_chance: f64,
    /// Work between the deadline check and the store write: a pause that lands here
    /// makes the write late. `Duration::ZERO` writes right after the check.
    pub work: Duration,
}

/// Events a holder reports beside the history (for the holder process's stdout).
pub trait Observer: Send + Sync {
    /// The holder checked its deadline and is about to do `work` before writing.
    fn working(&self, _key: &str, _fence: u64) {}
}

struct NoObserver;
impl Observer for NoObserver {}

fn jitter(d: Duration) -> Duration {
    d + d.mul_f64(fastrand::f64() * 0.5)
}

async fn sleep_until(t: Nanos) {
    let left = t.saturating_sub(now());
    if left > 0 {
        tokio::time::sleep(Duration::from_nanos(left)).await;
    }
}

/// How long [`Load::start_holders`] waits at each step for the kinds it started to
/// write through the store (a grant and a first write take milliseconds).
pub const START_WAIT: Duration = Duration::from_secs(10);

/// Which holder a load runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderKind {
    /// The holder library (`Member` and `Elector`).
    Library,
    /// The holder library's shard set (`Member::shards`): one group over every key
    /// of the holder (`key` is them, comma-separated), holding half of them at most.
    LibraryShards,
    /// A client written from leases.md alone.
    LeasesMd,
}

impl HolderKind {
    /// `library` or `leases-md`, as `fault-proc holder` takes it.
    pub fn name(self) -> &'static str {
        match self {
            HolderKind::Library => "library",
            HolderKind::LibraryShards => "library-shards",
            HolderKind::LeasesMd => "leases-md",
        }
    }

    /// The kind of load holder `h`: odd ones leases.md clients, even ones the
    /// library, every second of those with a shard set, so every scenario of three
    /// holders or more runs all three.
    pub fn of(h: usize) -> HolderKind {
        match h % 4 {
            1 | 3 => HolderKind::LeasesMd,
            2 => HolderKind::LibraryShards,
            _ => HolderKind::Library,
        }
    }

    /// The kind of the load holder named `holder` (`holder-{h}`), if it is one.
    pub fn of_holder(holder: &str) -> Option<HolderKind> {
        let h = holder.strip_prefix("holder-")?.parse().ok()?;
        Some(HolderKind::of(h))
    }
}

/// Runs one holder of `kind` until `stop`, then releases what it holds.
pub async fn run_holder(
    kind: HolderKind,
    client: Client,
    cfg: HolderConfig,
    store: StoreTarget,
    history: History,
    stop: Arc<AtomicBool>,
    observer: Arc<dyn Observer>,
) {
    match kind {
        HolderKind::Library => {
            run_library_holder(client, cfg, store, history, stop, observer).await
        }
        HolderKind::LibraryShards => {
            run_library_shards(client, cfg, store, history, stop, observer).await
        }
        HolderKind::LeasesMd => {
            run_leases_md_holder(client, cfg, store, history, stop, observer).await
        }
    }
}

/// Reads the owner of each key in turn until `stop`, recording every answer.
pub async fn run_reader(
    client: Client,
    name: String,
    keys: Vec<String>,
    every: Duration,
    history: History,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        for key in &keys {
            let sent = now();
            let outcome = match call(&client, "owner", &json!({"key": key}), REQUEST_TIMEOUT).await
            {
                Reply::Ok(v) if v["held"] == true => Outcome::Held {
                    holder: v["holder"].as_str().unwrap_or("").to_owned(),
                    revision: v["revision"].as_u64().unwrap_or(0),
                },
                Reply::Ok(_) => Outcome::Free,
                Reply::Err(why, _) | Reply::NoReply(why) => Outcome::Unknown { why },
            };
            history.call(Call {
                key: key.clone(),
                caller: name.clone(),
                op: Op::Read,
                sent,
                replied: now(),
                outcome,
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// What one subscriber saw on `dagnats.lease.changed.>`: for each key, the
/// `Nats-Sequence` of every event in arrival order.
pub type Seen = Arc<std::sync::Mutex<HashMap<String, Vec<u64>>>>;

/// Subscribes to the change events; records expiry markers into `history` (when
/// given) and every sequence into the returned [`Seen`]. Returns once subscribed.
pub async fn watch_events(client: Client, history: Option<History>) -> Seen {
    let seen: Seen = Arc::default();
    let mut sub = client
        .subscribe(dagnats_leases_core::subjects::CHANGED_SUBJECTS)
        .await
        .expect("subscribe to change events");
    client.flush().await.expect("flush the subscription");
    let out = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let observed = now();
            let key = msg.subject.rsplit('.').next().unwrap_or("").to_owned();
            let headers = msg.headers.unwrap_or_default();
            let Some(seq) = headers
                .get("Nats-Sequence")
                .and_then(|s| s.as_str().parse::<u64>().ok())
            else {
                continue;
            };
            if headers.get("Nats-Marker-Reason").is_some()
                && let Some(h) = &history
            {
                h.push(Record::Expiry(Expiry {
                    key: key.clone(),
                    seq,
                    observed,
                }));
            }
            out.lock().unwrap().entry(key).or_default().push(seq);
        }
    });
    seen
}

/// Connects a client for the load to one of `urls`, failing over to the others
/// (async-nats shuffles the list, so which node it lands on is random; see
/// [`connect_only`] for a client on one known node).
pub async fn connect(urls: &[String]) -> Client {
    let addrs: Vec<async_nats::ServerAddr> = urls
        .iter()
        .map(|u| u.parse().unwrap_or_else(|e| panic!("{u}: {e}")))
        .collect();
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .request_timeout(Some(REQUEST_TIMEOUT))
        .connect(addrs)
        .await
        .unwrap_or_else(|e| panic!("connect to {urls:?}: {e}"))
}

/// Connects a client to the server at `url` only: it never fails over to another
/// node, nor to servers the cluster announces. Every call it makes goes through
/// that node, and so is answered by the service instance connected there (the
/// server delivers a request to a local member of the service's queue group before
/// any remote one, and a cut-off node has no remote one), which lets a checker
/// attribute an answer to a node by its caller alone.
pub async fn connect_only(url: &str) -> Client {
    let addr: async_nats::ServerAddr = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .retain_servers_order()
        .ignore_discovered_servers()
        .request_timeout(Some(REQUEST_TIMEOUT))
        .connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Campaigning holders and readers over a set of keys, recording one history.
pub struct Load {
    /// The history every task records into.
    pub history: History,
    /// The store every in-process holder writes through.
    pub store: FencedStore,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The holders' clients, holder `h` on `clients[h]` ([`Load::contest`]).
    clients: Vec<Client>,
}

impl Load {
    /// An idle load with its history and store.
    pub fn new() -> Load {
        let history = History::new();
        Load {
            store: FencedStore::new(history.clone()),
            history,
            stop: Arc::new(AtomicBool::new(false)),
            tasks: Vec::new(),
            clients: Vec::new(),
        }
    }

    /// Starts `holders` holders, each campaigning for every key, holder `h` on a
    /// client connected to one of `urls_of(h)` ([`connect`]), in the steps of
    /// [`Load::start_holders`].
    pub async fn holders(
        &mut self,
        holders: usize,
        keys: &[String],
        ttl_ms: u64,
        urls_of: impl Fn(usize) -> Vec<String>,
    ) {
        let mut clients = Vec::new();
        for h in 0..holders {
            clients.push(connect(&urls_of(h)).await);
        }
        self.start_holders(clients, keys, ttl_ms).await;
    }

    /// Starts `holders` holders like [`Load::holders`], holder `h` on a client
    /// connected to `url_of(h)` only ([`connect_only`]).
    pub async fn pinned_holders(
        &mut self,
        holders: usize,
        keys: &[String],
        ttl_ms: u64,
        url_of: impl Fn(usize) -> String,
    ) {
        let mut clients = Vec::new();
        for h in 0..holders {
            clients.push(connect_only(&url_of(h)).await);
        }
        self.start_holders(clients, keys, ttl_ms).await;
    }

    /// Starts holder `h` (`holder-{h}`, of [`HolderKind::of`]`(h)`) on `clients[h]`,
    /// so that every kind holds a key and writes through the store before the keys
    /// are contested by all. Started all at once, the first holder to campaign takes
    /// every key, and a kind that missed the start holds only after a release or a
    /// fault, if ever (in a scenario of a few seconds, often never). So, in steps:
    /// 1. the library holders campaign for `keys[0]` alone, the leases.md ones for
    ///    `keys[1]` alone, until each kind has an accepted store write;
    /// 2. the shard sets start, over every key (they take free ones: `keys[2..]`,
    ///    which nobody else may hold then), until they have one too;
    /// 3. the library and leases.md holders campaign for every other key as well.
    ///
    /// A step whose writes do not come within [`START_WAIT`] says so and goes on (the
    /// fault suite's verdict fails a kind that held or wrote nothing in its run).
    pub async fn start_holders(&mut self, clients: Vec<Client>, keys: &[String], ttl_ms: u64) {
        assert!(keys.len() >= 3, "a key for each kind of holder: {keys:?}");
        let home = |kind| match kind {
            HolderKind::Library => Some(&keys[0]),
            HolderKind::LeasesMd => Some(&keys[1]),
            HolderKind::LibraryShards => None,
        };
        let kinds = |homed: bool| {
            let mut kinds = Vec::new();
            for kind in (0..clients.len()).map(HolderKind::of) {
                if home(kind).is_some() == homed && !kinds.contains(&kind) {
                    kinds.push(kind);
                }
            }
            kinds
        };
        for (h, client) in clients.iter().enumerate() {
            if let Some(key) = home(HolderKind::of(h)) {
                self.holder_task(h, client.clone(), key.clone(), ttl_ms);
            }
        }
        self.await_writes(&kinds(true)).await;
        for (h, client) in clients.iter().enumerate() {
            if home(HolderKind::of(h)).is_none() {
                self.holder_task(h, client.clone(), keys.join(","), ttl_ms);
            }
        }
        self.await_writes(&kinds(false)).await;
        for (h, client) in clients.iter().enumerate() {
            if let Some(home) = home(HolderKind::of(h)) {
                for key in keys.iter().filter(|k| *k != home) {
                    self.holder_task(h, client.clone(), key.clone(), ttl_ms);
                }
            }
        }
        self.clients = clients;
    }

    /// The library and leases.md holders started by [`Load::start_holders`]
    /// campaign for `keys` too, from now on (the shard sets keep theirs).
    pub fn contest(&mut self, keys: &[String], ttl_ms: u64) {
        for (h, client) in self.clients.clone().into_iter().enumerate() {
            if HolderKind::of(h) != HolderKind::LibraryShards {
                for key in keys {
                    self.holder_task(h, client.clone(), key.clone(), ttl_ms);
                }
            }
        }
    }

    /// Waits until each of `kinds` has an accepted store write, or [`START_WAIT`]
    /// has passed (then says which kinds had none).
    async fn await_writes(&self, kinds: &[HolderKind]) {
        let deadline = Instant::now() + START_WAIT;
        loop {
            let records = self.history.records();
            let missing: Vec<&str> = kinds
                .iter()
                .filter(|kind| {
                    !records.iter().any(|r| {
                        matches!(r, Record::Store(w)
                            if w.accepted && HolderKind::of_holder(&w.holder) == Some(**kind))
                    })
                })
                .map(|kind| kind.name())
                .collect();
            if missing.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                println!(
                    "load: no accepted store write of the {missing:?} holders within \
                     {START_WAIT:?} of their start"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Holder `h`'s task (of [`HolderKind::of`]`(h)`) for `key` (for a shard set:
    /// every key, comma-separated), on `client`.
    fn holder_task(&mut self, h: usize, client: Client, key: String, ttl_ms: u64) {
        let cfg = HolderConfig {
            holder: format!("holder-{h}"),
            key,
            ttl_ms,
            write_every: Duration::from_millis(100),
            campaign_every: Duration::from_millis(150),
            release_chance: 0.01,
            work: Duration::ZERO,
        };
        self.tasks.push(tokio::spawn(run_holder(
            HolderKind::of(h),
            client,
            cfg,
            StoreTarget::Local(self.store.clone()),
            self.history.clone(),
            Arc::clone(&self.stop),
            Arc::new(NoObserver),
        )));
    }

    /// Starts a reader on a client connected to one of `urls` ([`connect`]).
    pub async fn reader(&mut self, name: &str, keys: &[String], urls: &[String]) {
        let client = connect(urls).await;
        self.reader_on(name, keys, client);
    }

    /// Starts a reader on a client connected to `url` only ([`connect_only`]).
    pub async fn pinned_reader(&mut self, name: &str, keys: &[String], url: &str) {
        let client = connect_only(url).await;
        self.reader_on(name, keys, client);
    }

    fn reader_on(&mut self, name: &str, keys: &[String], client: Client) {
        self.tasks.push(tokio::spawn(run_reader(
            client,
            name.to_owned(),
            keys.to_vec(),
            Duration::from_millis(50),
            self.history.clone(),
            Arc::clone(&self.stop),
        )));
    }

    /// A flag the tasks stop on.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Stops every task (holders release what they hold) and waits for them.
    pub async fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks.drain(..) {
            task.await.expect("a load task panicked");
        }
    }
}

impl Default for Load {
    fn default() -> Self {
        Self::new()
    }
}
