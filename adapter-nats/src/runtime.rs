//! The runtime the shared async code runs on: spawn a future, sleep until an
//! [`Instant`]. Nothing more is asked of an executor.
//!
//! The service loop, the typed client and the holder library reach their executor
//! only through [`Runtime`], so one body of code runs on tokio (`TokioRuntime`,
//! here, with the default feature `runtime-tokio`) and on smol
//! (`dagnats_leases_smol::SmolRuntime`). Their timers are this
//! trait's too: every NATS request is sent without async-nats' own timeout (which
//! needs tokio's timer in the polling task) and raced against
//! [`Runtime::sleep_until`] instead. The model is quinn's `Runtime`: an object-safe
//! trait held as `Arc<dyn Runtime>`, so the types built on it ([`Member`],
//! [`LeaseClient`], [`ServiceHandle`]) stay the same type on every runtime.
//!
//! [`Member`]: crate::member::Member
//! [`LeaseClient`]: crate::client::LeaseClient
//! [`ServiceHandle`]: crate::service::ServiceHandle

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
#[cfg(feature = "runtime-tokio")]
use std::sync::Arc;
use std::time::Instant;

use futures::future::{BoxFuture, Either, select};
use futures::io::{AsyncRead, AsyncWrite};

/// A byte stream (TCP, or TLS over it) as the strict connection reads and writes it.
pub trait Socket: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Socket for T {}

/// A socket as [`Runtime::connect_tcp`] gives it.
pub type BoxSocket = Box<dyn Socket>;

/// A future this crate hands to a [`Runtime`] to run in the background.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A timer made by [`Runtime::sleep_until`]: resolves at its deadline.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// What the shared async code needs from an executor.
pub trait Runtime: Send + Sync + Debug + 'static {
    /// Runs `future` to completion in the background, detached.
    fn spawn(&self, future: Task);

    /// A future that resolves at `deadline`, an instant of [`Runtime::now`]'s clock
    /// (at once if it has passed).
    fn sleep_until(&self, deadline: Instant) -> Sleep;

    /// Opens a TCP connection to `host`:`port` on this runtime's reactor, as a
    /// futures-io stream: the strict connection's socket.
    fn connect_tcp(
        &self,
        host: String,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<BoxSocket>>;

    /// Now, on the clock of every deadline the shared code computes and arms:
    /// [`crate::clock::now`], which counts time suspended (a holder's deadline must,
    /// as the server's TTL does). A test's runtime may make it jump.
    fn now(&self) -> Instant {
        crate::clock::now()
    }
}

/// Runs on the tokio runtime of the calling task ([`tokio::spawn`],
/// [`tokio::time::sleep`]): spawn and sleep panic outside one.
#[cfg(feature = "runtime-tokio")]
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioRuntime;

#[cfg(feature = "runtime-tokio")]
impl TokioRuntime {
    /// The runtime as the shared code holds it.
    pub fn shared() -> Arc<dyn Runtime> {
        Arc::new(Self)
    }
}

#[cfg(feature = "runtime-tokio")]
impl Runtime for TokioRuntime {
    fn spawn(&self, future: Task) {
        tokio::spawn(future);
    }

    /// Sleeps for what is left until `deadline` by [`Runtime::now`] (tokio's timer
    /// runs on `CLOCK_MONOTONIC`, so an `Instant` of the suspend-counting clock is
    /// turned into a wait; a suspend during the wait delays the wake, never the
    /// answer of a machine asked at it).
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(tokio::time::sleep(
            deadline.saturating_duration_since(self.now()),
        ))
    }

    /// tokio's TCP stream through tokio-util's compat (futures-io's traits).
    fn connect_tcp(
        &self,
        host: String,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<BoxSocket>> {
        use tokio_util::compat::TokioAsyncReadCompatExt as _;
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream.compat()) as BoxSocket)
        })
    }
}

/// `future`'s output, or `None` if `deadline` comes first.
pub(crate) async fn until<F: Future>(
    runtime: &dyn Runtime,
    deadline: Instant,
    future: F,
) -> Option<F::Output> {
    let future = std::pin::pin!(future);
    match select(future, runtime.sleep_until(deadline)).await {
        Either::Left((output, _)) => Some(output),
        Either::Right(((), _)) => None,
    }
}
