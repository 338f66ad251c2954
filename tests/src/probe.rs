//! A minimal synchronous NATS request over a plain TCP connection.
//!
//! The harness is synchronous (no runtime), yet a cluster needs a few questions
//! answered (is JetStream ready, which node leads a stream). This speaks just enough
//! of the NATS protocol for one request: `CONNECT` (headers and no-responders on),
//! `SUB` on a fresh inbox, `PUB` with that reply subject, then the first `MSG` or
//! `HMSG` on the inbox. `PING`s are answered while waiting.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Sends `body` to `subject` on the server at `addr` and returns the reply's payload.
///
/// Fails with a message on a connection error, a `-ERR`, no responders (`503`), or
/// no reply within `timeout`.
pub fn request(
    addr: SocketAddr,
    subject: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + timeout;
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let set_timeout = |reader: &BufReader<TcpStream>| -> Result<(), String> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("{subject}: no reply within {timeout:?}"));
        }
        reader
            .get_ref()
            .set_read_timeout(Some(left))
            .map_err(|e| e.to_string())
    };
    set_timeout(&reader)?;
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("{addr}: reading INFO: {e}"))?;
    if !line.starts_with("INFO ") {
        return Err(format!("{addr}: expected INFO, got {line:?}"));
    }
    let inbox = format!("_INBOX.probe.{}", std::process::id());
    let mut out = Vec::new();
    out.extend_from_slice(
        b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true,\"protocol\":1,\"name\":\"harness-probe\"}\r\n",
    );
    out.extend_from_slice(format!("SUB {inbox} 1\r\n").as_bytes());
    out.extend_from_slice(format!("PUB {subject} {inbox} {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
    writer.write_all(&out).map_err(|e| format!("{addr}: {e}"))?;
    loop {
        set_timeout(&reader)?;
        line.clear();
        let n = reader.read_line(&mut line).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                format!("{subject}: no reply within {timeout:?}")
            } else {
                format!("{addr}: {e}")
            }
        })?;
        if n == 0 {
            return Err(format!("{addr}: connection closed"));
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().copied() {
            Some("PING") => writer
                .write_all(b"PONG\r\n")
                .map_err(|e| format!("{addr}: {e}"))?,
            Some("-ERR") => return Err(format!("{addr}: {}", line.trim_end())),
            Some("MSG") => {
                let len: usize = words
                    .last()
                    .and_then(|w| w.parse().ok())
                    .ok_or_else(|| format!("bad MSG line {line:?}"))?;
                let mut payload = vec![0; len + 2];
                reader
                    .read_exact(&mut payload)
                    .map_err(|e| format!("{addr}: {e}"))?;
                payload.truncate(len);
                return Ok(payload);
            }
            Some("HMSG") => {
                let nums: Vec<usize> = words[words.len() - 2..]
                    .iter()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                let [hlen, total] = nums[..] else {
                    return Err(format!("bad HMSG line {line:?}"));
                };
                let mut all = vec![0; total + 2];
                reader
                    .read_exact(&mut all)
                    .map_err(|e| format!("{addr}: {e}"))?;
                let headers = String::from_utf8_lossy(&all[..hlen]).into_owned();
                if headers.lines().next().is_some_and(|l| l.contains(" 503")) {
                    return Err(format!("{subject}: no responders"));
                }
                all.truncate(total);
                return Ok(all.split_off(hlen));
            }
            _ => {} // +OK, PONG, INFO updates
        }
    }
}

/// [`request`] with a JSON body and a JSON reply.
pub fn request_json(
    addr: SocketAddr,
    subject: &str,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let reply = request(addr, subject, body.to_string().as_bytes(), timeout)?;
    serde_json::from_slice(&reply).map_err(|e| format!("{subject}: reply is not JSON: {e}"))
}
