//! `dagnats-leases`: the lease service and its operator commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dagnats_leases_tokio::cli::{self, ServeArgs};
use dagnats_leases_tokio::service;

#[derive(Parser)]
#[command(
    name = "dagnats-leases",
    version,
    about = "Leases over NATS JetStream KV"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve api.leases.* until SIGINT or SIGTERM.
    Serve(ServeArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    cli::init_logging();
    let Command::Serve(args) = Cli::parse().command;
    let client = match args.connect.connect().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("cannot connect to {}: {e}", args.connect.nats_url);
            return ExitCode::from(cli::EXIT_NO_SERVER);
        }
    };
    let handle = match service::start(client, args.service_options()).await {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            return ExitCode::from(cli::EXIT_START_FAILED);
        }
    };
    cli::wait_for_signal().await;
    tracing::info!("signal received: stopping");
    handle.shutdown().await;
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
