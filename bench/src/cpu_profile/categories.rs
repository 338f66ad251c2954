//! How a profile's stacks are read and sorted: the category tables of each
//! process ([`SERVER`], [`SERVICE`], [`HOLDERS`]), the rule that the first frame a
//! table names from the leaf decides, and the parsers of `perf script` and
//! `go tool pprof -traces` output.

use super::*;

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
    pub(super) fn is_kernel(&self) -> bool {
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
pub(super) fn shares(
    role: Role,
    stacks: &[(Vec<Frame>, u64)],
) -> (u64, BTreeMap<&'static str, f64>) {
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
