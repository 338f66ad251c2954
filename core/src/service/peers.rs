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
const MAX_ID_LEN: usize = 64;

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

#[cfg(test)]
mod tests {
    use super::*;

    const OTHER: &[u8] = b"OTHERINSTANCE";

    /// A single-tenant service of `setting` keeping `known` keys, as `me`.
    fn config(setting: ChangesSetting, known: usize) -> ServiceConfig {
        let mut c = ServiceConfig::new("2.14.0", 1 << 20);
        c.instance_id = "ME".to_string();
        c.changes = setting;
        c.known_capacity = known;
        c
    }

    fn tenancy(setting: ChangesSetting, known: usize, cap: Option<usize>) -> ServiceConfig {
        let mut c = config(setting, known);
        c.bucket.tenancy = Tenancy::Accounts;
        c.tenant_accounts = crate::tenant::TenantAccounts::new(["TA"]).unwrap();
        c.max_leases_per_tenant = cap;
        c
    }

    /// What a service asks about change events and presence, in order:
    /// `sub:<kind>`, `unsub`, `announce`.
    fn asks(s: &mut Service) -> Vec<String> {
        std::iter::from_fn(|| s.poll_event())
            .filter_map(|e| match e {
                ServiceEvent::Subscribe {
                    kind: kind @ (SubscriptionKind::Changes | SubscriptionKind::Presence),
                    ..
                } => Some(format!("sub:{kind:?}")),
                ServiceEvent::UnsubscribeChanges => Some("unsub".to_string()),
                ServiceEvent::Announce { subject, body } => {
                    assert_eq!(subject, PRESENCE_SUBJECT);
                    assert_eq!(body, b"ME");
                    Some("announce".to_string())
                }
                _ => None,
            })
            .collect()
    }

    /// Moves `s` to `at`, firing its timer where due, each heartbeat it sends
    /// heard back (as its own subscription hears it).
    fn until(s: &mut Service, at: Instant) -> Vec<String> {
        until_echoed(s, at, true)
    }

    fn until_echoed(s: &mut Service, at: Instant, echo: bool) -> Vec<String> {
        let mut seen = Vec::new();
        while let Some(due) = s.poll_timeout().filter(|due| *due <= at) {
            s.handle_timeout(due);
            let asked = asks(s);
            if echo && asked.contains(&"announce".to_string()) {
                s.handle_presence(due, b"ME");
                seen.extend(asks(s));
            }
            seen.extend(asked);
        }
        seen
    }

    #[test]
    fn the_setting_reads_auto_and_always_and_refuses_anything_else() {
        assert_eq!("auto".parse(), Ok(ChangesSetting::Auto));
        assert_eq!("always".parse(), Ok(ChangesSetting::Always));
        let err = "true".parse::<ChangesSetting>().unwrap_err();
        assert!(
            err.contains("--changes") && err.contains("auto, always"),
            "{err}"
        );
    }

    #[test]
    fn changes_wanted_by_rule() {
        use ChangesSetting::{Always, Auto};
        use Tenancy::{Accounts, Single};
        // (setting, tenancy, readers, others, wanted)
        let table = [
            (Auto, Single, true, 0, false),    // alone: no change events
            (Auto, Single, true, 1, true),     // a second instance: take them
            (Auto, Single, false, 1, false),   // nothing reads them: never
            (Always, Single, true, 0, true),   // always: from the start
            (Always, Single, false, 0, false), // known 0, no cap: never
            (Auto, Accounts, true, 0, true),   // tenancy: always
            (Auto, Accounts, false, 0, false), // tenancy with nothing reading
        ];
        for (setting, tenancy, readers, others, wanted) in table {
            assert_eq!(
                changes_wanted(setting, tenancy, readers, others),
                wanted,
                "{setting:?} {tenancy:?} readers={readers} others={others}"
            );
        }
    }

    #[test]
    fn alone_no_change_subscription() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Auto, 1024),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        assert_eq!(asks(&mut s), ["sub:Presence", "announce"]);
        // Intervals go by: heartbeats, never a change subscription.
        let seen = until(&mut s, t0 + PRESENCE_EVERY * 10);
        assert!(seen.iter().all(|a| a == "announce"), "{seen:?}");
        assert_eq!(seen.len(), 10, "one heartbeat an interval: {seen:?}");
    }

    #[test]
    fn a_second_instance_appears_subscribe() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Auto, 1024),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        asks(&mut s);
        s.handle_presence(t0 + Duration::from_millis(10), OTHER);
        // Told at once that this one serves too, and subscribed.
        assert_eq!(asks(&mut s), ["announce", "sub:Changes"]);
        // Heard again: nothing new.
        s.handle_presence(t0 + Duration::from_millis(20), OTHER);
        assert_eq!(asks(&mut s), Vec::<String>::new());
    }

    #[test]
    fn it_goes_away_for_the_missed_intervals_unsubscribe() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Auto, 1024),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        asks(&mut s);
        s.handle_presence(t0, OTHER);
        asks(&mut s);
        // Unheard for fewer intervals: still subscribed.
        let seen = until(&mut s, t0 + PRESENCE_EVERY * (PRESENCE_MISSED - 1));
        assert!(!seen.contains(&"unsub".to_string()), "{seen:?}");
        // Unheard for PRESENCE_MISSED intervals: gone, unsubscribed once.
        let seen = until(&mut s, t0 + PRESENCE_EVERY * (PRESENCE_MISSED + 3));
        assert_eq!(seen.iter().filter(|a| *a == "unsub").count(), 1, "{seen:?}");
        // Back: subscribed again.
        s.handle_presence(t0 + PRESENCE_EVERY * 20, OTHER);
        assert!(asks(&mut s).contains(&"sub:Changes".to_string()));
    }

    #[test]
    fn heard_every_interval_it_stays_subscribed() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Auto, 1024),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        asks(&mut s);
        for n in 0..20 {
            s.handle_presence(t0 + PRESENCE_EVERY * n, OTHER);
            let seen = until(&mut s, t0 + PRESENCE_EVERY * n + PRESENCE_EVERY / 2);
            assert!(
                !seen.contains(&"unsub".to_string()),
                "interval {n}: {seen:?}"
            );
        }
    }

    #[test]
    fn deaf_to_its_own_heartbeat_it_takes_the_change_events_until_it_hears_itself() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Auto, 1024),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        asks(&mut s);
        // Fewer intervals unheard: still alone, no events.
        let seen = until_echoed(&mut s, t0 + PRESENCE_EVERY * (PRESENCE_MISSED - 1), false);
        assert!(seen.iter().all(|a| a == "announce"), "{seen:?}");
        // Its own heartbeat unheard for PRESENCE_MISSED intervals: it cannot tell.
        s.handle_timeout(t0 + PRESENCE_EVERY * PRESENCE_MISSED);
        let events: Vec<_> = std::iter::from_fn(|| s.poll_event()).collect();
        assert!(
            events.iter().any(|e| matches!(e, ServiceEvent::Log { level: LogLevel::Warn, line } if line.contains("own heartbeat"))),
            "{events:?}"
        );
        assert!(events.iter().any(|e| matches!(
            e,
            ServiceEvent::Subscribe {
                kind: SubscriptionKind::Changes,
                ..
            }
        )));
        // Heard again, alone: the events go.
        s.handle_presence(t0 + PRESENCE_EVERY * PRESENCE_MISSED, b"ME");
        assert_eq!(asks(&mut s), ["unsub"]);
    }

    #[test]
    fn tenancy_always_takes_change_events_and_hears_no_presence() {
        for (known, cap) in [(1024, None), (0, Some(10)), (1024, Some(10))] {
            let mut s = Service::new(
                tenancy(ChangesSetting::Auto, known, cap),
                OffsetDateTime::UNIX_EPOCH,
                Instant::now(),
            );
            assert_eq!(asks(&mut s), ["sub:Changes"], "known {known} cap {cap:?}");
        }
    }

    #[test]
    fn known_capacity_0_never_subscribes_but_still_announces() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Auto, 0),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        // Its writes are news to the others: it says it serves.
        assert_eq!(asks(&mut s), ["announce"]);
        s.handle_presence(t0, OTHER);
        assert_eq!(asks(&mut s), Vec::<String>::new());
        let mut s = Service::new(
            config(ChangesSetting::Always, 0),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        assert_eq!(asks(&mut s), ["announce"]);
    }

    #[test]
    fn always_subscribes_from_the_start_and_still_announces() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Always, 1024),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        assert_eq!(asks(&mut s), ["sub:Changes", "announce"]);
        s.handle_presence(t0, OTHER);
        assert_eq!(until(&mut s, t0 + PRESENCE_EVERY * 10).len(), 10);
    }

    #[test]
    fn a_heartbeat_that_names_no_other_instance_is_ignored() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Auto, 1024),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        asks(&mut s);
        let long = vec![b'x'; MAX_ID_LEN + 1];
        // Its own id is its echo: heard, it changes nothing here.
        for body in [&b"ME"[..], b"", b"  ", b"\xff\xfe", &long] {
            s.handle_presence(t0, body);
            assert_eq!(asks(&mut s), Vec::<String>::new(), "{body:?}");
        }
    }

    #[test]
    fn a_newcomer_is_answered_at_once_at_most_once_an_interval() {
        let t0 = Instant::now();
        let mut p = Peers::new("ME", true, t0);
        assert_eq!(p.poll_event(), Some(PeersEvent::Announce));
        p.handle_presence(t0, b"A");
        p.handle_presence(t0, b"B");
        let got: Vec<_> = std::iter::from_fn(|| p.poll_event()).collect();
        assert_eq!(got, [PeersEvent::Announce, PeersEvent::Subscribe]);
        p.handle_presence(t0 + PRESENCE_EVERY, b"C");
        assert_eq!(p.poll_event(), Some(PeersEvent::Announce));
    }

    #[test]
    fn forged_ids_cannot_grow_the_map_past_its_bound() {
        let t0 = Instant::now();
        let mut p = Peers::new("ME", true, t0);
        for n in 0..MAX_PEERS * 2 {
            p.handle_presence(t0, n.to_string().as_bytes());
        }
        assert_eq!(p.others(), MAX_PEERS);
    }

    #[test]
    fn a_failed_presence_subscription_takes_the_change_events() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Auto, 1024),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        asks(&mut s);
        s.handle_subscribe_failed(t0, SubscriptionKind::Presence, PRESENCE_SUBJECT, "denied");
        let events: Vec<_> = std::iter::from_fn(|| s.poll_event()).collect();
        assert!(
            events.iter().any(|e| matches!(e, ServiceEvent::Log { level: LogLevel::Warn, line } if line.contains(PRESENCE_SUBJECT))),
            "{events:?}"
        );
        assert!(events.iter().any(|e| matches!(
            e,
            ServiceEvent::Subscribe {
                kind: SubscriptionKind::Changes,
                ..
            }
        )));
        // It still announces, and never unsubscribes.
        let seen = until(&mut s, t0 + PRESENCE_EVERY * 10);
        assert!(seen.iter().all(|a| a == "announce"), "{seen:?}");
    }

    #[test]
    fn stopping_it_announces_nothing_more() {
        let t0 = Instant::now();
        let mut s = Service::new(
            config(ChangesSetting::Auto, 1024),
            OffsetDateTime::UNIX_EPOCH,
            t0,
        );
        asks(&mut s);
        s.handle_stop(t0);
        s.handle_presence(t0, OTHER);
        let seen = until(&mut s, t0 + PRESENCE_EVERY * 3);
        assert!(seen.is_empty(), "{seen:?}");
    }
}
