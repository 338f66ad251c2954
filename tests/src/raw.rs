//! A raw NATS protocol client for tests: every byte it sends is the test's.
//!
//! async-nats builds header blocks itself and parses what it receives leniently, so a
//! test of how the service reads hostile header bytes cannot use it. [`RawClient`]
//! speaks the text protocol over a tokio [`TcpStream`]: it reads `INFO`, sends
//! `CONNECT` (headers and no-responders on, optional user and password) and a
//! `PING`, then lets a test `SUB`, `PUB` and `HPUB` with header bytes exactly as
//! given, and read `MSG`/`HMSG` back raw (subject, reply, header bytes, payload). It
//! answers the server's `PING`s while it reads and keeps the server's `-ERR` lines
//! (a permissions violation) for [`RawClient::next_error`]. Every wait is bounded by
//! the client's timeout.
//!
//! ```no_run
//! # async fn demo(url: &str) -> std::io::Result<()> {
//! use dagnats_leases_tests::raw::RawClient;
//!
//! let mut client = RawClient::connect_as(url, "a1", "a1").await?;
//! let headers = b"NATS/1.0\r\nX-A: a\r\n\r\n";
//! let reply = client.request("api.leases.owner", Some(headers), br#"{"key":"k"}"#).await?;
//! println!("{:?}", String::from_utf8_lossy(&reply.payload));
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::io;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// How long one wait (connect, a reply, a message, a `PONG`) lasts unless told.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A message as the server delivered it, bytes untouched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawMsg {
    /// The subject it was delivered on.
    pub subject: String,
    /// The subscription id it was delivered to.
    pub sid: u64,
    /// The reply subject, if the publisher set one.
    pub reply: Option<String>,
    /// The header block (`NATS/1.0...\r\n\r\n`) as received; `None` for a `MSG`.
    pub headers: Option<Vec<u8>>,
    /// The payload.
    pub payload: Vec<u8>,
}

impl RawMsg {
    /// The status code on the header block's first line (`NATS/1.0 503`), if any: the
    /// server's "no responders" is 503.
    pub fn status(&self) -> Option<u16> {
        let headers = self.headers.as_ref()?;
        let first = headers.split(|b| *b == b'\n').next()?;
        let first = std::str::from_utf8(first).ok()?.trim_end();
        first
            .strip_prefix("NATS/1.0 ")?
            .split(' ')
            .next()?
            .parse()
            .ok()
    }

    /// The payload as JSON, if it is JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.payload).ok()
    }
}

/// One connection speaking the NATS text protocol with bytes the test chooses.
#[derive(Debug)]
pub struct RawClient {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// The server's `INFO` as JSON.
    info: Value,
    timeout: Duration,
    /// Messages read while waiting for something else (a `PONG`, a reply).
    pending: VecDeque<RawMsg>,
    /// `-ERR` lines read and not yet taken.
    errors: VecDeque<String>,
    /// Replies of [`RawClient::request`] come to `<inbox_prefix><n>.<seq>`.
    inbox_prefix: String,
    /// The request inbox's subscription, once made.
    inbox: Option<String>,
    next_sid: u64,
    next_request: u64,
    /// `PONG`s still owed to our `PING`s; counted so a late one is not taken for a new one.
    pongs_due: u64,
}

impl RawClient {
    /// Connects without credentials.
    pub async fn connect(url: &str) -> io::Result<RawClient> {
        Self::connect_with(url, None, DEFAULT_TIMEOUT).await
    }

    /// Connects as `user` with `password`.
    pub async fn connect_as(url: &str, user: &str, password: &str) -> io::Result<RawClient> {
        Self::connect_with(url, Some((user, password)), DEFAULT_TIMEOUT).await
    }

    /// Connects with optional credentials; every later wait is bounded by `timeout`.
    /// Fails with the server's `-ERR` (such as an authorization violation) if the
    /// server refuses the connection.
    pub async fn connect_with(
        url: &str,
        auth: Option<(&str, &str)>,
        timeout: Duration,
    ) -> io::Result<RawClient> {
        let addr = url
            .strip_prefix("nats://")
            .unwrap_or(url)
            .trim_end_matches('/');
        let stream = bounded(timeout, "connect", TcpStream::connect(addr)).await??;
        stream.set_nodelay(true)?;
        let (read, writer) = stream.into_split();
        let mut client = RawClient {
            reader: BufReader::new(read),
            writer,
            info: Value::Null,
            timeout,
            pending: VecDeque::new(),
            errors: VecDeque::new(),
            inbox_prefix: "_INBOX.".to_owned(),
            inbox: None,
            next_sid: 1,
            next_request: 0,
            pongs_due: 0,
        };
        let line = client.read_line().await?;
        let info = line
            .strip_prefix("INFO ")
            .ok_or_else(|| invalid(format!("expected INFO, got {line:?}")))?;
        client.info = serde_json::from_str(info).map_err(|e| invalid(format!("INFO: {e}")))?;
        let mut connect = json!({
            "verbose": false, "pedantic": false, "lang": "rust-raw", "version": "0",
            "protocol": 1, "headers": true, "no_responders": true,
        });
        if let Some((user, pass)) = auth {
            connect["user"] = json!(user);
            connect["pass"] = json!(pass);
        }
        client
            .write(format!("CONNECT {connect}\r\n").as_bytes())
            .await?;
        if let Err(e) = client.flush().await {
            let errors = client.take_errors();
            if errors.is_empty() {
                return Err(e);
            }
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("the server refused: {}", errors.join("; ")),
            ));
        }
        Ok(client)
    }

    /// The server's `INFO`.
    pub fn info(&self) -> &Value {
        &self.info
    }

    /// Sets where [`RawClient::request`]'s replies come to (default `_INBOX.`); takes
    /// effect for a client that has made no request yet.
    pub fn set_inbox_prefix(&mut self, prefix: &str) {
        self.inbox_prefix = prefix.to_owned();
    }

    /// Sets the bound of every later wait.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Writes these bytes as they are: for protocol lines no other method makes.
    pub async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let timeout = self.timeout;
        bounded(timeout, "write", self.writer.write_all(bytes)).await?
    }

    /// Subscribes (`SUB subject [queue] sid`); returns the sid. A refusal arrives later
    /// as an `-ERR` ([`RawClient::next_error`]); [`RawClient::flush`] makes sure the
    /// server has read it.
    pub async fn subscribe(&mut self, subject: &str, queue: Option<&str>) -> io::Result<u64> {
        let sid = self.next_sid;
        self.next_sid += 1;
        let line = match queue {
            Some(queue) => format!("SUB {subject} {queue} {sid}\r\n"),
            None => format!("SUB {subject} {sid}\r\n"),
        };
        self.write(line.as_bytes()).await?;
        Ok(sid)
    }

    /// Unsubscribes `sid`.
    pub async fn unsubscribe(&mut self, sid: u64) -> io::Result<()> {
        self.write(format!("UNSUB {sid}\r\n").as_bytes()).await
    }

    /// Publishes without headers (`PUB`).
    pub async fn publish(
        &mut self,
        subject: &str,
        reply: Option<&str>,
        payload: &[u8],
    ) -> io::Result<()> {
        let mut out = match reply {
            Some(reply) => format!("PUB {subject} {reply} {}\r\n", payload.len()),
            None => format!("PUB {subject} {}\r\n", payload.len()),
        }
        .into_bytes();
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\n");
        self.write(&out).await
    }

    /// Publishes with this header block exactly (`HPUB`): the test writes the
    /// `NATS/1.0` line and the terminating blank line itself, or leaves them out.
    pub async fn hpublish(
        &mut self,
        subject: &str,
        reply: Option<&str>,
        headers: &[u8],
        payload: &[u8],
    ) -> io::Result<()> {
        let total = headers.len() + payload.len();
        let mut out = match reply {
            Some(reply) => format!("HPUB {subject} {reply} {} {total}\r\n", headers.len()),
            None => format!("HPUB {subject} {} {total}\r\n", headers.len()),
        }
        .into_bytes();
        out.extend_from_slice(headers);
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\n");
        self.write(&out).await
    }

    /// Sends a `PING` and reads up to its `PONG`: everything sent before has then been
    /// processed by the server (messages read meanwhile are kept for later).
    pub async fn flush(&mut self) -> io::Result<()> {
        self.write(b"PING\r\n").await?;
        self.pongs_due += 1;
        while self.pongs_due > 0 {
            if let Some(msg) = self.read_op().await? {
                self.pending.push_back(msg);
            }
        }
        Ok(())
    }

    /// The next message on any subscription (kept ones first).
    pub async fn next_msg(&mut self) -> io::Result<RawMsg> {
        if let Some(msg) = self.pending.pop_front() {
            return Ok(msg);
        }
        loop {
            if let Some(msg) = self.read_op().await? {
                return Ok(msg);
            }
        }
    }

    /// The next message delivered to `sid`; others are kept for later.
    pub async fn next_on(&mut self, sid: u64) -> io::Result<RawMsg> {
        if let Some(at) = self.pending.iter().position(|m| m.sid == sid) {
            return Ok(self.pending.remove(at).expect("position is in range"));
        }
        loop {
            match self.read_op().await? {
                Some(msg) if msg.sid == sid => return Ok(msg),
                Some(msg) => self.pending.push_back(msg),
                None => {}
            }
        }
    }

    /// The next `-ERR` line the server sent (its text inside the quotes), reading
    /// until one comes.
    pub async fn next_error(&mut self) -> io::Result<String> {
        loop {
            if let Some(error) = self.errors.pop_front() {
                return Ok(error);
            }
            if let Some(msg) = self.read_op().await? {
                self.pending.push_back(msg);
            }
        }
    }

    /// `-ERR` lines read so far and not yet taken.
    pub fn take_errors(&mut self) -> Vec<String> {
        self.errors.drain(..).collect()
    }

    /// Publishes a request (with this header block exactly, if given) with a reply to
    /// the client's own inbox and returns the first reply. A "no responders" status
    /// comes back as a message too ([`RawMsg::status`] 503).
    pub async fn request(
        &mut self,
        subject: &str,
        headers: Option<&[u8]>,
        payload: &[u8],
    ) -> io::Result<RawMsg> {
        let reply = self.send_request(subject, headers, payload).await?;
        self.reply_to(&reply).await
    }

    /// Publishes a request like [`RawClient::request`] without waiting; returns the
    /// reply subject for [`RawClient::reply_to`].
    pub async fn send_request(
        &mut self,
        subject: &str,
        headers: Option<&[u8]>,
        payload: &[u8],
    ) -> io::Result<String> {
        let inbox = match &self.inbox {
            Some(inbox) => inbox.clone(),
            None => {
                let inbox = format!("{}raw{:016x}.", self.inbox_prefix, fastrand::u64(..));
                self.subscribe(&format!("{inbox}*"), None).await?;
                self.inbox = Some(inbox.clone());
                inbox
            }
        };
        self.next_request += 1;
        let reply = format!("{inbox}{}", self.next_request);
        match headers {
            Some(headers) => {
                self.hpublish(subject, Some(&reply), headers, payload)
                    .await?
            }
            None => self.publish(subject, Some(&reply), payload).await?,
        }
        Ok(reply)
    }

    /// The next message delivered on this exact subject (a request's reply); others
    /// are kept for later.
    pub async fn reply_to(&mut self, subject: &str) -> io::Result<RawMsg> {
        if let Some(at) = self.pending.iter().position(|m| m.subject == subject) {
            return Ok(self.pending.remove(at).expect("position is in range"));
        }
        loop {
            match self.read_op().await? {
                Some(msg) if msg.subject == subject => return Ok(msg),
                Some(msg) => self.pending.push_back(msg),
                None => {}
            }
        }
    }

    /// Reads one protocol operation; a message is returned, anything else handled.
    async fn read_op(&mut self) -> io::Result<Option<RawMsg>> {
        let line = self.read_line().await?;
        let mut words = line.split_ascii_whitespace();
        let op = words.next().unwrap_or("").to_ascii_uppercase();
        let args: Vec<&str> = words.collect();
        match op.as_str() {
            "PING" => {
                self.write(b"PONG\r\n").await?;
                Ok(None)
            }
            "PONG" => {
                self.pongs_due = self.pongs_due.saturating_sub(1);
                Ok(None)
            }
            "+OK" | "INFO" => Ok(None),
            "-ERR" => {
                let text = line["-ERR".len()..].trim();
                let text = text.trim_matches('\'').to_owned();
                self.errors.push_back(text);
                Ok(None)
            }
            "MSG" => {
                let (subject, sid, reply, len) = match args[..] {
                    [s, sid, len] => (s, sid, None, len),
                    [s, sid, reply, len] => (s, sid, Some(reply), len),
                    _ => return Err(invalid(format!("bad MSG line {line:?}"))),
                };
                let len = number(len, &line)?;
                let body = self.read_body(len).await?;
                Ok(Some(RawMsg {
                    subject: subject.to_owned(),
                    sid: number(sid, &line)? as u64,
                    reply: reply.map(str::to_owned),
                    headers: None,
                    payload: body,
                }))
            }
            "HMSG" => {
                let (subject, sid, reply, hlen, len) = match args[..] {
                    [s, sid, h, len] => (s, sid, None, h, len),
                    [s, sid, reply, h, len] => (s, sid, Some(reply), h, len),
                    _ => return Err(invalid(format!("bad HMSG line {line:?}"))),
                };
                let hlen = number(hlen, &line)?;
                let len = number(len, &line)?;
                if hlen > len {
                    return Err(invalid(format!("HMSG header longer than total: {line:?}")));
                }
                let mut body = self.read_body(len).await?;
                let payload = body.split_off(hlen);
                Ok(Some(RawMsg {
                    subject: subject.to_owned(),
                    sid: number(sid, &line)? as u64,
                    reply: reply.map(str::to_owned),
                    headers: Some(body),
                    payload,
                }))
            }
            _ => Err(invalid(format!("unexpected protocol line {line:?}"))),
        }
    }

    /// Reads `len` bytes and the `\r\n` after them.
    async fn read_body(&mut self, len: usize) -> io::Result<Vec<u8>> {
        let mut body = vec![0; len + 2];
        let timeout = self.timeout;
        bounded(timeout, "a message body", self.reader.read_exact(&mut body)).await??;
        if !body.ends_with(b"\r\n") {
            return Err(invalid("a message body not ended by CRLF".to_owned()));
        }
        body.truncate(len);
        Ok(body)
    }

    /// Reads one control line, without its line end; an end of stream is an error.
    async fn read_line(&mut self) -> io::Result<String> {
        let mut line = Vec::new();
        let timeout = self.timeout;
        let n = bounded(
            timeout,
            "a protocol line",
            self.reader.read_until(b'\n', &mut line),
        )
        .await??;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            line.pop();
        }
        String::from_utf8(line).map_err(|e| invalid(format!("a control line not UTF-8: {e}")))
    }
}

async fn bounded<F: std::future::Future>(
    timeout: Duration,
    what: &str,
    future: F,
) -> io::Result<F::Output> {
    tokio::time::timeout(timeout, future).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no {what} within {timeout:?}"),
        )
    })
}

fn number(word: &str, line: &str) -> io::Result<usize> {
    word.parse()
        .map_err(|_| invalid(format!("{word:?} is no length in {line:?}")))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}
