//! The dagnats lease service on smol.
//!
//! It runs the very same service loop as the tokio adapter (the core's machines,
//! driven by one future that spawns nothing) on smol's executor. async-nats needs
//! tokio's reactor and timer; [`async_compat::Compat`] provides them from a
//! background thread, so an application on smol runs no tokio runtime of its own.
//! Every future this crate hands out is already wrapped, so a bare `smol::spawn`
//! of them cannot panic with "there is no reactor running".
//!
//! ```no_run
//! smol::block_on(async {
//!     let client = dagnats_leases_smol::connect("nats://127.0.0.1:4222").await?;
//!     let service = dagnats_leases_smol::start(client, Default::default()).await?;
//!     service.shutdown().await;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })
//! # .unwrap();
//! ```
#![warn(missing_docs)]

use async_compat::Compat;
use dagnats_leases_core::Mode;
pub use dagnats_leases_tokio::service::ServiceOptions;
pub use dagnats_leases_tokio::{Error, ErrorKind};

/// Connects to NATS from smol.
pub async fn connect(url: &str) -> Result<async_nats::Client, Error> {
    Compat::new(async_nats::connect(url))
        .await
        .map_err(|e| Error::new(ErrorKind::Nats, e))
}

/// A service running on smol's executor.
#[derive(Debug)]
pub struct ServiceHandle {
    mode: Mode,
    stop: tokio::sync::watch::Sender<bool>,
    task: smol::Task<()>,
}

impl ServiceHandle {
    /// `Ready`, or `Unsupported` on a server without per-message TTL.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Stops taking requests, lets calls in flight finish within the bound, and returns.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.task.await;
    }
}

/// Ensures the bucket, then serves on smol's global executor.
pub async fn start(
    client: async_nats::Client,
    options: ServiceOptions,
) -> Result<ServiceHandle, Error> {
    let prepared = Compat::new(dagnats_leases_tokio::service::prepare(client, options)).await?;
    let task = smol::spawn(Compat::new(prepared.serve));
    Ok(ServiceHandle {
        mode: prepared.mode,
        stop: prepared.stop,
        task,
    })
}
