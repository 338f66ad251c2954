//! What both `serve` binaries share: their options, logging and the stop signal.

use std::time::Duration;

use crate::connect::ConnectOptions;
use crate::service::ServiceOptions;

/// The options of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// How to reach NATS.
    #[command(flatten)]
    pub connect: ConnectOptions,
    /// Stream replicas of the leases bucket (default: 1 on create, keep an existing one's).
    #[arg(long, env = "DAGNATS_LEASES_REPLICAS")]
    pub replicas: Option<usize>,
    /// Bound on each JetStream request, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub kv_timeout_ms: u64,
    /// How long shutdown waits for calls in flight, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,
    /// At most this many calls run at once; further requests wait in the
    /// subscription, so memory stays flat under a burst.
    #[arg(long, default_value_t = crate::service::DEFAULT_MAX_CALLS_IN_FLIGHT)]
    pub max_calls_in_flight: usize,
    /// Test only (feature `__test`): answer from unconfirmed reads on a replicated
    /// bucket, so that a benchmark can measure what confirmation costs.
    #[cfg(feature = "__test")]
    #[arg(long, hide = true)]
    pub unconfirmed_reads_for_tests: bool,
}

impl ServeArgs {
    /// The service options these arguments give.
    pub fn service_options(&self) -> ServiceOptions {
        ServiceOptions {
            replicas: self.replicas,
            kv_timeout: Duration::from_millis(self.kv_timeout_ms),
            shutdown_timeout: Duration::from_millis(self.shutdown_timeout_ms),
            max_calls_in_flight: self.max_calls_in_flight,
            #[cfg(feature = "__test")]
            unconfirmed_reads_for_tests: self.unconfirmed_reads_for_tests,
            ..ServiceOptions::default()
        }
    }
}

/// Logs to stderr through tracing, `RUST_LOG` filtering (default `info`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Resolves on SIGINT or SIGTERM (needs tokio's reactor: a runtime or `async_compat`).
pub async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub use crate::exit::{EXIT_NO_SERVER, EXIT_START_FAILED};
