//! Bad-input sweep: malformed and hostile bodies to every endpoint of the running
//! service get `kind: invalid` with a sentence, change no lease, and the service
//! keeps serving.

mod common;

use async_nats::Client;
use common::{call_raw, connect};
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::service::{self, ServiceOptions};
use serde_json::{Value, json};

const ENDPOINTS: [&str; 5] = ["acquire", "renew", "release", "owner", "forward"];

/// What must not change: every held key's owner read, and the stream's last sequence.
async fn snapshot(client: &Client, keys: &[String]) -> (Vec<Value>, u64) {
    let mut owners = Vec::new();
    for key in keys {
        owners.push(
            call_raw(
                client,
                "owner",
                json!({"key": key}).to_string().into_bytes(),
            )
            .await,
        );
    }
    let info = client
        .request("$JS.API.STREAM.INFO.KV_leases", "{}".into())
        .await
        .expect("stream info");
    let info: Value = serde_json::from_slice(&info.payload).unwrap();
    let last = info["state"]["last_seq"].as_u64().expect("last_seq");
    (owners, last)
}

/// A body of about `n` bytes: a JSON object whose `key` is `n` letters.
fn huge(n: usize) -> Vec<u8> {
    format!(
        r#"{{"key":"{}","holder":"h","ttl_ms":1000}}"#,
        "a".repeat(n)
    )
    .into_bytes()
}

/// A hostile body, and the endpoints that legitimately ignore the field it breaks.
struct Hostile {
    name: String,
    body: Vec<u8>,
    /// The lease calls accept the shared fields they do not use (contract.md), so a
    /// bad `holder` is no error to owner: such pairs are not sent (the core's wire
    /// tests cover them).
    ignored_by: &'static [&'static str],
}

/// Endpoints that take `ttl_ms` without using it.
const TTL_UNUSED: &[&str] = &["release", "owner"];

/// Every hostile body, named. `held` is a key held by `owner` at `rev` (so that a
/// body that slipped through validation would hit a real lease).
fn bodies(held: &str, owner: &str, rev: u64, max_payload: usize) -> Vec<Hostile> {
    let hostile = |name: &str, ignored_by: &'static [&'static str], body: Vec<u8>| Hostile {
        name: name.to_owned(),
        body,
        ignored_by,
    };
    let mut out: Vec<Hostile> = Vec::new();
    let mut partly: Vec<Hostile> = Vec::new();
    let mut add = |name: &str, body: Vec<u8>| out.push(hostile(name, &[], body));
    let mut add_ignored = |name: &str, ignored_by: &'static [&'static str], body: Vec<u8>| {
        partly.push(hostile(name, ignored_by, body))
    };
    add("empty body", Vec::new());
    add("whitespace", b"   \n".to_vec());
    add("not JSON", b"hello".to_vec());
    add("truncated JSON", br#"{"key":"k""#.to_vec());
    add("JSON null", b"null".to_vec());
    add("JSON array", br#"["key","k"]"#.to_vec());
    add("JSON string", br#""key""#.to_vec());
    add("JSON number", b"42".to_vec());
    add("empty object", b"{}".to_vec());
    add(
        "invalid UTF-8",
        b"{\"key\":\"\xff\xfe\",\"holder\":\"h\",\"ttl_ms\":1000}".to_vec(),
    );
    add("invalid UTF-8 outside strings", b"\xc3\x28".to_vec());
    add(
        "lone surrogate escape",
        br#"{"key":"\ud800","holder":"h","ttl_ms":1000}"#.to_vec(),
    );
    add(
        "NUL in key",
        b"{\"key\":\"a\\u0000b\",\"holder\":\"h\",\"ttl_ms\":1000}".to_vec(),
    );
    add(
        "deeply nested arrays",
        format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
    );
    add(
        "deeply nested in a field",
        format!(
            r#"{{"key":{}1{},"holder":"h","ttl_ms":1000}}"#,
            "[".repeat(5000),
            "]".repeat(5000)
        )
        .into_bytes(),
    );
    add("huge key near max_payload", huge(max_payload - 200));
    add(
        "huge unknown field",
        format!(
            r#"{{"key":"{held}","x":"{}"}}"#,
            "b".repeat(max_payload / 2)
        )
        .into_bytes(),
    );
    for (name, key) in [
        ("key with *", "a*".to_owned()),
        ("key with >", ">".to_owned()),
        ("key with .", format!("{held}.x")),
        ("key with a space", "a b".to_owned()),
        ("key with a tab", "a\tb".to_owned()),
        ("empty key", String::new()),
        ("129-byte key", "k".repeat(129)),
        ("non-ASCII key", "clé".to_owned()),
        ("key $JS", "$JS".to_owned()),
    ] {
        add(name, json!({"key": key, "holder": owner, "ttl_ms": 10_000, "revision": rev, "payload": "", "timeout_ms": 1000}).to_string().into_bytes());
    }
    for (name, holder) in [
        ("holder with *", "*"),
        ("holder with >", ">"),
        ("holder with .", "a.b"),
        ("holder with a space", " "),
        ("empty holder", ""),
    ] {
        add_ignored(
            name,
            &["owner"],
            json!({"key": held, "holder": holder, "ttl_ms": 10_000, "revision": rev})
                .to_string()
                .into_bytes(),
        );
    }
    add_ignored(
        "129-byte holder",
        &["owner"],
        json!({"key": held, "holder": "h".repeat(129), "ttl_ms": 10_000, "revision": rev})
            .to_string()
            .into_bytes(),
    );
    for (ttl, ignored_by) in [
        (json!(0), TTL_UNUSED),
        (json!(999), TTL_UNUSED),
        (json!(1500), TTL_UNUSED),
        (json!(600_001), TTL_UNUSED),
        (json!(u64::MAX), TTL_UNUSED),
        // Renew's ttl_ms is optional: null there means "keep the lease's own TTL".
        (json!(null), &["renew", "release", "owner"]),
        (json!(-1000), &[]),
        (json!(1e3), &[]),
        (json!(1000.5), &[]),
        (json!("2000"), &[]),
        (json!(true), &[]),
    ] {
        add_ignored(
            &format!("ttl_ms {ttl}"),
            ignored_by,
            json!({"key": held, "holder": owner, "ttl_ms": ttl, "revision": rev})
                .to_string()
                .into_bytes(),
        );
    }
    add(
        "ttl_ms 1e400",
        format!(r#"{{"key":"{held}","holder":"{owner}","ttl_ms":1e400,"revision":{rev}}}"#)
            .into_bytes(),
    );
    add("ttl_ms 2^64", format!(r#"{{"key":"{held}","holder":"{owner}","ttl_ms":18446744073709551616,"revision":{rev}}}"#).into_bytes());
    for revision in [
        json!(rev.to_string()),
        json!(-1),
        json!(null),
        json!(1.5),
        json!([rev]),
    ] {
        add(&format!("revision {revision}"), json!({"key": held, "holder": owner, "revision": revision, "ttl_ms": 10_000, "payload": "", "timeout_ms": 1000}).to_string().into_bytes());
    }
    add(
        "key as a number",
        json!({"key": 7, "holder": owner, "ttl_ms": 10_000, "revision": rev})
            .to_string()
            .into_bytes(),
    );
    add(
        "key null",
        json!({"key": null, "holder": owner, "ttl_ms": 10_000, "revision": rev})
            .to_string()
            .into_bytes(),
    );
    add(
        "key as an object",
        json!({"key": {"k": held}, "holder": owner, "ttl_ms": 10_000})
            .to_string()
            .into_bytes(),
    );
    add(
        "holder as an array",
        json!({"key": held, "holder": [owner], "ttl_ms": 10_000, "revision": rev})
            .to_string()
            .into_bytes(),
    );
    add(
        "duplicate key field",
        format!(
            r#"{{"key":"{held}","key":"other","holder":"{owner}","ttl_ms":10000,"revision":{rev}}}"#
        )
        .into_bytes(),
    );
    add(
        "duplicate holder field",
        format!(
            r#"{{"key":"{held}","holder":"x","holder":"{owner}","ttl_ms":10000,"revision":{rev}}}"#
        )
        .into_bytes(),
    );
    add(
        "unknown field",
        json!({"key": held, "holder": owner, "ttl_ms": 10_000, "revision": rev, "force": true})
            .to_string()
            .into_bytes(),
    );
    for typo in ["ttl", "revison", "holdr", "ttlMs", "TTL_MS"] {
        add(
            &format!("typo `{typo}`"),
            json!({"key": held, "holder": owner, "revision": rev, typo: 10_000})
                .to_string()
                .into_bytes(),
        );
    }
    add(
        "unknown field only",
        json!({"evil": 1}).to_string().into_bytes(),
    );
    add("payload not base64", json!({"key": held, "holder": owner, "ttl_ms": 10_000, "revision": rev, "payload": "!!!", "timeout_ms": 1000}).to_string().into_bytes());
    for t in [json!(0), json!(99), json!(30_001), json!("1000")] {
        add(&format!("timeout_ms {t}"), json!({"key": held, "payload": "aGk=", "timeout_ms": t, "holder": owner, "revision": rev, "ttl_ms": 10_000}).to_string().into_bytes());
    }
    add(
        "trailing garbage",
        format!(r#"{{"key":"{held}"}} x"#).into_bytes(),
    );
    add(
        "two objects",
        format!(r#"{{"key":"{held}"}}{{"key":"{held}"}}"#).into_bytes(),
    );
    out.extend(partly);
    out
}

#[tokio::test]
async fn hostile_bodies_are_invalid_and_change_nothing() {
    let server = NatsServer::start();
    let svc = service::start(connect(&server).await, ServiceOptions::default())
        .await
        .expect("service starts");
    let client = connect(&server).await;
    let max_payload = client.server_info().max_payload;

    // Held keys (long TTL, so nothing expires during the sweep).
    let keys: Vec<String> = (0..4).map(|i| format!("held-{i}")).collect();
    let mut revs = Vec::new();
    for key in &keys {
        let got = call_raw(
            &client,
            "acquire",
            json!({"key": key, "holder": "owner-1", "ttl_ms": 120_000})
                .to_string()
                .into_bytes(),
        )
        .await;
        assert_eq!(got["granted"], true, "{got}");
        revs.push(got["revision"].as_u64().unwrap());
    }
    let before = snapshot(&client, &keys).await;

    let bodies = bodies(&keys[0], "owner-1", revs[0], max_payload);
    let mut checked = 0;
    let mut failures = Vec::new();
    for endpoint in ENDPOINTS {
        for Hostile {
            name,
            body,
            ignored_by,
        } in &bodies
        {
            if ignored_by.contains(&endpoint) {
                continue;
            }
            let reply = call_raw(&client, endpoint, body.clone()).await;
            let sentence = reply["error"].as_str().unwrap_or("");
            if reply["kind"] != "invalid" || sentence.len() < 8 || !sentence.contains(' ') {
                failures.push(format!("{endpoint} / {name}: {reply}"));
            }
            checked += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "not invalid with a sentence:\n{}",
        failures.join("\n")
    );

    let after = snapshot(&client, &keys).await;
    assert_eq!(
        before, after,
        "the sweep changed a lease or wrote to the stream"
    );
    // Still serving: a fresh acquire and a renew of a held key work.
    let fresh = call_raw(
        &client,
        "acquire",
        json!({"key": "after-sweep", "holder": "h2", "ttl_ms": 5_000})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(fresh["granted"], true, "{fresh}");
    let renewed = call_raw(
        &client,
        "renew",
        json!({"key": keys[0], "holder": "owner-1", "revision": revs[0]})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert!(
        renewed["revision"].as_u64().unwrap() > before.1,
        "{renewed}"
    );
    println!(
        "bad input: {checked} hostile requests ({} bodies x 5 endpoints, less the shared \
         fields a call ignores) all invalid; \
         {} held leases and last sequence {} unchanged; service still serving",
        bodies.len(),
        keys.len(),
        before.1
    );
    svc.shutdown().await;
}
