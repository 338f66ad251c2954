//! `batch_probe` (issue 15, part 1, "measure first"; re-run on 2.15.1 for issue 24):
//! what ADR-50 atomic batch publishing does for KV-like writes on nats-server (the
//! pinned version; first run on 2.14.0) with `sync_interval: always`, on a single
//! server (an R1 stream) and on a three-node loopback cluster (an R3 stream), in one
//! run.
//!
//! It starts its servers as the benchmark does (`servers` of the bench library:
//! `.nats/bin/nats-server`, as `scripts/install-nats-server` puts it there;
//! `DAGNATS_NATS_SERVER` overrides), creates the service's stream `KV_leases` on
//! each with the config the service creates it with (`bucket::stream_config_for`
//! of the core, with `allow_atomic`: one message per subject, per-message TTL,
//! delete markers with a 1 s TTL, RePublish of `$KV.leases.*` to
//! `dagnats.lease.changed.{{wildcard(1)}}`), then:
//!
//! 1. checks per-message TTL, RePublish, a failed expected-sequence check and the
//!    batch size limit inside atomic batches (printed as findings);
//! 2. counts the servers' fsync calls per acked write (strace attached to every
//!    process, 256 writes each of single at 1 and 64 in flight, batches of 8 and 64;
//!    not timed);
//! 3. measures writes/s of single publishes (request/reply, 1, 64 and 256 in flight)
//!    against atomic batches of N = 1, 8, 32, 64 messages (several batches in
//!    flight), every write to a fresh key with `Nats-Expected-Last-Subject-Sequence:
//!    0` and `Nats-TTL: 15s` (what an acquire writes), R1 and R3 interleaved in
//!    slices, each slice on a purged stream (so no TTL expires mid-measurement);
//!    on R3 also the Raft appends the slice cost (`pindex` from `/raftz`); after
//!    each slice the stream's message count must equal the writes the acks confirmed.
//!
//! `scripts/bench --batch-probe [--slices 6]`, or
//! `cargo run --release -p dagnats-leases-bench --bin batch_probe [-- --slices 6]`.
//! Results: README.md, Benchmarks, "Atomic batches (issue 15 probe)".

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::{Client, HeaderMap};
use base64::Engine;
use bytes::Bytes;
use clap::Parser;
use dagnats_leases_bench::servers::{ACCOUNTS, Cluster, Nats, Server, Sync};
use dagnats_leases_core::service::bucket::stream_config_for;
use dagnats_leases_core::subjects::{CHANGED_SUBJECTS, STREAM, changed_subject, kv_subject};
use futures::StreamExt;
use serde_json::{Value, json};

/// The TTL every measured write carries (a lease's).
const WRITE_TTL: &str = "15s";

#[derive(Parser, Debug, Clone)]
#[command(
    name = "batch_probe",
    about = "ADR-50 atomic batches against single publishes, R1 and R3, sync_interval: always"
)]
struct Args {
    /// Measurement slices per mode (each mode runs once per cycle, R1 and R3 interleaved).
    #[arg(long, default_value_t = 6)]
    slices: usize,
    /// Writes per slice (a multiple of 64); single publishes at 1 in flight do a quarter.
    #[arg(long, default_value_t = 1024)]
    slice_writes: usize,
    /// Atomic batches in flight at once.
    #[arg(long, default_value_t = 4)]
    batches_in_flight: usize,
    /// Leave out the semantic checks (TTL, RePublish, failed check, size limit).
    #[arg(long)]
    no_checks: bool,
    /// Leave out the fsync count (strace attached to every server for a few
    /// hundred writes per mode; needs `strace` and ptrace).
    #[arg(long)]
    no_sync_count: bool,
}

// ---------------------------------------------------------------------------
// Servers

/// The account the probe writes in: the first of the bench servers' accounts.
const ACCOUNT: &str = ACCOUNTS[0];

/// Where a stream lives: one server (R1) or three (R3, everything connects to n1,
/// the stream's leader).
struct Place {
    name: &'static str,
    server: Server,
    client: Client,
    /// The stream's Raft group (R3).
    raft_group: Option<String>,
}

/// A JetStream API request; the reply's JSON.
async fn api(client: &Client, subject: &str, body: Value) -> Value {
    let request = async_nats::Request::new()
        .payload(body.to_string().into())
        .timeout(Some(Duration::from_secs(10)));
    match client.send_request(subject.to_string(), request).await {
        Ok(m) => serde_json::from_slice(&m.payload).unwrap_or(Value::Null),
        Err(e) => json!({ "error": { "description": e.to_string() } }),
    }
}

impl Place {
    async fn single() -> Place {
        Place::create("R1", Server::Single(Nats::start_sync(Sync::Always)), 1).await
    }

    async fn cluster() -> Place {
        // Started once a three-replica stream can be placed.
        Place::create("R3", Server::Cluster(Cluster::start().await), 3).await
    }

    /// The service's stream on `server` (its config from the core, with
    /// `allow_atomic`), its leader on n1, where the client is.
    async fn create(name: &'static str, server: Server, replicas: usize) -> Place {
        let client = server.connect(ACCOUNT).await;
        let created = api(
            &client,
            &format!("$JS.API.STREAM.CREATE.{STREAM}"),
            stream_config_for(replicas, true),
        )
        .await;
        assert!(created.get("error").is_none(), "create {name}: {created}");
        let mut raft_group = None;
        if replicas > 1 {
            Cluster::pin_leader(&client, STREAM).await;
            let info = api(&client, &format!("$JS.API.STREAM.INFO.{STREAM}"), json!({})).await;
            raft_group = info["cluster"]["raft_group"].as_str().map(str::to_string);
        }
        Place {
            name,
            server,
            client,
            raft_group,
        }
    }

    /// Its servers, n1 first.
    fn nodes(&self) -> &[Nats] {
        self.server.nodes()
    }

    async fn purge(&self) {
        let r = api(
            &self.client,
            &format!("$JS.API.STREAM.PURGE.{STREAM}"),
            json!({}),
        )
        .await;
        assert!(r["success"].as_bool() == Some(true), "purge: {r}");
    }

    async fn messages(&self) -> u64 {
        let info = api(
            &self.client,
            &format!("$JS.API.STREAM.INFO.{STREAM}"),
            json!({}),
        )
        .await;
        info["state"]["messages"].as_u64().unwrap_or(u64::MAX)
    }

    /// The stream group's last appended Raft index on the leader (n1), R3 only.
    fn raft_pindex(&self) -> Option<u64> {
        let group = self.raft_group.as_deref()?;
        // The group belongs to the stream's account; without `acc` /raftz lists the
        // system account's groups only.
        let v = self.nodes()[0].monitor(&format!("/raftz?acc={ACCOUNT}&group={group}"))?;
        v.as_object()?
            .values()
            .find_map(|groups| groups.get(group))?
            .get("pindex")?
            .as_u64()
    }

    /// The last message on `$KV.probe.<key>`: (seq, headers text), or `None`.
    async fn last(&self, key: &str) -> Option<(u64, String)> {
        let r = api(
            &self.client,
            &format!("$JS.API.STREAM.MSG.GET.{STREAM}"),
            json!({ "last_by_subj": kv_subject(key) }),
        )
        .await;
        let m = r.get("message")?;
        let hdrs = m["hdrs"]
            .as_str()
            .and_then(|h| base64::engine::general_purpose::STANDARD.decode(h).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Some((m["seq"].as_u64()?, hdrs))
    }
}

// ---------------------------------------------------------------------------
// Writes

fn write_headers(expected: u64, ttl: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("Nats-Expected-Last-Subject-Sequence", expected.to_string());
    h.insert("Nats-TTL", ttl);
    h
}

fn payload() -> Bytes {
    // About the size of a lease record.
    Bytes::from_static(
        br#"{"holder":"probe-holder-0123456789","acquired_at":"2026-01-01T00:00:00Z","ttl_ms":15000}"#,
    )
}

/// One message of an atomic batch: (key, expected last subject sequence, TTL).
type BatchMsg = (String, u64, String);

/// Publishes an atomic batch: messages 1..N-1 without a reply subject (no ack is
/// waited for), message N with `Nats-Batch-Commit: 1` as a request; the commit's
/// reply as JSON.
async fn atomic_batch(client: &Client, id: &str, msgs: &[BatchMsg]) -> Value {
    let n = msgs.len();
    for (i, (key, expected, ttl)) in msgs.iter().enumerate() {
        let mut h = write_headers(*expected, ttl);
        h.insert("Nats-Batch-Id", id);
        h.insert("Nats-Batch-Sequence", (i + 1).to_string());
        let subject = kv_subject(key);
        if i + 1 < n {
            client
                .publish_with_headers(subject, h, payload())
                .await
                .expect("publish");
        } else {
            h.insert("Nats-Batch-Commit", "1");
            return match client.request_with_headers(subject, h, payload()).await {
                Ok(m) => serde_json::from_slice(&m.payload).unwrap_or(Value::Null),
                Err(e) => json!({ "error": { "description": e.to_string() } }),
            };
        }
    }
    Value::Null
}

async fn single_write(client: &Client, key: &str, expected: u64, ttl: &str) -> Value {
    match client
        .request_with_headers(kv_subject(key), write_headers(expected, ttl), payload())
        .await
    {
        Ok(m) => serde_json::from_slice(&m.payload).unwrap_or(Value::Null),
        Err(e) => json!({ "error": { "description": e.to_string() } }),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Request/reply per message, this many in flight.
    Single(usize),
    /// Atomic batches of this many messages.
    Batch(usize),
}

impl Mode {
    fn label(self, batches_in_flight: usize) -> String {
        match self {
            Mode::Single(c) => format!("single, {c} in flight"),
            Mode::Batch(n) => format!("batch N={n}, {batches_in_flight} in flight"),
        }
    }

    fn messages_in_flight(self, batches_in_flight: usize) -> usize {
        match self {
            Mode::Single(c) => c,
            Mode::Batch(n) => n * batches_in_flight,
        }
    }
}

const MODES: [Mode; 7] = [
    Mode::Single(1),
    Mode::Single(64),
    // As many messages in flight as batches of 64, 4 at once.
    Mode::Single(256),
    Mode::Batch(1),
    Mode::Batch(8),
    Mode::Batch(32),
    Mode::Batch(64),
];

#[derive(Debug, Clone, Default)]
struct Slice {
    writes: usize,
    secs: f64,
    errors: usize,
    first_error: Option<String>,
    /// Latency of each request (single) or batch (first publish to commit ack), us.
    lat_us: Vec<u64>,
    /// Raft appends during the slice (R3).
    appends: Option<u64>,
    /// Messages the stream holds right after the slice (on a purged stream, every
    /// fresh key written once: must equal `writes`).
    stored: u64,
}

/// One slice of `mode` on a purged stream: `writes` fresh keys `<tag>-<i>`.
async fn run_slice(place: &Place, mode: Mode, writes: usize, tag: &str, bif: usize) -> Slice {
    place.purge().await;
    run_writes(place, mode, writes, tag, bif).await
}

/// The writes of [`run_slice`], on the stream as it is.
async fn run_writes(place: &Place, mode: Mode, writes: usize, tag: &str, bif: usize) -> Slice {
    let client = place.client.clone();
    let before = place.raft_pindex();
    let tag: Arc<str> = Arc::from(tag);
    let start = Instant::now();
    let results: Vec<(Result<usize, String>, u64)> = match mode {
        Mode::Single(c) => {
            futures::stream::iter(0..writes)
                .map(|i| {
                    let client = client.clone();
                    let tag = tag.clone();
                    async move {
                        let t = Instant::now();
                        let ack = single_write(&client, &format!("{tag}-{i}"), 0, WRITE_TTL).await;
                        let lat = t.elapsed().as_micros() as u64;
                        if ack.get("error").is_some() || ack.get("seq").is_none() {
                            (Err(ack.to_string()), lat)
                        } else {
                            (Ok(1), lat)
                        }
                    }
                })
                .buffer_unordered(c)
                .collect()
                .await
        }
        Mode::Batch(n) => {
            futures::stream::iter(0..writes / n)
                .map(|b| {
                    let client = client.clone();
                    let tag = tag.clone();
                    async move {
                        let msgs: Vec<BatchMsg> = (0..n)
                            .map(|k| (format!("{tag}-{}", b * n + k), 0, WRITE_TTL.to_string()))
                            .collect();
                        let t = Instant::now();
                        let ack = atomic_batch(&client, &format!("{tag}b{b}"), &msgs).await;
                        let lat = t.elapsed().as_micros() as u64;
                        if ack.get("error").is_none() && ack["count"].as_u64() == Some(n as u64) {
                            (Ok(n), lat)
                        } else {
                            (Err(ack.to_string()), lat)
                        }
                    }
                })
                .buffer_unordered(bif)
                .collect()
                .await
        }
    };
    let secs = start.elapsed().as_secs_f64();
    let after = place.raft_pindex();
    let mut s = Slice {
        secs,
        appends: before.zip(after).map(|(b, a)| a.saturating_sub(b)),
        stored: place.messages().await,
        ..Slice::default()
    };
    for (r, lat) in results {
        s.lat_us.push(lat);
        match r {
            Ok(w) => s.writes += w,
            Err(e) => {
                s.errors += 1;
                s.first_error.get_or_insert(e);
            }
        }
    }
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

// ---------------------------------------------------------------------------
// Semantic checks

/// Collects republished change events on `dagnats.lease.changed.<prefix>*` through
/// `client`.
async fn watch(client: &Client, prefix: &str) -> async_nats::Subscriber {
    let sub = client.subscribe(CHANGED_SUBJECTS).await.expect("subscribe");
    client.flush().await.expect("flush");
    let _ = prefix;
    sub
}

/// Change events for keys starting with `prefix` that arrive within `wait`
/// (stops early once `want` have arrived and 300 ms more passed quietly).
async fn drain(
    sub: &mut async_nats::Subscriber,
    prefix: &str,
    want: usize,
    wait: Duration,
) -> Vec<(async_nats::Message, Instant)> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let limit = if got.len() >= want {
            (tokio::time::Instant::now() + Duration::from_millis(300)).min(deadline)
        } else {
            deadline
        };
        match tokio::time::timeout_at(limit, sub.next()).await {
            Ok(Some(m)) => {
                if m.subject.starts_with(&changed_subject(prefix)) {
                    got.push((m, Instant::now()));
                }
            }
            _ => break,
        }
    }
    got
}

fn header(m: &async_nats::Message, name: &str) -> Option<String> {
    m.headers
        .as_ref()?
        .get(name)
        .map(|v| v.as_str().to_string())
}

fn err_of(ack: &Value) -> String {
    match ack.get("error") {
        Some(e) => format!(
            "err_code {} (http {}): \"{}\"",
            e["err_code"],
            e["code"],
            e["description"].as_str().unwrap_or("?")
        ),
        None => format!("no error: {ack}"),
    }
}

async fn checks(place: &Place) -> Vec<String> {
    let p = place.name;
    let mut out = Vec::new();
    let c = &place.client;

    // Q2: per-message TTL inside a batch.
    place.purge().await;
    let mut sub = watch(c, "ttl").await;
    let keys: Vec<String> = (0..3).map(|i| format!("ttl{p}-{i}")).collect();
    let msgs: Vec<BatchMsg> = keys
        .iter()
        .map(|k| (k.clone(), 0, "2s".to_string()))
        .collect();
    let t0 = Instant::now();
    let ack = atomic_batch(c, &format!("ttl{p}"), &msgs).await;
    let mut events = drain(&mut sub, "ttl", 6, Duration::from_secs(10)).await;
    events.retain(|(m, _)| header(m, "Nats-Marker-Reason").is_some());
    // Arrival of each marker event after the commit was sent (TTL 2 s).
    let marker_ms: Vec<u128> = events
        .iter()
        .map(|(_, at)| at.duration_since(t0).as_millis())
        .collect();
    let mut stored_markers = 0;
    for k in &keys {
        if let Some((_, h)) = place.last(k).await
            && h.contains("Nats-Marker-Reason: MaxAge")
        {
            stored_markers += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut left = 0;
    for k in &keys {
        if place.last(k).await.is_some() {
            left += 1;
        }
    }
    let reasons: Vec<String> = events
        .iter()
        .filter_map(|(m, _)| header(m, "Nats-Marker-Reason"))
        .collect();
    out.push(format!(
        "{p} Q2 TTL in a batch: batch of 3 with Nats-TTL 2s committed ({}); {} marker events \
         republished, reasons {reasons:?}, arriving {}-{} ms after the commit was sent; markers stored for {}/3 \
         keys when read; {left}/3 keys still hold anything 2.5 s later (markers' own 1 s TTL)",
        if ack.get("error").is_none() {
            format!("count {}", ack["count"])
        } else {
            err_of(&ack)
        },
        events.len(),
        marker_ms.iter().min().copied().unwrap_or(0),
        marker_ms.iter().max().copied().unwrap_or(0),
        stored_markers,
    ));

    // Q3: RePublish of batched messages, on n1 and (R3) on n2 as well.
    place.purge().await;
    let n = 32;
    let mut subs = vec![watch(c, "rp").await];
    let other = if place.nodes().len() > 1 {
        Some(place.nodes()[1].connect(ACCOUNT).await)
    } else {
        None
    };
    if let Some(o) = &other {
        subs.push(watch(o, "rp").await);
    }
    let id = format!("rp{p}");
    // Messages 1..N-1 first, then a pause: nothing may be visible before the commit.
    for i in 0..n - 1 {
        let mut h = write_headers(0, WRITE_TTL);
        h.insert("Nats-Batch-Id", id.as_str());
        h.insert("Nats-Batch-Sequence", (i + 1).to_string());
        c.publish_with_headers(kv_subject(&format!("rp{p}-{i}")), h, payload())
            .await
            .expect("publish");
    }
    c.flush().await.expect("flush");
    let early = drain(&mut subs[0], "rp", usize::MAX, Duration::from_millis(500)).await;
    let stored_early = place.messages().await;
    let mut h = write_headers(0, WRITE_TTL);
    h.insert("Nats-Batch-Id", id.as_str());
    h.insert("Nats-Batch-Sequence", n.to_string());
    h.insert("Nats-Batch-Commit", "1");
    let ack = match c
        .request_with_headers(kv_subject(&format!("rp{p}-{}", n - 1)), h, payload())
        .await
    {
        Ok(m) => serde_json::from_slice::<Value>(&m.payload).unwrap_or(Value::Null),
        Err(e) => json!({ "error": { "description": e.to_string() } }),
    };
    for (si, sub) in subs.iter_mut().enumerate() {
        let got = drain(sub, "rp", n, Duration::from_secs(5)).await;
        let mut per_key = std::collections::BTreeMap::<String, usize>::new();
        let mut seqs: Vec<u64> = Vec::new();
        for (m, _) in &got {
            *per_key.entry(m.subject.to_string()).or_default() += 1;
            if let Some(s) = header(m, "Nats-Sequence").and_then(|s| s.parse().ok()) {
                seqs.push(s);
            }
        }
        seqs.sort_unstable();
        let contiguous = seqs.windows(2).all(|w| w[1] == w[0] + 1);
        let max_per_key = per_key.values().copied().max().unwrap_or(0);
        out.push(format!(
            "{p} Q3 RePublish (subscriber on n{}): batch of {n} (ack seq {}, count {}); before the \
             commit {} events and {stored_early} messages stored; after it {} events for {} \
             distinct keys, at most {max_per_key} per key, Nats-Sequence {}..{} contiguous: {contiguous}",
            si + 1,
            ack["seq"],
            ack["count"],
            if si == 0 {
                early.len().to_string()
            } else {
                "-".into()
            },
            got.len(),
            per_key.len(),
            seqs.first().copied().unwrap_or(0),
            seqs.last().copied().unwrap_or(0),
        ));
    }

    // Q4: a failed expected-last-subject-sequence check inside a batch.
    place.purge().await;
    let held = single_write(c, &format!("q4{p}-held"), 0, WRITE_TTL).await;
    let held_seq = held["seq"].as_u64().unwrap_or(0);
    let mut msgs: Vec<BatchMsg> = (0..8)
        .map(|i| (format!("q4{p}-{i}"), 0, WRITE_TTL.to_string()))
        .collect();
    msgs[4] = (format!("q4{p}-held"), held_seq + 7, WRITE_TTL.to_string());
    let ack = atomic_batch(c, &format!("q4{p}"), &msgs).await;
    let mut stored = 0;
    for (k, _, _) in &msgs {
        if !k.ends_with("-held") && place.last(k).await.is_some() {
            stored += 1;
        }
    }
    let held_now = place.last(&format!("q4{p}-held")).await.map(|(s, _)| s);
    out.push(format!(
        "{p} Q4 failed check: batch of 8, message 5 expects {} on a key at seq {held_seq}: {}; \
         of the 7 other keys {stored} stored; the held key's seq now {held_now:?}; stream holds {} message(s)",
        held_seq + 7,
        err_of(&ack),
        place.messages().await,
    ));
    // Two messages to one key, both with an expected sequence, in one batch.
    let msgs: Vec<BatchMsg> = vec![
        (format!("q4{p}-dup"), 0, WRITE_TTL.to_string()),
        (format!("q4{p}-dup"), 0, WRITE_TTL.to_string()),
    ];
    let ack = atomic_batch(c, &format!("q4d{p}"), &msgs).await;
    out.push(format!(
        "{p} Q4 same key twice in one batch, both with an expected sequence: {}; key stored: {}",
        err_of(&ack),
        place.last(&format!("q4{p}-dup")).await.is_some(),
    ));

    // Q5: the batch size limit.
    for n in [1000usize, 1001] {
        place.purge().await;
        let msgs: Vec<BatchMsg> = (0..n)
            .map(|i| (format!("q5{p}{n}-{i}"), 0, WRITE_TTL.to_string()))
            .collect();
        let t = Instant::now();
        let ack = atomic_batch(c, &format!("q5{p}{n}"), &msgs).await;
        let ms = t.elapsed().as_millis();
        out.push(format!(
            "{p} Q5 batch of {n}: {} in {ms} ms; stream holds {} messages",
            if ack.get("error").is_none() {
                format!("accepted, count {}, last seq {}", ack["count"], ack["seq"])
            } else {
                err_of(&ack)
            },
            place.messages().await,
        ));
    }
    // The inflight limit: 51 open (uncommitted) batches on one stream.
    place.purge().await;
    let mut last_ack = Value::Null;
    let mut opened = 0;
    for b in 0..51 {
        let mut h = write_headers(0, WRITE_TTL);
        h.insert("Nats-Batch-Id", format!("open{p}{b}"));
        h.insert("Nats-Batch-Sequence", "1");
        // As a request: the server answers an open batch's message with an empty ack.
        match c
            .request_with_headers(kv_subject(&format!("open{p}-{b}")), h, payload())
            .await
        {
            Ok(m) if m.payload.is_empty() => opened += 1,
            Ok(m) => {
                last_ack = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
                break;
            }
            Err(e) => {
                last_ack = json!({ "error": { "description": e.to_string() } });
                break;
            }
        }
    }
    out.push(format!(
        "{p} Q5 open batches: {opened} opened (each first message answered with an empty ack), \
         the next: {}",
        err_of(&last_ack)
    ));
    // Let the open batches time out (10 s) later; purge now.
    place.purge().await;
    out
}

// ---------------------------------------------------------------------------
// fsync count

/// Counts the fsync/fdatasync calls of every server of `place` while `writes`
/// fresh keys are written in `mode` (strace -f -c attached to each process, not
/// timed). Per node: syscalls per committed message; `None` if strace failed.
async fn sync_count(
    place: &Place,
    mode: Mode,
    writes: usize,
    tag: &str,
    bif: usize,
) -> Option<(Slice, Vec<u64>)> {
    place.purge().await;
    let dir = tempfile::tempdir().ok()?;
    let mut tracers = Vec::new();
    for (i, node) in place.nodes().iter().enumerate() {
        let out = dir.path().join(format!("strace-{i}"));
        let child = Command::new("strace")
            .args([
                "-f",
                "-c",
                "-e",
                "trace=fsync,fdatasync,sync_file_range",
                "-o",
            ])
            .arg(&out)
            .arg("-p")
            .arg(node.pid().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        tracers.push((child, out));
    }
    // Attaching to every thread of a Go process takes a moment.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let s = run_writes(place, mode, writes, tag, bif).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut counts = Vec::new();
    for (mut child, out) in tracers {
        // SIGINT: strace detaches and writes its summary.
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let _ = child.wait();
        let text = std::fs::read_to_string(&out).ok()?;
        // Summary rows: "% time seconds usecs/call calls [errors] syscall".
        let calls: u64 = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let name = *f.last()?;
                if ["fsync", "fdatasync", "sync_file_range"].contains(&name) {
                    f.get(3)?.parse::<u64>().ok()
                } else {
                    None
                }
            })
            .sum();
        counts.push(calls);
    }
    Some((s, counts))
}

// ---------------------------------------------------------------------------

async fn run(args: Args) {
    let r1 = Place::single().await;
    let r3 = Place::cluster().await;
    println!(
        "nats-server {} (R1: one server; R3: three nodes on loopback, stream leader n1), \
         sync_interval: always on every node; {} cores",
        r1.server.version(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let places = [r1, r3];

    if !args.no_checks {
        // The open-batch check leaves up to 50 batches open for 10 s; the
        // measurements start after they are gone.
        for place in &places {
            for line in checks(place).await {
                println!("{line}");
            }
        }
        tokio::time::sleep(Duration::from_secs(11)).await;
    }

    if !args.no_sync_count {
        for place in &places {
            for (mi, mode) in [
                Mode::Single(1),
                Mode::Single(64),
                Mode::Batch(8),
                Mode::Batch(64),
            ]
            .into_iter()
            .enumerate()
            {
                let writes = 256;
                match sync_count(
                    place,
                    mode,
                    writes,
                    &format!("f{}{mi}", place.name),
                    args.batches_in_flight.max(1),
                )
                .await
                {
                    Some((s, counts)) => println!(
                        "{} fsyncs, {}: {} writes acked, {} stored; fsync calls per node {:?} = {} per acked write",
                        place.name,
                        mode.label(args.batches_in_flight.max(1)),
                        s.writes,
                        s.stored,
                        counts,
                        counts
                            .iter()
                            .map(|&c| format!("{:.2}", c as f64 / s.writes.max(1) as f64))
                            .collect::<Vec<_>>()
                            .join(" / "),
                    ),
                    None => println!("{} fsyncs: strace did not run (skipped)", place.name),
                }
            }
        }
    }

    let bif = args.batches_in_flight.max(1);
    let slice_writes = (args.slice_writes / 64).max(1) * 64;
    // The slowest modes get a quarter slice, so that no slice outlives the writes'
    // 15 s TTL: single at 1 in flight, and batches of 1 (on 2.15.1 an R1 batch of
    // 1 commits about 60 per second, 1,024 writes took 15 to 16 s).
    let writes_of = |m: Mode| match m {
        Mode::Single(1) | Mode::Batch(1) => slice_writes / 4,
        _ => slice_writes,
    };
    // Warm-up: one small slice of everything.
    for (pi, place) in places.iter().enumerate() {
        for (mi, mode) in MODES.iter().enumerate() {
            run_slice(place, *mode, 128, &format!("w{pi}m{mi}"), bif).await;
        }
    }
    // Interleaved: each cycle runs every mode once on R1 and once on R3, the order
    // of the modes rotated by one each cycle.
    let mut slices: Vec<Vec<Vec<Slice>>> = vec![vec![Vec::new(); MODES.len()]; places.len()];
    let start = Instant::now();
    for cycle in 0..args.slices {
        for k in 0..MODES.len() {
            let mi = (k + cycle) % MODES.len();
            for (pi, place) in places.iter().enumerate() {
                let s = run_slice(
                    place,
                    MODES[mi],
                    writes_of(MODES[mi]),
                    &format!("c{cycle}p{pi}m{mi}"),
                    bif,
                )
                .await;
                assert!(
                    s.secs < 14.0,
                    "{} {} (cycle {cycle}): a slice took {:.1} s: TTLs would expire inside \
                     it; {} writes committed, {} errors (first: {:?}), slowest request or \
                     batch {:.1} ms",
                    place.name,
                    MODES[mi].label(bif),
                    s.secs,
                    s.writes,
                    s.errors,
                    s.first_error,
                    s.lat_us.iter().copied().max().unwrap_or(0) as f64 / 1000.0,
                );
                slices[pi][mi].push(s);
            }
        }
        eprintln!(
            "cycle {}/{} done ({:.0} s)",
            cycle + 1,
            args.slices,
            start.elapsed().as_secs_f64()
        );
    }
    places[0].purge().await;
    places[1].purge().await;

    // The table.
    let rate = |s: &Slice| s.writes as f64 / s.secs;
    let med_rate = |v: &[Slice]| median(v.iter().map(rate).collect());
    let single64 = |pi: usize| med_rate(&slices[pi][1]);
    println!();
    println!(
        "{} slices per mode, {slice_writes} writes per slice ({} at single/1 and batch N=1), each write a fresh key \
         with Nats-Expected-Last-Subject-Sequence: 0 and Nats-TTL: 15s; writes/s = committed \
         messages / slice time, median over slices (min-max)",
        args.slices,
        slice_writes / 4
    );
    println!();
    println!(
        "| stream | mode | msgs in flight | writes/s median | min-max | p50 latency per request/batch, ms | vs single@64 same stream | R3 / R1 same mode | msgs per Raft append | errors | stream holds every acked write |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (pi, place) in places.iter().enumerate() {
        for (mi, mode) in MODES.iter().enumerate() {
            let v = &slices[pi][mi];
            let rates: Vec<f64> = v.iter().map(rate).collect();
            let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = rates.iter().copied().fold(0.0, f64::max);
            let lat: Vec<f64> = v
                .iter()
                .flat_map(|s| s.lat_us.iter().map(|&l| l as f64))
                .collect();
            let r3_r1 = med_rate(&slices[1][mi]) / med_rate(&slices[0][mi]);
            let appends: u64 = v.iter().filter_map(|s| s.appends).sum();
            let writes: usize = v.iter().map(|s| s.writes).sum();
            let errors: usize = v.iter().map(|s| s.errors).sum();
            let unmatched = v.iter().filter(|s| s.stored != s.writes as u64).count();
            println!(
                "| {} | {} | {} | {:.0} | {:.0}-{:.0} | {:.2} | {:.2} | {} | {} | {} | {} |",
                place.name,
                mode.label(bif),
                mode.messages_in_flight(bif),
                med_rate(v),
                lo,
                hi,
                median(lat) / 1000.0,
                med_rate(v) / single64(pi),
                if pi == 1 {
                    format!("{r3_r1:.2}")
                } else {
                    "-".into()
                },
                if place.raft_group.is_some() && appends > 0 {
                    format!("{:.1}", writes as f64 / appends as f64)
                } else {
                    "-".into()
                },
                errors,
                if unmatched == 0 {
                    "yes".to_string()
                } else {
                    format!("no, in {unmatched} slices")
                },
            );
            if let Some(e) = v.iter().find_map(|s| s.first_error.as_deref()) {
                println!("|   first error | {e} | | | | | | | | | |");
            }
        }
    }
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(args));
}
