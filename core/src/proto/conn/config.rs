//! How a [`Connection`](super::Connection) is set up: the servers to dial, how it
//! authenticates (and the nonce signer the adapter supplies), and its bounds.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Signs the server's nonce with the client's nkey: what nkey and JWT
/// authentication send back. The adapter supplies it (the core holds no keys).
pub trait NonceSigner: Send + Sync + fmt::Debug {
    /// The signature of `nonce`, base64url without padding.
    fn sign(&self, nonce: &[u8]) -> String;
}

/// How the connection authenticates.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    /// No credentials.
    #[default]
    None,
    /// User and password.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// A token.
    Token(String),
    /// An nkey: its public key, and the signer of the nonce.
    Nkey {
        /// The public key (`U...`).
        public: String,
        /// Signs INFO's nonce.
        signer: Arc<dyn NonceSigner>,
    },
    /// A user JWT and the signer of the nonce with its nkey (a creds file).
    Jwt {
        /// The user JWT.
        jwt: String,
        /// Signs INFO's nonce.
        signer: Arc<dyn NonceSigner>,
    },
}

/// A server to dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddr {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// `tls://`: TLS whatever the server says.
    pub tls: bool,
}

impl ServerAddr {
    /// Reads `nats://host:port`, `tls://host:port`, `host:port` or `host` (port
    /// 4222). Credentials in a URL are refused: they go in the options.
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        let (tls, rest) = if let Some(r) = url.strip_prefix("tls://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("nats://") {
            (false, r)
        } else if url.contains("://") {
            return Err(format!("{url:?}: only nats:// and tls:// are served"));
        } else {
            (false, url)
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains('@') {
            return Err(format!(
                "{url:?}: credentials go in the options, not in the URL"
            ));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || rest.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .map_err(|_| format!("{url:?}: the port {p:?} is not a number"))?;
                (h, port)
            }
            _ => (rest, 4222),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        Ok(Self {
            host: host.to_string(),
            port,
            tls,
        })
    }
}

/// How the connection runs.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// The servers, tried in turn.
    pub servers: Vec<ServerAddr>,
    /// The connection's name.
    pub name: String,
    /// Whether this connection gets its own messages back.
    pub echo: bool,
    /// Credentials.
    pub auth: Auth,
    /// TLS asked whatever the server says.
    pub tls: bool,
    /// How often a PING goes out on an idle or busy connection.
    pub ping_interval: Duration,
    /// PINGs unanswered past which the connection is stale and dropped.
    pub max_pings_out: u32,
    /// Bound on a dial and on each step of the handshake.
    pub connect_timeout: Duration,
    /// The first wait before dialing again; it doubles per failure.
    pub reconnect_min: Duration,
    /// The longest wait before dialing again.
    pub reconnect_max: Duration,
    /// Bytes kept while disconnected (publishes), past which a publish is refused.
    pub max_pending: usize,
    /// The request helper's inbox prefix: replies come on `<inbox>.<n>`. Unique
    /// per connection (the adapter makes it from a random id).
    pub inbox: String,
}

impl ConnectionConfig {
    /// Defaults for `servers`, with `inbox` the unique reply prefix.
    pub fn new(servers: Vec<ServerAddr>, inbox: impl Into<String>) -> Self {
        Self {
            servers,
            name: "dagnats-leases".to_string(),
            echo: false,
            auth: Auth::None,
            tls: false,
            ping_interval: Duration::from_secs(30),
            max_pings_out: 2,
            connect_timeout: Duration::from_secs(2),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(2),
            max_pending: 8 * 1024 * 1024,
            inbox: inbox.into(),
        }
    }
}
