//! `dagnats-leases-smol`: the lease service on smol, with the options of `dagnats-leases serve`.
//!
//! One thread runs it all: smol's executor polls the service, inside the
//! `block_on` of a tokio current-thread runtime that drives async-nats' socket and
//! runs its connection task. Under `async_compat::Compat` alone that task lives on
//! a thread of its own, and every NATS request crossed to it and back (two
//! wake-ups of another thread per request, which the bench's smol / tokio p50
//! showed).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dagnats_leases_core::shutdown::Shutdown;
use dagnats_leases_smol::SmolRuntime;
use dagnats_leases_tokio::cli::{self, ServeArgs};
use dagnats_leases_tokio::service::prepare;

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
    let io = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(io) => io,
        Err(e) => {
            tracing::error!("cannot start the IO driver: {e}");
            return ExitCode::from(cli::EXIT_START_FAILED);
        }
    };
    let executor = smol::LocalExecutor::new();
    io.block_on(executor.run(serve(args)))
}

async fn serve(args: ServeArgs) -> ExitCode {
    // Inside the IO runtime's `block_on`: the exporter's listener is spawned there.
    if let Some(addr) = args.metrics_addr {
        if let Err(e) = cli::serve_metrics(addr) {
            tracing::error!("cannot serve metrics on {addr}: {e}");
            return ExitCode::from(cli::EXIT_START_FAILED);
        }
        tracing::info!("serving metrics on http://{addr}/metrics");
    }
    // Taken from here on: a signal before the service serves ends the start at
    // once (as the default action did), and none can fall between two listeners.
    let mut signals = cli::StopSignals::new();
    let options = match args.service_options() {
        Ok(o) => o,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(cli::EXIT_START_FAILED);
        }
    };
    let shutdown_timeout = options.shutdown_timeout;
    let starting = async {
        let client = match args.connect().await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("cannot connect to {}: {e}", args.connect.nats_url);
                return Err(cli::EXIT_NO_SERVER);
            }
        };
        prepare(SmolRuntime::shared(), client, options)
            .await
            .map_err(|e| {
                tracing::error!("cannot start: {e}");
                cli::EXIT_START_FAILED
            })
    };
    let prepared = tokio::select! {
        started = starting => match started {
            Ok(prepared) => prepared,
            Err(code) => return ExitCode::from(code),
        },
        signal = signals.recv() => {
            tracing::info!("{signal:?} received while starting: stopping now");
            return ExitCode::from(signal.exit_code());
        }
    };
    let mut serving = std::pin::pin!(prepared.serve);
    tokio::select! {
        () = &mut serving => {}
        first = signals.recv() => {
            tracing::info!(
                "{first:?} received: stopping within {:?} (a second signal stops at once)",
                Shutdown::bound(shutdown_timeout)
            );
            let _ = prepared.stop.send(true);
            tokio::select! {
                () = serving => {}
                second = signals.recv() => {
                    tracing::warn!("{second:?} received while stopping: stopping now");
                    std::process::exit(second.exit_code().into());
                }
            }
        }
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
