//! The holder library: leader election, shard ownership and the owner's inbox, built
//! on the core's [`Holder`], [`InboxGuard`] machines.
//!
//! A [`Member`] is one process among the replicas of a service: one holder ID, one
//! inbox. From it:
//!
//! - [`Member::elect`] campaigns for one key and reports [`Ownership`] changes
//!   ([`Elector`]);
//! - [`Member::shards`] holds up to N keys of a set, one lease each ([`Shards`]);
//! - [`Member::inbox`] receives requests forwarded to this process as owner, with the
//!   contract's reject rules already applied ([`Inbox`]).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use dagnats_leases_tokio::member::{Member, Ownership};
//!
//! let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let member = Member::new(nats, "notify-7f3a")?;
//! let mut elector = member.elect("notify-leader", Duration::from_secs(15))?;
//! while let Some(change) = elector.next().await {
//!     match change.ownership {
//!         Ownership::Elected { fence } => println!("leading, fence every write with {fence}"),
//!         Ownership::SteppedDown { reason } => println!("stopped leading: {reason}"),
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::{Client, HeaderMap, Subscriber};
use dagnats_leases_core::guard::{InboxGuard, RejectReason};
use dagnats_leases_core::holder::{
    Holder, HolderConfig, HolderEvent, HolderRequest, HolderStatus, RequestId, StepDownReason,
};
use dagnats_leases_core::record::{HDR_FENCE, HDR_LEASE_EVENT, changed_subject, inbox_wildcard};
use dagnats_leases_core::wire::{self, Endpoint, ErrorKind};
use dagnats_leases_core::{NatsRequest, RequestOutcome};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, SelectAll};
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::{LeaseError, LeaseErrorKind};
use crate::exec;

/// Runs a background future: `tokio::spawn` by default; the smol adapter passes its
/// own.
pub type Spawner = Arc<dyn Fn(BoxFuture<'static, ()>) + Send + Sync>;

/// Sees what a member's campaigns do, as their driver does it: every request with
/// its outcome, and every event of a key's holder machine. For metrics, tracing, or
/// a test's history (the fault suite records the library's own view through it).
/// Called on the driver's task: keep it quick.
pub trait CampaignObserver: Send + Sync {
    /// A request for `key` (`endpoint`, `body`) was sent at `sent` and came back
    /// with `outcome` at `answered`.
    fn request(
        &self,
        _key: &str,
        _endpoint: Endpoint,
        _body: &[u8],
        _sent: Instant,
        _outcome: &RequestOutcome,
        _answered: Instant,
    ) {
    }

    /// The holder of `key` reported `event` at `at`.
    fn event(&self, _key: &str, _event: &HolderEvent, _at: Instant) {}
}

type Observer = Option<Arc<dyn CampaignObserver>>;

/// One process among the replicas: a NATS connection and a unique holder ID.
#[derive(Clone)]
pub struct Member {
    nats: Client,
    holder: String,
    guard: Arc<Mutex<InboxGuard>>,
    /// Keys some campaign of this member runs for: one holder ID may campaign for a
    /// key only once, or two campaigns would both believe they own it.
    keys: Arc<Mutex<BTreeSet<String>>>,
    spawn: Spawner,
    observer: Observer,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

/// A change of ownership of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// This process owns the key: fence every downstream write with `fence`.
    Elected {
        /// The revision that began the tenure.
        fence: u64,
    },
    /// Stop acting as owner of the key now.
    SteppedDown {
        /// Why.
        reason: StepDownReason,
    },
}

/// An [`Ownership`] change and the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The lease key.
    pub key: String,
    /// What changed.
    pub ownership: Ownership,
}

/// What a running campaign knows of a key it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenure {
    /// The revision that began the tenure.
    pub tenure: u64,
    /// The latest fence.
    pub fence: u64,
    /// The local deadline: past it, this process is no longer owner.
    pub deadline: Instant,
}

type Held = BTreeMap<String, Tenure>;

impl Member {
    /// A member with holder ID `holder` (`[A-Za-z0-9_-]{1,128}`, unique per process),
    /// running its background work on tokio.
    pub fn new(nats: Client, holder: impl Into<String>) -> Result<Member, LeaseError> {
        let spawn: Spawner = Arc::new(|f| {
            tokio::spawn(f);
        });
        Member::with_spawner(nats, holder, spawn)
    }

    /// A member whose background work runs through `spawn`.
    pub fn with_spawner(
        nats: Client,
        holder: impl Into<String>,
        spawn: Spawner,
    ) -> Result<Member, LeaseError> {
        let holder = holder.into();
        wire::check_name("holder", &holder)?;
        Ok(Member {
            guard: Arc::new(Mutex::new(InboxGuard::new(&holder))),
            keys: Arc::default(),
            nats,
            holder,
            spawn,
            observer: None,
        })
    }

    /// The same member, its campaigns started from now on reporting to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn CampaignObserver>) -> Member {
        self.observer = Some(observer);
        self
    }

    /// A holder ID unique to this process: `prefix` and random hex.
    pub fn unique_id(prefix: &str) -> String {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        format!("{prefix}-{:012x}", h.finish() & 0xffff_ffff_ffff)
    }

    /// This member's holder ID.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Campaigns for `key` until stopped; ownership changes arrive on the [`Elector`].
    pub fn elect(&self, key: &str, ttl: Duration) -> Result<Elector, LeaseError> {
        let config = HolderConfig::new(key, self.holder.clone(), ttl);
        self.elect_with(config)
    }

    /// [`Member::elect`] with every holder setting spelled out (its `holder` is
    /// replaced by this member's).
    pub fn elect_with(&self, mut config: HolderConfig) -> Result<Elector, LeaseError> {
        config.holder = self.holder.clone();
        let key = config.key.clone();
        Ok(Elector {
            key,
            campaign: self.campaign(vec![config], 1)?,
        })
    }

    /// Holds up to `max_held` of `keys`, one lease of `ttl` each, campaigning for the
    /// others while it holds fewer. Give every replica `ceil(keys / replicas)` to
    /// spread the shards.
    pub fn shards(
        &self,
        keys: &[&str],
        max_held: usize,
        ttl: Duration,
    ) -> Result<Shards, LeaseError> {
        let configs = keys
            .iter()
            .map(|k| HolderConfig::new(*k, self.holder.clone(), ttl))
            .collect();
        Ok(Shards {
            campaign: self.campaign(configs, max_held)?,
        })
    }

    fn campaign(
        &self,
        configs: Vec<HolderConfig>,
        max_held: usize,
    ) -> Result<Campaign, LeaseError> {
        for c in &configs {
            c.validate()?;
        }
        {
            let mut keys = self.keys.lock().expect("member keys lock");
            let mut seen = BTreeSet::new();
            if let Some(dup) = configs
                .iter()
                .find(|c| keys.contains(&c.key) || !seen.insert(c.key.clone()))
            {
                return Err(LeaseError::new(
                    LeaseErrorKind::Refused(ErrorKind::Invalid),
                    format!(
                        "key {:?} already has a campaign of holder {:?}: one holder ID \
                         campaigns for a key once",
                        dup.key, self.holder
                    ),
                ));
            }
            keys.extend(configs.iter().map(|c| c.key.clone()));
        }
        let member_keys = self.keys.clone();
        let (changes_tx, changes) = mpsc::unbounded_channel();
        let (held_tx, held) = watch::channel(Held::new());
        let (stop_tx, stop_rx) = oneshot::channel();
        let (done_tx, done) = oneshot::channel();
        let driver = Driver {
            nats: self.nats.clone(),
            guard: self.guard.clone(),
            configs,
            max_held: max_held.max(1),
            holders: BTreeMap::new(),
            failed: BTreeSet::new(),
            deferred: VecDeque::new(),
            gated_in_flight: 0,
            changes: changes_tx,
            held: held_tx,
            observer: self.observer.clone(),
        };
        (self.spawn)(
            async move {
                let keys: Vec<String> = driver.configs.iter().map(|c| c.key.clone()).collect();
                driver.run(stop_rx).await;
                let mut member = member_keys.lock().expect("member keys lock");
                for key in keys {
                    member.remove(&key);
                }
                drop(member);
                let _ = done_tx.send(());
            }
            .boxed(),
        );
        Ok(Campaign {
            changes,
            held,
            stop: Some(stop_tx),
            done: Some(done),
        })
    }

    /// Subscribes to this member's inbox, `dagnats.lease.inbox.<holder>.>` (a plain
    /// subscription, no queue group). Requests for keys this member does not own, or
    /// with a missing, malformed or stale fence, are rejected with
    /// `Dagnats-Lease-Reject: stale` before they reach [`Inbox::next`].
    pub async fn inbox(&self) -> Result<Inbox, crate::Error> {
        let subscriber = self
            .nats
            .subscribe(inbox_wildcard(&self.holder))
            .await
            .map_err(|e| crate::Error::new(crate::ErrorKind::Nats, e))?;
        self.nats
            .flush()
            .await
            .map_err(|e| crate::Error::new(crate::ErrorKind::Nats, e))?;
        Ok(Inbox {
            nats: self.nats.clone(),
            guard: self.guard.clone(),
            subscriber,
            rejected: 0,
        })
    }
}

/// The background work of an [`Elector`] or [`Shards`], and its channels.
#[derive(Debug)]
struct Campaign {
    changes: mpsc::UnboundedReceiver<Change>,
    held: watch::Receiver<Held>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<()>>,
}

impl Campaign {
    fn current(&self, key: &str) -> Option<Tenure> {
        self.held
            .borrow()
            .get(key)
            .copied()
            .filter(|t| Instant::now() < t.deadline)
    }

    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
    }
}

impl Drop for Campaign {
    fn drop(&mut self) {
        // Dropping without stop(): the driver steps down and releases in the background.
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Campaigns for one key. Stop it with [`Elector::stop`] (steps down and releases);
/// dropping it does the same in the background.
#[derive(Debug)]
pub struct Elector {
    key: String,
    campaign: Campaign,
}

impl Elector {
    /// The next ownership change; `None` once the elector has stopped.
    pub async fn next(&mut self) -> Option<Change> {
        self.campaign.changes.recv().await
    }

    /// The current tenure, if this process owns the key right now (its local deadline
    /// has not passed).
    pub fn tenure(&self) -> Option<Tenure> {
        self.campaign.current(&self.key)
    }

    /// Whether this process owns the key right now.
    pub fn is_leader(&self) -> bool {
        self.tenure().is_some()
    }

    /// The key campaigned for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Steps down (if leading), releases the lease, and waits for the release.
    pub async fn stop(mut self) {
        self.campaign.stop().await;
    }
}

/// Holds up to N of a set of shard keys. Stop it with [`Shards::stop`].
///
/// ```no_run
/// # async fn run(member: dagnats_leases_tokio::member::Member) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// // Three replicas, six shards: each holds at most two.
/// let keys = ["shard-0", "shard-1", "shard-2", "shard-3", "shard-4", "shard-5"];
/// let mut shards = member.shards(&keys, 2, Duration::from_secs(15))?;
/// while let Some(change) = shards.next().await {
///     println!("{}: {:?}; now holding {:?}", change.key, change.ownership, shards.held().keys());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Shards {
    campaign: Campaign,
}

impl Shards {
    /// The next ownership change of any shard; `None` once stopped.
    pub async fn next(&mut self) -> Option<Change> {
        self.campaign.changes.recv().await
    }

    /// The shards this process owns right now, with their tenures.
    pub fn held(&self) -> BTreeMap<String, Tenure> {
        let now = Instant::now();
        self.campaign
            .held
            .borrow()
            .iter()
            .filter(|(_, t)| now < t.deadline)
            .map(|(k, t)| (k.clone(), *t))
            .collect()
    }

    /// The tenure of one shard, if owned right now.
    pub fn tenure(&self, key: &str) -> Option<Tenure> {
        self.campaign.current(key)
    }

    /// Steps down from every shard, releases them, and waits for the releases.
    pub async fn stop(mut self) {
        self.campaign.stop().await;
    }
}

/// A request's outcome, for `key`'s holder; `gated` when it was a campaign acquire
/// counted against `max_held`.
struct Answer {
    key: String,
    id: RequestId,
    outcome: RequestOutcome,
    gated: bool,
}

type Pending = FuturesUnordered<BoxFuture<'static, Answer>>;
type ChangeFeed = SelectAll<Pin<Box<dyn futures::Stream<Item = String> + Send>>>;

/// Runs the holder machines of one campaign: the one driver loop of the library.
struct Driver {
    nats: Client,
    guard: Arc<Mutex<InboxGuard>>,
    configs: Vec<HolderConfig>,
    max_held: usize,
    holders: BTreeMap<String, Holder>,
    /// Keys the service refused for good (`invalid`, `unsupported`): not retried.
    failed: BTreeSet<String>,
    /// Campaign acquires waiting for room: at most `max_held` less what is held (or
    /// being confirmed) go out at once, so a member never wins more than it may
    /// keep, and the keys take turns.
    deferred: VecDeque<(String, HolderRequest)>,
    gated_in_flight: usize,
    changes: mpsc::UnboundedSender<Change>,
    held: watch::Sender<Held>,
    observer: Observer,
}

impl Driver {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        let mut pending = Pending::new();
        let mut feed = self.subscribe_changes().await;
        let mut stopping = false;
        let now = Instant::now();
        self.rebalance(now);
        loop {
            // Drain and pump until no deferred request was answered on the spot.
            self.drain(&mut pending);
            while self.pump(&mut pending) {
                self.drain(&mut pending);
            }
            let finished = self.holders.values().all(Holder::is_done)
                && pending.is_empty()
                && self.deferred.is_empty();
            if finished && (stopping || self.failed.len() == self.configs.len()) {
                break;
            }
            let wake = self.holders.values().filter_map(Holder::poll_timeout).min();
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => futures::future::pending().await,
                }
            };
            tokio::select! {
                Some(answer) = pending.next(), if !pending.is_empty() => {
                    if answer.gated {
                        self.gated_in_flight -= 1;
                    }
                    if let Some(h) = self.holders.get_mut(&answer.key) {
                        h.handle_outcome(Instant::now(), answer.id, answer.outcome);
                    }
                }
                Some(key) = feed.next(), if !stopping => {
                    if let Some(h) = self.holders.get_mut(&key) {
                        h.handle_changed(Instant::now());
                    }
                }
                _ = sleep => {
                    let now = Instant::now();
                    for h in self.holders.values_mut() {
                        h.handle_timeout(now);
                    }
                }
                _ = &mut stop, if !stopping => {
                    stopping = true;
                    let now = Instant::now();
                    for h in self.holders.values_mut() {
                        h.stop(now);
                    }
                }
            }
            if !stopping {
                self.rebalance(Instant::now());
            }
        }
        self.held.send_replace(Held::new());
    }

    /// One change-event subscription per key; a failed subscribe only loses the
    /// early wake-up, never correctness.
    async fn subscribe_changes(&self) -> ChangeFeed {
        let mut feed = SelectAll::new();
        for c in &self.configs {
            if let Ok(sub) = self.nats.subscribe(changed_subject(&c.key)).await {
                let key = c.key.clone();
                // Only a change that can free the key: a release, or the server's
                // expiry marker (no event header). Renewals say nothing new.
                let stream: Pin<Box<dyn futures::Stream<Item = String> + Send>> =
                    Box::pin(sub.filter_map(move |m| {
                        let event = m
                            .headers
                            .as_ref()
                            .and_then(|h| h.get(HDR_LEASE_EVENT))
                            .map(|v| v.as_str().to_string());
                        let frees = matches!(event.as_deref(), None | Some("released"));
                        futures::future::ready(frees.then(|| key.clone()))
                    }));
                feed.push(stream);
            }
        }
        feed
    }

    /// Keys held now or being confirmed: what counts against `max_held`.
    fn holding(&self, now: Instant) -> Vec<(u64, String)> {
        self.holders
            .iter()
            .filter_map(|(k, h)| match h.ownership(now) {
                Some(own) => Some((own.tenure, k.clone())),
                None if h.status() == HolderStatus::Confirming => Some((u64::MAX, k.clone())),
                None => None,
            })
            .collect()
    }

    /// Campaigns for keys while fewer than `max_held` are held; at `max_held` stops
    /// campaigning for the rest, and should more be held, releases the newest.
    fn rebalance(&mut self, now: Instant) {
        let mut holding = self.holding(now);
        // Finished holders (stopped for rebalancing, or refused for good) go away.
        self.holders.retain(|_, h| !h.is_done());
        if holding.len() >= self.max_held {
            holding.sort();
            let keep: BTreeSet<String> = holding
                .into_iter()
                .take(self.max_held)
                .map(|(_, k)| k)
                .collect();
            for (key, h) in self.holders.iter_mut() {
                if !keep.contains(key) {
                    h.stop(now);
                }
            }
            return;
        }
        for config in &self.configs {
            if !self.holders.contains_key(&config.key)
                && !self.failed.contains(&config.key)
                && let Ok(h) = Holder::new(config.clone(), now)
            {
                self.holders.insert(config.key.clone(), h);
            }
        }
    }

    /// Sends deferred campaign acquires while there is room under `max_held`. One
    /// whose holder no longer waits for it (stopping) is answered "no responders"
    /// on the spot: it was never sent, so it wrote nothing.
    /// Returns whether it answered any here (its machine may want to send again).
    fn pump(&mut self, pending: &mut Pending) -> bool {
        let now = Instant::now();
        let room = self.max_held.saturating_sub(self.holding(now).len());
        let mut kept = VecDeque::new();
        let mut answered_here = false;
        while let Some((key, request)) = self.deferred.pop_front() {
            let status = self.holders.get(&key).map(Holder::status);
            if status != Some(HolderStatus::Campaigning) {
                if let Some(h) = self.holders.get_mut(&key) {
                    h.handle_outcome(now, request.id, RequestOutcome::NoResponders);
                    answered_here = true;
                }
                continue;
            }
            if self.gated_in_flight < room {
                self.gated_in_flight += 1;
                pending.push(send(&self.nats, &self.observer, key, request, true));
            } else {
                kept.push_back((key, request));
            }
        }
        self.deferred = kept;
        answered_here
    }

    /// Sends what the machines want and passes their events on.
    fn drain(&mut self, pending: &mut Pending) {
        for (key, holder) in self.holders.iter_mut() {
            while let Some(request) = holder.poll_request() {
                let campaign = request.endpoint == Endpoint::Acquire
                    && holder.status() == HolderStatus::Campaigning;
                if campaign {
                    self.deferred.push_back((key.clone(), request));
                } else {
                    pending.push(send(
                        &self.nats,
                        &self.observer,
                        key.clone(),
                        request,
                        false,
                    ));
                }
            }
            while let Some(event) = holder.poll_event() {
                if let Some(o) = &self.observer {
                    o.event(key, &event, Instant::now());
                }
                self.guard
                    .lock()
                    .expect("inbox guard lock")
                    .observe(key, &event);
                let ownership = match &event {
                    HolderEvent::Elected { fence, deadline } => {
                        self.held.send_modify(|h| {
                            h.insert(
                                key.clone(),
                                Tenure {
                                    tenure: *fence,
                                    fence: *fence,
                                    deadline: *deadline,
                                },
                            );
                        });
                        Some(Ownership::Elected { fence: *fence })
                    }
                    HolderEvent::Renewed {
                        tenure,
                        fence,
                        deadline,
                    } => {
                        self.held.send_modify(|h| {
                            h.insert(
                                key.clone(),
                                Tenure {
                                    tenure: *tenure,
                                    fence: *fence,
                                    deadline: *deadline,
                                },
                            );
                        });
                        None
                    }
                    HolderEvent::SteppedDown { reason } => {
                        self.held.send_modify(|h| {
                            h.remove(key);
                        });
                        Some(Ownership::SteppedDown { reason: *reason })
                    }
                    HolderEvent::Failed { kind, message } => {
                        tracing::error!(key, %kind, message, "the lease service refused this holder");
                        self.failed.insert(key.clone());
                        None
                    }
                };
                if let Some(ownership) = ownership {
                    let _ = self.changes.send(Change {
                        key: key.clone(),
                        ownership,
                    });
                }
            }
        }
    }
}

fn send(
    nats: &Client,
    observer: &Observer,
    key: String,
    request: HolderRequest,
    gated: bool,
) -> BoxFuture<'static, Answer> {
    let nats = nats.clone();
    let observer = observer.clone();
    async move {
        let endpoint = request.endpoint;
        let body = observer.as_ref().map(|_| request.body.clone());
        let sent = Instant::now();
        let outcome = exec::send(
            &nats,
            NatsRequest {
                subject: endpoint.subject(),
                headers: Vec::new(),
                payload: request.body,
                timeout: request.timeout,
            },
        )
        .await;
        if let (Some(o), Some(body)) = (&observer, &body) {
            o.request(&key, endpoint, body, sent, &outcome, Instant::now());
        }
        Answer {
            key,
            id: request.id,
            outcome,
            gated,
        }
    }
    .boxed()
}

/// Requests forwarded to this member as owner (see [`Member::inbox`]).
///
/// ```no_run
/// # async fn run(member: dagnats_leases_tokio::member::Member) -> Result<(), Box<dyn std::error::Error>> {
/// let mut inbox = member.inbox().await?;
/// while let Some(request) = inbox.next().await {
///     // Only requests for keys this member owns, with a fence of its tenure, get here.
///     let answer = format!("handled under fence {}", request.fence);
///     request.respond(answer).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Inbox {
    nats: Client,
    guard: Arc<Mutex<InboxGuard>>,
    subscriber: Subscriber,
    rejected: u64,
}

/// One forwarded request this member accepted as owner: answer it with
/// [`ForwardedRequest::respond`].
#[derive(Debug)]
pub struct ForwardedRequest {
    /// The key it was forwarded for.
    pub key: String,
    /// The fence the service sent: fence the writes this request makes with it.
    pub fence: u64,
    /// The request body.
    pub payload: Vec<u8>,
    reply: Option<async_nats::Subject>,
    nats: Client,
}

impl ForwardedRequest {
    /// Sends `body` back as the owner's reply.
    pub async fn respond(self, body: impl Into<bytes::Bytes>) -> Result<(), crate::Error> {
        if let Some(reply) = self.reply {
            self.nats
                .publish(reply, body.into())
                .await
                .map_err(|e| crate::Error::new(crate::ErrorKind::Nats, e))?;
        }
        Ok(())
    }
}

impl Inbox {
    /// The next request this member should process as owner; rejected ones are
    /// answered here and skipped. `None` when the subscription ends.
    pub async fn next(&mut self) -> Option<ForwardedRequest> {
        loop {
            let message = self.subscriber.next().await?;
            let fence = message
                .headers
                .as_ref()
                .and_then(|h| h.get(HDR_FENCE))
                .map(|v| v.as_str().to_string());
            let verdict = self.guard.lock().expect("inbox guard lock").check(
                Instant::now(),
                message.subject.as_str(),
                fence.as_deref(),
            );
            match verdict {
                Ok(accepted) => {
                    return Some(ForwardedRequest {
                        key: accepted.key,
                        fence: accepted.fence,
                        payload: message.payload.to_vec(),
                        reply: message.reply,
                        nats: self.nats.clone(),
                    });
                }
                Err(reason) => {
                    self.rejected += 1;
                    tracing::debug!(subject = %message.subject, %reason, "forward rejected");
                    self.reject(message.reply).await;
                }
            }
        }
    }

    async fn reject(&self, reply: Option<async_nats::Subject>) {
        let Some(reply) = reply else { return };
        let (name, value) = RejectReason::reply_header();
        let mut headers = HeaderMap::new();
        headers.insert(name, value);
        let _ = self
            .nats
            .publish_with_headers(reply, headers, bytes::Bytes::new())
            .await;
    }

    /// How many forwarded requests were rejected so far.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }
}
