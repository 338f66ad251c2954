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

/// How a rule names a frame.
#[derive(Debug, Clone, Copy)]
pub enum Match {
    /// A kernel frame.
    Kernel,
    /// The symbol contains one of these.
    Contains(&'static [&'static str]),
    /// The symbol's path (after `<`, `&`, `core::ptr::drop_in_place<` and the
    /// like) starts with one of these: the crate or module the code is in.
    Path(&'static [&'static str]),
}

/// One rule: frames it names go to `category`.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The table's row.
    pub category: &'static str,
    /// Which frames.
    pub matches: Match,
}

/// A server stack that no rule names, in Go's garbage collector (its background
/// workers; assists count for the code that allocated).
pub const GO_GC: &str = "Go runtime: GC";
/// A server stack that no rule names, in Go's scheduler and network poller:
/// goroutines parked and woken, threads put to sleep and woken (futexes).
pub const GO_SCHED: &str = "Go runtime: scheduler, poller, wake-ups";
/// A stack no rule names.
pub const OTHER: &str = "other";

/// The async runtime's frames, the same in the service and the holders.
const RUNTIME: &[&str] = &[
    "tokio::",
    "mio::",
    "futures_util::",
    "futures_core::",
    "futures_channel::",
    "futures_executor::",
    "parking_lot",
    "std::thread",
    "std::sys::",
];

const fn rule(category: &'static str, matches: Match) -> Rule {
    Rule { category, matches }
}

/// nats-server. The kernel's part counts for the server code that made the
/// system call (an fsync for the store, a writev for delivery, a read for parse).
pub const SERVER: &[Rule] = &[
    rule(
        "store + fsync",
        Match::Contains(&[
            "server.(*fileStore)",
            "server.(*msgBlock)",
            "os.(*File).Sync",
        ]),
    ),
    rule(
        "delivery (fan-out, socket writes)",
        Match::Contains(&[
            "server.(*client).deliverMsg",
            "server.(*client).flushOutbound",
            "server.(*client).flushClients",
            "server.(*client).writeLoop",
            "server.(*client).queueOutbound",
            "server.(*client).flushSignal",
            "server.(*client).addToPCD",
            "server.(*client).enqueueProto",
        ]),
    ),
    rule(
        "JetStream (checks, ack, republish)",
        Match::Contains(&[
            "server.(*stream)",
            "server.(*jsOutQ)",
            "server.(*jetStream)",
            "server.(*consumer)",
            "server.(*ipQueue",
            "server.newJSPubMsg",
            "server.(*jsAccount)",
        ]),
    ),
    rule(
        "route (subject match, permissions)",
        Match::Contains(&[
            "server.(*Sublist)",
            "server.(*client).processInboundClientMsg",
            "server.(*client).processInboundMsg",
            "server.(*client).processMsgResults",
            "server.(*client).pubAllowed",
            "server.(*client).checkForImportServices",
            "server.(*Account)",
        ]),
    ),
    rule(
        "parse (read, protocol)",
        Match::Contains(&[
            "server.(*client).parse",
            "server.(*client).readLoop",
            "server.(*client).process",
        ]),
    ),
];

/// The lease service.
pub const SERVICE: &[Rule] = &[
    rule("kernel (system calls)", Match::Kernel),
    rule(
        "client library (strict client, async-nats)",
        Match::Path(&[
            "async_nats::",
            "dagnats_leases_nats::strict",
            "dagnats_leases_core::proto::",
            "bytes::",
            "nuid::",
        ]),
    ),
    rule(
        "decode (requests, acks, change events)",
        Match::Contains(&[
            "serde_json::de",
            "serde::de::",
            "serde_core::de::",
            "as serde::de::Deserialize",
            "as serde_core::de::Deserialize",
            "::decode",
            "::parse",
            "time::parsing",
        ]),
    ),
    rule(
        "encode (replies, writes)",
        Match::Contains(&[
            "serde_json::ser",
            "serde::ser::",
            "serde_core::ser::",
            "as serde::ser::Serialize",
            "as serde_core::ser::Serialize",
            "::to_json",
            "::encode",
            "time::formatting",
        ]),
    ),
    rule(
        "telemetry (metrics, logs)",
        Match::Path(&[
            "metrics::",
            "metrics_exporter_prometheus::",
            "metrics_util::",
            "tracing::",
            "tracing_core::",
            "tracing_subscriber::",
            "dagnats_leases_nats::telemetry",
        ]),
    ),
    rule("runtime (tokio)", Match::Path(RUNTIME)),
    rule(
        "call logic (service machine, its IO loop)",
        Match::Path(&[
            "dagnats_leases_core::",
            "dagnats_leases_nats::",
            "dagnats_leases_tokio::",
            "dagnats_leases::",
        ]),
    ),
];

/// This process: the holder library's members (and the benchmark's own loop,
/// which sleeps through the window).
pub const HOLDERS: &[Rule] = &[
    rule("kernel (system calls)", Match::Kernel),
    rule(
        "client library (async-nats)",
        Match::Path(&["async_nats::", "bytes::", "nuid::"]),
    ),
    rule(
        "JSON (encode, decode)",
        Match::Contains(&[
            "serde_json::",
            "serde::de::",
            "serde::ser::",
            "serde_core::",
        ]),
    ),
    rule(
        "telemetry (metrics)",
        Match::Path(&[
            "metrics::",
            "metrics_exporter_prometheus::",
            "metrics_util::",
            "dagnats_leases_nats::telemetry",
            "tracing::",
            "tracing_core::",
        ]),
    ),
    rule("runtime (tokio)", Match::Path(RUNTIME)),
    rule(
        "library: machines (core)",
        Match::Path(&["dagnats_leases_core::"]),
    ),
    rule(
        "library: driver (member, adapter)",
        Match::Path(&["dagnats_leases_nats::", "dagnats_leases_tokio::"]),
    ),
    rule(
        "the benchmark's loop",
        Match::Path(&["dagnats_leases_bench::"]),
    ),
];

/// One stack frame: its symbol and the object it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Function name (demangled; Rust's hash suffix removed).
    pub sym: String,
    /// The object (binary, library, `[kernel.kallsyms]`).
    pub dso: String,
}

impl Frame {
    fn is_kernel(&self) -> bool {
        self.dso.contains("kernel.kallsyms") || self.dso.starts_with("[kernel")
    }
}

/// The path a Rust symbol's code is in: past `<`, `&`, `mut `, `dyn ` and
/// `core::ptr::drop_in_place<`.
fn path_of(sym: &str) -> &str {
    let mut s = sym;
    loop {
        let before = s;
        for p in ["core::ptr::drop_in_place<", "<", "&", "mut ", "dyn "] {
            if let Some(r) = s.strip_prefix(p) {
                s = r;
            }
        }
        if s == before {
            return s;
        }
    }
}

impl Match {
    fn names(&self, f: &Frame) -> bool {
        match self {
            Match::Kernel => f.is_kernel(),
            Match::Contains(any) => !f.is_kernel() && any.iter().any(|p| f.sym.contains(p)),
            Match::Path(any) => {
                let path = path_of(&f.sym);
                !f.is_kernel() && any.iter().any(|p| path.starts_with(p))
            }
        }
    }
}

/// The category of a stack (`frames` leaf first) for `role`.
pub fn categorise(role: Role, frames: &[Frame]) -> &'static str {
    for f in frames.iter().filter(|f| f.dso != "inlined") {
        if let Some(r) = role.rules().iter().find(|r| r.matches.names(f)) {
            return r.category;
        }
    }
    if role == Role::Server {
        if frames.iter().any(|f| {
            [
                "runtime.gcBgMarkWorker",
                "runtime.bgsweep",
                "runtime.bgscavenge",
            ]
            .iter()
            .any(|g| f.sym.starts_with(g))
        }) {
            return GO_GC;
        }
        if frames.iter().any(|f| f.sym.starts_with("runtime.")) {
            return GO_SCHED;
        }
    }
    OTHER
}

/// A process being recorded.
struct Target {
    role: Role,
    pid: u32,
    perf: Option<Child>,
    data: PathBuf,
    cpu0: (f64, f64),
}

/// The profiles under way during one window.
pub struct Recording {
    dir: PathBuf,
    secs: u64,
    targets: Vec<Target>,
    pprof: Option<std::thread::JoinHandle<Result<usize, String>>>,
    varz0: (f64, f64),
    connz0: BTreeMap<u64, (String, f64, f64)>,
    load0: f64,
    nats_bin: PathBuf,
}

/// utime and stime of `pid`, seconds.
fn times(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) as f64;
    let hz = crate::scale::clk_tck();
    (ticks(11) / hz, ticks(12) / hz)
}

/// Each client connection's group (its name, or its client library and version),
/// `in_msgs` and `out_msgs` (`/connz`), by connection id.
fn connz(server: &Nats) -> BTreeMap<u64, (String, f64, f64)> {
    let v = server.monitor("/connz?limit=100000").unwrap_or_default();
    let mut out = BTreeMap::new();
    for c in v["connections"].as_array().into_iter().flatten() {
        let Some(cid) = c["cid"].as_u64() else {
            continue;
        };
        let name = c["name"].as_str().unwrap_or_default();
        let group = if name.is_empty() {
            format!(
                "{} {}",
                c["lang"].as_str().unwrap_or("?"),
                c["version"].as_str().unwrap_or("?")
            )
        } else {
            name.to_string()
        };
        let n = |k: &str| c[k].as_f64().unwrap_or(0.0);
        out.insert(cid, (group, n("in_msgs"), n("out_msgs")));
    }
    out
}

/// Messages of each group of connections over the window: (group, connections,
/// in, out).
fn conn_groups(
    before: &BTreeMap<u64, (String, f64, f64)>,
    after: &BTreeMap<u64, (String, f64, f64)>,
) -> Vec<(String, usize, f64, f64)> {
    let mut by: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
    for (cid, (group, i1, o1)) in after {
        let (i0, o0) = before.get(cid).map_or((0.0, 0.0), |b| (b.1, b.2));
        let e = by.entry(group.clone()).or_default();
        e.0 += 1;
        e.1 += i1 - i0;
        e.2 += o1 - o0;
    }
    by.into_iter().map(|(g, (n, i, o))| (g, n, i, o)).collect()
}

/// The server's `in_msgs` and `out_msgs` (`/varz`).
fn varz(server: &Nats) -> (f64, f64) {
    let v = server.monitor("/varz").unwrap_or_default();
    let n = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    (n("in_msgs"), n("out_msgs"))
}

/// The 1-minute load average.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// `perf record` of `pid` for `secs`, or why it could not start.
fn perf_record(role: Role, pid: u32, secs: u64, data: &Path, log: &Path) -> Result<Child, String> {
    let log = std::fs::File::create(log).map_err(|e| e.to_string())?;
    Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-F", &FREQUENCY.to_string()])
        .args(["--call-graph", &role.call_graph()])
        .args(["-p", &pid.to_string(), "-o"])
        .arg(data)
        .args(["--", "sleep", &secs.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot run perf: {e}"))
}

/// A GET of `path` on `port` whose body goes to `file`; its length.
fn fetch(port: u16, path: &str, file: &Path, timeout: Duration) -> Result<usize, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut all = Vec::new();
    s.read_to_end(&mut all).map_err(|e| e.to_string())?;
    let head_end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no HTTP header in the answer")?;
    let head = String::from_utf8_lossy(&all[..head_end]).to_string();
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "answered {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    let body = &all[head_end + 4..];
    std::fs::write(file, body).map_err(|e| e.to_string())?;
    Ok(body.len())
}

impl Recording {
    /// Starts perf on each of `pids` and the server's own profiler, each for
    /// `secs`; profiles go to `dir`.
    pub fn start(dir: &Path, secs: u64, pids: &[(Role, u32)], server: &Nats) -> Recording {
        std::fs::create_dir_all(dir).expect("profile dir");
        let targets = pids
            .iter()
            .map(|&(role, pid)| {
                let data = dir.join(format!("perf.{}.data", role.name()));
                let log = dir.join(format!("perf.{}.log", role.name()));
                let perf = perf_record(role, pid, secs, &data, &log)
                    .map_err(|e| println!("profile: {} not recorded: {e}", role.name()))
                    .ok();
                Target {
                    role,
                    pid,
                    perf,
                    data,
                    cpu0: times(pid),
                }
            })
            .collect();
        let pprof = server.prof_port().map(|port| {
            let file = dir.join("nats-server.pprof");
            std::thread::spawn(move || {
                fetch(
                    port,
                    &format!("/debug/pprof/profile?seconds={secs}"),
                    &file,
                    Duration::from_secs(secs + 30),
                )
            })
        });
        Recording {
            dir: dir.to_path_buf(),
            secs,
            targets,
            pprof,
            varz0: varz(server),
            connz0: connz(server),
            load0: load_average(),
            nats_bin: server.binary().to_path_buf(),
        }
    }

    /// Waits for every profile to end (blocking).
    pub fn finish(mut self, server: &Nats) -> Recorded {
        let varz1 = varz(server);
        let connz1 = connz(server);
        let load1 = load_average();
        let mut processes = BTreeMap::new();
        for t in &mut self.targets {
            let cpu1 = times(t.pid);
            let recorded = match t.perf.take() {
                Some(mut child) => match child.wait() {
                    Ok(s) if s.success() => Some(t.data.clone()),
                    Ok(s) => {
                        println!(
                            "profile: perf of the {} ended {s}: see perf.{}.log",
                            t.role.name(),
                            t.role.name()
                        );
                        None
                    }
                    Err(e) => {
                        println!("profile: perf of the {}: {e}", t.role.name());
                        None
                    }
                },
                None => None,
            };
            processes.insert(
                t.role,
                Measured {
                    user_s: cpu1.0 - t.cpu0.0,
                    system_s: cpu1.1 - t.cpu0.1,
                    perf_data: recorded,
                },
            );
        }
        let pprof = match self.pprof.take().map(|h| h.join()) {
            Some(Ok(Ok(bytes))) => {
                println!("profile: nats-server's own profile: {bytes} bytes");
                Some(self.dir.join("nats-server.pprof"))
            }
            Some(Ok(Err(e))) => {
                println!("profile: nats-server's own profile not fetched: {e}");
                None
            }
            Some(Err(_)) => None,
            None => None,
        };
        Recorded {
            dir: self.dir,
            secs: self.secs,
            processes,
            pprof,
            nats_bin: self.nats_bin,
            server_in_msgs: varz1.0 - self.varz0.0,
            server_out_msgs: varz1.1 - self.varz0.1,
            connections: conn_groups(&self.connz0, &connz1),
            load_average: (self.load0, load1),
        }
    }
}

/// A process's CPU over the window and its perf data.
#[derive(Debug, Clone)]
pub struct Measured {
    /// User CPU over the window, seconds.
    pub user_s: f64,
    /// System CPU over the window, seconds.
    pub system_s: f64,
    /// perf's data, if it recorded.
    pub perf_data: Option<PathBuf>,
}

/// What one window recorded.
#[derive(Debug, Clone)]
pub struct Recorded {
    dir: PathBuf,
    secs: u64,
    processes: BTreeMap<Role, Measured>,
    pprof: Option<PathBuf>,
    nats_bin: PathBuf,
    server_in_msgs: f64,
    server_out_msgs: f64,
    connections: Vec<(String, usize, f64, f64)>,
    load_average: (f64, f64),
}

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

/// Strips Rust's `::h0123456789abcdef` hash suffix.
fn clean(sym: &str) -> String {
    let s = match sym.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            head
        }
        _ => sym,
    };
    s.to_string()
}

/// Stacks (leaf first) and their weights from `perf script -F comm,tid,period,ip,sym,dso`.
pub fn parse_perf_script(text: &str) -> Vec<(Vec<Frame>, u64)> {
    let mut out = Vec::new();
    let mut frames: Vec<Frame> = Vec::new();
    let mut in_sample = false;
    for line in text.lines() {
        if line.trim().is_empty() {
            if in_sample {
                out.push((std::mem::take(&mut frames), 1));
                in_sample = false;
            }
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            if in_sample {
                out.push((std::mem::take(&mut frames), 1));
            }
            in_sample = true;
            continue;
        }
        // `\t  7f12ab sym+0x1 (dso)`: the address, then the symbol, then the object.
        let t = line.trim();
        let Some((_ip, rest)) = t.split_once(char::is_whitespace) else {
            continue;
        };
        let rest = rest.trim();
        let (sym, dso) = match rest.rsplit_once(" (") {
            Some((s, d)) => (s, d.trim_end_matches(')')),
            None => (rest, ""),
        };
        frames.push(Frame {
            sym: clean(sym),
            dso: dso.to_string(),
        });
    }
    if in_sample {
        out.push((frames, 1));
    }
    out
}

/// Stacks (leaf first) and their weights (microseconds) from `go tool pprof -traces`.
pub fn parse_pprof_traces(text: &str) -> Vec<(Vec<Frame>, u64)> {
    let mut out = Vec::new();
    let mut cur: Option<(Vec<Frame>, u64)> = None;
    let mut started = false;
    for line in text.lines() {
        if line.starts_with("-----------+") {
            started = true;
            if let Some(c) = cur.take() {
                out.push(c);
            }
            continue;
        }
        let t = line.trim().trim_end_matches(" (inline)");
        // A goroutine's pprof labels (`stream:  KV_leases`) come before its stack.
        let label = t
            .split_whitespace()
            .next()
            .is_some_and(|w| w.ends_with(':'));
        if !started || t.is_empty() || label {
            continue;
        }
        match &mut cur {
            None => {
                let Some((value, sym)) = t.split_once(char::is_whitespace) else {
                    continue;
                };
                let us = duration_us(value);
                cur = Some((
                    vec![Frame {
                        sym: sym.trim().to_string(),
                        dso: String::new(),
                    }],
                    us,
                ));
            }
            Some((frames, _)) => frames.push(Frame {
                sym: t.to_string(),
                dso: String::new(),
            }),
        }
    }
    if let Some(c) = cur {
        out.push(c);
    }
    out
}

/// `10ms`, `1.20s`, `500us` as microseconds.
fn duration_us(v: &str) -> u64 {
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().unwrap_or(0.0);
    let k = match unit {
        "ns" => 1e-3,
        "us" | "µs" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "min" | "mins" => 60e6,
        "hr" | "hrs" => 3600e6,
        _ => 0.0,
    };
    (n * k).round() as u64
}

/// Shares of each category of `role` in `stacks`.
fn shares(role: Role, stacks: &[(Vec<Frame>, u64)]) -> (u64, BTreeMap<&'static str, f64>) {
    let mut by: BTreeMap<&'static str, u64> = BTreeMap::new();
    let total: u64 = stacks.iter().map(|s| s.1).sum();
    for (frames, w) in stacks {
        *by.entry(categorise(role, frames)).or_default() += w;
    }
    let shares = by
        .into_iter()
        .map(|(k, v)| {
            (
                k,
                if total == 0 {
                    0.0
                } else {
                    v as f64 / total as f64
                },
            )
        })
        .collect();
    (total, shares)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(frames: &[(&str, &str)]) -> Vec<Frame> {
        frames
            .iter()
            .map(|(s, d)| Frame {
                sym: s.to_string(),
                dso: d.to_string(),
            })
            .collect()
    }

    #[test]
    fn the_first_frame_a_rule_names_from_the_leaf_decides() {
        let k = "[kernel.kallsyms]";
        let bin = "/x/dagnats-leases";
        let table = [
            // The allocator counts for its caller.
            (
                Role::Service,
                stack(&[
                    ("malloc", "libc.so.6"),
                    ("serde_json::de::from_slice", bin),
                    ("dagnats_leases_nats::service::serve::{{closure}}", bin),
                ]),
                "decode (requests, acks, change events)",
            ),
            // The kernel decides for the service ...
            (
                Role::Service,
                stack(&[
                    ("do_syscall_64", k),
                    ("__libc_sendmsg", "libc.so.6"),
                    ("<dagnats_leases_nats::strict::Conn as X>::poll", bin),
                ]),
                "kernel (system calls)",
            ),
            (
                Role::Service,
                stack(&[
                    ("dagnats_leases_core::proto::encode::publish", bin),
                    ("dagnats_leases_nats::service::serve", bin),
                ]),
                "client library (strict client, async-nats)",
            ),
            (
                Role::Service,
                stack(&[
                    ("core::ptr::drop_in_place<tokio::sync::mpsc::Rx>", bin),
                    ("dagnats_leases_core::service::Service::handle", bin),
                ]),
                "runtime (tokio)",
            ),
            (Role::Service, stack(&[("[unknown]", "libc.so.6")]), OTHER),
            // ... but not for the server: an fsync is the store's.
            (
                Role::Server,
                stack(&[
                    ("ext4_sync_file", k),
                    ("syscall.Syscall", "nats-server"),
                    ("os.(*File).Sync", "nats-server"),
                    (
                        "github.com/nats-io/nats-server/v2/server.(*msgBlock).flushPendingMsgsLocked",
                        "nats-server",
                    ),
                ]),
                "store + fsync",
            ),
            (
                Role::Server,
                stack(&[
                    ("runtime.mallocgc", "nats-server"),
                    (
                        "github.com/nats-io/nats-server/v2/server.(*client).deliverMsg",
                        "nats-server",
                    ),
                    (
                        "github.com/nats-io/nats-server/v2/server.(*client).processMsgResults",
                        "nats-server",
                    ),
                    (
                        "github.com/nats-io/nats-server/v2/server.(*client).parse",
                        "nats-server",
                    ),
                ]),
                "delivery (fan-out, socket writes)",
            ),
            (
                Role::Server,
                stack(&[
                    (
                        "github.com/nats-io/nats-server/v2/server.(*client).processInboundClientMsg",
                        "nats-server",
                    ),
                    (
                        "github.com/nats-io/nats-server/v2/server.(*client).parse",
                        "nats-server",
                    ),
                ]),
                "route (subject match, permissions)",
            ),
            (
                Role::Server,
                stack(&[
                    ("runtime.scanobject", "nats-server"),
                    ("runtime.gcBgMarkWorker", "nats-server"),
                ]),
                GO_GC,
            ),
            (
                Role::Server,
                stack(&[
                    ("finish_task_switch.isra.0", k),
                    ("runtime.park_m", "nats-server"),
                    ("runtime.mcall", "nats-server"),
                ]),
                GO_SCHED,
            ),
            // Inlined frames (short names, no path) are passed over.
            (
                Role::Service,
                stack(&[
                    ("poll<tokio::runtime::Foo>", "inlined"),
                    (
                        "dagnats_leases_core::known::KnownLeases::handle_change",
                        bin,
                    ),
                ]),
                "call logic (service machine, its IO loop)",
            ),
            (
                Role::Holders,
                stack(&[
                    (
                        "dagnats_leases_core::holder::campaign::Campaign::handle",
                        bin,
                    ),
                    ("dagnats_leases_nats::member::driver::run", bin),
                ]),
                "library: machines (core)",
            ),
        ];
        for (role, frames, want) in table {
            assert_eq!(categorise(role, &frames), want, "{frames:?}");
        }
    }

    #[test]
    fn perf_script_and_pprof_traces_parse() {
        let perf = "dagnats-leases 12/13 2004008\n\
            \tffffffff81d72a59 read_zero ([kernel.kallsyms])\n\
            \t           f82ad read (/usr/lib/x86_64-linux-gnu/libc.so.6)\n\
            \t          5a0001 tokio::runtime::park::Inner::park::h0123456789abcdef (/x/dagnats-leases)\n\
            \n\
            dagnats-leases 12/14 2004008\n\
            \t          5b0001 [unknown] (/x/dagnats-leases)\n";
        let stacks = parse_perf_script(perf);
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks[0].0.len(), 3);
        assert!(stacks[0].0[0].is_kernel());
        assert_eq!(stacks[0].0[2].sym, "tokio::runtime::park::Inner::park");
        assert_eq!(stacks[1].0[0].sym, "[unknown]");

        let traces = "File: nats-server\nType: cpu\n\
            -----------+-------------------------------------------------------\n\
            \x20     10ms   runtime.futex\n\
            \x20            runtime.futexsleep\n\
            -----------+-------------------------------------------------------\n\
            \x20   stream:  KV_leases\n\
            \x20  account:  tokio\n\
            \x20   1.20s   syscall.Syscall\n\
            \x20            os.(*File).Sync (inline)\n\
            -----------+-------------------------------------------------------\n";
        let stacks = parse_pprof_traces(traces);
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks[0].1, 10_000);
        assert_eq!(stacks[1].1, 1_200_000);
        assert_eq!(stacks[1].0[1].sym, "os.(*File).Sync");
        assert_eq!(categorise(Role::Server, &stacks[1].0), "store + fsync");
    }
}
