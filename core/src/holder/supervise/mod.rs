//! `lock`'s supervision as pure machines: when a command that runs under a lease is
//! signalled, when its end is believed, and when the lease may be released.
//!
//! `dagnats-leases lock KEY -- CMD` runs in two processes, so that the command is
//! stopped in time even when the tool that holds the lease cannot act:
//!
//! - the **watchdog** runs the command in a process group of its own and keeps the
//!   lease's deadline with a [`Supervisor`];
//! - the **tool** campaigns and renews, tells the watchdog each new deadline, and
//!   decides when to release with a [`Lock`]. If the watchdog dies, the tool supervises
//!   the command's group itself (the same [`Supervisor`]) before it releases.
//!
//! The rules, each with a table test:
//!
//! - A command is started only with more than the grace period left before the
//!   deadline ([`may_start`]).
//! - `grace` before the deadline the group gets SIGTERM; SIGKILL follows at the
//!   earlier of SIGTERM + grace and the deadline. So every SIGKILL goes out no later
//!   than the deadline, which comes before the server can free the lease.
//! - A lost lease, the tool gone (the watchdog's channel closed) or the command's first
//!   process exiting stop the group the same way: SIGTERM now, SIGKILL at the earlier
//!   of now + grace and the deadline. Every process left behind by the first one is
//!   stopped too, not only the one the tool started.
//! - SIGTERM, SIGINT and SIGHUP received by the tool or the watchdog are passed on to
//!   the command's group; neither process dies of them.
//! - The lease is released only once every process of the command is known to be
//!   gone: the watchdog said so before it exited, or (the watchdog having died) the tool saw
//!   the group empty itself. A tool that cannot tell (the watchdog died before it named
//!   the group) releases nothing: the lease runs out by its TTL.
//!
//! The files: the watchdog's [`Supervisor`] (`supervisor.rs`), the tool's [`Lock`]
//! (`lock.rs`), and the line protocol between the two processes (`lines.rs`); this
//! one holds what both share (signals, stop causes, exit codes, the grace rule).
//!
//! Like every machine in this crate they do no IO and read no clock: feed them
//! `handle_*(now, …)`, drain [`Supervisor::poll_event`] / [`Lock::poll_event`] after
//! every input, wake at `poll_timeout()`. The adapter reads `now` from a clock that
//! counts time suspended (`CLOCK_BOOTTIME` on Linux), so a suspend longer than the
//! lease's remaining time stops the command at once on resume.

use std::time::{Duration, Instant};

mod lines;
mod lock;
mod supervisor;

pub use lines::{WatchdogMessage, WatchdogReport};
pub use lock::{Lock, LockEvent, LockExit, NotGranted};
pub use supervisor::{Supervisor, SupervisorEvent};

/// A signal for every process of the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupSignal {
    /// SIGTERM: stop, cleanly.
    Term,
    /// SIGKILL: stop now.
    Kill,
    /// SIGINT, passed on from the tool or the watchdog.
    Int,
    /// SIGHUP, passed on from the tool or the watchdog.
    Hup,
}

impl GroupSignal {
    /// The signal's name without `SIG`, as the watchdog's channel spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Term => "TERM",
            Self::Kill => "KILL",
            Self::Int => "INT",
            Self::Hup => "HUP",
        }
    }

    /// The signal named `name` (as [`GroupSignal::name`] spells it).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Term, Self::Kill, Self::Int, Self::Hup]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// The exit code a shell gives for a process this signal ended: 128 + its number.
    pub fn exit_code(self) -> u8 {
        128 + match self {
            Self::Hup => 1,
            Self::Int => 2,
            Self::Kill => 9,
            Self::Term => 15,
        }
    }
}

/// Why a [`Supervisor`] is stopping the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopCause {
    /// The command's first process exited: the rest of its group goes too.
    LeaderExited,
    /// Only the grace period is left before the deadline.
    DeadlineNear,
    /// The lease was lost.
    Lost,
    /// The process holding the lease is gone: nobody renews it.
    ToolGone,
    /// The watchdog died; the tool stops the command itself.
    WatchdogGone,
}

/// `lock`'s exit code for any error without a code of its own (the watchdog's, for a
/// command whose first process's code it never saw).
pub const EXIT_ERROR: u8 = 1;
/// `lock`: the lease was lost while the command ran (the command was sent SIGTERM,
/// then SIGKILL after the grace period), or ran out before it could start.
pub const EXIT_LEASE_LOST: u8 = 5;
/// `lock`: `--grace` is more than half the TTL ([`lock_grace`]): refused before
/// anything runs.
pub const EXIT_BAD_GRACE: u8 = 6;
/// `lock`: the command could not be started.
pub const EXIT_CANNOT_RUN: u8 = 127;

/// The longest default grace period (the default is a third of the TTL, at most this).
pub const DEFAULT_GRACE_MAX: Duration = Duration::from_secs(5);

/// A `--grace` refused by [`lock_grace`]: more than half the TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraceTooLong {
    /// The grace asked for.
    pub grace: Duration,
    /// The lease's TTL.
    pub ttl: Duration,
}

impl std::fmt::Display for GraceTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--grace {:?} is more than half the TTL ({:?}): the command would be stopped \
             while the lease is healthy",
            self.grace, self.ttl
        )
    }
}

impl std::error::Error for GraceTooLong {}

/// The grace period of a `lock` under a lease of `ttl`: `requested`, or by default a
/// third of the TTL, at most [`DEFAULT_GRACE_MAX`]. More than half the TTL is
/// refused: SIGTERM would go out at every renewal's half-way point, while the lease
/// is healthy (a renewal comes every third of the TTL).
pub fn lock_grace(ttl: Duration, requested: Option<Duration>) -> Result<Duration, GraceTooLong> {
    let grace = requested.unwrap_or_else(|| (ttl / 3).min(DEFAULT_GRACE_MAX));
    if grace > ttl / 2 {
        return Err(GraceTooLong { grace, ttl });
    }
    Ok(grace)
}

/// Whether a command may start under a lease whose deadline is `deadline`: only with
/// more than `grace` left, so that it can be stopped gently before the deadline.
pub fn may_start(now: Instant, deadline: Instant, grace: Duration) -> bool {
    deadline
        .checked_duration_since(now)
        .is_some_and(|left| left > grace)
}
