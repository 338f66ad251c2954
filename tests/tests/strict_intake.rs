//! The service's intake reads header blocks strictly and a malformed one costs
//! only its own message: against a real nats-server, with the hostile bytes
//! written raw (tests/src/raw.rs), since nats-server relays a header block
//! unchecked and async-nats would not write one.
//!
//! - each kind of malformed block on a request (bare LF, folded line, no colon,
//!   bad name, non-UTF-8 value) is answered `invalid`, naming the headers, and
//!   runs no call, while another client's renewals on the same service all
//!   succeed through a flood of them;
//! - an owner answering a forward with a malformed block costs only that
//!   forward: the next forward and every renewal meanwhile succeed;
//! - after the server restarts, the service serves again, strictly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dagnats_leases_tests::NatsServer;
use dagnats_leases_tests::raw::RawClient;
use dagnats_leases_tokio::client::{LeaseClient, LeaseErrorKind};
use dagnats_leases_tokio::service::{self, ServiceHandle, ServiceOptions};
use serde_json::{Value, json};

/// One malformed header block of each kind, each also trying to forge the
/// header the server sets across an account import.
const MALFORMED: [(&str, &[u8]); 5] = [
    (
        "bare LF",
        b"NATS/1.0\r\nX-A: 1\nNats-Request-Info: {\"acc\":\"EVIL\"}\r\n\r\n",
    ),
    (
        "folded line",
        b"NATS/1.0\r\nX-A: 1\r\n Nats-Request-Info: {\"acc\":\"EVIL\"}\r\n\r\n",
    ),
    ("no colon", b"NATS/1.0\r\nno colon here\r\n\r\n"),
    ("bad name", b"NATS/1.0\r\nBad Name: v\r\n\r\n"),
    ("non-UTF-8 value", b"NATS/1.0\r\nX-A: \xff\xfe\r\n\r\n"),
];

async fn serve(server: &NatsServer) -> ServiceHandle {
    let backend = async_nats::connect(server.url()).await.expect("connect");
    service::start((server.url(), backend), ServiceOptions::default())
        .await
        .expect("service starts")
}

async fn leases(server: &NatsServer) -> LeaseClient {
    let client = async_nats::connect(server.url()).await.expect("connect");
    LeaseClient::new(client).with_timeout(Duration::from_secs(5))
}

/// Renews `key` every 50 ms until `stop`: (ok, failed) counts and the failures.
fn renew_until(
    leases: LeaseClient,
    key: &'static str,
    holder: &'static str,
    mut revision: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, Vec<String>)> {
    tokio::spawn(async move {
        let mut ok = 0;
        let mut failed = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        while !stop.load(Ordering::SeqCst) {
            tick.tick().await;
            match leases.renew(key, holder, revision, None).await {
                Ok(lease) => {
                    revision = lease.revision;
                    ok += 1;
                }
                Err(e) => failed.push(e.to_string()),
            }
        }
        (ok, failed)
    })
}

fn json_of(payload: &[u8]) -> Value {
    serde_json::from_slice(payload)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(payload)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_headers_are_answered_invalid_while_renewals_all_succeed() {
    let server = NatsServer::start();
    let _service = serve(&server).await;
    let holder = leases(&server).await;
    let lease = holder
        .acquire("steady", "h1", Duration::from_secs(30))
        .await
        .expect("acquire");
    assert!(lease.granted);
    let victim = holder
        .acquire("victim", "h2", Duration::from_secs(30))
        .await
        .expect("acquire");
    let stop = Arc::new(AtomicBool::new(false));
    let renewing = renew_until(
        holder.clone(),
        "steady",
        "h1",
        lease.lease.revision,
        stop.clone(),
    );

    // About 300 requests a second for three seconds, every kind in turn: each a
    // renew of another holder's lease that would succeed if its call ran.
    let mut raw = RawClient::connect(&server.url())
        .await
        .expect("raw connect");
    let body =
        json!({"key": "victim", "holder": "h2", "revision": victim.lease.revision}).to_string();
    let mut sent = Vec::new();
    let mut pace = tokio::time::interval(Duration::from_micros(3_333));
    for i in 0..900 {
        pace.tick().await;
        let (name, block) = MALFORMED[i % MALFORMED.len()];
        let reply = raw
            .send_request("api.leases.renew", Some(block), body.as_bytes())
            .await
            .expect("send");
        sent.push((name, reply));
    }
    let answers = sent.len();
    let mut invalid = 0;
    for (name, reply) in sent {
        let msg = raw
            .reply_to(&reply)
            .await
            .unwrap_or_else(|e| panic!("{name}: no answer ({e}); the intake lost it"));
        let v = json_of(&msg.payload);
        assert_eq!(v["kind"], "invalid", "{name}: {v}");
        let error = v["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("the request is malformed: malformed header block"),
            "{name}: {error}"
        );
        invalid += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let (ok, failed) = renewing.await.unwrap();
    println!(
        "{invalid}/{answers} malformed requests answered invalid; renewals: {ok} ok, {} failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "renewals failed during the flood: {failed:?}"
    );
    assert!(ok > 0);
    // No call ran for them: the victim's lease is at its revision still.
    let now = holder.owner("victim").await.expect("owner").expect("held");
    assert_eq!(
        now.revision, victim.lease.revision,
        "a malformed request ran its call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_answering_a_forward_with_malformed_headers_costs_only_that_forward() {
    let server = NatsServer::start();
    let _service = serve(&server).await;
    let holder = leases(&server).await;
    let steady = holder
        .acquire("steady", "h1", Duration::from_secs(30))
        .await
        .expect("acquire");
    holder
        .acquire("fw", "own", Duration::from_secs(30))
        .await
        .expect("acquire");
    let stop = Arc::new(AtomicBool::new(false));
    let renewing = renew_until(
        holder.clone(),
        "steady",
        "h1",
        steady.lease.revision,
        stop.clone(),
    );

    // The owner: answers each forward with a malformed block but every sixth,
    // which it answers well.
    let mut owner = RawClient::connect(&server.url())
        .await
        .expect("raw connect");
    let sid = owner
        .subscribe("dagnats.lease.inbox.own.fw", None)
        .await
        .expect("sub");
    owner.flush().await.expect("flush");
    let answered = Arc::new(AtomicU64::new(0));
    let owner_task = {
        let answered = answered.clone();
        tokio::spawn(async move {
            for i in 0..12usize {
                let Ok(msg) = owner.next_on(sid).await else {
                    return;
                };
                let reply = msg.reply.expect("a forward has a reply");
                if i % 6 == 5 {
                    owner.publish(&reply, None, b"fine").await.expect("reply");
                } else {
                    let (_, block) = MALFORMED[i % MALFORMED.len()];
                    owner
                        .hpublish(&reply, None, block, b"forged")
                        .await
                        .expect("reply");
                }
                answered.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let caller = leases(&server).await;
    let mut failed_forwards = 0;
    for i in 0..12usize {
        let outcome = caller.forward("fw", b"hello", Duration::from_secs(3)).await;
        if i % 6 == 5 {
            let forwarded = outcome.unwrap_or_else(|e| panic!("forward {i}: {e}"));
            assert_eq!(forwarded.payload, b"fine");
        } else {
            let e = outcome.expect_err("a malformed reply is no answer");
            assert_eq!(
                e.kind(),
                LeaseErrorKind::ErrorReply(dagnats_leases_core::wire::ErrorKind::Unavailable),
                "forward {i}: {e}"
            );
            assert!(
                e.to_string().contains("malformed header block"),
                "forward {i}: {e}"
            );
            failed_forwards += 1;
        }
    }
    owner_task.await.unwrap();
    stop.store(true, Ordering::SeqCst);
    let (ok, failed) = renewing.await.unwrap();
    println!(
        "{failed_forwards} forwards answered with malformed headers failed alone; {} answered; renewals: {ok} ok, {} failed",
        answered.load(Ordering::SeqCst),
        failed.len()
    );
    assert!(failed.is_empty(), "renewals failed meanwhile: {failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_keeps_serving_strictly_after_the_server_restarts() {
    let mut server = NatsServer::start();
    let _service = serve(&server).await;
    let holder = leases(&server).await;
    let lease = holder
        .acquire("k", "h", Duration::from_secs(60))
        .await
        .expect("acquire");
    server.restart();
    // Until the service is back (its strict connection redials with backoff).
    let mut renewed = None;
    for _ in 0..100 {
        match holder.renew("k", "h", lease.lease.revision, None).await {
            Ok(l) => {
                renewed = Some(l);
                break;
            }
            Err(e)
                if e.kind()
                    == LeaseErrorKind::ErrorReply(
                        dagnats_leases_core::wire::ErrorKind::Invalid,
                    ) =>
            {
                panic!("{e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let renewed = renewed.expect("the service serves after the restart");
    assert!(renewed.revision > lease.lease.revision);
    // Its subscriptions are back on the strict connection: a malformed request
    // is answered invalid.
    let mut raw = RawClient::connect(&server.url())
        .await
        .expect("raw connect");
    let msg = raw
        .request("api.leases.owner", Some(MALFORMED[0].1), br#"{"key":"k"}"#)
        .await
        .expect("answered");
    assert_eq!(json_of(&msg.payload)["kind"], "invalid");
}
