//! The line protocol between `lock` and its watchdog: one message a line each way
//! on their socket pair (the watchdog's stdin), and the first deadline's argument.

use std::time::{Duration, Instant};

use super::{GroupSignal, StopCause};

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
