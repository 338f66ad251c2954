//! The multi-tenant example, `scripts/tenants.conf` (what `scripts/serve --tenants`
//! runs and the docs show), on the real servers 2.15.1 and 2.11.11, without the lease
//! service: the NATS facts the service's tenancy mode builds on (issue 28).
//!
//! - A tenant's request reaches the serving user in LEASES with a `_R_.` reply and the
//!   server's own `Nats-Request-Info` (its account; with `share: true` its user) as the
//!   header's last value, whatever the tenant wrote; a same-account request keeps the
//!   header its sender wrote.
//! - Each tenant receives its own keys' change events only, under the single-tenant
//!   names `dagnats.lease.changed.<key>`.
//! - The serving user cannot write the bucket, purge it or answer into the writer's
//!   inboxes; the writer (the service's backend user) cannot delete the stream; a
//!   tenant's reply aimed at the bucket stays a reply. The writer may scan the
//!   bucket for tombstones left behind and purge them (the tombstone sweep).
//! - Forward: the service reaches a holder in its tenant at
//!   `dagnats.lease.inbox.<account>.<holder>.<key>`, and no other tenant's holder.

use std::path::Path;
use std::time::Duration;

use async_nats::{Client, Event, HeaderMap, Message, Subscriber};
use dagnats_leases_tests::{Binary, NatsServer};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The config under test, as committed.
const CONF: &str = include_str!("../../scripts/tenants.conf");
/// The header the server sets on a request that crosses a service import.
const REQUEST_INFO: &str = "Nats-Request-Info";
/// The writer's inbox prefix, the one `scripts/tenants.conf` lets it subscribe to.
const WRITER_INBOX: &str = "_dagnats_backend";
const WAIT: Duration = Duration::from_secs(10);

/// One server per release the example must work on: the supported one and the oldest.
fn servers() -> Vec<NatsServer> {
    let oldest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.nats/bin-2.11/nats-server");
    [Binary::Supported, Binary::Path(oldest)]
        .into_iter()
        .map(|binary| NatsServer::builder().binary(binary).config(CONF).start())
        .collect()
}

/// Connects as `user` (in the example each password is the user's name); server errors
/// such as permission violations go to the returned channel.
async fn connect(server: &NatsServer, user: &str) -> (Client, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut options = async_nats::ConnectOptions::new()
        .user_and_password(user.into(), user.into())
        .request_timeout(Some(WAIT))
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let Event::ServerError(e) = event {
                    let _ = tx.send(e.to_string());
                }
            }
        });
    match user {
        "writer" => options = options.custom_inbox_prefix(WRITER_INBOX),
        "a1" | "a2" | "b1" => options = options.custom_inbox_prefix(format!("_INBOX.{user}")),
        _ => {}
    }
    let client = options
        .connect(server.url())
        .await
        .unwrap_or_else(|e| panic!("{user} connects to v{}: {e}", server.version()));
    (client, rx)
}

/// Returns once the server has processed everything `client` sent before, its
/// subscriptions included (`flush` only writes the socket): a request nobody answers
/// comes back as "no responders" after the server has read it.
async fn round_trip(client: &Client) {
    let err = client
        .request("_INBOX.round-trip", "".into())
        .await
        .expect_err("nobody answers the round trip");
    assert_eq!(err.kind(), async_nats::RequestErrorKind::NoResponders);
}

async fn next(sub: &mut Subscriber) -> Message {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a message in time")
        .expect("subscription open")
}

async fn next_error(errors: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(WAIT, errors.recv())
        .await
        .expect("a server error in time")
        .expect("connection open")
}

/// The bucket's stream in the tenant layout: a tenant's key is `$KV.leases.<account>.<key>`,
/// republished on `dagnats.lease.changed.<account>.<key>`.
async fn create_bucket(writer: &Client) {
    let config = json!({
        "name": "KV_leases", "subjects": ["$KV.leases.>"], "max_msgs_per_subject": 1,
        "discard": "new", "allow_rollup_hdrs": true, "deny_delete": true,
        "allow_msg_ttl": true, "subject_delete_marker_ttl": 1_000_000_000u64,
        "storage": "file", "num_replicas": 1,
        "republish": {"src": "$KV.leases.*.*",
                      "dest": "dagnats.lease.changed.{{wildcard(1)}}.{{wildcard(2)}}"}
    });
    let reply = api(writer, "$JS.API.STREAM.CREATE.KV_leases", config).await;
    assert!(reply.get("error").is_none(), "stream create: {reply}");
}

async fn api(client: &Client, subject: &str, body: Value) -> Value {
    let reply = client
        .request(subject.to_owned(), body.to_string().into())
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    serde_json::from_slice(&reply.payload).expect("JSON")
}

/// A write to the bucket as the service makes it; returns the revision.
async fn write(writer: &Client, subject: &str) -> u64 {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-TTL", "30s");
    let reply = writer
        .request_with_headers(subject.to_owned(), headers, r#"{"holder":"h"}"#.into())
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    let ack: Value = serde_json::from_slice(&reply.payload).expect("JSON");
    ack["seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("{subject}: {ack}"))
}

async fn last_revision(writer: &Client, subject: &str) -> u64 {
    let reply = api(
        writer,
        "$JS.API.STREAM.MSG.GET.KV_leases",
        json!({ "last_by_subj": subject }),
    )
    .await;
    reply["message"]["seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("{subject}: {reply}"))
}

fn request_info(msg: &Message) -> Vec<String> {
    msg.headers
        .as_ref()
        .map(|h| h.get_all(REQUEST_INFO).map(|v| v.to_string()).collect())
        .unwrap_or_default()
}

/// Whether this server keeps all but the first of duplicated `Nats-Request-Info`
/// headers a client sent (it then appends its own last). nats-server removes them all
/// from 2.11.15, 2.12.6 and 2.14.0 on ("Improved handling of duplicate headers").
fn keeps_duplicated_headers(version: &str) -> bool {
    let parts: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
    match parts[..] {
        [2, 11, patch] => patch < 15,
        [2, 12, patch] => patch < 6,
        [2, minor, _] => minor < 11,
        _ => false,
    }
}

#[tokio::test]
async fn a_tenants_request_carries_the_servers_identity_and_a_local_one_its_own_header() {
    for server in servers() {
        let v = server.version().to_owned();
        let (serve, _) = connect(&server, "serve").await;
        let mut requests = serve
            .queue_subscribe("api.leases.*.*", "dagnats-leases".into())
            .await
            .unwrap();
        round_trip(&serve).await;
        let forged = r#"{"acc":"TA","user":"a1"}"#;
        for (user, account, shared) in [("a1", "TA", true), ("a2", "TA", true), ("b1", "TB", false)]
        {
            let (client, _) = connect(&server, user).await;
            let mut headers = HeaderMap::new();
            headers.append(REQUEST_INFO, forged);
            headers.append(REQUEST_INFO, forged);
            let call = tokio::spawn(async move {
                client
                    .request_with_headers("api.leases.owner", headers, "{}".into())
                    .await
            });
            let msg = next(&mut requests).await;
            // The server names the importing account in the subject's token 3.
            assert_eq!(
                msg.subject.as_str(),
                format!("api.leases.{account}.owner"),
                "v{v} {user}"
            );
            let reply = msg.reply.clone().expect("a reply subject");
            assert!(reply.starts_with("_R_."), "v{v} {user}: reply {reply}");
            let infos = request_info(&msg);
            let last: Value = serde_json::from_str(infos.last().expect("a header")).unwrap();
            assert_eq!(last["acc"], account, "v{v} {user}: {infos:?}");
            let want_user = if shared { json!(user) } else { Value::Null };
            assert_eq!(last["user"], want_user, "v{v} {user}: {infos:?}");
            // Forged copies survive only on servers without the duplicate-header fix,
            // and then before the server's own value.
            if keeps_duplicated_headers(&v) {
                assert_eq!(infos.len(), 2, "v{v} {user}: {infos:?}");
                assert_eq!(infos[0], forged, "v{v} {user}: {infos:?}");
            } else {
                assert_eq!(infos.len(), 1, "v{v} {user}: {infos:?}");
            }
            serve.publish(reply, "ok".into()).await.unwrap();
            let answered = call.await.unwrap().expect("the reply reaches the tenant");
            assert_eq!(&answered.payload[..], b"ok");
        }
        // Inside LEASES no import is crossed: a user there may publish to a tenant's
        // subject, and the header arrives as its sender wrote it; only the reply
        // (no `_R_.`) tells it from TA's.
        let (local, _) = connect(&server, "leases").await;
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_INFO, forged);
        let call = tokio::spawn(async move {
            local
                .request_with_headers("api.leases.TA.owner", headers, "{}".into())
                .await
        });
        let msg = next(&mut requests).await;
        let reply = msg.reply.clone().expect("a reply subject");
        assert!(reply.starts_with("_INBOX."), "v{v}: reply {reply}");
        assert_eq!(request_info(&msg), [forged], "v{v}");
        serve.publish(reply, "ok".into()).await.unwrap();
        call.await
            .unwrap()
            .expect("the reply reaches the local user");
    }
}

#[tokio::test]
async fn each_tenant_receives_its_own_keys_events_under_single_tenant_names() {
    for server in servers() {
        let v = server.version().to_owned();
        let (writer, _) = connect(&server, "writer").await;
        create_bucket(&writer).await;
        let (a1, _) = connect(&server, "a1").await;
        let (b1, _) = connect(&server, "b1").await;
        let mut ta_events = a1.subscribe("dagnats.lease.changed.>").await.unwrap();
        let mut tb_events = b1.subscribe("dagnats.lease.changed.>").await.unwrap();
        round_trip(&a1).await;
        round_trip(&b1).await;

        // Events of one stream arrive in stream order: the first event each tenant sees
        // after a write of its own shows that nothing written before it reached it.
        write(&writer, "$KV.leases.TA.job").await;
        write(&writer, "$KV.leases.TA.job.read").await;
        write(&writer, "$KV.leases.TB.job").await;
        write(&writer, "$KV.leases.TA.other").await;

        let event = next(&mut ta_events).await;
        assert_eq!(event.subject.as_str(), "dagnats.lease.changed.job", "v{v}");
        let event = next(&mut ta_events).await;
        assert_eq!(
            event.subject.as_str(),
            "dagnats.lease.changed.other",
            "v{v}: TA got a read confirmation or TB's key"
        );
        let event = next(&mut tb_events).await;
        assert_eq!(event.subject.as_str(), "dagnats.lease.changed.job", "v{v}");
        let headers = event.headers.expect("republish headers");
        assert_eq!(
            headers.get("Nats-Subject").map(|h| h.as_str()),
            Some("$KV.leases.TB.job"),
            "v{v}: TB's first event is its own key"
        );
    }
}

#[tokio::test]
async fn the_serving_user_cannot_write_the_bucket_and_a_steered_reply_stays_a_reply() {
    for server in servers() {
        let v = server.version().to_owned();
        let (writer, mut writer_errors) = connect(&server, "writer").await;
        create_bucket(&writer).await;
        let revision = write(&writer, "$KV.leases.TA.job").await;
        let (serve, mut serve_errors) = connect(&server, "serve").await;
        for subject in [
            "$KV.leases.TA.job",
            "$JS.API.STREAM.PURGE.KV_leases",
            "_dagnats_backend.forged.ack",
        ] {
            serve.publish(subject, "{}".into()).await.unwrap();
            let error = next_error(&mut serve_errors).await;
            assert!(
                error.contains("Permissions Violation") && error.contains(subject),
                "v{v}: {subject}: {error}"
            );
        }
        writer
            .publish("$JS.API.STREAM.DELETE.KV_leases", "{}".into())
            .await
            .unwrap();
        let error = next_error(&mut writer_errors).await;
        assert!(error.contains("Permissions Violation"), "v{v}: {error}");

        // A tenant points its request's reply at the bucket: the server hands the
        // service a `_R_.` reply instead, and the answer never reaches the bucket.
        let mut requests = serve.subscribe("api.leases.*.*").await.unwrap();
        round_trip(&serve).await;
        let (a1, _) = connect(&server, "a1").await;
        a1.publish_with_reply("api.leases.owner", "$KV.leases.TA.job", "{}".into())
            .await
            .unwrap();
        let msg = next(&mut requests).await;
        let reply = msg.reply.expect("a reply subject");
        assert!(reply.starts_with("_R_."), "v{v}: reply {reply}");
        serve.publish(reply, "{}".into()).await.unwrap();
        round_trip(&serve).await;
        assert_eq!(
            last_revision(&writer, "$KV.leases.TA.job").await,
            revision,
            "v{v}"
        );
        let state = api(&writer, "$JS.API.STREAM.INFO.KV_leases", json!({})).await;
        assert_eq!(state["state"]["messages"], 1, "v{v}: {state}");
    }
}

#[tokio::test]
async fn forward_reaches_the_holder_in_its_own_tenant_only() {
    for server in servers() {
        let v = server.version().to_owned();
        let (a1, _) = connect(&server, "a1").await;
        let mut inbox = a1.subscribe("dagnats.lease.inbox.h1.>").await.unwrap();
        round_trip(&a1).await;
        // The backend user forwards (`serve --backend-user writer`).
        let (serve, _) = connect(&server, "writer").await;
        let mut headers = HeaderMap::new();
        headers.insert("Dagnats-Lease-Fence", "7");
        let forward = {
            let serve = serve.clone();
            tokio::spawn(async move {
                serve
                    .request_with_headers("dagnats.lease.inbox.TA.h1.job", headers, "ping".into())
                    .await
            })
        };
        let msg = next(&mut inbox).await;
        assert_eq!(msg.subject.as_str(), "dagnats.lease.inbox.h1.job", "v{v}");
        let headers = msg.headers.clone().expect("headers");
        assert_eq!(
            headers.get("Dagnats-Lease-Fence").map(|h| h.as_str()),
            Some("7")
        );
        a1.publish(msg.reply.expect("a reply subject"), "pong".into())
            .await
            .unwrap();
        let answer = forward.await.unwrap().expect("the holder's reply");
        assert_eq!(&answer.payload[..], b"pong", "v{v}");

        // TB has no holder h1, and TA's is not TB's; nor can b1 reach TA's inboxes.
        let (b1, _) = connect(&server, "b1").await;
        for (client, subject) in [
            (&serve, "dagnats.lease.inbox.TB.h1.job"),
            (&b1, "dagnats.lease.inbox.h1.job"),
        ] {
            let err = client
                .request(subject, "ping".into())
                .await
                .expect_err("no responder");
            assert_eq!(
                err.kind(),
                async_nats::RequestErrorKind::NoResponders,
                "v{v}: {subject}"
            );
        }
    }
}

/// The tombstone sweep's own requests as the writer: the scan's reads
/// (`MSG.GET` with `next_by_subj`) find a tenant's tombstone left behind, and its
/// purge below its sequence + 1 removes it, leaving the live lease beside it.
#[tokio::test]
async fn the_writer_may_scan_the_bucket_for_tombstones_and_purge_them() {
    use dagnats_leases_core::{service::sweep, shard::ShardMap};
    for server in servers() {
        let v = server.version().to_owned();
        let (writer, _) = connect(&server, "writer").await;
        create_bucket(&writer).await;
        let live = write(&writer, "$KV.leases.TA.live").await;
        let mut headers = HeaderMap::new();
        headers.insert("KV-Operation", "DEL");
        let reply = writer
            .request_with_headers("$KV.leases.TA.gone", headers, "".into())
            .await
            .expect("a tombstone");
        let gone = serde_json::from_slice::<Value>(&reply.payload).unwrap()["seq"]
            .as_u64()
            .expect("its sequence");
        let read = |seq: u64| {
            let r = sweep::scan_request(0, seq, WAIT, &ShardMap::SINGLE);
            let body = serde_json::from_slice::<Value>(&r.payload).unwrap();
            let writer = writer.clone();
            async move { api(&writer, &r.subject, body).await }
        };
        let first = read(1).await;
        assert_eq!(first["message"]["seq"], live, "v{v}: {first}");
        let second = read(live + 1).await;
        assert_eq!(second["message"]["seq"], gone, "v{v}: {second}");
        assert_eq!(second["message"]["subject"], "$KV.leases.TA.gone", "v{v}");
        let end = read(gone + 1).await;
        assert_eq!(end["error"]["err_code"], 10037, "v{v}: {end}");
        let purge = sweep::purge_request("TA.gone", gone, WAIT);
        let body = serde_json::from_slice::<Value>(&purge.payload).unwrap();
        let purged = api(&writer, &purge.subject, body).await;
        assert_eq!(purged["purged"], 1, "v{v}: {purged}");
        let state = api(&writer, "$JS.API.STREAM.INFO.KV_leases", json!({})).await;
        assert_eq!(state["state"]["messages"], 1, "v{v}: the live lease stays");
        assert_eq!(last_revision(&writer, "$KV.leases.TA.live").await, live);
    }
}

/// The config the docs show is the one `scripts/serve --tenants` runs.
#[test]
fn docs_security_shows_the_committed_config() {
    let docs = include_str!("../../docs/security.md");
    let accounts = &CONF[CONF.find("accounts {").expect("an accounts block")..];
    assert!(
        docs.contains(accounts),
        "docs/security.md's example differs from scripts/tenants.conf"
    );
}
