//! The holder library: leader election, shard ownership and the owner's inbox, run
//! by the core's [`Campaign`] machine.
//!
//! A [`Member`] is one process among the replicas of a service: one holder ID, one
//! inbox, one [`Campaign`] holding every key it campaigns for. From it:
//!
//! - [`Member::elect`] campaigns for one key and reports [`Ownership`] changes
//!   ([`Elector`]);
//! - [`Member::shards`] holds up to N keys of a set, one lease each ([`Shards`]);
//!   a shard the library gives up by itself (for balance) is revoked first:
//!   [`StepDownReason::Revoked`], then released on [`Shards::done`] or at the
//!   deadline it names;
//! - [`Member::inbox`] receives requests forwarded to this process as owner, with the
//!   contract's reject rules already applied ([`Inbox`]);
//! - every [`Elector`], [`Shards`] and [`Semaphore`] takes the application's
//!   health check ([`Health`]): a group unhealthy for `unhealthy_for` (its TTL by
//!   default) steps down ([`StepDownReason::Unhealthy`]) and releases, and sends no
//!   campaign acquire until it is healthy again.
//!
//! Every rule (when to renew, when to step down, the cap on shards, which forwarded
//! request to accept, what the metrics count) is the core's. This file holds the
//! [`Member`] and what its parts share; `handles.rs` the handles a campaign
//! returns ([`Elector`], [`Semaphore`], [`Shards`], [`Health`]); `driver.rs` is
//! the one task per member that sends the machine's requests, subscribes and
//! rejects as it says (in the background, dropped when the machine gives them
//! up), feeds back their outcomes, change events and inbox messages, records what
//! its events say, and sleeps until the machine's next deadline, the one timer it
//! arms; `inbox.rs` is the application's side of the owner's inbox. The driver runs on any
//! [`Runtime`]: spawned through it, its timer is the runtime's, and
//! `tokio::select!` (a macro over plain futures: no tokio runtime needed to poll
//! it) waits on the rest.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use dagnats_leases_nats::member::{Member, Ownership};
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

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_nats::{Client, HeaderMap, Message, Subscriber};
/// Why a key stepped down, in [`Ownership::SteppedDown`].
pub use dagnats_leases_core::holder::StepDownReason;
use dagnats_leases_core::holder::campaign::{
    Campaign, CampaignEvent, CampaignTransmit, GroupId, InboxVerdict, RejectId,
};
use dagnats_leases_core::holder::guard::RejectReason;
use dagnats_leases_core::holder::relay::Listener;
use dagnats_leases_core::holder::{HolderConfig, HolderEvent};
use dagnats_leases_core::subjects::{HDR_FENCE, changed_subject, inbox_wildcard};
use dagnats_leases_core::wire::{Endpoint, ErrorReply};
use dagnats_leases_core::{RequestOutcome, TransmitId};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, SelectAll};
use futures::{FutureExt, StreamExt};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::client::{LeaseError, LeaseErrorKind, change_event};
use crate::nats_request;
use crate::runtime::Runtime;
#[cfg(feature = "runtime-tokio")]
use crate::runtime::TokioRuntime;
use crate::telemetry;

mod driver;
mod handles;
mod inbox;

use handles::Group;
pub use handles::{Elector, Health, HeldView, Semaphore, Shards, TenureView};
pub use inbox::{ForwardedRequest, Inbox};

/// Sees what a member's campaigns do, as their driver does it: every request with
/// its outcome, and every event of a key's holder machine. For metrics, tracing, or
/// a test's history (the fault suite records the library's own view through it).
/// Called on the driver's task: keep it quick.
pub trait CampaignObserver: Send + Sync {
    /// A request was sent and came back (or was given up on).
    fn request(&self, _request: &ObservedRequest<'_>) {}

    /// The holder of `key` reported `event` at `at`.
    fn event(&self, _key: &str, _event: &HolderEvent, _at: Instant) {}
}

/// One of a campaign's requests, as a [`CampaignObserver`] sees it once it is over.
#[derive(Debug, Clone, Copy)]
pub struct ObservedRequest<'a> {
    /// The key it was for.
    pub key: &'a str,
    /// The endpoint it went to.
    pub endpoint: Endpoint,
    /// Its body.
    pub body: &'a [u8],
    /// When it was sent.
    pub sent: Instant,
    /// How it came back (`TimedOut` when the campaign gave up on it).
    pub outcome: &'a RequestOutcome,
    /// When it came back.
    pub answered: Instant,
}

type Observer = Option<Arc<dyn CampaignObserver>>;

/// A change of ownership of one key (for [`StepDownReason::Revoked`] and
/// [`StepDownReason::Unhealthy`], call `done` once writes under way are over:
/// [`Elector::done`], [`Shards::done`], [`Semaphore::done`]).
pub use dagnats_leases_core::holder::relay::Ownership;

/// What a supervised member's campaigns tell ([`Member::supervised`],
/// [`Elector::next_heard`]): ownership changes, renewals and refusals.
pub use dagnats_leases_core::holder::relay::Heard;

/// An [`Ownership`] change and the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The lease key.
    pub key: String,
    /// What changed.
    pub ownership: Ownership,
}

/// What a running campaign knows of a key it holds: the core's tenure.
pub use dagnats_leases_core::holder::Tenure;

/// A key held now and its tenure: a semaphore's slot ([`Semaphore::held`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    /// The lease key (for a semaphore, the slot: `<name>-<i>`).
    pub key: String,
    /// Its tenure.
    pub tenure: Tenure,
}

/// Where a group's ownership changes go, and who waits for it to finish.
struct Outlet {
    changes: mpsc::UnboundedSender<(String, Heard)>,
    finished: Vec<oneshot::Sender<()>>,
}

/// An inbox subscription and where its accepted requests go.
struct InboxFeed {
    subscriber: Subscriber,
    accepted: mpsc::UnboundedSender<ForwardedRequest>,
    rejected: Arc<AtomicU64>,
}

/// What the handles and the driver share. The machine sits behind a lock so that
/// [`Member::elect`] can say at once whether a key is free to campaign for; the
/// driver holds the lock only while it feeds one input and drains the machine.
struct State {
    campaign: Campaign,
    outlets: BTreeMap<GroupId, Outlet>,
    inboxes: Vec<InboxFeed>,
    driver_started: bool,
    /// False once every clone of the [`Member`] is gone: the driver ends when its
    /// groups and inboxes have too.
    member_alive: bool,
}

/// What a member is made from: [`Member::build`] takes it and [`Shared`] keeps
/// it, so a member remade with one setting changed starts from the rest.
#[derive(Clone)]
struct MemberSettings {
    nats: Client,
    holder: String,
    runtime: Arc<dyn Runtime>,
    observer: Observer,
    /// The candidate priority of every campaign ([`Member::with_priority`]).
    priority: Option<u8>,
    /// Who hears the campaigns' events ([`Member::supervised`]).
    listener: Listener,
}

struct Shared {
    settings: MemberSettings,
    state: Mutex<State>,
    wake: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops `group`; `finished` fires once it has released what it held.
    fn stop_group(&self, group: GroupId, finished: Option<oneshot::Sender<()>>) {
        let mut state = self.lock();
        match state.outlets.get_mut(&group) {
            Some(outlet) => outlet.finished.extend(finished),
            None => return,
        }
        state
            .campaign
            .handle_stop_group(self.settings.runtime.now(), group);
        drop(state);
        self.wake.notify_one();
    }
}

/// Ends the member's part in the driver when the last clone goes.
struct LastHandle(Arc<Shared>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        self.0.lock().member_alive = false;
        self.0.wake.notify_one();
    }
}

/// One process among the replicas: a NATS connection and a unique holder ID.
#[derive(Clone)]
pub struct Member {
    shared: Arc<Shared>,
    _last: Arc<LastHandle>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("holder", &self.shared.settings.holder)
            .finish_non_exhaustive()
    }
}

impl Member {
    /// A member with holder ID `holder` (`[A-Za-z0-9_-]{1,128}`, unique per process),
    /// running its background work on tokio.
    #[cfg(feature = "runtime-tokio")]
    pub fn new(nats: Client, holder: impl Into<String>) -> Result<Self, LeaseError> {
        Self::with_runtime(nats, holder, TokioRuntime::shared())
    }

    /// A member whose background work (its one driver task, and its timer) runs on
    /// `runtime`.
    pub fn with_runtime(
        nats: Client,
        holder: impl Into<String>,
        runtime: Arc<dyn Runtime>,
    ) -> Result<Self, LeaseError> {
        Self::build(MemberSettings {
            nats,
            holder: holder.into(),
            runtime,
            observer: None,
            priority: None,
            listener: Listener::Application,
        })
    }

    fn build(settings: MemberSettings) -> Result<Self, LeaseError> {
        let mut campaign =
            Campaign::new(&settings.holder, settings.runtime.now()).map_err(ErrorReply::from)?;
        // The holders' retry jitter: randomness drawn here, never in the core
        // (std's per-process random hash keys are enough for spreading retries).
        campaign.seed_jitter({
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        });
        let shared = Arc::new(Shared {
            settings,
            state: Mutex::new(State {
                campaign,
                outlets: BTreeMap::new(),
                inboxes: Vec::new(),
                driver_started: false,
                member_alive: true,
            }),
            wake: Notify::new(),
        });
        Ok(Self {
            _last: Arc::new(LastHandle(shared.clone())),
            shared,
        })
    }

    /// The same member, its campaigns reporting to `observer`. Call it before the
    /// first campaign: a member made afresh (no campaigns, no inbox) is returned.
    pub fn with_observer(self, observer: Arc<dyn CampaignObserver>) -> Self {
        Self::remade(MemberSettings {
            observer: Some(observer),
            ..self.shared.settings.clone()
        })
    }

    /// The same member, its campaigns told to a supervisor of a process under
    /// the lease (`lock`): [`Elector::next_heard`] and [`Semaphore::next_heard`]
    /// then hear renewals and refusals as well as ownership changes. Call it
    /// before the first campaign: a member made afresh is returned.
    pub fn supervised(self) -> Self {
        Self::remade(MemberSettings {
            listener: Listener::Supervisor,
            ..self.shared.settings.clone()
        })
    }

    /// The same member as a candidate of `priority` (0 to
    /// [`dagnats_leases_core::holder::MAX_PRIORITY`], higher preferred) in every
    /// campaign it starts: after a release or an expiry, the highest candidate alive
    /// wins the free key; the others hold back 100 ms per step below the top (at most
    /// 1 s) and take it over when that one is not there. Nothing is taken from a
    /// holder. Give every candidate of a key a priority. Call it before the first
    /// campaign: a member made afresh is returned.
    ///
    /// ```no_run
    /// # async fn run(nats: async_nats::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use dagnats_leases_nats::member::Member;
    /// // The replica in the primary zone leads whenever it is up.
    /// let member = Member::new(nats, Member::unique_id("zone-a"))?.with_priority(10);
    /// let mut elector = member.elect("exporter-leader", Duration::from_secs(15))?;
    /// # Ok(()) }
    /// ```
    pub fn with_priority(self, priority: u8) -> Self {
        Self::remade(MemberSettings {
            priority: Some(priority),
            ..self.shared.settings.clone()
        })
    }

    /// A member made afresh from `settings`: this one's connection, holder ID and
    /// runtime with what [`Member::with_observer`], [`Member::supervised`] or
    /// [`Member::with_priority`] changed.
    fn remade(settings: MemberSettings) -> Self {
        Self::build(settings).expect("the holder ID was checked already")
    }

    /// A holder config of this member for `key`, with its priority.
    fn config(&self, key: &str, ttl: Duration) -> HolderConfig {
        let config = HolderConfig::new(key, self.shared.settings.holder.clone(), ttl);
        match self.shared.settings.priority {
            Some(p) => config.with_priority(p),
            None => config,
        }
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
        &self.shared.settings.holder
    }

    /// Campaigns for `key` until stopped; ownership changes arrive on the [`Elector`].
    pub fn elect(&self, key: &str, ttl: Duration) -> Result<Elector, LeaseError> {
        self.elect_with(self.config(key, ttl))
    }

    /// [`Member::elect`] with every holder setting spelled out (its `holder` is
    /// replaced by this member's).
    pub fn elect_with(&self, mut config: HolderConfig) -> Result<Elector, LeaseError> {
        config.holder = self.shared.settings.holder.clone();
        let key = config.key.clone();
        Ok(Elector {
            key,
            group: self.start(vec![config], 1)?,
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
        let configs = keys.iter().map(|k| self.config(k, ttl)).collect();
        Ok(Shards {
            group: self.start(configs, max_held)?,
        })
    }

    /// Shares `keys` evenly with every member running the same `set`: each holds
    /// `floor` or `ceil(keys / members)` once settled, learning of the others from
    /// one presence lease per member (`<set>-member-<i>`, `i` below the number of
    /// keys). A member above its share revokes its newest tenures, a few per renew
    /// interval: each steps down at once ([`StepDownReason::Revoked`]) and is
    /// released on [`Shards::done`] or at its deadline; nothing is taken from a
    /// holder.
    pub fn balanced_shards(
        &self,
        set: &str,
        keys: &[&str],
        ttl: Duration,
    ) -> Result<Shards, LeaseError> {
        let configs: Vec<HolderConfig> = keys.iter().map(|k| self.config(k, ttl)).collect();
        Ok(Shards {
            group: self.begin(|c, now| c.add_balanced_group(now, set, configs))?,
        })
    }

    /// Holds one of `permits` slots of semaphore `name`: the leases `<name>-<i>`,
    /// each with its own fence, tried in turn until one is granted. At most `permits`
    /// members hold a slot at once; others wait for a release or an expiry. The
    /// events are an [`Elector`]'s, with the slot as their `key`.
    pub fn semaphore(
        &self,
        name: &str,
        permits: usize,
        ttl: Duration,
    ) -> Result<Semaphore, LeaseError> {
        let config = self.config(name, ttl);
        Ok(Semaphore {
            name: name.to_string(),
            group: self.begin(|c, now| c.add_semaphore(now, config, permits))?,
        })
    }

    fn start(&self, configs: Vec<HolderConfig>, max_held: usize) -> Result<Group, LeaseError> {
        self.begin(|c, now| c.add_group(now, configs, max_held))
    }

    /// Adds a group to the machine (`add`); the machine says which change events
    /// to watch for it.
    fn begin(
        &self,
        add: impl FnOnce(&mut Campaign, Instant) -> Result<GroupId, ErrorReply>,
    ) -> Result<Group, LeaseError> {
        let (changes_tx, changes) = mpsc::unbounded_channel();
        let mut state = self.shared.lock();
        let now = self.shared.settings.runtime.now();
        let id = add(&mut state.campaign, now)
            .map_err(|e| LeaseError::new(LeaseErrorKind::ErrorReply(e.kind), e.error))?;
        // The gauges show at once, before the driver runs.
        telemetry::campaigning_for(state.campaign.candidates(id));
        state.outlets.insert(
            id,
            Outlet {
                changes: changes_tx,
                finished: Vec::new(),
            },
        );
        self.ensure_driver(&mut state);
        drop(state);
        self.shared.wake.notify_one();
        Ok(Group {
            shared: self.shared.clone(),
            id,
            changes,
            stopped: false,
        })
    }

    fn ensure_driver(&self, state: &mut State) {
        if !state.driver_started {
            state.driver_started = true;
            let shared = self.shared.clone();
            self.shared
                .settings
                .runtime
                .spawn(driver::drive(shared).boxed());
        }
    }

    /// Subscribes to this member's inbox, `dagnats.lease.inbox.<holder>.>` (a plain
    /// subscription, no queue group). Requests for keys this member does not own, or
    /// with a missing, malformed or stale fence, are rejected with
    /// `Dagnats-Lease-Reject: stale` before they reach [`Inbox::next`].
    pub async fn inbox(&self) -> Result<Inbox, crate::Error> {
        let nats = &self.shared.settings.nats;
        let subscriber = nats
            .subscribe(inbox_wildcard(&self.shared.settings.holder))
            .await
            .map_err(|e| crate::Error::new(crate::ErrorKind::Nats, e))?;
        nats.flush()
            .await
            .map_err(|e| crate::Error::new(crate::ErrorKind::Nats, e))?;
        let (accepted, requests) = mpsc::unbounded_channel();
        let rejected = Arc::new(AtomicU64::new(0));
        let mut state = self.shared.lock();
        state.inboxes.push(InboxFeed {
            subscriber,
            accepted,
            rejected: rejected.clone(),
        });
        self.ensure_driver(&mut state);
        drop(state);
        self.shared.wake.notify_one();
        Ok(Inbox { requests, rejected })
    }
}
