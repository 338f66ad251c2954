//! Tenancy against hostile bytes, on the example deployment (`scripts/tenants.conf`,
//! `serve --tenancy accounts` as `scripts/serve --tenants` runs it) on nats-server
//! 2.15.1 and 2.11.11, with requests written byte for byte by the raw protocol
//! client (`dagnats_leases_tests::raw`):
//!
//! - header blocks with a made-up `Nats-Request-Info` (folded lines, bare line
//!   feeds, a last line holding a space) never read or change another tenant's
//!   lease, and never get a lease for an account the deployment does not name
//!   (`NOSUCH`) or for the service's own (`LEASES`);
//! - the same forgeries inside one account never act as another user;
//! - no user subscribes to another user's reply inbox or to the endpoints;
//! - a burst of acquires of new keys stays within the tenant's cap.

use std::path::Path;
use std::time::Duration;

use dagnats_leases_tests::raw::{RawClient, RawMsg};
use dagnats_leases_tests::{Binary, NatsServer};
use serde_json::{Value, json};

#[path = "support/scrape.rs"]
mod scrape;

use scrape::Served;

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");
const CONF: &str = include_str!("../../scripts/tenants.conf");
/// The tenant accounts the example deployment names.
const TENANTS: [&str; 4] = ["--tenant-account", "TA", "--tenant-account", "TB"];

/// The example deployment on each supported release: the server and the service.
async fn deployments(extra: &[&str]) -> Vec<(NatsServer, Served)> {
    let oldest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.nats/bin-2.11/nats-server");
    let mut out = Vec::new();
    for binary in [Binary::Supported, Binary::Path(oldest)] {
        let server = NatsServer::builder().binary(binary).config(CONF).start();
        let served = serve(&server, extra).await;
        out.push((server, served));
    }
    out
}

/// The service for the example on `server`, as its users `serve` and `writer`,
/// with `extra` arguments.
async fn serve(server: &NatsServer, extra: &[&str]) -> Served {
    let mut args = vec![
        "--tenancy",
        "accounts",
        "--user",
        "serve",
        "--password",
        "serve",
        "--backend-user",
        "writer",
        "--backend-password",
        "writer",
    ];
    args.extend_from_slice(&TENANTS);
    args.extend_from_slice(extra);
    Served::start(BIN, &server.url(), &args).await
}

/// Connects as `user` (each password is the user's name), with the user's own
/// inbox prefix from the example's permissions.
async fn user(server: &NatsServer, name: &str) -> RawClient {
    let mut client = RawClient::connect_as(&server.url(), name, name)
        .await
        .unwrap_or_else(|e| panic!("{name} connects: {e}"));
    client.set_inbox_prefix(&inbox_prefix(name));
    client
}

/// The reply-inbox prefix the example gives `user`.
fn inbox_prefix(user: &str) -> String {
    match user {
        "writer" => "_dagnats_backend.".to_owned(),
        other => format!("_INBOX.{other}."),
    }
}

async fn call(
    client: &mut RawClient,
    endpoint: &str,
    headers: Option<&[u8]>,
    body: Value,
) -> Value {
    let subject = format!("api.leases.{endpoint}");
    let reply = client
        .request(&subject, headers, body.to_string().as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{endpoint}: {e}"));
    answer(&reply)
}

fn answer(reply: &RawMsg) -> Value {
    reply.json().unwrap_or_else(|| {
        panic!(
            "not JSON (status {:?}): {:?}",
            reply.status(),
            String::from_utf8_lossy(&reply.payload)
        )
    })
}

fn acquire(key: &str, holder: &str) -> Value {
    json!({"key": key, "holder": holder, "ttl_ms": 30000})
}

/// Header blocks that carry a made-up `Nats-Request-Info` (`info`) past the server:
/// after a bare line feed, with a last line holding only a space (the server's own
/// line then begins with it and is folded by a lenient reader), and plainer ones.
fn forged_blocks(info: &str) -> Vec<Vec<u8>> {
    [
        format!("NATS/1.0\r\nX-A: a\nNats-Request-Info: {info}\r\nX-B: b\r\n \r\n"),
        format!("NATS/1.0\r\nX-A: a\nNats-Request-Info: {info}\r\n \r\n"),
        format!("NATS/1.0\nNats-Request-Info: {info}\r\n \r\n"),
        format!("NATS/1.0\r\nX-A: a\nNats-Request-Info: {info}\r\n\r\n"),
        format!("NATS/1.0\r\nX-A: a\nNats-Request-Info: {info}\nX-B: b\r\n\t\r\n"),
        format!("NATS/1.0\r\nNats-Request-Info: {info}\r\n\r\n"),
        format!("NATS/1.0\r\nnats-request-info: {info}\r\n \r\n"),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect()
}

/// Sends a request with this header block; `None` when the server would not relay
/// the block or the service did not answer it (a reader that drops the block),
/// else the answer.
async fn forge(
    client: &mut RawClient,
    endpoint: &str,
    block: &[u8],
    body: &Value,
) -> Option<Value> {
    let what = format!(
        "{endpoint} {}",
        String::from_utf8_lossy(block).escape_debug()
    );
    let reply = client
        .request(
            &format!("api.leases.{endpoint}"),
            Some(block),
            body.to_string().as_bytes(),
        )
        .await;
    match reply {
        Ok(msg) if msg.status().is_some() => None,
        Ok(msg) => Some(answer(&msg)),
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{what}: {e}");
            None
        }
    }
}

/// The first block (the one that made the service act as another before) puts a
/// client header beside the server's: refused, naming why. A block the strict
/// reading finds malformed (a bare LF, a folded line) is `invalid`, naming the
/// line; a well-formed one with a client header beside the server's is
/// `forbidden`, naming the header.
fn assert_names_the_header(what: &str, got: &Option<Value>) {
    if let Some(v) = got {
        let text = v["error"].as_str().unwrap_or_default();
        match v["kind"].as_str() {
            Some("forbidden") => assert!(text.contains("Nats-Request-Info"), "{what}: {v}"),
            Some("invalid") => assert!(text.contains("malformed header block"), "{what}: {v}"),
            _ => panic!("{what}: neither forbidden nor a malformed block: {v}"),
        }
    }
}

/// The last record of `subject` in the bucket, as the backend user reads it.
async fn stored(writer: &mut RawClient, subject: &str) -> Option<u64> {
    let body = json!({"last_by_subj": subject}).to_string();
    let reply = writer
        .request("$JS.API.STREAM.MSG.GET.KV_leases", None, body.as_bytes())
        .await
        .unwrap();
    answer(&reply)["message"]["seq"].as_u64()
}

fn shown(block: &[u8]) -> String {
    String::from_utf8_lossy(block).escape_debug().to_string()
}

/// Where the server removed the forged line, the request is served as its sender
/// (TA); where a client header stands beside the server's, it is refused. Never
/// is TB's lease read or changed, nor a lease written for an unnamed account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_request_info_never_reaches_another_tenant_or_an_unnamed_account() {
    for (server, served) in deployments(&[]).await {
        let v = server.version().to_owned();
        let mut a1 = user(&server, "a1").await;
        let mut b1 = user(&server, "b1").await;
        let mut writer = user(&server, "writer").await;
        a1.set_timeout(Duration::from_secs(3));
        let tb = call(&mut b1, "acquire", None, acquire("job", "tb-holder")).await;
        assert_eq!(tb["granted"], true, "v{v}: {tb}");
        let fence = tb["revision"].clone();
        let fenced = json!({"key": "job", "holder": "tb-holder", "revision": fence});
        for info in [r#"{"acc":"TB"}"#, r#"{"acc":"TB","rtt":1}"#] {
            for (i, block) in forged_blocks(info).into_iter().enumerate() {
                for (endpoint, body) in [
                    ("owner", json!({"key": "job"})),
                    ("renew", fenced.clone()),
                    ("release", fenced.clone()),
                    ("acquire", acquire("job", "forger")),
                ] {
                    let what = format!("v{v} {endpoint} {}", shown(&block));
                    let got = forge(&mut a1, endpoint, &block, &body).await;
                    if i == 0 {
                        assert_names_the_header(&what, &got);
                    }
                    // Served at all, it was served as TA: never TB's holder (which
                    // renew and release only echo from their own body) or lease.
                    if let Some(got) = got {
                        let text = got.to_string();
                        if matches!(endpoint, "owner" | "acquire") {
                            assert!(!text.contains("tb-holder"), "{what}: {text}");
                        }
                        assert_ne!(got["revision"], fence, "{what}: {text}");
                        if matches!(endpoint, "renew" | "release") {
                            assert!(got.get("kind").is_some(), "{what}: {text}");
                        }
                    }
                }
            }
        }
        let owner = call(&mut b1, "owner", None, json!({"key": "job"})).await;
        assert_eq!(
            (&owner["holder"], &owner["revision"]),
            (&json!("tb-holder"), &fence),
            "v{v}: TB's lease changed: {owner}"
        );
        // Accounts the deployment does not name: a made-up one, the service's own.
        for account in ["NOSUCH", "LEASES"] {
            let info = format!(r#"{{"acc":"{account}"}}"#);
            for (i, block) in forged_blocks(&info).into_iter().enumerate() {
                let what = format!("v{v} {account} {}", shown(&block));
                let got = forge(&mut a1, "acquire", &block, &acquire("grab", "x")).await;
                if i == 0 {
                    assert_names_the_header(&what, &got);
                }
            }
            let subject = format!("$KV.leases.{account}.grab");
            assert_eq!(stored(&mut writer, &subject).await, None, "v{v}: {subject}");
        }
        assert_eq!(served.stop().await, Some(0), "v{v}");
    }
}

/// Inside one account a forged `Nats-Request-Info` naming another user must not
/// act as that user: a2's requests on a1's lease are refused, whether for the
/// header beside the server's or (served as a2) for the lease's binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_request_info_never_acts_as_another_user_of_the_account() {
    for (server, served) in deployments(&[]).await {
        let v = server.version().to_owned();
        let mut a1 = user(&server, "a1").await;
        let mut a2 = user(&server, "a2").await;
        a2.set_timeout(Duration::from_secs(3));
        let held = call(&mut a1, "acquire", None, acquire("job", "a1-holder")).await;
        assert_eq!(held["granted"], true, "v{v}: {held}");
        let fence = held["revision"].clone();
        let fenced = json!({"key": "job", "holder": "a1-holder", "revision": fence});
        for info in [
            r#"{"acc":"TA","user":"a1"}"#,
            r#"{"acc":"TA","user":"a1","rtt":1}"#,
        ] {
            for (i, block) in forged_blocks(info).into_iter().enumerate() {
                for (endpoint, body) in [
                    ("renew", fenced.clone()),
                    ("release", fenced.clone()),
                    ("acquire", acquire("job", "a1-holder")),
                ] {
                    let what = format!("v{v} {endpoint} {}", shown(&block));
                    let got = forge(&mut a2, endpoint, &block, &body).await;
                    if i == 0 {
                        assert_names_the_header(&what, &got);
                    }
                    if let Some(got) = got {
                        let malformed = got["kind"] == "invalid"
                            && got["error"]
                                .as_str()
                                .is_some_and(|e| e.contains("malformed header block"));
                        assert!(got["kind"] == "forbidden" || malformed, "{what}: {got}");
                    }
                }
            }
        }
        let owner = call(&mut a1, "owner", None, json!({"key": "job"})).await;
        assert_eq!(
            owner["revision"], fence,
            "v{v}: a1's lease changed: {owner}"
        );
        assert_eq!(served.stop().await, Some(0), "v{v}");
    }
}

#[tokio::test]
async fn no_user_subscribes_to_another_users_inbox_or_to_the_endpoints() {
    let oldest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.nats/bin-2.11/nats-server");
    for binary in [Binary::Supported, Binary::Path(oldest)] {
        let server = NatsServer::builder().binary(binary).config(CONF).start();
        let v = server.version().to_owned();
        let mut a2 = user(&server, "a2").await;
        for subject in [
            "_INBOX.a1.>",
            "_INBOX.>",
            "_INBOX.*.>",
            "_INBOX.a1.x.1",
            "api.leases.acquire",
            "api.leases.*",
            ">",
        ] {
            a2.subscribe(subject, None).await.unwrap();
            let error = a2.next_error().await.unwrap();
            assert!(
                error.contains("Permissions Violation") && error.contains(subject),
                "v{v}: a2 subscribed {subject}: {error}"
            );
        }
        // Its own inbox it may subscribe to.
        a2.subscribe("_INBOX.a2.>", None).await.unwrap();
        a2.flush().await.unwrap();
        assert_eq!(a2.take_errors(), Vec::<String>::new(), "v{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_keys_stays_within_the_tenants_cap() {
    for (server, served) in deployments(&["--max-leases-per-tenant", "3"]).await {
        let v = server.version().to_owned();
        let mut a1 = user(&server, "a1").await;
        let burst = 1500;
        let mut replies = Vec::with_capacity(burst);
        for i in 0..burst {
            let body = acquire(&format!("burst-{i}"), "h").to_string();
            replies.push(
                a1.send_request("api.leases.acquire", None, body.as_bytes())
                    .await
                    .unwrap(),
            );
        }
        let (mut granted, mut forbidden, mut other) = (0, 0, 0);
        for reply in replies {
            let msg = a1.reply_to(&reply).await.unwrap();
            let v = answer(&msg);
            if v["granted"] == true {
                granted += 1;
            } else if v["kind"] == "forbidden" {
                forbidden += 1;
            } else {
                other += 1;
            }
        }
        println!(
            "tenant_bytes: v{v}: {burst} acquires of new keys at once, cap 3: {granted} granted, \
             {forbidden} forbidden, {other} other"
        );
        assert!(granted <= 3, "v{v}: {granted} granted past a cap of 3");
        assert_eq!(granted, 3, "v{v}: the cap's places were not all used");
        assert_eq!(served.stop().await, Some(0), "v{v}");
    }
}

/// Two instances share the queue group: each counts its own acquires in flight
/// and learns the other's grants from the change events, so a burst can pass the
/// cap by at most the cap per further instance (docs/security.md); measured here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_across_two_instances_passes_the_cap_by_at_most_the_cap_per_instance() {
    let server = NatsServer::builder().config(CONF).start();
    let cap = ["--max-leases-per-tenant", "3"];
    let first = serve(&server, &cap).await;
    let second = serve(&server, &cap).await;
    let mut a1 = user(&server, "a1").await;
    let burst = 1500;
    let mut replies = Vec::with_capacity(burst);
    for i in 0..burst {
        let body = acquire(&format!("two-{i}"), "h").to_string();
        replies.push(
            a1.send_request("api.leases.acquire", None, body.as_bytes())
                .await
                .unwrap(),
        );
    }
    let mut granted = 0;
    for reply in replies {
        let msg = a1.reply_to(&reply).await.unwrap();
        if answer(&msg)["granted"] == true {
            granted += 1;
        }
    }
    println!(
        "tenant_bytes: {burst} acquires of new keys at once to two instances, cap 3: \
         {granted} granted"
    );
    assert!(
        granted >= 3,
        "{granted} granted: the cap's places were not used"
    );
    assert!(
        granted <= 6,
        "{granted} granted past the cap plus one cap per instance"
    );
    assert_eq!(first.stop().await, Some(0));
    assert_eq!(second.stop().await, Some(0));
}
