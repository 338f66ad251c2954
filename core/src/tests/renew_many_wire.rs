//! The `renew_many` body: the renew request's fields per item, its bounds, and the
//! reply's shape.

use crate::wire::{
    ErrorKind, ErrorReply, Lease, MAX_RENEW_MANY, RenewManyReply, RenewManyResult, Response,
    decode_renew_many, renew_many_subject,
};

fn item(key: &str) -> String {
    format!(r#"{{"key":"{key}","holder":"h","revision":7,"ttl_ms":15000}}"#)
}

fn body(items: &[String]) -> String {
    format!(r#"{{"leases":[{}]}}"#, items.join(","))
}

/// Refused as a whole with `invalid`, the message naming each of `names`.
fn rejects(body: &str, names: &[&str]) {
    match decode_renew_many(body.as_bytes()) {
        Ok(r) => panic!("accepted {body}: {r:?}"),
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::Invalid, "{body}");
            for name in names {
                assert!(
                    e.error.contains(name),
                    "{body}: {:?} does not name {name}",
                    e.error
                );
            }
        }
    }
}

#[test]
fn the_subject_sits_beside_the_five() {
    assert_eq!(renew_many_subject(), "api.leases.renew_many");
}

#[test]
fn each_item_is_a_renew_request_in_order() {
    let got = decode_renew_many(
        body(&[
            item("a"),
            r#"{"key":"b","holder":"h2","revision":9}"#.to_string(),
        ])
        .as_bytes(),
    )
    .expect("valid");
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0].key.as_str(), got[0].revision, got[0].ttl_ms),
        ("a", 7, Some(15000))
    );
    assert_eq!((got[1].key.as_str(), got[1].holder.as_str()), ("b", "h2"));
    assert_eq!(got[1].ttl_ms, None, "ttl_ms stays optional, as on renew");
}

#[test]
fn an_invalid_item_refuses_the_whole_request_naming_the_item_and_its_field() {
    let ok = item("a");
    let cases: [(&str, &[&str]); 8] = [
        (r#"{"key":"b","holder":"h"}"#, &["leases[1]", "revision"]),
        (
            r#"{"key":"b.c","holder":"h","revision":1}"#,
            &["leases[1]", "key"],
        ),
        (
            r#"{"key":"b","holder":"","revision":1}"#,
            &["leases[1]", "holder"],
        ),
        (
            r#"{"key":"b","holder":"h","revision":1,"ttl_ms":1500}"#,
            &["leases[1]", "ttl_ms"],
        ),
        (
            r#"{"key":"b","holder":"h","revision":"1"}"#,
            &["leases[1]", "revision"],
        ),
        (
            r#"{"key":"b","holder":"h","revision":1,"ttl":1000}"#,
            &["leases[1]", "ttl"],
        ),
        (r#"["b","h",1]"#, &["leases[1]", "object"]),
        (r#""b""#, &["leases[1]", "object"]),
    ];
    for (bad, names) in cases {
        rejects(&body(&[ok.clone(), bad.to_string()]), names);
    }
}

#[test]
fn a_key_twice_is_invalid() {
    rejects(
        &body(&[item("a"), item("b"), item("a")]),
        &["leases[2]", "leases[0]", "key"],
    );
}

#[test]
fn a_field_twice_in_an_item_is_refused_as_a_renew_alone_refuses_it() {
    use crate::wire::{Endpoint, Request};
    let twice = r#"{"key":"a","holder":"h","revision":7,"key":"b"}"#;
    assert!(Request::decode(Endpoint::Renew, twice.as_bytes()).is_err());
    rejects(
        &body(&[item("c"), twice.to_string()]),
        &["leases[1]", "duplicate field", "key"],
    );
}

#[test]
fn one_to_the_bound_of_items() {
    rejects(r#"{"leases":[]}"#, &["leases", "empty"]);
    let most: Vec<String> = (0..MAX_RENEW_MANY)
        .map(|i| item(&format!("k{i}")))
        .collect();
    assert_eq!(
        decode_renew_many(body(&most).as_bytes())
            .expect("at the bound")
            .len(),
        MAX_RENEW_MANY
    );
    let over: Vec<String> = (0..=MAX_RENEW_MANY)
        .map(|i| item(&format!("k{i}")))
        .collect();
    rejects(&body(&over), &["leases", &MAX_RENEW_MANY.to_string()]);
}

#[test]
fn the_body_is_an_object_with_leases_only() {
    for (bad, name) in [
        ("", "JSON"),
        ("nope", "JSON"),
        ("[]", "leases"),
        (" []", "object"),
        (r#"{}"#, "leases"),
        (r#"{"leases":{}}"#, "leases"),
        (r#"{"leases":[],"key":"a"}"#, "key"),
        (r#"{"leases":null}"#, "leases"),
    ] {
        rejects(bad, &[name]);
    }
    rejects(&format!("{} x", body(&[item("a")])), &["JSON"]);
}

fn lease(key: &str, revision: u64) -> Lease {
    Lease {
        held: true,
        key: key.to_string(),
        holder: "h".to_string(),
        revision,
        acquired_at: "2026-10-18T12:00:00Z".to_string(),
        expires_at: "2026-10-18T12:00:15Z".to_string(),
        ttl_ms: 15000,
    }
}

#[test]
fn the_reply_lists_each_item_as_a_renew_would_reply_it() {
    let lost = ErrorReply::new(ErrorKind::Lost, "the lease is not held");
    let reply = RenewManyReply {
        results: vec![
            RenewManyResult::of("a", &Response::Lease(lease("a", 8))),
            RenewManyResult::of("b", &Response::Error(lost.clone())),
        ],
    };
    let json: serde_json::Value = serde_json::from_slice(&reply.to_json()).expect("JSON");
    assert_eq!(
        json,
        serde_json::json!({"results": [
            {"held": true, "key": "a", "holder": "h", "revision": 8,
             "acquired_at": "2026-10-18T12:00:00Z", "expires_at": "2026-10-18T12:00:15Z",
             "ttl_ms": 15000},
            {"key": "b", "error": "the lease is not held", "kind": "lost"},
        ]})
    );
    let back = RenewManyReply::decode(&reply.to_json())
        .expect("parses")
        .expect("results");
    assert_eq!(back, reply);
    // Each item reads back as the renew reply of its key alone.
    assert_eq!(
        back.results[0].renew_body(),
        Response::Lease(lease("a", 8)).to_json()
    );
    assert_eq!(
        back.results[1].renew_body(),
        Response::Error(lost).to_json()
    );
    assert_eq!(back.results[1].key(), "b");
}

#[test]
fn a_whole_request_error_reads_as_one() {
    let body = br#"{"error":"the service is at its bound","kind":"unavailable"}"#;
    let e = RenewManyReply::decode(body)
        .expect("parses")
        .expect_err("an error");
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert!(RenewManyReply::decode(b"{").is_err());
    assert!(RenewManyReply::decode(br#"{"results":[{"key":"a"}]}"#).is_err());
}

/// A body read the one pass gives what the way of record gives; a body the one
/// pass does not take is the way of record's, sentence and all.
#[test]
fn the_one_pass_reads_as_the_way_of_record() {
    use crate::wire::{Endpoint, Request, decode_renew_many_items, decode_renew_many_of_record};
    let two = body(&[item("a"), item("b")]);
    // (body, whether the one pass takes it)
    let cases: &[(&str, bool)] = &[
        (&two, true),
        (
            r#" { "leases" : [ { "ttl_ms" : 15000 , "revision" : 7, "holder":"h", "key":"a" } ] } "#,
            true,
        ),
        (
            r#"{"leases":[{"key":"\u0061","holder":"h","revision":7,"ttl_ms":null}]}"#,
            true,
        ),
        (
            r#"{"leases":[{"key":"a","holder":"h","revision":7,"key":"b"}]}"#,
            false,
        ),
        (
            r#"{"leases":[{"key":"a","holder":"h","revision":7}],"leases":[]}"#,
            false,
        ),
        (
            r#"{"leases":[{"key":"a","holder":"h","revision":"7"}]}"#,
            false,
        ),
        (
            r#"{"leases":[{"key":"a", "holder":"h","revision":7,"ttl":1}]}"#,
            false,
        ),
        (
            r#"{"leases":[{"revision":"x","holder":5,"key":"a"}]}"#,
            false,
        ),
        (
            r#"{"leases":[[{"key":"a","holder":"h","revision":7}]]}"#,
            false,
        ),
        (r#"[[{"key":"a","holder":"h","revision":7}]]"#, false),
        (
            r#"{"leases":[{"key":"a","holder":"h","revision":7},{"key":"a","holder":"h","revision":8}]}"#,
            false,
        ),
        (r#"{"leases":[]}"#, false),
        (
            r#"{"leases":[{"key":"a","holder":"h","revision":-0}]}"#,
            false,
        ),
        (
            r#"{"leases":[{"key":"\ud800","holder":"h","revision":7}]}"#,
            false,
        ),
        ("{", false),
    ];
    for (body, one_pass) in cases {
        let bytes = body.as_bytes();
        let fast = decode_renew_many_items(bytes);
        assert_eq!(fast.is_some(), *one_pass, "{body}");
        let record = decode_renew_many_of_record(bytes);
        if fast.is_none() && record.is_ok() {
            // Only the way of record takes it (a field twice): refused, as alone.
            assert!(decode_renew_many(bytes).is_err(), "{body}");
        } else {
            assert_eq!(decode_renew_many(bytes), record, "{body}");
        }
        if let Some(items) = fast {
            let renews: Vec<_> = items.iter().map(|(r, _)| r.clone()).collect();
            assert_eq!(Ok(renews), record, "{body}");
            for (renew, raw) in items {
                assert_eq!(
                    Request::decode(Endpoint::Renew, raw),
                    Ok(Request::Renew(renew)),
                    "{body}: an item's own bytes are its request"
                );
            }
        }
    }
}

/// Each item as its holder hears it: a renewed item's own bytes, byte for byte a
/// renew's reply when the service wrote them; read as
/// [`RenewManyReply::decode`] reads the body, whatever its shape.
#[test]
fn each_item_reads_as_its_renew_reply() {
    let lost = ErrorReply::new(ErrorKind::Lost, "the lease is not held");
    let ours = RenewManyReply {
        results: vec![
            RenewManyResult::of("a", &Response::Lease(lease("a", 8))),
            RenewManyResult::of("b", &Response::Error(lost.clone())),
        ],
    }
    .to_json();
    let items = RenewManyReply::decode_bodies(&ours)
        .expect("parses")
        .expect("results");
    assert_eq!(items[0].body, Response::Lease(lease("a", 8)).to_json());
    assert_eq!(items[1].body, Response::Error(lost).to_json());
    assert_eq!((items[0].key.as_str(), items[0].error), ("a", None));
    assert_eq!(
        (items[1].key.as_str(), items[1].error),
        ("b", Some(ErrorKind::Lost))
    );

    let a = r#"{"held":true,"key":"a","holder":"h","revision":8,"acquired_at":"2026-10-18T12:00:00Z","expires_at":"2026-10-18T12:00:15Z","ttl_ms":15000}"#;
    let spaced = r#"{ "ttl_ms": 15000, "key": "a", "held": true, "holder": "h", "revision": 8, "acquired_at": "2026-10-18T12:00:00Z", "expires_at": "2026-10-18T12:00:15Z" }"#;
    let bodies = [
        String::from_utf8(ours).expect("UTF-8"),
        format!(r#"{{"results":[{spaced}]}}"#),
        format!(
            r#"{{"results":[{}]}}"#,
            a.replace(r#""ttl_ms""#, r#""extra":1,"ttl_ms""#)
        ),
        format!(
            r#"{{"results":[{}]}}"#,
            a.replace(r#""ttl_ms""#, r#""kind":"lost","ttl_ms""#)
        ),
        format!(
            r#"{{"results":[{}]}}"#,
            a.replace(r#""holder":"h""#, r#""holder":"x","holder":"h""#)
        ),
        format!(r#"{{"results":[{a}],"results":[]}}"#),
        format!(r#"[[{a}]]"#),
        r#"{"results":[{"key":"b","error":"gone","kind":"lost","holder":null}]}"#.to_string(),
        r#"{"results":[{"key":"b","error":"gone","kind":"lost","why":1}]}"#.to_string(),
        r#"{"results":[{"key":"b","error":"gone","kind":"nope"}]}"#.to_string(),
        r#"{"results":[{"key":"a"}]}"#.to_string(),
        r#"{"results":[]}"#.to_string(),
        r#"{"error":"the service is at its bound","kind":"unavailable"}"#.to_string(),
        r#"{"results":[],"kind":"lost"}"#.to_string(),
        "{".to_string(),
        "".to_string(),
    ];
    for body in &bodies {
        let bytes = body.as_bytes();
        let got = RenewManyReply::decode_bodies(bytes);
        match RenewManyReply::decode(bytes) {
            Err(_) => assert!(got.is_err(), "{body}: {got:?}"),
            Ok(Err(e)) => assert_eq!(got, Ok(Err(e)), "{body}"),
            Ok(Ok(reply)) => {
                let items = got.expect("parses").expect("results");
                assert_eq!(items.len(), reply.results.len(), "{body}");
                for (item, result) in items.iter().zip(&reply.results) {
                    assert_eq!(item.key, result.key(), "{body}");
                    assert_eq!(
                        Response::decode(crate::wire::Endpoint::Renew, &item.body),
                        Response::decode(crate::wire::Endpoint::Renew, &result.renew_body()),
                        "{body}: the holder reads the item as its renew reply"
                    );
                    let kind = match result {
                        RenewManyResult::Renewed(_) => None,
                        RenewManyResult::Failed { error, .. } => Some(error.kind),
                    };
                    assert_eq!(item.error, kind, "{body}");
                }
            }
        }
    }
    // A renewed item is handed on as it came, spaces and all.
    let items = RenewManyReply::decode_bodies(bodies[1].as_bytes())
        .expect("parses")
        .expect("results");
    assert_eq!(items[0].body, spaced.as_bytes());
}

/// A renew reply read straight into its lease reads as the JSON value's reading
/// would: the same lease, the same error, the same refusal, whatever the body.
#[test]
fn a_renew_reply_reads_the_same_straight_or_through_a_value() {
    use crate::wire::Endpoint;
    let lease = r#"{"held":true,"key":"a","holder":"h","revision":7,"acquired_at":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T00:00:15Z","ttl_ms":15000}"#;
    let through_value = |body: &[u8]| -> Result<Response, String> {
        let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        if value.get("kind").is_some() {
            return serde_json::from_value(value)
                .map(Response::Error)
                .map_err(|e| e.to_string());
        }
        serde_json::from_value(value)
            .map(Response::Lease)
            .map_err(|e| e.to_string())
    };
    let with = |extra: &str| lease.replacen('{', &format!("{{{extra},"), 1);
    let bodies = [
        lease.to_string(),
        with(r#""kind":"lost","error":"gone""#),
        with(r#""\u006bind":"lost","error":"gone""#),
        with(r#""note":"kind""#),
        with(r#""key":"b""#),
        with(r#""extra":[1,{"x":null}]"#),
        r#"{"error":"the lease is not held","kind":"lost"}"#.to_string(),
        r#"{"key":"a"}"#.to_string(),
        lease.replace("15000", "-1"),
        lease.replace("15000", "1.5"),
        format!("{lease} x"),
        "[]".to_string(),
        "".to_string(),
    ];
    for body in bodies {
        let read = Response::decode(Endpoint::Renew, body.as_bytes());
        let record = through_value(body.as_bytes());
        assert_eq!(
            read.is_ok(),
            record.is_ok(),
            "{body}: {read:?} / {record:?}"
        );
        if let (Ok(read), Ok(record)) = (read, record) {
            assert_eq!(read, record, "{body}");
        }
    }
}
