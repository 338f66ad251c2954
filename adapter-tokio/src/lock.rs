//! `dagnats-leases lock KEY -- CMD [ARGS...]`: runs a command while this process
//! holds a lease, campaigning with the holder library ([`Member`], [`Elector`]).
//!
//! Two processes take part, so that the command is stopped in time even when the
//! tool itself cannot act (frozen by SIGSTOP, a long pause, killed):
//!
//! - the **tool** holds the lease: it campaigns, renews (the library does), and
//!   tells the watchdog every new deadline as an absolute `CLOCK_BOOTTIME` time (one
//!   clock for every process on the machine, counting time suspended);
//! - the **watchdog** (`dagnats-leases __lock-watchdog`, started by the tool in a process
//!   group of its own) runs the command in another process group and keeps the
//!   deadline: `--grace` before it the command's group gets SIGTERM, SIGKILL at the
//!   latest at the deadline, which comes before the server can expire the lease.
//!
//! Every rule (when to signal, when the command is over, when to release; which
//! key and fence are held, which renewals count, which holder a message names;
//! when the watchdog's timer is armed) is a core machine: [`dagnats_leases_core::holder::supervise`], the watchdog's [`Supervisor`] and the
//! tool's [`Lock`]. This module is their IO: processes, signals, the channel between
//! the two processes (a socket pair that is the watchdog's stdin), and one timer each.
//!
//! Both processes are child subreapers (`PR_SET_CHILD_SUBREAPER`): a process the
//! command leaves behind stays the watchdog's descendant (or the tool's, if the watchdog
//! dies), so "every process of the command is gone" can be known by reaping, and
//! the lease is released only then. SIGTERM, SIGINT and SIGHUP to either process are
//! passed on to the command. The command's stdin is `/dev/null`; stdout and stderr
//! are the tool's.
//!
//! What `lock` cannot cover: every process of the tool and the watchdog killed at once
//! (`kill -9` of both), or the whole host paused; the lease then runs out by its TTL
//! while the command may run on. Fence downstream writes with `DAGNATS_LEASE_FENCE`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Client;
use dagnats_leases_core::holder::relay::Heard;
use dagnats_leases_core::holder::supervise::{
    GroupSignal, Lock, LockEvent, LockExit, NotGranted, StopCause, Supervisor, SupervisorEvent,
    WatchdogMessage, WatchdogReport, lock_grace,
};
use rustix::process::{Pid, Signal, WaitOptions};
use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal as SignalStream, SignalKind, signal};
use tokio::sync::mpsc;

use crate::clock;
use crate::exit::{EXIT_ERROR, EXIT_NO_SERVER, EXIT_NOT_HELD};
use crate::member::{Elector, Member, Semaphore};

pub use crate::exit::{EXIT_BAD_GRACE, EXIT_CANNOT_RUN, EXIT_LEASE_LOST};
/// The longest default grace period (the default is a third of the TTL, at most this).
pub use dagnats_leases_core::holder::supervise::DEFAULT_GRACE_MAX;

/// The environment variable naming the key, for the command.
pub const ENV_KEY: &str = "DAGNATS_LEASE_KEY";
/// The environment variable naming the holder ID, for the command.
pub const ENV_HOLDER: &str = "DAGNATS_LEASE_HOLDER";
/// The environment variable holding the fence (the tenure's revision), for the command.
pub const ENV_FENCE: &str = "DAGNATS_LEASE_FENCE";

pub use crate::cli::parse_duration;

/// How `lock` tells what it does and how it ended, on stderr (stdout is the
/// command's): a readable sentence, or with `--json` one JSON object a line,
/// `{"event", "key", "message"}` and `kind` (snake_case) for a failure.
#[derive(Debug, Clone)]
struct Say {
    json: bool,
    key: String,
}

impl Say {
    fn say(&self, event: &str, kind: Option<&str>, message: &str) {
        if self.json {
            let mut line = serde_json::json!({"event": event, "key": self.key, "message": message});
            if let Some(kind) = kind {
                line["kind"] = kind.into();
            }
            eprintln!("{line}");
        } else {
            eprintln!("dagnats-leases: {message}");
        }
    }
}

/// The options of `lock`.
#[derive(Debug, Clone, clap::Args)]
pub struct LockArgs {
    /// The lease key.
    pub key: String,
    /// Holder ID (default: `lock-` and random hex, unique to this process).
    #[arg(long, env = "DAGNATS_HOLDER")]
    pub holder: Option<String>,
    /// Time to live, whole seconds, in milliseconds (`15000`) or with a unit
    /// (`15s`).
    #[arg(long, env = "DAGNATS_TTL_MS", default_value = "15000", value_parser = crate::cli::parse_millis)]
    pub ttl_ms: u64,
    /// Time to live (`15s`, `1m`; a bare number is seconds): instead of --ttl-ms (it wins over it).
    #[arg(long, env = "DAGNATS_TTL", value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// Hold one of N slots of a semaphore named KEY (the leases `KEY-0` to
    /// `KEY-<N-1>`) instead of KEY itself: at most N commands run at once.
    #[arg(long, env = "DAGNATS_PERMITS")]
    pub permits: Option<usize>,
    /// How long to wait to be elected (default: for ever; a bare number is
    /// seconds); `0` tries once.
    #[arg(long, env = "DAGNATS_WAIT", value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Between SIGTERM and SIGKILL when the lease is lost (default: ttl/3, at most
    /// 5s; at most ttl/2, else `lock` exits 6).
    #[arg(long, env = "DAGNATS_GRACE", value_parser = parse_duration)]
    pub grace: Option<Duration>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// The options of the hidden `__lock-watchdog` (started by `lock`, never by hand).
#[derive(Debug, Clone, clap::Args)]
pub struct WatchdogArgs {
    /// Between SIGTERM and SIGKILL, in milliseconds.
    #[arg(long)]
    pub grace_ms: u64,
    /// The first deadline, `SECONDS.NANOSECONDS` of CLOCK_BOOTTIME.
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
    /// The next event of its keys as a supervisor hears it, with the key.
    async fn next(&mut self) -> Option<(String, Heard)> {
        match self {
            Self::One(e) => e.next_heard().await,
            Self::Slots(s) => s.next_heard().await,
        }
    }

    async fn stop(self) {
        match self {
            Self::One(e) => e.stop().await,
            Self::Slots(s) => s.stop().await,
        }
    }
}

/// A timer on `CLOCK_BOOTTIME` (a timerfd armed at an absolute time): it fires at
/// once on resume from a suspend that passed its time, where a `CLOCK_MONOTONIC`
/// timer would fire as late as the suspend was long. A thread of its own blocks
/// reading the timerfd (tokio registers a raw fd only through `unsafe`, which the
/// workspace forbids); a re-arm from the loop takes effect on that read at once.
struct BootTimer {
    fd: Arc<OwnedFd>,
    fired: mpsc::UnboundedReceiver<()>,
}

impl BootTimer {
    fn new() -> io::Result<Self> {
        let fd = Arc::new(rustix::time::timerfd_create(
            TimerfdClockId::Boottime,
            TimerfdFlags::CLOEXEC,
        )?);
        let (tx, fired) = mpsc::unbounded_channel();
        let reader = fd.clone();
        std::thread::spawn(move || {
            let mut expirations = [0u8; 8];
            loop {
                match rustix::io::read(&*reader, &mut expirations) {
                    Ok(_) if tx.send(()).is_ok() => {}
                    Err(rustix::io::Errno::INTR) => {}
                    _ => return,
                }
            }
        });
        Ok(Self { fd, fired })
    }

    /// Fires at `at` (on [`clock::now`]'s clock); `None` disarms.
    fn arm(&self, at: Option<Instant>) -> io::Result<()> {
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let value = match at {
            // At least 1 ns: an all-zero value would disarm.
            Some(at) => {
                let boot = clock::to_boot(at).max(Duration::from_nanos(1));
                Timespec {
                    tv_sec: boot.as_secs().try_into().unwrap_or(i64::MAX),
                    tv_nsec: boot.subsec_nanos().into(),
                }
            }
            None => zero,
        };
        let spec = Itimerspec {
            it_interval: zero,
            it_value: value,
        };
        rustix::time::timerfd_settime(&*self.fd, TimerfdTimerFlags::ABSTIME, &spec)?;
        Ok(())
    }

    /// Resolves when the timer fires (a wake that finds nothing due is harmless).
    async fn fired(&mut self) -> io::Result<()> {
        match self.fired.recv().await {
            Some(()) => Ok(()),
            None => Err(io::Error::other("the timer's thread ended")),
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP, handled (so neither process dies of them).
struct Signals {
    term: SignalStream,
    int: SignalStream,
    hup: SignalStream,
}

impl Signals {
    fn new() -> io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> GroupSignal {
        tokio::select! {
            _ = self.term.recv() => GroupSignal::Term,
            _ = self.int.recv() => GroupSignal::Int,
            _ = self.hup.recv() => GroupSignal::Hup,
        }
    }
}

fn raw_signal(signal: GroupSignal) -> Signal {
    match signal {
        GroupSignal::Term => Signal::TERM,
        GroupSignal::Kill => Signal::KILL,
        GroupSignal::Int => Signal::INT,
        GroupSignal::Hup => Signal::HUP,
    }
}

/// Sends `signal` to group `pgid` and to every child of this process outside it (a
/// process of the command that left the group and was then orphaned: this process
/// is its subreaper).
fn signal_command(pgid: u32, signal: GroupSignal) {
    let sig = raw_signal(signal);
    let group = i32::try_from(pgid).ok().and_then(Pid::from_raw);
    if let Some(group) = group {
        let _ = rustix::process::kill_process_group(group, sig);
    }
    for child in children() {
        if rustix::process::getpgid(Some(child)).ok() != group {
            let _ = rustix::process::kill_process(child, sig);
        }
    }
}

/// This process's children, from `/proc/self/task/*/children`.
fn children() -> Vec<Pid> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|pid| pid.parse().ok().and_then(Pid::from_raw))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// What reaping this process's children shows.
enum Reaped {
    /// Child `pid` ended with `code` (128 + N for signal N).
    Exited { pid: u32, code: u8 },
    /// No child is left.
    None,
}

/// Reaps every child of this process on a thread of its own, until none is left.
/// Only for a process that waits for no child in any other way.
fn reap_children() -> mpsc::UnboundedReceiver<Reaped> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        loop {
            match rustix::process::wait(WaitOptions::empty()) {
                Ok(Some((pid, status))) => {
                    let code = match (status.exit_status(), status.terminating_signal()) {
                        (Some(code), _) => code as u8,
                        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
                        _ => continue,
                    };
                    let pid = pid.as_raw_nonzero().get() as u32;
                    let _ = tx.send(Reaped::Exited { pid, code });
                }
                Ok(None) | Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    let _ = tx.send(Reaped::None);
                    return;
                }
            }
        }
    });
    rx
}

fn become_subreaper() {
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        eprintln!(
            "dagnats-leases: cannot become a child subreaper ({e}): a process the command orphans may outlive it"
        );
    }
}

/// The watchdog's side of the channel: the tool's socket, which is the watchdog's stdin.
fn channel_from_stdin() -> io::Result<UnixStream> {
    let fd = io::stdin().as_fd().try_clone_to_owned()?;
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

async fn send_line(to: &mut OwnedWriteHalf, line: String) {
    // A peer that is gone shows as the end of its lines; nothing to do here.
    let _ = to.write_all(format!("{line}\n").as_bytes()).await;
}

/// The watchdog as the tool runs it.
struct WatchdogProc {
    child: Child,
    to: OwnedWriteHalf,
    from: Lines<BufReader<OwnedReadHalf>>,
}

/// Starts the watchdog under `deadline`, the command's environment set.
fn start_watchdog(
    args: &LockArgs,
    grace: Duration,
    deadline: Instant,
    env: [(&str, String); 3],
) -> io::Result<WatchdogProc> {
    let exe = std::env::current_exe()?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let child = Command::new(exe)
        .arg("__lock-watchdog")
        .args(["--grace-ms", &grace.as_millis().to_string()])
        .args([
            "--deadline",
            &WatchdogMessage::clock_arg(clock::to_boot(deadline)),
        ])
        .arg("--")
        .args(&args.command)
        .envs(env)
        .stdin(std::process::Stdio::from(OwnedFd::from(theirs)))
        .process_group(0)
        .spawn()?;
    let (from, to) = UnixStream::from_std(ours)?.into_split();
    Ok(WatchdogProc {
        child,
        to,
        from: BufReader::new(from).lines(),
    })
}

/// The sentence `lock` says while it campaigns, for a refusal unlike the last.
fn say_waiting(say: &Say, why: NotGranted, key: &str, holder: Option<&str>) {
    match why {
        NotGranted::Held => say.say(
            "waiting",
            None,
            &format!(
                "waiting for {key} (held by {})",
                holder.unwrap_or("another holder")
            ),
        ),
        NotGranted::NoService => say.say(
            "waiting",
            Some("no_service"),
            &format!(
                "no lease service answers on {}: trying again",
                dagnats_leases_core::wire::Endpoint::Acquire.subject()
            ),
        ),
        NotGranted::NoAnswer => say.say(
            "waiting",
            Some("no_answer"),
            "the lease service gave no usable answer: trying again",
        ),
    }
}

/// The exit code for how `lock` ended, with the sentence said on stderr.
fn exit_code(
    say: &Say,
    exit: LockExit,
    key: &str,
    wait: Option<Duration>,
    holder: Option<&str>,
) -> u8 {
    let waited = humantime::format_duration(wait.unwrap_or_default());
    let (code, kind, message) = match exit {
        LockExit::Command(code) => (code, None, format!("the command exited with {code}")),
        LockExit::LeaseLost => (
            EXIT_LEASE_LOST,
            Some("lost"),
            format!("lost {key}: the command was stopped (or never started)"),
        ),
        LockExit::NotHeld => (
            EXIT_NOT_HELD,
            Some("not_held"),
            format!(
                "{key} is held by {} (waited {waited})",
                holder.unwrap_or("another holder")
            ),
        ),
        LockExit::NoService => (
            EXIT_NO_SERVER,
            Some("no_service"),
            format!(
                "no lease service answers on {} (waited {waited})",
                dagnats_leases_core::wire::Endpoint::Acquire.subject()
            ),
        ),
        LockExit::NoAnswer => (
            EXIT_ERROR,
            Some("no_answer"),
            format!("the lease service gave no usable answer for {key} (waited {waited})"),
        ),
        LockExit::Interrupted(signal) => (
            signal.exit_code(),
            Some("interrupted"),
            format!("{signal:?} before the command started"),
        ),
        LockExit::WatchdogGone => (
            EXIT_ERROR,
            Some("watchdog_gone"),
            "the watchdog process died: the command was stopped by lock".to_string(),
        ),
    };
    // The command's own end and an interrupt are not news in readable output.
    if say.json || !matches!(exit, LockExit::Command(_) | LockExit::Interrupted(_)) {
        say.say("exit", kind, &message);
    }
    code
}

/// Runs `lock`; returns the exit code. Messages go to stderr (JSON lines with
/// `json`).
pub async fn run(nats: Client, args: LockArgs, json: bool) -> u8 {
    let say = Say {
        json,
        key: args.key.clone(),
    };
    let ttl = args.ttl.unwrap_or(Duration::from_millis(args.ttl_ms));
    let grace = match lock_grace(ttl, args.grace) {
        Ok(grace) => grace,
        Err(e) => {
            say.say("exit", Some("invalid"), &e.to_string());
            return EXIT_BAD_GRACE;
        }
    };
    // Signals are taken before anything is sent: one that follows the first
    // acquire must be handled, never meet the default action and kill the tool
    // with its lease held.
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            say.say(
                "exit",
                Some("internal"),
                &format!("cannot handle signals: {e}"),
            );
            return EXIT_ERROR;
        }
    };
    let holder = args
        .holder
        .clone()
        .unwrap_or_else(|| Member::unique_id("lock"));
    let member = match Member::new(nats, holder.clone()) {
        Ok(m) => m.supervised(),
        Err(e) => {
            say.say("exit", Some(e.kind().as_str()), &e.to_string());
            return crate::exit::exit_code(&e);
        }
    };
    let started = match args.permits {
        None => member.elect(&args.key, ttl).map(Campaigner::One),
        Some(permits) => member
            .semaphore(&args.key, permits, ttl)
            .map(Campaigner::Slots),
    };
    let mut campaign = match started {
        Ok(e) => e,
        Err(e) => {
            say.say("exit", Some(e.kind().as_str()), &e.to_string());
            return crate::exit::exit_code(&e);
        }
    };
    // Orphans of a watchdog that died become this process's children.
    become_subreaper();

    let mut lock = Lock::new(grace, args.wait, clock::now());
    let mut watchdog: Option<WatchdogProc> = None;
    // After the watchdog died: what reaping the command's processes shows.
    let mut reaped: Option<mpsc::UnboundedReceiver<Reaped>> = None;
    loop {
        while let Some(event) = lock.poll_event() {
            let (held_key, fence) = lock.held().unwrap_or((&args.key, 0));
            let (held_key, other) = (held_key.to_string(), lock.named_holder().map(String::from));
            match event {
                LockEvent::Waiting(why) => say_waiting(&say, why, &args.key, other.as_deref()),
                LockEvent::StartWatchdog { deadline } => {
                    say.say(
                        "holding",
                        None,
                        &format!(
                            "holding {held_key} as {holder} (fence {fence}); running {}",
                            args.command[0]
                        ),
                    );
                    let env = [
                        (ENV_KEY, held_key.clone()),
                        (ENV_HOLDER, holder.clone()),
                        (ENV_FENCE, fence.to_string()),
                    ];
                    match start_watchdog(&args, grace, deadline, env) {
                        Ok(g) => watchdog = Some(g),
                        Err(e) => {
                            campaign.stop().await;
                            say.say(
                                "exit",
                                Some("internal"),
                                &format!("cannot start the watchdog: {e}"),
                            );
                            return EXIT_ERROR;
                        }
                    }
                }
                LockEvent::ToWatchdog(message) => {
                    if let Some(g) = &mut watchdog {
                        send_line(&mut g.to, message.to_line(clock::to_boot)).await;
                    }
                }
                LockEvent::Signal { pgid, signal } => signal_command(pgid, signal),
                LockEvent::WatchGroup { .. } => reaped = Some(reap_children()),
                LockEvent::Exit { exit, release } => {
                    let code = exit_code(&say, exit, &held_key, args.wait, other.as_deref());
                    if !release {
                        say.say(
                            "left_to_expire",
                            None,
                            &format!(
                                "the watchdog died before it could name the command's \
                                 processes: the lease on {held_key} is left to run out by its TTL"
                            ),
                        );
                        // Exit now: no release may go out, nor any renewal.
                        std::process::exit(code.into());
                    }
                    campaign.stop().await;
                    return code;
                }
            }
        }
        let wake = lock.poll_timeout();
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep(at.saturating_duration_since(clock::now())).await,
                None => futures::future::pending().await,
            }
        };
        tokio::select! {
            heard = campaign.next() => match heard {
                Some((key, heard)) => lock.handle_heard(clock::now(), &key, &heard),
                None => {
                    say.say("exit", Some("internal"), &format!("the campaign for {} ended", args.key));
                    return EXIT_ERROR;
                }
            },
            line = async { watchdog.as_mut().expect("guarded by the condition").from.next_line().await },
                if watchdog.is_some() && reaped.is_none() => match line {
                Ok(Some(line)) => {
                    if let Some(report) = WatchdogReport::parse(&line) {
                        lock.handle_report(clock::now(), report);
                    }
                }
                // The channel closed: the watchdog is gone once it has exited (then its
                // orphans, if any, are this process's children).
                _ => {
                    if let Some(g) = &mut watchdog {
                        let _ = g.child.wait().await;
                    }
                    lock.handle_watchdog_gone(clock::now());
                    if reaped.is_none() {
                        watchdog = None;
                    }
                }
            },
            Some(seen) = async { reaped.as_mut().expect("guarded by the condition").recv().await },
                if reaped.is_some() => {
                if let Reaped::None = seen {
                    lock.handle_group_empty(clock::now());
                }
            }
            () = sleep => lock.handle_timeout(clock::now()),
            signal = signals.recv() => lock.handle_signal(clock::now(), signal),
        }
    }
}

/// Runs `__lock-watchdog`: the command in its own process group, stopped at the
/// deadline; returns the command's code. The caller must then exit the process
/// without dropping the runtime (`std::process::exit`).
pub async fn watchdog(args: WatchdogArgs) -> u8 {
    let Some(deadline) =
        WatchdogMessage::parse_clock_arg(&args.deadline).and_then(clock::from_boot)
    else {
        eprintln!("dagnats-leases: __lock-watchdog: bad --deadline");
        return EXIT_ERROR;
    };
    let grace = Duration::from_millis(args.grace_ms);
    let (from_tool, mut to_tool) = match channel_from_stdin() {
        Ok(stream) => stream.into_split(),
        Err(e) => {
            eprintln!("dagnats-leases: __lock-watchdog: stdin is not lock's channel: {e}");
            return EXIT_ERROR;
        }
    };
    let (mut signals, mut timer) = match (Signals::new(), BootTimer::new()) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("dagnats-leases: __lock-watchdog: {e}");
            return EXIT_ERROR;
        }
    };
    become_subreaper();
    let mut supervisor = Supervisor::new(deadline, grace, clock::now());
    // The command's first process, whose PID is its group's ID; 0 until started.
    let mut pgid = 0;
    let mut reaped: Option<mpsc::UnboundedReceiver<Reaped>> = None;
    let mut lines = BufReader::new(from_tool).lines();
    let mut tool_open = true;
    loop {
        while let Some(event) = supervisor.poll_event() {
            match event {
                SupervisorEvent::Start => {
                    let child = std::process::Command::new(&args.command[0])
                        .args(&args.command[1..])
                        .stdin(std::process::Stdio::null())
                        .process_group(0)
                        .spawn();
                    match child {
                        Ok(c) => {
                            pgid = c.id();
                            reaped = Some(reap_children());
                            supervisor.handle_started(clock::now(), pgid);
                        }
                        Err(e) => {
                            eprintln!("dagnats-leases: cannot run {}: {e}", args.command[0]);
                            supervisor.handle_start_failed(clock::now());
                        }
                    }
                }
                SupervisorEvent::Signal(signal) => signal_command(pgid, signal),
                SupervisorEvent::Report(report) => {
                    send_line(&mut to_tool, report.to_line()).await;
                    if let WatchdogReport::Finished { code, stopped } = report {
                        if pgid == 0 && stopped == Some(StopCause::DeadlineNear) {
                            eprintln!(
                                "dagnats-leases: the lease has no more than --grace left: \
                                 not starting the command"
                            );
                        }
                        return code;
                    }
                }
            }
        }
        if let Some(wake) = supervisor.poll_timer()
            && let Err(e) = timer.arm(wake)
        {
            eprintln!("dagnats-leases: __lock-watchdog: cannot arm its timer: {e}");
            supervisor.handle_timer_failed(clock::now());
            continue;
        }
        tokio::select! {
            line = lines.next_line(), if tool_open => match line {
                Ok(Some(line)) => match WatchdogMessage::parse(&line, clock::from_boot) {
                    Some(WatchdogMessage::Deadline(at)) => supervisor.handle_deadline(clock::now(), at),
                    Some(WatchdogMessage::Lost) => supervisor.handle_lost(clock::now()),
                    Some(WatchdogMessage::Signal(s)) => supervisor.handle_signal(clock::now(), s),
                    None => {}
                },
                // The tool is gone: nobody renews the lease.
                _ => {
                    tool_open = false;
                    supervisor.handle_tool_gone(clock::now());
                }
            },
            Some(seen) = async { reaped.as_mut().expect("guarded by the condition").recv().await },
                if reaped.is_some() => match seen {
                Reaped::Exited { pid, code } => supervisor.handle_exited(clock::now(), pid, code),
                Reaped::None => supervisor.handle_group_empty(clock::now()),
            },
            fired = timer.fired() => match fired {
                Ok(()) => supervisor.handle_timeout(clock::now()),
                Err(e) => {
                    eprintln!("dagnats-leases: __lock-watchdog: its timer failed: {e}");
                    supervisor.handle_timer_failed(clock::now());
                }
            },
            signal = signals.recv() => supervisor.handle_signal(clock::now(), signal),
        }
    }
}
