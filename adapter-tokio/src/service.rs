//! The lease service: ensures the bucket, registers the `dagnats-api` micro
//! service, and runs each request's call machine, all of them polled by one
//! serving future that spawns nothing and keeps time on a [`Runtime`].
//!
//! Every reply goes to the request's reply subject only when that is a reply
//! inbox ([`dagnats_leases_core::reply_scope`]); the micro protocol's `$SRV`
//! verbs are answered here too, behind the same rule
//! ([`dagnats_leases_core::micro`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::Client;
use std::collections::HashMap;

use dagnats_leases_core::admit::{Admission, Admit};
use dagnats_leases_core::call::{Call, CallConfig, DEFAULT_KV_TIMEOUT};
use dagnats_leases_core::change::ChangeEvent;
use dagnats_leases_core::coalesce::{
    self, CoalesceWrites, Coalescer, CoalescerConfig, CoalescerEvent, WriteId,
};
use dagnats_leases_core::io::{EffectId, Mode, Transmit};
use dagnats_leases_core::micro::MicroService;
use dagnats_leases_core::replicas::{ReplicasCheck, ReplicasEvent};
use dagnats_leases_core::reply_scope::ReplyScope;
use dagnats_leases_core::shard::ShardMap;
use dagnats_leases_core::shutdown::{Shutdown, StopEvent, StopPhase};
use dagnats_leases_core::startup::{BucketOptions, REPLICAS_RECHECK, Startup, StartupEvent};
use dagnats_leases_core::subjects::{QUEUE_GROUP, TENANT_CHANGED_SUBJECTS};
use dagnats_leases_core::sweep::{SweepEvent, TombstoneSweep};
use dagnats_leases_core::tenant::{self, Caller, Tenancy, TenantLeases};
use dagnats_leases_core::wire::{Endpoint, ErrorKind, ErrorReply, Response};
use dagnats_leases_core::{NatsRequest, RequestOutcome};
use futures::future::AbortHandle;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt};
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot, watch};

use crate::exec;
use crate::intake::{self, Admitted, Gate, Incoming, Source};
use crate::known::KnownCache;
use crate::runtime::{self, Runtime, TokioRuntime};
use crate::telemetry::{self, JsOp};
use crate::{Error, ErrorKind as ServiceErrorKind};

/// The default bound on calls running at once: far above what one service needs to
/// keep JetStream busy (a call is a few round trips), far below what a burst of
/// tens of thousands of requests would cost in memory.
pub const DEFAULT_MAX_CALLS_IN_FLIGHT: usize = 1024;

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Stream replicas of the bucket; `None` creates with 1 and leaves an existing one's.
    pub replicas: Option<usize>,
    /// Bound on each JetStream request.
    pub kv_timeout: Duration,
    /// How long shutdown waits for calls in flight.
    pub shutdown_timeout: Duration,
    /// How often the stream's replicas are asked again while serving: read
    /// confirmation turns on when they go above 1 and off when they come back.
    pub replicas_recheck: Duration,
    /// At most this many calls run at once; further requests wait, up to
    /// `max_calls_waiting`, and past that are answered `unavailable` at once
    /// ([`dagnats_leases_core::admit`]): the service's memory stays flat whatever
    /// the burst, and no call is answered long after its caller gave up.
    pub max_calls_in_flight: usize,
    /// At most this many requests wait for a call to end (half of them kept for
    /// renew and release).
    pub max_calls_waiting: usize,
    /// Whether the calls' writes go through one write coalescer
    /// ([`dagnats_leases_core::coalesce`]): past `batch_after` single writes in
    /// flight they gather into atomic batches when the stream allows it
    /// (nats-server 2.12+). `Auto` by default: on for a single-replica bucket
    /// only ([`coalesce::coalesce_on`]), where `scripts/bench` measured batches
    /// winning with many writes in flight; on a three-node cluster they lost (see
    /// docs/benchmarks.md).
    pub coalesce_writes: CoalesceWrites,
    /// Single writes in flight before writes gather into batches.
    pub batch_after: usize,
    /// The smallest batch the coalescer sends; fewer gathered writes wait for a
    /// single write to come back and go single.
    pub min_batch: usize,
    /// The reply subjects the service answers: `_INBOX.`, `_R_.` and the
    /// operator's own prefixes. A request with any other reply is dropped
    /// unanswered and no call runs for it.
    pub reply_scope: ReplyScope,
    /// One key namespace, or one per tenant account (`serve --tenancy accounts`,
    /// [`dagnats_leases_core::tenant`]).
    pub tenancy: Tenancy,
    /// Tenancy: at most this many live leases per tenant account; an acquire of a
    /// new key past it is answered `forbidden` ([`TenantLeases`]).
    pub max_leases_per_tenant: Option<usize>,
    /// How many keys' last revisions the service remembers
    /// ([`dagnats_leases_core::known`]), learnt from its own calls and from the
    /// change events it subscribes to: a renew or release of a revision it knows is
    /// one conditional write and no read. 0: nothing remembered, no subscription,
    /// every renew and release reads first.
    pub known_capacity: usize,
    /// How many streams the bucket's keys are spread over (`serve --shards`,
    /// [`dagnats_leases_core::shard`]); one is the one-stream layout.
    pub shards: ShardMap,
    /// Test only: answer from unconfirmed reads even on a replicated bucket, to
    /// show what the fault tests catch without read confirmation.
    #[cfg(feature = "__test")]
    pub unconfirmed_reads_for_tests: bool,
}

impl ServiceOptions {
    /// The call config for a bucket of `replicas`.
    fn call_config(&self, base: CallConfig, replicas: usize) -> CallConfig {
        let config = base.for_replicas(replicas);
        #[cfg(feature = "__test")]
        if self.unconfirmed_reads_for_tests {
            return CallConfig {
                confirm_reads: false,
                ..config
            };
        }
        config
    }
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            replicas: None,
            kv_timeout: DEFAULT_KV_TIMEOUT,
            shutdown_timeout: Duration::from_secs(10),
            replicas_recheck: REPLICAS_RECHECK,
            max_calls_in_flight: DEFAULT_MAX_CALLS_IN_FLIGHT,
            max_calls_waiting: DEFAULT_MAX_CALLS_IN_FLIGHT,
            coalesce_writes: CoalesceWrites::Auto,
            batch_after: coalesce::DEFAULT_SINGLE_WINDOW,
            min_batch: coalesce::DEFAULT_MIN_BATCH,
            reply_scope: ReplyScope::default(),
            tenancy: Tenancy::Single,
            max_leases_per_tenant: None,
            known_capacity: dagnats_leases_core::known::DEFAULT_KNOWN_CAPACITY,
            shards: ShardMap::SINGLE,
            #[cfg(feature = "__test")]
            unconfirmed_reads_for_tests: false,
        }
    }
}

/// A running service, on whichever [`Runtime`] it was started. Dropping it without
/// [`ServiceHandle::shutdown`] aborts it.
#[derive(Debug)]
pub struct ServiceHandle {
    mode: Mode,
    stop: watch::Sender<bool>,
    /// Fires when the serving task ends; `None` once awaited.
    done: Option<oneshot::Receiver<()>>,
    abort: AbortHandle,
}

impl ServiceHandle {
    /// `Ready`, or `Unsupported` on a server without per-message TTL.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Stops taking requests, lets calls in flight finish within the bound, and returns.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
    }
}

impl Drop for ServiceHandle {
    fn drop(&mut self) {
        if self.done.is_some() {
            self.abort.abort();
        }
    }
}

/// The service's connections: `serving` reads the requests and publishes the
/// replies, `backend` makes every other request (JetStream, the owners' inboxes).
///
/// One client serves as both (`From<Client>`). The documented deployment gives
/// them two NATS users: the serving user may publish only to reply inboxes, so
/// even a broken reply check could not write the bucket (docs/security.md).
#[derive(Debug, Clone)]
pub struct Clients {
    /// Subscribes to the lease API and `$SRV`, and publishes replies.
    pub serving: Client,
    /// Talks to JetStream and to the owners' inboxes.
    pub backend: Client,
}

impl From<Client> for Clients {
    fn from(client: Client) -> Self {
        Self {
            serving: client.clone(),
            backend: client,
        }
    }
}

/// Ensures the bucket (waiting while JetStream is not ready, and answering every
/// call `unavailable` meanwhile), then serves on tokio.
pub async fn start(
    clients: impl Into<Clients>,
    options: ServiceOptions,
) -> Result<ServiceHandle, Error> {
    start_on(TokioRuntime::shared(), clients, options).await
}

/// [`start`] on `runtime`: the serving future is spawned there and keeps time with
/// its timer.
pub async fn start_on(
    runtime: Arc<dyn Runtime>,
    clients: impl Into<Clients>,
    options: ServiceOptions,
) -> Result<ServiceHandle, Error> {
    let prepared = prepare(runtime.clone(), clients, options).await?;
    let (serve, abort) = futures::future::abortable(prepared.serve);
    let (finished, done) = oneshot::channel();
    runtime.spawn(Box::pin(async move {
        let _ = serve.await;
        let _ = finished.send(());
    }));
    Ok(ServiceHandle {
        mode: prepared.mode,
        stop: prepared.stop,
        done: Some(done),
        abort,
    })
}

/// A service ready to serve: its mode, its stop switch, and the one future that
/// serves every request until the switch is thrown. The future spawns nothing and
/// keeps time on the [`Runtime`] it was prepared with, so that runtime's executor
/// (or any other) can poll it.
pub struct Prepared {
    /// `Ready`, or `Unsupported` on a server without per-message TTL.
    pub mode: Mode,
    /// Send `true` to stop taking requests and drain the calls in flight.
    pub stop: watch::Sender<bool>,
    /// Serves until stopped.
    pub serve: futures::future::BoxFuture<'static, ()>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("mode", &self.mode)
            .finish()
    }
}

/// Registers the endpoints and ensures the bucket; returns the serving future.
///
/// The endpoints answer from the start: while the bucket is being ensured (and
/// JetStream may not be there yet) every call replies `unavailable`
/// ([`Mode::Starting`]), so callers retry instead of seeing no responders. This
/// future answers those itself, until it returns with the mode startup settled on.
///
/// The micro protocol's verbs (`$SRV.PING`, `INFO`, `STATS`) are answered by the
/// same loop, behind the same reply rule. async-nats needs a tokio context: on
/// smol, poll this future and the serving one under `async_compat::Compat`.
pub async fn prepare(
    runtime: Arc<dyn Runtime>,
    clients: impl Into<Clients>,
    options: ServiceOptions,
) -> Result<Prepared, Error> {
    let Clients { serving, backend } = clients.into();
    let client = backend;
    let info = client.server_info();
    if info.version.is_empty() {
        // Judging support from an empty INFO would wrongly settle on `unsupported`.
        return Err(Error::new(
            ServiceErrorKind::Config,
            "the client has not received the server's INFO yet: connect without \
             retry_on_initial_connect, or wait for the connection first",
        ));
    }
    telemetry::set_mode(Mode::Starting);
    // The instance id: unique per process, as the micro protocol asks.
    let inbox = serving.new_inbox();
    let id = inbox.rsplit('.').next().unwrap_or_default().to_string();
    let mut micro = MicroService::new(id, env!("CARGO_PKG_VERSION"), OffsetDateTime::now_utc());
    let mut requests = intake::subscribe(&serving, &micro).await?;
    // Push the subscriptions onto the socket (async-nats' flush does not wait for the
    // server): the server reads them before anything this client sends after them.
    serving
        .flush()
        .await
        .map_err(|e| Error::new(ServiceErrorKind::Nats, e))?;
    let mut gate = Gate::new(options.reply_scope.clone(), options.tenancy);
    let starting = CallConfig {
        mode: Mode::Starting,
        max_payload: info.max_payload,
        kv_timeout: options.kv_timeout,
        confirm_reads: false,
        shards: options.shards,
    };
    let (mode, replicas, atomic) = {
        let ensure = ensure_bucket(&*runtime, &client, &options, &info.version);
        tokio::pin!(ensure);
        loop {
            tokio::select! {
                settled = &mut ensure => break settled.map_err(|refused| Error::new(ServiceErrorKind::Config, refused))?,
                Some((source, message)) = requests.next() => {
                    let Some(request) = gate.admit(runtime.now(), source, message) else { continue };
                    let body = match source {
                        // No effects in `Starting` mode: the reply is at hand.
                        Source::Api(endpoint) => {
                            let started = runtime.now();
                            let response = drive_call(&*runtime, &client, starting, None, endpoint, &request.payload, std::future::pending(), None, None).await;
                            let took = runtime.now() - started;
                            telemetry::call_answered(endpoint, &response, took);
                            micro.handle_answered(endpoint, &response, took);
                            response.to_json()
                        }
                        Source::Srv => match micro.verb_of(&request.subject) {
                            Some(verb) => micro.reply(verb),
                            None => continue,
                        },
                    };
                    intake::reply(&*runtime, &serving, request.reply, body).await;
                }
            }
        }
    };
    telemetry::set_mode(mode);
    if options.tenancy == Tenancy::Accounts
        && let Some(warning) = tenant::request_info_warning(&info.version)
    {
        tracing::warn!("{warning}");
    }
    // Whether writes go through the coalescer: the setting, the bucket's replicas
    // and whether the stream takes batches decide; the serve loop reads the answer.
    let atomic = coalesce::coalesce_on(options.coalesce_writes, replicas, atomic);
    let options = ServiceOptions {
        coalesce_writes: if atomic {
            CoalesceWrites::On
        } else {
            CoalesceWrites::Off
        },
        ..options
    };
    let base = CallConfig { mode, ..starting };
    let config = options.call_config(base, replicas);
    tracing::info!(
        ?mode,
        replicas,
        confirm_reads = config.confirm_reads,
        atomic_batches = atomic,
        max_payload = info.max_payload,
        server = %info.version,
        "serving api.leases.* in queue group {QUEUE_GROUP}"
    );
    let (stop, stopped) = watch::channel(false);
    let writer = Writer::new(&client, atomic, &options, runtime.now());
    // The replicas are asked again now and then: read confirmation follows them.
    let check = (mode == Mode::Ready).then(|| {
        ReplicasCheck::new(
            options.replicas_recheck,
            options.kv_timeout,
            replicas,
            runtime.now(),
        )
        .with_shards(options.shards)
    });
    let known = (options.known_capacity > 0).then(|| KnownCache::new(options.known_capacity));
    let watch = known
        .clone()
        .map(|k| k.watch(client.clone(), options.tenancy));
    let serve = serve(
        runtime,
        Intake {
            serving,
            requests,
            gate,
            micro,
        },
        client,
        config,
        options,
        stopped,
        writer,
        check,
        known,
    );
    Ok(Prepared {
        mode,
        stop,
        serve: Box::pin(watching(serve, watch)),
    })
}

/// What the serve loop reads requests from and answers them through.
struct Intake {
    serving: Client,
    requests: Incoming,
    gate: Gate,
    micro: MicroService,
}

/// Runs `serve` to its end while `watch` (which never ends) feeds the known map.
/// The watch is polled first: a change event the connection delivered before a
/// request is learnt before that request's call starts.
async fn watching(
    serve: impl std::future::Future<Output = ()>,
    watch: Option<impl std::future::Future<Output = ()>>,
) {
    let Some(watch) = watch else {
        return serve.await;
    };
    let (serve, watch) = (std::pin::pin!(serve), std::pin::pin!(watch));
    futures::future::select(watch, serve).await;
}

/// The mode to serve in, the stream's replicas, and whether it takes atomic
/// batches; or why the service must not start (the bucket has another layout).
async fn ensure_bucket(
    runtime: &dyn Runtime,
    client: &Client,
    options: &ServiceOptions,
    version: &str,
) -> Result<(Mode, usize, bool), String> {
    let bucket = BucketOptions {
        replicas: options.replicas,
        tenancy: options.tenancy,
        shards: options.shards,
    };
    let mut startup = Startup::new(bucket, version, options.kv_timeout, runtime.now());
    loop {
        while let Some(event) = startup.poll_event() {
            match event {
                StartupEvent::Log(line) => tracing::warn!("{line}"),
                StartupEvent::Done(mode) => {
                    return Ok((mode, startup.replicas(), startup.atomic()));
                }
                StartupEvent::Refused(why) => return Err(why),
            }
        }
        if let Some(t) = startup.poll_transmit() {
            let outcome = exec::send(runtime, client, t.request).await;
            startup.handle_outcome(runtime.now(), t.id, outcome);
            continue;
        }
        if let Some(at) = startup.poll_timeout() {
            runtime.sleep_until(at).await;
            startup.handle_timeout(runtime.now());
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    runtime: Arc<dyn Runtime>,
    intake: Intake,
    client: Client,
    mut config: CallConfig,
    options: ServiceOptions,
    mut stopped: watch::Receiver<bool>,
    mut writer: Writer,
    mut check: Option<ReplicasCheck>,
    known: Option<KnownCache>,
) {
    let Intake {
        serving,
        mut requests,
        mut gate,
        mut micro,
    } = intake;
    let writes = (options.coalesce_writes == CoalesceWrites::On).then(|| writer.sink.clone());
    // Tenancy: every tenant's change events, for its count of live leases.
    let mut tenant_leases = TenantLeases::new(options.max_leases_per_tenant);
    let mut changes = match options.tenancy {
        Tenancy::Accounts => match client.subscribe(TENANT_CHANGED_SUBJECTS).await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(
                    "no per-tenant lease counts: cannot subscribe to change events: {e}"
                );
                None
            }
        },
        Tenancy::Single => None,
    };
    let shutdown_timeout = options.shutdown_timeout;
    let mut check_at = check.as_ref().and_then(ReplicasCheck::poll_timeout);
    let mut recheck = sleep_until(&*runtime, check_at);
    let mut asking: Option<(
        EffectId,
        futures::future::BoxFuture<'static, RequestOutcome>,
    )> = None;
    // Each release's tombstone is purged after its reply
    // ([`dagnats_leases_core::sweep`]): one purge out at a time.
    let mut sweep =
        TombstoneSweep::new(options.kv_timeout, runtime.now()).with_shards(options.shards);
    let mut purging: Option<(
        EffectId,
        futures::future::BoxFuture<'static, RequestOutcome>,
    )> = None;
    // Thrown when shutdown stops waiting: every call still running then ends
    // `internal` through the core (`Call::abort`), and is answered.
    let (cut, cut_off) = watch::channel(false);
    // Every call in flight is polled by this one future: calls run concurrently
    // without spawning, so the same loop serves on any executor.
    let mut calls = FuturesUnordered::new();
    let mut sending: FuturesUnordered<Sending> = FuturesUnordered::new();
    let take = |calls: &mut FuturesUnordered<_>, endpoint: Endpoint, request, config| {
        calls.push(answer(
            runtime.clone(),
            client.clone(),
            serving.clone(),
            config,
            endpoint,
            request,
            cut_off.clone(),
            writes.clone(),
            known.clone(),
        ));
    };
    let mut admission = Admission::new(
        options.max_calls_in_flight,
        options.max_calls_waiting,
        runtime.now(),
    );
    if options.tenancy == Tenancy::Accounts {
        // No tenant's slow calls (forwards to a silent owner) hold every slot.
        admission = admission.with_tenant_share(options.max_calls_in_flight / 2);
    }
    // Starts what admission starts; returns what it refuses, to be answered one at
    // a time (a refusal held in memory per request would undo the bound).
    let admit = |admission: &mut Admission<_>, calls: &mut FuturesUnordered<_>, config| {
        let mut refused = Vec::new();
        while let Some(event) = admission.poll_event() {
            match event {
                Admit::Start(endpoint, request) => take(calls, endpoint, request, config),
                Admit::Refuse(endpoint, request, response) => {
                    refused.push((endpoint, request, response))
                }
            }
        }
        refused
    };
    loop {
        tokio::select! {
            next = requests.next() => {
                let Some((source, message)) = next else { break };
                let Some(request) = gate.admit(runtime.now(), source, message) else { continue };
                match source {
                    Source::Api(endpoint) => {
                        let mut request = request;
                        if let Ok(Some(caller)) = &request.scope
                            && let Err(refused) = tenant_leases.check_request(caller, endpoint, &request.payload)
                        {
                            request.scope = Err(refused);
                        }
                        admission.handle_request_of(runtime.now(), request.tenant(), endpoint, request);
                        for (endpoint, request, response) in admit(&mut admission, &mut calls, config) {
                            sending.push(refuse(&runtime, &serving, &mut micro, endpoint, request, response));
                        }
                    }
                    Source::Srv => sending.push(answer_verb(&runtime, &serving, &micro, request)),
                }
            }
            Some(()) = sending.next(), if !sending.is_empty() => {}
            Some(answered) = calls.next(), if !calls.is_empty() => {
                micro.handle_answered(answered.endpoint, &answered.response, answered.took);
                match (&answered.response, &answered.scope) {
                    (Response::Released(r), scope) => {
                        let key = tenant::storage_key(scope.as_ref(), &r.key);
                        sweep.handle_released(runtime.now(), key, r.revision);
                        if let Some(caller) = scope {
                            tenant_leases.handle_released(&caller.account, &r.key);
                        }
                    }
                    (Response::Acquired(r), Some(caller)) if r.granted => {
                        tenant_leases.handle_granted(&caller.account, &r.lease.key);
                    }
                    _ => {}
                }
                let tenant = answered.scope.as_ref().map(|c| c.account.clone());
                admission.handle_finished_of(runtime.now(), tenant);
                let refused = admit(&mut admission, &mut calls, config);
                debug_assert!(refused.is_empty(), "a call ending refuses nothing");
            }
            Some(change) = async { changes.as_mut().expect("guarded").next().await }, if changes.is_some() => {
                if let Some((account, key)) = TenantLeases::key_of(&change.subject) {
                    let header = |name: &str| change.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str());
                    let event = ChangeEvent::from_parts(header, &change.payload);
                    tenant_leases.handle_change(account, key, event.kind);
                }
            }
            outcome = async { purging.as_mut().expect("guarded").1.as_mut().await }, if purging.is_some() => {
                let (id, _) = purging.take().expect("guarded");
                sweep.handle_outcome(runtime.now(), id, outcome);
            }
            () = writer.step(&runtime, &client) => {}
            () = &mut recheck => {
                if let Some(c) = &mut check {
                    c.handle_timeout(runtime.now());
                }
            }
            outcome = async { asking.as_mut().expect("guarded").1.as_mut().await }, if asking.is_some() => {
                let (id, _) = asking.take().expect("guarded");
                if let Some(c) = &mut check {
                    c.handle_outcome(runtime.now(), id, outcome);
                }
            }
            _ = stopped.changed() => break,
        }
        if let Some(t) = sweep.poll_transmit() {
            let (client, runtime) = (client.clone(), runtime.clone());
            let send = async move { exec::send(&*runtime, &client, t.request).await };
            purging = Some((t.id, Box::pin(send)));
        }
        while let Some(event) = sweep.poll_event() {
            match event {
                SweepEvent::Purged { .. } => {}
                SweepEvent::Failed { key, reason } => {
                    telemetry::tombstone_left("failed");
                    tracing::debug!(key, "the released key's tombstone stays: {reason}")
                }
                SweepEvent::Dropped { key } => {
                    telemetry::tombstone_left("dropped");
                    tracing::debug!(key, "too many tombstones to purge: this one stays")
                }
            }
        }
        let Some(c) = &mut check else { continue };
        while let Some(t) = c.poll_transmit() {
            let (client, runtime) = (client.clone(), runtime.clone());
            let send = async move { exec::send(&*runtime, &client, t.request).await };
            asking = Some((t.id, Box::pin(send)));
        }
        while let Some(event) = c.poll_event() {
            match event {
                ReplicasEvent::ConfirmReads { replicas, on } => {
                    tracing::info!(
                        replicas,
                        confirm_reads = on,
                        "the leases stream's replicas changed"
                    );
                    config = options.call_config(config, replicas);
                }
                ReplicasEvent::StreamReplaced => {
                    tracing::warn!(
                        "the leases stream is gone or was made anew: forgetting the revisions known"
                    );
                    if let Some(known) = &known {
                        known.forget();
                    }
                }
            }
        }
        if c.poll_timeout() != check_at {
            check_at = c.poll_timeout();
            recheck = sleep_until(&*runtime, check_at);
        }
    }
    // Every wait from here on has its bound, decided by the core's stop machine,
    // the unsubscribes included: they are the drain phase's first wait.
    let mut stop = Shutdown::new(runtime.now(), shutdown_timeout);
    // Unsubscribe everything, then keep reading: the requests already delivered to
    // this client are in the subscriptions' buffers, and each stream ends once
    // those are read. Every one of them is answered. The unsubscribes are queued to
    // the connection: a server that is gone must not hold the stop.
    let _ = stop_wait(&*runtime, &stop, intake::drain(&mut requests)).await;
    admission.handle_stop(runtime.now());
    let refused = admit(&mut admission, &mut calls, config);
    debug_assert!(refused.is_empty(), "stopping refuses nothing");
    let in_flight = calls.len();
    if in_flight > 0 {
        tracing::info!("stopping: waiting up to {shutdown_timeout:?} for {in_flight} calls");
    }
    let mut bound = sleep_until(&*runtime, stop.poll_timeout());
    let mut open = true;
    let mut late = 0usize;
    while open || !calls.is_empty() {
        tokio::select! {
            next = requests.next(), if open => match next {
                Some((source, message)) => {
                    let Some(request) = gate.admit(runtime.now(), source, message) else { continue };
                    match source {
                        Source::Api(endpoint) => {
                            late += 1;
                            take(&mut calls, endpoint, request, config);
                        }
                        Source::Srv => sending.push(answer_verb(&runtime, &serving, &micro, request)),
                    }
                }
                None => open = false,
            },
            Some(answered) = calls.next(), if !calls.is_empty() => {
                micro.handle_answered(answered.endpoint, &answered.response, answered.took);
            }
            Some(()) = sending.next(), if !sending.is_empty() => {}
            () = writer.step(&runtime, &client) => {}
            _ = &mut bound => {
                stop.handle_timeout(runtime.now());
                if stop.phase() != StopPhase::Drain {
                    break;
                }
                bound = sleep_until(&*runtime, stop.poll_timeout());
            }
        }
    }
    if stop.phase() == StopPhase::Drain {
        stop.handle_phase_done(runtime.now());
    }
    if late > 0 {
        tracing::info!("stopping: took {late} requests delivered before the unsubscribe");
    }
    // Past the bound: what still runs is cut off and answered `internal`, as is any
    // request still buffered (its call is cut off at once).
    while let Some(event) = stop.poll_event() {
        match event {
            StopEvent::GaveUp(_) if open && calls.is_empty() => {
                tracing::warn!("stopping: the endpoints did not close in time (NATS unreachable?)")
            }
            StopEvent::GaveUp(phase) => {
                tracing::warn!("stopping: gave up waiting in phase {phase:?}")
            }
            StopEvent::CutOff => {
                let _ = cut.send(true);
                if open {
                    while let Some(Some((source, message))) = requests.next().now_or_never() {
                        let Some(request) = gate.admit(runtime.now(), source, message) else {
                            continue;
                        };
                        if let Source::Api(endpoint) = source {
                            take(&mut calls, endpoint, request, config);
                        }
                    }
                }
                if !calls.is_empty() {
                    tracing::warn!(
                        "stopping: {} calls did not finish in time; they are answered `internal`",
                        calls.len()
                    );
                }
            }
        }
    }
    if stop.phase() == StopPhase::Replies {
        // Each cut-off call replies at once; the bound only guards a stuck publish.
        let replies = async {
            loop {
                tokio::select! {
                    next = calls.next() => if next.is_none() { break },
                    () = writer.step(&runtime, &client) => {}
                }
            }
        };
        let sent = stop_wait(&*runtime, &stop, replies).await;
        stop_settle(&*runtime, &mut stop, sent.is_some());
    }
    drop(calls);
    drop(requests);
    // A flush waits until the client's writes are on the socket: for ever while the
    // client reconnects to a server that is gone, as long as the socket is full.
    let flushed = stop_wait(&*runtime, &stop, serving.flush()).await;
    stop_settle(&*runtime, &mut stop, flushed.is_some());
    while let Some(StopEvent::GaveUp(phase)) = stop.poll_event() {
        tracing::warn!("stopping: gave up waiting in phase {phase:?}");
    }
}

/// `future`'s output, or `None` at the stop phase's bound.
async fn stop_wait<F: std::future::Future>(
    runtime: &dyn Runtime,
    stop: &Shutdown,
    future: F,
) -> Option<F::Output> {
    let deadline = stop.poll_timeout().unwrap_or_else(|| runtime.now());
    runtime::until(runtime, deadline, future).await
}

/// Tells the stop machine how the phase's wait ended: `finished`, or at its bound.
fn stop_settle(runtime: &dyn Runtime, stop: &mut Shutdown, finished: bool) {
    let now = runtime.now();
    if finished {
        stop.handle_phase_done(now);
    } else {
        // The timer fired: at the bound, even if the clock reads a hair before it.
        stop.handle_timeout(stop.poll_timeout().map_or(now, |at| now.max(at)));
    }
}

/// A call answered: what the micro protocol's stats count, and whose it was.
struct Answered {
    endpoint: Endpoint,
    response: Response,
    took: Duration,
    scope: Option<Caller>,
}

/// Runs one request's call and sends its reply.
#[allow(clippy::too_many_arguments)]
async fn answer(
    runtime: Arc<dyn Runtime>,
    client: Client,
    serving: Client,
    config: CallConfig,
    endpoint: Endpoint,
    request: Admitted,
    mut cut_off: watch::Receiver<bool>,
    writes: Option<WriteSink>,
    known: Option<KnownCache>,
) -> Answered {
    let cut = async move {
        if cut_off.wait_for(|cut| *cut).await.is_err() {
            // The service is gone without cutting anything off: nothing to wait for.
            std::future::pending::<()>().await;
        }
    };
    let started = runtime.now();
    let (response, scope) = match request.scope {
        Err(refused) => (Response::Error(refused), None),
        Ok(scope) => {
            let response = drive_call(
                &*runtime,
                &client,
                config,
                scope.clone(),
                endpoint,
                &request.payload,
                cut,
                writes.as_ref(),
                known.as_ref(),
            )
            .await;
            (response, scope)
        }
    };
    let took = runtime.now() - started;
    telemetry::call_answered(endpoint, &response, took);
    intake::reply(&*runtime, &serving, request.reply, response.to_json()).await;
    Answered {
        endpoint,
        response,
        took,
        scope,
    }
}

/// Answers a request admission refused, at once.
fn refuse(
    runtime: &Arc<dyn Runtime>,
    serving: &Client,
    micro: &mut MicroService,
    endpoint: Endpoint,
    request: Admitted,
    response: Response,
) -> Sending {
    telemetry::refused(endpoint);
    micro.handle_answered(endpoint, &response, Duration::ZERO);
    let (runtime, serving) = (runtime.clone(), serving.clone());
    Box::pin(async move {
        intake::reply(&*runtime, &serving, request.reply, response.to_json()).await;
    })
}

/// Answers a `$SRV` verb meant for this instance; ignores any other subject.
fn answer_verb(
    runtime: &Arc<dyn Runtime>,
    serving: &Client,
    micro: &MicroService,
    request: Admitted,
) -> Sending {
    let body = micro
        .verb_of(&request.subject)
        .map(|verb| micro.reply(verb));
    let (runtime, serving) = (runtime.clone(), serving.clone());
    Box::pin(async move {
        if let Some(body) = body {
            intake::reply(&*runtime, &serving, request.reply, body).await;
        }
    })
}

/// A reply the serve loop answers without a call (a refusal, a `$SRV` verb), sent
/// beside the loop so that a slow handoff never holds it.
type Sending = futures::future::BoxFuture<'static, ()>;

/// Sleeps until `at`, or for ever without one.
fn sleep_until(runtime: &dyn Runtime, at: Option<Instant>) -> runtime::Sleep {
    match at {
        Some(at) => runtime.sleep_until(at),
        None => Box::pin(std::future::pending()),
    }
}

/// Runs one call to its reply and returns the reply body.
pub async fn run_call(
    runtime: &dyn Runtime,
    client: &Client,
    config: CallConfig,
    endpoint: Endpoint,
    body: &[u8],
) -> Vec<u8> {
    run_call_until(
        runtime,
        client,
        config,
        endpoint,
        body,
        std::future::pending(),
    )
    .await
}

/// Runs one call to its reply, or until `cut` completes: the call is then cut off
/// ([`Call::abort`]) and replies `internal`. Returns the reply body.
pub async fn run_call_until(
    runtime: &dyn Runtime,
    client: &Client,
    config: CallConfig,
    endpoint: Endpoint,
    body: &[u8],
    cut: impl std::future::Future<Output = ()>,
) -> Vec<u8> {
    let started = runtime.now();
    let response = drive_call(
        runtime, client, config, None, endpoint, body, cut, None, None,
    )
    .await;
    telemetry::call_answered(endpoint, &response, runtime.now() - started);
    response.to_json()
}

/// Carries out one call's effects until it replies (or `cut` completes), starting
/// it with what `known` knows of its key and teaching `known` what it learns.
#[allow(clippy::too_many_arguments)]
async fn drive_call(
    runtime: &dyn Runtime,
    client: &Client,
    config: CallConfig,
    scope: Option<Caller>,
    endpoint: Endpoint,
    body: &[u8],
    cut: impl std::future::Future<Output = ()>,
    writes: Option<&WriteSink>,
    known: Option<&KnownCache>,
) -> Response {
    let cut = cut.fuse();
    tokio::pin!(cut);
    let (now, wall) = (runtime.now(), OffsetDateTime::now_utc());
    let mut call = match known {
        Some(known) => known.start_call(config, scope, now, wall, endpoint, body),
        None => Call::new_scoped(config, scope, None, now, wall, endpoint, body),
    };
    loop {
        if let Some(known) = known {
            known.learn_from(&mut call);
        }
        if let Some(response) = call.poll_event() {
            return response;
        }
        let Some(transmit) = call.poll_transmit() else {
            // Waiting with nothing to do can only be a forward's deadline.
            match call.poll_timeout() {
                Some(at) => {
                    tokio::select! {
                        () = runtime.sleep_until(at) => call.handle_timeout(runtime.now()),
                        _ = &mut cut => call.abort(runtime.now()),
                    }
                    continue;
                }
                None => {
                    return Response::Error(ErrorReply::new(
                        ErrorKind::Internal,
                        "the call stopped without a reply",
                    ));
                }
            }
        };
        let op = JsOp::of(transmit.kind);
        let coalesced = writes.filter(|_| transmit.kind.is_stream_write());
        let Transmit { id, request, .. } = transmit;
        let deadline = call.poll_timeout();
        let expired = async {
            match deadline {
                Some(at) => runtime.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            outcome = send_effect(client, coalesced, request) => {
                if let Some(op) = op {
                    op.outcome(&outcome);
                }
                call.handle_outcome(runtime.now(), id, outcome)
            }
            _ = expired => {
                if let Some(op) = op {
                    op.timed_out();
                }
                call.handle_timeout(runtime.now())
            }
            _ = &mut cut => call.abort(runtime.now()),
        }
    }
}

/// Sends one effect's request: a write through the serve loop's coalescer when
/// there is one, anything else (and every write without one) straight.
async fn send_effect(
    client: &Client,
    writes: Option<&WriteSink>,
    request: NatsRequest,
) -> RequestOutcome {
    let Some(writes) = writes else {
        return exec::send_untimed(client, request).await;
    };
    let (tx, rx) = oneshot::channel();
    if writes.send((request, tx)).is_err() {
        return RequestOutcome::Failed("the service is stopping".to_string());
    }
    rx.await
        .unwrap_or_else(|_| RequestOutcome::Failed("the write was dropped".to_string()))
}

/// A write for the coalescer and where its outcome goes.
type WriteSink = mpsc::UnboundedSender<(NatsRequest, oneshot::Sender<RequestOutcome>)>;

/// The serve loop's one [`Coalescer`]: calls hand it their writes through
/// [`WriteSink`]; the loop sends only what it says and feeds the outcomes back.
struct Writer {
    coalescer: Coalescer,
    sink: WriteSink,
    incoming: mpsc::UnboundedReceiver<(NatsRequest, oneshot::Sender<RequestOutcome>)>,
    waiting: HashMap<WriteId, oneshot::Sender<RequestOutcome>>,
    next_write: u64,
    sends: FuturesUnordered<futures::future::BoxFuture<'static, (EffectId, RequestOutcome)>>,
}

impl Writer {
    fn new(client: &Client, atomic: bool, options: &ServiceOptions, now: Instant) -> Self {
        let config = if atomic {
            // Unique per process: the server keys open batches by id.
            let inbox = client.new_inbox();
            let nuid = inbox.rsplit('.').next().unwrap_or_default();
            CoalescerConfig {
                single_window: options.batch_after,
                min_batch: options.min_batch,
                ..CoalescerConfig::atomic(format!("{nuid}-"))
            }
        } else {
            CoalescerConfig::single()
        };
        let (sink, incoming) = mpsc::unbounded_channel();
        Self {
            coalescer: Coalescer::new(config, now),
            sink,
            incoming,
            waiting: HashMap::new(),
            next_write: 0,
            sends: FuturesUnordered::new(),
        }
    }

    /// Waits for a write or a send's outcome and handles it. Never completes
    /// while there is neither (cancel-safe: for `select!`).
    async fn step(&mut self, runtime: &Arc<dyn Runtime>, client: &Client) {
        tokio::select! {
            Some((request, tx)) = self.incoming.recv() => {
                self.next_write += 1;
                let id = WriteId(self.next_write);
                self.waiting.insert(id, tx);
                self.coalescer.handle_write(runtime.now(), id, request);
            }
            Some((id, outcome)) = self.sends.next(), if !self.sends.is_empty() => {
                // Writes still queued whose call gave up (timed out, cut off)
                // are not sent late.
                if self.coalescer.pending().0 > 0 {
                    let (now, coalescer) = (runtime.now(), &mut self.coalescer);
                    self.waiting
                        .retain(|w, tx| !(tx.is_closed() && coalescer.handle_cancel(now, *w)));
                }
                self.coalescer.handle_outcome(runtime.now(), id, outcome);
            }
        }
        while let Some(CoalescerEvent::Done { write, outcome }) = self.coalescer.poll_event() {
            if let Some(tx) = self.waiting.remove(&write) {
                // The call may have given up: nobody to tell then.
                let _ = tx.send(outcome);
            }
        }
        while let Some(send) = self.coalescer.poll_transmit() {
            let client = client.clone();
            let runtime = runtime.clone();
            self.sends.push(Box::pin(async move {
                for m in send.publish {
                    let mut headers = async_nats::HeaderMap::new();
                    for (name, value) in &m.headers {
                        headers.insert(*name, value.as_str());
                    }
                    // A message lost here leaves a gap: the commit is
                    // answered `incomplete` and the writes go single.
                    let _ = client
                        .publish_with_headers(m.subject, headers, m.payload.into())
                        .await;
                }
                let outcome = exec::send(&*runtime, &client, send.request).await;
                (send.id, outcome)
            }));
        }
    }
}
