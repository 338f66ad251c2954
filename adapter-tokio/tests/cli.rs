//! The operator commands of `dagnats-leases` against a real server and the service:
//! output, `--json`, and the exit codes that tell "not yours" from errors.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dagnats_leases_tests::NatsServer;
use dagnats_leases_tokio::member::{Member, Ownership};
use dagnats_leases_tokio::service::{self, BucketOptions, ServiceConfig, ServiceOptions};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");

struct Cli {
    url: String,
}

impl Cli {
    async fn run(&self, args: &[&str]) -> Output {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(["--nats-url".to_string(), self.url.clone()]);
        tokio::task::spawn_blocking(move || Command::new(BIN).args(&all).output().unwrap())
            .await
            .unwrap()
    }

    /// Runs with `--json` and returns the exit code and the one JSON line.
    async fn json(&self, args: &[&str]) -> (i32, Value) {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.run(&all).await;
        let text = String::from_utf8_lossy(&out.stdout);
        let value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{args:?}: not one JSON line ({e}): {text}"));
        (out.status.code().unwrap(), value)
    }
}

async fn setup() -> (NatsServer, service::ServiceHandle, Cli) {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let handle = service::start((server.url(), client), ServiceOptions::default())
        .await
        .unwrap();
    let cli = Cli { url: server.url() };
    (server, handle, cli)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_release_owner_with_their_exit_codes() {
    let (_server, _service, cli) = setup().await;
    let (code, got) = cli
        .json(&["acquire", "job", "--holder", "ops-1", "--ttl-ms", "30000"])
        .await;
    assert_eq!(code, 0);
    assert_eq!(got["granted"], true);
    let rev = got["revision"].as_u64().unwrap();

    // Someone else: not granted, exit 3, the reply names the holder.
    let (code, other) = cli.json(&["acquire", "job", "--holder", "ops-2"]).await;
    assert_eq!(code, 3);
    assert_eq!(
        (other["granted"].clone(), other["holder"].clone()),
        (false.into(), "ops-1".into())
    );

    let (code, renewed) = cli
        .json(&[
            "renew",
            "job",
            "--holder",
            "ops-1",
            "--revision",
            &rev.to_string(),
        ])
        .await;
    assert_eq!(code, 0);
    let rev2 = renewed["revision"].as_u64().unwrap();
    assert!(rev2 > rev);

    // The old fence: fence_mismatch, exit 4. Another holder: lost, exit 3.
    let (code, err) = cli
        .json(&[
            "renew",
            "job",
            "--holder",
            "ops-1",
            "--revision",
            &rev.to_string(),
        ])
        .await;
    assert_eq!((code, err["kind"].as_str()), (4, Some("fence_mismatch")));
    let (code, err) = cli
        .json(&[
            "renew",
            "job",
            "--holder",
            "ops-2",
            "--revision",
            &rev2.to_string(),
        ])
        .await;
    assert_eq!((code, err["kind"].as_str()), (3, Some("lost")));

    let (code, owner) = cli.json(&["owner", "job"]).await;
    assert_eq!((code, owner["holder"].as_str()), (0, Some("ops-1")));

    let (code, released) = cli
        .json(&[
            "release",
            "job",
            "--holder",
            "ops-1",
            "--revision",
            &rev2.to_string(),
        ])
        .await;
    assert_eq!((code, released["released"].clone()), (0, true.into()));
    let (code, owner) = cli.json(&["owner", "job"]).await;
    assert_eq!((code, owner["held"].clone()), (3, false.into()));
    let (code, err) = cli
        .json(&[
            "release",
            "job",
            "--holder",
            "ops-1",
            "--revision",
            &rev2.to_string(),
        ])
        .await;
    assert_eq!((code, err["kind"].as_str()), (3, Some("lost")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readable_output_and_invalid_input() {
    let (_server, _service, cli) = setup().await;
    let out = cli.run(&["acquire", "job", "--holder", "ops-1"]).await;
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("granted job to ops-1 (revision "),
        "{text}"
    );
    let out = cli.run(&["owner", "free-key"]).await;
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "free-key is not held"
    );
    // Refused before any request, with the field named.
    let out = cli
        .run(&["acquire", "job", "--holder", "ops-1", "--ttl-ms", "1500"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid") && err.contains("ttl_ms"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_is_exit_2() {
    let cli = Cli {
        url: "nats://127.0.0.1:1".into(),
    };
    let out = cli.run(&["owner", "job"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_the_held_leases() {
    let (_server, _service, cli) = setup().await;
    for (key, holder) in [("a", "h1"), ("b", "h2"), ("c", "h3")] {
        let (code, _) = cli.json(&["acquire", key, "--holder", holder]).await;
        assert_eq!(code, 0);
    }
    let (_, b) = cli.json(&["owner", "b"]).await;
    let rev = b["revision"].to_string();
    cli.json(&["release", "b", "--holder", "h2", "--revision", &rev])
        .await;
    // A read confirmation such as a replicated bucket's service writes (a stand-in:
    // this server has one replica), made to stay: list must not take it for a key.
    let client = async_nats::connect(&cli.url).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-TTL", "60s");
    let ack = client
        .request_with_headers("$KV.leases.a.read", headers, "".into())
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&ack.payload).contains("\"seq\""));
    // A user who may read the stream lists in one pass: no owner call per key.
    let mut owner_calls = client.subscribe("api.leases.owner").await.unwrap();
    client.flush().await.unwrap();
    let out = cli.run(&["list", "--json"]).await;
    assert_eq!(out.status.code(), Some(0));
    client.flush().await.unwrap();
    assert!(
        futures::FutureExt::now_or_never(futures::StreamExt::next(&mut owner_calls)).is_none(),
        "list made owner calls"
    );
    let held: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let keys: Vec<&str> = held.iter().map(|l| l["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["a", "c"]);
    let out = cli.run(&["list"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("2 held\n"));
}

/// On a sharded bucket (`serve --shards 3`) list finds the count in shard 0's
/// metadata and lists the held keys of every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_reads_every_shard_of_a_sharded_bucket() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let shards = dagnats_leases_core::shard::ShardMap::new(3).unwrap();
    let options = ServiceOptions::from(ServiceConfig {
        bucket: BucketOptions {
            shards,
            ..BucketOptions::default()
        },
        ..ServiceConfig::default()
    });
    let _service = service::start((server.url(), client), options)
        .await
        .unwrap();
    let cli = Cli { url: server.url() };
    let keys: Vec<String> = (0..12).map(|n| format!("s{n}")).collect();
    let spread: std::collections::BTreeSet<u32> = keys.iter().map(|k| shards.shard_of(k)).collect();
    assert_eq!(spread.len(), 3, "the keys cover every shard");
    for key in &keys {
        let (code, _) = cli.json(&["acquire", key, "--holder", "h"]).await;
        assert_eq!(code, 0);
    }
    let out = cli.run(&["list", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["key"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    listed.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(listed, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_change_and_an_expiry_as_expired() {
    use tokio::io::AsyncBufReadExt;
    let (server, _service, cli) = setup().await;
    let mut watcher = tokio::process::Command::new(BIN)
        .args(["watch", "w", "--count", "5", "--nats-url", &server.url()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the watcher says its subscription is live.
    let mut stderr = tokio::io::BufReader::new(watcher.stderr.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(20), stderr.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ready.as_deref(), Some("watching dagnats.lease.changed.w"));

    let revision = |v: &Value| v["revision"].as_u64().unwrap();
    let (_, got) = cli
        .json(&["acquire", "w", "--holder", "h1", "--ttl-ms", "1000"])
        .await;
    let (_, renewed) = cli
        .json(&[
            "renew",
            "w",
            "--holder",
            "h1",
            "--revision",
            &revision(&got).to_string(),
        ])
        .await;
    let (_, released) = cli
        .json(&[
            "release",
            "w",
            "--holder",
            "h1",
            "--revision",
            &revision(&renewed).to_string(),
        ])
        .await;
    // A lease of 1 s that nobody renews: the server's expiry marker follows it, as the
    // next write to the stream.
    let (_, again) = cli
        .json(&["acquire", "w", "--holder", "h2", "--ttl-ms", "1000"])
        .await;
    assert_eq!(again["granted"], true);
    let out = tokio::time::timeout(Duration::from_secs(20), watcher.wait_with_output())
        .await
        .expect("five events within 20 s")
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        lines,
        [
            format!("{} w acquired h1", revision(&got)),
            format!("{} w renewed h1", revision(&renewed)),
            format!("{} w released", revision(&released)),
            format!("{} w acquired h2", revision(&again)),
            format!("{} w expired", revision(&again) + 1),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_prints_the_owners_reply() {
    let (server, _service, cli) = setup().await;
    let member = Member::new(async_nats::connect(server.url()).await.unwrap(), "echo-1").unwrap();
    let mut inbox = member.inbox().await.unwrap();
    let mut elector = member.elect("svc", Duration::from_secs(5)).unwrap();
    let change = tokio::time::timeout(Duration::from_secs(20), elector.next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(change.ownership, Ownership::Elected { .. }));
    tokio::spawn(async move {
        while let Some(r) = inbox.next().await {
            let body = format!("echo: {}", String::from_utf8_lossy(&r.payload));
            r.respond(body).await.unwrap();
        }
    });
    let out = cli.run(&["forward", "svc", "--payload", "hello"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "echo: hello\n");
    let (code, got) = cli.json(&["forward", "svc", "--payload", "hi"]).await;
    assert_eq!((code, got["holder"].as_str()), (0, Some("echo-1")));
    elector.stop().await;
    let (code, err) = cli.json(&["forward", "svc", "--payload", "hi"]).await;
    assert_eq!((code, err["kind"].as_str()), (3, Some("not_held")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_wait_is_woken_by_the_release_and_wait_0_tries_once() {
    let (_server, _service, cli) = setup().await;
    let (code, held) = cli
        .json(&["acquire", "w", "--holder", "ops-1", "--ttl-ms", "60000"])
        .await;
    assert_eq!(code, 0);
    let rev = held["revision"].to_string();

    // --wait 0: one try, refused at once.
    let (code, got) = cli
        .json(&["acquire", "w", "--holder", "ops-2", "--wait", "0"])
        .await;
    assert_eq!((code, got["holder"].as_str()), (3, Some("ops-1")));
    // No duration at all is refused before any request: exit 2 with a sentence
    // naming the option (a bare number is seconds).
    for bad in ["soon", "5 parsecs"] {
        let out = cli
            .run(&["acquire", "w", "--holder", "ops-2", "--wait", bad])
            .await;
        assert_eq!(out.status.code(), Some(2), "--wait {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--wait") && err.contains("is not a duration"),
            "{err}"
        );
    }
    // A bounded wait that ends without the lease: exit 3, after the bound.
    let started = std::time::Instant::now();
    let (code, _) = cli
        .json(&["acquire", "w", "--holder", "ops-2", "--wait", "1s"])
        .await;
    assert_eq!(code, 3);
    assert!(started.elapsed() >= Duration::from_secs(1));

    // A long wait, woken by the release (the lease's 60 s TTL is far off).
    let mut waiter = Command::new(BIN)
        .args([
            "acquire", "w", "--holder", "ops-2", "--wait", "30s", "--json",
        ])
        .args(["--nats-url", &cli.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = waiter.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let line = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the waiter says it waits");
    assert_eq!(line, "dagnats-leases: waiting for w (held by ops-1)");
    let released_at = std::time::Instant::now();
    let (code, _) = cli
        .json(&["release", "w", "--holder", "ops-1", "--revision", &rev])
        .await;
    assert_eq!(code, 0);
    let out = tokio::task::spawn_blocking(move || waiter.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (got["granted"].clone(), got["holder"].as_str()),
        (true.into(), Some("ops-2"))
    );
    assert!(
        released_at.elapsed() < Duration::from_secs(10),
        "woken by the release, not a timer: {:?}",
        released_at.elapsed()
    );
}

/// The library call under `acquire --wait`: refused while another holds the key,
/// then granted on the release, long before the other lease's 60 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_acquire_waiting_is_woken_by_the_release() {
    use dagnats_leases_core::wire::Endpoint;
    use dagnats_leases_tokio::client::LeaseClient;
    use futures::StreamExt;

    let (server, _service, _cli) = setup().await;
    let nats = async_nats::connect(server.url()).await.unwrap();
    let leases = LeaseClient::new(nats.clone());
    let held = leases
        .acquire("lw", "ops-1", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(held.granted);
    // Zero wait is one try.
    let once = leases
        .acquire_waiting("lw", "ops-2", Duration::from_secs(5), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!((once.granted, once.lease.holder.as_str()), (false, "ops-1"));

    // The waiter's acquires, seen on the service's subject.
    let mut asks = nats.subscribe(Endpoint::Acquire.subject()).await.unwrap();
    nats.flush().await.unwrap();
    let waiter = tokio::spawn({
        let leases = leases.clone();
        async move {
            leases
                .acquire_waiting(
                    "lw",
                    "ops-2",
                    Duration::from_secs(5),
                    Duration::from_secs(50),
                )
                .await
        }
    });
    tokio::time::timeout(Duration::from_secs(20), asks.next())
        .await
        .expect("the waiter asks")
        .unwrap();
    let owner = leases.owner("lw").await.unwrap().unwrap();
    assert_eq!(owner.holder, "ops-1", "the waiter's first try was refused");
    // Waiting is not polling: while the key stays held (no change event, its TTL
    // 60 s off), the waiter asks nothing more. A poller at any period under 2 s fails.
    let polled = tokio::time::timeout(Duration::from_secs(2), asks.next()).await;
    assert!(
        polled.is_err(),
        "the waiter asked again while nothing changed: it polls"
    );
    leases
        .release("lw", "ops-1", held.lease.revision)
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("woken by the release, not the 60 s TTL")
        .unwrap()
        .unwrap();
    assert_eq!((got.granted, got.lease.holder.as_str()), (true, "ops-2"));
}

/// Far past every command's documented bound: a command still running then has
/// hung, and the test fails saying so (never a timing assertion).
const HUNG: Duration = Duration::from_secs(60);

/// Runs the binary with exactly `args` (no URL added) and returns what it did, or
/// fails if it has not ended by [`HUNG`].
async fn bounded(args: &[&str]) -> Output {
    bounded_with(args, &[]).await
}

/// [`bounded`] with `env` set for the command.
async fn bounded_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let child = tokio::process::Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::timeout(HUNG, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} did not end: it hangs"))
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The one JSON line on stdout.
fn json_line(out: &Output) -> Value {
    let stdout = text(&out.stdout);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON line ({e}): {stdout:?} {out:?}"))
}

/// A NATS server with no lease service: every command says no lease service
/// answers (exit 2), never that a key is held by someone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_service_is_never_held_by_another_holder() {
    let server = NatsServer::start();
    let url = server.url();
    let u = url.as_str();
    for args in [
        &[
            "lock",
            "k",
            "--wait",
            "2s",
            "--nats-url",
            u,
            "--",
            "echo",
            "hi",
        ][..],
        &["acquire", "k", "--holder", "h", "--nats-url", u],
        &[
            "acquire",
            "k",
            "--holder",
            "h",
            "--wait",
            "2s",
            "--nats-url",
            u,
        ],
        &["owner", "k", "--nats-url", u],
    ] {
        let out = bounded(args).await;
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("no lease service answers"), "{args:?}: {err}");
        assert!(!err.contains("held by"), "{args:?}: {err}");
        assert!(
            text(&out.stdout).is_empty(),
            "{args:?}: the command never ran"
        );
    }
    // The same outcomes with --json: one spelling of the kind.
    for args in [
        &["acquire", "k", "--holder", "h", "--json", "--nats-url", u][..],
        &[
            "acquire",
            "k",
            "--holder",
            "h",
            "--wait",
            "1s",
            "--json",
            "--nats-url",
            u,
        ],
        &["owner", "k", "--json", "--nats-url", u],
    ] {
        let out = bounded(args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(json_line(&out)["kind"], "no_service", "{args:?}");
    }
    let out = bounded(&[
        "lock",
        "k",
        "--wait",
        "0",
        "--json",
        "--nats-url",
        u,
        "--",
        "true",
    ])
    .await;
    assert_eq!(out.status.code(), Some(2));
    let last: Value = serde_json::from_str(text(&out.stderr).lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["event"].as_str(), last["kind"].as_str()),
        (Some("exit"), Some("no_service"))
    );

    // Without --wait, lock waits (as documented) but says why at once.
    let mut child = tokio::process::Command::new(BIN)
        .args(["lock", "k", "--nats-url", u, "--", "echo", "hi"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stderr.take().unwrap()));
    let first = tokio::time::timeout(HUNG, lines.next_line())
        .await
        .expect("lock said nothing: it waits in silence")
        .unwrap()
        .unwrap();
    assert!(first.contains("no lease service answers"), "{first}");
    child.kill().await.unwrap();
}

/// --json errors before any call: no server, a bad key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_errors_for_no_server_and_a_bad_key() {
    let out = bounded(&["owner", "job", "--json", "--nats-url", "nats://127.0.0.1:1"]).await;
    assert_eq!(out.status.code(), Some(2));
    let got = json_line(&out);
    assert_eq!(got["kind"], "no_server");
    assert!(got["error"].as_str().unwrap().contains("cannot connect"));
    let server = NatsServer::start();
    let url = server.url();
    // A key no lease can have: refused at once, not watched for ever.
    let out = bounded(&["watch", "bad.key", "--nats-url", &url]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("field `key`"), "{out:?}");
    let out = bounded(&["watch", "bad.key", "--json", "--nats-url", &url]).await;
    assert_eq!(
        (out.status.code(), json_line(&out)["kind"].clone()),
        (Some(1), "invalid".into())
    );
    // `list` on a server without JetStream says so, not that the bucket is missing.
    let no_js = NatsServer::builder().jetstream(false).start();
    let out = bounded(&["list", "--json", "--nats-url", &no_js.url()]).await;
    let got = json_line(&out);
    assert_eq!(
        (out.status.code(), got["kind"].clone()),
        (Some(1), "no_jetstream".into()),
        "{got}"
    );
    assert!(
        got["error"].as_str().unwrap().contains("no JetStream"),
        "{got}"
    );
    // Bad arguments with --json: exit 2, and a JSON line all the same.
    for (args, says) in [
        (&["owner", "--json"][..], "KEY"),
        (
            &[
                "acquire", "k", "--holder", "h", "--ttl-ms", "soon", "--json",
            ],
            "neither milliseconds nor a duration",
        ),
    ] {
        let out = bounded(args).await;
        let got = json_line(&out);
        assert_eq!(
            (out.status.code(), got["kind"].clone()),
            (Some(2), "usage".into()),
            "{args:?}: {got}"
        );
        assert!(got["error"].as_str().unwrap().contains(says), "{got}");
    }
    // `elect` too: an observer of a key no lease can have would read its owner in
    // vain for ever (and a space in it failed the subscribe as if no server answered).
    for key in ["bad.key", "bad key"] {
        let out = bounded(&["elect", "--observe", key, "--nats-url", &url]).await;
        assert_eq!(out.status.code(), Some(1), "{key:?}: {out:?}");
        assert!(text(&out.stderr).contains("field `key`"), "{out:?}");
        for campaign in [&["elect", key][..], &["elect", "--observe", key]] {
            let mut args = campaign.to_vec();
            args.extend_from_slice(&["--json", "--nats-url", &url]);
            let out = bounded(&args).await;
            assert_eq!(
                (out.status.code(), json_line(&out)["kind"].clone()),
                (Some(1), "invalid".into()),
                "{args:?}"
            );
        }
    }
}

/// Times take units everywhere, and the old forms still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_take_units_and_the_old_forms_still_work() {
    let (_server, _service, cli) = setup().await;
    for (key, ttl) in [
        ("a", &["--ttl-ms", "15000"][..]),
        ("b", &["--ttl-ms", "15s"]),
        ("c", &["--ttl", "15s"]),
        ("d", &["--ttl", "15"]),
    ] {
        let mut args = vec!["acquire", key, "--holder", "h"];
        args.extend_from_slice(ttl);
        let (code, got) = cli.json(&args).await;
        assert_eq!((code, got["ttl_ms"].as_u64()), (0, Some(15_000)), "{ttl:?}");
    }
    let (code, got) = cli
        .json(&["acquire", "a", "--holder", "x", "--wait", "0"])
        .await;
    assert_eq!((code, got["granted"].clone()), (3, false.into()));
    let out = cli
        .run(&["acquire", "e", "--holder", "h", "--ttl-ms", "soon"])
        .await;
    assert_eq!(out.status.code(), Some(2), "a bad time is a bad argument");
    assert!(text(&out.stderr).contains("neither milliseconds nor a duration"));
    // `elect` too: `--ttl 2s`, the lease it holds then has a TTL of 2000 ms.
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut elect = tokio::process::Command::new(BIN)
        .args([
            "elect",
            "f",
            "--ttl",
            "2s",
            "--json",
            "--nats-url",
            &cli.url,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(elect.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(HUNG, lines.next_line())
        .await
        .expect("elect prints its election")
        .unwrap()
        .expect("a line");
    let elected: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(elected["event"], "elected", "{line}");
    let (code, got) = cli.json(&["owner", "f"]).await;
    assert_eq!((code, got["ttl_ms"].as_u64()), (0, Some(2_000)), "{got}");
    elect.kill().await.unwrap();
}

/// The documented monitor (publish `api.leases.owner` only): `list` and `watch`
/// end at once saying what was refused; with the stream info allowed too, `list`
/// lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_watch_without_permission_end_at_once_saying_so() {
    use dagnats_leases_tests::secure::{Permissions, Users};
    let service_permissions = Permissions::new()
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
        ]);
    let monitor = Permissions::new()
        .publish(["api.leases.owner"])
        .subscribe(["_INBOX.>"]);
    let lister = Permissions::new()
        .publish([
            "api.leases.owner",
            "$JS.API.STREAM.INFO.KV_leases",
            "$JS.API.STREAM.INFO.KV_leases_*",
        ])
        .subscribe(["_INBOX.>"]);
    let users = Users::new()
        .password("svc", "svc", service_permissions)
        .password("ops", "ops", Permissions::all())
        .password("monitor", "monitor", monitor)
        .password("lister", "lister", lister);
    let server = NatsServer::builder().config(users.config()).start();
    let url = server.url();
    let svc = async_nats::ConnectOptions::with_user_and_password("svc".into(), "svc".into())
        .connect(&url)
        .await
        .unwrap();
    let serving = dagnats_leases_tokio::strict::StrictOptions {
        user: Some("svc".into()),
        password: Some("svc".into()),
        ..dagnats_leases_tokio::strict::StrictOptions::new(url.clone())
    };
    let _service = service::start((serving, svc), ServiceOptions::default())
        .await
        .unwrap();
    let as_user = |user: &'static str, args: &[&'static str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(["--nats-url", &url, "--user", user, "--password", user].map(String::from));
        all
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        bounded(&args).await
    };
    let out = run(as_user("ops", &["acquire", "job", "--holder", "h"])).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = run(as_user("monitor", &["owner", "job"])).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "the monitor may ask owner: {out:?}"
    );

    let out = run(as_user("monitor", &["list"])).await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refused a JetStream request") && err.contains("owner KEY"),
        "{err}"
    );
    let out = run(as_user("monitor", &["list", "--json"])).await;
    assert_eq!(json_line(&out)["kind"], "permission");

    let out = run(as_user("monitor", &["watch", "job"])).await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("refused the subscription"), "{err}");
    let out = run(as_user("monitor", &["watch", "--json"])).await;
    assert_eq!(json_line(&out)["kind"], "permission");

    let out = run(as_user("lister", &["list", "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json_line(&out)["key"], "job");
}

/// Completions and man pages come from the clap definitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_man_pages_are_generated() {
    for shell in ["bash", "zsh", "fish"] {
        let out = bounded(&["completions", shell]).await;
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = text(&out.stdout);
        assert!(
            script.contains("dagnats-leases") && script.contains("acquire"),
            "{shell}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man");
    let out = bounded(&["man", man.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for page in [
        "dagnats-leases.1",
        "dagnats-leases-acquire.1",
        "dagnats-leases-lock.1",
    ] {
        let roff = std::fs::read_to_string(man.join(page)).unwrap();
        assert!(roff.contains(".TH"), "{page}");
    }
    let acquire = std::fs::read_to_string(man.join("dagnats-leases-acquire.1")).unwrap();
    assert!(acquire.contains("ttl"), "the flags are in the page");
}

/// Every flag of `serve` and of every command can be set from the environment:
/// walks clap's definitions.
#[test]
fn every_flag_has_an_environment_variable() {
    use clap::{Args, Subcommand};
    let serve = dagnats_leases_tokio::cli::ServeArgs::augment_args(clap::Command::new("serve"));
    let ops = dagnats_leases_tokio::commands::Op::augment_subcommands(clap::Command::new("ops"));
    let commands: Vec<&clap::Command> = std::iter::once(&serve)
        .chain(ops.get_subcommands().filter(|c| !c.is_hide_set()))
        .collect();
    assert!(
        commands.len() > 8,
        "every command walked: {}",
        commands.len()
    );
    let missing: Vec<String> = commands
        .iter()
        .flat_map(|c| {
            c.get_arguments()
                .filter(|a| !a.is_hide_set() && !a.is_positional())
                .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
                .filter(|a| a.get_env().is_none())
                .map(|a| format!("{} --{}", c.get_name(), a.get_id()))
        })
        .collect();
    assert!(missing.is_empty(), "flags without an env var: {missing:?}");
}

/// A flag set in the environment never clashes with another given on the
/// command line: `--ttl` wins over a `DAGNATS_TTL_MS`, and `elect --observe`
/// ignores a `DAGNATS_HOLDER` meant for campaigning (both once refused as
/// conflicting arguments). Without a server, each ends as no server, not as bad
/// usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_from_the_environment_never_clash_with_the_command_line() {
    let none = "nats://127.0.0.1:1";
    for (args, env) in [
        (
            vec![
                "acquire",
                "k",
                "--holder",
                "h",
                "--ttl",
                "5s",
                "--nats-url",
                none,
            ],
            vec![("DAGNATS_TTL_MS", "9000")],
        ),
        (
            vec!["elect", "--observe", "k", "--nats-url", none],
            vec![("DAGNATS_HOLDER", "me"), ("DAGNATS_TTL", "5s")],
        ),
    ] {
        let out = bounded_with(&args, &env).await;
        let stderr = text(&out.stderr);
        assert!(
            !stderr.contains("cannot be used with"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("Usage:"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    }
}

/// Logs to a pipe carry no colours; --log-format json writes JSON lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_pipe_are_plain_and_json_is_json() {
    let out = bounded(&["serve", "--nats-url", "nats://127.0.0.1:1"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("cannot connect"), "{err}");
    assert!(!err.contains('\u{1b}'), "ANSI escapes in a pipe: {err:?}");
    let out = bounded(&[
        "serve",
        "--log-format",
        "json",
        "--nats-url",
        "nats://127.0.0.1:1",
    ])
    .await;
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    let lines: Vec<Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(lines.iter().any(|l| l["level"] == "ERROR"), "{err}");
}

/// `serve`'s coalescer and admission bounds reach the service's config: each
/// default is the core's (the single window unset: it follows the replicas), and
/// each flag sets its own field.
#[test]
fn serve_batch_and_admission_bounds_reach_the_config() {
    use clap::Parser;
    use dagnats_leases_core::service::coalesce::{
        DEFAULT_BATCHES_IN_FLIGHT, DEFAULT_MAX_BATCH, DEFAULT_MIN_BATCH,
    };
    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: dagnats_leases_tokio::cli::ServeArgs,
    }
    let config = |argv: &[&str]| {
        let serve = Serve::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))
            .expect("parses");
        let options = serve.args.service_options().expect("options");
        let c = &options.config;
        (
            c.batch_after,
            c.min_batch,
            c.max_batch,
            c.batches_in_flight,
            c.max_calls_in_flight,
            c.max_calls_waiting,
        )
    };
    let default = dagnats_leases_core::service::DEFAULT_MAX_CALLS_IN_FLIGHT;
    assert_eq!(
        config(&[]),
        (
            None,
            DEFAULT_MIN_BATCH,
            DEFAULT_MAX_BATCH,
            DEFAULT_BATCHES_IN_FLIGHT,
            default,
            default
        )
    );
    assert_eq!(
        config(&[
            "--batch-after",
            "3",
            "--min-batch",
            "5",
            "--max-batch",
            "100",
            "--batches-in-flight",
            "7",
            "--max-calls-in-flight",
            "11",
            "--max-calls-waiting",
            "13",
        ]),
        (Some(3), 5, 100, 7, 11, 13)
    );
}
