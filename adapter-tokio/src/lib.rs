//! The dagnats lease service on tokio: the `dagnats-leases` binary.
//!
//! The service loop, the typed client and the holder library are
//! `dagnats-leases-nats`'s, runtime-neutral, re-exported here under the same paths
//! with its `runtime-tokio` feature on ([`runtime::TokioRuntime`],
//! [`member::Member::new`], [`client::LeaseClient::new`], [`service::start`]). This
//! crate adds what only the tokio binary has: its commands ([`commands`]) and
//! `lock` ([`lock`]) and `elect` ([`elect`]), which use tokio's processes, stdin and signals.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "nats://127.0.0.1:4222";
//! let client = async_nats::connect(url).await?;
//! // The strict serving connection to `url` (opened by the service) and the
//! // backend client.
//! let service = dagnats_leases_tokio::service::start((url, client), Default::default()).await?;
//! // ... until it is time to stop:
//! service.shutdown().await;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![warn(clippy::use_self)]

pub use dagnats_leases_nats::{
    Error, ErrorKind, client, clock, member, nats_request, runtime, service, strict, telemetry,
};
#[cfg(feature = "cli")]
pub use dagnats_leases_nats::{cli, connect, exit};

#[cfg(feature = "cli")]
pub mod commands;
#[cfg(feature = "cli")]
pub mod elect;
#[cfg(feature = "cli")]
pub mod lock;
#[cfg(feature = "cli")]
pub mod report;
