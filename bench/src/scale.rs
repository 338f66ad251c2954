//! Scale (`--scale N`, issue 24 item 4): N leases of TTL 20 s held by the holder
//! library (members with shard sets, `Member::shards`, each renewing at ttl/3)
//! through the tokio service on the `sync_interval: always` server, for a window
//! of `--scale-secs` once every lease is held: renewals/s, leases lost (goal 0),
//! renew p99 as the holders see it, CPU and memory of the service, the server and
//! this process (where the members run).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dagnats_leases_tokio::member::{Member, Ownership};
use dagnats_leases_tokio::telemetry;
use serde::Serialize;

use crate::procs::{self, Impl};
use crate::servers::{self, PASSWORD};

/// The leases' TTL.
pub(crate) const TTL: Duration = Duration::from_secs(20);

/// What the window showed.
#[derive(Debug, Clone, Serialize)]
pub struct Scale {
    /// nats-server version and sync.
    pub nats_server: String,
    /// Cores of the machine.
    pub cores: usize,
    /// Leases asked for.
    pub leases: usize,
    /// Members (one connection each), each with a shard set of up to
    /// `--scale-per-member` keys.
    pub members: usize,
    /// TTL, seconds; renewed at a third of it.
    pub ttl_s: u64,
    /// Whether members joined one after another (`--scale-gradual`).
    pub gradual: bool,
    /// Seconds until every lease was held (or the ramp's bound).
    pub ramp_s: f64,
    /// Leases held when the window began.
    pub held_at_start: i64,
    /// Leases held when it ended.
    pub held_at_end: i64,
    /// The window, seconds.
    pub window_s: f64,
    /// Renewals answered per second in the window (the holders' count).
    pub renewals_per_s: f64,
    /// What ttl/3 asks for: leases / (ttl / 3).
    pub renewals_per_s_needed: f64,
    /// Step-downs in the window (any reason): leases lost. Goal 0.
    pub leases_lost: u64,
    /// Renew latency p50 and p99 as the holders saw it, ms (the holder library's
    /// `dagnats_leases_renew_duration_seconds`, a summary over its last minute).
    pub renew_p50_ms: f64,
    /// See `renew_p50_ms`.
    pub renew_p99_ms: f64,
    /// CPU of the service, the server and this process (the members), in cores
    /// (1.0 = one core busy) over the window.
    pub cpu_service: f64,
    /// See `cpu_service`.
    pub cpu_server: f64,
    /// See `cpu_service`.
    pub cpu_members: f64,
    /// VmRSS at the window's end, KiB: service, server, this process.
    pub rss_service_kib: u64,
    /// See `rss_service_kib`.
    pub rss_server_kib: u64,
    /// See `rss_service_kib`.
    pub rss_members_kib: u64,
}

/// utime + stime of `pid`, seconds.
pub(crate) fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // After the command: state is field 3, utime 14, stime 15 (1-based).
    (ticks(11) + ticks(12)) as f64 / clk_tck()
}

pub(crate) fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// A sample's value from Prometheus text: the first line starting with `prefix`.
pub(crate) fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The sum of every sample of `name` (any labels).
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Members of the holder library (`Member::shards`, one connection each), each
/// holding its own range of keys `<prefix>-<i>` at [`TTL`]: how many leases are
/// held now, and how many were lost (step-downs, any reason) since they began.
pub(crate) struct Holders {
    url: String,
    account: String,
    prefix: String,
    members: usize,
    /// Leases held now.
    pub held: Arc<AtomicI64>,
    /// Step-downs so far.
    pub lost: Arc<AtomicU64>,
    /// Step-downs so far by reason (`deadline_missed`, `lost`, ...), so a step
    /// that loses leases says why.
    pub lost_by_reason: Arc<Mutex<BTreeMap<String, u64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Holders {
    /// No members yet; they will connect to `url` as `account`.
    pub fn new(url: &str, account: &str, prefix: &str) -> Holders {
        Holders {
            url: url.to_string(),
            account: account.to_string(),
            prefix: prefix.to_string(),
            members: 0,
            held: Arc::new(AtomicI64::new(0)),
            lost: Arc::new(AtomicU64::new(0)),
            lost_by_reason: Arc::default(),
            tasks: Vec::new(),
        }
    }

    /// Starts one more member, on a connection of its own, campaigning for every
    /// key numbered in `keys` (its shard set).
    pub async fn add_member(&mut self, keys: std::ops::Range<usize>) {
        let client = async_nats::ConnectOptions::new()
            .user_and_password(self.account.clone(), PASSWORD.to_string())
            .connect(self.url.as_str())
            .await
            .expect("connect");
        let member =
            Member::new(client, format!("{}-{}", self.prefix, self.members)).expect("member");
        self.members += 1;
        let mine: Vec<String> = keys.map(|i| format!("{}-{i}", self.prefix)).collect();
        let mine: Vec<&str> = mine.iter().map(String::as_str).collect();
        let mut shards = member.shards(&mine, mine.len(), TTL).expect("shards");
        let (held, lost) = (self.held.clone(), self.lost.clone());
        let by_reason = self.lost_by_reason.clone();
        self.tasks.push(tokio::spawn(async move {
            let _member = member;
            while let Some(change) = shards.next().await {
                match change.ownership {
                    Ownership::Elected { .. } => {
                        held.fetch_add(1, Ordering::Relaxed);
                    }
                    Ownership::SteppedDown { reason } => {
                        held.fetch_sub(1, Ordering::Relaxed);
                        lost.fetch_add(1, Ordering::Relaxed);
                        let mut by_reason = by_reason.lock().expect("reasons");
                        *by_reason.entry(reason.to_string()).or_default() += 1;
                    }
                    #[allow(unreachable_patterns)]
                    _ => {}
                }
            }
        }));
    }

    /// Step-downs so far, by reason: `deadline_missed 2, lost 1`.
    pub fn lost_reasons(&self) -> String {
        let by_reason = self.lost_by_reason.lock().expect("reasons");
        let parts: Vec<String> = by_reason.iter().map(|(r, n)| format!("{r} {n}")).collect();
        parts.join(", ")
    }

    /// Members started so far.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Stops every member (their connections close).
    pub fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

/// Holds `n` leases for `secs` once all are held, and prints the figures.
pub async fn run(out: &Path, n: usize, secs: u64, per_member: usize, gradual: bool) -> Scale {
    let per_member = per_member.max(1);
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_bucket_duration(Duration::from_secs(20))
        .expect("bucket duration")
        .install_recorder()
        .expect("a metrics recorder");
    let server = servers::Nats::start_sync(servers::Sync::Always);
    let imp = Impl::Tokio;
    let admin = server.connect(imp.name()).await;
    let running = procs::start(imp, "scale-tokio", &server.url(), None, out, &admin).await;
    let members = n.div_ceil(per_member).max(1);
    println!(
        "scale: {n} leases of TTL {}s in {members} members, nats-server {} (sync always), {} cores (shared machine: noisy)",
        TTL.as_secs(),
        server.version,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut holders = Holders::new(&server.url(), imp.name(), "scale");
    let (held, lost) = (holders.held.clone(), holders.lost.clone());
    let start = Instant::now();
    for m in 0..members {
        holders
            .add_member(m * per_member..((m + 1) * per_member).min(n))
            .await;
        // Members join one after another: the next once this one holds its set
        // (or after 15 s), so no one campaigns for every key at once.
        if gradual {
            let want = ((m + 1) * per_member).min(n) as i64;
            let joined = Instant::now();
            while held.load(Ordering::Relaxed) < want && joined.elapsed() < Duration::from_secs(15)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    // The ramp: until every lease is held, at most 5 minutes.
    let ramp_bound = Duration::from_secs(90) + start.elapsed();
    let mut last_print = Instant::now();
    while (held.load(Ordering::Relaxed) as usize) < n && start.elapsed() < ramp_bound {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if last_print.elapsed() > Duration::from_secs(10) {
            println!(
                "scale: {} held after {:.0} s",
                held.load(Ordering::Relaxed),
                start.elapsed().as_secs_f64()
            );
            last_print = Instant::now();
        }
    }
    let ramp_s = start.elapsed().as_secs_f64();
    // A third of a TTL to settle into the renew rhythm.
    tokio::time::sleep(TTL / 3).await;
    let held_at_start = held.load(Ordering::Relaxed);
    println!("scale: {held_at_start} held after {ramp_s:.1} s; the window begins");
    let me = std::process::id();
    let (svc, srv) = (running.pid(), server.pid());
    let cpu0 = (cpu_s(svc), cpu_s(srv), cpu_s(me));
    let text0 = handle.render();
    let renews0 = sample(&text0, &format!("{}_count", telemetry::RENEW_DURATION)).unwrap_or(0.0);
    let lost0 = lost.load(Ordering::Relaxed);
    let w0 = Instant::now();
    while w0.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(15)).await;
        println!(
            "scale: {:.0} s, {} held, {} lost",
            w0.elapsed().as_secs_f64(),
            held.load(Ordering::Relaxed),
            lost.load(Ordering::Relaxed) - lost0
        );
    }
    let window_s = w0.elapsed().as_secs_f64();
    let cpu1 = (cpu_s(svc), cpu_s(srv), cpu_s(me));
    let text = handle.render();
    std::fs::write(out.join("scale-metrics.txt"), &text).ok();
    let renews = sample(&text, &format!("{}_count", telemetry::RENEW_DURATION)).unwrap_or(0.0);
    let q = |quantile: &str| {
        sample(
            &text,
            &format!("{}{{quantile=\"{quantile}\"}}", telemetry::RENEW_DURATION),
        )
        .map_or(f64::NAN, |s| s * 1e3)
    };
    let scale = Scale {
        nats_server: format!("{}, sync_interval: always", server.version),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        leases: n,
        members,
        ttl_s: TTL.as_secs(),
        gradual,
        ramp_s,
        held_at_start,
        held_at_end: held.load(Ordering::Relaxed),
        window_s,
        renewals_per_s: (renews - renews0) / window_s,
        renewals_per_s_needed: n as f64 / (TTL.as_secs_f64() / 3.0),
        leases_lost: lost.load(Ordering::Relaxed) - lost0,
        renew_p50_ms: q("0.5"),
        renew_p99_ms: q("0.99"),
        cpu_service: (cpu1.0 - cpu0.0) / window_s,
        cpu_server: (cpu1.1 - cpu0.1) / window_s,
        cpu_members: (cpu1.2 - cpu0.2) / window_s,
        rss_service_kib: procs::rss_kib(svc),
        rss_server_kib: procs::rss_kib(srv),
        rss_members_kib: procs::rss_kib(me),
    };
    let step_downs = total(&text, telemetry::STEP_DOWNS) + 0.0;
    for line in text
        .lines()
        .filter(|l| l.starts_with(telemetry::STEP_DOWNS) || l.starts_with(telemetry::SLOWPATH))
    {
        println!("  {line}");
    }
    println!();
    println!(
        "scale: {} leases (TTL {} s, renewed at ttl/3) in {} members over {:.0} s, nats-server {}",
        scale.leases, scale.ttl_s, scale.members, scale.window_s, scale.nats_server
    );
    println!(
        "  held {} at the start, {} at the end; lost in the window {} (step-downs in the whole run {step_downs})",
        scale.held_at_start, scale.held_at_end, scale.leases_lost
    );
    println!(
        "  renewals/s {:.0} (ttl/3 asks {:.0}); renew p50 {:.1} ms, p99 {:.1} ms",
        scale.renewals_per_s, scale.renewals_per_s_needed, scale.renew_p50_ms, scale.renew_p99_ms
    );
    println!(
        "  CPU (cores): service {:.2}, server {:.2}, members {:.2}; RSS: service {} KiB, server {} KiB, members {} KiB",
        scale.cpu_service,
        scale.cpu_server,
        scale.cpu_members,
        scale.rss_service_kib,
        scale.rss_server_kib,
        scale.rss_members_kib
    );
    holders.stop();
    running.stop();
    scale
}

/// Puts `scale` under the `scale` key of `report.json` in `out`.
pub fn write(out: &Path, scale: &Scale) {
    let path = crate::report::put(out, "scale", serde_json::to_value(scale).expect("json"));
    println!("wrote the scale run to {}", path.display());
}
