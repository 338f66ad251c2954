//! Whether the service takes the change events, by who else serves.
//!
//! A change event tells an instance of a write it did not make; of its own writes
//! it knows already, from their acks ([`crate::known`]). Alone, an instance that
//! took the events would pay, on every renewal, the server's delivery of the
//! event and its own parse of it, to learn nothing. So with `changes: auto` (the
//! default) a single-tenant instance subscribes to them only while another
//! instance serves beside it; with `always` it does from the start (as tenancy
//! does always: the tenants' cap counts live leases from the events).
//!
//! Who serves is learnt from a presence heartbeat: every single-tenant instance
//! publishes its instance id on [`PRESENCE_SUBJECT`] at start and every
//! [`PRESENCE_EVERY`], and an `auto` instance counts the other ids it heard in
//! the last [`PRESENCE_MISSED`] intervals. A heartbeat is one message every few
//! seconds per instance, with no request, no window of replies to gather and no
//! reply subject to check; an instance that hears a newcomer answers with its
//! own heartbeat at once (at most once an interval), so the newcomer need not
//! wait an interval to learn it is not alone. An instance hears its own
//! heartbeat too: one that has not for [`PRESENCE_MISSED`] intervals (its
//! publish or subscription refused) cannot tell whether it is alone, and takes
//! the change events until it hears itself again.
//!
//! Every way this can be wrong costs reads, never a lease: a write that expects
//! a revision is conditional, so a fact the known map holds that another
//! instance has since moved is refused by the server and the key read, as it
//! would be with no fact at all. The window between a second instance starting
//! and this one subscribing, a heartbeat lost, or one forged by a client
//! (which only makes an instance subscribe, as `always` does) change how many
//! reads are made, nothing else.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::*;
use crate::tenant::Tenancy;

/// Where every single-tenant instance publishes its instance id.
pub const PRESENCE_SUBJECT: &str = "dagnats.lease.presence";

/// How often an instance says it serves.
pub const PRESENCE_EVERY: Duration = Duration::from_secs(5);

/// After this many intervals unheard, an instance counts as gone.
pub const PRESENCE_MISSED: u32 = 3;

/// At most this many other instances are remembered: more says nothing more
/// (one is enough to subscribe), and forged ids cannot grow the map.
pub const MAX_PEERS: usize = 256;

/// The longest instance id heard: a NUID is 22 characters.
pub(crate) const MAX_ID_LEN: usize = 64;

/// When the service takes the change events (`serve --changes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChangesSetting {
    /// Only while another instance serves (single tenancy), always in tenancy.
    #[default]
    Auto,
    /// From the start, alone or not.
    Always,
}

impl std::str::FromStr for ChangesSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            _ => Err(format!("--changes: `{s}` is not one of auto, always")),
        }
    }
}

/// Whether a service takes the change events: never when nothing reads them
/// (`readers`: a known map, or tenancy's cap), always in tenancy or with
/// `always`, else only while `others` instances serve beside it.
pub fn changes_wanted(
    setting: ChangesSetting,
    tenancy: Tenancy,
    readers: bool,
    others: usize,
) -> bool {
    readers && (tenancy == Tenancy::Accounts || setting == ChangesSetting::Always || others > 0)
}

/// What [`Peers`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeersEvent {
    /// Publish this instance's heartbeat.
    Announce,
    /// Another instance serves now: take the change events.
    Subscribe,
    /// No other instance was heard for [`PRESENCE_MISSED`] intervals: stop.
    Unsubscribe,
    /// This instance has not heard its own heartbeat for [`PRESENCE_MISSED`]
    /// intervals (its publish or its subscription refused): it cannot tell
    /// whether it is alone, so it takes the change events until it hears itself.
    Deaf,
}

/// The presence machine: the heartbeats this instance sends and, when it
/// decides (`listens`), the others it heard and whether to take change events.
#[derive(Debug)]
pub struct Peers {
    me: String,
    listens: bool,
    every: Duration,
    missed: u32,
    /// Each other instance, and when it was last heard.
    seen: HashMap<String, Instant>,
    subscribed: bool,
    /// When this instance last heard its own heartbeat (its start, at first).
    self_heard: Instant,
    /// Whether it is deaf to its own heartbeat now.
    deaf: bool,
    next: Instant,
    /// When a heartbeat went out early for a newcomer.
    early: Option<Instant>,
    events: VecDeque<PeersEvent>,
}

impl Peers {
    /// Starting at `now` as `me`: a heartbeat goes out at once. `listens`: this
    /// instance decides on its change subscription from what it hears.
    pub fn new(me: impl Into<String>, listens: bool, now: Instant) -> Self {
        Self {
            me: me.into(),
            listens,
            every: PRESENCE_EVERY,
            missed: PRESENCE_MISSED,
            seen: HashMap::new(),
            subscribed: false,
            self_heard: now,
            deaf: false,
            next: now + PRESENCE_EVERY,
            early: None,
            events: VecDeque::from([PeersEvent::Announce]),
        }
    }

    /// The same with another interval (a test's).
    pub fn with_interval(mut self, every: Duration, now: Instant) -> Self {
        self.every = every;
        self.next = now + every;
        self
    }

    /// Whether this instance decides on its change subscription.
    pub fn listens(&self) -> bool {
        self.listens
    }

    /// How many other instances were heard within the window.
    pub fn others(&self) -> usize {
        self.seen.len()
    }

    /// A heartbeat heard at `now`. Its body is an instance id: one that is not
    /// text, empty, too long or this instance's own is ignored.
    pub fn handle_presence(&mut self, now: Instant, body: &[u8]) {
        if !self.listens {
            return;
        }
        let Some(id) = std::str::from_utf8(body)
            .ok()
            .map(str::trim)
            .filter(|id| !id.is_empty() && id.len() <= MAX_ID_LEN)
        else {
            return;
        };
        if id == self.me {
            // Its own, echoed: the heartbeats go round.
            self.self_heard = now;
            self.deaf = false;
            return self.decide();
        }
        let full = self.seen.len() >= MAX_PEERS;
        match self.seen.get_mut(id) {
            Some(at) => *at = now,
            None if full => return,
            None => {
                self.seen.insert(id.to_string(), now);
                // A newcomer: tell it at once, at most once an interval.
                if self.early.is_none_or(|at| now >= at + self.every) {
                    self.early = Some(now);
                    self.events.push_back(PeersEvent::Announce);
                }
            }
        }
        self.decide();
    }

    /// The time has come: a heartbeat goes out, and instances unheard for
    /// [`PRESENCE_MISSED`] intervals are forgotten.
    pub fn handle_timeout(&mut self, now: Instant) {
        if now < self.next {
            return;
        }
        self.events.push_back(PeersEvent::Announce);
        self.next = now + self.every;
        let window = self.every * self.missed;
        self.seen.retain(|_, at| now < *at + window);
        if !self.deaf && now >= self.self_heard + window {
            self.deaf = true;
            if self.listens {
                self.events.push_back(PeersEvent::Deaf);
            }
        }
        self.decide();
    }

    /// Subscribes or unsubscribes as the others heard say; an instance that
    /// does not listen keeps what it has.
    fn decide(&mut self) {
        if !self.listens {
            return;
        }
        let wanted = !self.seen.is_empty() || self.deaf;
        if wanted != self.subscribed {
            self.subscribed = wanted;
            self.events.push_back(if wanted {
                PeersEvent::Subscribe
            } else {
                PeersEvent::Unsubscribe
            });
        }
    }

    /// When to call [`Peers::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        Some(self.next)
    }

    /// The next thing to do.
    pub fn poll_event(&mut self) -> Option<PeersEvent> {
        self.events.pop_front()
    }
}

impl Service {
    /// The presence machine of a service of `config` starting at `now`: every
    /// single-tenant instance announces itself; it listens only where the
    /// setting leaves its change subscription to it.
    pub(super) fn peers_of(config: &ServiceConfig, now: Instant) -> Option<Peers> {
        if config.bucket.tenancy != Tenancy::Single {
            return None;
        }
        let listens = config.changes == ChangesSetting::Auto && config.known_capacity > 0;
        Some(Peers::new(config.instance_id.clone(), listens, now))
    }

    /// Whether the change events are subscribed at start: where something reads
    /// them and no other instance needs hearing of first.
    pub(super) fn changes_at_start(&self) -> bool {
        let listens = self.peers.as_ref().is_some_and(Peers::listens);
        !listens
            && changes_wanted(
                self.config.changes,
                self.config.bucket.tenancy,
                self.changes_unwatched_warning().is_some(),
                0,
            )
    }

    /// The presence subscription, where this instance listens.
    pub(super) fn subscribe_presence(&mut self) {
        if self.peers.as_ref().is_some_and(Peers::listens) {
            self.events.push_back(ServiceEvent::Subscribe {
                subject: PRESENCE_SUBJECT.to_string(),
                queue: None,
                kind: SubscriptionKind::Presence,
            });
        }
    }

    /// A heartbeat delivered on [`PRESENCE_SUBJECT`] at `now`.
    pub fn handle_presence(&mut self, now: Instant, payload: &[u8]) {
        if self.stop.is_some() {
            return;
        }
        if let Some(peers) = &mut self.peers {
            peers.handle_presence(now, payload);
        }
        self.pump(now);
    }

    /// The presence subscription failed: this instance cannot tell whether it
    /// is alone, so it takes the change events as `always` would.
    pub(super) fn presence_failed(&mut self, subject: &str, error: &str) {
        // It still announces itself: the others' decisions need it.
        let mut subscribed = false;
        if let Some(peers) = &mut self.peers {
            peers.listens = false;
            peers.seen.clear();
            subscribed = std::mem::replace(&mut peers.subscribed, true);
        }
        self.events.push_back(ServiceEvent::Log {
            level: LogLevel::Warn,
            line: format!(
                "could not subscribe to {subject} ({error}): taking the change events \
                 as --changes always does"
            ),
        });
        if !subscribed {
            self.events.push_back(ServiceEvent::Subscribe {
                subject: changed_subject("*"),
                queue: None,
                kind: SubscriptionKind::Changes,
            });
        }
    }

    /// The presence machine's timer, while not stopping and not answering every
    /// call `unsupported` (such an instance writes nothing).
    pub(super) fn peers_timeout(&self) -> Option<Instant> {
        match (&self.stop, self.mode) {
            (None, Mode::Starting | Mode::Ready) => {
                self.peers.as_ref().and_then(Peers::poll_timeout)
            }
            _ => None,
        }
    }

    /// Moves the presence machine's clock along (not while stopping).
    pub(super) fn peers_handle_timeout(&mut self, now: Instant) {
        if self.peers_timeout().is_some()
            && let Some(peers) = &mut self.peers
        {
            peers.handle_timeout(now);
        }
    }

    /// What the presence machine asks, as the service's events.
    pub(super) fn pump_peers(&mut self) {
        let me = self.config.instance_id.clone();
        let changes = || ServiceEvent::Subscribe {
            subject: changed_subject("*"),
            queue: None,
            kind: SubscriptionKind::Changes,
        };
        let log = |level, line: String| ServiceEvent::Log { level, line };
        while let Some(event) = self.peers.as_mut().and_then(Peers::poll_event) {
            let events = match event {
                PeersEvent::Announce => vec![ServiceEvent::Announce {
                    subject: PRESENCE_SUBJECT.to_string(),
                    body: me.clone().into_bytes(),
                }],
                PeersEvent::Subscribe => vec![
                    log(
                        LogLevel::Info,
                        "another instance serves (or none can be heard): taking the change \
                         events"
                            .to_string(),
                    ),
                    changes(),
                ],
                PeersEvent::Unsubscribe => vec![
                    log(
                        LogLevel::Info,
                        "no other instance heard: not taking the change events".to_string(),
                    ),
                    ServiceEvent::UnsubscribeChanges,
                ],
                PeersEvent::Deaf => vec![log(
                    LogLevel::Warn,
                    format!(
                        "this instance does not hear its own heartbeat on {PRESENCE_SUBJECT} \
                         (the backend user may lack publish or subscribe there): it cannot \
                         tell whether another instance serves, so it takes the change events"
                    ),
                )],
            };
            self.events.extend(events);
        }
    }
}
