//! The dagnats lease service's adapter over async-nats, on any executor.
//!
//! It drives the sans-IO machines of [`dagnats_leases_core`] with async-nats: the
//! service's IO loop ([`service`]), the typed client ([`client`]) and the holder
//! library ([`member`]). No lease logic lives here: checks, retries, deadlines and
//! replies come from the core's machines; this crate sends, receives, subscribes
//! and arms their timers.
//!
//! It reaches its executor only through [`runtime::Runtime`] (spawn, sleep until an
//! instant), as quinn sits on its `Runtime` trait beside quinn-proto. The default
//! feature `runtime-tokio` adds `TokioRuntime` and the constructors that use it
//! (`Member::new`, `LeaseClient::new`, `service::start`); `dagnats-leases-smol`
//! turns it off and brings `SmolRuntime`. The feature `cli` adds what both `serve`
//! binaries share (its modules `cli`, `connect` and `exit`).
//!
//! ```no_run
//! # #[cfg(feature = "runtime-tokio")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "nats://127.0.0.1:4222";
//! let client = async_nats::connect(url).await?;
//! // The strict serving connection to `url` (opened by the service) and the
//! // backend client.
//! let service = dagnats_leases_nats::service::start((url, client), Default::default()).await?;
//! // ... until it is time to stop:
//! service.shutdown().await;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![warn(clippy::use_self)]

mod cancellable;
#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
pub mod clock;
#[cfg(feature = "cli")]
pub mod connect;
#[cfg(feature = "cli")]
pub mod exit;
mod intake;
pub mod links;
pub mod member;
pub mod nats_request;
#[cfg(feature = "cli")]
pub mod probe;
pub mod runtime;
pub mod service;
pub mod strict;
pub mod telemetry;

/// What went wrong in the adapter (not a lease outcome: those are replies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Connecting to or talking to NATS failed.
    Nats,
    /// The options given are not usable.
    Config,
}

impl ErrorKind {
    /// Its snake_case name: `nats` or `config`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::Config => "config",
        }
    }
}

/// An adapter error in async-nats' style: a kind and its source.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl Error {
    /// An error of `kind` caused by `source`.
    pub fn new(
        kind: ErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind,
            source: source.into(),
        }
    }

    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.source)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
