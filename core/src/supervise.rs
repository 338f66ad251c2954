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
//! Like every machine in this crate they do no IO and read no clock: feed them
//! `handle_*(now, …)`, drain [`Supervisor::poll_event`] / [`Lock::poll_event`] after
//! every input, wake at `poll_timeout()`. The adapter reads `now` from a clock that
//! counts time suspended (`CLOCK_BOOTTIME` on Linux), so a suspend longer than the
//! lease's remaining time stops the command at once on resume.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

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

/// What a [`Supervisor`] wants done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupervisorEvent {
    /// Start the command (in a process group of its own), then feed
    /// [`Supervisor::handle_started`] or [`Supervisor::handle_start_failed`].
    Start,
    /// Send this signal to every process of the command.
    Signal(GroupSignal),
    /// Tell the tool this ([`WatchdogReport::to_line`]). After
    /// [`WatchdogReport::Finished`], the watchdog exits with its `code`: every process of
    /// the command is gone (or it never started).
    Report(WatchdogReport),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stopping {
    cause: StopCause,
    /// When SIGKILL goes out; `None` once it has.
    kill_at: Option<Instant>,
}

/// A command's process group under a lease's deadline. See the [module docs](self).
#[derive(Debug)]
pub struct Supervisor {
    grace: Duration,
    deadline: Instant,
    stopping: Option<Stopping>,
    /// The command's first process (its group's ID), once started.
    leader: Option<u32>,
    leader_code: Option<u8>,
    finished: bool,
    events: VecDeque<SupervisorEvent>,
}

impl Supervisor {
    /// Supervises a command under `deadline` (the watchdog's): [`SupervisorEvent::Start`]
    /// when [`may_start`] says yes; otherwise it never starts, and reports
    /// [`EXIT_LEASE_LOST`] stopped for [`StopCause::DeadlineNear`].
    pub fn new(deadline: Instant, grace: Duration, now: Instant) -> Self {
        let mut supervisor = Self::running(deadline, grace);
        if may_start(now, deadline, grace) {
            supervisor.events.push_back(SupervisorEvent::Start);
        } else {
            supervisor.finish(EXIT_LEASE_LOST, Some(StopCause::DeadlineNear));
        }
        supervisor
    }

    /// Takes over a running group that must stop now (its watchdog died): SIGTERM at
    /// once, SIGKILL at the earlier of now + grace and `deadline`.
    pub fn stopping_now(
        deadline: Instant,
        grace: Duration,
        cause: StopCause,
        now: Instant,
    ) -> Self {
        let mut supervisor = Self::running(deadline, grace);
        supervisor.stop(now, cause);
        supervisor
    }

    fn running(deadline: Instant, grace: Duration) -> Self {
        Self {
            grace,
            deadline,
            stopping: None,
            leader: None,
            leader_code: None,
            finished: false,
            events: VecDeque::new(),
        }
    }

    /// The command started; `pid` is its first process, the ID of its group.
    pub fn handle_started(&mut self, now: Instant, pid: u32) {
        if self.finished || self.leader.is_some() {
            return;
        }
        self.leader = Some(pid);
        self.events
            .push_back(SupervisorEvent::Report(WatchdogReport::Started {
                pgid: pid,
            }));
        self.handle_timeout(now);
    }

    /// The command could not be started: the watchdog reports [`EXIT_CANNOT_RUN`].
    pub fn handle_start_failed(&mut self, _now: Instant) {
        if self.leader.is_none() {
            self.finish(EXIT_CANNOT_RUN, None);
        }
    }

    /// A child `pid` of the watchdog exited with `code` (128 + N for a signal N): the
    /// command's first process is the one whose PID is its group's ID, and its end
    /// stops the rest ([`Supervisor::handle_leader_exited`]); any other is one of
    /// its processes, whose end changes nothing.
    pub fn handle_exited(&mut self, now: Instant, pid: u32, code: u8) {
        if self.leader == Some(pid) {
            self.handle_leader_exited(now, code);
        }
    }

    /// The timer that keeps the deadline failed (it cannot be armed, or its wait
    /// broke): nothing would stop the command in time, so it is killed now rather
    /// than left to run unguarded.
    pub fn handle_timer_failed(&mut self, _now: Instant) {
        let killed = self.stopping.is_some_and(|s| s.kill_at.is_none());
        if self.finished || killed {
            return;
        }
        let cause = self.stop_cause().unwrap_or(StopCause::DeadlineNear);
        self.stopping = Some(Stopping {
            cause,
            kill_at: None,
        });
        self.events
            .push_back(SupervisorEvent::Signal(GroupSignal::Kill));
    }

    /// The deadline in force.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The lease was renewed: a new deadline. Ignored once stopping: a stop is never
    /// taken back, nor its SIGKILL put off.
    pub fn handle_deadline(&mut self, now: Instant, deadline: Instant) {
        if self.stopping.is_none() && !self.finished {
            self.deadline = deadline;
        }
        self.handle_timeout(now);
    }

    /// The lease was lost.
    pub fn handle_lost(&mut self, now: Instant) {
        self.stop(now, StopCause::Lost);
    }

    /// The tool holding the lease is gone (its channel to the watchdog closed).
    pub fn handle_tool_gone(&mut self, now: Instant) {
        self.stop(now, StopCause::ToolGone);
    }

    /// A signal arrived for the command (at the watchdog, or passed on by the tool).
    pub fn handle_signal(&mut self, now: Instant, signal: GroupSignal) {
        if !self.finished {
            self.events.push_back(SupervisorEvent::Signal(signal));
        }
        self.handle_timeout(now);
    }

    /// The command's first process exited with `code`: whatever it left in its group
    /// is stopped too.
    pub fn handle_leader_exited(&mut self, now: Instant, code: u8) {
        self.leader_code.get_or_insert(code);
        self.stop(now, StopCause::LeaderExited);
    }

    /// No process of the command is left: the watchdog reports the first process's
    /// code ([`EXIT_ERROR`] if its end was not seen).
    pub fn handle_group_empty(&mut self, _now: Instant) {
        let code = self.leader_code.unwrap_or(EXIT_ERROR);
        self.finish(code, self.stopping.map(|s| s.cause));
    }

    fn finish(&mut self, code: u8, stopped: Option<StopCause>) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.events
            .push_back(SupervisorEvent::Report(WatchdogReport::Finished {
                code,
                stopped,
            }));
    }

    /// Acts on the time: SIGTERM `grace` before the deadline, SIGKILL when due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.finished {
            return;
        }
        match self.stopping {
            None if now + self.grace >= self.deadline => self.stop(now, StopCause::DeadlineNear),
            Some(Stopping {
                kill_at: Some(at), ..
            }) if now >= at => self.kill(),
            _ => {}
        }
    }

    /// When to call [`Supervisor::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.finished {
            return None;
        }
        match self.stopping {
            None => Some(
                self.deadline
                    .checked_sub(self.grace)
                    .unwrap_or(self.deadline),
            ),
            Some(s) => s.kill_at,
        }
    }

    /// The next thing to do, if any.
    pub fn poll_event(&mut self) -> Option<SupervisorEvent> {
        self.events.pop_front()
    }

    /// Whether every process of the command is gone and every event drained.
    pub fn is_done(&self) -> bool {
        self.finished && self.events.is_empty()
    }

    /// Why the command is being stopped, if it is.
    pub fn stop_cause(&self) -> Option<StopCause> {
        self.stopping.map(|s| s.cause)
    }

    fn stop(&mut self, now: Instant, cause: StopCause) {
        if self.finished || self.stopping.is_some() {
            return;
        }
        let kill_at = (now + self.grace).min(self.deadline);
        self.stopping = Some(Stopping {
            cause,
            kill_at: Some(kill_at),
        });
        self.events
            .push_back(SupervisorEvent::Signal(GroupSignal::Term));
        if now >= kill_at {
            self.kill();
        }
    }

    fn kill(&mut self) {
        if let Some(s) = &mut self.stopping {
            s.kill_at = None;
        }
        self.events
            .push_back(SupervisorEvent::Signal(GroupSignal::Kill));
    }
}

/// What the tool tells its watchdog, a line each on their channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchdogMessage {
    /// The lease's new deadline.
    Deadline(Instant),
    /// The lease is lost: stop the command.
    Lost,
    /// Pass this signal on to the command.
    Signal(GroupSignal),
}

/// What the watchdog tells the tool, a line each on their channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchdogReport {
    /// The command runs in process group `pgid`.
    Started {
        /// The group's ID (the first process's PID).
        pgid: u32,
    },
    /// Every process of the command is gone; the watchdog exits.
    Finished {
        /// The command's exit code (the watchdog's own when it could not start it).
        code: u8,
        /// Why the watchdog stopped the command, if it did.
        stopped: Option<StopCause>,
    },
}

/// `SECONDS.NANOSECONDS`: an absolute time on the clock both processes read.
fn format_clock(at: Duration) -> String {
    format!("{}.{:09}", at.as_secs(), at.subsec_nanos())
}

fn parse_clock(text: &str) -> Option<Duration> {
    let (secs, nanos) = text.split_once('.')?;
    if nanos.len() != 9 {
        return None;
    }
    Some(Duration::new(secs.parse().ok()?, nanos.parse().ok()?))
}

impl WatchdogMessage {
    /// The message as one line of the channel (without the newline); `clock` turns
    /// a deadline into an absolute time of the clock both processes read.
    pub fn to_line(&self, clock: impl Fn(Instant) -> Duration) -> String {
        match self {
            Self::Deadline(at) => format!("deadline {}", format_clock(clock(*at))),
            Self::Lost => "lost".to_string(),
            Self::Signal(s) => format!("signal {}", s.name()),
        }
    }

    /// Reads a line of the channel (`clock` turns an absolute time back into an
    /// instant, `None` when it has none: out of range); `None` for anything else.
    pub fn parse(line: &str, clock: impl Fn(Duration) -> Option<Instant>) -> Option<Self> {
        let mut words = line.split_whitespace();
        let message = match (words.next()?, words.next()) {
            ("deadline", Some(at)) => Self::Deadline(clock(parse_clock(at)?)?),
            ("lost", None) => Self::Lost,
            ("signal", Some(name)) => Self::Signal(GroupSignal::from_name(name)?),
            _ => return None,
        };
        words.next().is_none().then_some(message)
    }

    /// An absolute time on the command line (the watchdog's first deadline), as a
    /// deadline line spells it.
    pub fn clock_arg(at: Duration) -> String {
        format_clock(at)
    }

    /// Reads [`WatchdogMessage::clock_arg`]'s text.
    pub fn parse_clock_arg(text: &str) -> Option<Duration> {
        parse_clock(text)
    }
}

impl StopCause {
    fn name(self) -> &'static str {
        match self {
            Self::LeaderExited => "leader_exited",
            Self::DeadlineNear => "deadline_near",
            Self::Lost => "lost",
            Self::ToolGone => "tool_gone",
            Self::WatchdogGone => "watchdog_gone",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [
            Self::LeaderExited,
            Self::DeadlineNear,
            Self::Lost,
            Self::ToolGone,
            Self::WatchdogGone,
        ]
        .into_iter()
        .find(|c| c.name() == name)
    }

    /// Whether the command was stopped because the lease ended, rather than because
    /// it chose to end.
    fn ends_the_lease(self) -> bool {
        !matches!(self, Self::LeaderExited)
    }
}

impl WatchdogReport {
    /// The report as one line of the channel (without the newline).
    pub fn to_line(&self) -> String {
        match self {
            Self::Started { pgid } => format!("started {pgid}"),
            Self::Finished {
                code,
                stopped: None,
            } => format!("finished {code}"),
            Self::Finished {
                code,
                stopped: Some(cause),
            } => format!("finished {code} {}", cause.name()),
        }
    }

    /// Reads a line of the channel; `None` for anything else.
    pub fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        let report = match (words.next()?, words.next()?.parse::<u32>().ok()?) {
            ("started", pgid) if pgid > 0 => Self::Started { pgid },
            ("finished", code) => Self::Finished {
                code: u8::try_from(code).ok()?,
                stopped: match words.next() {
                    Some(name) => Some(StopCause::from_name(name)?),
                    None => None,
                },
            },
            _ => return None,
        };
        words.next().is_none().then_some(report)
    }
}

/// How `lock` ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockExit {
    /// The command ran under the lease and exited with this code.
    Command(u8),
    /// The lease was lost, or its deadline came, while the command ran (or before it
    /// could start): the command was stopped.
    LeaseLost,
    /// `--wait` passed and the key was still another holder's.
    NotHeld,
    /// A signal arrived before the command started.
    Interrupted(GroupSignal),
    /// The watchdog died: the tool stopped the command itself, or could not tell
    /// whether it still runs (then nothing was released).
    WatchdogGone,
}

/// What a [`Lock`] wants done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockEvent {
    /// Start the watchdog (and through it the command) under `deadline`.
    StartWatchdog {
        /// The lease's deadline now.
        deadline: Instant,
    },
    /// Tell the watchdog this.
    ToWatchdog(WatchdogMessage),
    /// The watchdog is gone: signal every process of the command (group `pgid`) from
    /// the tool itself.
    Signal {
        /// The command's process group.
        pgid: u32,
        /// The signal.
        signal: GroupSignal,
    },
    /// The watchdog is gone: wait until every process of the command has ended (the
    /// tool reaps them as their subreaper), then feed [`Lock::handle_group_empty`].
    WatchGroup {
        /// The command's process group.
        pgid: u32,
    },
    /// Stop campaigning and exit `lock` with `exit`, releasing the lease first when
    /// `release` is true (no process of the command is left, or none started).
    Exit {
        /// How `lock` ends.
        exit: LockExit,
        /// Whether to release the lease (stop the campaign) before exiting.
        release: bool,
    },
}

#[derive(Debug)]
enum LockPhase {
    /// Not holding the key yet.
    Campaigning {
        wait_until: Option<Instant>,
        refused: bool,
        waited_out: bool,
    },
    /// Elected, but with no more than the grace period left: wait for a renewal.
    Elected,
    /// The watchdog runs the command.
    Running {
        pgid: Option<u32>,
        finished: Option<(u8, Option<StopCause>)>,
    },
    /// The watchdog died; the tool stops the command's group itself.
    TakingOver {
        pgid: u32,
        supervisor: Supervisor,
    },
    Done,
}

/// The tool's side of `lock`: campaign until elected (or until `--wait` has
/// passed), start the watchdog, pass deadlines, loss and signals on, and release only
/// once every process of the command is gone. See the [module docs](self).
#[derive(Debug)]
pub struct Lock {
    grace: Duration,
    phase: LockPhase,
    /// The tenure's deadline, as the holder last handed it out.
    deadline: Option<Instant>,
    lost: bool,
    events: VecDeque<LockEvent>,
}

impl Lock {
    /// A `lock` that campaigns, giving up after `wait` if the key stays another's
    /// (`None`: for ever; zero: after the first refusal).
    pub fn new(grace: Duration, wait: Option<Duration>, now: Instant) -> Self {
        Self {
            grace,
            phase: LockPhase::Campaigning {
                wait_until: wait.map(|w| now + w),
                refused: false,
                waited_out: false,
            },
            deadline: None,
            lost: false,
            events: VecDeque::new(),
        }
    }

    /// The holder's acquire did not win the key ([`HolderEvent::Refused`]): `--wait`
    /// gives up once it has passed and an acquire was refused since the start.
    ///
    /// [`HolderEvent::Refused`]: crate::holder::HolderEvent::Refused
    pub fn handle_refused(&mut self, now: Instant) {
        if let LockPhase::Campaigning {
            refused,
            waited_out,
            ..
        } = &mut self.phase
        {
            *refused = true;
            if *waited_out {
                self.exit(LockExit::NotHeld, true);
                return;
            }
        }
        self.handle_timeout(now);
    }

    /// Elected, with the tenure's deadline as the campaign holds it now: `None`
    /// when the tenure is over already (its deadline passed between the election
    /// and this call, a pause right there): that is a loss.
    pub fn handle_elected(&mut self, now: Instant, deadline: Option<Instant>) {
        if matches!(self.phase, LockPhase::Campaigning { .. }) {
            self.phase = LockPhase::Elected;
        }
        match deadline {
            Some(deadline) => self.handle_deadline(now, deadline),
            None => self.handle_lost(now),
        }
    }

    /// The holder handed out a new deadline (a renewal).
    pub fn handle_deadline(&mut self, now: Instant, deadline: Instant) {
        match self.phase {
            LockPhase::Elected => {
                self.deadline = Some(deadline);
                if may_start(now, deadline, self.grace) {
                    self.phase = LockPhase::Running {
                        pgid: None,
                        finished: None,
                    };
                    self.events.push_back(LockEvent::StartWatchdog { deadline });
                }
            }
            LockPhase::Running { .. } if !self.lost => {
                self.deadline = Some(deadline);
                self.events
                    .push_back(LockEvent::ToWatchdog(WatchdogMessage::Deadline(deadline)));
            }
            _ => {}
        }
    }

    /// The campaign stepped down: the lease is lost.
    pub fn handle_lost(&mut self, now: Instant) {
        match &mut self.phase {
            LockPhase::Elected => self.exit(LockExit::LeaseLost, true),
            LockPhase::Running { .. } if !self.lost => {
                self.lost = true;
                self.events
                    .push_back(LockEvent::ToWatchdog(WatchdogMessage::Lost));
            }
            LockPhase::TakingOver { supervisor, .. } => {
                self.lost = true;
                supervisor.handle_lost(now);
                self.drain_supervisor();
            }
            _ => {}
        }
    }

    /// SIGTERM, SIGINT or SIGHUP arrived at the tool.
    pub fn handle_signal(&mut self, now: Instant, signal: GroupSignal) {
        match &mut self.phase {
            LockPhase::Campaigning { .. } | LockPhase::Elected => {
                self.exit(LockExit::Interrupted(signal), true)
            }
            LockPhase::Running { .. } => self
                .events
                .push_back(LockEvent::ToWatchdog(WatchdogMessage::Signal(signal))),
            LockPhase::TakingOver { supervisor, .. } => {
                supervisor.handle_signal(now, signal);
                self.drain_supervisor();
            }
            LockPhase::Done => {}
        }
    }

    /// A line from the watchdog.
    pub fn handle_report(&mut self, _now: Instant, report: WatchdogReport) {
        if let LockPhase::Running { pgid, finished } = &mut self.phase {
            match report {
                WatchdogReport::Started { pgid: group } => *pgid = Some(group),
                WatchdogReport::Finished { code, stopped } => *finished = Some((code, stopped)),
            }
        }
    }

    /// The watchdog has exited and its channel is closed.
    pub fn handle_watchdog_gone(&mut self, now: Instant) {
        let LockPhase::Running { pgid, finished } = self.phase else {
            return;
        };
        let deadline = self.deadline.unwrap_or(now);
        match (finished, pgid) {
            // The watchdog saw every process of the command gone.
            (Some((code, stopped)), _) => {
                let lease_ended =
                    self.lost || now >= deadline || stopped.is_some_and(StopCause::ends_the_lease);
                let exit = if lease_ended {
                    LockExit::LeaseLost
                } else {
                    LockExit::Command(code)
                };
                self.exit(exit, true);
            }
            // It died with the command running: stop the group from here.
            (None, Some(pgid)) => {
                let supervisor =
                    Supervisor::stopping_now(deadline, self.grace, StopCause::WatchdogGone, now);
                self.phase = LockPhase::TakingOver { pgid, supervisor };
                self.events.push_back(LockEvent::WatchGroup { pgid });
                self.drain_supervisor();
            }
            // It died before naming the group: whether the command runs cannot be
            // told, so nothing is released; the lease runs out by its TTL.
            (None, None) => self.exit(LockExit::WatchdogGone, false),
        }
    }

    /// After the watchdog died: no process of the command is left.
    pub fn handle_group_empty(&mut self, now: Instant) {
        if let LockPhase::TakingOver { supervisor, .. } = &mut self.phase {
            supervisor.handle_group_empty(now);
            self.drain_supervisor();
        }
    }

    /// Acts on the time: `--wait` passing, and the SIGKILL due after a watchdog died.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &mut self.phase {
            LockPhase::Campaigning {
                wait_until: Some(at),
                refused,
                waited_out,
            } if now >= *at && !*waited_out => {
                *waited_out = true;
                if *refused {
                    self.exit(LockExit::NotHeld, true);
                }
            }
            LockPhase::TakingOver { supervisor, .. } => {
                supervisor.handle_timeout(now);
                self.drain_supervisor();
            }
            _ => {}
        }
    }

    /// When to call [`Lock::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            LockPhase::Campaigning {
                wait_until,
                waited_out: false,
                ..
            } => *wait_until,
            LockPhase::TakingOver { supervisor, .. } => supervisor.poll_timeout(),
            _ => None,
        }
    }

    /// The next thing to do, if any.
    pub fn poll_event(&mut self) -> Option<LockEvent> {
        self.events.pop_front()
    }

    /// Whether `lock` has decided how it ends and every event is drained.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, LockPhase::Done) && self.events.is_empty()
    }

    fn drain_supervisor(&mut self) {
        let LockPhase::TakingOver { pgid, supervisor } = &mut self.phase else {
            return;
        };
        let pgid = *pgid;
        let mut finished = false;
        while let Some(event) = supervisor.poll_event() {
            match event {
                SupervisorEvent::Signal(signal) => {
                    self.events.push_back(LockEvent::Signal { pgid, signal })
                }
                SupervisorEvent::Report(WatchdogReport::Finished { .. }) => finished = true,
                // A supervisor taking over starts nothing and reports to nobody.
                SupervisorEvent::Start
                | SupervisorEvent::Report(WatchdogReport::Started { .. }) => {}
            }
        }
        if finished {
            self.exit(LockExit::WatchdogGone, true);
        }
    }

    fn exit(&mut self, exit: LockExit, release: bool) {
        if matches!(self.phase, LockPhase::Done) {
            return;
        }
        self.phase = LockPhase::Done;
        self.events.push_back(LockEvent::Exit { exit, release });
    }
}
