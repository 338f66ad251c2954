//! What both `serve` binaries share: their options, logging and the stop signal.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use dagnats_leases_core::reply_scope::ReplyScope;
use dagnats_leases_core::service::ServiceConfig;
use dagnats_leases_core::service::bucket::BucketOptions;
use dagnats_leases_core::tenant::{Tenancy, TenantAccounts};

use crate::connect::ConnectOptions;
use crate::service::{Clients, ServiceOptions};
use crate::telemetry;

/// The `serve` command, as both binaries take it.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ServeCommand {
    /// Serve api.leases.* until SIGINT or SIGTERM.
    Serve(ServeArgs),
}

/// The options of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// How to reach NATS.
    #[command(flatten)]
    pub connect: ConnectOptions,
    /// A second NATS user for the service's JetStream and forward requests: the
    /// user above then only reads requests and publishes replies, and may be
    /// allowed to publish to reply inboxes only (docs/security.md).
    #[command(flatten)]
    pub backend: BackendAuth,
    /// A reply subject prefix to answer besides `_INBOX.` and `_R_.` (repeatable;
    /// whole tokens ending in `.`, e.g. `_INBOX_billing.`). A request whose reply
    /// is no reply inbox is dropped unanswered.
    #[arg(
        long = "reply-prefix",
        value_name = "PREFIX",
        env = "DAGNATS_LEASES_REPLY_PREFIXES",
        value_delimiter = ','
    )]
    pub reply_prefixes: Vec<String>,
    /// `single`: one key namespace for every caller. `accounts`: the service runs
    /// in its own NATS account and each tenant account that imports it has its own
    /// keys and events; a request must come through an import (docs/security.md).
    #[arg(
        long,
        env = "DAGNATS_LEASES_TENANCY",
        default_value = "single",
        value_parser = parse_tenancy
    )]
    pub tenancy: Tenancy,
    /// With --tenancy accounts (and required by it): a tenant account the service
    /// serves (repeatable, or comma-separated in the variable). A request whose
    /// subject names any other account, the service's own among them, is
    /// answered `forbidden`.
    #[arg(
        long = "tenant-account",
        value_name = "ACCOUNT",
        env = "DAGNATS_LEASES_TENANT_ACCOUNTS",
        value_delimiter = ','
    )]
    pub tenant_accounts: Vec<String>,
    /// With --tenancy accounts: at most this many live leases per tenant account;
    /// an acquire of a new key past it is answered `forbidden` (default: no cap).
    #[arg(long, env = "DAGNATS_LEASES_MAX_LEASES_PER_TENANT", value_name = "N")]
    pub max_leases_per_tenant: Option<usize>,
    /// Stream replicas of the leases bucket (default: 1 on create, keep an existing one's).
    #[arg(long, env = "DAGNATS_LEASES_REPLICAS")]
    pub replicas: Option<usize>,
    /// How many streams the leases bucket's keys are spread over (1: the one stream
    /// `KV_leases`; N > 1: `KV_leases_0 .. KV_leases_<N-1>`, a key's shard fixed by
    /// its name). The bucket keeps the count it was made with: a service started
    /// with another refuses to start (docs/architecture.md, "Sharded bucket").
    #[arg(
        long,
        env = "DAGNATS_LEASES_SHARDS",
        default_value_t = 1,
        value_name = "N"
    )]
    pub shards: u32,
    /// Bound on each JetStream request, in milliseconds (or with a unit: `5s`).
    #[arg(long, env = "DAGNATS_LEASES_KV_TIMEOUT_MS", default_value_t = millis(dagnats_leases_core::call::DEFAULT_KV_TIMEOUT), value_parser = parse_millis)]
    pub kv_timeout_ms: u64,
    /// How long shutdown waits for calls in flight, in milliseconds (or with a
    /// unit: `10s`).
    #[arg(long, env = "DAGNATS_LEASES_SHUTDOWN_TIMEOUT_MS", default_value_t = millis(dagnats_leases_core::service::DEFAULT_SHUTDOWN_TIMEOUT), value_parser = parse_millis)]
    pub shutdown_timeout_ms: u64,
    /// At most this many calls run at once; further requests wait (see
    /// --max-calls-waiting), so memory stays flat under a burst.
    #[arg(long, env = "DAGNATS_LEASES_MAX_CALLS_IN_FLIGHT", default_value_t = crate::service::DEFAULT_MAX_CALLS_IN_FLIGHT)]
    pub max_calls_in_flight: usize,
    /// At most this many requests wait for a call to end (half kept for renew and
    /// release); past that a request is answered `unavailable` at once.
    #[arg(long, env = "DAGNATS_LEASES_MAX_CALLS_WAITING", default_value_t = crate::service::DEFAULT_MAX_CALLS_IN_FLIGHT)]
    pub max_calls_waiting: usize,
    /// Gather the calls' writes into atomic batches under load (nats-server 2.12+):
    /// `auto` (the default: on, past `--batch-after` single writes, for the
    /// advised `sync_interval: always` servers, where batches held the most
    /// leases; see docs/benchmarks.md), `true`, or `false` (a server on the lazy
    /// default sync).
    #[arg(
        long,
        env = "DAGNATS_LEASES_COALESCE_WRITES",
        default_value = "auto",
        value_name = "auto|true|false"
    )]
    pub coalesce_writes: dagnats_leases_core::service::coalesce::CoalesceWrites,
    /// Serve `renew_many` (many renewals in one request, advertised in `$SRV.INFO`,
    /// which the holder library uses where it is listed): `true` (the default) or
    /// `false` (not subscribed, not listed; the library renews one by one).
    #[arg(
        long,
        env = "DAGNATS_LEASES_RENEW_MANY",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "true|false"
    )]
    pub renew_many: bool,
    /// Single writes in flight before writes start to gather into batches
    /// [default: 16 on a single-replica bucket, 64 on a replicated one, as the
    /// bucket is at startup].
    #[arg(long, env = "DAGNATS_LEASES_BATCH_AFTER", value_name = "N")]
    pub batch_after: Option<usize>,
    /// The smallest batch sent; fewer gathered writes wait for a single to come back.
    #[arg(long, env = "DAGNATS_LEASES_MIN_BATCH", default_value_t = dagnats_leases_core::service::coalesce::DEFAULT_MIN_BATCH)]
    pub min_batch: usize,
    /// The largest batch sent (at most 1,000, the server's bound).
    #[arg(long, env = "DAGNATS_LEASES_MAX_BATCH", default_value_t = dagnats_leases_core::service::coalesce::DEFAULT_MAX_BATCH)]
    pub max_batch: usize,
    /// Batches out at once (at most 50, the server's bound per stream).
    #[arg(long, env = "DAGNATS_LEASES_BATCHES_IN_FLIGHT", default_value_t = dagnats_leases_core::service::coalesce::DEFAULT_BATCHES_IN_FLIGHT)]
    pub batches_in_flight: usize,
    /// How many keys' last revisions the service remembers (learnt from its own
    /// calls and the change events), so a renew or release of a revision it knows
    /// is one write and no read; 0 turns that off (every renew and release reads).
    #[arg(long, env = "DAGNATS_LEASES_KNOWN_KEYS", default_value_t = dagnats_leases_core::known::DEFAULT_KNOWN_CAPACITY)]
    pub known_keys: usize,
    /// When the service takes the change events: `auto` (the default: only while
    /// another instance serves, heard by its presence heartbeat on
    /// `dagnats.lease.presence`; always in tenancy) or `always` (from the start).
    /// Alone, an instance knows its own writes from their acks.
    #[arg(
        long,
        env = "DAGNATS_LEASES_CHANGES",
        default_value = "auto",
        value_name = "auto|always"
    )]
    pub changes: dagnats_leases_core::service::peers::ChangesSetting,
    /// Log lines as readable text (colours only on a terminal) or as JSON objects,
    /// one a line.
    #[arg(long, env = "DAGNATS_LEASES_LOG_FORMAT", default_value = "text", value_name = "text|json", value_parser = parse_log_format)]
    pub log_format: LogFormat,
    /// Serve the metrics over HTTP on this address, e.g. `127.0.0.1:9464`:
    /// `/metrics` (Prometheus text), `/livez` and `/readyz` (200, or 503 with
    /// the reason). Off when left out.
    #[arg(long, env = "DAGNATS_LEASES_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Test only (feature `__test`): answer from unconfirmed reads on a replicated
    /// bucket, so that a benchmark can measure what confirmation costs.
    #[cfg(feature = "__test")]
    #[arg(long, hide = true)]
    pub unconfirmed_reads_for_tests: bool,
}

/// How the service's second connection authenticates (TLS and the URL are the
/// first one's). None given: one connection does everything.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BackendAuth {
    /// Credentials file of the backend user.
    #[arg(long, env = "DAGNATS_BACKEND_CREDS")]
    pub backend_creds: Option<std::path::PathBuf>,
    /// Backend user name (with --backend-password).
    #[arg(long, env = "DAGNATS_BACKEND_USER")]
    pub backend_user: Option<String>,
    /// Backend user's password.
    #[arg(long, env = "DAGNATS_BACKEND_PASSWORD")]
    pub backend_password: Option<String>,
    /// Backend user's nkey seed.
    #[arg(long, env = "DAGNATS_BACKEND_NKEY")]
    pub backend_nkey: Option<String>,
}

/// Reads a duration given as a time (`--wait`, `--grace`, `--ttl`): humantime's
/// `250ms`, `5s`, `1.5s`, `2m`, `1h 30m`, or a bare number of seconds (`30`, `0`).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(secs));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); e.g. 0, 30, 500ms, 5s, 2m"))
}

/// A default duration as a `--*-ms` option shows it: whole milliseconds.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Reads a `--*-ms` option: a bare number of milliseconds (`15000`, as ever), or a
/// duration with a unit (`15s`, `1m`, `500ms`).
pub fn parse_millis(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    let d = humantime::parse_duration(text).map_err(|e| {
        format!("{text:?} is neither milliseconds nor a duration ({e}); e.g. 15000, 15s, 1m")
    })?;
    u64::try_from(d.as_millis()).map_err(|_| format!("{text:?} is too long"))
}

/// The reply inbox prefix of the service's backend connection.
pub const BACKEND_INBOX_PREFIX: &str = "_dagnats_backend";

/// `single` or `accounts`, as `--tenancy` takes it.
fn parse_tenancy(s: &str) -> Result<Tenancy, String> {
    match s {
        "single" => Ok(Tenancy::Single),
        "accounts" => Ok(Tenancy::Accounts),
        other => Err(format!("{other:?}: expected single or accounts")),
    }
}

impl BackendAuth {
    /// `connect` with this authentication instead of its own, or `None` when none
    /// is given.
    fn options(&self, connect: &ConnectOptions) -> Option<ConnectOptions> {
        if self.backend_creds.is_none()
            && self.backend_user.is_none()
            && self.backend_password.is_none()
            && self.backend_nkey.is_none()
        {
            return None;
        }
        Some(ConnectOptions {
            creds: self.backend_creds.clone(),
            user: self.backend_user.clone(),
            password: self.backend_password.clone(),
            token: None,
            nkey: self.backend_nkey.clone(),
            name: format!("{}-backend", connect.name),
            // Its own inboxes: the serving user, allowed `_INBOX.>`, cannot
            // publish a forged JetStream answer into them.
            inbox_prefix: Some(BACKEND_INBOX_PREFIX.to_string()),
            ..connect.clone()
        })
    }
}

impl ServeArgs {
    /// The service's connections: the strict serving connection's options (the
    /// service opens it) and the backend client, connected as the serving user or,
    /// when `--backend-*` is given, as the backend user.
    pub async fn connect(&self) -> Result<Clients, crate::Error> {
        let backend = match self.backend.options(&self.connect) {
            None => self.connect.connect().await?,
            Some(backend) => backend.connect().await?,
        };
        Ok(Clients::new(self.connect.strict(), backend))
    }

    /// The service options these arguments give, or why they cannot be had.
    pub fn service_options(&self) -> Result<ServiceOptions, crate::Error> {
        let reply_scope = ReplyScope::with_prefixes(&self.reply_prefixes)
            .map_err(|e| crate::Error::new(crate::ErrorKind::Config, e))?;
        let config = |e: String| crate::Error::new(crate::ErrorKind::Config, e);
        let tenant_accounts = TenantAccounts::new(&self.tenant_accounts)
            .map_err(|e| config(format!("--tenant-account: {e}")))?;
        match (self.tenancy, tenant_accounts.is_empty()) {
            (Tenancy::Accounts, true) => {
                return Err(config(
                    "--tenancy accounts needs the tenant accounts it serves: name each with \
                     --tenant-account (or DAGNATS_LEASES_TENANT_ACCOUNTS=TA,TB)"
                        .to_string(),
                ));
            }
            (Tenancy::Single, false) => {
                return Err(config(
                    "--tenant-account is for --tenancy accounts: one namespace has no tenants"
                        .to_string(),
                ));
            }
            _ => {}
        }
        let shards = dagnats_leases_core::shard::ShardMap::new(self.shards)
            .map_err(|e| crate::Error::new(crate::ErrorKind::Config, e))?;
        Ok(ServiceOptions::from(ServiceConfig {
            bucket: BucketOptions {
                replicas: self.replicas,
                tenancy: self.tenancy,
                shards,
            },
            kv_timeout: Duration::from_millis(self.kv_timeout_ms),
            shutdown_timeout: Duration::from_millis(self.shutdown_timeout_ms),
            max_calls_in_flight: self.max_calls_in_flight,
            max_calls_waiting: self.max_calls_waiting,
            coalesce_writes: self.coalesce_writes,
            renew_many: self.renew_many,
            batch_after: self.batch_after,
            min_batch: self.min_batch,
            max_batch: self.max_batch,
            batches_in_flight: self.batches_in_flight,
            known_capacity: self.known_keys,
            changes: self.changes,
            #[cfg(feature = "__test")]
            unconfirmed_reads_for_tests: self.unconfirmed_reads_for_tests,
            reply_scope,
            tenant_accounts,
            max_leases_per_tenant: self.max_leases_per_tenant,
            ..ServiceConfig::default()
        }))
    }
}

/// Upper bounds of the latency histograms' buckets, in seconds: calls and renews.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the campaign-to-elected histogram's buckets, in seconds: a free
/// key is won in milliseconds, a held one at its holder's release or expiry.
pub const ELECTION_BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

/// The Prometheus recorder `serve --metrics-addr` installs, without its listener:
/// every histogram of [`telemetry`] as a Prometheus histogram with these buckets
/// (the exporter's default is a summary). A test or an application may install it
/// with [`PrometheusBuilder::install_recorder`] and render the text itself.
pub fn prometheus_builder() -> PrometheusBuilder {
    let buckets = |name: &str| {
        if name == telemetry::CAMPAIGN_TO_ELECTED {
            &ELECTION_BUCKETS[..]
        } else {
            &LATENCY_BUCKETS[..]
        }
    };
    telemetry::HISTOGRAMS
        .iter()
        .fold(PrometheusBuilder::new(), |builder, name| {
            builder
                .set_buckets_for_metric(Matcher::Full(name.to_string()), buckets(name))
                .expect("the bucket lists are not empty")
        })
}

/// Installs the process's metrics recorder and serves its Prometheus text over
/// HTTP on `addr` (bound before it returns). Call it inside a tokio runtime
/// (on smol: in the `block_on` of one), where the listener is spawned.
pub fn serve_metrics(addr: SocketAddr) -> Result<(), crate::Error> {
    let handle = prometheus_builder()
        .install_recorder()
        .map_err(|e| crate::Error::new(crate::ErrorKind::Config, e))?;
    crate::probe::serve(addr, handle)
        .map_err(|e| crate::Error::new(crate::ErrorKind::Config, e))?;
    telemetry::describe();
    Ok(())
}

/// How `serve` writes its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Readable lines, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object a line (time, level, target, fields), never coloured.
    Json,
}

/// `text` or `json`, as `--log-format` takes it.
fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(format!("{other:?}: expected text or json")),
    }
}

/// Logs to stderr through tracing, `RUST_LOG` filtering (default `info`), as text.
pub fn init_logging() {
    init_logging_as(LogFormat::Text);
}

/// Logs to stderr through tracing in `format`, `RUST_LOG` filtering (default
/// `info`). Colours only when stderr is a terminal: a log file or a journal gets
/// plain text.
pub fn init_logging_as(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // async-nats logs every reconnect attempt at INFO itself; the service's own
        // connection log says an outage once (WARN) and its end once (INFO).
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,async_nats=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// Resolves on SIGINT or SIGTERM (needs tokio's reactor: a runtime or `async_compat`).
pub async fn wait_for_signal() {
    StopSignals::new().recv().await;
}

/// A signal that stops `serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT (Ctrl-C).
    Int,
    /// SIGTERM.
    Term,
}

impl StopSignal {
    /// The exit code of a process this signal stopped at once: 128 + its number,
    /// as a shell reports a process the signal killed.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Int => 130,
            Self::Term => 143,
        }
    }
}

/// SIGINT and SIGTERM, handled from creation on: the first starts the stop, a
/// second (of either) stops at once. One set for the process's life, so that no
/// signal falls between two listeners.
#[derive(Debug)]
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Handles both signals from now on (needs tokio's reactor).
    pub fn new() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        Self {
            term: signal(SignalKind::terminate()).expect("SIGTERM handler"),
            int: signal(SignalKind::interrupt()).expect("SIGINT handler"),
        }
    }

    /// The next signal.
    pub async fn recv(&mut self) -> StopSignal {
        tokio::select! {
            _ = self.int.recv() => StopSignal::Int,
            _ = self.term.recv() => StopSignal::Term,
        }
    }
}

impl Default for StopSignals {
    fn default() -> Self {
        Self::new()
    }
}

pub use crate::exit::{EXIT_NO_SERVER, EXIT_START_FAILED};

/// What both `serve` binaries do before they serve: the metrics listener, the
/// service options and the connections, each failure logged with its exit code.
/// The start itself (`start`, on the binary's runtime) races the stop signals: a
/// signal before the service serves ends the start at once.
pub async fn start_serving<T, F>(
    args: &ServeArgs,
    signals: &mut StopSignals,
    start: impl FnOnce(Clients, ServiceOptions) -> F,
) -> Result<(T, Duration), u8>
where
    F: std::future::Future<Output = Result<T, crate::Error>>,
{
    if let Some(addr) = args.metrics_addr {
        if let Err(e) = serve_metrics(addr) {
            tracing::error!("cannot serve metrics on {addr}: {e}");
            return Err(EXIT_START_FAILED);
        }
        tracing::info!("serving metrics on http://{addr}/metrics (and /livez, /readyz)");
    }
    let mut options = args.service_options().map_err(|e| {
        tracing::error!("{e}");
        EXIT_START_FAILED
    })?;
    // Each connection counts itself down and up: readiness follows.
    let links = crate::connect::LinksDown::new();
    options.links_down = Some(links.subscribe());
    let mut args = args.clone();
    args.connect.links_down = Some(links);
    let args = &args;
    let shutdown_timeout = options.shutdown_timeout;
    let starting = async {
        let clients = args.connect().await.map_err(|e| {
            tracing::error!("cannot connect to {}: {e}", args.connect.nats_url);
            EXIT_NO_SERVER
        })?;
        start(clients, options).await.map_err(|e| {
            tracing::error!("cannot start: {e}");
            EXIT_START_FAILED
        })
    };
    tokio::select! {
        started = starting => started.map(|t| (t, shutdown_timeout)),
        signal = signals.recv() => {
            tracing::info!("{signal:?} received while starting: stopping now");
            Err(signal.exit_code())
        }
    }
}
