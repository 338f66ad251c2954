//! Admission: which requests the service starts at once, which wait for a call to
//! end, and which it refuses at once with `unavailable`.
//!
//! Requests past the bound used to wait in the subscription, unbounded: under a
//! load above what the server can write (`scripts/bench --scale 100000` on 2
//! cores), 61,685 requests piled up there, each answered long after its caller
//! gave up, while the renewals of the leases already held queued behind them and
//! every lease was lost. Now a request is read at once and:
//!
//! - starts while fewer than `max_in_flight` calls run;
//! - else waits, in arrival order, while fewer than `max_waiting` wait; a call that
//!   takes a key or only reads (acquire, owner, forward) waits only while fewer than
//!   half of `max_waiting` wait, so the other half stays for renew and release,
//!   which keep the leases already held;
//! - else is refused at once: `unavailable`, which callers retry with backoff (the
//!   holder library's campaign doubles its wait; an owner renews again at its retry
//!   interval).
//!
//! The machine holds the waiting requests themselves (any `T`: the adapter's
//! request handle), so the adapter only starts, answers and counts calls ending.

use crate::io::Transmit;
use std::collections::VecDeque;
use std::time::Instant;

use crate::wire::{Endpoint, ErrorKind, ErrorReply, Response};

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit<T> {
    /// Start its call now; feed [`Admission::handle_finished`] when it ends.
    Start(Endpoint, T),
    /// Answer it with this reply now; no call runs for it.
    Refuse(Endpoint, T, Response),
}

/// The admission machine. See the [module docs](self).
#[derive(Debug)]
pub struct Admission<T> {
    max_in_flight: usize,
    max_waiting: usize,
    in_flight: usize,
    waiting: VecDeque<(Endpoint, T)>,
    out: VecDeque<Admit<T>>,
    refused: u64,
}

impl<T> Admission<T> {
    /// At most `max_in_flight` calls at once (at least 1) and `max_waiting`
    /// requests waiting.
    pub fn new(max_in_flight: usize, max_waiting: usize, _now: Instant) -> Self {
        Self {
            max_in_flight: max_in_flight.max(1),
            max_waiting,
            in_flight: 0,
            waiting: VecDeque::new(),
            out: VecDeque::new(),
            refused: 0,
        }
    }

    /// A request for `endpoint` arrived.
    pub fn handle_request(&mut self, _now: Instant, endpoint: Endpoint, request: T) {
        if self.in_flight < self.max_in_flight {
            self.in_flight += 1;
            self.out.push_back(Admit::Start(endpoint, request));
            return;
        }
        let keeps_a_lease = matches!(endpoint, Endpoint::Renew | Endpoint::Release);
        let room = if keeps_a_lease {
            self.max_waiting
        } else {
            self.max_waiting / 2
        };
        if self.waiting.len() < room {
            self.waiting.push_back((endpoint, request));
            return;
        }
        self.refused += 1;
        let reply = ErrorReply::new(
            ErrorKind::Unavailable,
            format!(
                "the service is at its bound ({} calls running, {} waiting): retry with backoff",
                self.in_flight,
                self.waiting.len()
            ),
        );
        self.out
            .push_back(Admit::Refuse(endpoint, request, Response::Error(reply)));
    }

    /// A started call ended: the first waiting request starts.
    pub fn handle_finished(&mut self, _now: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.start_waiting();
    }

    /// The service stops: every waiting request starts now (shutdown answers each
    /// one, or cuts it off at its bound), and the bound is lifted.
    pub fn handle_stop(&mut self, _now: Instant) {
        self.max_in_flight = usize::MAX;
        self.start_waiting();
    }

    /// What to do next; drain after every input.
    pub fn poll_event(&mut self) -> Option<Admit<T>> {
        self.out.pop_front()
    }

    /// Never: this machine sends nothing (here for the crate's vocabulary: every
    /// machine drains the same four outputs).
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        None
    }

    /// Never: admission keeps no deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    /// Nothing to act on at a timeout; here for the crate's vocabulary.
    pub fn handle_timeout(&mut self, _now: Instant) {}

    /// No call running, none waiting, nothing to poll.
    pub fn is_done(&self) -> bool {
        self.in_flight == 0 && self.waiting.is_empty() && self.out.is_empty()
    }

    /// Calls running, requests waiting, and requests refused so far.
    pub fn counts(&self) -> (usize, usize, u64) {
        (self.in_flight, self.waiting.len(), self.refused)
    }

    fn start_waiting(&mut self) {
        while self.in_flight < self.max_in_flight {
            let Some((endpoint, request)) = self.waiting.pop_front() else {
                return;
            };
            self.in_flight += 1;
            self.out.push_back(Admit::Start(endpoint, request));
        }
    }
}
