//! `dagnats-leases-bench`: the lease service on tokio and on smol against the floor
//! (a bare JetStream responder doing the same operations) and against etcd, in one
//! run on one machine; latency at concurrency 1, throughput at 16 and 64, the
//! service's memory with 1,000 and 100,000 leases held. On request also the cost
//! of read confirmation on a three-node cluster (`--r3`) and the service against
//! an earlier commit's (`--prev-bin`). `scripts/bench` builds everything and runs
//! it; the report goes to `target/bench/`.
#![warn(missing_docs)]

mod baseline;
mod burst;
mod campaign_cost;
mod capacity;
mod cpu_profile;
#[cfg(feature = "etcd")]
mod etcd;
mod load;
mod memory;
mod procs;
mod profile;
mod renew_many_cost;
mod report;
mod run;
mod scale;
mod stand_in;

use dagnats_leases_bench::servers;

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use load::{Op, Stats};

/// The concurrencies measured: latency at 1, throughput at 16 and 64.
pub const CONCURRENCIES: [usize; 3] = [1, 16, 64];
/// Also measured on the three-node cluster and the three-member etcd (`--r3`).
pub const R3_WIDE: usize = 256;

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
        /// Account user.
        #[arg(long)]
        user: String,
        /// Its password.
        #[arg(long)]
        password: String,
    },
    /// What one input costs the holder library's Campaign machine holding many
    /// keys, against a few (stand-in service, virtual time; no NATS).
    CampaignCost {
        /// Shard group sizes, the first the baseline of the ratios.
        #[arg(long, value_delimiter = ',', default_value = "10,100,1000,10000")]
        keys: Vec<usize>,
        /// Where the report goes (default: target/bench in the checkout).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// What a grouped renewal (`renew_many`) costs in JSON on each side: the
    /// holder library's Campaign machine per renewal and the service's JSON per
    /// renewal (stand-in service, virtual time; no NATS).
    RenewManyCost {
        /// Keys one member holds.
        #[arg(long, value_delimiter = ',', default_value = "1000")]
        keys: Vec<usize>,
        /// Rounds per size; the median is reported.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Where the report goes (default: target/bench in the checkout).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Profile baseline and service under callgrind: instructions and allocations per call.
    Profile {
        /// Calls per operation, sequential.
        #[arg(long, default_value_t = 500)]
        calls: usize,
        /// Operations (default: all five).
        #[arg(long, value_delimiter = ',')]
        ops: Vec<String>,
        /// Where the profiles go (default: target/bench in the checkout).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Options of a benchmark run.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// A short smoke run: one round, few calls, a small memory step.
    #[arg(long)]
    pub quick: bool,
    /// Rounds; each starts every implementation afresh.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Calls per measurement at concurrency 1.
    #[arg(long)]
    pub calls: Option<usize>,
    /// Calls per measurement at concurrency 16 and 64.
    #[arg(long)]
    pub tp_calls: Option<usize>,
    /// Slices each measurement is cut into, to interleave the implementations.
    #[arg(long)]
    pub slices: Option<usize>,
    /// Leases held for the large memory figure.
    #[arg(long)]
    pub mem_leases: Option<usize>,
    /// Leave out etcd.
    #[arg(long)]
    pub no_etcd: bool,
    /// Leave out the memory figures.
    #[arg(long)]
    pub no_memory: bool,
    /// nats-server's JetStream sync: `default` (lazy, every 2 minutes: baseline,
    /// tokio, smol), `always` (an fsync before every ack, as etcd does: all three,
    /// named `*-fsync`) or `both` (the default: the three on a lazy server plus
    /// baseline and tokio on a second, `sync_interval: always` server, measured on
    /// acquire, renew and release with half the calls at 16 and 64).
    #[arg(long, value_enum, default_value_t = SyncMode::Both)]
    pub sync: SyncMode,
    /// Short for `--sync always`: the etcd comparison at equal durability, every
    /// implementation and operation at full size.
    #[arg(long, conflicts_with = "sync")]
    pub sync_always: bool,
    /// Also start a three-node nats-server cluster (loopback, `sync_interval:
    /// always` on every node, an R3 bucket with its leader on the node everything
    /// connects to) and measure there, interleaved with the rest, the tokio service
    /// with read confirmation (`tokio-r3`) and without (`tokio-unconfirmed-r3`,
    /// `--unconfirmed-reads-for-tests`: the binary must be built with feature
    /// `dagnats-leases-tokio/__test`), every operation, a quarter of the calls at
    /// 16 and 64.
    /// Ratios confirmed / unconfirmed in the table and in `r3_confirm`.
    #[arg(long)]
    pub r3: bool,
    /// The `dagnats-leases` binary of an earlier commit (`scripts/bench
    /// --r1-against REV` builds it): run as `tokio-prev` beside `tokio` on the R1
    /// server (the lazy one; the fsync one under `--sync always`), every operation.
    /// Ratios tokio / tokio-prev in the table and in `r1_vs_prev`.
    #[arg(long)]
    pub prev_bin: Option<PathBuf>,
    /// The commit `--prev-bin` was built from, for the report.
    #[arg(long, requires = "prev_bin")]
    pub prev_rev: Option<String>,
    /// Where the report goes (default: target/bench in the checkout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The operations measured, e.g. `--ops release` (default: all five): one
    /// operation's figures measured alone, in a shorter run.
    #[arg(long, value_delimiter = ',', value_parser = parse_op)]
    pub ops: Vec<Op>,
    /// Instead of the benchmark: N acquires of distinct keys sent at once to the
    /// tokio service on a fresh (lazy) nats-server, with the default bound on calls
    /// in flight and with it effectively off (`--max-calls-in-flight 1000000`, the
    /// baseline); replies, time and the service's memory; `burst` in report.json.
    #[arg(long, num_args = 0..=1, default_missing_value = "100000", value_name = "N")]
    pub burst: Option<usize>,
    /// Instead of the benchmark: N leases (default 100,000) of TTL 20 s held by the
    /// holder library (members with shard sets of `--scale-per-member`, renewing at ttl/3)
    /// through the tokio service on a `sync_interval: always` server, for
    /// `--scale-secs` once all are held; `scale` in report.json.
    #[arg(long, num_args = 0..=1, default_missing_value = "100000", value_name = "N")]
    pub scale: Option<usize>,
    /// The window of `--scale`, seconds.
    #[arg(long, default_value_t = 120)]
    pub scale_secs: u64,
    /// In `--scale`, start the members one after another, each once the one
    /// before holds its set (or after 15 s), rather than all at once.
    #[arg(long)]
    pub scale_gradual: bool,
    /// Keys in each member's shard set in `--scale`.
    #[arg(long, default_value_t = 1_000)]
    pub scale_per_member: usize,
    /// After the benchmark (or instead of it, with `--capacity-only`): the lease
    /// capacity of each of `--capacity-impls`, side by side: the largest count of
    /// leases of TTL 20 s, renewed at ttl/3, held for `--capacity-hold-secs` with
    /// none lost, ramped by `--capacity-steps`; `capacity` in report.json.
    #[arg(long)]
    pub capacity: bool,
    /// Only the capacity ramp (`--capacity`), no benchmark.
    #[arg(long)]
    pub capacity_only: bool,
    /// The ramp's lease counts (default 10,000, then 25,000 to 150,000 by 25,000; with
    /// `--quick` 1,000 and 2,000).
    #[arg(long, value_delimiter = ',')]
    pub capacity_steps: Vec<usize>,
    /// Seconds each step holds once all its leases are held (default 60; 10 with
    /// `--quick`).
    #[arg(long)]
    pub capacity_hold_secs: Option<u64>,
    /// Implementations ramped, in order: `tokio-fsync`, `tokio-r3`,
    /// `tokio-single-fsync` and `tokio-single-r3` (coalescer off),
    /// `tokio-fsync-shardsN` (`serve --shards N`), `etcd`,
    /// `etcd-r3` (default: tokio-fsync and etcd, and with `--r3` tokio-r3 and
    /// etcd-r3; etcd's left out with `--no-etcd`).
    #[arg(long, value_delimiter = ',')]
    pub capacity_impls: Vec<String>,
    /// Instead of the benchmark: where a renewal's CPU goes. One capacity step
    /// (`--capacity-steps`, default 10,000 leases; `--capacity-hold-secs`, default
    /// 30; `--capacity-impls`, default tokio-fsync, one server only) with, during
    /// its window, nats-server's own profiler and `perf record` of the server, the
    /// service and this process (the holders); the share of each process's CPU by
    /// category, `profile.json` (a column per run) and flame graphs.
    #[arg(long)]
    pub cpu_profile: bool,
    /// The profile's column name after the commit (e.g. `before`).
    #[arg(long, requires = "cpu_profile")]
    pub cpu_profile_label: Option<String>,
}

/// An operation named on the command line (`--ops`).
fn parse_op(name: &str) -> Result<Op, String> {
    Op::ALL
        .into_iter()
        .find(|op| op.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = Op::ALL.iter().map(|op| op.name()).collect();
            format!("`{name}` is not an operation: one of {}", names.join(", "))
        })
}

/// Which nats-servers a run starts (see `--sync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SyncMode {
    /// One server, default (lazy) sync.
    Default,
    /// One server, `sync_interval: always`.
    Always,
    /// Both servers.
    Both,
}

/// The suffix of an implementation's name on the `sync_interval: always` server.
pub const FSYNC: &str = "-fsync";
/// The suffix of an implementation's name on the three-node cluster (`--r3`).
pub const R3: &str = "-r3";

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
        Some(Command::Baseline {
            nats_url,
            user,
            password,
        }) => rt.block_on(baseline::serve(&nats_url, &user, &password)),
        Some(Command::CampaignCost { keys, out }) => {
            let costs = campaign_cost::run(&keys);
            let out = out.unwrap_or_else(|| servers::checkout().join("target/bench"));
            std::fs::create_dir_all(&out).expect("report dir");
            let path = out.join("campaign-cost.json");
            let json = serde_json::to_string_pretty(&costs).expect("costs serialise");
            std::fs::write(&path, json).expect("write the report");
            println!("report: {}", path.display());
        }
        Some(Command::RenewManyCost { keys, rounds, out }) => {
            let costs = renew_many_cost::run(&keys, rounds);
            let out = out.unwrap_or_else(|| servers::checkout().join("target/bench"));
            std::fs::create_dir_all(&out).expect("report dir");
            let path = out.join("renew-many-cost.json");
            let json = serde_json::to_string_pretty(&costs).expect("costs serialise");
            std::fs::write(&path, json).expect("write the report");
            println!("report: {}", path.display());
        }
        Some(Command::Profile { calls, ops, out }) => {
            let ops: Vec<Op> = if ops.is_empty() {
                Op::ALL.to_vec()
            } else {
                Op::ALL
                    .into_iter()
                    .filter(|o| ops.iter().any(|n| n == o.name()))
                    .collect()
            };
            let out = out.unwrap_or_else(|| servers::checkout().join("target/bench"));
            rt.block_on(profile::run(&out, calls, &ops))
        }
        None => rt.block_on(run::run(cli.run)),
    }
}
