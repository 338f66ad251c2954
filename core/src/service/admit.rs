//! Admission: which requests the service starts at once, which wait for a call to
//! end, and which it answers `unavailable` at once (overloaded).
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
//! - else is answered `unavailable` at once (overloaded), which callers retry with backoff (the
//!   holder library's campaign doubles its wait; an owner renews again at its retry
//!   interval).
//!
//! With tenants each account may also run at most a share of the calls at once
//! ([`Admission::with_tenant_share`], half of them in the service): one tenant's
//! slow calls (forwards to an owner that never answers, 30 s each) cannot hold
//! every slot while another tenant's renewals wait.
//!
//! With tenants (`serve --tenancy accounts`) each account waits in a queue of its
//! own and calls start from the queues in turn, so one tenant's flood waits behind
//! another's renewals no longer than one call each; and when the room is full, a
//! request of a tenant with fewer waiting takes the place of the last request of
//! the tenant with the most (which is answered `unavailable`), so a flood cannot
//! keep another tenant out of the room either.
//!
//! The machine holds the waiting requests themselves (any `T`: the adapter's
//! request handle), so the adapter only starts, answers and counts calls ending.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::wire::{Endpoint, ErrorKind, ErrorReply, Response};

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmissionEvent<T> {
    /// Start its call now; feed [`Admission::handle_finished`] when it ends.
    Start(Endpoint, T),
    /// Answer it with this reply now; no call runs for it.
    Overloaded(Endpoint, T, Response),
}

/// What [`Admission::counts`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionCounts {
    /// Calls running.
    pub running: usize,
    /// Requests waiting for a call to end.
    pub waiting: usize,
    /// Requests answered `unavailable` at once at the bound so far.
    pub overloaded: u64,
}

/// The admission machine. See the [module docs](self).
#[derive(Debug)]
pub struct Admission<T> {
    max_in_flight: usize,
    max_waiting: usize,
    in_flight: usize,
    /// The most calls one tenant runs at once.
    tenant_share: usize,
    /// Calls running, by tenant.
    running: BTreeMap<Option<String>, usize>,
    /// One queue per tenant (`None`: the one shared namespace).
    queues: BTreeMap<Option<String>, VecDeque<(Endpoint, T)>>,
    /// The tenants with a request waiting, in the order they start one.
    turns: VecDeque<Option<String>>,
    waiting: usize,
    out: VecDeque<AdmissionEvent<T>>,
    overloaded: u64,
}

impl<T> Admission<T> {
    /// At most `max_in_flight` calls at once (at least 1) and `max_waiting`
    /// requests waiting.
    pub fn new(max_in_flight: usize, max_waiting: usize, _now: Instant) -> Self {
        Self {
            max_in_flight: max_in_flight.max(1),
            max_waiting,
            in_flight: 0,
            tenant_share: usize::MAX,
            running: BTreeMap::new(),
            queues: BTreeMap::new(),
            turns: VecDeque::new(),
            waiting: 0,
            out: VecDeque::new(),
            overloaded: 0,
        }
    }

    /// Each tenant runs at most `share` calls at once (at least 1); the others of
    /// a tenant at its share wait in its queue.
    pub fn with_tenant_share(mut self, share: usize) -> Self {
        self.tenant_share = share.max(1);
        self
    }

    fn runs(&self, tenant: &Option<String>) -> usize {
        self.running.get(tenant).copied().unwrap_or(0)
    }

    fn start(&mut self, tenant: Option<String>, endpoint: Endpoint, request: T) {
        self.in_flight += 1;
        *self.running.entry(tenant).or_default() += 1;
        self.out.push_back(AdmissionEvent::Start(endpoint, request));
    }

    /// A request for `endpoint` arrived.
    pub fn handle_request(&mut self, now: Instant, endpoint: Endpoint, request: T) {
        self.handle_request_of(now, None, endpoint, request);
    }

    /// A request for `endpoint` of `tenant` arrived (`None`: no tenancy).
    pub fn handle_request_of(
        &mut self,
        _now: Instant,
        tenant: Option<String>,
        endpoint: Endpoint,
        request: T,
    ) {
        if self.in_flight < self.max_in_flight && self.runs(&tenant) < self.tenant_share {
            return self.start(tenant, endpoint, request);
        }
        let keeps_a_lease = matches!(endpoint, Endpoint::Renew | Endpoint::Release);
        let room = if keeps_a_lease {
            self.max_waiting
        } else {
            self.max_waiting / 2
        };
        if self.waiting < room {
            return self.enqueue(tenant, endpoint, request);
        }
        let own = self.queues.get(&tenant).map_or(0, VecDeque::len);
        let longest = self
            .queues
            .iter()
            .filter(|(t, q)| **t != tenant && q.len() > own + 1)
            .max_by_key(|(_, q)| q.len())
            .map(|(t, _)| t.clone());
        if let Some(victim) = longest {
            let queue = self.queues.get_mut(&victim).expect("found above");
            let (their_endpoint, theirs) = queue.pop_back().expect("longer than 1");
            self.waiting -= 1;
            self.answer_overloaded(their_endpoint, theirs);
            return self.enqueue(tenant, endpoint, request);
        }
        self.answer_overloaded(endpoint, request);
    }

    fn enqueue(&mut self, tenant: Option<String>, endpoint: Endpoint, request: T) {
        let queue = self.queues.entry(tenant.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(tenant);
        }
        queue.push_back((endpoint, request));
        self.waiting += 1;
    }

    fn answer_overloaded(&mut self, endpoint: Endpoint, request: T) {
        self.overloaded += 1;
        let reply = ErrorReply::new(
            ErrorKind::Unavailable,
            format!(
                "the service is at its bound ({} calls running, {} waiting): retry with backoff",
                self.in_flight, self.waiting
            ),
        );
        self.out.push_back(AdmissionEvent::Overloaded(
            endpoint,
            request,
            Response::Error(reply),
        ));
    }

    /// A started call ended: the first waiting request starts.
    pub fn handle_finished(&mut self, now: Instant) {
        self.handle_finished_of(now, None);
    }

    /// A started call of `tenant` ended.
    pub fn handle_finished_of(&mut self, _now: Instant, tenant: Option<String>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(n) = self.running.get_mut(&tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running.remove(&tenant);
            }
        }
        self.start_waiting();
    }

    /// The service stops: every waiting request starts now (shutdown answers each
    /// one, or cuts it off at its bound), and the bound is lifted.
    pub fn handle_stop(&mut self, _now: Instant) {
        self.max_in_flight = usize::MAX;
        self.tenant_share = usize::MAX;
        self.start_waiting();
    }

    /// What to do next; drain after every input.
    pub fn poll_event(&mut self) -> Option<AdmissionEvent<T>> {
        self.out.pop_front()
    }

    /// No call running, none waiting, nothing to poll.
    pub fn is_done(&self) -> bool {
        self.in_flight == 0 && self.waiting == 0 && self.out.is_empty()
    }

    /// Calls running, requests waiting, and requests answered at the bound so far.
    pub fn counts(&self) -> AdmissionCounts {
        AdmissionCounts {
            running: self.in_flight,
            waiting: self.waiting,
            overloaded: self.overloaded,
        }
    }

    fn start_waiting(&mut self) {
        // Tenants at their share pass their turn; a round with none able stops.
        let mut passed = 0;
        while self.in_flight < self.max_in_flight && passed < self.turns.len() {
            let Some(tenant) = self.turns.pop_front() else {
                return;
            };
            if self.runs(&tenant) >= self.tenant_share {
                self.turns.push_back(tenant);
                passed += 1;
                continue;
            }
            passed = 0;
            let queue = self
                .queues
                .get_mut(&tenant)
                .expect("a tenant in turn waits");
            let Some((endpoint, request)) = queue.pop_front() else {
                continue;
            };
            if queue.is_empty() {
                self.queues.remove(&tenant);
            } else {
                self.turns.push_back(tenant.clone());
            }
            self.waiting -= 1;
            self.start(tenant, endpoint, request);
        }
    }
}
