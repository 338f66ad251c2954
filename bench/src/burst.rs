//! A burst (`--burst N`, issue 24 item 5): N acquire requests of distinct keys sent
//! at once, without waiting for any reply, to the tokio service on a fresh
//! nats-server (default, lazy sync); the service's resident memory before, at its
//! peak during, and after. Run twice in one run: with the default bound on calls in
//! flight (`--max-calls-in-flight` left out, 1,024) and with the bound effectively
//! off (`--max-calls-in-flight 1000000`, the baseline), each on its own server.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;

use crate::load::{HOLDER, TTL_MS};
use crate::procs::{self, Impl};
use crate::servers::{self, PASSWORD};

/// Connections the requests are published on (and replies read from).
const CONNECTIONS: usize = 4;
/// The whole burst's bound: replies later than this count as timed out.
const BOUND: Duration = Duration::from_secs(180);
/// Once replies stop coming for this long, the rest count as timed out.
const IDLE: Duration = Duration::from_secs(30);
/// The bound that is effectively none, for the baseline.
const UNBOUNDED: usize = 1_000_000;

/// One burst against one configuration of the service.
#[derive(Debug, Clone, Serialize)]
pub struct BurstRun {
    /// `bounded` (the default) or `unbounded` (the baseline).
    pub label: String,
    /// `--max-calls-in-flight` (the service's default when bounded).
    pub max_calls_in_flight: usize,
    /// Requests sent.
    pub requests: usize,
    /// Replies `granted: true`.
    pub granted: u64,
    /// Replies with an error or not granted.
    pub errors: u64,
    /// The errors by `kind` (`not granted` for a refusal).
    pub error_kinds: std::collections::BTreeMap<String, u64>,
    /// Requests without a reply within the bound.
    pub timed_out: u64,
    /// From the first publish to the last reply, seconds.
    pub seconds_to_last_reply: f64,
    /// From the first publish to the last publish flushed, seconds.
    pub seconds_to_sent: f64,
    /// The service's VmRSS before the burst, KiB.
    pub rss_before_kib: u64,
    /// Its highest VmRSS during the burst (sampled every 10 ms), KiB.
    pub rss_peak_kib: u64,
    /// Its VmRSS 3 s after the last reply, KiB.
    pub rss_after_kib: u64,
    /// Lines of the service's log that report a slow consumer (async-nats drops
    /// messages past a subscription's capacity, 65,536 by default, and reports it;
    /// its event channel is bounded, so this is a lower bound on the reports).
    pub slow_consumer_reports: usize,
    /// Replies per second over the time to the last reply.
    pub replies_per_s: f64,
}

/// The two runs and their ratios.
#[derive(Debug, Clone, Serialize)]
pub struct Burst {
    /// nats-server version and sync.
    pub nats_server: String,
    /// Cores of the machine.
    pub cores: usize,
    /// With the default bound, then without.
    pub runs: Vec<BurstRun>,
    /// Peak RSS growth bounded / unbounded (peak minus before).
    pub rss_growth_bounded_over_unbounded: f64,
    /// Peak RSS bounded / unbounded.
    pub rss_peak_bounded_over_unbounded: f64,
    /// Time to the last reply, bounded / unbounded.
    pub time_bounded_over_unbounded: f64,
}

/// Runs the burst of `n` requests twice and prints the figures.
pub async fn run(out: &Path, n: usize) -> Burst {
    let mut runs = Vec::new();
    let mut version = String::new();
    for (label, bound) in [("bounded", None), ("unbounded", Some(UNBOUNDED))] {
        let server = servers::Nats::start();
        version = server.version.clone();
        let run = one(out, &server, label, bound, n).await;
        runs.push(run);
    }
    let (b, u) = (&runs[0], &runs[1]);
    let growth = |r: &BurstRun| r.rss_peak_kib.saturating_sub(r.rss_before_kib).max(1) as f64;
    let burst = Burst {
        nats_server: format!("{version}, default (lazy) sync"),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        rss_growth_bounded_over_unbounded: growth(b) / growth(u),
        rss_peak_bounded_over_unbounded: b.rss_peak_kib as f64 / u.rss_peak_kib as f64,
        time_bounded_over_unbounded: b.seconds_to_last_reply / u.seconds_to_last_reply,
        runs,
    };
    print(&burst);
    burst
}

fn print(b: &Burst) {
    println!();
    println!(
        "burst of {} acquires at once, nats-server {}, {} cores (shared machine: noisy)",
        b.runs[0].requests, b.nats_server, b.cores
    );
    println!(
        "{:<10} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>6}",
        "run",
        "bound",
        "granted",
        "errors",
        "timed out",
        "sent s",
        "answer s",
        "rss before",
        "rss peak",
        "rss after",
        "slow"
    );
    for r in &b.runs {
        println!(
            "{:<10} {:>8} {:>8} {:>8} {:>9} {:>8.2} {:>9.2} {:>10} {:>10} {:>10} {:>6}",
            r.label,
            r.max_calls_in_flight,
            r.granted,
            r.errors,
            r.timed_out,
            r.seconds_to_sent,
            r.seconds_to_last_reply,
            format!("{} KiB", r.rss_before_kib),
            format!("{} KiB", r.rss_peak_kib),
            format!("{} KiB", r.rss_after_kib),
            r.slow_consumer_reports
        );
    }
    for r in &b.runs {
        if !r.error_kinds.is_empty() {
            println!("{} errors by kind: {:?}", r.label, r.error_kinds);
        }
    }
    println!(
        "bounded / unbounded: RSS growth {:.3}, peak RSS {:.3}, time to the last reply {:.3}",
        b.rss_growth_bounded_over_unbounded,
        b.rss_peak_bounded_over_unbounded,
        b.time_bounded_over_unbounded
    );
}

async fn one(
    out: &Path,
    server: &servers::Nats,
    label: &str,
    bound: Option<usize>,
    n: usize,
) -> BurstRun {
    let imp = Impl::Tokio;
    let admin = server.connect(imp.name()).await;
    let options = procs::Options {
        extra_args: bound
            .map(|b| vec!["--max-calls-in-flight".to_string(), b.to_string()])
            .unwrap_or_default(),
        // The connection's events (slow consumer among them) are logged at info.
        rust_log: Some("info".to_string()),
        ..procs::Options::default()
    };
    let log_label = format!("burst-{label}");
    let running = procs::start_with(
        imp,
        imp.name(),
        &log_label,
        &server.url(),
        out,
        &admin,
        &options,
    )
    .await;
    let pid = running.pid();
    // Warm-up: the first allocations, then settle.
    crate::load::measure(
        &admin,
        crate::load::Op::Acquire,
        &format!("bw{label}"),
        16,
        500,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before_kib = procs::rss_kib(pid);

    // The senders' own subscriptions hold every reply: none is dropped on this side.
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        let c = async_nats::ConnectOptions::new()
            .user_and_password(imp.name().to_string(), PASSWORD.to_string())
            .subscription_capacity(n + 1024)
            .connect(server.url())
            .await
            .expect("connect");
        conns.push(c);
    }
    let granted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicU64::new(0));
    let last_reply = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let kinds = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let mut readers = Vec::new();
    for (ci, c) in conns.iter().enumerate() {
        let mut sub = c
            .subscribe(format!("_INBOX.burst.{label}.{ci}.*"))
            .await
            .expect("subscribe");
        c.flush().await.expect("flush");
        let (granted, errors, answered, last_reply, kinds) = (
            granted.clone(),
            errors.clone(),
            answered.clone(),
            last_reply.clone(),
            kinds.clone(),
        );
        readers.push(tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let v: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap_or_default();
                if v.get("granted") == Some(&serde_json::Value::Bool(true)) {
                    granted.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    let kind = v
                        .get("kind")
                        .and_then(|k| k.as_str())
                        .unwrap_or("not granted")
                        .to_string();
                    *kinds.lock().expect("lock").entry(kind).or_insert(0) += 1;
                }
                answered.fetch_add(1, Ordering::Relaxed);
                *last_reply.lock().expect("lock") = Some(Instant::now());
            }
        }));
    }
    // The requests, built before the clock starts.
    let bodies: Vec<Bytes> = (0..n)
        .map(|i| {
            format!(r#"{{"key":"burst-{label}-{i}","holder":"{HOLDER}","ttl_ms":{TTL_MS}}}"#).into()
        })
        .collect();

    // RSS sampled every 10 ms until told to stop.
    let sampling = Arc::new(AtomicBool::new(true));
    let peak = Arc::new(AtomicU64::new(rss_before_kib));
    let sampler = {
        let (sampling, peak) = (sampling.clone(), peak.clone());
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    && let Some(kib) = s
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    let start = Instant::now();
    let senders: Vec<_> = conns
        .iter()
        .enumerate()
        .map(|(ci, c)| {
            let c = c.clone();
            let mine: Vec<(usize, Bytes)> = bodies
                .iter()
                .enumerate()
                .filter(|(i, _)| i % CONNECTIONS == ci)
                .map(|(i, b)| (i, b.clone()))
                .collect();
            let label = label.to_string();
            tokio::spawn(async move {
                for (i, body) in mine {
                    c.publish_with_reply(
                        "api.leases.acquire",
                        format!("_INBOX.burst.{label}.{ci}.{i}"),
                        body,
                    )
                    .await
                    .expect("publish");
                }
                c.flush().await.expect("flush");
            })
        })
        .collect();
    for s in senders {
        s.await.expect("sender");
    }
    let seconds_to_sent = start.elapsed().as_secs_f64();
    let mut last_count = 0;
    let mut last_progress = Instant::now();
    loop {
        let now = answered.load(Ordering::Relaxed);
        if now as usize >= n || start.elapsed() > BOUND {
            break;
        }
        if now != last_count {
            last_count = now;
            last_progress = Instant::now();
        } else if last_progress.elapsed() > IDLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds_to_last_reply = last_reply
        .lock()
        .expect("lock")
        .map_or(0.0, |t| t.duration_since(start).as_secs_f64());
    tokio::time::sleep(Duration::from_secs(3)).await;
    sampling.store(false, Ordering::Relaxed);
    sampler.await.expect("sampler");
    let rss_after_kib = procs::rss_kib(pid);
    running.stop();
    for r in readers {
        r.abort();
    }
    let log = std::fs::read_to_string(out.join(format!("{log_label}.log"))).unwrap_or_default();
    let slow_consumer_reports = log.lines().filter(|l| l.contains("slow consumer")).count();
    let answered = answered.load(Ordering::Relaxed);
    BurstRun {
        label: label.to_string(),
        max_calls_in_flight: bound.unwrap_or(1024),
        requests: n,
        granted: granted.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        error_kinds: kinds.lock().expect("lock").clone(),
        timed_out: (n as u64).saturating_sub(answered),
        seconds_to_last_reply,
        seconds_to_sent,
        rss_before_kib,
        rss_peak_kib: peak.load(Ordering::Relaxed),
        rss_after_kib,
        slow_consumer_reports,
        replies_per_s: answered as f64 / seconds_to_last_reply.max(1e-9),
    }
}

/// Puts `burst` under the `burst` key of `report.json` in `out`, keeping what a
/// full run wrote there.
pub fn write(out: &Path, burst: &Burst) {
    let path = crate::report::put(out, "burst", serde_json::to_value(burst).expect("json"));
    println!("wrote the burst to {}", path.display());
}
