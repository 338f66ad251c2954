//! The load generator: closed-loop workers, each sending one request at a time,
//! and the statistics of what they measured.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::{Client, HeaderMap, jetstream};
use bytes::Bytes;
use dagnats_leases_core::record::{
    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_LEASE_EVENT, HDR_TTL, LeaseRecord, format_time,
    inbox_wildcard, kv_subject,
};
use futures::StreamExt;
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

/// Runs `concurrency` workers over `calls` calls split between them; worker `w`
/// gets its index and its range of call numbers and returns its latencies.
pub async fn run_workers<F, Fut>(concurrency: usize, calls: usize, make: F) -> Stats
where
    F: Fn(usize, Range<usize>) -> Fut,
    Fut: Future<Output = Vec<Duration>> + Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(concurrency + 1));
    let per = calls.div_ceil(concurrency);
    let mut tasks = Vec::with_capacity(concurrency);
    for w in 0..concurrency {
        let range = (w * per).min(calls)..((w + 1) * per).min(calls);
        let work = make(w, range);
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            work.await
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut lat = Vec::with_capacity(calls);
    for t in tasks {
        lat.extend(t.await.expect("worker"));
    }
    Stats::from(lat, start.elapsed())
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

/// One call; panics on an error reply (a benchmark of failures would measure nothing).
async fn call(client: &Client, subject: &'static str, body: Bytes) -> (Duration, Value) {
    let start = Instant::now();
    let reply = client
        .request(subject, body)
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    let took = start.elapsed();
    let value: Value = serde_json::from_slice(&reply.payload)
        .unwrap_or_else(|e| panic!("{subject}: reply is not JSON ({e})"));
    if value.get("error").is_some() || value.get("granted") == Some(&Value::Bool(false)) {
        panic!("{subject}: {value}");
    }
    (took, value)
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

/// Measures `op` against whatever serves `api.leases.*` now. `tag` makes the keys
/// of this measurement unique.
pub async fn measure(
    client: &Client,
    js: &jetstream::Context,
    op: Op,
    tag: &str,
    concurrency: usize,
    calls: usize,
) -> Stats {
    let subject = subject(op);
    let name = op.name();
    match op {
        Op::Acquire => {
            let tag = tag.to_string();
            run_workers(concurrency, calls, |_, range| {
                let client = client.clone();
                let tag = tag.clone();
                async move {
                    let mut lat = Vec::with_capacity(range.len());
                    for i in range {
                        let body = format!(
                            r#"{{"key":"{name}-{tag}-{concurrency}-{i}","holder":"{HOLDER}","ttl_ms":{TTL_MS}}}"#
                        );
                        lat.push(call(&client, subject, body.into()).await.0);
                    }
                    lat
                }
            })
            .await
        }
        Op::Release => {
            let keys: Vec<String> = (0..calls)
                .map(|i| format!("{name}-{tag}-{concurrency}-{i}"))
                .collect();
            let revs = put_leases(js, &keys, HOLDER).await;
            let bodies: Arc<Vec<Bytes>> = Arc::new(
                keys.iter()
                    .zip(&revs)
                    .map(|(k, r)| {
                        format!(r#"{{"key":"{k}","holder":"{HOLDER}","revision":{r}}}"#).into()
                    })
                    .collect(),
            );
            run_workers(concurrency, calls, |_, range| {
                let client = client.clone();
                let bodies = bodies.clone();
                async move {
                    let mut lat = Vec::with_capacity(range.len());
                    for i in range {
                        lat.push(call(&client, subject, bodies[i].clone()).await.0);
                    }
                    lat
                }
            })
            .await
        }
        Op::Renew | Op::Owner | Op::Forward => {
            let holder = if op == Op::Forward {
                ECHO_HOLDER
            } else {
                HOLDER
            };
            let keys: Vec<String> = (0..concurrency)
                .map(|w| format!("{name}-{tag}-{concurrency}-{w}"))
                .collect();
            let revs = put_leases(js, &keys, holder).await;
            run_workers(concurrency, calls, |w, range| {
                let client = client.clone();
                let key = keys[w].clone();
                let mut revision = revs[w];
                async move {
                    let mut lat = Vec::with_capacity(range.len());
                    let fixed: Bytes = match op {
                        Op::Owner => format!(r#"{{"key":"{key}"}}"#).into(),
                        _ => format!(
                            r#"{{"key":"{key}","payload":"{FORWARD_PAYLOAD}","timeout_ms":5000}}"#
                        )
                        .into(),
                    };
                    for _ in range {
                        let body = match op {
                            Op::Renew => format!(
                                r#"{{"key":"{key}","holder":"{HOLDER}","revision":{revision},"ttl_ms":{TTL_MS}}}"#
                            )
                            .into(),
                            _ => fixed.clone(),
                        };
                        let (took, reply) = call(&client, subject, body).await;
                        if op == Op::Renew {
                            revision = reply["revision"].as_u64().expect("renew revision");
                        }
                        if op == Op::Forward {
                            assert_eq!(reply["payload"].as_str(), Some(FORWARD_PAYLOAD));
                        }
                        lat.push(took);
                    }
                    lat
                }
            })
            .await
        }
    }
}
