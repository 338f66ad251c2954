//! The watchdog's machine: a command's process group under a lease's deadline.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{
    EXIT_CANNOT_RUN, EXIT_ERROR, EXIT_LEASE_LOST, GroupSignal, StopCause, WatchdogReport, may_start,
};

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

/// A command's process group under a lease's deadline. See the [module docs](crate::holder::supervise).
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
    /// The timer last handed out to arm ([`Supervisor::poll_timer`]).
    armed: Option<Option<Instant>>,
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
            armed: None,
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

    /// The timer to arm now (`Some(None)`: disarm), when it is not the one last
    /// handed out: each wake-up is armed once, so a timer that failed to arm
    /// ([`Supervisor::handle_timer_failed`]) is not tried again for it.
    pub fn poll_timer(&mut self) -> Option<Option<Instant>> {
        let wake = self.poll_timeout();
        if self.armed == Some(wake) {
            return None;
        }
        self.armed = Some(wake);
        Some(wake)
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
