//! The report: medians over rounds, ratios to the baseline, the table on stdout
//! and `report.json`; the plot of latency against concurrency (hand-written SVG)
//! is `plot`'s.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::Results;
use crate::load::{Op, Stats};
use crate::memory::Memory;

mod plot;

pub use plot::plot;

/// What the run ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// CPU cores the machine has.
    pub cores: usize,
    /// nats-server version.
    pub nats_server: String,
    /// The JetStream sync of each implementation's nats-server: `default` (lazy,
    /// every 2 minutes) or `always` (`sync_interval: always`, names ending `-fsync`).
    pub nats_sync: BTreeMap<String, String>,
    /// etcd version, if etcd ran.
    pub etcd: Option<String>,
    /// Rounds; every figure is the median over them.
    pub rounds: usize,
    /// Calls per measurement at concurrency 1.
    pub calls_c1: usize,
    /// Calls per measurement at concurrency 16 and 64.
    pub calls_tp: usize,
    /// The commit `tokio-prev` was built from (`--prev-bin`, `--prev-rev`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prev_rev: Option<String>,
    /// The three-node cluster (`--r3`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r3: Option<R3Setup>,
}

/// The three-node cluster of `--r3`.
#[derive(Debug, Clone, Serialize)]
pub struct R3Setup {
    /// nats-server nodes, on loopback, each with its own store.
    pub nodes: usize,
    /// JetStream sync on every node.
    pub sync: String,
    /// Stream replicas of each account's bucket.
    pub replicas: usize,
    /// Where clients, services and stream leaders are.
    pub placement: String,
    /// Calls per measurement at concurrency 1 there.
    pub calls_c1: usize,
    /// Calls per measurement at concurrency 16 and 64 there.
    pub calls_tp: usize,
    /// Calls per measurement at concurrency 256 there (and on `etcd-r3`).
    pub calls_256: usize,
    /// Members of the etcd cluster beside it (`etcd-r3`), if etcd ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_members: Option<usize>,
}

/// The figures of one implementation for one operation.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// `c1`, `c16`, `c64`: median over rounds of each statistic.
    #[serde(flatten)]
    pub at: BTreeMap<String, Stats>,
    /// p50 at concurrency 1 over the baseline's (median over rounds of each).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_p50: Option<f64>,
    /// Throughput at 64 in flight over the baseline's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_ops_per_s_64: Option<f64>,
    /// The p50 ratio of each round on its own (same round's baseline).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ratio_p50_rounds: Vec<f64>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine and the run's sizes.
    pub setup: Setup,
    /// Operation, then implementation.
    pub operations: BTreeMap<String, BTreeMap<String, Figures>>,
    /// The service (tokio, on each sync) against etcd: operation, then implementation.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub vs_etcd: BTreeMap<String, BTreeMap<String, VsEtcd>>,
    /// Read confirmation on the three-node cluster (`--r3`): `tokio-r3` (confirmed
    /// reads) over `tokio-unconfirmed-r3` (`--unconfirmed-reads-for-tests`), per
    /// operation.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub r3_confirm: BTreeMap<String, Pair>,
    /// The write coalescer on over off on each `sync_interval: always` server:
    /// `tokio-fsync` and `tokio-r3` (on, as it ships: `auto`) over
    /// `tokio-single-fsync` and `tokio-single-r3` (`--coalesce-writes false`):
    /// keyed by the first, then operation. Goal: `p50_c1` at most [`COALESCE_GOAL`] (no added wait at
    /// one call in flight; reported, not asserted).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub coalesce: BTreeMap<String, BTreeMap<String, Pair>>,
    /// smol over tokio on the same server in the same run (`smol` / `tokio`, and
    /// `smol-fsync` / `tokio-fsync`): server, then operation. Goal: `p50_c1` at most
    /// [`SMOL_GOAL`] on every operation (reported, not asserted).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub smol_vs_tokio: BTreeMap<String, BTreeMap<String, Pair>>,
    /// The service against an earlier commit's on the single (R1) server
    /// (`--prev-bin`): `tokio` over `tokio-prev` (or their `-fsync`), per operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r1_vs_prev: Option<VsPrev>,
    /// Resident memory of the service with leases held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Vec<Memory>>,
}

/// One implementation over another on the same server, one operation: ratios of
/// the medians over rounds, and of each round on its own.
#[derive(Debug, Clone, Serialize)]
pub struct Pair {
    /// The numerator.
    pub this: String,
    /// The denominator.
    pub over: String,
    /// p50 at concurrency 1, this / over (above 1: this is slower).
    pub p50_c1: f64,
    /// Throughput at 16 in flight, this / over (below 1: this is slower).
    pub ops_per_s_c16: f64,
    /// Throughput at 64 in flight, this / over (below 1: this is slower).
    pub ops_per_s_c64: f64,
    /// Throughput at 256 in flight, this / over, where both ran there (`--r3`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_per_s_c256: Option<f64>,
    /// `p50_c1` of each round on its own.
    pub p50_c1_rounds: Vec<f64>,
    /// `ops_per_s_c64` of each round on its own.
    pub ops_per_s_c64_rounds: Vec<f64>,
}

impl Pair {
    /// For each (this, over) measured, every operation's pair, keyed by `this`.
    fn per_server(
        results: &Results,
        pairs: &[(&str, &str)],
    ) -> BTreeMap<String, BTreeMap<String, Pair>> {
        let mut out: BTreeMap<String, BTreeMap<String, Pair>> = BTreeMap::new();
        for (this, over) in pairs {
            for op in Op::ALL {
                if let Some(p) = Pair::of(results, op, this, over) {
                    out.entry(this.to_string())
                        .or_default()
                        .insert(op.name().to_string(), p);
                }
            }
        }
        out
    }

    /// `this` over `over` for `op`, if both were measured.
    fn of(results: &Results, op: Op, this: &str, over: &str) -> Option<Pair> {
        let a = results.get(&(op, this.to_string()))?;
        let b = results.get(&(op, over.to_string()))?;
        let med = |m: &BTreeMap<usize, Vec<Stats>>, c: usize| Stats::median(&m[&c]);
        let rounds = |c: usize, f: fn(&Stats) -> f64| -> Vec<f64> {
            a[&c].iter().zip(&b[&c]).map(|(x, y)| f(x) / f(y)).collect()
        };
        Some(Pair {
            this: this.to_string(),
            over: over.to_string(),
            p50_c1: med(a, 1).p50_us / med(b, 1).p50_us,
            ops_per_s_c16: med(a, 16).ops_per_s / med(b, 16).ops_per_s,
            ops_per_s_c64: med(a, 64).ops_per_s / med(b, 64).ops_per_s,
            ops_per_s_c256: a
                .get(&crate::R3_WIDE)
                .zip(b.get(&crate::R3_WIDE))
                .map(|(x, y)| Stats::median(x).ops_per_s / Stats::median(y).ops_per_s),
            p50_c1_rounds: rounds(1, |s| s.p50_us),
            ops_per_s_c64_rounds: rounds(64, |s| s.ops_per_s),
        })
    }
}

/// The service against an earlier commit's service.
#[derive(Debug, Clone, Serialize)]
pub struct VsPrev {
    /// The earlier commit.
    pub rev: String,
    /// The bar: `p50_c1` at most this, `ops_per_s_c64` at least its inverse.
    pub bound: f64,
    /// Operation, then the ratios.
    pub operations: BTreeMap<String, Pair>,
}

/// The goal for smol's p50 at concurrency 1 over tokio's, every operation.
pub const SMOL_GOAL: f64 = 1.05;
/// The coalescer's bound on p50 at one call in flight over every write alone.
pub const COALESCE_GOAL: f64 = 1.05;

/// The bound R1 figures must keep against the earlier commit's.
pub const PREV_BOUND: f64 = 1.02;

/// One implementation against etcd, medians over rounds.
#[derive(Debug, Clone, Serialize)]
pub struct VsEtcd {
    /// etcd's p50 at concurrency 1 over this one's (above 1: this one is faster).
    pub etcd_p50_over_this_c1: f64,
    /// This one's throughput at 16 in flight over etcd's.
    pub ops_per_s_c16_over_etcd: f64,
    /// This one's throughput at 64 in flight over etcd's.
    pub ops_per_s_c64_over_etcd: f64,
    /// This one's throughput at 256 in flight over etcd's (`tokio-r3` against
    /// `etcd-r3` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_per_s_c256_over_etcd: Option<f64>,
    /// The etcd it is compared with: `etcd` (one member) or `etcd-r3` (three).
    pub against: String,
}

/// The floor an implementation is compared with: the baseline on the same server
/// (there is none on the cluster).
fn baseline_of(imp: &str) -> &'static str {
    if imp.ends_with(crate::FSYNC) {
        "baseline-fsync"
    } else if imp.ends_with(crate::R3) {
        "baseline-r3"
    } else {
        "baseline"
    }
}

fn key(c: usize) -> String {
    format!("c{c}")
}

/// Order of implementations in the table and the plot.
const ORDER: [&str; 14] = [
    "baseline",
    "tokio",
    "tokio-prev",
    "smol",
    "baseline-fsync",
    "tokio-fsync",
    "tokio-single-fsync",
    "tokio-prev-fsync",
    "smol-fsync",
    "tokio-r3",
    "tokio-unconfirmed-r3",
    "tokio-single-r3",
    "etcd",
    "etcd-r3",
];

/// The confirmed and the unconfirmed service on the cluster.
const R3_PAIR: (&str, &str) = ("tokio-r3", "tokio-unconfirmed-r3");

impl Report {
    /// Medians and ratios of every measurement.
    /// `prev` names the earlier commit's service (`tokio-prev` or `tokio-prev-fsync`).
    pub fn new(
        results: &Results,
        memory: Option<Vec<Memory>>,
        setup: Setup,
        prev: Option<&str>,
    ) -> Report {
        let mut operations: BTreeMap<String, BTreeMap<String, Figures>> = BTreeMap::new();
        for op in Op::ALL {
            for imp in ORDER {
                let Some(per_c) = results.get(&(op, imp.to_string())) else {
                    continue;
                };
                // etcd's floor: the lazy baseline, else the fsync one.
                let base = match imp {
                    "etcd" => results
                        .get(&(op, "baseline".to_string()))
                        .or_else(|| results.get(&(op, "baseline-fsync".to_string()))),
                    _ => results.get(&(op, baseline_of(imp).to_string())),
                };
                let at: BTreeMap<String, Stats> = per_c
                    .iter()
                    .map(|(c, rounds)| (key(*c), Stats::median(rounds)))
                    .collect();
                let (mut ratio_p50, mut ratio_ops, mut ratio_p50_rounds) = (None, None, Vec::new());
                if let Some(base) = base
                    && !imp.starts_with("baseline")
                {
                    let b1 = Stats::median(&base[&1]);
                    ratio_p50 = Some(at[&key(1)].p50_us / b1.p50_us);
                    let b64 = Stats::median(&base[&64]);
                    ratio_ops = Some(at[&key(64)].ops_per_s / b64.ops_per_s);
                    ratio_p50_rounds = per_c[&1]
                        .iter()
                        .zip(&base[&1])
                        .map(|(s, b)| s.p50_us / b.p50_us)
                        .collect();
                }
                operations.entry(op.name().to_string()).or_default().insert(
                    imp.to_string(),
                    Figures {
                        at,
                        ratio_p50,
                        ratio_ops_per_s_64: ratio_ops,
                        ratio_p50_rounds,
                    },
                );
            }
        }
        let mut vs_etcd: BTreeMap<String, BTreeMap<String, VsEtcd>> = BTreeMap::new();
        for (op, per_impl) in &operations {
            // The service on one server against one member, on the cluster against
            // the three-member cluster.
            for (imp, peer) in [
                ("tokio", "etcd"),
                ("tokio-fsync", "etcd"),
                ("tokio-r3", "etcd-r3"),
            ] {
                let (Some(f), Some(etcd)) = (per_impl.get(imp), per_impl.get(peer)) else {
                    continue;
                };
                let ops =
                    |c: usize| Some(f.at.get(&key(c))?.ops_per_s / etcd.at.get(&key(c))?.ops_per_s);
                vs_etcd.entry(op.clone()).or_default().insert(
                    imp.to_string(),
                    VsEtcd {
                        etcd_p50_over_this_c1: etcd.at[&key(1)].p50_us / f.at[&key(1)].p50_us,
                        ops_per_s_c16_over_etcd: ops(16).unwrap_or(f64::NAN),
                        ops_per_s_c64_over_etcd: ops(64).unwrap_or(f64::NAN),
                        ops_per_s_c256_over_etcd: ops(crate::R3_WIDE),
                        against: peer.to_string(),
                    },
                );
            }
        }
        let r3_confirm = Op::ALL
            .into_iter()
            .filter_map(|op| {
                Pair::of(results, op, R3_PAIR.0, R3_PAIR.1).map(|p| (op.name().to_string(), p))
            })
            .collect();
        let coalesce = Pair::per_server(
            results,
            &[
                ("tokio-fsync", "tokio-single-fsync"),
                ("tokio-r3", "tokio-single-r3"),
            ],
        );
        let smol_vs_tokio =
            Pair::per_server(results, &[("smol", "tokio"), ("smol-fsync", "tokio-fsync")]);
        let r1_vs_prev = prev.map(|prev| {
            let this = prev.replacen("tokio-prev", "tokio", 1);
            VsPrev {
                rev: setup.prev_rev.clone().unwrap_or_default(),
                bound: PREV_BOUND,
                operations: Op::ALL
                    .into_iter()
                    .filter_map(|op| {
                        Pair::of(results, op, &this, prev).map(|p| (op.name().to_string(), p))
                    })
                    .collect(),
            }
        });
        Report {
            setup,
            operations,
            vs_etcd,
            r3_confirm,
            coalesce,
            smol_vs_tokio,
            r1_vs_prev,
            memory,
        }
    }

    /// The table on stdout.
    pub fn print(&self) {
        let s = &self.setup;
        println!();
        println!(
            "medians over {} rounds; {} cores; nats-server {}{}; latency in us, throughput in calls/s",
            s.rounds,
            s.cores,
            s.nats_server,
            s.etcd
                .as_ref()
                .map(|v| format!(", etcd {v}"))
                .unwrap_or_default()
        );
        println!(
            "{:<8} {:<20} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}",
            "op",
            "impl",
            "p50@1",
            "p99@1",
            "ops@1",
            "p50@16",
            "ops@16",
            "p50@64",
            "ops@64",
            "ops@256",
            "p50/base",
            "ops64/base"
        );
        for op in Op::ALL {
            let Some(per_impl) = self.operations.get(op.name()) else {
                continue;
            };
            for imp in ORDER {
                let Some(f) = per_impl.get(imp) else { continue };
                let get = |c: usize| f.at.get(&key(c)).copied();
                let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
                let ratio = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
                println!(
                    "{:<8} {:<20} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}",
                    op.name(),
                    imp,
                    num(get(1).map(|s| s.p50_us)),
                    num(get(1).map(|s| s.p99_us)),
                    num(get(1).map(|s| s.ops_per_s)),
                    num(get(16).map(|s| s.p50_us)),
                    num(get(16).map(|s| s.ops_per_s)),
                    num(get(64).map(|s| s.p50_us)),
                    num(get(64).map(|s| s.ops_per_s)),
                    num(get(crate::R3_WIDE).map(|s| s.ops_per_s)),
                    ratio(f.ratio_p50),
                    ratio(f.ratio_ops_per_s_64),
                );
            }
        }
        if !self.vs_etcd.is_empty() {
            println!();
            println!(
                "against etcd (fsync on every write): etcd p50@1 / this, this ops / etcd ops at 16, 64 (and 256 on the clusters)"
            );
            println!(
                "{:<8} {:<14} {:<8} {:>6} {:>6} {:>6} {:>6}",
                "op", "this", "against", "p50@1", "ops@16", "ops@64", "ops@256"
            );
            for (op, per_impl) in &self.vs_etcd {
                for (imp, v) in per_impl {
                    println!(
                        "{op:<8} {imp:<14} {:<8} {:>6.2} {:>6.2} {:>6.2} {:>6}",
                        v.against,
                        v.etcd_p50_over_this_c1,
                        v.ops_per_s_c16_over_etcd,
                        v.ops_per_s_c64_over_etcd,
                        v.ops_per_s_c256_over_etcd
                            .map_or("-".to_string(), |r| format!("{r:.2}"))
                    );
                }
            }
        }
        print_against_goal(&self.smol_vs_tokio, "same server, same run", SMOL_GOAL);
        if !self.r3_confirm.is_empty() {
            print_pairs(
                &format!(
                    "read confirmation on the 3-node cluster (R3, sync always): {} / {}, medians over rounds (each round)",
                    R3_PAIR.0, R3_PAIR.1
                ),
                "ops@64 rounds",
                &self.r3_confirm,
                |p| rounds(&p.ops_per_s_c64_rounds),
            );
        }
        print_against_goal(
            &self.coalesce,
            "the write coalescer on, over every write alone",
            COALESCE_GOAL,
        );
        if let Some(prev) = &self.r1_vs_prev {
            println!();
            let pair = prev.operations.values().next();
            println!(
                "R1 against {}: {} / {}, medians over rounds (each round); holds if p50@1 <= {:.2} and ops@64 >= {:.3}",
                prev.rev,
                pair.map_or("tokio", |p| p.this.as_str()),
                pair.map_or("tokio-prev", |p| p.over.as_str()),
                prev.bound,
                1.0 / prev.bound
            );
            println!(
                "{:<8} {:>8} {:>8} {:>8}   {:<20} {:<20} bar",
                "op", "p50@1", "ops@16", "ops@64", "p50@1 rounds", "ops@64 rounds"
            );
            for op in Op::ALL {
                let Some(p) = prev.operations.get(op.name()) else {
                    continue;
                };
                let holds = p.p50_c1 <= prev.bound && p.ops_per_s_c64 >= 1.0 / prev.bound;
                println!(
                    "{:<8} {:>8.3} {:>8.3} {:>8.3}   {:<20} {:<20} {}",
                    op.name(),
                    p.p50_c1,
                    p.ops_per_s_c16,
                    p.ops_per_s_c64,
                    rounds(&p.p50_c1_rounds),
                    rounds(&p.ops_per_s_c64_rounds),
                    if holds { "holds" } else { "missed" }
                );
            }
        }
        if let Some(memory) = &self.memory {
            println!();
            for m in memory {
                let steps: Vec<String> = m
                    .steps
                    .iter()
                    .map(|s| format!("{} leases: {} KiB", s.leases, s.rss_kib))
                    .collect();
                println!("memory {:<6} {}", m.implementation, steps.join(", "));
            }
        }
    }
}

/// Puts `value` under `key` of `report.json` in `out`, keeping what is there (a full
/// run's report, or another mode's key).
pub fn put(out: &std::path::Path, key: &str, value: serde_json::Value) -> std::path::PathBuf {
    let path = out.join("report.json");
    let mut report: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    report[key] = value;
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json")).expect("write");
    path
}

/// Each round's ratio, three decimals, space-separated.
fn rounds(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{r:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A table of one implementation over another, an operation a row, with a last
/// column of `last`.
/// Each server's pairs, with whether p50@1 meets `goal` (and ops@256 where run).
fn print_against_goal(servers: &BTreeMap<String, BTreeMap<String, Pair>>, what: &str, goal: f64) {
    for pairs in servers.values() {
        let Some(first) = pairs.values().next() else {
            continue;
        };
        print_pairs(
            &format!(
                "{} / {} ({what}): medians over rounds (each round); goal p50@1 <= {goal:.2}",
                first.this, first.over
            ),
            "ops@256 goal",
            pairs,
            |p| {
                let wide = p
                    .ops_per_s_c256
                    .map_or("-".to_string(), |r| format!("{r:.3}"));
                let met = if p.p50_c1 <= goal { "met" } else { "missed" };
                format!("{wide:>7} {met}")
            },
        );
    }
}

fn print_pairs(
    title: &str,
    last_header: &str,
    pairs: &BTreeMap<String, Pair>,
    last: impl Fn(&Pair) -> String,
) {
    println!();
    println!("{title}");
    println!(
        "{:<8} {:>8} {:>8} {:>8}   {:<20} {last_header}",
        "op", "p50@1", "ops@16", "ops@64", "p50@1 rounds"
    );
    for op in Op::ALL {
        let Some(p) = pairs.get(op.name()) else {
            continue;
        };
        println!(
            "{:<8} {:>8.3} {:>8.3} {:>8.3}   {:<20} {}",
            op.name(),
            p.p50_c1,
            p.ops_per_s_c16,
            p.ops_per_s_c64,
            rounds(&p.p50_c1_rounds),
            last(p)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every implementation a `--sync always --r3` run measures, each with figures
    /// that tell them apart: throughput `ops`, p50 `1000 / ops` ms.
    fn results(imps: &[(&str, f64)]) -> Results {
        let mut results = Results::new();
        for op in Op::ALL {
            for (imp, ops) in imps {
                let stats = Stats {
                    p50_us: 1e6 / ops,
                    p99_us: 2e6 / ops,
                    ops_per_s: *ops,
                };
                let per_c = [1, 16, 64, crate::R3_WIDE]
                    .into_iter()
                    .map(|c| (c, vec![stats]))
                    .collect();
                results.insert((op, imp.to_string()), per_c);
            }
        }
        results
    }

    fn setup() -> Setup {
        Setup {
            cores: 2,
            nats_server: "2.15.1".into(),
            nats_sync: BTreeMap::new(),
            etcd: Some("3.4.23".into()),
            rounds: 1,
            calls_c1: 10,
            calls_tp: 10,
            prev_rev: None,
            r3: None,
        }
    }

    #[test]
    fn an_r3_run_gives_the_cluster_rows_against_etcd_r3_and_the_coalescer_pairs() {
        let results = results(&[
            ("baseline-fsync", 1000.0),
            ("tokio-fsync", 600.0),
            ("tokio-single-fsync", 300.0),
            ("etcd", 800.0),
            ("tokio-r3", 3000.0),
            ("tokio-unconfirmed-r3", 4000.0),
            ("tokio-single-r3", 6000.0),
            ("etcd-r3", 1000.0),
        ]);
        let report = Report::new(&results, None, setup(), None);
        let acquire = &report.vs_etcd["acquire"];
        let r3 = &acquire["tokio-r3"];
        assert_eq!(r3.against, "etcd-r3");
        assert_eq!(r3.ops_per_s_c64_over_etcd, 3.0);
        assert_eq!(r3.ops_per_s_c256_over_etcd, Some(3.0));
        assert_eq!(acquire["tokio-fsync"].against, "etcd");
        assert_eq!(acquire["tokio-fsync"].ops_per_s_c16_over_etcd, 0.75);
        let fsync = &report.coalesce["tokio-fsync"]["renew"];
        assert_eq!(
            (fsync.this.as_str(), fsync.over.as_str()),
            ("tokio-fsync", "tokio-single-fsync")
        );
        assert_eq!(fsync.ops_per_s_c64, 2.0);
        assert_eq!(fsync.p50_c1, 0.5);
        let r3 = &report.coalesce["tokio-r3"]["owner"];
        assert_eq!(r3.ops_per_s_c256, Some(0.5));
        assert_eq!(report.r3_confirm["owner"].ops_per_s_c64, 0.75);
        assert!(report.operations["acquire"].contains_key("tokio-single-r3"));
    }
}
