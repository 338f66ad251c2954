//! `dagnats-leases`: the lease service and its operator commands.

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use dagnats_leases_core::service::shutdown::Shutdown;
use dagnats_leases_tokio::cli::{self, ServeCommand};
use dagnats_leases_tokio::commands::{self, Op};
use dagnats_leases_tokio::{lock, service};

/// mimalloc instead of the system allocator: the service's many small per-call
/// buffers cost glibc's malloc a third of the service's CPU at capacity.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "dagnats-leases",
    version,
    about = "Leases over NATS JetStream KV"
)]
enum Cli {
    #[command(flatten)]
    Serve(ServeCommand),
    #[command(flatten)]
    Op(Op),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages (dagnats-leases.1 and one per command) into a directory.
    Man {
        /// The directory (made if missing).
        dir: std::path::PathBuf,
    },
    /// Started by `lock`: runs its command and stops it at the lease's deadline.
    #[command(name = "__lock-watchdog", hide = true)]
    LockWatchdog(lock::WatchdogArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return bad_arguments(e),
    };
    let args = match cli {
        Cli::Serve(ServeCommand::Serve(args)) => args,
        Cli::Op(op) => return ExitCode::from(operate(op).await),
        Cli::Completions { shell } => {
            let mut cli = Cli::command();
            clap_complete::generate(shell, &mut cli, "dagnats-leases", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Cli::Man { dir } => return write_man_pages(&dir),
        Cli::LockWatchdog(args) => {
            // Exit at once: tokio's stdin read cannot be cancelled, and the runtime's
            // shutdown would wait for it (for the tool's next line) otherwise.
            let code = lock::watchdog(args).await;
            std::process::exit(code.into());
        }
    };
    cli::init_logging_as(args.log_format);
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

/// Bad arguments: clap's message and exit 2, or with `--json` anywhere among
/// them `{"error", "kind": "usage"}` on stdout (every outcome is JSON then).
fn bad_arguments(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let asked_json = std::env::args_os().skip(1).any(|a| a == "--json");
    let shown = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if !asked_json || shown {
        e.exit();
    }
    let rendered = e.render().to_string();
    // clap's sentence: its lines up to the usage block, on one line.
    let message = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    let message = message.trim_start_matches("error: ");
    println!("{}", serde_json::json!({"error": message, "kind": "usage"}));
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

/// Runs one operator command (logging stays off: its output is the command's own).
async fn operate(op: Op) -> u8 {
    commands::operate(op, &mut std::io::stdout()).await
}

/// Writes `dagnats-leases.1` and `dagnats-leases-<command>.1` for each visible
/// command into `dir`.
fn write_man_pages(dir: &std::path::Path) -> ExitCode {
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        let cli = Cli::command();
        clap_mangen::generate_to(cli, dir)
    });
    match written {
        Ok(()) => {
            println!("man pages written to {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "dagnats-leases: cannot write man pages to {}: {e}",
                dir.display()
            );
            ExitCode::from(commands::EXIT_ERROR)
        }
    }
}
