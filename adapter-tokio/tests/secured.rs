//! On a nats-server that enforces authentication, subject permissions and TLS:
//! the service (`dagnats-leases serve`) and the operator commands connect with each
//! connection option, a holder user limited to exactly the README's permission list
//! campaigns, renews, releases and serves forwards, and is refused everything else.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use async_nats::{Client, Event};
use dagnats_leases_tests::NatsServer;
use dagnats_leases_tests::secure::{self, Certs, Permissions, Users};
use dagnats_leases_tokio::client::LeaseClient;
use dagnats_leases_tokio::client::change_event;
use dagnats_leases_tokio::member::{Member, Ownership};
use dagnats_leases_tokio::service::{self, ServiceOptions};
use dagnats_leases_tokio::strict::StrictOptions;
use futures::StreamExt;
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");
const WAIT: Duration = Duration::from_secs(20);

/// The service's permissions, as the operations guide lists them.
fn service_permissions() -> Permissions {
    Permissions::new()
        .subscribe([
            "api.leases.>",
            "$SRV.>",
            "_INBOX.>",
            "dagnats.lease.changed.*",
            "dagnats.lease.presence",
        ])
        .publish([
            "$JS.API.>",
            "$KV.leases.>",
            "dagnats.lease.inbox.>",
            "dagnats.lease.presence",
            "_INBOX.>",
        ])
}

/// A holder's permissions for `holder` campaigning for `key`, as the docs list
/// them: replies at its own inbox prefix, `_INBOX.<holder>.`.
fn holder_permissions(holder: &str, key: &str) -> Permissions {
    Permissions::new()
        .publish([
            "api.leases.acquire",
            "api.leases.renew",
            "api.leases.release",
            "api.leases.owner",
            "api.leases.renew_many",
            "$SRV.INFO.dagnats-api",
        ])
        .subscribe([
            format!("_INBOX.{holder}.>"),
            format!("dagnats.lease.changed.{key}"),
            format!("dagnats.lease.inbox.{holder}.>"),
        ])
        .allow_responses()
}

/// `dagnats-leases serve` with these connection arguments; killed when dropped.
struct Serve {
    child: Child,
    lines: std_mpsc::Receiver<String>,
}

impl Serve {
    /// Starts it and waits for its "serving" log line (or panics with what it said).
    fn start(url: &str, auth: &[&str]) -> Serve {
        let mut child = Command::new(BIN)
            .args(["serve", "--nats-url", url])
            .args(auth)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std_mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let serve = Serve { child, lines };
        serve.wait_for("serving api.leases.*");
        serve
    }

    fn wait_for(&self, needle: &str) {
        let deadline = std::time::Instant::now() + WAIT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(line) => seen.push(line),
                Err(_) => panic!(
                    "serve never logged {needle:?}; it said:\n{}",
                    seen.join("\n")
                ),
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a CLI command against `url` with these connection arguments.
async fn cli(url: &str, args: &[&str], auth: &[&str]) -> Output {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--nats-url".to_owned(), url.to_owned()]);
    all.extend(auth.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || Command::new(BIN).args(&all).output().unwrap())
        .await
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The CLI with `auth` reaches the service: acquire then owner answer.
async fn cli_works(url: &str, auth: &[&str], key: &str) {
    let out = cli(url, &["acquire", key, "--holder", "ops-1"], auth).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = cli(url, &["owner", key], auth).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("to ops-1"),
        "{}",
        text(&out)
    );
}

/// The CLI with `auth` cannot connect: exit 2 and a sentence saying why.
async fn cli_refused(url: &str, auth: &[&str], why: &str) {
    let out = cli(url, &["owner", "k"], auth).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("cannot connect") && err.contains(why),
        "{}",
        text(&out)
    );
}

/// `serve` with `auth` cannot connect: exit 2 and a sentence.
fn serve_refused(url: &str, auth: &[&str], why: &str) {
    let out = Command::new(BIN)
        .args(["serve", "--nats-url", url])
        .args(auth)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("cannot connect") && err.contains(why),
        "{}",
        text(&out)
    );
}

fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_password_nkey_and_token_connect_the_service_and_the_cli() {
    let (seed, public) = secure::nkey_user();
    let (svc_seed, svc_public) = secure::nkey_user();
    let (stranger_seed, _) = secure::nkey_user();
    let users = Users::new()
        .password("svc", "svc-secret", service_permissions())
        .nkey(&svc_public, service_permissions())
        .password("ops", "ops-secret", Permissions::all())
        .nkey(&public, Permissions::all());
    let server = NatsServer::builder().config(users.config()).start();
    let url = server.url();

    // Each service instance alone, each CLI option against it.
    let svc = Serve::start(&url, &["--user", "svc", "--password", "svc-secret"]);
    cli_works(
        &url,
        &["--user", "ops", "--password", "ops-secret"],
        "by-password",
    )
    .await;
    drop(svc);
    let svc = Serve::start(&url, &["--nkey", &svc_seed]);
    cli_works(&url, &["--nkey", &seed], "by-nkey").await;
    drop(svc);

    // Env works as the flags do (NATS_USER / NATS_PASSWORD).
    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            Command::new(BIN)
                .args(["owner", "by-nkey", "--nats-url", &url])
                .env("NATS_USER", "ops")
                .env("NATS_PASSWORD", "ops-secret")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    // No service runs now: the connection works, the call finds no responder: no
    // lease service answers (2), not a refused login.
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("no lease service answers"),
        "{}",
        text(&out)
    );

    cli_refused(
        &url,
        &["--user", "ops", "--password", "wrong"],
        "authorization",
    )
    .await;
    cli_refused(&url, &[], "authorization").await;
    cli_refused(&url, &["--nkey", &stranger_seed], "authorization").await;
    serve_refused(
        &url,
        &["--user", "svc", "--password", "wrong"],
        "authorization",
    );

    let token_server = NatsServer::builder()
        .config(secure::token("s3cret-token"))
        .start();
    let url = token_server.url();
    let _svc = Serve::start(&url, &["--token", "s3cret-token"]);
    cli_works(&url, &["--token", "s3cret-token"], "by-token").await;
    cli_refused(&url, &["--token", "not-it"], "authorization").await;
    serve_refused(&url, &["--token", "not-it"], "authorization");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mutual_tls_connect_and_bad_certificates_are_refused() {
    let certs = Certs::generate();
    let ca = p(&certs.ca());
    let rogue_ca = p(&certs.rogue_ca());

    // Server-authenticated TLS: the client trusts the CA.
    let server = NatsServer::builder()
        .config(certs.server_tls(false))
        .start();
    let url = server.url();
    let svc = Serve::start(&url, &["--tls-ca", &ca]);
    cli_works(&url, &["--tls-ca", &ca], "over-tls").await;
    cli_refused(&url, &["--tls-ca", &rogue_ca], "certificate").await;
    serve_refused(&url, &["--tls-ca", &rogue_ca], "certificate");
    drop(svc);

    // Mutual TLS: the server demands a client certificate of its CA.
    let server = NatsServer::builder().config(certs.server_tls(true)).start();
    let url = server.url();
    let (cert, key) = certs.client("client");
    let (cert, key) = (p(&cert), p(&key));
    let mtls = [
        "--tls-ca",
        ca.as_str(),
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    let _svc = Serve::start(&url, &mtls);
    cli_works(&url, &mtls, "over-mtls").await;
    for bad in ["expired-client", "rogue-client"] {
        let (cert, key) = certs.client(bad);
        let (cert, key) = (p(&cert), p(&key));
        let args = [
            "--tls-ca",
            ca.as_str(),
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ];
        let out = cli(&url, &["owner", "k"], &args).await;
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
            "{bad}: {}",
            text(&out)
        );
    }
    // No client certificate at all.
    let out = cli(&url, &["owner", "k"], &["--tls-ca", &ca]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Connects as `user`, collecting the server's errors (permission violations come
/// back only this way: the server drops the message and says `-ERR`).
/// A holder connects with its own inbox prefix, `_INBOX.<user>`.
async fn connect_as(url: &str, user: &str) -> (Client, mpsc::UnboundedReceiver<String>) {
    let mut options = async_nats::ConnectOptions::with_user_and_password(user.into(), "pw".into());
    if user.starts_with("holder-") {
        options = options.custom_inbox_prefix(format!("_INBOX.{user}"));
    }
    connect_watching(url, user, options).await
}

/// Connects with `options`; the server's errors (permission violations) arrive on
/// the receiver.
async fn connect_watching(
    url: &str,
    user: &str,
    options: async_nats::ConnectOptions,
) -> (Client, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let client = options
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let Event::ServerError(e) = event {
                    let _ = tx.send(e.to_string());
                }
            }
        })
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("{user} connects: {e}"));
    (client, rx)
}

/// A server with the service (limited to the README's service list), an observer,
/// two holders limited to the README's holder list and a forwarding operator.
async fn permissioned() -> (NatsServer, service::ServiceHandle) {
    let users = Users::new()
        .password("svc", "pw", service_permissions())
        .password("admin", "pw", Permissions::all())
        .password("holder-a", "pw", holder_permissions("holder-a", "job"))
        .password("holder-b", "pw", holder_permissions("holder-b", "job"))
        .password(
            "ops",
            "pw",
            Permissions::new()
                .publish(["api.leases.forward", "api.leases.owner"])
                .subscribe(["_INBOX.>"]),
        );
    let server = NatsServer::builder().config(users.config()).start();
    let (svc, mut svc_errors) = connect_as(&server.url(), "svc").await;
    let handle = until(
        "the service's start",
        service::start(
            (
                StrictOptions {
                    user: Some("svc".into()),
                    password: Some("pw".into()),
                    ..StrictOptions::new(server.url())
                },
                svc.clone(),
            ),
            ServiceOptions::default(),
        ),
    )
    .await
    .expect("the service starts with the README's service permissions");
    svc.flush().await.unwrap();
    assert!(svc_errors.try_recv().is_err(), "the service was refused");
    (server, handle)
}

async fn until<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_with_the_documented_permissions_campaigns_renews_releases_and_serves() {
    let (server, _service) = permissioned().await;
    let url = server.url();
    let (admin, _) = connect_as(&url, "admin").await;
    let mut events = admin.subscribe("dagnats.lease.changed.job").await.unwrap();
    admin.flush().await.unwrap();

    let (holder, mut violations) = connect_as(&url, "holder-a").await;
    let member = Member::new(holder.clone(), "holder-a").unwrap();
    let mut inbox = member.inbox().await.unwrap();
    let mut elector = member.elect("job", Duration::from_secs(3)).unwrap();
    let fence = match until("election", elector.next()).await {
        Some(change) => match change.ownership {
            Ownership::Elected { fence } => fence,
            other => panic!("{other:?}"),
        },
        None => panic!("the elector ended"),
    };

    // Acquired, renewed to confirm the grant, then renewed again at ttl/3, as
    // change events say.
    let mut seen = Vec::new();
    until("two renewals", async {
        while let Some(m) = events.next().await {
            seen.push(change_event(&m).kind.as_str());
            if seen.iter().filter(|e| **e == "renewed").count() == 2 {
                break;
            }
        }
    })
    .await;
    assert_eq!(seen.first(), Some(&"acquired"), "{seen:?}");

    // A forward reaches holder-a's inbox and its answer comes back.
    let (ops, _) = connect_as(&url, "ops").await;
    let forward = tokio::spawn(async move {
        LeaseClient::new(ops)
            .forward("job", b"ping", Duration::from_secs(5))
            .await
    });
    let request = until("a forwarded request", inbox.next()).await.unwrap();
    assert_eq!(
        (request.key.as_str(), &request.payload[..]),
        ("job", &b"ping"[..])
    );
    assert!(request.fence >= fence);
    request.respond("pong").await.unwrap();
    let reply = until("the forward's reply", forward)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (&reply.payload[..], reply.holder.as_str()),
        (&b"pong"[..], "holder-a")
    );

    // Release.
    until("the release", elector.stop()).await;
    until("the released event", async {
        while let Some(m) = events.next().await {
            if change_event(&m).kind.as_str() == "released" {
                break;
            }
        }
    })
    .await;
    let owner = LeaseClient::new(admin).owner("job").await.unwrap();
    assert!(owner.is_none(), "{owner:?}");

    // The server refused nothing of all that (a flush is answered after any -ERR).
    holder.flush().await.unwrap();
    assert!(
        violations.try_recv().is_err(),
        "the documented list was not enough"
    );
}

/// Waits for the server to refuse `subject` to this connection (publish or subscribe).
async fn refused(violations: &mut mpsc::UnboundedReceiver<String>, what: &str, subject: &str) {
    let expected = format!("permissions violation for {what} to \"{subject}\"");
    until(&expected, async {
        while let Some(error) = violations.recv().await {
            if error.to_lowercase().contains(&expected.to_lowercase()) {
                return;
            }
        }
        panic!("connection closed before {expected}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_cannot_write_the_bucket_use_jetstream_read_other_inboxes_or_serve_calls() {
    let (server, _service) = permissioned().await;
    let url = server.url();
    let (holder, mut violations) = connect_as(&url, "holder-a").await;

    // Write the bucket directly: refused, and nothing is written.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-TTL", "60s");
    holder
        .publish_with_headers("$KV.leases.job", headers, r#"{"holder":"holder-a"}"#.into())
        .await
        .unwrap();
    refused(&mut violations, "publish", "$KV.leases.job").await;
    let (admin, _) = connect_as(&url, "admin").await;
    assert!(
        LeaseClient::new(admin)
            .owner("job")
            .await
            .unwrap()
            .is_none()
    );

    // JetStream's API.
    holder.publish("$JS.API.INFO", "".into()).await.unwrap();
    refused(&mut violations, "publish", "$JS.API.INFO").await;
    holder
        .publish("$JS.API.STREAM.DELETE.KV_leases", "".into())
        .await
        .unwrap();
    refused(
        &mut violations,
        "publish",
        "$JS.API.STREAM.DELETE.KV_leases",
    )
    .await;

    // Another holder's inbox.
    let _sub = holder
        .subscribe("dagnats.lease.inbox.holder-b.>")
        .await
        .unwrap();
    refused(
        &mut violations,
        "subscription",
        "dagnats.lease.inbox.holder-b.>",
    )
    .await;

    // Another holder's replies, or every client's.
    for subject in ["_INBOX.holder-b.>", "_INBOX.>"] {
        let _sub = holder.subscribe(subject).await.unwrap();
        refused(&mut violations, "subscription", subject).await;
    }

    // Answer lease calls, as the service would (plain and in its queue group).
    let _sub = holder.subscribe("api.leases.acquire").await.unwrap();
    refused(&mut violations, "subscription", "api.leases.acquire").await;
    let _sub = holder
        .queue_subscribe("api.leases.>", "dagnats-leases".into())
        .await
        .unwrap();
    refused(&mut violations, "subscription", "api.leases.>").await;

    // Change events of a key it was not given.
    let _sub = holder
        .subscribe("dagnats.lease.changed.other")
        .await
        .unwrap();
    refused(
        &mut violations,
        "subscription",
        "dagnats.lease.changed.other",
    )
    .await;
}

/// Operator mode: `.creds` users of one account (JWTs made by the test). The
/// service with the README's service list and the CLI connect with `--creds`; a
/// holder with the README's holder list campaigns and renews through the service,
/// and may not publish to the bucket; creds of an account the operator never
/// signed are refused with exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creds_users_connect_the_service_the_cli_and_a_holder() {
    let operator = secure::Operator::generate();
    let server = NatsServer::builder()
        .config(operator.server_config())
        .start();
    let url = server.url();
    let svc = operator.creds("svc", &service_permissions());
    let ops = operator.creds("ops", &Permissions::all());
    let holder = operator.creds("holder-c", &holder_permissions("holder-c", "by-creds-job"));

    let _svc = Serve::start(&url, &["--creds", &p(&svc)]);
    cli_works(&url, &["--creds", &p(&ops)], "by-creds").await;

    let options = async_nats::ConnectOptions::with_credentials_file(&holder)
        .await
        .expect("a creds file")
        .custom_inbox_prefix("_INBOX.holder-c");
    let (client, mut violations) = connect_watching(&url, "holder-c", options).await;
    let member = Member::new(client.clone(), "holder-c").unwrap();
    let mut elector = member
        .elect("by-creds-job", Duration::from_secs(3))
        .unwrap();
    match until("election", elector.next()).await.map(|c| c.ownership) {
        Some(Ownership::Elected { .. }) => {}
        other => panic!("{other:?}"),
    }
    // Renewed past its first TTL: still the owner.
    let ops_options = async_nats::ConnectOptions::with_credentials_file(&ops)
        .await
        .unwrap();
    let (ops_client, _) = connect_watching(&url, "ops", ops_options).await;
    let leases = LeaseClient::new(ops_client);
    let first = leases.owner("by-creds-job").await.unwrap().unwrap();
    until("a renewal", async {
        loop {
            let now = leases.owner("by-creds-job").await.unwrap().unwrap();
            if now.revision > first.revision {
                assert_eq!(now.holder, "holder-c");
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        violations.try_recv().is_err(),
        "the documented list sufficed"
    );
    // Not on its list: the bucket itself.
    client
        .publish("$KV.leases.by-creds-job", "forged".into())
        .await
        .unwrap();
    client.flush().await.unwrap();
    let refused = until("a permissions violation", violations.recv())
        .await
        .unwrap();
    assert!(
        refused.to_lowercase().contains("permissions violation"),
        "{refused}"
    );
    until("the release", elector.stop()).await;

    let rogue = operator.rogue_creds("rogue");
    cli_refused(&url, &["--creds", &p(&rogue)], "authorization").await;
    serve_refused(&url, &["--creds", &p(&rogue)], "authorization");
}
