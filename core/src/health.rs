//! What a process tells its operator about itself: whether its connection to NATS
//! is up (and how loudly to say so), and whether the service is ready.
//!
//! [`ConnectionLog`] reads a NATS client's connection events: a lost connection
//! is one warning per outage however many reconnect attempts fail (each is a debug
//! line), the reconnect one info line naming how many attempts it took.
//! [`readiness`] is what the service machine ([`crate::service::Service`])
//! answers a readiness probe with: ready only while serving, connected, its
//! bucket reachable and not refused.

/// A connection event of a NATS client, as the adapter reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// Connected, or reconnected.
    Connected,
    /// The connection was lost; the client reconnects on its own.
    Disconnected,
    /// A connect or reconnect attempt failed (the client's own error).
    AttemptFailed(String),
    /// The server sent an error.
    ServerError(String),
    /// The server is shutting down (lame duck mode): it asks clients to move.
    LameDuck,
    /// A subscription fell behind and the client dropped messages.
    SlowConsumer(u64),
    /// The connection is closed for good.
    Closed,
}

/// Reads connection events into log lines and the connected state. See the
/// [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct ConnectionLog {
    /// Whether the connection is lost now.
    down: bool,
    /// Attempts that failed in this outage.
    failed_attempts: u64,
}

impl ConnectionLog {
    /// A connection that is up (a client is handed over connected).
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the connection is up, as far as the events said.
    pub fn connected(&self) -> bool {
        !self.down
    }

    /// Reads `event`; the log line it is worth, if any, and how loud.
    pub fn handle(&mut self, event: LinkEvent) -> Option<(LogLevel, String)> {
        match event {
            LinkEvent::Connected if self.down => {
                let tries = std::mem::take(&mut self.failed_attempts);
                self.down = false;
                Some((
                    LogLevel::Info,
                    format!(
                        "nats: reconnected (after {tries} failed attempt{})",
                        if tries == 1 { "" } else { "s" }
                    ),
                ))
            }
            LinkEvent::Connected => Some((LogLevel::Info, "nats: connected".to_string())),
            LinkEvent::Disconnected if self.down => None,
            LinkEvent::Disconnected => {
                self.down = true;
                self.failed_attempts = 0;
                Some((
                    LogLevel::Warn,
                    "nats: connection lost; reconnecting (one line when it is back)".to_string(),
                ))
            }
            LinkEvent::AttemptFailed(why) if self.down => {
                self.failed_attempts += 1;
                Some((
                    LogLevel::Debug,
                    format!(
                        "nats: reconnect attempt {} failed: {why}",
                        self.failed_attempts
                    ),
                ))
            }
            LinkEvent::AttemptFailed(why) => {
                Some((LogLevel::Warn, format!("nats: client error: {why}")))
            }
            LinkEvent::ServerError(why) => {
                Some((LogLevel::Warn, format!("nats: server error: {why}")))
            }
            LinkEvent::LameDuck => Some((
                LogLevel::Warn,
                "nats: the server is shutting down (lame duck mode); the client will move"
                    .to_string(),
            )),
            LinkEvent::SlowConsumer(sid) => Some((
                LogLevel::Warn,
                format!("nats: subscription {sid} fell behind: messages were dropped"),
            )),
            LinkEvent::Closed => {
                self.down = true;
                Some((
                    LogLevel::Warn,
                    "nats: connection closed for good".to_string(),
                ))
            }
        }
    }
}

/// Why the service is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// The bucket is being ensured.
    Starting,
    /// The server cannot expire keys: every call is answered `unsupported`.
    Unsupported,
    /// A connection to NATS is lost (the client is reconnecting).
    Disconnected,
    /// The last look at the leases stream got no answer or an error.
    BucketUnreachable(String),
    /// The service refuses to serve its bucket (its sequence went back).
    BucketRefused(String),
    /// The service is stopping.
    Stopping,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Starting => write!(f, "starting: the leases bucket is being ensured"),
            Self::Unsupported => write!(
                f,
                "unsupported: the server has no per-message TTL (nats-server 2.11+ needed)"
            ),
            Self::Disconnected => write!(f, "disconnected from NATS: reconnecting"),
            Self::BucketUnreachable(why) => write!(f, "leases bucket unreachable: {why}"),
            Self::BucketRefused(why) => write!(f, "refused: {why}"),
            Self::Stopping => write!(f, "stopping"),
        }
    }
}

/// The service's answer to a readiness probe, and its connection state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// `Ok` when ready to serve, else why not.
    pub ready: Result<(), NotReady>,
    /// Whether every connection of the service is up.
    pub connected: bool,
}

/// Whether a service is ready, from what it knows: its mode's being serving
/// (`serving`; else `not_serving` says why), its connections, the bucket's last
/// answer, a refusal and a stop. The first reason in that order of gravity wins.
pub fn readiness(
    not_serving: Option<NotReady>,
    connected: bool,
    bucket: Result<(), String>,
    refused: Option<&str>,
    stopping: bool,
) -> Result<(), NotReady> {
    if stopping {
        return Err(NotReady::Stopping);
    }
    if let Some(why) = refused {
        return Err(NotReady::BucketRefused(why.to_string()));
    }
    if !connected {
        return Err(NotReady::Disconnected);
    }
    if let Some(why) = not_serving {
        return Err(why);
    }
    bucket.map_err(NotReady::BucketUnreachable)
}

/// How loud a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Worth knowing.
    Info,
    /// Something is off.
    Warn,
    /// Detail.
    Debug,
    /// Something is wrong and needs an operator.
    Error,
}
