//! Where a renewal's CPU goes (`--cpu-profile`, `scripts/bench --profile`): one
//! capacity step of the service on a `sync_interval: always` server, and during
//! its window three profiles at once:
//!
//! - nats-server's own profiler (`prof_port`, `/debug/pprof/profile`), saved as
//!   `nats-server.pprof` (with `go tool pprof -top` beside it when Go is there);
//! - `perf record` of nats-server, of the service and of this process (where the
//!   holder library's members run), each as collapsed stacks and, when
//!   `inferno-flamegraph` is on the PATH, a flame graph (SVG).
//!
//! Each sample's stack is put in one category by its frames, read from the leaf
//! to the root: the first frame a rule of the process's table names decides
//! ([`SERVER`], [`SERVICE`], [`HOLDERS`]); a stack no rule names is `other`. So
//! the allocator, `memcpy` and the like count for the code that called them.
//! The shares times each process's CPU per renewal (its CPU over the window, from
//! `/proc`, over the renewals the holders counted) give microseconds per renewal.
//! Every run is kept in `profile.json` (a run of the same label is replaced) and
//! the table printed has a column per run.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::servers::Nats;

/// perf's sampling frequency, per thread, Hz.
pub const FREQUENCY: u32 = 499;
/// Bytes of stack perf copies per sample to unwind a Rust process (built
/// without frame pointers) from its DWARF tables.
pub const DWARF_STACK: u32 = 32_768;

/// What a process is, for its category table and for how perf unwinds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// nats-server (Go, frame pointers).
    Server,
    /// The lease service (`dagnats-leases serve`).
    Service,
    /// This process: the holder library's members.
    Holders,
}

impl Role {
    /// The name in files and the table.
    pub fn name(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Service => "service",
            Role::Holders => "holders",
        }
    }

    /// perf's unwinding: frame pointers for Go, DWARF for Rust.
    fn call_graph(self) -> String {
        match self {
            Role::Server => "fp".to_string(),
            Role::Service | Role::Holders => format!("dwarf,{DWARF_STACK}"),
        }
    }

    /// The category rules, in the order they are tried on each frame.
    fn rules(self) -> &'static [Rule] {
        match self {
            Role::Server => SERVER,
            Role::Service => SERVICE,
            Role::Holders => HOLDERS,
        }
    }

    /// Every category, in table order (the rules' and the fallbacks).
    fn categories(self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = Vec::new();
        for r in self.rules() {
            if !v.contains(&r.category) {
                v.push(r.category);
            }
        }
        if self == Role::Server {
            v.extend([GO_GC, GO_SCHED]);
        }
        v.push(OTHER);
        v
    }
}

mod categories;
mod record;

use categories::shares;
pub use categories::*;
pub use record::*;

/// One category's part of a process's CPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Part {
    /// The category.
    pub category: String,
    /// Its share of the process's samples.
    pub share: f64,
    /// Microseconds of CPU per renewal (share times the process's CPU per renewal).
    pub us_per_renewal: f64,
}

/// One process in one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessProfile {
    /// Which process (`server`, `service`, `holders`, or `server (pprof)`, the
    /// server's own profiler).
    pub process: String,
    /// Its CPU over the window, cores.
    pub cores: f64,
    /// Its CPU per renewal, microseconds.
    pub us_per_renewal: f64,
    /// The share of its CPU time in the kernel (`/proc`'s stime).
    pub system_share: f64,
    /// Samples (perf's, or the server's profiler's 10 ms ticks).
    pub samples: u64,
    /// The share of samples whose leaf frame is in the kernel (perf only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_leaf_share: Option<f64>,
    /// Each category, in table order.
    pub parts: Vec<Part>,
}

/// One run's profile: what `profile.json`'s `runs` hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunProfile {
    /// The column's name: the commit (and `--cpu-profile-label`, if given).
    pub label: String,
    /// When it ran (UTC, RFC 3339).
    pub at: String,
    /// What ran.
    pub setup: String,
    /// Leases held.
    pub leases: usize,
    /// The window, seconds.
    pub window_s: f64,
    /// Renewals answered per second in the window.
    pub renewals_per_s: f64,
    /// Messages the server read per renewal (`/varz` in_msgs over the renewals).
    pub server_in_msgs_per_renewal: f64,
    /// Messages the server delivered per renewal (`/varz` out_msgs).
    pub server_out_msgs_per_renewal: f64,
    /// The same by group of client connections (`/connz`).
    pub connections: Vec<Connections>,
    /// Load average (1 minute) at the window's start and end: the machine is shared.
    pub load_average: (f64, f64),
    /// Cores of the machine.
    pub cores: usize,
    /// Each process.
    pub processes: Vec<ProcessProfile>,
    /// The files written (perf data, collapsed stacks, flame graphs, pprof).
    pub files: Vec<String>,
}

/// The messages of a group of client connections (`/connz`), per renewal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Connections {
    /// The connections' name, or their client library and version.
    pub group: String,
    /// How many.
    pub connections: usize,
    /// Messages the server read from them, per renewal.
    pub in_per_renewal: f64,
    /// Messages the server delivered to them, per renewal.
    pub out_per_renewal: f64,
}

/// `profile.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProfileFile {
    /// Every run kept, oldest first.
    pub runs: Vec<RunProfile>,
}

/// Writes `stacks` as collapsed stacks (root first, `;` between frames), the
/// input of a flame graph.
fn write_folded(path: &Path, process: &str, stacks: &[(Vec<Frame>, u64)]) {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for (frames, w) in stacks {
        let mut line = process.to_string();
        for f in frames.iter().rev() {
            line.push(';');
            let name = if f.is_kernel() {
                format!("{}_[k]", f.sym)
            } else {
                f.sym.clone()
            };
            line.push_str(&name.replace(';', ":"));
        }
        *counts.entry(line).or_default() += w;
    }
    let text: String = counts
        .into_iter()
        .map(|(k, v)| format!("{k} {v}\n"))
        .collect();
    std::fs::write(path, text).expect("write collapsed stacks");
}

/// `inferno-flamegraph` on the PATH or in cargo's bin directory.
fn flamegraph_tool() -> Option<PathBuf> {
    let mut candidates = vec![PathBuf::from("inferno-flamegraph")];
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        candidates.push(PathBuf::from(home).join("bin/inferno-flamegraph"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cargo/bin/inferno-flamegraph"));
    }
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Renders `folded` as `svg`; false when it could not.
fn flamegraph(tool: &Path, folded: &Path, svg: &Path, title: &str) -> bool {
    let Ok(out) = std::fs::File::create(svg) else {
        return false;
    };
    Command::new(tool)
        .args(["--title", title, "--minwidth", "0.2"])
        .arg(folded)
        .stdout(out)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A command's stdout, or why not.
fn output(cmd: &mut Command) -> Result<String, String> {
    let o = cmd.output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("failed")
            .to_string());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// What the profile needs from the capacity step it was taken in.
#[derive(Debug, Clone)]
pub struct StepFigures {
    /// Leases held.
    pub leases: usize,
    /// Renewals answered per second in the window.
    pub renewals_per_s: f64,
    /// The window, seconds.
    pub window_s: f64,
    /// What ran.
    pub setup: String,
}

/// Turns what was recorded into the run's profile: collapsed stacks, flame
/// graphs, the categories; adds it to `profile.json` in `out` and prints the
/// table of every run there.
pub fn analyse(out: &Path, recorded: &Recorded, step: &StepFigures, label: &str) {
    let renewals = step.renewals_per_s * recorded.secs as f64;
    let tool = flamegraph_tool();
    if tool.is_none() {
        println!(
            "profile: inferno-flamegraph not found (cargo install inferno): collapsed stacks only"
        );
    }
    let mut files = Vec::new();
    let rel = |p: &Path| {
        p.strip_prefix(out)
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned()
    };
    let mut processes = Vec::new();
    let mut part = |process: String,
                    role: Role,
                    m: &Measured,
                    stacks: &[(Vec<Frame>, u64)],
                    kernel_leaf: Option<f64>| {
        let (total, by) = shares(role, stacks);
        let cpu_s = m.user_s + m.system_s;
        let us = cpu_s / renewals * 1e6;
        let parts = role
            .categories()
            .into_iter()
            .map(|c| {
                let share = by.get(c).copied().unwrap_or(0.0);
                Part {
                    category: c.to_string(),
                    share,
                    us_per_renewal: share * us,
                }
            })
            .collect();
        processes.push(ProcessProfile {
            process,
            cores: cpu_s / recorded.secs as f64,
            us_per_renewal: us,
            system_share: if cpu_s > 0.0 { m.system_s / cpu_s } else { 0.0 },
            samples: total,
            kernel_leaf_share: kernel_leaf,
            parts,
        });
    };
    for (role, m) in &recorded.processes {
        let Some(data) = &m.perf_data else { continue };
        let script = match output(
            Command::new("perf")
                .args([
                    "script",
                    "--no-inline",
                    "-F",
                    "comm,tid,period,ip,sym,dso",
                    "-i",
                ])
                .arg(data),
        ) {
            Ok(s) => s,
            Err(e) => {
                println!("profile: perf script of the {}: {e}", role.name());
                continue;
            }
        };
        let stacks = parse_perf_script(&script);
        let folded = recorded.dir.join(format!("{}.folded", role.name()));
        write_folded(&folded, role.name(), &stacks);
        files.push(rel(&data.clone()));
        files.push(rel(&folded));
        if let Some(tool) = &tool {
            let svg = out.join(format!("flamegraph.{}.svg", role.name()));
            let title = format!(
                "{}: {} leases, {:.0} renewals/s ({label})",
                role.name(),
                step.leases,
                step.renewals_per_s
            );
            if flamegraph(tool, &folded, &svg, &title) {
                files.push(rel(&svg));
            }
        }
        let n = stacks.len().max(1) as f64;
        let kernel_leaf = stacks
            .iter()
            .filter(|(f, _)| f.first().is_some_and(Frame::is_kernel))
            .count() as f64
            / n;
        part(
            role.name().to_string(),
            *role,
            m,
            &stacks,
            Some(kernel_leaf),
        );
    }
    // The server's own profiler: the same categories, from its stacks.
    if let (Some(pprof), Some(m)) = (&recorded.pprof, recorded.processes.get(&Role::Server)) {
        files.push(rel(pprof));
        let go = |args: &[&str]| {
            output(
                Command::new("go")
                    .args(["tool", "pprof"])
                    .args(args)
                    .arg(&recorded.nats_bin)
                    .arg(pprof),
            )
        };
        match go(&["-top", "-nodecount=40"]) {
            Ok(top) => {
                let path = recorded.dir.join("nats-server.pprof.top.txt");
                std::fs::write(&path, top).expect("write pprof top");
                files.push(rel(&path));
                if let Ok(traces) = go(&["-traces"]) {
                    let stacks = parse_pprof_traces(&traces);
                    part(
                        "server (its own profiler)".to_string(),
                        Role::Server,
                        m,
                        &stacks,
                        None,
                    );
                }
            }
            Err(e) => println!(
                "profile: `go tool pprof` not available ({e}): nats-server.pprof kept as it is, the server's categories come from perf only"
            ),
        }
    }
    let run = RunProfile {
        label: label.to_string(),
        at: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        setup: step.setup.clone(),
        leases: step.leases,
        window_s: step.window_s,
        renewals_per_s: step.renewals_per_s,
        server_in_msgs_per_renewal: recorded.server_in_msgs / renewals,
        server_out_msgs_per_renewal: recorded.server_out_msgs / renewals,
        connections: recorded
            .connections
            .iter()
            .map(|(group, n, i, o)| Connections {
                group: group.clone(),
                connections: *n,
                in_per_renewal: i / renewals,
                out_per_renewal: o / renewals,
            })
            .collect(),
        load_average: recorded.load_average,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        processes,
        files,
    };
    let path = out.join("profile.json");
    let mut all: ProfileFile = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    for c in &run.connections {
        println!(
            "profile: {} connection(s) `{}`: {:.2} messages in, {:.2} out per renewal",
            c.connections, c.group, c.in_per_renewal, c.out_per_renewal
        );
    }
    all.runs.retain(|r| r.label != run.label);
    all.runs.push(run);
    std::fs::write(&path, serde_json::to_string_pretty(&all).expect("json"))
        .expect("write profile.json");
    print!("{}", table(&all.runs));
    println!("profile: written to {}", path.display());
}

/// The table of `runs`, a column per run, in Markdown: for each process its
/// CPU per renewal, then each category's share and microseconds per renewal.
pub fn table(runs: &[RunProfile]) -> String {
    let mut t = String::from("| process: category |");
    for r in runs {
        t += &format!(" {} |", r.label);
    }
    t += "\n| --- |";
    t += &" --- |".repeat(runs.len());
    t += "\n";
    let row = |t: &mut String, name: &str, cell: &dyn Fn(&RunProfile) -> String| {
        *t += &format!("| {name} |");
        for r in runs {
            *t += &format!(" {} |", cell(r));
        }
        *t += "\n";
    };
    row(&mut t, "leases; renewals/s", &|r| {
        format!("{}; {:.0}", r.leases, r.renewals_per_s)
    });
    row(&mut t, "server messages in / out per renewal", &|r| {
        format!(
            "{:.2} / {:.2}",
            r.server_in_msgs_per_renewal, r.server_out_msgs_per_renewal
        )
    });
    row(&mut t, "load average (1 min) start / end", &|r| {
        format!("{:.1} / {:.1}", r.load_average.0, r.load_average.1)
    });
    let mut names: Vec<String> = Vec::new();
    for r in runs {
        for p in &r.processes {
            if !names.contains(&p.process) {
                names.push(p.process.clone());
            }
        }
    }
    for name in names {
        let of = |r: &RunProfile| r.processes.iter().find(|p| p.process == name).cloned();
        row(&mut t, &format!("**{name}**: CPU per renewal"), &|r| {
            of(r).map_or("-".to_string(), |p| {
                format!(
                    "**{:.0} us** ({:.2} cores; kernel: {:.0}% by /proc, {})",
                    p.us_per_renewal,
                    p.cores,
                    p.system_share * 100.0,
                    p.kernel_leaf_share
                        .map_or("-".to_string(), |k| format!("{:.0}% of samples", k * 100.0))
                )
            })
        });
        let mut cats: Vec<String> = Vec::new();
        for r in runs {
            if let Some(p) = of(r) {
                for c in &p.parts {
                    if !cats.contains(&c.category) {
                        cats.push(c.category.clone());
                    }
                }
            }
        }
        for c in cats {
            row(&mut t, &format!("{name}: {c}"), &|r| {
                of(r)
                    .and_then(|p| p.parts.into_iter().find(|x| x.category == c))
                    .map_or("-".to_string(), |x| {
                        format!("{:.0}% ({:.1} us)", x.share * 100.0, x.us_per_renewal)
                    })
            });
        }
    }
    t
}
