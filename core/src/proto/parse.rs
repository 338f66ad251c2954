//! Reading what a NATS server writes: its protocol lines (`INFO`, `MSG`, `HMSG`,
//! `PING`, `PONG`, `+OK`, `-ERR`), framed by the byte counts `MSG` and `HMSG`
//! declare, and each `HMSG`'s header block, read strictly.
//!
//! Two kinds of fault, two scopes. A broken protocol line (an unknown op, a bad
//! byte count, a payload not followed by CRLF, a line past the bound) is the
//! server's own framing gone wrong: [`ProtocolError`], and the connection ends. A
//! malformed header block is what a client wrote and the server relayed
//! unchecked: that one message carries a [`HeaderError`] and the stream goes on.

use std::fmt;

use serde::Deserialize;

/// The longest protocol line read (an `INFO` with many `connect_urls` included).
pub const MAX_CONTROL_LINE: usize = 64 * 1024;

/// The largest header block read: a request needs one short header at most, so
/// a larger block is refused unread and costs no more than its bytes.
pub const MAX_HEADER_BLOCK: usize = 16 * 1024;

/// What the server said in `INFO`: the fields this client acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ServerInfo {
    /// The server's id.
    pub server_id: String,
    /// The server's version (`2.11.4`).
    pub version: String,
    /// The largest message (headers and payload) the server takes.
    pub max_payload: usize,
    /// Whether the server takes headers.
    pub headers: bool,
    /// Whether the client must authenticate.
    pub auth_required: bool,
    /// Whether the connection must be upgraded to TLS.
    pub tls_required: bool,
    /// Whether the server can upgrade to TLS.
    pub tls_available: bool,
    /// What an nkey or JWT client signs.
    pub nonce: Option<String>,
    /// Other servers of the cluster.
    pub connect_urls: Vec<String>,
    /// The protocol version.
    pub proto: i64,
}

/// A message a subscription delivered (`MSG` or `HMSG`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// The subject it was published to.
    pub subject: String,
    /// The subscription it came on.
    pub sid: u64,
    /// Its reply subject.
    pub reply: Option<String>,
    /// Its header block as read: empty for `MSG`; an error naming what is wrong
    /// when the block is malformed (the message still arrives, so its sender can
    /// be told).
    pub headers: Result<Headers, HeaderError>,
    /// Its body.
    pub payload: Vec<u8>,
}

/// A well-formed header block: the status line's code and description, and each
/// `Name: value` line in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// The status code (`503`: no responders), if the status line had one.
    pub status: Option<u16>,
    /// The status line's description.
    pub description: String,
    /// Each header, in order, value trimmed of surrounding spaces and tabs.
    pub pairs: Vec<(String, String)>,
}

/// What is wrong with a header block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderErrorKind {
    /// The first line is not `NATS/1.0` with an optional status.
    StatusLine,
    /// A CR not followed by LF, or an LF not after a CR.
    BareLineEnd,
    /// A line starts with a space or tab (obsolete line folding).
    Folded,
    /// A line has no colon.
    NoColon,
    /// A name is empty or has a character outside RFC 7230's token.
    BadName,
    /// A value has a control character (tab excepted).
    ControlInValue,
    /// A value or the status description is not UTF-8.
    NotUtf8,
    /// The block does not end with an empty line at its declared length.
    Unterminated,
    /// The block is larger than [`MAX_HEADER_BLOCK`]: refused unread.
    TooLarge,
    /// The subject or reply subject is not UTF-8 text, or holds a control
    /// character (the server relays a publisher's subject bytes unchecked).
    Subject,
}

impl HeaderErrorKind {
    /// A short name, for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StatusLine => "status_line",
            Self::BareLineEnd => "bare_line_end",
            Self::Folded => "folded",
            Self::NoColon => "no_colon",
            Self::BadName => "bad_name",
            Self::ControlInValue => "control_in_value",
            Self::NotUtf8 => "not_utf8",
            Self::Unterminated => "unterminated",
            Self::TooLarge => "too_large",
            Self::Subject => "subject",
        }
    }
}

/// A malformed header block: what is wrong and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderError {
    /// What is wrong.
    pub kind: HeaderErrorKind,
    /// The line (1: the status line).
    pub line: usize,
    /// A sentence naming it.
    pub detail: String,
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            HeaderErrorKind::Subject => write!(f, "malformed subject: {}", self.detail),
            HeaderErrorKind::TooLarge => write!(f, "header block too large: {}", self.detail),
            _ => write!(
                f,
                "malformed header block, line {}: {}",
                self.line, self.detail
            ),
        }
    }
}

impl std::error::Error for HeaderError {}

/// One operation the server wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerOp {
    /// `INFO {json}`.
    Info(Box<ServerInfo>),
    /// `MSG` or `HMSG`.
    Msg(Delivered),
    /// `PING`: answer `PONG`.
    Ping,
    /// `PONG`: a `PING` of ours answered.
    Pong,
    /// `+OK` (verbose mode only).
    Ok,
    /// `-ERR 'text'`: the text without its quotes.
    Err(String),
}

/// The server's framing is broken: the connection cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

/// Reads server ops from bytes fed in any chunks.
#[derive(Debug, Clone)]
pub struct Parser {
    buf: Vec<u8>,
    /// Where unread bytes start in `buf`.
    start: usize,
    /// The largest message body (headers and payload) taken.
    max_message: usize,
    failed: bool,
}

impl Parser {
    /// A parser taking messages up to `max_message` bytes (headers and payload).
    pub fn new(max_message: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            max_message,
            failed: false,
        }
    }

    /// Sets the largest message taken (INFO's `max_payload`, with slack).
    pub fn set_max_message(&mut self, max_message: usize) {
        self.max_message = max_message;
    }

    /// Appends bytes read from the socket.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Forgets everything fed (a new socket).
    pub fn reset(&mut self) {
        self.buf.clear();
        self.start = 0;
        self.failed = false;
    }

    /// Bytes fed and not yet read.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete op; `None` until more bytes come. After an error it
    /// returns `None` until [`Parser::reset`].
    pub fn next_op(&mut self) -> Option<Result<ServerOp, ProtocolError>> {
        if self.failed {
            return None;
        }
        let out = self.parse_one();
        if let Some(Err(_)) = &out {
            self.failed = true;
        }
        if self.start > 0 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        out
    }

    fn parse_one(&mut self) -> Option<Result<ServerOp, ProtocolError>> {
        let data = &self.buf[self.start..];
        let Some(end) = find_crlf(data) else {
            if data.len() > MAX_CONTROL_LINE {
                return Some(Err(ProtocolError(format!(
                    "a protocol line longer than {MAX_CONTROL_LINE} bytes"
                ))));
            }
            if let Some(i) = data.iter().position(|&b| b == b'\n') {
                return Some(Err(ProtocolError(format!(
                    "a protocol line ends with a bare LF at byte {i}"
                ))));
            }
            return None;
        };
        let line = &data[..end];
        let (op, rest) = split_op(line);
        let upper = op.to_ascii_uppercase();
        // A bare CR may sit in a MSG line's subject or reply (a publisher's bytes,
        // relayed unchecked): that message is refused on its own (MsgHead::parse).
        let subjects_inside = matches!(upper.as_slice(), b"MSG" | b"HMSG");
        if let Some(i) = line
            .iter()
            .position(|&b| b == b'\n' || (b == b'\r' && !subjects_inside))
        {
            return Some(Err(ProtocolError(format!(
                "a bare CR or LF inside a protocol line at byte {i}"
            ))));
        }
        let after_line = end + 2;
        let result = match upper.as_slice() {
            b"PING" if rest.is_empty() => Ok(ServerOp::Ping),
            b"PONG" if rest.is_empty() => Ok(ServerOp::Pong),
            b"+OK" if rest.is_empty() => Ok(ServerOp::Ok),
            b"-ERR" => {
                let text = String::from_utf8_lossy(rest);
                let text = text.trim().trim_matches('\'').to_string();
                Ok(ServerOp::Err(text))
            }
            b"INFO" => match serde_json::from_slice::<ServerInfo>(rest) {
                Ok(info) => Ok(ServerOp::Info(Box::new(info))),
                Err(e) => Err(ProtocolError(format!("INFO is not the JSON expected: {e}"))),
            },
            b"MSG" | b"HMSG" => {
                return self.parse_msg(upper.as_slice() == b"HMSG", rest.to_vec(), after_line);
            }
            _ => Err(ProtocolError(format!(
                "unknown op {:?}",
                String::from_utf8_lossy(&op[..op.len().min(16)])
            ))),
        };
        self.start += after_line;
        Some(result)
    }

    fn parse_msg(
        &mut self,
        with_headers: bool,
        args: Vec<u8>,
        after_line: usize,
    ) -> Option<Result<ServerOp, ProtocolError>> {
        let head = match MsgHead::parse(&args, with_headers) {
            Ok(h) => h,
            Err(e) => return Some(Err(e)),
        };
        if head.total > self.max_message {
            return Some(Err(ProtocolError(format!(
                "a message of {} bytes, past the {} taken",
                head.total, self.max_message
            ))));
        }
        let data = &self.buf[self.start + after_line..];
        if data.len() < head.total + 2 {
            return None;
        }
        if &data[head.total..head.total + 2] != b"\r\n" {
            return Some(Err(ProtocolError(
                "a message's payload is not followed by CRLF at its declared length".into(),
            )));
        }
        let headers = if let Some(detail) = head.malformed {
            Err(HeaderError {
                kind: HeaderErrorKind::Subject,
                line: 0,
                detail,
            })
        } else if head.header_len > MAX_HEADER_BLOCK {
            Err(HeaderError {
                kind: HeaderErrorKind::TooLarge,
                line: 0,
                detail: format!(
                    "{} bytes, past the {MAX_HEADER_BLOCK} read",
                    head.header_len
                ),
            })
        } else if with_headers {
            parse_headers(&data[..head.header_len])
        } else {
            Ok(Headers::default())
        };
        let payload = data[head.header_len..head.total].to_vec();
        self.start += after_line + head.total + 2;
        Some(Ok(ServerOp::Msg(Delivered {
            subject: head.subject,
            sid: head.sid,
            reply: head.reply,
            headers,
            payload,
        })))
    }
}

/// The arguments of a `MSG`/`HMSG` line.
struct MsgHead {
    subject: String,
    sid: u64,
    reply: Option<String>,
    header_len: usize,
    total: usize,
    /// The subject or reply is not text: the message is refused on its own.
    malformed: Option<String>,
}

impl MsgHead {
    fn parse(args: &[u8], with_headers: bool) -> Result<Self, ProtocolError> {
        let op = if with_headers { "HMSG" } else { "MSG" };
        let bad = |why: &str| ProtocolError(format!("{op} line: {why}"));
        let args: Vec<&[u8]> = args
            .split(|&b| b == b' ' || b == b'\t')
            .filter(|a| !a.is_empty())
            .collect();
        let counts = if with_headers { 2 } else { 1 };
        if args.len() != 2 + counts && args.len() != 3 + counts {
            return Err(bad("wrong number of arguments"));
        }
        // A subject is the publisher's bytes: one that is not text makes this
        // message malformed, never the stream.
        let text = |b: &[u8]| -> Option<String> {
            std::str::from_utf8(b)
                .ok()
                .filter(|s| !s.chars().any(char::is_control))
                .map(str::to_string)
        };
        let mut malformed = None;
        let number = |b: &[u8]| -> Result<usize, ProtocolError> {
            if b.is_empty() || b.len() > 12 || !b.iter().all(u8::is_ascii_digit) {
                return Err(bad("a byte count or sid is not a number"));
            }
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("a byte count or sid is not a number"))
        };
        let subject = text(args[0]).unwrap_or_else(|| {
            malformed = Some("the subject is not UTF-8 text without control characters".into());
            String::from_utf8_lossy(args[0]).replace(char::is_control, "\u{fffd}")
        });
        let sid = number(args[1])? as u64;
        // A reply that is not text is no reply: nothing is sent to it.
        let reply = if args.len() == 3 + counts {
            text(args[2]).or_else(|| {
                malformed =
                    Some("the reply subject is not UTF-8 text without control characters".into());
                None
            })
        } else {
            None
        };
        let n = args.len();
        let (header_len, total) = if with_headers {
            (number(args[n - 2])?, number(args[n - 1])?)
        } else {
            (0, number(args[n - 1])?)
        };
        if header_len > total {
            return Err(bad("header length past the total length"));
        }
        Ok(Self {
            subject,
            sid,
            reply,
            header_len,
            total,
            malformed,
        })
    }
}

fn find_crlf(data: &[u8]) -> Option<usize> {
    data.windows(2).position(|w| w == b"\r\n")
}

fn split_op(line: &[u8]) -> (&[u8], &[u8]) {
    match line.iter().position(|&b| b == b' ' || b == b'\t') {
        Some(i) => {
            let rest = &line[i..];
            let skip = rest
                .iter()
                .position(|&b| b != b' ' && b != b'\t')
                .unwrap_or(rest.len());
            (&line[..i], &rest[skip..])
        }
        None => (line, &[]),
    }
}

/// Whether `b` is an RFC 7230 token character (what a header name is made of).
pub fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Reads a header block strictly: `NATS/1.0` (optional status code and
/// description) CRLF, then `Name: value` CRLF lines, then an empty line ending
/// exactly at the block's end. CRLF only, no folding, token names, values
/// without control characters (tab allowed) and UTF-8.
pub fn parse_headers(block: &[u8]) -> Result<Headers, HeaderError> {
    let err = |kind, line, detail: String| HeaderError { kind, line, detail };
    let mut lines = Vec::new();
    let mut rest = block;
    let mut number = 0;
    loop {
        number += 1;
        let Some(end) = find_crlf(rest) else {
            if let Some(i) = rest.iter().position(|&b| b == b'\r' || b == b'\n') {
                return Err(err(
                    HeaderErrorKind::BareLineEnd,
                    number,
                    format!("a bare {} ends or splits a line", cr_or_lf(rest[i])),
                ));
            }
            return Err(err(
                HeaderErrorKind::Unterminated,
                number,
                "the block does not end with an empty line at its declared length".into(),
            ));
        };
        let line = &rest[..end];
        if let Some(i) = line.iter().position(|&b| b == b'\r' || b == b'\n') {
            return Err(err(
                HeaderErrorKind::BareLineEnd,
                number,
                format!("a bare {} ends or splits a line", cr_or_lf(line[i])),
            ));
        }
        rest = &rest[end + 2..];
        if line.is_empty() && number > 1 {
            if !rest.is_empty() {
                return Err(err(
                    HeaderErrorKind::Unterminated,
                    number,
                    format!(
                        "{} bytes after the empty line that ends the block",
                        rest.len()
                    ),
                ));
            }
            break;
        }
        lines.push(line);
    }
    let mut headers = status_line(lines[0])?;
    for (i, line) in lines[1..].iter().enumerate() {
        let number = i + 2;
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(err(
                HeaderErrorKind::Folded,
                number,
                "a line starts with a space or tab (folding is not allowed)".into(),
            ));
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(err(
                HeaderErrorKind::NoColon,
                number,
                "a line has no colon".into(),
            ));
        };
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| is_token_char(b)) {
            return Err(err(
                HeaderErrorKind::BadName,
                number,
                format!(
                    "the name {:?} is not an RFC 7230 token",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        let name = String::from_utf8_lossy(name).into_owned();
        let value = trim_ows(&line[colon + 1..]);
        if value.iter().any(|&b| is_control(b)) {
            return Err(err(
                HeaderErrorKind::ControlInValue,
                number,
                format!("the value of {name} has a control character"),
            ));
        }
        let Ok(value) = std::str::from_utf8(value) else {
            return Err(err(
                HeaderErrorKind::NotUtf8,
                number,
                format!("the value of {name} is not UTF-8"),
            ));
        };
        headers.pairs.push((name, value.to_string()));
    }
    Ok(headers)
}

fn cr_or_lf(b: u8) -> &'static str {
    if b == b'\r' { "CR" } else { "LF" }
}

fn is_control(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

fn status_line(line: &[u8]) -> Result<Headers, HeaderError> {
    let bad = |detail: &str| HeaderError {
        kind: HeaderErrorKind::StatusLine,
        line: 1,
        detail: detail.to_string(),
    };
    let Some(rest) = line.strip_prefix(b"NATS/1.0") else {
        return Err(bad("the block does not start with NATS/1.0"));
    };
    if rest.is_empty() {
        return Ok(Headers::default());
    }
    let Some(rest) = rest.strip_prefix(b" ") else {
        return Err(bad("NATS/1.0 is followed by something other than a space"));
    };
    let (code, description) = match rest.iter().position(|&b| b == b' ') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    if code.len() != 3 || !code.iter().all(u8::is_ascii_digit) {
        return Err(bad("the status code is not three digits"));
    }
    if description.iter().any(|&b| is_control(b)) {
        return Err(bad("the status description has a control character"));
    }
    let Ok(description) = std::str::from_utf8(description) else {
        return Err(HeaderError {
            kind: HeaderErrorKind::NotUtf8,
            line: 1,
            detail: "the status description is not UTF-8".into(),
        });
    };
    let code = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    Ok(Headers {
        status: Some(code),
        description: description.trim().to_string(),
        pairs: Vec::new(),
    })
}
