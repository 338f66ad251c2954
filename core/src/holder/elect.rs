//! `dagnats-leases elect`'s decisions: what state `elect --http` reports to the
//! application beside it ([`leader_state`], and [`shards_state`] for a shard set), when a stopping process may release
//! ([`Leadership`]), and which change events are changes of
//! leader for `elect --observe` ([`LeaderWatch`]).
//!
//! The application of another language learns from the HTTP endpoint whether it may
//! act as leader and until when. What it is told never reaches past the holder
//! library's own local deadline: the time left is rounded down to whole
//! milliseconds, and a wall-clock deadline is the wall clock read *before* the
//! monotonic one plus that time left. An application counts `valid_for_ms` from the
//! moment it *sent* its request, which can only shorten it further.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;
use time::OffsetDateTime;

use crate::change::{ChangeEvent, ChangeKind};
use crate::holder::Tenure;

/// How long `elect --http` waits after a failed accept (out of file descriptors,
/// say) before it accepts again, rather than failing in a busy loop.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// How often `elect --observe` reads the owner to make up for change events it
/// missed (they are delivered at most once).
pub const OBSERVE_RESYNC: Duration = Duration::from_secs(5);

/// What `elect --http` serves: the state the application may act on now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaderState {
    /// Whether this process leads: act as leader only while true.
    pub leader: bool,
    /// The lease key.
    pub key: String,
    /// This process's holder ID.
    pub holder: String,
    /// The fence that began the tenure: send it with every downstream write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// The latest revision of the tenure (its last renewal; at least `fence`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// How long the application may act as leader, counted from when it sent the
    /// request; 0 when not leading.
    pub valid_for_ms: u64,
    /// The same end as a wall-clock time (RFC 3339), for logs and cross-checks.
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub deadline: Option<OffsetDateTime>,
    /// The wall-clock time the state was read at (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub now: OffsetDateTime,
}

impl LeaderState {
    /// The HTTP status: 200 while leading, 503 otherwise (so a plain health check
    /// of a load balancer or a probe routes to the leader only).
    pub fn http_status(&self) -> u16 {
        if self.leader { 200 } else { 503 }
    }
}

/// The state to report at `now` (the holder library's clock) for `tenure`, the
/// library's answer at that same `now`. `wall` must be read *before* `now`, so that
/// `wall + time left` is never later than the library's deadline. A process that is
/// `stopping` (a signal received, its release about to go out) leads no more, and
/// neither does a tenure with under a millisecond left.
pub fn leader_state(
    key: &str,
    holder: &str,
    tenure: Option<Tenure>,
    stopping: bool,
    now: Instant,
    wall: OffsetDateTime,
) -> LeaderState {
    let left = tenure
        .filter(|_| !stopping)
        .map(|t| (t, t.deadline.saturating_duration_since(now)))
        .map(|(t, left)| (t, u64::try_from(left.as_millis()).unwrap_or(u64::MAX)))
        .filter(|&(_, ms)| ms > 0);
    match left {
        Some((t, ms)) => LeaderState {
            leader: true,
            key: key.to_string(),
            holder: holder.to_string(),
            fence: Some(t.tenure),
            revision: Some(t.fence),
            valid_for_ms: ms,
            deadline: Some(wall + Duration::from_millis(ms)),
            now: wall,
        },
        None => LeaderState {
            leader: false,
            key: key.to_string(),
            holder: holder.to_string(),
            fence: None,
            revision: None,
            valid_for_ms: 0,
            deadline: None,
            now: wall,
        },
    }
}

/// One shard held, as `elect --shards N --http` serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardLease {
    /// The shard's key.
    pub key: String,
    /// The tenure's start fence: send it with every write for this shard.
    pub fence: u64,
    /// The tenure's latest revision.
    pub revision: u64,
    /// How long the application may act on this shard, from when it sent the request.
    pub valid_for_ms: u64,
    /// The same end as a wall-clock time (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub deadline: OffsetDateTime,
}

/// What `elect --shards N --http` serves: the shards this process may act on now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardsState {
    /// Whether this process owns at least one shard.
    pub leader: bool,
    /// The set's name (its shards are `<set>-<i>`).
    pub set: String,
    /// This process's holder ID.
    pub holder: String,
    /// The shards owned now, each by [`leader_state`]'s rule; no other may be acted on.
    pub shards: Vec<ShardLease>,
    /// The wall-clock time the state was read at (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub now: OffsetDateTime,
}

impl ShardsState {
    /// The HTTP status: 200 while this process owns a shard, 503 otherwise.
    pub fn http_status(&self) -> u16 {
        if self.leader { 200 } else { 503 }
    }
}

/// The shards to report at `now` for `held` (the library's keys and tenures at
/// that same `now`), each by the rule of [`leader_state`].
pub fn shards_state<'a>(
    set: &str,
    holder: &str,
    held: impl IntoIterator<Item = (&'a String, &'a Tenure)>,
    stopping: bool,
    now: Instant,
    wall: OffsetDateTime,
) -> ShardsState {
    let shards: Vec<ShardLease> = held
        .into_iter()
        .map(|(key, t)| leader_state(key, holder, Some(*t), stopping, now, wall))
        .filter_map(|s| {
            Some(ShardLease {
                fence: s.fence?,
                revision: s.revision?,
                valid_for_ms: s.valid_for_ms,
                deadline: s.deadline?,
                key: s.key,
            })
        })
        .collect();
    ShardsState {
        leader: !shards.is_empty(),
        set: set.to_string(),
        holder: holder.to_string(),
        shards,
        now: wall,
    }
}

/// What one `elect` process has told its application, and so when it may let the
/// key go. A release frees the key at once, before the deadlines already handed
/// out: an application told "leader until T" would still act while the next
/// leader is elected. So a stopping process says "not leader" from the stop on,
/// keeps its lease (renewed by the library as before), and releases only once the
/// latest deadline it handed out has passed; at once if none is still to come.
#[derive(Debug, Clone)]
pub struct Leadership {
    key: String,
    holder: String,
    stopping: bool,
    /// The latest deadline handed out (on the library's clock).
    handed_out: Option<Instant>,
}

impl Leadership {
    /// Nothing handed out yet for `holder`'s campaign for `key`.
    pub fn new(key: &str, holder: &str) -> Self {
        Self {
            key: key.to_string(),
            holder: holder.to_string(),
            stopping: false,
            handed_out: None,
        }
    }

    /// The state to hand the application ([`leader_state`]), remembered as handed
    /// out.
    pub fn state(
        &mut self,
        tenure: Option<Tenure>,
        now: Instant,
        wall: OffsetDateTime,
    ) -> LeaderState {
        let state = leader_state(&self.key, &self.holder, tenure, self.stopping, now, wall);
        if state.leader {
            self.hand_out(now + Duration::from_millis(state.valid_for_ms));
        }
        state
    }

    /// The shards to hand the application ([`shards_state`]; `key` is the set),
    /// each one's deadline remembered as handed out.
    pub fn shards_state<'a>(
        &mut self,
        held: impl IntoIterator<Item = (&'a String, &'a Tenure)>,
        now: Instant,
        wall: OffsetDateTime,
    ) -> ShardsState {
        let state = shards_state(&self.key, &self.holder, held, self.stopping, now, wall);
        for shard in &state.shards {
            self.hand_out(now + Duration::from_millis(shard.valid_for_ms));
        }
        state
    }

    fn hand_out(&mut self, until: Instant) {
        self.handed_out = Some(self.handed_out.map_or(until, |t| t.max(until)));
    }

    /// The key (or the set) campaigned for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The process stops: it leads no more, whatever its tenure says.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// Whether [`Leadership::stop`] was called.
    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// When the lease may be released: `None` at once (no deadline handed out is
    /// still to come at `now`), else the latest one handed out.
    pub fn release_at(&self, now: Instant) -> Option<Instant> {
        self.handed_out.filter(|&t| t > now)
    }
}

/// A change of leader of one key, as `elect --observe` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaderChange {
    /// The lease key.
    pub key: String,
    /// The holder that leads now, or `None`: the key is free.
    pub leader: Option<String>,
    /// The revision that says so (the acquire's, or the release's or expiry's); 0
    /// when a read found the key free (it names no revision).
    pub revision: u64,
}

/// What the owner read (`api.leases.owner`) answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerRead {
    /// Held by `holder` at `revision`.
    Held {
        /// The holder.
        holder: String,
        /// The lease's latest revision.
        revision: u64,
    },
    /// Nobody holds the key.
    Free,
    /// The read failed (no answer, an error reply): it is tried again later.
    Failed,
}

/// Follows one key's leader from change events, resynchronised by owner reads:
/// events are delivered at most once, so it reads the owner at the start, after an
/// event it cannot interpret (a write the service did not make), after a failed
/// read (at the next resync), and every `resync` in any case.
///
/// Rules: an event or read older than the newest revision seen is ignored; a
/// renewal by the current leader is no change; a read that finds the key free
/// counts only if no event arrived while it was under way (it names no revision,
/// so it could be older than one); consecutive equal leaders print once.
#[derive(Debug)]
pub struct LeaderWatch {
    key: String,
    resync: Duration,
    /// The leader last reported: `None` before anything is known.
    reported: Option<Option<String>>,
    /// The newest revision seen, from events or reads.
    revision: u64,
    /// Events applied so far (a free read counts only if none arrived meanwhile).
    events_seen: u64,
    /// A read under way, with `events_seen` when it was sent.
    reading: Option<u64>,
    read_due: bool,
    next_resync: Instant,
    changes: VecDeque<LeaderChange>,
}

impl LeaderWatch {
    /// Watches `key`, reading its owner at once and every `resync` after.
    pub fn new(key: &str, resync: Duration, now: Instant) -> Self {
        Self {
            key: key.to_string(),
            resync,
            reported: None,
            revision: 0,
            events_seen: 0,
            reading: None,
            read_due: true,
            next_resync: now + resync,
            changes: VecDeque::new(),
        }
    }

    /// Whether to send an owner read now (at most one is under way at a time).
    pub fn poll_read(&mut self) -> bool {
        if self.read_due && self.reading.is_none() {
            self.read_due = false;
            self.reading = Some(self.events_seen);
            return true;
        }
        false
    }

    /// The answer of the read [`LeaderWatch::poll_read`] asked for.
    pub fn handle_read(&mut self, now: Instant, read: OwnerRead) {
        let Some(sent_at) = self.reading.take() else {
            return;
        };
        self.next_resync = now + self.resync;
        match read {
            OwnerRead::Held { holder, revision } => {
                if revision >= self.revision {
                    self.revision = revision;
                    self.report(Some(holder), revision);
                }
            }
            OwnerRead::Free if sent_at == self.events_seen => self.report(None, 0),
            // An event came while it was under way: it may be older; read again.
            OwnerRead::Free => self.read_due = true,
            OwnerRead::Failed => {}
        }
    }

    /// A change event of the key.
    pub fn handle_change(&mut self, _now: Instant, event: &ChangeEvent) {
        if event.revision != 0 && event.revision <= self.revision {
            return;
        }
        self.events_seen += 1;
        self.revision = self.revision.max(event.revision);
        match (event.kind, &event.holder) {
            (ChangeKind::Acquired | ChangeKind::Renewed, Some(holder)) => {
                self.report(Some(holder.clone()), event.revision)
            }
            (ChangeKind::Released | ChangeKind::Expired | ChangeKind::Deleted, _) => {
                self.report(None, event.revision)
            }
            // Not the service's write, or no record: ask who holds it.
            _ => self.read_due = true,
        }
    }

    /// When to wake for the next resync.
    pub fn poll_timeout(&self) -> Instant {
        self.next_resync
    }

    /// Time passed: a resync read is due once `poll_timeout` is reached.
    pub fn handle_timeout(&mut self, now: Instant) {
        if now >= self.next_resync {
            self.read_due = true;
            self.next_resync = now + self.resync;
        }
    }

    /// The next change of leader to print.
    pub fn poll_event(&mut self) -> Option<LeaderChange> {
        self.changes.pop_front()
    }

    fn report(&mut self, leader: Option<String>, revision: u64) {
        if self.reported.as_ref() == Some(&leader) {
            return;
        }
        self.reported = Some(leader.clone());
        self.changes.push_back(LeaderChange {
            key: self.key.clone(),
            leader,
            revision,
        });
    }
}
