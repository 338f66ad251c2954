//! The tool's machine: campaign, start the watchdog, pass deadlines, loss and
//! signals on, and release only once every process of the command is gone.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{
    GroupSignal, StopCause, Supervisor, SupervisorEvent, WatchdogMessage, WatchdogReport, may_start,
};
use crate::holder::OutcomeClass;
use crate::holder::relay::Heard;

/// Why a campaign's acquire did not win the key, as `lock` tells it: a lease
/// service that answered "held" is not the same as no lease service at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotGranted {
    /// The service answered: another holder has the key.
    Held,
    /// Nobody received the acquire: no lease service is running.
    NoService,
    /// No usable answer (timed out, `unavailable`, `internal`, the connection failed).
    NoAnswer,
}

impl NotGranted {
    /// The refusal a [`HolderEvent::NotGranted`] reports: `holder_named` when the
    /// service named the current holder, `answer` what came back.
    ///
    /// [`HolderEvent::NotGranted`]: crate::holder::HolderEvent::NotGranted
    pub fn of(holder_named: bool, answer: OutcomeClass) -> Self {
        match answer {
            _ if holder_named => Self::Held,
            OutcomeClass::NoResponders => Self::NoService,
            // A clear answer that names nobody is still the service's "no".
            OutcomeClass::Clear => Self::Held,
            _ => Self::NoAnswer,
        }
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
    /// `--wait` passed and no lease service answered the last acquire.
    NoService,
    /// `--wait` passed and the last acquire got no usable answer (timed out,
    /// `unavailable`, ...).
    NoAnswer,
    /// A signal arrived before the command started.
    Interrupted(GroupSignal),
    /// The watchdog died: the tool stopped the command itself, or could not tell
    /// whether it still runs (then nothing was released).
    WatchdogGone,
}

/// What a [`Lock`] wants done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockEvent {
    /// Campaigning: the acquire was refused for another reason than the last one
    /// told (the first refusal included). Say so on stderr; the campaign goes on.
    Waiting(NotGranted),
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
        /// The last refusal since the start, if any.
        not_granted: Option<NotGranted>,
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
/// once every process of the command is gone. See the [module docs](crate::holder::supervise).
#[derive(Debug)]
pub struct Lock {
    grace: Duration,
    phase: LockPhase,
    /// The tenure's deadline, as the holder last handed it out.
    deadline: Option<Instant>,
    lost: bool,
    events: VecDeque<LockEvent>,
    /// The key held and its fence, once elected (a semaphore's slot).
    held: Option<(String, u64)>,
    /// The holder the service last named in a refusal.
    named: Option<String>,
}

impl Lock {
    /// A `lock` that campaigns, giving up after `wait` if the key stays another's
    /// (`None`: for ever; zero: after the first refusal).
    pub fn new(grace: Duration, wait: Option<Duration>, now: Instant) -> Self {
        Self {
            grace,
            phase: LockPhase::Campaigning {
                wait_until: wait.map(|w| now + w),
                not_granted: None,
                waited_out: false,
            },
            deadline: None,
            lost: false,
            events: VecDeque::new(),
            held: None,
            named: None,
        }
    }

    /// What the campaign told of `key`'s holder ([`Heard`], as a supervisor
    /// hears it): an election records the key held (a semaphore's slot) and its
    /// fence, and one whose deadline has passed already is a loss; a renewal
    /// counts only for the key held; a refusal keeps the holder it names.
    pub fn handle_heard(&mut self, now: Instant, key: &str, heard: &Heard) {
        match heard {
            Heard::Elected { fence, deadline } => {
                self.held = Some((key.to_string(), *fence));
                self.handle_elected(now, (now < *deadline).then_some(*deadline));
            }
            Heard::SteppedDown { .. } => self.handle_lost(now),
            Heard::Renewed { deadline } => {
                if self.held.as_ref().is_some_and(|(k, _)| k == key) {
                    self.handle_deadline(now, *deadline);
                }
            }
            Heard::NotGranted { why, holder } => {
                if holder.is_some() {
                    self.named.clone_from(holder);
                }
                self.handle_not_granted(now, *why);
            }
            Heard::Failed { .. } => {}
        }
    }

    /// The key held (a semaphore's slot) and its fence, once elected: what the
    /// command's environment and `lock`'s messages name.
    pub fn held(&self) -> Option<(&str, u64)> {
        self.held.as_ref().map(|(k, f)| (k.as_str(), *f))
    }

    /// The holder the service last named in a refusal, for `lock`'s messages.
    pub fn named_holder(&self) -> Option<&str> {
        self.named.as_deref()
    }

    /// The holder's acquire did not win the key ([`HolderEvent::NotGranted`], read
    /// with [`NotGranted::of`]): a refusal unlike the last one is told
    /// ([`LockEvent::Waiting`]); `--wait` gives up once it has passed and an
    /// acquire was refused since the start, with an exit that says why.
    ///
    /// [`HolderEvent::NotGranted`]: crate::holder::HolderEvent::NotGranted
    pub fn handle_not_granted(&mut self, now: Instant, why: NotGranted) {
        if let LockPhase::Campaigning {
            not_granted,
            waited_out,
            ..
        } = &mut self.phase
        {
            let told = not_granted.replace(why) == Some(why);
            if *waited_out {
                self.exit(Self::waited_out(why), true);
                return;
            }
            if !told {
                self.events.push_back(LockEvent::Waiting(why));
            }
        }
        self.handle_timeout(now);
    }

    /// How `lock` ends when `--wait` passed after `why`.
    fn waited_out(why: NotGranted) -> LockExit {
        match why {
            NotGranted::Held => LockExit::NotHeld,
            NotGranted::NoService => LockExit::NoService,
            NotGranted::NoAnswer => LockExit::NoAnswer,
        }
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
                not_granted,
                waited_out,
            } if now >= *at && !*waited_out => {
                *waited_out = true;
                if let Some(why) = *not_granted {
                    self.exit(Self::waited_out(why), true);
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

impl StopCause {
    /// Whether the command was stopped because the lease ended, rather than because
    /// it chose to end.
    fn ends_the_lease(self) -> bool {
        !matches!(self, Self::LeaderExited)
    }
}
