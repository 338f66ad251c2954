//! `dagnats-leases lock KEY -- CMD [ARGS...]`: runs a command while this process
//! holds a lease, campaigning with the holder library ([`Member`], [`Elector`]).
//!
//! Two processes take part, so that the command is stopped in time even when the
//! tool itself cannot act (frozen by SIGSTOP, a long pause, killed):
//!
//! - the **tool** holds the lease: it campaigns, renews (the library does), and on
//!   every change of its local deadline tells the guard the new deadline as an
//!   absolute `CLOCK_MONOTONIC` time (the same clock for every process on the machine,
//!   so a tool frozen between reading its deadline and writing it can only send a
//!   deadline that is already true);
//! - the **guard** (`dagnats-leases __lock-guard`, started by the tool in its own
//!   process group) runs the command in a process group of its own and keeps the
//!   deadline: `--grace` before it, the command's group gets SIGTERM; at it, SIGKILL.
//!   The local deadline is the send time of the last write of the lease plus the TTL,
//!   less a clock-drift margin, so the command is gone before the server can expire
//!   the lease and grant it to anyone else. Renewals push the deadline on (the
//!   library renews every ttl/3, so a healthy tool never gets near it: `--grace` is
//!   at most half the TTL).
//!
//! On a step-down the tool sends the command SIGTERM at once, SIGKILL after
//! `--grace` (through the guard), and exits [`EXIT_LEASE_LOST`]. When the command
//! exits, the tool releases the lease and exits with the command's code (128 + N for
//! a command killed by signal N). SIGINT and SIGTERM to the tool go to the command's
//! process group. The command's stdin is `/dev/null` (the guard's stdin is the tool's
//! channel to it); stdout and stderr are the tool's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_nats::Client;
use dagnats_leases_core::RequestOutcome;
use dagnats_leases_core::wire::Endpoint;
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use crate::exit::{EXIT_ERROR, EXIT_NOT_HELD};
use crate::member::{CampaignObserver, Change, Elector, Member, Ownership, Semaphore, Tenure};

pub use crate::exit::{EXIT_CANNOT_RUN, EXIT_LEASE_LOST};
/// The longest default grace period (the default is a third of the TTL, at most this).
pub const DEFAULT_GRACE_MAX: Duration = Duration::from_secs(5);

/// The environment variable naming the key, for the command.
pub const ENV_KEY: &str = "DAGNATS_LEASE_KEY";
/// The environment variable naming the holder ID, for the command.
pub const ENV_HOLDER: &str = "DAGNATS_LEASE_HOLDER";
/// The environment variable holding the fence (the tenure's revision), for the command.
pub const ENV_FENCE: &str = "DAGNATS_LEASE_FENCE";

/// Reads a duration for `--wait` and `--grace` with humantime: `250ms`, `5s`, `1.5s`,
/// `2m`, `1h 30m`, or `0`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); e.g. 0, 500ms, 5s, 2m"))
}

/// The options of `lock`.
#[derive(Debug, Clone, clap::Args)]
pub struct LockArgs {
    /// The lease key.
    pub key: String,
    /// Holder ID (default: `lock-` and random hex, unique to this process).
    #[arg(long)]
    pub holder: Option<String>,
    /// Time to live, whole seconds in milliseconds.
    #[arg(long, default_value_t = 15_000)]
    pub ttl_ms: u64,
    /// Hold one of N slots of a semaphore named KEY (the leases `KEY-0` to
    /// `KEY-<N-1>`) instead of KEY itself: at most N commands run at once.
    #[arg(long)]
    pub permits: Option<usize>,
    /// How long to wait to be elected (default: for ever); `0` tries once.
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Between SIGTERM and SIGKILL when the lease is lost (default: ttl/3, at most
    /// 5s; at most ttl/2).
    #[arg(long, value_parser = parse_duration)]
    pub grace: Option<Duration>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// The options of the hidden `__lock-guard` (started by `lock`, never by hand).
#[derive(Debug, Clone, clap::Args)]
pub struct GuardArgs {
    /// Between SIGTERM and SIGKILL, in milliseconds.
    #[arg(long)]
    pub grace_ms: u64,
    /// The first deadline, `SECONDS.NANOSECONDS` of CLOCK_MONOTONIC.
    #[arg(long)]
    pub deadline: String,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// What `lock` campaigns with: the key itself, or a slot of a semaphore.
enum Campaigner {
    One(Elector),
    Slots(Semaphore),
}

impl Campaigner {
    async fn next(&mut self) -> Option<Change> {
        match self {
            Self::One(e) => e.next().await,
            Self::Slots(s) => s.next().await,
        }
    }

    /// The key held now (the slot, for a semaphore) and its tenure.
    fn held(&self) -> Option<(String, Tenure)> {
        match self {
            Self::One(e) => e.tenure().map(|t| (e.key().to_string(), t)),
            Self::Slots(s) => s.held(),
        }
    }

    async fn stop(self) {
        match self {
            Self::One(e) => e.stop().await,
            Self::Slots(s) => s.stop().await,
        }
    }
}

/// Tells when an acquire came back without the lease (for `--wait`).
#[derive(Default)]
struct AcquireWatch {
    denied: AtomicBool,
    answered: Notify,
}

impl CampaignObserver for AcquireWatch {
    fn request(
        &self,
        _key: &str,
        endpoint: Endpoint,
        _body: &[u8],
        _sent: Instant,
        outcome: &RequestOutcome,
        _answered: Instant,
    ) {
        if endpoint != Endpoint::Acquire {
            return;
        }
        let granted = match outcome {
            RequestOutcome::Reply { payload, .. } => {
                serde_json::from_slice::<serde_json::Value>(payload)
                    .ok()
                    .and_then(|v| v["granted"].as_bool())
                    == Some(true)
            }
            _ => false,
        };
        self.denied.store(!granted, Ordering::SeqCst);
        self.answered.notify_one();
    }
}

/// CLOCK_MONOTONIC now, the clock `Instant` reads on Linux, shared by every process.
fn monotonic_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `deadline` as an absolute CLOCK_MONOTONIC time, `SECONDS.NANOSECONDS`.
fn absolute(deadline: Instant) -> String {
    let at = monotonic_now() + deadline.saturating_duration_since(Instant::now());
    format!("{}.{:09}", at.as_secs(), at.subsec_nanos())
}

fn parse_absolute(text: &str) -> Option<Duration> {
    let (s, n) = text.split_once('.')?;
    Some(Duration::new(s.parse().ok()?, n.parse().ok()?))
}

/// The exit code a shell gives for this status.
fn code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        _ => EXIT_ERROR,
    }
}

/// Runs `lock`; returns the exit code. Messages go to stderr.
pub async fn run(nats: Client, args: LockArgs) -> u8 {
    let ttl = Duration::from_millis(args.ttl_ms);
    let grace = args
        .grace
        .unwrap_or_else(|| (ttl / 3).min(DEFAULT_GRACE_MAX));
    if grace > ttl / 2 {
        eprintln!(
            "dagnats-leases: --grace {grace:?} is more than half the TTL ({ttl:?}): \
             the command would be stopped while the lease is healthy"
        );
        return crate::exit::EXIT_NO_SERVER; // bad arguments, as clap's
    }
    let holder = args
        .holder
        .clone()
        .unwrap_or_else(|| Member::unique_id("lock"));
    let watch = Arc::new(AcquireWatch::default());
    let member = match Member::new(nats, holder.clone()) {
        Ok(m) => m.with_observer(watch.clone()),
        Err(e) => {
            eprintln!("dagnats-leases: {e}");
            return crate::commands::exit_code(&e);
        }
    };
    let started = match args.permits {
        None => member.elect(&args.key, ttl).map(Campaigner::One),
        Some(permits) => member
            .semaphore(&args.key, permits, ttl)
            .map(Campaigner::Slots),
    };
    let mut elector = match started {
        Ok(e) => e,
        Err(e) => {
            eprintln!("dagnats-leases: {e}");
            return crate::commands::exit_code(&e);
        }
    };
    let mut sigint = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut sigterm = signal(SignalKind::terminate()).expect("SIGTERM handler");

    // Campaign until elected, or until --wait is over and the last acquire was refused.
    let wait_until = args.wait.map(|w| tokio::time::Instant::now() + w);
    let fence = loop {
        let waited_out = async {
            match wait_until {
                Some(at) => loop {
                    tokio::time::sleep_until(at).await;
                    if watch.denied.load(Ordering::SeqCst) {
                        return;
                    }
                    watch.answered.notified().await;
                    if watch.denied.load(Ordering::SeqCst) {
                        return;
                    }
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            change = elector.next() => match change.map(|c| c.ownership) {
                Some(Ownership::Elected { fence }) => break fence,
                Some(Ownership::SteppedDown { .. }) => continue,
                None => {
                    eprintln!("dagnats-leases: the campaign for {} ended", args.key);
                    return EXIT_ERROR;
                }
            },
            _ = waited_out => {
                elector.stop().await;
                eprintln!(
                    "dagnats-leases: {} is held by another holder (waited {:?})",
                    args.key,
                    args.wait.unwrap_or_default()
                );
                return EXIT_NOT_HELD;
            }
            _ = sigint.recv() => { elector.stop().await; return 130; }
            _ = sigterm.recv() => { elector.stop().await; return 143; }
        }
    };
    let Some((key, tenure)) = elector.held() else {
        // Elected and already past the deadline (a pause right here): start over is
        // not worth it for a one-shot tool.
        elector.stop().await;
        eprintln!(
            "dagnats-leases: lost {} before the command started",
            args.key
        );
        return EXIT_LEASE_LOST;
    };
    eprintln!(
        "dagnats-leases: holding {key} as {holder} (fence {fence}); running {}",
        args.command[0]
    );

    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            elector.stop().await;
            eprintln!("dagnats-leases: cannot find my own binary: {e}");
            return EXIT_ERROR;
        }
    };
    let mut guard: Child = match Command::new(exe)
        .arg("__lock-guard")
        .args(["--grace-ms", &grace.as_millis().to_string()])
        .args(["--deadline", &absolute(tenure.deadline)])
        .arg("--")
        .args(&args.command)
        .env(ENV_KEY, &key)
        .env(ENV_HOLDER, &holder)
        .env(ENV_FENCE, fence.to_string())
        .stdin(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(g) => g,
        Err(e) => {
            elector.stop().await;
            eprintln!("dagnats-leases: cannot start the guard: {e}");
            return EXIT_ERROR;
        }
    };
    let mut to_guard: ChildStdin = guard.stdin.take().expect("piped stdin");
    let mut last_deadline = tenure.deadline;
    let mut lost = false;
    // How often the local deadline is looked at (no request: the library renews).
    let mut tick = tokio::time::interval(
        (ttl / 20).clamp(Duration::from_millis(20), Duration::from_millis(250)),
    );
    let status = loop {
        tokio::select! {
            status = guard.wait() => break status,
            change = elector.next(), if !lost => {
                if !matches!(change.map(|c| c.ownership), Some(Ownership::Elected { .. })) {
                    lost = true;
                    eprintln!("dagnats-leases: lost {key}: stopping the command");
                    let _ = to_guard.write_all(b"lost\n").await;
                }
            }
            _ = tick.tick(), if !lost => {
                if let Some((_, t)) = elector.held()
                    && t.deadline != last_deadline
                {
                    last_deadline = t.deadline;
                    let line = format!("deadline {}\n", absolute(t.deadline));
                    let _ = to_guard.write_all(line.as_bytes()).await;
                }
            }
            _ = sigint.recv() => { let _ = to_guard.write_all(b"signal INT\n").await; }
            _ = sigterm.recv() => { let _ = to_guard.write_all(b"signal TERM\n").await; }
        }
    };
    let expired = !lost && elector.held().is_none();
    if expired {
        eprintln!(
            "dagnats-leases: the lease on {key} ran past its deadline (this process could not \
             renew it in time): the command was stopped"
        );
    }
    let lost = lost || expired;
    elector.stop().await;
    match status {
        // The command's code (127, with the guard's sentence, if it could not start).
        Ok(status) if !lost => code_of(status),
        Ok(_) => EXIT_LEASE_LOST,
        Err(e) => {
            eprintln!("dagnats-leases: cannot wait for the guard: {e}");
            EXIT_ERROR
        }
    }
}

fn signal_group(pgid: u32, sig: Signal) {
    if let Some(pid) = i32::try_from(pgid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, sig);
    }
}

/// Runs `__lock-guard`: the command in its own process group, stopped at the
/// deadline; returns the command's code. The caller must then exit the process
/// without dropping the runtime (`std::process::exit`): the stdin read in flight
/// cannot be cancelled.
pub async fn guard(args: GuardArgs) -> u8 {
    let Some(mut deadline) = parse_absolute(&args.deadline) else {
        eprintln!("dagnats-leases: __lock-guard: bad --deadline");
        return EXIT_ERROR;
    };
    let grace = Duration::from_millis(args.grace_ms);
    let mut child = match Command::new(&args.command[0])
        .args(&args.command[1..])
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dagnats-leases: cannot run {}: {e}", args.command[0]);
            return EXIT_CANNOT_RUN;
        }
    };
    let pgid = child.id().expect("a running child has an id");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut open = true;
    // Once terminating: when SIGKILL goes out (CLOCK_MONOTONIC).
    let mut kill_at: Option<Duration> = None;
    let until = |at: Duration| at.saturating_sub(monotonic_now());
    loop {
        let term_in = until(deadline.saturating_sub(grace));
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(s) => code_of(s),
                    Err(_) => EXIT_ERROR,
                };
            }
            line = lines.next_line(), if open => match line {
                Ok(Some(line)) => {
                    let mut words = line.split_whitespace();
                    match (words.next(), words.next()) {
                        (Some("deadline"), Some(at)) if kill_at.is_none() => {
                            if let Some(at) = parse_absolute(at) {
                                deadline = at;
                            }
                        }
                        (Some("lost"), _) if kill_at.is_none() => {
                            signal_group(pgid, Signal::TERM);
                            kill_at = Some(monotonic_now() + grace);
                        }
                        (Some("signal"), Some("INT")) => signal_group(pgid, Signal::INT),
                        (Some("signal"), Some("TERM")) => signal_group(pgid, Signal::TERM),
                        _ => {}
                    }
                }
                // The tool is gone (or exiting): the last deadline stands.
                _ => open = false,
            },
            _ = tokio::time::sleep(term_in), if kill_at.is_none() => {
                signal_group(pgid, Signal::TERM);
                kill_at = Some(deadline);
            }
            _ = tokio::time::sleep(until(kill_at.unwrap_or_default())), if kill_at.is_some() => {
                signal_group(pgid, Signal::KILL);
                kill_at = Some(Duration::MAX);
            }
        }
    }
}
