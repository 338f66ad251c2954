//! Health against a real server, through the `dagnats-leases serve` binary: its
//! metrics listener's `/readyz` follows the connection, unknown paths are 404,
//! `serve` ends with the cause where waiting cannot help (no JetStream, replicas
//! a single server cannot hold), and a bucket whose sequence went back under the
//! service is refused without a fence handed out again. Every wait is bounded and
//! waits on what it expects; no timing is asserted.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use dagnats_leases_tests::NatsServer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "support/scrape.rs"]
mod scrape;

use scrape::{Served, call, free_addr};

const BIN: &str = env!("CARGO_BIN_EXE_dagnats-leases");

/// `GET path` on `addr`: the status line and the body.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    ))
}

/// Asks `/readyz` until its status line has `status`, within `bound`; its body.
async fn readyz_until(addr: SocketAddr, status: &str, bound: Duration) -> String {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let last = get(addr, "/readyz").await;
        if let Ok((line, body)) = &last
            && line.contains(status)
        {
            return body.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz never answered {status} within {bound:?}: last {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `serve` with its metrics on a free address and its log in `log`, killed when
/// dropped.
struct Logged {
    child: Option<std::process::Child>,
    addr: SocketAddr,
}

impl Logged {
    fn start(url: &str, log: &std::path::Path) -> Self {
        let addr = free_addr();
        let child = Command::new(BIN)
            .args(["serve", "--nats-url", url])
            .args(["--metrics-addr", &addr.to_string()])
            .args(["--shutdown-timeout-ms", "2000"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("the binary starts");
        Self {
            child: Some(child),
            addr,
        }
    }

    /// SIGTERM, and the exit code.
    async fn stop(mut self) -> Option<i32> {
        let mut child = self.child.take().unwrap();
        let pid = child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        tokio::task::spawn_blocking(move || child.wait().unwrap().code())
            .await
            .unwrap()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_connection_and_unknown_paths_are_404() {
    let mut server = NatsServer::start();
    let log = std::env::temp_dir().join(format!("dagnats-health-{}.log", std::process::id()));
    let served = Logged::start(&server.url(), &log);
    readyz_until(served.addr, "200", Duration::from_secs(20)).await;
    let (line, body) = get(served.addr, "/readyz").await.unwrap();
    assert!(line.contains("200"), "{line}: {body}");
    let (line, body) = get(served.addr, "/livez").await.unwrap();
    assert!(line.contains("200"), "{line}: {body}");
    for path in ["/healthz", "/", "/metricsx"] {
        let (line, _) = get(served.addr, path).await.unwrap();
        assert!(line.contains("404"), "{path}: {line}");
    }
    let (_, metrics) = get(served.addr, "/metrics").await.unwrap();
    for line in [
        "dagnats_leases_ready 1",
        "dagnats_leases_connected 1",
        "dagnats_leases_build_info{version=",
    ] {
        assert!(metrics.contains(line), "{line}: {metrics}");
    }

    server.kill();
    let body = readyz_until(served.addr, "503", Duration::from_secs(20)).await;
    assert!(body.contains("disconnected"), "{body}");
    let (_, metrics) = get(served.addr, "/metrics").await.unwrap();
    assert!(metrics.contains("dagnats_leases_connected 0"), "{metrics}");
    // Alive all along: the process answers.
    let (line, _) = get(served.addr, "/livez").await.unwrap();
    assert!(line.contains("200"), "{line}");

    server.restart();
    readyz_until(served.addr, "200", Duration::from_secs(30)).await;
    assert_eq!(served.stop().await, Some(0));
    // One warning for the outage however many attempts failed, one line back,
    // for each of the service's two connections (the backend's and the serving
    // one's), and nothing of the attempts above DEBUG.
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    for connection in [
        "connection=dagnats-leases\n",
        "connection=dagnats-leases (serving)",
    ] {
        let of = |what: &str| {
            text.lines()
                .filter(|l| l.contains(what) && (l.to_string() + "\n").contains(connection))
                .count()
        };
        let (lost, back) = (of("connection lost"), of("nats: reconnected"));
        assert_eq!((lost, back), (1, 1), "{connection}: {text}");
    }
    assert!(!text.contains("reconnect attempt"), "{text}");
    assert!(
        text.lines()
            .filter(|l| l.contains("connection lost"))
            .all(|l| l.contains("WARN")),
        "{text}"
    );
}

/// Runs `serve` with `extra` against `url` until it exits, within `bound`: its
/// exit code and what it wrote to stderr.
async fn serve_until_exit(url: &str, extra: &[&str], bound: Duration) -> (Option<i32>, String) {
    let child = Command::new(BIN)
        .args(["serve", "--nats-url", url])
        .args(["--metrics-addr", &free_addr().to_string()])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let pid = child.id();
    let waited = tokio::time::timeout(
        bound,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await;
    match waited {
        Ok(out) => {
            let out = out.unwrap().unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("serve {extra:?} did not exit within {bound:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_jetstream_exits_naming_the_cause() {
    let server = NatsServer::builder().jetstream(false).start();
    let (code, stderr) = serve_until_exit(&server.url(), &[], Duration::from_secs(60)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no JetStream"), "{stderr}");
    assert!(
        !stderr.contains("no stream leader"),
        "the wrong cause: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_one_server_exit_naming_the_cause() {
    let server = NatsServer::start();
    let (code, stderr) =
        serve_until_exit(&server.url(), &["--replicas", "3"], Duration::from_secs(60)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--replicas 3"), "{stderr}");
    assert!(stderr.contains("without a cluster"), "{stderr}");
}

/// A JetStream API request's JSON answer.
async fn api(nats: &async_nats::Client, subject: &str, body: Value) -> Value {
    let reply = nats
        .request(subject.to_string(), body.to_string().into())
        .await
        .unwrap();
    serde_json::from_slice(&reply.payload).unwrap()
}

fn fence(reply: &str) -> u64 {
    let v: Value = serde_json::from_str(reply).unwrap();
    assert_eq!(v["granted"], json!(true), "{reply}");
    v["revision"].as_u64().unwrap()
}

/// The stream deleted and made again with its config (a restore of an empty
/// backup, as far as sequences go) under a running service: the service refuses
/// it (not ready, every call `unavailable` naming why) and no fence is handed out
/// on it. Made again with `first_seq` above every fence used, while the service
/// is down (the documented restore), it is served, and fences go on upwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_rewound_under_the_service_is_refused_and_no_fence_repeats() {
    let server = NatsServer::start();
    let served = Served::start(BIN, &server.url(), &[]).await;
    let nats = async_nats::connect(server.url()).await.unwrap();
    let mut high = 0;
    for key in ["r1", "r2", "r3"] {
        let body: &'static str = match key {
            "r1" => r#"{"key":"r1","holder":"a","ttl_ms":60000}"#,
            "r2" => r#"{"key":"r2","holder":"a","ttl_ms":60000}"#,
            _ => r#"{"key":"r3","holder":"a","ttl_ms":60000}"#,
        };
        high = high.max(fence(&call(&nats, "acquire", body).await));
    }
    let info = api(&nats, "$JS.API.STREAM.INFO.KV_leases", json!({})).await;
    let config = info["config"].clone();
    // The service's check reads the stream's sequence (every 10 s): wait until
    // it has seen the writes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, metrics) = get(served.addr, "/metrics").await.unwrap();
        let seen = scrape::value(
            &metrics,
            "dagnats_leases_stream_last_seq",
            &[("stream", "KV_leases")],
        );
        if seen.is_some_and(|s| s >= high as f64) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deleted = api(&nats, "$JS.API.STREAM.DELETE.KV_leases", json!({})).await;
    assert_eq!(deleted["success"], json!(true), "{deleted}");
    let created = api(&nats, "$JS.API.STREAM.CREATE.KV_leases", config.clone()).await;
    assert!(created.get("error").is_none(), "{created}");

    let body = readyz_until(served.addr, "503", Duration::from_secs(40)).await;
    assert!(body.contains("refused"), "{body}");
    let refused = call(
        &nats,
        "acquire",
        r#"{"key":"r4","holder":"b","ttl_ms":60000}"#,
    )
    .await;
    assert!(refused.contains(r#""kind":"unavailable""#), "{refused}");
    assert!(refused.contains("refuses its bucket"), "{refused}");
    let (_, metrics) = get(served.addr, "/metrics").await.unwrap();
    assert!(
        metrics.contains("dagnats_leases_bucket_refused 1"),
        "{metrics}"
    );
    let after = api(&nats, "$JS.API.STREAM.INFO.KV_leases", json!({})).await;
    assert_eq!(
        after["state"]["last_seq"],
        json!(0),
        "no fence handed out: {after}"
    );
    assert_eq!(served.stop().await, Some(0));

    // The restore procedure: the service down, the stream made anew above.
    let deleted = api(&nats, "$JS.API.STREAM.DELETE.KV_leases", json!({})).await;
    assert_eq!(deleted["success"], json!(true), "{deleted}");
    let mut above = config;
    above["first_seq"] = json!(high + 1000);
    let above_config = above.clone();
    let created = api(&nats, "$JS.API.STREAM.CREATE.KV_leases", above).await;
    assert!(created.get("error").is_none(), "{created}");
    let served = Served::start(BIN, &server.url(), &[]).await;
    let next = fence(
        &call(
            &nats,
            "acquire",
            r#"{"key":"r1","holder":"c","ttl_ms":60000}"#,
        )
        .await,
    );
    assert!(next > high, "fence {next} after {high}");
    readyz_until(served.addr, "200", Duration::from_secs(10)).await;

    // Rewound again, and a call at once, before the service looks at the stream:
    // its write lands at sequence 1, below the fence it handed out, and the
    // reply refuses instead of handing out fence 1 again.
    let deleted = api(&nats, "$JS.API.STREAM.DELETE.KV_leases", json!({})).await;
    assert_eq!(deleted["success"], json!(true), "{deleted}");
    let mut from_one = above_config;
    from_one.as_object_mut().unwrap().remove("first_seq");
    let created = api(&nats, "$JS.API.STREAM.CREATE.KV_leases", from_one).await;
    assert!(created.get("error").is_none(), "{created}");
    let at_once = call(
        &nats,
        "acquire",
        r#"{"key":"r5","holder":"d","ttl_ms":60000}"#,
    )
    .await;
    assert!(at_once.contains(r#""kind":"unavailable""#), "{at_once}");
    assert!(at_once.contains("refuses its bucket"), "{at_once}");
    let body = readyz_until(served.addr, "503", Duration::from_secs(10)).await;
    assert!(body.contains("refused"), "{body}");
    assert_eq!(served.stop().await, Some(0));
}

/// The rolling restart of docs/operations.md ("Upgrade and rollback"): two
/// instances, each in turn stopped with SIGTERM and replaced by a new one that
/// answers `/readyz` 200 before the next is stopped, twice over, while `elect`
/// holds a key with a 3 s TTL. The lease is renewed through the new instances and
/// the leader never steps down: its only line after the election is the
/// `stepped_down` of its own stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_keeps_the_leader_leading() {
    use futures::StreamExt;
    use tokio::io::{AsyncBufReadExt, BufReader};
    const BOUND: Duration = Duration::from_secs(30);
    let server = NatsServer::start();
    let url = server.url();
    let mut instances = vec![
        Served::start(BIN, &url, &[]).await,
        Served::start(BIN, &url, &[]).await,
    ];
    let nats = async_nats::connect(&url).await.unwrap();
    let mut events = nats.subscribe("dagnats.lease.changed.roll").await.unwrap();
    nats.flush().await.unwrap();
    let mut elect = tokio::process::Command::new(BIN)
        .args([
            "elect", "roll", "--holder", "roller", "--ttl", "3s", "--json",
        ])
        .args(["--nats-url", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(elect.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(BOUND, lines.next_line())
        .await
        .expect("elect is elected")
        .unwrap()
        .expect("a line");
    let elected: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(elected["event"], "elected", "{line}");
    for _ in 0..4 {
        let old = instances.remove(0);
        assert_eq!(old.stop().await, Some(0), "an instance's exit on SIGTERM");
        let new = Served::start(BIN, &url, &[]).await;
        readyz_until(new.addr, "200", BOUND).await;
        instances.push(new);
    }
    // Renewed through the instances started last: two renewals after the last
    // restart (the first may have been sent before it).
    let mut renewed = 0;
    while renewed < 2 {
        let event = tokio::time::timeout(BOUND, events.next())
            .await
            .expect("the leader renews")
            .unwrap();
        let kind = event
            .headers
            .as_ref()
            .and_then(|h| h.get("Dagnats-Lease-Event"))
            .map(|v| v.as_str().to_string());
        assert_ne!(
            kind.as_deref(),
            Some("released"),
            "released during the restarts"
        );
        let expired = event
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Marker-Reason"));
        assert!(expired.is_none(), "the lease expired during the restarts");
        if kind.as_deref() == Some("renewed") {
            renewed += 1;
        }
    }
    let pid = elect.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let mut after = Vec::new();
    while let Some(line) = tokio::time::timeout(BOUND, lines.next_line())
        .await
        .expect("elect ends on SIGTERM")
        .unwrap()
    {
        after.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    assert_eq!(after.len(), 1, "one line after the election: {after:?}");
    assert_eq!(
        (after[0]["event"].clone(), after[0]["reason"].clone()),
        (json!("stepped_down"), json!("stopped")),
        "{after:?}"
    );
}
