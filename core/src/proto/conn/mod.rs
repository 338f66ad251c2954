//! One client connection to NATS as a machine: the handshake, keepalive,
//! subscriptions kept across reconnects, reconnection with backoff (to the
//! configured servers and the cluster's others from `INFO`'s `connect_urls`), the
//! request helper, and `INFO`'s `max_payload`. The adapter dials, upgrades to TLS, reads
//! and writes bytes when told; every decision (when to dial which server, when a
//! connection is stale, what a message is) is here.
//!
//! Inputs: [`Connection::handle_connected`] (the dial succeeded),
//! [`Connection::handle_dial_failed`], [`Connection::handle_tls_ready`],
//! [`Connection::handle_read`], [`Connection::handle_closed`],
//! [`Connection::handle_timeout`]; and the user's commands
//! ([`Connection::subscribe`], [`Connection::publish`], [`Connection::request`],
//! [`Connection::flush`], [`Connection::close`], ...). Outputs:
//! [`Connection::poll_transmit`] (bytes to write), [`Connection::poll_event`],
//! [`Connection::poll_timeout`].
//!
//! Files: this one holds the connection's state, its inputs, the user's commands
//! and its outputs; `config.rs` how it is set up (servers, authentication,
//! bounds); `server.rs` what it does with what the server writes (the handshake,
//! PONGs, messages) and with a lost connection (the backoff, the next server).

mod config;
mod server;

pub use config::{Auth, ConnectionConfig, NonceSigner, ServerAddr};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::time::Instant;

use super::encode::{self, EncodeError};
use super::parse::{Delivered, Parser, ServerInfo};
use crate::io::RequestOutcome;

/// The largest message read before the server's `INFO` says its own bound.
const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;
/// What a delivered message may carry past `max_payload` (its header block).
const MESSAGE_SLACK: usize = 64 * 1024;
/// The most servers dialed in turn, configured and learnt from INFO together.
pub const MAX_SERVERS: usize = 64;

/// Names a subscription.
pub type Sid = u64;

/// Names a request of the request helper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Names a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlushId(pub u64);

/// Why a publish or request was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// What would be written is not valid.
    Encode(EncodeError),
    /// Disconnected, and the bytes kept for the reconnect are at their bound.
    Full,
    /// The connection is closed.
    Closed,
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Encode(e) => e.fmt(f),
            Self::Full => {
                f.write_str("disconnected, and the bytes kept for the reconnect are full")
            }
            Self::Closed => f.write_str("the connection is closed"),
        }
    }
}

impl std::error::Error for SendError {}

impl From<EncodeError> for SendError {
    fn from(e: EncodeError) -> Self {
        Self::Encode(e)
    }
}

/// What the connection reports.
#[derive(Debug, Clone, PartialEq)]
pub enum ConnEvent {
    /// Dial `servers[server]` and say [`Connection::handle_connected`] or
    /// [`Connection::handle_dial_failed`].
    Dial {
        /// Index into the config's servers.
        server: usize,
        /// Where.
        addr: ServerAddr,
    },
    /// Upgrade the socket to TLS for `host`, then [`Connection::handle_tls_ready`]
    /// (or [`Connection::handle_closed`] if it fails).
    UpgradeTls {
        /// The name the certificate must carry.
        host: String,
    },
    /// Drop the socket (and any dial under way); nothing more is read from it.
    CloseSocket,
    /// The handshake ended with the server's PONG: subscriptions are in place.
    Connected(Box<ServerInfo>),
    /// The connection was lost or a dial failed; a dial follows after the backoff.
    Disconnected {
        /// Why.
        why: String,
        /// Whether a connection was ever made.
        ever_connected: bool,
        /// Dials failed in a row.
        failures: u32,
    },
    /// A message on subscription `sid` (its header block may carry an error).
    Message {
        /// The subscription.
        sid: Sid,
        /// The message.
        message: Delivered,
    },
    /// A request's reply (a malformed header block is `Failed`, naming it).
    Replied {
        /// The request.
        id: RequestId,
        /// What came of it.
        outcome: RequestOutcome,
    },
    /// Every byte asked before the flush reached the server.
    Flushed(FlushId),
    /// A drained subscription's last message was delivered ([`Connection::drain`]).
    Drained(Sid),
    /// The server's `-ERR` (a permissions violation, or why it closes).
    ServerError(String),
    /// Closed for good ([`Connection::close`]).
    Closed,
}

/// What a PONG answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PongFor {
    Handshake,
    Keepalive,
    Flush(FlushId),
    Drain(Sid),
}

#[derive(Debug, Clone)]
enum State {
    /// Waiting to dial at `at`.
    Idle {
        at: Instant,
    },
    Dialing {
        deadline: Instant,
    },
    AwaitInfo {
        deadline: Instant,
    },
    Upgrading {
        deadline: Instant,
        info: Box<ServerInfo>,
    },
    AwaitPong {
        deadline: Instant,
        info: Box<ServerInfo>,
    },
    Connected {
        next_ping: Instant,
    },
    Closed,
}

#[derive(Debug, Clone)]
struct Subscription {
    subject: String,
    queue: Option<String>,
    /// Unsubscribed, its messages still delivered until the server has read the
    /// UNSUB ([`Connection::drain`]).
    draining: bool,
}

/// The connection machine.
#[derive(Debug)]
pub struct Connection {
    config: ConnectionConfig,
    state: State,
    parser: Parser,
    server: usize,
    failures: u32,
    ever_connected: bool,
    max_payload: usize,
    subs: BTreeMap<Sid, Subscription>,
    next_sid: Sid,
    inbox_sid: Option<Sid>,
    requests: HashMap<u64, ()>,
    next_request: u64,
    next_flush: u64,
    /// Flushes asked and not yet sent on this socket.
    unsent_flushes: Vec<FlushId>,
    pongs: VecDeque<PongFor>,
    pings_out: u32,
    /// Bytes for the socket now.
    out: Vec<u8>,
    /// Publishes made while no socket takes them, for the next connection.
    pending: Vec<u8>,
    last_error: Option<String>,
    events: VecDeque<ConnEvent>,
}

impl Connection {
    /// A connection that dials its first server at once.
    pub fn new(config: ConnectionConfig, now: Instant) -> Self {
        let mut conn = Self {
            config,
            state: State::Idle { at: now },
            parser: Parser::new(DEFAULT_MAX_PAYLOAD + MESSAGE_SLACK),
            server: 0,
            failures: 0,
            ever_connected: false,
            max_payload: DEFAULT_MAX_PAYLOAD,
            subs: BTreeMap::new(),
            next_sid: 1,
            inbox_sid: None,
            requests: HashMap::new(),
            next_request: 1,
            next_flush: 1,
            unsent_flushes: Vec::new(),
            pongs: VecDeque::new(),
            pings_out: 0,
            out: Vec::new(),
            pending: Vec::new(),
            last_error: None,
            events: VecDeque::new(),
        };
        if conn.config.servers.is_empty() {
            conn.state = State::Closed;
            conn.events.push_back(ConnEvent::Disconnected {
                why: "no server to dial".to_string(),
                ever_connected: false,
                failures: 1,
            });
            conn.events.push_back(ConnEvent::Closed);
        } else {
            conn.handle_timeout(now);
        }
        conn
    }

    /// Whether the handshake is done and the socket is up.
    pub fn is_connected(&self) -> bool {
        matches!(self.state, State::Connected { .. })
    }

    /// Whether [`Connection::close`] was called.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// The server's `max_payload` (1 MiB until INFO says).
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Whether the socket takes ops now (CONNECT was written).
    fn live(&self) -> bool {
        matches!(
            self.state,
            State::AwaitPong { .. } | State::Connected { .. }
        )
    }

    /// The dial succeeded: the server's INFO comes next.
    pub fn handle_connected(&mut self, now: Instant) {
        if let State::Dialing { .. } = self.state {
            self.parser.reset();
            self.state = State::AwaitInfo {
                deadline: now + self.config.connect_timeout,
            };
        }
    }

    /// The dial failed.
    pub fn handle_dial_failed(&mut self, now: Instant, why: &str) {
        if let State::Dialing { .. } = self.state {
            self.lost(now, format!("dial failed: {why}"), false);
        }
    }

    /// The TLS upgrade asked ([`ConnEvent::UpgradeTls`]) is done.
    pub fn handle_tls_ready(&mut self, now: Instant) {
        if let State::Upgrading { info, .. } = &self.state {
            let info = info.clone();
            self.send_connect(now, info);
        }
    }

    /// The socket closed or failed (a read or write error, or the TLS upgrade).
    pub fn handle_closed(&mut self, now: Instant, why: &str) {
        if matches!(self.state, State::Idle { .. } | State::Closed) {
            return;
        }
        let why = match self.last_error.take() {
            Some(err) => format!("{why} (the server said: {err})"),
            None => why.to_string(),
        };
        self.lost(now, why, false);
    }

    /// Bytes read from the socket.
    pub fn handle_read(&mut self, now: Instant, bytes: &[u8]) {
        if !matches!(
            self.state,
            State::AwaitInfo { .. } | State::AwaitPong { .. } | State::Connected { .. }
        ) {
            return;
        }
        self.parser.feed(bytes);
        while let Some(op) = self.parser.next_op() {
            match op {
                Ok(op) => self.handle_op(now, op),
                Err(e) => return self.lost(now, e.to_string(), true),
            }
            if !matches!(
                self.state,
                State::AwaitInfo { .. } | State::AwaitPong { .. } | State::Connected { .. }
            ) {
                return;
            }
        }
    }

    /// Acts on the deadline [`Connection::poll_timeout`] gave.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &mut self.state {
            State::Idle { at } if *at <= now => {
                self.state = State::Dialing {
                    deadline: now + self.config.connect_timeout,
                };
                self.events.push_back(ConnEvent::Dial {
                    server: self.server,
                    addr: self.config.servers[self.server].clone(),
                });
            }
            State::Dialing { deadline } if *deadline <= now => {
                self.lost(now, "dial timed out".into(), true)
            }
            State::AwaitInfo { deadline }
            | State::Upgrading { deadline, .. }
            | State::AwaitPong { deadline, .. }
                if *deadline <= now =>
            {
                self.lost(now, "the handshake timed out".into(), true)
            }
            State::Connected { next_ping } if *next_ping <= now => {
                if self.pings_out >= self.config.max_pings_out {
                    let why = format!("stale: {} PINGs unanswered", self.pings_out);
                    return self.lost(now, why, true);
                }
                *next_ping = now + self.config.ping_interval;
                self.pings_out += 1;
                self.pongs.push_back(PongFor::Keepalive);
                self.out.extend_from_slice(encode::PING);
            }
            _ => {}
        }
    }

    /// Subscribes to `subject` (in `queue`); kept and sent again after a reconnect.
    pub fn subscribe(&mut self, subject: &str, queue: Option<&str>) -> Result<Sid, SendError> {
        if self.is_closed() {
            return Err(SendError::Closed);
        }
        let sid = self.next_sid;
        let bytes = encode::sub(subject, queue, sid)?;
        self.next_sid += 1;
        self.subs.insert(
            sid,
            Subscription {
                subject: subject.to_string(),
                queue: queue.map(str::to_string),
                draining: false,
            },
        );
        if self.live() {
            self.out.extend_from_slice(&bytes);
        }
        Ok(sid)
    }

    /// Unsubscribes `sid`: no message of it is reported after this.
    pub fn unsubscribe(&mut self, sid: Sid) {
        if self.subs.remove(&sid).is_some() && self.live() {
            self.out.extend_from_slice(&encode::unsub(sid));
        }
    }

    /// Unsubscribes `sid` and keeps delivering what the server sent before it read
    /// the UNSUB: [`ConnEvent::Drained`] says the last one came (at once while
    /// disconnected).
    pub fn drain(&mut self, sid: Sid) {
        let live = self.live();
        let Some(sub) = self.subs.get_mut(&sid) else {
            return;
        };
        if sub.draining {
            return;
        }
        if live {
            sub.draining = true;
            self.out.extend_from_slice(&encode::unsub(sid));
            self.pongs.push_back(PongFor::Drain(sid));
            self.out.extend_from_slice(encode::PING);
        } else {
            self.subs.remove(&sid);
            self.events.push_back(ConnEvent::Drained(sid));
        }
    }

    /// Publishes, checked; while disconnected, kept for the next connection up to
    /// `max_pending`.
    pub fn publish(
        &mut self,
        subject: &str,
        reply: Option<&str>,
        headers: &[(&str, &str)],
        payload: &[u8],
    ) -> Result<(), SendError> {
        if self.is_closed() {
            return Err(SendError::Closed);
        }
        let bytes = encode::publish(subject, reply, headers, payload, self.max_payload)?;
        if self.live() {
            self.out.extend_from_slice(&bytes);
        } else if self.pending.len() + bytes.len() > self.config.max_pending {
            return Err(SendError::Full);
        } else {
            self.pending.extend_from_slice(&bytes);
        }
        Ok(())
    }

    /// Sends a request whose reply comes on the connection's one wildcard inbox
    /// subscription (made with the first request); its outcome is a
    /// [`ConnEvent::Replied`]. No timer: the caller keeps the deadline and
    /// [`Connection::cancel_request`]s.
    pub fn request(
        &mut self,
        subject: &str,
        headers: &[(&str, &str)],
        payload: &[u8],
    ) -> Result<RequestId, SendError> {
        if self.inbox_sid.is_none() {
            let sid = self.subscribe(&format!("{}.*", self.config.inbox), None)?;
            self.inbox_sid = Some(sid);
        }
        let token = self.next_request;
        let reply = format!("{}.{token}", self.config.inbox);
        self.publish(subject, Some(&reply), headers, payload)?;
        self.next_request += 1;
        self.requests.insert(token, ());
        Ok(RequestId(token))
    }

    /// Forgets a request: its reply, if one comes, is dropped.
    pub fn cancel_request(&mut self, id: RequestId) {
        self.requests.remove(&id.0);
    }

    /// Requests waiting for their reply.
    pub fn requests_waiting(&self) -> usize {
        self.requests.len()
    }

    /// Asks for a [`ConnEvent::Flushed`] once everything written before it has
    /// reached the server (a PING's PONG), after a reconnect if need be.
    pub fn flush(&mut self) -> FlushId {
        let id = FlushId(self.next_flush);
        self.next_flush += 1;
        if self.live() {
            self.pongs.push_back(PongFor::Flush(id));
            self.out.extend_from_slice(encode::PING);
        } else {
            self.unsent_flushes.push(id);
        }
        id
    }

    /// Closes for good: the socket is dropped and nothing more is dialed.
    pub fn close(&mut self) {
        if self.is_closed() {
            return;
        }
        self.state = State::Closed;
        self.out.clear();
        self.events.push_back(ConnEvent::CloseSocket);
        self.events.push_back(ConnEvent::Closed);
    }

    /// Bytes to write to the socket, in order.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        if self.out.is_empty()
            || !matches!(
                self.state,
                State::AwaitPong { .. } | State::Connected { .. }
            )
        {
            return None;
        }
        Some(std::mem::take(&mut self.out))
    }

    /// The next thing that happened.
    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// When to call [`Connection::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Idle { at } => Some(*at),
            State::Dialing { deadline }
            | State::AwaitInfo { deadline }
            | State::Upgrading { deadline, .. }
            | State::AwaitPong { deadline, .. } => Some(*deadline),
            State::Connected { next_ping } => Some(*next_ping),
            State::Closed => None,
        }
    }
}
