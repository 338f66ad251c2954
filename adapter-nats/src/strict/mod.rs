//! The strict NATS connection: the core's [`Connection`](dagnats_leases_core::proto::Connection) machine
//! ([`dagnats_leases_core::proto`]) driven over a socket of the [`Runtime`]'s
//! (TCP from [`Runtime::connect_tcp`], TLS with futures-rustls over it). It carries
//! what callers and owners write (the service's requests, its replies, its
//! forwards), so a malformed header block costs only its own message: the
//! subscriber gets it with the error, a request gets `Failed` naming it, and the
//! connection serves on. Every decision is the machine's; this only dials,
//! upgrades, reads, writes and arms one timer.

mod auth;
mod driver;
mod tls;

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use dagnats_leases_core::RequestOutcome;
use dagnats_leases_core::proto::{Auth, ConnectionConfig, Delivered, SendError, ServerAddr, Sid};
use futures::Stream;
use tokio::sync::{mpsc, oneshot};

use crate::runtime::Runtime;
use crate::{Error, ErrorKind};

pub use dagnats_leases_core::proto::ServerInfo;

/// How the strict connection reaches and authenticates to NATS: the options of
/// `serve` (`--nats-url`, `--user`/`--password`, `--token`, `--nkey`, `--creds`,
/// `--tls-ca`, `--tls-cert`/`--tls-key`).
#[derive(Debug, Clone, Default)]
pub struct StrictOptions {
    /// Server URL(s), comma-separated (`nats://`, `tls://`, `host:port`).
    pub urls: String,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// Token.
    pub token: Option<String>,
    /// Nkey seed.
    pub nkey: Option<String>,
    /// Credentials file (JWT and nkey seed).
    pub creds: Option<PathBuf>,
    /// CA certificate file (turns TLS on).
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (with `tls_key`): mTLS.
    pub tls_cert: Option<PathBuf>,
    /// Client key.
    pub tls_key: Option<PathBuf>,
    /// Connection name shown by the server.
    pub name: Option<String>,
    /// The reply inbox prefix (`_INBOX` when unset).
    pub inbox_prefix: Option<String>,
    /// Bound on a dial and each handshake step (2 s when unset).
    pub connect_timeout: Option<Duration>,
    /// Keepalive PING interval (30 s when unset).
    pub ping_interval: Option<Duration>,
    /// Where this connection counts itself down and up again (the service's
    /// readiness).
    pub links_down: Option<crate::links::LinksDown>,
}

impl StrictOptions {
    /// Options for `urls` with no credentials.
    pub fn new(urls: impl Into<String>) -> Self {
        Self {
            urls: urls.into(),
            ..Self::default()
        }
    }

    /// The machine's config and the TLS config, checked.
    fn configs(&self) -> Result<(ConnectionConfig, Option<TlsSettings>), Error> {
        let config_err = |why: String| Error::new(ErrorKind::Config, why);
        let servers = self
            .urls
            .split(',')
            .filter(|u| !u.trim().is_empty())
            .map(ServerAddr::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(config_err)?;
        if servers.is_empty() {
            return Err(config_err("no NATS server URL".into()));
        }
        let prefix = self.inbox_prefix.as_deref().unwrap_or("_INBOX");
        let inbox = format!("{}.{}", prefix.trim_end_matches('.'), nuid::next());
        let mut config = ConnectionConfig::new(servers, inbox);
        if let Some(name) = &self.name {
            config.name = name.clone();
        }
        if let Some(t) = self.connect_timeout {
            config.connect_timeout = t;
        }
        if let Some(t) = self.ping_interval {
            config.ping_interval = t;
        }
        config.auth = match (&self.user, &self.password) {
            (Some(user), Some(password)) => Auth::UserPassword {
                user: user.clone(),
                password: password.clone(),
            },
            (None, None) => Auth::None,
            _ => return Err(config_err("--user and --password go together".into())),
        };
        if let Some(token) = &self.token {
            config.auth = Auth::Token(token.clone());
        }
        if let Some(seed) = &self.nkey {
            let (public, signer) = auth::signer(seed)?;
            config.auth = Auth::Nkey { public, signer };
        }
        if let Some(path) = &self.creds {
            let (jwt, seed) = auth::read_creds(path)?;
            let (_, signer) = auth::signer(&seed)?;
            config.auth = Auth::Jwt { jwt, signer };
        }
        let cert_key = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            (None, None) => None,
            _ => return Err(config_err("--tls-cert and --tls-key go together".into())),
        };
        config.tls = self.tls_ca.is_some() || cert_key.is_some();
        // Without a CA or client certificate, TLS is made (with the system's
        // roots) only if a server requires it.
        let tls = if config.tls {
            Some(TlsSettings(tls::client_config(
                self.tls_ca.as_deref(),
                cert_key,
            )?))
        } else {
            None
        };
        Ok((config, tls))
    }
}

/// The rustls config the driver upgrades with when the machine asks.
#[derive(Clone)]
struct TlsSettings(Arc<futures_rustls::rustls::ClientConfig>);

/// A command to the driver.
enum Command {
    Subscribe {
        subject: String,
        queue: Option<String>,
        messages: mpsc::Sender<Delivered>,
        done: oneshot::Sender<Result<Sid, SendError>>,
    },
    Drain(Sid),
    Publish {
        subject: String,
        reply: Option<String>,
        headers: Vec<(String, String)>,
        payload: Vec<u8>,
        done: oneshot::Sender<Result<(), SendError>>,
    },
    Request {
        subject: String,
        headers: Vec<(String, String)>,
        payload: Vec<u8>,
        outcome: oneshot::Sender<RequestOutcome>,
    },
    Flush(oneshot::Sender<()>),
}

/// A strict connection's handle: cheap to clone; the connection closes when the
/// last clone is dropped.
#[derive(Debug, Clone)]
pub struct StrictClient {
    commands: mpsc::UnboundedSender<Command>,
    info: Arc<ServerInfo>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

/// How many messages a subscription keeps unread before it drops the next (a
/// slow consumer, counted in the log).
const SUBSCRIPTION_CAPACITY: usize = 64 * 1024;

fn closed() -> Error {
    Error::new(ErrorKind::Nats, "the strict connection is closed")
}

impl StrictClient {
    /// Connects on `runtime`: the driver is spawned there, and this returns once
    /// the handshake is done, or fails once every server was tried once.
    pub async fn connect(
        runtime: Arc<dyn Runtime>,
        options: &StrictOptions,
    ) -> Result<Self, Error> {
        let (config, tls) = options.configs()?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let (first, connected) = oneshot::channel();
        let servers = config.servers.len();
        // Named apart from the client connections that share `name`.
        let name = format!(
            "{} (serving)",
            options.name.as_deref().unwrap_or("dagnats-leases")
        );
        let links = crate::links::LinkReporter::new(name, options.links_down.clone());
        let driver = driver::Driver::new(
            runtime.clone(),
            config,
            tls,
            receiver,
            first,
            servers,
            links,
        );
        runtime.spawn(Box::pin(driver.run()));
        match connected.await {
            Ok(Ok(info)) => Ok(Self {
                commands,
                info: Arc::new(info),
            }),
            Ok(Err(why)) => Err(Error::new(ErrorKind::Nats, why)),
            Err(_) => Err(closed()),
        }
    }

    /// The server's INFO at the first connect.
    pub fn server_info(&self) -> &ServerInfo {
        &self.info
    }

    /// Subscribes to `subject` (in `queue`): kept across reconnects.
    pub async fn subscribe(
        &self,
        subject: String,
        queue: Option<String>,
    ) -> Result<Subscription, Error> {
        let (messages, receiver) = mpsc::channel(SUBSCRIPTION_CAPACITY);
        let (done, sid) = oneshot::channel();
        self.commands
            .send(Command::Subscribe {
                subject,
                queue,
                messages,
                done,
            })
            .map_err(|_| closed())?;
        let sid = sid
            .await
            .map_err(|_| closed())?
            .map_err(|e| Error::new(ErrorKind::Nats, e))?;
        Ok(Subscription {
            sid,
            receiver,
            commands: self.commands.clone(),
        })
    }

    /// Publishes, checked by the encoder (subjects, headers, `max_payload`).
    pub async fn publish(
        &self,
        subject: String,
        reply: Option<String>,
        headers: Vec<(String, String)>,
        payload: Vec<u8>,
    ) -> Result<(), Error> {
        let (done, result) = oneshot::channel();
        self.commands
            .send(Command::Publish {
                subject,
                reply,
                headers,
                payload,
                done,
            })
            .map_err(|_| closed())?;
        result
            .await
            .map_err(|_| closed())?
            .map_err(|e| Error::new(ErrorKind::Nats, e))
    }

    /// Sends a request on the connection's one inbox subscription and waits for
    /// its outcome, untimed (drop the future to give it up: the caller's machine
    /// keeps the deadline). A reply whose header block is malformed is `Failed`,
    /// naming it.
    pub async fn request(
        &self,
        subject: String,
        headers: Vec<(String, String)>,
        payload: Vec<u8>,
    ) -> RequestOutcome {
        let (outcome, receiver) = oneshot::channel();
        if self
            .commands
            .send(Command::Request {
                subject,
                headers,
                payload,
                outcome,
            })
            .is_err()
        {
            return RequestOutcome::Failed("the strict connection is closed".into());
        }
        receiver
            .await
            .unwrap_or_else(|_| RequestOutcome::Failed("the strict connection is closed".into()))
    }

    /// Waits until every op asked before it has reached the server (a PING's
    /// PONG; after a reconnect if need be).
    pub async fn flush(&self) -> Result<(), Error> {
        let (done, flushed) = oneshot::channel();
        self.commands
            .send(Command::Flush(done))
            .map_err(|_| closed())?;
        flushed.await.map_err(|_| closed())
    }
}

/// A subscription's messages, each with its header block as read (an error
/// naming what is wrong when malformed). Dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    sid: Sid,
    receiver: mpsc::Receiver<Delivered>,
    commands: mpsc::UnboundedSender<Command>,
}

impl Subscription {
    /// Unsubscribes; the stream ends once the messages the server sent before it
    /// read the UNSUB are read.
    pub fn drain(&mut self) {
        let _ = self.commands.send(Command::Drain(self.sid));
    }
}

impl Stream for Subscription {
    type Item = Delivered;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Delivered>> {
        self.receiver.poll_recv(cx)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Drain(self.sid));
    }
}
