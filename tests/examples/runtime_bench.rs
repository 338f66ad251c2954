//! Acquire latency of the service on smol against the service on tokio, measured in
//! one run on one nats-server: the baseline is the tokio service, the figure is the
//! ratio. `scripts/bench-runtimes` runs it in release mode.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use dagnats_leases_tests::NatsServer;
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn measure(
    server: &NatsServer,
    runtime: &str,
    round: usize,
    n: usize,
) -> (Duration, Duration) {
    common::set_runtime(runtime);
    let service = common::start_service(server).await;
    let client = common::connect(server).await;
    let mut lat = Vec::with_capacity(n);
    for i in 0..(n + 200) {
        let body =
            json!({"key": format!("{runtime}-{round}-{i}"), "holder": "bench", "ttl_ms": 60000});
        let start = Instant::now();
        let reply = common::call_raw(&client, "acquire", body.to_string().into_bytes()).await;
        let took = start.elapsed();
        assert_eq!(reply["granted"], true, "{reply}");
        if i >= 200 {
            lat.push(took);
        }
    }
    service.stop().await;
    lat.sort();
    (percentile(&lat, 0.5), percentile(&lat, 0.99))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let server = NatsServer::start();
    println!(
        "acquire of a fresh key, sequential, {n} calls per round, nats-server {}",
        server.version()
    );
    println!(
        "{:<8} {:>6} {:>10} {:>10}",
        "runtime", "round", "p50 us", "p99 us"
    );
    let mut p50 = std::collections::BTreeMap::<&str, Vec<Duration>>::new();
    for round in 0..3 {
        for runtime in ["tokio", "smol"] {
            let (a, b) = measure(&server, runtime, round, n).await;
            println!(
                "{runtime:<8} {round:>6} {:>10} {:>10}",
                a.as_micros(),
                b.as_micros()
            );
            p50.entry(runtime).or_default().push(a);
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let t = median(p50.get_mut("tokio").unwrap());
    let s = median(p50.get_mut("smol").unwrap());
    println!(
        "median p50: tokio {} us, smol {} us; ratio smol/tokio = {:.3}",
        t.as_micros(),
        s.as_micros(),
        s.as_secs_f64() / t.as_secs_f64()
    );
}
