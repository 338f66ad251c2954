//! How a stopping service spends its time: every wait on NATS after the stop
//! signal has a bound, so the service is gone within [`Shutdown::bound`] whatever
//! NATS is doing (up, killed, frozen, unreachable, slow).
//!
//! The phases, in order, each with its own bound from the moment it begins:
//!
//! 1. [`StopPhase::Drain`]: the endpoints are unsubscribed; the calls in flight and
//!    the requests delivered before the unsubscribe run to their replies, for at
//!    most `drain` (the service's `shutdown_timeout`).
//! 2. [`StopPhase::Replies`], only when the drain ran out: every call still running
//!    is cut off ([`ShutdownEvent::CutOff`]) and answered `internal`; the replies get
//!    [`REPLY_BOUND`] to be handed to the client (a client whose server is gone may
//!    take none of them).
//! 3. [`StopPhase::Flush`]: the client pushes what it holds to the server, for at
//!    most [`FLUSH_BOUND`] (an async-nats flush waits until the client's writes are
//!    on the socket: while the client reconnects to a server that is gone, or the
//!    socket to a frozen one is full, that is for ever).
//!
//! A phase that ends before its bound moves on at once; one that reaches it gives up
//! ([`ShutdownEvent::GaveUp`], for the log) and moves on. The adapter arms one timer at
//! [`Shutdown::poll_timeout`] and races the phase's wait against it.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use dagnats_leases_core::io::FLUSH_BOUND;
//! use dagnats_leases_core::service::shutdown::{Shutdown, ShutdownEvent, StopPhase};
//!
//! let start = Instant::now();
//! let mut stop = Shutdown::new(Duration::from_secs(10), start);
//! // Every call answered within the drain: straight to the flush.
//! stop.handle_phase_over(start + Duration::from_millis(3));
//! assert_eq!(stop.phase(), StopPhase::Flush);
//! // The server is gone: the flush gives up at its bound.
//! let at = stop.poll_timeout().unwrap();
//! assert_eq!(at, start + Duration::from_millis(3) + FLUSH_BOUND);
//! stop.handle_timeout(at);
//! assert_eq!(stop.poll_event(), Some(ShutdownEvent::GaveUp(StopPhase::Flush)));
//! assert!(stop.is_stopped());
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::io::FLUSH_BOUND;

/// How long the replies of calls cut off at the drain's bound get to go out.
pub const REPLY_BOUND: Duration = Duration::from_secs(1);

/// What a stop may take beyond the drain: [`REPLY_BOUND`] and [`FLUSH_BOUND`].
pub const STOP_MARGIN: Duration = REPLY_BOUND.saturating_add(FLUSH_BOUND);

/// Where a stopping service is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopPhase {
    /// Calls in flight and requests already delivered run to their replies.
    Drain,
    /// The calls still running were cut off; their replies go out.
    Replies,
    /// The client pushes what it holds to the server.
    Flush,
    /// Stopped: nothing is waited for any more.
    Stopped,
}

/// What the stopping service does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownEvent {
    /// Cut off every call still running (each answers `internal`), and every
    /// request still buffered.
    CutOff,
    /// The phase reached its bound with work left (log it): what it waited on is
    /// given up.
    GaveUp(StopPhase),
}

/// The machine of a stopping service: which phase, and until when.
#[derive(Debug, Clone)]
pub struct Shutdown {
    phase: StopPhase,
    deadline: Option<Instant>,
    events: VecDeque<ShutdownEvent>,
}

impl Shutdown {
    /// Stopping from `now`: the drain may take `drain`.
    pub fn new(drain: Duration, now: Instant) -> Self {
        Self {
            phase: StopPhase::Drain,
            deadline: Some(now + drain),
            events: VecDeque::new(),
        }
    }

    /// The longest a stop with a drain of `drain` takes, every phase at its bound:
    /// the figure a supervisor's grace period must exceed.
    pub fn bound(drain: Duration) -> Duration {
        drain.saturating_add(STOP_MARGIN)
    }

    /// The phase now.
    pub fn phase(&self) -> StopPhase {
        self.phase
    }

    /// Whether the stop is over.
    pub fn is_stopped(&self) -> bool {
        self.phase == StopPhase::Stopped
    }

    /// When the phase's bound is reached; `None` once done.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// The next thing to do, if any.
    pub fn poll_event(&mut self) -> Option<ShutdownEvent> {
        self.events.pop_front()
    }

    /// What the phase waited on is over (every call answered, the replies handed
    /// to the client, the flush answered): the next phase begins. The drain, done,
    /// skips the replies: nothing is cut off.
    pub fn handle_phase_over(&mut self, now: Instant) {
        match self.phase {
            StopPhase::Drain | StopPhase::Replies => self.enter(now, StopPhase::Flush),
            StopPhase::Flush => self.enter(now, StopPhase::Stopped),
            StopPhase::Stopped => {}
        }
    }

    /// The timer fired: at the bound or past it, the phase gives up and the next
    /// begins (the drain's cuts off what still runs); before it, nothing changes.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(deadline) = self.deadline else {
            return;
        };
        if now < deadline {
            return;
        }
        self.events.push_back(ShutdownEvent::GaveUp(self.phase));
        match self.phase {
            StopPhase::Drain => {
                self.events.push_back(ShutdownEvent::CutOff);
                self.enter(now, StopPhase::Replies);
            }
            StopPhase::Replies => self.enter(now, StopPhase::Flush),
            StopPhase::Flush => self.enter(now, StopPhase::Stopped),
            StopPhase::Stopped => {}
        }
    }

    fn enter(&mut self, now: Instant, phase: StopPhase) {
        self.phase = phase;
        self.deadline = match phase {
            StopPhase::Drain => unreachable!("the drain is only the first phase"),
            StopPhase::Replies => Some(now + REPLY_BOUND),
            StopPhase::Flush => Some(now + FLUSH_BOUND),
            StopPhase::Stopped => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRAIN: Duration = Duration::from_secs(10);

    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// The phase's wait ended, this long after the previous step.
        Ended(Duration),
        /// The timer fired, this long after the previous step.
        Timer(Duration),
        /// The timer fired at the phase's deadline.
        AtBound,
    }

    /// The phase, the events and the timeout (from the stop) after a step.
    type After = (StopPhase, Vec<ShutdownEvent>, Option<Duration>);

    /// Runs `steps` from a stop at `t0`; returns the phase, events and timeout
    /// after each step.
    fn run(steps: &[Step]) -> Vec<After> {
        let t0 = Instant::now();
        let mut now = t0;
        let mut stop = Shutdown::new(DRAIN, t0);
        steps
            .iter()
            .map(|step| {
                match *step {
                    Step::Ended(d) => {
                        now += d;
                        stop.handle_phase_over(now);
                    }
                    Step::Timer(d) => {
                        now += d;
                        stop.handle_timeout(now);
                    }
                    Step::AtBound => {
                        now = stop.poll_timeout().expect("a phase with a bound");
                        stop.handle_timeout(now);
                    }
                }
                let events = std::iter::from_fn(|| stop.poll_event()).collect();
                (stop.phase(), events, stop.poll_timeout().map(|t| t - t0))
            })
            .collect()
    }

    #[test]
    fn each_phase_moves_on_at_its_end_or_at_its_bound() {
        use ShutdownEvent::*;
        use Step::*;
        use StopPhase::*;
        let ms = Duration::from_millis;
        let table: Vec<(&str, Vec<Step>, Vec<After>)> = vec![
            (
                "every call answered, the flush answered: nothing cut off",
                vec![Ended(ms(40)), Ended(ms(2))],
                vec![
                    (Flush, vec![], Some(ms(40) + FLUSH_BOUND)),
                    (Stopped, vec![], None),
                ],
            ),
            (
                "the server is gone: the drain cuts off at its bound, then each phase gives up",
                vec![AtBound, AtBound, AtBound],
                vec![
                    (
                        Replies,
                        vec![GaveUp(Drain), CutOff],
                        Some(DRAIN + REPLY_BOUND),
                    ),
                    (
                        Flush,
                        vec![GaveUp(Replies)],
                        Some(DRAIN + REPLY_BOUND + FLUSH_BOUND),
                    ),
                    (Stopped, vec![GaveUp(Flush)], None),
                ],
            ),
            (
                "the cut-off replies go out at once; the flush is answered",
                vec![AtBound, Ended(ms(5)), Ended(ms(1))],
                vec![
                    (
                        Replies,
                        vec![GaveUp(Drain), CutOff],
                        Some(DRAIN + REPLY_BOUND),
                    ),
                    (Flush, vec![], Some(DRAIN + ms(5) + FLUSH_BOUND)),
                    (Stopped, vec![], None),
                ],
            ),
            (
                "a timer that fires early changes nothing",
                vec![Timer(ms(9_999)), Ended(ms(1)), Timer(ms(999))],
                vec![
                    (Drain, vec![], Some(DRAIN)),
                    (Flush, vec![], Some(DRAIN + FLUSH_BOUND)),
                    (Flush, vec![], Some(DRAIN + FLUSH_BOUND)),
                ],
            ),
            (
                "a timer that fires late gives up as at the bound, the next bound from then",
                vec![Timer(DRAIN + ms(300))],
                vec![(
                    Replies,
                    vec![GaveUp(Drain), CutOff],
                    Some(DRAIN + ms(300) + REPLY_BOUND),
                )],
            ),
            (
                "once done, neither the timer nor an end changes anything",
                vec![Ended(ms(1)), Ended(ms(1)), Timer(ms(5_000)), Ended(ms(1))],
                vec![
                    (Flush, vec![], Some(ms(1) + FLUSH_BOUND)),
                    (Stopped, vec![], None),
                    (Stopped, vec![], None),
                    (Stopped, vec![], None),
                ],
            ),
        ];
        for (name, steps, expected) in table {
            assert_eq!(run(&steps), expected, "{name}");
        }
    }

    #[test]
    fn every_phase_at_its_bound_ends_within_the_stated_bound() {
        for drain in [Duration::ZERO, Duration::from_millis(1500), DRAIN] {
            let t0 = Instant::now();
            let mut stop = Shutdown::new(drain, t0);
            let mut now = t0;
            while let Some(at) = stop.poll_timeout() {
                now = at;
                stop.handle_timeout(now);
            }
            assert!(stop.is_stopped());
            assert_eq!(now - t0, Shutdown::bound(drain), "drain {drain:?}");
            assert_eq!(Shutdown::bound(drain), drain + REPLY_BOUND + FLUSH_BOUND);
        }
    }
}
