//! The metrics listener of `serve --metrics-addr`: `GET /metrics` (Prometheus
//! text), `GET /livez` (the process answers), `GET /readyz` (the service's
//! readiness, as its machine last said: 200, or 503 with the reason); any other
//! path is 404 and any other method 405. One request per connection, its head
//! bounded in size and time: a client that sends too much or too slowly is cut off.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::telemetry;

/// The most a request's head may be.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client has to send its request's head.
const READ_BOUND: Duration = Duration::from_secs(5);

/// An HTTP answer: status line, content type, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// `200 OK`, `404 Not Found`, ...
    pub status: &'static str,
    /// The body.
    pub body: String,
}

/// What a request's head is answered: `ready` is the service's readiness, and
/// `metrics` renders the Prometheus text when asked.
pub fn answer(head: &str, ready: Result<(), String>, metrics: impl FnOnce() -> String) -> Answer {
    let mut words = head.lines().next().unwrap_or_default().split(' ');
    let (method, target) = (words.next().unwrap_or_default(), words.next());
    let Some(target) = target else {
        return Answer {
            status: "400 Bad Request",
            body: "a request line is `GET <path> HTTP/1.1`\n".to_string(),
        };
    };
    let path = target.split('?').next().unwrap_or_default();
    if !matches!(path, "/metrics" | "/livez" | "/readyz") {
        return Answer {
            status: "404 Not Found",
            body: "not found: the paths are /metrics, /livez and /readyz\n".to_string(),
        };
    }
    if method != "GET" {
        return Answer {
            status: "405 Method Not Allowed",
            body: "only GET\n".to_string(),
        };
    }
    match (path, ready) {
        ("/metrics", _) => Answer {
            status: "200 OK",
            body: metrics(),
        },
        ("/livez", _) => Answer {
            status: "200 OK",
            body: "alive\n".to_string(),
        },
        (_, Ok(())) => Answer {
            status: "200 OK",
            body: "ready\n".to_string(),
        },
        (_, Err(why)) => Answer {
            status: "503 Service Unavailable",
            body: format!("not ready: {why}\n"),
        },
    }
}

/// Binds `addr` now and serves the listener on tokio from then on.
pub fn serve(addr: SocketAddr, handle: PrometheusHandle) -> std::io::Result<()> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of descriptors, say: do not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(READ_BOUND, one(stream, handle)).await;
            });
        }
    });
    Ok(())
}

/// Reads one request's head and answers it.
async fn one(mut stream: tokio::net::TcpStream, handle: PrometheusHandle) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            let answer = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            return stream.write_all(answer.as_bytes()).await;
        }
    }
    let head = String::from_utf8_lossy(&head);
    let answer = answer(&head, telemetry::readiness(), || handle.render());
    let content_type = if answer.body.starts_with("# ") || head.contains("/metrics") {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        answer.status,
        answer.body.len(),
        answer.body
    );
    stream.write_all(out.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_path_and_method_has_its_answer() {
        let not_ready = || Err("disconnected from NATS: reconnecting".to_string());
        // (request line, readiness, status, body has)
        let table = [
            ("GET /metrics HTTP/1.1", Ok(()), "200 OK", "text"),
            ("GET /metrics HTTP/1.1", not_ready(), "200 OK", "text"),
            ("GET /livez HTTP/1.1", not_ready(), "200 OK", "alive"),
            ("GET /readyz HTTP/1.1", Ok(()), "200 OK", "ready"),
            (
                "GET /readyz?verbose HTTP/1.1",
                not_ready(),
                "503 Service Unavailable",
                "disconnected",
            ),
            ("GET /healthz HTTP/1.1", Ok(()), "404 Not Found", "/readyz"),
            ("GET / HTTP/1.1", Ok(()), "404 Not Found", "not found"),
            (
                "POST /readyz HTTP/1.1",
                Ok(()),
                "405 Method Not Allowed",
                "GET",
            ),
            ("GARBAGE", Ok(()), "400 Bad Request", "GET"),
            ("", Ok(()), "400 Bad Request", "GET"),
        ];
        for (line, ready, status, has) in table {
            let a = answer(&format!("{line}\r\nHost: x\r\n\r\n"), ready, || {
                "text".to_string()
            });
            assert_eq!(a.status, status, "{line}");
            assert!(a.body.contains(has), "{line}: {}", a.body);
        }
    }
}
