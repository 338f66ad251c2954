//! Bad-input sweep: malformed and hostile bodies to every endpoint of the running
//! service get `kind: invalid` with a sentence, change no lease, and the service
//! keeps serving. Widened for issue 28: hostile reply subjects get no answer
//! anywhere and change nothing; hostile request headers never reach a stored write
//! or a forward; churned key names leave an empty stream; a flood of bogus renews
//! is refused while another caller's renew latency is measured (a figure for
//! docs/security.md, not an assertion). Each test prints a `bad input:` line.

mod common;

use async_nats::Client;
use common::{call_raw, connect};
use dagnats_leases_tests::{Binary, NatsServer};
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
    let svc = service::start(
        (server.url(), connect(&server).await),
        ServiceOptions::default(),
    )
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

// ---------------------------------------------------------------------------
// Hostile reply subjects, hostile headers, churned key names and a flood of bogus
// renews (issue 28, item 7). The reply-refusal counter is covered by
// adapter-tokio/tests/scoped.rs; here the sweep is wider and checks what an
// attacker can observe: an answer on the subject it steered to, a changed bucket.
// ---------------------------------------------------------------------------

/// The bucket's stream, as the server reports it: messages, first and last sequence.
async fn stream_state(client: &Client) -> (u64, u64, u64) {
    let info = client
        .request("$JS.API.STREAM.INFO.KV_leases", "{}".into())
        .await
        .expect("stream info");
    let info: Value = serde_json::from_slice(&info.payload).unwrap();
    let state = &info["state"];
    (
        state["messages"].as_u64().expect("messages"),
        state["first_seq"].as_u64().expect("first_seq"),
        state["last_seq"].as_u64().expect("last_seq"),
    )
}

/// A key's last stored message, read straight from the stream
/// (`$JS.API.STREAM.MSG.GET.KV_leases`, `last_by_subj`), not through the service.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    seq: u64,
    /// Header lines in stored order, as (name, value).
    headers: Vec<(String, String)>,
    data: Vec<u8>,
}

impl Stored {
    fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// Parses a NATS header block (`NATS/1.0\r\nName: value\r\n...\r\n\r\n`).
fn parse_headers(block: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(block);
    text.split("\r\n")
        .skip(1)
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            (name.to_string(), value.trim().to_string())
        })
        .collect()
}

/// The last message stored for `$KV.leases.<subject_tail>`, or `None` when the stream
/// holds none (never written, or purged).
async fn stored(client: &Client, subject_tail: &str) -> Option<Stored> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let reply = client
        .request(
            "$JS.API.STREAM.MSG.GET.KV_leases",
            json!({"last_by_subj": format!("$KV.leases.{subject_tail}")})
                .to_string()
                .into(),
        )
        .await
        .expect("msg get");
    let v: Value = serde_json::from_slice(&reply.payload).unwrap();
    if v["error"]["code"] == 404 {
        return None;
    }
    let msg = &v["message"];
    assert!(msg.is_object(), "MSG.GET answered {v}");
    let headers = msg["hdrs"]
        .as_str()
        .map(|h| parse_headers(&b64.decode(h).unwrap()))
        .unwrap_or_default();
    let data = msg["data"]
        .as_str()
        .map(|d| b64.decode(d).unwrap())
        .unwrap_or_default();
    Some(Stored {
        seq: msg["seq"].as_u64().expect("seq"),
        headers,
        data,
    })
}

/// The whole observable bucket: the stream's state and the last record of `keys`.
async fn bucket(client: &Client, keys: &[&str]) -> ((u64, u64, u64), Vec<Option<Stored>>) {
    let mut records = Vec::new();
    for key in keys {
        records.push(stored(client, key).await);
    }
    (stream_state(client).await, records)
}

/// Waits for `marker` on `sub` (published after everything under test); returns
/// every message seen before it.
async fn until_marker(sub: &mut async_nats::Subscriber, marker: &str) -> Vec<async_nats::Message> {
    use futures::StreamExt;
    let mut seen = Vec::new();
    loop {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(10), sub.next())
            .await
            .unwrap_or_else(|_| panic!("no {marker} within 10 s"))
            .expect("subscription open");
        if msg.subject.as_str() == marker {
            return seen;
        }
        seen.push(msg);
    }
}

/// Reply subjects an attacker may write: the bucket's subjects, the JetStream API,
/// the service's own subjects, wildcards, malformed and look-alike inboxes.
fn hostile_reply_subjects() -> Vec<String> {
    let mut out: Vec<String> = [
        // The bucket.
        "$KV.leases.held-0",
        "$KV.leases.held-1.read",
        "$KV.leases.fresh",
        "$KV.leases.*",
        "$KV.leases.>",
        // The JetStream API.
        "$JS.API.STREAM.PURGE.KV_leases",
        "$JS.API.STREAM.DELETE.KV_leases",
        "$JS.API.STREAM.MSG.DELETE.KV_leases",
        "$JS.API.STREAM.UPDATE.KV_leases",
        "$JS.API.STREAM.CREATE.KV_other",
        "$JS.API.STREAM.MSG.GET.KV_leases",
        "$JS.API.CONSUMER.CREATE.KV_leases",
        "$JS.API.INFO",
        "$JS.API.>",
        // The service's own subjects.
        "api.leases.acquire",
        "api.leases.renew",
        "api.leases.release",
        "api.leases.owner",
        "api.leases.forward",
        "api.leases.renew_many",
        "api.leases.*",
        "$SRV.PING",
        "$SRV.INFO.dagnats-api",
        "$SRV.STATS.dagnats-api",
        "$SRV.>",
        "dagnats.lease.changed.held-0",
        "dagnats.lease.changed.>",
        "dagnats.lease.inbox.fh.held-2",
        // Wildcards, also under an inbox prefix.
        ">",
        "*",
        "_INBOX.>",
        "_INBOX.*",
        "_INBOX.*.x",
        "_INBOX.x.>",
        // Malformed inboxes: empty tokens, control characters, too long.
        "_INBOX.",
        "_INBOX..x",
        "_INBOX.a..b",
        "_INBOX.a\u{1}b",
        "_INBOX.a\u{7f}b",
        "_INBOX.a\u{0}b",
        // Look-alikes of an inbox.
        "_inbox.x",
        "_INBOX",
        "INBOX.x",
        "_R_x",
        "$KV.leases._INBOX.x",
        // Whitespace: async-nats refuses these unless subject validation is off.
        "_INBOX.a b",
        "_INBOX.a\tb",
        "_INBOX.a\r\nb",
        " _INBOX.x",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    out.push(format!("_INBOX.{}", "x".repeat(600)));
    out
}

async fn hostile_reply_subjects_are_not_answered_and_change_nothing(binary: Binary) {
    let server = NatsServer::builder().binary(binary).start();
    let svc = service::start(
        (server.url(), connect(&server).await),
        ServiceOptions::default(),
    )
    .await
    .expect("service starts");
    let client = connect(&server).await;
    let attacker = connect(&server).await;
    // A client with async-nats' subject validation off, for the whitespace subjects.
    let raw = async_nats::ConnectOptions::new()
        .skip_subject_validation(true)
        .connect(server.url())
        .await
        .expect("connect");
    // Sees every message; an answer is a message on a hostile subject that has no
    // reply subject of its own (the service's requests to JetStream all have one)
    // and is not one of the bucket's republished change events.
    let watcher = connect(&server).await;
    let mut all = watcher.subscribe(">").await.unwrap();
    // In place once a request on the same connection has round-tripped (async-nats'
    // flush is no round trip): JetStream answers this one, and the request
    // itself is the first thing the subscription sees.
    watcher
        .request("$JS.API.INFO", "".into())
        .await
        .expect("JetStream answers");
    until_marker(&mut all, "$JS.API.INFO").await;

    let mut revs = Vec::new();
    for i in 0..3 {
        let got = call_raw(
            &client,
            "acquire",
            json!({"key": format!("held-{i}"), "holder": "fh", "ttl_ms": 120_000})
                .to_string()
                .into_bytes(),
        )
        .await;
        assert_eq!(got["granted"], true, "{got}");
        revs.push(got["revision"].clone());
    }
    let keys = ["held-0", "held-1", "held-2", "fresh", "held-1.read"];
    let before = bucket(&client, &keys).await;

    let bodies = [
        (
            "acquire",
            json!({"key": "fresh", "holder": "thief", "ttl_ms": 60_000}),
        ),
        (
            "renew",
            json!({"key": "held-0", "holder": "fh", "revision": revs[0]}),
        ),
        (
            "release",
            json!({"key": "held-0", "holder": "fh", "revision": revs[0]}),
        ),
        ("owner", json!({"key": "held-1"})),
        (
            "forward",
            json!({"key": "held-2", "payload": "aGk=", "timeout_ms": 200}),
        ),
        (
            "renew_many",
            json!({"leases": [{"key": "held-1", "holder": "fh", "revision": revs[1]}]}),
        ),
    ];
    let subjects = hostile_reply_subjects();
    let (mut sent, mut refused_by_client, mut sent_raw) = (0, 0, 0);
    for to in &subjects {
        let requests = bodies
            .iter()
            .map(|(e, b)| (format!("api.leases.{e}"), b.to_string()))
            .chain(
                ["$SRV.PING", "$SRV.INFO.dagnats-api", "$SRV.STATS"]
                    .iter()
                    .map(|v| (v.to_string(), String::new())),
            );
        for (subject, body) in requests {
            match attacker
                .publish_with_reply(subject.clone(), to.clone(), body.clone().into())
                .await
            {
                Ok(()) => sent += 1,
                Err(_) => {
                    // Refused by the client library; sent anyway with validation off.
                    // The server's protocol parser splits on whitespace, so such a
                    // request is a protocol error at the server, or arrives with the
                    // reply cut at the first space: either way no inbox of ours.
                    refused_by_client += 1;
                    if raw
                        .publish_with_reply(subject, to.clone(), body.into())
                        .await
                        .is_ok()
                    {
                        sent_raw += 1;
                    }
                }
            }
        }
    }
    attacker.flush().await.unwrap();
    let _ = raw.flush().await;

    // The service still answers a good request after all that; then the bucket is
    // read, then a marker closes the window in which an answer would show.
    let fresh = call_raw(
        &client,
        "owner",
        json!({"key": "held-0"}).to_string().into_bytes(),
    )
    .await;
    assert_eq!(fresh["held"], true, "{fresh}");
    assert_eq!(fresh["revision"], revs[0], "{fresh}");
    let after = bucket(&client, &keys).await;
    attacker.publish("sweep.done", "".into()).await.unwrap();
    let seen = until_marker(&mut all, "sweep.done").await;
    let answered: Vec<String> = seen
        .iter()
        .filter(|m| {
            // The bucket's own republished change events carry `Nats-Stream`.
            let republished = m
                .headers
                .as_ref()
                .is_some_and(|h| h.get("Nats-Stream").is_some());
            m.reply.is_none() && !republished && subjects.iter().any(|s| s == m.subject.as_str())
        })
        .map(|m| {
            format!(
                "{:?}: {}",
                m.subject.as_str(),
                String::from_utf8_lossy(&m.payload)
            )
        })
        .collect();
    assert!(
        answered.is_empty(),
        "answered on a hostile reply subject:\n{}",
        answered.join("\n")
    );
    assert_eq!(after, before, "the bucket changed");

    // No reply subject at all: nothing runs (a steered acquire would hold `fresh`).
    for (endpoint, body) in &bodies {
        attacker
            .publish(format!("api.leases.{endpoint}"), body.to_string().into())
            .await
            .unwrap();
    }
    attacker.flush().await.unwrap();
    let good = call_raw(
        &client,
        "acquire",
        json!({"key": "after-replies", "holder": "h2", "ttl_ms": 5_000})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(good["granted"], true, "{good}");
    let fresh_owner = call_raw(
        &client,
        "owner",
        json!({"key": "fresh"}).to_string().into_bytes(),
    )
    .await;
    assert_eq!(
        fresh_owner["held"], false,
        "a request without a reply ran: {fresh_owner}"
    );
    let (after_none, records) = bucket(&client, &keys).await;
    assert_eq!(records, before.1, "a request without a reply changed a key");
    assert_eq!(
        after_none.2,
        before.0.2 + 1,
        "only the good acquire wrote: {after_none:?}"
    );
    println!(
        "bad input: nats-server {}: {} hostile reply subjects x 8 requests ({sent} sent, {refused_by_client} \
         with whitespace refused by async-nats, {sent_raw} of those written with validation \
         off, a protocol error at the server), and 5 without a reply: none answered, \
         stream and {} records unchanged; service still serving",
        server.version(),
        subjects.len(),
        keys.len()
    );
    svc.shutdown().await;
}

/// Headers a client may put on a request that would change a write if the service
/// copied them into it (or would forge who sent it): each must be ignored.
const HOSTILE_HEADERS: &[(&str, &str)] = &[
    ("Nats-Request-Info", r#"{"acc":"TA","user":"a1"}"#),
    ("Nats-TTL", "1s"),
    ("Nats-Rollup", "sub"),
    ("Nats-Rollup", "all"),
    ("Nats-Expected-Last-Subject-Sequence", "999999"),
    (
        "Nats-Expected-Last-Subject-Sequence-Subject",
        "$KV.leases.sentinel",
    ),
    ("Nats-Expected-Stream", "KV_other"),
    ("Nats-Expected-Last-Sequence", "1"),
    ("Nats-Expected-Last-Msg-Id", "none"),
    ("Nats-Msg-Id", "hostile-id"),
    ("Nats-Batch-Id", "hostile-batch"),
    ("Nats-Marker-Reason", "MaxAge"),
    ("KV-Operation", "PURGE"),
    ("KV-Operation", "DEL"),
    ("Dagnats-Lease-Event", "released"),
    ("Dagnats-Lease-Fence", "1"),
    // A second identity claim (all at once: two copies, as a forger on 2.11 sends).
    ("Nats-Request-Info", r#"{"acc":"TB"}"#),
    // Other spellings: the server's header names are case-sensitive.
    ("nats-ttl", "1s"),
    ("NATS-ROLLUP", "all"),
    ("kv-operation", "PURGE"),
];

/// Headers whose values differ from one message to the next by nature: the
/// expected revision (checked on its own) and what the server adds to a
/// republished change event.
const PER_MESSAGE: &[&str] = &[
    "Nats-Expected-Last-Subject-Sequence",
    "Nats-Sequence",
    "Nats-Time-Stamp",
    "Nats-Last-Sequence",
    "Nats-Subject",
    "Dagnats-Lease-Fence",
];

/// Header lines as (name, value) from an async-nats header map.
fn header_lines(headers: Option<&async_nats::HeaderMap>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(h) = headers {
        for (name, values) in h.iter() {
            for v in values {
                out.push((name.to_string(), v.as_str().to_string()));
            }
        }
    }
    out
}

/// A write's headers against the same write made without hostile headers: the
/// same names, the same values (but for the per-message ones), the revision
/// header (`Nats-Expected-Last-Subject-Sequence` of a write, `Dagnats-Lease-Fence`
/// of a forward) the one the call read, and nothing of `sent`.
fn same_headers(
    what: &str,
    control: &[(String, String)],
    got: &[(String, String)],
    revision: (&str, u64),
    sent: &[(&str, &str)],
    failures: &mut Vec<String>,
) {
    let shape = |lines: &[(String, String)]| {
        let mut v: Vec<(String, String)> = lines
            .iter()
            .map(|(n, val)| {
                let val = if PER_MESSAGE.contains(&n.as_str()) {
                    String::new()
                } else {
                    val.clone()
                };
                (n.clone(), val)
            })
            .collect();
        v.sort();
        v
    };
    if shape(control) != shape(got) {
        failures.push(format!(
            "{what}: headers {got:?}, the service's own are {control:?}"
        ));
        return;
    }
    let (header, rev) = revision;
    let values: Vec<&String> = got
        .iter()
        .filter(|(n, _)| n == header)
        .map(|(_, v)| v)
        .collect();
    if values != [&rev.to_string()] {
        failures.push(format!(
            "{what}: {header} {values:?}, the call read revision {rev}"
        ));
    }
    for (name, value) in sent {
        let ours = control.iter().any(|(n, v)| n == name && v == value);
        if !ours && got.iter().any(|(n, v)| n == name && v == value) {
            failures.push(format!("{what}: the request's {name}: {value} was copied"));
        }
    }
}

/// One lease's life with `sent` on every request; returns the writes' and the
/// forward's header lines in order (acquire, renew, release event, forward).
struct Life {
    acquire: Vec<(String, String)>,
    acquire_rev: u64,
    renew: Vec<(String, String)>,
    renew_rev: u64,
    release_event: Vec<(String, String)>,
    forwarded: Vec<(String, String)>,
    /// The stream's last sequence moved by owner (it must not).
    owner_wrote: bool,
    /// Stored Nats-TTL of the acquire and the renew.
    ttls: (Vec<String>, Vec<String>),
}

const LIFE_TTL_MS: u64 = 60_000;

/// The header that makes a write conditional on the revision the call read.
const EXPECTED: &str = "Nats-Expected-Last-Subject-Sequence";

async fn life(
    client: &Client,
    events: &mut async_nats::Subscriber,
    inbox: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<(String, String)>>,
    key: &str,
    sent: &[(&str, &str)],
) -> Life {
    use futures::StreamExt;
    let mut headers = async_nats::HeaderMap::new();
    for (n, v) in sent {
        headers.append(*n, *v);
    }
    let call = |endpoint: &'static str, body: Value| {
        let headers = headers.clone();
        async move {
            let reply = client
                .request_with_headers(
                    format!("api.leases.{endpoint}"),
                    headers,
                    body.to_string().into(),
                )
                .await
                .unwrap_or_else(|e| panic!("{endpoint} {key}: {e}"));
            let v: Value = serde_json::from_slice(&reply.payload).unwrap();
            v
        }
    };
    let mut next_event = async || {
        let m = tokio::time::timeout(std::time::Duration::from_secs(10), events.next())
            .await
            .unwrap_or_else(|_| panic!("no change event for {key}"))
            .unwrap();
        assert_eq!(m.subject.as_str(), format!("dagnats.lease.changed.{key}"));
        header_lines(m.headers.as_ref())
    };

    let a = call(
        "acquire",
        json!({"key": key, "holder": "fh", "ttl_ms": LIFE_TTL_MS}),
    )
    .await;
    assert_eq!(a["granted"], true, "acquire {key} with {sent:?}: {a}");
    let acquire_rev = a["revision"].as_u64().unwrap();
    next_event().await;
    let stored_a = stored(client, key).await.expect("the acquire is stored");
    assert_eq!(stored_a.seq, acquire_rev);

    let r = call(
        "renew",
        json!({"key": key, "holder": "fh", "revision": acquire_rev}),
    )
    .await;
    assert_eq!(r["held"], true, "renew {key} with {sent:?}: {r}");
    let renew_rev = r["revision"].as_u64().unwrap();
    next_event().await;
    let stored_r = stored(client, key).await.expect("the renew is stored");
    assert_eq!(stored_r.seq, renew_rev);

    let before_owner = stream_state(client).await;
    let o = call("owner", json!({"key": key})).await;
    assert_eq!(o["held"], true, "owner {key} with {sent:?}: {o}");
    assert_eq!(o["revision"], renew_rev, "owner {key} with {sent:?}: {o}");
    let owner_wrote = stream_state(client).await != before_owner;

    let f = call(
        "forward",
        json!({"key": key, "payload": "aGk=", "timeout_ms": 5000}),
    )
    .await;
    assert!(f.get("kind").is_none(), "forward {key} with {sent:?}: {f}");
    let forwarded = inbox.recv().await.expect("the holder got the forward");

    let d = call(
        "release",
        json!({"key": key, "holder": "fh", "revision": renew_rev}),
    )
    .await;
    assert_eq!(d["released"], true, "release {key} with {sent:?}: {d}");
    let release_event = next_event().await;

    let ttl = |s: &Stored| s.header("Nats-TTL").iter().map(|v| v.to_string()).collect();
    Life {
        ttls: (ttl(&stored_a), ttl(&stored_r)),
        acquire: stored_a.headers,
        acquire_rev,
        renew: stored_r.headers,
        renew_rev,
        release_event,
        forwarded,
        owner_wrote,
    }
}

async fn hostile_request_headers_are_never_copied_into_a_write(binary: Binary) {
    use futures::StreamExt;
    let server = NatsServer::builder().binary(binary).start();
    let svc = service::start(
        (server.url(), connect(&server).await),
        ServiceOptions::default(),
    )
    .await
    .expect("service starts");
    let client = connect(&server).await;
    let mut events = client.subscribe("dagnats.lease.changed.>").await.unwrap();
    // The owner `fh` answers forwards and reports the headers it was sent.
    let holder = connect(&server).await;
    let mut forwards = holder.subscribe("dagnats.lease.inbox.fh.>").await.unwrap();
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let answering = holder.clone();
    tokio::spawn(async move {
        while let Some(m) = forwards.next().await {
            let _ = seen_tx.send(header_lines(m.headers.as_ref()));
            if let Some(reply) = m.reply {
                let _ = answering.publish(reply, "ok".into()).await;
            }
        }
    });
    // Both subscriptions are in place once a request on each connection has
    // round-tripped (async-nats' flush is no round trip).
    let _ = client.request("_INBOX.round-trip", "".into()).await;
    let _ = holder.request("_INBOX.round-trip", "".into()).await;

    let sentinel = call_raw(
        &client,
        "acquire",
        json!({"key": "sentinel", "holder": "s", "ttl_ms": 120_000})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(sentinel["granted"], true, "{sentinel}");
    events.next().await.unwrap();
    let sentinel_stored = stored(&client, "sentinel").await;

    let control = life(&client, &mut events, &mut seen, "control", &[]).await;
    let own_ttl = vec![dagnats_leases_core::record::ttl_header(LIFE_TTL_MS)];
    assert_eq!(control.ttls, (own_ttl.clone(), own_ttl.clone()));
    assert!(!control.owner_wrote);

    let mut cases: Vec<Vec<(&str, &str)>> = HOSTILE_HEADERS.iter().map(|h| vec![*h]).collect();
    cases.push(HOSTILE_HEADERS.to_vec());
    let mut failures = Vec::new();
    for (i, sent) in cases.iter().enumerate() {
        let key = format!("hdr-{i}");
        let got = life(&client, &mut events, &mut seen, &key, sent).await;
        let what = |call: &str| format!("{call} {key} with {sent:?}");
        same_headers(
            &what("acquire"),
            &control.acquire,
            &got.acquire,
            (EXPECTED, 0),
            sent,
            &mut failures,
        );
        same_headers(
            &what("renew"),
            &control.renew,
            &got.renew,
            (EXPECTED, got.acquire_rev),
            sent,
            &mut failures,
        );
        same_headers(
            &what("release"),
            &control.release_event,
            &got.release_event,
            (EXPECTED, got.renew_rev),
            sent,
            &mut failures,
        );
        same_headers(
            &what("forward"),
            &control.forwarded,
            &got.forwarded,
            ("Dagnats-Lease-Fence", got.renew_rev),
            sent,
            &mut failures,
        );
        // The check itself catches a copy: the control write with `sent` added.
        let mut copied = control.acquire.clone();
        copied.extend(sent.iter().map(|(n, v)| (n.to_string(), v.to_string())));
        let mut caught = Vec::new();
        same_headers(
            "copy",
            &control.acquire,
            &copied,
            (EXPECTED, 0),
            sent,
            &mut caught,
        );
        assert!(!caught.is_empty(), "the check misses a copy of {sent:?}");
        if got.ttls != control.ttls {
            failures.push(format!("{}: TTLs {:?}", what("acquire/renew"), got.ttls));
        }
        if got.owner_wrote {
            failures.push(format!("{}: wrote to the stream", what("owner")));
        }
    }

    // One `Nats-Msg-Id` on two different acquires: both granted, both stored.
    let mut same_id = async_nats::HeaderMap::new();
    same_id.insert("Nats-Msg-Id", "same-id");
    let mut dedup = Vec::new();
    for key in ["dedup-a", "dedup-b"] {
        let reply = client
            .request_with_headers(
                "api.leases.acquire",
                same_id.clone(),
                json!({"key": key, "holder": "fh", "ttl_ms": LIFE_TTL_MS})
                    .to_string()
                    .into(),
            )
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(v["granted"], true, "{key} with a reused Nats-Msg-Id: {v}");
        let s = stored(&client, key).await.expect("stored");
        assert_eq!(Some(s.seq), v["revision"].as_u64(), "{key}: {v}");
        dedup.push(s.seq);
    }
    assert_ne!(dedup[0], dedup[1], "two acquires deduplicated into one");

    assert!(
        failures.is_empty(),
        "hostile headers reached a write:\n{}",
        failures.join("\n")
    );
    assert_eq!(
        stored(&client, "sentinel").await,
        sentinel_stored,
        "another key's record changed"
    );
    println!(
        "bad input: nats-server {}: {} hostile headers, one at a time and all at once, on acquire, renew, \
         owner, forward and release ({} calls): every stored write and forward carries \
         exactly the service's own headers (acquire {:?}), the requested TTL {}; a reused \
         Nats-Msg-Id deduplicated no acquire",
        server.version(),
        HOSTILE_HEADERS.len(),
        cases.len() * 5,
        {
            let mut names: Vec<&str> = control.acquire.iter().map(|(n, _)| n.as_str()).collect();
            names.sort_unstable();
            names
        },
        own_ttl[0]
    );
    svc.shutdown().await;
}

#[tokio::test]
async fn churned_key_names_leave_an_empty_stream() {
    use futures::StreamExt;
    let server = NatsServer::start();
    let svc = service::start(
        (server.url(), connect(&server).await),
        ServiceOptions::default(),
    )
    .await
    .expect("service starts");
    let client = connect(&server).await;
    // Fresh names of every allowed shape: letters, digits, `_`, `-`, 1 to 128 bytes.
    let n = 400;
    let keys: Vec<String> = (0..n)
        .map(|i| match i % 4 {
            0 => format!("churn-{i}"),
            1 => format!("_{i}_"),
            2 => format!("{i}{}", "k".repeat(128 - i.to_string().len())),
            _ => format!("C-{i}-x_y"),
        })
        .collect();
    let releases: Vec<u64> = futures::stream::iter(keys.iter().cloned())
        .map(|key| {
            let client = client.clone();
            async move {
                let a = call_raw(
                    &client,
                    "acquire",
                    json!({"key": key, "holder": "churner", "ttl_ms": 60_000})
                        .to_string()
                        .into_bytes(),
                )
                .await;
                assert_eq!(a["granted"], true, "{key}: {a}");
                let r = call_raw(
                    &client,
                    "release",
                    json!({"key": key, "holder": "churner", "revision": a["revision"]})
                        .to_string()
                        .into_bytes(),
                )
                .await;
                assert_eq!(r["released"], true, "{key}: {r}");
                r["revision"].as_u64().unwrap()
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let last = *releases.iter().max().unwrap();
    // The sweep purges each release's tombstone after its reply: waited on as the
    // server reports it, bounded.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let (messages, _, last_seq) = loop {
        let state = stream_state(&client).await;
        if state.0 == 0 {
            break state;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} messages left after {n} fresh keys acquired and released",
            state.0
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(
        last_seq, last,
        "the stream's last sequence is the last release"
    );
    // A churned name taken again gets a fence above everything before.
    let again = call_raw(
        &client,
        "acquire",
        json!({"key": keys[0], "holder": "h2", "ttl_ms": 5_000})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert!(again["revision"].as_u64().unwrap() > last, "{again}");
    println!(
        "bad input: {n} fresh key names acquired and released (16 at a time) leave \
         {messages} messages in KV_leases, last sequence {last_seq}; the next grant's \
         fence is {}",
        again["revision"]
    );
    svc.shutdown().await;
}

/// The `p`-th percentile of sorted durations, in microseconds.
fn percentile(sorted: &[std::time::Duration], p: usize) -> u128 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)].as_micros()
}

/// Renews of `key` by its holder, one after another until `until` says stop, each
/// at the revision the last one returned (`revision`, shared with the flood); each
/// one's latency, sorted.
async fn timed_renews(
    client: &Client,
    key: &str,
    revision: &std::sync::atomic::AtomicU64,
    until: impl Fn(usize) -> bool,
) -> Vec<std::time::Duration> {
    use std::sync::atomic::Ordering;
    let mut times = Vec::new();
    let mut i = 0;
    while !until(i) {
        let start = std::time::Instant::now();
        let r = call_raw(
            client,
            "renew",
            json!({"key": key, "holder": "victim", "revision": revision.load(Ordering::SeqCst)})
                .to_string()
                .into_bytes(),
        )
        .await;
        times.push(start.elapsed());
        assert_eq!(r["held"], true, "the holder's renew {i}: {r}");
        revision.store(r["revision"].as_u64().unwrap(), Ordering::SeqCst);
        i += 1;
    }
    times.sort();
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bogus_renews_is_refused_and_another_callers_renewals_go_on() {
    use futures::StreamExt;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let server = NatsServer::start();
    let svc = service::start(
        (server.url(), connect(&server).await),
        ServiceOptions::default(),
    )
    .await
    .expect("service starts");
    let holder = connect(&server).await;
    let attacker = connect(&server).await;
    let held = call_raw(
        &holder,
        "acquire",
        json!({"key": "busy", "holder": "victim", "ttl_ms": 60_000})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(held["granted"], true, "{held}");
    let before = stored(&holder, "busy").await;

    let current = std::sync::Arc::new(AtomicU64::new(held["revision"].as_u64().unwrap()));
    let quiet = timed_renews(&holder, "busy", &current, |i| i >= 300).await;

    // The flood: a wrong holder at the current revision, and the right holder at a
    // stale one (revisions only grow), 64 at a time from one connection.
    let flood = 3000;
    let stale_below = current.load(Ordering::SeqCst);
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let flooding = {
        let attacker = attacker.clone();
        let current = current.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let kinds: Vec<String> = futures::stream::iter(0..flood)
                .map(|i| {
                    let attacker = attacker.clone();
                    let current = current.clone();
                    async move {
                        let body = if i % 2 == 0 {
                            let revision = current.load(Ordering::SeqCst);
                            json!({"key": "busy", "holder": "thief", "revision": revision})
                        } else {
                            let stale = 1 + i % (stale_below - 1);
                            json!({"key": "busy", "holder": "victim", "revision": stale})
                        };
                        let r = call_raw(&attacker, "renew", body.to_string().into_bytes()).await;
                        assert_ne!(r["held"], true, "a bogus renew held: {r}");
                        r["kind"].as_str().unwrap_or("no kind").to_string()
                    }
                })
                .buffer_unordered(64)
                .collect()
                .await;
            done.store(true, Ordering::SeqCst);
            kinds
        })
    };
    let flooded = timed_renews(&holder, "busy", &current, |i| {
        // While the flood lasts (at least one renew).
        i > 0 && done.load(Ordering::SeqCst)
    })
    .await;
    let kinds = flooding.await.unwrap();
    let mut tally = std::collections::BTreeMap::new();
    for k in &kinds {
        *tally.entry(k.as_str()).or_insert(0) += 1;
    }
    // The lease is the holder's still, at the fence it renews; only its renews wrote.
    let owner = call_raw(
        &holder,
        "owner",
        json!({"key": "busy"}).to_string().into_bytes(),
    )
    .await;
    assert_eq!(owner["holder"], "victim", "{owner}");
    assert_ne!(stored(&holder, "busy").await, before);
    println!(
        "bad input: renew latency of one holder, p50/p99 {}/{} us quiet ({} renews), \
         {}/{} us during a flood of {flood} bogus renews from another caller ({} renews; \
         the flood answered {tally:?})",
        percentile(&quiet, 50),
        percentile(&quiet, 99),
        quiet.len(),
        percentile(&flooded, 50),
        percentile(&flooded, 99),
        flooded.len(),
    );
    svc.shutdown().await;
}

#[tokio::test]
async fn hostile_reply_subjects_are_not_answered_and_change_nothing_on_the_supported_server() {
    hostile_reply_subjects_are_not_answered_and_change_nothing(Binary::Supported).await;
}

#[tokio::test]
async fn hostile_reply_subjects_are_not_answered_and_change_nothing_on_the_oldest_server() {
    hostile_reply_subjects_are_not_answered_and_change_nothing(Binary::Oldest).await;
}

#[tokio::test]
async fn hostile_request_headers_are_never_copied_into_a_write_on_the_supported_server() {
    hostile_request_headers_are_never_copied_into_a_write(Binary::Supported).await;
}

#[tokio::test]
async fn hostile_request_headers_are_never_copied_into_a_write_on_the_oldest_server() {
    hostile_request_headers_are_never_copied_into_a_write(Binary::Oldest).await;
}
