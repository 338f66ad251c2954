//! The load generator: closed-loop workers, each sending one request at a time,
//! and the statistics of what they measured.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::{Client, HeaderMap, jetstream};
use bytes::Bytes;
use dagnats_leases_core::record::{LeaseRecord, format_time};
use dagnats_leases_core::subjects::{
    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_LEASE_EVENT, HDR_TTL, inbox_wildcard, kv_subject,
};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

/// The operations measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// Acquire of a fresh key.
    Acquire,
    /// Renew of a held key with its current fence.
    Renew,
    /// Release of a held key.
    Release,
    /// Owner of a held key.
    Owner,
    /// Forward to an owner that echoes.
    Forward,
}

impl Op {
    /// Every operation, in the contract's order.
    pub const ALL: [Op; 5] = [Op::Acquire, Op::Renew, Op::Release, Op::Owner, Op::Forward];

    /// Whether the call writes to the stream (so nats-server's sync matters).
    pub fn writes(self) -> bool {
        matches!(self, Op::Acquire | Op::Renew | Op::Release)
    }

    /// The endpoint name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Release => "release",
            Op::Owner => "owner",
            Op::Forward => "forward",
        }
    }
}

/// The holder every bench lease has, except the forward keys'.
pub const HOLDER: &str = "bench";
/// The holder of the forward keys: the echo owner.
pub const ECHO_HOLDER: &str = "echo";
/// TTL of every bench lease: long enough to outlive a measurement.
pub const TTL_MS: u64 = 120_000;
/// What the forward sends (base64 of "hello, owner").
pub const FORWARD_PAYLOAD: &str = "aGVsbG8sIG93bmVy";

/// What one measurement found.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stats {
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// Calls completed per second over the whole measurement.
    pub ops_per_s: f64,
}

impl Stats {
    fn from(mut lat: Vec<Duration>, elapsed: Duration) -> Stats {
        lat.sort();
        let pick = |p: f64| {
            let i = ((lat.len() as f64 - 1.0) * p).round() as usize;
            lat[i].as_secs_f64() * 1e6
        };
        Stats {
            p50_us: pick(0.50),
            p99_us: pick(0.99),
            ops_per_s: lat.len() as f64 / elapsed.as_secs_f64(),
        }
    }

    /// The median of each figure over several rounds.
    pub fn median(all: &[Stats]) -> Stats {
        let med = |f: fn(&Stats) -> f64| {
            let mut v: Vec<f64> = all.iter().map(f).collect();
            v.sort_by(|a, b| a.total_cmp(b));
            let n = v.len();
            if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            }
        };
        Stats {
            p50_us: med(|s| s.p50_us),
            p99_us: med(|s| s.p99_us),
            ops_per_s: med(|s| s.ops_per_s),
        }
    }
}

/// One operation against one implementation, ready to run: worker `w` of a slice
/// makes the calls numbered `range` and returns their latencies.
pub trait Target: Send + Sync + 'static {
    /// The work of worker `w` over calls `range`.
    fn work(self: Arc<Self>, w: usize, range: Range<usize>) -> BoxFuture<'static, Vec<Duration>>;
}

/// Runs calls `range` of `target` with `concurrency` workers; latencies and the
/// time the slice took.
async fn run_slice(
    target: Arc<dyn Target>,
    concurrency: usize,
    range: Range<usize>,
) -> (Vec<Duration>, Duration) {
    let barrier = Arc::new(tokio::sync::Barrier::new(concurrency + 1));
    let per = range.len().div_ceil(concurrency);
    let mut tasks = Vec::with_capacity(concurrency);
    for w in 0..concurrency {
        let lo = (range.start + w * per).min(range.end);
        let hi = (range.start + (w + 1) * per).min(range.end);
        let work = target.clone().work(w, lo..hi);
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            work.await
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut lat = Vec::with_capacity(range.len());
    for t in tasks {
        lat.extend(t.await.expect("worker"));
    }
    (lat, start.elapsed())
}

/// Measures several implementations of one operation interleaved in time: the
/// calls are cut into `slices`, and each slice runs on every target in turn (the
/// order rotating), so a burst of noise from elsewhere on the machine hits all of
/// them alike. Each target comes with its own number of calls (a slow one may make
/// fewer). Returns the statistics of each target, in order.
pub async fn interleaved(
    targets: &[(Arc<dyn Target>, usize)],
    concurrency: usize,
    slices: usize,
) -> Vec<Stats> {
    let mut lat: Vec<Vec<Duration>> = targets
        .iter()
        .map(|(_, calls)| Vec::with_capacity(*calls))
        .collect();
    let mut elapsed = vec![Duration::ZERO; targets.len()];
    for s in 0..slices {
        for k in 0..targets.len() {
            let t = (k + s) % targets.len();
            let (target, calls) = &targets[t];
            let range = s * calls / slices..(s + 1) * calls / slices;
            let (l, e) = run_slice(target.clone(), concurrency, range).await;
            lat[t].extend(l);
            elapsed[t] += e;
        }
    }
    lat.into_iter()
        .zip(elapsed)
        .map(|(l, e)| Stats::from(l, e))
        .collect()
}

/// Measures one target alone (warm-ups, memory traffic, profiles).
pub async fn alone(target: Arc<dyn Target>, concurrency: usize, calls: usize) -> Stats {
    let (l, e) = run_slice(target, concurrency, 0..calls).await;
    Stats::from(l, e)
}

/// What a target is set up for: `calls` calls of `op` at `concurrency`, its keys
/// kept apart from other runs' by `tag`.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The operation.
    pub op: Op,
    /// Keeps the keys apart (the round, the run).
    pub tag: String,
    /// Workers at once.
    pub concurrency: usize,
    /// Calls in all.
    pub calls: usize,
}

impl Plan {
    /// `calls` calls of `op` at `concurrency`, keys tagged `tag`.
    pub fn new(op: Op, tag: &str, concurrency: usize, calls: usize) -> Self {
        Self {
            op,
            tag: tag.to_string(),
            concurrency,
            calls,
        }
    }

    /// The key of call (or worker) `i`: `<op>-<tag>-<concurrency>-<i>`.
    pub fn key(&self, i: usize) -> String {
        format!("{}-{}-{}-{i}", self.op.name(), self.tag, self.concurrency)
    }

    /// The keys of the first `n` calls (or workers).
    pub fn keys(&self, n: usize) -> Vec<String> {
        (0..n).map(|i| self.key(i)).collect()
    }
}

/// Sets up and measures one operation against one implementation alone.
pub async fn measure(
    client: &Client,
    op: Op,
    tag: &str,
    concurrency: usize,
    calls: usize,
) -> Stats {
    let target = NatsTarget::prepare(client, &Plan::new(op, tag, concurrency, calls)).await;
    alone(target, concurrency, calls).await
}

/// Writes a lease straight into the bucket (the setup of renew, release, owner and
/// forward, not measured); returns its revision.
pub async fn put_lease(js: &jetstream::Context, key: &str, holder: &str) -> u64 {
    let mut headers = HeaderMap::new();
    headers.insert(HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, "0");
    headers.insert(HDR_LEASE_EVENT, "acquired");
    headers.insert(HDR_TTL, format!("{}s", TTL_MS / 1000).as_str());
    let record = LeaseRecord {
        holder: holder.to_string(),
        acquired_at: format_time(time::OffsetDateTime::now_utc()),
        ttl_ms: TTL_MS,
        bound_to: None,
        unknown: Default::default(),
    };
    js.publish_with_headers(kv_subject(key), headers, record.to_json().into())
        .await
        .expect("setup publish")
        .await
        .unwrap_or_else(|e| panic!("setup write of {key}: {e}"))
        .sequence
}

/// Writes many leases, 64 at a time; returns their revisions in order.
pub async fn put_leases(js: &jetstream::Context, keys: &[String], holder: &str) -> Vec<u64> {
    futures::stream::iter(keys.iter())
        .map(|k| put_lease(js, k, holder))
        .buffered(64)
        .collect()
        .await
}

/// Acquires each key through whatever serves `api.leases.*` for `client`'s
/// account, 64 at a time (the setup of release, not measured); returns the
/// revisions granted in order. A release is measured on a lease its service
/// granted, as a deployment's leases are: a lease written behind the service's
/// back is one it may not have heard of (alone, `serve --changes auto` takes no
/// change events), and its release would read the key first.
pub async fn acquire_leases(client: &Client, keys: &[String]) -> Vec<u64> {
    futures::stream::iter(keys.iter())
        .map(|k| async move {
            let body = format!(r#"{{"key":"{k}","holder":"{HOLDER}","ttl_ms":{TTL_MS}}}"#);
            let (_, reply) = call(client, "api.leases.acquire", body.into()).await;
            reply
                .get("revision")
                .and_then(Value::as_u64)
                .unwrap_or_else(|| panic!("setup acquire of {k}: no revision in {reply}"))
        })
        .buffered(64)
        .collect()
        .await
}

/// Whether an owner call writes to the stream (a read confirmation, on a
/// replicated bucket): the stream's last sequence before and after one call.
pub async fn owner_writes(client: &Client) -> bool {
    let js = jetstream::new(client.clone());
    let last = || async {
        js.get_stream(dagnats_leases_core::subjects::STREAM)
            .await
            .expect("the leases stream")
            .cached_info()
            .state
            .last_sequence
    };
    let before = last().await;
    call(
        client,
        "api.leases.owner",
        r#"{"key":"confirm-probe"}"#.into(),
    )
    .await;
    last().await != before
}

/// Replies to every forwarded request with its own body, until the client closes.
pub async fn echo_owner(client: Client) {
    let mut sub = client
        .subscribe(inbox_wildcard(ECHO_HOLDER))
        .await
        .expect("echo subscribes");
    client.flush().await.expect("flush");
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            if let Some(reply) = msg.reply {
                let _ = client.publish(reply, msg.payload).await;
            }
        }
    });
}

/// Calls answered `unavailable` and sent again (see [`call`]), over the whole run.
pub static RETRIED_UNAVAILABLE: AtomicU64 = AtomicU64::new(0);

/// One call; panics on an error reply (a benchmark of failures would measure
/// nothing), except `unavailable`, which the contract says to retry: the call is
/// sent again (up to 10 times; counted in [`RETRIED_UNAVAILABLE`]) and its latency
/// runs to the answer that is not `unavailable`.
async fn call(client: &Client, subject: &'static str, body: Bytes) -> (Duration, Value) {
    let start = Instant::now();
    let mut tries = 0;
    loop {
        let reply = client
            .request(subject, body.clone())
            .await
            .unwrap_or_else(|e| panic!("{subject}: {e}"));
        let value: Value = serde_json::from_slice(&reply.payload)
            .unwrap_or_else(|e| panic!("{subject}: reply is not JSON ({e})"));
        if value.get("kind").and_then(Value::as_str) == Some("unavailable") && tries < 10 {
            tries += 1;
            RETRIED_UNAVAILABLE.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let took = start.elapsed();
        if value.get("error").is_some() || value.get("granted") == Some(&Value::Bool(false)) {
            panic!("{subject}: {value}");
        }
        return (took, value);
    }
}

fn subject(op: Op) -> &'static str {
    match op {
        Op::Acquire => "api.leases.acquire",
        Op::Renew => "api.leases.renew",
        Op::Release => "api.leases.release",
        Op::Owner => "api.leases.owner",
        Op::Forward => "api.leases.forward",
    }
}

/// One operation against whatever serves `api.leases.*` for `client`'s account.
pub struct NatsTarget {
    client: Client,
    op: Op,
    /// Acquire and release: one body per call.
    per_call: Vec<Bytes>,
    /// Renew, owner and forward: one key per worker.
    keys: Vec<String>,
    /// Renew: each worker's current fence.
    revisions: Vec<AtomicU64>,
}

impl NatsTarget {
    /// Sets up the calls of `plan`.
    pub async fn prepare(client: &Client, plan: &Plan) -> Arc<NatsTarget> {
        let js = jetstream::new(client.clone());
        let (op, concurrency, calls) = (plan.op, plan.concurrency, plan.calls);
        let (mut per_call, mut keys, mut revisions) = (Vec::new(), Vec::new(), Vec::new());
        match op {
            Op::Acquire => {
                per_call = plan
                    .keys(calls)
                    .iter()
                    .map(|key| {
                        format!(r#"{{"key":"{key}","holder":"{HOLDER}","ttl_ms":{TTL_MS}}}"#).into()
                    })
                    .collect();
            }
            Op::Release => {
                let keys = plan.keys(calls);
                let revs = acquire_leases(client, &keys).await;
                per_call = keys
                    .iter()
                    .zip(&revs)
                    .map(|(k, r)| {
                        format!(r#"{{"key":"{k}","holder":"{HOLDER}","revision":{r}}}"#).into()
                    })
                    .collect();
            }
            Op::Renew | Op::Owner | Op::Forward => {
                let holder = if op == Op::Forward {
                    ECHO_HOLDER
                } else {
                    HOLDER
                };
                keys = plan.keys(concurrency);
                revisions = put_leases(&js, &keys, holder)
                    .await
                    .into_iter()
                    .map(AtomicU64::new)
                    .collect();
            }
        }
        Arc::new(NatsTarget {
            client: client.clone(),
            op,
            per_call,
            keys,
            revisions,
        })
    }
}

impl Target for NatsTarget {
    fn work(self: Arc<Self>, w: usize, range: Range<usize>) -> BoxFuture<'static, Vec<Duration>> {
        Box::pin(async move {
            let op = self.op;
            let subject = subject(op);
            let mut lat = Vec::with_capacity(range.len());
            match op {
                Op::Acquire | Op::Release => {
                    for i in range {
                        lat.push(
                            call(&self.client, subject, self.per_call[i].clone())
                                .await
                                .0,
                        );
                    }
                }
                Op::Renew | Op::Owner | Op::Forward => {
                    let key = &self.keys[w];
                    let fixed: Bytes = match op {
                        Op::Owner => format!(r#"{{"key":"{key}"}}"#).into(),
                        _ => format!(
                            r#"{{"key":"{key}","payload":"{FORWARD_PAYLOAD}","timeout_ms":5000}}"#
                        )
                        .into(),
                    };
                    for _ in range {
                        let body = match op {
                            Op::Renew => {
                                let revision = self.revisions[w].load(Ordering::Relaxed);
                                format!(
                                    r#"{{"key":"{key}","holder":"{HOLDER}","revision":{revision},"ttl_ms":{TTL_MS}}}"#
                                )
                                .into()
                            }
                            _ => fixed.clone(),
                        };
                        let (took, reply) = call(&self.client, subject, body).await;
                        if op == Op::Renew {
                            let r = reply["revision"].as_u64().expect("renew revision");
                            self.revisions[w].store(r, Ordering::Relaxed);
                        }
                        if op == Op::Forward {
                            assert_eq!(reply["payload"].as_str(), Some(FORWARD_PAYLOAD));
                        }
                        lat.push(took);
                    }
                }
            }
            lat
        })
    }
}
