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
//! The renewals of one `renew_many` request arrive at once (up to 256) but are
//! single renew calls each ([`Admission::handle_item_of`]): each is admitted on its
//! own, so those that find the room full are answered `unavailable` one by one while
//! the others run, and those that wait, wait in a lane of their own beside the
//! lane of single calls: the two lanes take turns as calls end, so a request that
//! arrived after a group of renewals starts after one of them, not after all (with
//! tenants, each tenant has the two lanes, and the turns go round all of them).
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

/// Where a waiting request waits: its tenant, and whether it is an item of a
/// `renew_many` request (`true`) or a single call.
type Lane = (Option<String>, bool);

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
    /// One queue per lane: a tenant's (`None`: the one shared namespace) single
    /// calls, or the renewals of its `renew_many` requests.
    queues: BTreeMap<Lane, VecDeque<(Endpoint, T)>>,
    /// The lanes with a request waiting, in the order they start one.
    turns: VecDeque<Lane>,
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
        self.handle_tenant_request(now, None, endpoint, request);
    }

    /// A request for `endpoint` of `tenant` arrived (`None`: no tenancy).
    pub fn handle_tenant_request(
        &mut self,
        now: Instant,
        tenant: Option<String>,
        endpoint: Endpoint,
        request: T,
    ) {
        self.handle_in_lane(now, (tenant, false), endpoint, request);
    }

    /// One renewal of a `renew_many` request of `tenant` arrived: admitted as a
    /// single call would be, but if it waits, it waits in the tenant's lane of
    /// grouped renewals, which takes turns with its single calls.
    pub fn handle_item_of(
        &mut self,
        now: Instant,
        tenant: Option<String>,
        endpoint: Endpoint,
        request: T,
    ) {
        self.handle_in_lane(now, (tenant, true), endpoint, request);
    }

    fn handle_in_lane(&mut self, _now: Instant, lane: Lane, endpoint: Endpoint, request: T) {
        let tenant = lane.0.clone();
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
            return self.enqueue(lane, endpoint, request);
        }
        // The room is full: another tenant with more waiting gives up its last.
        let mut by_tenant: BTreeMap<&Option<String>, usize> = BTreeMap::new();
        for ((t, _), q) in &self.queues {
            *by_tenant.entry(t).or_default() += q.len();
        }
        let own = by_tenant.get(&tenant).copied().unwrap_or(0);
        let longest = by_tenant
            .into_iter()
            .filter(|(t, n)| **t != tenant && *n > own + 1)
            .max_by_key(|(_, n)| *n)
            .map(|(t, _)| t.clone());
        if let Some(victim) = longest {
            let victim_lane = self
                .queues
                .iter()
                .filter(|((t, _), _)| *t == victim)
                .max_by_key(|(_, q)| q.len())
                .map(|(l, _)| l.clone())
                .expect("a tenant with requests waiting");
            let queue = self.queues.get_mut(&victim_lane).expect("found above");
            let (their_endpoint, theirs) = queue.pop_back().expect("one waits");
            if queue.is_empty() {
                self.queues.remove(&victim_lane);
                self.turns.retain(|l| *l != victim_lane);
            }
            self.waiting -= 1;
            self.answer_overloaded(their_endpoint, theirs);
            return self.enqueue(lane, endpoint, request);
        }
        self.answer_overloaded(endpoint, request);
    }

    fn enqueue(&mut self, lane: Lane, endpoint: Endpoint, request: T) {
        let queue = self.queues.entry(lane.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(lane);
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
        self.handle_tenant_finished(now, None);
    }

    /// A started call of `tenant` ended.
    pub fn handle_tenant_finished(&mut self, _now: Instant, tenant: Option<String>) {
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
    pub fn is_idle(&self) -> bool {
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
        // Lanes of tenants at their share pass their turn; a round with none able
        // stops.
        let mut passed = 0;
        while self.in_flight < self.max_in_flight && passed < self.turns.len() {
            let Some(lane) = self.turns.pop_front() else {
                return;
            };
            if self.runs(&lane.0) >= self.tenant_share {
                self.turns.push_back(lane);
                passed += 1;
                continue;
            }
            passed = 0;
            let queue = self.queues.get_mut(&lane).expect("a lane in turn waits");
            let Some((endpoint, request)) = queue.pop_front() else {
                continue;
            };
            let tenant = lane.0.clone();
            if queue.is_empty() {
                self.queues.remove(&lane);
            } else {
                self.turns.push_back(lane);
            }
            self.waiting -= 1;
            self.start(tenant, endpoint, request);
        }
    }
}
