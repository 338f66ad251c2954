//! The lease service's IO loop around the core's
//! [`Service`] machine, one serving future
//! that keeps time on a [`Runtime`] (the one task it spawns there is its strict
//! serving connection's, [`crate::strict`]): it subscribes to what the
//! machine asks (and tells it of a subscription that failed), feeds it every
//! message, outcome, timer and the stop, sends its requests untimed and drops the
//! ones it cancels, publishes its replies (and tells it as each is handed to the
//! client), unsubscribes and flushes when it says, and records its metric and log
//! events. Every decision (which reply may go out, who the caller is, which of
//! the inputs that arrived at once goes first, admission,
//! the calls, the coalescer, the confirm switch, when a request is given up, which
//! failed subscription is fatal, the stop's phases and when its flush may begin) is
//! the machine's.
//!
//! Files: this one holds the options, the handle and how the service starts;
//! `io_loop.rs` the serve loop's IO around the machine.

mod io_loop;

use std::sync::Arc;

use async_nats::Client;
use dagnats_leases_core::io::Mode;
use dagnats_leases_core::service::{Service, ServiceEvent};
use futures::future::AbortHandle;
use time::OffsetDateTime;
use tokio::sync::{oneshot, watch};

use crate::runtime::Runtime;
#[cfg(feature = "runtime-tokio")]
use crate::runtime::TokioRuntime;
use crate::strict::{StrictClient, StrictOptions};
use crate::{Error, ErrorKind as ServiceErrorKind};
use io_loop::Io;

pub use dagnats_leases_core::service::bucket::BucketOptions;
pub use dagnats_leases_core::service::{DEFAULT_MAX_CALLS_IN_FLIGHT, ServiceConfig};

/// How the service runs: the core's [`ServiceConfig`], whose fields and defaults
/// are the options (written once, in the core; read and set through this type
/// as if its own), and how readiness hears of the connections. [`start`] fills
/// in what the server's INFO says, the instance id and this crate's version.
#[derive(Debug, Clone, Default)]
pub struct ServiceOptions {
    /// The options and their defaults.
    pub config: ServiceConfig,
    /// How many of the service's connections are down (`connect::LinksDown`
    /// of the `cli` feature counts them from the client's events): readiness
    /// follows it. `None`: taken as always connected.
    pub links_down: Option<watch::Receiver<u32>>,
}

impl ServiceOptions {
    /// The core's config for a server of `version` with `max_payload`, this
    /// instance named `instance_id`.
    fn service_config(
        &self,
        version: &str,
        max_payload: usize,
        instance_id: String,
    ) -> ServiceConfig {
        ServiceConfig {
            server_version: version.to_string(),
            max_payload,
            instance_id,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..self.config.clone()
        }
    }
}

impl From<ServiceConfig> for ServiceOptions {
    fn from(config: ServiceConfig) -> Self {
        Self {
            config,
            links_down: None,
        }
    }
}

impl std::ops::Deref for ServiceOptions {
    type Target = ServiceConfig;

    fn deref(&self) -> &ServiceConfig {
        &self.config
    }
}

impl std::ops::DerefMut for ServiceOptions {
    fn deref_mut(&mut self) -> &mut ServiceConfig {
        &mut self.config
    }
}

/// A running service, on whichever [`Runtime`] it was started. Dropping it without
/// [`ServiceHandle::shutdown`] aborts it.
#[derive(Debug)]
pub struct ServiceHandle {
    mode: Mode,
    stop: watch::Sender<bool>,
    /// Fires when the serving task ends; `None` once awaited.
    done: Option<oneshot::Receiver<()>>,
    abort: AbortHandle,
}

impl ServiceHandle {
    /// `Ready`, or `Unsupported` on a server without per-message TTL.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Stops taking requests, lets calls in flight finish within the bound, and returns.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
    }
}

impl Drop for ServiceHandle {
    fn drop(&mut self) {
        if self.done.is_some() {
            self.abort.abort();
        }
    }
}

/// The service's connections: `serving` is the strict connection
/// ([`crate::strict`]) the service opens from these options, which reads the
/// requests, publishes the replies and sends the forwards to owners' inboxes
/// (everything a caller or an owner writes); `backend` is an async-nats client for
/// JetStream and the change events (bytes only the server writes).
///
/// The documented deployment gives them two NATS users: the serving user may
/// publish only to reply inboxes and owners' inboxes, so even a broken reply
/// check could not write the bucket (docs/security.md).
#[derive(Debug, Clone)]
pub struct Clients {
    /// How to open the strict serving connection.
    pub serving: StrictOptions,
    /// Talks to JetStream and reads the change events.
    pub backend: Client,
}

impl Clients {
    /// The serving connection's options and the backend client.
    pub fn new(serving: StrictOptions, backend: Client) -> Self {
        Self { serving, backend }
    }
}

/// The serving connection to this URL, without credentials, and the backend client.
impl From<(String, Client)> for Clients {
    fn from((url, backend): (String, Client)) -> Self {
        Self::new(StrictOptions::new(url), backend)
    }
}

/// The serving connection to this URL, without credentials, and the backend client.
impl From<(&str, Client)> for Clients {
    fn from((url, backend): (&str, Client)) -> Self {
        Self::new(StrictOptions::new(url), backend)
    }
}

impl From<(StrictOptions, Client)> for Clients {
    fn from((serving, backend): (StrictOptions, Client)) -> Self {
        Self::new(serving, backend)
    }
}

/// Ensures the bucket (waiting while JetStream is not ready, and answering every
/// call `unavailable` meanwhile), then serves on tokio.
#[cfg(feature = "runtime-tokio")]
pub async fn start(
    clients: impl Into<Clients>,
    options: ServiceOptions,
) -> Result<ServiceHandle, Error> {
    start_on(TokioRuntime::shared(), clients, options).await
}

/// [`start`] on `runtime`: the serving future is spawned there and keeps time with
/// its timer.
pub async fn start_on(
    runtime: Arc<dyn Runtime>,
    clients: impl Into<Clients>,
    options: ServiceOptions,
) -> Result<ServiceHandle, Error> {
    let prepared = prepare(runtime.clone(), clients, options).await?;
    let (serve, abort) = futures::future::abortable(prepared.serve);
    let (finished, done) = oneshot::channel();
    runtime.spawn(Box::pin(async move {
        let _ = serve.await;
        let _ = finished.send(());
    }));
    Ok(ServiceHandle {
        mode: prepared.mode,
        stop: prepared.stop,
        done: Some(done),
        abort,
    })
}

/// A service ready to serve: its mode, its stop switch, and the one future that
/// serves every request until the switch is thrown. The future spawns nothing (its
/// strict connection's task was spawned when it was prepared) and keeps time on the
/// [`Runtime`] it was prepared with, so that runtime's executor (or any other) can
/// poll it.
pub struct Prepared {
    /// `Ready`, or `Unsupported` on a server without per-message TTL.
    pub mode: Mode,
    /// Send `true` to stop taking requests and drain the calls in flight.
    pub stop: watch::Sender<bool>,
    /// Serves until stopped.
    pub serve: futures::future::BoxFuture<'static, ()>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("mode", &self.mode)
            .finish()
    }
}

/// Registers the endpoints and ensures the bucket; returns the serving future.
///
/// The endpoints answer from the start: while the bucket is being ensured (and
/// JetStream may not be there yet) every call replies `unavailable`
/// ([`Mode::Starting`]), so callers retry instead of seeing no responders. This
/// future answers those itself, until it returns with the mode startup settled on.
///
/// Every decision is the core's [`Service`] machine's; this drives it: it
/// subscribes, receives, sends, publishes the replies, flushes, arms one timer and
/// records what the machine reports. It opens the strict serving connection on
/// `runtime` (its task spawned there). The backend async-nats client needs a
/// tokio context only where it was connected.
pub async fn prepare(
    runtime: Arc<dyn Runtime>,
    clients: impl Into<Clients>,
    options: ServiceOptions,
) -> Result<Prepared, Error> {
    let Clients { serving, backend } = clients.into();
    let info = backend.server_info();
    // The instance id: unique per process, as the micro protocol asks.
    let id = nuid::next().to_string();
    let config = options.service_config(&info.version, info.max_payload, id);
    let mut service = Service::new(config, OffsetDateTime::now_utc(), runtime.now());
    // What the machine says before anything is carried out: a start it refuses
    // (no INFO on the backend client) ends here, with no serving connection.
    let early: Vec<ServiceEvent> = std::iter::from_fn(|| service.poll_event()).collect();
    if let Some(ServiceEvent::StartRefused(why)) = early
        .iter()
        .find(|e| matches!(e, ServiceEvent::StartRefused(_)))
    {
        return Err(Error::new(ServiceErrorKind::Config, why.clone()));
    }
    let serving = StrictClient::connect(runtime.clone(), &serving).await?;
    let mut links_down = options.links_down.clone();
    if let Some(links) = &mut links_down {
        let down = *links.borrow_and_update();
        service.handle_connection(runtime.now(), down == 0);
    }
    let mut io = Io::new(
        runtime,
        serving,
        backend,
        info.max_payload,
        info.version.clone(),
    );
    io.links_down = links_down;
    for event in early {
        io.record(&mut service, event).await?;
    }
    io.drain(&mut service).await?;
    // Wait for the server's PONG after the subscriptions: it has read them before
    // anything any client sends after this returns.
    io.serving
        .flush()
        .await
        .map_err(|e| Error::new(ServiceErrorKind::Nats, e))?;
    while service.is_starting() {
        io.step(&mut service, None).await?;
    }
    let (stop, stopped) = watch::channel(false);
    let mode = service.mode();
    let serve = async move {
        let mut stopped = stopped;
        while !service.is_done() {
            if let Err(e) = io.step(&mut service, Some(&mut stopped)).await {
                tracing::warn!("serving: {e}");
            }
        }
    };
    Ok(Prepared {
        mode,
        stop,
        serve: Box::pin(serve),
    })
}
