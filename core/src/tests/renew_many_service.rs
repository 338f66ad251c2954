//! The service's `renew_many`: each item its own renew call, gathered into one
//! reply in request order; the rules every request meets, once for the request.

use std::time::Instant;

use serde_json::{Value, json};

use super::service::{acquire, config, ready, replies, serving};
use crate::service::{Received, Service, ServiceConfig, ServiceEvent, SubscriptionKind};
use crate::sim::service_world::ServiceWorld;
use crate::wire::{ErrorKind, RenewManyReply, RenewManyResult, Response};

/// Answers every request in flight until none is left.
fn run(w: &mut ServiceWorld) {
    while !w.in_flight().is_empty() {
        w.deliver(0);
        w.settle().unwrap();
    }
}

/// The fence `holder` was granted `key` at.
fn granted(w: &mut ServiceWorld, holder: &str, key: &str) -> u64 {
    let reply = acquire(w, holder, key);
    run(w);
    match w.reply_to(&reply) {
        Some(Response::Acquired(r)) if r.granted => r.lease.revision,
        other => panic!("{key} not granted to {holder}: {other:?}"),
    }
}

/// The reply to `renew_many` request `reply`: its results, or its one error.
fn answer(w: &ServiceWorld, reply: &str) -> Result<RenewManyReply, ErrorReply> {
    let (_, body) = w
        .many_replies
        .iter()
        .find(|(to, _)| to == reply)
        .unwrap_or_else(|| panic!("{reply} not answered"));
    RenewManyReply::decode(body).expect("a reply of its shape")
}

use crate::wire::ErrorReply;

fn item(key: &str, holder: &str, revision: u64) -> Value {
    json!({"key": key, "holder": holder, "revision": revision, "ttl_ms": 5000})
}

#[test]
fn each_item_is_renewed_with_its_own_new_fence_and_a_lost_one_beside_them() {
    let mut w = serving(config(), 1);
    let a = granted(&mut w, "h", "a");
    let b = granted(&mut w, "h", "b");
    let c = granted(&mut w, "other", "c");
    let d = granted(&mut w, "h", "d");
    let reply = w.request_many(
        json!({"leases": [
            item("a", "h", a),
            item("c", "h", c),   // another holder's: lost
            item("b", "h", b),
            item("d", "h", d + 100), // h's, at a fence that is not current
        ]}),
        true,
    );
    w.settle().unwrap();
    assert!(
        w.many_replies.is_empty(),
        "no reply before every item is in"
    );
    run(&mut w);
    let results = answer(&w, &reply).expect("results").results;
    let keys: Vec<&str> = results.iter().map(RenewManyResult::key).collect();
    assert_eq!(keys, ["a", "c", "b", "d"], "in request order");
    let fence = |r: &RenewManyResult| match r {
        RenewManyResult::Renewed(l) => Some(l.revision),
        RenewManyResult::Failed { .. } => None,
    };
    let kind = |r: &RenewManyResult| match r {
        RenewManyResult::Failed { error, .. } => Some(error.kind),
        RenewManyResult::Renewed(_) => None,
    };
    let (fa, fb) = (fence(&results[0]).unwrap(), fence(&results[2]).unwrap());
    assert!(
        fa > d && fb > d && fa != fb,
        "each its own new fence: {fa}, {fb}"
    );
    assert_eq!(kind(&results[1]), Some(ErrorKind::Lost));
    assert_eq!(kind(&results[3]), Some(ErrorKind::FenceMismatch));
    // Each item is a renew call: the other holder's lease stands.
    let owner = w.request(crate::wire::Endpoint::Owner, json!({"key": "c"}), true);
    w.settle().unwrap();
    run(&mut w);
    w.settle().unwrap();
    match w.reply_to(&owner) {
        Some(Response::Lease(l)) => assert_eq!((l.holder.as_str(), l.revision), ("other", c)),
        other => panic!("{other:?}"),
    }
    assert_eq!(w.service.renew_many_requests(), Some(1));
}

#[test]
fn an_invalid_item_refuses_the_whole_request_and_no_call_runs() {
    let mut w = serving(config(), 1);
    let a = granted(&mut w, "h", "a");
    let table = [
        (
            "a bad key",
            json!({"leases": [item("a", "h", a), item("b.c", "h", 1)]}),
            "leases[1]",
        ),
        (
            "a key twice",
            json!({"leases": [item("a", "h", a), item("a", "h", a)]}),
            "leases[1]",
        ),
        (
            "no revision",
            json!({"leases": [item("a", "h", a), {"key": "b", "holder": "h"}]}),
            "revision",
        ),
        ("none", json!({"leases": []}), "leases"),
        (
            "257",
            json!({"leases": (0..257).map(|i| item(&format!("k{i}"), "h", 1)).collect::<Vec<_>>()}),
            "256",
        ),
    ];
    let twice = format!(
        r#"{{"leases":[{},{{"key":"b","holder":"h","revision":1,"key":"c"}}]}}"#,
        item("a", "h", a)
    );
    let table = table
        .into_iter()
        .map(|(name, body, names)| (name, body.to_string(), names))
        .chain([("a field twice in an item", twice, "duplicate field")]);
    for (name, body, names) in table {
        let reply = w.request_many_bytes(body.as_bytes(), true);
        w.settle().unwrap();
        assert!(w.in_flight().is_empty(), "{name}: a call ran");
        let e = answer(&w, &reply).expect_err("one error");
        assert_eq!(e.kind, ErrorKind::Invalid, "{name}");
        assert!(e.error.contains(names), "{name}: {}", e.error);
    }
}

#[test]
fn the_reply_rule_drops_it_unanswered_and_runs_nothing() {
    let mut w = serving(config(), 1);
    let a = granted(&mut w, "h", "a");
    let reply = w.request_many(json!({"leases": [item("a", "h", a)]}), false);
    w.settle().unwrap();
    assert!(
        w.in_flight().is_empty(),
        "no call for a refused reply subject"
    );
    assert!(w.many_replies.iter().all(|(to, _)| *to != reply));
    assert!(
        w.events
            .iter()
            .any(|e| matches!(e, ServiceEvent::Dropped { .. })),
        "counted"
    );
}

#[test]
fn a_request_larger_than_the_room_left_is_answered_item_by_item_not_refused_whole() {
    let mut c = config();
    c.max_calls_in_flight = 2;
    c.max_calls_waiting = 2;
    let mut w = serving(c, 1);
    let fences: Vec<u64> = (0..5)
        .map(|i| granted(&mut w, "h", &format!("k{i}")))
        .collect();
    let items = json!({"leases": (0..5).map(|i| item(&format!("k{i}"), "h", fences[i])).collect::<Vec<_>>()});
    let reply = w.request_many(items, true);
    w.settle().unwrap();
    assert_eq!(
        w.in_flight().len(),
        2,
        "two run, two wait, the fifth finds no room"
    );
    assert_eq!(w.service.admission_counts().waiting, 2);
    run(&mut w);
    let results = answer(&w, &reply).expect("results, not one error").results;
    let kinds: Vec<Option<ErrorKind>> = results
        .iter()
        .map(|r| match r {
            RenewManyResult::Renewed(_) => None,
            RenewManyResult::Failed { error, .. } => Some(error.kind),
        })
        .collect();
    assert_eq!(
        kinds,
        [None, None, None, None, Some(ErrorKind::Unavailable)],
        "each item its own outcome: four renewed, the one past the room unavailable"
    );
    assert_eq!(w.service.admission_counts().running, 0);
}

#[test]
fn a_groups_waiting_renewals_take_turns_with_a_single_call_that_came_after_them() {
    let mut c = config();
    c.max_calls_in_flight = 1;
    c.max_calls_waiting = 10;
    let mut w = serving(c, 1);
    let fences: Vec<u64> = (0..4)
        .map(|i| granted(&mut w, "h", &format!("k{i}")))
        .collect();
    let items = json!({"leases": (0..4).map(|i| item(&format!("k{i}"), "h", fences[i])).collect::<Vec<_>>()});
    let many = w.request_many(items, true);
    w.settle().unwrap();
    let single = acquire(&mut w, "other", "fresh");
    w.settle().unwrap();
    assert_eq!(
        w.service.admission_counts().waiting,
        4,
        "three renewals and the acquire"
    );
    // Answer one call at a time until the acquire is answered: it started after
    // the group's second renewal, not after all four.
    let mut answered_first = 0;
    while w.reply_to(&single).is_none() {
        w.deliver(0);
        w.settle().unwrap();
        answered_first += 1;
        assert!(answered_first < 100, "the acquire was never answered");
    }
    assert!(
        w.many_replies.iter().all(|(to, _)| *to != many),
        "the acquire is answered before the group's reply"
    );
    run(&mut w);
    let results = answer(&w, &many).expect("results").results;
    assert!(
        results
            .iter()
            .all(|r| matches!(r, RenewManyResult::Renewed(_))),
        "{results:?}"
    );
}

#[test]
fn a_reply_that_could_outgrow_max_payload_is_refused_before_any_item_runs() {
    let t0 = Instant::now();
    let mut c = config();
    c.max_payload = 4 * 1024;
    let (mut s, _) = ready(c, t0);
    let body =
        json!({"leases": (0..5).map(|i| item(&format!("k{i}"), "h", 1)).collect::<Vec<_>>()});
    s.handle_request(
        t0,
        time::OffsetDateTime::UNIX_EPOCH,
        many("_INBOX.a", &body),
    );
    let sent = replies(&mut s);
    let e = RenewManyReply::decode(&sent[0].1)
        .unwrap()
        .expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.error.contains("max_payload"), "{}", e.error);
    assert!(s.poll_transmit().is_none());
}

fn many(reply: &str, body: &Value) -> Received {
    Received {
        subject: "api.leases.renew_many".to_string(),
        reply: Some(reply.to_string()),
        payload: body.to_string().into_bytes(),
        ..Received::default()
    }
}

#[test]
fn while_starting_it_is_answered_unavailable_at_once() {
    let t0 = Instant::now();
    let mut s = Service::new(config(), time::OffsetDateTime::UNIX_EPOCH, t0);
    replies(&mut s);
    let body = json!({"leases": [item("a", "h", 1)]});
    s.handle_request(
        t0,
        time::OffsetDateTime::UNIX_EPOCH,
        many("_INBOX.a", &body),
    );
    let sent = replies(&mut s);
    assert_eq!(sent.len(), 1);
    let e = RenewManyReply::decode(&sent[0].1)
        .unwrap()
        .expect_err("at once");
    assert_eq!(e.kind, ErrorKind::Unavailable);
}

#[test]
fn a_malformed_header_block_is_invalid_and_runs_nothing() {
    let t0 = Instant::now();
    let (mut s, _) = ready(config(), t0);
    let mut m = many("_INBOX.a", &json!({"leases": [item("a", "h", 1)]}));
    m.header_error = Some("a header line without a colon".to_string());
    s.handle_request(t0, time::OffsetDateTime::UNIX_EPOCH, m);
    let sent = replies(&mut s);
    let e = RenewManyReply::decode(&sent[0].1)
        .unwrap()
        .expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(s.poll_transmit().is_none());
}

/// Tenancy: a tenant's request comes in on `api.leases.<account>.renew_many` and
/// renews that tenant's keys only; one not through an import is `forbidden` whole.
#[test]
fn a_tenants_items_renew_its_own_keys_and_a_non_tenant_is_forbidden() {
    let t0 = Instant::now();
    let mut c = config();
    c.bucket.tenancy = crate::tenant::Tenancy::Accounts;
    let (mut s, _) = ready(c, t0);
    let body = json!({"leases": [item("a", "h", 3), item("b", "h", 4)]});
    let mut m = many("_INBOX.x", &body);
    m.subject = "api.leases.TA.renew_many".to_string();
    s.handle_request(t0, time::OffsetDateTime::UNIX_EPOCH, m.clone());
    let sent = replies(&mut s);
    let e = RenewManyReply::decode(&sent[0].1)
        .unwrap()
        .expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Forbidden);
    assert!(s.poll_transmit().is_none(), "no item ran");
    m.reply = Some("_R_.x".to_string());
    m.headers = vec![(
        "Nats-Request-Info".to_string(),
        r#"{"acc":"TA"}"#.to_string(),
    )];
    s.handle_request(t0, time::OffsetDateTime::UNIX_EPOCH, m);
    assert!(replies(&mut s).is_empty());
    let reads: Vec<String> = std::iter::from_fn(|| s.poll_transmit())
        .map(|t| String::from_utf8_lossy(&t.request.payload).into_owned())
        .collect();
    assert_eq!(reads.len(), 2, "{reads:?}");
    for (read, key) in reads.iter().zip(["a", "b"]) {
        assert!(
            read.contains(&format!("$KV.leases.TA.{key}")),
            "the tenant's key: {read}"
        );
    }
}

#[test]
fn off_it_is_neither_subscribed_nor_advertised_nor_answered() {
    let t0 = Instant::now();
    for on in [true, false] {
        let mut c: ServiceConfig = config();
        c.renew_many = on;
        let mut s = Service::new(c.clone(), time::OffsetDateTime::UNIX_EPOCH, t0);
        let api: Vec<String> = std::iter::from_fn(|| s.poll_event())
            .filter_map(|e| match e {
                ServiceEvent::Subscribe {
                    subject,
                    kind: SubscriptionKind::Api,
                    ..
                } => Some(subject),
                _ => None,
            })
            .collect();
        assert_eq!(api.contains(&"api.leases.renew_many".to_string()), on);
        let (mut s, _) = ready(c, t0);
        s.handle_request(
            t0,
            time::OffsetDateTime::UNIX_EPOCH,
            Received {
                subject: "$SRV.INFO.dagnats-api".to_string(),
                reply: Some("_INBOX.i".to_string()),
                ..Received::default()
            },
        );
        let info = replies(&mut s).remove(0).1;
        assert_eq!(
            crate::service::micro::advertises_renew_many(&info),
            on,
            "on: {on}"
        );
        let body = json!({"leases": [item("a", "h", 1)]});
        s.handle_request(
            t0,
            time::OffsetDateTime::UNIX_EPOCH,
            many("_INBOX.a", &body),
        );
        assert_eq!(
            replies(&mut s).len() + usize::from(s.poll_transmit().is_some()),
            usize::from(on)
        );
    }
}

#[test]
fn info_from_another_or_an_older_service_does_not_advertise_it() {
    use crate::service::micro::advertises_renew_many;
    assert!(!advertises_renew_many(b"not json"));
    assert!(!advertises_renew_many(
        br#"{"name":"dagnats-api","endpoints":[{"name":"renew"}]}"#
    ));
    assert!(!advertises_renew_many(
        br#"{"name":"other","endpoints":[{"name":"renew_many"}]}"#
    ));
    assert!(advertises_renew_many(
        br#"{"name":"dagnats-api","endpoints":[{"name":"renew"},{"name":"renew_many"}]}"#
    ));
}
