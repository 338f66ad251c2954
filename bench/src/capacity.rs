//! Capacity (`--capacity`, issue 29 part 3): how many leases of TTL 20 s, each
//! renewed at ttl/3 as the contract advises, an implementation holds for a whole
//! window with none lost, side by side with etcd on this machine.
//!
//! Each implementation gets a fresh server (and service) and a ramp of steps
//! (`--capacity-steps`, coarse: 25,000 more leases a step by default). A step adds
//! the leases it lacks (the service's a member at a time, each once the one
//! before holds its set), waits until all are held (at most [`RAMP_BOUND`]), then
//! holds them for `--capacity-hold-secs` (60); the ramp stops at the first step
//! that loses a lease (or does not get them all held), and the implementation's
//! figure is the last step before it.
//!
//! - The service (`tokio-fsync`: one server with `sync_interval: always`;
//!   `tokio-r3`: the three-node cluster, an R3 bucket; `-shardsN`: `serve --shards
//!   N`; `tokio-batched-*` / `tokio-single-*`: the write coalescer forced on / off;
//!   `-no-renew-many`: `serve --renew-many false`, every renewal its own request)
//!   is held by the holder library as
//!   in `--scale` ([`crate::scale::Holders`]: members of 1,000 keys, one connection
//!   each). A lease is lost when its holder steps down (the library renews at
//!   ttl/3 and gives a lease up once it can no longer renew it before its end).
//! - etcd (`etcd`: one member; `etcd-r3`: three) gets a lease of TTL 20 s and a key
//!   on it per lease, granted 64 at a time, kept alive every ttl/3 over
//!   [`ETCD_STREAMS`] keepalive streams that each carry many leases
//!   ([`crate::etcd::KeepAlives`]). A lease is lost when etcd answers its
//!   keepalive with a TTL of 0, and at the window's end the keys under the prefix
//!   are counted (every one must still be there).
//!
//! CPU is measured over each window, in cores: the service and the server(s) (or
//! etcd's members) and, beside them, this process (the holders or the etcd client).
//!
//! This file holds the plan, the steps' records and the window; each
//! implementation's ramp is its own file (`service_ramp`, `etcd_ramp`).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dagnats_leases_core::service::coalesce::CoalesceWrites;
use serde::Serialize;

use crate::procs::{self, Impl};
use crate::scale::{Holders, TTL, cpu_s, sample};
use crate::servers;

mod etcd_ramp;
mod service_ramp;

use etcd_ramp::etcd;
use service_ramp::service;

/// How long a step may take to get every lease held.
pub const RAMP_BOUND: Duration = Duration::from_secs(120);
/// How long a step waits for a member's leases before the next member joins.
pub const MEMBER_BOUND: Duration = Duration::from_secs(15);
/// Keys in each holder-library member's shard set.
pub const PER_MEMBER: usize = 1_000;
/// Keepalive streams (each on its own connection) for etcd's leases.
#[cfg(feature = "etcd")]
pub const ETCD_STREAMS: usize = 4;
/// etcd leases granted at once while a step ramps.
#[cfg(feature = "etcd")]
pub const ETCD_GRANTS_IN_FLIGHT: usize = 64;

/// The run's options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Lease counts of the ramp, ascending.
    pub steps: Vec<usize>,
    /// Seconds each step holds once all its leases are held.
    pub hold_s: u64,
    /// Implementations, in order (see [`Kind::parse`]).
    pub impls: Vec<String>,
    /// `--cpu-profile`: profile each step's window (the service's on one server
    /// only), the profiles going to this directory.
    pub profile: Option<std::path::PathBuf>,
}

/// What one step showed.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Leases asked for.
    pub leases: usize,
    /// Whether every lease was held for the whole window with none lost.
    pub held: bool,
    /// Seconds until every lease of the step was held (or the ramp's bound).
    pub ramp_s: f64,
    /// Leases held at the window's end (or when the step stopped).
    pub held_at_end: i64,
    /// Leases lost since the step began (ramp and window).
    pub lost: u64,
    /// The window, seconds (shorter when a loss stopped it).
    pub window_s: f64,
    /// Renewals (keepalives) answered per second in the window.
    pub renewals_per_s: f64,
    /// What ttl/3 asks for: leases / (ttl / 3).
    pub renewals_per_s_needed: f64,
    /// Renew (keepalive) latency p50 and p99 in the window, ms: the holder
    /// library's summary over its last minute; etcd's measured here.
    pub renew_p50_ms: f64,
    /// See `renew_p50_ms`.
    pub renew_p99_ms: f64,
    /// CPU of the service over the window, cores (none for etcd).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_service: Option<f64>,
    /// CPU of the server(s), or of etcd's member(s), cores.
    pub cpu_server: f64,
    /// CPU of this process (the holders, or etcd's client), cores.
    pub cpu_members: f64,
    /// (service + server) CPU per 1,000 leases, cores.
    pub cpu_per_1000_leases: f64,
    /// The holders' (or etcd client's) CPU per 1,000 leases, cores.
    pub members_cpu_per_1000_leases: f64,
    /// Why the step failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// One implementation's ramp.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    /// The largest step held for the whole window with none lost (0: none).
    pub held: usize,
    /// The step that lost leases (or did not get them held), if one did; none
    /// means the ramp's top was held.
    pub first_failed: Option<usize>,
    /// (service + server) CPU per 1,000 leases at `held`, cores.
    pub cpu_per_1000_leases: Option<f64>,
    /// The holders' (or client's) CPU per 1,000 leases at `held`, cores.
    pub members_cpu_per_1000_leases: Option<f64>,
    /// What ran: server, sync, replicas, options.
    pub setup: String,
    /// TTL of every lease, seconds; renewed at a third of it.
    pub ttl_s: u64,
    /// The window each step holds, seconds.
    pub hold_s: u64,
    /// Cores of the machine.
    pub cores: usize,
    /// The load average (1 minute) when the ramp began: the machine is shared.
    pub load_average_at_start: f64,
    /// Every step run.
    pub steps: Vec<Step>,
    /// With `--cpu-profile`: what the last window's profilers recorded.
    #[serde(skip)]
    pub recorded: Option<crate::cpu_profile::Recorded>,
}

/// What an implementation name asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// The tokio service on one `sync_interval: always` server or on the cluster.
    Service {
        /// On the three-node cluster, an R3 bucket.
        cluster: bool,
        /// `serve --shards N`, if given.
        shards: Option<usize>,
        /// `serve --coalesce-writes`: `auto` (`tokio-`, as the runs of record), `true`
        /// (`tokio-batched-`) or `false` (`tokio-single-`).
        coalesce: CoalesceWrites,
        /// `serve --renew-many`: on as it ships; off (`-no-renew-many`) the holder
        /// library renews one key a request.
        renew_many: bool,
    },
    /// etcd with this many members.
    Etcd {
        /// Members: 1 or 3.
        members: usize,
    },
}

impl Kind {
    /// `tokio[-batched|-single](-fsync|-r3)[-shardsN][-no-renew-many]`, `etcd` or
    /// `etcd-r3`.
    pub fn parse(name: &str) -> Result<Kind, String> {
        match name {
            "etcd" => return Ok(Kind::Etcd { members: 1 }),
            "etcd-r3" => return Ok(Kind::Etcd { members: 3 }),
            _ => {}
        }
        let bad = || {
            format!(
                "--capacity-impls: `{name}` is not an implementation (tokio-fsync, tokio-r3, \
                 tokio-batched-r3, tokio-single-fsync, tokio-single-r3, tokio-fsync-shards4, \
                 tokio-fsync-no-renew-many, etcd, etcd-r3)"
            )
        };
        let (name, renew_many) = match name.strip_suffix("-no-renew-many") {
            Some(rest) => (rest, false),
            None => (name, true),
        };
        let (rest, shards) = match name.rsplit_once("-shards") {
            Some((rest, n)) => (rest, Some(n.parse::<usize>().map_err(|_| bad())?)),
            None => (name, None),
        };
        let (coalesce, place) = if let Some(p) = rest.strip_prefix("tokio-batched-") {
            (CoalesceWrites::On, p)
        } else if let Some(p) = rest.strip_prefix("tokio-single-") {
            (CoalesceWrites::Off, p)
        } else {
            (
                CoalesceWrites::Auto,
                rest.strip_prefix("tokio-").ok_or_else(bad)?,
            )
        };
        let cluster = match place {
            "fsync" => false,
            "r3" => true,
            _ => return Err(bad()),
        };
        Ok(Kind::Service {
            cluster,
            shards,
            coalesce,
            renew_many,
        })
    }
}

/// How one service implementation is run.
struct Setting {
    cluster: bool,
    shards: Option<usize>,
    coalesce: CoalesceWrites,
    renew_many: bool,
}

/// The 1-minute load average.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Runs every implementation's ramp, printing as it goes and putting each under
/// `capacity.<impl>` of `report.json` in `out` as soon as it ends; returns them.
pub async fn run(out: &Path, options: &Options) -> Vec<(String, Capacity)> {
    let kinds: Vec<(String, Kind)> = options
        .impls
        .iter()
        .map(|n| Kind::parse(n).map(|k| (n.clone(), k)))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}"));
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_bucket_duration(Duration::from_secs(20))
        .expect("bucket duration")
        .install_recorder()
        .expect("a metrics recorder");
    let started = Instant::now();
    let load = load_average();
    let of_record = is_quiet(load);
    if of_record {
        println!(
            "capacity: load average {load:.2} at the start (under {QUIET_LOAD}): a run of record"
        );
    } else {
        println!(
            "capacity: load average {load:.2} at the start (not under {QUIET_LOAD}): NOT a run of record; \
             rerun alone on a quiet machine for figures to cite"
        );
    }
    put_value(
        out,
        "run",
        serde_json::json!({ "load_average_at_start": load, "of_record": of_record }),
    );
    let mut all = Vec::new();
    for (name, kind) in kinds {
        println!(
            "capacity {name}: steps {:?}, each held {} s once all are held; TTL {} s, renewed every {:.1} s ({:.0} s since the ramp began)",
            options.steps,
            options.hold_s,
            TTL.as_secs(),
            (TTL / 3).as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        let capacity = match kind {
            Kind::Service {
                cluster,
                shards,
                coalesce,
                renew_many,
            } => {
                let setting = Setting {
                    cluster,
                    shards,
                    coalesce,
                    renew_many,
                };
                service(out, &name, setting, options, &handle).await
            }
            Kind::Etcd { members } => etcd(out, &name, members, options).await,
        };
        println!(
            "capacity {name}: held {} (first failed step: {}), (service + server) CPU per 1,000 leases {}",
            capacity.held,
            capacity
                .first_failed
                .map_or("none".to_string(), |n| n.to_string()),
            capacity
                .cpu_per_1000_leases
                .map_or("-".to_string(), |c| format!("{c:.4}"))
        );
        put(out, &name, &capacity);
        all.push((name, capacity));
    }
    println!("capacity: done in {:.0} s", started.elapsed().as_secs_f64());
    all
}

/// The 1-minute load average under which a run's start counts as quiet.
pub const QUIET_LOAD: f64 = 1.0;

/// Whether a run that starts at `load` may be called a run of record: only on a
/// machine with less than one runnable task on average (nothing else running).
pub fn is_quiet(load: f64) -> bool {
    load < QUIET_LOAD
}

/// Puts `capacity` under `capacity.<name>` of `report.json`, keeping the rest.
fn put(out: &Path, name: &str, capacity: &Capacity) {
    put_value(out, name, serde_json::to_value(capacity).expect("json"));
}

/// Puts `value` under `capacity.<name>` of `report.json`, keeping the rest.
fn put_value(out: &Path, name: &str, value: serde_json::Value) {
    let path = out.join("report.json");
    let mut all = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|r| r.get("capacity").cloned())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    all[name] = value;
    let path = crate::report::put(out, "capacity", all);
    println!("capacity {name}: written to {}", path.display());
}

/// What a window measured, before it becomes a [`Step`].
struct Window {
    secs: f64,
    cpu_service: Option<f64>,
    cpu_server: f64,
    cpu_members: f64,
}

/// CPU seconds of `pids` together.
fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter().map(|p| cpu_s(*p)).sum()
}

/// Holds for `hold_s` (stopping early once `lost()` moves past `lost0`), and
/// measures CPU meanwhile.
async fn window(
    hold_s: u64,
    service: Option<u32>,
    servers: &[u32],
    lost: impl Fn() -> u64,
    lost0: u64,
) -> Window {
    let me = std::process::id();
    let c0 = (service.map(cpu_s), cpu_of(servers), cpu_s(me));
    let w0 = Instant::now();
    while w0.elapsed() < Duration::from_secs(hold_s) && lost() == lost0 {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let secs = w0.elapsed().as_secs_f64();
    // No window (the ramp failed): no rates, rather than ticks over nothing.
    let per_s = |d: f64| if hold_s == 0 { f64::NAN } else { d / secs };
    Window {
        secs,
        cpu_service: service.map(cpu_s).zip(c0.0).map(|(b, a)| per_s(b - a)),
        cpu_server: per_s(cpu_of(servers) - c0.1),
        cpu_members: per_s(cpu_s(me) - c0.2),
    }
}

/// Why a step failed, if it did, as its record says: a ramp that did not get
/// every lease held says how many it held (and any lost beside); else the leases
/// lost, with their reasons where the ramp knows them (`lost_reasons`); else
/// `other`, a failure only that ramp can see.
fn why_failed(
    leases: usize,
    ramp_s: f64,
    ramped: bool,
    held_at_end: i64,
    lost: u64,
    lost_reasons: Option<String>,
    other: Option<String>,
) -> Option<String> {
    let lost = (lost > 0).then(|| match lost_reasons {
        Some(reasons) => format!("{lost} lost ({reasons})"),
        None => format!("{lost} lost"),
    });
    if ramped {
        return lost.or(other);
    }
    let held = format!("{held_at_end} of {leases} held after {ramp_s:.0} s of ramp");
    Some(match lost {
        Some(lost) => format!("{held}, {lost}"),
        None => held,
    })
}

/// Adds the step's record, from what it measured, to `steps` (`renewals`: those
/// counted over the window, `None` when it had none; `why`: why it failed);
/// whether the ramp goes on: it stops at the first step that failed.
#[allow(clippy::too_many_arguments)]
fn record_step(
    steps: &mut Vec<Step>,
    leases: usize,
    ramp_s: f64,
    held_at_end: i64,
    lost: u64,
    w: &Window,
    renewals: Option<f64>,
    renew_ms: (f64, f64),
    why: Option<String>,
) -> bool {
    let renewals_per_s = renewals
        .filter(|_| w.secs > 0.0)
        .map_or(f64::NAN, |n| n / w.secs);
    let k = leases as f64 / 1000.0;
    let step = Step {
        leases,
        held: why.is_none(),
        ramp_s,
        held_at_end,
        lost,
        window_s: w.secs,
        renewals_per_s,
        renewals_per_s_needed: leases as f64 / (TTL.as_secs_f64() / 3.0),
        renew_p50_ms: renew_ms.0,
        renew_p99_ms: renew_ms.1,
        cpu_service: w.cpu_service,
        cpu_server: w.cpu_server,
        cpu_members: w.cpu_members,
        cpu_per_1000_leases: (w.cpu_service.unwrap_or(0.0) + w.cpu_server) / k,
        members_cpu_per_1000_leases: w.cpu_members / k,
        why,
    };
    println!(
        "  {} leases: {} (ramp {:.1} s, window {:.0} s, held {}, lost {}); renewals/s {:.0} (ttl/3 asks {:.0}), renew p50 {:.1} ms p99 {:.1} ms; CPU service {} server {:.2} members {:.2} cores",
        step.leases,
        step.why.as_deref().unwrap_or("held"),
        step.ramp_s,
        step.window_s,
        step.held_at_end,
        step.lost,
        step.renewals_per_s,
        step.renewals_per_s_needed,
        step.renew_p50_ms,
        step.renew_p99_ms,
        step.cpu_service
            .map_or("-".to_string(), |c| format!("{c:.2}")),
        step.cpu_server,
        step.cpu_members
    );
    let held = step.held;
    steps.push(step);
    held
}

/// The ramp's summary from its steps.
fn capacity_of(steps: Vec<Step>, setup: String, hold_s: u64, load: f64) -> Capacity {
    let best = steps.iter().rev().find(|s| s.held);
    Capacity {
        held: best.map_or(0, |s| s.leases),
        first_failed: steps.iter().find(|s| !s.held).map(|s| s.leases),
        cpu_per_1000_leases: best.map(|s| s.cpu_per_1000_leases),
        members_cpu_per_1000_leases: best.map(|s| s.members_cpu_per_1000_leases),
        setup,
        ttl_s: TTL.as_secs(),
        hold_s,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average_at_start: load,
        steps,
        recorded: None,
    }
}

#[cfg(test)]
mod tests {
    use super::Kind;

    #[test]
    fn a_run_is_of_record_only_when_it_starts_under_a_load_of_one() {
        assert!(super::is_quiet(0.0));
        assert!(super::is_quiet(0.99));
        assert!(!super::is_quiet(1.0));
        assert!(!super::is_quiet(7.5));
        // An unreadable load average proves nothing quiet.
        assert!(!super::is_quiet(f64::NAN));
    }

    #[test]
    fn a_failed_step_says_what_was_short_then_what_was_lost_then_the_ramps_own_reason() {
        let why = |ramped, lost, reasons: Option<&str>, other: Option<&str>| {
            super::why_failed(
                3_000,
                12.4,
                ramped,
                2_998,
                lost,
                reasons.map(str::to_string),
                other.map(str::to_string),
            )
        };
        let keys = Some("2998 of 3000 keys left at the window's end");
        let table = [
            (true, 0, None, None, None),
            (true, 0, Some("deadline_missed 0"), keys, keys),
            (true, 2, None, keys, Some("2 lost")),
            (
                true,
                2,
                Some("deadline_missed 2"),
                None,
                Some("2 lost (deadline_missed 2)"),
            ),
            (
                false,
                0,
                None,
                keys,
                Some("2998 of 3000 held after 12 s of ramp"),
            ),
            (
                false,
                1,
                Some("lost 1"),
                None,
                Some("2998 of 3000 held after 12 s of ramp, 1 lost (lost 1)"),
            ),
        ];
        for (ramped, lost, reasons, other, want) in table {
            assert_eq!(
                why(ramped, lost, reasons, other).as_deref(),
                want,
                "ramped {ramped}, lost {lost}, {reasons:?}, {other:?}"
            );
        }
    }

    #[test]
    fn implementation_names_parse_as_in_vs_etcd() {
        use super::CoalesceWrites::{Auto, Off, On};
        let svc = |cluster, shards, coalesce| Kind::Service {
            cluster,
            shards,
            coalesce,
            renew_many: true,
        };
        let table = [
            ("tokio-fsync", Ok(svc(false, None, Auto))),
            ("tokio-r3", Ok(svc(true, None, Auto))),
            ("tokio-batched-r3", Ok(svc(true, None, On))),
            ("tokio-single-fsync", Ok(svc(false, None, Off))),
            ("tokio-fsync-shards4", Ok(svc(false, Some(4), Auto))),
            ("tokio-r3-shards2", Ok(svc(true, Some(2), Auto))),
            (
                "tokio-fsync-shards2-no-renew-many",
                Ok(Kind::Service {
                    cluster: false,
                    shards: Some(2),
                    coalesce: Auto,
                    renew_many: false,
                }),
            ),
            ("etcd", Ok(Kind::Etcd { members: 1 })),
            ("etcd-r3", Ok(Kind::Etcd { members: 3 })),
        ];
        for (name, want) in table {
            assert_eq!(Kind::parse(name), want, "{name}");
        }
        for bad in ["tokio", "smol-fsync", "tokio-fsync-shardsx", "etcd-r5"] {
            let err = Kind::parse(bad).expect_err(bad);
            assert!(
                err.contains("--capacity-impls") && err.contains(bad),
                "{err}"
            );
        }
    }
}
