//! Attacks on the service as it ships, with every byte written raw
//! (tests/src/raw.rs) against real nats-servers: the breaks found, each as the
//! smallest byte-exact reproduction (failing while the break stands), and the
//! strongest probes that held, kept as regression tests.
//!
//! Found: nats-server relays a subject or reply subject that is not UTF-8 (it
//! checks neither in a client's `PUB`), and the service's strict reader takes
//! such a `MSG`/`HMSG` line for the server's framing gone wrong
//! (`ProtocolError`, "a subject is not UTF-8"): the serving connection drops,
//! with every request delivered on it after that message, and reconnects.
//! Any caller does it with one 30-byte `PUB`: a tenant user in the example
//! deployment (`api.leases.\xff`, which the import maps to
//! `api.leases.TA.\xff`), any caller in one account (the reply
//! `_INBOX.\xff`). Sent in a loop it keeps every other holder's renewals
//! unanswered (measured by hand: 95 of 100 renewals answered 503 while a
//! second connection sent 20 such `PUB`s).

use std::path::Path;
use std::time::Duration;

use dagnats_leases_core::tenant::{Tenancy, TenantAccounts};
use dagnats_leases_tests::raw::{RawClient, RawMsg};
use dagnats_leases_tests::{Binary, NatsServer};
use dagnats_leases_tokio::service::{self, Clients, ServiceHandle, ServiceOptions};
use dagnats_leases_tokio::strict::StrictOptions;
use serde_json::{Value, json};

/// The example multi-tenant deployment's accounts and users.
const CONF: &str = include_str!("../../scripts/tenants.conf");

/// The supported server and the oldest supported one, with the example config.
fn tenant_servers() -> Vec<NatsServer> {
    let oldest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.nats/bin-2.11/nats-server");
    [Binary::Supported, Binary::Path(oldest)]
        .into_iter()
        .map(|binary| NatsServer::builder().binary(binary).config(CONF).start())
        .collect()
}

/// The service as the example deployment runs it (`serve --tenancy accounts
/// --tenant-account TA --tenant-account TB --user serve --backend-user writer`).
async fn serve_tenants(server: &NatsServer, cap: Option<usize>) -> ServiceHandle {
    let backend =
        async_nats::ConnectOptions::with_user_and_password("writer".into(), "writer".into())
            .custom_inbox_prefix("_dagnats_backend")
            .connect(server.url())
            .await
            .expect("backend connects");
    let mut serving = StrictOptions::new(server.url());
    serving.user = Some("serve".into());
    serving.password = Some("serve".into());
    let options = ServiceOptions {
        tenancy: Tenancy::Accounts,
        tenant_accounts: TenantAccounts::new(["TA", "TB"]).expect("names"),
        max_leases_per_tenant: cap,
        ..ServiceOptions::default()
    };
    service::start(Clients::new(serving, backend), options)
        .await
        .expect("service starts")
}

/// The service in one account on a server without authorization.
async fn serve_one_account(server: &NatsServer) -> ServiceHandle {
    let backend = async_nats::connect(server.url()).await.expect("connect");
    service::start((server.url(), backend), ServiceOptions::default())
        .await
        .expect("service starts")
}

/// A user of the example (each password is the user's name) with its own inbox.
async fn user(server: &NatsServer, name: &str) -> RawClient {
    let mut client = RawClient::connect_as(&server.url(), name, name)
        .await
        .unwrap_or_else(|e| panic!("{name} connects: {e}"));
    client.set_inbox_prefix(&format!("_INBOX.{name}."));
    client.set_timeout(Duration::from_secs(5));
    client
}

fn answer(what: &str, reply: &RawMsg) -> Value {
    reply.json().unwrap_or_else(|| {
        panic!(
            "{what}: not JSON (status {:?}): {:?}",
            reply.status(),
            String::from_utf8_lossy(&reply.payload)
        )
    })
}

async fn call(
    client: &mut RawClient,
    endpoint: &str,
    headers: Option<&[u8]>,
    body: Value,
) -> Value {
    let what = format!("{endpoint} {body}");
    let reply = client
        .request(
            &format!("api.leases.{endpoint}"),
            headers,
            body.to_string().as_bytes(),
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    answer(&what, &reply)
}

fn acquire(key: &str, holder: &str) -> Value {
    json!({"key": key, "holder": holder, "ttl_ms": 30000})
}

/// Sends `bad` (a whole protocol line and payload, as written), then on the
/// same connection an `owner` request: the server delivers both to the service
/// in that order, so the request is answered only if `bad` cost nothing but
/// itself. Returns the answer, or the error of waiting for it.
async fn owner_after(client: &mut RawClient, bad: &[u8]) -> Result<Value, String> {
    client.write(bad).await.map_err(|e| e.to_string())?;
    let reply = client
        .request("api.leases.owner", None, br#"{"key":"steady"}"#)
        .await
        .map_err(|e| format!("no answer to the request sent after it: {e}"))?;
    if reply.status() == Some(503) {
        return Err(
            "the request sent after it found no responders: the service's \
                    subscription was gone (its connection dropped)"
                .into(),
        );
    }
    Ok(answer("owner", &reply))
}

// ---------------------------------------------------------------------------
// Breaks: these fail while the break stands.
// ---------------------------------------------------------------------------

/// BREAK: a tenant user's `PUB api.leases.\xff` (30 bytes) drops the serving
/// connection, and the request delivered after it is never answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_subject_that_is_not_utf8_costs_only_its_own_request() {
    for server in tenant_servers() {
        let v = server.version().to_owned();
        let service = serve_tenants(&server, None).await;
        let mut a1 = user(&server, "a1").await;
        let held = call(&mut a1, "acquire", None, acquire("steady", "h1")).await;
        assert_eq!(held["granted"], true, "v{v}: {held}");
        let mut a2 = user(&server, "a2").await;
        let got = owner_after(&mut a2, b"PUB api.leases.\xff _INBOX.a2.x 2\r\n{}\r\n").await;
        let got = got.unwrap_or_else(|e| panic!("v{v}: after PUB api.leases.\\xff: {e}"));
        assert_eq!(got["holder"], "h1", "v{v}: {got}");
        service.shutdown().await;
    }
}

/// BREAK: in one account, a request whose reply subject is not UTF-8
/// (`_INBOX.\xff`) drops the serving connection the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_subject_that_is_not_utf8_costs_only_its_own_request() {
    let server = NatsServer::start();
    let service = serve_one_account(&server).await;
    let mut holder = RawClient::connect(&server.url()).await.expect("connect");
    holder.set_timeout(Duration::from_secs(5));
    let held = call(&mut holder, "acquire", None, acquire("steady", "h1")).await;
    assert_eq!(held["granted"], true, "{held}");
    let got = owner_after(
        &mut holder,
        b"PUB api.leases.owner _INBOX.\xff 16\r\n{\"key\":\"steady\"}\r\n",
    )
    .await;
    let got = got.unwrap_or_else(|e| panic!("after a reply _INBOX.\\xff: {e}"));
    assert_eq!(got["holder"], "h1", "{got}");
    service.shutdown().await;
}

/// HELD: in one account the service subscribes to each endpoint's subject, so
/// a subject that is not UTF-8 under `api.leases.` never reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_a_subject_that_is_not_utf8_in_one_account_costs_nothing() {
    let server = NatsServer::start();
    let service = serve_one_account(&server).await;
    let mut holder = RawClient::connect(&server.url()).await.expect("connect");
    holder.set_timeout(Duration::from_secs(5));
    let held = call(&mut holder, "acquire", None, acquire("steady", "h1")).await;
    assert_eq!(held["granted"], true, "{held}");
    let got = owner_after(&mut holder, b"PUB api.leases.\xc3 _INBOX.x 2\r\n{}\r\n").await;
    let got = got.unwrap_or_else(|e| panic!("after PUB api.leases.\\xc3: {e}"));
    assert_eq!(got["holder"], "h1", "{got}");
    service.shutdown().await;
}
