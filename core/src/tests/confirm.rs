//! Table tests of read confirmation: on a replicated bucket every read a call
//! answers from is confirmed by a conditional write before the reply; a write that
//! commits confirms itself; a single replica confirms nothing.

use std::time::Duration;

use super::support::*;
use crate::call::{CallConfig, CallRequest, MAX_READ_CONFIRMS};
use crate::io::RequestOutcome;
use crate::subjects::{
    HDR_EXPECTED_LAST_SUBJECT_SEQUENCE, HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT, HDR_TTL,
};
use crate::wire::{Endpoint, ErrorKind, Response};

const OWNER: &str = r#"{"key":"k"}"#;
const ACQUIRE: &str = r#"{"key":"k","holder":"me","ttl_ms":15000}"#;
const RENEW: &str = r#"{"key":"k","holder":"me","revision":7}"#;
const RELEASE: &str = r#"{"key":"k","holder":"me","revision":7}"#;
const FORWARD: &str = r#"{"key":"k","payload":"aGk=","timeout_ms":2000}"#;

/// Reads `state`, then confirms it (expecting `revision`) with `outcome`.
fn read_and_confirm(d: &mut Drive, state: RequestOutcome, revision: u64, outcome: RequestOutcome) {
    let r = d.read();
    d.feed(r.id, state);
    let c = d.confirm();
    assert_eq!(
        c.revision, revision,
        "the confirmation expects the revision read"
    );
    d.feed(c.id, outcome);
}

#[test]
fn a_confirmation_is_a_conditional_publish_to_the_keys_read_subject() {
    let mut d = Drive::replicated(Endpoint::Owner, OWNER);
    let r = d.read();
    d.feed(r.id, held(7, "own", 15000, 0));
    let c = d.confirm();
    let req = c.nats_request();
    assert_eq!(req.subject, "$KV.leases.k.read");
    assert_eq!(header(&req, HDR_EXPECTED_LAST_SUBJECT_SEQUENCE), Some("7"));
    assert_eq!(
        header(&req, HDR_EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT),
        Some("$KV.leases.k")
    );
    assert_eq!(header(&req, HDR_TTL), Some("1s"));
    assert!(req.payload.is_empty());
    assert!(
        d.call.poll_request(&mut owner_ids()).is_none(),
        "no reply before the confirmation"
    );
    d.feed(c.id, ack(8));
    let Response::Lease(l) = d.reply() else {
        panic!("expected the lease")
    };
    assert_eq!((l.holder.as_str(), l.revision), ("own", 7));
}

#[test]
fn a_free_key_is_confirmed_against_the_sequence_read_or_0_when_never_written() {
    for (state, revision) in [(no_message(), 0), (marker(4), 4), (tombstone(5), 5)] {
        let mut d = Drive::replicated(Endpoint::Owner, OWNER);
        read_and_confirm(&mut d, state, revision, ack(9));
        assert!(matches!(d.reply(), Response::Free(_)));
    }
}

#[test]
fn a_single_replica_bucket_answers_from_the_read() {
    let mut d = Drive::new(Endpoint::Owner, OWNER);
    let r = d.read();
    d.feed(r.id, held(7, "own", 15000, 0));
    assert!(matches!(d.reply(), Response::Lease(_)));
    assert!(!CallConfig::ready(MAX_PAYLOAD).for_replicas(1).confirm_reads);
    assert!(CallConfig::ready(MAX_PAYLOAD).for_replicas(3).confirm_reads);
}

#[test]
fn a_confirmation_refused_because_the_key_moved_on_reads_again() {
    let mut d = Drive::replicated(Endpoint::Owner, OWNER);
    read_and_confirm(&mut d, held(7, "old", 15000, 0), 7, wrong_last_sequence());
    read_and_confirm(&mut d, held(9, "new", 15000, 0), 9, ack(10));
    let Response::Lease(l) = d.reply() else {
        panic!("expected the lease")
    };
    assert_eq!((l.holder.as_str(), l.revision), ("new", 9));
}

#[test]
fn a_confirmation_refused_while_a_write_to_the_key_is_in_flight_reads_again() {
    let in_flight = crate::sim::api_error(400, 10164, "wrong last sequence");
    let mut d = Drive::replicated(Endpoint::Owner, OWNER);
    read_and_confirm(&mut d, held(7, "old", 15000, 0), 7, in_flight.clone());
    read_and_confirm(&mut d, held(9, "new", 15000, 0), 9, ack(10));
    assert!(matches!(d.reply(), Response::Lease(l) if l.revision == 9));
    // The same code on a create: the key is changing, read it and try again.
    let mut d = Drive::replicated(Endpoint::Acquire, ACQUIRE);
    let w = d.write();
    d.feed(w.id, in_flight);
    let r = d.read();
    d.feed(r.id, marker(11));
    assert_eq!(d.write().expected_revision, 11);
}

#[test]
fn confirmations_are_bounded_then_unavailable() {
    let mut d = Drive::replicated(Endpoint::Owner, OWNER);
    for n in 0..MAX_READ_CONFIRMS {
        read_and_confirm(
            &mut d,
            held(7 + u64::from(n), "own", 15000, 0),
            7 + u64::from(n),
            wrong_last_sequence(),
        );
    }
    let r = d.read();
    d.feed(r.id, held(20, "own", 15000, 0));
    let e = d.error();
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert!(e.error.contains("confirmed"), "{}", e.error);
}

#[test]
fn an_unconfirmed_read_never_reaches_the_caller() {
    // What a deposed leader does with a write it cannot commit: no ack in time.
    for outcome in [
        RequestOutcome::TimedOut,
        RequestOutcome::NoResponders,
        crate::sim::api_error(503, 10008, "JetStream system temporarily unavailable"),
    ] {
        let mut d = Drive::replicated(Endpoint::Owner, OWNER);
        read_and_confirm(&mut d, held(7, "stale", 15000, 0), 7, outcome);
        let e = d.error();
        assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
        assert!(!e.error.contains("stale\""));
    }
}

#[test]
fn acquire_confirms_granted_false_and_the_repeat_grant_but_not_its_own_create() {
    // Its own create commits: that is the confirmation.
    let mut d = Drive::replicated(Endpoint::Acquire, ACQUIRE);
    let w = d.write();
    d.feed(w.id, ack(3));
    assert!(matches!(d.reply(), Response::Acquired(a) if a.granted));
    // Another holder's lease, and the caller's own older write, are answered from reads.
    for (holder, granted) in [("other", false), ("me", true)] {
        let mut d = Drive::replicated(Endpoint::Acquire, ACQUIRE);
        let w = d.write();
        d.feed(w.id, wrong_last_sequence());
        read_and_confirm(&mut d, held(7, holder, 15000, 0), 7, ack(8));
        let Response::Acquired(a) = d.reply() else {
            panic!("expected an acquire reply")
        };
        assert_eq!(
            (a.granted, a.lease.holder.as_str(), a.lease.revision),
            (granted, holder, 7)
        );
    }
    // A free key read after the conflict goes straight to a create over it.
    let mut d = Drive::replicated(Endpoint::Acquire, ACQUIRE);
    let w = d.write();
    d.feed(w.id, wrong_last_sequence());
    let r = d.read();
    d.feed(r.id, marker(4));
    assert_eq!(d.write().expected_revision, 4);
}

#[test]
fn renew_and_release_confirm_lost_and_fence_mismatch_but_not_a_passing_fence_check() {
    for body in [RENEW, RELEASE] {
        let endpoint = if body == RENEW {
            Endpoint::Renew
        } else {
            Endpoint::Release
        };
        let mut d = Drive::replicated(endpoint, body);
        let r = d.read();
        d.feed(r.id, held(7, "me", 15000, 0));
        assert!(matches!(d.effect(), CallRequest::KvWrite(w) if w.expected_revision == 7));
        for (state, revision, kind) in [
            (held(7, "other", 15000, 0), 7, ErrorKind::Lost),
            (no_message(), 0, ErrorKind::Lost),
            (held(9, "me", 15000, 0), 9, ErrorKind::FenceMismatch),
        ] {
            let mut d = Drive::replicated(endpoint, body);
            read_and_confirm(&mut d, state, revision, ack(10));
            assert_eq!(d.error().kind, kind);
        }
    }
}

#[test]
fn a_corrupt_record_is_confirmed_before_internal() {
    let mut d = Drive::replicated(Endpoint::Owner, OWNER);
    read_and_confirm(&mut d, corrupt(6), 6, ack(7));
    assert_eq!(d.error().kind, ErrorKind::Internal);
}

#[test]
fn forward_confirms_its_first_read_and_every_re_read() {
    let mut d = Drive::replicated(Endpoint::Forward, FORWARD);
    read_and_confirm(&mut d, held(7, "old", 15000, 0), 7, ack(8));
    let i = d.inbox();
    assert_eq!((i.holder.as_str(), i.fence), ("old", 7));
    d.feed(i.id, RequestOutcome::NoResponders);
    read_and_confirm(&mut d, held(9, "new", 15000, 0), 9, ack(10));
    let i = d.inbox();
    assert_eq!((i.holder.as_str(), i.fence), ("new", 9));
    d.feed(i.id, RequestOutcome::reply(b"ok".to_vec()));
    assert!(matches!(d.reply(), Response::Forwarded(_)));
    // not_held is an answer from a read too.
    let mut d = Drive::replicated(Endpoint::Forward, FORWARD);
    read_and_confirm(&mut d, no_message(), 0, ack(3));
    assert_eq!(d.error().kind, ErrorKind::NotHeld);
}

#[test]
fn a_forwards_confirmation_is_bounded_by_its_deadline() {
    let mut d = Drive::replicated(Endpoint::Forward, FORWARD);
    let r = d.read();
    d.advance(Duration::from_millis(1500));
    d.feed(r.id, held(7, "own", 15000, 0));
    let c = d.confirm();
    assert_eq!(c.timeout, Duration::from_millis(500));
}
