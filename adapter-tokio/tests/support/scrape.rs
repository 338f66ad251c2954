//! Scraping a `serve --metrics-addr` binary over plain HTTP, shared by both
//! adapters' tests through `#[path]`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dagnats_leases_tests::NatsServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A loopback address with a port free a moment ago (the binary binds it).
pub fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// The body of `GET /metrics` on `addr`.
pub async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "scrape answered {head}");
    Ok(body.to_string())
}

/// The value of the sample `name` whose labels include every one of `labels`
/// (summed over the samples that match), or `None` when there is none.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, number)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, label_text) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        let has = |(k, v): &(&str, &str)| {
            label_text
                .split(',')
                .any(|pair| pair == format!("{k}=\"{v}\""))
        };
        if labels.iter().all(has) {
            let n: f64 = number.parse().unwrap();
            found = Some(found.unwrap_or(0.0) + n);
        }
    }
    found
}

/// [`value`], 0 when the sample is not there.
pub fn count(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(text, name, labels).unwrap_or(0.0)
}

/// A `serve` binary serving its metrics; killed when dropped.
pub struct Served {
    child: Option<Child>,
    /// Where its metrics are served.
    pub addr: SocketAddr,
}

impl Served {
    /// Starts `binary serve --metrics-addr` against `nats_url`, with `extra`
    /// arguments, and waits until its scrape shows it serving.
    pub async fn start(binary: &str, nats_url: &str, extra: &[&str]) -> Self {
        let addr = free_addr();
        let child = Command::new(binary)
            .args(["serve", "--nats-url", nats_url])
            .args(["--metrics-addr", &addr.to_string()])
            .args(extra)
            .args(["--shutdown-timeout-ms", "2000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts");
        let served = Self {
            child: Some(child),
            addr,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(text) = scrape(addr).await
                && value(&text, "dagnats_leases_mode", &[("mode", "serving")]) == Some(1.0)
            {
                assert_eq!(
                    value(&text, "dagnats_leases_mode", &[("mode", "starting")]),
                    Some(0.0)
                );
                return served;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the binary never served its metrics in mode serving"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, and the exit code.
    pub async fn stop(mut self) -> Option<i32> {
        let mut child = self.child.take().unwrap();
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let exit = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        exit.code()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `binary serve --metrics-addr`: calls show up by endpoint and reply kind, and
/// their latency histogram counts them.
pub async fn counts_calls(binary: &str) {
    let server = NatsServer::start();
    let served = Served::start(binary, &server.url(), &[]).await;
    let before = scrape(served.addr).await.unwrap();
    let nats = async_nats::connect(server.url()).await.unwrap();
    let call = |endpoint, body| call(&nats, endpoint, body);
    let granted = call("acquire", r#"{"key":"m","holder":"a","ttl_ms":30000}"#).await;
    assert!(granted.contains(r#""granted":true"#), "{granted}");
    let taken = call("acquire", r#"{"key":"m","holder":"b","ttl_ms":30000}"#).await;
    assert!(taken.contains(r#""granted":false"#), "{taken}");
    call("owner", r#"{"key":"m"}"#).await;
    let lost = call("renew", r#"{"key":"m","holder":"b","revision":1}"#).await;
    assert!(lost.contains(r#""kind":"lost""#), "{lost}");
    let after = scrape(served.addr).await.unwrap();

    let calls = "dagnats_leases_calls_total";
    let grew =
        |labels: &[(&str, &str)]| count(&after, calls, labels) - count(&before, calls, labels);
    assert_eq!(
        grew(&[("endpoint", "acquire"), ("reply", "ok")]),
        1.0,
        "{after}"
    );
    assert_eq!(
        grew(&[("endpoint", "acquire"), ("reply", "not_granted")]),
        1.0
    );
    assert_eq!(grew(&[("endpoint", "owner"), ("reply", "ok")]), 1.0);
    assert_eq!(grew(&[("endpoint", "renew"), ("reply", "lost")]), 1.0);
    let latency = "dagnats_leases_call_duration_seconds_count";
    let acquire = [("endpoint", "acquire")];
    assert_eq!(
        count(&after, latency, &acquire) - count(&before, latency, &acquire),
        2.0,
        "{after}"
    );
    // A histogram with buckets, not a summary.
    assert!(
        value(
            &after,
            "dagnats_leases_call_duration_seconds_bucket",
            &[("endpoint", "acquire"), ("le", "+Inf")]
        )
        .is_some(),
        "{after}"
    );
    assert!(
        after.contains("# HELP dagnats_leases_calls_total"),
        "{after}"
    );
    assert_eq!(served.stop().await, Some(0), "SIGTERM ends it with exit 0");
}

/// Calls `api.leases.<endpoint>` with `body`; the reply as text.
pub async fn call(nats: &async_nats::Client, endpoint: &str, body: &'static str) -> String {
    let reply = nats
        .request(format!("api.leases.{endpoint}"), body.into())
        .await
        .unwrap();
    String::from_utf8(reply.payload.to_vec()).unwrap()
}
