//! Writing client ops: `CONNECT`, `PING`, `PONG`, `SUB`, `UNSUB`, `PUB`, `HPUB`.
//! Every subject, queue group and header written is checked first: what this
//! client writes is as strict as what it reads.

use std::fmt;

use serde::Serialize;

use super::parse::is_token_char;

/// Why an op was not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// A subject is empty, has an empty token, whitespace or a control character,
    /// or a wildcard where a literal subject is needed.
    Subject(String),
    /// A queue group name is empty or has whitespace or a control character.
    Queue(String),
    /// A header name is not an RFC 7230 token.
    HeaderName(String),
    /// A header value has a control character (tab excepted).
    HeaderValue(String),
    /// Headers and payload together are past the server's `max_payload`.
    TooLarge {
        /// Headers and payload.
        size: usize,
        /// The server's bound.
        max: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Subject(s) => write!(f, "the subject {s:?} is not a valid NATS subject"),
            Self::Queue(q) => write!(f, "the queue group {q:?} is not valid"),
            Self::HeaderName(n) => write!(f, "the header name {n:?} is not an RFC 7230 token"),
            Self::HeaderValue(n) => write!(f, "the value of header {n:?} has a control character"),
            Self::TooLarge { size, max } => {
                write!(
                    f,
                    "a message of {size} bytes is past the server's max_payload {max}"
                )
            }
        }
    }
}

impl std::error::Error for EncodeError {}

/// Checks a subject: non-empty tokens of printable non-space characters; with
/// `wildcards`, `*` as a whole token and `>` as the whole last token.
pub fn check_subject(subject: &str, wildcards: bool) -> Result<(), EncodeError> {
    let bad = || EncodeError::Subject(subject.to_string());
    if subject.is_empty() {
        return Err(bad());
    }
    let tokens: Vec<&str> = subject.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad());
        }
        let wild = *token == "*" || *token == ">";
        if wild && (!wildcards || (*token == ">" && i + 1 != tokens.len())) {
            return Err(bad());
        }
    }
    Ok(())
}

fn check_queue(queue: &str) -> Result<(), EncodeError> {
    if queue.is_empty() || queue.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(EncodeError::Queue(queue.to_string()));
    }
    Ok(())
}

/// Checks one header: a token name and a value with no control character but tab.
pub fn check_header(name: &str, value: &str) -> Result<(), EncodeError> {
    if name.is_empty() || !name.bytes().all(is_token_char) {
        return Err(EncodeError::HeaderName(name.to_string()));
    }
    if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(EncodeError::HeaderValue(name.to_string()));
    }
    Ok(())
}

/// The fields of `CONNECT`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Connect {
    /// Always false: no `+OK` per op.
    pub verbose: bool,
    /// Always false.
    pub pedantic: bool,
    /// Whether the connection is TLS.
    pub tls_required: bool,
    /// The connection's name, shown by the server.
    pub name: String,
    /// This client.
    pub lang: &'static str,
    /// Its version.
    pub version: &'static str,
    /// Protocol 1: the server may send INFO updates.
    pub protocol: u8,
    /// Whether the server sends this connection its own messages back.
    pub echo: bool,
    /// Headers on.
    pub headers: bool,
    /// A request nobody subscribes to is answered by a 503 status.
    pub no_responders: bool,
    /// User (with `pass`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass: Option<String>,
    /// Token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_token: Option<String>,
    /// Nkey public key (with `sig`, unless a JWT names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nkey: Option<String>,
    /// The user JWT.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt: Option<String>,
    /// The signature of INFO's nonce, base64url without padding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sig: Option<String>,
}

/// `CONNECT {json}` CRLF.
pub fn connect(fields: &Connect) -> Vec<u8> {
    let json = serde_json::to_string(fields).unwrap_or_else(|_| "{}".to_string());
    format!("CONNECT {json}\r\n").into_bytes()
}

/// `PING` CRLF.
pub const PING: &[u8] = b"PING\r\n";
/// `PONG` CRLF.
pub const PONG: &[u8] = b"PONG\r\n";

/// `SUB subject [queue] sid` CRLF.
pub fn sub(subject: &str, queue: Option<&str>, sid: u64) -> Result<Vec<u8>, EncodeError> {
    check_subject(subject, true)?;
    match queue {
        Some(q) => {
            check_queue(q)?;
            Ok(format!("SUB {subject} {q} {sid}\r\n").into_bytes())
        }
        None => Ok(format!("SUB {subject} {sid}\r\n").into_bytes()),
    }
}

/// `UNSUB sid` CRLF.
pub fn unsub(sid: u64) -> Vec<u8> {
    format!("UNSUB {sid}\r\n").into_bytes()
}

/// `PUB` (no headers) or `HPUB`, checked, with its payload, bounded by `max_payload`.
pub fn publish(
    subject: &str,
    reply: Option<&str>,
    headers: &[(&str, &str)],
    payload: &[u8],
    max_payload: usize,
) -> Result<Vec<u8>, EncodeError> {
    check_subject(subject, false)?;
    if let Some(reply) = reply {
        check_subject(reply, false)?;
    }
    let mut block = Vec::new();
    if !headers.is_empty() {
        block.extend_from_slice(b"NATS/1.0\r\n");
        for (name, value) in headers {
            check_header(name, value)?;
            block.extend_from_slice(name.as_bytes());
            block.extend_from_slice(b": ");
            block.extend_from_slice(value.as_bytes());
            block.extend_from_slice(b"\r\n");
        }
        block.extend_from_slice(b"\r\n");
    }
    let size = block.len() + payload.len();
    if size > max_payload {
        return Err(EncodeError::TooLarge {
            size,
            max: max_payload,
        });
    }
    let reply = reply.map(|r| format!(" {r}")).unwrap_or_default();
    let mut out = if headers.is_empty() {
        format!("PUB {subject}{reply} {size}\r\n").into_bytes()
    } else {
        format!("HPUB {subject}{reply} {} {size}\r\n", block.len()).into_bytes()
    };
    out.extend_from_slice(&block);
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    Ok(out)
}
