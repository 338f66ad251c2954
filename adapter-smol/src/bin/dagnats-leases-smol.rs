//! `dagnats-leases-smol`: the lease service on smol, with the options of `dagnats-leases serve`.

use std::process::ExitCode;

use async_compat::Compat;
use clap::{Parser, Subcommand};
use dagnats_leases_tokio::cli::{self, ServeArgs};

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
    Serve(ServeArgs),
}

fn main() -> ExitCode {
    cli::init_logging();
    let Command::Serve(args) = Cli::parse().command;
    smol::block_on(async {
        let client = match Compat::new(args.connect.connect()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("cannot connect to {}: {e}", args.connect.nats_url);
                return ExitCode::from(cli::EXIT_NO_SERVER);
            }
        };
        let handle = match dagnats_leases_smol::start(client, args.service_options()).await {
            Ok(h) => h,
            Err(e) => {
                tracing::error!("cannot start: {e}");
                return ExitCode::from(cli::EXIT_START_FAILED);
            }
        };
        Compat::new(cli::wait_for_signal()).await;
        tracing::info!("signal received: stopping");
        handle.shutdown().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}
