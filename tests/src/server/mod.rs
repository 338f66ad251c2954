//! One nats-server process on a loopback port: its options, start, restart, stop,
//! and what it reports. Re-exported from the crate root.

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

/// Which nats-server binary to run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Binary {
    /// v2.15.1 from `.nats/bin/nats-server`, or `$DAGNATS_NATS_SERVER`.
    #[default]
    Supported,
    /// v2.11.11, the oldest supported, from `.nats/bin-2.11/nats-server`, or
    /// `$DAGNATS_NATS_SERVER_OLDEST`.
    Oldest,
    /// Debian's v2.9.10 from `/usr/sbin/nats-server`, or `$DAGNATS_NATS_SERVER_LEGACY`.
    Legacy,
    /// This exact path.
    Path(PathBuf),
}

impl Binary {
    /// The path this binary resolves to, and where that choice came from.
    fn resolve(&self) -> (PathBuf, String) {
        let from_env = |var: &str| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(|v| (PathBuf::from(v), format!("${var}")))
        };
        match self {
            Binary::Supported => from_env(ENV_SERVER).unwrap_or_else(|| {
                let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
                let root = manifest.parent().unwrap_or(manifest);
                (
                    root.join(".nats/bin/nats-server"),
                    "the checkout's .nats/bin".to_owned(),
                )
            }),
            Binary::Oldest => from_env(ENV_SERVER_OLDEST).unwrap_or_else(|| {
                let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
                let root = manifest.parent().unwrap_or(manifest);
                (
                    root.join(".nats/bin-2.11/nats-server"),
                    "the checkout's .nats/bin-2.11".to_owned(),
                )
            }),
            Binary::Legacy => from_env(ENV_SERVER_LEGACY).unwrap_or_else(|| {
                (
                    PathBuf::from(LEGACY_DEFAULT_PATH),
                    "Debian's package".to_owned(),
                )
            }),
            Binary::Path(p) => (p.clone(), "an explicit path".to_owned()),
        }
    }
}

/// How to start a [`NatsServer`]; a builder. Get one from [`NatsServer::builder`].
///
/// Every setting except the binary goes into a generated configuration file that
/// the server reads on every (re)start. A cluster node ([`cluster`](Self::cluster),
/// used by [`NatsCluster`](crate::NatsCluster)) reads its cluster port from the same ports file as the
/// client port, and pins it for restarts the same way.
#[derive(Clone, Debug)]
pub struct NatsServerOptions {
    binary: Binary,
    port: Option<u16>,
    server_name: Option<String>,
    max_payload: Option<u32>,
    sync_always: bool,
    jetstream: bool,
    extra_config: Vec<String>,
    cluster: Option<ClusterConfig>,
    ready_timeout: Duration,
}

/// The `cluster { .. }` block of one node (see [`NatsServerOptions::cluster`]).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The cluster's name, the same on every node.
    pub name: String,
    /// Route URLs this node dials, e.g. `nats-route://127.0.0.1:6222`.
    pub routes: Vec<String>,
    /// The address gossiped to other nodes for implicit routes (`advertise`); `None`
    /// gossips the listen address.
    pub advertise: Option<String>,
}

impl Default for NatsServerOptions {
    fn default() -> Self {
        Self {
            binary: Binary::Supported,
            port: None,
            server_name: None,
            max_payload: None,
            sync_always: false,
            jetstream: true,
            extra_config: Vec::new(),
            cluster: None,
            ready_timeout: Duration::from_secs(5),
        }
    }
}

impl NatsServerOptions {
    /// The defaults: v2.15.1, a free port, JetStream on, the server's own limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs this binary instead of v2.15.1.
    pub fn binary(mut self, binary: Binary) -> Self {
        self.binary = binary;
        self
    }

    /// Runs Debian's v2.9.10 (shorthand for `binary(Binary::Legacy)`).
    pub fn legacy(self) -> Self {
        self.binary(Binary::Legacy)
    }

    /// Listens on this port instead of one the kernel picks. Start fails if it is taken.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Sets `server_name` (needed for JetStream clusters; stable across restarts).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Sets `max_payload`, the largest message the server accepts, in bytes.
    pub fn max_payload(mut self, bytes: u32) -> Self {
        self.max_payload = Some(bytes);
        self
    }

    /// Sets JetStream's `sync_interval: always` (fsync before every ack). Not known
    /// to v2.9.10, which refuses to start with it.
    pub fn sync_always(mut self, on: bool) -> Self {
        self.sync_always = on;
        self
    }

    /// Turns JetStream on (the default) or off.
    pub fn jetstream(mut self, on: bool) -> Self {
        self.jetstream = on;
        self
    }

    /// Appends a raw line (or block) to the generated configuration file.
    pub fn config(mut self, text: impl Into<String>) -> Self {
        self.extra_config.push(text.into());
        self
    }

    /// Makes the server a cluster node: a `cluster { .. }` block listening on a loopback
    /// port the kernel picks on the first start (read from the ports file, then pinned
    /// for restarts, like the client port), dialing `config.routes`.
    pub fn cluster(mut self, config: ClusterConfig) -> Self {
        self.cluster = Some(config);
        self
    }

    /// Bounds how long a (re)start waits for the server to accept connections.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts the server; panics with the reason (and the server's log) if it fails.
    #[track_caller]
    pub fn start(self) -> NatsServer {
        match self.try_start() {
            Ok(server) => server,
            Err(e) => panic!("{e}"),
        }
    }

    /// Starts the server, or says why it did not start.
    pub fn try_start(self) -> Result<NatsServer, StartError> {
        NatsServer::launch(self)
    }

    /// The configuration file's text for this store directory; `cluster_port` 0 lets
    /// the kernel pick the cluster port.
    fn config_text(&self, store_dir: &Path, cluster_port: u16) -> String {
        let mut conf = String::from("# Generated by dagnats-leases-tests.\n");
        if let Some(name) = &self.server_name {
            conf += &format!("server_name: {}\n", quote(name));
        }
        if let Some(bytes) = self.max_payload {
            conf += &format!("max_payload: {bytes}\n");
        }
        if self.jetstream {
            conf += "jetstream {\n";
            conf += &format!("  store_dir: {}\n", quote(&store_dir.to_string_lossy()));
            if self.sync_always {
                conf += "  sync_interval: always\n";
            }
            conf += "}\n";
        }
        if let Some(cluster) = &self.cluster {
            let port = if cluster_port == 0 {
                "-1".to_owned()
            } else {
                cluster_port.to_string()
            };
            conf += "cluster {\n";
            conf += &format!("  name: {}\n", quote(&cluster.name));
            conf += &format!("  listen: {}\n", quote(&format!("{HOST}:{port}")));
            if let Some(advertise) = &cluster.advertise {
                conf += &format!("  advertise: {}\n", quote(advertise));
            }
            let routes: Vec<String> = cluster.routes.iter().map(|r| quote(r)).collect();
            conf += &format!("  routes: [{}]\n", routes.join(", "));
            conf += "}\n";
        }
        for extra in &self.extra_config {
            conf += extra;
            conf += "\n";
        }
        conf
    }
}

/// A double-quoted string for the NATS configuration format (JSON escaping is valid there).
fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}

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
