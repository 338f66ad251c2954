//! The servers the benchmark and `batch_probe` run: nats-server (v2.15.1 from
//! `.nats/bin`, as `scripts/install-nats-server` puts it there;
//! `DAGNATS_NATS_SERVER` overrides) on a free loopback port with its own store
//! directory and a monitoring port. Kept here rather than borrowed from the test
//! harness so that the benchmark builds on its own.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The accounts of the benchmark's nats-server, one per implementation.
pub const ACCOUNTS: [&str; 7] = [
    "baseline",
    "tokio",
    "smol",
    "tokio-prev",
    "tokio-unconfirmed",
    "tokio-batched",
    "tokio-single",
];
/// Every account user's password.
pub const PASSWORD: &str = "bench";

/// A free loopback port (bound, then released: fine for a benchmark's own servers).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The checkout's root.
pub fn checkout() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("checkout")
        .to_path_buf()
}

/// How often nats-server fsyncs its JetStream store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Sync {
    /// The default: `sync_interval` unset, a sync every 2 minutes (lazy). An
    /// acknowledged write can be lost if the machine (not the process) dies.
    Default,
    /// `sync_interval: always`: an fsync after every write, before its ack (what
    /// the README recommends and what etcd does with its WAL).
    Always,
}

/// One nats-server with JetStream; killed (and its store removed) when dropped.
pub struct Nats {
    child: Child,
    port: u16,
    /// The monitoring port (`/varz`, `/raftz`, ...).
    http: u16,
    /// The version the server's INFO gives.
    pub version: String,
    /// The port of the server's own profiler (`prof_port`), if it has one.
    prof: Option<u16>,
    /// The binary it runs.
    bin: PathBuf,
    _dir: tempfile::TempDir,
}

/// The `accounts { .. }` block: one account per implementation, each with its own
/// `api.leases.*` and its own `KV_leases`, so all of them can run at once and the
/// load generator can interleave its calls between them.
fn accounts_block() -> String {
    let q = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let mut conf = String::from("accounts {\n");
    for account in ACCOUNTS {
        conf += &format!(
            "  {}: {{ jetstream: enabled, users: [{{user: {}, password: {PASSWORD}}}] }}\n",
            q(account),
            q(account)
        );
    }
    conf += "}\n";
    conf
}

impl Nats {
    /// Starts nats-server with the default (lazy) sync and waits for its INFO.
    pub fn start() -> Nats {
        Nats::start_sync(Sync::Default)
    }

    /// Starts nats-server with `sync` and waits for its INFO.
    pub fn start_sync(sync: Sync) -> Nats {
        Nats::launch(free_port(), sync, "")
    }

    /// Like [`Nats::start_sync`], with the server's own profiler on a port of its
    /// own (`prof_port`: Go's `/debug/pprof/` endpoints), for `--cpu-profile`.
    pub fn start_profiled(sync: Sync) -> Nats {
        let prof = free_port();
        let mut nats = Nats::launch(free_port(), sync, &format!("prof_port: {prof}\n"));
        nats.prof = Some(prof);
        nats
    }

    /// Starts nats-server on `port` with `sync` and `extra` configuration (a
    /// cluster node's name and `cluster { .. }` block), and waits for its INFO.
    fn launch(port: u16, sync: Sync, extra: &str) -> Nats {
        let bin = std::env::var_os("DAGNATS_NATS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| checkout().join(".nats/bin/nats-server"));
        assert!(
            bin.is_file(),
            "{} is missing: run scripts/install-nats-server",
            bin.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("dagnats-bench-nats-")
            .tempdir()
            .expect("temp dir");
        let log = std::fs::File::create(dir.path().join("nats.log")).expect("log");
        let sync_interval = match sync {
            Sync::Default => "",
            Sync::Always => ", sync_interval: always",
        };
        let http = free_port();
        let mut conf = format!(
            "listen: \"127.0.0.1:{port}\"\nhttp: \"127.0.0.1:{http}\"\n\
             jetstream {{ store_dir: {:?}{sync_interval} }}\n{extra}",
            dir.path().join("store").display().to_string()
        );
        conf += &accounts_block();
        let conf_path = dir.path().join("nats.conf");
        std::fs::write(&conf_path, conf).expect("config");
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let version = loop {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) {
                let mut line = String::new();
                if BufReader::new(stream).read_line(&mut line).is_ok()
                    && let Some(json) = line.strip_prefix("INFO ")
                {
                    let info: serde_json::Value =
                        serde_json::from_str(json.trim()).expect("INFO is JSON");
                    break info["version"].as_str().unwrap_or("?").to_string();
                }
            }
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        };
        Nats {
            child,
            port,
            http,
            version,
            prof: None,
            bin,
            _dir: dir,
        }
    }

    /// A GET of `path` on the monitoring port, the body as JSON.
    pub fn monitor(&self, path: &str) -> Option<serde_json::Value> {
        let mut s = TcpStream::connect(("127.0.0.1", self.http)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        let (_, json) = body.split_once("\r\n\r\n")?;
        serde_json::from_str(json).ok()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The port of the server's profiler, if it was started with one
    /// ([`Nats::start_profiled`]).
    pub fn prof_port(&self) -> Option<u16> {
        self.prof
    }

    /// The nats-server binary it runs (what `go tool pprof` reads symbols from).
    pub fn binary(&self) -> &std::path::Path {
        &self.bin
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A client in `account`.
    pub async fn connect(&self, account: &str) -> async_nats::Client {
        connect(&self.url(), account).await
    }
}

/// A client of the server at `url` in `account`.
async fn connect(url: &str, account: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .user_and_password(account.to_string(), PASSWORD.to_string())
        .request_timeout(Some(Duration::from_secs(30)))
        .connect(url)
        .await
        .expect("connect")
}

/// The nodes of [`Cluster`].
pub const CLUSTER_NODES: usize = 3;

/// A three-node nats-server cluster on loopback (names `n1`, `n2`, `n3`), every
/// node with `sync_interval: always` and its own store directory, routes straight
/// between the nodes. Everything the benchmark runs on it connects to `n1`, and
/// [`Cluster::pin_leader`] puts each account's stream leader there, so that every
/// implementation sees the same topology: reads served by the local leader, writes
/// replicated to the two others (a quorum of two out of three). Dropping it kills
/// every node.
pub struct Cluster {
    nodes: Vec<Nats>,
}

impl Cluster {
    /// The `server_name` of node `i`.
    pub fn name_of(i: usize) -> String {
        format!("n{}", i + 1)
    }

    /// Starts the three nodes and waits until a three-replica stream can be placed.
    pub async fn start() -> Cluster {
        let ports: Vec<(u16, u16)> = (0..CLUSTER_NODES)
            .map(|_| (free_port(), free_port()))
            .collect();
        let nodes = (0..CLUSTER_NODES)
            .map(|i| {
                let routes: Vec<String> = (0..CLUSTER_NODES)
                    .filter(|&j| j != i)
                    .map(|j| format!("\"nats-route://127.0.0.1:{}\"", ports[j].1))
                    .collect();
                let extra = format!(
                    "server_name: {}\ncluster {{\n  name: dagnats-bench\n  listen: \"127.0.0.1:{}\"\n  routes: [{}]\n}}\n",
                    Cluster::name_of(i),
                    ports[i].1,
                    routes.join(", ")
                );
                Nats::launch(ports[i].0, Sync::Always, &extra)
            })
            .collect();
        let cluster = Cluster { nodes };
        cluster.wait_placement(Duration::from_secs(30)).await;
        cluster
    }

    /// Polls until the meta group knows every peer: a three-replica probe stream is
    /// created (then deleted).
    async fn wait_placement(&self, within: Duration) {
        let client = self.connect(ACCOUNTS[0]).await;
        let body = serde_json::json!({
            "name": "BENCH_READY",
            "subjects": ["bench.ready"],
            "storage": "memory",
            "num_replicas": CLUSTER_NODES,
        })
        .to_string();
        let deadline = Instant::now() + within;
        loop {
            let request = async_nats::Request::new()
                .payload(body.clone().into())
                .timeout(Some(Duration::from_secs(2)));
            let last = match client
                .send_request("$JS.API.STREAM.CREATE.BENCH_READY", request)
                .await
            {
                Ok(reply) => {
                    let v: serde_json::Value =
                        serde_json::from_slice(&reply.payload).unwrap_or_default();
                    if v.get("error").is_none() {
                        break;
                    }
                    v.to_string()
                }
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "no three-replica placement within {within:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = client
            .request("$JS.API.STREAM.DELETE.BENCH_READY", "".into())
            .await;
    }

    /// `n1`'s client URL: where everything connects.
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }

    /// The nodes, `n1` first.
    pub fn nodes(&self) -> &[Nats] {
        &self.nodes
    }

    /// The nodes' version.
    pub fn version(&self) -> &str {
        &self.nodes[0].version
    }

    /// A client of `n1` in `account`.
    pub async fn connect(&self, account: &str) -> async_nats::Client {
        connect(&self.url(), account).await
    }

    /// The stream replicas of `stream` (in `client`'s account).
    pub async fn replicas(client: &async_nats::Client, stream: &str) -> usize {
        async_nats::jetstream::new(client.clone())
            .get_stream(stream)
            .await
            .expect("the stream")
            .cached_info()
            .config
            .num_replicas
    }

    /// Moves the leader of `stream` (in `client`'s account) to `n1`, the node
    /// everything connects to, and waits until it is there; returns the leader the
    /// stream had before.
    pub async fn pin_leader(client: &async_nats::Client, stream: &str) -> String {
        let js = async_nats::jetstream::new(client.clone());
        let want = Cluster::name_of(0);
        let leader = || async {
            js.get_stream(stream)
                .await
                .ok()
                .and_then(|s| s.cached_info().cluster.clone())
                .and_then(|c| c.leader)
        };
        let before = leader().await.unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last_stepdown: Option<Instant> = None;
        loop {
            let now = leader().await;
            if now.as_deref() == Some(want.as_str()) {
                return before;
            }
            assert!(
                Instant::now() < deadline,
                "the leader of {stream} did not move to {want} (it is {now:?})"
            );
            // A step-down with a preferred successor; asked again after 2 s if the
            // election went elsewhere.
            if now.is_some() && last_stepdown.is_none_or(|t| t.elapsed() > Duration::from_secs(2)) {
                let body = serde_json::json!({ "placement": { "preferred": want } });
                let _ = client
                    .request(
                        format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                        body.to_string().into(),
                    )
                    .await;
                last_stepdown = Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The server an implementation runs on.
pub enum Server {
    /// One nats-server.
    Single(Nats),
    /// The three-node cluster.
    Cluster(Cluster),
}

impl Server {
    /// The URL everything connects to.
    pub fn url(&self) -> String {
        match self {
            Server::Single(n) => n.url(),
            Server::Cluster(c) => c.url(),
        }
    }

    /// The version nats-server reports.
    pub fn version(&self) -> &str {
        match self {
            Server::Single(n) => &n.version,
            Server::Cluster(c) => c.version(),
        }
    }

    /// A client in `account`.
    pub async fn connect(&self, account: &str) -> async_nats::Client {
        connect(&self.url(), account).await
    }

    /// Its nodes: the one server, or the cluster's, `n1` first.
    pub fn nodes(&self) -> &[Nats] {
        match self {
            Server::Single(n) => std::slice::from_ref(n),
            Server::Cluster(c) => c.nodes(),
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
