//! The implementations under test, each run as a process of its own: the service
//! binaries on tokio and on smol, and the baseline (this binary's `baseline`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::Client;

/// Who answers `api.leases.*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Impl {
    /// The bare responder: the floor.
    Baseline,
    /// `dagnats-leases serve`.
    Tokio,
    /// `dagnats-leases-smol serve`.
    Smol,
}

impl Impl {
    /// The three, floor first.
    pub const ALL: [Impl; 3] = [Impl::Baseline, Impl::Tokio, Impl::Smol];

    /// The name in tables and the report.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Baseline => "baseline",
            Impl::Tokio => "tokio",
            Impl::Smol => "smol",
        }
    }
}

/// A running implementation; killed when dropped.
#[derive(Debug)]
pub struct Running {
    child: Child,
}

/// Where the service binaries are: next to this one (the same target directory).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent().expect("exe dir").to_path_buf()
}

/// Starts `imp` against `url`, its log `<label>.log` in `log_dir`, and waits until
/// it answers.
pub async fn start(imp: Impl, label: &str, url: &str, log_dir: &Path, client: &Client) -> Running {
    start_with(imp, imp.name(), label, url, log_dir, client, &[]).await
}

/// Runs the tokio service once in `account` (whose client is `client`), so that
/// the account has the leases bucket: the baseline does not create it.
pub async fn create_bucket(account: &str, url: &str, log_dir: &Path, client: &Client) {
    start_with(Impl::Tokio, account, "bucket", url, log_dir, client, &[])
        .await
        .stop();
}

/// Like [`start`], in `account`, with a command that wraps the binary (e.g. valgrind).
pub async fn start_with(
    imp: Impl,
    account: &str,
    label: &str,
    url: &str,
    log_dir: &Path,
    client: &Client,
    wrapper: &[String],
) -> Running {
    let dir = bin_dir();
    let auth = ["--user", account, "--password", crate::servers::PASSWORD];
    let (bin, first): (PathBuf, &str) = match imp {
        Impl::Baseline => (std::env::current_exe().expect("exe"), "baseline"),
        Impl::Tokio => (dir.join("dagnats-leases"), "serve"),
        Impl::Smol => (dir.join("dagnats-leases-smol"), "serve"),
    };
    let mut args = vec![first, "--nats-url", url];
    args.extend(auth);
    assert!(
        bin.is_file(),
        "{} is missing: build it first (scripts/bench does)",
        bin.display()
    );
    let log = std::fs::File::create(log_dir.join(format!("{label}.log"))).expect("log");
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    let child = cmd
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let running = Running { child };
    wait_ready(client, imp, Duration::from_secs(60)).await;
    running
}

/// Waits until something answers `api.leases.owner`.
async fn wait_ready(client: &Client, imp: Impl, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let request = async_nats::Request::new()
            .payload(r#"{"key":"ready-probe"}"#.into())
            .timeout(Some(Duration::from_secs(1)));
        if client
            .send_request("api.leases.owner", request)
            .await
            .is_ok()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not start answering",
            imp.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Running {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits for the exit (SIGKILL after 15 s).
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-s", "TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Resident memory of a process in KiB (`VmRSS` in `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}
