//! `dagnats-leases`: the lease service and its operator commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dagnats_leases_core::shutdown::Shutdown;
use dagnats_leases_tokio::cli::{self, ServeArgs};
use dagnats_leases_tokio::commands::{self, Op};
use dagnats_leases_tokio::{lock, service};

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
    #[command(flatten)]
    Op(Op),
    /// Started by `lock`: runs its command and stops it at the lease's deadline.
    #[command(name = "__lock-watchdog", hide = true)]
    LockWatchdog(lock::WatchdogArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Cli::parse().command {
        Command::Serve(args) => args,
        Command::Op(op) => return ExitCode::from(operate(op).await),
        Command::LockWatchdog(args) => {
            // Exit at once: tokio's stdin read cannot be cancelled, and the runtime's
            // shutdown would wait for it (for the tool's next line) otherwise.
            let code = lock::watchdog(args).await;
            std::process::exit(code.into());
        }
    };
    cli::init_logging();
    // Taken from here on: a signal before the service serves ends the start at
    // once (as the default action did), and none can fall between two listeners.
    let mut signals = cli::StopSignals::new();
    let started = cli::start_serving(&args, &mut signals, |clients, options| {
        service::start(clients, options)
    })
    .await;
    let (handle, shutdown_timeout) = match started {
        Ok(started) => started,
        Err(code) => return ExitCode::from(code),
    };
    let first = signals.recv().await;
    tracing::info!(
        "{first:?} received: stopping within {:?} (a second signal stops at once)",
        Shutdown::bound(shutdown_timeout)
    );
    tokio::select! {
        () = handle.shutdown() => {}
        second = signals.recv() => {
            tracing::warn!("{second:?} received while stopping: stopping now");
            // At once: the runtime's shutdown is not waited for either.
            std::process::exit(second.exit_code().into());
        }
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// Runs one operator command (logging stays off: its output is the command's own).
async fn operate(op: Op) -> u8 {
    commands::operate(op, &mut std::io::stdout()).await
}
