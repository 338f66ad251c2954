//! How a service runs: the operator's options and what the server said.

use std::time::Duration;

use super::bucket::BucketOptions;
use super::coalesce::{
    CoalesceWrites, DEFAULT_BATCHES_IN_FLIGHT, DEFAULT_MAX_BATCH, DEFAULT_MIN_BATCH,
};
use super::peers::ChangesSetting;
use super::replicas::REPLICAS_RECHECK;
use crate::call::DEFAULT_KV_TIMEOUT;
use crate::known::DEFAULT_KNOWN_CAPACITY;
use crate::reply_scope::ReplyScope;
use crate::tenant::TenantAccounts;

/// The default bound on calls running at once: room for the write coalescer to
/// gather full batches at a single server's capacity (a stream renewing 22,500
/// leases a second at 160 ms each has some 3,600 calls running; with 1,024 one
/// server held 75,000 leases, with 4,096 150,000: docs/benchmarks.md, capacity), far
/// below what a burst of tens of thousands of requests would cost in memory.
pub const DEFAULT_MAX_CALLS_IN_FLIGHT: usize = 4096;

/// The default bound on how long a stop waits for the calls in flight.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// How the service runs: the operator's options and what the server said in INFO.
/// Its defaults ([`ServiceConfig::default`]) are the only ones: the adapters'
/// options and the CLI's flags take theirs from here.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The bucket's replicas and the tenancy.
    pub bucket: BucketOptions,
    /// The server's version from INFO: whether it has per-message TTL and batches.
    pub server_version: String,
    /// The server's `max_payload`, which bounds a forward's reply.
    pub max_payload: usize,
    /// Bound on each JetStream request.
    pub kv_timeout: Duration,
    /// How long a stop waits for the calls in flight.
    pub shutdown_timeout: Duration,
    /// How often the stream's replicas are asked again while serving.
    pub replicas_recheck: Duration,
    /// At most this many calls run at once ([`Admission`](super::admit::Admission)).
    pub max_calls_in_flight: usize,
    /// At most this many requests wait for a call to end.
    pub max_calls_waiting: usize,
    /// Whether the calls' writes go through the write [`Coalescer`](super::coalesce::Coalescer): `Auto` as
    /// [`coalesce_on`](super::coalesce::coalesce_on) decides (on wherever the
    /// stream takes atomic batches).
    pub coalesce_writes: CoalesceWrites,
    /// Single writes in flight before writes gather into batches; `None` follows
    /// the stream's replicas at startup ([`single_window`](super::coalesce::single_window)).
    pub batch_after: Option<usize>,
    /// The smallest batch the coalescer sends.
    pub min_batch: usize,
    /// The largest batch the coalescer sends.
    pub max_batch: usize,
    /// Batches the coalescer has out at once.
    pub batches_in_flight: usize,
    /// This instance's process-unique id (a NUID): the micro protocol's instance id
    /// and the prefix of its batch ids.
    pub instance_id: String,
    /// The service's version, for `$SRV.INFO`.
    pub version: String,
    /// The reply subjects the service answers.
    pub reply_scope: ReplyScope,
    /// Tenancy: at most this many live leases per tenant account.
    pub max_leases_per_tenant: Option<usize>,
    /// Tenancy: the accounts served; a request of any other is refused, and
    /// tenancy with none named refuses to start.
    pub tenant_accounts: TenantAccounts,
    /// How many keys' last revisions the service remembers (0: none, no change
    /// events subscribed for them).
    pub known_capacity: usize,
    /// When the change events are taken: `Auto`, only while another instance
    /// serves (always in tenancy); `Always`, from the start ([`super::peers`]).
    pub changes: ChangesSetting,
    /// Whether the service serves `renew_many` (many renewals in one request) and
    /// advertises it in `$SRV.INFO`; off, it is a service of the five endpoints alone.
    pub renew_many: bool,
    /// Test stand-in: answer from unconfirmed reads even on a replicated bucket, to
    /// show what the fault tests catch without read confirmation.
    #[cfg(any(test, feature = "__test"))]
    pub unconfirmed_reads_for_tests: bool,
}

impl ServiceConfig {
    /// The defaults for a server of `server_version` with `max_payload`.
    pub fn new(server_version: impl Into<String>, max_payload: usize) -> Self {
        Self {
            bucket: BucketOptions::default(),
            server_version: server_version.into(),
            max_payload,
            kv_timeout: DEFAULT_KV_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            replicas_recheck: REPLICAS_RECHECK,
            max_calls_in_flight: DEFAULT_MAX_CALLS_IN_FLIGHT,
            max_calls_waiting: DEFAULT_MAX_CALLS_IN_FLIGHT,
            coalesce_writes: CoalesceWrites::Auto,
            batch_after: None,
            min_batch: DEFAULT_MIN_BATCH,
            max_batch: DEFAULT_MAX_BATCH,
            batches_in_flight: DEFAULT_BATCHES_IN_FLIGHT,
            instance_id: "service".to_string(),
            version: String::new(),
            reply_scope: ReplyScope::default(),
            max_leases_per_tenant: None,
            tenant_accounts: TenantAccounts::default(),
            known_capacity: DEFAULT_KNOWN_CAPACITY,
            changes: ChangesSetting::Auto,
            renew_many: true,
            #[cfg(any(test, feature = "__test"))]
            unconfirmed_reads_for_tests: false,
        }
    }
}

/// The defaults, before the server's INFO is known (an adapter fills in
/// `server_version` and `max_payload` from it).
impl Default for ServiceConfig {
    fn default() -> Self {
        Self::new(String::new(), 0)
    }
}
