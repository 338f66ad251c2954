//! Input bounds and reply shapes.

use crate::wire::{Endpoint, ErrorKind, Request};

fn kind(endpoint: Endpoint, body: &str) -> Result<Request, (ErrorKind, String)> {
    Request::decode(endpoint, body.as_bytes()).map_err(|e| (e.kind, e.error))
}

fn rejects(endpoint: Endpoint, body: &str, field: &str) {
    match kind(endpoint, body) {
        Ok(r) => panic!("accepted {body}: {r:?}"),
        Err((k, msg)) => {
            assert_eq!(k, ErrorKind::Invalid, "{body}");
            assert!(
                msg.contains(field),
                "{body}: message {msg:?} does not name {field}"
            );
        }
    }
}

#[test]
fn key_and_holder_are_1_to_128_bytes_of_letters_digits_underscore_and_dash() {
    let ok = "aZ09_-".repeat(21) + "ab"; // 128 bytes
    assert_eq!(ok.len(), 128);
    let body = |k: &str, h: &str| format!(r#"{{"key":"{k}","holder":"{h}","ttl_ms":1000}}"#);
    assert!(kind(Endpoint::Acquire, &body(&ok, &ok)).is_ok());
    assert!(kind(Endpoint::Acquire, &body("a", "b")).is_ok());
    for bad in ["", "a.b", "a*", "a>", "a b", "é", &format!("{ok}x")] {
        rejects(Endpoint::Acquire, &body(bad, "h"), "key");
        rejects(Endpoint::Acquire, &body("k", bad), "holder");
    }
}

#[test]
fn ttl_ms_is_whole_seconds_from_1s_to_10m() {
    let body = |t: &str| format!(r#"{{"key":"k","holder":"h","ttl_ms":{t}}}"#);
    for ok in ["1000", "2000", "600000"] {
        assert!(kind(Endpoint::Acquire, &body(ok)).is_ok(), "{ok}");
    }
    for bad in [
        "999", "1500", "1999", "600001", "601000", "0", "-1000", "1000.5", "\"1000\"", "null",
    ] {
        rejects(Endpoint::Acquire, &body(bad), "ttl_ms");
    }
    rejects(
        Endpoint::Renew,
        r#"{"key":"k","holder":"h","revision":1,"ttl_ms":1500}"#,
        "ttl_ms",
    );
}

#[test]
fn revision_is_required_on_renew_and_release() {
    rejects(Endpoint::Renew, r#"{"key":"k","holder":"h"}"#, "revision");
    rejects(Endpoint::Release, r#"{"key":"k","holder":"h"}"#, "revision");
    rejects(
        Endpoint::Release,
        r#"{"key":"k","holder":"h","revision":"3"}"#,
        "revision",
    );
    assert!(kind(Endpoint::Renew, r#"{"key":"k","holder":"h","revision":3}"#).is_ok());
}

#[test]
fn forward_timeout_ms_is_100_to_30000() {
    let body = |t: u64| format!(r#"{{"key":"k","payload":"","timeout_ms":{t}}}"#);
    for ok in [100, 30000] {
        assert!(kind(Endpoint::Forward, &body(ok)).is_ok());
    }
    for bad in [99, 30001, 0] {
        rejects(Endpoint::Forward, &body(bad), "timeout_ms");
    }
}

#[test]
fn forward_payload_is_base64() {
    let Ok(Request::Forward(f)) = kind(
        Endpoint::Forward,
        r#"{"key":"k","payload":"AAEC/w==","timeout_ms":100}"#,
    ) else {
        panic!()
    };
    assert_eq!(f.payload, vec![0, 1, 2, 255]);
    for bad in ["AAE", "!!!!", "AAEC/w=="].iter().take(2) {
        rejects(
            Endpoint::Forward,
            &format!(r#"{{"key":"k","payload":"{bad}","timeout_ms":100}}"#),
            "payload",
        );
    }
}

#[test]
fn unknown_fields_are_rejected_by_name() {
    rejects(
        Endpoint::Acquire,
        r#"{"key":"k","holder":"h","ttl_ms":1000,"ttl":5}"#,
        "ttl",
    );
    rejects(
        Endpoint::Renew,
        r#"{"key":"k","holder":"h","revison":3}"#,
        "revison",
    );
    rejects(
        Endpoint::Release,
        r#"{"key":"k","holder":"h","revision":3,"ttl":15000}"#,
        "ttl",
    );
    rejects(
        Endpoint::Owner,
        r#"{"key":"k","payload":"aGk=","timeout_ms":100}"#,
        "payload",
    );
    rejects(
        Endpoint::Acquire,
        r#"{"key":"k","holder":"h","ttl_ms":1000,"timeout_ms":100}"#,
        "timeout_ms",
    );
}

/// The body leases.md's Go example sends: one struct reused for every call.
fn shared_body(revision: u64) -> String {
    format!(
        r#"{{"key":"notify-leader","holder":"notify-7f3a","revision":{revision},"ttl_ms":15000}}"#
    )
}

#[test]
fn release_ignores_the_shared_ttl_ms() {
    let Ok(Request::Release(r)) = kind(Endpoint::Release, &shared_body(42)) else {
        panic!("release with ttl_ms was not accepted");
    };
    assert_eq!(
        (r.key.as_str(), r.holder.as_str(), r.revision),
        ("notify-leader", "notify-7f3a", 42)
    );
}

#[test]
fn owner_ignores_the_shared_holder_revision_and_ttl_ms() {
    let Ok(Request::Owner(r)) = kind(Endpoint::Owner, &shared_body(42)) else {
        panic!("owner with holder, revision and ttl_ms was not accepted");
    };
    assert_eq!(r.key, "notify-leader");
    // Ignored fields are not range-checked: an empty holder or ttl 0 is fine here.
    assert!(
        kind(
            Endpoint::Owner,
            r#"{"key":"k","holder":"","revision":0,"ttl_ms":0}"#
        )
        .is_ok()
    );
}

#[test]
fn acquire_ignores_the_shared_revision() {
    let Ok(Request::Acquire(r)) = kind(Endpoint::Acquire, &shared_body(42)) else {
        panic!("acquire with revision was not accepted");
    };
    assert_eq!((r.holder.as_str(), r.ttl_ms), ("notify-7f3a", 15_000));
}

#[test]
fn renew_uses_every_shared_field() {
    let Ok(Request::Renew(r)) = kind(Endpoint::Renew, &shared_body(42)) else {
        panic!("renew was not accepted");
    };
    assert_eq!((r.revision, r.ttl_ms), (42, Some(15_000)));
}

#[test]
fn an_ignored_field_of_the_wrong_type_is_still_invalid() {
    rejects(
        Endpoint::Release,
        r#"{"key":"k","holder":"h","revision":3,"ttl_ms":"15s"}"#,
        "ttl_ms",
    );
    rejects(Endpoint::Owner, r#"{"key":"k","revision":-1}"#, "revision");
    rejects(Endpoint::Owner, r#"{"key":"k","holder":7}"#, "holder");
}

#[test]
fn a_missing_field_or_a_wrong_type_is_named() {
    rejects(Endpoint::Acquire, r#"{"key":"k","ttl_ms":1000}"#, "holder");
    rejects(
        Endpoint::Acquire,
        r#"{"key":5,"holder":"h","ttl_ms":1000}"#,
        "key",
    );
    rejects(
        Endpoint::Forward,
        r#"{"key":"k","payload":5,"timeout_ms":100}"#,
        "payload",
    );
}

#[test]
fn a_json_array_is_not_a_request_even_when_its_items_fit_the_fields() {
    for (endpoint, body) in [
        (Endpoint::Owner, r#"["key","k"]"#),
        (Endpoint::Acquire, r#"["k","h",null,15000]"#),
        (Endpoint::Forward, r#" ["k","aGk=",100]"#),
    ] {
        rejects(endpoint, body, "JSON object");
    }
    assert!(kind(Endpoint::Owner, " \n\t{\"key\":\"k\"}").is_ok());
}

#[test]
fn a_body_that_is_not_json_is_invalid() {
    for body in ["", "nope", "{", r#"{"key":"k"} {}"#, "\u{0}"] {
        rejects(Endpoint::Owner, body, "JSON");
    }
    let bad_utf8 = [b'{', b'"', 0xff, b'"', b':', b'1', b'}'];
    assert_eq!(
        Request::decode(Endpoint::Owner, &bad_utf8)
            .unwrap_err()
            .kind,
        ErrorKind::Invalid
    );
    let deep = "[".repeat(10_000);
    assert_eq!(
        Request::decode(Endpoint::Owner, deep.as_bytes())
            .unwrap_err()
            .kind,
        ErrorKind::Invalid
    );
}

#[test]
fn error_kinds_serialise_as_snake_case() {
    use ErrorKind::*;
    for (k, s) in [
        (Invalid, "invalid"),
        (Unsupported, "unsupported"),
        (Lost, "lost"),
        (FenceMismatch, "fence_mismatch"),
        (Unavailable, "unavailable"),
        (Internal, "internal"),
        (NotHeld, "not_held"),
        (OwnerUnavailable, "owner_unavailable"),
        (OwnerRejected, "owner_rejected"),
        (OwnerTimeout, "owner_timeout"),
        (ReplyTooLarge, "reply_too_large"),
    ] {
        assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{s}\""));
        assert_eq!(k.as_str(), s);
        assert_eq!(
            serde_json::from_str::<ErrorKind>(&format!("\"{s}\"")).unwrap(),
            k
        );
    }
}

#[test]
fn replies_have_the_contract_shape() {
    use crate::wire::*;
    let lease = Lease {
        held: true,
        key: "notify-leader".into(),
        holder: "notify-7f3a".into(),
        revision: 42,
        acquired_at: "2026-10-18T12:00:00Z".into(),
        expires_at: "2026-10-18T12:00:15Z".into(),
        ttl_ms: 15000,
    };
    let granted = Response::Acquired(AcquireReply {
        granted: true,
        lease: lease.clone(),
    });
    assert_eq!(
        String::from_utf8(granted.to_json()).unwrap(),
        r#"{"granted":true,"held":true,"key":"notify-leader","holder":"notify-7f3a","revision":42,"acquired_at":"2026-10-18T12:00:00Z","expires_at":"2026-10-18T12:00:15Z","ttl_ms":15000}"#
    );
    let err = Response::Error(ErrorReply::new(ErrorKind::Lost, "gone"));
    assert_eq!(
        String::from_utf8(err.to_json()).unwrap(),
        r#"{"error":"gone","kind":"lost"}"#
    );
    let e = ErrorReply {
        holder: Some("h".into()),
        revision: Some(3),
        ..ErrorReply::new(ErrorKind::OwnerTimeout, "t")
    };
    assert_eq!(
        serde_json::to_string(&e).unwrap(),
        r#"{"error":"t","kind":"owner_timeout","holder":"h","revision":3}"#
    );
    // Clients can read the replies back.
    let back: AcquireReply = serde_json::from_slice(&granted.to_json()).unwrap();
    assert_eq!(back.lease, lease);
}

#[test]
fn timestamps_are_rfc3339_utc() {
    let t = time::OffsetDateTime::from_unix_timestamp(1_792_324_800).unwrap();
    assert_eq!(crate::record::format_time(t), "2026-10-18T12:00:00Z");
    let t = t + std::time::Duration::from_micros(1_234_567);
    assert_eq!(crate::record::format_time(t), "2026-10-18T12:00:01.234Z");
}

#[test]
fn a_client_waits_for_a_forward_past_its_timeout_by_the_two_hops_room() {
    use crate::wire::{FORWARD_HOP_ROOM, forward_client_wait};
    use std::time::Duration;
    for ms in [100, 2_000, 30_000] {
        let timeout = Duration::from_millis(ms);
        let wait = forward_client_wait(timeout);
        assert!(
            wait > timeout,
            "the service answers by {timeout:?}: heard first"
        );
        assert_eq!(wait - timeout, FORWARD_HOP_ROOM);
    }
    assert_eq!(FORWARD_HOP_ROOM, Duration::from_secs(1));
}

/// A stored message of a key, as `list` reads it from the stream and `owner` from
/// a leader read: one rule for both, a row per kind of message.
#[test]
fn a_stored_message_reads_as_held_free_or_corrupt() {
    use crate::js::KeyState;
    use crate::record::format_time;
    use time::macros::datetime;
    let at = datetime!(2026-12-05 12:00:00 UTC);
    let record = br#"{"holder":"h1","acquired_at":"2026-12-05T11:59:00Z","ttl_ms":15000}"#;
    let none = |_: &str| None;
    let marker = |n: &str| (n == "Nats-Marker-Reason").then_some("MaxAge");
    let deleted = |n: &str| (n == "KV-Operation").then_some("DEL");
    let purged = |n: &str| (n == "KV-Operation").then_some("PURGE");
    let put = |n: &str| (n == "Dagnats-Lease-Event").then_some("acquired");
    for (what, state, held) in [
        ("a record", KeyState::of_message(7, none, record, at), true),
        (
            "with a lease event",
            KeyState::of_message(7, put, record, at),
            true,
        ),
        (
            "an expiry marker",
            KeyState::of_message(7, marker, b"", at),
            false,
        ),
        (
            "a tombstone",
            KeyState::of_message(7, deleted, b"", at),
            false,
        ),
        ("a purge", KeyState::of_message(7, purged, b"", at), false),
        (
            "a corrupt record",
            KeyState::of_message(7, none, b"{", at),
            false,
        ),
    ] {
        assert_eq!(state.revision(), 7, "{what}");
        let lease = state.lease("k");
        assert_eq!(lease.is_some(), held, "{what}: {state:?}");
        if let Some(l) = lease {
            assert_eq!(
                (l.key.as_str(), l.holder.as_str(), l.revision),
                ("k", "h1", 7)
            );
            assert_eq!(
                l.expires_at,
                format_time(at + std::time::Duration::from_secs(15))
            );
            assert_eq!(l.ttl_ms, 15_000);
        }
    }
    assert!(matches!(
        KeyState::of_message(7, none, b"{", at),
        KeyState::Corrupt { .. }
    ));
}
