//! `batch_probe` (issue 15, part 1, "measure first"; re-run on 2.15.1 for issue 24):
//! what ADR-50 atomic batch publishing does for KV-like writes on nats-server (the
//! pinned version; first run on 2.14.0) with `sync_interval: always`, on a single
//! server (an R1 stream) and on a three-node loopback cluster (an R3 stream), in one
//! run.
//!
//! It starts its servers as the benchmark does (`servers` of the bench library:
//! `.nats/bin/nats-server`, as `scripts/install-nats-server` puts it there;
//! `DAGNATS_NATS_SERVER` overrides), creates the service's stream `KV_leases` on
//! each with the config the service creates it with (`bucket::stream_config_with_atomic`
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::{Client, HeaderMap};
use base64::Engine;
use bytes::Bytes;
use clap::Parser;
use dagnats_leases_bench::servers::{ACCOUNTS, Cluster, Nats, Server, Sync};
use dagnats_leases_core::service::bucket::stream_config_with_atomic;
use dagnats_leases_core::subjects::{STREAM, kv_subject};
use futures::StreamExt;
use serde_json::{Value, json};

mod checks;
mod fsyncs;

use checks::checks;
use fsyncs::sync_count;

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
            stream_config_with_atomic(replicas, true),
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
