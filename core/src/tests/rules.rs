//! Table tests: one per rule of leases.md and contract.md, `input -> expected effects`.

use std::time::Duration;

use time::OffsetDateTime;

use super::support::*;
use crate::call::{CallConfig, CallRequest, MAX_ACQUIRE_WRITES, MAX_FORWARD_ATTEMPTS, Operation};
use crate::io::Mode;
use crate::io::RequestOutcome;
use crate::record::{LeaseEvent, LeaseRecord, format_time};
use crate::sim::MsgKind;
use crate::subjects::{
    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_FENCE, HDR_KV_OPERATION, HDR_LEASE_EVENT, HDR_REJECT,
    HDR_TTL,
};
use crate::wire::{Endpoint, ErrorKind, Response};

/// The acquire's create meets an existing key, and its leader read finds `state`.
fn create_conflicts_then_reads(d: &mut Drive, state: RequestOutcome) {
    let w = d.write();
    d.feed(w.id, wrong_last_sequence());
    let r = d.read();
    d.feed(r.id, state);
}

const ACQUIRE: &str = r#"{"key":"k","holder":"me","ttl_ms":15000}"#;

fn acquired(r: Response) -> crate::wire::AcquireReply {
    match r {
        Response::Acquired(a) => a,
        other => panic!("expected an acquire reply, got {other:?}"),
    }
}

#[test]
fn acquire_grants_a_free_key_with_one_create_expecting_no_revision() {
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    let w = d.write();
    assert_eq!(
        (w.key.as_str(), w.expected_revision, w.operation),
        ("k", 0, Operation::Put)
    );
    d.feed(w.id, ack(42));
    let a = acquired(d.reply());
    assert!(a.granted && a.lease.held);
    assert_eq!(
        (a.lease.holder.as_str(), a.lease.revision, a.lease.ttl_ms),
        ("me", 42, 15000)
    );
    assert_eq!(a.lease.acquired_at, format_time(wall()));
    assert_eq!(
        a.lease.expires_at,
        format_time(wall() + Duration::from_secs(15))
    );
}

#[test]
fn every_write_carries_ttl_expected_revision_and_event_headers() {
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    let w = d.write();
    let req = w.nats_request();
    assert_eq!(req.subject, "$KV.leases.k");
    assert_eq!(header(&req, HDR_TTL), Some("15s"));
    assert_eq!(header(&req, HDR_EXPECTED_LAST_SUBJECT_SEQUENCE), Some("0"));
    assert_eq!(header(&req, HDR_LEASE_EVENT), Some("acquired"));
    assert_eq!(header(&req, HDR_KV_OPERATION), None);
    let record = LeaseRecord::parse(&req.payload).unwrap();
    assert_eq!(
        record,
        LeaseRecord {
            holder: "me".into(),
            acquired_at: format_time(wall()),
            ttl_ms: 15000,
            bound_to: None,
            unknown: Default::default(),
        }
    );
}

#[test]
fn acquire_of_a_key_held_by_another_replies_granted_false_naming_that_holder() {
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    create_conflicts_then_reads(&mut d, held(40, "other", 15000, 5000));
    let a = acquired(d.reply());
    assert!(!a.granted);
    assert_eq!((a.lease.holder.as_str(), a.lease.revision), ("other", 40));
    assert_eq!(
        a.lease.expires_at,
        format_time(epoch() + Duration::from_secs(20))
    );
}

#[test]
fn acquire_by_the_current_holder_is_idempotent_same_revision_ttl_not_extended() {
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    create_conflicts_then_reads(&mut d, held(40, "me", 15000, 5000));
    // The reply comes straight from the read: no write, so the TTL is not extended.
    let a = acquired(d.reply());
    assert!(a.granted);
    assert_eq!(a.lease.revision, 40);
    assert_eq!(a.lease.acquired_at, "2026-09-21T00:00:00Z");
    assert_eq!(
        a.lease.expires_at,
        format_time(epoch() + Duration::from_secs(20))
    );
}

#[test]
fn acquire_over_an_expiry_marker_expects_the_marker_revision() {
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    create_conflicts_then_reads(&mut d, marker(17));
    let w = d.write();
    assert_eq!(w.expected_revision, 17);
    assert_eq!(
        w.ttl_ms,
        Some(15000),
        "a create over a marker still carries the TTL"
    );
    d.feed(w.id, ack(18));
    assert_eq!(acquired(d.reply()).lease.revision, 18);
}

#[test]
fn acquire_over_a_tombstone_expects_its_revision() {
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    create_conflicts_then_reads(&mut d, tombstone(9));
    let w = d.write();
    assert_eq!((w.expected_revision, w.event), (9, LeaseEvent::Acquired));
}

#[test]
fn acquire_of_a_key_gone_between_create_and_read_creates_again() {
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    create_conflicts_then_reads(&mut d, no_message());
    let w = d.write();
    assert_eq!(w.expected_revision, 0);
    d.feed(w.id, ack(3));
    assert!(acquired(d.reply()).granted);
}

#[test]
fn acquire_retries_the_create_a_bounded_number_of_times() {
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    let mut writes = 0;
    for _ in 0..20 {
        match d.call.poll_request(&mut owner_ids()) {
            Some(CallRequest::KvWrite(w)) => {
                writes += 1;
                d.feed(w.id, wrong_last_sequence());
            }
            Some(CallRequest::KvRead(r)) => d.feed(r.id, marker(writes)),
            None => {
                assert_eq!(d.reply().error_kind(), Some(ErrorKind::Unavailable));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(d.call.is_done(), "the acquire kept trying");
    assert_eq!(writes, MAX_ACQUIRE_WRITES as u64);
}

#[test]
fn acquire_whose_create_reply_is_lost_is_unavailable_and_a_retry_recovers_the_fence() {
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    let w = d.write();
    d.feed(w.id, RequestOutcome::TimedOut);
    assert_eq!(d.error().kind, ErrorKind::Unavailable);
    // The create landed; the retried acquire finds it and returns it.
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    create_conflicts_then_reads(&mut d, held(5, "me", 15000, 0));
    let a = acquired(d.reply());
    assert!(a.granted);
    assert_eq!(a.lease.revision, 5);
}

const RENEW: &str = r#"{"key":"k","holder":"me","revision":40}"#;

#[test]
fn renew_extends_to_ttl_from_now_and_returns_the_new_fence() {
    let mut d = Drive::new(
        Endpoint::Renew,
        r#"{"key":"k","holder":"me","revision":40,"ttl_ms":30000}"#,
    );
    let r = d.read();
    d.feed(r.id, held(40, "me", 15000, 0));
    let w = d.write();
    assert_eq!(
        (w.expected_revision, w.event, w.ttl_ms),
        (40, LeaseEvent::Renewed, Some(30000))
    );
    let record = LeaseRecord::parse(&w.value).unwrap();
    assert_eq!(
        record.acquired_at, "2026-09-21T00:00:00Z",
        "acquired_at is kept"
    );
    assert_eq!(record.ttl_ms, 30000);
    assert_eq!(header(&w.nats_request(), HDR_TTL), Some("30s"));
    d.feed(w.id, ack(44));
    let Response::Lease(l) = d.reply() else {
        panic!()
    };
    assert_eq!((l.revision, l.ttl_ms), (44, 30000));
    assert_eq!(l.acquired_at, "2026-09-21T00:00:00Z");
    assert_eq!(l.expires_at, format_time(wall() + Duration::from_secs(30)));
}

#[test]
fn renew_without_ttl_ms_keeps_the_lease_ttl() {
    let mut d = Drive::new(Endpoint::Renew, RENEW);
    let r = d.read();
    d.feed(r.id, held(40, "me", 7000, 0));
    assert_eq!(d.write().ttl_ms, Some(7000));
}

#[test]
fn renew_by_another_holder_is_lost() {
    let mut d = Drive::new(Endpoint::Renew, RENEW);
    let r = d.read();
    d.feed(r.id, held(40, "other", 15000, 0));
    assert_eq!(d.error().kind, ErrorKind::Lost);
}

#[test]
fn renew_of_an_expired_or_released_key_is_lost() {
    for state in [marker(41), tombstone(41), no_message()] {
        let mut d = Drive::new(Endpoint::Renew, RENEW);
        let r = d.read();
        d.feed(r.id, state);
        assert_eq!(d.error().kind, ErrorKind::Lost);
    }
}

#[test]
fn renew_with_a_revision_that_is_not_the_current_fence_is_fence_mismatch() {
    for current in [39, 41] {
        let mut d = Drive::new(Endpoint::Renew, RENEW);
        let r = d.read();
        d.feed(r.id, held(current, "me", 15000, 0));
        let e = d.error();
        assert_eq!(e.kind, ErrorKind::FenceMismatch);
        assert!(e.error.contains("revision"), "{}", e.error);
    }
}

#[test]
fn renew_racing_another_write_fails_instead_of_overwriting() {
    let mut d = Drive::new(Endpoint::Renew, RENEW);
    let r = d.read();
    d.feed(r.id, held(40, "me", 15000, 0));
    let w = d.write();
    d.feed(w.id, wrong_last_sequence());
    // It reads again and judges the new state; it never writes without the check.
    let r = d.read();
    d.feed(r.id, held(45, "other", 15000, 0));
    assert_eq!(d.error().kind, ErrorKind::Lost);
}

const RELEASE: &str = r#"{"key":"k","holder":"me","revision":40}"#;

#[test]
fn release_deletes_under_the_fence_with_a_tombstone_without_ttl() {
    let mut d = Drive::new(Endpoint::Release, RELEASE);
    let r = d.read();
    d.feed(r.id, held(40, "me", 15000, 0));
    let w = d.write();
    assert_eq!(
        (w.operation, w.expected_revision, w.ttl_ms, w.event),
        (Operation::Delete, 40, None, LeaseEvent::Released)
    );
    let req = w.nats_request();
    assert_eq!(header(&req, HDR_KV_OPERATION), Some("DEL"));
    assert_eq!(header(&req, HDR_TTL), None);
    assert!(req.payload.is_empty());
    d.feed(w.id, ack(41));
    assert_eq!(
        String::from_utf8(d.reply().to_json()).unwrap(),
        r#"{"released":true,"held":false,"key":"k","holder":"me","revision":41}"#
    );
}

#[test]
fn release_of_an_expired_lease_is_lost() {
    let mut d = Drive::new(Endpoint::Release, RELEASE);
    let r = d.read();
    d.feed(r.id, marker(41));
    assert_eq!(d.error().kind, ErrorKind::Lost);
}

#[test]
fn release_by_another_holder_is_lost_and_with_an_old_fence_is_fence_mismatch() {
    let mut d = Drive::new(Endpoint::Release, RELEASE);
    let r = d.read();
    d.feed(r.id, held(40, "other", 15000, 0));
    assert_eq!(d.error().kind, ErrorKind::Lost);
    let mut d = Drive::new(Endpoint::Release, RELEASE);
    let r = d.read();
    d.feed(r.id, held(43, "me", 15000, 0));
    assert_eq!(d.error().kind, ErrorKind::FenceMismatch);
}

#[test]
fn lost_and_fence_mismatch_texts_name_no_other_holder_and_no_fence_the_caller_did_not_send() {
    for (endpoint, body) in [
        (Endpoint::Release, RELEASE),
        (
            Endpoint::Renew,
            r#"{"key":"k","holder":"me","revision":40,"ttl_ms":15000}"#,
        ),
    ] {
        let mut d = Drive::new(endpoint, body);
        let r = d.read();
        d.feed(r.id, held(40, "stranger-7f3a", 15000, 0));
        let e = d.error();
        assert_eq!(e.kind, ErrorKind::Lost);
        assert!(
            !e.error.contains("stranger-7f3a"),
            "{endpoint:?}: {}",
            e.error
        );
        let mut d = Drive::new(endpoint, body);
        let r = d.read();
        d.feed(r.id, held(4321, "me", 15000, 0));
        let e = d.error();
        assert_eq!(e.kind, ErrorKind::FenceMismatch);
        assert!(!e.error.contains("4321"), "{endpoint:?}: {}", e.error);
        assert!(e.error.contains("field `revision` is 40"), "{}", e.error);
    }
}

#[test]
fn owner_is_a_read_with_no_side_effects() {
    let mut d = Drive::new(Endpoint::Owner, r#"{"key":"k"}"#);
    let r = d.read();
    d.feed(r.id, held(40, "x", 15000, 1000));
    let Response::Lease(l) = d.reply() else {
        panic!()
    };
    assert_eq!((l.holder.as_str(), l.revision, l.ttl_ms), ("x", 40, 15000));
    assert_eq!(l.expires_at, format_time(epoch() + Duration::from_secs(16)));
}

#[test]
fn owner_of_a_free_expired_or_released_key_is_held_false() {
    for state in [no_message(), marker(3), tombstone(3)] {
        let mut d = Drive::new(Endpoint::Owner, r#"{"key":"k"}"#);
        let r = d.read();
        d.feed(r.id, state);
        assert_eq!(
            String::from_utf8(d.reply().to_json()).unwrap(),
            r#"{"held":false,"key":"k"}"#
        );
    }
}

/// Every call that starts with a leader read, with a valid body for key `k`.
const CALLS_THAT_READ_FIRST: [(Endpoint, &str); 4] = [
    (Endpoint::Owner, r#"{"key":"k"}"#),
    (Endpoint::Renew, RENEW),
    (Endpoint::Release, RELEASE),
    (
        Endpoint::Forward,
        r#"{"key":"k","payload":"","timeout_ms":1000}"#,
    ),
];

#[test]
fn every_read_goes_through_the_stream_leader() {
    for (endpoint, body) in CALLS_THAT_READ_FIRST {
        let mut d = Drive::new(endpoint, body);
        let (_, req) = CallRequest::KvRead(d.read()).nats_request();
        assert_eq!(
            req.subject, "$JS.API.STREAM.MSG.GET.KV_leases",
            "not a direct get"
        );
        assert_eq!(req.payload, br#"{"last_by_subj":"$KV.leases.k"}"#);
    }
}

#[test]
fn a_corrupt_record_is_internal_and_left_as_it_is() {
    for (endpoint, body) in CALLS_THAT_READ_FIRST {
        let mut d = Drive::new(endpoint, body);
        let r = d.read();
        d.feed(r.id, corrupt(40));
        assert_eq!(d.error().kind, ErrorKind::Internal, "{endpoint:?}");
    }
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    create_conflicts_then_reads(&mut d, corrupt(40));
    assert_eq!(d.error().kind, ErrorKind::Internal);
}

#[test]
fn a_record_with_a_newer_releases_field_is_held_and_renew_writes_the_field_back() {
    let newer = br#"{"holder":"me","acquired_at":"2026-09-21T00:00:00Z","ttl_ms":15000,"binding":{"acc":"TA","user":"a1"}}"#;
    let stored = || {
        msg(
            40,
            MsgKind::Value,
            vec![(HDR_LEASE_EVENT, "acquired"), ("Nats-TTL", "15s")],
            newer.to_vec(),
            0,
        )
    };
    let mut d = Drive::new(Endpoint::Owner, r#"{"key":"k"}"#);
    let r = d.read();
    d.feed(r.id, stored());
    let Response::Lease(l) = d.reply() else {
        panic!("not read as a lease")
    };
    assert_eq!((l.holder.as_str(), l.revision), ("me", 40));
    let mut d = Drive::new(
        Endpoint::Renew,
        r#"{"key":"k","holder":"me","revision":40,"ttl_ms":20000}"#,
    );
    let r = d.read();
    d.feed(r.id, stored());
    let w = d.write();
    let written: serde_json::Value = serde_json::from_slice(&w.value).unwrap();
    assert_eq!(
        written["binding"],
        serde_json::json!({"acc": "TA", "user": "a1"})
    );
    assert_eq!(written["ttl_ms"], 20000);
}

#[test]
fn a_failed_effect_ends_the_call_with_unavailable_or_internal() {
    let cases = [
        (RequestOutcome::TimedOut, ErrorKind::Unavailable),
        (RequestOutcome::NoResponders, ErrorKind::Unavailable),
        (
            RequestOutcome::Failed("connection closed".into()),
            ErrorKind::Unavailable,
        ),
        (
            crate::sim::api_error(503, 10008, "JetStream system temporarily unavailable"),
            ErrorKind::Unavailable,
        ),
        (
            crate::sim::api_error(404, 10059, "stream not found"),
            ErrorKind::Unavailable,
        ),
        (
            crate::sim::api_error(500, 10999, "something else"),
            ErrorKind::Internal,
        ),
        (RequestOutcome::reply("not json"), ErrorKind::Internal),
    ];
    for (outcome, kind) in cases {
        // A failed read ends renew before any write.
        let mut d = Drive::new(Endpoint::Renew, RENEW);
        let r = d.read();
        d.feed(r.id, outcome.clone());
        assert_eq!(d.error().kind, kind, "read {outcome:?}");
        // A failed write ends acquire without another write.
        let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
        let w = d.write();
        d.feed(w.id, outcome.clone());
        assert_eq!(d.error().kind, kind, "write {outcome:?}");
    }
}

#[test]
fn an_outcome_for_another_effect_is_ignored() {
    let mut d = Drive::new(Endpoint::Owner, r#"{"key":"k"}"#);
    let r = d.read();
    d.call
        .handle_outcome(d.now, crate::io::TransmitId(r.id.0 + 9), no_message());
    assert!(d.call.poll_request(&mut owner_ids()).is_none() && !d.call.is_done());
    d.feed(r.id, no_message());
    assert!(matches!(d.reply(), Response::Free(_)));
}

const FORWARD: &str = r#"{"key":"k","payload":"AAEC/w==","timeout_ms":2000}"#;

fn forward_to_owner(d: &mut Drive, holder: &str, revision: u64) -> crate::call::InboxRequest {
    let r = d.read();
    d.feed(r.id, held(revision, holder, 15000, 0));
    d.inbox()
}

#[test]
fn forward_sends_the_decoded_payload_to_the_holder_inbox_with_the_fence_header() {
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    let i = forward_to_owner(&mut d, "own", 42);
    let req = i.nats_request();
    assert_eq!(req.subject, "dagnats.lease.inbox.own.k");
    assert_eq!(header(&req, HDR_FENCE), Some("42"));
    assert_eq!(req.payload, vec![0, 1, 2, 255]);
    assert_eq!(req.timeout, Duration::from_millis(2000));
    d.feed(i.id, RequestOutcome::reply(vec![9, 8]));
    assert_eq!(
        String::from_utf8(d.reply().to_json()).unwrap(),
        r#"{"payload":"CQg=","key":"k","holder":"own","revision":42}"#
    );
}

#[test]
fn forward_to_a_key_nobody_holds_is_not_held() {
    for state in [no_message(), marker(4), tombstone(4)] {
        let mut d = Drive::new(Endpoint::Forward, FORWARD);
        let r = d.read();
        d.feed(r.id, state);
        let e = d.error();
        assert_eq!(
            (e.kind, e.holder, e.revision),
            (ErrorKind::NotHeld, None, None)
        );
    }
}

#[test]
fn forward_retries_a_new_owner_after_no_responders_or_a_reject() {
    for first in [
        RequestOutcome::NoResponders,
        RequestOutcome::Reply {
            headers: vec![(HDR_REJECT.into(), "stale".into())],
            payload: vec![],
        },
    ] {
        let mut d = Drive::new(Endpoint::Forward, FORWARD);
        let i = forward_to_owner(&mut d, "old", 42);
        d.feed(i.id, first);
        let i = forward_to_owner(&mut d, "new", 50);
        assert_eq!((i.holder.as_str(), i.fence), ("new", 50));
        d.feed(i.id, RequestOutcome::reply(b"ok".to_vec()));
        let Response::Forwarded(f) = d.reply() else {
            panic!()
        };
        assert_eq!((f.holder.as_str(), f.revision), ("new", 50));
    }
}

#[test]
fn forward_to_the_same_owner_after_no_responders_is_owner_unavailable_naming_it() {
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    let i = forward_to_owner(&mut d, "own", 42);
    d.feed(i.id, RequestOutcome::NoResponders);
    let r = d.read();
    d.feed(r.id, held(42, "own", 15000, 0));
    let e = d.error();
    assert_eq!(
        (e.kind, e.holder.as_deref(), e.revision),
        (ErrorKind::OwnerUnavailable, Some("own"), Some(42))
    );
}

#[test]
fn forward_rejected_by_an_owner_that_stays_is_owner_rejected() {
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    let i = forward_to_owner(&mut d, "own", 42);
    d.feed(
        i.id,
        RequestOutcome::Reply {
            headers: vec![(HDR_REJECT.into(), "stale".into())],
            payload: vec![],
        },
    );
    let r = d.read();
    d.feed(r.id, held(42, "own", 15000, 0));
    assert_eq!(d.error().kind, ErrorKind::OwnerRejected);
}

#[test]
fn forward_whose_owner_left_during_a_retry_is_not_held_naming_the_last_tried() {
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    let i = forward_to_owner(&mut d, "own", 42);
    d.feed(i.id, RequestOutcome::NoResponders);
    let r = d.read();
    d.feed(r.id, marker(43));
    let e = d.error();
    assert_eq!(
        (e.kind, e.holder.as_deref()),
        (ErrorKind::NotHeld, Some("own"))
    );
}

#[test]
fn forward_makes_at_most_three_attempts() {
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    let mut attempts = 0u64;
    for _ in 0..20 {
        match d.call.poll_request(&mut owner_ids()) {
            Some(CallRequest::KvRead(r)) => d.feed(r.id, held(40 + attempts, "own", 15000, 0)),
            Some(CallRequest::InboxRequest(i)) => {
                attempts += 1;
                d.feed(i.id, RequestOutcome::NoResponders);
            }
            None => {
                assert_eq!(d.reply().error_kind(), Some(ErrorKind::OwnerUnavailable));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(d.call.is_done(), "the forward kept trying");
    assert_eq!(attempts, u64::from(MAX_FORWARD_ATTEMPTS));
}

#[test]
fn forward_timeout_is_never_retried() {
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    let i = forward_to_owner(&mut d, "own", 42);
    d.feed(i.id, RequestOutcome::TimedOut);
    let e = d.error();
    assert_eq!(
        (e.kind, e.holder.as_deref(), e.revision),
        (ErrorKind::OwnerTimeout, Some("own"), Some(42))
    );
}

#[test]
fn forward_timeout_ms_bounds_the_whole_call() {
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    assert_eq!(
        d.call.poll_timeout(),
        Some(d.now + Duration::from_millis(2000))
    );
    let r = d.read();
    d.advance(Duration::from_millis(1500));
    d.feed(r.id, held(42, "own", 15000, 0));
    let i = d.inbox();
    assert_eq!(
        i.timeout,
        Duration::from_millis(500),
        "the inbox gets only what is left"
    );
    d.advance(Duration::from_millis(499));
    d.call.handle_timeout(d.now);
    assert!(d.call.poll_request(&mut owner_ids()).is_none(), "not yet");
    d.advance(Duration::from_millis(1));
    d.call.handle_timeout(d.now);
    assert_eq!(d.error().kind, ErrorKind::OwnerTimeout);
    // A late reply changes nothing.
    d.call
        .handle_outcome(d.now, i.id, RequestOutcome::reply(b"late".to_vec()));
    assert!(d.call.poll_request(&mut owner_ids()).is_none());
}

/// The deadline passes while a forward re-reads the lease after its owner had no
/// responder or rejected it: the core decides `owner_timeout` from `now`, whatever
/// the re-read found and whichever the adapter's timer or the read's own timeout
/// comes first.
#[test]
fn forward_whose_deadline_passes_during_a_reread_is_owner_timeout() {
    let reject = || RequestOutcome::Reply {
        headers: vec![(HDR_REJECT.into(), "stale".into())],
        payload: vec![],
    };
    type Reread = (&'static str, fn() -> RequestOutcome);
    let rereads: [Reread; 4] = [
        ("the same owner", || held(42, "own", 15000, 0)),
        ("a new owner", || held(50, "new", 15000, 0)),
        ("nobody", || marker(43)),
        ("the read's own timeout", || RequestOutcome::TimedOut),
    ];
    for first in [RequestOutcome::NoResponders, reject()] {
        for (what, reread) in rereads {
            let mut d = Drive::new(Endpoint::Forward, FORWARD);
            let i = forward_to_owner(&mut d, "own", 42);
            d.advance(Duration::from_millis(1200));
            d.feed(i.id, first.clone());
            let r = d.read();
            assert_eq!(
                r.timeout,
                Duration::from_millis(800),
                "bounded by the deadline"
            );
            d.advance(Duration::from_millis(800));
            d.feed(r.id, reread());
            let e = d.error();
            assert_eq!(
                (e.kind, e.holder.as_deref(), e.revision),
                (ErrorKind::OwnerTimeout, Some("own"), Some(42)),
                "{first:?}, then a re-read finding {what}"
            );
        }
    }
    // The same on a replicated bucket: the confirmation of the re-read comes back late.
    let mut d = Drive::replicated(Endpoint::Forward, FORWARD);
    let r = d.read();
    d.feed(r.id, held(42, "own", 15000, 0));
    let c = d.confirm();
    d.feed(c.id, ack(60));
    let i = d.inbox();
    d.feed(i.id, RequestOutcome::NoResponders);
    let r = d.read();
    d.feed(r.id, held(42, "own", 15000, 0));
    let c = d.confirm();
    d.advance(Duration::from_millis(2000));
    d.feed(c.id, ack(61));
    assert_eq!(d.error().kind, ErrorKind::OwnerTimeout);
    // An owner's no-responders at the deadline is not followed by a zero-time read.
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    let i = forward_to_owner(&mut d, "own", 42);
    d.advance(Duration::from_millis(2000));
    d.feed(i.id, RequestOutcome::NoResponders);
    assert_eq!(d.error().kind, ErrorKind::OwnerTimeout);
}

/// leases.md: "dagnats stopping mid-call is internal". A call cut off by the
/// service's shutdown, whatever it waits on, ends with one `internal` reply; an
/// outcome that comes back afterwards changes nothing, and a call that has
/// replied already is left as it is.
#[test]
fn a_call_cut_off_by_the_service_stopping_is_internal() {
    let stopping = |d: &mut Drive| {
        d.call.handle_stop(d.now);
        let e = d.error();
        assert_eq!(e.kind, ErrorKind::Internal);
        assert!(
            e.error.starts_with("the service is stopping"),
            "{}",
            e.error
        );
        e
    };
    // Waiting on its create.
    let mut d = Drive::new(Endpoint::Acquire, ACQUIRE);
    let w = d.write();
    stopping(&mut d);
    d.call.handle_outcome(d.now, w.id, ack(5));
    assert!(
        d.call.poll_request(&mut owner_ids()).is_none(),
        "a late ack changes nothing"
    );
    // Waiting on a leader read.
    let mut d = Drive::new(Endpoint::Owner, r#"{"key":"k"}"#);
    let r = d.read();
    stopping(&mut d);
    d.call.handle_outcome(d.now, r.id, no_message());
    assert!(d.call.poll_request(&mut owner_ids()).is_none());
    // Waiting on a read confirmation.
    let mut d = Drive::replicated(Endpoint::Owner, r#"{"key":"k"}"#);
    let r = d.read();
    d.feed(r.id, held(42, "own", 15000, 0));
    let _ = d.confirm();
    stopping(&mut d);
    // A forward waiting on a silent owner names the owner it tried.
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    let _ = forward_to_owner(&mut d, "own", 42);
    let e = stopping(&mut d);
    assert_eq!((e.holder.as_deref(), e.revision), (Some("own"), Some(42)));
    assert_eq!(d.call.poll_timeout(), None, "no deadline left to wait for");
    // A forward whose deadline passed before the stop is what it would have been.
    let mut d = Drive::new(Endpoint::Forward, FORWARD);
    let _ = forward_to_owner(&mut d, "own", 42);
    d.advance(Duration::from_millis(2000));
    d.call.handle_stop(d.now);
    assert_eq!(d.error().kind, ErrorKind::OwnerTimeout);
    // A call that has replied (or is about to: its reply is queued) keeps its reply.
    let mut d = Drive::new(Endpoint::Owner, r#"{"key":"k"}"#);
    let r = d.read();
    d.feed(r.id, no_message());
    d.call.handle_stop(d.now);
    assert!(matches!(d.reply(), Response::Free(_)));
    d.call.handle_stop(d.now);
    assert!(d.call.poll_request(&mut owner_ids()).is_none());
    let mut d = Drive::new(Endpoint::Owner, "not json");
    d.call.handle_stop(d.now);
    assert_eq!(d.error().kind, ErrorKind::Invalid);
}

#[test]
fn forward_reply_that_does_not_fit_max_payload_is_reply_too_large() {
    let max = 1000;
    let config = CallConfig {
        max_payload: max,
        ..CallConfig::ready(max)
    };
    // {"payload":"<b64>","key":"k","holder":"own","revision":42} is 46 bytes + the base64.
    let wrapper = r#"{"payload":"","key":"k","holder":"own","revision":42}"#.len();
    let fits = (max - wrapper) / 4 * 3;
    for (size, ok) in [(fits, true), (fits + 1, false)] {
        let mut d = Drive::with_config(config, Endpoint::Forward, FORWARD);
        let i = forward_to_owner(&mut d, "own", 42);
        d.feed(i.id, RequestOutcome::reply(vec![1u8; size]));
        let reply = d.reply();
        assert!(reply.to_json().len() <= max || !ok);
        match ok {
            true => assert!(matches!(reply, Response::Forwarded(_)), "{size}: {reply:?}"),
            false => assert_eq!(reply.error_kind(), Some(ErrorKind::ReplyTooLarge), "{size}"),
        }
    }
}

#[test]
fn a_server_without_per_message_ttl_answers_unsupported_on_every_subject() {
    let config = CallConfig {
        mode: Mode::Unsupported,
        ..CallConfig::ready(MAX_PAYLOAD)
    };
    for endpoint in Endpoint::ALL {
        let mut d = Drive::with_config(config, endpoint, "{}");
        assert_eq!(d.error().kind, ErrorKind::Unsupported);
    }
}

#[test]
fn calls_before_the_bucket_is_ready_are_unavailable() {
    let config = CallConfig {
        mode: Mode::Starting,
        ..CallConfig::ready(MAX_PAYLOAD)
    };
    let mut d = Drive::with_config(config, Endpoint::Owner, r#"{"key":"k"}"#);
    assert_eq!(d.error().kind, ErrorKind::Unavailable);
}

#[test]
fn an_invalid_request_is_rejected_before_any_kv_effect() {
    for endpoint in Endpoint::ALL {
        for body in crate::test_support::invalid_bodies(endpoint) {
            let mut d = Drive::new(endpoint, &body);
            let e = d.error();
            assert_eq!(e.kind, ErrorKind::Invalid, "{endpoint:?} {body}");
        }
    }
}

/// The server's expiry is a check and then a marker that rolls the key up: a renew
/// landing between the two is acknowledged, then wiped. So renew and release of a
/// lease with less than the guard left (by its store time) are `lost`, unwritten.
#[test]
fn renew_and_release_of_a_lease_at_its_end_are_lost_without_a_write() {
    use crate::call::{MAX_EXPIRY_GUARD, expiry_guard};
    assert_eq!(expiry_guard(2_000), Duration::from_millis(500));
    assert_eq!(expiry_guard(15_000), MAX_EXPIRY_GUARD);
    for (endpoint, body) in [
        (Endpoint::Renew, r#"{"key":"k","holder":"me","revision":7}"#),
        (
            Endpoint::Release,
            r#"{"key":"k","holder":"me","revision":7}"#,
        ),
    ] {
        // Written at the epoch; the call runs a second later (support::wall).
        // 2 s TTL: 1000 ms left, over the 500 ms guard: written.
        let mut d = Drive::new(endpoint, body);
        let r = d.read();
        d.feed(r.id, held(7, "me", 2000, 0));
        assert!(matches!(d.effect(), CallRequest::KvWrite(w) if w.expected_revision == 7));
        // The same read answered 600 ms later: 400 ms left, under the guard.
        let mut d = Drive::new(endpoint, body);
        let r = d.read();
        d.advance(Duration::from_millis(600));
        d.feed(r.id, held(7, "me", 2000, 0));
        let e = d.error();
        assert_eq!(e.kind, ErrorKind::Lost, "{e:?}");
        assert!(e.error.contains("at its end"), "{}", e.error);
        // Past its end but not yet marked by the server: lost too.
        let mut d = Drive::new(endpoint, body);
        let r = d.read();
        d.feed(r.id, held(7, "me", 1000, 0));
        assert_eq!(d.error().kind, ErrorKind::Lost);
    }
}

/// A renewal that lands within the expiry guard of the end of the lease it renews
/// (or after it) may be wiped by that lease's expiry marker (nats-server 2.14,
/// README Fault tests): it is `lost`, not a renewal. The end is the server's (the
/// old revision's store time + TTL), so it is judged on the server's clock: a renew
/// acknowledged in the second half of the old lease (by the service's clock) reads
/// the key back through the stream leader and compares its own message's store
/// time. `renew_acked` runs a renew of revision 40 (TTL 15 s, stored at `old_ms`)
/// on a service whose clock reads `wall` at the start, acknowledged at 41.
fn renew_acked(config: CallConfig, wall: OffsetDateTime, old_ms: u64, ack_after_ms: u64) -> Drive {
    let mut d = Drive::at_wall(config, Endpoint::Renew, RENEW, wall);
    let r = d.read();
    d.feed(r.id, held(40, "me", 15000, old_ms));
    let w = d.write();
    assert_eq!(w.expected_revision, 40);
    d.advance(Duration::from_millis(ack_after_ms));
    d.feed(w.id, ack(41));
    d
}

fn single() -> CallConfig {
    CallConfig::ready(MAX_PAYLOAD)
}

/// The service clock lags the server's by 2 s. The old lease was stored at server
/// time epoch + 6.5 s (TTL 15 s: it ends at 21.5 s); the call starts at 20 s by the
/// service's clock, 22 s by the server's. By the service's clock 1.5 s are left,
/// over the 1 s guard, so it writes; the write lands at 22.01 s, after the end.
#[test]
fn a_renewal_landing_after_the_end_by_the_servers_clock_is_lost_though_the_service_clock_lags() {
    let service = epoch() + Duration::from_secs(20);
    let mut d = renew_acked(single(), service, 6_500, 10);
    let rb = d.read();
    assert_eq!(rb.key, "k");
    // Stored 2.01 s after the call began by the service's clock: the server's.
    d.feed(rb.id, held(41, "me", 15000, 22_010));
    let e = d.error();
    assert_eq!(e.kind, ErrorKind::Lost, "{e:?}");
    assert!(e.error.contains("revision 41"), "{}", e.error);
    // Within the guard before the end (stored at 20.6 s of 21.5 s): lost too.
    let mut d = renew_acked(single(), service, 6_500, 10);
    let rb = d.read();
    d.feed(rb.id, held(41, "me", 15000, 20_600));
    assert_eq!(d.error().kind, ErrorKind::Lost);
    // Gone already: the old lease's marker wiped it (or nothing is left).
    for state in [marker(42), no_message()] {
        let mut d = renew_acked(single(), service, 6_500, 10);
        let rb = d.read();
        d.feed(rb.id, state);
        let e = d.error();
        assert_eq!(e.kind, ErrorKind::Lost);
        assert!(e.error.contains("gone"), "{}", e.error);
    }
}

/// The same lag, a renew well inside the lease (stored at 16 s, 9 s of 15 left by
/// the server's clock when the call starts): renewed, with no read-back.
#[test]
fn a_renewal_well_inside_the_lease_is_renewed_without_a_read_back() {
    let service = epoch() + Duration::from_secs(20);
    let mut d = renew_acked(single(), service, 16_000, 10);
    let Response::Lease(l) = d.reply() else {
        panic!("expected the lease")
    };
    assert_eq!(l.revision, 41);
}

/// Which acks read back: from the second half of the old lease on, by the service's
/// clock (old lease stored at 0, TTL 15 s; call at 1 s). A renew every ttl/3 is
/// acknowledged about 5 s in: no read. The read-back decides either way, also
/// against a service clock running ahead (acked after the end by it, stored 2 s
/// before the end by the server's): renewed.
#[test]
fn a_renew_reads_back_from_the_second_half_of_the_lease_on_and_the_stored_time_decides() {
    for (ack_after_ms, reads_back) in [(4_000, false), (6_499, false), (6_500, true)] {
        let mut d = renew_acked(single(), wall(), 0, ack_after_ms);
        match d.call.poll_request(&mut owner_ids()) {
            Some(CallRequest::KvRead(_)) => assert!(reads_back, "read back at {ack_after_ms}"),
            None => match d.reply() {
                Response::Lease(l) => {
                    assert!(!reads_back, "no read-back at {ack_after_ms}");
                    assert_eq!(l.revision, 41);
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }
    let mut d = renew_acked(single(), wall(), 0, 15_000);
    let rb = d.read();
    d.feed(rb.id, held(41, "me", 15000, 13_000));
    assert!(matches!(d.reply(), Response::Lease(l) if l.revision == 41));
    // 14 s: within the 1 s guard of the 15 s end.
    let mut d = renew_acked(single(), wall(), 0, 15_000);
    let rb = d.read();
    d.feed(rb.id, held(41, "me", 15000, 14_000));
    assert_eq!(d.error().kind, ErrorKind::Lost);
}

/// On a replicated bucket the read-back is confirmed like any read: a deposed
/// leader showing the key before the renewal (or without it) is refuted by the
/// confirmation, and the call reads again.
#[test]
fn a_renewals_read_back_is_confirmed_on_a_replicated_bucket() {
    let replicated = single().for_replicas(3);
    let mut d = renew_acked(replicated, wall(), 0, 10_000);
    let stale = d.read();
    d.feed(stale.id, held(40, "me", 15000, 0));
    let c = d.confirm();
    assert_eq!(c.revision, 40);
    d.feed(c.id, wrong_last_sequence());
    let fresh = d.read();
    d.feed(fresh.id, held(41, "me", 15000, 11_000));
    let c = d.confirm();
    assert_eq!(c.revision, 41);
    d.feed(c.id, ack(42));
    assert!(matches!(d.reply(), Response::Lease(l) if l.revision == 41));
}

/// A read-back that fails leaves the renewal's landing time unknown: `unavailable`,
/// as a write whose ack was lost.
#[test]
fn a_failed_read_back_is_unavailable() {
    let mut d = renew_acked(single(), wall(), 0, 10_000);
    let rb = d.read();
    d.feed(rb.id, RequestOutcome::TimedOut);
    let e = d.error();
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert!(e.error.contains("revision 41"), "{}", e.error);
}

/// The call keeps its own request deadlines: an effect unanswered within its timeout
/// times out in `handle_timeout` (the adapter arms one timer from `poll_timeout`),
/// and its late outcome is ignored.
#[test]
fn an_effect_unanswered_within_its_timeout_times_out_in_the_call() {
    let mut d = Drive::new(Endpoint::Owner, r#"{"key":"k"}"#);
    let r = d.read();
    let due = d.now + r.timeout;
    assert_eq!(d.call.poll_timeout(), Some(due));
    d.call.handle_timeout(due - Duration::from_millis(1));
    assert!(
        d.call.poll_request(&mut owner_ids()).is_none(),
        "not before its timeout"
    );
    d.call.handle_timeout(due);
    let e = d.error();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{}", e.error);
    assert!(d.call.is_done());
    assert_eq!(d.call.poll_timeout(), None, "nothing left to wait for");
    d.call.handle_outcome(due, r.id, held(3, "me", 15000, 0));
    assert!(
        d.call.poll_request(&mut owner_ids()).is_none(),
        "a late outcome changes nothing"
    );
}
