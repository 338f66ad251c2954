//! Recording one window: `perf record` of each process, the server's own
//! profiler, and the `/proc`, `/varz` and `/connz` figures taken around it.

use super::*;

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
    pub(super) dir: PathBuf,
    pub(super) secs: u64,
    pub(super) processes: BTreeMap<Role, Measured>,
    pub(super) pprof: Option<PathBuf>,
    pub(super) nats_bin: PathBuf,
    pub(super) server_in_msgs: f64,
    pub(super) server_out_msgs: f64,
    pub(super) connections: Vec<(String, usize, f64, f64)>,
    pub(super) load_average: (f64, f64),
}
