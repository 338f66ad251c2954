//! What a [`Connection`] does with what the server writes: `INFO` and the
//! handshake (TLS, CONNECT, the first PONG), `max_payload` and the servers it
//! learns, PONGs, delivered messages and replies; and a lost connection, with the
//! backoff before the next server is dialed.

use std::time::{Duration, Instant};

use super::super::encode::{self, Connect};
use super::super::parse::{Delivered, ServerInfo, ServerOp};
use super::{
    Auth, ConnEvent, Connection, MAX_SERVERS, MESSAGE_SLACK, PongFor, RequestId, ServerAddr, Sid,
    State,
};
use crate::io::RequestOutcome;

impl Connection {
    pub(super) fn handle_op(&mut self, now: Instant, op: ServerOp) {
        if let State::AwaitInfo { .. } = self.state {
            let ServerOp::Info(info) = op else {
                return self.lost(now, "the server's first op is not INFO".into(), true);
            };
            return self.handle_info(now, info);
        }
        match op {
            ServerOp::Info(info) => {
                if info.max_payload > 0 {
                    self.set_max_payload(info.max_payload);
                }
                self.learn_servers(&info);
            }
            ServerOp::Ping => self.out.extend_from_slice(encode::PONG),
            ServerOp::Pong => self.handle_pong(now),
            ServerOp::Ok => {}
            ServerOp::Err(text) => {
                self.last_error = Some(text.clone());
                self.events.push_back(ConnEvent::ServerError(text));
            }
            ServerOp::Msg(message) => self.handle_message(message),
        }
    }

    pub(super) fn set_max_payload(&mut self, max: usize) {
        self.max_payload = max;
        self.parser
            .set_max_message(max.saturating_add(MESSAGE_SLACK));
    }

    /// The cluster's other servers, from INFO's `connect_urls`: dialed in turn
    /// after the configured ones when a connection is lost (at most
    /// [`MAX_SERVERS`] in all).
    pub(super) fn learn_servers(&mut self, info: &ServerInfo) {
        let tls = self.config.servers[self.server].tls;
        for url in &info.connect_urls {
            if self.config.servers.len() >= MAX_SERVERS {
                return;
            }
            let Ok(mut addr) = ServerAddr::parse(url) else {
                continue;
            };
            addr.tls = tls;
            if !self
                .config
                .servers
                .iter()
                .any(|s| s.host == addr.host && s.port == addr.port)
            {
                self.config.servers.push(addr);
            }
        }
    }

    pub(super) fn handle_info(&mut self, now: Instant, info: Box<ServerInfo>) {
        if info.max_payload > 0 {
            self.set_max_payload(info.max_payload);
        }
        self.learn_servers(&info);
        let addr = &self.config.servers[self.server];
        let tls = info.tls_required || self.config.tls || addr.tls;
        if tls && !info.tls_required && !info.tls_available {
            return self.lost(now, "TLS is asked but the server offers none".into(), true);
        }
        if tls {
            if self.parser.buffered() > 0 {
                return self.lost(now, "the server wrote past INFO before TLS".into(), true);
            }
            let host = addr.host.clone();
            self.state = State::Upgrading {
                deadline: now + self.config.connect_timeout,
                info,
            };
            self.events.push_back(ConnEvent::UpgradeTls { host });
            return;
        }
        self.send_connect(now, info);
    }

    /// CONNECT, every subscription, the flushes waiting, then PING.
    pub(super) fn send_connect(&mut self, now: Instant, info: Box<ServerInfo>) {
        let tls = !matches!(self.state, State::AwaitInfo { .. });
        let mut fields = Connect {
            verbose: false,
            pedantic: false,
            tls_required: tls,
            name: self.config.name.clone(),
            lang: "rust-dagnats-leases",
            version: env!("CARGO_PKG_VERSION"),
            protocol: 1,
            echo: self.config.echo,
            headers: true,
            no_responders: true,
            ..Connect::default()
        };
        let nonce = info.nonce.clone().unwrap_or_default();
        match &self.config.auth {
            Auth::None => {}
            Auth::UserPassword { user, password } => {
                fields.user = Some(user.clone());
                fields.pass = Some(password.clone());
            }
            Auth::Token(token) => fields.auth_token = Some(token.clone()),
            Auth::Nkey { public, signer } => {
                fields.nkey = Some(public.clone());
                fields.sig = Some(signer.sign(nonce.as_bytes()));
            }
            Auth::Jwt { jwt, signer } => {
                fields.jwt = Some(jwt.clone());
                fields.sig = Some(signer.sign(nonce.as_bytes()));
            }
        }
        self.out.clear();
        self.out.extend_from_slice(&encode::connect(&fields));
        for (sid, sub) in self.subs.iter().filter(|(_, s)| !s.draining) {
            // Checked when first made.
            if let Ok(bytes) = encode::sub(&sub.subject, sub.queue.as_deref(), *sid) {
                self.out.extend_from_slice(&bytes);
            }
        }
        self.pongs.clear();
        self.pongs.push_back(PongFor::Handshake);
        self.out.extend_from_slice(encode::PING);
        for flush in std::mem::take(&mut self.unsent_flushes) {
            self.pongs.push_back(PongFor::Flush(flush));
            self.out.extend_from_slice(encode::PING);
        }
        let pending = std::mem::take(&mut self.pending);
        self.out.extend_from_slice(&pending);
        self.pings_out = 0;
        self.state = State::AwaitPong {
            deadline: now + self.config.connect_timeout,
            info,
        };
    }

    pub(super) fn handle_pong(&mut self, now: Instant) {
        self.pings_out = 0;
        match self.pongs.pop_front() {
            Some(PongFor::Handshake) => {
                if let State::AwaitPong { info, .. } = &self.state {
                    let info = info.clone();
                    self.failures = 0;
                    self.ever_connected = true;
                    self.last_error = None;
                    self.state = State::Connected {
                        next_ping: now + self.config.ping_interval,
                    };
                    self.events.push_back(ConnEvent::Connected(info));
                }
            }
            Some(PongFor::Flush(id)) => self.events.push_back(ConnEvent::Flushed(id)),
            Some(PongFor::Drain(sid)) => {
                self.subs.remove(&sid);
                self.events.push_back(ConnEvent::Drained(sid));
            }
            Some(PongFor::Keepalive) | None => {}
        }
    }

    pub(super) fn handle_message(&mut self, message: Delivered) {
        if Some(message.sid) == self.inbox_sid {
            let token = message
                .subject
                .rsplit('.')
                .next()
                .and_then(|t| t.parse::<u64>().ok());
            if let Some(token) = token
                && self.requests.remove(&token).is_some()
            {
                let outcome = match message.headers {
                    Err(e) => RequestOutcome::Failed(format!("the reply's {e}")),
                    Ok(h) if h.status == Some(503) && message.payload.is_empty() => {
                        RequestOutcome::NoResponders
                    }
                    Ok(h) => RequestOutcome::Reply {
                        headers: h.pairs,
                        payload: message.payload,
                    },
                };
                self.events.push_back(ConnEvent::Replied {
                    id: RequestId(token),
                    outcome,
                });
            }
            return;
        }
        if self.subs.contains_key(&message.sid) {
            self.events.push_back(ConnEvent::Message {
                sid: message.sid,
                message,
            });
        }
    }

    /// Drops the socket (when `close`) and waits out the backoff to dial again.
    pub(super) fn lost(&mut self, now: Instant, why: String, close: bool) {
        if close || !matches!(self.state, State::Dialing { .. }) {
            self.events.push_back(ConnEvent::CloseSocket);
        }
        self.failures = self.failures.saturating_add(1);
        self.events.push_back(ConnEvent::Disconnected {
            why,
            ever_connected: self.ever_connected,
            failures: self.failures,
        });
        self.out.clear();
        self.parser.reset();
        for pong in self.pongs.drain(..) {
            if let PongFor::Flush(id) = pong {
                self.unsent_flushes.push(id);
            }
        }
        // The server forgot the drained subscriptions with the socket.
        let drained: Vec<Sid> = self
            .subs
            .iter()
            .filter(|(_, s)| s.draining)
            .map(|(sid, _)| *sid)
            .collect();
        for sid in drained {
            self.subs.remove(&sid);
            self.events.push_back(ConnEvent::Drained(sid));
        }
        self.unsent_flushes.sort();
        self.server = (self.server + 1) % self.config.servers.len();
        self.state = State::Idle {
            at: now + self.backoff(),
        };
    }

    /// The wait before the next dial: doubling from `reconnect_min` per failure
    /// in a row, up to `reconnect_max`.
    pub(super) fn backoff(&self) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(20);
        self.config
            .reconnect_min
            .saturating_mul(1 << doublings)
            .min(self.config.reconnect_max)
    }
}
