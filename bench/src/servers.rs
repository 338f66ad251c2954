//! The servers the benchmark runs: nats-server (v2.14.0 from `.nats/bin`, as
//! `scripts/install-nats-server` puts it there) on a free loopback port with its own
//! store directory. Kept here rather than borrowed from the test harness so that
//! the benchmark builds on its own.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The accounts of the benchmark's nats-server, one per implementation.
pub const ACCOUNTS: [&str; 3] = ["baseline", "tokio", "smol"];
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

impl Sync {
    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Sync::Default => "default",
            Sync::Always => "always",
        }
    }
}

/// One nats-server with JetStream; killed (and its store removed) when dropped.
pub struct Nats {
    child: Child,
    port: u16,
    /// The version the server's INFO gives.
    pub version: String,
    _dir: tempfile::TempDir,
}

impl Nats {
    /// Starts nats-server with the default (lazy) sync and waits for its INFO.
    pub fn start() -> Nats {
        Nats::start_sync(Sync::Default)
    }

    /// Starts nats-server with `sync` and waits for its INFO.
    pub fn start_sync(sync: Sync) -> Nats {
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
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("nats.log")).expect("log");
        // One account per implementation: each has its own `api.leases.*` and its
        // own `KV_leases`, so all of them can run at once and the load generator
        // can interleave its calls between them.
        let sync_interval = match sync {
            Sync::Default => "",
            Sync::Always => ", sync_interval: always",
        };
        let mut conf = format!(
            "listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: {:?}{sync_interval} }}\naccounts {{\n",
            dir.path().join("store").display().to_string()
        );
        for account in ACCOUNTS {
            conf += &format!(
                "  {account}: {{ jetstream: enabled, users: [{{user: {account}, password: {PASSWORD}}}] }}\n"
            );
        }
        conf += "}\n";
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
            version,
            _dir: dir,
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A client in `account`.
    pub async fn connect(&self, account: &str) -> async_nats::Client {
        async_nats::ConnectOptions::new()
            .user_and_password(account.to_string(), PASSWORD.to_string())
            .request_timeout(Some(Duration::from_secs(30)))
            .connect(self.url())
            .await
            .expect("connect")
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
