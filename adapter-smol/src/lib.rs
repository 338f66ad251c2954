//! The dagnats lease service on smol.
//!
//! Nothing here is a copy: the service loop, [`LeaseClient`], [`Member`] and
//! [`ServiceHandle`] are the runtime-neutral crate's (`dagnats-leases-nats`, used
//! without its `runtime-tokio` feature, so with no tokio runtime or timer and
//! without the tokio adapter), run on [`SmolRuntime`], which spawns on smol's
//! global executor and sleeps on smol's timer.
//!
//! ```no_run
//! smol::block_on(async {
//!     let url = "nats://127.0.0.1:4222";
//!     let client = dagnats_leases_smol::connect(url).await?;
//!     // The strict serving connection to `url` (opened by the service) and the
//!     // backend client.
//!     let service = dagnats_leases_smol::start((url, client), Default::default()).await?;
//!     service.shutdown().await;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })
//! # .unwrap();
//! ```
//!
//! # Where async-nats needs tokio
//!
//! async-nats is built on tokio, but only two of the steps used here need a tokio
//! context in the task that polls them, and only those run under
//! [`async_compat::Compat`] (which lends its own tokio runtime, on a thread of its
//! own, when the application has none):
//!
//! - **connecting** ([`connect`]): the TCP (and TLS) stream is registered with
//!   tokio's reactor, and the connection task that reads, writes, pings and
//!   reconnects is `tokio::spawn`ed. It then lives on Compat's runtime.
//! - **starting the service** ([`start`]): async-nats' micro service
//!   `tokio::spawn`s its `$SRV.PING`/`INFO`/`STATS` handler.
//!
//! Everything after that is runtime-neutral and runs on smol with no `Compat`: a
//! request, a publish, a subscription or a flush is a message on a
//! `tokio::sync::mpsc` channel to the connection task and a `tokio::sync` channel
//! to wait on (tokio's channels need no runtime), and dropping a subscriber
//! unsubscribes with a `try_send`. The one other tokio dependency was the request
//! timeout: async-nats wraps a request in `tokio::time::timeout`, which panics
//! without tokio's timer. The shared code sends every request with async-nats'
//! timeout off and races it with [`Runtime::sleep_until`] instead, so a request
//! needs no `Compat` (before, every call of the client and every holder-library
//! task ran under one). The service's serving future, the holder library's driver
//! task and the client's calls are all plain smol futures.
//!
//! The service's serving connection is not async-nats at all: it is the strict
//! connection of `dagnats_leases_nats::strict`, whose socket comes from
//! [`SmolRuntime`]'s `connect_tcp` ([`smol::net::TcpStream`]) and whose task runs
//! on smol's executor; only its backend client (JetStream, change events) is
//! async-nats.
//!
//! A client connected some other way (`async_nats::connect` inside your own tokio
//! runtime, or under `Compat`) works the same: only the connection task needs
//! tokio, and it has it.
//!
//! # One thread instead of two
//!
//! Under `Compat` the connection task runs on async-compat's own thread, so every
//! NATS request wakes that thread and its reply wakes smol's: on 2 cores that cost
//! smol 10 to 25 % of p50 over tokio. The `dagnats-leases-smol` binary avoids it:
//! it runs a `smol::LocalExecutor` inside the `block_on` of a tokio
//! current-thread runtime, connects there (the connection task is spawned on that
//! runtime, on the same thread) and polls the service's serving future
//! ([`dagnats_leases_nats::service::prepare`]) on the executor. An application
//! can lay itself out the same way.
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![warn(clippy::use_self)]

use std::sync::Arc;
use std::time::Instant;

use async_compat::Compat;
pub use dagnats_leases_nats::client::{Forwarded, LeaseClient, LeaseError, LeaseErrorKind};
pub use dagnats_leases_nats::member::{
    CampaignObserver, Change, Elector, ForwardedRequest, Health, Inbox, Member, ObservedRequest,
    Ownership, Semaphore, Shards, StepDownReason, Tenure,
};
pub use dagnats_leases_nats::runtime::Runtime;
use dagnats_leases_nats::runtime::{BoxSocket, Sleep, Task};
pub use dagnats_leases_nats::service::{Clients, ServiceHandle, ServiceOptions};
pub use dagnats_leases_nats::strict::StrictOptions;
pub use dagnats_leases_nats::{Error, ErrorKind};

/// Runs the shared async code on smol: [`smol::spawn`] (detached) and
/// [`smol::Timer::after`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SmolRuntime;

impl SmolRuntime {
    /// The runtime as the shared code holds it.
    pub fn shared() -> Arc<dyn Runtime> {
        Arc::new(Self)
    }
}

impl Runtime for SmolRuntime {
    fn spawn(&self, future: Task) {
        smol::spawn(future).detach();
    }

    /// Sleeps for what is left until `deadline` by [`Runtime::now`] (the
    /// suspend-counting clock; smol's timer runs on `CLOCK_MONOTONIC`).
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        let timer = smol::Timer::after(deadline.saturating_duration_since(self.now()));
        Box::pin(async move {
            timer.await;
        })
    }

    /// [`smol::net::TcpStream`], a futures-io stream already.
    fn connect_tcp(
        &self,
        host: String,
        port: u16,
    ) -> smol::future::Boxed<std::io::Result<BoxSocket>> {
        Box::pin(async move {
            let stream = smol::net::TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as BoxSocket)
        })
    }
}

/// Connects to NATS from smol (under [`Compat`]: the connection task is tokio's).
pub async fn connect(url: &str) -> Result<async_nats::Client, Error> {
    Compat::new(async_nats::connect(url))
        .await
        .map_err(|e| Error::new(ErrorKind::Nats, e))
}

/// Ensures the bucket, then serves on smol's global executor. The start runs under
/// [`Compat`] (async-nats' micro service spawns its handler on tokio); the serving
/// future runs on smol alone.
pub async fn start(
    clients: impl Into<Clients>,
    options: ServiceOptions,
) -> Result<ServiceHandle, Error> {
    Compat::new(dagnats_leases_nats::service::start_on(
        SmolRuntime::shared(),
        clients,
        options,
    ))
    .await
}

/// A holder-library [`Member`] whose background work (campaigns, renewals) runs on
/// smol's executor and timer. Every method, [`Member::inbox`] and
/// [`ForwardedRequest::respond`] included, works from plain smol code.
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
    Member::with_runtime(client, holder, SmolRuntime::shared())
}

/// The typed lease calls, timed on smol's timer ([`LeaseClient::with_runtime`]).
pub fn lease_client(client: async_nats::Client) -> LeaseClient {
    LeaseClient::with_runtime(client, SmolRuntime::shared())
}
