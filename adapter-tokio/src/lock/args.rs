//! The options of `lock` and of the hidden `__lock-watchdog`, and the environment
//! the command is given.

use std::time::Duration;

use crate::cli::parse_duration;

/// The environment variable naming the key, for the command.
pub const ENV_KEY: &str = "DAGNATS_LEASE_KEY";
/// The environment variable naming the holder ID, for the command.
pub const ENV_HOLDER: &str = "DAGNATS_LEASE_HOLDER";
/// The environment variable holding the fence (the tenure's revision), for the command.
pub const ENV_FENCE: &str = "DAGNATS_LEASE_FENCE";

/// The options of `lock`.
#[derive(Debug, Clone, clap::Args)]
pub struct LockArgs {
    /// The lease key.
    pub key: String,
    /// Holder ID (default: `lock-` and random hex, unique to this process).
    #[arg(long, env = "DAGNATS_HOLDER")]
    pub holder: Option<String>,
    /// Time to live, whole seconds, in milliseconds (`15000`) or with a unit
    /// (`15s`).
    #[arg(long, env = "DAGNATS_TTL_MS", default_value = "15000", value_parser = crate::cli::parse_millis)]
    pub ttl_ms: u64,
    /// Time to live (`15s`, `1m`; a bare number is seconds): instead of --ttl-ms (it wins over it).
    #[arg(long, env = "DAGNATS_TTL", value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// Hold one of N slots of a semaphore named KEY (the leases `KEY-0` to
    /// `KEY-<N-1>`) instead of KEY itself: at most N commands run at once.
    #[arg(long, env = "DAGNATS_PERMITS")]
    pub permits: Option<usize>,
    /// How long to wait to be elected (default: for ever; a bare number is
    /// seconds); `0` tries once.
    #[arg(long, env = "DAGNATS_WAIT", value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Between SIGTERM and SIGKILL when the lease is lost (default: ttl/3, at most
    /// 5s; at most ttl/2, else `lock` exits 6).
    #[arg(long, env = "DAGNATS_GRACE", value_parser = parse_duration)]
    pub grace: Option<Duration>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// The options of the hidden `__lock-watchdog` (started by `lock`, never by hand).
#[derive(Debug, Clone, clap::Args)]
pub struct WatchdogArgs {
    /// Between SIGTERM and SIGKILL, in milliseconds.
    #[arg(long)]
    pub grace_ms: u64,
    /// The first deadline, `SECONDS.NANOSECONDS` of CLOCK_BOOTTIME.
    #[arg(long)]
    pub deadline: String,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}
