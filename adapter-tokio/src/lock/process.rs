//! The processes' own IO: a timer on `CLOCK_BOOTTIME`, the signals handled,
//! signalling the command's processes, reaping them, and becoming their subreaper.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dagnats_leases_core::holder::supervise::GroupSignal;
use rustix::process::{Pid, Signal, WaitOptions};
use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use tokio::signal::unix::{Signal as SignalStream, SignalKind, signal};
use tokio::sync::mpsc;

use crate::clock;

/// A timer on `CLOCK_BOOTTIME` (a timerfd armed at an absolute time): it fires at
/// once on resume from a suspend that passed its time, where a `CLOCK_MONOTONIC`
/// timer would fire as late as the suspend was long. A thread of its own blocks
/// reading the timerfd (tokio registers a raw fd only through `unsafe`, which the
/// workspace forbids); a re-arm from the loop takes effect on that read at once.
pub(super) struct BootTimer {
    fd: Arc<OwnedFd>,
    fired: mpsc::UnboundedReceiver<()>,
}

impl BootTimer {
    pub(super) fn new() -> io::Result<Self> {
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
    pub(super) fn arm(&self, at: Option<Instant>) -> io::Result<()> {
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
    pub(super) async fn fired(&mut self) -> io::Result<()> {
        match self.fired.recv().await {
            Some(()) => Ok(()),
            None => Err(io::Error::other("the timer's thread ended")),
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP, handled (so neither process dies of them).
pub(super) struct Signals {
    term: SignalStream,
    int: SignalStream,
    hup: SignalStream,
}

impl Signals {
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    pub(super) async fn recv(&mut self) -> GroupSignal {
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
pub(super) fn signal_command(pgid: u32, signal: GroupSignal) {
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
pub(super) enum Reaped {
    /// Child `pid` ended with `code` (128 + N for signal N).
    Exited { pid: u32, code: u8 },
    /// No child is left.
    None,
}

/// Reaps every child of this process on a thread of its own, until none is left.
/// Only for a process that waits for no child in any other way.
pub(super) fn reap_children() -> mpsc::UnboundedReceiver<Reaped> {
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

pub(super) fn become_subreaper() {
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        eprintln!(
            "dagnats-leases: cannot become a child subreaper ({e}): a process the command orphans may outlive it"
        );
    }
}
