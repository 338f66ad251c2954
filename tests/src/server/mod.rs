//! One nats-server process on a loopback port: its options, start, restart, stop,
//! and what it reports. Re-exported from the crate root.
//!
//! Files: this one holds the process (start, restart, stop, its ports, logs and
//! INFO); `options.rs` how it is configured (the binary, the options, the
//! configuration file).

mod options;

pub use options::{Binary, ClusterConfig, NatsServerOptions};

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tempfile::TempDir;

/// The nats-server version `scripts/install-nats-server` puts in `.nats/bin/`.
pub const SUPPORTED_VERSION: &str = "2.15.1";
/// The version of Debian's nats-server package, used by the "unsupported" tests.
pub const LEGACY_VERSION: &str = "2.9.10";
/// Environment variable naming the binary [`NatsServer::start`] runs.
pub const ENV_SERVER: &str = "DAGNATS_NATS_SERVER";
/// The oldest supported release line, the first with per-message TTL.
pub const OLDEST_VERSION: &str = "2.11.11";
/// Environment variable naming the binary [`Binary::Oldest`] runs.
pub const ENV_SERVER_OLDEST: &str = "DAGNATS_NATS_SERVER_OLDEST";
/// Environment variable naming the binary [`NatsServer::start_legacy`] runs.
pub const ENV_SERVER_LEGACY: &str = "DAGNATS_NATS_SERVER_LEGACY";
/// Where Debian's package installs nats-server.
pub const LEGACY_DEFAULT_PATH: &str = "/usr/sbin/nats-server";

/// The address every server listens on.
const HOST: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// How often the harness looks again while waiting for a process (bounded by a deadline).
const POLL: Duration = Duration::from_millis(5);
/// How long [`NatsServer::stop`] waits for the process to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How many log lines a failure message (or a panicking test's drop) shows.
const LOG_TAIL_LINES: usize = 40;

/// Why a server did not start.
#[derive(Debug)]
pub struct StartError {
    message: String,
}

impl StartError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StartError {}

/// What the server announced in its `INFO` line to the harness's probe connection.
#[derive(Clone, Debug, Deserialize)]
pub struct ServerInfo {
    /// The server's id (new on every start).
    #[serde(default)]
    pub server_id: String,
    /// The server's name (the id unless `server_name` is set).
    #[serde(default)]
    pub server_name: String,
    /// The version, e.g. `2.15.1`.
    pub version: String,
    /// The client port.
    pub port: u16,
    /// The largest message the server accepts, in bytes.
    #[serde(default)]
    pub max_payload: u64,
    /// Whether JetStream is enabled.
    #[serde(default)]
    pub jetstream: bool,
}

/// The ports file nats-server writes into `--ports_file_dir`.
#[derive(Deserialize)]
struct PortsFile {
    /// Client URLs, e.g. `nats://127.0.0.1:4222`.
    nats: Vec<String>,
    /// Route URLs, e.g. `nats://127.0.0.1:6222`, when the server is a cluster node.
    #[serde(default)]
    cluster: Vec<String>,
}

/// A running (or stopped) nats-server process with its own temporary directory.
///
/// Dropping it kills the process (SIGKILL) and removes the directory, including the
/// JetStream store. When dropped during a panic it prints the tail of the server's
/// log to stderr, which the test harness shows with the failure.
pub struct NatsServer {
    options: NatsServerOptions,
    binary: PathBuf,
    child: Option<Child>,
    paused: bool,
    port: u16,
    cluster_port: u16,
    info: ServerInfo,
    config_path: PathBuf,
    store_dir: PathBuf,
    ports_dir: PathBuf,
    log_path: PathBuf,
    // Last, so it is removed after the process is gone.
    dir: TempDir,
}

impl fmt::Debug for NatsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsServer")
            .field("binary", &self.binary)
            .field("pid", &self.pid())
            .field("url", &self.url())
            .field("version", &self.info.version)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl NatsServer {
    /// Starts nats-server v2.15.1 with JetStream on a free loopback port.
    ///
    /// Panics if the binary is missing (run `scripts/install-nats-server`) or the
    /// server does not become ready in time.
    #[track_caller]
    pub fn start() -> Self {
        NatsServerOptions::new().start()
    }

    /// Starts Debian's nats-server v2.9.10 (too old for per-message TTL) with JetStream.
    #[track_caller]
    pub fn start_legacy() -> Self {
        NatsServerOptions::new().legacy().start()
    }

    /// Options for a server with other settings; finish with
    /// [`start`](NatsServerOptions::start).
    pub fn builder() -> NatsServerOptions {
        NatsServerOptions::new()
    }

    fn launch(options: NatsServerOptions) -> Result<Self, StartError> {
        let (binary, source) = options.binary.resolve();
        if !binary.is_file() {
            return Err(StartError::new(format!(
                "nats-server not found at {} ({source}): run scripts/install-nats-server \
                 from the checkout root (as root, for Debian's v{LEGACY_VERSION})",
                binary.display()
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("dagnats-nats-")
            .tempdir()
            .map_err(|e| StartError::new(format!("cannot create a temporary directory: {e}")))?;
        let store_dir = dir.path().join("store");
        let ports_dir = dir.path().join("ports");
        let config_path = dir.path().join("nats-server.conf");
        let log_path = dir.path().join("nats-server.log");
        let io_err = |what: &str, e: std::io::Error| StartError::new(format!("{what}: {e}"));
        fs::create_dir(&store_dir).map_err(|e| io_err("cannot create the store dir", e))?;
        fs::create_dir(&ports_dir).map_err(|e| io_err("cannot create the ports dir", e))?;
        fs::write(&config_path, options.config_text(&store_dir, 0))
            .map_err(|e| io_err("cannot write the config file", e))?;

        let mut server = NatsServer {
            paused: false,
            cluster_port: 0,
            port: options.port.unwrap_or(0),
            options,
            binary,
            child: None,
            info: ServerInfo {
                server_id: String::new(),
                server_name: String::new(),
                version: String::new(),
                port: 0,
                max_payload: 0,
                jetstream: false,
            },
            config_path,
            store_dir,
            ports_dir,
            log_path,
            dir,
        };
        server.spawn_until_ready()?;
        Ok(server)
    }

    /// The client URL, `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{HOST}:{}", self.port)
    }

    /// The client port; the same across [`restart`](Self::restart)s.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The route (cluster) port of a cluster node, the same across restarts; `None`
    /// for a server started without [`NatsServerOptions::cluster`].
    pub fn cluster_port(&self) -> Option<u16> {
        (self.cluster_port != 0).then_some(self.cluster_port)
    }

    /// Whether the process is stopped by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Freezes the process (SIGSTOP), as a stalled VM or a long GC pause would: its
    /// sockets stay open but it answers nothing. A no-op if it is not running.
    pub fn pause(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, rustix::process::Signal::STOP);
            self.paused = true;
        }
    }

    /// Lets a [`pause`](Self::pause)d process run again (SIGCONT).
    pub fn resume(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, rustix::process::Signal::CONT);
        }
        self.paused = false;
    }

    /// The client address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((HOST, self.port))
    }

    /// The JetStream store directory (the server keeps its data in `jetstream/` inside).
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The version the server announced, e.g. `2.15.1`.
    pub fn version(&self) -> &str {
        &self.info.version
    }

    /// The `INFO` the current (or last) process announced.
    pub fn info(&self) -> &ServerInfo {
        &self.info
    }

    /// The binary this server runs.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The generated configuration file.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The file collecting the server's stdout and stderr over all (re)starts.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The process id, while a process is running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// Stops the server gracefully: SIGTERM, then waits for it to exit. A no-op if
    /// it is not running. Panics if it has not exited within 10 s (after killing it).
    #[track_caller]
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        if std::mem::take(&mut self.paused) {
            signal(child.id(), rustix::process::Signal::CONT);
        }
        sigterm(&self.binary, child.id());
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "nats-server (pid {}) did not exit within {STOP_TIMEOUT:?} of SIGTERM\n{}",
                        child.id(),
                        self.log_tail()
                    );
                }
            }
        }
    }

    /// Kills the server at once (SIGKILL), as a crash would, and reaps it. A no-op if
    /// it is not running. [`restart`](Self::restart) brings it back.
    pub fn kill(&mut self) {
        self.paused = false;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server (SIGTERM, as [`stop`](Self::stop)) if it runs, and starts it
    /// again on the same port with the same configuration and store directory,
    /// waiting until it accepts connections. Panics if it does not come back.
    #[track_caller]
    pub fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.spawn_until_ready() {
            panic!("{e}");
        }
    }

    /// Spawns the process and waits until it accepts connections and says `INFO`.
    ///
    /// With a known port (a restart, or [`NatsServerOptions::port`]), a port still
    /// taken by someone else is retried until the deadline.
    fn spawn_until_ready(&mut self) -> Result<(), StartError> {
        let timeout = self.options.ready_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            let mut child = self.spawn()?;
            match self.wait_ready(&mut child, deadline) {
                Ok((info, cluster_port)) => {
                    self.port = info.port;
                    self.cluster_port = cluster_port;
                    self.info = info;
                    self.child = Some(child);
                    return Ok(());
                }
                Err(Failure::Exited(status)) => {
                    let log = self.log();
                    let port_taken = log.contains("address already in use");
                    if port_taken && self.port != 0 && Instant::now() < deadline {
                        std::thread::sleep(POLL);
                        continue;
                    }
                    return Err(StartError::new(format!(
                        "nats-server {} exited during start-up ({status})\n{}",
                        self.binary.display(),
                        self.log_tail()
                    )));
                }
                Err(Failure::Timeout(last)) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(StartError::new(format!(
                        "nats-server {} was not ready within {timeout:?} (last: {last})\n{}",
                        self.binary.display(),
                        self.log_tail()
                    )));
                }
            }
        }
    }

    fn spawn(&self) -> Result<Child, StartError> {
        // A SIGKILLed server leaves its ports file behind; only the new one may be read.
        if let Ok(entries) = fs::read_dir(&self.ports_dir) {
            for entry in entries.flatten() {
                let _ = fs::remove_file(entry.path());
            }
        }
        if self.options.cluster.is_some() {
            // Pin the cluster port once known, as the client port is.
            fs::write(
                &self.config_path,
                self.options.config_text(&self.store_dir, self.cluster_port),
            )
            .map_err(|e| StartError::new(format!("cannot write the config file: {e}")))?;
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| StartError::new(format!("cannot open the log file: {e}")))?;
        let log2 = log
            .try_clone()
            .map_err(|e| StartError::new(format!("cannot clone the log file: {e}")))?;
        let port = if self.port == 0 {
            "-1".to_owned() // RANDOM_PORT: the server binds a port the kernel picks.
        } else {
            self.port.to_string()
        };
        Command::new(&self.binary)
            .arg("-c")
            .arg(&self.config_path)
            .arg("-a")
            .arg(HOST.to_string())
            .arg("-p")
            .arg(port)
            .arg("--ports_file_dir")
            .arg(&self.ports_dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| StartError::new(format!("cannot run {}: {e}", self.binary.display())))
    }

    /// Polls (every few ms, up to `deadline`) for the ports file, then for the INFO line.
    fn wait_ready(
        &self,
        child: &mut Child,
        deadline: Instant,
    ) -> Result<(ServerInfo, u16), Failure> {
        let pid = child.id();
        let mut last = String::from("no ports file yet");
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(Failure::Exited(status));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Failure::Timeout(last));
            }
            match self.read_ports_file(pid) {
                Ok((port, cluster)) => {
                    match probe_info(SocketAddr::from((HOST, port)), deadline - now) {
                        Ok(info) if info.port == port => return Ok((info, cluster)),
                        Ok(info) => last = format!("INFO says port {}, not {port}", info.port),
                        Err(e) => last = format!("probe of port {port}: {e}"),
                    }
                }
                Err(e) => last = e,
            }
            std::thread::sleep(POLL);
        }
    }

    /// The client port (and the cluster port, 0 if none) from the ports file
    /// `<exe>_<pid>.ports` of process `pid`.
    fn read_ports_file(&self, pid: u32) -> Result<(u16, u16), String> {
        let suffix = format!("_{pid}.ports");
        let entries = fs::read_dir(&self.ports_dir).map_err(|e| e.to_string())?;
        let path = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(&suffix))
            })
            .ok_or_else(|| "no ports file yet".to_owned())?;
        let text = fs::read_to_string(&path).map_err(|e| e.to_string())?;
        let ports: PortsFile =
            serde_json::from_str(&text).map_err(|e| format!("ports file {text:?}: {e}"))?;
        let port_of = |url: &str| {
            url.trim_end_matches('/')
                .rsplit(':')
                .next()
                .and_then(|p| p.parse::<u16>().ok())
                .ok_or_else(|| format!("cannot read a port in {url:?}"))
        };
        let url = ports.nats.first().ok_or("ports file lists no client URL")?;
        let client = port_of(url)?;
        let cluster = match (&self.options.cluster, ports.cluster.first()) {
            (None, _) => 0,
            (Some(_), Some(url)) => port_of(url)?,
            (Some(_), None) => return Err("ports file lists no cluster URL yet".to_owned()),
        };
        Ok((client, cluster))
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
        format!(
            "--- last {} lines of {} ---\n{}",
            tail.len(),
            self.log_path.display(),
            tail.join("\n")
        )
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("nats-server at {}:\n{}", self.url(), self.log_tail());
        }
    }
}

/// Why a spawned process did not become ready.
enum Failure {
    Exited(ExitStatus),
    Timeout(String),
}

/// Connects to `addr` and reads the server's `INFO {..}` line.
fn probe_info(addr: SocketAddr, timeout: Duration) -> Result<ServerInfo, String> {
    let timeout = timeout.max(Duration::from_millis(1));
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    // The INFO line is at most a few KiB; bound the read all the same.
    BufReader::new(stream.take(1 << 20))
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let json = line
        .strip_prefix("INFO ")
        .ok_or_else(|| format!("expected INFO, got {line:?}"))?;
    serde_json::from_str(json.trim_end()).map_err(|e| format!("INFO {json:?}: {e}"))
}

/// Sends `sig` to process `pid`, ignoring failure (it may have exited already).
pub(crate) fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Sends SIGTERM to `pid`: with `kill`, or else with the server's own `--signal`.
fn sigterm(binary: &Path, pid: u32) {
    let pid = pid.to_string();
    let quiet = |cmd: &mut Command| {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
    };
    let sent = match quiet(Command::new("kill").args(["-s", "TERM", &pid])) {
        Ok(status) => status.success(),
        Err(_) => false,
    };
    if !sent {
        let _ = quiet(
            Command::new(binary)
                .arg("--signal")
                .arg(format!("term={pid}")),
        );
    }
}
