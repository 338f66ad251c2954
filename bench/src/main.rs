//! `dagnats-leases-bench`: the lease service on tokio and on smol against the floor
//! (a bare JetStream responder doing the same operations) and against etcd, in one
//! run on one machine; latency at concurrency 1, throughput at 16 and 64, the
//! service's memory with 1,000 and 100,000 leases held. `scripts/bench` builds
//! everything and runs it; the report goes to `target/bench/`.
#![warn(missing_docs)]

mod baseline;
#[cfg(feature = "etcd")]
mod etcd;
mod load;
mod memory;
mod procs;
mod report;
mod servers;

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use load::{Op, Stats};
use procs::Impl;

/// The concurrencies measured: latency at 1, throughput at 16 and 64.
pub const CONCURRENCIES: [usize; 3] = [1, 16, 64];

#[derive(Parser)]
#[command(
    name = "dagnats-leases-bench",
    about = "Benchmarks of the lease service"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the baseline responder on api.leases.* (run by the benchmark itself).
    Baseline {
        /// The server.
        #[arg(long)]
        nats_url: String,
    },
}

/// Options of a benchmark run.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// A short smoke run: one round, few calls, a small memory step.
    #[arg(long)]
    pub quick: bool,
    /// Rounds; each runs every implementation once, in a rotating order.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Calls per measurement at concurrency 1.
    #[arg(long)]
    pub calls: Option<usize>,
    /// Calls per measurement at concurrency 16 and 64.
    #[arg(long)]
    pub tp_calls: Option<usize>,
    /// Leases held for the large memory figure.
    #[arg(long)]
    pub mem_leases: Option<usize>,
    /// Leave out etcd.
    #[arg(long)]
    pub no_etcd: bool,
    /// Leave out the memory figures.
    #[arg(long)]
    pub no_memory: bool,
    /// Where the report goes (default: target/bench in the checkout).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Every measurement: operation, implementation, concurrency, one entry per round.
pub type Results = BTreeMap<(Op, String), BTreeMap<usize, Vec<Stats>>>;

fn main() {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match cli.command {
        Some(Command::Baseline { nats_url }) => rt.block_on(baseline::serve(&nats_url)),
        None => rt.block_on(run(cli.run)),
    }
}

async fn run(args: RunArgs) {
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
    let calls = args.calls.unwrap_or(if args.quick { 100 } else { 1000 });
    let tp_calls = args.tp_calls.unwrap_or(if args.quick { 320 } else { 3200 });
    let mem_leases = args
        .mem_leases
        .unwrap_or(if args.quick { 10_000 } else { 100_000 });
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("checkout")
            .join("target/bench")
    });
    std::fs::create_dir_all(&out).expect("report dir");

    let server = servers::Nats::start();
    let url = server.url();
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(std::time::Duration::from_secs(10)))
        .connect(&url)
        .await
        .expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    load::echo_owner(client.clone()).await;
    println!(
        "nats-server {} on {url}; {} cores; {rounds} rounds; {calls} calls at concurrency 1, \
         {tp_calls} at 16 and 64",
        server.version,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );

    // The service creates the bucket; the baseline needs it there.
    procs::start(Impl::Tokio, &url, &out, &client).await.stop();

    #[cfg(feature = "etcd")]
    let etcd = (!args.no_etcd).then(|| etcd::Etcd::start(&out));
    #[cfg(feature = "etcd")]
    let etcd_client = match &etcd {
        Some(e) => Some(e.client().await),
        None => None,
    };
    #[cfg(not(feature = "etcd"))]
    if !args.no_etcd {
        println!("etcd left out: this build lacks the `etcd` feature (scripts/bench turns it on)");
    }

    let mut results: Results = BTreeMap::new();
    for round in 0..rounds {
        let mut order = Impl::ALL.to_vec();
        order.rotate_left(round % Impl::ALL.len());
        for imp in order {
            let running = procs::start(imp, &url, &out, &client).await;
            let tag = format!("{}{round}", imp.name());
            // Warm-up: connections, caches, the first allocations.
            load::measure(&client, &js, Op::Acquire, &format!("w{tag}"), 4, 200).await;
            load::measure(&client, &js, Op::Owner, &format!("w{tag}"), 4, 200).await;
            for op in Op::ALL {
                for c in CONCURRENCIES {
                    let n = if c == 1 { calls } else { tp_calls };
                    let stats = load::measure(&client, &js, op, &tag, c, n).await;
                    results
                        .entry((op, imp.name().to_string()))
                        .or_default()
                        .entry(c)
                        .or_default()
                        .push(stats);
                }
            }
            running.stop();
            println!("round {round}: {} done", imp.name());
        }
        #[cfg(feature = "etcd")]
        if let Some(client) = &etcd_client {
            etcd::measure_all(client, round, calls, tp_calls, &mut results).await;
            println!("round {round}: etcd done");
        }
    }
    #[cfg(feature = "etcd")]
    let etcd_version = etcd.as_ref().map(|e| e.version());
    #[cfg(feature = "etcd")]
    drop(etcd);
    #[cfg(not(feature = "etcd"))]
    let etcd_version: Option<String> = None;
    let nats_version = server.version.clone();
    drop(client);
    drop(server);

    let memory = if args.no_memory {
        None
    } else {
        Some(memory::measure(&out, mem_leases).await)
    };

    let report = report::Report::new(
        &results,
        memory,
        report::Setup {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            nats_server: nats_version,
            etcd: etcd_version,
            rounds,
            calls_c1: calls,
            calls_tp: tp_calls,
        },
    );
    report.print();
    let json = out.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report).expect("json")).expect("write");
    let svg = out.join("latency.svg");
    std::fs::write(&svg, report::plot(&report)).expect("write plot");
    println!("wrote {} and {}", json.display(), svg.display());
}
