//! The implementations under test, each run as a process of its own: the service
//! binaries on tokio and on smol, and the baseline (this binary's `baseline`); on
//! request also the tokio service with read confirmation turned off (the same
//! binary, built with feature `__test`) and the tokio service of an earlier commit
//! (a binary built elsewhere, see [`set_prev_bin`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
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
    /// `dagnats-leases serve` of an earlier commit (`--prev-bin`).
    TokioPrev,
    /// `dagnats-leases serve --unconfirmed-reads-for-tests`: no read confirmation
    /// on a replicated bucket (needs the binary built with feature `__test`).
    TokioUnconfirmed,
    /// `dagnats-leases serve --coalesce-writes true`: the write coalescer on
    /// wherever the stream takes batches (as `tokio` ships it: `auto`, the same
    /// today).
    TokioBatched,
    /// `dagnats-leases serve --coalesce-writes false`: every write alone (the
    /// capacity ramp's `tokio-single-*`).
    TokioSingle,
}

impl Impl {
    /// The three, floor first.
    pub const ALL: [Impl; 3] = [Impl::Baseline, Impl::Tokio, Impl::Smol];
    /// Every implementation, each with an account on the benchmark's servers.
    #[cfg(test)]
    const EVERY: [Impl; 7] = [
        Impl::Baseline,
        Impl::Tokio,
        Impl::Smol,
        Impl::TokioPrev,
        Impl::TokioUnconfirmed,
        Impl::TokioBatched,
        Impl::TokioSingle,
    ];

    /// The name in tables and the report, and the account it runs in.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Baseline => "baseline",
            Impl::Tokio => "tokio",
            Impl::Smol => "smol",
            Impl::TokioPrev => "tokio-prev",
            Impl::TokioUnconfirmed => "tokio-unconfirmed",
            Impl::TokioBatched => "tokio-batched",
            Impl::TokioSingle => "tokio-single",
        }
    }
}

/// The earlier commit's `dagnats-leases` binary, once set.
static PREV_BIN: OnceLock<PathBuf> = OnceLock::new();

/// Where [`Impl::TokioPrev`]'s binary is.
pub fn set_prev_bin(path: PathBuf) {
    PREV_BIN.set(path).expect("the earlier binary is set once");
}

/// How an implementation is started beyond its binary.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A command that wraps the binary (e.g. valgrind).
    pub wrapper: Vec<String>,
    /// `--replicas` of the service (the bucket's stream replicas on create).
    pub replicas: Option<usize>,
    /// Further arguments of the service (e.g. `--max-calls-in-flight`).
    pub extra_args: Vec<String>,
    /// `RUST_LOG` of the process (default `warn`).
    pub rust_log: Option<String>,
    /// Further environment of the process: a setting read from the environment
    /// is ignored by a binary without it (an earlier commit's), where an unknown
    /// flag would stop it.
    pub env: Vec<(String, String)>,
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
pub async fn start(
    imp: Impl,
    label: &str,
    url: &str,
    replicas: Option<usize>,
    log_dir: &Path,
    client: &Client,
) -> Running {
    let options = Options {
        replicas,
        ..Options::default()
    };
    start_with(imp, imp.name(), label, url, log_dir, client, &options).await
}

/// Runs a tokio service once in `imp`'s account (whose client is `client`), so
/// that the account has the leases bucket (with `replicas`): the baseline does not
/// create it. The earlier commit's service creates its own.
pub async fn create_bucket(
    imp: Impl,
    url: &str,
    replicas: Option<usize>,
    log_dir: &Path,
    client: &Client,
) {
    let creator = match imp {
        Impl::TokioPrev => Impl::TokioPrev,
        _ => Impl::Tokio,
    };
    let options = Options {
        replicas,
        ..Options::default()
    };
    let label = format!("bucket-{}", imp.name());
    start_with(creator, imp.name(), &label, url, log_dir, client, &options)
        .await
        .stop();
}

/// Like [`start`], in `account`, with `options`.
pub async fn start_with(
    imp: Impl,
    account: &str,
    label: &str,
    url: &str,
    log_dir: &Path,
    client: &Client,
    options: &Options,
) -> Running {
    let dir = bin_dir();
    let (bin, first): (PathBuf, &str) = match imp {
        Impl::Baseline => (std::env::current_exe().expect("exe"), "baseline"),
        Impl::Tokio | Impl::TokioUnconfirmed | Impl::TokioBatched | Impl::TokioSingle => {
            (dir.join("dagnats-leases"), "serve")
        }
        Impl::Smol => (dir.join("dagnats-leases-smol"), "serve"),
        Impl::TokioPrev => (
            PREV_BIN.get().expect("tokio-prev needs --prev-bin").clone(),
            "serve",
        ),
    };
    let mut args: Vec<String> = [
        first,
        "--nats-url",
        url,
        "--user",
        account,
        "--password",
        crate::servers::PASSWORD,
    ]
    .map(String::from)
    .to_vec();
    if let Some(r) = options.replicas
        && imp != Impl::Baseline
    {
        args.extend(["--replicas".to_string(), r.to_string()]);
    }
    if imp == Impl::TokioUnconfirmed {
        args.push("--unconfirmed-reads-for-tests".to_string());
    }
    if imp == Impl::TokioBatched {
        args.extend(["--coalesce-writes", "true"].map(String::from));
    }
    if imp == Impl::TokioSingle {
        args.extend(["--coalesce-writes", "false"].map(String::from));
    }
    args.extend(options.extra_args.iter().cloned());
    assert!(
        bin.is_file(),
        "{} is missing: build it first (scripts/bench does)",
        bin.display()
    );
    let log = std::fs::File::create(log_dir.join(format!("{label}.log"))).expect("log");
    let mut cmd = match options.wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    let child = cmd
        .args(args)
        .env("RUST_LOG", options.rust_log.as_deref().unwrap_or("warn"))
        .envs(options.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let mut running = Running { child };
    let log = log_dir.join(format!("{label}.log"));
    wait_ready(client, &mut running, label, &log, Duration::from_secs(60)).await;
    running
}

/// Waits until the service serves: it answers `api.leases.owner` with anything but
/// `unavailable` (a service still starting answers so); panics if `running` exits
/// first (its log says why) or it does not serve `within`.
async fn wait_ready(
    client: &Client,
    running: &mut Running,
    label: &str,
    log: &Path,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let request = async_nats::Request::new()
            .payload(r#"{"key":"ready-probe"}"#.into())
            .timeout(Some(Duration::from_secs(1)));
        if let Ok(reply) = client.send_request("api.leases.owner", request).await {
            let starting = serde_json::from_slice::<serde_json::Value>(&reply.payload)
                .is_ok_and(|v| v.get("kind").and_then(|k| k.as_str()) == Some("unavailable"));
            if !starting {
                return;
            }
        }
        if let Ok(Some(status)) = running.child.try_wait() {
            panic!("{label} exited ({status}): see {}", log.display());
        }
        assert!(
            Instant::now() < deadline,
            "{label} did not start serving: see {}",
            log.display()
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

#[cfg(test)]
mod tests {
    use super::Impl;

    #[test]
    fn every_implementation_has_an_account() {
        for imp in Impl::EVERY {
            assert!(
                crate::servers::ACCOUNTS.contains(&imp.name()),
                "{} has no account",
                imp.name()
            );
        }
    }
}
