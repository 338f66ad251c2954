//! The dagnats lease service on tokio.
//!
//! It drives the sans-IO machines of [`dagnats_leases_core`] with async-nats: every
//! request a machine asks for is one NATS request ([`nats_request`]), and the
//! service is one loop around the core's `Service` machine, which runs a call
//! machine per request, so a slow forward never holds up an acquire. No lease
//! logic lives here: checks, retries and replies come from the core.
//!
//! The service loop, [`client`] and [`member`] reach their executor only through
//! [`runtime::Runtime`] (spawn, sleep until an instant): [`runtime::TokioRuntime`]
//! here, `SmolRuntime` in `dagnats-leases-smol`, which uses this crate with
//! `default-features = false`. The default feature `cli` adds the `dagnats-leases`
//! binary and what only it needs ([`cli`], [`commands`], [`connect`]: clap,
//! tracing-subscriber, tokio's signal handling and multi-thread scheduler).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let service = dagnats_leases_tokio::service::start(client, Default::default()).await?;
//! // ... until it is time to stop:
//! service.shutdown().await;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![warn(clippy::use_self)]

#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
pub mod clock;
#[cfg(feature = "cli")]
pub mod commands;
#[cfg(feature = "cli")]
pub mod connect;
#[cfg(feature = "cli")]
pub mod exit;
mod intake;
#[cfg(feature = "cli")]
pub mod lock;
pub mod member;
pub mod nats_request;
pub mod runtime;
pub mod service;
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
        write!(f, "{:?}: {}", self.kind, self.source)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
