//! Connection options a production deployment needs, shared by the binary's commands.

use std::path::PathBuf;
use std::sync::Mutex;

use dagnats_leases_core::health::LinkEvent;

pub(crate) use crate::links::LinkReporter;
pub use crate::links::LinksDown;
use crate::{Error, ErrorKind};

/// An async-nats event as the core's connection log reads it.
fn link_event(event: async_nats::Event) -> LinkEvent {
    use async_nats::Event;
    match event {
        Event::Connected => LinkEvent::Connected,
        Event::Disconnected => LinkEvent::Disconnected,
        Event::LameDuckMode => LinkEvent::LameDuck,
        Event::Draining | Event::Closed => LinkEvent::Closed,
        Event::SlowConsumer(sid) => LinkEvent::SlowConsumer(sid),
        Event::ServerError(e) => LinkEvent::ServerError(e.to_string()),
        Event::ClientError(e) => LinkEvent::AttemptFailed(e.to_string()),
    }
}

/// How to reach and authenticate to NATS.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnectOptions {
    /// NATS server URL(s), comma-separated.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Credentials file (JWT and nkey seed).
    #[arg(long, env = "NATS_CREDS")]
    pub creds: Option<PathBuf>,
    /// User name (with --password).
    #[arg(long, env = "NATS_USER")]
    pub user: Option<String>,
    /// Password (with --user).
    #[arg(long, env = "NATS_PASSWORD")]
    pub password: Option<String>,
    /// Authentication token.
    #[arg(long, env = "NATS_TOKEN")]
    pub token: Option<String>,
    /// Nkey seed.
    #[arg(long, env = "NATS_NKEY")]
    pub nkey: Option<String>,
    /// CA certificate file for TLS (turns TLS on).
    #[arg(long, env = "NATS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate for TLS (with --tls-key).
    #[arg(long, env = "NATS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Client key for TLS (with --tls-cert).
    #[arg(long, env = "NATS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Connection name shown by the server.
    #[arg(long, env = "NATS_NAME", default_value = "dagnats-leases")]
    pub name: String,
    /// The prefix of this connection's reply inboxes (`_INBOX` when unset), e.g.
    /// `_INBOX.a1`: where a deployment lets each user subscribe to its own prefix
    /// only, no other user can read its replies (docs/security.md). The service's
    /// backend connection always takes its own.
    #[arg(long, env = "DAGNATS_INBOX_PREFIX", value_name = "PREFIX")]
    pub inbox_prefix: Option<String>,
    /// Where this connection counts itself down and up again (the service's
    /// readiness); not a flag.
    #[arg(skip)]
    pub links_down: Option<LinksDown>,
}

impl ConnectOptions {
    /// The same server, credentials and TLS for the service's strict serving
    /// connection ([`crate::strict`]).
    pub fn strict(&self) -> crate::strict::StrictOptions {
        crate::strict::StrictOptions {
            urls: self.nats_url.clone(),
            user: self.user.clone(),
            password: self.password.clone(),
            token: self.token.clone(),
            nkey: self.nkey.clone(),
            creds: self.creds.clone(),
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            name: Some(self.name.clone()),
            inbox_prefix: self.inbox_prefix.clone(),
            links_down: self.links_down.clone(),
            ..Default::default()
        }
    }

    /// Connects with these options (failing fast if no server answers now);
    /// async-nats reconnects on its own afterwards.
    pub async fn connect(&self) -> Result<async_nats::Client, Error> {
        self.connect_reporting(None).await
    }

    /// [`Self::connect`], sending each error the server reports on the connection
    /// (`-ERR`, such as a permissions violation) to `errors`: a command can then
    /// fail at once on a refused subscribe or publish instead of waiting for
    /// messages or replies that never come.
    pub async fn connect_reporting(
        &self,
        errors: Option<tokio::sync::mpsc::UnboundedSender<async_nats::ServerError>>,
    ) -> Result<async_nats::Client, Error> {
        let mut options = match &self.creds {
            Some(path) => async_nats::ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| Error::new(ErrorKind::Config, e))?,
            None => async_nats::ConnectOptions::new(),
        };
        match (&self.user, &self.password) {
            (Some(u), Some(p)) => options = options.user_and_password(u.clone(), p.clone()),
            (None, None) => {}
            _ => {
                return Err(Error::new(
                    ErrorKind::Config,
                    "--user and --password go together",
                ));
            }
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if let Some(seed) = &self.nkey {
            options = options.nkey(seed.clone());
        }
        if let Some(ca) = &self.tls_ca {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => options = options.add_client_certificate(c.clone(), k.clone()),
            (None, None) => {}
            _ => {
                return Err(Error::new(
                    ErrorKind::Config,
                    "--tls-cert and --tls-key go together",
                ));
            }
        }
        if let Some(prefix) = &self.inbox_prefix {
            let prefix = dagnats_leases_core::reply_scope::client_inbox_prefix(prefix)
                .map_err(|e| Error::new(ErrorKind::Config, format!("--inbox-prefix: {e}")))?;
            options = options.custom_inbox_prefix(prefix);
        }
        // One warning per outage, not one per reconnect attempt: the core's
        // connection log decides what each event is worth.
        let reporter = Mutex::new(LinkReporter::new(
            self.name.clone(),
            self.links_down.clone(),
        ));
        options = options
            .name(self.name.clone())
            .event_callback(move |event| {
                if let (async_nats::Event::ServerError(e), Some(errors)) = (&event, &errors) {
                    let _ = errors.send(e.clone());
                }
                reporter
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .report(link_event(event));
                async {}
            });
        let urls: Vec<&str> = self.nats_url.split(',').map(str::trim).collect();
        let addrs = urls
            .iter()
            .map(|u| u.parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::new(ErrorKind::Config, e))?;
        options
            .connect(addrs)
            .await
            .map_err(|e| Error::new(ErrorKind::Nats, e))
    }
}
