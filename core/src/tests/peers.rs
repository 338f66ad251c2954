//! The presence heartbeat and the change subscription it decides
//! (`service/peers.rs`): who else serves, by setting and tenancy.

use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::health::LogLevel;

use crate::service::peers::*;
use crate::service::*;
use crate::tenant::Tenancy;

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
