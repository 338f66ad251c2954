//! `dagnats-leases-smol`: the lease service on smol, with the options of `dagnats-leases serve`.

use std::time::Duration;

use async_compat::Compat;
use clap::{Parser, Subcommand};
use dagnats_leases_tokio::connect::ConnectOptions;
use dagnats_leases_tokio::service::ServiceOptions;

#[derive(Parser)]
#[command(
    name = "dagnats-leases-smol",
    version,
    about = "Leases over NATS JetStream KV, on smol"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve api.leases.* until SIGINT or SIGTERM.
    Serve {
        #[command(flatten)]
        connect: ConnectOptions,
        /// Stream replicas of the leases bucket (default: 1 on create, keep an existing one's).
        #[arg(long, env = "DAGNATS_LEASES_REPLICAS")]
        replicas: Option<usize>,
        /// Bound on each JetStream request, in milliseconds.
        #[arg(long, default_value_t = 5000)]
        kv_timeout_ms: u64,
        /// How long shutdown waits for calls in flight, in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        shutdown_timeout_ms: u64,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let Command::Serve {
        connect,
        replicas,
        kv_timeout_ms,
        shutdown_timeout_ms,
    } = Cli::parse().command;
    smol::block_on(async {
        let client = match Compat::new(connect.connect()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("cannot connect to {}: {e}", connect.nats_url);
                return std::process::ExitCode::from(2);
            }
        };
        let options = ServiceOptions {
            replicas,
            kv_timeout: Duration::from_millis(kv_timeout_ms),
            shutdown_timeout: Duration::from_millis(shutdown_timeout_ms),
        };
        let handle = match dagnats_leases_smol::start(client, options).await {
            Ok(h) => h,
            Err(e) => {
                tracing::error!("cannot start: {e}");
                return std::process::ExitCode::from(1);
            }
        };
        Compat::new(wait_for_signal()).await;
        tracing::info!("signal received: stopping");
        handle.shutdown().await;
        tracing::info!("stopped");
        std::process::ExitCode::SUCCESS
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
