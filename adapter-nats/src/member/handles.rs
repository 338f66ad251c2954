//! The holder library's public handles: what [`Member::elect`],
//! [`Member::semaphore`] and [`Member::shards`] return ([`Elector`],
//! [`Semaphore`], [`Shards`]), the views and health check they hand out
//! ([`TenureView`], [`HeldView`], [`Health`]), and the [`Group`] of the member's
//! campaign each of them runs.

use super::*;

/// Writes a handle's methods that only hand over to its [`Group`] (its field
/// `group`), each with the doc the handle gives it: the docs differ by handle,
/// the bodies do not. `health` writes `set_healthy` after it.
macro_rules! group_methods {
    () => {};
    ($(#[$doc:meta])* next; $($rest:tt)*) => {
        $(#[$doc])*
        pub async fn next(&mut self) -> Option<Change> {
            self.group.next_change().await
        }
        group_methods!($($rest)*);
    };
    ($(#[$doc:meta])* next_heard; $($rest:tt)*) => {
        $(#[$doc])*
        pub async fn next_heard(&mut self) -> Option<(String, Heard)> {
            self.group.changes.recv().await
        }
        group_methods!($($rest)*);
    };
    ($(#[$doc:meta])* health; $($rest:tt)*) => {
        $(#[$doc])*
        pub fn health(&self) -> Health {
            self.group.health()
        }

        /// Reports the health check: [`Health::set_healthy`].
        pub fn set_healthy(&self, healthy: bool) {
            self.group.health().set_healthy(healthy);
        }
        group_methods!($($rest)*);
    };
    ($(#[$doc:meta])* stopped_writing($key:ident); $($rest:tt)*) => {
        $(#[$doc])*
        pub fn stopped_writing(&self, $key: &str) {
            self.group.stopped_writing($key);
        }

        /// The old name of `stopped_writing`.
        #[deprecated(since = "0.2.0", note = "renamed `stopped_writing`")]
        pub fn done(&self, $key: &str) {
            self.stopped_writing($key);
        }
        group_methods!($($rest)*);
    };
    ($(#[$doc:meta])* stop; $($rest:tt)*) => {
        $(#[$doc])*
        pub async fn stop(mut self) {
            self.group.stop().await;
        }
        group_methods!($($rest)*);
    };
}

/// A running group of the member's campaign, as an [`Elector`] or [`Shards`] sees it.
pub(super) struct Group {
    pub(super) shared: Arc<Shared>,
    pub(super) id: GroupId,
    pub(super) changes: mpsc::UnboundedReceiver<(String, Heard)>,
    pub(super) stopped: bool,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("id", &self.id).finish()
    }
}

impl Group {
    /// The next ownership change: what the application hears of its events.
    async fn next_change(&mut self) -> Option<Change> {
        loop {
            let (key, heard) = self.changes.recv().await?;
            if let Some(ownership) = heard.into_ownership() {
                return Some(Change { key, ownership });
            }
        }
    }

    fn hand_over(&self) {
        let now = self.shared.settings.runtime.now();
        self.shared.lock().campaign.handle_hand_over(now, self.id);
        self.shared.wake.notify_one();
    }

    fn tenure(&self, key: &str) -> Option<Tenure> {
        let state = self.shared.lock();
        state
            .campaign
            .tenure(key, self.shared.settings.runtime.now())
    }

    fn held(&self) -> BTreeMap<String, Tenure> {
        let state = self.shared.lock();
        state
            .campaign
            .held(self.id, self.shared.settings.runtime.now())
    }

    fn stopped_writing(&self, key: &str) {
        self.shared
            .lock()
            .campaign
            .handle_stopped_writing(self.shared.settings.runtime.now(), key);
        self.shared.wake.notify_one();
    }

    fn health(&self) -> Health {
        Health {
            shared: self.shared.clone(),
            group: self.id,
        }
    }

    async fn stop(&mut self) {
        self.stopped = true;
        let (finished, done) = oneshot::channel();
        self.shared.stop_group(self.id, Some(finished));
        // Err: the group had finished already (or the driver is gone).
        let _ = done.await;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Dropped without stop(): the driver steps down and releases in the background.
        if !self.stopped {
            self.shared.stop_group(self.id, None);
        }
    }
}

/// Where the application reports a group's health check: an [`Elector`]'s, a
/// [`Shards`]' or a [`Semaphore`]'s ([`Elector::health`]). Cheap to clone, so a
/// task of its own (a probe loop, a connection-state callback) can report while
/// another awaits `next()`.
///
/// The library runs no check and keeps no timer for it: the application reports
/// whenever it learns something (a probe every second, a database connection
/// lost and back), and the core's campaign machine holds every rule:
///
/// - a group is healthy until reported otherwise;
/// - while unhealthy, it sends no campaign acquire (one not yet sent is taken back);
///   the keys it holds stay held and renewed;
/// - unhealthy since T, at T + `unhealthy_for` ([`Health::set_unhealthy_for`], the
///   TTL by default) every key it holds steps down with
///   [`StepDownReason::Unhealthy`] and is released the way a revoked key is: when
///   the application calls `stopped_writing` for it, or at the deadline the reason
///   names;
/// - healthy again, it campaigns at once.
///
/// ```no_run
/// # async fn run(member: dagnats_leases_nats::member::Member) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dagnats_leases_nats::member::{Ownership, StepDownReason};
/// # async fn database_answers() -> bool { true }
/// let mut elector = member.elect("notify-leader", Duration::from_secs(15))?;
/// let health = elector.health();
/// tokio::spawn(async move {
///     loop {
///         health.set_healthy(database_answers().await);
///         tokio::time::sleep(Duration::from_secs(1)).await;
///     }
/// });
/// while let Some(change) = elector.next().await {
///     if let Ownership::SteppedDown { reason: StepDownReason::Unhealthy { .. } } = change.ownership {
///         // Stop writing; then let the next leader in at once.
///         elector.stopped_writing();
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Health {
    shared: Arc<Shared>,
    group: GroupId,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Health {
    /// The health check passed (`true`) or failed (`false`) just now.
    pub fn set_healthy(&self, healthy: bool) {
        let now = self.shared.settings.runtime.now();
        self.shared
            .lock()
            .campaign
            .handle_health(now, self.group, healthy);
        self.shared.wake.notify_one();
    }

    /// How long the check may fail before the group's keys step down (the TTL unless
    /// set).
    pub fn set_unhealthy_for(&self, unhealthy_for: Duration) {
        let now = self.shared.settings.runtime.now();
        self.shared
            .lock()
            .campaign
            .set_unhealthy_for(now, self.group, unhealthy_for);
        self.shared.wake.notify_one();
    }

    /// Whether the group is healthy, as last reported.
    pub fn is_healthy(&self) -> bool {
        self.shared.lock().campaign.is_healthy(self.group)
    }
}

/// Campaigns for one key. Stop it with [`Elector::stop`] (steps down and releases);
/// dropping it does the same in the background.
#[derive(Debug)]
pub struct Elector {
    pub(super) key: String,
    pub(super) group: Group,
}

impl Elector {
    group_methods! {
        /// The next ownership change; `None` once the elector has stopped.
        next;
        /// The next event a supervisor hears ([`Member::supervised`]: renewals and
        /// refusals too), with its key; `None` once stopped.
        next_heard;
    }

    /// The current tenure, if this process owns the key right now (its local deadline
    /// has not passed).
    pub fn tenure(&self) -> Option<Tenure> {
        self.group.tenure(&self.key)
    }

    /// Whether this process owns the key right now.
    pub fn is_leader(&self) -> bool {
        self.tenure().is_some()
    }

    /// A cloneable view of this key's tenure, for a task other than the one awaiting
    /// [`Elector::next`] (an HTTP handler answering whether this process leads).
    pub fn tenure_view(&self) -> TenureView {
        TenureView {
            shared: self.group.shared.clone(),
            key: self.key.clone(),
        }
    }

    /// The key campaigned for.
    pub fn key(&self) -> &str {
        &self.key
    }

    group_methods! {
        /// Where to report the health check ([`Health`]).
        health;
    }

    /// The application has stopped writing under the key after a step-down that
    /// keeps the lease to its deadline ([`StepDownReason::Unhealthy`]): it is
    /// released now, so the next leader is elected at once. Otherwise nothing
    /// happens.
    pub fn stopped_writing(&self) {
        self.group.stopped_writing(&self.key);
    }

    /// The old name of [`Elector::stopped_writing`].
    #[deprecated(since = "0.2.0", note = "renamed `stopped_writing`")]
    pub fn done(&self) {
        self.stopped_writing();
    }

    /// Hands the key over: steps down now ([`StepDownReason::HandedOver`]),
    /// releases the lease, and asks for the key again only a campaign interval
    /// (ttl/3) later, so a member waiting for it is elected within milliseconds
    /// (woken by the release). Unlike [`Elector::stop`], the elector goes on as a
    /// candidate. Nothing happens when this process does not lead. Returns at once;
    /// the release is given up, as a stop's is, within
    /// [`HolderConfig::stop_bound`] when NATS does not answer.
    pub fn hand_over(&self) {
        self.group.hand_over();
    }

    group_methods! {
        /// Steps down (if leading), releases the lease, and waits for the release: at
        /// most [`HolderConfig::stop_bound`] (4 × the request timeout: the TTL by
        /// default, at most 20 s) whatever NATS is doing, as each request is given up at
        /// its timeout. Dropping the elector does the same in the background.
        stop;
    }
}

/// An [`Elector`]'s tenure as another task reads it ([`Elector::tenure_view`]):
/// what the library believes at the instant asked, local deadline included. Once
/// the elector has stopped it reads `None`.
#[derive(Clone)]
pub struct TenureView {
    shared: Arc<Shared>,
    key: String,
}

impl std::fmt::Debug for TenureView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenureView")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl TenureView {
    /// Now on the library's clock, and the tenure at that instant (if leading).
    pub fn read(&self) -> (Instant, Option<Tenure>) {
        let now = self.shared.settings.runtime.now();
        let tenure = self.shared.lock().campaign.tenure(&self.key, now);
        (now, tenure)
    }
}

/// A [`Shards`]' held keys as another task reads them ([`Shards::held_view`]):
/// what the library believes at the instant asked, local deadlines included.
#[derive(Clone)]
pub struct HeldView {
    shared: Arc<Shared>,
    group: GroupId,
}

impl std::fmt::Debug for HeldView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldView")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl HeldView {
    /// Now on the library's clock, and the keys owned at that instant.
    pub fn read(&self) -> (Instant, BTreeMap<String, Tenure>) {
        let now = self.shared.settings.runtime.now();
        let held = self.shared.lock().campaign.held(self.group, now);
        (now, held)
    }
}

/// Holds one slot of a semaphore. Stop it with [`Semaphore::stop`] (steps down and
/// releases); dropping it does the same in the background.
///
/// ```no_run
/// # async fn run(member: dagnats_leases_nats::member::Member) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// // At most three exporters run at once, whatever the number of replicas.
/// let mut permit = member.semaphore("exporter", 3, Duration::from_secs(15))?;
/// while let Some(change) = permit.next().await {
///     println!("{}: {:?}", change.key, change.ownership);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Semaphore {
    pub(super) name: String,
    pub(super) group: Group,
}

impl Semaphore {
    group_methods! {
        /// The next ownership change of a slot; `None` once stopped.
        next;
        /// The next event a supervisor hears of a slot ([`Member::supervised`]:
        /// renewals and refusals too), with the slot; `None` once stopped.
        next_heard;
    }

    /// The slot this process holds right now, with its tenure.
    pub fn held(&self) -> Option<HeldKey> {
        let (key, tenure) = self.group.held().into_iter().next()?;
        Some(HeldKey { key, tenure })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    group_methods! {
        /// Where to report the health check ([`Health`]).
        health;
        /// The application has stopped writing under `slot`, revoked
        /// ([`StepDownReason::Revoked`], [`StepDownReason::Unhealthy`]): it is
        /// released now rather than at its deadline. Otherwise nothing happens.
        stopped_writing(slot);
        /// Steps down from its slot (if holding one), releases it, and waits for that:
        /// at most [`HolderConfig::stop_bound`], as [`Elector::stop`].
        stop;
    }
}

/// Holds up to N of a set of shard keys. Stop it with [`Shards::stop`].
///
/// ```no_run
/// # async fn run(member: dagnats_leases_nats::member::Member) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// // Three replicas, six shards: each holds at most two.
/// let keys = ["shard-0", "shard-1", "shard-2", "shard-3", "shard-4", "shard-5"];
/// let mut shards = member.shards(&keys, 2, Duration::from_secs(15))?;
/// while let Some(change) = shards.next().await {
///     println!("{}: {:?}; now holding {:?}", change.key, change.ownership, shards.held().keys());
/// }
/// # Ok(()) }
/// ```
///
/// A balanced set moves a shard by revoking it: the shard steps down at once, and
/// its lease goes to another member only once the application has stopped writing
/// under it ([`Shards::stopped_writing`]) or at the deadline it was last given.
///
/// ```no_run
/// # async fn run(member: dagnats_leases_nats::member::Member) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dagnats_leases_nats::member::{Ownership, StepDownReason};
/// let keys = ["shard-0", "shard-1", "shard-2", "shard-3"];
/// let mut shards = member.balanced_shards("orders", &keys, Duration::from_secs(15))?;
/// while let Some(change) = shards.next().await {
///     if let Ownership::SteppedDown { reason: StepDownReason::Revoked { deadline } } = change.ownership {
///         // Take no new work for the shard; let writes under way finish (each
///         // before `deadline`), then hand it over.
///         shards.stopped_writing(&change.key);
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Shards {
    pub(super) group: Group,
}

impl Shards {
    group_methods! {
        /// The next ownership change of any shard; `None` once stopped.
        next;
    }

    /// The shards this process owns right now, with their tenures.
    pub fn held(&self) -> BTreeMap<String, Tenure> {
        self.group.held()
    }

    /// The tenure of one shard, if owned right now.
    pub fn tenure(&self, key: &str) -> Option<Tenure> {
        self.group.tenure(key)
    }

    /// A cloneable view of the shards held, for a task other than the one awaiting
    /// [`Shards::next`] (an HTTP handler answering which shards this process owns).
    pub fn held_view(&self) -> HeldView {
        HeldView {
            shared: self.group.shared.clone(),
            group: self.group.id,
        }
    }

    group_methods! {
        /// The application has stopped writing under shard `key`, revoked to
        /// rebalance ([`StepDownReason::Revoked`]) or for health
        /// ([`StepDownReason::Unhealthy`]): it is released now rather than at its
        /// deadline, so the next owner gets it sooner. Otherwise nothing happens.
        stopped_writing(key);
        /// Where to report the health check ([`Health`]). A balanced set's presence
        /// follows it: unhealthy for `unhealthy_for`, the member leaves the set, and
        /// the others' shares grow to cover its shards.
        health;
        /// Steps down from every shard, releases them, and waits for the releases: at
        /// most [`HolderConfig::stop_bound`], as [`Elector::stop`] (the releases go out
        /// together, none queued).
        stop;
    }
}
