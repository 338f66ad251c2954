//! A benchmark run as the command line asks for it (no subcommand): the servers
//! and implementations it starts, the rounds of interleaved measurements, the
//! memory figures, the report and, with `--capacity`, the capacity ramp; or,
//! instead of the benchmark, `--burst`, `--scale`, `--capacity-only` or
//! `--cpu-profile`.

use std::collections::BTreeMap;

use dagnats_leases_bench::servers;

use crate::load::{self, Op};
use crate::procs::{self, Impl};
use crate::{CONCURRENCIES, FSYNC, R3, R3_WIDE, Results, RunArgs, SyncMode};
use crate::{burst, capacity, cpu_profile, memory, report, scale};

#[cfg(feature = "etcd")]
use crate::etcd;

/// Where an implementation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The single server with the default (lazy) sync.
    Lazy,
    /// The single server with `sync_interval: always`.
    Fsync,
    /// The three-node cluster, `sync_interval: always`, an R3 bucket.
    R3,
}

impl Place {
    /// What the implementation's name gets.
    fn suffix(self) -> &'static str {
        match self {
            Place::Lazy => "",
            Place::Fsync => FSYNC,
            Place::R3 => R3,
        }
    }

    /// The sync in the report's `setup.nats_sync`.
    fn sync_name(self) -> &'static str {
        match self {
            Place::Lazy => "default",
            Place::Fsync => "always",
            Place::R3 => "always, 3-node cluster, R3",
        }
    }

    /// The services' environment here. On the lazy server the write coalescer is
    /// off (`DAGNATS_LEASES_COALESCE_WRITES=false`), as the operations guide has a
    /// server without `sync_interval: always` run it: `auto` would turn it on for
    /// the R1 bucket, and every write at 64 in flight would measure the batches'
    /// staging and commit (release at 64 did fewer calls a second than at 16,
    /// about a tenth of its rate with the coalescer off on a loaded machine), so
    /// tokio against tokio-prev there compared the timing of their batches, not
    /// their write paths. The fsync server and the cluster run the services as
    /// they ship.
    fn service_env(self) -> Vec<(String, String)> {
        match self {
            Place::Lazy => vec![(
                "DAGNATS_LEASES_COALESCE_WRITES".to_string(),
                "false".to_string(),
            )],
            Place::Fsync | Place::R3 => Vec::new(),
        }
    }

    /// The bucket's stream replicas (`--replicas` of the service).
    fn replicas(self) -> Option<usize> {
        (self == Place::R3).then_some(servers::CLUSTER_NODES)
    }

    /// Calls of `op` at `c` in flight here, `n` the run's figure for `c`; `None`
    /// leaves the measurement out. In `--sync both`, the fsync server measures only
    /// what writes (owner and forward write nothing, so its sync cannot matter),
    /// with half the calls at 16 and 64 (each write waits for an fsync, one at a
    /// time); the cluster measures everything (confirmation is a write) with a
    /// quarter of the calls at 16 and 64 (each write waits for a replica's ack and
    /// fsyncs on every node, about 1,600 writes/s here). At 256 in flight the
    /// cluster measures every operation but forward and the fsync server the
    /// writes (where the write coalescer's batches form). The full run stays within
    /// about 6 minutes; `--r3` adds 2 to 3.
    fn calls(self, sync: SyncMode, op: Op, c: usize, n: usize) -> Option<usize> {
        match self {
            Place::R3 if c == R3_WIDE && op != Op::Forward => Some(n),
            Place::Fsync if c == R3_WIDE && op.writes() => Some(n),
            _ if c == R3_WIDE => None,
            Place::Fsync if sync == SyncMode::Both && !op.writes() => None,
            Place::Fsync if sync == SyncMode::Both && c > 1 => Some(n / 2),
            Place::R3 if c > 1 => Some(n / 4),
            _ => Some(n),
        }
    }
}

/// The benchmark, or what `args` runs instead of it.
pub async fn run(args: RunArgs) {
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
    let calls = args.calls.unwrap_or(if args.quick { 100 } else { 1000 });
    let tp_calls = args.tp_calls.unwrap_or(if args.quick { 640 } else { 6400 });
    let slices = args.slices.unwrap_or(if args.quick { 4 } else { 10 });
    let mem_leases = args
        .mem_leases
        .unwrap_or(if args.quick { 10_000 } else { 100_000 });
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| servers::checkout().join("target/bench"));
    std::fs::create_dir_all(&out).expect("report dir");
    if let Some(n) = args.burst {
        let burst = burst::run(&out, n).await;
        burst::write(&out, &burst);
        return;
    }
    if args.capacity_only {
        capacity::run(&out, &capacity_options(&args)).await;
        return;
    }
    if args.cpu_profile {
        cpu_profile(&out, &args).await;
        return;
    }
    if let Some(n) = args.scale {
        let scale = scale::run(
            &out,
            n,
            args.scale_secs,
            args.scale_per_member,
            args.scale_gradual,
        )
        .await;
        scale::write(&out, &scale);
        return;
    }

    let sync = if args.sync_always {
        SyncMode::Always
    } else {
        args.sync
    };
    if let Some(bin) = &args.prev_bin {
        assert!(bin.is_file(), "--prev-bin {}: no such file", bin.display());
        procs::set_prev_bin(bin.clone());
    }
    // Each server with the implementations it serves; on the fsync-always one the
    // names get `-fsync`, on the cluster `-r3`. In `both`, smol is left out of the
    // fsync server to keep the run short. The earlier commit's service runs on the
    // first server only.
    let mut plan: Vec<(Place, Vec<Impl>)> = Vec::new();
    if sync != SyncMode::Always {
        plan.push((Place::Lazy, Impl::ALL.to_vec()));
    }
    // The write coalescer on over off: `tokio` has it on (as it ships: `auto`) and
    // `tokio-single` off, on the fsync server and on the cluster.
    match sync {
        SyncMode::Always => plan.push((
            Place::Fsync,
            [&Impl::ALL[..], &[Impl::TokioSingle]].concat(),
        )),
        SyncMode::Both => plan.push((
            Place::Fsync,
            vec![Impl::Baseline, Impl::Tokio, Impl::TokioSingle],
        )),
        SyncMode::Default => {}
    }
    if args.prev_bin.is_some() {
        plan[0].1.push(Impl::TokioPrev);
    }
    if args.r3 {
        plan.push((
            Place::R3,
            vec![Impl::Tokio, Impl::TokioUnconfirmed, Impl::TokioSingle],
        ));
    }
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    let mut nats_sync = BTreeMap::new();
    let mut prev_label = None;
    for (place, imps) in plan {
        let server = match place {
            Place::Lazy => {
                servers::Server::Single(servers::Nats::start_sync(servers::Sync::Default))
            }
            Place::Fsync => {
                servers::Server::Single(servers::Nats::start_sync(servers::Sync::Always))
            }
            Place::R3 => servers::Server::Cluster(servers::Cluster::start().await),
        };
        let url = server.url();
        for imp in imps {
            let label = format!("{}{}", imp.name(), place.suffix());
            let client = server.connect(imp.name()).await;
            load::echo_owner(client.clone()).await;
            // The service creates the bucket in each account; the baseline needs it there.
            procs::create_bucket(imp, &url, place.replicas(), &out, &client).await;
            if place == Place::R3 {
                let was =
                    servers::Cluster::pin_leader(&client, dagnats_leases_core::subjects::STREAM)
                        .await;
                let replicas =
                    servers::Cluster::replicas(&client, dagnats_leases_core::subjects::STREAM)
                        .await;
                assert_eq!(
                    replicas,
                    servers::CLUSTER_NODES,
                    "{label}: the bucket's replicas"
                );
                println!(
                    "{label}: bucket with {replicas} replicas, stream leader {was}, now {}",
                    servers::Cluster::name_of(0)
                );
            }
            if imp == Impl::TokioPrev {
                prev_label = Some(label.clone());
            }
            nats_sync.insert(label.clone(), place.sync_name().to_string());
            clients.push((imp, label, place, client));
        }
        println!(
            "nats-server {} on {url}, JetStream sync {}",
            server.version(),
            match place {
                Place::Lazy => "default (lazy, every 2 min)",
                Place::Fsync => "always (fsync before every ack)",
                Place::R3 =>
                    "always on each of 3 cluster nodes; R3 bucket, each stream's leader on the node everything connects to",
            }
        );
        servers.push((place, server));
    }
    println!(
        "{} cores; {rounds} rounds; {calls} calls at concurrency 1, \
         {tp_calls} at 16 and 64, in {slices} interleaved slices",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );

    #[cfg(feature = "etcd")]
    let etcd = (!args.no_etcd).then(|| etcd::Etcd::start(&out));
    #[cfg(feature = "etcd")]
    let etcd_client = match &etcd {
        Some(e) => Some(e.client().await),
        None => None,
    };
    #[cfg(feature = "etcd")]
    let etcd_r3 = (args.r3 && !args.no_etcd).then(|| etcd::Etcd::start_cluster(&out));
    #[cfg(feature = "etcd")]
    let etcd_r3_client = match &etcd_r3 {
        Some(e) => Some(e.client().await),
        None => None,
    };
    #[cfg(feature = "etcd")]
    if let Some(e) = &etcd_r3 {
        println!(
            "etcd {}: three members on loopback (fsync as shipped), every call to the leader {}",
            e.version(),
            e.leader_url().await
        );
    }
    #[cfg(not(feature = "etcd"))]
    if !args.no_etcd {
        println!("etcd left out: this build lacks the `etcd` feature (scripts/bench turns it on)");
    }

    // 256 in flight: on the cluster, and on the fsync server for the writes (where
    // the write coalescer's batches would form).
    let mut concurrencies = CONCURRENCIES.to_vec();
    if args.r3 || sync != SyncMode::Default {
        concurrencies.push(R3_WIDE);
    }
    let mut results: Results = BTreeMap::new();
    for round in 0..rounds {
        // Fresh processes each round, all running at once, each in its own account.
        let mut running = Vec::new();
        for (imp, label, place, client) in &clients {
            let url = servers
                .iter()
                .find(|(p, _)| p == place)
                .expect("its server")
                .1
                .url();
            let options = procs::Options {
                replicas: place.replicas(),
                env: place.service_env(),
                ..procs::Options::default()
            };
            running.push(
                procs::start_with(*imp, imp.name(), label, &url, &out, client, &options).await,
            );
            if *place == Place::R3 {
                let was =
                    servers::Cluster::pin_leader(client, dagnats_leases_core::subjects::STREAM)
                        .await;
                if was != servers::Cluster::name_of(0) {
                    println!("round {round}: {label}'s stream leader was on {was}, moved back");
                }
                // The one thing that tells the two apart: confirmation writes.
                let writes = load::owner_writes(client).await;
                assert_eq!(
                    writes,
                    *imp != Impl::TokioUnconfirmed,
                    "{label}: an owner call {} the stream",
                    if writes {
                        "wrote to"
                    } else {
                        "did not write to"
                    }
                );
            }
            let tag = format!("w{}{round}", imp.name());
            // Warm-up: connections, caches, the first allocations.
            load::measure(client, Op::Acquire, &tag, 4, 200).await;
            load::measure(client, Op::Owner, &tag, 4, 200).await;
        }
        for op in Op::ALL
            .into_iter()
            .filter(|op| args.ops.is_empty() || args.ops.contains(op))
        {
            for c in concurrencies.iter().copied() {
                // At 256 in flight (the cluster only) as many calls as 16 and 64
                // get on the single servers, at least two per worker per slice.
                let n = match c {
                    1 => calls,
                    R3_WIDE => tp_calls.max(R3_WIDE * slices * 2),
                    _ => tp_calls,
                };
                let tag = format!("r{round}");
                let mut names = Vec::new();
                let mut targets: Vec<(std::sync::Arc<dyn load::Target>, usize)> = Vec::new();
                for (_, label, place, client) in &clients {
                    let Some(n) = place.calls(sync, op, c, n) else {
                        continue;
                    };
                    names.push(label.clone());
                    targets.push((
                        load::NatsTarget::prepare(client, &load::Plan::new(op, &tag, c, n)).await,
                        n,
                    ));
                }
                #[cfg(feature = "etcd")]
                if let Some(client) = &etcd_client
                    && op != Op::Forward
                    && c != R3_WIDE
                {
                    names.push("etcd".to_string());
                    targets.push((
                        etcd::EtcdTarget::prepare(client, &load::Plan::new(op, &tag, c, n)).await,
                        n,
                    ));
                }
                // The three-member etcd gets what the three-node cluster gets.
                #[cfg(feature = "etcd")]
                if let Some(client) = &etcd_r3_client
                    && op != Op::Forward
                    && let Some(n) = Place::R3.calls(sync, op, c, n)
                {
                    names.push("etcd-r3".to_string());
                    targets.push((
                        etcd::EtcdTarget::prepare(client, &load::Plan::new(op, &tag, c, n)).await,
                        n,
                    ));
                }
                let stats = load::interleaved(&targets, c, slices).await;
                for (name, stats) in names.into_iter().zip(stats) {
                    results
                        .entry((op, name))
                        .or_default()
                        .entry(c)
                        .or_default()
                        .push(stats);
                }
            }
            println!("round {round}: {} done", op.name());
        }
        for r in running {
            r.stop();
        }
    }
    #[cfg(feature = "etcd")]
    let etcd_version = etcd.as_ref().map(|e| e.version());
    #[cfg(feature = "etcd")]
    drop(etcd);
    #[cfg(feature = "etcd")]
    let etcd_r3_members = etcd_r3.as_ref().map(|_| etcd::CLUSTER_MEMBERS);
    #[cfg(feature = "etcd")]
    drop(etcd_r3);
    #[cfg(not(feature = "etcd"))]
    let etcd_r3_members: Option<usize> = None;
    #[cfg(not(feature = "etcd"))]
    let etcd_version: Option<String> = None;
    let nats_version = servers[0].1.version().to_string();
    drop(clients);
    drop(servers);

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
            nats_sync,
            etcd: etcd_version,
            rounds,
            calls_c1: calls,
            calls_tp: tp_calls,
            prev_rev: args
                .prev_bin
                .as_ref()
                .map(|_| args.prev_rev.clone().unwrap_or_else(|| "?".to_string())),
            r3: args.r3.then(|| report::R3Setup {
                nodes: servers::CLUSTER_NODES,
                sync: "always".to_string(),
                replicas: servers::CLUSTER_NODES,
                placement: "every client and service on n1, every stream leader on n1".to_string(),
                calls_c1: calls,
                calls_tp: tp_calls / 4,
                calls_256: tp_calls.max(R3_WIDE * slices * 2),
                etcd_members: etcd_r3_members,
            }),
        },
        prev_label.as_deref(),
    );
    report.print();
    println!(
        "calls answered `unavailable` and sent again: {}",
        load::RETRIED_UNAVAILABLE.load(std::sync::atomic::Ordering::Relaxed)
    );
    let json = out.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report).expect("json")).expect("write");
    let svg = out.join("latency.svg");
    std::fs::write(&svg, report::plot(&report)).expect("write plot");
    println!("wrote {} and {}", json.display(), svg.display());
    if args.capacity {
        capacity::run(&out, &capacity_options(&args)).await;
    }
}

/// `--cpu-profile`: one capacity step of the service on one server, profiled.
async fn cpu_profile(out: &std::path::Path, args: &RunArgs) {
    let mut options = capacity_options(args);
    if args.capacity_steps.is_empty() {
        options.steps = vec![10_000];
    }
    options.hold_s = args.capacity_hold_secs.unwrap_or(30);
    if args.capacity_impls.is_empty() {
        options.impls = vec!["tokio-fsync".to_string()];
    }
    for name in &options.impls {
        match capacity::Kind::parse(name) {
            Ok(capacity::Kind::Service { cluster: false, .. }) => {}
            _ => panic!(
                "--cpu-profile: `{name}` is not the service on one server (tokio-fsync, tokio-single-fsync, tokio-fsync-shardsN)"
            ),
        }
    }
    options.profile = Some(out.join("cpu-profile"));
    let commit = std::process::Command::new("git")
        .arg("-C")
        .arg(servers::checkout())
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "?".to_string());
    for (name, capacity) in capacity::run(out, &options).await {
        let (Some(recorded), Some(step)) = (&capacity.recorded, capacity.steps.last()) else {
            println!(
                "profile {name}: no window was recorded (the step did not get its leases held)"
            );
            continue;
        };
        let label = match &args.cpu_profile_label {
            Some(l) => format!("{commit} {l}"),
            None => commit.clone(),
        };
        let label = if options.impls.len() > 1 {
            format!("{label} {name}")
        } else {
            label
        };
        let figures = cpu_profile::StepFigures {
            leases: step.leases,
            renewals_per_s: step.renewals_per_s,
            window_s: step.window_s,
            setup: format!(
                "{}{}",
                capacity.setup,
                step.why
                    .as_ref()
                    .map_or(String::new(), |w| format!("; the step failed: {w}"))
            ),
        };
        cpu_profile::analyse(out, recorded, &figures, &label);
    }
}

/// The capacity ramp's options from the command line.
fn capacity_options(args: &RunArgs) -> capacity::Options {
    let steps = if !args.capacity_steps.is_empty() {
        let mut s = args.capacity_steps.clone();
        s.sort_unstable();
        s.dedup();
        s
    } else if args.quick {
        vec![1_000, 2_000]
    } else {
        std::iter::once(10_000)
            .chain((1..=6).map(|i| i * 25_000))
            .collect()
    };
    let impls = if !args.capacity_impls.is_empty() {
        args.capacity_impls.clone()
    } else {
        let mut v = vec!["tokio-fsync".to_string()];
        if args.r3 {
            v.push("tokio-r3".to_string());
        }
        if !args.no_etcd {
            v.push("etcd".to_string());
            if args.r3 {
                v.push("etcd-r3".to_string());
            }
        }
        v
    };
    capacity::Options {
        steps,
        hold_s: args
            .capacity_hold_secs
            .unwrap_or(if args.quick { 10 } else { 60 }),
        impls,
        profile: None,
    }
}
