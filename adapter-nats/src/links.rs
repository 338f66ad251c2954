//! How a process's NATS connections report their ups and downs: one log line as
//! the core's connection log says, and a count of those down for readiness. Used
//! by every connection the service makes (the strict serving one too), so it is
//! compiled without the `cli` feature.

use std::sync::Arc;

use dagnats_leases_core::health::LogLevel;
use dagnats_leases_core::health::{ConnectionLog, LinkEvent};
use tokio::sync::watch;

/// How many of a process's NATS connections are down now: each connection made
/// with it counts itself down on a lost connection and up again when it is
/// back. The service's readiness reads it ([`crate::service::ServiceOptions`]).
#[derive(Debug, Clone)]
pub struct LinksDown(Arc<watch::Sender<u32>>);

impl LinksDown {
    /// None down yet.
    pub fn new() -> Self {
        Self(Arc::new(watch::channel(0).0))
    }

    /// The count, changes notified.
    pub fn subscribe(&self) -> watch::Receiver<u32> {
        self.0.subscribe()
    }
}

impl Default for LinksDown {
    fn default() -> Self {
        Self::new()
    }
}

/// One connection's events, logged as the core's [`ConnectionLog`] says (one
/// warning per outage, not one per attempt) and counted in [`LinksDown`].
#[derive(Debug)]
pub(crate) struct LinkReporter {
    log: ConnectionLog,
    name: String,
    links: Option<LinksDown>,
}

impl LinkReporter {
    /// A connection that is up, named `name` in the log lines.
    pub(crate) fn new(name: String, links: Option<LinksDown>) -> Self {
        Self {
            log: ConnectionLog::new(),
            name,
            links,
        }
    }

    /// Logs `event` as the log says and moves the count when up or down changed.
    pub(crate) fn report(&mut self, event: LinkEvent) {
        let was = self.log.connected();
        let said = self.log.handle(event);
        let is = self.log.connected();
        if let Some(links) = &self.links
            && was != is
        {
            links.0.send_modify(|down| {
                *down = if is {
                    down.saturating_sub(1)
                } else {
                    *down + 1
                }
            });
        }
        let name = &self.name;
        if let Some((level, line)) = said {
            match level {
                LogLevel::Error => tracing::error!(connection = %name, "{line}"),
                LogLevel::Warn => tracing::warn!(connection = %name, "{line}"),
                LogLevel::Info => tracing::info!(connection = %name, "{line}"),
                LogLevel::Debug => tracing::debug!(connection = %name, "{line}"),
            }
        }
    }
}
