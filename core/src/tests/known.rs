//! Table tests: renew, release and owner from what the service knows of a key
//! ([`KnownLeases`]): one write and no read when the revision named is known and
//! its holder matches; today's read otherwise; the expiry guard on either stamp.

use std::time::{Duration, Instant};

use super::support::*;
use crate::call::{Call, CallConfig, CallRequest, Operation, expiry_guard};
use crate::known::{Known, KnownLeases, KnownState, Stamp, fact_of_change};
use crate::record::{LeaseEvent, LeaseRecord};
use crate::subjects::{HDR_KV_OPERATION, HDR_MARKER_REASON, HDR_SEQUENCE, HDR_TIME_STAMP};
use crate::wire::{Endpoint, ErrorKind, Response};

const RENEW: &str = r#"{"key":"k","holder":"me","revision":40}"#;
const RELEASE: &str = r#"{"key":"k","holder":"me","revision":40}"#;

fn record(holder: &str, ttl_ms: u64) -> LeaseRecord {
    LeaseRecord {
        holder: holder.into(),
        acquired_at: "2026-09-21T00:00:00Z".into(),
        ttl_ms,
        bound_to: None,
        unknown: Default::default(),
    }
}

/// A map knowing revision `revision` of `k`: `holder`'s record of `ttl_ms`, stored at
/// `stamp`.
fn knowing(revision: u64, holder: &str, ttl_ms: u64, stamp: Stamp) -> KnownLeases {
    let mut known = KnownLeases::new(16);
    known.learn(
        "k",
        Known {
            revision,
            state: KnownState::Held {
                record: record(holder, ttl_ms),
                stamp,
            },
        },
    );
    known
}

/// Stored at the epoch by the server's clock (the call runs a second later).
fn by_server() -> Stamp {
    Stamp {
        server: Some(epoch()),
        sent_before: None,
    }
}

/// A call of `endpoint` with `known`, started now (support::wall on the wall).
fn drive(config: CallConfig, endpoint: Endpoint, body: &str, known: &KnownLeases) -> Drive {
    drive_at(Instant::now(), config, endpoint, body, known)
}

/// [`drive`], started at `now`.
fn drive_at(
    now: Instant,
    config: CallConfig,
    endpoint: Endpoint,
    body: &str,
    known: &KnownLeases,
) -> Drive {
    Drive {
        call: Call::with_known(config, known, endpoint, body.as_bytes(), wall(), now),
        now,
    }
}

fn single() -> CallConfig {
    CallConfig::ready(MAX_PAYLOAD)
}

#[test]
fn a_release_of_a_known_revision_is_one_fenced_tombstone_and_no_read() {
    let known = knowing(40, "me", 15000, by_server());
    let mut d = drive(single(), Endpoint::Release, RELEASE, &known);
    let w = d.write();
    assert_eq!(
        (w.operation, w.expected_revision, w.ttl_ms, w.event),
        (Operation::Delete, 40, None, LeaseEvent::Released)
    );
    d.feed(w.id, ack(41));
    assert_eq!(
        String::from_utf8(d.reply().to_json()).unwrap(),
        r#"{"released":true,"held":false,"key":"k","holder":"me","revision":41}"#
    );
    let (key, fact) = d.call.poll_learnt().expect("the tombstone is learnt");
    assert_eq!((key.as_str(), fact.revision), ("k", 41));
    assert_eq!(fact.state, KnownState::Free);
}

#[test]
fn a_renew_of_a_known_revision_is_one_fenced_write_of_the_known_record_and_no_read() {
    let known = knowing(40, "me", 15000, by_server());
    let body = r#"{"key":"k","holder":"me","revision":40,"ttl_ms":30000}"#;
    let mut d = drive(single(), Endpoint::Renew, body, &known);
    let w = d.write();
    assert_eq!(
        (w.operation, w.expected_revision, w.ttl_ms, w.event),
        (Operation::Put, 40, Some(30000), LeaseEvent::Renewed)
    );
    let written = LeaseRecord::parse(&w.value).unwrap();
    assert_eq!(written.acquired_at, "2026-09-21T00:00:00Z", "kept");
    assert_eq!((written.holder.as_str(), written.ttl_ms), ("me", 30000));
    d.feed(w.id, ack(41));
    let Response::Lease(l) = d.reply() else {
        panic!("expected a lease")
    };
    assert_eq!((l.revision, l.ttl_ms), (41, 30000));
    // Without ttl_ms the known record's TTL is kept.
    let mut d = drive(single(), Endpoint::Renew, RENEW, &known);
    assert_eq!(d.write().ttl_ms, Some(15000));
}

/// The service's own grant, learnt from its ack, is what the next renew and
/// release of that lease act on: each is one write, no read.
#[test]
fn a_renew_or_release_of_a_lease_just_granted_is_one_write() {
    let mut known = KnownLeases::new(16);
    let mut grant = drive(
        single(),
        Endpoint::Acquire,
        r#"{"key":"k","holder":"me","ttl_ms":15000}"#,
        &known,
    );
    let w = grant.write();
    grant.feed(w.id, ack(40));
    let (key, fact) = grant.call.poll_learnt().expect("the grant is learnt");
    assert!(matches!(
        &fact.state,
        KnownState::Held { stamp, .. } if stamp.sent_before.is_some() && stamp.server.is_none()
    ));
    known.learn(&key, fact);
    for (endpoint, body) in [(Endpoint::Renew, RENEW), (Endpoint::Release, RELEASE)] {
        let mut d = drive(single(), endpoint, body, &known);
        let w = d.write();
        assert_eq!(w.expected_revision, 40, "{endpoint:?}");
        d.feed(w.id, ack(41));
        assert!(!matches!(d.reply(), Response::Error(_)), "{endpoint:?}");
    }
}

#[test]
fn a_known_revision_another_write_replaced_reads_and_answers_lost_or_fence_mismatch() {
    let known = knowing(40, "me", 15000, by_server());
    for endpoint in [Endpoint::Renew, Endpoint::Release] {
        for (now_at, kind) in [
            (held(41, "other", 15000, 0), ErrorKind::Lost),
            (marker(41), ErrorKind::Lost),
            (held(42, "me", 15000, 0), ErrorKind::FenceMismatch),
        ] {
            let mut d = drive(single(), endpoint, RENEW, &known);
            let w = d.write();
            d.feed(w.id, wrong_last_sequence());
            let r = d.read();
            d.feed(r.id, now_at);
            assert_eq!(d.error().kind, kind, "{endpoint:?}");
        }
    }
}

/// The revision named holds another holder's record: nothing is written, and one
/// request tells `lost` from `fence_mismatch` (the caller may hold the key now at a
/// revision the service has not learnt yet): on one replica the read, on a
/// replicated bucket a read confirmation of the revision known.
#[test]
fn a_known_revision_held_by_another_is_lost_without_writing() {
    let known = knowing(40, "other", 15000, by_server());
    let replicated = CallConfig::ready(MAX_PAYLOAD).for_replicas(3);
    for endpoint in [Endpoint::Renew, Endpoint::Release] {
        // One replica: the read, and the read's answer.
        let mut d = drive(single(), endpoint, RENEW, &known);
        let r = d.read();
        d.feed(r.id, held(40, "other", 15000, 0));
        let e = d.error();
        assert_eq!(e.kind, ErrorKind::Lost, "{endpoint:?}");
        assert!(
            !e.error.contains("other`"),
            "names the other holder: {}",
            e.error
        );
        let mut d = drive(single(), endpoint, RENEW, &known);
        let r = d.read();
        d.feed(r.id, held(42, "me", 15000, 0));
        assert_eq!(d.error().kind, ErrorKind::FenceMismatch, "{endpoint:?}");
        // Replicated: the known revision confirmed is still the last: lost.
        let mut d = drive(replicated, endpoint, RENEW, &known);
        let c = d.confirm();
        assert_eq!(c.revision, 40);
        d.feed(c.id, ack(41));
        assert_eq!(d.error().kind, ErrorKind::Lost, "{endpoint:?}");
        // The key moved on: the read decides, confirmed (here: the caller holds
        // it now at 42, so its fence 40 is a mismatch).
        let mut d = drive(replicated, endpoint, RENEW, &known);
        let c = d.confirm();
        d.feed(c.id, wrong_last_sequence());
        let r = d.read();
        d.feed(r.id, held(42, "me", 15000, 0));
        let c = d.confirm();
        assert_eq!(c.revision, 42);
        d.feed(c.id, ack(43));
        assert_eq!(d.error().kind, ErrorKind::FenceMismatch, "{endpoint:?}");
    }
}

#[test]
fn a_revision_not_known_or_known_as_no_lease_is_read_first() {
    let free = {
        let mut k = KnownLeases::new(16);
        k.learn(
            "k",
            Known {
                revision: 40,
                state: KnownState::Free,
            },
        );
        k
    };
    let cases = [
        KnownLeases::new(16),
        knowing(39, "me", 15000, by_server()),
        knowing(41, "me", 15000, by_server()),
        knowing(40, "me", 15000, Stamp::default()),
        free,
    ];
    for known in &cases {
        for endpoint in [Endpoint::Renew, Endpoint::Release] {
            let mut d = drive(single(), endpoint, RENEW, known);
            assert!(matches!(d.effect(), CallRequest::KvRead(_)), "{endpoint:?}");
        }
    }
}

/// A known lease within the expiry guard of its end (or past it, not yet marked
/// by the server) is never renewed from what is known: the call reads, and the
/// read's own checks answer (here: `lost`, with no write).
#[test]
fn a_known_lease_at_its_end_by_either_stamp_is_read_and_not_renewed() {
    // 2 s TTL, stored at the epoch by the server's clock; the call at 1 s by its
    // own: 1000 ms left, over the 500 ms guard: written at once.
    let known = knowing(40, "me", 2000, by_server());
    let mut d = drive(single(), Endpoint::Renew, RENEW, &known);
    assert!(matches!(d.effect(), CallRequest::KvWrite(_)));
    // 1 s TTL: at its end by the server's store time.
    let known = knowing(40, "me", 1000, by_server());
    for endpoint in [Endpoint::Renew, Endpoint::Release] {
        let mut d = drive(single(), endpoint, RENEW, &known);
        let r = d.read();
        d.feed(r.id, held(40, "me", 1000, 0));
        assert_eq!(d.error().kind, ErrorKind::Lost, "{endpoint:?}");
    }
    // Known from the service's own write, 1.6 s ago by its monotonic clock, of a
    // 2 s lease: 400 ms left, under the 500 ms guard.
    let t0 = Instant::now();
    let own = Stamp {
        server: None,
        sent_before: Some(t0),
    };
    let known = knowing(40, "me", 2000, own);
    let now = t0 + Duration::from_millis(1600);
    let mut d = drive_at(now, single(), Endpoint::Renew, RENEW, &known);
    assert!(matches!(d.effect(), CallRequest::KvRead(_)));
    // Both stamps known: the nearer end decides (the server's says plenty left).
    let both = Stamp {
        server: Some(wall()),
        sent_before: Some(t0),
    };
    let known = knowing(40, "me", 2000, both);
    let mut d = drive_at(now, single(), Endpoint::Renew, RENEW, &known);
    assert!(matches!(d.effect(), CallRequest::KvRead(_)));
}

/// A renewal made from the service's own write is judged on its monotonic clock:
/// acknowledged more than the guard before the old lease's end as that clock
/// bounds it, renewed with no read-back; later, with no server store time to read
/// back against, `lost`.
#[test]
fn a_renewal_from_an_own_write_is_renewed_only_if_acked_clear_of_the_guard() {
    let t0 = Instant::now();
    let own = Stamp {
        server: None,
        sent_before: Some(t0),
    };
    let known = knowing(40, "me", 15000, own);
    let guard = expiry_guard(15000);
    for (ack_at, renewed) in [
        (
            Duration::from_secs(15) - guard - Duration::from_millis(1),
            true,
        ),
        (Duration::from_secs(15) - guard, false),
    ] {
        let mut d = drive_at(
            t0 + Duration::from_secs(5),
            single(),
            Endpoint::Renew,
            RENEW,
            &known,
        );
        let w = d.write();
        d.now = t0 + ack_at;
        d.feed(w.id, ack(41));
        match d.reply() {
            Response::Lease(l) => assert!(renewed, "renewed at {ack_at:?}: {l:?}"),
            Response::Error(e) => {
                assert!(!renewed, "{e:?}");
                assert_eq!(e.kind, ErrorKind::Lost);
            }
            other => panic!("{other:?}"),
        }
    }
}

/// With the end known by the server's store time, a late ack reads the renewal
/// back as the read path does.
#[test]
fn a_renewal_from_a_known_server_stamp_acked_late_reads_back() {
    let known = knowing(40, "me", 15000, by_server());
    let mut d = drive(single(), Endpoint::Renew, RENEW, &known);
    let w = d.write();
    d.advance(Duration::from_secs(9));
    d.feed(w.id, ack(41));
    let r = d.read();
    // Stored 14.5 s into a 15 s lease by the server's clock: under the guard.
    d.feed(r.id, held(41, "me", 15000, 14_500));
    assert_eq!(d.error().kind, ErrorKind::Lost);
}

#[test]
fn owner_on_a_replicated_bucket_confirms_a_known_revision_without_reading() {
    let replicated = CallConfig::ready(MAX_PAYLOAD).for_replicas(3);
    let known = knowing(40, "x", 15000, by_server());
    let mut d = drive(replicated, Endpoint::Owner, r#"{"key":"k"}"#, &known);
    let c = d.confirm();
    assert_eq!(c.revision, 40);
    d.feed(c.id, ack(41));
    let Response::Lease(l) = d.reply() else {
        panic!("expected a lease")
    };
    assert_eq!((l.holder.as_str(), l.revision), ("x", 40));
    // The key moved on: the confirmation is refused and the call reads.
    let mut d = drive(replicated, Endpoint::Owner, r#"{"key":"k"}"#, &known);
    let c = d.confirm();
    d.feed(c.id, wrong_last_sequence());
    let r = d.read();
    d.feed(r.id, marker(41));
    let c = d.confirm();
    assert_eq!(c.revision, 41);
    d.feed(c.id, ack(42));
    assert!(matches!(d.reply(), Response::Free(_)));
    // One replica: owner reads, as it always did.
    let mut d = drive(single(), Endpoint::Owner, r#"{"key":"k"}"#, &known);
    assert!(matches!(d.effect(), CallRequest::KvRead(_)));
    // Known only from the service's own write, with no server store time: the
    // reply's times would be the service's guess, so owner reads.
    let own_write = Stamp {
        server: None,
        sent_before: Some(Instant::now()),
    };
    let known = knowing(40, "x", 15000, own_write);
    let mut d = drive(replicated, Endpoint::Owner, r#"{"key":"k"}"#, &known);
    assert!(matches!(d.effect(), CallRequest::KvRead(_)));
}

/// A change event states the revision (`Nats-Sequence`), the record and the
/// server's store time (`Nats-Time-Stamp`, nanoseconds as the server writes it);
/// a marker or a tombstone states the key free.
#[test]
fn change_events_teach_the_map_and_an_older_revision_never_replaces_a_newer() {
    let body = record("me", 15000).to_json();
    let headers = |name: &str| match name {
        HDR_SEQUENCE => Some("40"),
        HDR_TIME_STAMP => Some("2026-12-05T02:40:04.123456789Z"),
        _ => None,
    };
    let fact = fact_of_change(headers, &body).unwrap();
    let KnownState::Held { record: r, stamp } = &fact.state else {
        panic!("{fact:?}")
    };
    assert_eq!((fact.revision, r.holder.as_str()), (40, "me"));
    let server = stamp.server.expect("the store time parses");
    assert_eq!(server.nanosecond(), 123_456_789);
    let marker = |name: &str| match name {
        HDR_SEQUENCE => Some("41"),
        HDR_MARKER_REASON => Some("MaxAge"),
        _ => None,
    };
    assert_eq!(fact_of_change(marker, &[]).unwrap().state, KnownState::Free);
    let tombstone = |name: &str| match name {
        HDR_SEQUENCE => Some("41"),
        HDR_KV_OPERATION => Some("DEL"),
        _ => None,
    };
    assert_eq!(
        fact_of_change(tombstone, &[]).unwrap().state,
        KnownState::Free
    );
    assert!(fact_of_change(|_| None, &body).is_none(), "no sequence");

    let mut known = KnownLeases::new(16);
    known.handle_change("dagnats.lease.changed.k", marker, &[]);
    known.handle_change("dagnats.lease.changed.k", headers, &body);
    assert_eq!(known.get("k").unwrap().revision, 41, "older ignored");
    // The same revision learnt from the service's own write and its event: both
    // stamps kept.
    let mut known = KnownLeases::new(16);
    let t0 = Instant::now();
    known.learn(
        "k",
        Known {
            revision: 40,
            state: KnownState::Held {
                record: record("me", 15000),
                stamp: Stamp {
                    server: None,
                    sent_before: Some(t0),
                },
            },
        },
    );
    known.handle_change("dagnats.lease.changed.k", headers, &body);
    let KnownState::Held { stamp, .. } = &known.get("k").unwrap().state else {
        panic!()
    };
    assert_eq!((stamp.server, stamp.sent_before), (Some(server), Some(t0)));
    // A tenant's key is learnt as stored, `<account>.<key>`; other subjects teach
    // nothing.
    known.handle_change("dagnats.lease.changed.TA.k", marker, &[]);
    assert!(known.get("TA.k").is_some() && known.len() == 2);
    for other in [
        "dagnats.lease.changed.a.b.c",
        "dagnats.lease.changed..b",
        "dagnats.lease.changed.",
        "other.k",
    ] {
        known.handle_change(other, marker, &[]);
    }
    assert_eq!(known.len(), 2);
}

#[test]
fn the_map_forgets_the_key_learnt_longest_ago_past_its_capacity() {
    let mut known = KnownLeases::new(2);
    for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
        known.learn(
            key,
            Known {
                revision: i as u64 + 1,
                state: KnownState::Free,
            },
        );
    }
    assert_eq!(known.len(), 2);
    assert!(known.get("a").is_none());
    assert!(known.get("b").is_some() && known.get("c").is_some());
    let mut none = KnownLeases::new(0);
    none.learn(
        "a",
        Known {
            revision: 1,
            state: KnownState::Free,
        },
    );
    assert!(none.is_empty());
}

/// A change event a client forged (the server's republish is not the only
/// publisher a deployment may allow): it names the next revision held by `x`
/// before the victim's own renewal is stored there. The two facts disagree, so
/// the map trusts neither: `x`'s renew of that revision reads first, and is
/// refused by what the stream holds.
#[test]
fn two_facts_that_disagree_about_one_revision_make_the_calls_read_again() {
    let mut known = knowing(41, "x", 15000, by_server());
    known.learn(
        "k",
        Known {
            revision: 41,
            state: KnownState::Held {
                record: record("victim", 15000),
                stamp: by_server(),
            },
        },
    );
    assert_eq!(known.get("k").unwrap().state, KnownState::Other);
    let mut d = drive(
        single(),
        Endpoint::Renew,
        r#"{"key":"k","holder":"x","revision":41}"#,
        &known,
    );
    let r = d.read();
    d.feed(r.id, held(41, "victim", 15000, 0));
    assert_eq!(d.error().kind, ErrorKind::Lost);
    // A later fact of another revision replaces the disputed one.
    known.learn(
        "k",
        Known {
            revision: 42,
            state: KnownState::Free,
        },
    );
    assert_eq!(known.get("k").unwrap().state, KnownState::Free);
    // Held against free disagrees too.
    let mut known = knowing(41, "x", 15000, by_server());
    known.learn(
        "k",
        Known {
            revision: 41,
            state: KnownState::Free,
        },
    );
    assert_eq!(known.get("k").unwrap().state, KnownState::Other);
}
