//! Where the service may publish a reply: only to a reply inbox.
//!
//! A reply subject is whatever the requester wrote. A responder that answers
//! blindly publishes with its own permissions wherever it was pointed: at
//! `$KV.leases.<key>` (a record that never expires, a key out of service for good)
//! or at the JetStream API (`$JS.API.STREAM.PURGE.KV_leases`, read as a purge
//! request on nats-server 2.11). So every reply the service sends, the five
//! endpoints' and the micro service's `$SRV` ones, goes out only when its subject
//! is a reply inbox: it starts with `_INBOX.` (the clients' default), `_R_.` (what
//! the server rewrites a reply to across an account import; no client may use it
//! itself) or a prefix the operator adds. A request whose reply is anything else
//! is not run at all: an answer nobody may receive must not change a lease either.
//!
//! [`ReplyScope`] is the rule; [`DropLog`] keeps its log lines to one per
//! interval, so a flood of steered requests cannot flood the log.

use std::time::{Duration, Instant};

/// The reply prefixes every service accepts: async-nats', nats.go's and
/// nats-py's default inbox prefix, and the server's own for replies across an
/// account import.
pub const DEFAULT_REPLY_PREFIXES: [&str; 2] = ["_INBOX.", "_R_."];

/// The longest reply subject accepted, in bytes: far above any inbox a client
/// library makes (async-nats': `_INBOX.` + 22 + `.` + a counter).
pub const MAX_REPLY_LEN: usize = 512;

/// Subjects no operator prefix may reach: the server's and JetStream's own
/// (`$`), the bucket, the lease API and the change events and owner inboxes.
const PROTECTED_PREFIXES: [&str; 3] = ["$", "api.", "dagnats."];

/// Why a reply subject was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The request carried no reply subject: nobody asked for an answer.
    Missing,
    /// The subject does not start with an accepted inbox prefix.
    NotAnInbox,
    /// An inbox prefix, but not a subject a reply can go to: an empty token, a
    /// wildcard, a space or a control character, or longer than [`MAX_REPLY_LEN`].
    Malformed,
}

impl DropReason {
    /// The label of the refusal metric and log line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::NotAnInbox => "not_an_inbox",
            Self::Malformed => "malformed",
        }
    }
}

/// An operator prefix that cannot be accepted, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyPrefixError(pub String);

impl std::fmt::Display for ReplyPrefixError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReplyPrefixError {}

/// The reply prefixes a service accepts. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyScope {
    prefixes: Vec<String>,
}

impl Default for ReplyScope {
    fn default() -> Self {
        Self {
            prefixes: DEFAULT_REPLY_PREFIXES.map(String::from).to_vec(),
        }
    }
}

impl ReplyScope {
    /// The defaults and `extra` prefixes (a client's custom inbox prefix, such as
    /// `_INBOX_billing.`). Each must be one or more literal tokens ending in `.`,
    /// and must not reach the server's, the bucket's or the lease API's subjects.
    pub fn with_prefixes<S: AsRef<str>>(
        extra: impl IntoIterator<Item = S>,
    ) -> Result<Self, ReplyPrefixError> {
        let mut scope = Self::default();
        for prefix in extra {
            let prefix = prefix.as_ref();
            check_prefix(prefix)?;
            if !scope.prefixes.iter().any(|p| p == prefix) {
                scope.prefixes.push(prefix.to_string());
            }
        }
        Ok(scope)
    }

    /// The accepted prefixes, defaults first.
    pub fn prefixes(&self) -> &[String] {
        &self.prefixes
    }

    /// Whether a reply may go to `reply`.
    pub fn check(&self, reply: Option<&str>) -> Result<(), DropReason> {
        let reply = reply.ok_or(DropReason::Missing)?;
        let rest = self
            .prefixes
            .iter()
            .find_map(|p| reply.strip_prefix(p.as_str()))
            .ok_or(DropReason::NotAnInbox)?;
        if reply.len() > MAX_REPLY_LEN || !is_literal_subject(rest) {
            return Err(DropReason::Malformed);
        }
        Ok(())
    }
}

fn check_prefix(prefix: &str) -> Result<(), ReplyPrefixError> {
    let Some(tokens) = prefix.strip_suffix('.') else {
        return Err(ReplyPrefixError(format!(
            "reply prefix {prefix:?} must end with '.' (a whole subject token, as in _INBOX_billing.)"
        )));
    };
    if !is_literal_subject(tokens) {
        return Err(ReplyPrefixError(format!(
            "reply prefix {prefix:?} must be literal subject tokens: no empty token, wildcard, space or control character"
        )));
    }
    if let Some(p) = PROTECTED_PREFIXES.iter().find(|p| prefix.starts_with(**p)) {
        return Err(ReplyPrefixError(format!(
            "reply prefix {prefix:?} reaches subjects starting {p:?}, which replies must never reach"
        )));
    }
    Ok(())
}

/// A client's reply-inbox prefix as given (`--inbox-prefix _INBOX.a1`, with or
/// without the trailing `.`), in the form async-nats' `custom_inbox_prefix`
/// takes: literal tokens, no trailing `.`. It must not reach the server's, the
/// bucket's, the lease API's or the import replies' subjects (`_R_.`). A prefix
/// under `_INBOX.` (such as `_INBOX.a1`) is one the service answers by default;
/// another needs `serve --reply-prefix`.
pub fn client_inbox_prefix(given: &str) -> Result<String, ReplyPrefixError> {
    let prefix = given.strip_suffix('.').unwrap_or(given);
    check_prefix(&format!("{prefix}."))?;
    if prefix == "_R_" || prefix.starts_with("_R_.") {
        return Err(ReplyPrefixError(format!(
            "inbox prefix {given:?} is the server's own for replies across an import"
        )));
    }
    Ok(prefix.to_string())
}

/// One or more non-empty literal tokens: no `*` or `>` token, no whitespace or
/// control character anywhere.
fn is_literal_subject(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|t| !t.is_empty() && t != "*" && t != ">" && !t.chars().any(bad_char))
}

fn bad_char(c: char) -> bool {
    c.is_whitespace() || c.is_control()
}

/// One log line per `every` about refused replies, however many are refused:
/// [`DropLog::handle_dropped`] says when to write one and how many it covers.
#[derive(Debug, Clone)]
pub struct DropLog {
    every: Duration,
    next_at: Option<Instant>,
    unlogged: u64,
}

impl DropLog {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            next_at: None,
            unlogged: 0,
        }
    }

    /// A reply was refused at `now`. `Some(n)`: write a line now, covering `n`
    /// refusals (this one and those not logged since the last line).
    pub fn handle_dropped(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        if self.next_at.is_some_and(|at| now < at) {
            return None;
        }
        self.next_at = Some(now + self.every);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// The default interval between refusal log lines.
pub const DROP_LOG_EVERY: Duration = Duration::from_secs(10);
