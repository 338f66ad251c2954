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

pub use dagnats_leases_tokio::client::{Forwarded, LeaseError, LeaseErrorKind};
pub use dagnats_leases_tokio::member::{
    Change, Elector, ForwardedRequest, Inbox, Member, Ownership, Shards, Tenure,
};

/// A holder-library [`Member`] whose background work (campaigns, renewals) runs on
/// smol's executor under [`Compat`]. [`Elector::next`], [`Elector::stop`] and
/// [`Shards`] work from plain smol code; wrap [`Member::inbox`] and
/// [`ForwardedRequest::respond`] in [`Compat`] (they talk to NATS directly).
///
/// ```no_run
/// smol::block_on(async {
///     let client = dagnats_leases_smol::connect("nats://127.0.0.1:4222").await?;
///     let member = dagnats_leases_smol::member(client, "notify-7f3a")?;
///     let mut elector = member.elect("notify-leader", std::time::Duration::from_secs(15))?;
///     while let Some(change) = elector.next().await {
///         println!("{change:?}");
///     }
///     Ok::<_, Box<dyn std::error::Error>>(())
/// })
/// # .unwrap();
/// ```
pub fn member(client: async_nats::Client, holder: &str) -> Result<Member, LeaseError> {
    let spawn: dagnats_leases_tokio::member::Spawner = std::sync::Arc::new(|f| {
        smol::spawn(Compat::new(f)).detach();
    });
    Member::with_spawner(client, holder, spawn)
}

/// The typed lease calls, for smol: each call of [`LeaseClient`] is run under
/// [`Compat`] (async-nats' request timeout needs tokio's timer).
#[derive(Debug, Clone)]
pub struct LeaseClient {
    inner: dagnats_leases_tokio::client::LeaseClient,
}

impl LeaseClient {
    /// A client with the default call timeout.
    pub fn new(client: async_nats::Client) -> Self {
        LeaseClient {
            inner: dagnats_leases_tokio::client::LeaseClient::new(client),
        }
    }

    /// The tokio adapter's client underneath (its futures need [`Compat`] on smol).
    pub fn inner(&self) -> &dagnats_leases_tokio::client::LeaseClient {
        &self.inner
    }

    /// See [`dagnats_leases_tokio::client::LeaseClient::acquire`].
    pub async fn acquire(
        &self,
        key: &str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<dagnats_leases_core::wire::AcquireReply, LeaseError> {
        Compat::new(self.inner.acquire(key, holder, ttl)).await
    }

    /// See [`dagnats_leases_tokio::client::LeaseClient::acquire_waiting`].
    pub async fn acquire_waiting(
        &self,
        key: &str,
        holder: &str,
        ttl: std::time::Duration,
        wait: std::time::Duration,
    ) -> Result<dagnats_leases_core::wire::AcquireReply, LeaseError> {
        Compat::new(self.inner.acquire_waiting(key, holder, ttl, wait)).await
    }

    /// See [`dagnats_leases_tokio::client::LeaseClient::renew`].
    pub async fn renew(
        &self,
        key: &str,
        holder: &str,
        revision: u64,
        ttl: Option<std::time::Duration>,
    ) -> Result<dagnats_leases_core::wire::Lease, LeaseError> {
        Compat::new(self.inner.renew(key, holder, revision, ttl)).await
    }

    /// See [`dagnats_leases_tokio::client::LeaseClient::release`].
    pub async fn release(
        &self,
        key: &str,
        holder: &str,
        revision: u64,
    ) -> Result<dagnats_leases_core::wire::ReleaseReply, LeaseError> {
        Compat::new(self.inner.release(key, holder, revision)).await
    }

    /// See [`dagnats_leases_tokio::client::LeaseClient::owner`].
    pub async fn owner(
        &self,
        key: &str,
    ) -> Result<Option<dagnats_leases_core::wire::Lease>, LeaseError> {
        Compat::new(self.inner.owner(key)).await
    }

    /// See [`dagnats_leases_tokio::client::LeaseClient::forward`].
    pub async fn forward(
        &self,
        key: &str,
        payload: &[u8],
        timeout: std::time::Duration,
    ) -> Result<Forwarded, LeaseError> {
        Compat::new(self.inner.forward(key, payload, timeout)).await
    }
}
