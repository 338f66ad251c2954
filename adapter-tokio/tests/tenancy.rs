//! Tenancy through NATS accounts, on a real server configured with the example
//! deployment (`scripts/tenants.conf`: the service in account LEASES as a serving
//! and a backend user; tenant TA with users a1 and a2 whose import shares
//! identity; tenant TB with b1, whose import does not): `dagnats-leases serve
//! --tenancy accounts` as `scripts/serve --tenants` runs it.
//!
//! TA and TB each hold `job`; b1 sees TB's events and none of TA's; a2 cannot
//! renew, take or release a1's lease while a1 can; a request from the service's
//! own account is refused whatever `Nats-Request-Info` it forges; the holder
//! library (an election, a forward to its inbox) and the CLI work unchanged as
//! tenant clients.

use std::time::Duration;

use async_nats::{Client, HeaderMap};
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::client::{LeaseClient, change_event};
use dagnats_leases_tokio::member::{Member, Ownership};
use futures::StreamExt;
use serde_json::{Value, json};

#[path = "support/scrape.rs"]
mod scrape;

use scrape::Served;

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");
const WAIT: Duration = Duration::from_secs(10);

/// The server with the committed example accounts, and the service as
/// `scripts/serve --tenants` starts it.
async fn deployment() -> (NatsServer, Served) {
    deployment_with(&[]).await
}

/// [`deployment`] with more `serve` arguments.
async fn deployment_with(extra: &[&str]) -> (NatsServer, Served) {
    let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/tenants.conf");
    let text = std::fs::read_to_string(conf).expect("scripts/tenants.conf");
    deployment_of(text, extra).await
}

/// The service with `extra` arguments on a server with config `text`.
async fn deployment_of(text: String, extra: &[&str]) -> (NatsServer, Served) {
    let server = NatsServer::builder().config(text).start();
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
        "--tenant-account",
        "TA",
        "--tenant-account",
        "TB",
    ];
    args.extend_from_slice(extra);
    let served = Served::start(BIN, &server.url(), &args).await;
    (server, served)
}

/// Connects as `user`; a tenant's user with the reply-inbox prefix the example
/// lets it alone subscribe to, `_INBOX.<user>`.
async fn connect(server: &NatsServer, user: &str) -> Client {
    let mut options = async_nats::ConnectOptions::with_user_and_password(user.into(), user.into());
    if user != "leases" {
        options = options.custom_inbox_prefix(format!("_INBOX.{user}"));
    }
    options.connect(server.url()).await.unwrap()
}

async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("no {what} within {WAIT:?}"))
}

async fn call(client: &Client, endpoint: &str, body: Value) -> Value {
    let reply = within(
        "reply",
        client.request(format!("api.leases.{endpoint}"), body.to_string().into()),
    )
    .await
    .unwrap();
    serde_json::from_slice(&reply.payload).unwrap()
}

fn acquire(holder: &str) -> Value {
    json!({"key": "job", "holder": holder, "ttl_ms": 30000})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_hold_the_same_key_apart_and_see_only_their_own_events() {
    let (server, served) = deployment().await;
    let (a1, b1) = (connect(&server, "a1").await, connect(&server, "b1").await);
    let mut b1_events = b1.subscribe("dagnats.lease.changed.>").await.unwrap();
    let mut a1_events = a1.subscribe("dagnats.lease.changed.job").await.unwrap();
    // A subscription is in place once a request after it has come back.
    call(&b1, "owner", json!({"key": "probe"})).await;
    call(&a1, "owner", json!({"key": "probe"})).await;

    let ta = call(&a1, "acquire", acquire("ta-holder")).await;
    assert_eq!(ta["granted"], true, "{ta}");
    let a1_saw = change_event(&within("TA's event", a1_events.next()).await.unwrap());
    assert_eq!(a1_saw.kind.as_str(), "acquired");
    let tb = call(&b1, "acquire", acquire("tb-holder")).await;
    assert_eq!(tb["granted"], true, "TB's job is its own: {tb}");
    // b1's first event is its own acquire: TA's, written before, never reached it.
    let first = within("TB's event", b1_events.next()).await.unwrap();
    assert_eq!(first.subject.as_str(), "dagnats.lease.changed.job");
    assert_eq!(
        change_event(&first).revision,
        tb["revision"].as_u64().unwrap()
    );
    let owner_b = call(&b1, "owner", json!({"key": "job"})).await;
    assert_eq!(owner_b["holder"], "tb-holder");
    let owner_a = call(&a1, "owner", json!({"key": "job"})).await;
    assert_eq!(owner_a["holder"], "ta-holder");
    // TA's release: one more event for a1, none for b1.
    call(
        &a1,
        "release",
        json!({"key": "job", "holder": "ta-holder", "revision": ta["revision"]}),
    )
    .await;
    let released = change_event(&within("TA's release", a1_events.next()).await.unwrap());
    assert_eq!(released.kind.as_str(), "released");
    b1.flush().await.unwrap();
    call(&b1, "owner", json!({"key": "probe"})).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), b1_events.next())
            .await
            .is_err(),
        "b1 saw an event of TA's"
    );
    assert_eq!(served.stop().await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_of_the_account_cannot_renew_take_or_release_the_lease_and_its_user_can() {
    let (server, served) = deployment().await;
    let (a1, a2) = (connect(&server, "a1").await, connect(&server, "a2").await);
    let held = call(&a1, "acquire", acquire("shared-name")).await;
    assert_eq!(held["granted"], true, "{held}");
    let revision = held["revision"].clone();
    let fenced = json!({"key": "job", "holder": "shared-name", "revision": revision});
    for (endpoint, body) in [
        ("acquire", acquire("shared-name")),
        ("renew", fenced.clone()),
        ("release", fenced.clone()),
    ] {
        let refused = call(&a2, endpoint, body).await;
        assert_eq!(refused["kind"], "forbidden", "{endpoint}: {refused}");
        let text = refused["error"].as_str().unwrap();
        assert!(
            !text.contains("shared-name") && !text.contains(&revision.to_string()),
            "{endpoint} names the holder or the fence: {text}"
        );
    }
    let still = call(&a1, "owner", json!({"key": "job"})).await;
    assert_eq!(still["revision"], revision, "a2 changed the lease: {still}");
    let again = call(&a1, "acquire", acquire("shared-name")).await;
    assert_eq!(
        (&again["granted"], &again["revision"]),
        (&json!(true), &revision)
    );
    let renewed = call(&a1, "renew", fenced).await;
    assert_eq!(renewed["held"], true, "{renewed}");
    let released = call(
        &a1,
        "release",
        json!({"key": "job", "holder": "shared-name", "revision": renewed["revision"]}),
    )
    .await;
    assert_eq!(released["released"], true, "{released}");
    assert_eq!(served.stop().await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_from_the_services_own_account_is_refused_even_with_a_forged_request_info() {
    let (server, served) = deployment().await;
    let leases = connect(&server, "leases").await;
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Request-Info", r#"{"acc":"TA","user":"a1","rtt":1}"#);
    // It may publish to TA's endpoint subject itself: the reply (no `_R_.`) shows
    // that no import was crossed.
    let reply = within(
        "reply",
        leases.request_with_headers(
            "api.leases.TA.acquire",
            headers,
            acquire("forger").to_string().into(),
        ),
    )
    .await
    .unwrap();
    let refused: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(refused["kind"], "forbidden", "{refused}");
    let a1 = connect(&server, "a1").await;
    let owner = call(&a1, "owner", json!({"key": "job"})).await;
    assert_eq!(
        owner["held"], false,
        "the forged request took TA's key: {owner}"
    );
    assert_eq!(served.stop().await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_library_and_the_cli_work_unchanged_as_tenant_clients() {
    let (server, served) = deployment().await;
    let a1 = connect(&server, "a1").await;
    let member = Member::new(a1.clone(), "lib-holder").unwrap();
    let mut inbox = member.inbox().await.unwrap();
    let mut elector = member.elect("leader", Duration::from_secs(6)).unwrap();
    let fence = match within("election", elector.next()).await {
        Some(change) => match change.ownership {
            Ownership::Elected { fence } => fence,
            other => panic!("{other:?}"),
        },
        None => panic!("the elector ended"),
    };
    // A forward from another user of TA reaches the holder's inbox through the
    // service account's import of TA's inboxes, and its answer comes back.
    let a2 = connect(&server, "a2").await;
    let forward = tokio::spawn(async move {
        LeaseClient::new(a2)
            .forward("leader", b"ping", Duration::from_secs(5))
            .await
    });
    let request = within("a forwarded request", inbox.next()).await.unwrap();
    assert_eq!(
        (request.key.as_str(), &request.payload[..]),
        ("leader", &b"ping"[..])
    );
    assert!(request.fence >= fence);
    request.respond("pong").await.unwrap();
    let reply = within("the forward's reply", forward)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&reply.payload[..], b"pong");
    // The CLI as b1: TB has no `leader`.
    let out = std::process::Command::new(BIN)
        .args(["owner", "leader", "--nats-url", &server.url()])
        .args([
            "--user",
            "b1",
            "--password",
            "b1",
            "--inbox-prefix",
            "_INBOX.b1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    within("the release", elector.stop()).await;
    let owner = call(&a1, "owner", json!({"key": "leader"})).await;
    assert_eq!(owner["held"], false, "{owner}");
    assert_eq!(served.stop().await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_cap_a_tenant_is_refused_new_keys_while_another_tenant_is_served() {
    let (server, served) = deployment_with(&["--max-leases-per-tenant", "2"]).await;
    let (a1, b1) = (connect(&server, "a1").await, connect(&server, "b1").await);
    let mut held = Vec::new();
    for key in ["k1", "k2"] {
        let r = call(
            &a1,
            "acquire",
            json!({"key": key, "holder": "h", "ttl_ms": 30000}),
        )
        .await;
        assert_eq!(r["granted"], true, "{r}");
        held.push(r);
    }
    let refused = call(
        &a1,
        "acquire",
        json!({"key": "k3", "holder": "h", "ttl_ms": 30000}),
    )
    .await;
    assert_eq!(refused["kind"], "forbidden", "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("cap of 2"),
        "{refused}"
    );
    // A key it holds is still answered; TB is served.
    let again = call(
        &a1,
        "acquire",
        json!({"key": "k1", "holder": "h", "ttl_ms": 30000}),
    )
    .await;
    assert_eq!(again["granted"], true, "{again}");
    for key in ["k1", "k2"] {
        let r = call(
            &b1,
            "acquire",
            json!({"key": key, "holder": "h", "ttl_ms": 30000}),
        )
        .await;
        assert_eq!(r["granted"], true, "TB is served: {key} {r}");
    }
    let r = call(
        &b1,
        "acquire",
        json!({"key": "k3", "holder": "h", "ttl_ms": 30000}),
    )
    .await;
    assert_eq!(r["kind"], "forbidden", "TB has a cap of its own: {r}");
    // A release frees a place.
    let r = call(
        &a1,
        "release",
        json!({"key": "k2", "holder": "h", "revision": held[1]["revision"]}),
    )
    .await;
    assert_eq!(r["released"], true, "{r}");
    let k3 = call(
        &a1,
        "acquire",
        json!({"key": "k3", "holder": "h", "ttl_ms": 30000}),
    )
    .await;
    assert_eq!(k3["granted"], true, "{k3}");
    assert_eq!(served.stop().await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_flood_does_not_starve_another_tenants_renewals() {
    let (server, served) =
        deployment_with(&["--max-calls-in-flight", "2", "--max-calls-waiting", "8"]).await;
    let (a1, b1) = (connect(&server, "a1").await, connect(&server, "b1").await);
    let lease = call(
        &b1,
        "acquire",
        json!({"key": "keep", "holder": "b", "ttl_ms": 30000}),
    )
    .await;
    assert_eq!(lease["granted"], true, "{lease}");
    let mut revision = lease["revision"].clone();
    // TA floods: renewals published without waiting, far past the room.
    let inbox = a1.new_inbox();
    let mut flood_replies = a1.subscribe(format!("{inbox}.*")).await.unwrap();
    let flood = 2000;
    let flooding = {
        let a1 = a1.clone();
        tokio::spawn(async move {
            for i in 0..flood {
                // Renewals of a lease TA does not hold: they wait in the whole
                // room, not only the half kept from reads and acquires.
                let body = json!({"key": format!("f{}", i % 50), "holder": "x", "revision": 1})
                    .to_string();
                a1.publish_with_reply("api.leases.renew", format!("{inbox}.{i}"), body.into())
                    .await
                    .unwrap();
            }
            a1.flush().await.unwrap();
        })
    };
    // TB renews all along: never refused.
    for _ in 0..20 {
        let r = call(
            &b1,
            "renew",
            json!({"key": "keep", "holder": "b", "revision": revision}),
        )
        .await;
        assert_eq!(r["held"], true, "TB's renewal during TA's flood: {r}");
        revision = r["revision"].clone();
    }
    within("the flood sent", flooding).await.unwrap();
    // The flood itself was answered (a part of it `unavailable`), none dropped.
    let mut answered = 0;
    let mut unavailable = 0;
    while answered < flood {
        let m = within("a flood reply", flood_replies.next()).await.unwrap();
        let v: Value = serde_json::from_slice(&m.payload).unwrap();
        if v["kind"] == "unavailable" {
            unavailable += 1;
        }
        answered += 1;
    }
    println!(
        "tenancy: TA's flood of {flood} renewals: {unavailable} answered unavailable; TB's 20 renewals all held"
    );
    assert_eq!(served.stop().await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_forwards_to_a_silent_owner_do_not_hold_every_slot() {
    let (server, served) = deployment_with(&["--max-calls-in-flight", "4"]).await;
    let (a1, b1) = (connect(&server, "a1").await, connect(&server, "b1").await);
    // TA's owner takes forwards and never answers them.
    let mut silent = a1.subscribe("dagnats.lease.inbox.silent.>").await.unwrap();
    call(&a1, "owner", json!({"key": "probe"})).await;
    let held = call(
        &a1,
        "acquire",
        json!({"key": "slow", "holder": "silent", "ttl_ms": 30000}),
    )
    .await;
    assert_eq!(held["granted"], true, "{held}");
    let kept = call(
        &b1,
        "acquire",
        json!({"key": "keep", "holder": "b", "ttl_ms": 30000}),
    )
    .await;
    assert_eq!(kept["granted"], true, "{kept}");
    // Four forwards of TA, each waiting 10 s for the silent owner: with four
    // slots, TA runs two (its share), the others wait.
    let a2 = connect(&server, "a2").await;
    let forwards: Vec<_> = (0..4)
        .map(|_| {
            let a2 = a2.clone();
            tokio::spawn(async move {
                let body = json!({"key": "slow", "payload": "", "timeout_ms": 10000});
                a2.request("api.leases.forward", body.to_string().into())
                    .await
            })
        })
        .collect();
    for _ in 0..2 {
        within("a forward at the silent owner", silent.next())
            .await
            .unwrap();
    }
    // TB's renewal is answered while TA's forwards still wait on their owner.
    let renewed = call(
        &b1,
        "renew",
        json!({"key": "keep", "holder": "b", "revision": kept["revision"]}),
    )
    .await;
    assert_eq!(renewed["held"], true, "{renewed}");
    assert!(
        forwards.iter().all(|f| !f.is_finished()),
        "TB's renewal waited for TA's forwards to end"
    );
    drop(forwards);
    assert_eq!(served.stop().await, Some(0));
}

/// Tenancy on a bucket of three shards (`--shards 3`): the storage key
/// `<account>.<key>` picks the shard, so TA's and TB's `job` may live in different
/// streams; each tenant holds its keys apart and sees only its own events, from
/// every shard. The example's backend user is given every shard's subjects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_on_three_shards_hold_their_keys_apart() {
    let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/tenants.conf");
    let text = std::fs::read_to_string(conf).expect("scripts/tenants.conf");
    let start = text
        .find("publish: {allow: [\"$JS.API.INFO\"")
        .expect("the writer's list");
    let end = start + text[start..].find("]},").expect("its end");
    let text = format!(
        "{}publish: {{allow: [\"$JS.API.>\", \"$KV.>\", \"dagnats.lease.inbox.>\"{}",
        &text[..start],
        &text[end..]
    );
    let (server, _served) = deployment_of(text, &["--shards", "3"]).await;
    let shards = dagnats_leases_core::shard::ShardMap::new(3).unwrap();
    let keys: Vec<String> = (0..6).map(|n| format!("t{n}")).collect();
    let spread: std::collections::BTreeSet<u32> = ["TA", "TB"]
        .iter()
        .flat_map(|acc| {
            keys.iter()
                .map(move |k| shards.shard_of(&format!("{acc}.{k}")))
        })
        .collect();
    assert_eq!(spread.len(), 3, "the tenants' keys cover every shard");
    let (a1, b1) = (connect(&server, "a1").await, connect(&server, "b1").await);
    let mut a1_events = a1.subscribe("dagnats.lease.changed.>").await.unwrap();
    let mut b1_events = b1.subscribe("dagnats.lease.changed.>").await.unwrap();
    call(&b1, "owner", json!({"key": "probe"})).await;
    call(&a1, "owner", json!({"key": "probe"})).await;
    for key in &keys {
        for (client, events, holder) in [(&a1, &mut a1_events, "ta"), (&b1, &mut b1_events, "tb")] {
            let got = call(
                client,
                "acquire",
                json!({"key": key, "holder": holder, "ttl_ms": 30000}),
            )
            .await;
            assert_eq!(got["granted"], true, "{holder} {key}: {got}");
            // The next event this tenant sees is its own write, on its own subject.
            let ev = within("the tenant's event", events.next()).await.unwrap();
            assert_eq!(ev.subject.as_str(), format!("dagnats.lease.changed.{key}"));
            assert_eq!(
                change_event(&ev).revision,
                got["revision"].as_u64().unwrap(),
                "{holder} saw another tenant's write"
            );
        }
    }
    for key in &keys {
        assert_eq!(
            call(&a1, "owner", json!({"key": key})).await["holder"],
            "ta"
        );
        assert_eq!(
            call(&b1, "owner", json!({"key": key})).await["holder"],
            "tb"
        );
    }
}

/// Tenancy serves only accounts the deployment names: without one `serve` refuses
/// to start, naming the option; a name that is no subject token, or the option
/// without tenancy, is refused too; a bad `--inbox-prefix` is refused by name.
#[test]
fn tenancy_needs_its_tenant_accounts_named_and_an_inbox_prefix_must_be_literal() {
    let server = NatsServer::start();
    let url = server.url();
    for (args, says) in [
        (&["--tenancy", "accounts"][..], "--tenant-account"),
        (
            &["--tenancy", "accounts", "--tenant-account", "T.A"][..],
            "--tenant-account",
        ),
        (&["--tenant-account", "TA"][..], "--tenancy accounts"),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["serve", "--nats-url", &url])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let out = std::process::Command::new(BIN)
        .args([
            "owner",
            "k",
            "--nats-url",
            &url,
            "--inbox-prefix",
            "_INBOX.*",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--inbox-prefix"), "{stderr}");
}
