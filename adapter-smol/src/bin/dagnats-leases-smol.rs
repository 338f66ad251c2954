//! `dagnats-leases-smol`: the lease service on smol, with the options of `dagnats-leases serve`.
//!
//! One thread runs it all: smol's executor polls the service, inside the
//! `block_on` of a tokio current-thread runtime that drives async-nats' socket and
//! runs its connection task. Under `async_compat::Compat` alone that task lives on
//! a thread of its own, and every NATS request crossed to it and back (two
//! wake-ups of another thread per request, which the bench's smol / tokio p50
//! showed).

use std::process::ExitCode;

use clap::Parser;
use dagnats_leases_core::service::shutdown::Shutdown;
use dagnats_leases_nats::cli::{self, ServeArgs, ServeCommand};
use dagnats_leases_nats::service::prepare;
use dagnats_leases_smol::SmolRuntime;

/// mimalloc instead of the system allocator, as in `dagnats-leases`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "dagnats-leases-smol",
    version,
    about = "Leases over NATS JetStream KV, on smol"
)]
struct Cli {
    #[command(subcommand)]
    command: ServeCommand,
}

fn main() -> ExitCode {
    let ServeCommand::Serve(args) = Cli::parse().command;
    cli::init_logging_as(args.log_format);
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
    // Signals are taken from here on: one before the service serves ends the start.
    let mut signals = cli::StopSignals::new();
    let started = cli::start_serving(&args, &mut signals, |clients, options| {
        prepare(SmolRuntime::shared(), clients, options)
    })
    .await;
    let (prepared, shutdown_timeout) = match started {
        Ok(started) => started,
        Err(code) => return ExitCode::from(code),
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
