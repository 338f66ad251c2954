//! Which input the service takes first when several arrived at once, and when
//! its start has settled: the adapter hands over what it received together
//! ([`Arrivals`]) and the machine orders it, so no adapter decides whether a
//! renew takes the known path.
//!
//! The rule: change events before requests. A change event the connection
//! delivered before a request is learnt before that request's call starts, so
//! a renew or release of the revision it names is one write and no read
//! ([`crate::known`]).

use std::time::Instant;

use time::OffsetDateTime;

use super::{Received, Service};
use crate::io::Mode;

/// What an adapter received at once: the change events already delivered and
/// at most one request (or verb). Either may be empty.
#[derive(Debug, Clone, Default)]
pub struct Arrivals {
    /// Change events (`dagnats.lease.changed.*`), in the order delivered.
    pub changes: Vec<Received>,
    /// A request to an endpoint or a verb.
    pub request: Option<Received>,
}

impl Arrivals {
    /// Change events alone.
    pub fn changes(changes: Vec<Received>) -> Self {
        Self {
            changes,
            request: None,
        }
    }

    /// A request and the change events delivered with it.
    pub fn request(request: Received, changes: Vec<Received>) -> Self {
        Self {
            changes,
            request: Some(request),
        }
    }
}

impl Service {
    /// Takes `arrivals` in the intake order: every change event, then the
    /// request.
    pub fn handle_arrivals(&mut self, now: Instant, wall: OffsetDateTime, arrivals: Arrivals) {
        for change in arrivals.changes {
            self.handle_request(now, wall, change);
        }
        if let Some(request) = arrivals.request {
            self.handle_request(now, wall, request);
        }
    }

    /// Whether the adapter keeps driving the machine before it hands out the
    /// service's handle: until startup settles on a mode ([`Mode::Ready`] or
    /// [`Mode::Unsupported`]), which the handle then reports.
    pub fn is_starting(&self) -> bool {
        self.mode() == Mode::Starting
    }
}
